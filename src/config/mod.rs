//! `jobs.toml`: raw serde structures become validated [`Config`] values in one
//! step, and every mistake is reported with its file:line:column.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::suggest::nearest;
use crate::template::Secrets;
pub use address::DatabaseUrl;
pub use job::{
    Action, Fingerprint, HttpAction, Job, Missed, Policy, ProcessAction, Program, Retry,
};
pub(crate) use rules::short;
pub use secret::Secret;
pub use settings::{Allow, ApiSettings, Settings, Token};

pub mod address;
pub mod after;
pub mod code;
pub mod environment;
#[cfg(feature = "config-file")]
mod file;
#[cfg(feature = "config-file")]
pub use file::UNREADABLE;
mod job;
#[cfg(feature = "config-file")]
mod locator;
pub mod notify;
#[cfg(feature = "config-file")]
mod parts;
#[cfg(feature = "config-file")]
mod raw;
mod rules;
mod secret;
#[cfg(feature = "config-file")]
mod sections;
mod settings;
mod sql;
#[cfg(feature = "config-file")]
mod validate;
#[cfg(feature = "config-file")]
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

/// A loaded `jobs.toml`.
/// Why a build without an HTTP client refuses an `http` job or a notifier.
pub const NO_HTTP: &str = "this build of scheduler sends no HTTP requests: its `http-actions` feature is off (the scheduler binary has it)";

/// Why a `command` or `shell` job is refused by a build without processes.
pub const NO_PROCESS: &str = "this build of scheduler starts no processes: its `process-actions` feature is off (the scheduler binary has it)";

/// A job's `output_max` unless it says otherwise: 16 MiB.
pub const OUTPUT_MAX: u64 = 16 * 1024 * 1024;

/// The sizes `output_max` may take: 8 KiB to 1 GiB.
pub const OUTPUT_MAX_RANGE: std::ops::RangeInclusive<u64> = 8 * 1024..=1024 * 1024 * 1024;

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
    pub jobs: Vec<Arc<Job>>,
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

impl Config {
    /// Jobs given in code only, with `settings`: no file.
    pub fn in_code(settings: Settings) -> Config {
        Config {
            path: PathBuf::from(IN_CODE),
            settings,
            api: None,
            jobs: Vec::new(),
            secrets: Secrets::default(),
            incomplete: Vec::new(),
            notifiers: Vec::new(),
            incomplete_notifiers: Vec::new(),
        }
    }

    /// Puts every job in `namespace` (`NAMESPACE/NAME`, unique in the
    /// database), and every name that refers to one: a notifier's `jobs`,
    /// the jobs left incomplete.
    pub(crate) fn put_in_namespace(&mut self, namespace: &str) {
        let full = |name: &str| format!("{namespace}/{name}");
        for job in &mut self.jobs {
            let job = Arc::make_mut(job);
            job.name = full(&job.name).into();
        }
        for named in self.notifiers.iter_mut().filter_map(|n| n.jobs.as_mut()) {
            for job in named {
                *job = full(job);
            }
        }
        for (job, _) in &mut self.incomplete {
            *job = full(job);
        }
    }

    /// Masks `more` too in every message about any job: the password of a
    /// database URL given on the command line.
    pub fn mask_also(&mut self, more: &[String]) {
        self.secrets = self.secrets.with(more);
        for job in &mut self.jobs {
            Arc::make_mut(job).secrets = self.secrets.clone();
        }
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
            .find(|j| *j.name == *full)
            .map(|j| &**j)
            .ok_or_else(|| nearest(name, self.jobs.iter().map(|j| self.short_name(j))))
    }

    /// A job's name as its file writes it, without the namespace.
    fn short_name<'a>(&self, job: &'a Job) -> &'a str {
        job.name.split_once('/').map_or(&job.name, |(_, name)| name)
    }
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
            .map(|job| (&*job.name, job.definition.as_str()))
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
