//! What is due for a job at an instant: the latest fire's period and the
//! missed ones before it. One answer for `run` and for `serve`'s scan.

use std::collections::HashSet;

use chrono::{DateTime, TimeDelta, Utc};

use crate::config::{Job, Missed};
use crate::period::Period;
use crate::store::{Claim, ClaimRow, Trigger};

/// A period to claim, with the fire it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// The period.
    pub period: Period,
    /// The fire that covers it.
    pub fire: DateTime<Utc>,
    /// `schedule` for the latest fire, `catch-up` for older ones.
    pub trigger: Trigger,
}

/// The periods due for `job` at `now`, oldest first.
///
/// Older periods are those whose fires lie in `[since, latest fire)`, kept
/// per `missed`: all, or none (`latest` and `skip`, for which the latest is
/// the only one). The latest fire's period comes last when `with_latest`.
pub fn due(job: &Job, now: DateTime<Utc>, since: DateTime<Utc>, with_latest: bool) -> Vec<Due> {
    let tick = TimeDelta::nanoseconds(1);
    let Some(latest) = job.schedule.prev_before(now + tick) else {
        return Vec::new();
    };
    let latest = Due {
        period: job.period.period_of(&job.schedule, latest),
        fire: latest,
        trigger: Trigger::Schedule,
    };
    let mut due = Vec::new();
    if job.missed == Missed::All {
        let mut seen = HashSet::from([latest.period.label.clone()]);
        for fire in job.schedule.fires_between(since - tick, latest.fire - tick) {
            let period = job.period.period_of(&job.schedule, fire);
            if seen.insert(period.label.clone()) {
                due.push(Due {
                    period,
                    fire,
                    trigger: Trigger::CatchUp,
                });
            }
        }
    }
    if with_latest {
        due.push(latest);
    }
    due
}

/// How one period of `job` stands, in one word, with the fire that makes it
/// due: `succeeded`, `failed`, `running`, `released`, `lease expired`,
/// `missing` (due, never run) or `not due` (its fire is still ahead). One
/// answer for `status JOB --from --to` and the API's range.
pub fn standing(
    job: &Job,
    period: &Period,
    row: Option<&ClaimRow>,
    now: DateTime<Utc>,
) -> (&'static str, Option<DateTime<Utc>>) {
    let fire = job.period.fire_for(&job.schedule, period);
    let state = match row {
        None if fire.is_some_and(|f| f > now) => "not due",
        None => "missing",
        Some(row) => match (row.as_claim(), row.state.as_str()) {
            (Claim::Held { .. }, "released") => "released",
            (Claim::Held { .. }, _) => "running",
            (_, "running") => "lease expired",
            (_, "succeeded") => "succeeded",
            (_, "released") => "released",
            _ => "failed",
        },
    };
    (state, fire)
}
