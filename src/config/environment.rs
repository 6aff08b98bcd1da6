//! What a `command` or `shell` job inherits of the scheduler's environment:
//! everything but the scheduler's own secrets (the database URL, the
//! variables behind `[api]` tokens, every job's `${NAME}`), unless the job
//! names one itself; or, with `inherit = [...]`, only the variables listed.

use std::ffi::OsString;
use std::sync::Arc;

/// Variables that are never taken for secrets, whoever names them: a job's
/// `workdir = "${HOME}/reports"` does not take `HOME` from the others, nor
/// is every path under it masked in their output.
const PUBLIC: [&str; 12] = [
    "PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "TZ", "TMPDIR", "PWD", "TERM",
    "HOSTNAME",
];

/// Variables the scheduler reads its database password from, hidden from
/// every job that does not name them, whatever the configuration says.
pub const DATABASE_VARIABLES: [&str; 2] = ["DATABASE_URL", "PGPASSWORD"];

/// Variables holding the trace exporter's credentials (an API key in its
/// headers), hidden from every job that does not name them.
pub const OTLP_SECRET_VARIABLES: [&str; 2] = [
    "OTEL_EXPORTER_OTLP_HEADERS",
    "OTEL_EXPORTER_OTLP_TRACES_HEADERS",
];

/// Whether the variable `name` is a well-known, public one (`PATH`, `LC_*`, …).
pub fn is_public(name: &str) -> bool {
    PUBLIC.contains(&name) || name.starts_with("LC_")
}

/// What one job inherits.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inherit {
    /// `inherit = [...]`: only these variables of the scheduler's
    /// environment (systemd's clean environment); `None`: all but `hidden`.
    pub only: Option<Vec<String>>,
    /// The scheduler's secret variables, shared by every job of a
    /// configuration.
    pub hidden: Arc<[String]>,
    /// The variables the job's own strings name with `${NAME}`: it gets
    /// them even when they are secrets.
    pub named: Vec<String>,
}

impl Inherit {
    /// Whether the job gets the scheduler's variable `name`.
    pub fn passes(&self, name: &str) -> bool {
        let allowed = match &self.only {
            Some(only) => only.iter().any(|n| n == name),
            None => !self.hidden.iter().any(|n| n == name),
        };
        allowed || self.named.iter().any(|n| n == name)
    }

    /// The variables of this process's environment the job gets.
    pub fn variables(&self) -> impl Iterator<Item = (OsString, OsString)> + '_ {
        std::env::vars_os().filter(|(name, _)| name.to_str().is_some_and(|n| self.passes(n)))
    }
}

/// The hidden variables of a configuration that read `read` (name, value)
/// for its `${NAME}`s: every name but the public ones, and the database's.
pub fn hidden<'a>(read: impl IntoIterator<Item = &'a str>) -> Arc<[String]> {
    let mut names: Vec<String> = read
        .into_iter()
        .filter(|name| !name.is_empty() && !is_public(name))
        .chain(DATABASE_VARIABLES)
        .chain(OTLP_SECRET_VARIABLES)
        .map(str::to_owned)
        .collect();
    names.sort();
    names.dedup();
    names.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_gets_a_hidden_variable_only_when_it_names_it() {
        let mut inherit = Inherit {
            hidden: hidden(["TOKEN", "HOME"]),
            ..Inherit::default()
        };
        assert!(!inherit.passes("TOKEN"));
        assert!(!inherit.passes("DATABASE_URL"));
        assert!(!inherit.passes("OTEL_EXPORTER_OTLP_HEADERS"));
        assert!(inherit.passes("HOME"), "a public variable is never hidden");
        assert!(inherit.passes("OTHER"));
        inherit.named = vec!["TOKEN".into()];
        assert!(inherit.passes("TOKEN"));
        inherit.only = Some(vec!["PATH".into()]);
        assert!(inherit.passes("PATH"));
        assert!(inherit.passes("TOKEN"), "named, so given even with a list");
        assert!(!inherit.passes("OTHER"));
    }
}
