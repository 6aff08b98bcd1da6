//! Figures for claiming: in-process claim + complete of a no-op run next to
//! a raw loop of the two minimal statements (insert-on-conflict, update), on
//! SQLite and PostgreSQL in the same run; and `scheduler run --from --to`
//! over 1,000 periods of /bin/true. Run with `cargo bench --bench claims`
//! (PostgreSQL from SCHEDULER_TEST_DATABASE_URL, default the local server).

mod support;
use support::{admin_url, postgres_database};

use std::process::Command;
use std::time::{Duration, Instant};

use chrono::Utc;
use scheduler::period::Period;
use scheduler::store::{Claim, ClaimRequest, Finish, Store, Trigger};
use sqlx::Connection;

const RUNS: usize = 2_000;

async fn claim_and_complete(store: &Store) -> f64 {
    let started = Instant::now();
    for i in 0..RUNS {
        let start = Utc::now();
        let period = Period {
            label: format!("p{i}"),
            start,
            end: start,
        };
        let request = ClaimRequest {
            job: "bench",
            period: &period,
            owner: "bench",
            lease: Duration::from_secs(60),
            trigger: Trigger::Schedule,
            concurrency: 1,
            force: false,
            manual: false,
            scheduled_at: start,
        };
        let Claim::Won(lease) = store.claim(&request).await.unwrap() else {
            panic!("not won")
        };
        let finish = Finish {
            succeeded: true,
            ..Finish::default()
        };
        assert!(store.finish(&lease, &finish).await.unwrap());
    }
    RUNS as f64 / started.elapsed().as_secs_f64()
}

async fn raw_sqlite(url: &str) -> f64 {
    let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
    sqlx::query("PRAGMA journal_mode = WAL")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("PRAGMA synchronous = FULL")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE raw (key TEXT PRIMARY KEY, state TEXT NOT NULL)")
        .execute(&mut conn)
        .await
        .unwrap();
    let started = Instant::now();
    for i in 0..RUNS {
        let key = format!("raw:{i}");
        sqlx::query("INSERT INTO raw (key, state) VALUES (?1, 'running') ON CONFLICT DO NOTHING RETURNING key")
            .bind(&key)
            .fetch_optional(&mut conn)
            .await
            .unwrap()
            .unwrap();
        sqlx::query("UPDATE raw SET state = 'succeeded' WHERE key = ?1 AND state = 'running'")
            .bind(&key)
            .execute(&mut conn)
            .await
            .unwrap();
    }
    RUNS as f64 / started.elapsed().as_secs_f64()
}

async fn raw_postgres(url: &str) -> f64 {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query("CREATE TABLE raw (key TEXT PRIMARY KEY, state TEXT NOT NULL)")
        .execute(&mut conn)
        .await
        .unwrap();
    let started = Instant::now();
    for i in 0..RUNS {
        let key = format!("raw:{i}");
        sqlx::query("INSERT INTO raw (key, state) VALUES ($1, 'running') ON CONFLICT DO NOTHING RETURNING key")
            .bind(&key)
            .fetch_optional(&mut conn)
            .await
            .unwrap()
            .unwrap();
        sqlx::query("UPDATE raw SET state = 'succeeded' WHERE key = $1 AND state = 'running'")
            .bind(&key)
            .execute(&mut conn)
            .await
            .unwrap();
    }
    RUNS as f64 / started.elapsed().as_secs_f64()
}

fn backfill(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("jobs.toml"),
        "[[job]]\nname = \"sync\"\nschedule = \"* * * * *\"\nperiod = \"minute\"\ncommand = [\"/bin/true\"]\n",
    )
    .unwrap();
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_scheduler"))
        .args([
            "-q",
            "--database-url",
            url,
            "run",
            "sync",
            "--from",
            "2026-01-01T00:00",
            "--to",
            "2026-01-01T16:39",
        ])
        .current_dir(dir.path())
        .output()
        .unwrap();
    let secs = started.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let done = String::from_utf8_lossy(&out.stdout)
        .matches("succeeded")
        .count();
    assert_eq!(done, 1000);
    println!(
        "  run --from --to, 1,000 periods of /bin/true: {secs:.2}s = {:.0} periods/s",
        1000.0 / secs
    );
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sqlite = format!("sqlite://{}", dir.path().join("bench.db").display());
    let raw = format!("sqlite://{}?mode=rwc", dir.path().join("raw.db").display());
    let store = Store::connect(&sqlite).await.unwrap();
    store.migrate().await.unwrap();
    let (ours, baseline) = (claim_and_complete(&store).await, raw_sqlite(&raw).await);
    println!("SQLite (WAL, synchronous=FULL), {RUNS} no-op runs:");
    println!(
        "  claim + complete: {ours:.0} runs/s; raw two statements: {baseline:.0} runs/s; ratio {:.2}",
        ours / baseline
    );
    backfill(&format!(
        "sqlite://{}",
        dir.path().join("backfill.db").display()
    ));

    let admin = admin_url();
    let (Some(ours_url), Some(raw_url), Some(backfill_url)) = (
        postgres_database("scheduler_bench").await,
        postgres_database("scheduler_bench_raw").await,
        postgres_database("scheduler_bench_backfill").await,
    ) else {
        println!("PostgreSQL: no server at {admin}; skipped");
        return;
    };
    let store = Store::connect(&ours_url).await.unwrap();
    store.migrate().await.unwrap();
    let (ours, baseline) = (
        claim_and_complete(&store).await,
        raw_postgres(&raw_url).await,
    );
    println!("PostgreSQL (loopback), {RUNS} no-op runs:");
    println!(
        "  claim + complete: {ours:.0} runs/s; raw two statements: {baseline:.0} runs/s; ratio {:.2}",
        ours / baseline
    );
    backfill(&backfill_url);
}
