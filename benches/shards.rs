//! Figures for shards: a backfill of 1,000 periods × 16 shards against one
//! of 16,000 periods not split, in shard-periods (claims run) per second,
//! with the backfill's peak RSS; and a backfill four times as long, to
//! show that memory does not grow with the range. A no-op `sql` job that
//! may run 100 at once, on SQLite and, where a server answers, on
//! PostgreSQL. Run with `cargo bench --bench shards` (about a minute).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod support;

/// A backfill's speed and its process's peak RSS.
struct Backfill {
    per_second: f64,
    peak_mib: f64,
}

/// `scheduler run JOB --from FROM --to TO` with `shards` (1: not split);
/// the claims it ran over the time taken, and its peak RSS (VmHWM, read
/// until it exits).
fn backfill(url: &str, shards: u32, to: &str, claims: usize) -> Backfill {
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "[[job]]\nname = \"rollup\"\nschedule = \"* * * * *\"\nperiod = \"minute\"\nshards = {shards}\n\
         concurrency = 100\nsql = {{ statement = \"SELECT 1\" }}\n"
    );
    std::fs::write(dir.path().join("jobs.toml"), toml).unwrap();
    let started = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_scheduler"))
        .args(["-q", "--database-url", url, "run", "rollup"])
        .args(["--from", "2026-01-01T00:00", "--to", to])
        .current_dir(dir.path())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let status = format!("/proc/{}/status", child.id());
    let mut peak_kib = 0u64;
    let read = std::thread::spawn({
        let stdout = child.stdout.take().unwrap();
        move || std::io::read_to_string(stdout).unwrap_or_default()
    });
    while child.try_wait().unwrap().is_none() {
        if let Some(kib) = std::fs::read_to_string(&status).ok().and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        }) {
            peak_kib = peak_kib.max(kib);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let secs = started.elapsed().as_secs_f64();
    let out = read.join().unwrap();
    assert_eq!(out.matches("succeeded").count(), claims, "{out}");
    Backfill {
        per_second: claims as f64 / secs,
        peak_mib: peak_kib as f64 / 1024.0,
    }
}

/// The three backfills, each on a database of its own that `fresh` makes.
async fn compare<F, Fut>(fresh: F, what: &str)
where
    F: Fn(&'static str) -> Fut,
    Fut: std::future::Future<Output = Option<String>>,
{
    let (Some(plain), Some(split), Some(long)) = (
        fresh("scheduler_bench_shards_plain").await,
        fresh("scheduler_bench_shards_split").await,
        fresh("scheduler_bench_shards_long").await,
    ) else {
        println!("{what}: no database; skipped");
        return;
    };
    println!("{what}, a no-op sql job, concurrency 100:");
    // 16,000 minutes: 2026-01-01T00:00 to 2026-01-12T02:39.
    let plain = backfill(&plain, 1, "2026-01-12T02:39", 16_000);
    // 1,000 minutes × 16 shards: to 2026-01-01T16:39.
    let split = backfill(&split, 16, "2026-01-01T16:39", 16_000);
    // Four times as long: 4,000 minutes × 16 shards.
    let long = backfill(&long, 16, "2026-01-03T18:39", 64_000);
    println!(
        "  16,000 periods not split:     {:.0} claims/s, peak RSS {:.1} MiB",
        plain.per_second, plain.peak_mib
    );
    println!(
        "  1,000 periods × 16 shards:    {:.0} shard-periods/s, peak RSS {:.1} MiB; ratio to not split {:.2}",
        split.per_second,
        split.peak_mib,
        split.per_second / plain.per_second
    );
    println!(
        "  4,000 periods × 16 shards:    {:.0} shard-periods/s, peak RSS {:.1} MiB",
        long.per_second, long.peak_mib
    );
}

#[tokio::main]
async fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let sqlite = |name: &'static str| {
        let url = format!(
            "sqlite://{}",
            dir.path().join(format!("{name}.db")).display()
        );
        async move { Some(url) }
    };
    compare(sqlite, "SQLite").await;
    compare(support::postgres_database, "PostgreSQL (loopback)").await;
}
