//! The settings of a file: `[scheduler]`, the process's, and `[api]`, the
//! HTTP API's and its tokens'.

use std::time::Duration;

use chrono_tz::Tz;

use super::secret::Secret;
use super::{ConfigError, DatabaseUrl};

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

impl Settings {
    /// The defaults of an empty `[scheduler]` table.
    pub fn defaults() -> Settings {
        Settings {
            timezone: Tz::UTC,
            lease: Duration::from_secs(60),
            catch_up: Duration::from_secs(24 * 3600),
            shutdown_grace: Duration::from_secs(30),
            max_running: 16,
            scan_interval: Duration::from_secs(5),
            database_url: None,
            namespace: None,
            database_url_error: None,
        }
    }
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
