//! What is due for a job at an instant: the latest fire's period and the
//! missed ones before it. One answer for `run` and for `serve`'s scan.

use std::collections::{HashMap, HashSet};

use chrono::{DateTime, TimeDelta, Utc};

use crate::config::{Job, Missed};
use crate::error::Error;
use crate::period::{Period, PeriodKey};
use crate::store::{Claim, ClaimRow, Store, Trigger};

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

/// The overdue periods of each of `jobs`, by job name: due within the
/// catch-up window and after the job was first seen (`serve` never runs a
/// fire from before), with no success and nothing running. A few
/// statements for any number of jobs.
pub async fn overdue(
    store: &Store,
    jobs: &[&Job],
    catch_up: std::time::Duration,
    now: DateTime<Utc>,
) -> Result<HashMap<String, Vec<String>>, Error> {
    let window = now - TimeDelta::from_std(catch_up).unwrap_or_default();
    let names: Vec<String> = jobs.iter().map(|j| j.name.clone()).collect();
    let first_seen = store.first_seen(&names).await?;
    let mut keys: Vec<(String, String)> = Vec::new();
    for job in jobs {
        // Never seen: `serve` starts it at its next fire.
        let Some(seen) = first_seen.get(&job.name) else {
            continue;
        };
        let since = window.max(*seen);
        for d in due(job, now, since, true)
            .into_iter()
            .filter(|d| d.fire >= since)
        {
            keys.push((
                job.name.clone(),
                PeriodKey::new(&job.name, &d.period.label).to_string(),
            ));
        }
    }
    let mut overdue: HashMap<String, Vec<String>> = HashMap::new();
    for chunk in keys.chunks(1_000) {
        let wanted: Vec<String> = chunk.iter().map(|(_, key)| key.clone()).collect();
        let rows = store.rows(&wanted).await?;
        for (job, key) in chunk {
            let done_or_running = matches!(
                rows.get(key).map(ClaimRow::as_claim),
                Some(Claim::Succeeded { .. } | Claim::Held { .. })
            );
            if !done_or_running {
                overdue.entry(job.clone()).or_default().push(key.clone());
            }
        }
    }
    Ok(overdue)
}
