//! `jobs.toml`: raw serde structures become validated [`Config`] values in one
//! step, and every mistake is reported with its file:line:column.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono_tz::Tz;
use serde::Deserialize;
use toml::Spanned;

use crate::period::{Covers, PeriodRule, Unit};
use crate::schedule::{DstRule, Gap, Repeat, Schedule};
use crate::suggest::nearest;
use crate::template::{Template, TemplateError};

/// A configuration mistake: where it is and what was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{place}: {message}")]
pub struct ConfigError {
    /// `jobs.toml:12:9`, or just the path when no line applies.
    pub place: String,
    /// What is wrong and what was expected.
    pub message: String,
}

/// Process-wide settings from `[scheduler]`.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Default zone for schedules.
    pub timezone: Tz,
    /// How long a running claim stays valid without a heartbeat.
    pub lease: Duration,
    /// How far back missed periods are looked for.
    pub catch_up: Duration,
    /// How long SIGTERM waits for running jobs.
    pub shutdown_grace: Duration,
    /// Runs at once in this process.
    pub max_running: usize,
    /// How often `serve` scans for missed, retryable and expired claims.
    pub scan_interval: Duration,
    /// The database, unless `--database-url` or `DATABASE_URL` says otherwise.
    pub database_url: Option<String>,
}

/// What to do with periods missed while nothing ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Missed {
    /// Run every missed period within the catch-up window.
    #[default]
    All,
    /// Run only the newest missed period.
    Latest,
    /// Run none of them.
    Skip,
}

/// Retry policy for failures a run reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Attempts in all, the first included (1 = no retry).
    pub attempts: u32,
    /// Wait after the first failure; doubled after each further one.
    pub backoff: Duration,
    /// The longest wait.
    pub max_backoff: Duration,
}

impl Retry {
    /// The wait before the next attempt after `failures` failures, or `None`
    /// when the budget is spent.
    pub fn backoff_after(&self, failures: u32) -> Option<Duration> {
        if failures >= self.attempts {
            return None;
        }
        let factor = 2u32.saturating_pow(failures.saturating_sub(1));
        Some(self.backoff.saturating_mul(factor).min(self.max_backoff))
    }
}

/// How a `command` or `shell` action starts its process.
#[derive(Debug, Clone)]
pub enum Program {
    /// Executed directly, no shell.
    Command(Vec<Template>),
    /// Run by `/bin/sh -c`.
    Shell(Template),
}

/// A job's one action.
#[derive(Debug, Clone)]
pub enum Action {
    /// A child process.
    Process {
        /// What to execute.
        program: Program,
        /// Working directory.
        workdir: Option<Template>,
        /// Extra environment variables.
        env: Vec<(String, Template)>,
    },
    /// An HTTP request carrying `Idempotency-Key`.
    Http {
        /// The address.
        url: Template,
        /// GET, POST, …
        method: String,
        /// Extra headers.
        headers: Vec<(String, Template)>,
        /// Request body.
        body: Option<Template>,
        /// Request timeout.
        timeout: Duration,
    },
    /// A statement run in the transaction that marks the claim succeeded.
    Sql {
        /// With `$1`, `$2`, … for the params.
        statement: String,
        /// Bound, never spliced.
        params: Vec<Template>,
    },
}

/// A validated job.
#[derive(Debug, Clone)]
pub struct Job {
    /// `[a-z0-9][a-z0-9_-]{0,62}`, unique.
    pub name: String,
    /// When it fires.
    pub schedule: Schedule,
    /// What a fire covers.
    pub period: PeriodRule,
    /// What it does.
    pub action: Action,
    /// Killed and counted failed past this.
    pub timeout: Option<Duration>,
    /// Periods of this job running at once, across all replicas.
    pub concurrency: u32,
    /// What happens to periods missed while nothing ran.
    pub missed: Missed,
    /// Retries of reported failures.
    pub retry: Retry,
    /// Finished claims older than this may be pruned.
    pub keep: Option<Duration>,
}

/// A loaded `jobs.toml`.
#[derive(Debug, Clone)]
pub struct Config {
    /// Where it was read from.
    pub path: PathBuf,
    /// `[scheduler]`.
    pub settings: Settings,
    /// `[[job]]`s in file order.
    pub jobs: Vec<Job>,
}

impl Config {
    /// Reads and validates the file at `path`, expanding `${VAR}` from the
    /// process environment.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError {
            place: path.display().to_string(),
            message: format!(
                "cannot read the configuration file: {e}; pass --config PATH or set SCHEDULER_CONFIG"
            ),
        })?;
        Config::parse(path, &text, &|name| std::env::var(name).ok())
    }

    /// Validates `text` as if read from `path`.
    pub fn parse(
        path: &Path,
        text: &str,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Config, ConfigError> {
        let at = Locator { path, text };
        let raw: RawFile = toml::from_str(text).map_err(|e| at.toml_error(&e))?;
        let settings = raw.scheduler.unwrap_or_default().validate(&at, env)?;
        let mut jobs: Vec<Job> = Vec::with_capacity(raw.job.len());
        let mut seen: BTreeMap<String, Range<usize>> = BTreeMap::new();
        for raw_job in raw.job {
            let name_span = raw_job.name.span();
            let job = raw_job.validate(&at, &settings, env)?;
            if let Some(first) = seen.get(&job.name) {
                return Err(at.error(
                    name_span,
                    format!(
                        "job name `{}` is already used at line {}; job names must be unique",
                        job.name,
                        at.line_col(first.start).0
                    ),
                ));
            }
            seen.insert(job.name.clone(), name_span);
            jobs.push(job);
        }
        Ok(Config {
            path: path.to_owned(),
            settings,
            jobs,
        })
    }

    /// The job called `name`, or an error that suggests the nearest name.
    pub fn job(&self, name: &str) -> Result<&Job, ConfigError> {
        self.jobs.iter().find(|j| j.name == name).ok_or_else(|| {
            let hint = nearest(name, self.jobs.iter().map(|j| j.name.as_str()))
                .map(|n| format!("; did you mean `{n}`?"))
                .unwrap_or_else(|| {
                    let names: Vec<_> = self.jobs.iter().map(|j| j.name.as_str()).collect();
                    format!("; its jobs are: {}", names.join(", "))
                });
            ConfigError {
                place: "JOB".into(),
                message: format!("no job named `{name}` in {}{hint}", self.path.display()),
            }
        })
    }
}

/// Turns byte offsets into file:line:column places.
struct Locator<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Locator<'_> {
    fn line_col(&self, offset: usize) -> (usize, usize) {
        let before = &self.text[..offset.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        (line, column)
    }

    fn error(&self, span: Range<usize>, message: String) -> ConfigError {
        let (line, column) = self.line_col(span.start);
        ConfigError {
            place: format!("{}:{line}:{column}", self.path.display()),
            message,
        }
    }

    /// An error inside a string value: `offset` counts from the string's
    /// first character, after the opening quote.
    fn template_error(&self, span: Range<usize>, e: TemplateError) -> ConfigError {
        self.error(span.start + 1 + e.offset..span.end, e.message)
    }

    fn toml_error(&self, e: &toml::de::Error) -> ConfigError {
        let message = e.message().trim().to_owned();
        let message = match unknown_name(&message) {
            Some((given, expected)) => match nearest(given, expected.iter().copied()) {
                Some(n) => format!("{message}; did you mean `{n}`?"),
                None => message,
            },
            None => message,
        };
        match e.span() {
            Some(span) => self.error(span, message),
            None => ConfigError {
                place: self.path.display().to_string(),
                message,
            },
        }
    }
}

/// From serde's "unknown field `x`, expected one of `a`, `b`", the given
/// name and the expected ones.
fn unknown_name(message: &str) -> Option<(&str, Vec<&str>)> {
    let rest = message
        .strip_prefix("unknown field `")
        .or_else(|| message.strip_prefix("unknown variant `"))?;
    let (given, expected) = rest.split_once('`')?;
    let expected = expected.split('`').skip(1).step_by(2).collect();
    Some((given, expected))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFile {
    scheduler: Option<RawSettings>,
    #[serde(default)]
    job: Vec<RawJob>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawSettings {
    timezone: Option<Spanned<String>>,
    lease: Option<Spanned<String>>,
    catch_up: Option<Spanned<String>>,
    shutdown_grace: Option<Spanned<String>>,
    max_running: Option<Spanned<i64>>,
    scan_interval: Option<Spanned<String>>,
    database_url: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawJob {
    name: Spanned<String>,
    schedule: Spanned<String>,
    timezone: Option<Spanned<String>>,
    #[serde(default)]
    period: Unit,
    #[serde(default)]
    covers: Covers,
    command: Option<Spanned<Vec<Spanned<String>>>>,
    shell: Option<Spanned<String>>,
    http: Option<Spanned<RawHttp>>,
    sql: Option<Spanned<RawSql>>,
    workdir: Option<Spanned<String>>,
    env: Option<Spanned<BTreeMap<String, Spanned<String>>>>,
    timeout: Option<Spanned<String>>,
    concurrency: Option<Spanned<i64>>,
    #[serde(default)]
    missed: Missed,
    retry: Option<RawRetry>,
    keep: Option<Spanned<String>>,
    #[serde(default)]
    dst: RawDst,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    url: Spanned<String>,
    method: Option<Spanned<String>>,
    #[serde(default)]
    headers: BTreeMap<String, Spanned<String>>,
    body: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSql {
    statement: Spanned<String>,
    #[serde(default)]
    params: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    attempts: Option<Spanned<i64>>,
    backoff: Option<Spanned<String>>,
    max_backoff: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawDst {
    #[serde(default)]
    gap: Gap,
    #[serde(default)]
    repeat: Repeat,
}

type Env<'a> = &'a dyn Fn(&str) -> Option<String>;

fn duration(
    at: &Locator,
    value: Option<&Spanned<String>>,
    default: &str,
) -> Result<Duration, ConfigError> {
    let Some(value) = value else {
        return Ok(humantime::parse_duration(default).unwrap_or_default());
    };
    match humantime::parse_duration(value.get_ref()) {
        Ok(d) if !d.is_zero() => Ok(d),
        Ok(_) => Err(at.error(value.span(), "a duration must be longer than zero".into())),
        Err(e) => Err(at.error(
            value.span(),
            format!(
                "`{}` is not a duration ({e}): expected a number and a unit, e.g. `90s`, `5m`, `24h`, `7d`",
                value.get_ref()
            ),
        )),
    }
}

fn positive(at: &Locator, value: Option<&Spanned<i64>>, default: u32) -> Result<u32, ConfigError> {
    match value {
        None => Ok(default),
        Some(v) => u32::try_from(*v.get_ref())
            .ok()
            .filter(|n| *n >= 1)
            .ok_or_else(|| {
                at.error(
                    v.span(),
                    format!(
                        "`{}` is out of range: expected a whole number from 1",
                        v.get_ref()
                    ),
                )
            }),
    }
}

fn zone(at: &Locator, value: &Spanned<String>) -> Result<Tz, ConfigError> {
    value.get_ref().parse::<Tz>().map_err(|_| {
        let names = chrono_tz::TZ_VARIANTS.iter().map(|tz| tz.name());
        let hint = nearest(value.get_ref(), names)
            .map(|n| format!("; did you mean `{n}`?"))
            .unwrap_or_default();
        at.error(
            value.span(),
            format!(
                "`{}` is not a time zone: expected an IANA name such as `UTC` or `Europe/Berlin`{hint}",
                value.get_ref()
            ),
        )
    })
}

fn template(at: &Locator, value: &Spanned<String>, env: Env) -> Result<Template, ConfigError> {
    Template::load(value.get_ref(), env).map_err(|e| at.template_error(value.span(), e))
}

fn templates<'a>(
    at: &Locator,
    values: impl IntoIterator<Item = (&'a String, &'a Spanned<String>)>,
    env: Env,
) -> Result<Vec<(String, Template)>, ConfigError> {
    values
        .into_iter()
        .map(|(k, v)| Ok((k.clone(), template(at, v, env)?)))
        .collect()
}

impl RawSettings {
    fn validate(self, at: &Locator, env: Env) -> Result<Settings, ConfigError> {
        let database_url = match &self.database_url {
            Some(url) => Some(
                crate::template::expand_env(url.get_ref(), env)
                    .map_err(|e| at.template_error(url.span(), e))?,
            ),
            None => None,
        };
        Ok(Settings {
            timezone: self
                .timezone
                .as_ref()
                .map_or(Ok(Tz::UTC), |z| zone(at, z))?,
            lease: duration(at, self.lease.as_ref(), "60s")?,
            catch_up: duration(at, self.catch_up.as_ref(), "24h")?,
            shutdown_grace: duration(at, self.shutdown_grace.as_ref(), "30s")?,
            max_running: positive(at, self.max_running.as_ref(), 16)? as usize,
            scan_interval: duration(at, self.scan_interval.as_ref(), "5s")?,
            database_url,
        })
    }
}

impl RawJob {
    fn validate(self, at: &Locator, settings: &Settings, env: Env) -> Result<Job, ConfigError> {
        let name = self.name.get_ref();
        let valid_name = name.len() <= 63
            && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
            && name
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-');
        if !valid_name {
            return Err(at.error(
                self.name.span(),
                format!(
                    "`{name}` is not a valid job name: expected 1 to 63 of a-z, 0-9, `_` and `-`, starting with a letter or digit"
                ),
            ));
        }
        let zone = match &self.timezone {
            Some(z) => zone(at, z)?,
            None => settings.timezone,
        };
        let dst = DstRule {
            gap: self.dst.gap,
            repeat: self.dst.repeat,
        };
        let schedule = Schedule::parse(self.schedule.get_ref(), zone, dst).map_err(|e| {
            at.error(
                self.schedule.span(),
                format!("{e}: expected 5 fields (minute hour day-of-month month day-of-week), 6 with seconds first, or @hourly/@daily/@weekly/@monthly/@yearly"),
            )
        })?;
        let action = self.action(at, env)?;
        let retry = match &self.retry {
            None => Retry {
                attempts: 1,
                backoff: Duration::from_secs(60),
                max_backoff: Duration::from_secs(3600),
            },
            Some(r) => Retry {
                attempts: positive(at, r.attempts.as_ref(), 1)?,
                backoff: duration(at, r.backoff.as_ref(), "1m")?,
                max_backoff: duration(at, r.max_backoff.as_ref(), "1h")?,
            },
        };
        Ok(Job {
            name: name.clone(),
            schedule,
            period: PeriodRule {
                unit: self.period,
                covers: self.covers,
            },
            action,
            timeout: self
                .timeout
                .as_ref()
                .map(|t| duration(at, Some(t), ""))
                .transpose()?,
            concurrency: positive(at, self.concurrency.as_ref(), 1)?,
            missed: self.missed,
            retry,
            keep: self
                .keep
                .as_ref()
                .map(|k| duration(at, Some(k), ""))
                .transpose()?,
        })
    }

    fn action(&self, at: &Locator, env: Env) -> Result<Action, ConfigError> {
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
        ];
        if self.http.is_some() || self.sql.is_some() {
            if let Some((key, Some(span))) = process_only.into_iter().find(|(_, s)| s.is_some()) {
                return Err(at.error(
                    span,
                    format!("`{key}` applies only to `command` and `shell` actions"),
                ));
            }
        }
        let process = |program| -> Result<Action, ConfigError> {
            Ok(Action::Process {
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
            })
        };
        if let Some(command) = &self.command {
            if command.get_ref().is_empty() {
                return Err(at.error(
                    command.span(),
                    "`command` is empty: expected the program and its arguments, e.g. [\"./bin/bill\", \"{period}\"]".into(),
                ));
            }
            let argv = command
                .get_ref()
                .iter()
                .map(|a| template(at, a, env))
                .collect::<Result<_, _>>()?;
            return process(Program::Command(argv));
        }
        if let Some(shell) = &self.shell {
            return process(Program::Shell(template(at, shell, env)?));
        }
        if let Some(http) = &self.http {
            let http = http.get_ref();
            let method = match &http.method {
                None => "POST".to_owned(),
                Some(m) => {
                    let upper = m.get_ref().to_ascii_uppercase();
                    const METHODS: [&str; 5] = ["GET", "POST", "PUT", "PATCH", "DELETE"];
                    if !METHODS.contains(&upper.as_str()) {
                        return Err(at.error(
                            m.span(),
                            format!(
                                "`{}` is not an HTTP method: expected one of {}",
                                m.get_ref(),
                                METHODS.join(", ")
                            ),
                        ));
                    }
                    upper
                }
            };
            let url = template(at, &http.url, env)?;
            let scheme_ok = ["http://", "https://"]
                .iter()
                .any(|s| http.url.get_ref().starts_with(s));
            if !scheme_ok {
                return Err(at.error(
                    http.url.span(),
                    "`url` must start with http:// or https://".into(),
                ));
            }
            return Ok(Action::Http {
                url,
                method,
                headers: templates(at, &http.headers, env)?,
                body: http
                    .body
                    .as_ref()
                    .map(|b| template(at, b, env))
                    .transpose()?,
                timeout: duration(at, http.timeout.as_ref(), "30s")?,
            });
        }
        let Some(sql) = self.sql.as_ref().map(Spanned::get_ref) else {
            return Err(at.error(name_span, "no action".into()));
        };
        Ok(Action::Sql {
            statement: sql.statement.get_ref().clone(),
            params: sql
                .params
                .iter()
                .map(|p| template(at, p, env))
                .collect::<Result<_, _>>()?,
        })
    }
}
