//! Figures for the pure core and startup: fire times per second, labels per
//! second, and the startup time and peak RSS of `scheduler check` on a
//! jobs.toml of 10,000 jobs. Run with `cargo bench --bench core`.

use std::hint::black_box;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

use chrono::{DateTime, Utc};
use nix::sys::resource::{UsageWho, getrusage};
use scheduler::config::Config;

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().to_utc()
}

fn job(body: &str) -> scheduler::config::Job {
    let text = format!("[[job]]\nname = \"b\"\ncommand = [\"true\"]\n{body}\n");
    let job = Config::parse(Path::new("bench.toml"), &text, &|_| None)
        .unwrap()
        .jobs
        .remove(0);
    std::sync::Arc::unwrap_or_clone(job)
}

fn fires_per_second(zone: &str) {
    let job = job(&format!(
        "schedule = \"* * * * *\"\ntimezone = \"{zone}\"\nperiod = \"minute\""
    ));
    let started = Instant::now();
    let count = job
        .schedule
        .fires_between(at("2026-01-01T00:00:00Z"), at("2027-01-01T00:00:00Z"))
        .count();
    let secs = started.elapsed().as_secs_f64();
    println!(
        "fires, every-minute job over 2026 in {zone}: {count} in {secs:.3}s = {:.0} fires/s",
        count as f64 / secs
    );
}

fn labels_per_second(unit: &str) {
    let job = job(&format!(
        "schedule = \"* * * * *\"\ntimezone = \"Europe/Berlin\"\nperiod = \"{unit}\""
    ));
    let fires: Vec<_> = job
        .schedule
        .fires_between(at("2026-03-01T00:00:00Z"), at("2026-04-01T00:00:00Z"))
        .collect();
    let started = Instant::now();
    for fire in &fires {
        black_box(job.period.period_of(&job.schedule, *fire));
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "labels, {unit} periods in Europe/Berlin: {} in {secs:.3}s = {:.0} labels/s",
        fires.len(),
        fires.len() as f64 / secs
    );
}

fn startup_with_10_000_jobs() {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::from("[scheduler]\ntimezone = \"Europe/Berlin\"\n");
    for i in 0..10_000 {
        let unit = ["minute", "hour", "day", "month"][i % 4];
        text.push_str(&format!(
            "\n[[job]]\nname = \"job-{i}\"\nschedule = \"{} {} * * *\"\nperiod = \"{unit}\"\ncommand = [\"/bin/true\", \"{{period}}\"]\n",
            i % 60,
            i % 24
        ));
    }
    let path = dir.path().join("jobs.toml");
    std::fs::write(&path, text).unwrap();
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_scheduler"))
        .args(["--config", path.to_str().unwrap(), "check"])
        .output()
        .unwrap();
    let secs = started.elapsed().as_secs_f64();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rss_kib = getrusage(UsageWho::RUSAGE_CHILDREN).unwrap().max_rss();
    println!(
        "startup, `scheduler check` on 10,000 jobs (1,440 distinct patterns): {:.0} ms, peak RSS {:.1} MiB",
        secs * 1000.0,
        rss_kib as f64 / 1024.0
    );
}

fn main() {
    // `cargo test --all-targets` runs bench binaries too; only measure under `cargo bench`.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    fires_per_second("UTC");
    fires_per_second("Europe/Berlin");
    for unit in ["minute", "day", "week", "month", "fire"] {
        labels_per_second(unit);
    }
    startup_with_10_000_jobs();
}
