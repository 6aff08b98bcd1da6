//! The one view of a period that every front end shows: its key, where it
//! stands ([`PeriodState`]), the fire that makes it due, its claim row and
//! what it waits for, read for many periods in a few statements.

use chrono::{DateTime, Utc};

use super::after::Upstream;
use crate::config::Job;
use crate::error::Error;
use crate::period::{Period, PeriodKey, Shard};
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
    /// For a period split into shards, where each shard stands, by the
    /// same rule; empty for one not split.
    pub shards: Vec<ShardView>,
}

/// One shard of a period, as it stands.
#[derive(Debug, Clone)]
pub struct ShardView {
    /// Which shard.
    pub shard: Shard,
    /// Its key, claimed or not.
    pub key: PeriodKey,
    /// Where it stands.
    pub state: PeriodState,
    /// Its claim, if it was ever claimed.
    pub row: Option<ClaimRow>,
}

impl ShardView {
    /// The shard as JSON: its index, state and claim.
    pub fn json(&self) -> serde_json::Value {
        use crate::period::utc_text;
        let row = self.row.as_ref();
        serde_json::json!({
            "shard": self.shard.index,
            "period_key": self.key,
            "state": self.state,
            "attempt": row.map(|r| r.attempt),
            "failures": row.map(|r| r.failures),
            "owner": row.map(|r| &r.owner),
            "lease_until": row.and_then(|r| r.lease_until).map(utc_text),
            "finished_at": row.and_then(|r| r.finished_at).map(utc_text),
        })
    }
}

impl PeriodView {
    /// What it waits for, in words: for a waiting period.
    pub fn waiting_for(&self) -> Option<String> {
        (self.state == PeriodState::Waiting).then(|| self.upstream.to_string())
    }

    /// For a period split into shards, how many stand in each state, the
    /// first few shards of each state but `succeeded` named: `4 shards: 2
    /// succeeded, 1 failed (#1), 1 due (#3)`.
    pub fn shard_words(&self) -> Option<String> {
        const NAMED: usize = 3;
        if self.shards.is_empty() {
            return None;
        }
        let mut by_state: Vec<(PeriodState, Vec<u32>)> = Vec::new();
        for shard in &self.shards {
            match by_state.iter_mut().find(|(state, _)| *state == shard.state) {
                Some((_, indexes)) => indexes.push(shard.shard.index),
                None => by_state.push((shard.state, vec![shard.shard.index])),
            }
        }
        let words: Vec<String> = by_state
            .iter()
            .map(|(state, indexes)| {
                if *state == PeriodState::Succeeded {
                    return format!("{} {state}", indexes.len());
                }
                let mut named: Vec<String> = indexes
                    .iter()
                    .take(NAMED)
                    .map(|i| format!("#{i}"))
                    .collect();
                if indexes.len() > NAMED {
                    named.push("…".to_owned());
                }
                format!("{} {state} ({})", indexes.len(), named.join(", "))
            })
            .collect();
        Some(format!(
            "{} shards: {}",
            self.shards.len(),
            words.join(", ")
        ))
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
        let shards = (!self.shards.is_empty())
            .then(|| serde_json::Value::Array(self.shards.iter().map(ShardView::json).collect()));
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
            "shards": shards,
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
    let claims = super::shards::claims(store, &pairs).await?;
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
        .map(|(job, _)| job.name.as_ref())
        .collect();
    if !waiting_jobs.is_empty() {
        let keys: Vec<String> = pairs
            .iter()
            .zip(&names_of_keys(&pairs))
            .filter(|((job, _), _)| waiting_jobs.contains(&job.name.as_ref()))
            .map(|(_, key)| key.clone())
            .collect();
        for chunk in keys.chunks(VIEWS_PER_READ) {
            noted.extend(store.waits(chunk).await?.into_keys());
        }
    }
    let mut views = pairs.into_iter().zip(keys).zip(upstream).zip(claims).map(
        |((((job, period), key), upstream), claims)| {
            let sighting = super::due::Sighting {
                owed_from: owing.owed_from(&job.name),
                noted: noted.contains(key.as_str()),
                paused: paused.contains(&*job.name),
            };
            let stands = |row: Option<&ClaimRow>| {
                super::due::standing(job, period, row, sighting, &upstream, now)
            };
            let standing = stands(claims.row.as_ref());
            let shards = shard_views(&key, &claims, |row| stands(row).state);
            PeriodView {
                key,
                period: period.clone(),
                state: standing.state,
                late: standing.late,
                fire: standing.fire,
                row: claims.row,
                upstream,
                shards,
            }
        },
    );
    Ok(asked
        .iter()
        .map(|(_, periods)| views.by_ref().take(periods.len()).collect())
        .collect())
}

/// Each shard of a period split into shards, as `stands` says a shard with
/// its row (or none) stands.
fn shard_views(
    key: &PeriodKey,
    claims: &super::shards::PeriodClaims,
    stands: impl Fn(Option<&ClaimRow>) -> PeriodState,
) -> Vec<ShardView> {
    if claims.shards <= 1 {
        return Vec::new();
    }
    let mut rows = claims.shard_rows.iter().peekable();
    Shard::all(claims.shards)
        .into_iter()
        .flatten()
        .map(|shard| {
            let row = rows
                .next_if(|(s, _)| *s == shard)
                .map(|(_, row)| row.clone());
            let (job, label) = key.parts();
            ShardView {
                shard,
                key: PeriodKey::of(job, label, Some(shard)),
                state: stands(row.as_ref()),
                row,
            }
        })
        .collect()
}

/// The period keys of `pairs`, as text.
fn names_of_keys(pairs: &[(&Job, &Period)]) -> Vec<String> {
    pairs
        .iter()
        .map(|(job, p)| PeriodKey::new(&job.name, &p.label).to_string())
        .collect()
}
