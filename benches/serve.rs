//! Figures for `serve`: fire lateness over 60 fires on SQLite and
//! PostgreSQL beside a bare croner + tokio loop, in one shared window;
//! 10,000 idle jobs (startup, RSS, CPU per idle minute, timer wake-ups),
//! without and with deadlines and a notifier. Run with `cargo bench --bench
//! serve` (about 6 minutes). `SERVE_MANY=1` runs only 100,000 jobs (check,
//! start-up, idle memory, a scrape, the lateness of an every-minute and
//! an every-second job among them; about 4 minutes). Bursts
//! of every-minute jobs on several replicas are `benches/burst.rs`.

mod support;
use support::postgres_database;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// `scheduler` in `dir`, its log written to `dir/scheduler.log`: a pipe
/// nobody reads until the end would stop it at its first 64 KiB (10,000
/// jobs' first sightings are logged).
fn scheduler(dir: &std::path::Path, url: &str, args: &[&str]) -> Child {
    let log = std::fs::File::create(dir.join("scheduler.log")).unwrap();
    Command::new(env!("CARGO_BIN_EXE_scheduler"))
        .args(["--log-format", "json", "--database-url", url])
        .args(args)
        .current_dir(dir)
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap()
}

/// Stops `child` and reads the JSON lines of its log in `dir`.
fn stop(mut child: Child, dir: &std::path::Path) -> Vec<serde_json::Value> {
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    child.wait().unwrap();
    let log = std::fs::File::open(dir.join("scheduler.log")).unwrap();
    BufReader::new(log)
        .lines()
        .map_while(Result::ok)
        .filter_map(|l| serde_json::from_str(&l).ok())
        .collect()
}

/// A field of every scheduled "claim won" line, sorted.
fn claim_field(logs: &[serde_json::Value], field: &str) -> Vec<f64> {
    let mut ms: Vec<f64> = logs
        .iter()
        .filter(|l| l["fields"]["message"] == "claim won" && l["fields"]["trigger"] == "schedule")
        .filter_map(|l| l["fields"][field].as_f64())
        .collect();
    ms.sort_by(f64::total_cmp);
    ms
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted
        .get(((sorted.len() as f64 - 1.0) * p).round() as usize)
        .copied()
        .unwrap_or(f64::NAN)
}

fn say(name: &str, what: &str, ms: &[f64]) {
    println!(
        "{name}: {what} over {} fires: p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        ms.len(),
        percentile(ms, 0.5),
        percentile(ms, 0.99),
        ms.last().copied().unwrap_or_default()
    );
}

/// The floor: croner and a tokio sleep until each next fire of an
/// every-second pattern, nothing else; how late each wake-up is, in ms.
fn bare_loop(window: Duration) -> Vec<f64> {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let cron = croner::parser::CronParser::builder()
            .seconds(croner::parser::Seconds::Required)
            .build()
            .parse("* * * * * *")
            .unwrap();
        let until = Instant::now() + window;
        let mut ms = Vec::new();
        while Instant::now() < until {
            let now = chrono::Utc::now();
            let fire = cron.find_next_occurrence(&now, false).unwrap();
            tokio::time::sleep((fire - now).to_std().unwrap_or_default()).await;
            let late = chrono::Utc::now() - fire;
            ms.push(late.num_microseconds().unwrap_or(0) as f64 / 1000.0);
        }
        ms.sort_by(f64::total_cmp);
        ms
    })
}

/// `serve` on each database and the bare loop, side by side in one
/// 60-second window: how late after each fire its claim starts, how long
/// the claim takes, and the bare loop's wake-ups.
fn fire_lateness(databases: &[(&str, String)]) {
    let dirs: Vec<tempfile::TempDir> = databases
        .iter()
        .map(|_| tempfile::tempdir().unwrap())
        .collect();
    let serves: Vec<Child> = databases
        .iter()
        .zip(&dirs)
        .map(|((_, url), dir)| {
            std::fs::write(
                dir.path().join("jobs.toml"),
                "[[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\n",
            )
            .unwrap();
            scheduler(dir.path(), url, &["serve"])
        })
        .collect();
    std::thread::sleep(Duration::from_secs(1));
    let bare = bare_loop(Duration::from_secs(60));
    std::thread::sleep(Duration::from_secs(1));
    for (((name, _), serve), dir) in databases.iter().zip(serves).zip(&dirs) {
        let logs = stop(serve, dir.path());
        say(
            name,
            "claim start after the fire",
            &claim_field(&logs, "lateness_ms"),
        );
        say(name, "claim statement", &claim_field(&logs, "claim_ms"));
    }
    say("bare croner + tokio loop", "wake-up after the fire", &bare);
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<&str> = stat
        .rsplit_once(") ")
        .unwrap()
        .1
        .split_whitespace()
        .collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn metric(port: u16, name: &str) -> f64 {
    let out = Command::new("curl")
        .args(["-s", &format!("http://127.0.0.1:{port}/metrics")])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .find(|l| l.starts_with(name))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Seconds from listening to the idle minute measured.
const SETTLE: u64 = 15;

/// How many idle minutes are measured: one varies by a tenth of a second.
const IDLE_MINUTES: u64 = 2;

/// How many scrapes of `/metrics` the cost of one is measured over.
const SCRAPES: u64 = 10;

/// `serve` with 10,000 yearly jobs, idle: with `deadlines`, each job has
/// a deadline and a notifier is told of them all (the deadline check runs
/// at every scan).
fn ten_thousand_idle_jobs(url: &str, deadlines: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::new();
    let deadline = if deadlines { "deadline = \"1h\"\n" } else { "" };
    for i in 0..10_000 {
        text.push_str(&format!(
            "[[job]]\nname = \"job-{i}\"\nschedule = \"{} {} 1 1 *\"\nperiod = \"year\"\ncommand = [\"true\"]\n{deadline}\n",
            i % 60,
            i % 24
        ));
    }
    if deadlines {
        text.push_str("[[notify]]\nname = \"all\"\nurl = \"http://127.0.0.1:9/\"\n");
    }
    std::fs::write(dir.path().join("jobs.toml"), text).unwrap();
    let started = Instant::now();
    let serve = scheduler(dir.path(), url, &["serve", "--listen", "127.0.0.1:19191"]);
    let pid = serve.id();
    while Command::new("curl")
        .args(["-sf", "http://127.0.0.1:19191/healthz"])
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    // The service is listening before its start-up scan and its first
    // deadline check (the whole catch-up window, once); idle is after them.
    std::thread::sleep(Duration::from_secs(SETTLE));
    let startup = started.elapsed();
    // No scrape inside the idle minutes: one renders every series, and
    // costs what the last figure says.
    let wake0 = metric(19191, "scheduler_wakeups_total");
    let cpu0 = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(60 * IDLE_MINUTES));
    let cpu1 = cpu_ticks(pid);
    let wake1 = metric(19191, "scheduler_wakeups_total");
    let rss = rss_kib(pid);
    let before = cpu_ticks(pid);
    for _ in 0..SCRAPES {
        metric(19191, "scheduler_wakeups_total");
    }
    let scrape_ms = (cpu_ticks(pid) - before) as f64 * 10.0 / SCRAPES as f64;
    stop(serve, dir.path());
    println!(
        "10,000 idle jobs{}: listening after {:.0} ms; RSS {:.1} MiB; CPU {:.2} s per idle minute (over {IDLE_MINUTES}); {:.0} timer wake-ups per minute; a /metrics scrape {scrape_ms:.0} ms CPU",
        if deadlines {
            " with deadlines and a notifier"
        } else {
            ""
        },
        startup
            .as_millis()
            .saturating_sub(u128::from(SETTLE) * 1000),
        rss as f64 / 1024.0,
        (cpu1 - cpu0) as f64 / 100.0 / IDLE_MINUTES as f64,
        (wake1 - wake0) / IDLE_MINUTES as f64
    );
}

/// How many jobs the large run loads.
const MANY: usize = 100_000;

/// `check`, then `serve --listen` of 100,000 jobs, half hourly, half
/// daily (a no-op `sql` statement each, so that the fires in the window
/// cost no process), and an every-minute and an every-second job among
/// them: start-up, idle RSS, CPU per minute, a scrape's CPU, and the two
/// jobs' fire lateness, the every-second job's from the start-up's
/// catch-up (each of the 100,000 owes its latest fire) on.
fn hundred_thousand_jobs(url: &str) {
    let dir = tempfile::tempdir().unwrap();
    let mut text = String::from(
        "[[job]]\nname = \"tick\"\nschedule = \"* * * * *\"\nsql = { statement = \"SELECT 1\" }\n\n\
         [[job]]\nname = \"second\"\nschedule = \"* * * * * *\"\nsql = { statement = \"SELECT 1\" }\n\n",
    );
    for i in 0..MANY - 2 {
        let schedule = match i % 2 {
            0 => format!("{} * * * *", i % 60),
            _ => format!("{} {} * * *", i % 60, i % 24),
        };
        text.push_str(&format!(
            "[[job]]\nname = \"job-{i}\"\nschedule = \"{schedule}\"\nsql = {{ statement = \"SELECT 1\" }}\n\n"
        ));
    }
    std::fs::write(dir.path().join("jobs.toml"), text).unwrap();
    let started = Instant::now();
    let check = Command::new(env!("CARGO_BIN_EXE_scheduler"))
        .arg("check")
        .current_dir(dir.path())
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(check.success(), "check failed");
    let checked = started.elapsed();
    let started = Instant::now();
    let spawned_at = chrono::Utc::now();
    let serve = scheduler(dir.path(), url, &["serve", "--listen", "127.0.0.1:19192"]);
    let pid = serve.id();
    while Command::new("curl")
        .args(["-sf", "http://127.0.0.1:19192/healthz"])
        .output()
        .map(|o| !o.status.success())
        .unwrap_or(true)
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    let listening = started.elapsed();
    std::thread::sleep(Duration::from_secs(SETTLE));
    let cpu0 = cpu_ticks(pid);
    std::thread::sleep(Duration::from_secs(60 * IDLE_MINUTES));
    let cpu1 = cpu_ticks(pid);
    let rss = rss_kib(pid);
    let peak = peak_kib(pid);
    let before = cpu_ticks(pid);
    for _ in 0..SCRAPES {
        metric(19192, "scheduler_wakeups_total");
    }
    let scrape_ms = (cpu_ticks(pid) - before) as f64 * 10.0 / SCRAPES as f64;
    let logs = stop(serve, dir.path());
    let lateness = |job: &str| {
        let mut ms: Vec<f64> = logs
            .iter()
            .filter(|l| {
                l["fields"]["message"] == "claim won" && l["fields"]["trigger"] == "schedule"
            })
            .filter(|l| {
                l["fields"]["period_key"]
                    .as_str()
                    .is_some_and(|k| k.strip_prefix(job).is_some_and(|k| k.starts_with(':')))
            })
            .filter_map(|l| l["fields"]["lateness_ms"].as_f64())
            .collect();
        ms.sort_by(f64::total_cmp);
        ms
    };
    println!(
        "{MANY} jobs (hourly and daily, one every minute and one every second): `check` {:.2} s; listening after {:.2} s; RSS {:.1} MiB idle, peak {:.1} MiB; CPU {:.2} s per minute (over {IDLE_MINUTES}); a /metrics scrape {scrape_ms:.0} ms CPU",
        checked.as_secs_f64(),
        listening.as_secs_f64(),
        rss as f64 / 1024.0,
        peak as f64 / 1024.0,
        (cpu1 - cpu0) as f64 / 100.0 / IDLE_MINUTES as f64,
    );
    // The start-up's catch-up: each job owes its latest fire.
    let caught_up: Vec<chrono::DateTime<chrono::Utc>> = logs
        .iter()
        .filter(|l| l["fields"]["message"] == "claim won" && l["fields"]["trigger"] == "catch-up")
        .filter_map(|l| l["timestamp"].as_str()?.parse().ok())
        .collect();
    if let Some(last) = caught_up.iter().max() {
        println!(
            "the start-up's catch-up: {} claims, the last won {:.1} s after the start",
            caught_up.len(),
            (*last - spawned_at).as_seconds_f64()
        );
    }
    say(
        "the every-minute job among them",
        "claim start after the fire",
        &lateness("tick"),
    );
    say(
        "an every-second job among them, from the start-up's catch-up on",
        "claim start after the fire",
        &lateness("second"),
    );
}

fn peak_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    if std::env::var_os("SERVE_MANY").is_some() {
        let dir = tempfile::tempdir().unwrap();
        hundred_thousand_jobs(&format!(
            "sqlite://{}",
            dir.path().join("many.db").display()
        ));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let pg = |name: &str| runtime.block_on(postgres_database(name));
    let mut databases = vec![(
        "SQLite",
        format!("sqlite://{}", dir.path().join("late.db").display()),
    )];
    if let Some(url) = pg("scheduler_bench_late") {
        databases.push(("PostgreSQL", url));
    }
    fire_lateness(&databases);
    for deadlines in [false, true] {
        let db = format!("idle-{deadlines}.db");
        ten_thousand_idle_jobs(
            &format!("sqlite://{}", dir.path().join(db).display()),
            deadlines,
        );
    }
}
