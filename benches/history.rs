//! Figures for a large history on PostgreSQL: 1,000,000 claims and
//! 3,000,000 attempts (100 every-minute jobs × 10,000 periods, each
//! period's third attempt the one that succeeded), against an empty table:
//! - claim + complete: each claim's time, p50 and p99, on both;
//! - `status JOB --from --to` of one job's 10,000 periods, and one page of
//!   the console's grid (`GET /v1/jobs/{job}/periods?…&limit=1000`);
//! - `prune` of 900,000 claims (90 of the jobs have a `keep`) beside a
//!   `serve` firing an every-second job: how late its claims start before
//!   and while the prune runs;
//! - a backfill of 300,000 periods into a fresh table with autovacuum off,
//!   in periods per second for each 50,000.
//!
//! Run with `cargo bench --bench history` (about 8 minutes).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, TimeDelta, Utc};
use scheduler::period::Period;
use scheduler::store::{Claim, ClaimRequest, Finish, Store, Trigger};

mod support;

const JOBS: usize = 100;
const PERIODS: i64 = 10_000;
/// The jobs a prune thins: 90 of 100, 900,000 claims.
const PRUNED_JOBS: usize = 90;
const PROBES: usize = 2_000;
const SECRET: &str = "history-bench-secret";

fn binary() -> &'static str {
    env!("CARGO_BIN_EXE_scheduler")
}

/// The first period of every job: 2025-01-01T00:00 UTC, a minute each.
fn first() -> DateTime<Utc> {
    "2025-01-01T00:00:00Z".parse().expect("a time")
}

fn label(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M").to_string()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

/// The jobs' `jobs.toml`: `h000` … `h099`, every minute, a no-op `sql`
/// statement; the first `keep` of them with `keep = "1s"`; `extra` after.
fn jobs_toml(keep: usize, extra: &str) -> String {
    let mut toml = format!(
        "[scheduler]\ncatch_up = \"1s\"\n\n[api]\ntokens = [{{ name = \"bench\", secret = \"{SECRET}\", allow = [\"read\"] }}]\n\n{extra}"
    );
    for j in 0..JOBS {
        let keep = if j < keep { "keep = \"1s\"\n" } else { "" };
        toml.push_str(&format!(
            "\n[[job]]\nname = \"h{j:03}\"\nschedule = \"* * * * *\"\nperiod = \"minute\"\n{keep}sql = {{ statement = \"SELECT 1\" }}\n"
        ));
    }
    toml
}

/// The history: every job's 10,000 periods succeeded at their third
/// attempt, a year and more ago; then the statistics, as autovacuum would
/// leave them.
async fn fill(url: &str) {
    let store = Store::connect(url).await.expect("a store");
    store.migrate().await.expect("migrated");
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(url)
        .await
        .expect("a connection");
    let started = Instant::now();
    for statement in [
        format!(
            "INSERT INTO scheduler_claims (period_key, job, period, period_start, period_end,
                 scheduled_at, state, attempt, failures, trigger, owner, started_at, finished_at)
             SELECT j.name || ':' || to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI'),
                    j.name, to_char(t AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI'), t,
                    t + interval '1 minute', t, 'succeeded', 3, 2, 'schedule', 'bench', t,
                    t + interval '1 second'
               FROM (SELECT 'h' || lpad(n::text, 3, '0') AS name
                       FROM generate_series(0, {}) n) j,
                    generate_series(timestamptz '2025-01-01 00:00:00+00',
                                    timestamptz '2025-01-01 00:00:00+00' + interval '{} minutes',
                                    interval '1 minute') t",
            JOBS - 1,
            PERIODS - 1
        ),
        "INSERT INTO scheduler_attempts (period_key, attempt, job, trigger, owner, scheduled_at,
             started_at, finished_at, outcome, exit_code)
         SELECT c.period_key, a, c.job, CASE WHEN a = 1 THEN 'schedule' ELSE 'retry' END,
                'bench', c.scheduled_at, c.started_at, c.finished_at,
                CASE WHEN a = 3 THEN 'succeeded' ELSE 'failed' END,
                CASE WHEN a = 3 THEN 0 ELSE 1 END
           FROM scheduler_claims c, generate_series(1, 3) a"
            .to_owned(),
        "ANALYZE scheduler_claims, scheduler_attempts".to_owned(),
    ] {
        sqlx::query(&statement)
            .execute(&mut conn)
            .await
            .expect("the history");
    }
    println!(
        "history of {} claims and {} attempts written in {:.0} s",
        JOBS as i64 * PERIODS,
        3 * JOBS as i64 * PERIODS,
        started.elapsed().as_secs_f64()
    );
}

/// Claims and completes `PROBES` new periods one after another; each
/// claim's time in ms, sorted.
async fn claim_times(url: &str) -> Vec<f64> {
    let store = Store::connect(url).await.expect("a store");
    store.migrate().await.expect("migrated");
    let mut ms = Vec::with_capacity(PROBES);
    for i in 0..PROBES {
        let start = Utc::now();
        let period = Period {
            label: format!("p{i}"),
            start,
            end: start,
        };
        let request = ClaimRequest {
            job: "probe",
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
        let asked = Instant::now();
        let Claim::Won(lease) = store.claim(&request).await.expect("a claim") else {
            panic!("not won")
        };
        ms.push(asked.elapsed().as_secs_f64() * 1000.0);
        let finish = Finish {
            succeeded: true,
            ..Finish::default()
        };
        assert!(store.finish(&lease, &finish).await.expect("finished"));
    }
    ms.sort_by(f64::total_cmp);
    ms
}

/// The median of `rounds` wall times of `what`, in ms.
fn median_ms(rounds: usize, mut what: impl FnMut()) -> f64 {
    let mut ms: Vec<f64> = (0..rounds)
        .map(|_| {
            let started = Instant::now();
            what();
            started.elapsed().as_secs_f64() * 1000.0
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    ms[rounds / 2]
}

/// `scheduler ARGS` in `dir` on `url`, to its end; its stdout.
fn scheduler(dir: &std::path::Path, url: &str, args: &[&str]) -> String {
    let out = Command::new(binary())
        .args(["--database-url", url])
        .args(args)
        .current_dir(dir)
        .env("SCHEDULER_LOG", "warn")
        .stderr(Stdio::inherit())
        .output()
        .expect("scheduler");
    assert!(out.status.success(), "scheduler {args:?} failed");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `serve --listen` in `dir` on `url`, its JSON log in `dir/serve.log`;
/// stopped with SIGTERM when dropped.
struct Serve(Child);

impl Serve {
    fn start(dir: &std::path::Path, url: &str, addr: &str) -> Serve {
        let log = std::fs::File::create(dir.join("serve.log")).expect("a log");
        let child = Command::new(binary())
            .args(["--log-format", "json", "--database-url", url])
            .args(["serve", "--listen", addr])
            .current_dir(dir)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("serve");
        support::wait_ready(&format!("http://{addr}"));
        Serve(child)
    }
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.0.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let _ = self.0.wait();
    }
}

/// The `lateness_ms` of each scheduled claim `dir/serve.log` holds, with
/// when it was logged.
fn lateness(dir: &std::path::Path) -> Vec<(DateTime<Utc>, f64)> {
    let log = std::fs::File::open(dir.join("serve.log")).expect("the log");
    BufReader::new(log)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(&l).ok())
        .filter(|l| l["fields"]["message"] == "claim won" && l["fields"]["trigger"] == "schedule")
        .filter_map(|l| {
            let at = l["timestamp"].as_str()?.parse().ok()?;
            Some((at, l["fields"]["lateness_ms"].as_f64()?))
        })
        .collect()
}

fn say_lateness(what: &str, mut ms: Vec<f64>) {
    ms.sort_by(f64::total_cmp);
    println!(
        "  {what}: {} fires, lateness p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        ms.len(),
        percentile(&ms, 0.5),
        percentile(&ms, 0.99),
        ms.last().copied().unwrap_or(f64::NAN)
    );
}

/// Views of one job's 10,000 periods over the whole history.
fn views(dir: &std::path::Path, url: &str) {
    std::fs::write(dir.join("jobs.toml"), jobs_toml(0, "")).expect("jobs.toml");
    let (from, to) = (
        label(first()),
        label(first() + TimeDelta::minutes(PERIODS - 1)),
    );
    let status = median_ms(5, || {
        let out = scheduler(dir, url, &["status", "h000", "--from", &from, "--to", &to]);
        assert!(out.contains("succeeded"), "{out}");
    });
    println!("  `status h000 --from --to` of 10,000 periods: median {status:.0} ms of 5");
    let addr = format!("127.0.0.1:{}", support::free_port());
    let serve = Serve::start(dir, url, &addr);
    let page = format!("http://{addr}/v1/jobs/h000/periods?from={from}&to={to}&limit=1000");
    let http = reqwest::blocking::Client::new();
    let grid = median_ms(21, || {
        let body = http
            .get(&page)
            .bearer_auth(SECRET)
            .send()
            .and_then(|r| r.error_for_status())
            .and_then(|r| r.text())
            .expect("a page");
        assert!(body.contains("succeeded"), "{body}");
    });
    println!("  the console's grid, one page of 1,000 periods: median {grid:.1} ms of 21");
    drop(serve);
}

/// `prune` of 900,000 claims beside a `serve` firing an every-second job.
fn prune_beside_a_fire(dir: &std::path::Path, url: &str) {
    let tick = "[[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\nsql = { statement = \"SELECT 1\" }\n";
    let serving = tempfile::tempdir().expect("a dir");
    std::fs::write(
        serving.path().join("jobs.toml"),
        format!("[scheduler]\n\n{tick}"),
    )
    .expect("jobs.toml");
    let addr = format!("127.0.0.1:{}", support::free_port());
    let serve = Serve::start(serving.path(), url, &addr);
    std::thread::sleep(Duration::from_secs(30));
    std::fs::write(dir.join("jobs.toml"), jobs_toml(PRUNED_JOBS, "")).expect("jobs.toml");
    let began = Utc::now();
    let started = Instant::now();
    let out = scheduler(dir, url, &["prune"]);
    let took = started.elapsed();
    let ended = Utc::now();
    std::thread::sleep(Duration::from_secs(2));
    drop(serve);
    let pruned: u64 = out
        .lines()
        .filter_map(|l| {
            l.split("pruned ")
                .nth(1)?
                .split(' ')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    println!(
        "  prune of {pruned} claims (and their attempts): {:.1} s",
        took.as_secs_f64()
    );
    let fires = lateness(serving.path());
    say_lateness(
        "an every-second job, the 25 s before the prune",
        fires
            .iter()
            .filter(|(at, _)| *at < began && *at > began - TimeDelta::seconds(25))
            .map(|(_, ms)| *ms)
            .collect(),
    );
    say_lateness(
        "the same while the prune ran",
        fires
            .iter()
            .filter(|(at, _)| *at >= began && *at <= ended)
            .map(|(_, ms)| *ms)
            .collect(),
    );
}

/// A backfill of 300,000 periods of a no-op `sql` job into a fresh table
/// with autovacuum off: periods per second for each 50,000.
async fn backfill_without_autovacuum() {
    const CHUNK: usize = 50_000;
    const ALL: i64 = 300_000;
    let Some(url) = support::postgres_database("scheduler_bench_history_backfill").await else {
        return;
    };
    let store = Store::connect(&url).await.expect("a store");
    store.migrate().await.expect("migrated");
    let mut conn = <sqlx::PgConnection as sqlx::Connection>::connect(&url)
        .await
        .expect("a connection");
    for table in ["scheduler_claims", "scheduler_attempts", "scheduler_output"] {
        sqlx::query(&format!(
            "ALTER TABLE {table} SET (autovacuum_enabled = false)"
        ))
        .execute(&mut conn)
        .await
        .expect("autovacuum off");
    }
    let dir = tempfile::tempdir().expect("a dir");
    std::fs::write(
        dir.path().join("jobs.toml"),
        "[[job]]\nname = \"fill\"\nschedule = \"* * * * *\"\nperiod = \"minute\"\nconcurrency = 100\nsql = { statement = \"SELECT 1\" }\n",
    )
    .expect("jobs.toml");
    let to = label(first() + TimeDelta::minutes(ALL - 1));
    let mut child = Command::new(binary())
        .args(["-q", "--database-url", &url, "run", "fill"])
        .args(["--from", &label(first()), "--to", &to])
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the backfill");
    let stdout = BufReader::new(child.stdout.take().expect("its stdout"));
    let mut done = 0;
    let mut since = Instant::now();
    let mut rates = Vec::new();
    for line in stdout.lines().map_while(Result::ok) {
        if line.contains("succeeded") {
            done += 1;
            if done % CHUNK == 0 {
                rates.push(format!(
                    "{:.0}",
                    CHUNK as f64 / since.elapsed().as_secs_f64()
                ));
                since = Instant::now();
            }
        }
    }
    assert!(
        child.wait().expect("its end").success(),
        "the backfill failed"
    );
    println!(
        "  backfill of {ALL} periods, autovacuum off, periods/s for each 50,000: {}",
        rates.join(", ")
    );
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let (Some(empty), Some(full)) = (
        support::postgres_database("scheduler_bench_history_empty").await,
        support::postgres_database("scheduler_bench_history_full").await,
    ) else {
        println!("no PostgreSQL: skipped");
        return;
    };
    fill(&full).await;
    println!("PostgreSQL (loopback):");
    let on_empty = claim_times(&empty).await;
    let on_full = claim_times(&full).await;
    println!(
        "  claim of a new period, {PROBES} one after another: empty table p50 {:.2} ms, p99 {:.2} ms; \
         1,000,000 claims p50 {:.2} ms, p99 {:.2} ms; p99 ratio {:.2}",
        percentile(&on_empty, 0.5),
        percentile(&on_empty, 0.99),
        percentile(&on_full, 0.5),
        percentile(&on_full, 0.99),
        percentile(&on_full, 0.99) / percentile(&on_empty, 0.99)
    );
    let dir = tempfile::tempdir().expect("a dir");
    views(dir.path(), &full);
    prune_beside_a_fire(dir.path(), &full);
    backfill_without_autovacuum().await;
}
