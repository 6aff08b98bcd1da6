//! `[[notify]]`: who is told when a period is late, failed for good, or
//! recovered, and how.

use serde::Deserialize;
use toml::Spanned;

use super::rules::job_name_problem;
use super::vars::Vars;
use super::{ConfigError, Job, Locator};
use crate::suggest::nearest;

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

    fn parse(word: &str) -> Option<Event> {
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

/// The shortest HMAC secret taken.
const SHORTEST_SECRET: usize = 16;

/// A `[[notify]]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawNotify {
    name: Spanned<String>,
    url: Spanned<String>,
    events: Option<Spanned<Vec<Spanned<String>>>>,
    jobs: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    format: Format,
    secret: Option<Spanned<String>>,
}

impl RawNotify {
    /// The notifier, its URL and secret expanded and noted as secrets;
    /// `jobs` (already validated, their names as written) must name them.
    pub(super) fn validate(
        self,
        at: &Locator,
        env: &Vars<'_>,
        jobs: &[Job],
    ) -> Result<Notifier, ConfigError> {
        let name = self.name.get_ref();
        if let Some(problem) = job_name_problem(name) {
            let problem = problem.replace("job name", "notifier name");
            return Err(at.error(self.name.span(), problem));
        }
        if cfg!(not(feature = "http-actions")) {
            return Err(at.error(self.url.span(), super::NO_HTTP.into()));
        }
        let url = crate::template::expand_env(self.url.get_ref(), &|n| env.get(n))
            .map_err(|e| at.template_error(self.url.span(), e))?;
        env.note_secret(&url);
        if !(url.starts_with("https://") || url.starts_with("http://") || url.is_empty()) {
            return Err(at.error(
                self.url.span(),
                format!("notifier `{name}`: `url` must start with http:// or https:// (after `${{NAME}}` expansion)"),
            ));
        }
        // The error names no part of the URL: it may hold a secret.
        if let (false, Err(e)) = (url.is_empty(), url::Url::parse(&url)) {
            return Err(at.error(
                self.url.span(),
                format!("notifier `{name}`: `url` is not a valid URL after `${{NAME}}` expansion ({e}): expected http(s)://HOST[:PORT]/PATH"),
            ));
        }
        let events = match &self.events {
            None => Event::ALL.to_vec(),
            Some(words) => events(at, words, name)?,
        };
        let secret = match &self.secret {
            None => None,
            Some(secret) => {
                let value = crate::template::expand_env(secret.get_ref(), &|n| env.get(n))
                    .map_err(|e| at.template_error(secret.span(), e))?;
                let length = value.chars().count();
                if length < SHORTEST_SECRET && !value.is_empty() {
                    return Err(at.error(
                        secret.span(),
                        format!("the secret of notifier `{name}` is {length} character(s) long: expected at least {SHORTEST_SECRET}, e.g. from `openssl rand -hex 32`"),
                    ));
                }
                env.note_secret(&value);
                Some(value)
            }
        };
        let jobs = match self.jobs {
            None => None,
            Some(named) => Some(job_names(at, named, jobs, name)?),
        };
        Ok(Notifier {
            name: name.clone(),
            url,
            events,
            jobs,
            format: self.format,
            secret,
        })
    }
}

/// The events of a notifier's `events` list; it must name some.
fn events(
    at: &Locator,
    words: &Spanned<Vec<Spanned<String>>>,
    name: &str,
) -> Result<Vec<Event>, ConfigError> {
    let mut events = Vec::new();
    for word in words.get_ref() {
        let Some(event) = Event::parse(word.get_ref()) else {
            let hint = nearest(word.get_ref(), ["late", "failed", "recovered"])
                .map(|n| format!("; did you mean `{n}`?"))
                .unwrap_or_default();
            return Err(at.error(
                word.span(),
                format!(
                    "unknown event `{}`, expected `late`, `failed` or `recovered`{hint}",
                    word.get_ref()
                ),
            ));
        };
        if !events.contains(&event) {
            events.push(event);
        }
    }
    if events.is_empty() {
        return Err(at.error(
            words.span(),
            format!("notifier `{name}` is told of nothing: expected some of \"late\", \"failed\", \"recovered\""),
        ));
    }
    Ok(events)
}

/// The jobs a notifier's `jobs` list names, each one of the file's.
fn job_names(
    at: &Locator,
    named: Spanned<Vec<Spanned<String>>>,
    jobs: &[Job],
    name: &str,
) -> Result<Vec<String>, ConfigError> {
    if named.get_ref().is_empty() {
        return Err(at.error(
            named.span(),
            format!(
                "notifier `{name}` is told of no job: name some, or leave `jobs` out for every job"
            ),
        ));
    }
    named
        .into_inner()
        .into_iter()
        .map(|job| {
            let written = job.get_ref();
            if jobs.iter().any(|j| j.name == *written) {
                return Ok(written.clone());
            }
            let hint = nearest(written, jobs.iter().map(|j| j.name.as_str()))
                .map(|n| format!("; did you mean `{n}`?"))
                .unwrap_or_default();
            Err(at.error(
                job.span(),
                format!(
                    "notifier `{name}` names job `{written}`, which jobs.toml does not have{hint}"
                ),
            ))
        })
        .collect()
}
