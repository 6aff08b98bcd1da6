//! The SQLite backend: one writer connection per process, WAL, and short
//! `BEGIN IMMEDIATE` transactions so several processes can share one file.
//! Times are milliseconds since the epoch on SQLite's clock.

use std::collections::HashMap;
use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use sqlx::{Row, Sqlite, Transaction};

use super::group::{GroupTx, Pass, PassOver, Refused, run_pass};
use super::{
    ADOPTED_ATTEMPT, Attempt, Claim, ClaimRequest, ClaimRow, Finish, GroupedEnd, GroupedSql,
    JobRecord, Lease, Param, Reclaimable, Released, Sighted, SqlLimits, claim_state,
};
use crate::handler;
use crate::period::{Period, PeriodKey};

/// The scheduler's migrations, beside whatever else `_sqlx_migrations`
/// holds (see [`super::SCHEDULER_VERSIONS`]).
fn migrator() -> sqlx::migrate::Migrator {
    let mut migrator = sqlx::migrate!("migrations/sqlite");
    migrator.set_ignore_missing(true);
    migrator
}

/// SQLite's clock in milliseconds.
pub(super) const NOW: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// The `first_seen` of a job that only `pause` or `resume` has named (no
/// scheduler has seen it): 9999-12-31, replaced by the first sighting.
const NOT_SEEN: &str = "253402214400000";

/// A handle on one SQLite file.
#[derive(Debug, Clone)]
pub struct SqliteStore {
    pub(super) pool: SqlitePool,
    pub(super) outage: std::sync::Arc<super::outage::Outage>,
}

fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

fn opt_time(row: &SqliteRow, column: &str) -> Result<Option<DateTime<Utc>>, sqlx::Error> {
    Ok(row.try_get::<Option<i64>, _>(column)?.map(time))
}

fn claim_row(row: &SqliteRow) -> Result<ClaimRow, sqlx::Error> {
    Ok(ClaimRow {
        period_key: row.try_get("period_key")?,
        period: row.try_get("period")?,
        state: claim_state(row.try_get("state")?)?,
        attempt: row.try_get("attempt")?,
        failures: row.try_get("failures")?,
        owner: row.try_get("owner")?,
        lease_until: opt_time(row, "lease_until")?,
        started_at: opt_time(row, "started_at")?,
        retry_at: opt_time(row, "retry_at")?,
        finished_at: opt_time(row, "finished_at")?,
        // The rule is SQL: NULL (a comparison with a missing time) is no.
        claimable: row
            .try_get::<Option<bool>, _>("claimable")?
            .unwrap_or(false),
        now: time(row.try_get("now")?),
    })
}

impl SqliteStore {
    pub(super) async fn connect(url: &str) -> Result<SqliteStore, sqlx::Error> {
        let options = SqliteConnectOptions::from_str(url)?
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // FULL: an acknowledged claim survives a power cut; a lost one
            // would be a double run.
            .synchronous(SqliteSynchronous::Full)
            // Writers from other processes take turns; a wait can approach
            // the whole timeout under contention, so it is generous.
            .busy_timeout(Duration::from_secs(30));
        // Processes opening a new file together race to switch it to WAL,
        // which SQLite answers with "database is locked" rather than a wait.
        let mut tries = 0;
        let pool = loop {
            let pool = SqlitePoolOptions::new()
                .max_connections(1)
                // A broken connection fails its query and is replaced; a ping
                // before every use would cost a round trip per statement.
                .test_before_acquire(false)
                .acquire_timeout(Duration::from_secs(60))
                .connect_with(options.clone())
                .await;
            match pool {
                Err(sqlx::Error::Database(e)) if tries < 20 && e.message().contains("locked") => {
                    tries += 1;
                    tokio::time::sleep(Duration::from_millis(25 * tries)).await;
                }
                other => break other?,
            }
        };
        Ok(SqliteStore {
            pool,
            outage: Default::default(),
        })
    }

    pub(super) async fn has_schema(&self) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar(
            "SELECT count(*) > 0 FROM sqlite_master WHERE type = 'table' AND name = 'scheduler_claims'",
        )
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
        // Processes starting together on a new file race to migrate (SQLite
        // has no migration lock); the loser finds the work done on a later
        // try. The waits are random, so two racers fall out of step.
        let mut tries = 0;
        loop {
            match migrator.run(&self.pool).await {
                Err(e)
                    if tries < 30
                        && !matches!(e, sqlx::migrate::MigrateError::VersionMissing(_)) =>
                {
                    tries += 1;
                    let jitter = getrandom::u32().unwrap_or(0) % 100;
                    tokio::time::sleep(Duration::from_millis(20 + u64::from(jitter))).await;
                }
                Ok(()) => return Ok(super::applied_since(migrator, &before)),
                Err(e) => return Err(e),
            }
        }
    }

    async fn begin(&self) -> Result<Transaction<'static, Sqlite>, sqlx::Error> {
        self.pool.begin_with("BEGIN IMMEDIATE").await
    }

    /// `_wait`: claims take turns through the write lock, whatever it says.
    /// `hold`: an expired lease is answered as held, not taken over
    /// ([`super::outage`]).
    pub(super) async fn claim_many(
        &self,
        requests: &[ClaimRequest<'_>],
        _wait: bool,
        hold: bool,
    ) -> Result<Vec<Claim>, sqlx::Error> {
        // One write transaction, so one commit for the whole batch; inside
        // it each key is the one-key claim statement, which sees what the
        // batch claimed before it.
        let mut tx = self.begin().await?;
        let mut claims = Vec::with_capacity(requests.len());
        for r in requests {
            claims.push(claim(&mut tx, r, hold).await?);
        }
        // How manual runs were asked for, on the attempts won, in the same
        // commit and one statement; (key, attempt, how, by) travel as one
        // JSON array.
        let asked: Vec<(&str, i32, &str, &str)> = requests
            .iter()
            .zip(&claims)
            .filter_map(|(r, claim)| match (r.asked, claim) {
                (Some(asked), Claim::Won(lease)) => {
                    Some((lease.key.as_str(), lease.attempt, asked.how, asked.by))
                }
                _ => None,
            })
            .collect();
        if !asked.is_empty() {
            sqlx::query(
                "UPDATE scheduler_attempts SET asked = h.value ->> 2, requested_by = h.value ->> 3
                   FROM json_each(?1) AS h
                  WHERE period_key = h.value ->> 0 AND attempt = h.value ->> 1",
            )
            .bind(serde_json::to_string(&asked).unwrap_or_else(|_| "[]".into()))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(claims)
    }

    pub(super) async fn renew(
        &self,
        leases: &[&Lease],
        lease: Duration,
    ) -> Result<Vec<bool>, sqlx::Error> {
        let mut tx = self.begin().await?;
        let mut renewed = Vec::with_capacity(leases.len());
        for l in leases {
            let done = sqlx::query(&format!(
                "UPDATE scheduler_claims SET lease_until = {NOW} + ?3
                  WHERE period_key = ?1 AND attempt = ?2 AND state = 'running'"
            ))
            .bind(l.key.as_str())
            .bind(l.attempt)
            .bind(lease.as_millis() as i64)
            .execute(&mut *tx)
            .await?;
            renewed.push(done.rows_affected() == 1);
        }
        tx.commit().await?;
        Ok(renewed)
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

    pub(super) async fn release(
        &self,
        lease: &Lease,
        output: Option<&str>,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.begin().await?;
        let done = sqlx::query(&format!(
            "UPDATE scheduler_claims SET state = 'released', lease_until = NULL, finished_at = {NOW}
              WHERE period_key = ?1 AND attempt = ?2 AND state = 'running'"
        ))
        .bind(lease.key.as_str())
        .bind(lease.attempt)
        .execute(&mut *tx)
        .await?;
        let released = done.rows_affected() == 1;
        if released {
            mark_attempt(&mut tx, lease.key.as_str(), lease.attempt, "released").await?;
            keep_output(&mut tx, lease, output).await?;
        }
        tx.commit().await?;
        Ok(released)
    }

    pub(super) async fn confirm_stopped(
        &self,
        lease: &Lease,
        output: Option<&str>,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.begin().await?;
        let done = sqlx::query(
            "UPDATE scheduler_claims SET lease_until = NULL
              WHERE period_key = ?1 AND attempt = ?2 AND state = 'released'",
        )
        .bind(lease.key.as_str())
        .bind(lease.attempt)
        .execute(&mut *tx)
        .await?;
        let confirmed = done.rows_affected() == 1;
        if confirmed {
            keep_output(&mut tx, lease, output).await?;
        }
        tx.commit().await?;
        Ok(confirmed)
    }

    pub(super) async fn release_key(&self, key: &str) -> Result<Option<Released>, sqlx::Error> {
        let mut tx = self.begin().await?;
        let row = sqlx::query(&format!(
            "UPDATE scheduler_claims SET state = 'released', finished_at = {NOW}
              WHERE period_key = ?1 AND state = 'running' RETURNING owner, attempt, lease_until"
        ))
        .bind(key)
        .fetch_optional(&mut *tx)
        .await?;
        let released = match row {
            Some(row) => {
                mark_attempt(&mut tx, key, row.try_get("attempt")?, "released").await?;
                Some(Released {
                    owner: row.try_get("owner")?,
                    lease_until: opt_time(&row, "lease_until")?,
                })
            }
            None => None,
        };
        tx.commit().await?;
        Ok(released)
    }

    pub(super) async fn rows(&self, keys: &[String]) -> Result<Vec<ClaimRow>, sqlx::Error> {
        // One statement for many keys: the keys travel as one JSON array.
        let keys = serde_json::to_string(keys).unwrap_or_else(|_| "[]".into());
        let rows = sqlx::query(&format!(
            "SELECT c.*, {} AS claimable, {NOW} AS now FROM scheduler_claims c
              WHERE c.period_key IN (SELECT value FROM json_each(?1))",
            claimable("0", "0", "0")
        ))
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
        let jobs = serde_json::to_string(jobs).unwrap_or_else(|_| "[]".into());
        let rows = sqlx::query(&format!(
            "SELECT job, period, period_start, period_end, scheduled_at, state, trigger
               FROM scheduler_claims
              WHERE job IN (SELECT value FROM json_each(?1)) AND {}
              ORDER BY period_start LIMIT ?2",
            claimable("0", "0", "0")
        ))
        .bind(jobs)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(Reclaimable {
                    job: row.try_get("job")?,
                    period: Period {
                        label: row.try_get("period")?,
                        start: time(row.try_get("period_start")?),
                        end: time(row.try_get("period_end")?),
                    },
                    scheduled_at: time(row.try_get("scheduled_at")?),
                    trigger: super::taken_as(row.try_get("state")?, row.try_get("trigger")?),
                })
            })
            .collect()
    }

    pub(super) async fn see_jobs(
        &self,
        jobs: &[String],
    ) -> Result<HashMap<String, JobRecord>, sqlx::Error> {
        let names = serde_json::to_string(jobs).unwrap_or_else(|_| "[]".into());
        let mut tx = self.begin().await?;
        // One instant for every row, read once: a row that holds it after
        // the statement was seen for the first time by it.
        let now: i64 = sqlx::query_scalar(&format!("SELECT {NOW}"))
            .fetch_one(&mut *tx)
            .await?;
        let rows = sqlx::query(
            "INSERT INTO scheduler_jobs (name, first_seen)
             SELECT value, ?2 FROM json_each(?1) WHERE true
             ON CONFLICT (name) DO UPDATE
                 SET first_seen = min(scheduler_jobs.first_seen, excluded.first_seen)
             RETURNING name, first_seen, owed_from, paused",
        )
        .bind(names)
        .bind(now)
        .fetch_all(&mut *tx)
        .await?;
        tx.commit().await?;
        rows.iter()
            .map(|row| {
                let first_seen: i64 = row.try_get("first_seen")?;
                let record = JobRecord {
                    first_seen: time(first_seen),
                    owed_from: opt_time(row, "owed_from")?,
                    paused: row.try_get("paused")?,
                    new: first_seen == now,
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
        let rows: Vec<serde_json::Value> = periods
            .iter()
            .map(|(period, fire)| {
                serde_json::json!([
                    PeriodKey::new(job, &period.label).to_string(),
                    period.label,
                    ms(period.start),
                    ms(period.end),
                    ms(*fire)
                ])
            })
            .collect();
        let rows = serde_json::Value::from(rows).to_string();
        let mut tx = self.begin().await?;
        let taken: Vec<String> = sqlx::query_scalar(
            "SELECT c.period_key FROM json_each(?1) AS r
               JOIN scheduler_claims AS c ON c.period_key = r.value ->> 0",
        )
        .bind(&rows)
        .fetch_all(&mut *tx)
        .await?;
        if !taken.is_empty() {
            return Ok(taken);
        }
        // The trigger `scheduler_claims_attempt_new` writes the attempt row;
        // recording its outcome settles the claim, as every outcome does.
        sqlx::query(&format!(
            "INSERT INTO scheduler_claims
                (period_key, job, period, period_start, period_end, scheduled_at, state,
                 attempt, failures, trigger, owner, lease_until, started_at)
             SELECT r.value ->> 0, ?2, r.value ->> 1, r.value ->> 2, r.value ->> 3,
                    r.value ->> 4, 'running', {ADOPTED_ATTEMPT}, 0, 'adopted', ?3, {NOW}, {NOW}
               FROM json_each(?1) AS r"
        ))
        .bind(&rows)
        .bind(job)
        .bind(by)
        .execute(&mut *tx)
        .await?;
        sqlx::query(&format!(
            "UPDATE scheduler_attempts
                SET outcome = 'succeeded', finished_at = {NOW}, asked = 'adopt', requested_by = ?2
              WHERE attempt = {ADOPTED_ATTEMPT}
                AND period_key IN (SELECT value ->> 0 FROM json_each(?1))"
        ))
        .bind(&rows)
        .bind(by)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Vec::new())
    }

    pub(super) async fn first_seen(
        &self,
        jobs: &[String],
    ) -> Result<HashMap<String, Sighted>, sqlx::Error> {
        let names = serde_json::to_string(jobs).unwrap_or_else(|_| "[]".into());
        let rows: Vec<(String, i64, Option<i64>)> = sqlx::query_as(&format!(
            "SELECT name, first_seen, owed_from FROM scheduler_jobs
              WHERE name IN (SELECT value FROM json_each(?1)) AND first_seen < {NOT_SEEN}"
        ))
        .bind(names)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(name, at, owed)| {
                let seen = Sighted {
                    first_seen: time(at),
                    owed_from: owed.map(time),
                };
                (name, seen)
            })
            .collect())
    }

    pub(super) async fn note_owed(
        &self,
        job: &str,
        owed_from: DateTime<Utc>,
    ) -> Result<(), sqlx::Error> {
        let mut tx = self.begin().await?;
        sqlx::query(
            "UPDATE scheduler_jobs SET owed_from = ?2 WHERE name = ?1 AND owed_from IS NULL",
        )
        .bind(job)
        .bind(ms(owed_from))
        .execute(&mut *tx)
        .await?;
        tx.commit().await
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
        let names = serde_json::to_string(jobs).unwrap_or_else(|_| "[]".into());
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT job, max(scheduled_at) FROM scheduler_claims
              WHERE job IN (SELECT value FROM json_each(?1)) AND trigger <> 'manual'
              GROUP BY job",
        )
        .bind(names)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|(job, at)| (job, time(at))).collect())
    }

    pub(super) async fn set_paused(&self, job: &str, paused: bool) -> Result<(), sqlx::Error> {
        sqlx::query(&format!(
            "INSERT INTO scheduler_jobs (name, first_seen, paused) VALUES (?1, {NOT_SEEN}, ?2)
             ON CONFLICT (name) DO UPDATE SET paused = excluded.paused"
        ))
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
            "SELECT * FROM scheduler_attempts WHERE {column} = ?1
              ORDER BY started_at DESC, attempt DESC LIMIT ?2"
        ))
        .bind(value)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(Attempt {
                    period_key: row.try_get("period_key")?,
                    attempt: row.try_get("attempt")?,
                    trigger: super::trigger(row.try_get("trigger")?)?,
                    owner: row.try_get("owner")?,
                    scheduled_at: opt_time(row, "scheduled_at")?,
                    started_at: time(row.try_get("started_at")?),
                    finished_at: opt_time(row, "finished_at")?,
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
        let rows = sqlx::query(&format!(
            "SELECT c.*, {} AS claimable, {NOW} AS now FROM scheduler_claims c
              WHERE c.period_key IN (
                    SELECT period_key FROM (SELECT period_key FROM scheduler_claims WHERE job = ?1
                                             ORDER BY period_start DESC LIMIT ?2)
                    UNION
                    SELECT period_key FROM (SELECT period_key FROM scheduler_claims
                                             WHERE job = ?1 AND state IN ('running', 'released', 'failed')
                                             ORDER BY period_start DESC LIMIT ?3)
                    UNION
                    SELECT period_key FROM (SELECT period_key FROM scheduler_claims
                                             WHERE job = ?1 AND finished_at IS NOT NULL
                                             ORDER BY finished_at DESC LIMIT 1))
              ORDER BY c.period_start DESC",
            claimable("0", "0", "0")
        ))
        .bind(job)
        .bind(limit)
        .bind(super::UNSETTLED_SHOWN)
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
        let mut tx = self.begin().await?;
        // One cutoff for both statements: SQLite's clock moves between
        // them, and claims deleted without their attempts would leave rows
        // that block the period's next claim.
        let now: i64 = sqlx::query_scalar(&format!("SELECT {NOW}"))
            .fetch_one(&mut *tx)
            .await?;
        let finished_before = now.saturating_sub(keep.as_millis() as i64);
        let fired_before = now.saturating_sub(window.as_millis() as i64);
        // A period still waiting may need one, however long it waits: a
        // pruned claim reads as a period never run.
        let doomed = "SELECT period_key FROM scheduler_claims c
                       WHERE job = ?1 AND state IN ('succeeded', 'failed')
                         AND finished_at < ?2 AND scheduled_at < ?3
                         AND NOT EXISTS (
                             SELECT 1 FROM scheduler_waiting w
                              WHERE w.period_start <= c.period_end
                                AND w.period_end >= c.period_start
                                AND NOT EXISTS (SELECT 1 FROM scheduler_claims o
                                                 WHERE o.period_key = w.period_key))";
        // A waiting row a crash left beside its claim would, the claim
        // gone, read as a period never run.
        for table in ["scheduler_attempts", "scheduler_waiting"] {
            sqlx::query(&format!(
                "DELETE FROM {table} WHERE period_key IN ({doomed})"
            ))
            .bind(job)
            .bind(finished_before)
            .bind(fired_before)
            .execute(&mut *tx)
            .await?;
        }
        let done = sqlx::query(&format!(
            "DELETE FROM scheduler_claims WHERE period_key IN ({doomed})"
        ))
        .bind(job)
        .bind(finished_before)
        .bind(fired_before)
        .execute(&mut *tx)
        .await?;
        if dry_run {
            tx.rollback().await?;
        } else {
            tx.commit().await?;
        }
        Ok(done.rows_affected())
    }
}

/// Which claims can be taken again: SQLite's claim rule, read from
/// `schema/sqlite/claimable.sql` (beside PostgreSQL's), with `manual`,
/// `force` and `hold` (SQL: a parameter or a literal) and the clock put in.
fn claimable(manual: &str, force: &str, hold: &str) -> String {
    static RULE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        include_str!("../../schema/sqlite/claimable.sql")
            .lines()
            .filter(|line| !line.starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n")
            .replace(":now", NOW)
    });
    RULE.replace(":manual", manual)
        .replace(":force", force)
        .replace(":hold", hold)
}

/// The claim of one key, inside a write transaction. The attempt row is
/// written by the trigger `scheduler_claims_attempt_*`. The concurrency
/// count gates the row the upsert inserts: with no free slot there is no
/// row, so no insert and no takeover either. The counts name their partial
/// indexes: without statistics SQLite would count the released claims
/// through the job's index, every claim of the job, which grows with
/// history.
async fn claim(
    tx: &mut Transaction<'static, Sqlite>,
    r: &ClaimRequest<'_>,
    hold: bool,
) -> Result<Claim, sqlx::Error> {
    static CLAIM: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "INSERT INTO scheduler_claims
                (period_key, job, period, period_start, period_end, scheduled_at, state, attempt,
                 failures, trigger, owner, lease_until, started_at)
             SELECT ?1, ?2, ?3, ?4, ?5, ?12, 'running', 1, 0, ?6, ?7, {NOW} + ?8, {NOW}
              WHERE (SELECT count(*) FROM scheduler_claims INDEXED BY scheduler_claims_running
                      WHERE job = ?2 AND state = 'running' AND lease_until >= {NOW}
                        AND period_key <> ?1)
                  + (SELECT count(*) FROM scheduler_claims INDEXED BY scheduler_claims_released
                      WHERE job = ?2 AND state = 'released' AND lease_until >= {NOW}
                        AND period_key <> ?1) < ?11
             ON CONFLICT (period_key) DO UPDATE SET
                state = 'running',
                attempt = scheduler_claims.attempt + 1,
                trigger = CASE
                    WHEN ?9 THEN ?6
                    WHEN scheduler_claims.state IN ('running', 'released') THEN 'recovery'
                    WHEN scheduler_claims.state = 'failed' THEN 'retry'
                    ELSE ?6 END,
                owner = excluded.owner,
                lease_until = excluded.lease_until,
                retry_at = NULL,
                started_at = excluded.started_at,
                finished_at = NULL
             WHERE {}
             RETURNING attempt, failures, trigger",
            claimable("?9", "?10", "?13")
        )
    });
    static CURRENT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        format!(
            "SELECT *, {} AS claimable, {NOW} AS now FROM scheduler_claims WHERE period_key = ?1",
            claimable("?2", "?3", "?4")
        )
    });
    let key = r.key();
    let won = sqlx::query(&CLAIM)
        .bind(key.as_str())
        .bind(r.job)
        .bind(&r.period.label)
        .bind(ms(r.period.start))
        .bind(ms(r.period.end))
        .bind(r.trigger.as_str())
        .bind(r.owner)
        .bind(r.lease.as_millis() as i64)
        .bind(r.manual)
        .bind(r.force)
        .bind(r.concurrency)
        .bind(ms(r.scheduled_at))
        .bind(hold)
        .fetch_optional(&mut **tx)
        .await?;
    if let Some(row) = won {
        return Ok(Claim::Won(Lease {
            key,
            attempt: row.try_get("attempt")?,
            failures: row.try_get("failures")?,
            trigger: super::trigger(row.try_get("trigger")?)?,
            granted: r.lease,
        }));
    }
    let row = sqlx::query(&CURRENT)
        .bind(key.as_str())
        .bind(r.manual)
        .bind(r.force)
        .bind(hold)
        .fetch_optional(&mut **tx)
        .await?;
    Ok(match row {
        Some(row) => claim_row(&row)?.as_claim(),
        None => Claim::Busy,
    })
}

/// Writes outcomes in one statement, each only if its claim is still at
/// that attempt (running, or released by `scheduler release` and not
/// claimed since); the trigger `scheduler_attempts_outcome` settles each
/// claim in the same statement. How many were written.
async fn record_many(
    conn: &mut sqlx::SqliteConnection,
    outcomes: &[(&Lease, Finish)],
) -> Result<std::collections::HashSet<String>, sqlx::Error> {
    if outcomes.is_empty() {
        return Ok(std::collections::HashSet::new());
    }
    let rows: Vec<serde_json::Value> = outcomes
        .iter()
        .map(|(lease, f)| {
            serde_json::json!([
                lease.key.as_str(),
                lease.attempt,
                if f.succeeded { "succeeded" } else { "failed" },
                f.exit_code,
                f.http_status,
                f.error,
                f.output,
                f.retry_after.map(|d| d.as_millis() as i64),
                f.definition,
            ])
        })
        .collect();
    let rows = serde_json::Value::Array(rows).to_string();
    let done = sqlx::query(&format!(
        "UPDATE scheduler_attempts
            SET outcome = h.outcome, finished_at = {NOW}, exit_code = h.exit_code,
                http_status = h.http_status, error = h.error, output = h.output,
                retry_after = h.retry_after, definition = h.definition
           FROM (SELECT json_extract(value, '$[0]') AS key, json_extract(value, '$[1]') AS attempt,
                        json_extract(value, '$[2]') AS outcome, json_extract(value, '$[3]') AS exit_code,
                        json_extract(value, '$[4]') AS http_status, json_extract(value, '$[5]') AS error,
                        json_extract(value, '$[6]') AS output, json_extract(value, '$[7]') AS retry_after,
                        json_extract(value, '$[8]') AS definition
                   FROM json_each(?1)) AS h
          WHERE scheduler_attempts.period_key = h.key AND scheduler_attempts.attempt = h.attempt
            AND scheduler_attempts.outcome IN ('running', 'released')
            AND EXISTS (SELECT 1 FROM scheduler_claims c
                         WHERE c.period_key = h.key AND c.attempt = h.attempt
                           AND c.state IN ('running', 'released'))
         RETURNING scheduler_attempts.period_key"
    ))
    .bind(rows)
    .fetch_all(conn)
    .await?;
    done.iter().map(|row| row.try_get(0)).collect()
}

/// Keeps the output tail of a job stopped by a release or a shutdown with
/// its attempt.
async fn keep_output(
    tx: &mut Transaction<'static, Sqlite>,
    lease: &Lease,
    output: Option<&str>,
) -> Result<(), sqlx::Error> {
    if let Some(output) = output {
        sqlx::query(
            "UPDATE scheduler_attempts SET output = ?3 WHERE period_key = ?1 AND attempt = ?2",
        )
        .bind(lease.key.as_str())
        .bind(lease.attempt)
        .bind(output)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

async fn mark_attempt(
    tx: &mut Transaction<'static, Sqlite>,
    key: &str,
    attempt: i32,
    outcome: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "UPDATE scheduler_attempts SET outcome = ?3, finished_at = {NOW}
          WHERE period_key = ?1 AND attempt = ?2"
    ))
    .bind(key)
    .bind(attempt)
    .bind(outcome)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The keys of `runs` whose claims are still at their attempts, in one
/// statement.
async fn owned(
    tx: &mut sqlx::SqliteConnection,
    runs: &[GroupedSql<'_>],
) -> Result<std::collections::HashSet<String>, sqlx::Error> {
    let pairs: Vec<(&str, i32)> = runs
        .iter()
        .map(|r| (r.lease.key.as_str(), r.lease.attempt))
        .collect();
    let pairs = serde_json::to_string(&pairs).unwrap_or_else(|_| "[]".into());
    let keys: Vec<String> = sqlx::query_scalar(
        "SELECT c.period_key FROM scheduler_claims c
           JOIN json_each(?1) AS h
             ON c.period_key = json_extract(h.value, '$[0]')
            AND c.attempt = json_extract(h.value, '$[1]')
          WHERE c.state IN ('running', 'released')",
    )
    .bind(pairs)
    .fetch_all(tx)
    .await?;
    Ok(keys.into_iter().collect())
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
                let (mut ends, outcomes) = super::group::alone(runs, i, end);
                recording();
                if record_many(conn, &outcomes).await?.is_empty() {
                    ends[i] = GroupedEnd::Moved;
                }
                return Ok(Some(ends));
            }
        }
        let outcomes = super::group_outcomes(runs, &ends);
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
