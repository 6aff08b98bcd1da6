//! `on_upstream_rerun = "rerun"`: the succeeded periods an upstream success
//! made stale, reopened for a new attempt and handed back to be claimed,
//! trigger `upstream`.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, Utc};

use super::after::{KEYS_PER_READ, look};
use super::due::Due;
use crate::config::Job;
use crate::config::after::OnRerun;
use crate::error::Error;
use crate::period::{Period, PeriodKey};
use crate::store::{ClaimRow, ClaimState, Store, Trigger};

/// Periods reopened: by job name, each as due.
pub type Reopened = Vec<(Arc<str>, Due)>;

/// The succeeded periods of the jobs of `jobs` that rerun when a period
/// they needed succeeds again (`on_upstream_rerun = "rerun"`), made stale
/// by an upstream success recorded at `since` or after: each reopened
/// for a new attempt (of replicas that find it together, one does, by
/// its attempt number) and returned to be claimed, trigger `upstream`.
/// Statements: one for the successes, then a few for what they make
/// stale; none for jobs that do not rerun. With the periods reopened comes
/// whether one that needed those successes is still running (or held):
/// it may be stale once it ends, so they are looked at again.
pub async fn reopen_stale(
    store: &Store,
    jobs: &[&Job],
    since: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<(Reopened, bool), Error> {
    let rerun: Vec<&Job> = jobs
        .iter()
        .copied()
        .filter(|job| job.after.any() && job.after.on_rerun == OnRerun::Rerun)
        .collect();
    if rerun.is_empty() {
        return Ok((Vec::new(), false));
    }
    let succeeded = store.succeeded_since(&upstream_jobs(&rerun), since).await?;
    // The periods of the rerunning jobs that needed what succeeded.
    let candidates = needing(
        &rerun,
        succeeded
            .iter()
            .map(|done| (done.job.as_str(), &done.period)),
    );
    let (done, running) = succeeded_rows(store, candidates).await?;
    let reopened = reopen(store, done, now).await?;
    Ok((reopened, running))
}

/// The jobs whose successes the rerunning jobs of `rerun` need: the jobs
/// of their `after`, and themselves for those that need their previous
/// period; each once, in name order.
fn upstream_jobs(rerun: &[&Job]) -> Vec<String> {
    let mut upstream: Vec<String> = Vec::new();
    for job in rerun {
        upstream.extend(job.after.upstream.iter().map(|up| up.job.clone()));
        if job.after.previous {
            upstream.push(job.name.to_string());
        }
    }
    upstream.sort_unstable();
    upstream.dedup();
    upstream
}

/// The periods of the jobs of `rerun` that needed one of the upstream
/// periods of `succeeded` (its job and period), each once.
fn needing<'j, 's>(
    rerun: &[&'j Job],
    succeeded: impl IntoIterator<Item = (&'s str, &'s Period)>,
) -> Vec<(&'j Job, Period)> {
    let mut seen = HashSet::new();
    let mut candidates: Vec<(&Job, Period)> = Vec::new();
    for (done_job, done_period) in succeeded {
        for job in rerun {
            let mut needing = Vec::new();
            if job.after.upstream.iter().any(|up| up.job == done_job) {
                needing.extend(job.period.overlapping(
                    &job.schedule,
                    done_period.start,
                    done_period.end,
                ));
            }
            if job.after.previous && *job.name == *done_job {
                let next = job.period.following(&job.schedule, done_period);
                if job.period.fire_for(&job.schedule, &next).is_some() {
                    needing.push(next);
                }
            }
            for period in needing {
                if seen.insert(PeriodKey::new(&job.name, &period.label)) {
                    candidates.push((job, period));
                }
            }
        }
    }
    candidates
}

/// Of `candidates`, those that succeeded, each with its claim row; and
/// whether one of them is running (or held) still.
async fn succeeded_rows<'j>(
    store: &Store,
    candidates: Vec<(&'j Job, Period)>,
) -> Result<(Vec<(&'j Job, Period, ClaimRow)>, bool), Error> {
    let keys: Vec<String> = candidates
        .iter()
        .map(|(job, p)| PeriodKey::new(&job.name, &p.label).to_string())
        .collect();
    let mut rows: HashMap<String, ClaimRow> = HashMap::new();
    for chunk in keys.chunks(KEYS_PER_READ) {
        rows.extend(store.rows(chunk).await?);
    }
    let running = rows.values().any(|row| row.state.is_live());
    let done = candidates
        .into_iter()
        .zip(&keys)
        .filter_map(|((job, period), key)| {
            let row = rows
                .remove(key)
                .filter(|r| r.state == ClaimState::Succeeded)?;
            Some((job, period, row))
        })
        .collect();
    Ok((done, running))
}

/// Reopens each period of `done` that a newer upstream success made stale,
/// and says so; those reopened, as due.
async fn reopen(
    store: &Store,
    done: Vec<(&Job, Period, ClaimRow)>,
    now: DateTime<Utc>,
) -> Result<Reopened, Error> {
    let asked: Vec<(&Job, &Period)> = done.iter().map(|(job, p, _)| (*job, p)).collect();
    let looked = look(store, &asked, now).await?;
    let mut reopened = Vec::new();
    for ((job, period, row), upstream) in done.iter().zip(looked) {
        if !upstream.stale(row.started_at) || !store.reopen(&row.period_key, row.attempt).await? {
            continue;
        }
        tracing::info!(
            job = &*job.name,
            period_key = row.period_key,
            attempt = row.attempt,
            "stale: a period it needed succeeded again; reopened for a new attempt (on_upstream_rerun = \"rerun\")"
        );
        let Some(fire) = job.timing().of(period) else {
            continue;
        };
        reopened.push((
            job.name.clone(),
            Due {
                period: period.clone(),
                fire,
                trigger: Trigger::Upstream,
                shard: PeriodKey::of_stored(&row.period_key).shard(),
            },
        ));
    }
    Ok(reopened)
}
