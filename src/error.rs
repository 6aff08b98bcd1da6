//! Why a command or a library call could not do its work, one variant per
//! thing a caller acts on; each front end words its own fields (a flag, a
//! JSON field, an option) in the message.

use chrono::{DateTime, Utc};

use crate::config::ConfigError;

/// Why a command (or a library call) could not do its work.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A refused configuration: a mistake in `jobs.toml` or in a job or
    /// setting given in code, with its place.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// No job of that name (an HTTP service's 404).
    #[error("{message}")]
    UnknownJob {
        /// The name asked for.
        job: String,
        /// What the scheduler has instead.
        message: String,
    },
    /// A label that is no period of the job, or a range that holds none:
    /// not a label of its period rule, a period a spring-forward skips, or
    /// one its schedule, calendar or active dates leave out.
    #[error("{field}: {message}")]
    NoSuchPeriod {
        /// The field that named it, in the front end's words.
        field: &'static str,
        /// The job.
        job: String,
        /// The label given.
        label: String,
        /// Why it is none.
        message: String,
    },
    /// A period that may not run yet: it has not started, or its fire is
    /// still ahead (run early, it would turn that scheduled run into a
    /// no-op; the `early` option runs it anyway).
    #[error("{field}: {message}")]
    NotDue {
        /// The field that named it, in the front end's words.
        field: &'static str,
        /// Its period key.
        period_key: String,
        /// When it may run: its start, or its fire.
        due_at: DateTime<Utc>,
        /// Whether the `early` option runs it now: its fire is ahead, but
        /// it has started (`false`: it has not started, and nothing runs
        /// it yet).
        early_runs_it: bool,
        /// Why not yet.
        message: String,
    },
    /// A bad argument or combination of them, its field named first.
    #[error("{0}")]
    Usage(String),
    /// The database failed or could not be reached; any URL in it is masked.
    #[error("{0}")]
    Database(String),
    /// Some other part of the environment failed.
    #[error("{0:#}")]
    Environment(anyhow::Error),
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
