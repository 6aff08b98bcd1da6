//! Figures for claiming: in-process claim + complete of a no-op run next to
//! a raw loop of the two minimal statements (insert-on-conflict, update), on
//! SQLite and PostgreSQL in the same run; `scheduler run --from --to` over
//! 1,000 periods of /bin/true, next to the serial claim → spawn → complete
//! limit (the raw statements around a bare `posix_spawn` of /bin/true,
//! and around /bin/true started under its supervisor as the scheduler starts
//! a job, both measured in the same run), and over 10,000 of a no-op `sql` job, next to
//! the batched-claim limit (a bare insert of 100 keys per commit) and the
//! batched claim → run → record limit (that claim, then the 100 keys'
//! statements and their outcomes in one transaction). Run with `cargo bench --bench claims`
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
            shard: None,
            owner: "bench",
            lease: Duration::from_secs(60),
            trigger: Trigger::Schedule,
            concurrency: 1,
            force: false,
            manual: false,
            scheduled_at: start,
            asked: None,
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

/// What a raw loop does between its two statements: nothing, or start
/// `/bin/true` and wait for it (the serial claim → spawn → complete limit,
/// measured in the same run as the backfill it bounds).
#[derive(Clone, Copy, PartialEq)]
enum Between {
    Nothing,
    SpawnTrue,
    /// `/bin/true` started as the scheduler starts a job: its supervisor
    /// forked by the zygote, the job's tree watched and swept.
    Supervised,
}

impl Between {
    fn runs(self) -> usize {
        match self {
            Between::Nothing => RUNS,
            Between::SpawnTrue | Between::Supervised => 1_000,
        }
    }

    async fn act(self) {
        static ZYGOTE: std::sync::LazyLock<scheduler::engine::supervision::Launcher> =
            std::sync::LazyLock::new(|| {
                scheduler::engine::supervision::Launcher::new(
                    env!("CARGO_BIN_EXE_scheduler-supervise").into(),
                    Vec::new(),
                )
            });
        match self {
            Between::Nothing => {}
            Between::SpawnTrue => {
                use std::os::unix::process::CommandExt;
                let status = Command::new("/bin/true").process_group(0).status().unwrap();
                assert!(status.success());
            }
            Between::Supervised => {
                let spec = scheduler::engine::supervision::Spec {
                    fence_ms: 60_000,
                    program: "/bin/true".into(),
                    args: Vec::new(),
                    env: Vec::new(),
                    workdir: None,
                };
                let mut job = ZYGOTE.start(&spec).await.unwrap();
                assert_eq!(
                    job.status.ended().await,
                    scheduler::engine::supervision::Ended::Exited(0)
                );
            }
        }
    }

    fn prefix(self) -> &'static str {
        match self {
            Between::Nothing => "raw",
            Between::SpawnTrue => "spawn",
            Between::Supervised => "supervised",
        }
    }
}

async fn raw_sqlite(url: &str, between: Between) -> f64 {
    let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
    sqlx::query("PRAGMA journal_mode = WAL")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("PRAGMA synchronous = FULL")
        .execute(&mut conn)
        .await
        .unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS raw (key TEXT PRIMARY KEY, state TEXT NOT NULL)")
        .execute(&mut conn)
        .await
        .unwrap();
    let started = Instant::now();
    for i in 0..between.runs() {
        let key = format!("{}:{i}", between.prefix());
        sqlx::query("INSERT INTO raw (key, state) VALUES (?1, 'running') ON CONFLICT DO NOTHING RETURNING key")
            .bind(&key)
            .fetch_optional(&mut conn)
            .await
            .unwrap()
            .unwrap();
        between.act().await;
        sqlx::query("UPDATE raw SET state = 'succeeded' WHERE key = ?1 AND state = 'running'")
            .bind(&key)
            .execute(&mut conn)
            .await
            .unwrap();
    }
    between.runs() as f64 / started.elapsed().as_secs_f64()
}

async fn raw_postgres(url: &str, between: Between) -> f64 {
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query("CREATE TABLE IF NOT EXISTS raw (key TEXT PRIMARY KEY, state TEXT NOT NULL)")
        .execute(&mut conn)
        .await
        .unwrap();
    let started = Instant::now();
    for i in 0..between.runs() {
        let key = format!("{}:{i}", between.prefix());
        sqlx::query("INSERT INTO raw (key, state) VALUES ($1, 'running') ON CONFLICT DO NOTHING RETURNING key")
            .bind(&key)
            .fetch_optional(&mut conn)
            .await
            .unwrap()
            .unwrap();
        between.act().await;
        sqlx::query("UPDATE raw SET state = 'succeeded' WHERE key = $1 AND state = 'running'")
            .bind(&key)
            .execute(&mut conn)
            .await
            .unwrap();
    }
    between.runs() as f64 / started.elapsed().as_secs_f64()
}

/// `scheduler run JOB --from 2026-01-01T00:00 --to TO` of job `job` in
/// `toml`; prints `periods` over the time taken, and returns that rate.
fn backfill(url: &str, toml: &str, job: &str, to: &str, periods: usize, what: &str) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("jobs.toml"), toml).unwrap();
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_scheduler"))
        .args(["-q", "--database-url", url, "run", job])
        .args(["--from", "2026-01-01T00:00", "--to", to])
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
    assert_eq!(done, periods);
    println!(
        "  run --from --to, {periods} periods of {what}: {secs:.2}s = {:.0} periods/s",
        periods as f64 / secs
    );
    periods as f64 / secs
}

/// 1,000 periods of `/bin/true`, one at a time (`concurrency = 1`), next
/// to `limits`, the serial claim → spawn → complete limits of the same run:
/// with a bare spawn, and with the job started as the scheduler starts it
/// (under its supervisor).
fn backfill_true(url: &str, (bare, supervised): (f64, f64)) {
    let toml = "[[job]]\nname = \"sync\"\nschedule = \"* * * * *\"\nperiod = \"minute\"\ncommand = [\"/bin/true\"]\n";
    let rate = backfill(url, toml, "sync", "2026-01-01T16:39", 1_000, "/bin/true");
    println!(
        "    serial limit (raw claim, posix_spawn /bin/true, raw complete): {bare:.0}/s; ratio {:.2}",
        rate / bare
    );
    println!(
        "    serial limit with the job supervised (raw claim, /bin/true through the zygote, raw complete): {supervised:.0}/s; ratio {:.2}",
        rate / supervised
    );
}

/// 10,000 periods of a no-op `sql` job that may run 100 at once: claimed
/// 100 per statement, run as groups; next to `limit`, the batched claim →
/// run → record limit of the same run.
fn backfill_sql(url: &str, limit: f64) {
    let toml = "[[job]]\nname = \"rollup\"\nschedule = \"* * * * *\"\nperiod = \"minute\"\nconcurrency = 100\nsql = { statement = \"SELECT 1\" }\n";
    let rate = backfill(
        url,
        toml,
        "rollup",
        "2026-01-07T22:39",
        10_000,
        "a no-op sql job (concurrency 100)",
    );
    println!(
        "    batched claim → run → record limit (100 keys claimed per statement, then their 100 `SELECT 1`s and one update of their outcomes in one transaction): {limit:.0}/s; ratio {:.2}",
        rate / limit
    );
}

/// 10,000 periods of a no-op code job (the library) that may run 100 at
/// once, through `Scheduler::run_range`: plain and transaction-scoped.
async fn backfill_code(url: &str, scoped: bool) {
    let job = scheduler::CodeJob::new("noop", "* * * * *")
        .period(scheduler::Unit::Minute)
        .concurrency(100);
    let (job, what) = if scoped {
        let job = job.transaction(|_, _| Box::pin(async { Ok(()) }));
        (job, "transaction-scoped")
    } else {
        (job.handler(|_| async { Ok(()) }), "plain")
    };
    let scheduler = scheduler::Scheduler::builder()
        .database_url(url)
        .job(job)
        .build()
        .await
        .unwrap();
    let started = Instant::now();
    let runs = scheduler
        .run_range(
            "noop",
            "2026-01-01T00:00",
            "2026-01-07T22:39",
            scheduler::RunOptions::default(),
        )
        .await
        .unwrap();
    let secs = started.elapsed().as_secs_f64();
    let done = runs
        .iter()
        .filter(|run| run.outcome == scheduler::PeriodOutcome::Succeeded)
        .count();
    assert_eq!(done, 10_000);
    println!(
        "  library run_range, 10000 periods of a no-op {what} code job (concurrency 100): {secs:.2}s = {:.0} periods/s",
        10_000.0 / secs
    );
}

/// The batched-claim limit: 10,000 keys claimed 100 per statement by a
/// bare `INSERT … SELECT … ON CONFLICT DO NOTHING`, one commit each. With
/// `run`, the limit under any batched `sql` backfill: each hundred's
/// statements (`SELECT 1`, one round trip each) and one update of their
/// outcomes follow its claim, in one transaction per hundred.
async fn raw_batched_postgres(url: &str, run: bool) -> f64 {
    let table = if run { "raw_run" } else { "raw_batch" };
    let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
    sqlx::query(&format!(
        "CREATE TABLE IF NOT EXISTS {table} (k TEXT PRIMARY KEY, state TEXT, n INT)"
    ))
    .execute(&mut conn)
    .await
    .unwrap();
    let claim = format!(
        "INSERT INTO {table} SELECT k, 'running', 1 FROM unnest($1::text[]) AS k
         ON CONFLICT DO NOTHING RETURNING k"
    );
    let record =
        format!("UPDATE {table} SET state = 'succeeded' WHERE k = ANY($1) AND state = 'running'");
    let started = Instant::now();
    for chunk in 0..100 {
        let keys: Vec<String> = (0..100).map(|i| format!("k{chunk}-{i}")).collect();
        let won: Vec<String> = sqlx::query_scalar(&claim)
            .bind(&keys)
            .fetch_all(&mut conn)
            .await
            .unwrap();
        if run {
            let mut tx = conn.begin().await.unwrap();
            for _ in &won {
                sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
            }
            sqlx::query(&record)
                .bind(&won)
                .execute(&mut *tx)
                .await
                .unwrap();
            tx.commit().await.unwrap();
        }
    }
    10_000.0 / started.elapsed().as_secs_f64()
}

/// The same on SQLite: 100 single-row upserts per transaction; with `run`,
/// the hundred's statements and outcomes in one more.
async fn raw_batched_sqlite(url: &str, run: bool) -> f64 {
    let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
    for pragma in [
        "PRAGMA journal_mode = WAL",
        "PRAGMA synchronous = FULL",
        "CREATE TABLE IF NOT EXISTS raw (k TEXT PRIMARY KEY, state TEXT, n INT)",
    ] {
        sqlx::query(pragma).execute(&mut conn).await.unwrap();
    }
    let started = Instant::now();
    for chunk in 0..100 {
        let keys: Vec<String> = (0..100).map(|i| format!("k{chunk}-{i}")).collect();
        let mut tx = conn.begin().await.unwrap();
        for key in &keys {
            sqlx::query("INSERT INTO raw VALUES (?1, 'running', 1) ON CONFLICT DO NOTHING")
                .bind(key)
                .execute(&mut *tx)
                .await
                .unwrap();
        }
        tx.commit().await.unwrap();
        if run {
            let mut tx = conn.begin().await.unwrap();
            for key in &keys {
                sqlx::query("SELECT 1").execute(&mut *tx).await.unwrap();
                sqlx::query(
                    "UPDATE raw SET state = 'succeeded' WHERE k = ?1 AND state = 'running'",
                )
                .bind(key)
                .execute(&mut *tx)
                .await
                .unwrap();
            }
            tx.commit().await.unwrap();
        }
    }
    10_000.0 / started.elapsed().as_secs_f64()
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
    let (ours, baseline) = (
        claim_and_complete(&store).await,
        raw_sqlite(&raw, Between::Nothing).await,
    );
    println!("SQLite (WAL, synchronous=FULL), {RUNS} no-op runs:");
    println!(
        "  claim + complete: {ours:.0} runs/s; raw two statements: {baseline:.0} runs/s; ratio {:.2}",
        ours / baseline
    );
    backfill_true(
        &format!("sqlite://{}", dir.path().join("backfill.db").display()),
        (
            raw_sqlite(&raw, Between::SpawnTrue).await,
            raw_sqlite(&raw, Between::Supervised).await,
        ),
    );
    let raw_run = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("raw_run.db").display()
    );
    backfill_sql(
        &format!("sqlite://{}", dir.path().join("backfill_sql.db").display()),
        raw_batched_sqlite(&raw_run, true).await,
    );
    for (file, scoped) in [("code.db", false), ("code_tx.db", true)] {
        backfill_code(
            &format!("sqlite://{}", dir.path().join(file).display()),
            scoped,
        )
        .await;
    }
    let raw_batch = format!(
        "sqlite://{}?mode=rwc",
        dir.path().join("raw_batch.db").display()
    );
    println!(
        "  batched-claim limit (100 keys per transaction): {:.0} claims/s",
        raw_batched_sqlite(&raw_batch, false).await
    );

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
        raw_postgres(&raw_url, Between::Nothing).await,
    );
    println!("PostgreSQL (loopback), {RUNS} no-op runs:");
    println!(
        "  claim + complete: {ours:.0} runs/s; raw two statements: {baseline:.0} runs/s; ratio {:.2}",
        ours / baseline
    );
    backfill_true(
        &backfill_url,
        (
            raw_postgres(&raw_url, Between::SpawnTrue).await,
            raw_postgres(&raw_url, Between::Supervised).await,
        ),
    );
    if let Some(url) = postgres_database("scheduler_bench_backfill_sql").await {
        backfill_sql(&url, raw_batched_postgres(&raw_url, true).await);
    }
    for (name, scoped) in [
        ("scheduler_bench_code", false),
        ("scheduler_bench_code_tx", true),
    ] {
        if let Some(url) = postgres_database(name).await {
            backfill_code(&url, scoped).await;
        }
    }
    println!(
        "  batched-claim limit (100 keys per statement): {:.0} claims/s",
        raw_batched_postgres(&raw_url, false).await
    );
}
