//! Claims: what a claim asks for and is answered, the lease that fences
//! an attempt's writes, how an attempt ends, a claim row as it stands; and
//! the store's claims, renewals, outcomes, releases and recoveries.

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{ClaimState, PeriodState, Store, Trigger, query_error};
use crate::error::Error;
use crate::period::{Period, PeriodKey};

/// What a claim asks for.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// The job's name.
    pub job: &'a str,
    /// The period to claim.
    pub period: &'a Period,
    /// The shard of it to claim, of a period split into shards.
    pub shard: Option<crate::period::Shard>,
    /// Who claims: host, pid and a start stamp.
    pub owner: &'a str,
    /// How long the claim lives without a heartbeat.
    pub lease: Duration,
    /// Why, if the claim is new or a manual run.
    pub trigger: Trigger,
    /// Periods of the job allowed to run at once.
    pub concurrency: u32,
    /// Also take a succeeded period.
    pub force: bool,
    /// Ignore backoff and the retry budget of a failed period.
    pub manual: bool,
    /// The fire this run stands for.
    pub scheduled_at: DateTime<Utc>,
    /// How and by whom a manual run was asked for: written on the attempt
    /// if it is won, in the claim's own commit.
    pub asked: Option<Asked<'a>>,
}

/// How a manual attempt was asked for, as `history` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Asked<'a> {
    /// `manual`, with `force` and `early` if they were given.
    pub how: &'static str,
    /// An API token's name, or `cli:` and the user.
    pub by: &'a str,
}

impl ClaimRequest<'_> {
    /// The key claimed.
    pub fn key(&self) -> PeriodKey {
        PeriodKey::of(self.job, &self.period.label, self.shard)
    }
}

/// A won claim: the key and the attempt that fences every later write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    /// `<job>:<label>`.
    pub key: PeriodKey,
    /// The fencing token.
    pub attempt: i32,
    /// Reported failures so far.
    pub failures: i32,
    /// Why this attempt runs.
    pub trigger: Trigger,
    /// How long the lease runs, counted from when the claiming statement
    /// began: the lease asked for, plus any time the database held the
    /// claim back for a row another transaction had locked.
    pub granted: Duration,
}

/// The outcome of a claim: expected outcomes are values, not errors.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This caller runs the period.
    Won(Lease),
    /// Already succeeded.
    Succeeded {
        /// When it finished.
        at: DateTime<Utc>,
    },
    /// A live claim elsewhere.
    Held {
        /// Who holds it.
        owner: String,
        /// Its lease end.
        until: DateTime<Utc>,
    },
    /// A running claim whose lease ran out, left to its runner a while
    /// longer: this process has just started or saw the database fail
    /// lately, and the runner may still be writing its outcome
    /// ([`Store::holding`]). Claimed again once the hold is over.
    Expired {
        /// Who held it.
        owner: String,
        /// When its lease ran out.
        until: DateTime<Utc>,
    },
    /// Failed; retried at `retry_at`, or never (`None`: budget spent or permanent).
    Failed {
        /// When the retry is due.
        retry_at: Option<DateTime<Utc>>,
        /// Failures so far.
        failures: i32,
    },
    /// Claimable, but the job's concurrency slots are full.
    Busy,
    /// Not decided: another transaction held the job's lock (another
    /// replica claiming the same burst). Only a scheduled claim of several
    /// keys on PostgreSQL answers so; it is asked for again shortly.
    Contended,
}

/// How a run ended, to be recorded with its attempt.
#[derive(Debug, Clone, Default)]
pub struct Finish {
    /// Exit 0, HTTP 2xx, SQL committed.
    pub succeeded: bool,
    /// When to retry a failure, if at all.
    pub retry_after: Option<Duration>,
    /// The process exit code.
    pub exit_code: Option<i32>,
    /// The HTTP status.
    pub http_status: Option<i32>,
    /// What went wrong, in words.
    pub error: Option<String>,
    /// The last 4 KiB of output.
    pub output: Option<String>,
    /// The fingerprint of the job's definition it ran under.
    pub definition: Option<String>,
}

/// The attempt number of a period `scheduler adopt` recorded: an earlier
/// system ran it, no attempt here did. A claim that takes it (`--force`)
/// raises it to 1 as any claim does.
pub const ADOPTED_ATTEMPT: i32 = 0;

/// A claim row as it stands, for `status`, `--dry-run` and `--wait`.
#[derive(Debug, Clone, Serialize)]
pub struct ClaimRow {
    /// `<job>:<label>`.
    pub period_key: String,
    /// The period label.
    pub period: String,
    /// Where its claim stands.
    pub state: ClaimState,
    /// The latest attempt.
    pub attempt: i32,
    /// Reported failures.
    pub failures: i32,
    /// Who holds or held it.
    pub owner: String,
    /// Lease end of a running claim.
    pub lease_until: Option<DateTime<Utc>>,
    /// When its latest attempt was claimed (unread by a claim's answer).
    pub started_at: Option<DateTime<Utc>>,
    /// When a failed claim's retry is due.
    pub retry_at: Option<DateTime<Utc>>,
    /// When it finished.
    pub finished_at: Option<DateTime<Utc>>,
    /// Whether a claim would take it now (a scheduled one: no force, with
    /// backoff), as the backend's claimable rule says.
    #[serde(skip)]
    pub claimable: bool,
    /// The database's clock when read.
    #[serde(skip)]
    pub now: DateTime<Utc>,
}

impl ClaimRow {
    /// Of `rows`, the one whose run finished last (succeeded or failed):
    /// a job's "last" in `status` and the API alike. An adopted period
    /// never ran here: it is no run's end.
    pub fn finished_last(rows: &[ClaimRow]) -> Option<&ClaimRow> {
        rows.iter()
            .filter(|r| r.finished_at.is_some() && r.state.is_finished())
            .filter(|r| r.attempt != ADOPTED_ATTEMPT)
            .max_by_key(|r| r.finished_at)
    }

    /// Where its period stands now, as far as its claim tells (a row
    /// exists: the period is due or was run by hand).
    pub fn standing(&self) -> PeriodState {
        match (self.as_claim(), self.state) {
            (Claim::Held { .. }, ClaimState::Released) => PeriodState::Stopping,
            (Claim::Held { .. }, _) => PeriodState::Running,
            (_, ClaimState::Running) => PeriodState::LeaseExpired,
            (_, ClaimState::Released) => PeriodState::Released,
            // Attempt 0 is no attempt: `scheduler adopt` wrote it.
            (_, ClaimState::Succeeded) if self.attempt == ADOPTED_ATTEMPT => PeriodState::Adopted,
            (_, ClaimState::Succeeded) => PeriodState::Succeeded,
            (_, ClaimState::Failed) => PeriodState::Failed,
        }
    }

    /// What a claim that did not win it is told: why not, or [`Claim::Busy`]
    /// for a claimable row (no concurrency slot was free).
    pub fn as_claim(&self) -> Claim {
        if self.claimable {
            return Claim::Busy;
        }
        match self.state {
            ClaimState::Succeeded => Claim::Succeeded {
                at: self.finished_at.unwrap_or(self.now),
            },
            ClaimState::Failed => Claim::Failed {
                retry_at: self.retry_at,
                failures: self.failures,
            },
            // Not claimable though its lease ran out: only a claim that
            // holds expired leases ([`Store::holding`]) reads it so.
            ClaimState::Running if self.lease_until.is_some_and(|until| until < self.now) => {
                Claim::Expired {
                    owner: self.owner.clone(),
                    until: self.lease_until.unwrap_or(self.now),
                }
            }
            // Running, or released by `scheduler release` and held until its
            // runner confirms the stop or its lease runs out.
            ClaimState::Running | ClaimState::Released => Claim::Held {
                owner: self.owner.clone(),
                until: self.lease_until.unwrap_or(self.now),
            },
        }
    }
}

/// What `release` ended.
#[derive(Debug, Clone)]
pub struct Released {
    /// Who was running it.
    pub owner: String,
    /// Until when it stays unclaimable unless its runner confirms the stop.
    pub lease_until: Option<DateTime<Utc>>,
}

/// A period whose claim can be taken again now: its lease expired, it was
/// released, or its retry is due.
#[derive(Debug, Clone)]
pub struct Reclaimable {
    /// The job's name.
    pub job: String,
    /// The period, as claimed before.
    pub period: Period,
    /// The fire it stood for.
    pub scheduled_at: DateTime<Utc>,
    /// The shard it is, of a period split into shards.
    pub shard: Option<crate::period::Shard>,
    /// `recovery` for a claim to take over or retry, `upstream` for a
    /// period that waited for its upstream periods and can run now, or
    /// that an upstream rerun reopened ([`Store::reopen`]).
    pub trigger: Trigger,
}

/// How a claimable row is taken again: a period an upstream rerun
/// reopened (released, its trigger `upstream`) as that rerun; any other
/// as a recovery.
pub(super) fn taken_as(state: &str, trigger: &str) -> Trigger {
    if state == "released" && trigger == "upstream" {
        Trigger::Upstream
    } else {
        Trigger::Recovery
    }
}

impl Store {
    /// Claims a period: wins it, or says who has it and why not.
    pub async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Claim, Error> {
        let mut claims = self.claim_many(std::slice::from_ref(request)).await?;
        claims
            .pop()
            .ok_or_else(|| Error::Database("database error: the claim returned no row".into()))
    }

    /// Claims many periods in one statement and one commit; the answers
    /// come in the order of `requests`. Each key is decided as by a claim of
    /// its own: atomically, within its job's `concurrency` (counting what
    /// this batch won before it), with its attempt row. All requests share
    /// the first one's owner and lease.
    pub async fn claim_many(&self, requests: &[ClaimRequest<'_>]) -> Result<Vec<Claim>, Error> {
        self.claim_batch(requests, true).await
    }

    /// [`Store::claim_many`] for a scheduled burst: on PostgreSQL the keys
    /// of a job whose lock another transaction holds (another replica's
    /// claim of the same burst) are answered [`Claim::Contended`] rather
    /// than queued behind it, unless the batch is of one key. SQLite's
    /// claims take turns as ever.
    pub async fn claim_many_unqueued(
        &self,
        requests: &[ClaimRequest<'_>],
    ) -> Result<Vec<Claim>, Error> {
        self.claim_batch(requests, false).await
    }

    /// [`Store::claim_many`] (`wait`) or [`Store::claim_many_unqueued`].
    pub(crate) async fn claim_batch(
        &self,
        requests: &[ClaimRequest<'_>],
        wait: bool,
    ) -> Result<Vec<Claim>, Error> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        let hold = self.holding(requests[0].lease).is_some();
        let claims = self.seen(bounded!(self.claim_many(requests, wait, hold)))?;
        if claims.len() != requests.len() {
            return Err(Error::Database(format!(
                "database error: {} claims asked for, {} answered",
                requests.len(),
                claims.len()
            )));
        }
        let won = claims.iter().filter(|c| matches!(c, Claim::Won(_))).count();
        self.wrote(won as u64);
        Ok(claims)
    }

    /// Renews the leases of `leases`; returns, in order, whether each is still ours.
    pub async fn renew(&self, leases: &[&Lease], lease: Duration) -> Result<Vec<bool>, Error> {
        let renewed = dispatch!(self.renew(leases, lease)).map_err(query_error);
        self.seen(renewed)
    }

    /// Records how an attempt ended; `false` if the claim had moved on.
    pub async fn finish(&self, lease: &Lease, finish: &Finish) -> Result<bool, Error> {
        let recorded = self.finish_many(&[(lease, finish.clone())]).await?;
        Ok(recorded.first().copied().unwrap_or(false))
    }

    /// Records how many attempts ended, in one statement and one commit;
    /// for each, in order, `false` if its claim had moved on.
    pub async fn finish_many(&self, outcomes: &[(&Lease, Finish)]) -> Result<Vec<bool>, Error> {
        let recorded = self.seen(bounded!(self.finish_many(outcomes)))?;
        Ok(outcomes
            .iter()
            .map(|(lease, _)| recorded.contains(lease.key.as_str()))
            .collect())
    }

    /// Ends a running attempt without an outcome (shutdown), so the period
    /// can be taken at once; spends no retry. The stopped job's `output`
    /// tail, if any, is kept with the attempt.
    pub async fn release(&self, lease: &Lease, output: Option<&str>) -> Result<bool, Error> {
        bounded!(self.release(lease, output))
    }

    /// Ends whatever attempt is running for `key` (`scheduler release`).
    /// The period becomes claimable once its runner confirms that the job
    /// stopped ([`Store::confirm_stopped`]), or once the lease it holds has
    /// run out: a runner cut off from the database may still be running it.
    pub async fn release_key(&self, key: &str) -> Result<Option<Released>, Error> {
        bounded!(self.release_key(key))
    }

    /// A runner whose claim was released tells that its job has stopped, so
    /// the period can be claimed at once, keeping the job's `output` tail
    /// with the attempt; `false` if it moved on meanwhile.
    pub async fn confirm_stopped(
        &self,
        lease: &Lease,
        output: Option<&str>,
    ) -> Result<bool, Error> {
        bounded!(self.confirm_stopped(lease, output))
    }

    /// The claim rows of `keys` that exist, by key, in one statement.
    pub async fn rows(&self, keys: &[String]) -> Result<HashMap<String, ClaimRow>, Error> {
        let rows = bounded!(self.rows(keys))?;
        Ok(rows
            .into_iter()
            .map(|row| (row.period_key.clone(), row))
            .collect())
    }

    /// The claim rows of whole periods (`(job, period)`), a split one's
    /// shards with it, in one statement: by the key of the period.
    pub async fn period_rows(
        &self,
        periods: &[(&str, &Period)],
    ) -> Result<HashMap<String, Vec<ClaimRow>>, Error> {
        let rows = bounded!(self.period_rows(periods))?;
        let mut of_periods: HashMap<String, Vec<ClaimRow>> = HashMap::new();
        for row in rows {
            let key = PeriodKey::of_stored(&row.period_key).period_key();
            of_periods
                .entry(key.as_str().to_owned())
                .or_default()
                .push(row);
        }
        Ok(of_periods)
    }

    /// The periods of `job` from `from` on (by start) split into shards of
    /// which some were never claimed (a shutdown while the rest waited for
    /// a slot): each period, its newest fire and its count of shards,
    /// oldest first, a thousand at most.
    pub async fn partly_claimed(
        &self,
        job: &str,
        from: DateTime<Utc>,
    ) -> Result<Vec<(Period, DateTime<Utc>, u32)>, Error> {
        bounded!(self.partly_claimed(job, from))
    }

    /// Periods of `jobs` that can be claimed again now, oldest first, then
    /// those that waited for upstream periods and may be ready now
    /// ([`Store::ready`], with `sweep` every waiting one looked at):
    /// `limit` of each at most.
    pub async fn reclaimable(
        &self,
        jobs: &[String],
        limit: u32,
        sweep: bool,
    ) -> Result<Vec<Reclaimable>, Error> {
        let mut found = self.takeable(jobs, limit).await?;
        found.extend(self.ready(jobs, limit, sweep).await?);
        Ok(found)
    }

    /// The claims of `jobs` that can be taken again now (an expired lease,
    /// a release, a retry that is due), oldest first.
    pub async fn takeable(&self, jobs: &[String], limit: u32) -> Result<Vec<Reclaimable>, Error> {
        self.seen(bounded!(self.reclaimable(jobs, limit)))
    }

    /// Records `periods` of `job` (each with the fire it stands for) as
    /// adopted (`scheduler adopt`): done by an earlier system, never run
    /// here. A claim row at [`ADOPTED_ATTEMPT`], succeeded, with an
    /// attempt row that says who adopted it, in one transaction: all of
    /// them, or, if any of them has a claim already, none (the keys that
    /// have one are returned and nothing is written). Inserted, never
    /// updated: a period that ran here is never made adopted.
    pub async fn adopt(
        &self,
        job: &str,
        periods: &[(Period, DateTime<Utc>)],
        shards: u32,
        by: &str,
    ) -> Result<Vec<String>, Error> {
        let rows = adopted(job, periods, shards);
        bounded!(self.adopt(job, &rows, by))
    }
}

/// The rows an adoption of `periods` of `job` writes, each with its key:
/// one per period, or one per shard of a period split `shards` ways (each
/// shard adopted, so none of them runs).
pub(super) fn adopted<'a>(
    job: &str,
    periods: &'a [(Period, DateTime<Utc>)],
    shards: u32,
) -> Vec<(String, &'a Period, DateTime<Utc>)> {
    periods
        .iter()
        .flat_map(|(period, fire)| {
            crate::period::Shard::all(shards)
                .into_iter()
                .map(move |shard| {
                    (
                        PeriodKey::of(job, &period.label, shard).to_string(),
                        period,
                        *fire,
                    )
                })
        })
        .collect()
}
