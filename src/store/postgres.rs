//! The PostgreSQL backend: the claim is one call of `scheduler_claim` (see
//! the migration), every other write one statement, so a run costs two round
//! trips and two commits besides heartbeats.

use std::borrow::Cow;
use std::collections::HashMap;
use std::time::Duration;

use chrono::{DateTime, Utc};

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{Connection, Row};

use super::group::{GroupTx, Pass, PassOver, Refused, run_pass};
use super::{
    ADOPTED_ATTEMPT, Attempt, Claim, ClaimRequest, ClaimRow, Finish, GroupedEnd, GroupedSql,
    JobRecord, Lease, Param, Reclaimable, Released, Sighted, SqlLimits, claim_state,
};
use crate::handler::Transaction;
use crate::period::{Period, PeriodKey};

/// The scheduler's migrations, beside whatever else `_sqlx_migrations`
/// holds (see [`super::SCHEDULER_VERSIONS`]).
fn migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!("migrations/postgres");
    migrator.set_ignore_missing(true);
    migrator
}

/// `text` as PostgreSQL's `text` can hold it: a NUL byte (a job that
/// prints binary, a response body) becomes `\x00`, as `history` shows one
/// that SQLite kept. Refused, the outcome could never be recorded, and its
/// period was taken over and run again at every lease.
fn without_nul(text: &str) -> Cow<'_, str> {
    if text.contains('\0') {
        Cow::Owned(text.replace('\0', "\\x00"))
    } else {
        Cow::Borrowed(text)
    }
}

/// Has every connection give back, as it returns to its pool, what one
/// large message grew its buffers to. sqlx keeps a connection's buffers at
/// their largest for its life: a scan binding 10,000 job names leaves
/// 240 KB behind in each connection it ever ran on. Free when nothing grew.
fn shrinking_on_release(options: PgPoolOptions) -> PgPoolOptions {
    options.after_release(|conn, _| {
        Box::pin(async move {
            conn.shrink_buffers();
            Ok(true)
        })
    })
}

/// Connections to one PostgreSQL database, in two pools so that no action
/// can starve the scheduler's own statements.
#[derive(Debug, Clone)]
pub struct PgStore {
    /// Claims, heartbeats, outcomes and scans: short statements, bounded
    /// by a server-side statement and lock timeout.
    pub(super) pool: PgPool,
    /// `sql` actions only, each holding a connection for its statement.
    actions: PgPool,
    pub(super) outage: std::sync::Arc<super::outage::Outage>,
}

/// The most connections `sql` actions of one process hold at once; more
/// wait for one (within their own timeout) without delaying anything else.
const ACTION_CONNECTIONS: u32 = 16;

fn millis(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn claim_row(row: &PgRow) -> Result<ClaimRow, sqlx::Error> {
    Ok(ClaimRow {
        period_key: row.try_get("period_key")?,
        period: row.try_get("period")?,
        state: claim_state(row.try_get("state")?)?,
        attempt: row.try_get("attempt")?,
        failures: row.try_get("failures")?,
        owner: row.try_get("owner")?,
        lease_until: row.try_get("lease_until")?,
        started_at: row.try_get("started_at")?,
        retry_at: row.try_get("retry_at")?,
        finished_at: row.try_get("finished_at")?,
        // The rule is SQL: NULL (a comparison with a missing time) is no.
        claimable: row
            .try_get::<Option<bool>, _>("claimable")?
            .unwrap_or(false),
        now: row.try_get("now")?,
    })
}

/// One row of `scheduler_claim_many`: won, or the row as it stands.
fn claim_of(
    row: &PgRow,
    request: &ClaimRequest<'_>,
    key: &PeriodKey,
) -> Result<Claim, sqlx::Error> {
    let label = request.period.label.as_str();
    if row.try_get("o_won")? {
        // The lease counts from the instant the row was won, which is after
        // any wait for a lock; the statement began at `o_now`.
        let until: Option<DateTime<Utc>> = row.try_get("o_lease_until")?;
        let began: DateTime<Utc> = row.try_get("o_now")?;
        let granted = until.map_or(request.lease, |until| {
            (until - began).to_std().unwrap_or(Duration::ZERO)
        });
        return Ok(Claim::Won(Lease {
            key: key.clone(),
            attempt: row.try_get("o_attempt")?,
            failures: row.try_get("o_failures")?,
            trigger: super::trigger(row.try_get("o_trigger")?)?,
            granted,
        }));
    }
    if row.try_get("o_contended")? {
        return Ok(Claim::Contended);
    }
    let Some(state) = row.try_get::<Option<&str>, _>("o_state")? else {
        return Ok(Claim::Busy);
    };
    let state = claim_state(state)?;
    let current = ClaimRow {
        period_key: key.to_string(),
        period: label.to_owned(),
        state,
        attempt: row.try_get("o_attempt")?,
        failures: row.try_get("o_failures")?,
        owner: row
            .try_get::<Option<String>, _>("o_owner")?
            .unwrap_or_default(),
        lease_until: row.try_get("o_lease_until")?,
        started_at: None,
        retry_at: row.try_get("o_retry_at")?,
        finished_at: row.try_get("o_finished_at")?,
        claimable: row
            .try_get::<Option<bool>, _>("o_claimable")?
            .unwrap_or(false),
        now: row.try_get("o_now")?,
    };
    Ok(current.as_claim())
}

/// Records outcomes and their attempt rows in one statement, each fenced
/// by its attempt (running, or released by `scheduler release` and not
/// claimed since: finished work is kept rather than run again). The rows
/// are locked in the order claims and renewals lock them. The end is the
/// clock at the write (`clock_timestamp()`), not the transaction's start:
/// an `sql` action's statement runs before it.
const RECORD: &str = "
    WITH h AS (
        SELECT * FROM unnest($1::text[], $2::int[], $3::text[], $4::int[], $5::bigint[],
                             $6::int[], $7::int[], $8::text[], $9::text[], $10::text[])
            AS h(key, attempt, state, failed, retry_ms, exit_code, http_status, error, output,
                 definition)
    ), mine AS (
        SELECT c.period_key FROM scheduler_claims c JOIN h ON c.period_key = h.key
         WHERE c.attempt = h.attempt AND c.state IN ('running', 'released')
         ORDER BY c.job COLLATE \"C\", c.period_key COLLATE \"C\"
           FOR NO KEY UPDATE OF c
    ), c AS (
        UPDATE scheduler_claims c
           SET state = h.state, finished_at = clock_timestamp(), lease_until = NULL,
               failures = c.failures + h.failed,
               retry_at = clock_timestamp() + h.retry_ms * interval '1 millisecond'
          FROM h JOIN mine ON mine.period_key = h.key
         WHERE c.period_key = h.key
     RETURNING c.period_key, c.attempt, c.finished_at)
    UPDATE scheduler_attempts a
       SET outcome = h.state, finished_at = c.finished_at, exit_code = h.exit_code,
           http_status = h.http_status, error = h.error, output = h.output,
           definition = h.definition
      FROM c JOIN h ON h.key = c.period_key
     WHERE a.period_key = c.period_key AND a.attempt = c.attempt
    RETURNING a.period_key";

impl PgStore {
    /// On an application's pool: one pool for everything.
    pub(super) fn from_pool(pool: PgPool) -> PgStore {
        PgStore {
            actions: pool.clone(),
            pool,
            outage: Default::default(),
        }
    }

    pub(super) async fn connect(url: &str) -> Result<PgStore, sqlx::Error> {
        // One connection made directly first: the pool retries a refused,
        // unresolvable, TLS-failing or unauthorised connection until its
        // acquire timeout and then says only "pool timed out"; this says why.
        const FIRST_CONNECT: Duration = Duration::from_secs(10);
        let connect = <sqlx::PgConnection as sqlx::Connection>::connect(url);
        let first = tokio::time::timeout(FIRST_CONNECT, connect)
            .await
            .map_err(|_| {
                sqlx::Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("no answer from the server within {FIRST_CONNECT:?}"),
                ))
            })??;
        let _ = sqlx::Connection::close(first).await;
        let options: PgConnectOptions = url.parse()?;
        // The scheduler's own statements are short; one that waits on a
        // lock or runs away is cut off by the server rather than left to
        // hold a connection that heartbeats need.
        let control = options
            .clone()
            .options([("statement_timeout", "30s"), ("lock_timeout", "10s")]);
        let pool = shrinking_on_release(PgPoolOptions::new())
            .max_connections(8)
            // A broken connection fails its query and is replaced; a ping
            // before every use would cost a round trip per statement.
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(10))
            .connect_with(control)
            .await?;
        let actions = shrinking_on_release(PgPoolOptions::new())
            .max_connections(ACTION_CONNECTIONS)
            .test_before_acquire(false)
            .acquire_timeout(Duration::from_secs(3600))
            // A runner frozen inside an action's transaction would hold its
            // locks against the takeover; the server ends such a
            // transaction (a live runner is never idle inside one).
            .connect_lazy_with(options.options([("idle_in_transaction_session_timeout", "30s")]));
        Ok(PgStore {
            pool,
            actions,
            outage: Default::default(),
        })
    }

    pub(super) async fn has_schema(&self) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar("SELECT to_regclass('scheduler_claims') IS NOT NULL")
            .fetch_one(&self.pool)
            .await
    }

    /// Applies what is pending; the migrations it applied. The versions
    /// of `_sqlx_migrations` past the scheduler's range are another
    /// program's, and left alone.
    pub(super) async fn migrate(&self) -> Result<Vec<String>, sqlx::migrate::MigrateError> {
        let migrator = &migrator();
        let before: Vec<i64> =
            sqlx::query_scalar("SELECT version FROM _sqlx_migrations WHERE success")
                .fetch_all(&self.pool)
                .await
                .unwrap_or_default();
        super::refuse_newer(migrator, &before)?;
        migrator.run(&self.pool).await?;
        Ok(super::applied_since(migrator, &before))
    }

    /// `wait`: for the jobs' locks, or else answer the keys of a job whose
    /// lock another transaction holds contended (a batch of several keys).
    /// `hold`: an expired lease is answered as held, not taken over
    /// ([`super::outage`]): the claim runs in a transaction that says so to
    /// `scheduler_claimable`, three more round trips, only after an outage.
    pub(super) async fn claim_many(
        &self,
        requests: &[ClaimRequest<'_>],
        wait: bool,
        hold: bool,
    ) -> Result<Vec<Claim>, sqlx::Error> {
        let keys: Vec<PeriodKey> = requests.iter().map(ClaimRequest::key).collect();
        let column = |f: &dyn Fn(&ClaimRequest<'_>) -> String| -> Vec<String> {
            requests.iter().map(f).collect()
        };
        let jobs = column(&|r| r.job.to_owned());
        let labels = column(&|r| r.period.label.clone());
        let triggers = column(&|r| r.trigger.as_str().to_owned());
        let starts: Vec<DateTime<Utc>> = requests.iter().map(|r| r.period.start).collect();
        let ends: Vec<DateTime<Utc>> = requests.iter().map(|r| r.period.end).collect();
        let scheduled: Vec<DateTime<Utc>> = requests.iter().map(|r| r.scheduled_at).collect();
        let concurrency: Vec<i32> = requests
            .iter()
            .map(|r| i32::try_from(r.concurrency).unwrap_or(i32::MAX))
            .collect();
        let force: Vec<bool> = requests.iter().map(|r| r.force).collect();
        let manual: Vec<bool> = requests.iter().map(|r| r.manual).collect();
        let key_texts: Vec<&str> = keys.iter().map(PeriodKey::as_str).collect();
        // How manual runs were asked for is written on the attempts won by
        // the claiming statement itself: one round trip, one commit.
        let how: Vec<Option<&str>> = requests.iter().map(|r| r.asked.map(|a| a.how)).collect();
        let by: Vec<Option<&str>> = requests.iter().map(|r| r.asked.map(|a| a.by)).collect();
        let noting = how.iter().any(Option::is_some);
        let call = if noting {
            "SELECT * FROM scheduler_claim_many_asked($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"
        } else {
            "SELECT * FROM scheduler_claim_many($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
        };
        let mut statement = sqlx::query(call)
            .bind(&key_texts)
            .bind(&jobs)
            .bind(&labels)
            .bind(&starts)
            .bind(&ends)
            .bind(&scheduled)
            .bind(&triggers)
            .bind(&concurrency)
            .bind(&force)
            .bind(&manual)
            .bind(requests[0].owner)
            .bind(millis(requests[0].lease))
            .bind(wait);
        if noting {
            statement = statement.bind(&how).bind(&by);
        }
        let rows = if hold {
            let mut tx = self.pool.begin().await?;
            sqlx::query("SELECT set_config('scheduler.recovery', 'hold', true)")
                .execute(&mut *tx)
                .await?;
            let rows = statement.fetch_all(&mut *tx).await?;
            tx.commit().await?;
            rows
        } else {
            statement.fetch_all(&self.pool).await?
        };
        let mut claims: Vec<Option<Claim>> = vec![None; requests.len()];
        for row in &rows {
            let ord: i32 = row.try_get("o_ord")?;
            let Some(i) = usize::try_from(ord).ok().and_then(|o| o.checked_sub(1)) else {
                continue;
            };
            let Some(slot) = claims.get_mut(i) else {
                continue;
            };
            *slot = Some(claim_of(row, &requests[i], &keys[i])?);
        }
        Ok(claims.into_iter().flatten().collect())
    }

    pub(super) async fn renew(
        &self,
        leases: &[&Lease],
        lease: Duration,
    ) -> Result<Vec<bool>, sqlx::Error> {
        let keys: Vec<&str> = leases.iter().map(|l| l.key.as_str()).collect();
        let attempts: Vec<i32> = leases.iter().map(|l| l.attempt).collect();
        // Rows locked in the order a batch claim takes them (job, then key),
        // so a renewal never deadlocks with another replica's claim of the
        // same keys; a no-key lock, which an sql group's key share passes.
        let renewed: Vec<(String, i32)> = sqlx::query_as(
            "WITH mine AS (
                SELECT c.period_key FROM scheduler_claims c
                  JOIN unnest($1::text[], $2::int[]) AS h(key, attempt)
                    ON c.period_key = h.key AND c.attempt = h.attempt
                 WHERE c.state = 'running'
                 ORDER BY c.job COLLATE \"C\", c.period_key COLLATE \"C\"
                   FOR NO KEY UPDATE OF c)
             UPDATE scheduler_claims c
                SET lease_until = now() + $3 * interval '1 millisecond'
               FROM mine
              WHERE c.period_key = mine.period_key
          RETURNING c.period_key, c.attempt",
        )
        .bind(&keys)
        .bind(&attempts)
        .bind(millis(lease))
        .fetch_all(&self.pool)
        .await?;
        let renewed: std::collections::HashSet<(&str, i32)> = renewed
            .iter()
            .map(|(key, attempt)| (key.as_str(), *attempt))
            .collect();
        Ok(leases
            .iter()
            .map(|l| renewed.contains(&(l.key.as_str(), l.attempt)))
            .collect())
    }

    pub(super) async fn finish_many(
        &self,
        outcomes: &[(&Lease, Finish)],
    ) -> Result<std::collections::HashSet<String>, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        record_many(&mut conn, outcomes).await
    }

    pub(super) async fn run_sql_group(
        &self,
        runs: &[GroupedSql<'_>],
        limits: &SqlLimits,
        recording: &(dyn Fn() + Sync),
    ) -> Result<Option<Vec<GroupedEnd>>, sqlx::Error> {
        // The backend of the pass under way (a pass after a failure may be
        // on another connection): the one a cancel must reach.
        let backend = std::sync::atomic::AtomicI32::new(0);
        let committing = std::sync::atomic::AtomicBool::new(false);
        let under_way = UnderWay {
            backend: &backend,
            committing: &committing,
        };
        let work = self.group_passes(runs, limits, recording, under_way);
        tokio::pin!(work);
        tokio::select! {
            result = &mut work => return result,
            () = limits.cancelled_wait() => {}
        }
        if let Some(pid) = running_backend(&backend) {
            let _ = sqlx::query("SELECT pg_cancel_backend($1)")
                .bind(pid)
                .execute(&self.pool)
                .await;
        }
        // A handler may be awaiting something else than its statement: it
        // is dropped now (its token was cancelled), its transaction rolled
        // back with it.
        if runs.iter().any(|run| run.work.is_code())
            && !committing.load(std::sync::atomic::Ordering::SeqCst)
        {
            return Ok(None);
        }
        match tokio::time::timeout(Duration::from_secs(5), &mut work).await {
            Ok(Ok(Some(ends))) => Ok(Some(ends)),
            Ok(_) => Ok(None),
            Err(_) => {
                if let Some(pid) = running_backend(&backend) {
                    let _ = sqlx::query("SELECT pg_terminate_backend($1)")
                        .bind(pid)
                        .execute(&self.pool)
                        .await;
                }
                Ok(None)
            }
        }
    }

    /// The passes of a group until one commits (or it is stopped): the
    /// first without savepoints, the next, after a failure, careful.
    async fn group_passes(
        &self,
        runs: &[GroupedSql<'_>],
        limits: &SqlLimits,
        recording: &(dyn Fn() + Sync),
        under_way: UnderWay<'_>,
    ) -> Result<Option<Vec<GroupedEnd>>, sqlx::Error> {
        // What is known already: a failing statement found by a pass.
        let mut failed: Vec<Option<String>> = vec![None; runs.len()];
        let mut careful = false;
        loop {
            let mut conn = self.actions.acquire().await?;
            let mut tx = sqlx::Connection::begin(&mut *conn).await?;
            let (ours, round_trip) = begin_group(&mut tx, runs, under_way.backend).await?;
            let pass = PassOver {
                runs,
                ours: &ours,
                failed: &failed,
                careful,
                limits,
                started: std::time::Instant::now(),
                round_trip,
            };
            let mut ends = Vec::with_capacity(runs.len());
            let mut group = PgGroupTx {
                conn: &mut tx,
                timeout: None,
                limits,
            };
            match run_pass(&mut group, pass, &mut ends).await? {
                Pass::Done => {}
                Pass::Stopped => return Ok(None),
                // Statements run without savepoints first (a round trip
                // each); a failure rolls the pass back, and the next is
                // careful, on another connection if this one was ended.
                Pass::FailedAt(i, error) => {
                    if tx.rollback().await.is_err() {
                        let _ = conn.close().await;
                    }
                    failed[i] = Some(error);
                    careful = true;
                    continue;
                }
                // A code job runs alone in its group: only its own end is
                // at stake, written outside the lost transaction.
                Pass::Ended(i, end) => {
                    let _ = tx.rollback().await;
                    let _ = conn.close().await;
                    let (mut ends, outcomes) = super::group::alone(runs, i, end);
                    recording();
                    let mut control = self.pool.acquire().await?;
                    if record_many(&mut control, &outcomes).await?.is_empty() {
                        ends[i] = GroupedEnd::Moved;
                    }
                    return Ok(Some(ends));
                }
            }
            sqlx::Executor::execute(
                &mut *tx,
                "SET LOCAL statement_timeout = '30s'; SET LOCAL plan_cache_mode = force_generic_plan",
            )
            .await?;
            let outcomes = super::group_outcomes(runs, &ends);
            recording();
            under_way
                .committing
                .store(true, std::sync::atomic::Ordering::SeqCst);
            if record_many(&mut tx, &outcomes).await?.len() != outcomes.len() {
                // Cannot happen under the key share locks; if it did, no
                // statement may commit without its outcome.
                return Err(sqlx::Error::Protocol(
                    "a claim moved on inside its sql group".into(),
                ));
            }
            tx.commit().await?;
            return Ok(Some(ends));
        }
    }

    pub(super) async fn release(
        &self,
        lease: &Lease,
        output: Option<&str>,
    ) -> Result<bool, sqlx::Error> {
        let released = sqlx::query(
            "WITH c AS (
                UPDATE scheduler_claims
                   SET state = 'released', lease_until = NULL, finished_at = now()
                 WHERE period_key = $1 AND attempt = $2 AND state = 'running'
             RETURNING period_key, attempt)
             UPDATE scheduler_attempts a SET outcome = 'released', finished_at = now(),
                    output = COALESCE($3::text, a.output)
               FROM c WHERE a.period_key = c.period_key AND a.attempt = c.attempt
             RETURNING 1",
        )
        .bind(lease.key.as_str())
        .bind(lease.attempt)
        .bind(output.map(without_nul))
        .fetch_optional(&self.pool)
        .await?;
        Ok(released.is_some())
    }

    pub(super) async fn confirm_stopped(
        &self,
        lease: &Lease,
        output: Option<&str>,
    ) -> Result<bool, sqlx::Error> {
        let (confirmed,): (i64,) = sqlx::query_as(
            "WITH c AS (
                UPDATE scheduler_claims SET lease_until = NULL
                 WHERE period_key = $1 AND attempt = $2 AND state = 'released'
             RETURNING period_key, attempt),
             a AS (
                UPDATE scheduler_attempts a SET output = COALESCE($3::text, a.output)
                  FROM c WHERE a.period_key = c.period_key AND a.attempt = c.attempt)
             SELECT count(*) FROM c",
        )
        .bind(lease.key.as_str())
        .bind(lease.attempt)
        .bind(output.map(without_nul))
        .fetch_one(&self.pool)
        .await?;
        Ok(confirmed == 1)
    }

    pub(super) async fn release_key(&self, key: &str) -> Result<Option<Released>, sqlx::Error> {
        // The lease stays: the runner may be cut off and unable to stop its
        // job; the period is claimable once that runner confirms the job
        // stopped, or once the lease it was granted has run out.
        let row: Option<(String, Option<DateTime<Utc>>)> = sqlx::query_as(
            "WITH c AS (
                UPDATE scheduler_claims
                   SET state = 'released', finished_at = now()
                 WHERE period_key = $1 AND state = 'running'
             RETURNING period_key, attempt, owner, lease_until),
             a AS (
                UPDATE scheduler_attempts a SET outcome = 'released', finished_at = now()
                  FROM c WHERE a.period_key = c.period_key AND a.attempt = c.attempt)
             SELECT owner, lease_until FROM c",
        )
        .bind(key)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|(owner, lease_until)| Released { owner, lease_until }))
    }

    pub(super) async fn rows(&self, keys: &[String]) -> Result<Vec<ClaimRow>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT c.*, scheduler_claimable(c.state, c.lease_until, c.retry_at, false, false) AS claimable,
                    now() AS now
               FROM scheduler_claims c WHERE c.period_key = ANY($1)",
        )
        .bind(keys)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(claim_row).collect()
    }

    pub(super) async fn reclaimable(
        &self,
        jobs: &[String],
        limit: u32,
    ) -> Result<Vec<Reclaimable>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT job, period, period_start, period_end, scheduled_at, state, trigger
               FROM scheduler_claims
              WHERE job = ANY($1)
                AND scheduler_claimable(state, lease_until, retry_at, false, false)
              ORDER BY period_start LIMIT $2",
        )
        .bind(jobs)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(Reclaimable {
                    job: row.try_get("job")?,
                    period: Period {
                        label: row.try_get("period")?,
                        start: row.try_get("period_start")?,
                        end: row.try_get("period_end")?,
                    },
                    scheduled_at: row.try_get("scheduled_at")?,
                    trigger: super::taken_as(row.try_get("state")?, row.try_get("trigger")?),
                })
            })
            .collect()
    }

    pub(super) async fn see_jobs(
        &self,
        jobs: &[String],
    ) -> Result<HashMap<String, JobRecord>, sqlx::Error> {
        let rows = sqlx::query(
            "INSERT INTO scheduler_jobs (name, first_seen)
             SELECT name, now() FROM unnest($1::text[]) AS name
             ON CONFLICT (name) DO UPDATE
                 SET first_seen = LEAST(scheduler_jobs.first_seen, excluded.first_seen)
             RETURNING name, first_seen, owed_from, paused, first_seen = now() AS new",
        )
        .bind(jobs)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                let record = JobRecord {
                    first_seen: row.try_get("first_seen")?,
                    owed_from: row.try_get("owed_from")?,
                    paused: row.try_get("paused")?,
                    new: row.try_get("new")?,
                };
                Ok((row.try_get("name")?, record))
            })
            .collect()
    }

    pub(super) async fn adopt(
        &self,
        job: &str,
        periods: &[(Period, DateTime<Utc>)],
        by: &str,
    ) -> Result<Vec<String>, sqlx::Error> {
        let keys: Vec<String> = periods
            .iter()
            .map(|(p, _)| PeriodKey::new(job, &p.label).to_string())
            .collect();
        let labels: Vec<&str> = periods.iter().map(|(p, _)| p.label.as_str()).collect();
        let starts: Vec<DateTime<Utc>> = periods.iter().map(|(p, _)| p.start).collect();
        let ends: Vec<DateTime<Utc>> = periods.iter().map(|(p, _)| p.end).collect();
        let fires: Vec<DateTime<Utc>> = periods.iter().map(|(_, f)| *f).collect();
        let mut tx = self.pool.begin().await?;
        // The job's claim lock, as every claim of it takes: a claim that
        // read no row before this commits waits for it and then finds the
        // period done, rather than take the row at attempt 0 for its own.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('scheduler_claims:' || $1, 0))")
            .bind(job)
            .execute(&mut *tx)
            .await?;
        // Inserted as running and then settled, so that what a success
        // wakes (periods waiting for it) wakes; every row or none.
        let inserted: Vec<String> = sqlx::query_scalar(&format!(
            "INSERT INTO scheduler_claims
                (period_key, job, period, period_start, period_end, scheduled_at, state,
                 attempt, failures, trigger, owner, started_at)
             SELECT k, $6, l, s, e, f, 'running', {ADOPTED_ATTEMPT}, 0, 'adopted', $7, now()
               FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::timestamptz[],
                           $5::timestamptz[]) AS r(k, l, s, e, f)
             ON CONFLICT (period_key) DO NOTHING
             RETURNING period_key"
        ))
        .bind(&keys)
        .bind(&labels)
        .bind(&starts)
        .bind(&ends)
        .bind(&fires)
        .bind(job)
        .bind(by)
        .fetch_all(&mut *tx)
        .await?;
        if inserted.len() < keys.len() {
            let inserted: std::collections::HashSet<String> = inserted.into_iter().collect();
            tx.rollback().await?;
            return Ok(keys.into_iter().filter(|k| !inserted.contains(k)).collect());
        }
        sqlx::query(&format!(
            "INSERT INTO scheduler_attempts
                (period_key, attempt, job, trigger, owner, scheduled_at, started_at,
                 finished_at, outcome, asked, requested_by)
             SELECT period_key, attempt, job, trigger, owner, scheduled_at, started_at,
                    now(), 'succeeded', 'adopt', $2
               FROM scheduler_claims WHERE period_key = ANY($1) AND attempt = {ADOPTED_ATTEMPT}"
        ))
        .bind(&keys)
        .bind(by)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE scheduler_claims SET state = 'succeeded', finished_at = now()
              WHERE period_key = ANY($1)",
        )
        .bind(&keys)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Vec::new())
    }

    pub(super) async fn first_seen(
        &self,
        jobs: &[String],
    ) -> Result<HashMap<String, Sighted>, sqlx::Error> {
        let rows: Vec<(String, DateTime<Utc>, Option<DateTime<Utc>>)> = sqlx::query_as(
            "SELECT name, first_seen, owed_from FROM scheduler_jobs
              WHERE name = ANY($1) AND first_seen < '9999-12-31T00:00:00Z'",
        )
        .bind(jobs)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(name, first_seen, owed_from)| {
                (
                    name,
                    Sighted {
                        first_seen,
                        owed_from,
                    },
                )
            })
            .collect())
    }

    pub(super) async fn note_owed(
        &self,
        job: &str,
        owed_from: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            "UPDATE scheduler_jobs SET owed_from = $2 WHERE name = $1 AND owed_from IS NULL",
        )
        .bind(job)
        .bind(owed_from)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub(super) async fn paused_jobs(&self) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query_scalar("SELECT name FROM scheduler_jobs WHERE paused")
            .fetch_all(&self.pool)
            .await
    }

    pub(super) async fn last_fires(
        &self,
        jobs: &[String],
    ) -> Result<HashMap<String, DateTime<Utc>>, sqlx::Error> {
        let rows: Vec<(String, DateTime<Utc>)> = sqlx::query_as(
            "SELECT job, max(scheduled_at) FROM scheduler_claims
             WHERE job = ANY($1) AND trigger <> 'manual' GROUP BY job",
        )
        .bind(jobs)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().collect())
    }

    pub(super) async fn set_paused(&self, job: &str, paused: bool) -> Result<(), sqlx::Error> {
        sqlx::query(
            // A job only `pause` or `resume` has named is not seen yet: its
            // first sighting (`see_jobs`) sets `first_seen`, so a new job
            // paused before it is deployed still starts at its next fire.
            "INSERT INTO scheduler_jobs (name, first_seen, paused)
             VALUES ($1, '9999-12-31T00:00:00Z', $2)
             ON CONFLICT (name) DO UPDATE SET paused = excluded.paused",
        )
        .bind(job)
        .bind(paused)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The attempts whose `column` (`job` or `period_key`) is `value`.
    pub(super) async fn history(
        &self,
        column: &'static str,
        value: &str,
        limit: u32,
    ) -> Result<Vec<Attempt>, sqlx::Error> {
        let rows = sqlx::query(&format!(
            "SELECT * FROM scheduler_attempts WHERE {column} = $1
              ORDER BY started_at DESC, attempt DESC LIMIT $2"
        ))
        .bind(value)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(Attempt {
                    period_key: row.try_get("period_key")?,
                    attempt: row.try_get("attempt")?,
                    trigger: super::trigger(row.try_get("trigger")?)?,
                    owner: row.try_get("owner")?,
                    scheduled_at: row.try_get("scheduled_at")?,
                    started_at: row.try_get("started_at")?,
                    finished_at: row.try_get("finished_at")?,
                    outcome: super::attempt_outcome(row.try_get("outcome")?)?,
                    exit_code: row.try_get("exit_code")?,
                    http_status: row.try_get("http_status")?,
                    error: row.try_get("error")?,
                    output: row.try_get("output")?,
                    asked: row.try_get("asked")?,
                    requested_by: row.try_get("requested_by")?,
                    definition: row.try_get("definition")?,
                })
            })
            .collect()
    }

    pub(super) async fn recent(&self, job: &str, limit: u32) -> Result<Vec<ClaimRow>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT c.*, scheduler_claimable(c.state, c.lease_until, c.retry_at, false, false) AS claimable,
                    now() AS now
               FROM scheduler_claims c
              WHERE c.period_key IN (
                    (SELECT period_key FROM scheduler_claims WHERE job = $1
                      ORDER BY period_start DESC LIMIT $2)
                    UNION
                    (SELECT period_key FROM scheduler_claims
                      WHERE job = $1 AND state IN ('running', 'released', 'failed')
                      ORDER BY period_start DESC LIMIT $3)
                    UNION
                    (SELECT period_key FROM scheduler_claims
                      WHERE job = $1 AND finished_at IS NOT NULL
                      ORDER BY finished_at DESC LIMIT 1))
              ORDER BY c.period_start DESC",
        )
        .bind(job)
        .bind(i64::from(limit))
        .bind(i64::from(super::UNSETTLED_SHOWN))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(claim_row).collect()
    }

    pub(super) async fn prune(
        &self,
        job: &str,
        keep: Duration,
        window: Duration,
        dry_run: bool,
    ) -> Result<u64, sqlx::Error> {
        // A large delete may outlast the control pool's statement timeout.
        let mut tx = self.actions.begin().await?;
        let pruned: Option<i64> = sqlx::query_scalar(
            "WITH c AS (
                DELETE FROM scheduler_claims
                 WHERE job = $1 AND state IN ('succeeded', 'failed')
                   AND finished_at < now() - $2 * interval '1 millisecond'
                   AND scheduled_at < now() - $3 * interval '1 millisecond'
                   -- A period still waiting may need it, however long it
                   -- waits: a pruned claim reads as a period never run.
                   AND NOT EXISTS (
                       SELECT 1 FROM scheduler_waiting w
                        WHERE w.period_start <= (extract(epoch from scheduler_claims.period_end) * 1000)::bigint
                          AND w.period_end >= (extract(epoch from scheduler_claims.period_start) * 1000)::bigint
                          AND NOT EXISTS (SELECT 1 FROM scheduler_claims o
                                           WHERE o.period_key = w.period_key))
             RETURNING period_key),
             a AS (DELETE FROM scheduler_attempts a USING c WHERE a.period_key = c.period_key),
             -- A waiting row a crash left beside its claim would, the claim
             -- gone, read as a period never run.
             w AS (DELETE FROM scheduler_waiting w USING c WHERE w.period_key = c.period_key)
             SELECT count(*) FROM c",
        )
        .bind(job)
        .bind(millis(keep))
        .bind(millis(window))
        .fetch_one(&mut *tx)
        .await?;
        if dry_run {
            tx.rollback().await?;
        } else {
            tx.commit().await?;
        }
        Ok(pruned.unwrap_or(0) as u64)
    }
}

/// Writes outcomes with [`RECORD`]; the keys of those still at their
/// attempt.
async fn record_many(
    conn: &mut sqlx::PgConnection,
    outcomes: &[(&Lease, Finish)],
) -> Result<std::collections::HashSet<String>, sqlx::Error> {
    let keys: Vec<&str> = outcomes.iter().map(|(l, _)| l.key.as_str()).collect();
    let attempts: Vec<i32> = outcomes.iter().map(|(l, _)| l.attempt).collect();
    let states: Vec<&str> = outcomes
        .iter()
        .map(|(_, f)| if f.succeeded { "succeeded" } else { "failed" })
        .collect();
    let failed: Vec<i32> = outcomes
        .iter()
        .map(|(_, f)| i32::from(!f.succeeded))
        .collect();
    let retry: Vec<Option<i64>> = outcomes
        .iter()
        .map(|(_, f)| f.retry_after.map(millis))
        .collect();
    let exit_codes: Vec<Option<i32>> = outcomes.iter().map(|(_, f)| f.exit_code).collect();
    let statuses: Vec<Option<i32>> = outcomes.iter().map(|(_, f)| f.http_status).collect();
    let errors: Vec<Option<Cow<'_, str>>> = outcomes
        .iter()
        .map(|(_, f)| f.error.as_deref().map(without_nul))
        .collect();
    let output: Vec<Option<Cow<'_, str>>> = outcomes
        .iter()
        .map(|(_, f)| f.output.as_deref().map(without_nul))
        .collect();
    let definitions: Vec<Option<&str>> = outcomes
        .iter()
        .map(|(_, f)| f.definition.as_deref())
        .collect();
    let rows = sqlx::query(RECORD)
        .bind(&keys)
        .bind(&attempts)
        .bind(&states)
        .bind(&failed)
        .bind(&retry)
        .bind(&exit_codes)
        .bind(&statuses)
        .bind(&errors)
        .bind(&output)
        .bind(&definitions)
        .fetch_all(conn)
        .await?;
    rows.iter().map(|row| row.try_get(0)).collect()
}

/// What a cancel of a group needs to know of the pass under way.
#[derive(Clone, Copy)]
struct UnderWay<'u> {
    /// The backend the pass runs on, 0 before it started.
    backend: &'u std::sync::atomic::AtomicI32,
    /// The pass is recording its outcomes: it is let commit.
    committing: &'u std::sync::atomic::AtomicBool,
}

/// Starts a pass of a group in `tx`: notes its backend, and locks the
/// group's claims still at their attempts. Those keys, and what a round
/// trip costs now.
async fn begin_group(
    tx: &mut sqlx::PgConnection,
    runs: &[GroupedSql<'_>],
    backend: &std::sync::atomic::AtomicI32,
) -> Result<(std::collections::HashSet<String>, Duration), sqlx::Error> {
    let sent = std::time::Instant::now();
    // The group's own statements take generic plans (see `lock_group`);
    // the session's own plan cache mode comes back for the actions'
    // statements. It is read in the subquery, whose row the outer target
    // list (and so `set_config`) is computed from.
    let (pid, plan_mode, _): (i32, String, String) = sqlx::query_as(
        "SELECT s.pid, s.mode, set_config('plan_cache_mode', 'force_generic_plan', true)
           FROM (SELECT pg_backend_pid() AS pid,
                        current_setting('plan_cache_mode') AS mode OFFSET 0) AS s",
    )
    .fetch_one(&mut *tx)
    .await?;
    // What a round trip costs now. A statement is judged quick or slow by
    // its time beyond that, so a busy machine, which slows every round trip
    // alike, does not make quick jobs look slow (and run alone, which loads
    // the machine further).
    let round_trip = sent.elapsed();
    backend.store(pid, std::sync::atomic::Ordering::SeqCst);
    let ours = lock_group(tx, runs, &plan_mode).await?;
    Ok((ours, round_trip))
}

/// The backend a group's pass runs on, once it started one.
fn running_backend(backend: &std::sync::atomic::AtomicI32) -> Option<i32> {
    Some(backend.load(std::sync::atomic::Ordering::SeqCst)).filter(|pid| *pid != 0)
}

/// Takes a key share lock on every claim of the group still at its
/// attempt, in one statement: held until the commit, so no takeover can
/// change an attempt meanwhile, while renewals (no key update) pass. The
/// keys it holds.
///
/// Planned generic, as the group's outcomes are: the planner prices a
/// custom plan of a one-key array below the generic one and would plan
/// these statements again for every group (about a third of the server's CPU
/// in a burst of single-period groups), while the generic plan, index look-ups
/// per key, is the one it makes anyway. Each row found sets the session's
/// `plan_mode` back for the statements of the actions; with no row found,
/// none of them runs.
async fn lock_group(
    tx: &mut sqlx::PgConnection,
    runs: &[GroupedSql<'_>],
    plan_mode: &str,
) -> Result<std::collections::HashSet<String>, sqlx::Error> {
    let keys: Vec<&str> = runs.iter().map(|r| r.lease.key.as_str()).collect();
    let attempts: Vec<i32> = runs.iter().map(|r| r.lease.attempt).collect();
    let ours: Vec<(String, String)> = sqlx::query_as(
        "SELECT c.period_key, set_config('plan_cache_mode', $3, true)
           FROM scheduler_claims c
           JOIN unnest($1::text[], $2::int[]) AS h(key, attempt)
             ON c.period_key = h.key AND c.attempt = h.attempt
          WHERE c.state IN ('running', 'released')
          ORDER BY c.job COLLATE \"C\", c.period_key COLLATE \"C\"
            FOR KEY SHARE OF c",
    )
    .bind(&keys)
    .bind(&attempts)
    .bind(plan_mode)
    .fetch_all(tx)
    .await?;
    Ok(ours.into_iter().map(|(key, _)| key).collect())
}

/// A group's transaction on PostgreSQL: an action's `timeout` is the
/// transaction's `statement_timeout` while it runs.
struct PgGroupTx<'c> {
    conn: &'c mut sqlx::PgConnection,
    /// The `statement_timeout` set; the actions pool's connections start
    /// without one.
    timeout: Option<Duration>,
    limits: &'c SqlLimits,
}

impl GroupTx for PgGroupTx<'_> {
    async fn bound(&mut self, timeout: Option<Duration>) -> Result<Option<Duration>, sqlx::Error> {
        if timeout != self.timeout {
            self.timeout = timeout;
            // A number this code computed, never text from a user.
            sqlx::query(&format!(
                "SET LOCAL statement_timeout = {}",
                timeout.map_or(0, |t| millis(t).max(1))
            ))
            .execute(&mut *self.conn)
            .await?;
        }
        Ok(timeout)
    }

    fn unbound(&mut self) {}

    async fn execute(&mut self, sql: &'static str) -> Result<(), sqlx::Error> {
        sqlx::Executor::execute(&mut *self.conn, sql)
            .await
            .map(|_| ())
    }

    async fn statement(
        &mut self,
        run: &GroupedSql<'_>,
        statement: &str,
        params: &[Param],
    ) -> Result<(), Refused> {
        let mut query = sqlx::query(statement);
        for param in params {
            query = match param {
                Param::Text(text) => query.bind(text.clone()),
                Param::Instant(at) => query.bind(*at),
            };
        }
        match query.execute(&mut *self.conn).await {
            Ok(_) => Ok(()),
            Err(_) if *self.limits.cancel.borrow() => Err(Refused::Stopped),
            Err(e) => Err(Refused::Failed(run.error(&e))),
        }
    }

    fn transaction(&mut self) -> Transaction<'_> {
        Transaction::postgres_of(self.conn)
    }

    fn timed_out(&self) -> String {
        let limit = self.timeout.unwrap_or_default();
        format!("timed out after {}", humantime::format_duration(limit))
    }

    fn expired(&self) -> bool {
        false
    }
}
