//! A group of `sql` actions on SQLite: its passes in the one writer's
//! transaction, each statement stopped at its deadline.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use super::SqliteStore;
use super::claims::{owned, record_many};
use crate::handler;
use crate::store::group::{GroupTx, Pass, PassOver, Refused, run_pass};
use crate::store::{GroupedEnd, GroupedSql, Param, SqlLimits};

impl SqliteStore {
    pub(in crate::store) async fn run_sql_group(
        &self,
        runs: &[GroupedSql<'_>],
        limits: &SqlLimits,
        recording: &(dyn Fn() + Sync),
    ) -> Result<Option<Vec<GroupedEnd>>, sqlx::Error> {
        // The group holds SQLite's one writer, which every claim and
        // heartbeat of every process waits for: no statement runs past the
        // writer bound, and none starts once the group has run its budget.
        let started = std::time::Instant::now();
        let mut conn = self.pool.acquire().await?;
        let (deadline, expired) = stop_at_deadline(&mut conn, started, limits).await?;
        let conn: &mut sqlx::SqliteConnection = &mut conn;
        let stops = Stops {
            started,
            deadline: &deadline,
            expired: &expired,
        };
        let result = group_passes(conn, runs, limits, recording, stops).await;
        if result.is_err() {
            // Whatever failed, the connection goes back without a transaction.
            let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
        }
        conn.lock_handle().await?.remove_progress_handler();
        result
    }
}

/// How SQLite stops a group's action at its deadline.
#[derive(Clone, Copy)]
struct Stops<'s> {
    /// From when the deadline counts.
    started: std::time::Instant,
    /// The running action's deadline, in microseconds after `started`; 0
    /// while the group's own statements run.
    deadline: &'s std::sync::atomic::AtomicU64,
    /// Set by the progress handler when it stopped an action at its
    /// deadline.
    expired: &'s AtomicBool,
}

/// The passes of a group until one commits (or it is stopped). The
/// transaction is driven by statements, not sqlx's transaction type: an
/// interrupted write makes SQLite roll the whole transaction back by
/// itself, which that type would not know.
async fn group_passes(
    conn: &mut sqlx::SqliteConnection,
    runs: &[GroupedSql<'_>],
    limits: &SqlLimits,
    recording: &(dyn Fn() + Sync),
    stops: Stops<'_>,
) -> Result<Option<Vec<GroupedEnd>>, sqlx::Error> {
    // A failing statement found by a pass: the group runs again,
    // with a savepoint per statement (the first pass has none: one
    // statement per period).
    let mut failed: Vec<Option<String>> = vec![None; runs.len()];
    let mut careful = false;
    loop {
        sqlx::query("BEGIN IMMEDIATE").execute(&mut *conn).await?;
        let ours = owned(conn, runs).await?;
        let pass = PassOver {
            runs,
            ours: &ours,
            failed: &failed,
            careful,
            limits,
            started: stops.started,
            round_trip: Duration::ZERO,
        };
        let mut group = SqliteGroupTx {
            conn: &mut *conn,
            stops,
            limits,
            bound: limits.writer_timeout,
        };
        let mut ends = Vec::with_capacity(runs.len());
        match run_pass(&mut group, pass, &mut ends).await? {
            Pass::Done => {}
            Pass::Stopped => {
                let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
                return Ok(None);
            }
            // Without a savepoint, or SQLite ended the transaction
            // itself: the pass is lost; the next one has
            // savepoints and skips this statement.
            Pass::FailedAt(i, error) => {
                let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
                failed[i] = Some(error);
                careful = true;
                continue;
            }
            // A code job runs alone in its group: only its own end
            // is at stake, written outside the lost transaction.
            Pass::Ended(i, end) => {
                let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
                let (mut ends, outcomes) = crate::store::group::alone(runs, i, end);
                recording();
                if record_many(conn, &outcomes).await?.is_empty() {
                    ends[i] = GroupedEnd::Moved;
                }
                return Ok(Some(ends));
            }
        }
        let outcomes = crate::store::group::group_outcomes(runs, &ends);
        recording();
        if record_many(conn, &outcomes).await?.len() != outcomes.len() {
            let _ = sqlx::query("ROLLBACK").execute(&mut *conn).await;
            // Cannot happen while this group holds the writer; if it
            // did, no statement may commit without its outcome.
            return Err(sqlx::Error::Protocol(
                "a claim moved on inside its sql group".into(),
            ));
        }
        sqlx::query("COMMIT").execute(&mut *conn).await?;
        return Ok(Some(ends));
    }
}

/// Makes SQLite stop the running statement at its deadline (in
/// microseconds after `started`, 0 for none) or at the cancel of
/// `limits`: the deadline, and the flag that says a statement was stopped
/// at it.
async fn stop_at_deadline(
    conn: &mut sqlx::SqliteConnection,
    started: std::time::Instant,
    limits: &SqlLimits,
) -> Result<(Arc<std::sync::atomic::AtomicU64>, Arc<AtomicBool>), sqlx::Error> {
    let cancel = limits.cancel.subscribe();
    let deadline = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let expired = Arc::new(AtomicBool::new(false));
    let (until, flag) = (deadline.clone(), expired.clone());
    conn.lock_handle()
        .await?
        .set_progress_handler(1000, move || {
            let at = until.load(Ordering::SeqCst);
            let over = at != 0 && std::time::Instant::now() >= started + Duration::from_micros(at);
            flag.store(over, Ordering::SeqCst);
            !(over || *cancel.borrow())
        });
    Ok((deadline, expired))
}

/// A group's transaction on SQLite: the group holds the database's one
/// writer, so no action runs past the writer bound (or its `timeout`, if
/// shorter), stopped by the progress handler at its deadline.
struct SqliteGroupTx<'c> {
    conn: &'c mut sqlx::SqliteConnection,
    stops: Stops<'c>,
    limits: &'c SqlLimits,
    /// The running action's bound.
    bound: Duration,
}

impl GroupTx for SqliteGroupTx<'_> {
    async fn bound(&mut self, timeout: Option<Duration>) -> Result<Option<Duration>, sqlx::Error> {
        let writer = self.limits.writer_timeout;
        self.bound = timeout.map_or(writer, |t| t.min(writer));
        let at = std::time::Instant::now() + self.bound;
        let micros = at.duration_since(self.stops.started).as_micros().max(1);
        self.stops
            .deadline
            .store(u64::try_from(micros).unwrap_or(u64::MAX), Ordering::SeqCst);
        Ok(Some(self.bound))
    }

    fn unbound(&mut self) {
        self.stops.deadline.store(0, Ordering::SeqCst);
    }

    async fn execute(&mut self, sql: &'static str) -> Result<(), sqlx::Error> {
        for statement in sql.split("; ") {
            sqlx::query(statement).execute(&mut *self.conn).await?;
        }
        Ok(())
    }

    async fn statement(
        &mut self,
        run: &GroupedSql<'_>,
        statement: &str,
        params: &[Param],
    ) -> Result<(), Refused> {
        let mut query = sqlx::query(statement);
        for param in params {
            query = query.bind(param.text());
        }
        match query.execute(&mut *self.conn).await {
            Ok(_) => Ok(()),
            Err(_) if *self.limits.cancel.borrow() => Err(Refused::Stopped),
            Err(_) if self.expired() => Err(Refused::Failed(self.timed_out())),
            Err(e) => Err(Refused::Failed(run.error(&e))),
        }
    }

    fn transaction(&mut self) -> handler::Transaction<'_> {
        handler::Transaction::sqlite_of(self.conn)
    }

    fn timed_out(&self) -> String {
        format!(
            "timed out after {} (on SQLite an sql action holds the database's one writer at most lease/3, or its `timeout` if shorter)",
            humantime::format_duration(self.bound)
        )
    }

    fn expired(&self) -> bool {
        self.stops.expired.load(Ordering::SeqCst)
    }
}
