//! The library: code jobs on the one engine, on both backends, with two
//! schedulers in one process, two processes, a `jobs.toml` beside code,
//! lost claims, transaction-scoped handlers and shutdown through the handle.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use scheduler::{
    CodeJob, Context, Failure, Handled, PeriodOutcome, RunOptions, Scheduler, Transaction, Unit,
};

use crate::support::{TestDb, Workspace};

/// SQLite, and PostgreSQL where a server answers.
async fn backends() -> Vec<TestDb> {
    let mut dbs = vec![TestDb::sqlite()];
    dbs.extend(TestDb::postgres().await);
    dbs
}

/// One number from the test's database.
pub(crate) async fn number(url: &str, sql: &str) -> i64 {
    use sqlx::Connection;
    if url.starts_with("sqlite:") {
        let options: sqlx::sqlite::SqliteConnectOptions = url.parse().unwrap();
        let mut conn = sqlx::SqliteConnection::connect_with(&options.create_if_missing(true))
            .await
            .unwrap();
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_optional(&mut conn)
            .await
            .unwrap()
            .unwrap_or(0)
    } else {
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query_scalar::<_, i64>(sql)
            .fetch_optional(&mut conn)
            .await
            .unwrap()
            .unwrap_or(0)
    }
}

/// Runs `sql` (no result) on the test's database.
async fn execute(url: &str, sql: &str) {
    number(url, sql).await;
}

/// The period keys a plain handler was called with, in call order.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<String>>>);

impl Calls {
    fn job(&self, name: &str, schedule: &str) -> CodeJob {
        let calls = self.clone();
        CodeJob::new(name, schedule).handler(move |cx: Context| {
            let calls = calls.clone();
            async move {
                calls.0.lock().unwrap().push(cx.period_key().to_owned());
                Ok(())
            }
        })
    }

    fn keys(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// Asserts that `keys` (of a per-fire, every-second job) are unique and
/// cover every second between the first and the last.
fn once_each_second(keys: &[String], at_least: usize) {
    let unique: HashSet<&String> = keys.iter().collect();
    assert_eq!(unique.len(), keys.len(), "a period ran twice: {keys:?}");
    assert!(keys.len() >= at_least, "too few periods ran: {keys:?}");
    let mut seconds: Vec<i64> = keys
        .iter()
        .map(|key| {
            let label = key.split_once(':').unwrap().1;
            DateTime::parse_from_rfc3339(label).unwrap().timestamp()
        })
        .collect();
    seconds.sort_unstable();
    for pair in seconds.windows(2) {
        assert_eq!(pair[1] - pair[0], 1, "a second was missed: {keys:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_code_job_runs_each_period_once_across_two_schedulers_in_one_process() {
    for db in backends().await {
        let calls = Calls::default();
        let mut handles = Vec::new();
        for _ in 0..2 {
            let scheduler = Scheduler::builder()
                .database_url(&db.url)
                .job(calls.job("tick", "* * * * * *"))
                .build()
                .await
                .unwrap();
            handles.push(scheduler.start(std::future::pending()));
        }
        tokio::time::sleep(Duration::from_millis(4500)).await;
        for handle in &handles {
            handle.shutdown();
        }
        for handle in handles {
            tokio::time::timeout(Duration::from_secs(30), handle.stopped())
                .await
                .expect("stopped in time")
                .unwrap();
        }
        let keys = calls.keys();
        once_each_second(&keys, 3);
        let succeeded = number(
            &db.url,
            "SELECT count(*) FROM scheduler_claims WHERE state = 'succeeded'",
        )
        .await;
        assert_eq!(succeeded as usize, keys.len(), "{}", db.url);
    }
}

/// The plain tokio example, compiled into this test binary: a child
/// process runs it through [`plain_tokio_process`].
#[path = "../../examples/plain_tokio.rs"]
mod plain_tokio;

/// Not a test of its own: this binary started again to run only this,
/// with `PLAIN_TOKIO=1`, is the plain tokio example as a process.
#[test]
#[ignore = "a child process of a_code_job_runs_each_period_once_across_two_processes"]
fn plain_tokio_process() {
    if std::env::var_os("PLAIN_TOKIO").is_some() {
        plain_tokio::main().unwrap();
    }
}

#[test]
fn a_code_job_runs_each_period_once_across_two_processes() {
    for db in crate::support::databases() {
        let dir = tempfile::tempdir().unwrap();
        let start = || {
            std::process::Command::new(std::env::current_exe().unwrap())
                .args(["--ignored", "--exact", "embed::plain_tokio_process"])
                .current_dir(dir.path())
                .env("PLAIN_TOKIO", "1")
                .env("DATABASE_URL", &db.url)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        };
        // The second starts once the first has made the file (two programs
        // creating one SQLite file at once race to switch it to WAL): its
        // write-ahead log is there, or its tables on PostgreSQL.
        let first = start();
        let made = || match db.url.strip_prefix("sqlite://") {
            Some(file) => std::path::Path::new(&format!("{file}-wal")).exists(),
            None => crate::support::migrated(&db.url),
        };
        crate::support::eventually("the first copy's database", Duration::from_secs(60), made);
        let copies = [first, start()];
        // Four periods run by the copies.
        crate::support::eventually("four periods", Duration::from_secs(60), || {
            crate::support::migrated(&db.url)
                && crate::support::count(&db.url, "SELECT count(DISTINCT period_key) FROM ticks")
                    >= 4
        });
        for copy in &copies {
            let pid = nix::unistd::Pid::from_raw(copy.id() as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        }
        for copy in copies {
            let out = crate::support::wait(copy, Duration::from_secs(30));
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        let count = |sql: &str| crate::support::count(&db.url, sql);
        let rows = count("SELECT count(*) FROM ticks");
        let keys = count("SELECT count(DISTINCT period_key) FROM ticks");
        let owners = count("SELECT count(DISTINCT owner) FROM ticks");
        let succeeded = count("SELECT count(*) FROM scheduler_claims WHERE state = 'succeeded'");
        assert_eq!(rows, keys, "a period ran twice ({})", db.url);
        assert_eq!(rows, succeeded, "a row without its success, or the reverse");
        assert!(rows >= 3, "too few periods ran: {rows}");
        assert!(owners >= 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_jobs_and_jobs_toml_jobs_run_in_one_scheduler() {
    for db in backends().await {
        execute(&db.url, "CREATE TABLE from_file (k TEXT PRIMARY KEY)").await;
        let ws = Workspace::new(
            r#"
[[job]]
name = "filed"
schedule = "* * * * * *"
sql = { statement = "INSERT INTO from_file (k) VALUES ($1)", params = ["{period_key}"] }
"#,
        );
        let calls = Calls::default();
        let scheduler = Scheduler::builder()
            .database_url(&db.url)
            .config_file(ws.path().join("jobs.toml"))
            .job(calls.job("coded", "* * * * * *"))
            .build()
            .await
            .unwrap();
        let handle = scheduler.start(tokio::time::sleep(Duration::from_millis(3500)));
        tokio::time::timeout(Duration::from_secs(30), handle.stopped())
            .await
            .expect("stopped in time")
            .unwrap();
        once_each_second(&calls.keys(), 2);
        let filed = number(&db.url, "SELECT count(*) FROM from_file").await;
        assert!(filed >= 2, "the jobs.toml job ran {filed} times");
        let claims = number(
            &db.url,
            "SELECT count(*) FROM scheduler_claims WHERE job = 'filed' AND state = 'succeeded'",
        )
        .await;
        assert_eq!(claims, filed);
    }
}

/// `run_period` of `job`'s period `label` in a task of its own.
fn in_background(
    scheduler: &Scheduler,
    job: &'static str,
    label: &str,
) -> tokio::task::JoinHandle<Result<Vec<scheduler::PeriodRun>, scheduler::Error>> {
    let (scheduler, label) = (scheduler.clone(), label.to_owned());
    tokio::spawn(async move {
        scheduler
            .run_period(job, &label, RunOptions::default())
            .await
    })
}

/// Yesterday's label of a daily job.
fn yesterday() -> String {
    (Utc::now() - chrono::Duration::days(1))
        .format("%Y-%m-%d")
        .to_string()
}

/// A daily job whose handler ignores its token and beats until dropped.
#[derive(Clone, Default)]
struct Stubborn {
    beats: Arc<AtomicU64>,
    cancelled: Arc<AtomicBool>,
}

impl Stubborn {
    fn job(&self, name: &str) -> CodeJob {
        let me = self.clone();
        CodeJob::new(name, "0 4 * * *")
            .period(Unit::Day)
            .handler(move |cx: Context| {
                let me = me.clone();
                async move {
                    let (token, cancelled) = (cx.token().clone(), me.cancelled.clone());
                    tokio::spawn(async move {
                        token.cancelled().await;
                        cancelled.store(true, Ordering::SeqCst);
                    });
                    loop {
                        me.beats.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                }
            })
    }

    async fn started(&self) {
        while self.beats.load(Ordering::SeqCst) == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Asserts that its token was cancelled and its future dropped. The
    /// flag is set by a task of its own, which a loaded machine may run a
    /// moment after the run ended: it is waited for, within a bound.
    async fn stopped(&self) {
        let cancelled = tokio::time::timeout(Duration::from_secs(10), async {
            while !self.cancelled.load(Ordering::SeqCst) {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
        .await;
        assert!(cancelled.is_ok(), "the token was not cancelled");
        let then = self.beats.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(
            self.beats.load(Ordering::SeqCst),
            then,
            "the handler still runs"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_claim_cancels_the_token_and_drops_a_handler_that_ignores_it() {
    for db in backends().await {
        let stubborn = Stubborn::default();
        let job = stubborn.job("stubborn");
        let scheduler = Scheduler::builder()
            .database_url(&db.url)
            .lease(Duration::from_secs(3))
            .job(job)
            .build()
            .await
            .unwrap();
        let label = yesterday();
        let running = in_background(&scheduler, "stubborn", &label);
        stubborn.started().await;
        let key = format!("stubborn:{label}");
        assert!(scheduler.release("stubborn", &label).await.unwrap());
        let runs = tokio::time::timeout(Duration::from_secs(20), running)
            .await
            .expect("the run ended")
            .unwrap()
            .unwrap();
        assert_eq!(runs.len(), 1);
        assert_eq!(runs[0].outcome, PeriodOutcome::Released, "{:?}", runs[0]);
        stubborn.stopped().await;
        let recorded = number(
            &db.url,
            &format!(
                "SELECT count(*) FROM scheduler_attempts WHERE period_key = '{key}' AND outcome IN ('succeeded', 'failed')"
            ),
        )
        .await;
        assert_eq!(recorded, 0, "the lost attempt recorded an outcome");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_over_claim_cancels_the_token_and_drops_the_handler() {
    for db in backends().await {
        let stubborn = Stubborn::default();
        let first = Scheduler::builder()
            .database_url(&db.url)
            .lease(Duration::from_secs(3))
            .job(stubborn.job("taken"))
            .build()
            .await
            .unwrap();
        let calls = Calls::default();
        // The same lease: a scheduler that has just started leaves an
        // expired lease to its runner for lease/3 of the database's answers.
        let second = Scheduler::builder()
            .database_url(&db.url)
            .lease(Duration::from_secs(3))
            .job(calls.job("taken", "0 4 * * *").period(Unit::Day))
            .build()
            .await
            .unwrap();
        let label = yesterday();
        let running = in_background(&first, "taken", &label);
        stubborn.started().await;
        // The first runner's lease runs out (as if it froze); the second
        // takes the period over. Its heartbeat may renew in between: again.
        let expire = if db.url.starts_with("postgres") {
            "UPDATE scheduler_claims SET lease_until = now() - interval '1 minute' WHERE state = 'running'"
        } else {
            "UPDATE scheduler_claims SET lease_until = 0 WHERE state = 'running'"
        };
        let mut taken = None;
        for _ in 0..20 {
            execute(&db.url, expire).await;
            let runs = second
                .run_period("taken", &label, RunOptions::default())
                .await
                .unwrap();
            if runs[0].outcome == PeriodOutcome::Succeeded {
                taken = Some(runs);
                break;
            }
        }
        let taken = taken.expect("the second runner took the period over");
        assert_eq!(taken[0].attempt, Some(2));
        let lost = tokio::time::timeout(Duration::from_secs(20), running)
            .await
            .expect("the first run ended")
            .unwrap()
            .unwrap();
        assert_eq!(lost[0].outcome, PeriodOutcome::Lost, "{:?}", lost[0]);
        stubborn.stopped().await;
        let first_recorded = number(
            &db.url,
            &format!(
                "SELECT count(*) FROM scheduler_attempts WHERE period_key = 'taken:{label}' AND attempt = 1 AND outcome IN ('succeeded', 'failed')"
            ),
        )
        .await;
        assert_eq!(
            first_recorded, 0,
            "the taken-over attempt recorded an outcome"
        );
    }
}

/// A transaction-scoped job that writes its period key to `ledger`, then
/// does what `then` says.
fn ledger_job(name: &str, then: &'static str) -> CodeJob {
    CodeJob::new(name, "0 4 * * *")
        .period(Unit::Day)
        .transaction(move |cx, tx| Box::pin(write_then(cx, tx, then)))
}

async fn write_then(cx: Context, mut tx: Transaction<'_>, then: &str) -> Handled {
    const INSERT: &str = "INSERT INTO ledger (k) VALUES ($1)";
    let key = cx.period_key().to_owned();
    if tx.is_postgres() {
        sqlx::query(INSERT)
            .bind(key)
            .execute(tx.postgres()?)
            .await?;
    } else {
        sqlx::query(INSERT).bind(key).execute(tx.sqlite()?).await?;
    }
    match then {
        "succeed" => Ok(()),
        "fail" => Err(Failure::permanent("no such customer")),
        // Ignores its token, holding its transaction.
        _ => {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok(())
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_scoped_handler_commits_its_write_with_the_success_and_nothing_otherwise() {
    for db in backends().await {
        execute(&db.url, "CREATE TABLE ledger (k TEXT NOT NULL)").await;
        let scheduler = Scheduler::builder()
            .database_url(&db.url)
            .lease(Duration::from_secs(3))
            .job(ledger_job("good", "succeed"))
            .job(ledger_job("bad", "fail"))
            .job(ledger_job("stuck", "hang"))
            .build()
            .await
            .unwrap();
        let label = yesterday();
        let run = |job: &'static str| {
            let (scheduler, label) = (scheduler.clone(), label.clone());
            async move {
                scheduler
                    .run_period(job, &label, RunOptions::default())
                    .await
                    .unwrap()
                    .remove(0)
            }
        };
        let good = run("good").await;
        assert_eq!(good.outcome, PeriodOutcome::Succeeded, "{good:?}");
        let bad = run("bad").await;
        assert_eq!(bad.outcome, PeriodOutcome::Failed, "{bad:?}");
        assert_eq!(bad.error.as_deref(), Some("no such customer"));
        let count = |sql: String| {
            let url = db.url.clone();
            async move { number(&url, &sql).await }
        };
        let written = |job: &str| {
            count(format!(
                "SELECT count(*) FROM ledger WHERE k = '{job}:{label}'"
            ))
        };
        assert_eq!(
            written("good").await,
            1,
            "the success committed without its write"
        );
        assert_eq!(
            written("bad").await,
            0,
            "a failed handler's write committed"
        );
        let no_retry = count(format!(
            "SELECT count(*) FROM scheduler_claims WHERE period_key = 'bad:{label}' AND state = 'failed' AND retry_at IS NULL"
        ));
        assert_eq!(no_retry.await, 1, "a permanent failure is not retried");
        // Stopped inside its transaction: on PostgreSQL its claim is
        // released under it; on SQLite it holds the one writer past lease/3.
        let stuck = {
            let run = run("stuck");
            tokio::spawn(run)
        };
        tokio::time::sleep(Duration::from_millis(500)).await;
        if db.url.starts_with("postgres") {
            let store = scheduler::store::Store::connect(&db.url).await.unwrap();
            store.release_key(&format!("stuck:{label}")).await.unwrap();
        }
        let stuck = tokio::time::timeout(Duration::from_secs(20), stuck)
            .await
            .expect("the stuck handler was stopped")
            .unwrap();
        assert_ne!(stuck.outcome, PeriodOutcome::Succeeded, "{stuck:?}");
        assert_eq!(
            written("stuck").await,
            0,
            "a stopped handler's write committed"
        );
        let succeeded = count(format!(
            "SELECT count(*) FROM scheduler_claims WHERE period_key = 'stuck:{label}' AND state = 'succeeded'"
        ));
        assert_eq!(succeeded.await, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_through_the_handle_gives_the_grace_then_releases_the_claim() {
    for db in backends().await {
        let started = Arc::new(Mutex::new(Vec::<String>::new()));
        let seen = started.clone();
        let job = CodeJob::new("long", "* * * * * *").handler(move |cx: Context| {
            let seen = seen.clone();
            async move {
                seen.lock().unwrap().push(cx.period_key().to_owned());
                // Ignores its token: only the end of the grace stops it.
                tokio::time::sleep(Duration::from_secs(600)).await;
                Ok(())
            }
        });
        let scheduler = Scheduler::builder()
            .database_url(&db.url)
            .shutdown_grace(Duration::from_millis(1500))
            .max_running(1)
            .job(job)
            .build()
            .await
            .unwrap();
        let handle = scheduler.start(std::future::pending());
        while started.lock().unwrap().is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        handle.shutdown();
        let claims_then = number(&db.url, "SELECT count(*) FROM scheduler_claims").await;
        let asked = std::time::Instant::now();
        tokio::time::timeout(Duration::from_secs(30), handle.stopped())
            .await
            .expect("stopped in time")
            .unwrap();
        assert!(
            asked.elapsed() >= Duration::from_millis(1400),
            "the handler did not get its grace"
        );
        let key = started.lock().unwrap()[0].clone();
        let released = number(
            &db.url,
            &format!(
                "SELECT count(*) FROM scheduler_claims WHERE period_key = '{key}' AND state = 'released' AND failures = 0"
            ),
        )
        .await;
        assert_eq!(
            released, 1,
            "the claim was not released, or a retry was spent"
        );
        let claims_now = number(&db.url, "SELECT count(*) FROM scheduler_claims").await;
        assert_eq!(claims_now, claims_then, "a claim was made after shutdown");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handler_that_commits_its_transaction_itself_is_recorded_failed_for_good_not_rerun() {
    for db in backends().await {
        execute(&db.url, "CREATE TABLE ledger (k TEXT NOT NULL)").await;
        let job = CodeJob::new("sloppy", "0 4 * * *")
            .period(Unit::Day)
            .retry(scheduler::Retry::attempts(5))
            .transaction(|cx, mut tx| {
                Box::pin(async move {
                    const INSERT: &str = "INSERT INTO ledger (k) VALUES ($1)";
                    let key = cx.period_key().to_owned();
                    if tx.is_postgres() {
                        let conn = tx.postgres()?;
                        sqlx::query(INSERT).bind(key).execute(&mut *conn).await?;
                        sqlx::query("COMMIT").execute(&mut *conn).await?;
                    } else {
                        let conn = tx.sqlite()?;
                        sqlx::query(INSERT).bind(key).execute(&mut *conn).await?;
                        sqlx::query("COMMIT").execute(&mut *conn).await?;
                    }
                    Ok(())
                })
            });
        let scheduler = Scheduler::builder()
            .database_url(&db.url)
            .job(job)
            .build()
            .await
            .unwrap();
        let label = yesterday();
        let runs = tokio::time::timeout(
            Duration::from_secs(30),
            scheduler.run_period("sloppy", &label, RunOptions::default()),
        )
        .await
        .expect("the run ended")
        .unwrap();
        assert_eq!(runs[0].outcome, PeriodOutcome::Failed, "{:?}", runs[0]);
        let error = runs[0].error.clone().unwrap_or_default();
        assert!(error.contains("ended its transaction itself"), "{error}");
        let failed_for_good = number(
            &db.url,
            &format!(
                "SELECT count(*) FROM scheduler_claims WHERE period_key = 'sloppy:{label}' AND state = 'failed' AND retry_at IS NULL"
            ),
        )
        .await;
        assert_eq!(failed_for_good, 1, "not recorded failed for good");
        // Served, it is not taken again.
        let handle = scheduler.start(tokio::time::sleep(Duration::from_secs(2)));
        handle.stopped().await.unwrap();
        let attempts = number(
            &db.url,
            &format!("SELECT count(*) FROM scheduler_attempts WHERE period_key = 'sloppy:{label}'"),
        )
        .await;
        assert_eq!(attempts, 1, "the period ran again");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_the_server_ends_under_a_handler_is_a_failure_under_the_retry_policy() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    execute(&db.url, "CREATE TABLE ledger (k TEXT NOT NULL)").await;
    // An application pool whose sessions end after 1 s idle in a transaction.
    let options: sqlx::postgres::PgConnectOptions = db.url.parse().unwrap();
    let pool = sqlx::PgPool::connect_with(
        options.options([("idle_in_transaction_session_timeout", "1s")]),
    )
    .await
    .unwrap();
    let job = CodeJob::new("idle", "0 4 * * *")
        .period(Unit::Day)
        .retry(scheduler::Retry::attempts(3))
        .transaction(|cx, mut tx| {
            Box::pin(async move {
                sqlx::query("INSERT INTO ledger (k) VALUES ($1)")
                    .bind(cx.period_key().to_owned())
                    .execute(tx.postgres()?)
                    .await?;
                // An outside call, past the server's idle limit.
                tokio::time::sleep(Duration::from_secs(2)).await;
                sqlx::query("INSERT INTO ledger (k) VALUES ('after')")
                    .execute(tx.postgres()?)
                    .await?;
                Ok(())
            })
        });
    let scheduler = Scheduler::builder()
        .postgres_pool(pool)
        .job(job)
        .build()
        .await
        .unwrap();
    let label = yesterday();
    let runs = tokio::time::timeout(
        Duration::from_secs(30),
        scheduler.run_period("idle", &label, RunOptions::default()),
    )
    .await
    .expect("the run ended")
    .unwrap();
    assert_eq!(runs[0].outcome, PeriodOutcome::Failed, "{:?}", runs[0]);
    let retried = number(
        &db.url,
        &format!(
            "SELECT count(*) FROM scheduler_claims WHERE period_key = 'idle:{label}' AND state = 'failed' AND retry_at IS NOT NULL AND failures = 1"
        ),
    )
    .await;
    assert_eq!(retried, 1, "not a failure with a retry due");
    assert_eq!(number(&db.url, "SELECT count(*) FROM ledger").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_panicking_handler_is_a_failure_that_says_why() {
    for db in backends().await {
        let job = CodeJob::new("boom", "0 4 * * *")
            .period(Unit::Day)
            .handler(|cx: Context| async move { panic!("no invoice for {}", cx.label()) });
        let scheduler = Scheduler::builder()
            .database_url(&db.url)
            .job(job)
            .build()
            .await
            .unwrap();
        let label = yesterday();
        let runs = scheduler
            .run_period("boom", &label, RunOptions::default())
            .await
            .unwrap();
        assert_eq!(runs[0].outcome, PeriodOutcome::Failed);
        let error = runs[0].error.clone().unwrap_or_default();
        assert!(
            error.contains(&format!("no invoice for {label}")),
            "{error}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_run_that_finds_every_slot_taken_says_busy_not_done() {
    for db in backends().await {
        let job =
            CodeJob::new("slow", "0 4 * * *")
                .period(Unit::Day)
                .handler(|_cx: Context| async {
                    tokio::time::sleep(Duration::from_secs(2)).await;
                    Ok(())
                });
        let scheduler = Scheduler::builder()
            .database_url(&db.url)
            .job(job)
            .build()
            .await
            .unwrap();
        let days = |n: i64| {
            (Utc::now() - chrono::Duration::days(n))
                .format("%Y-%m-%d")
                .to_string()
        };
        let first = in_background(&scheduler, "slow", &days(2));
        tokio::time::sleep(Duration::from_millis(500)).await;
        let second = scheduler
            .run_period("slow", &days(1), RunOptions::default().wait(false))
            .await
            .unwrap();
        assert_eq!(second[0].outcome, PeriodOutcome::Busy, "{:?}", second[0]);
        let first = first.await.unwrap().unwrap();
        assert_eq!(first[0].outcome, PeriodOutcome::Succeeded);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_given_in_code_apply_to_the_files_jobs_too() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        r#"
[scheduler]
timezone = "Europe/Berlin"
catch_up = "24h"

[[job]]
name = "filed"
schedule = "0 4 * * *"
period = "day"
keep = "30h"
command = ["true"]
"#,
    );
    // A longer catch-up window than the file's `keep`: refused, as in the file.
    let refused = Scheduler::builder()
        .database_url(&db.url)
        .config_file(ws.path().join("jobs.toml"))
        .catch_up(Duration::from_secs(48 * 3600))
        .supervisor(env!("CARGO_BIN_EXE_scheduler-supervise"))
        .build()
        .await
        .expect_err("keep shorter than catch_up is refused");
    assert!(
        refused.to_string().contains("shorter than catch_up"),
        "{refused}"
    );
    // The zone given in code is the file's jobs' zone: a day starts at
    // midnight UTC, not Berlin's.
    let scheduler = Scheduler::builder()
        .database_url(&db.url)
        .config_file(ws.path().join("jobs.toml"))
        .timezone(chrono_tz::UTC)
        .supervisor(env!("CARGO_BIN_EXE_scheduler-supervise"))
        .build()
        .await
        .unwrap();
    let label = yesterday();
    let runs = scheduler
        .run_period("filed", &label, RunOptions::default())
        .await
        .unwrap();
    assert_eq!(runs[0].outcome, PeriodOutcome::Succeeded, "{:?}", runs[0]);
    let midnight = chrono::NaiveDate::parse_from_str(&label, "%Y-%m-%d")
        .unwrap()
        .and_hms_opt(0, 0, 0)
        .unwrap()
        .and_utc()
        .timestamp_millis();
    let start = number(
        &db.url,
        &format!("SELECT period_start FROM scheduler_claims WHERE period_key = 'filed:{label}'"),
    )
    .await;
    assert_eq!(start, midnight, "the day is not UTC's");
}

/// A pause said through the library reaches the library's own loop at
/// once, not at its next scan (a minute away here); a resume starts it
/// again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_through_the_library_stops_its_own_loop_at_once() {
    let db = TestDb::sqlite();
    let calls = Calls::default();
    let scheduler = Scheduler::builder()
        .database_url(&db.url)
        .scan_interval(Duration::from_secs(60))
        .job(calls.job("tick", "* * * * * *"))
        .build()
        .await
        .unwrap();
    let handle = scheduler.start(std::future::pending());
    let ran = |n: usize| {
        let calls = calls.clone();
        async move {
            while calls.keys().len() < n {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    };
    tokio::time::timeout(Duration::from_secs(10), ran(2))
        .await
        .expect("the job runs");
    scheduler.pause("tick", true).await.unwrap();
    // A fire already claimed may still end.
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let paused_at = calls.keys().len();
    tokio::time::sleep(Duration::from_millis(3000)).await;
    assert_eq!(
        calls.keys().len(),
        paused_at,
        "fires ran after the pause: {:?}",
        calls.keys()
    );
    scheduler.pause("tick", false).await.unwrap();
    tokio::time::timeout(Duration::from_secs(10), ran(paused_at + 1))
        .await
        .expect("the job runs again once resumed");
    handle.shutdown();
    tokio::time::timeout(Duration::from_secs(30), handle.stopped())
        .await
        .expect("stopped in time")
        .unwrap();
    once_each_second(&calls.keys()[..paused_at], 2);
}

/// A code job waits for a job of jobs.toml (`after`), and a jobs.toml job
/// for a code job; an unknown name is refused when the scheduler is built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn code_jobs_wait_for_file_jobs_and_file_jobs_for_code_jobs() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[[job]]\nname = \"ingest\"\nschedule = \"0 1 * * *\"\nperiod = \"day\"\nsql = { statement = \"SELECT 1\" }\n\n\
         [[job]]\nname = \"publish\"\nschedule = \"0 3 1 * *\"\nperiod = \"month\"\ncovers = \"previous\"\n\
         after = [\"report\"]\nsql = { statement = \"SELECT 1\" }\n",
    );
    let report = CodeJob::new("report", "0 2 1 * *")
        .period(Unit::Month)
        .covers(scheduler::Covers::Previous)
        .after(["ingest"])
        .handler(|_cx| async move { Ok(()) });
    let scheduler = Scheduler::builder()
        .database_url(&db.url)
        .config_file(ws.path().join("jobs.toml"))
        .job(report)
        .build()
        .await
        .unwrap();
    let asked = RunOptions::default();
    let waiting = scheduler
        .run_period("report", "2026-10", asked.clone())
        .await
        .unwrap();
    assert_eq!(waiting[0].outcome, PeriodOutcome::Waiting, "{waiting:?}");
    assert!(
        waiting[0]
            .detail
            .starts_with("ingest: 0/31, missing 2026-10-01"),
        "{waiting:?}"
    );
    let publish = scheduler
        .run_period("publish", "2026-10", asked.clone())
        .await
        .unwrap();
    assert_eq!(publish[0].outcome, PeriodOutcome::Waiting, "{publish:?}");
    assert!(
        publish[0]
            .detail
            .starts_with("report: 0/1, missing 2026-10"),
        "{publish:?}"
    );
    let all = scheduler
        .run_period("publish", "2026-10", asked.with_upstream())
        .await
        .unwrap();
    let outcomes: Vec<(&str, PeriodOutcome)> = all
        .iter()
        .map(|r| (r.period_key.as_str(), r.outcome))
        .collect();
    assert_eq!(outcomes.len(), 33, "{outcomes:?}");
    assert_eq!(outcomes[0], ("ingest:2026-10-01", PeriodOutcome::Succeeded));
    assert_eq!(outcomes[31], ("report:2026-10", PeriodOutcome::Succeeded));
    assert_eq!(outcomes[32], ("publish:2026-10", PeriodOutcome::Succeeded));
    let unknown = Scheduler::builder()
        .database_url(&db.url)
        .job(
            CodeJob::new("late", "0 2 1 * *")
                .after(["nope"])
                .handler(|_cx| async move { Ok(()) }),
        )
        .build()
        .await;
    let Err(e) = unknown else {
        panic!("an unknown name in after was built");
    };
    assert!(e.to_string().contains("no job named `nope`"), "{e}");
}

/// `run_due` runs what is due by the scheduler's clock, as `scheduler run`
/// does: a stopped clock moved by hand a day at a time runs each day's
/// period once, a second call at the same instant runs nothing, and two
/// days skipped are both caught up; no sleeping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_due_runs_each_period_once_as_a_stopped_clock_moves_on() {
    use chrono::TimeDelta;
    use scheduler::clock::{Clock, StoppedClock};
    for db in backends().await {
        let calls = Calls::default();
        // Where the database's clock is: the job's first sighting (on that
        // clock) decides what it owes.
        let clock = Arc::new(StoppedClock::at(Utc::now()));
        let scheduler = Scheduler::builder()
            .database_url(&db.url)
            .catch_up(Duration::from_secs(3 * 24 * 3600))
            .clock(clock.clone())
            .job(calls.job("rollup", "0 0 * * *").period(Unit::Day))
            .build()
            .await
            .unwrap();
        let ran = |runs: &[scheduler::PeriodRun]| -> Vec<String> {
            runs.iter()
                .filter(|r| r.outcome == PeriodOutcome::Succeeded)
                .map(|r| r.period_key.clone())
                .collect()
        };
        let today = format!("rollup:{}", clock.now().format("%Y-%m-%d"));
        let first = scheduler.run_due(None).await.unwrap();
        assert_eq!(ran(&first), std::slice::from_ref(&today), "{first:?}");
        let again = scheduler.run_due(Some("rollup")).await.unwrap();
        assert!(ran(&again).is_empty(), "{again:?}");
        clock.advance(TimeDelta::days(1));
        let tomorrow = format!("rollup:{}", clock.now().format("%Y-%m-%d"));
        let next = scheduler.run_due(None).await.unwrap();
        assert_eq!(ran(&next), std::slice::from_ref(&tomorrow), "{next:?}");
        clock.advance(TimeDelta::days(2));
        let caught_up = scheduler.run_due(None).await.unwrap();
        assert_eq!(ran(&caught_up).len(), 2, "{caught_up:?}");
        let keys = calls.keys();
        let unique: HashSet<&String> = keys.iter().collect();
        assert_eq!(unique.len(), 4, "{keys:?}");
        assert_eq!(&keys[..2], [today, tomorrow]);
    }
}
