//! The burst: N jobs that all fire every minute, an in-database `sql`
//! insert each, on several `serve` replicas sharing one database. Prints,
//! per minute, the lateness of each statement's start after its fire
//! (p50 / p99 / max), the periods run, doubled and missed, and per replica
//! its peak RSS and CPU.
//!
//! `cargo bench --bench burst` runs 1,000 and 10,000 jobs on 3 PostgreSQL
//! replicas and 1,000 on 2 SQLite processes, 3 minutes each (about 12
//! minutes). `BURST=pg:1000:3,sqlite:1000:2` picks the runs (backend, jobs,
//! replicas); `BURST_MINUTES` the minutes; `BURST_LISTEN=1` starts each
//! replica with `--listen` (`/metrics` recorded, nobody scraping), as the
//! `Dockerfile` does; `BURST_MAX_RUNNING=N` sets `max_running` (default 16);
//! `BURST_JITTER=30s` gives every job that `jitter` (lateness is then
//! counted from each job's own delayed fire).
//!
//! `graphile` as the backend (`BURST=graphile:1000:3,pg:1000:3`) runs the
//! same items under graphile-worker 0.17.3, side by side in one run: each
//! item a crontab line of its own, the task the same insert on the same
//! PostgreSQL server, `concurrency` the scheduler's `max_running`. Its npm
//! package is installed by the bench itself, once, under cargo's
//! `CARGO_TARGET_TMPDIR` (Node.js and the npm registry needed; without
//! them the run is skipped and says why). Both connect without TLS
//! (`sslmode=disable`), as node-postgres does unless asked.

mod support;
use support::postgres_database;

use std::collections::HashMap;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Timelike, Utc};
use sqlx::Connection;

struct Setup {
    backend: String,
    jobs: usize,
    replicas: usize,
    minutes: u32,
}

/// What a replica used: peak RSS, the peak of its whole life (VmHWM),
/// and CPU seconds.
#[derive(Default, Clone, Copy)]
struct Usage {
    rss_kib: u64,
    hwm_kib: u64,
    cpu_ticks: u64,
}

/// The insert each item runs: its key, its fire, the statement's start.
const PG_INSERT: &str = "INSERT INTO burst_runs VALUES ($1, $2::timestamptz, clock_timestamp())";

/// graphile-worker's version, as the issue's figures had it.
const GRAPHILE: &str = "graphile-worker@0.17.3";

fn max_running() -> usize {
    std::env::var("BURST_MAX_RUNNING")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(16)
}

fn jobs_toml(jobs: usize, backend: &str) -> String {
    let statement = if backend == "pg" {
        PG_INSERT
    } else {
        "INSERT INTO burst_runs VALUES ($1, $2, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))"
    };
    let mut text = String::new();
    if std::env::var_os("BURST_MAX_RUNNING").is_some() {
        text.push_str(&format!("[scheduler]\nmax_running = {}\n\n", max_running()));
    }
    let jitter = std::env::var("BURST_JITTER")
        .map(|j| format!("jitter = \"{j}\"\n"))
        .unwrap_or_default();
    for i in 0..jobs {
        text.push_str(&format!(
            "[[job]]\nname = \"job-{i}\"\nschedule = \"* * * * *\"\nperiod = \"minute\"\n{jitter}\
             sql = {{ statement = \"{statement}\", params = [\"{{period_key}}\", \"{{scheduled_at}}\"] }}\n\n"
        ));
    }
    text
}

fn usage(pid: u32) -> Usage {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let cpu_ticks = stat
        .rsplit_once(") ")
        .map(|(_, rest)| {
            let f: Vec<&str> = rest.split_whitespace().collect();
            f.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
                + f.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0)
        })
        .unwrap_or(0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let kib = |field: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    Usage {
        rss_kib: kib("VmRSS:"),
        hwm_kib: kib("VmHWM:"),
        cpu_ticks,
    }
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// (period key, fire, statement start) of every run, by reading the table.
async fn runs(url: &str, backend: &str) -> Vec<(String, DateTime<Utc>, DateTime<Utc>)> {
    if backend != "sqlite" {
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query_as("SELECT period_key, scheduled_at, started_at FROM burst_runs")
            .fetch_all(&mut conn)
            .await
            .unwrap()
    } else {
        let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
        let rows: Vec<(String, String, String)> =
            sqlx::query_as("SELECT period_key, scheduled_at, started_at FROM burst_runs")
                .fetch_all(&mut conn)
                .await
                .unwrap();
        rows.into_iter()
            .map(|(k, f, s)| (k, parse(&f), parse(&s)))
            .collect()
    }
}

fn parse(text: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.to_utc())
        .unwrap_or_default()
}

async fn create_table(url: &str, backend: &str) {
    if backend != "sqlite" {
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query("CREATE TABLE burst_runs (period_key TEXT, scheduled_at TIMESTAMPTZ, started_at TIMESTAMPTZ)")
            .execute(&mut conn)
            .await
            .unwrap();
    } else {
        let options: sqlx::sqlite::SqliteConnectOptions = url.parse().unwrap();
        let mut conn = sqlx::SqliteConnection::connect_with(&options.create_if_missing(true))
            .await
            .unwrap();
        sqlx::query(
            "CREATE TABLE burst_runs (period_key TEXT, scheduled_at TEXT, started_at TEXT)",
        )
        .execute(&mut conn)
        .await
        .unwrap();
    }
}

/// The replicas' commands: `serve` with the items as `jobs.toml`, or
/// graphile-worker with them as a crontab; `None` (said why) when the
/// replicas cannot start here.
fn replicas(setup: &Setup, url: &str, dir: &Path) -> Option<Vec<Command>> {
    if setup.backend == "graphile" {
        return graphile(setup, url, dir);
    }
    std::fs::write(dir.join("jobs.toml"), jobs_toml(setup.jobs, &setup.backend)).unwrap();
    let listen: Vec<&str> = match std::env::var_os("BURST_LISTEN") {
        Some(_) => vec!["--listen", "127.0.0.1:0"],
        None => Vec::new(),
    };
    let serve = |_| {
        let mut command = Command::new(env!("CARGO_BIN_EXE_scheduler"));
        command
            .args(["--database-url", url, "serve"])
            .args(listen.iter())
            .env("SCHEDULER_LOG", "warn")
            .current_dir(dir);
        command
    };
    Some((0..setup.replicas).map(serve).collect())
}

/// graphile-worker's runner: the items as crontab lines, each running
/// [`PG_INSERT`] through the worker's own pool.
const WORKER_JS: &str = r#"const { run, runMigrations, Logger } = require("graphile-worker");
const connectionString = process.env.DATABASE_URL;
const concurrency = Number(process.env.BURST_CONCURRENCY);
const logger = new Logger(() => (level, message) => {
  if (level === "error") console.error(message);
});
async function main() {
  if (process.argv[2] === "migrate") {
    await runMigrations({ connectionString, logger });
    return;
  }
  const runner = await run({
    connectionString,
    concurrency,
    maxPoolSize: Math.max(concurrency, 10),
    crontabFile: process.env.BURST_CRONTAB,
    logger,
    taskList: {
      burst: async (payload, helpers) => {
        await helpers.query(process.env.BURST_INSERT, [payload.key, payload._cron.ts]);
      },
    },
  });
  await runner.promise;
}
main().catch((e) => {
  console.error(e);
  process.exit(1);
});
"#;

/// graphile-worker's replicas, its package installed on first use and its
/// schema migrated before they start (three at once would race for it).
fn graphile(setup: &Setup, url: &str, dir: &Path) -> Option<Vec<Command>> {
    let home = Path::new(env!("CARGO_TARGET_TMPDIR")).join(GRAPHILE.replace('@', "-"));
    if !home
        .join("node_modules/graphile-worker/package.json")
        .exists()
    {
        let installed = Command::new("npm")
            .args(["install", "--no-audit", "--no-fund", "--prefix"])
            .arg(&home)
            .arg(GRAPHILE)
            .stdout(Stdio::null())
            .status();
        if !installed.is_ok_and(|s| s.success()) {
            println!(
                "graphile-worker: `npm install {GRAPHILE}` failed (Node.js and the npm registry are needed): skipping"
            );
            return None;
        }
    }
    std::fs::write(home.join("worker.js"), WORKER_JS).unwrap();
    let crontab: String = (0..setup.jobs)
        .map(|i| format!("* * * * * burst ?id=job-{i} {{\"key\":\"job-{i}\"}}\n"))
        .collect();
    std::fs::write(dir.join("crontab"), crontab).unwrap();
    let worker = |_| {
        let mut command = Command::new("node");
        command
            .arg(home.join("worker.js"))
            .env("DATABASE_URL", url)
            .env("BURST_CONCURRENCY", max_running().to_string())
            .env("BURST_CRONTAB", dir.join("crontab"))
            .env("BURST_INSERT", PG_INSERT)
            .current_dir(dir);
        command
    };
    let migrated = worker(()).arg("migrate").status();
    if !migrated.is_ok_and(|s| s.success()) {
        println!("graphile-worker: its migration failed: skipping");
        return None;
    }
    Some((0..setup.replicas).map(|_| worker(())).collect())
}

fn burst(setup: &Setup, url: &str) {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(create_table(url, &setup.backend));
    let dir = tempfile::tempdir().unwrap();
    let Some(commands) = replicas(setup, url, dir.path()) else {
        return;
    };
    // Start 20 s before a minute, so that every replica is up for its first fire.
    let now = Utc::now();
    let to_minute = 60 - now.second() as u64;
    if to_minute < 20 {
        std::thread::sleep(Duration::from_secs(to_minute + 1));
    }
    let mut replicas: Vec<Child> = commands
        .into_iter()
        .map(|mut command| {
            command
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let start = Utc::now();
    let first = start
        .with_second(0)
        .and_then(|t| t.with_nanosecond(0))
        .unwrap()
        + chrono::Duration::minutes(1);
    let last = first + chrono::Duration::minutes(i64::from(setup.minutes) - 1);
    let end = last + chrono::Duration::seconds(58);
    let mut peak = vec![Usage::default(); replicas.len()];
    let mut cpu_at_first = vec![0u64; replicas.len()];
    let mut counted = false;
    let began = Instant::now();
    while Utc::now() < end {
        // Start-up (parsing jobs.toml) is not the burst: RSS counts from
        // the first minute on.
        let bursting = Utc::now() >= first;
        for (i, r) in replicas.iter().enumerate() {
            let u = usage(r.id());
            if bursting {
                peak[i].rss_kib = peak[i].rss_kib.max(u.rss_kib);
            }
            peak[i].hwm_kib = peak[i].hwm_kib.max(u.hwm_kib);
            peak[i].cpu_ticks = u.cpu_ticks;
        }
        if !counted && Utc::now() >= first {
            counted = true;
            cpu_at_first = peak.iter().map(|u| u.cpu_ticks).collect();
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let took = began.elapsed();
    for r in &mut replicas {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(r.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    for mut r in replicas {
        let _ = r.wait();
    }
    let rows = runtime.block_on(runs(url, &setup.backend));
    let mut by_minute: HashMap<DateTime<Utc>, Vec<(String, f64)>> = HashMap::new();
    for (key, fire, started) in rows {
        let ms = (started - fire).num_microseconds().unwrap_or(0) as f64 / 1000.0;
        // A jittered fire falls within its minute.
        let minute = fire.with_second(0).and_then(|f| f.with_nanosecond(0));
        by_minute
            .entry(minute.unwrap_or(fire))
            .or_default()
            .push((key, ms));
    }
    println!(
        "{} jobs firing every minute, an sql insert each, {} replicas on {} ({:.0} s):",
        setup.jobs,
        setup.replicas,
        match setup.backend.as_str() {
            "pg" => "PostgreSQL",
            "graphile" => "PostgreSQL, graphile-worker",
            _ => "SQLite",
        },
        took.as_secs_f64()
    );
    let mut minute = first;
    while minute <= last {
        let runs = by_minute.remove(&minute).unwrap_or_default();
        let mut keys: Vec<&str> = runs.iter().map(|(k, _)| k.as_str()).collect();
        keys.sort_unstable();
        keys.dedup();
        let mut ms: Vec<f64> = runs.iter().map(|(_, ms)| *ms).collect();
        ms.sort_by(f64::total_cmp);
        println!(
            "  {}: {} run, {} doubled, {} missed; lateness p50 {:.1} ms, p99 {:.1} ms, max {:.1} ms",
            minute.format("%H:%M"),
            runs.len(),
            runs.len() - keys.len(),
            setup.jobs - keys.len(),
            percentile(&ms, 0.5),
            percentile(&ms, 0.99),
            ms.last().copied().unwrap_or(f64::NAN),
        );
        minute += chrono::Duration::minutes(1);
    }
    let minutes = f64::from(setup.minutes);
    for (i, u) in peak.iter().enumerate() {
        println!(
            "  replica {}: peak RSS during the bursts {:.1} MiB, over its whole life (VmHWM) {:.1} MiB, CPU {:.2} s per minute",
            i + 1,
            u.rss_kib as f64 / 1024.0,
            u.hwm_kib as f64 / 1024.0,
            (u.cpu_ticks - cpu_at_first[i]) as f64 / 100.0 / minutes
        );
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let minutes: u32 = std::env::var("BURST_MINUTES")
        .ok()
        .and_then(|m| m.parse().ok())
        .unwrap_or(3);
    let plan =
        std::env::var("BURST").unwrap_or_else(|_| "pg:1000:3,pg:10000:3,sqlite:1000:2".into());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for (n, item) in plan.split(',').enumerate() {
        let parts: Vec<&str> = item.split(':').collect();
        let [backend, jobs, replicas] = parts[..] else {
            panic!("BURST: expected backend:jobs:replicas, got {item}");
        };
        assert!(
            ["pg", "sqlite", "graphile"].contains(&backend),
            "BURST: the backend is pg, sqlite or graphile, not {backend}"
        );
        let setup = Setup {
            backend: backend.to_owned(),
            jobs: jobs.parse().unwrap(),
            replicas: replicas.parse().unwrap(),
            minutes,
        };
        let dir = tempfile::tempdir().unwrap();
        let url = if backend != "sqlite" {
            match runtime.block_on(postgres_database(&format!("scheduler_bench_burst_{n}"))) {
                // Both sides over plain connections: node-postgres does
                // not use TLS unless asked, sqlx prefers it.
                Some(url) => {
                    let join = if url.contains('?') { '&' } else { '?' };
                    format!("{url}{join}sslmode=disable")
                }
                None => {
                    println!("no PostgreSQL server: skipping {item}");
                    continue;
                }
            }
        } else {
            format!("sqlite://{}", dir.path().join("burst.db").display())
        };
        burst(&setup, &url);
    }
}
