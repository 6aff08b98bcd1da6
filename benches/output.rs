//! Figures for issue 43: what a job printing 50 MB costs the scheduler
//! beside it, and what traces cost. Three `serve` processes on SQLite side
//! by side in one window, each with an every-second job: one alone, one
//! beside a job printing 50 MB (25 MB of lines, then 25 MB with no
//! newline), one exporting traces to a collector that takes them. Then a
//! backfill of `/bin/true` with traces off and on. Run with `cargo bench
//! --bench output` (about 2 minutes).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TICK: &str = "[[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\n";

/// Its latest fire is within `catch_up` when `serve` first sees it: it
/// runs once, at the start.
const PRINTER: &str = "[[job]]\nname = \"printer\"\nschedule = \"0 0 * * *\"\nperiod = \"day\"\n\
    shell = \"head -c 18750000 /dev/urandom | base64; head -c 25000000 /dev/zero\"\n";

fn scheduler(dir: &std::path::Path, args: &[&str], otel: Option<&str>) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_scheduler"));
    command
        .args(["--log-format", "json", "--database-url"])
        .arg(format!("sqlite://{}", dir.join("s.db").display()))
        .args(args)
        .current_dir(dir)
        .env_remove("OTEL_EXPORTER_OTLP_ENDPOINT")
        .stdout(Stdio::null());
    if let Some(endpoint) = otel {
        command
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
            .env("OTEL_BSP_SCHEDULE_DELAY", "1000");
    }
    command
}

fn serve(dir: &std::path::Path, jobs: &str, otel: Option<&str>) -> Child {
    std::fs::write(dir.join("jobs.toml"), jobs).unwrap();
    let log = std::fs::File::create(dir.join("serve.log")).unwrap();
    scheduler(dir, &["serve"], otel)
        .stderr(log)
        .spawn()
        .unwrap()
}

/// Stops `child`; the JSON lines of its log.
fn stop(mut child: Child, dir: &std::path::Path) -> Vec<serde_json::Value> {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    child.wait().unwrap();
    let log = std::fs::File::open(dir.join("serve.log")).unwrap();
    BufReader::new(log)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect()
}

/// The peak resident set of `pid`, in MiB.
fn peak_rss_mib(pid: u32) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        .unwrap_or(0.0)
        / 1024.0
}

fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let Some((_, rest)) = stat.rsplit_once(") ") else {
        return 0.0;
    };
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

/// The tick's scheduled fires' lateness, sorted (ms).
fn lateness(logs: &[serde_json::Value]) -> Vec<f64> {
    let mut ms: Vec<f64> = logs
        .iter()
        .filter(|l| l["fields"]["message"] == "claim won" && l["fields"]["job"] == "tick")
        .filter(|l| l["fields"]["trigger"] == "schedule")
        .filter_map(|l| l["fields"]["lateness_ms"].as_f64())
        .collect();
    ms.sort_by(f64::total_cmp);
    ms
}

fn warned(logs: &[serde_json::Value], what: &str) -> usize {
    logs.iter()
        .filter(|l| l["level"] == "WARN")
        .filter(|l| {
            l["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(what))
        })
        .count()
}

/// A collector that takes every export and counts its bytes, on a
/// runtime of its own.
fn collector() -> (
    String,
    std::sync::Arc<std::sync::atomic::AtomicUsize>,
    tokio::runtime::Runtime,
) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let at = format!("http://{}", listener.local_addr().unwrap());
    let taken = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = taken.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| async move {
            counted.fetch_add(body.len(), std::sync::atomic::Ordering::Relaxed);
            ""
        }),
    );
    runtime.spawn(async move { axum::serve(listener, app).await });
    (at, taken, runtime)
}

fn side_by_side(otel: &str) {
    let dirs: Vec<tempfile::TempDir> = (0..3).map(|_| tempfile::tempdir().unwrap()).collect();
    let printer_jobs = format!("{TICK}\n{PRINTER}");
    let serves = [
        ("alone", serve(dirs[0].path(), TICK, None)),
        (
            "beside the 50 MB printer",
            serve(dirs[1].path(), &printer_jobs, None),
        ),
        ("exporting traces", serve(dirs[2].path(), TICK, Some(otel))),
    ];
    let started = Instant::now();
    let mut peak = [0.0f64; 3];
    while started.elapsed() < Duration::from_secs(40) {
        for (i, (_, child)) in serves.iter().enumerate() {
            peak[i] = peak[i].max(peak_rss_mib(child.id()));
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    for (i, ((name, child), dir)) in serves.into_iter().zip(&dirs).enumerate() {
        let cpu = cpu_seconds(child.id());
        let logs = stop(child, dir.path());
        let late = lateness(&logs);
        println!(
            "serve, every-second job, {name}: lateness over {} fires p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms; peak RSS {:.1} MiB; {:.2} CPU-s in 40 s; {} heartbeat warning(s)",
            late.len(),
            percentile(&late, 0.5),
            percentile(&late, 0.99),
            late.last().copied().unwrap_or_default(),
            peak[i],
            cpu,
            warned(&logs, "heartbeat") + warned(&logs, "lease"),
        );
    }
    let kept = Command::new(env!("CARGO_BIN_EXE_scheduler"))
        .args(["--database-url"])
        .arg(format!(
            "sqlite://{}",
            dirs[1].path().join("s.db").display()
        ))
        .args(["logs", "printer", "--period"])
        .arg(chrono::Utc::now().format("%Y-%m-%d").to_string())
        .current_dir(dirs[1].path())
        .output()
        .unwrap();
    println!(
        "the printer's kept output: {:.1} MiB of 50 MB printed; {}",
        (kept.stdout.len()) as f64 / 1048576.0,
        String::from_utf8_lossy(&kept.stderr).trim()
    );
}

/// `run --from --to` of 300 days of `/bin/true`: periods per second.
fn backfill(otel: Option<&str>) -> f64 {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("jobs.toml"),
        "[[job]]\nname = \"t\"\nschedule = \"0 4 * * *\"\nperiod = \"day\"\ncommand = [\"true\"]\n",
    )
    .unwrap();
    let started = Instant::now();
    let out = scheduler(
        dir.path(),
        &["run", "t", "--from", "2025-01-01", "--to", "2025-10-27"],
        otel,
    )
    .stderr(Stdio::null())
    .output()
    .unwrap();
    assert!(out.status.success());
    300.0 / started.elapsed().as_secs_f64()
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    let (otel, taken, _runtime) = collector();
    side_by_side(&otel);
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..3 {
        off.push(backfill(None));
        on.push(backfill(Some(&otel)));
    }
    let best = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    println!(
        "run --from --to, 300 periods of /bin/true, SQLite, best of 3: traces off {:.0} periods/s, on {:.0} periods/s ({:.2}×); the collector took {} KiB",
        best(&off),
        best(&on),
        best(&on) / best(&off),
        taken.load(std::sync::atomic::Ordering::Relaxed) / 1024
    );
}
