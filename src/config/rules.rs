//! What is wrong with one value, if anything: the rules of names, counts,
//! durations and schedules, said alike for `jobs.toml` and for jobs and
//! settings given in code ([`code`](super::code)).

use std::time::Duration;

use chrono_tz::Tz;

use crate::schedule::{DstRule, Schedule};

/// The longest duration accepted: far beyond any sensible window, and far
/// inside what instants can be shifted by.
const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// What is wrong with a duration (written `written`), if anything: the
/// rule of every duration, in jobs.toml and in code.
pub(super) fn duration_problem(d: Duration, written: &str) -> Option<String> {
    if d > LONGEST || chrono::TimeDelta::from_std(d).is_err() {
        return Some(format!(
            "`{written}` is too long: expected at most 100 years"
        ));
    }
    d.is_zero()
        .then(|| "a duration must be longer than zero".to_owned())
}

/// What is wrong with `key = written` (`d`) of at least `floor`, if
/// anything.
pub(super) fn floor_problem(
    key: &str,
    written: &str,
    d: Duration,
    floor: Duration,
) -> Option<String> {
    (d < floor).then(|| {
        format!(
            "{key} = `{written}` is too short: expected at least {}",
            short(floor)
        )
    })
}

/// The shortest lease: heartbeats come every lease/3 and a runner stops
/// its job a heartbeat before its lease runs out; below a second that
/// leaves no time for a database round trip.
pub(super) const SHORTEST_LEASE: Duration = Duration::from_secs(1);

/// The shortest scan interval.
pub(super) const SHORTEST_SCAN: Duration = Duration::from_millis(100);

/// What is wrong with a job name, if anything.
pub(super) fn job_name_problem(name: &str) -> Option<String> {
    (!valid_name(name)).then(|| {
        format!(
            "`{name}` is not a valid job name: expected 1 to 63 of a-z, 0-9, `_` and `-`, starting with a letter or digit"
        )
    })
}

/// What is wrong with a namespace, if anything.
pub(super) fn namespace_problem(namespace: &str) -> Option<String> {
    (!valid_name(namespace)).then(|| {
        format!(
            "`{namespace}` is not a valid namespace: expected 1 to 63 of a-z, 0-9, `_` and `-`, starting with a letter or digit (e.g. \"staging\")"
        )
    })
}

/// A schedule, or what is wrong with it.
pub(super) fn schedule(text: &str, zone: Tz, dst: DstRule) -> Result<Schedule, String> {
    Schedule::parse(text, zone, dst).map_err(|e| {
        format!("{e}: expected 5 fields (minute hour day-of-month month day-of-week), 6 with seconds first, or @hourly/@daily/@weekly/@monthly/@yearly")
    })
}

/// What is wrong with `keep` (written `written`) under a catch-up window
/// of `catch_up`, if anything: a period pruned inside the window would be
/// claimed, and run, again.
pub(super) fn keep_problem(written: &str, keep: Duration, catch_up: Duration) -> Option<String> {
    (keep < catch_up).then(|| {
        format!(
            "keep = `{written}` is shorter than catch_up ({}): a period pruned inside the catch-up window would run again; expected at least `{}`",
            short(catch_up),
            short(catch_up)
        )
    })
}

/// What is wrong with a count that must be at least 1 (`concurrency`,
/// `max_running`, `retry.attempts`), if anything.
pub(super) fn count_problem(n: i64) -> Option<String> {
    (u32::try_from(n).map_or(true, |n| n < 1))
        .then(|| format!("`{n}` is out of range: expected a whole number from 1"))
}

/// 1 to 63 of a-z, 0-9, `_` and `-`, starting with a letter or digit: a
/// job name, and a namespace.
fn valid_name(name: &str) -> bool {
    name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// Why `deadline` cannot be, against `catch_up`.
pub(crate) fn deadline_problem(deadline: Duration, catch_up: Duration) -> Option<String> {
    (deadline >= catch_up).then(|| {
        format!(
            "`deadline` ({}) must be shorter than `catch_up` ({}): late periods are looked for within the catch-up window, and one older than it is not run any more; raise `catch_up` in [scheduler]",
            short(deadline),
            short(catch_up)
        )
    })
}

/// A duration as a person writes it: `24h`, `90s`, `100ms`.
/// Why `bytes` cannot be a job's `output_max`.
#[cfg(feature = "config-file")]
pub(crate) fn output_max_problem(bytes: u64) -> Option<String> {
    let range = super::OUTPUT_MAX_RANGE;
    (!range.contains(&bytes)).then(|| {
        format!(
            "`output_max` must be from {} KiB to {} GiB: each attempt keeps its tail of 4 KiB at least, and its output is read back whole",
            range.start() >> 10,
            range.end() >> 30,
        )
    })
}

/// Why `keep_output` cannot be `keep_output` beside `keep`.
#[cfg(feature = "config-file")]
pub(crate) fn keep_output_problem(keep_output: Duration, keep: Option<Duration>) -> Option<String> {
    let keep = keep?;
    (keep_output > keep).then(|| {
        format!(
            "`keep_output` ({}) is longer than `keep` ({}): the output goes with its claim; make it at most `keep`",
            short(keep_output),
            short(keep)
        )
    })
}

pub(crate) fn short(d: Duration) -> String {
    let secs = d.as_secs();
    match (secs, d.subsec_nanos()) {
        (0, _) => humantime::format_duration(d).to_string(),
        (s, 0) if s % 86_400 == 0 => format!("{}d", s / 86_400),
        (s, 0) if s % 3_600 == 0 => format!("{}h", s / 3_600),
        (s, 0) if s % 60 == 0 => format!("{}m", s / 60),
        (s, 0) => format!("{s}s"),
        _ => humantime::format_duration(d).to_string(),
    }
}
