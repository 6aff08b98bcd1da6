//! What is due for a job at an instant: the latest fire's period and the
//! missed ones before it. One answer for `run` and for `serve`'s scan.

use std::collections::HashSet;

use chrono::{DateTime, TimeDelta, Utc};

use crate::config::{Job, Missed};
use crate::period::Period;
use crate::store::Trigger;

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
