//! Figures for notifications on SQLite: how long after its deadline a
//! `late` period reaches a receiver from a running replica (the goal: one
//! `scan_interval`), and how long after start-up the `late` periods of a
//! day with every replica down have all arrived (the goal: a minute). Run
//! with `cargo bench --bench notify` (about 2 minutes).

use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use sqlx::Connection;

/// What a receiver was sent: when it arrived, and the body.
type Got = Arc<Mutex<Vec<(DateTime<Utc>, serde_json::Value)>>>;

/// A receiver answering 200 to every notification, on a port of its own.
fn receiver(runtime: &tokio::runtime::Runtime) -> (String, Got) {
    let got: Got = Arc::default();
    let seen = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |body: String| async move {
            let body = serde_json::from_str(&body).unwrap_or_default();
            seen.lock().unwrap().push((Utc::now(), body));
        }),
    );
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    runtime.spawn(async move { axum::serve(listener, app).await });
    (url, got)
}

fn scheduler(dir: &std::path::Path, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_scheduler"));
    command
        .args(["--database-url", "sqlite://s.db"])
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    command
}

fn stop(mut child: Child) {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    child.wait().unwrap();
}

/// Milliseconds, sorted.
fn sorted(mut ms: Vec<f64>) -> Vec<f64> {
    ms.sort_by(f64::total_cmp);
    ms
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

/// A job failing every second, with retries left and a deadline of 2 s,
/// under the default `scan_interval` (5 s): each period's `late` arrives
/// this long after its deadline.
fn late_on_a_running_replica(runtime: &tokio::runtime::Runtime) {
    let dir = tempfile::tempdir().unwrap();
    let (url, got) = receiver(runtime);
    std::fs::write(
        dir.path().join("jobs.toml"),
        format!(
            "[[job]]\nname = \"flaky\"\nschedule = \"* * * * * *\"\ncommand = [\"false\"]\n\
             deadline = \"2s\"\nretry = {{ attempts = 2, backoff = \"1h\" }}\n\n\
             [[notify]]\nname = \"hook\"\nurl = \"{url}\"\nevents = [\"late\"]\n"
        ),
    )
    .unwrap();
    let serve = scheduler(dir.path(), &["serve"]).spawn().unwrap();
    std::thread::sleep(Duration::from_secs(45));
    stop(serve);
    let lag = sorted(
        got.lock()
            .unwrap()
            .iter()
            .filter_map(|(at, body)| {
                let deadline = body["deadline"].as_str()?.parse::<DateTime<Utc>>().ok()?;
                Some((*at - deadline).num_milliseconds() as f64)
            })
            .collect(),
    );
    println!(
        "late on a running replica (scan_interval 5 s): {} periods told, deadline → receiver p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms",
        lag.len(),
        percentile(&lag, 0.5),
        percentile(&lag, 0.99),
        percentile(&lag, 1.0)
    );
}

/// `jobs` every-minute jobs (deadline 5 minutes) first seen a day ago and
/// never run since: every replica was down. How long after `serve`
/// starts the last of their `late` arrives (the newest 100 of each).
fn late_after_a_day_down(runtime: &tokio::runtime::Runtime, jobs: usize) {
    let dir = tempfile::tempdir().unwrap();
    let (url, got) = receiver(runtime);
    let mut text = String::new();
    for i in 0..jobs {
        text.push_str(&format!(
            "[[job]]\nname = \"job-{i}\"\nschedule = \"* * * * *\"\ncommand = [\"true\"]\ndeadline = \"5m\"\n\n"
        ));
    }
    text.push_str(&format!(
        "[[notify]]\nname = \"hook\"\nurl = \"{url}\"\nevents = [\"late\"]\n"
    ));
    std::fs::write(dir.path().join("jobs.toml"), text).unwrap();
    // The database made, and the jobs recorded as first seen a day ago.
    assert!(
        scheduler(dir.path(), &["migrate"])
            .status()
            .unwrap()
            .success()
    );
    let db = format!("sqlite://{}", dir.path().join("s.db").display());
    runtime.block_on(async {
        let mut conn = sqlx::SqliteConnection::connect(&db).await.unwrap();
        let day_ago = (Utc::now() - chrono::TimeDelta::days(1)).timestamp_millis();
        for i in 0..jobs {
            sqlx::query("INSERT INTO scheduler_jobs (name, first_seen) VALUES ($1, $2)")
                .bind(format!("job-{i}"))
                .bind(day_ago)
                .execute(&mut conn)
                .await
                .unwrap();
        }
    });
    let expected = jobs * 100;
    let started = Instant::now();
    let serve = scheduler(dir.path(), &["serve"]).spawn().unwrap();
    while got.lock().unwrap().len() < expected && started.elapsed() < Duration::from_secs(300) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let all = started.elapsed();
    stop(serve);
    let got = got.lock().unwrap();
    let ids: std::collections::HashSet<&str> = got
        .iter()
        .filter_map(|(_, body)| body["id"].as_str())
        .collect();
    println!(
        "late after a day down: {jobs} every-minute jobs, {} late told ({} twice), {expected} of them within {:.1} s of start-up",
        ids.len(),
        got.len() - ids.len(),
        all.as_secs_f64()
    );
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let runtime = tokio::runtime::Runtime::new().unwrap();
    late_on_a_running_replica(&runtime);
    for jobs in [10, 100] {
        late_after_a_day_down(&runtime, jobs);
    }
}
