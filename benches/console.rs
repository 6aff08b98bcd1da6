//! The console's grid in a real headless Chromium: a job with 10,000 daily
//! periods (9,000 of them succeeded, the rest never claimed), shown as one
//! range. Measured in the browser, from the start of the page's load: when
//! the first page of cells (1,000 periods, one request) is painted, and
//! when all 10,000 are. Also what one page costs the server.
//!
//! `cargo bench --bench console` (needs Debian's `chromium` and
//! `chromium-driver`; without them it says so and stops)

#[allow(dead_code)]
#[path = "../tests/it/browser.rs"]
mod browser;
#[allow(dead_code)] // its PostgreSQL helpers: this bench runs on SQLite
mod support;
use support::{free_port, wait_ready};

use std::process::{Child, Command, Stdio};
use std::time::Instant;

use chrono::{Days, NaiveDate};

const SECRET: &str = "bench-secret-0123456789abcdef";
const PERIODS: u64 = 10_000;
const CLAIMED: u64 = 9_000;
const ROUNDS: usize = 5;

fn main() {
    // `cargo test --all-targets` runs bench binaries without `--bench`.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let first = NaiveDate::from_ymd_opt(1999, 1, 1).expect("a date");
    let last = first + Days::new(PERIODS - 1);
    let claimed = first + Days::new(CLAIMED - 1);
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(
        dir.path().join("jobs.toml"),
        format!(
            "[api]\ntokens = [{{ name = \"bench\", secret = \"{SECRET}\", allow = [\"read\"] }}]\n\n\
             [[job]]\nname = \"daily\"\nschedule = \"0 3 * * *\"\nperiod = \"day\"\n\
             sql = {{ statement = \"SELECT 1\" }}\n"
        ),
    )
    .expect("jobs.toml");
    let url = format!("sqlite://{}/bench.db", dir.path().display());
    let binary = env!("CARGO_BIN_EXE_scheduler");
    let started = Instant::now();
    let backfill = Command::new(binary)
        .args(["--database-url", &url, "run", "daily"])
        .args(["--from", &first.to_string(), "--to", &claimed.to_string()])
        .current_dir(dir.path())
        .env("SCHEDULER_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("backfill");
    assert!(backfill.success(), "the backfill failed");
    println!(
        "backfill of {CLAIMED} periods: {:.1} s",
        started.elapsed().as_secs_f64()
    );

    let addr = format!("127.0.0.1:{}", free_port());
    let serve = Serve(
        Command::new(binary)
            .args(["--database-url", &url, "serve", "--listen", &addr])
            .env("SCHEDULER_LOG", "warn")
            .current_dir(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("serve"),
    );
    let base = format!("http://{addr}");
    wait_ready(&base);
    let http = reqwest::blocking::Client::new();

    // One page, as the grid asks for it, timed at the client.
    let page = format!("{base}/v1/jobs/daily/periods?from={first}&to={last}&limit=1000");
    let mut times = Vec::new();
    for _ in 0..20 {
        let start = Instant::now();
        let body = http
            .get(&page)
            .bearer_auth(SECRET)
            .send()
            .and_then(|r| r.bytes())
            .expect("a page");
        times.push((start.elapsed().as_secs_f64() * 1000.0, body.len()));
    }
    times.sort_by(|a, b| a.0.total_cmp(&b.0));
    println!(
        "one page of 1,000 periods: median {:.1} ms, {} KiB",
        times[times.len() / 2].0,
        times[0].1 / 1024
    );

    let Some(browser) = browser::Browser::start(1280, 900) else {
        println!("no browser: the grid's paint is not measured");
        return;
    };
    browser.log_in(&base, SECRET);
    let grid = format!("{base}/#/job/daily?from={first}&to={last}");
    let mut painted = Vec::new();
    let mut complete = Vec::new();
    for _ in 0..ROUNDS {
        browser.goto("about:blank");
        browser.goto(&grid);
        browser.until("the whole grid", || {
            browser.eval("return performance.getEntriesByName('grid:complete').length")
                == serde_json::json!(1)
        });
        let marks = browser.eval(
            "return [performance.getEntriesByName('grid:painted')[0].startTime,\
                     performance.getEntriesByName('grid:complete')[0].startTime,\
                     document.querySelectorAll('#grid .cell').length]",
        );
        assert_eq!(marks[2], serde_json::json!(PERIODS), "cells shown");
        painted.push(marks[0].as_f64().unwrap_or(f64::NAN));
        complete.push(marks[1].as_f64().unwrap_or(f64::NAN));
    }
    painted.sort_by(f64::total_cmp);
    complete.sort_by(f64::total_cmp);
    println!(
        "grid of {PERIODS} periods, from the page's load: first page painted median {:.0} ms (max {:.0}); all {PERIODS} cells median {:.0} ms (max {:.0}); {ROUNDS} loads",
        painted[ROUNDS / 2],
        painted[ROUNDS - 1],
        complete[ROUNDS / 2],
        complete[ROUNDS - 1]
    );
    drop(browser);
    drop(serve);
}

/// `serve`, stopped when dropped.
struct Serve(Child);

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
