//! A group of `sql` actions on PostgreSQL: its passes in one transaction,
//! the claims key-share locked, a statement cancelled through its backend.

use std::time::Duration;

use super::claims::record_many;
use super::{PgStore, millis};
use crate::handler::Transaction;
use crate::store::group::{GroupTx, Pass, PassOver, Refused, run_pass};
use crate::store::{GroupedEnd, GroupedSql, Param, SqlLimits};

impl PgStore {
    pub(in crate::store) async fn run_sql_group(
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
                    let (mut ends, outcomes) = crate::store::group::alone(runs, i, end);
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
            let outcomes = crate::store::group::group_outcomes(runs, &ends);
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
