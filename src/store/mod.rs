//! The claim store: one interface, one module per backend, all SQL inside.
//!
//! A claim is decided by the period key's primary key in one atomic step;
//! every later write names the attempt it belongs to and changes nothing once
//! the claim has moved on (the attempt number is the fencing token). Lease
//! expiry is measured on the database's clock.

/// PostgreSQL's clock, in milliseconds since the epoch.
#[cfg(feature = "postgres")]
pub(crate) const PG_NOW: &str = "(extract(epoch from clock_timestamp()) * 1000)::bigint";

/// Runs `$body` with `$pool` bound to the backend's pool and `$now` to its
/// clock expression, within [`STATEMENT_BOUND`].
macro_rules! on_pool {
    ($store:expr, |$pool:ident, $now:ident| $body:expr) => {{
        let work = async {
            match $store {
                #[cfg(feature = "sqlite")]
                Store::Sqlite(s) => {
                    let ($pool, $now) = (&s.pool, $crate::store::sqlite::NOW);
                    $body
                }
                #[cfg(feature = "postgres")]
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

/// Calls the same method on whichever backend this is.
macro_rules! dispatch {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        match $self {
            #[cfg(feature = "sqlite")]
            $crate::store::Store::Sqlite(s) => s.$method($($arg),*).await,
            #[cfg(feature = "postgres")]
            $crate::store::Store::Postgres(s) => s.$method($($arg),*).await,
        }
    };
}

/// [`dispatch!`] within [`STATEMENT_BOUND`], errors mapped.
macro_rules! bounded {
    ($self:ident . $method:ident ( $($arg:expr),* )) => {
        match tokio::time::timeout($crate::store::STATEMENT_BOUND, async { dispatch!($self.$method($($arg),*)) }).await {
            Ok(result) => result.map_err($crate::store::query_error),
            Err(_) => Err($crate::error::Error::Database(format!(
                "database error: no answer within {}s",
                $crate::store::STATEMENT_BOUND.as_secs()
            ))),
        }
    };
}

/// Reads a row of either backend into the struct `$ty`, each field from
/// the column of its name: what sqlx's `FromRow` derive writes, without
/// its proc macro (which compiles sqlx's drivers, SQLite's C source among
/// them, a second time in every release build). A field `: word` is a
/// stored word read back (its `TryFrom<String>`); `: default`, a column
/// some statements leave out.
macro_rules! from_row {
    ($ty:ident { $($field:ident $(: $how:ident)?),* $(,)? }) => {
        #[cfg(feature = "sqlite")]
        from_row!(@impl sqlx::sqlite::SqliteRow, $ty { $($field $(: $how)?),* });
        #[cfg(feature = "postgres")]
        from_row!(@impl sqlx::postgres::PgRow, $ty { $($field $(: $how)?),* });
    };
    (@impl $row:ty, $ty:ident { $($field:ident $(: $how:ident)?),* }) => {
        impl<'r> sqlx::FromRow<'r, $row> for $ty {
            fn from_row(row: &'r $row) -> Result<Self, sqlx::Error> {
                use sqlx::Row;
                Ok($ty { $($field: from_row!(@get row, $field $(, $how)?),)* })
            }
        }
    };
    (@get $row:ident, $field:ident) => {
        $row.try_get(stringify!($field))?
    };
    (@get $row:ident, $field:ident, word) => {{
        let word: String = $row.try_get(stringify!($field))?;
        word.try_into().map_err(|e: String| sqlx::Error::ColumnDecode {
            index: stringify!($field).into(),
            source: e.into(),
        })?
    }};
    (@get $row:ident, $field:ident, default) => {
        match $row.try_get(stringify!($field)) {
            Err(sqlx::Error::ColumnNotFound(_)) => Default::default(),
            other => other?,
        }
    };
}

mod api;
mod claims;
mod group;
mod history;
mod jobs;
mod migrate;
mod notify;
mod outage;
mod output;
#[cfg(feature = "postgres")]
mod postgres;
#[cfg(feature = "sqlite")]
mod sqlite;
#[cfg(feature = "postgres")]
mod statistics;
mod waiting;

pub use api::{ApiRun, KeyClaim, KeyRecord};
pub use claims::{
    ADOPTED_ATTEMPT, Asked, Claim, ClaimRequest, ClaimRow, Finish, Lease, Reclaimable, Released,
};
pub use group::{GROUP_BUDGET, GroupedEnd, GroupedSql, Param, SqlLimits, Work};
pub use history::Attempt;
pub use jobs::{JobRecord, Owes, Sighted};
pub use notify::{Delivery, FailedForGood, NewNotification, Notification, Tried};
pub use output::Chunk;
pub use waiting::Waiting;

/// A duration in milliseconds, as the API's and the notifications' tables
/// keep times.
fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 4)
}

use std::time::Duration;

pub use crate::config::DatabaseUrl;
#[cfg(feature = "postgres")]
use crate::config::address::{mask_password_in, mask_url};
use crate::error::Error;
pub use crate::state::{
    ApiRunState, AttemptOutcome, ClaimState, DeliveryState, KeyState, PeriodState, Trigger,
};

/// The database, SQLite or PostgreSQL.
#[derive(Debug, Clone)]
pub enum Store {
    /// An embedded SQLite file.
    #[cfg(feature = "sqlite")]
    Sqlite(sqlite::SqliteStore),
    /// A PostgreSQL server.
    #[cfg(feature = "postgres")]
    Postgres(postgres::PgStore),
}

/// How long the scheduler's own statements may take before they count as
/// failed: a stalled connection (the server alive, the path to it not)
/// would otherwise hold a claim, a scan or a release forever.
pub const STATEMENT_BOUND: Duration = Duration::from_secs(10);

/// How many claims (with their attempts and output) one transaction of a
/// prune deletes: what another process's claim may wait for at most.
pub(crate) const PRUNE_BATCH: u32 = 1_000;

/// How many running, released or failed periods of one job `status` shows
/// at most, besides the newest ones.
pub const UNSETTLED_SHOWN: u32 = 100;

impl Store {
    /// Opens the database at `url` (`sqlite://FILE` or `postgres://…`, a
    /// relative path taken from the working directory), creating a missing
    /// SQLite file.
    pub async fn connect(url: &str) -> Result<Store, Error> {
        let cwd = std::env::current_dir().map_err(|e| Error::Environment(e.into()))?;
        let url = DatabaseUrl::parse(url, &cwd)
            .map_err(|e| Error::Usage(format!("database URL: {e}")))?;
        Store::open(&url, true).await
    }

    /// Opens the database at `url`. A missing SQLite file is created (owner
    /// read and write only: it holds output tails) when `create`, else
    /// reported, so a command run from the wrong directory does not read an
    /// empty new database as "never ran".
    pub async fn open(url: &DatabaseUrl, create: bool) -> Result<Store, Error> {
        #[cfg(not(feature = "sqlite"))]
        let _ = create;
        let driver_url = url.driver_url();
        let store = match url {
            #[cfg(feature = "sqlite")]
            DatabaseUrl::Sqlite { path, .. } => {
                prepare_sqlite_file(path, create)?;
                Store::Sqlite(
                    sqlite::SqliteStore::connect(&driver_url)
                        .await
                        .map_err(|e| sqlite_error(path, e))?,
                )
            }
            #[cfg(feature = "postgres")]
            DatabaseUrl::Postgres(_) => Store::Postgres(
                postgres::PgStore::connect(&driver_url)
                    .await
                    .map_err(|e| db_error(&driver_url, "connect to", e))?,
            ),
            #[allow(unreachable_patterns)]
            other => return Err(not_built(other)),
        };
        Ok(store)
    }

    /// The scheduler on an application's PostgreSQL pool: its statements
    /// and its `sql` and transaction-scoped jobs use the pool's
    /// connections as they are (each of the scheduler's statements is still
    /// bounded by [`STATEMENT_BOUND`]).
    #[cfg(feature = "postgres")]
    pub fn from_postgres_pool(pool: sqlx::PgPool) -> Store {
        Store::Postgres(postgres::PgStore::from_pool(pool))
    }

    /// The scheduler on an application's SQLite pool, whose options are
    /// the application's (WAL and `synchronous = FULL` keep an
    /// acknowledged claim through a power cut).
    #[cfg(feature = "sqlite")]
    pub fn from_sqlite_pool(pool: sqlx::SqlitePool) -> Store {
        Store::Sqlite(sqlite::SqliteStore {
            pool,
            outage: Default::default(),
        })
    }

    /// Applies pending migrations, returning which (`0004 api`);
    /// refuses a database migrated by a newer version. They are kept in
    /// `scheduler_migrations` ([`migrate`]), so an application's own sqlx
    /// migrations in the same database are left to it.
    pub async fn migrate(&self) -> Result<Vec<String>, Error> {
        // Another process migrating holds the migration lock meanwhile; a
        // lock never given back (a connection that kept it) is no hang.
        const MIGRATION_BOUND: Duration = Duration::from_secs(120);
        let Ok(result) =
            tokio::time::timeout(MIGRATION_BOUND, async { dispatch!(self.migrate()) }).await
        else {
            return Err(Error::Database(format!(
                "cannot migrate the database: not done within {}s (another process holds the lock of the scheduler's migrations?)",
                MIGRATION_BOUND.as_secs()
            )));
        };
        result.map_err(refused)
    }

    /// What is left to migrate before this scheduler may run on the
    /// database, read with no lock and no DDL (a role that may only read
    /// suffices); `None`: nothing. A database migrated by a newer or an
    /// edited scheduler is refused as [`Store::migrate`] refuses it.
    pub async fn needs_migrating(&self) -> Result<Option<String>, Error> {
        match tokio::time::timeout(STATEMENT_BOUND, async { dispatch!(self.standing()) }).await {
            Ok(result) => result.map_err(refused),
            Err(_) => Err(Error::Database(format!(
                "database error: no answer within {}s",
                STATEMENT_BOUND.as_secs()
            ))),
        }
    }

    /// Whether the scheduler's tables are here at all (a database that
    /// nothing has run against has none).
    pub async fn has_schema(&self) -> Result<bool, Error> {
        bounded!(self.has_schema())
    }

    /// How long this process's claims still leave expired leases to their
    /// runners, if they do: for a heartbeat interval (`lease`/3) of the
    /// database's answers after the process started, for a whole `lease`
    /// after it saw the database fail (the runner may still be writing its
    /// outcome). Such a claim is answered [`Claim::Expired`].
    pub fn holding(&self, lease: Duration) -> Option<Duration> {
        self.outage().holding(lease)
    }

    /// Whether this is PostgreSQL.
    pub fn is_postgres(&self) -> bool {
        match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => false,
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => true,
        }
    }

    /// What this process saw of its database lately ([`outage`]).
    fn outage(&self) -> &outage::Outage {
        match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(s) => &s.outage,
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => &s.outage,
        }
    }

    /// Counts `rows` of the claims table this process wrote (claimed new,
    /// or pruned); on PostgreSQL, once they are a large share of it, the
    /// tables' statistics are refreshed beside the caller ([`statistics`]).
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    fn wrote(&self, rows: u64) {
        match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => {}
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => s.wrote(rows),
        }
    }

    /// [`Store::wrote`] by a writer that ends with its write (a prune,
    /// run as a command): the refresh is made before it returns.
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    async fn wrote_last(&self, rows: u64) {
        match self {
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => {}
            #[cfg(feature = "postgres")]
            Store::Postgres(s) => s.wrote_last(rows).await,
        }
    }

    /// `result`, noted as a sign of the database being away or back: the
    /// claims, renewals, outcomes and scans every running process sends.
    fn seen<T>(&self, result: Result<T, Error>) -> Result<T, Error> {
        self.outage().note(&result);
        result
    }
}

#[cfg(feature = "postgres")]
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
/// Why the scheduler's migrations could not be applied, or read.
fn refused(e: migrate::MigrateError) -> Error {
    match e {
        migrate::MigrateError::VersionMissing(version) => Error::Database(format!(
            "the database was migrated by a newer version of scheduler (migration {version} in scheduler_migrations is unknown to this one), or that table was edited; upgrade scheduler or point it at another database"
        )),
        migrate::MigrateError::VersionMismatch(version) => Error::Database(format!(
            "migration {version} recorded in the database differs from this scheduler's own: the database was migrated by a build whose migrations were edited, or its record was"
        )),
        migrate::MigrateError::Gap(missing, newest) => Error::Database(format!(
            "migration {missing} is missing from scheduler_migrations below migration {newest}: its record was deleted; applied now it would run out of order over a newer schema, so restore the row (or the database)"
        )),
        migrate::MigrateError::ExecuteMigration(e, version) => Error::Database(format!(
            "cannot migrate the database: migration {version} failed: {e}"
        )),
        migrate::MigrateError::Execute(e) => Error::Database(format!(
            "cannot migrate the database (the scheduler's tables, or their record scheduler_migrations): {e}"
        )),
        migrate::MigrateError::Unrecorded(schema) => Error::Database(format!(
            "the scheduler's tables are in schema `{schema}`, but no record of their migrations (scheduler_migrations, or an earlier release's rows in _sqlx_migrations) is where this connection looks: migrated again they would be a second, empty set, and every period could run again; nothing was changed. Connect with `{schema}` first on the search_path (`?options=-csearch_path%3D{schema}`), where the record is"
        )),
        migrate::MigrateError::Elsewhere(schema) => Error::Database(format!(
            "the scheduler's tables are in schema `{schema}`, but this connection creates tables in another one (the first of its search_path): a migration would split them; nothing was changed. Put `{schema}` first on the search_path (`?options=-csearch_path%3D{schema}`)"
        )),
    }
}

/// A database this build has no driver for (its feature is off).
#[allow(dead_code)]
fn not_built(url: &DatabaseUrl) -> Error {
    let feature = match url {
        DatabaseUrl::Sqlite { .. } => "sqlite",
        DatabaseUrl::Postgres(_) => "postgres",
    };
    Error::Usage(format!(
        "database URL: {url}: this build of scheduler has no {feature} driver (its `{feature}` feature is off)"
    ))
}

#[cfg(feature = "sqlite")]
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
#[cfg(feature = "sqlite")]
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
