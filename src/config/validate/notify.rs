//! `[[notify]]` checked: its name, URL, events, jobs and secret.

use serde::Deserialize;
use std::sync::Arc;
use toml::Spanned;

use crate::config::locator::Locator;
use crate::config::notify::{Event, Format, Notifier};
use crate::config::rules::job_name_problem;
use crate::config::vars::Vars;
use crate::config::{ConfigError, Job};
use crate::suggest::nearest;

/// The shortest HMAC secret taken.
const SHORTEST_SECRET: usize = 16;

/// A `[[notify]]` as written.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(in crate::config) struct RawNotify {
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
    pub(in crate::config) fn validate(
        self,
        at: &Locator,
        env: &Vars<'_>,
        jobs: &[Arc<Job>],
    ) -> Result<Notifier, ConfigError> {
        let name = self.name.get_ref();
        if let Some(problem) = job_name_problem(name) {
            let problem = problem.replace("job name", "notifier name");
            return Err(at.error(self.name.span(), problem));
        }
        if cfg!(not(feature = "http-actions")) {
            return Err(at.error(self.url.span(), crate::config::NO_HTTP.into()));
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
    jobs: &[Arc<Job>],
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
            if jobs.iter().any(|j| *j.name == **written) {
                return Ok(written.clone());
            }
            let hint = nearest(written, jobs.iter().map(|j| j.name.as_ref()))
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
