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

/// Writes one line to standard output; `Err(Stop::Closed)` when
/// the reader has gone (`| head`), any other failure as an error.
pub fn say(line: std::fmt::Arguments<'_>) -> Result<(), Stop> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    out.write_fmt(line)
        .and_then(|()| out.write_all(b"\n"))
        .map_err(Stop::from)
}

/// Why writing to standard output stopped a command.
#[derive(Debug)]
pub enum Stop {
    /// The reader closed the pipe: end quietly with [`Outcome::StdoutClosed`].
    Closed,
    /// Another failure, reported.
    Failed(Error),
}

impl From<std::io::Error> for Stop {
    fn from(e: std::io::Error) -> Stop {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            Stop::Closed
        } else {
            Stop::Failed(Error::Environment(anyhow::anyhow!(
                "cannot write to stdout: {e}"
            )))
        }
    }
}

impl From<ConfigError> for Stop {
    fn from(e: ConfigError) -> Stop {
        Stop::Failed(Error::Config(e))
    }
}

impl From<Error> for Stop {
    fn from(e: Error) -> Stop {
        Stop::Failed(e)
    }
}

impl Stop {
    /// The command's result once it stopped.
    pub fn into_result(self) -> Result<Outcome, Error> {
        match self {
            Stop::Closed => Ok(Outcome::StdoutClosed),
            Stop::Failed(e) => Err(e),
        }
    }
}

/// A database URL with its password replaced by `***`: the one in the
/// user part and any `password=` query parameter, also in a URL that does
/// not parse.
pub fn mask_url(url: &str) -> String {
    let masked = match url::Url::parse(url) {
        Ok(mut parsed) if parsed.password().is_some() => {
            let _ = parsed.set_password(Some("***"));
            parsed.to_string()
        }
        Ok(parsed) if parsed.has_host() => url.to_owned(),
        // No host: `postgres:/user:pw@host/db` parses, as a path.
        _ => match user_password(url, true) {
            Some(range) => format!("{}***{}", &url[..range.start], &url[range.end..]),
            None => url.to_owned(),
        },
    };
    mask_query_passwords(&masked)
}

/// `text` with every occurrence of `url`'s password (as written and
/// decoded, and any `password=` parameter) masked.
pub fn mask_password_in(text: &str, url: &str) -> String {
    let mut secrets = url_passwords(url);
    // Longest first, so a password that contains another is masked whole.
    secrets.sort_by_key(|s| std::cmp::Reverse(s.len()));
    let mut text = text.replace(url, &mask_url(url));
    for secret in secrets.iter().filter(|s| !s.is_empty()) {
        text = text.replace(secret.as_str(), "***");
    }
    text
}

/// The passwords a database URL holds, parsable or not: the user part's
/// and any `password=` parameter's, as written and decoded.
pub fn url_passwords(url: &str) -> Vec<String> {
    let mut secrets: Vec<String> = Vec::new();
    if let Some(range) = user_password(url, false) {
        secrets.push(url[range].to_owned());
    }
    if let Some(password) = url::Url::parse(url)
        .ok()
        .and_then(|u| u.password().map(str::to_owned))
    {
        secrets.push(password);
    }
    secrets.extend(query_passwords(url).map(|r| url[r].to_owned()));
    let decoded: Vec<String> = secrets
        .iter()
        .filter_map(|s| {
            url::form_urlencoded::parse(format!("x={s}").as_bytes())
                .next()
                .map(|(_, v)| v.into_owned())
        })
        .collect();
    secrets.extend(decoded);
    secrets.retain(|s| !s.is_empty());
    secrets.sort();
    secrets.dedup();
    secrets
}

/// Where the password of `scheme://user:password@host…` is, found by text,
/// also with one slash or none after the scheme: after the first `:` of the
/// user part, up to the last `@`. With `lone`, a user part without a `:`
/// is taken whole (`postgres:PASSWORD@host` may be a password).
fn user_password(url: &str, lone: bool) -> Option<std::ops::Range<usize>> {
    let scheme = url
        .find(':')
        .filter(|at| {
            let scheme = &url[..*at];
            scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "+.-".contains(c))
        })
        .map_or(0, |at| at + 1);
    let start = scheme + url[scheme..].len() - url[scheme..].trim_start_matches('/').len();
    let rest = &url[start..];
    let at = rest.rfind('@')?;
    match rest[..at].find(':') {
        Some(colon) => Some(start + colon + 1..start + at),
        None if lone && at > 0 => Some(start..start + at),
        None => None,
    }
}

/// Where the values of `password=` parameters are.
fn query_passwords(url: &str) -> impl Iterator<Item = std::ops::Range<usize>> + '_ {
    let lower = url.to_ascii_lowercase();
    let starts: Vec<usize> = lower
        .match_indices("password=")
        .map(|(i, m)| i + m.len())
        .collect();
    starts.into_iter().map(move |start| {
        let end = url[start..]
            .find(['&', '#', ' '])
            .map_or(url.len(), |i| start + i);
        start..end
    })
}

fn mask_query_passwords(url: &str) -> String {
    let mut out = String::with_capacity(url.len());
    let mut from = 0;
    for range in query_passwords(url) {
        out.push_str(&url[from..range.start]);
        out.push_str("***");
        from = range.end;
    }
    out.push_str(&url[from..]);
    out
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn passwords_are_masked_in_urls_that_do_not_parse() {
        for url in [
            "postgres://app:hunter2@127.0.0.1:notaport/x",
            "postgres://u:hunter2@127.0.0.1:99999/db",
            "postgres://u:hunter2@[::1/db",
            "postgres//u:hunter2@h/db",
            "postgres://u@h:1/db?password=hunter2",
            "postgres://u@h:1/db?sslmode=require&PASSWORD=hunter2&x=1",
            "postgres://u:hunter2@h/db",
        ] {
            let masked = mask_url(url);
            assert!(!masked.contains("hunter2"), "{url} -> {masked}");
            let text = mask_password_in(&format!("failed: {url} (hunter2)"), url);
            assert!(!text.contains("hunter2"), "{url} -> {text}");
        }
    }
}
