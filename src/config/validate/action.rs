//! A job's one action checked: `command`, `shell`, `http` or `sql`, with
//! what each may carry (`workdir`, `env` and `inherit` for a process).

use std::ops::Range;

use toml::Spanned;

use super::{duration, fitted, no_nul, template, templates};
use crate::config::environment::Inherit;
use crate::config::locator::Locator;
use crate::config::raw::{RawHttp, RawJob, RawSql};
use crate::config::sql::{Dialect, ends_the_transaction, is_empty_in_effect};
use crate::config::vars::Env;
use crate::config::{Action, ConfigError, HttpAction, ProcessAction, Program};
use crate::template::Template;

impl RawJob {
    pub(super) fn action(&self, at: &Locator, env: Env) -> Result<Action, ConfigError> {
        let given: Vec<(&str, Range<usize>)> = [
            self.command.as_ref().map(|c| ("command", c.span())),
            self.shell.as_ref().map(|c| ("shell", c.span())),
            self.http.as_ref().map(|c| ("http", c.span())),
            self.sql.as_ref().map(|c| ("sql", c.span())),
        ]
        .into_iter()
        .flatten()
        .collect();
        let name_span = self.name.span();
        match given.as_slice() {
            [] => {
                return Err(at.error(
                    name_span,
                    format!(
                        "job `{}` has no action: expected exactly one of `command`, `shell`, `http` or `sql`",
                        self.name.get_ref()
                    ),
                ));
            }
            [_] => {}
            [_, (second, span), ..] => {
                return Err(at.error(
                    span.clone(),
                    format!(
                        "job `{}` has `{}` and `{second}`: expected exactly one action",
                        self.name.get_ref(),
                        given[0].0
                    ),
                ));
            }
        }
        let process_only = [
            ("workdir", self.workdir.as_ref().map(Spanned::span)),
            ("env", self.env.as_ref().map(Spanned::span)),
            ("inherit", self.inherit.as_ref().map(Spanned::span)),
        ];
        if (self.http.is_some() || self.sql.is_some())
            && let Some((key, Some(span))) = process_only.into_iter().find(|(_, s)| s.is_some())
        {
            return Err(at.error(
                span,
                format!("`{key}` applies only to `command` and `shell` actions"),
            ));
        }
        if let Some(command) = &self.command {
            self.check_process_env(at)?;
            return self.command(at, env, command);
        }
        if let Some(shell) = &self.shell {
            self.check_process_env(at)?;
            return self.shell(at, env, shell);
        }
        if let Some(http) = &self.http {
            return http_action(at, env, http.get_ref());
        }
        let Some(sql) = self.sql.as_ref().map(Spanned::get_ref) else {
            return Err(at.error(name_span, "no action".into()));
        };
        sql_action(at, env, sql)
    }

    /// What is wrong with the names of `env` and `inherit`: every bad
    /// entry of `inherit` at once, each with its place.
    fn check_process_env(&self, at: &Locator) -> Result<(), ConfigError> {
        if let Some(vars) = &self.env
            && let Some(bad) = vars
                .get_ref()
                .keys()
                .find(|k| k.is_empty() || k.contains(['=', '\0']))
        {
            return Err(at.error(
                vars.span(),
                format!(
                    "`{}` is not an environment variable name: expected a non-empty name without `=` or NUL",
                    bad.escape_default()
                ),
            ));
        }
        let mut listed: Vec<&str> = Vec::new();
        let bad: Vec<ConfigError> = self
            .inherit
            .iter()
            .flat_map(|i| i.get_ref())
            .filter_map(|name| {
                let text = name.get_ref().as_str();
                let valid = text.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                    && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                let problem = if !valid {
                    format!(
                        "`{}` is not an environment variable name: expected letters, digits and `_`, not starting with a digit, e.g. inherit = [\"PATH\", \"HOME\"]",
                        text.escape_default()
                    )
                } else if listed.contains(&text) {
                    format!("`{text}` is listed twice in `inherit`: list each variable once")
                } else {
                    listed.push(text);
                    return None;
                };
                Some(at.error(name.span(), problem))
            })
            .collect();
        if !bad.is_empty() {
            return Err(ConfigError::joined(bad));
        }
        Ok(())
    }

    /// A `command` or `shell` action running `program`, with the job's
    /// `workdir`, `env` and `inherit`.
    fn process(&self, at: &Locator, env: Env, program: Program) -> Result<Action, ConfigError> {
        Ok(Action::Process(Box::new(ProcessAction {
            program,
            workdir: self
                .workdir
                .as_ref()
                .map(|w| template(at, w, env))
                .transpose()?,
            env: match &self.env {
                Some(vars) => templates(at, vars.get_ref(), env)?,
                None => Vec::new(),
            },
            inherit: Inherit {
                only: self.inherit.as_ref().map(|names| {
                    names
                        .get_ref()
                        .iter()
                        .map(|n| n.get_ref().clone())
                        .collect()
                }),
                ..Inherit::default()
            },
        })))
    }

    /// The `command` action.
    fn command(
        &self,
        at: &Locator,
        env: Env,
        command: &Spanned<Vec<Spanned<String>>>,
    ) -> Result<Action, ConfigError> {
        if cfg!(not(feature = "process-actions")) {
            return Err(at.error(command.span(), crate::config::NO_PROCESS.into()));
        }
        if command.get_ref().is_empty() {
            return Err(at.error(
                command.span(),
                "`command` is empty: expected the program and its arguments, e.g. [\"./bin/bill\", \"{period}\"]".into(),
            ));
        }
        let program = &command.get_ref()[0];
        let unset_before = env.unset_count();
        let argv: Vec<Template> = command
            .get_ref()
            .iter()
            .map(|a| template(at, a, env))
            .collect::<Result<_, _>>()
            .map(fitted)?;
        // Empty as written, or after expansion unless a lenient load
        // left a variable empty.
        let empty = program.get_ref().trim().is_empty()
            || (argv[0].render(&NoValues).trim().is_empty() && env.unset_count() == unset_before);
        if empty {
            return Err(at.error(
                program.span(),
                "the program name is empty: expected the program to run first, e.g. [\"./bin/bill\", \"{period}\"]".into(),
            ));
        }
        self.process(at, env, Program::Command(argv))
    }

    /// The `shell` action: `${NAME}` stays in the script for /bin/sh.
    fn shell(
        &self,
        at: &Locator,
        env: Env,
        shell: &Spanned<String>,
    ) -> Result<Action, ConfigError> {
        let env_names: Vec<&str> = self
            .env
            .as_ref()
            .map(|vars| vars.get_ref().keys().map(String::as_str).collect())
            .unwrap_or_default();
        if cfg!(not(feature = "process-actions")) {
            return Err(at.error(shell.span(), crate::config::NO_PROCESS.into()));
        }
        no_nul(at, shell)?;
        // `${NAME}` stays in the script for /bin/sh; it must be set in the
        // scheduler's environment, the job's `env` or `SCHEDULER_*`.
        let known = |name: &str| {
            if env_names.contains(&name) || SCHEDULER_VARIABLES.contains(&name) {
                Some(String::new())
            } else {
                env.get(name)
            }
        };
        let script = Template::load_shell(shell.get_ref(), &known)
            .map_err(|e| at.template_error(shell.span(), e))?;
        if script.render(&NoValues).trim().is_empty() {
            return Err(at.error(
                shell.span(),
                "`shell` is empty: expected a command line for /bin/sh".into(),
            ));
        }
        self.process(at, env, Program::Shell(script))
    }
}

/// The `http` action.
fn http_action(at: &Locator, env: Env, http: &RawHttp) -> Result<Action, ConfigError> {
    if cfg!(not(feature = "http-actions")) {
        return Err(at.error(http.url.span(), crate::config::NO_HTTP.into()));
    }
    let method = http_method(at, http)?;
    let unset_before = env.unset_count();
    let url = template(at, &http.url, env)?;
    // Checked after `${NAME}` expansion, unless a lenient load left a
    // variable empty.
    let prefix = url.prefix().to_ascii_lowercase();
    let scheme_ok = ["http://", "https://"]
        .iter()
        .any(|s| prefix.starts_with(s));
    if !scheme_ok && env.unset_count() == unset_before {
        return Err(at.error(
                http.url.span(),
                "`url` must start with http:// or https:// (after `${NAME}` expansion); other schemes are not sent".into(),
            ));
    }
    // Placeholders filled with a sample; the error names no value
    // (one may be a secret).
    if env.unset_count() == unset_before
        && let Err(e) = url::Url::parse(&url.render(&SampleValues))
    {
        return Err(at.error(
                http.url.span(),
                format!("`url` is not a valid URL after `${{NAME}}` expansion ({e}): expected http(s)://HOST[:PORT]/PATH"),
            ));
    }
    #[cfg(feature = "http-actions")]
    for (name, value) in &http.headers {
        if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(at.error(
                    value.span(),
                    format!(
                        "`{}` is not a valid header name: expected letters, digits and `-` (no spaces or `:`)",
                        name.escape_default()
                    ),
                ));
        }
    }
    let headers = templates(at, &http.headers, env)?;
    #[cfg(feature = "http-actions")]
    for ((name, template), (_, value)) in headers.iter().zip(&http.headers) {
        let valid = template
            .literals()
            .all(|text| reqwest::header::HeaderValue::from_str(text).is_ok());
        if !valid {
            return Err(at.error(
                    value.span(),
                    format!(
                        "the value of header `{name}` has a character a header cannot carry (a control character such as a newline)"
                    ),
                ));
        }
    }
    Ok(Action::Http(Box::new(HttpAction {
        url,
        method,
        headers,
        body: http
            .body
            .as_ref()
            .map(|b| template(at, b, env))
            .transpose()?,
        timeout: duration(at, http.timeout.as_ref(), "30s")?,
    })))
}

/// An `http` action's method, upper-cased; `POST` when none is given.
fn http_method(at: &Locator, http: &RawHttp) -> Result<String, ConfigError> {
    Ok(match &http.method {
        None => "POST".to_owned(),
        Some(m) => {
            let upper = m.get_ref().to_ascii_uppercase();
            const METHODS: [&str; 7] = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"];
            if !METHODS.contains(&upper.as_str()) {
                return Err(at.error(
                    m.span(),
                    format!(
                        "`{}` is not an HTTP method: expected one of {}",
                        m.get_ref().escape_default(),
                        METHODS.join(", ")
                    ),
                ));
            }
            upper
        }
    })
}

/// The `sql` action.
fn sql_action(at: &Locator, env: Env, sql: &RawSql) -> Result<Action, ConfigError> {
    if sql.statement.get_ref().contains('\0') {
        no_nul(at, &sql.statement)?;
    }
    if let Some(name) = variable_in(sql.statement.get_ref()) {
        return Err(at.error(
            sql.statement.span(),
            format!(
                "`${{{name}}}` in an SQL statement is not expanded: a value is never spliced into SQL text; pass it as a param, e.g. statement = \"... $1\", params = [\"${{{name}}}\"]"
            ),
        ));
    }
    if let Some(word) = ends_the_transaction(sql.statement.get_ref(), Dialect::POSTGRES) {
        return Err(at.error(
            sql.statement.span(),
            format!(
                "the SQL statement runs `{word}`: a statement runs inside the transaction that records its outcome, and must not end or split it; expected a statement such as \"INSERT INTO t VALUES ($1)\""
            ),
        ));
    }
    if [Dialect::POSTGRES, Dialect::SQLITE]
        .into_iter()
        .any(|dialect| is_empty_in_effect(sql.statement.get_ref(), dialect))
    {
        return Err(at.error(
            sql.statement.span(),
            "the SQL statement is empty (nothing but blanks, comments and `;`): expected a statement, e.g. \"INSERT INTO t VALUES ($1)\"".into(),
        ));
    }
    Ok(Action::Sql {
        statement: sql.statement.get_ref().clone(),
        params: sql
            .params
            .iter()
            .map(|p| template(at, p, env))
            .collect::<Result<_, _>>()
            .map(fitted)?,
    })
}

/// The name of the first `${NAME}` in `text`, if any.
fn variable_in(text: &str) -> Option<&str> {
    text.match_indices("${").find_map(|(at, _)| {
        let rest = &text[at + 2..];
        let name = &rest[..rest.find('}')?];
        let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        valid.then_some(name)
    })
}

/// The variables every job process gets from the scheduler.
const SCHEDULER_VARIABLES: [&str; 10] = [
    "SCHEDULER_JOB",
    "SCHEDULER_PERIOD",
    "SCHEDULER_PERIOD_KEY",
    "SCHEDULER_PERIOD_START",
    "SCHEDULER_PERIOD_END",
    "SCHEDULER_SCHEDULED_AT",
    "SCHEDULER_ATTEMPT",
    "SCHEDULER_TRIGGER",
    "SCHEDULER_SHARD",
    "SCHEDULER_SHARDS",
];

/// Renders every placeholder as a value any of them could have in a URL.
struct SampleValues;

impl crate::template::Values for SampleValues {
    fn value(&self, _: &str) -> String {
        "2026-07".to_owned()
    }
}

/// Renders placeholders as nothing, to look at a template's literal text.
struct NoValues;

impl crate::template::Values for NoValues {
    fn value(&self, _: &str) -> String {
        String::new()
    }
}
