//! The one view of a period that every front end shows: its key, where it
//! stands ([`PeriodState`]), the fire that makes it due, its claim row and
//! what it waits for, read for many periods in a few statements.

use chrono::{DateTime, Utc};

use super::after::Upstream;
use crate::config::Job;
use crate::error::Error;
use crate::period::{Period, PeriodKey};
use crate::store::{ClaimRow, PeriodState, Store};

/// How many periods' rows one statement reads.
pub const VIEWS_PER_READ: usize = 1_000;

/// One period of a job, as it stands; serialized as
/// [`PeriodView::json`] shows it.
#[derive(Debug, Clone)]
pub struct PeriodView {
    /// `<job>:<label>`.
    pub key: PeriodKey,
    /// The period.
    pub period: Period,
    /// Where it stands.
    pub state: PeriodState,
    /// Past its deadline and not done, though owed.
    pub late: bool,
    /// The fire that makes it due, if the schedule has one.
    pub fire: Option<DateTime<Utc>>,
    /// Its claim, if it was ever claimed.
    pub row: Option<ClaimRow>,
    /// Where the upstream periods it needs stand (its job's `after`):
    /// what it waits for, and whether its success is stale.
    pub upstream: Upstream,
}

impl PeriodView {
    /// What it waits for, in words: for a waiting period.
    pub fn waiting_for(&self) -> Option<String> {
        (self.state == PeriodState::Waiting).then(|| self.upstream.to_string())
    }

    /// For a stale period, the upstream period that succeeded again since
    /// its attempt started, and when.
    pub fn stale_by(&self) -> Option<(&str, DateTime<Utc>)> {
        if self.state != PeriodState::Stale {
            return None;
        }
        Some((self.upstream.newest_key.as_deref()?, self.upstream.newest?))
    }

    /// The period as JSON, one shape for `status --json` and the API: its
    /// key, label, state, fire, claim (attempt, failures, owner, lease,
    /// retry, end), what it waits for and what made it stale.
    pub fn json(&self) -> serde_json::Value {
        use crate::period::utc_text;
        let row = self.row.as_ref();
        serde_json::json!({
            "period_key": self.key,
            "period": self.period.label,
            "state": self.state,
            "late": self.late,
            "fire": self.fire.map(utc_text),
            "attempt": row.map(|r| r.attempt),
            "failures": row.map(|r| r.failures),
            "owner": row.map(|r| &r.owner),
            "lease_until": row.and_then(|r| r.lease_until).map(utc_text),
            "retry_at": row.and_then(|r| r.retry_at).map(utc_text),
            "finished_at": row.and_then(|r| r.finished_at).map(utc_text),
            "waiting_for": self.waiting_for(),
            "stale": self.stale_json(),
        })
    }

    /// [`PeriodView::stale_by`] as JSON: `{"upstream": key, "succeeded_at": …}`.
    pub fn stale_json(&self) -> Option<serde_json::Value> {
        self.stale_by().map(|(key, at)| {
            serde_json::json!({ "upstream": key, "succeeded_at": crate::period::utc_text(at) })
        })
    }
}

impl serde::Serialize for PeriodView {
    fn serialize<S: serde::Serializer>(&self, to: S) -> Result<S::Ok, S::Error> {
        self.json().serialize(to)
    }
}

/// The views of `periods` of `job` (at most [`VIEWS_PER_READ`], read in one
/// statement), in their order, as they stand at `now`.
pub async fn periods(
    store: &Store,
    job: &Job,
    periods: &[Period],
    now: DateTime<Utc>,
) -> Result<Vec<PeriodView>, Error> {
    let mut views = of_jobs(store, &[(job, periods)], now).await?;
    Ok(views.pop().unwrap_or_default())
}

/// The views of the periods of many jobs, per job in the order asked, as
/// they stand at `now`: one statement per [`VIEWS_PER_READ`] periods in
/// all, however many jobs (the console's jobs view shows each job's
/// recent periods in one or two).
pub async fn of_jobs(
    store: &Store,
    asked: &[(&Job, &[Period])],
    now: DateTime<Utc>,
) -> Result<Vec<Vec<PeriodView>>, Error> {
    let pairs: Vec<(&Job, &Period)> = asked
        .iter()
        .flat_map(|(job, periods)| periods.iter().map(move |p| (*job, p)))
        .collect();
    let keys: Vec<PeriodKey> = pairs
        .iter()
        .map(|(job, p)| PeriodKey::new(&job.name, &p.label))
        .collect();
    let key_names = names_of_keys(&pairs);
    let mut rows = std::collections::HashMap::new();
    for chunk in key_names.chunks(VIEWS_PER_READ) {
        rows.extend(store.rows(chunk).await?);
    }
    let upstream = super::after::look(store, &pairs, now).await?;
    let owing = super::owed::owing(store, asked.iter().map(|(job, _)| *job), now).await?;
    let paused: std::collections::HashSet<String> =
        store.paused_jobs().await?.into_iter().collect();
    // The periods a gate noted waiting (a backfill, a scan): they run once
    // ready, whenever they fired.
    let mut noted = std::collections::HashSet::new();
    let waiting_jobs: Vec<&str> = asked
        .iter()
        .filter(|(job, _)| job.after.any())
        .map(|(job, _)| job.name.as_str())
        .collect();
    if !waiting_jobs.is_empty() {
        let keys: Vec<String> = pairs
            .iter()
            .zip(&names_of_keys(&pairs))
            .filter(|((job, _), _)| waiting_jobs.contains(&job.name.as_str()))
            .map(|(_, key)| key.clone())
            .collect();
        for chunk in keys.chunks(VIEWS_PER_READ) {
            noted.extend(store.waits(chunk).await?.into_keys());
        }
    }
    let mut views =
        pairs
            .into_iter()
            .zip(keys)
            .zip(upstream)
            .map(|(((job, period), key), upstream)| {
                let row = rows.remove(key.as_str());
                let sighting = super::due::Sighting {
                    owed_from: owing.owed_from(&job.name),
                    noted: noted.contains(key.as_str()),
                    paused: paused.contains(&job.name),
                };
                let standing =
                    super::due::standing(job, period, row.as_ref(), sighting, &upstream, now);
                PeriodView {
                    key,
                    period: period.clone(),
                    state: standing.state,
                    late: standing.late,
                    fire: standing.fire,
                    row,
                    upstream,
                }
            });
    Ok(asked
        .iter()
        .map(|(_, periods)| views.by_ref().take(periods.len()).collect())
        .collect())
}

/// The period keys of `pairs`, as text.
fn names_of_keys(pairs: &[(&Job, &Period)]) -> Vec<String> {
    pairs
        .iter()
        .map(|(job, p)| PeriodKey::new(&job.name, &p.label).to_string())
        .collect()
}
