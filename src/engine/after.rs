//! What a period of a job with `after` needs, and where that stands: the
//! upstream periods whose windows overlap its own (the expected set, from
//! each upstream job's schedule, zone and period rule, claimed or not),
//! and its own previous period where the job names itself. Looked up for
//! many periods of many jobs at once, one statement per
//! [`KEYS_PER_READ`] upstream keys.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::shards::{PeriodClaims, of_rows};
use crate::config::Job;
use crate::error::Error;
use crate::period::{Period, PeriodKey, Shard};
use crate::store::{ClaimState, Store};

/// How many upstream keys one statement looks up.
pub const KEYS_PER_READ: usize = 1_000;

/// How many missing labels of one upstream job are named in words.
const NAMED: usize = 3;

/// Where the upstream periods of one period stand.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Upstream {
    /// What it waits for, one entry per upstream job with a period not
    /// succeeded; empty when it waits for nothing.
    pub waits: Vec<Wait>,
    /// When the newest success among its upstream periods was recorded: a
    /// period of it that succeeded before that is stale.
    pub newest: Option<DateTime<Utc>>,
    /// The key of that upstream period.
    pub newest_key: Option<String>,
}

/// What a period waits for of one upstream job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Wait {
    /// The upstream job (the job itself, for its previous period).
    pub job: String,
    /// Its periods needed that have succeeded.
    pub done: usize,
    /// Its periods needed.
    pub needed: usize,
    /// The labels of those not succeeded, oldest first.
    pub missing: Vec<String>,
    /// Where each of `missing` stands, if it was ever claimed (running,
    /// failed, released): said beside its label.
    #[serde(skip)]
    pub claimed: Vec<Option<ClaimState>>,
    /// The key whose success to look out for: of the newest period
    /// missing, or of a shard of it not succeeded.
    #[serde(skip)]
    pub watch: Option<String>,
}

impl Upstream {
    /// Whether a period of it waits.
    pub fn waiting(&self) -> bool {
        !self.waits.is_empty()
    }

    /// The key of the upstream period to look out for: the newest one not
    /// succeeded of the last upstream job (upstream periods tend to
    /// succeed in order, so its success comes last).
    pub fn watch(&self) -> Option<String> {
        self.waits.last()?.watch.clone()
    }

    /// Whether a success of the period at `started` (its attempt's claim)
    /// was made before an upstream period it needs succeeded again.
    pub fn stale(&self, started: Option<DateTime<Utc>>) -> bool {
        self.newest
            .zip(started)
            .is_some_and(|(newest, started)| newest > started)
    }
}

/// `ingest: 30/31, missing 2026-07-31; users: 0/1, missing 2026-07`.
impl fmt::Display for Upstream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, wait) in self.waits.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{wait}")?;
        }
        Ok(())
    }
}

impl fmt::Display for Wait {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let named: Vec<String> = self
            .missing
            .iter()
            .zip(&self.claimed)
            .take(NAMED)
            .map(|(label, claimed)| match claimed {
                Some(state) => format!("{label} ({state})"),
                None => label.clone(),
            })
            .collect();
        write!(
            f,
            "{}: {}/{}, missing {}",
            self.job,
            self.done,
            self.needed,
            named.join(", ")
        )?;
        if self.missing.len() > NAMED {
            write!(f, " and {} more", self.missing.len() - NAMED)?;
        }
        Ok(())
    }
}

/// One upstream period a period needs.
struct Needed {
    job: String,
    label: String,
    key: String,
    period: Period,
    /// Into how many shards its job splits a period now.
    shards: u32,
    fire: Option<DateTime<Utc>>,
    /// It is the job's own previous period.
    previous: bool,
}

/// The upstream periods `period` of `job` needs, oldest first by job.
fn needed(job: &Job, period: &Period) -> Vec<Needed> {
    let mut needed = Vec::new();
    for up in &job.after.upstream {
        for p in up
            .period
            .overlapping(&up.schedule, period.start, period.end)
        {
            needed.push(Needed {
                key: PeriodKey::new(&up.job, &p.label).to_string(),
                fire: up.timing().of(&p),
                job: up.job.clone(),
                label: p.label.clone(),
                period: p,
                shards: up.shards,
                previous: false,
            });
        }
    }
    if job.after.previous
        && let Some(p) = job.period.preceding(&job.schedule, period)
    {
        needed.push(Needed {
            key: PeriodKey::new(&job.name, &p.label).to_string(),
            fire: job.timing().of(&p),
            job: job.name.to_string(),
            label: p.label.clone(),
            period: p,
            shards: job.policy.shards,
            previous: true,
        });
    }
    needed
}

/// The periods of other jobs that `period` of `job` needs, as (job,
/// label) pairs, oldest first by job: what `run --with-upstream` runs
/// first (its own previous period is not among them: a range runs oldest
/// first).
pub fn upstream_of(job: &Job, period: &Period) -> Vec<(String, String)> {
    let mut seen = HashSet::new();
    needed(job, period)
        .into_iter()
        .filter(|n| n.job != *job.name && seen.insert(n.key.clone()))
        .map(|n| (n.job, n.label))
        .collect()
}

/// Where the upstream periods of each of `asked` stand at `now`, in their
/// order: one statement per [`KEYS_PER_READ`] upstream keys (and, for jobs
/// that name themselves, one for when they were first seen). A job without
/// `after` waits for nothing.
///
/// Every period of another job whose window overlaps is waited for,
/// whether it was ever claimed or not: one from before that job was
/// deployed is missing until it is run (`--with-upstream`). A job's own
/// previous period is not waited for if it was never claimed and its fire
/// came before the job owes its fires ([`Job::owed_since`]; never seen, before now): no
/// scheduler runs such a period on its own, and the job's first period
/// has no previous one; its older periods are backfilled in order.
pub async fn look(
    store: &Store,
    asked: &[(&Job, &Period)],
    now: DateTime<Utc>,
) -> Result<Vec<Upstream>, Error> {
    let needs: Vec<Vec<Needed>> = asked
        .iter()
        .map(|(job, period)| match job.after.any() {
            true => needed(job, period),
            false => Vec::new(),
        })
        .collect();
    let mut wanted: Vec<&Needed> = needs.iter().flatten().collect();
    if wanted.is_empty() {
        return Ok(vec![Upstream::default(); asked.len()]);
    }
    wanted.sort_unstable_by(|a, b| a.key.cmp(&b.key));
    wanted.dedup_by(|a, b| a.key == b.key);
    let mut rows: HashMap<String, PeriodClaims> = HashMap::new();
    for chunk in wanted.chunks(KEYS_PER_READ) {
        let asked: Vec<(&str, &Period)> =
            chunk.iter().map(|n| (n.job.as_str(), &n.period)).collect();
        let mut found = store.period_rows(&asked).await?;
        for need in chunk {
            let key = PeriodKey::of_stored(&need.key);
            let of_period = found.remove(&need.key).unwrap_or_default();
            rows.insert(need.key.clone(), of_rows(key, of_period, need.shards));
        }
    }
    let mut jobs: Vec<String> = needs
        .iter()
        .flatten()
        .filter(|n| n.previous)
        .map(|n| n.job.clone())
        .collect();
    jobs.sort_unstable();
    jobs.dedup();
    // From when each of them owes its fires (docs/commands.md).
    let mut previous: Vec<&Job> = Vec::new();
    for (job, _) in asked {
        let named = jobs.binary_search_by(|j| j.as_str().cmp(&job.name)).is_ok();
        if named && !previous.iter().any(|p| p.name == job.name) {
            previous.push(job);
        }
    }
    let owing = super::owed::owing(store, previous, now).await?;
    let owed: HashMap<Arc<str>, DateTime<Utc>> = asked
        .iter()
        .filter_map(|(job, _)| Some((job.name.clone(), owing.owed_from(&job.name)?)))
        .collect();
    // A previous period from before the first sighting that is noted
    // waiting will run (a first `run` takes the latest due period): it is
    // waited for, so the job's periods run in order.
    let before: Vec<String> = needs
        .iter()
        .flatten()
        .filter(|n| n.previous && !rows.get(&n.key).is_some_and(PeriodClaims::claimed))
        .map(|n| n.key.clone())
        .collect();
    let noted = match before.is_empty() {
        true => HashMap::new(),
        false => store.waits(&before).await?,
    };
    Ok(needs
        .into_iter()
        .map(|needs| standing(needs, &rows, &owed, &noted, now))
        .collect())
}

/// Where `needs` stand, from their rows.
fn standing(
    needs: Vec<Needed>,
    rows: &HashMap<String, PeriodClaims>,
    owed: &HashMap<Arc<str>, DateTime<Utc>>,
    noted: &HashMap<String, String>,
    now: DateTime<Utc>,
) -> Upstream {
    let mut upstream = Upstream::default();
    let mut by_job: Vec<Wait> = Vec::new();
    for need in needs {
        let claims = rows.get(&need.key);
        let row = claims.and_then(|c| c.row.as_ref());
        let succeeded = row.filter(|r| r.state == ClaimState::Succeeded);
        if let Some(row) = succeeded
            && row.finished_at > upstream.newest
        {
            upstream.newest = row.finished_at;
            upstream.newest_key = Some(need.key.clone());
        }
        let before_first_seen = need.previous
            && !claims.is_some_and(PeriodClaims::claimed)
            && !noted.contains_key(&need.key)
            && need
                .fire
                .is_some_and(|fire| fire < owed.get(need.job.as_str()).copied().unwrap_or(now));
        if before_first_seen {
            continue;
        }
        let at = match by_job.iter().position(|w| w.job == need.job) {
            Some(at) => at,
            None => {
                by_job.push(Wait {
                    job: need.job.clone(),
                    done: 0,
                    needed: 0,
                    missing: Vec::new(),
                    claimed: Vec::new(),
                    watch: None,
                });
                by_job.len() - 1
            }
        };
        let wait = &mut by_job[at];
        wait.needed += 1;
        match succeeded {
            Some(_) => wait.done += 1,
            None => {
                wait.watch = Some(watched(&need, claims));
                wait.missing.push(need.label);
                wait.claimed.push(row.map(|r| r.state));
            }
        }
    }
    upstream.waits = by_job
        .into_iter()
        .filter(|w| !w.missing.is_empty())
        .collect();
    upstream
}

/// The key to look out for of a period `need` misses: its own, or, for a
/// period split into shards, that of its first shard not succeeded.
fn watched(need: &Needed, claims: Option<&PeriodClaims>) -> String {
    let shards = claims.map_or(need.shards, |c| c.shards);
    let done = |index: u32| {
        claims.is_some_and(|c| {
            c.shard_rows
                .iter()
                .any(|(s, row)| s.index == index && row.state == ClaimState::Succeeded)
        })
    };
    match Shard::all(shards)
        .into_iter()
        .flatten()
        .find(|s| !done(s.index))
    {
        Some(shard) => PeriodKey::of(&need.job, &need.label, Some(shard)).to_string(),
        None => need.key.clone(),
    }
}
