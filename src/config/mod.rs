//! `jobs.toml`: raw serde structures become validated [`Config`] values in one
//! step, and every mistake is reported with its file:line:column.

use std::collections::BTreeMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use chrono_tz::Tz;
use serde::Deserialize;

use crate::fires::{FireRules, Timing};
use crate::period::PeriodRule;
use crate::schedule::Schedule;
use crate::suggest::nearest;
use crate::template::{Secrets, Template, TemplateError};
pub use address::DatabaseUrl;

pub mod address;
pub mod after;
pub mod code;
pub mod environment;
pub mod notify;
mod raw;
pub(crate) use raw::short;

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

/// The HTTP API's settings, from `[api]`.
#[derive(Debug, Clone)]
pub struct ApiSettings {
    /// How long an Idempotency-Key is remembered.
    pub key_ttl: Duration,
    /// Who may call it.
    pub tokens: Vec<Token>,
}

/// A bearer token of the API.
#[derive(Debug, Clone)]
pub struct Token {
    /// Its name: the scope of its Idempotency-Keys, and who asked for a run.
    pub name: String,
    /// Its secret, hashed.
    pub secret: Secret,
    /// What it may do.
    pub allow: Allow,
}

/// What a token may do.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Allow {
    /// Read jobs, periods and runs.
    pub read: bool,
    /// Start runs.
    pub trigger: bool,
    /// Pause, resume, release.
    pub operate: bool,
}

/// A token's secret, kept only as its SHA-256 hash, compared in constant
/// time; never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(Option<[u8; 32]>);

impl Secret {
    fn new(secret: &str) -> Secret {
        use sha2::Digest;
        Secret((!secret.is_empty()).then(|| sha2::Sha256::digest(secret.as_bytes()).into()))
    }

    fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// Whether `given` is this secret, in time independent of where they
    /// differ.
    pub fn matches(&self, given: &str) -> bool {
        use sha2::Digest;
        use subtle::ConstantTimeEq;
        let Some(hash) = &self.0 else {
            return false;
        };
        let given: [u8; 32] = sha2::Sha256::digest(given.as_bytes()).into();
        hash.ct_eq(&given).into()
    }

    /// The HMAC-SHA256 of `message` under this secret (keyed by its hash,
    /// never by the secret itself): what signs the console's sessions, so
    /// that every replica with the same token checks them, and a changed
    /// or removed secret ends them. `None` for a token without a secret.
    pub fn seal(&self, message: &[u8]) -> Option<[u8; 32]> {
        use hmac::Mac;
        let hash = self.0.as_ref()?;
        let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(hash)
            .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
        mac.update(b"scheduler console session\0");
        mac.update(message);
        Some(mac.finalize().into_bytes().into())
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
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
    /// The database, unless `--database-url` or `DATABASE_URL` says
    /// otherwise; a relative SQLite path is taken from the directory of
    /// `jobs.toml`.
    pub database_url: Option<DatabaseUrl>,
    /// `[scheduler].namespace`: the prefix (`staging/`) of every job's name
    /// as the database knows it, so several deployments share one database
    /// without colliding.
    pub namespace: Option<String>,
    /// Why `database_url` could not be read, when a command that opens no
    /// database read the file leniently (an unset `${VAR}` in it): a
    /// command that needs the database reports it.
    pub database_url_error: Option<ConfigError>,
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

/// A child process.
#[derive(Debug, Clone)]
pub struct ProcessAction {
    /// What to execute.
    pub program: Program,
    /// Working directory.
    pub workdir: Option<Template>,
    /// Extra environment variables.
    pub env: Vec<(String, Template)>,
    /// What it inherits of the scheduler's environment.
    pub inherit: environment::Inherit,
}

/// An HTTP request carrying `Idempotency-Key`.
#[derive(Debug, Clone)]
pub struct HttpAction {
    /// The address.
    pub url: Template,
    /// GET, POST, …
    pub method: String,
    /// Extra headers.
    pub headers: Vec<(String, Template)>,
    /// Request body.
    pub body: Option<Template>,
    /// Request timeout.
    pub timeout: Duration,
}

/// A job's one action. The larger ones are boxed, so that a job of the
/// small ones (`sql`, above all, 10,000 of which are one burst) is 100
/// bytes smaller.
#[derive(Debug, Clone)]
pub enum Action {
    /// A child process.
    Process(Box<ProcessAction>),
    /// An HTTP request carrying `Idempotency-Key`.
    Http(Box<HttpAction>),
    /// An async function of the embedding program (a code job of the
    /// library).
    Code(crate::handler::Handler),
    /// A statement run in the transaction that marks the claim succeeded.
    Sql {
        /// With `$1`, `$2`, … for the params.
        statement: String,
        /// Bound, never spliced.
        params: Vec<Template>,
    },
}

impl Action {
    /// Everything it does, values included: only for the definition
    /// fingerprint.
    fn exact(&self) -> String {
        let t = Template::exact;
        let pairs = |pairs: &[(String, Template)]| -> Vec<(String, String)> {
            pairs.iter().map(|(k, v)| (k.clone(), t(v))).collect()
        };
        match self {
            Action::Process(process) => {
                let program = match &process.program {
                    Program::Command(args) => {
                        format!("command {:?}", args.iter().map(t).collect::<Vec<_>>())
                    }
                    Program::Shell(script) => format!("shell {:?}", t(script)),
                };
                let mut text = format!(
                    "{program} {:?} {:?}",
                    process.workdir.as_ref().map(t),
                    pairs(&process.env)
                );
                // Only where given, so that older definitions keep their
                // fingerprints.
                if let Some(only) = &process.inherit.only {
                    text.push_str(&format!(" inherit {only:?}"));
                }
                text
            }
            Action::Http(http) => format!(
                "http {} {:?} {:?} {:?} {:?}",
                http.method,
                t(&http.url),
                pairs(&http.headers),
                http.body.as_ref().map(t),
                http.timeout
            ),
            Action::Sql { statement, params } => format!(
                "sql {statement:?} {:?}",
                params.iter().map(t).collect::<Vec<_>>()
            ),
            Action::Code(handler) => format!("code {handler:?}"),
        }
    }

    /// The values `${NAME}` put into it.
    fn secrets(&self) -> Secrets {
        match self {
            Action::Process(process) => {
                let program: Vec<&Template> = match &process.program {
                    Program::Command(args) => args.iter().collect(),
                    Program::Shell(script) => vec![script],
                };
                Secrets::of(
                    program
                        .into_iter()
                        .chain(&process.workdir)
                        .chain(process.env.iter().map(|(_, v)| v)),
                )
            }
            Action::Http(http) => Secrets::of(
                std::iter::once(&http.url)
                    .chain(http.headers.iter().map(|(_, v)| v))
                    .chain(&http.body),
            ),
            Action::Sql { params, .. } => Secrets::of(params),
            Action::Code(_) => Secrets::default(),
        }
    }
}

/// A job's [`Job::definition`]: 12 hex digits, held in place (a `String`
/// would cost every job a heap block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fingerprint([u8; 12]);

impl Fingerprint {
    /// The digits.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
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
    /// How its fires move to working days and are delayed (which fires
    /// exist at all is the schedule's: its active window, a skipping
    /// calendar).
    pub fires: FireRules,
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
    /// A period must have succeeded this long after its fire, or it is
    /// late.
    pub deadline: Option<Duration>,
    /// The upstream periods each of its periods waits for.
    pub after: after::After,
    /// How far back missed periods are owed: `[scheduler].catch_up`,
    /// copied here so that the one rule of what a job owes
    /// ([`Job::owed_since`]) needs nothing but the job.
    pub catch_up: Duration,
    /// A fingerprint of what it does and when (schedule, zone, period
    /// rule, action after `${VAR}` expansion): 12 hex digits of a SHA-256,
    /// recorded on every attempt, so `history` shows where it changed. A
    /// hash, never the values themselves.
    pub definition: Fingerprint,
    /// The values `${NAME}` put into its action, masked in every message
    /// about it.
    pub secrets: Secrets,
}

impl Job {
    /// Its fires as they run: the one answer to when a period is due.
    pub fn timing(&self) -> Timing<'_> {
        Timing::new(&self.name, &self.schedule, &self.period, &self.fires)
    }

    /// The instant from which the job's fires are owed, given when a
    /// `serve` or `run JOB` first saw it (docs/commands.md): the latest fire at
    /// that sighting if it lies within `catch_up` of it (a platform cron
    /// container starts minutes after its fire: that fire is why it
    /// started), else the sighting itself. A fire before this instant is
    /// *before first seen*: no mode runs it on its own, no view counts it
    /// as missed, late or waiting. One rule for the timer, the scan, a
    /// reload, a resume, `run JOB`, `--dry-run` and every view.
    pub fn owed_since(&self, first_seen: DateTime<Utc>) -> DateTime<Utc> {
        let window = TimeDelta::from_std(self.catch_up).unwrap_or(TimeDelta::MAX);
        self.timing()
            .latest(first_seen)
            .map(|fire| fire.at)
            .filter(|at| first_seen - *at <= window)
            .map_or(first_seen, |at| at.min(first_seen))
    }

    /// From when the job owes its fires: as its first sighting recorded it
    /// (`recorded`), else worked out from when it was first seen
    /// ([`Job::owed_since`]), else, never seen, as a first sighting now
    /// would have it.
    pub fn owed_from(
        &self,
        first_seen: Option<DateTime<Utc>>,
        recorded: Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> DateTime<Utc> {
        recorded.unwrap_or_else(|| self.owed_since(first_seen.unwrap_or(now)))
    }

    /// Computes [`Job::definition`] from the rest.
    fn fingerprint(&self) -> Fingerprint {
        use sha2::Digest;
        let mut text = format!(
            "{}\n{}\n{:?}\n{}",
            self.schedule.source(),
            self.schedule.zone().name(),
            self.period,
            self.action.exact()
        );
        // Which fires exist and when they run: only where set, so a job
        // without them keeps the fingerprint it had.
        let calendar = |c: &crate::calendar::Calendar| {
            let holidays: Vec<String> = c.holidays().map(|d| d.to_string()).collect();
            format!("{} {:?} {}", c.name, c.weekdays(), holidays.join(","))
        };
        if let Some(days) = self.schedule.days() {
            let working = days.working.as_deref().map(calendar);
            text += &format!("\n{:?} {:?} {working:?}", days.from, days.until);
        }
        if let Some(shift) = &self.fires.shift {
            text += &format!("\n{} {}", shift.to, calendar(&shift.calendar));
        }
        if let Some(jitter) = self.fires.jitter {
            text += &format!("\njitter {}", jitter.as_secs());
        }
        let hash = sha2::Sha256::digest(text.as_bytes());
        let mut digits = [0; 12];
        // Six bytes make exactly twelve hex digits.
        let _ = hex::encode_to_slice(&hash[..6], &mut digits);
        Fingerprint(digits)
    }

    /// Fills in what is derived from the rest: [`Job::definition`] and
    /// [`Job::secrets`].
    pub(crate) fn derive(&mut self) {
        self.definition = self.fingerprint();
        self.secrets = self.action.secrets();
    }
}

/// A loaded `jobs.toml`.
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
        let vars = raw::Vars::new(env, lenient.jobs);
        let api_vars = raw::Vars::new(env, lenient.api);
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
                let word = raw::ends_the_transaction(statement, raw::Dialect::SQLITE)?;
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

    /// The job called `name`, or an error that suggests the nearest name.
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
            ConfigError {
                place: "JOB".into(),
                message: format!("no job named `{name}` in {}{hint}", self.path.display()),
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

/// Turns byte offsets into file:line:column places.
pub(crate) struct Locator<'a> {
    path: &'a Path,
    text: &'a str,
}

impl Locator<'_> {
    /// The directory of the file, as an absolute path.
    pub(crate) fn directory(&self) -> PathBuf {
        let dir = match self.path.parent() {
            Some(dir) if !dir.as_os_str().is_empty() => dir,
            _ => Path::new("."),
        };
        std::path::absolute(dir).unwrap_or_else(|_| dir.to_owned())
    }

    pub(crate) fn line_col(&self, offset: usize) -> (usize, usize) {
        let before = &self.text[..offset.min(self.text.len())];
        let line = before.matches('\n').count() + 1;
        let column = before.rsplit('\n').next().map_or(0, |l| l.chars().count()) + 1;
        (line, column)
    }

    /// The warning for `${name}`, not set: at its first place in the file.
    fn unset(&self, name: &str) -> ConfigError {
        let written = format!("${{{name}}}");
        let offset = self
            .text
            .match_indices(&written)
            .find(|(i, _)| !self.text[..*i].ends_with('$'))
            .map_or(0, |(i, _)| i);
        self.error(
            offset..offset + written.len(),
            format!("environment variable `{name}` is not set (named by `{written}`)"),
        )
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
        let mut message = e.message().trim().to_owned();
        if let Some(span) = e.span()
            && message.starts_with("invalid type: string")
            && message.contains("expected a sequence")
        {
            let line_start = self.text[..span.start.min(self.text.len())]
                .rfind('\n')
                .map_or(0, |i| i + 1);
            let key = self.text[line_start..span.start.min(self.text.len())]
                .trim_end()
                .trim_end_matches('=')
                .trim();
            if key == "command" {
                let value = self.text.get(span.clone()).unwrap_or("\"…\"");
                message = format!(
                    "`command` is a string, but it must be an array of the program and its arguments, run without a shell, e.g. command = [\"./bin/bill\", \"--month\", \"{{period}}\"]; to run a command line through /bin/sh, write shell = {value}"
                );
            }
            if key == "after" {
                let value = self.text.get(span.clone()).unwrap_or("\"…\"");
                message = format!(
                    "`after` is a string, but it must be an array of job names: after = [{value}]"
                );
            }
        }
        if let Some(span) = e.span()
            && message.starts_with("invalid type: ")
            && !message.contains("expected a sequence")
        {
            let at = span.start.min(self.text.len());
            let line_start = self.text[..at].rfind('\n').map_or(0, |i| i + 1);
            let key = self.text[line_start..at]
                .rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .find(|word| !word.is_empty())
                .unwrap_or("");
            let value = self.text.get(span.clone()).unwrap_or("").trim();
            if let Some(said) = wrong_type(key, value, &message) {
                message = said;
            }
        }
        if let Some(span) = e.span()
            && message.starts_with("invalid type: map")
            && message.contains("expected a sequence")
            && self.text[span.start.min(self.text.len())..]
                .trim_start()
                .starts_with("[job]")
        {
            message = "`[job]` is one table, but jobs are an array of tables: write `[[job]]` above each job".into();
        }
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

/// For serde's "invalid type: integer `3`, expected struct RawRetry" on
/// `key` (written `value`), what to write instead, in the file's words:
/// "`retry` is a number, but it must be a table: retry = { attempts = 3 }".
/// No name of an internal type reaches a user: a key not listed here gets
/// serde's message with the type names said in TOML's words.
fn wrong_type(key: &str, value: &str, message: &str) -> Option<String> {
    let rest = message.strip_prefix("invalid type: ")?;
    let given = match rest.split([' ', ',']).next().unwrap_or("") {
        "string" => "a string",
        "integer" | "floating" => "a number",
        "boolean" => "true or false",
        "sequence" => "an array",
        "map" => "a table",
        _ => "a value of another type",
    };
    let string = value.starts_with('"') || value.starts_with('\'');
    let number = value.trim_matches(['"', '\'']);
    let number = number.parse::<u64>().ok().filter(|_| !number.is_empty());
    const DURATIONS: [&str; 11] = [
        "timeout",
        "deadline",
        "lease",
        "catch_up",
        "shutdown_grace",
        "scan_interval",
        "keep",
        "jitter",
        "key_ttl",
        "backoff",
        "max_backoff",
    ];
    let (must, example) = match key {
        "sql" if string => ("a table", format!("sql = {{ statement = {value} }}")),
        "sql" => ("a table", "sql = { statement = \"SELECT 1\" }".to_owned()),
        "http" if string => ("a table", format!("http = {{ url = {value} }}")),
        "http" => (
            "a table",
            "http = { url = \"https://example.com/hook\" }".to_owned(),
        ),
        "retry" => (
            "a table",
            format!(
                "retry = {{ attempts = {}, backoff = \"1m\" }}",
                number.unwrap_or(3)
            ),
        ),
        "env" | "headers" => (
            "a table of names and values",
            format!("{key} = {{ NAME = \"value\" }}"),
        ),
        "dst" => (
            "a table",
            "dst = { gap = \"shift\", repeat = \"first\" }".to_owned(),
        ),
        "concurrency" | "max_running" | "attempts" => (
            "a whole number, without quotes",
            format!("{key} = {}", number.unwrap_or(2)),
        ),
        key if DURATIONS.contains(&key) => (
            "a duration in quotes",
            format!(
                "{key} = \"{}\"",
                number.map_or("30s".to_owned(), |n| format!("{n}s"))
            ),
        ),
        _ => {
            let said = message
                .replace("expected a map", "expected a table")
                .replace("expected a sequence", "expected an array")
                .replace("expected i64", "expected a whole number")
                .replace("expected u32", "expected a whole number")
                .replace("expected u64", "expected a whole number");
            return match said.find("expected struct ") {
                Some(at) => Some(format!("{}expected a table", &said[..at])),
                None => (said != message).then_some(said),
            };
        }
    };
    Some(format!(
        "`{key}` is {given}, but it must be {must}: {example}"
    ))
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

/// The top-level tables of jobs.toml, as written: `[scheduler]`, `[api]`
/// and every `[[job]]`.
#[derive(Default)]
struct Sections<'t> {
    settings: Option<toml::Spanned<toml::de::DeValue<'t>>>,
    api: Option<toml::Spanned<toml::de::DeValue<'t>>>,
    jobs: Vec<toml::Spanned<toml::de::DeValue<'t>>>,
    notify: Vec<toml::Spanned<toml::de::DeValue<'t>>>,
    calendars: Vec<toml::Spanned<toml::de::DeValue<'t>>>,
}

impl<'t> Sections<'t> {
    /// Sorts the file's tables; an unknown one is an error.
    fn of(
        root: toml::Spanned<toml::de::DeTable<'t>>,
        at: &Locator<'_>,
        errors: &mut Vec<ConfigError>,
    ) -> Self {
        use serde::de::IntoDeserializer;
        let mut sections = Sections::default();
        for (key, value) in root.into_inner() {
            match key.get_ref().as_ref() {
                "scheduler" => sections.settings = Some(value),
                "api" => sections.api = Some(value),
                "job" => match value.get_ref().as_array() {
                    Some(jobs) => sections.jobs.extend(jobs.iter().cloned()),
                    None => {
                        if let Err(e) = Vec::<raw::RawJob>::deserialize(value.into_deserializer()) {
                            errors.push(at.toml_error(&e));
                        }
                    }
                },
                "calendar" => match value.get_ref().as_array() {
                    Some(calendars) => sections.calendars.extend(calendars.iter().cloned()),
                    None => {
                        let raw = Vec::<raw::RawCalendar>::deserialize(value.into_deserializer());
                        if let Err(e) = raw {
                            errors.push(at.toml_error(&e));
                        }
                    }
                },
                "notify" => match value.get_ref().as_array() {
                    Some(notify) => sections.notify.extend(notify.iter().cloned()),
                    None => {
                        let raw = Vec::<notify::RawNotify>::deserialize(value.into_deserializer());
                        if let Err(e) = raw {
                            errors.push(at.toml_error(&e));
                        }
                    }
                },
                other => {
                    let hint = nearest(other, ["scheduler", "api", "job", "notify", "calendar"])
                        .map(|n| format!("; did you mean `{n}`?"))
                        .unwrap_or_default();
                    errors.push(at.error(
                        key.span(),
                        format!(
                            "unknown field `{other}`, expected `scheduler`, `api`, `job`, `notify` or `calendar`{hint}"
                        ),
                    ));
                }
            }
        }
        sections
    }

    /// `[scheduler]`, validated; a bad one is an error, and the jobs are
    /// still checked against the defaults (but not `keep` against a
    /// `catch_up` the file may set otherwise).
    fn settings(
        &self,
        at: &Locator<'_>,
        vars: &raw::Vars<'_>,
        errors: &mut Vec<ConfigError>,
    ) -> Result<Settings, ConfigError> {
        use serde::de::IntoDeserializer;
        let settings = self
            .settings
            .clone()
            .map(|value| raw::RawSettings::deserialize(value.into_deserializer()))
            .transpose()
            .map_err(|e| at.toml_error(&e))
            .and_then(|raw| raw.unwrap_or_default().validate(at, vars));
        match settings {
            Ok(settings) => Ok(settings),
            Err(e) => {
                errors.push(e);
                let mut defaults = raw::RawSettings::default().validate(at, vars)?;
                defaults.catch_up = Duration::ZERO;
                Ok(defaults)
            }
        }
    }

    /// `[api]`, validated, if the file has one.
    fn api(
        &self,
        at: &Locator<'_>,
        vars: &raw::Vars<'_>,
        errors: &mut Vec<ConfigError>,
    ) -> Option<ApiSettings> {
        use serde::de::IntoDeserializer;
        let api = self
            .api
            .clone()
            .map(|value| raw::RawApi::deserialize(value.into_deserializer()))
            .transpose()
            .map_err(|e| at.toml_error(&e))
            .and_then(|raw| raw.map(|raw| raw.validate(at, vars)).transpose());
        api.unwrap_or_else(|e| {
            errors.push(e);
            None
        })
    }

    /// Every `[[calendar]]`, validated, names unique.
    fn calendars(&mut self, at: &Locator<'_>, errors: &mut Vec<ConfigError>) -> raw::Calendars {
        use serde::de::IntoDeserializer;
        let mut calendars = raw::Calendars::new();
        for value in std::mem::take(&mut self.calendars) {
            let span = value.span();
            let raw = match raw::RawCalendar::deserialize(value.into_deserializer()) {
                Ok(raw) => raw,
                Err(e) => {
                    errors.push(at.toml_error(&e));
                    continue;
                }
            };
            let name = raw.name().to_owned();
            if calendars.contains_key(&name) {
                errors.push(at.error(
                    span,
                    format!("calendar name `{name}` is used twice; each needs its own"),
                ));
                continue;
            }
            // A calendar with a mistake is still known by name: its jobs
            // are not told it is missing as well.
            let calendar = raw
                .validate(at)
                .map_err(|e| errors.push(e))
                .ok()
                .map(std::sync::Arc::new);
            calendars.insert(name, calendar);
        }
        calendars
    }

    /// Every `[[job]]`, validated, names unique; with the `${VAR}`s each
    /// one names that are not set (job, variable).
    fn jobs(
        mut self,
        at: &Locator<'_>,
        settings: &Settings,
        vars: &raw::Vars<'_>,
        errors: &mut Vec<ConfigError>,
    ) -> (Vec<Job>, Vec<(String, String)>) {
        use serde::de::IntoDeserializer;
        let calendars = self.calendars(at, errors);
        let mut jobs: Vec<Job> = Vec::with_capacity(self.jobs.len());
        let mut incomplete: Vec<(String, String)> = Vec::new();
        let mut seen: BTreeMap<String, Range<usize>> = BTreeMap::new();
        // Every job's name as written, its own mistakes or not: what an
        // `after` may name.
        let names: Vec<String> = self
            .jobs
            .iter()
            .filter_map(|value| match value.get_ref() {
                toml::de::DeValue::Table(table) => match table.get("name")?.get_ref() {
                    toml::de::DeValue::String(name) => Some(name.to_string()),
                    _ => None,
                },
                _ => None,
            })
            .collect();
        for value in self.jobs {
            let raw_job = match raw::RawJob::deserialize(value.into_deserializer()) {
                Ok(raw_job) => raw_job,
                Err(e) => {
                    errors.push(at.toml_error(&e));
                    continue;
                }
            };
            let name_span = raw_job.name.span();
            let mark = vars.mark();
            let mut job = match raw_job.validate(at, settings, vars, &calendars) {
                Ok(job) => job,
                Err(e) => {
                    errors.push(e);
                    continue;
                }
            };
            if let Some(first) = seen.get(&job.name) {
                let line = at.line_col(first.start).0;
                errors.push(at.error(
                    name_span,
                    format!(
                        "job name `{}` is already used at line {line}; job names must be unique",
                        job.name
                    ),
                ));
                continue;
            }
            seen.insert(job.name.clone(), name_span);
            if let Action::Process(process) = &mut job.action {
                process.inherit.named = vars.names_since(mark);
            }
            for name in vars.missed_since(mark) {
                incomplete.push((job.name.clone(), name));
            }
            jobs.push(job);
        }
        // With other mistakes in the file, an `after` that names no job is
        // told now, with them, not in a later round (linking the jobs waits
        // for a file without mistakes).
        if !errors.is_empty() {
            for job in &jobs {
                errors.extend(job.after.unknown_names(&names));
            }
        }
        (jobs, incomplete)
    }
}

/// Every `[[notify]]`, validated, names unique.
fn notifiers(
    values: Vec<toml::Spanned<toml::de::DeValue<'_>>>,
    at: &Locator<'_>,
    vars: &raw::Vars<'_>,
    jobs: &[Job],
    errors: &mut Vec<ConfigError>,
) -> (Vec<notify::Notifier>, Vec<(String, String)>) {
    use serde::de::IntoDeserializer;
    let mut notifiers: Vec<notify::Notifier> = Vec::new();
    let mut incomplete = Vec::new();
    for value in values {
        let span = value.span();
        let mark = vars.mark();
        let validated = notify::RawNotify::deserialize(value.into_deserializer())
            .map_err(|e| at.toml_error(&e))
            .and_then(|raw| raw.validate(at, vars, jobs));
        match validated {
            Ok(n) if notifiers.iter().any(|m| m.name == n.name) => errors.push(at.error(
                span,
                format!(
                    "notifier name `{}` is used twice; each needs its own",
                    n.name
                ),
            )),
            Ok(n) => {
                for name in vars.missed_since(mark) {
                    incomplete.push((n.name.clone(), name));
                }
                notifiers.push(n);
            }
            Err(e) => errors.push(e),
        }
    }
    (notifiers, incomplete)
}

/// Every value the file read from the environment that is not public is
/// a secret, and so is the database password: each job masks them, and a
/// job's process never inherits a variable that holds one.
fn seal(
    jobs: &mut [Job],
    vars: &raw::Vars<'_>,
    api_vars: &raw::Vars<'_>,
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
