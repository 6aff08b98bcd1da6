//! The error kinds a command can end in, and the exit code of each.

use crate::config::ConfigError;

/// Why a command (or a library call) could not do its work.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
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
    /// Standard output was closed by its reader (`| head`): the command
    /// stopped quietly, as a process killed by SIGPIPE would.
    StdoutClosed,
}

impl Outcome {
    /// 0, 1, or 141 (128 + SIGPIPE) for a closed standard output.
    pub fn exit_code(self) -> u8 {
        match self {
            Outcome::Done => 0,
            Outcome::RunFailed => 1,
            Outcome::StdoutClosed => 141,
        }
    }
}

/// Writes one line to standard output; `Err(Unread::Closed)` when
/// the reader has gone (`| head`), any other failure as an error.
pub fn say(line: std::fmt::Arguments<'_>) -> Result<(), Unread> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_fmt(line)
        .and_then(|()| out.write_all(b"\n"))
        .map_err(Unread::from)
}

/// Why writing to standard output stopped a command.
#[derive(Debug)]
pub enum Unread {
    /// The reader closed the pipe: end quietly with [`Outcome::StdoutClosed`].
    Closed,
    /// Another failure, reported.
    Failed(Error),
}

impl From<std::io::Error> for Unread {
    fn from(e: std::io::Error) -> Unread {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Unread::Closed
        } else {
            Unread::Failed(Error::Environment(anyhow::anyhow!(
                "cannot write to stdout: {e}"
            )))
        }
    }
}

impl From<ConfigError> for Unread {
    fn from(e: ConfigError) -> Unread {
        Unread::Failed(Error::Config(e))
    }
}

impl From<Error> for Unread {
    fn from(e: Error) -> Unread {
        Unread::Failed(e)
    }
}

impl Unread {
    /// The command's result once it stopped.
    pub fn into_result(self) -> Result<Outcome, Error> {
        match self {
            Unread::Closed => Ok(Outcome::StdoutClosed),
            Unread::Failed(e) => Err(e),
        }
    }
}

/// `text` with control characters (a job's colours, a carriage return) as
/// `\x1b`-style escapes, tabs kept: it never moves a terminal's cursor or
/// forges another line.
pub fn printable(text: &str) -> String {
    let mut shown = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\t' => shown.push(c),
            c if c.is_control() && (c as u32) < 0x100 => {
                shown.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => shown.extend(c.escape_unicode()),
            c => shown.push(c),
        }
    }
    shown
}
