//! The error kinds a command can end in, and the exit code of each.

use crate::config::ConfigError;

/// Why a command could not do its work.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A mistake in `jobs.toml`.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A bad flag or argument, named in the message.
    #[error("{0}")]
    Usage(String),
    /// The database failed or could not be reached; any URL in it is masked.
    #[error("{0}")]
    Database(String),
    /// Some other part of the environment failed.
    #[error("{0:#}")]
    Environment(anyhow::Error),
}

impl Error {
    /// The process exit code: 2 for usage and configuration, 3 for the
    /// database and the environment.
    pub fn exit_code(&self) -> u8 {
        match self {
            Error::Config(_) | Error::Usage(_) => 2,
            Error::Database(_) | Error::Environment(_) => 3,
        }
    }
}

/// How a command that did its work ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Everything asked for is done (or is being done elsewhere).
    Done,
    /// At least one run failed.
    RunFailed,
}

impl Outcome {
    /// 0 or 1.
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Done => 0,
            Outcome::RunFailed => 1,
        }
    }
}

/// A database URL with its password replaced by `***`.
pub fn mask_url(url: &str) -> String {
    match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        _ => url.to_owned(),
    }
}

/// `text` with every occurrence of `url`'s password masked.
pub fn mask_password_in(text: &str, url: &str) -> String {
    match url::Url::parse(url)
        .ok()
        .and_then(|u| u.password().map(str::to_owned))
    {
        Some(password) if !password.is_empty() => text.replace(&password, "***"),
        _ => text.to_owned(),
    }
}
