//! The HTTP API's read and replay rates, against a real `serve --listen`
//! on each backend: `GET /v1/jobs/{job}/periods` over a 1,000-period range
//! (500 of them with a claim row), and a replayed `POST` (the same
//! Idempotency-Key and body). Four client threads, keep-alive off as the
//! server has it.
//!
//! `cargo bench --bench api`

mod support;
use support::{free_port, postgres_database, wait_ready};

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SECRET: &str = "bench-secret-0123456789abcdef";
const CLIENTS: usize = 4;
const SECONDS: u64 = 5;

fn jobs_toml() -> String {
    format!(
        "[api]\ntokens = [{{ name = \"bench\", secret = \"{SECRET}\", allow = [\"read\", \"trigger\"] }}]\n\n\
         [[job]]\nname = \"daily\"\nschedule = \"0 3 * * *\"\nperiod = \"day\"\nconcurrency = 100\n\
         sql = {{ statement = \"SELECT 1\" }}\n"
    )
}

fn client() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(60))
        .build()
        .expect("client")
}

/// Requests per second of `request`, from [`CLIENTS`] threads.
fn rate(request: impl Fn(&reqwest::blocking::Client) -> bool + Sync) -> (f64, usize) {
    let started = Instant::now();
    let until = started + Duration::from_secs(SECONDS);
    let (done, failed) = std::thread::scope(|s| {
        let handles: Vec<_> = (0..CLIENTS)
            .map(|_| {
                s.spawn(|| {
                    let client = client();
                    let (mut done, mut failed) = (0usize, 0usize);
                    while Instant::now() < until {
                        if request(&client) {
                            done += 1;
                        } else {
                            failed += 1;
                        }
                    }
                    (done, failed)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_default())
            .fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
    });
    (done as f64 / started.elapsed().as_secs_f64(), failed)
}

fn bench(backend: &str, url: &str) {
    let dir = tempfile::tempdir().expect("temp dir");
    std::fs::write(dir.path().join("jobs.toml"), jobs_toml()).expect("jobs.toml");
    let binary = env!("CARGO_BIN_EXE_scheduler");
    let backfill = Command::new(binary)
        .args([
            "--database-url",
            url,
            "run",
            "daily",
            "--from",
            "2024-01-01",
            "--to",
            "2025-05-14",
        ])
        .current_dir(dir.path())
        .env("SCHEDULER_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .expect("backfill");
    assert!(backfill.success(), "the backfill failed");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut serve: Child = Command::new(binary)
        .args(["--database-url", url, "serve", "--listen", &addr])
        .env("SCHEDULER_LOG", "warn")
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("serve");
    let base = format!("http://{addr}");
    wait_ready(&base);
    let range = format!("{base}/v1/jobs/daily/periods?from=2024-01-01&to=2026-09-26");
    let probe = client()
        .get(&range)
        .bearer_auth(SECRET)
        .send()
        .and_then(|r| r.json::<serde_json::Value>())
        .expect("range");
    let periods = probe["periods"].as_array().map_or(0, Vec::len);
    let (reads, read_failures) = rate(|c| {
        c.get(&range)
            .bearer_auth(SECRET)
            .send()
            .is_ok_and(|r| r.status().is_success() && r.bytes().is_ok())
    });
    let post = format!("{base}/v1/jobs/daily/runs?wait=60");
    let body = serde_json::json!({"period": "2024-01-01"});
    let first = client()
        .post(&post)
        .bearer_auth(SECRET)
        .header("Idempotency-Key", "bench-replay")
        .json(&body)
        .send()
        .expect("first POST");
    assert!(
        first.status().is_success(),
        "first POST: {}",
        first.status()
    );
    let (replays, replay_failures) = rate(|c| {
        c.post(&post)
            .bearer_auth(SECRET)
            .header("Idempotency-Key", "bench-replay")
            .json(&body)
            .send()
            .is_ok_and(|r| r.headers().contains_key("idempotent-replayed"))
    });
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(serve.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    );
    let _ = serve.wait();
    println!(
        "{backend}: GET periods over {periods} periods: {reads:.0} requests/s ({read_failures} failed); replayed POST: {replays:.0} requests/s ({replay_failures} failed); {CLIENTS} clients, {SECONDS} s each"
    );
}

fn main() {
    // `cargo test --all-targets` runs bench binaries without `--bench`.
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let sqlite = format!("sqlite://{}", dir.path().join("bench.db").display());
    bench("SQLite", &sqlite);
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    match runtime.block_on(postgres_database("scheduler_bench_api")) {
        Some(url) => bench("PostgreSQL", &url),
        None => println!("no PostgreSQL server: skipping it"),
    }
}
