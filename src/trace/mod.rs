//! A trace of every attempt, sent over OTLP/HTTP when the OpenTelemetry
//! environment variables ask for one (docs/operations.md, "Traces"): a
//! span per attempt with its claim, action and record under it, and the
//! trace context handed to the work (`TRACEPARENT` for a process, a
//! `traceparent` header for `http`, a comment for `sql`, the handler's
//! [`crate::Context`] for code).
//!
//! An attempt's trace id is worked out from what its history row holds
//! (its period key, attempt number and owner), so `history` and the API
//! show it without a write of its own.

#[cfg(feature = "otel")]
mod client;
#[cfg(feature = "otel")]
mod otlp;
#[cfg(feature = "otel")]
mod settings;

use chrono::{DateTime, Utc};
use sha2::{Digest, Sha256};

use crate::store::Trigger;

/// The trace id of attempt `attempt` of `period_key` that `owner` ran, as
/// 32 lower-case hex digits. A hash, so as random as a trace id must be,
/// and the same wherever it is worked out.
pub fn trace_id(period_key: &str, attempt: i32, owner: &str) -> String {
    let bytes = trace_id_bytes(period_key, attempt, owner);
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn trace_id_bytes(period_key: &str, attempt: i32, owner: &str) -> [u8; 16] {
    let mut hash = Sha256::new();
    for part in [
        period_key.as_bytes(),
        &attempt.to_be_bytes(),
        owner.as_bytes(),
    ] {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    let digest = hash.finalize();
    let mut id = [0; 16];
    id.copy_from_slice(&digest[..16]);
    // An all-zero id is invalid; a hash gives one once in 2^128.
    id[15] |= u8::from(id == [0; 16]);
    id
}

/// What traces this process's attempts: nothing unless set up from the
/// environment ([`Tracer::from_env`]). Cheap to clone.
#[derive(Clone, Default)]
pub struct Tracer {
    #[cfg(feature = "otel")]
    exporting: Option<std::sync::Arc<otlp::Exporting>>,
}

impl std::fmt::Debug for Tracer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tracer").field("on", &self.is_on()).finish()
    }
}

impl Tracer {
    /// A tracer that traces nothing.
    pub fn off() -> Tracer {
        Tracer::default()
    }

    /// A tracer set up from the OpenTelemetry environment variables: off
    /// unless `OTEL_EXPORTER_OTLP_ENDPOINT` (or its `_TRACES_` form) is
    /// set; a value that cannot be used is an error naming its variable.
    /// Must be called inside a Tokio runtime, which carries the exports.
    #[cfg(feature = "otel")]
    pub fn from_env() -> Result<Tracer, crate::config::ConfigError> {
        let Some(settings) = settings::Settings::from_env(&|name| std::env::var(name).ok())? else {
            return Ok(Tracer::off());
        };
        Ok(Tracer {
            exporting: Some(std::sync::Arc::new(otlp::Exporting::start(settings)?)),
        })
    }

    /// Whether attempts are traced.
    pub fn is_on(&self) -> bool {
        #[cfg(feature = "otel")]
        return self.exporting.is_some();
        #[cfg(not(feature = "otel"))]
        false
    }

    /// Sends what is still queued, within a second, before the process
    /// ends; nothing at all if the collector did not take the last export
    /// (an unreachable endpoint never delays a shutdown).
    pub async fn shutdown(&self) {
        #[cfg(feature = "otel")]
        if let Some(exporting) = &self.exporting {
            exporting.clone().shutdown().await;
        }
    }

    /// The trace of a claim just won.
    pub(crate) fn attempt(&self, attempt: Attempt<'_>) -> AttemptTrace {
        #[cfg(feature = "otel")]
        return AttemptTrace {
            spans: self
                .exporting
                .as_ref()
                .map(|exporting| Box::new(exporting.attempt(&attempt))),
        };
        #[cfg(not(feature = "otel"))]
        {
            let _ = attempt;
            AttemptTrace {}
        }
    }
}

/// An attempt about to run, as its trace sees it.
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
pub(crate) struct Attempt<'a> {
    pub job: &'a str,
    pub period: &'a str,
    pub period_key: &'a str,
    pub attempt: i32,
    pub trigger: Trigger,
    pub owner: &'a str,
    /// When its claiming statement was sent, and when it was answered.
    pub claim: (DateTime<Utc>, DateTime<Utc>),
}

/// The spans of one attempt: its own, from its claim on, and the child
/// spans of its claim, action and record. Without tracing, nothing.
pub struct AttemptTrace {
    #[cfg(feature = "otel")]
    spans: Option<Box<otlp::AttemptSpans>>,
}

impl AttemptTrace {
    /// The W3C `traceparent` of the action, for the work to carry on its
    /// trace (once [`AttemptTrace::action`] started it).
    pub fn traceparent(&self) -> Option<String> {
        #[cfg(feature = "otel")]
        return self.spans.as_ref().and_then(|spans| spans.traceparent());
        #[cfg(not(feature = "otel"))]
        None
    }

    /// The action starts now.
    pub(crate) fn action(&self) {
        #[cfg(feature = "otel")]
        if let Some(spans) = &self.spans {
            spans.child(otlp::Child::Action);
        }
    }

    /// The outcome's write starts now (the action's span ends).
    pub(crate) fn record(&self) {
        #[cfg(feature = "otel")]
        if let Some(spans) = &self.spans {
            spans.child(otlp::Child::Record);
        }
    }

    /// The attempt ended as `ended` says.
    pub(crate) fn end(&self, ended: &Ended<'_>) {
        #[cfg(feature = "otel")]
        if let Some(spans) = &self.spans {
            spans.end(ended);
        }
        #[cfg(not(feature = "otel"))]
        let _ = ended;
    }
}

/// How an attempt ended, for its span.
#[cfg_attr(not(feature = "otel"), allow(dead_code))]
pub(crate) struct Ended<'a> {
    /// `succeeded`, `failed`, `lost`, … (`None`: it never ran).
    pub outcome: Option<&'static str>,
    /// What went wrong, for a failure.
    pub error: Option<&'a str>,
    /// The process's exit code, where there is one.
    pub exit_code: Option<i32>,
    /// The HTTP status, where there is one.
    pub http_status: Option<i32>,
}

/// `statement` with the sqlcommenter comment carrying `traceparent`,
/// before a closing semicolon if it has one.
pub fn commented(statement: &str, traceparent: &str) -> String {
    let body = statement.trim_end();
    let (body, semicolon) = match body.strip_suffix(';') {
        Some(body) => (body.trim_end(), ";"),
        None => (body, ""),
    };
    // A `--` comment on the last line would swallow the comment; a line
    // of its own keeps it.
    let last_line = body.rsplit('\n').next().unwrap_or(body);
    let gap = if last_line.contains("--") { "\n" } else { " " };
    format!("{body}{gap}/*traceparent='{traceparent}'*/{semicolon}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_id_is_32_hex_digits_and_differs_by_attempt_and_owner() {
        let id = trace_id("billing:2026-07", 1, "host:12:ab");
        assert_eq!(id.len(), 32);
        assert!(
            id.chars()
                .all(|c| c.is_ascii_hexdigit() && !c.is_uppercase())
        );
        assert_eq!(id, trace_id("billing:2026-07", 1, "host:12:ab"));
        assert_ne!(id, trace_id("billing:2026-07", 2, "host:12:ab"));
        assert_ne!(id, trace_id("billing:2026-07", 1, "host:13:ab"));
        // Pinned: ids shown before an upgrade still find their traces (and
        // docs/operations.md shows this one).
        assert_eq!(
            trace_id("billing:2026-07", 2, "vm:15140:e3db7"),
            "5182804bd0771f5df7820b96c76e0c88"
        );
        // The parts cannot run into each other.
        assert_ne!(trace_id("a:b", 1, "c"), trace_id("a:", 1, "bc"));
    }

    #[test]
    fn the_comment_goes_before_a_closing_semicolon_and_past_a_line_comment() {
        let tp = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
        assert_eq!(
            commented("INSERT INTO t VALUES ($1)", tp),
            format!("INSERT INTO t VALUES ($1) /*traceparent='{tp}'*/")
        );
        assert_eq!(
            commented("SELECT 1 ;  \n", tp),
            format!("SELECT 1 /*traceparent='{tp}'*/;")
        );
        assert_eq!(
            commented("SELECT 1 -- the one", tp),
            format!("SELECT 1 -- the one\n/*traceparent='{tp}'*/")
        );
    }
}
