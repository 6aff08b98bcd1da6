//! A plain tokio program with one period-keyed job: every second, each
//! period writes a row in the transaction that records it done, so the
//! `ticks` table holds each period once, however many copies of this
//! program run against the database, and whatever kills them.
//!
//! ```sh
//! cargo run --example plain_tokio                      # sqlite://ticks.db
//! DATABASE_URL=postgres://postgres@127.0.0.1/test cargo run --example plain_tokio
//! ```
//!
//! Ctrl-C or SIGTERM stops it: no new claims, the running period gets the
//! grace, then it is released for another copy.

use std::str::FromStr;
use std::sync::Arc;

use scheduler::{CodeJob, Context, Handled, Scheduler, Transaction};

const CREATE: &str = "CREATE TABLE IF NOT EXISTS ticks (period_key TEXT NOT NULL, attempt INTEGER NOT NULL, owner TEXT NOT NULL)";

/// Writes the period's row inside the scheduler's transaction: it commits
/// with the period's success or not at all.
async fn tick(cx: Context, mut tx: Transaction<'_>, owner: Arc<str>) -> Handled {
    // `$1` reads the same on both databases.
    const INSERT: &str = "INSERT INTO ticks (period_key, attempt, owner) VALUES ($1, $2, $3)";
    let (key, attempt, owner) = (cx.period_key().to_owned(), cx.attempt(), owner.to_string());
    if tx.is_postgres() {
        let insert = sqlx::query(INSERT).bind(key).bind(attempt).bind(owner);
        insert.execute(tx.postgres()?).await?;
    } else {
        let insert = sqlx::query(INSERT).bind(key).bind(attempt).bind(owner);
        insert.execute(tx.sqlite()?).await?;
    }
    tracing::info!("tick");
    Ok(())
}

#[tokio::main]
pub async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info,sqlx=warn"))
        .init();
    let url = std::env::var("DATABASE_URL").unwrap_or_else(|_| "sqlite://ticks.db".into());
    let owner: Arc<str> = format!("pid {}", std::process::id()).into();
    // The application's own pool: the scheduler's tables live beside its
    // own, and its handlers write in the same database.
    let builder = if url.starts_with("postgres") {
        let pool = sqlx::PgPool::connect(&url).await?;
        sqlx::query(CREATE).execute(&pool).await?;
        Scheduler::builder().postgres_pool(pool)
    } else {
        let options = sqlx::sqlite::SqliteConnectOptions::from_str(&url)?
            .create_if_missing(true)
            .journal_mode(sqlx::sqlite::SqliteJournalMode::Wal)
            .synchronous(sqlx::sqlite::SqliteSynchronous::Full)
            .busy_timeout(std::time::Duration::from_secs(30));
        let pool = sqlx::sqlite::SqlitePoolOptions::new()
            .max_connections(1)
            .connect_with(options)
            .await?;
        sqlx::query(CREATE).execute(&pool).await?;
        Scheduler::builder().sqlite_pool(pool)
    };
    let scheduler = builder
        .shutdown_grace(std::time::Duration::from_secs(5))
        .job(
            CodeJob::new("tick", "* * * * * *")
                .transaction(move |cx, tx| Box::pin(tick(cx, tx, owner.clone()))),
        )
        .build()
        .await?;
    let handle = scheduler.start(async {
        use tokio::signal::unix::{SignalKind, signal};
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    });
    handle.stopped().await?;
    Ok(())
}
