//! `jobs.toml`: raw serde structures become validated [`Config`] values in one
//! step, and every mistake is reported with its file:line:column.

use std::path::{Path, PathBuf};

use crate::suggest::nearest;
use crate::template::Secrets;
pub use address::DatabaseUrl;
pub use job::{Action, Fingerprint, HttpAction, Job, Missed, ProcessAction, Program, Retry};
pub(crate) use locator::Locator;
pub(crate) use rules::short;
pub use secret::Secret;
use sections::{Sections, notifiers};
pub use settings::{Allow, ApiSettings, Settings, Token};
use vars::Vars;

pub mod address;
pub mod after;
pub mod code;
pub mod environment;
mod job;
mod locator;
pub mod notify;
mod raw;
mod rules;
mod secret;
mod sections;
mod settings;
mod sql;
mod validate;
mod vars;

/// A configuration mistake: where it is and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{place}: {message}")]
pub struct ConfigError {
    /// `jobs.toml:12:9`, or just the path when no line applies.
    pub place: String,
    /// What is wrong and what was expected.
    pub message: String,
}

impl ConfigError {
    /// Several mistakes as one error, in file order, one paragraph each.
    pub fn joined(mut errors: Vec<ConfigError>) -> ConfigError {
        errors.sort_by_key(ConfigError::line_col);
        errors.dedup();
        let mut errors = errors.into_iter();
        let Some(first) = errors.next() else {
            return ConfigError {
                place: String::new(),
                message: "no mistakes".into(),
            };
        };
        let mut message = first.message;
        for e in errors {
            message.push_str(&format!("\n\n{e}"));
        }
        ConfigError {
            place: first.place,
            message,
        }
    }

    /// The line and column at the end of `place`, for ordering.
    fn line_col(&self) -> (usize, usize) {
        let mut parts = self.place.rsplit(':');
        let column = parts.next().and_then(|c| c.parse().ok());
        let line = parts.next().and_then(|l| l.parse().ok());
        match (line, column) {
            (Some(line), Some(column)) => (line, column),
            _ => (0, 0),
        }
    }
}

fn read(path: &Path) -> Result<String, ConfigError> {
    std::fs::read_to_string(path).map_err(|e| ConfigError {
        place: path.display().to_string(),
        message: format!(
            "cannot read the configuration file: {e}; pass --config PATH or set SCHEDULER_CONFIG"
        ),
    })
}

/// A loaded `jobs.toml`.
/// Why a build without an HTTP client refuses an `http` job or a notifier.
pub const NO_HTTP: &str = "this build of scheduler sends no HTTP requests: its `http-actions` feature is off (the scheduler binary has it)";

/// The [`Config::path`] of jobs given in code, with no file.
pub const IN_CODE: &str = "(code)";

#[derive(Debug, Clone)]
pub struct Config {
    /// Where it was read from.
    pub path: PathBuf,
    /// `[scheduler]`.
    pub settings: Settings,
    /// `[api]`; `None` without it (`/v1/` answers 404).
    pub api: Option<ApiSettings>,
    /// `[[job]]`s in file order.
    pub jobs: Vec<Job>,
    /// Every secret it holds (each `${NAME}`'s value, the tokens, the
    /// database password), masked in every message about any job.
    pub secrets: Secrets,
    /// Read leniently: each job with a `${NAME}` that was not set, and the
    /// name (the job's action is incomplete: it must not run).
    pub incomplete: Vec<(String, String)>,
    /// `[[notify]]`s in file order.
    pub notifiers: Vec<notify::Notifier>,
    /// Read leniently: each notifier with a `${NAME}` that was not set, and
    /// the name (it must not send).
    pub incomplete_notifiers: Vec<(String, String)>,
}

/// Which parts of a file take an unset `${VAR}` as empty (and a warning)
/// rather than as a mistake.
#[derive(Debug, Clone, Copy)]
struct Lenient {
    jobs: bool,
    api: bool,
}

impl Lenient {
    const NOTHING: Lenient = Lenient {
        jobs: false,
        api: false,
    };
}

/// The passwords in the scheduler's database variables (`DATABASE_URL`,
/// `PGPASSWORD`), masked in every job's output whether or not the file
/// names them.
fn database_passwords(env: &dyn Fn(&str) -> Option<String>) -> Vec<String> {
    let url = env("DATABASE_URL").map(|url| address::url_passwords(&url));
    url.into_iter().flatten().chain(env("PGPASSWORD")).collect()
}

impl Config {
    /// Masks `more` too in every message about any job: the password of a
    /// database URL given on the command line.
    pub fn mask_also(&mut self, more: &[String]) {
        self.secrets = self.secrets.with(more);
        for job in &mut self.jobs {
            job.secrets = self.secrets.clone();
        }
    }

    /// Reads and validates the file at `path`, expanding `${VAR}` from the
    /// process environment; an unset one is an error.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let mut config = Config::load_adjusted(path, &|_| {})?;
        config.link_after()?;
        Ok(config)
    }

    /// Like [`Config::load`], with `adjust` applied to the settings before
    /// the jobs are checked against them (the library's settings given in
    /// code: a zone, a catch-up window), and the jobs' `after` not yet
    /// linked: the library's code jobs join them first
    /// (the builder links them then).
    pub fn load_adjusted(
        path: &Path,
        adjust: &dyn Fn(&mut Settings),
    ) -> Result<Config, ConfigError> {
        let text = read(path)?;
        let env = |name: &str| std::env::var(name).ok();
        let lenient = Lenient::NOTHING;
        Config::parse_inner(path, &text, &env, lenient, adjust, false).map(|(config, _)| config)
    }

    /// Like [`Config::load`] for `run`, which serves no API and runs the
    /// jobs it names only: an unset `${VAR}` of an `[api]` token or of
    /// another job leaves it empty rather than refusing the file. The jobs
    /// it leaves incomplete are listed ([`Config::incomplete`]), with a
    /// warning with its place for each name; [`Config::complete`] refuses
    /// one that is to run.
    pub fn load_to_run(path: &Path) -> Result<(Config, Vec<ConfigError>), ConfigError> {
        let text = read(path)?;
        let env = |name: &str| std::env::var(name).ok();
        let lenient = Lenient {
            jobs: true,
            api: true,
        };
        Config::parse_inner(path, &text, &env, lenient, &|_| {}, true)
    }

    /// Refuses to run `job` (its full name) while a `${VAR}` of it is
    /// unset: the error of `unset` (the lenient load's warnings) that names
    /// it.
    /// So is a notifier told of `job` with a `${VAR}` unset: `run`
    /// delivers, so it needs them as `serve` does.
    pub fn complete(&self, job: &str, unset: &[ConfigError]) -> Result<(), ConfigError> {
        let told = |notifier: &str| {
            self.notifiers.iter().any(|n| {
                n.name == notifier
                    && n.jobs
                        .as_ref()
                        .is_none_or(|jobs| jobs.iter().any(|j| j == job))
            })
        };
        let jobs = self.incomplete.iter().filter(|(name, _)| name == job);
        let notifiers = self
            .incomplete_notifiers
            .iter()
            .filter(|(name, _)| told(name));
        let missing: Vec<ConfigError> = jobs
            .chain(notifiers)
            .filter_map(|(_, var)| {
                let named = format!("`{var}` is not set");
                unset.iter().find(|e| e.message.contains(&named)).cloned()
            })
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::joined(missing))
        }
    }

    /// Like [`Config::load`], for commands that run no action: an unset
    /// `${VAR}` in a job is returned as a warning instead (one per name, at
    /// its first use). `[scheduler].database_url` must still be complete.
    pub fn load_lenient(path: &Path) -> Result<(Config, Vec<ConfigError>), ConfigError> {
        let text = read(path)?;
        Config::parse_with(path, &text, &|name| std::env::var(name).ok(), true)
    }

    /// Validates `text` as if read from `path`.
    pub fn parse(
        path: &Path,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        Config::parse_with(path, text, env, false).map(|(config, _)| config)
    }

    /// Validates `text`; with `lenient`, unset variables of jobs are
    /// warnings. Every mistake is reported, in file order, one paragraph
    /// each.
    pub fn parse_with(
        path: &Path,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
        lenient: bool,
    ) -> Result<(Config, Vec<ConfigError>), ConfigError> {
        let lenient = Lenient {
            jobs: lenient,
            api: lenient,
        };
        Config::parse_inner(path, text, env, lenient, &|_| {}, true)
    }

    fn parse_inner(
        path: &Path,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
        lenient: Lenient,
        adjust: &dyn Fn(&mut Settings),
        link: bool,
    ) -> Result<(Config, Vec<ConfigError>), ConfigError> {
        let at = Locator { path, text };
        let vars = Vars::new(env, lenient.jobs);
        let api_vars = Vars::new(env, lenient.api);
        let root = toml::de::DeTable::parse(text).map_err(|e| at.toml_error(&e))?;
        let mut errors: Vec<ConfigError> = Vec::new();
        let mut sections = Sections::of(root, &at, &mut errors);
        let mut settings = sections.settings(&at, &vars, &mut errors)?;
        adjust(&mut settings);
        let api = sections.api(&at, &api_vars, &mut errors);
        let notify = std::mem::take(&mut sections.notify);
        let (mut jobs, incomplete) = sections.jobs(&at, &settings, &vars, &mut errors);
        let (mut notifiers, incomplete_notifiers) =
            notifiers(notify, &at, &vars, &jobs, &mut errors);
        if !errors.is_empty() {
            return Err(ConfigError::joined(errors));
        }
        let secrets = seal(&mut jobs, &vars, &api_vars, env);
        // Names are unique within the file; the namespace makes them so in
        // the database.
        if let Some(namespace) = &settings.namespace {
            for job in &mut jobs {
                job.name = format!("{namespace}/{}", job.name);
            }
            for named in notifiers.iter_mut().filter_map(|n| n.jobs.as_mut()) {
                for job in named {
                    *job = format!("{namespace}/{job}");
                }
            }
        }
        let mut unset = vars.unset();
        if lenient.jobs {
            for name in api_vars.unset() {
                if !unset.contains(&name) {
                    unset.push(name);
                }
            }
        }
        let warnings = unset.into_iter().map(|name| at.unset(&name)).collect();
        let config = Config {
            path: path.to_owned(),
            settings,
            api,
            jobs,
            secrets,
            incomplete,
            notifiers,
            incomplete_notifiers,
        };
        let mut config = config;
        if link {
            config.link_after()?;
        }
        Ok((config, warnings))
    }

    /// Checks the `sql` statements as SQLite reads them, which runs every
    /// statement of a text and quotes names with `[…]` and backticks: none
    /// may end or split the transaction that records its outcome.
    pub fn check_for_sqlite(&self) -> Result<(), ConfigError> {
        let errors: Vec<ConfigError> = self
            .jobs
            .iter()
            .filter_map(|job| {
                let Action::Sql { statement, .. } = &job.action else {
                    return None;
                };
                let word = sql::ends_the_transaction(statement, sql::Dialect::SQLITE)?;
                Some(ConfigError {
                    place: format!("{}: job `{}`", self.path.display(), job.name),
                    message: format!(
                        "the SQL statement runs `{word}` as SQLite reads it (SQLite runs every statement of the text): a statement runs inside the transaction that records its outcome, and must not end or split it"
                    ),
                })
            })
            .collect();
        if errors.is_empty() {
            Ok(())
        } else {
            Err(ConfigError::joined(errors))
        }
    }

    /// The name the database knows `name` by: with the namespace's
    /// prefix, unless it has one.
    pub fn full_name<'a>(&self, name: &'a str) -> std::borrow::Cow<'a, str> {
        match &self.settings.namespace {
            Some(namespace) if !name.contains('/') => format!("{namespace}/{name}").into(),
            _ => name.into(),
        }
    }

    /// The job called `name` (with or without the namespace), or an error
    /// that suggests the nearest name.
    pub fn job(&self, name: &str) -> Result<&Job, ConfigError> {
        self.find(name).map_err(|near| {
            let hint = near
                .map(|n| format!("; did you mean `{n}`?"))
                .unwrap_or_else(|| {
                    let names: Vec<_> = self.jobs.iter().map(|j| self.short_name(j)).collect();
                    format!("; its jobs are: {}", names.join(", "))
                });
            let source = if self.path == Path::new(IN_CODE) {
                String::new()
            } else {
                format!(" in {}", self.path.display())
            };
            ConfigError {
                place: "JOB".into(),
                message: format!("no job named `{name}`{source}{hint}"),
            }
        })
    }

    /// The job called `name` (with or without the namespace), or the
    /// nearest name, if one is near, for the caller's message.
    pub fn find(&self, name: &str) -> Result<&Job, Option<&str>> {
        let full = self.full_name(name);
        self.jobs
            .iter()
            .find(|j| j.name == full)
            .ok_or_else(|| nearest(name, self.jobs.iter().map(|j| self.short_name(j))))
    }

    /// A job's name as its file writes it, without the namespace.
    fn short_name<'a>(&self, job: &'a Job) -> &'a str {
        job.name.split_once('/').map_or(&job.name, |(_, name)| name)
    }
}

/// Every value the file read from the environment that is not public is
/// a secret, and so is the database password: each job masks them, and a
/// job's process never inherits a variable that holds one.
fn seal(
    jobs: &mut [Job],
    vars: &Vars<'_>,
    api_vars: &Vars<'_>,
    env: &dyn Fn(&str) -> Option<String>,
) -> Secrets {
    let mut read = vars.read_all();
    read.extend(api_vars.read_all());
    let hidden = environment::hidden(read.iter().map(|(name, _)| name.as_str()));
    let secrets = Secrets::of_values(
        read.iter()
            .filter(|(name, _)| !environment::is_public(name))
            .map(|(_, value)| value.clone())
            .chain(database_passwords(env)),
    );
    for job in jobs {
        job.derive();
        job.secrets = secrets.clone();
        if let Action::Process(process) = &mut job.action {
            process.inherit.hidden = hidden.clone();
        }
    }
    secrets
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The fingerprint of a job must not change with the code that holds
    /// it: a new release would show every job's history as "definition
    /// changed". Values recorded by the release of 2026-12-02.
    #[test]
    fn a_job_keeps_its_definition_fingerprint_across_releases() {
        let text = r#"
[[job]]
name = "cmd"
schedule = "0 3 * * *"
period = "day"
command = ["/bin/echo", "{period}"]
workdir = "/tmp"
env = { A = "x{period_key}" }

[[job]]
name = "sh"
schedule = "@hourly"
period = "hour"
timezone = "Europe/Berlin"
shell = "echo {period} > /dev/null"

[[job]]
name = "web"
schedule = "*/5 * * * *"
period = "minute"
http = { url = "http://127.0.0.1:9/{period}", method = "POST", headers = { X-A = "b" }, body = "{period_key}", timeout = "5s" }

[[job]]
name = "q"
schedule = "* * * * *"
period = "minute"
sql = { statement = "SELECT $1", params = ["{period_key}"] }
"#;
        let config = Config::parse(Path::new("jobs.toml"), text, &|_| None).unwrap();
        let definitions: Vec<(&str, &str)> = config
            .jobs
            .iter()
            .map(|job| (job.name.as_str(), job.definition.as_str()))
            .collect();
        assert_eq!(
            definitions,
            [
                ("cmd", "29b433f4393b"),
                ("sh", "95f2760c75bd"),
                ("web", "7d98cb38714c"),
                ("q", "942fb8873f31"),
            ]
        );
    }
}
