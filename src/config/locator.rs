//! Where a mistake is (file:line:column), and serde's messages said in the
//! words of the file.

use std::ops::Range;
use std::path::{Path, PathBuf};

use super::ConfigError;
use crate::suggest::nearest;
use crate::template::TemplateError;

/// Turns byte offsets into file:line:column places.
pub(crate) struct Locator<'a> {
    pub(super) path: &'a Path,
    pub(super) text: &'a str,
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
    pub(super) fn unset(&self, name: &str) -> ConfigError {
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

    /// serde's error, in the file's words, at its place.
    pub(super) fn toml_error(&self, e: &toml::de::Error) -> ConfigError {
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
