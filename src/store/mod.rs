//! The claim store: one interface, one module per backend, all SQL inside.
//!
//! A claim is decided by the period key's primary key in one atomic step;
//! every later write names the attempt it belongs to and changes nothing once
//! the claim has moved on (the attempt number is the fencing token). Lease
//! expiry is measured on the database's clock.

/// PostgreSQL's clock, in milliseconds since the epoch.
pub(crate) const PG_NOW: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// Runs `$body` with `$pool` bound to the backend's pool and `$now` to its
/// clock expression, within [`STATEMENT_BOUND`].
macro_rules! on_pool {
    ($store:expr, |$pool:ident, $now:ident| $body:expr) => {{
        let work = async {
            match $store {
                Store::Sqlite(s) => {
                    let ($pool, $now) = (&s.pool, $crate::store::sqlite::NOW);
                    $body
                }
                Store::Postgres(s) => {
                    let ($pool, $now) = (&s.pool, $crate::store::PG_NOW);
                    $body
                }
            }
        };
        match tokio::time::timeout($crate::store::STATEMENT_BOUND, work).await {
            Ok(result) => result.map_err($crate::store::query_error),
            Err(_) => Err($crate::error::Error::Database(format!(
                "database error: no answer within {}s",
                $crate::store::STATEMENT_BOUND.as_secs()
            ))),
        }
    }};
}

mod api;
mod group;
mod notify;
mod outage;
mod postgres;
mod sqlite;
mod waiting;

pub use api::{ApiRun, KeyClaim, KeyRecord};
pub use notify::{Delivery, FailedForGood, NewNotification, Notification, Tried};
pub use waiting::Waiting;

/// A duration in milliseconds, as the API's and the notifications' tables
/// keep times.
fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

pub use crate::config::DatabaseUrl;
use crate::config::address::{mask_password_in, mask_url};
use crate::error::Error;
use crate::period::{Period, PeriodKey};
pub use crate::state::{
    ApiRunState, AttemptOutcome, ClaimState, DeliveryState, KeyState, PeriodState, Trigger,
};

/// What a claim asks for.
#[derive(Debug, Clone)]
pub struct ClaimRequest<'a> {
    /// The job's name.
    pub job: &'a str,
    /// The period to claim.
    pub period: &'a Period,
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
        PeriodKey::new(self.job, &self.period.label)
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

/// One recorded attempt, for `history` and `status`.
#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    /// `<job>:<label>`.
    pub period_key: String,
    /// The attempt number.
    pub attempt: i32,
    /// Why it ran.
    pub trigger: Trigger,
    /// Who ran it.
    pub owner: String,
    /// The fire it stood for.
    pub scheduled_at: Option<DateTime<Utc>>,
    /// When it was claimed.
    pub started_at: DateTime<Utc>,
    /// When it ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// The process exit code.
    pub exit_code: Option<i32>,
    /// The HTTP status.
    pub http_status: Option<i32>,
    /// What went wrong.
    pub error: Option<String>,
    /// The output tail.
    pub output: Option<String>,
    /// For a manual attempt, how it was asked for: `manual`, with `force`
    /// and `early` where given.
    pub asked: Option<String>,
    /// For a manual attempt, who asked: the API token's name, or `cli:` and
    /// the user.
    pub requested_by: Option<String>,
    /// The fingerprint of the job's definition it ran under, once it ended.
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
    /// `recovery` for a claim to take over or retry, `upstream` for a
    /// period that waited for its upstream periods and can run now, or
    /// that an upstream rerun reopened ([`Store::reopen`]).
    pub trigger: Trigger,
}

/// How a claimable row is taken again: a period an upstream rerun
/// reopened (released, its trigger `upstream`) as that rerun; any other
/// as a recovery.
fn taken_as(state: &str, trigger: &str) -> Trigger {
    if state == "released" && trigger == "upstream" {
        Trigger::Upstream
    } else {
        Trigger::Recovery
    }
}

/// A job as the database has seen it.
#[derive(Debug, Clone, Copy)]
pub struct JobRecord {
    /// When a `run` or `serve` first saw it.
    pub first_seen: DateTime<Utc>,
    /// From when it owes its fires, as its first sighting fixed it
    /// ([`Store::note_owed`]); `None` where no sighting recorded it yet.
    pub owed_from: Option<DateTime<Utc>>,
    /// Seen for the first time by the call that returned this.
    pub new: bool,
    /// Paused for every replica.
    pub paused: bool,
}

/// A job's first sighting as the database holds it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sighted {
    /// When a `run` or `serve` first saw it.
    pub first_seen: DateTime<Utc>,
    /// From when it owes its fires, where its first sighting recorded it.
    pub owed_from: Option<DateTime<Utc>>,
}

/// The database, SQLite or PostgreSQL.
#[derive(Debug, Clone)]
pub enum Store {
    /// An embedded SQLite file.
    Sqlite(sqlite::SqliteStore),
    /// A PostgreSQL server.
    Postgres(postgres::PgStore),
}

/// Calls the same method on whichever backend this is.
macro_rules! dispatch {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        match $self {
            Store::Sqlite(s) => s.$method($($arg),*).await,
            Store::Postgres(s) => s.$method($($arg),*).await,
        }
    };
}

/// How long the scheduler's own statements may take before they count as
/// failed: a stalled connection (the server alive, the path to it not)
/// would otherwise hold a claim, a scan or a release forever.
pub const STATEMENT_BOUND: Duration = Duration::from_secs(10);

/// How many running, released or failed periods of one job `status` shows
/// at most, besides the newest ones.
pub const UNSETTLED_SHOWN: u32 = 100;

/// [`dispatch!`] within [`STATEMENT_BOUND`], errors mapped.
macro_rules! bounded {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        match tokio::time::timeout(STATEMENT_BOUND, async { dispatch!($self.$method($($arg),*)) }).await {
            Ok(result) => result.map_err(query_error),
            Err(_) => Err(Error::Database(format!(
                "database error: no answer within {}s",
                STATEMENT_BOUND.as_secs()
            ))),
        }
    };
}

impl Store {
    /// Opens the database at `url` (`sqlite://FILE` or `postgres://…`, a
    /// relative path taken from the working directory), creating a missing
    /// SQLite file.
    pub async fn connect(url: &str) -> Result<Store, Error> {
        let cwd = std::env::current_dir().map_err(|e| Error::Environment(e.into()))?;
        let url = DatabaseUrl::parse(url, &cwd)
            .map_err(|e| Error::Usage(format!("--database-url: {e}")))?;
        Store::open(&url, true).await
    }

    /// Opens the database at `url`. A missing SQLite file is created (owner
    /// read and write only: it holds output tails) when `create`, else
    /// reported, so a command run from the wrong directory does not read an
    /// empty new database as "never ran".
    pub async fn open(url: &DatabaseUrl, create: bool) -> Result<Store, Error> {
        let driver_url = url.driver_url();
        let store = match url {
            DatabaseUrl::Sqlite { path, .. } => {
                prepare_sqlite_file(path, create)?;
                Store::Sqlite(
                    sqlite::SqliteStore::connect(&driver_url)
                        .await
                        .map_err(|e| sqlite_error(path, e))?,
                )
            }
            DatabaseUrl::Postgres(_) => Store::Postgres(
                postgres::PgStore::connect(&driver_url)
                    .await
                    .map_err(|e| db_error(&driver_url, "connect to", e))?,
            ),
        };
        Ok(store)
    }

    /// The scheduler on an application's PostgreSQL pool: its statements
    /// and its `sql` and transaction-scoped jobs use the pool's
    /// connections as they are (each of the scheduler's statements is still
    /// bounded by [`STATEMENT_BOUND`]).
    pub fn from_postgres_pool(pool: sqlx::PgPool) -> Store {
        Store::Postgres(postgres::PgStore::from_pool(pool))
    }

    /// The scheduler on an application's SQLite pool, whose options are
    /// the application's (WAL and `synchronous = FULL` keep an
    /// acknowledged claim through a power cut).
    pub fn from_sqlite_pool(pool: sqlx::SqlitePool) -> Store {
        Store::Sqlite(sqlite::SqliteStore {
            pool,
            outage: Default::default(),
        })
    }

    /// Applies pending migrations, returning which (`0004 api`);
    /// refuses a database migrated by a newer version. `_sqlx_migrations`
    /// may also hold an application's own migrations (the library's
    /// database is the application's): versions past
    /// [`SCHEDULER_VERSIONS`] are theirs and left alone.
    pub async fn migrate(&self) -> Result<Vec<String>, Error> {
        // Another process migrating holds the migration lock meanwhile; a
        // lock never given back (a connection that kept it) is no hang.
        const MIGRATION_BOUND: Duration = Duration::from_secs(120);
        let Ok(result) =
            tokio::time::timeout(MIGRATION_BOUND, async { dispatch!(self.migrate()) }).await
        else {
            return Err(Error::Database(format!(
                "cannot migrate the database: not done within {}s (another process holds sqlx's migration lock?)",
                MIGRATION_BOUND.as_secs()
            )));
        };
        result.map_err(|e| match e {
            sqlx::migrate::MigrateError::VersionMissing(version) => Error::Database(format!(
                "the database was migrated by a newer version of scheduler (migration {version} is unknown to this one); upgrade scheduler or point it at another database"
            )),
            sqlx::migrate::MigrateError::VersionMismatch(version) => Error::Database(format!(
                "migration {version} in _sqlx_migrations is not this scheduler's: another program's sqlx migrations with small version numbers share the table (give them sqlx's default timestamp versions), or the scheduler's own were edited"
            )),
            other => Error::Database(format!("cannot migrate the database: {other}")),
        })
    }

    /// Whether the scheduler's tables are here at all (a database that
    /// nothing has run against has none).
    pub async fn has_schema(&self) -> Result<bool, Error> {
        bounded!(self.has_schema())
    }

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

    /// Runs a group of `sql` actions in one transaction and one commit:
    /// each statement in a savepoint of its own, so a failing one fails
    /// only its own period, and every outcome fenced by its attempt. While
    /// the group runs its claims cannot be taken over (PostgreSQL: a key
    /// share lock each, which renewals pass and other replicas' claims
    /// report as held; SQLite: the one writer). A group that fails to
    /// commit records nothing. `recording` is called just before the
    /// outcomes are written. `Ok(None)`: stopped through `limits.cancel`,
    /// nothing committed.
    pub async fn run_sql_group(
        &self,
        runs: &[GroupedSql<'_>],
        limits: &SqlLimits,
        recording: &(dyn Fn() + Sync),
    ) -> Result<Option<Vec<GroupedEnd>>, Error> {
        dispatch!(self.run_sql_group(runs, limits, recording)).map_err(query_error)
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

    /// How long this process's claims still leave expired leases to their
    /// runners, if they do: for a heartbeat interval (`lease`/3) of the
    /// database's answers after the process started, for a whole `lease`
    /// after it saw the database fail (the runner may still be writing its
    /// outcome). Such a claim is answered [`Claim::Expired`].
    pub fn holding(&self, lease: Duration) -> Option<Duration> {
        self.outage().holding(lease)
    }

    /// What this process saw of its database lately ([`outage`]).
    fn outage(&self) -> &outage::Outage {
        match self {
            Store::Sqlite(s) => &s.outage,
            Store::Postgres(s) => &s.outage,
        }
    }

    /// `result`, noted as a sign of the database being away or back: the
    /// claims, renewals, outcomes and scans every running process sends.
    fn seen<T>(&self, result: Result<T, Error>) -> Result<T, Error> {
        self.outage().note(&result);
        result
    }

    /// Records `jobs` as seen (now, on the database's clock) where new, in
    /// one statement, and returns each one's record.
    pub async fn see_jobs(&self, jobs: &[String]) -> Result<HashMap<String, JobRecord>, Error> {
        bounded!(self.see_jobs(jobs))
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
        by: &str,
    ) -> Result<Vec<String>, Error> {
        bounded!(self.adopt(job, periods, by))
    }

    /// When each of `jobs` was first seen, and from when it owes its
    /// fires where that is recorded, for those a `serve` or `run JOB` has
    /// seen (one only `pause` named is not); reads only.
    pub async fn first_seen(&self, jobs: &[String]) -> Result<HashMap<String, Sighted>, Error> {
        bounded!(self.first_seen(jobs))
    }

    /// Records, for `job` seen for the first time, from when it owes its
    /// fires, unless a sighting recorded it already: fixed there, so that a
    /// later change of the job's calendar, dates or jitter never makes a
    /// fire from before the sighting owed.
    pub async fn note_owed(&self, job: &str, owed_from: DateTime<Utc>) -> Result<(), Error> {
        bounded!(self.note_owed(job, owed_from))
    }

    /// The jobs paused for every replica.
    pub async fn paused_jobs(&self) -> Result<Vec<String>, Error> {
        bounded!(self.paused_jobs())
    }

    /// For each of `jobs` with claims, the newest fire a claim was made for
    /// by a scheduler, not by hand: a hand run of a recent period says
    /// nothing of the periods before it.
    pub async fn last_fires(
        &self,
        jobs: &[String],
    ) -> Result<HashMap<String, DateTime<Utc>>, Error> {
        bounded!(self.last_fires(jobs))
    }

    /// Pauses or resumes `job` for every replica.
    pub async fn set_paused(&self, job: &str, paused: bool) -> Result<(), Error> {
        bounded!(self.set_paused(job, paused))
    }

    /// The attempts of `job`, newest first.
    pub async fn history(&self, job: &str, limit: u32) -> Result<Vec<Attempt>, Error> {
        bounded!(self.history("job", job, limit))
    }

    /// The attempts of one period, newest first.
    pub async fn attempts(&self, key: &str, limit: u32) -> Result<Vec<Attempt>, Error> {
        bounded!(self.history("period_key", key, limit))
    }

    /// The claim rows of `job` that `status` shows, newest period first:
    /// the `limit` newest periods, every running, released or failed one
    /// however old (up to [`UNSETTLED_SHOWN`]: a stuck backfill period is
    /// what on-call looks for), and the one that finished last.
    pub async fn recent(&self, job: &str, limit: u32) -> Result<Vec<ClaimRow>, Error> {
        bounded!(self.recent(job, limit))
    }

    /// Deletes finished claims of `job` (and their attempts) that finished
    /// more than `keep` ago and whose fire lies before the catch-up
    /// `window` (a pruned period inside it could be claimed again); returns
    /// how many claims went (`dry_run`: would go; nothing is deleted).
    pub async fn prune(
        &self,
        job: &str,
        keep: Duration,
        window: Duration,
        dry_run: bool,
    ) -> Result<u64, Error> {
        dispatch!(self.prune(job, keep, window, dry_run)).map_err(query_error)
    }
}

/// The highest migration version a newer scheduler could have: anything
/// above it in `_sqlx_migrations` is another program's.
pub const SCHEDULER_VERSIONS: i64 = 9_999;

/// Refuses a shared `_sqlx_migrations` that holds a newer scheduler's
/// migration (reported as missing); the application's own versions above
/// [`SCHEDULER_VERSIONS`] are left to it.
fn refuse_newer(
    migrator: &sqlx::migrate::Migrator,
    applied: &[i64],
) -> Result<(), sqlx::migrate::MigrateError> {
    let ours = migrator.iter().map(|m| m.version).max().unwrap_or(0);
    match applied
        .iter()
        .find(|v| **v > ours && **v <= SCHEDULER_VERSIONS)
    {
        Some(newer) => Err(sqlx::migrate::MigrateError::VersionMissing(*newer)),
        None => Ok(()),
    }
}

/// The migrations of `migrator` not among `before` (applied versions).
fn applied_since(migrator: &sqlx::migrate::Migrator, before: &[i64]) -> Vec<String> {
    migrator
        .iter()
        .filter(|m| !before.contains(&m.version))
        .map(|m| format!("{:04} {}", m.version, m.description))
        .collect()
}

/// One `sql` action of a group committed together.
#[derive(Debug)]
pub struct GroupedSql<'a> {
    /// Its won claim.
    pub lease: &'a Lease,
    /// What it runs.
    pub work: Work<'a>,
    /// How long the statement may run: the job's `timeout`.
    pub timeout: Option<Duration>,
    /// What is recorded if the statement fails (its error filled in).
    pub failure: Finish,
    /// Values masked in its error (a bound param may hold a secret, and
    /// the database quotes bad values back).
    pub secrets: &'a crate::template::Secrets,
}

impl GroupedSql<'_> {
    /// How the database's error about it is told, secrets masked.
    fn error(&self, e: &dyn std::fmt::Display) -> String {
        self.secrets.mask(&e.to_string())
    }
}

/// What one action of a group runs in the group's transaction.
pub enum Work<'a> {
    /// An `sql` job's statement.
    Statement {
        /// With `$1`, `$2`, … for the params.
        statement: &'a str,
        /// Its params, rendered.
        params: Vec<Param>,
    },
    /// A code job's transaction-scoped handler: always in a savepoint of
    /// its own, and run once (a failure is rolled back alone, never run
    /// again in a second pass).
    Code {
        /// The handler.
        handler: &'a crate::handler::Scoped,
        /// What it is told, its token cancelled when the group is stopped.
        context: crate::handler::Context,
    },
}

/// A bound param of an `sql` statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    /// Text.
    Text(String),
    /// An instant (a param that is just `{period_start}`, `{period_end}` or
    /// `{scheduled_at}`): a `timestamptz` on PostgreSQL, so that a
    /// procedure taking one is called as written; RFC 3339 text on SQLite,
    /// which has no such type.
    Instant(DateTime<Utc>),
}

impl Param {
    /// Its value as text, as SQLite is given it.
    pub fn text(&self) -> String {
        match self {
            Param::Text(text) => text.clone(),
            Param::Instant(at) => crate::period::utc_text(*at),
        }
    }
}

impl std::fmt::Debug for Work<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Work::Statement { statement, .. } => write!(f, "Statement({statement:?})"),
            Work::Code { context, .. } => write!(f, "Code({})", context.period_key()),
        }
    }
}

impl Work<'_> {
    /// Whether it is a handler.
    fn is_code(&self) -> bool {
        matches!(self, Work::Code { .. })
    }

    /// How a failure of it is told.
    fn failed(&self, error: &str) -> String {
        match self {
            Work::Statement { .. } => format!("SQL failed: {error}"),
            Work::Code { .. } => error.to_owned(),
        }
    }
}

/// How one action of a group ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupedEnd {
    /// Its statement and its success committed together; how long the
    /// statement ran (on PostgreSQL, beyond a round trip of the moment).
    Succeeded(Duration),
    /// Its statement failed and was rolled back; the failure is recorded.
    Failed(String),
    /// Its handler failed for good and was rolled back; the failure is
    /// recorded, no retry due.
    Permanent(String),
    /// Its claim had moved on: nothing of it ran.
    Moved,
    /// Not started: the group had run its [`GROUP_BUDGET`].
    NotStarted,
}

/// How long a group of `sql` actions runs before it starts no more
/// statements: it commits what it ran and leaves the rest
/// ([`GroupedEnd::NotStarted`]) to run apart, so a slow statement delays
/// the others of its group once at most.
pub const GROUP_BUDGET: Duration = Duration::from_millis(100);

/// What a group records: each success, and each failure with its error.
fn group_outcomes<'a>(runs: &[GroupedSql<'a>], ends: &[GroupedEnd]) -> Vec<(&'a Lease, Finish)> {
    runs.iter()
        .zip(ends)
        .filter_map(|(run, end)| match end {
            GroupedEnd::Succeeded(_) => Some((
                run.lease,
                Finish {
                    succeeded: true,
                    definition: run.failure.definition.clone(),
                    ..Finish::default()
                },
            )),
            GroupedEnd::Failed(error) => Some((
                run.lease,
                Finish {
                    error: Some(run.work.failed(error)),
                    ..run.failure.clone()
                },
            )),
            GroupedEnd::Permanent(error) => Some((
                run.lease,
                Finish {
                    error: Some(run.work.failed(error)),
                    retry_after: None,
                    ..run.failure.clone()
                },
            )),
            GroupedEnd::Moved | GroupedEnd::NotStarted => None,
        })
        .collect()
}

/// The bounds of an `sql` action's statement.
#[derive(Debug)]
pub struct SqlLimits {
    /// How long the statement may run: the job's `timeout`.
    pub timeout: Option<Duration>,
    /// How long a statement may hold SQLite's one writer at most, whatever
    /// its `timeout` (heartbeats and claims wait for it meanwhile).
    pub writer_timeout: Duration,
    /// Turned true to stop the statement: its claim was lost or shutdown
    /// came. A channel, so a waiter sleeps until it turns and SQLite's
    /// progress handler can read it too.
    pub cancel: tokio::sync::watch::Sender<bool>,
}

impl SqlLimits {
    /// Limits with no cancel yet.
    pub fn new(timeout: Option<Duration>, writer_timeout: Duration) -> SqlLimits {
        SqlLimits {
            timeout,
            writer_timeout,
            cancel: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Stops the statement.
    pub fn cancel(&self) {
        self.cancel.send_replace(true);
    }

    /// Resolves once the statement is to stop.
    async fn cancelled_wait(&self) {
        let _ = self
            .cancel
            .subscribe()
            .wait_for(|cancelled| *cancelled)
            .await;
    }
}

fn db_error(url: &str, verb: &str, e: sqlx::Error) -> Error {
    let hint = match &e {
        sqlx::Error::Database(db) if db.code().as_deref() == Some("3D000") => {
            "; create it first (`createdb NAME`, or `CREATE DATABASE`), or name one that exists"
        }
        sqlx::Error::Io(io) if io.kind() == std::io::ErrorKind::ConnectionRefused => {
            "; is the server running, and listening on that host and port?"
        }
        _ => "",
    };
    let text = mask_password_in(&e.to_string(), url);
    Error::Database(format!(
        "cannot {verb} the database at {}: {text}{hint}",
        mask_url(url)
    ))
}

/// Checks that a SQLite file can be opened, or creates it with mode 0600
/// when `create`; says which path and why when neither works.
fn prepare_sqlite_file(path: &std::path::Path, create: bool) -> Result<(), Error> {
    use std::os::unix::fs::OpenOptionsExt;
    let cannot = |e: std::io::Error| {
        Error::Database(format!(
            "cannot open the SQLite database {}: {e}; check that the file and its directory exist and that this user may read and write them",
            path.display()
        ))
    };
    match std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(path)
    {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && !create => {
            Err(Error::Database(format!(
                "no database at {}: nothing has run against it yet, or this is not the right one (a relative path in jobs.toml is taken from the directory of jobs.toml; one in --database-url or DATABASE_URL from the working directory); `scheduler migrate` creates it",
                path.display()
            )))
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            match std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)
            {
                Ok(_) => {
                    // Worth a line: a new, empty database has run nothing,
                    // and a wrong path here would run everything again.
                    tracing::info!("created a new database at {}", path.display());
                    Ok(())
                }
                // Another process created it meanwhile.
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
                Err(e) => Err(cannot(e)),
            }
        }
        Err(e) => Err(cannot(e)),
    }
}

/// A SQLite error on open, with the path and, for SQLite's bare "unable to
/// open database file (code: 14)", what to check.
fn sqlite_error(path: &std::path::Path, e: sqlx::Error) -> Error {
    let code_14 = matches!(&e, sqlx::Error::Database(d) if d.code().as_deref() == Some("14"));
    let hint = if code_14 {
        let dir = path.parent().unwrap_or(path);
        format!(
            "; SQLite cannot open or create the file or its -wal and -shm files next to it: check that this user may write to {}",
            dir.display()
        )
    } else {
        String::new()
    };
    Error::Database(format!(
        "cannot open the SQLite database {}: {e}{hint}",
        path.display()
    ))
}

fn query_error(e: sqlx::Error) -> Error {
    metrics::counter!("scheduler_database_errors_total").increment(1);
    Error::Database(format!("database error: {e}"))
}

/// Keeps the last `limit` bytes of `text`, cut at a character boundary.
pub fn tail(text: &str, limit: usize) -> &str {
    let mut start = text.len().saturating_sub(limit);
    while !text.is_char_boundary(start) {
        start += 1;
    }
    &text[start..]
}

/// The [`ClaimState`] a stored word names; a word no version writes is a
/// decoding error, not a guess.
pub(crate) fn claim_state(word: &str) -> Result<ClaimState, sqlx::Error> {
    ClaimState::parse(word)
        .ok_or_else(|| sqlx::Error::Decode(format!("`{word}` is not a state of a claim").into()))
}

/// The [`Trigger`] a stored word names; a word no version writes is a
/// decoding error, not a guess.
pub(crate) fn trigger(word: &str) -> Result<Trigger, sqlx::Error> {
    Trigger::parse(word)
        .ok_or_else(|| sqlx::Error::Decode(format!("`{word}` is not a trigger").into()))
}

/// The [`AttemptOutcome`] a stored word names, as [`trigger`] reads.
pub(crate) fn attempt_outcome(word: &str) -> Result<AttemptOutcome, sqlx::Error> {
    AttemptOutcome::parse(word).ok_or_else(|| {
        sqlx::Error::Decode(format!("`{word}` is not an outcome of an attempt").into())
    })
}
