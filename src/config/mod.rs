//! `jobs.toml`: raw serde structures become validated [`Config`] values in one
//! step, and every mistake is reported with its file:line:column.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono_tz::Tz;
use serde::Deserialize;

use crate::period::PeriodRule;
use crate::schedule::Schedule;
use crate::suggest::nearest;
use crate::template::{Template, TemplateError};

mod raw;
use raw::RawFile;

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
pub(crate) struct Locator<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Locator<'_> {
    pub(crate) fn line_col(&self, offset: usize) -> (usize, usize) {
        let before = &self.text[..offset.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        (line, column)
    }

    pub(crate) fn error(&self, span: Range<usize>, message: String) -> ConfigError {
        let (line, column) = self.line_col(span.start);
        ConfigError {
            place: format!("{}:{line}:{column}", self.path.display()),
            message,
        }
    }

    /// An error inside a string value: `offset` counts from the string's
    /// first character, after the opening quote.
    pub(crate) fn template_error(&self, span: Range<usize>, e: TemplateError) -> ConfigError {
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
