//! The raw file ([`raw`](super::raw)) checked into [`Config`](super::Config)
//! values, every mistake with its file:line:column: `[scheduler]` and
//! `[api]` (`settings`), `[[calendar]]` (`calendar`), `[[job]]` (`job`),
//! its action (`action`) and `[[notify]]` (`notify`); here, the readers of
//! one value they share.

mod action;
mod calendar;
mod job;
mod notify;
mod settings;

pub(super) use notify::RawNotify;

use std::time::Duration;

use chrono::NaiveDate;
use chrono_tz::Tz;
use toml::Spanned;

use super::ConfigError;
use super::locator::Locator;
use super::rules::{count_problem, duration_problem, floor_problem};
use super::vars::Env;
use crate::suggest::nearest;
use crate::template::Template;

fn duration(
    at: &Locator,
    value: Option<&Spanned<String>>,
    default: &str,
) -> Result<Duration, ConfigError> {
    let Some(value) = value else {
        return Ok(humantime::parse_duration(default).unwrap_or_default());
    };
    match humantime::parse_duration(value.get_ref()) {
        Ok(d) => match duration_problem(d, value.get_ref()) {
            Some(problem) => Err(at.error(value.span(), problem)),
            None => Ok(d),
        },
        Err(e) => Err(at.error(
            value.span(),
            format!(
                "`{}` is not a duration ({e}): expected a number and a unit, e.g. `90s`, `5m`, `24h`, `7d`",
                value.get_ref()
            ),
        )),
    }
}

/// A duration of at least `floor` (`floor_text` in messages).
fn at_least(
    at: &Locator,
    (key, value): (&str, Option<&Spanned<String>>),
    default: &str,
    floor: Duration,
) -> Result<Duration, ConfigError> {
    // Under the floor, zero included, the message names the key and the
    // floor.
    if let Some(value) = value
        && let Ok(d) = humantime::parse_duration(value.get_ref())
        && let Some(problem) = floor_problem(key, value.get_ref(), d, floor)
    {
        return Err(at.error(value.span(), problem));
    }
    duration(at, value, default)
}

fn positive(at: &Locator, value: Option<&Spanned<i64>>, default: u32) -> Result<u32, ConfigError> {
    match value {
        None => Ok(default),
        Some(v) => match count_problem(*v.get_ref()) {
            Some(problem) => Err(at.error(v.span(), problem)),
            None => Ok(u32::try_from(*v.get_ref()).unwrap_or(default)),
        },
    }
}

fn zone(at: &Locator, value: &Spanned<String>) -> Result<Tz, ConfigError> {
    value.get_ref().parse::<Tz>().map_err(|_| {
        let names = chrono_tz::TZ_VARIANTS.iter().map(|tz| tz.name());
        let hint = nearest(value.get_ref(), names)
            .map(|n| format!("; did you mean `{n}`?"))
            .unwrap_or_default();
        at.error(
            value.span(),
            format!(
                "`{}` is not a time zone: expected an IANA name such as `UTC` or `Europe/Berlin`{hint}",
                value.get_ref()
            ),
        )
    })
}

fn template(at: &Locator, value: &Spanned<String>, env: Env) -> Result<Template, ConfigError> {
    no_nul(at, value)?;
    Template::load(value.get_ref(), &|name| env.get(name))
        .map_err(|e| at.template_error(value.span(), e))
}

/// A NUL byte cannot reach a program, its environment or a path.
fn no_nul(at: &Locator, value: &Spanned<String>) -> Result<(), ConfigError> {
    match value.get_ref().find('\0') {
        Some(i) => Err(at.error(
            value.span().start + 1 + i..value.span().end,
            "a NUL byte (\\u0000) cannot be passed to a program, its environment or a path".into(),
        )),
        None => Ok(()),
    }
}

fn templates<'a>(
    at: &Locator,
    values: impl IntoIterator<Item = (&'a String, &'a Spanned<String>)>,
    env: Env,
) -> Result<Vec<(String, Template)>, ConfigError> {
    values
        .into_iter()
        .map(|(k, v)| Ok((k.clone(), template(at, v, env)?)))
        .collect::<Result<_, _>>()
        .map(fitted)
}

/// `items` without room to spare. A collect through `Result` cannot know
/// its length and starts with room for four; a job keeps its vectors for
/// the process's life, and a configuration may hold 100,000 jobs.
fn fitted<T>(mut items: Vec<T>) -> Vec<T> {
    items.shrink_to_fit();
    items
}

/// The value of `result`, or `None` with its error added to `errors`.
fn kept<T>(errors: &mut Vec<ConfigError>, result: Result<T, ConfigError>) -> Option<T> {
    result.map_err(|e| errors.push(e)).ok()
}

/// A local date: a string `"YYYY-MM-DD"`, or a TOML date (`2027-01-01`
/// unquoted) without a time.
fn date(at: &Locator, value: &Spanned<toml::Value>) -> Result<NaiveDate, ConfigError> {
    let date = match value.get_ref() {
        toml::Value::String(text) => crate::calendar::iso_date(text),
        toml::Value::Datetime(d) if d.time.is_none() && d.offset.is_none() => d
            .date
            .and_then(|d| NaiveDate::from_ymd_opt(i32::from(d.year), d.month.into(), d.day.into())),
        _ => None,
    };
    date.ok_or_else(|| {
        at.error(
            value.span(),
            format!(
                "`{}` is not a date: expected `YYYY-MM-DD`, e.g. `2027-01-01`",
                match value.get_ref() {
                    toml::Value::String(text) => text.clone(),
                    other => other.to_string(),
                }
            ),
        )
    })
}
