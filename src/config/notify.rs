//! `[[notify]]`: who is told when a period is late, failed for good, or
//! recovered, and how.

use serde::Deserialize;

/// What a notifier is told of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Event {
    /// A period's deadline passed and it has not succeeded.
    Late,
    /// An attempt failed and no retry is left.
    Failed,
    /// A period told `late` or `failed` succeeded later.
    Recovered,
}

impl Event {
    /// Every event, in the order they are told of.
    pub const ALL: [Event; 3] = [Event::Late, Event::Failed, Event::Recovered];

    /// Its word, in payloads, rows and `history`.
    pub fn as_str(self) -> &'static str {
        match self {
            Event::Late => "late",
            Event::Failed => "failed",
            Event::Recovered => "recovered",
        }
    }

    #[cfg(feature = "config-file")]
    pub(super) fn parse(word: &str) -> Option<Event> {
        Event::ALL.into_iter().find(|e| e.as_str() == word)
    }
}

/// How a notification's body is written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Format {
    /// The documented JSON payload.
    #[default]
    Json,
    /// `{"text": "…"}`, as a Slack incoming webhook takes it.
    Slack,
}

/// One `[[notify]]`.
#[derive(Debug, Clone)]
pub struct Notifier {
    /// Its name: part of each notification's Idempotency-Key.
    pub name: String,
    /// Where it is sent, `${VAR}`s expanded (masked in every message).
    pub url: String,
    /// What it is told of.
    pub events: Vec<Event>,
    /// The jobs it is told of (full names); `None`: every job.
    pub jobs: Option<Vec<String>>,
    /// How the body is written.
    pub format: Format,
    /// Signs each body with HMAC-SHA256 when set.
    pub secret: Option<String>,
}

impl Notifier {
    /// Whether it is told of `event` for job `job`.
    pub fn wants(&self, event: Event, job: &str) -> bool {
        self.events.contains(&event)
            && self
                .jobs
                .as_ref()
                .is_none_or(|jobs| jobs.iter().any(|j| j == job))
    }
}
