//! The scheduler's migrations, kept in a table of its own,
//! `scheduler_migrations`, so that an application's sqlx migrations (in
//! `_sqlx_migrations`, numbered as it likes) share the database whichever
//! side migrates first.
//!
//! The build lists the files (`migrations/{sqlite,postgres}`, see
//! `build.rs`) and the crate embeds them; each one's checksum is SHA-384 of
//! its text, as sqlx records it. Applying them is here rather than sqlx's
//! migrator's, which keeps its table's name to itself and, embedded by
//! `sqlx::migrate!`, would compile sqlx's drivers (and SQLite's C source) a
//! second time, for the macro, in every application's release build.
//!
//! All pending migrations go in one transaction that other migrating
//! processes wait for: PostgreSQL's advisory lock, SQLite's `BEGIN
//! IMMEDIATE`. A database migrated by an earlier release
//! (the scheduler's rows in `_sqlx_migrations`) moves over in that same
//! transaction.

use sha2::{Digest, Sha384};

/// One migration the crate embeds.
pub(super) struct Migration {
    /// The number its file name starts with.
    pub version: i64,
    /// The rest of its file name, in words (`claims in batches`).
    pub description: String,
    /// Its statements.
    pub sql: &'static str,
    /// SHA-384 of `sql`, as sqlx recorded it for the release before.
    pub checksum: Vec<u8>,
}

/// The migrations of a build's list (`(version, file name, text)`, in
/// version order).
pub(super) fn embedded(list: &[(i64, &str, &'static str)]) -> Vec<Migration> {
    list.iter()
        .map(|(version, file, sql)| Migration {
            version: *version,
            description: file
                .trim_end_matches(".sql")
                .split_once('_')
                .map_or("", |(_, rest)| rest)
                .replace('_', " "),
            sql,
            checksum: Sha384::digest(sql.as_bytes()).to_vec(),
        })
        .collect()
}

/// Why migrating stopped.
#[derive(Debug)]
pub(super) enum MigrateError {
    /// The database holds a migration this scheduler does not know: a
    /// newer scheduler migrated it.
    VersionMissing(i64),
    /// A migration the database holds differs from this scheduler's own.
    VersionMismatch(i64),
    /// A migration is missing below the newest one applied: its record
    /// was deleted.
    Gap(i64, i64),
    /// A migration's statements failed.
    ExecuteMigration(sqlx::Error, i64),
    /// The database failed around them.
    Execute(sqlx::Error),
    /// The scheduler's tables are there (in this schema), but no record of
    /// their migrations is where this connection looks: migrated again,
    /// they would be a second, empty set beside them, or fail.
    Unrecorded(String),
    /// The scheduler's tables are in this schema, and this connection
    /// creates in another (the first of its `search_path`).
    Elsewhere(String),
}

impl From<sqlx::Error> for MigrateError {
    fn from(e: sqlx::Error) -> MigrateError {
        MigrateError::Execute(e)
    }
}

/// The SQL that differs between the backends in [`migrate_in`].
pub(super) struct Dialect {
    /// Whether `scheduler_migrations` is here.
    pub has_table: &'static str,
    /// Waits for any other process migrating, if `BEGIN` does not.
    pub lock: Option<&'static str>,
    /// Creates `scheduler_migrations` if it is missing.
    pub table: &'static str,
    /// Whether `_sqlx_migrations` is here, where an earlier release kept
    /// the scheduler's migrations.
    pub has_sqlx_table: &'static str,
    /// Where `scheduler_claims` is, if it is: its schema, and whether new
    /// tables go there too.
    pub claims_at: &'static str,
}

/// Where the scheduler's migrations stand: what the database holds, as
/// `(version, checksum)`, against what this scheduler has.
pub(super) struct Ledger<'a> {
    pub ours: &'a [Migration],
    pub applied: Vec<(i64, Vec<u8>)>,
}

impl Ledger<'_> {
    /// Refuses a database a newer scheduler migrated (a version this one
    /// does not know), whose migration differs from this one's, or that
    /// misses one below the newest it holds (applied now, it would run
    /// out of order).
    pub fn check(&self) -> Result<(), MigrateError> {
        for (version, checksum) in &self.applied {
            match self.ours.iter().find(|m| m.version == *version) {
                None => return Err(MigrateError::VersionMissing(*version)),
                Some(ours) if ours.checksum != *checksum => {
                    return Err(MigrateError::VersionMismatch(*version));
                }
                Some(_) => {}
            }
        }
        let newest = self.applied.iter().map(|(v, _)| *v).max();
        match (self.pending().next(), newest) {
            (Some(gap), Some(newest)) if gap.version < newest => {
                Err(MigrateError::Gap(gap.version, newest))
            }
            _ => Ok(()),
        }
    }

    /// What is left to do, for a database this scheduler may run on
    /// without migrating: `None` when nothing is.
    pub fn to_do(&self) -> Option<String> {
        match self.pending().count() {
            0 => None,
            n => Some(format!("{n} migration(s) to apply")),
        }
    }

    /// This scheduler's migrations the database does not hold, oldest
    /// first.
    pub fn pending(&self) -> impl Iterator<Item = &Migration> {
        self.ours
            .iter()
            .filter(|m| !self.applied.iter().any(|(v, _)| *v == m.version))
    }

    /// Among the rows of `_sqlx_migrations` an earlier release left (some
    /// are this scheduler's), one of this scheduler's versions whose
    /// checksum differs: an edited migration, refused rather than taken
    /// for the application's.
    pub fn edited_in(&self, rows: &[(i64, Vec<u8>)]) -> Option<i64> {
        rows.iter()
            .find(|(version, checksum)| {
                self.ours
                    .iter()
                    .any(|m| m.version == *version && m.checksum != *checksum)
            })
            .map(|(version, _)| *version)
    }

    /// The rows of `_sqlx_migrations` that are this scheduler's (its
    /// version and checksum): an earlier release's, to move over. Any other
    /// row is the application's, and stays.
    pub fn moving_over<'r>(&self, rows: &'r [(i64, Vec<u8>)]) -> Vec<&'r (i64, Vec<u8>)> {
        rows.iter()
            .filter(|(version, checksum)| {
                self.ours
                    .iter()
                    .any(|m| m.version == *version && m.checksum == *checksum)
            })
            .collect()
    }
}

/// Where the database's migrations stand, read with no lock and no DDL (a
/// role that may only read, a writer holding SQLite's lock): `None` when
/// this scheduler may run on it as it is, else what is left to do.
macro_rules! standing_in {
    ($pool:expr, $migrations:expr, $dialect:expr) => {{
        use $crate::store::migrate::Ledger;
        let has_table: bool = sqlx::query_scalar($dialect.has_table)
            .fetch_one($pool)
            .await?;
        if has_table {
            let applied: Vec<(i64, Vec<u8>)> =
                sqlx::query_as("SELECT version, checksum FROM scheduler_migrations")
                    .fetch_all($pool)
                    .await?;
            let ledger = Ledger {
                ours: $migrations,
                applied,
            };
            ledger.check()?;
            Ok::<Option<String>, $crate::store::migrate::MigrateError>(ledger.to_do())
        } else {
            Ok(Some(
                "no record of the scheduler's migrations: a new database, or one an earlier release recorded in _sqlx_migrations".into(),
            ))
        }
    }};
}

pub(super) use standing_in;

/// `version description`, as `scheduler migrate` lists what it applied.
pub(super) fn named(migration: &Migration) -> String {
    format!("{:04} {}", migration.version, migration.description)
}

/// Applies the pending migrations of `$migrations` in transaction `$tx`
/// (begun by the caller) with the backend's `$dialect` and clock `$now`,
/// and commits; what it applied, named.
macro_rules! migrate_in {
    ($tx:expr, $migrations:expr, $dialect:expr, $now:expr) => {{
        use $crate::store::migrate::{Ledger, named};
        let mut tx = $tx;
        let dialect = $dialect;
        if let Some(lock) = dialect.lock {
            sqlx::query(lock).execute(&mut *tx).await?;
        }
        // Tables the connection sees in another schema than the one it
        // creates in: a record made here would split them.
        let claims_at: Option<(String, bool)> = sqlx::query_as(dialect.claims_at)
            .fetch_optional(&mut *tx)
            .await?;
        if let Some((schema, false)) = &claims_at {
            return Err($crate::store::migrate::MigrateError::Elsewhere(schema.clone()));
        }
        sqlx::raw_sql(dialect.table).execute(&mut *tx).await?;
        let applied: Vec<(i64, Vec<u8>)> =
            sqlx::query_as("SELECT version, checksum FROM scheduler_migrations")
                .fetch_all(&mut *tx)
                .await?;
        let mut ledger = Ledger {
            ours: $migrations,
            applied,
        };
        let has_sqlx_table: bool = sqlx::query_scalar(dialect.has_sqlx_table)
            .fetch_one(&mut *tx)
            .await?;
        if has_sqlx_table {
            // Read in a savepoint: a `_sqlx_migrations` not of sqlx's shape
            // is another program's, and holds nothing of the scheduler's.
            let mut read = sqlx::Connection::begin(&mut *tx).await?;
            let rows: Vec<(i64, Vec<u8>)> =
                match sqlx::query_as("SELECT version, checksum FROM _sqlx_migrations WHERE success")
                    .fetch_all(&mut *read)
                    .await
                {
                    Ok(rows) => {
                        read.commit().await?;
                        rows
                    }
                    Err(_) => {
                        read.rollback().await?;
                        Vec::new()
                    }
                };
            let moving = ledger.moving_over(&rows);
            if let Some(edited) = ledger.edited_in(&rows).filter(|_| !moving.is_empty()) {
                return Err($crate::store::migrate::MigrateError::VersionMismatch(edited));
            }
            if !moving.is_empty() {
                tracing::info!(
                    migrations = moving.len(),
                    "moving the scheduler's migrations from _sqlx_migrations, where an earlier release kept them, to scheduler_migrations"
                );
            }
            for (version, checksum) in moving {
                let description = ledger
                    .ours
                    .iter()
                    .find(|m| m.version == *version)
                    .map(|m| m.description.clone())
                    .unwrap_or_default();
                sqlx::query(&format!(
                    "INSERT INTO scheduler_migrations (version, description, checksum, applied_at)
                     VALUES ($1, $2, $3, {}) ON CONFLICT (version) DO NOTHING",
                    $now
                ))
                .bind(version)
                .bind(description)
                .bind(checksum)
                .execute(&mut *tx)
                .await?;
                sqlx::query("DELETE FROM _sqlx_migrations WHERE version = $1")
                    .bind(version)
                    .execute(&mut *tx)
                    .await?;
                if !ledger.applied.iter().any(|(v, _)| v == version) {
                    ledger.applied.push((*version, checksum.clone()));
                }
            }
        }
        ledger.check()?;
        if let (Some((schema, _)), true) = (&claims_at, ledger.applied.is_empty()) {
            return Err($crate::store::migrate::MigrateError::Unrecorded(schema.clone()));
        }
        let mut done = Vec::new();
        for migration in ledger.pending() {
            sqlx::raw_sql(migration.sql)
                .execute(&mut *tx)
                .await
                .map_err(|e| {
                    $crate::store::migrate::MigrateError::ExecuteMigration(e, migration.version)
                })?;
            sqlx::query(&format!(
                "INSERT INTO scheduler_migrations (version, description, checksum, applied_at)
                 VALUES ($1, $2, $3, {})",
                $now
            ))
            .bind(migration.version)
            .bind(&migration.description)
            .bind(&migration.checksum)
            .execute(&mut *tx)
            .await?;
            done.push(named(migration));
        }
        tx.commit().await?;
        Ok::<Vec<String>, $crate::store::migrate::MigrateError>(done)
    }};
}

pub(super) use migrate_in;
