//! The SQLite backend: one writer connection per process, WAL, and short
//! `BEGIN IMMEDIATE` transactions so several processes can share one file.
//! Times are milliseconds since the epoch on SQLite's clock.
//!
//! Its statements, by what they touch: the claims (`claims`), the jobs
//! (`jobs`), the attempts kept (`history`) and a group of `sql` actions
//! (`group`).

use std::str::FromStr;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Row, Sqlite, Transaction};

use super::{ClaimRow, claim_state};

mod claims;
mod group;
mod history;
mod jobs;

/// The scheduler's migrations, which [`super::migrate`] applies.
fn migrations() -> Vec<super::migrate::Migration> {
    super::migrate::embedded(include!(concat!(env!("OUT_DIR"), "/sqlite_migrations.rs")))
}

/// How the migrations are recorded on SQLite; `BEGIN IMMEDIATE` makes
/// every other migrating process wait.
fn dialect() -> super::migrate::Dialect {
    super::migrate::Dialect {
        has_table: "SELECT count(*) > 0 FROM sqlite_master
                     WHERE type = 'table' AND name = 'scheduler_migrations'",
        lock: None,
        table: "CREATE TABLE IF NOT EXISTS scheduler_migrations (
                    version INTEGER PRIMARY KEY,
                    description TEXT NOT NULL,
                    checksum BLOB NOT NULL,
                    applied_at INTEGER NOT NULL)",
        has_sqlx_table: "SELECT count(*) > 0 FROM sqlite_master
                          WHERE type = 'table' AND name = '_sqlx_migrations'",
        claims_at: "SELECT 'main', TRUE FROM sqlite_master
                     WHERE type = 'table' AND name = 'scheduler_claims'",
    }
}

/// Whether `e` is SQLite saying another connection holds the lock.
fn locked(e: &sqlx::Error) -> bool {
    matches!(e, sqlx::Error::Database(e) if e.message().contains("locked"))
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
                Err(e) if tries < 20 && locked(&e) => {
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

    /// Applies what is pending; the migrations it applied.
    /// What is left to migrate, read with no lock and no DDL (a reader
    /// never waits for SQLite's writer); `None`: nothing.
    pub(super) async fn standing(&self) -> Result<Option<String>, super::migrate::MigrateError> {
        super::migrate::standing_in!(&self.pool, &migrations(), dialect())
    }

    /// Applies what is pending; the migrations it applied. A database
    /// with nothing to apply is only read.
    pub(super) async fn migrate(&self) -> Result<Vec<String>, super::migrate::MigrateError> {
        if self.standing().await?.is_none() {
            return Ok(Vec::new());
        }
        // Processes starting together on a new file race to begin (a
        // pool of the application's may wait less than ours); the loser
        // finds the work done on a later try. The waits are random, so two
        // racers fall out of step.
        let mut tries = 0;
        loop {
            match self.migrate_once().await {
                Err(super::migrate::MigrateError::Execute(e)) if tries < 30 && locked(&e) => {
                    tries += 1;
                    let jitter = getrandom::u32().unwrap_or(0) % 100;
                    tokio::time::sleep(Duration::from_millis(20 + u64::from(jitter))).await;
                }
                done => return done,
            }
        }
    }

    async fn migrate_once(&self) -> Result<Vec<String>, super::migrate::MigrateError> {
        let tx = self.begin().await?;
        super::migrate::migrate_in!(tx, &migrations(), dialect(), NOW)
    }

    async fn begin(&self) -> Result<Transaction<'static, Sqlite>, sqlx::Error> {
        self.pool.begin_with("BEGIN IMMEDIATE").await
    }
}
