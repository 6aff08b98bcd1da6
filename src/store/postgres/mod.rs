//! The PostgreSQL backend: the claim is one call of `scheduler_claim` (see
//! the migration), every other write one statement, so a run costs two round
//! trips and two commits besides heartbeats.
//!
//! Its statements, by what they touch: the claims (`claims`), the jobs
//! (`jobs`), the attempts kept (`history`) and a group of `sql` actions
//! (`group`).

use std::borrow::Cow;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool, PgPoolOptions, PgRow};
use sqlx::{Connection, Row};

use super::{ClaimRow, claim_state};

mod claims;
mod group;
mod history;
mod jobs;

/// The scheduler's migrations, which [`super::migrate`] applies.
fn migrations() -> Vec<super::migrate::Migration> {
    super::migrate::embedded(include!(concat!(
        env!("OUT_DIR"),
        "/postgres_migrations.rs"
    )))
}

/// How the migrations are recorded and locked on PostgreSQL.
fn dialect() -> super::migrate::Dialect {
    super::migrate::Dialect {
        has_table: "SELECT to_regclass('scheduler_migrations') IS NOT NULL",
        // One key for the scheduler's migrations in this database; sqlx's
        // own lock (the application's migrations) is another.
        lock: Some("SELECT pg_advisory_xact_lock(7296351420113578001)"),
        table: "CREATE TABLE IF NOT EXISTS scheduler_migrations (
                    version BIGINT PRIMARY KEY,
                    description TEXT NOT NULL,
                    checksum BYTEA NOT NULL,
                    applied_at BIGINT NOT NULL)",
        has_sqlx_table: "SELECT to_regclass('_sqlx_migrations') IS NOT NULL",
        claims_at: "SELECT n.nspname::text, n.nspname = current_schema()
                      FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
                     WHERE c.oid = to_regclass('scheduler_claims')",
    }
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
    statistics: std::sync::Arc<super::statistics::Statistics>,
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

impl PgStore {
    /// On an application's pool: one pool for everything.
    pub(super) fn from_pool(pool: PgPool) -> PgStore {
        PgStore {
            actions: pool.clone(),
            pool,
            outage: Default::default(),
            statistics: Default::default(),
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
            statistics: Default::default(),
        })
    }

    /// Counts `rows` written; when they call for it, refreshes the
    /// statistics in a task of its own, never in front of the writer.
    pub(super) fn wrote(&self, rows: u64) {
        if self.statistics.wrote(rows) {
            let store = self.clone();
            tokio::spawn(async move { store.analyze().await });
        }
    }

    /// [`PgStore::wrote`] for a writer that ends with its write (a
    /// prune): the refresh is made before it returns.
    pub(super) async fn wrote_last(&self, rows: u64) {
        if self.statistics.wrote(rows) {
            self.analyze().await;
        }
    }

    /// `ANALYZE` of the tables a claim and a prune write, skipping one
    /// another session is analysing (another replica's refresh, or
    /// autovacuum's); a role that does not own them is warned by the
    /// server and changes nothing.
    async fn analyze(&self) {
        let started = std::time::Instant::now();
        let refreshed = async {
            sqlx::query(
                "ANALYZE (SKIP_LOCKED) scheduler_claims, scheduler_attempts, scheduler_output",
            )
            .execute(&self.pool)
            .await?;
            sqlx::query_scalar::<_, f32>(
                "SELECT reltuples FROM pg_class WHERE oid = 'scheduler_claims'::regclass",
            )
            .fetch_one(&self.pool)
            .await
        }
        .await;
        match refreshed {
            Ok(rows) => {
                let rows = rows.max(0.0) as u64;
                let ms = started.elapsed().as_millis() as u64;
                tracing::debug!(rows, ms, "statistics of the scheduler's tables refreshed");
                self.statistics.refreshed(Some(rows));
            }
            Err(e) => {
                tracing::warn!("cannot refresh the statistics of the scheduler's tables: {e}");
                self.statistics.refreshed(None);
            }
        }
    }

    pub(super) async fn has_schema(&self) -> Result<bool, sqlx::Error> {
        sqlx::query_scalar("SELECT to_regclass('scheduler_claims') IS NOT NULL")
            .fetch_one(&self.pool)
            .await
    }

    /// What is left to migrate, read with no lock and no DDL; `None`:
    /// nothing.
    pub(super) async fn standing(&self) -> Result<Option<String>, super::migrate::MigrateError> {
        super::migrate::standing_in!(&self.pool, &migrations(), dialect())
    }

    /// Applies what is pending; the migrations it applied. A database
    /// with nothing to apply is only read.
    pub(super) async fn migrate(&self) -> Result<Vec<String>, super::migrate::MigrateError> {
        if self.standing().await?.is_none() {
            return Ok(Vec::new());
        }
        let tx = self.pool.begin().await?;
        super::migrate::migrate_in!(tx, &migrations(), dialect(), super::PG_NOW)
    }
}
