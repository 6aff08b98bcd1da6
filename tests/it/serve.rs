//! `scheduler serve` with real processes: replicas, kill -9, SIGTERM,
//! database outages, catch-up, concurrency, reload and pause.

use std::collections::BTreeSet;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::support::{Said, TestDb, Workspace, eventually, lines, logged, wait};

const BOUND: Duration = Duration::from_secs(60);

fn settings(extra: &str) -> String {
    format!(
        "[scheduler]\nlease = \"2s\"\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\n{extra}\n"
    )
}

/// The value of `series` (a name with its labels) in a `/metrics` text.
pub(crate) fn metric(metrics: &str, series: &str) -> Option<f64> {
    metrics.lines().find_map(|l| {
        l.strip_prefix(series)?
            .strip_prefix(' ')?
            .trim()
            .parse()
            .ok()
    })
}

fn every_second(name: &str, body: &str) -> String {
    format!("\n[[job]]\nname = \"{name}\"\nschedule = \"* * * * * *\"\n{body}\n")
}

/// A replica; its log goes to serve.log in the workspace (a pipe nobody
/// reads until the end could fill and stall it).
pub(crate) fn serve(ws: &Workspace, url: &str) -> Child {
    serve_with(ws, url, &[])
}

/// `serve` with `extra` arguments after it.
pub(crate) fn serve_with(ws: &Workspace, url: &str, extra: &[&str]) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(ws.path().join("serve.log"))
        .expect("serve.log");
    ws.command(&[&["--database-url", url, "serve"], extra].concat())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start serve")
}

/// A replica serving HTTP on a port the kernel picks, and the address it
/// bound, read back from its log.
pub(crate) fn serve_listening(ws: &Workspace, url: &str, extra: &[&str]) -> (Child, String) {
    let log = ws.path().join("serve.log");
    let before = crate::support::listened(&log).len();
    let child = serve_with(ws, url, &[&["--listen", "127.0.0.1:0"], extra].concat());
    (child, crate::support::listening_at(&log, before, BOUND))
}

pub(crate) fn signal(child: &Child, signal: Signal) {
    kill(Pid::from_raw(child.id() as i32), signal).expect("signal");
}

/// SIGTERM, then the exit code, which must come within the bound.
pub(crate) fn stop(child: Child) -> i32 {
    signal(&child, Signal::SIGTERM);
    wait(child, BOUND).code()
}

/// The UTC seconds of `job:<instant>` keys in the first column of `lines`.
fn seconds(lines: &[String]) -> Vec<DateTime<Utc>> {
    lines
        .iter()
        .filter_map(|l| {
            l.split_whitespace()
                .next()?
                .split_once(':')
                .map(|(_, t)| t.to_owned())
        })
        .map(|t| DateTime::parse_from_rfc3339(&t).expect("instant").to_utc())
        .collect()
}

/// Whether `file` holds a run of trigger `trigger` (a line ending so) whose
/// second is `at` or later.
fn runs_since(file: &std::path::Path, trigger: &str, at: DateTime<Utc>) -> bool {
    let runs: Vec<String> = lines(file)
        .into_iter()
        .filter(|l| l.ends_with(trigger))
        .collect();
    seconds(&runs).into_iter().any(|t| t >= at)
}

/// Asserts each second ran once and none between the first and last is missing.
fn assert_once_without_gaps(runs: &[DateTime<Utc>]) {
    let unique: BTreeSet<_> = runs.iter().collect();
    assert_eq!(unique.len(), runs.len(), "a second ran twice: {runs:?}");
    let (first, last) = (**unique.first().unwrap(), **unique.last().unwrap());
    assert_eq!(
        unique.len() as i64,
        (last - first).num_seconds() + 1,
        "gaps in {unique:?}"
    );
}

fn replicas_run_every_second_once(db: &TestDb, count: usize) {
    let ws = Workspace::new(
        &(settings("")
            + &every_second("tick", "shell = \"echo $SCHEDULER_PERIOD_KEY >> runs.txt\"")),
    );
    let replicas: Vec<Child> = (0..count).map(|_| serve(&ws, &db.url)).collect();
    eventually("six seconds run", BOUND, || {
        seconds(&lines(ws.path().join("runs.txt")))
            .into_iter()
            .collect::<BTreeSet<_>>()
            .len()
            >= 6
    });
    for replica in replicas {
        assert_eq!(stop(replica), 0);
    }
    let runs = seconds(&lines(ws.path().join("runs.txt")));
    assert!(runs.len() >= 5, "too few runs: {runs:?}");
    assert_once_without_gaps(&runs);
}

#[test]
fn three_replicas_on_postgres_run_every_second_exactly_once() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    replicas_run_every_second_once(&db, 3);
}

#[test]
fn two_processes_on_one_sqlite_file_run_every_second_exactly_once() {
    replicas_run_every_second_once(&TestDb::sqlite(), 2);
}

/// A job whose first run (in this workspace) parks: it records its runner's
/// pid (its parent is the job's supervisor, whose parent is the runner's
/// zygote, whose parent is the runner) and sleeps; every run appends `key
/// attempt trigger` to runs.txt.
const PARKING_JOB: &str = "shell = \"if mkdir parked 2>/dev/null; then z=$(cut -d' ' -f4 /proc/$PPID/stat); cut -d' ' -f4 /proc/$z/stat > victim; echo $SCHEDULER_PERIOD_KEY > parked-key; sleep 20; fi; echo $SCHEDULER_PERIOD_KEY $SCHEDULER_ATTEMPT $SCHEDULER_TRIGGER >> runs.txt\"";

fn parked(ws: &Workspace) -> (i32, String) {
    eventually("a job to park", BOUND, || {
        lines(ws.path().join("victim")).len() == 1 && lines(ws.path().join("parked-key")).len() == 1
    });
    let pid = lines(ws.path().join("victim"))[0].parse().unwrap();
    (pid, lines(ws.path().join("parked-key"))[0].clone())
}

#[test]
fn a_period_whose_replica_is_killed_is_finished_by_another_with_attempt_2() {
    // The same behaviour on PostgreSQL and on one SQLite file shared by processes.
    for db in crate::support::databases() {
        let ws = Workspace::new(
            &(settings("")
                + &every_second(
                    "tick",
                    &format!("period = \"fire\"\nconcurrency = 5\n{PARKING_JOB}"),
                )),
        );
        let (replicas, addrs): (Vec<Child>, Vec<String>) =
            (0..2).map(|_| serve_listening(&ws, &db.url, &[])).unzip();
        let (victim, key) = parked(&ws);
        kill(Pid::from_raw(victim), Signal::SIGKILL).unwrap();
        let recovered = format!("{key} 2 recovery");
        eventually("recovery with attempt 2", BOUND, || {
            lines(ws.path().join("runs.txt")).contains(&recovered)
        });
        for (replica, addr) in replicas.into_iter().zip(&addrs) {
            if replica.id() as i32 != victim {
                // The survivor counts the takeover.
                let metrics = crate::support::http_get(addr, "/metrics");
                let taken_over = metric(&metrics, "scheduler_claims_taken_over_total");
                assert!(taken_over >= Some(1.0), "{metrics}");
                assert_eq!(stop(replica), 0);
            } else {
                wait(replica, BOUND);
            }
        }
        let runs = lines(ws.path().join("runs.txt"));
        assert_eq!(
            runs.iter()
                .filter(|l| l.starts_with(&format!("{key} ")))
                .count(),
            1,
            "{runs:?}"
        );
    }
}

#[test]
fn sigterm_releases_a_running_period_and_another_replica_takes_it_at_once() {
    // The same behaviour on PostgreSQL and on one SQLite file shared by processes.
    for db in crate::support::databases() {
        let text = "[scheduler]\nlease = \"60s\"\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\n"
            .to_owned()
            + &every_second(
                "tick",
                &format!("period = \"fire\"\nconcurrency = 5\n{PARKING_JOB}"),
            );
        let ws = Workspace::new(&text);
        let mut replicas = vec![serve(&ws, &db.url), serve(&ws, &db.url)];
        let (victim, key) = parked(&ws);
        let index = replicas
            .iter()
            .position(|r| r.id() as i32 == victim)
            .expect("a replica ran it");
        let stopped = replicas.remove(index);
        let started = Instant::now();
        assert_eq!(stop(stopped), 0, "SIGTERM exits 0");
        let recovered = format!("{key} 2 recovery");
        eventually("the released period to run elsewhere", BOUND, || {
            lines(ws.path().join("runs.txt")).contains(&recovered)
        });
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "waited for the 60 s lease instead of the release"
        );
        assert_eq!(stop(replicas.remove(0)), 0);
    }
}

#[test]
fn missed_seconds_after_downtime_are_caught_up_once_and_a_new_job_does_not_back_fill() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        &(settings("")
            + &every_second(
                "tick",
                "shell = \"echo $SCHEDULER_PERIOD_KEY $SCHEDULER_TRIGGER >> runs.txt\"",
            )),
    );
    let first = serve(&ws, &db.url);
    eventually("two runs", BOUND, || {
        lines(ws.path().join("runs.txt")).len() >= 2
    });
    assert_eq!(stop(first), 0);
    // Scenario time: the downtime whose fires are missed.
    std::thread::sleep(Duration::from_secs(5));
    let restarted_at = Utc::now();
    let added = settings("")
        + &every_second(
            "tick",
            "shell = \"echo $SCHEDULER_PERIOD_KEY $SCHEDULER_TRIGGER >> runs.txt\"",
        )
        + &every_second(
            "fresh",
            "shell = \"echo $SCHEDULER_PERIOD_KEY $SCHEDULER_TRIGGER >> fresh.txt\"",
        );
    std::fs::write(ws.path().join("jobs.toml"), added).unwrap();
    let second = serve(&ws, &db.url);
    // The restart claims what was missed before it serves; then runs on
    // time, the new job's among them.
    let live = restarted_at + chrono::TimeDelta::seconds(1);
    eventually("the restart's catch-up, then runs on time", BOUND, || {
        logged(&ws, "serving", 2)
            && runs_since(&ws.path().join("runs.txt"), " schedule", live)
            && !lines(ws.path().join("fresh.txt")).is_empty()
    });
    assert_eq!(stop(second), 0);

    let runs = lines(ws.path().join("runs.txt"));
    assert_once_without_gaps(&seconds(&runs));
    let caught_up = runs.iter().filter(|l| l.ends_with(" catch-up")).count();
    assert!(
        caught_up >= 4,
        "expected the ~5 missed seconds as catch-up: {runs:?}"
    );
    let fresh = seconds(&lines(ws.path().join("fresh.txt")));
    assert!(!fresh.is_empty());
    assert!(
        fresh
            .iter()
            .all(|t| *t >= restarted_at - chrono::TimeDelta::seconds(1)),
        "back-filled: {fresh:?}"
    );
}

#[test]
fn missed_latest_runs_only_the_newest_missed_period() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        &(settings("")
            + &every_second(
                "tick",
                "missed = \"latest\"\nshell = \"echo $SCHEDULER_PERIOD_KEY $SCHEDULER_TRIGGER >> runs.txt\"",
            )),
    );
    let first = serve(&ws, &db.url);
    eventually("two runs", BOUND, || {
        lines(ws.path().join("runs.txt")).len() >= 2
    });
    assert_eq!(stop(first), 0);
    // Scenario time: the downtime whose fires are missed.
    std::thread::sleep(Duration::from_secs(5));
    let restarted_at = Utc::now();
    let second = serve(&ws, &db.url);
    let live = restarted_at + chrono::TimeDelta::seconds(1);
    eventually("the restart's catch-up, then a run on time", BOUND, || {
        logged(&ws, "serving", 2) && runs_since(&ws.path().join("runs.txt"), " schedule", live)
    });
    assert_eq!(stop(second), 0);
    let runs = lines(ws.path().join("runs.txt"));
    // The first start takes the latest fire as the job's first sighting
    // (a catch-up, first line); the restart takes only the newest of the
    // five seconds missed.
    assert!(runs[0].ends_with(" catch-up"), "{runs:?}");
    assert_eq!(
        runs.iter()
            .skip(1)
            .filter(|l| l.ends_with(" catch-up"))
            .count(),
        1,
        "{runs:?}"
    );
    let all = seconds(&runs);
    let gap = all
        .windows(2)
        .map(|w| (w[1] - w[0]).num_seconds())
        .max()
        .unwrap();
    assert!(
        gap >= 4,
        "the older missed seconds must be skipped: {runs:?}"
    );
}

#[test]
fn concurrency_1_holds_across_replicas_with_a_job_slower_than_its_schedule() {
    // The same behaviour on PostgreSQL and on one SQLite file shared by processes.
    for db in crate::support::databases() {
        let job = "period = \"fire\"\nmissed = \"skip\"\nshell = \"echo start $(date +%s%N) >> spans.txt; sleep 1.5; echo end $(date +%s%N) >> spans.txt\"";
        let ws = Workspace::new(&(settings("") + &every_second("slow", job)));
        let replicas = [serve(&ws, &db.url), serve(&ws, &db.url)];
        eventually("four runs", BOUND, || {
            lines(ws.path().join("spans.txt"))
                .iter()
                .filter(|l| l.starts_with("end"))
                .count()
                >= 4
        });
        for replica in replicas {
            assert_eq!(stop(replica), 0);
        }
        let spans = lines(ws.path().join("spans.txt"));
        assert!(spans.len() >= 4, "{spans:?}");
        let mut running = 0;
        for line in &spans {
            running += if line.starts_with("start") { 1 } else { -1 };
            assert!(running <= 1, "two runs at once: {spans:?}");
        }
    }
}

#[test]
fn sighup_reloads_jobs_toml_and_a_bad_file_keeps_the_old_one() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        &(settings("") + &every_second("tick", "shell = \"echo tick >> tick.txt\"")),
    );
    let replica = serve(&ws, &db.url);
    eventually("the first tick", BOUND, || {
        !lines(ws.path().join("tick.txt")).is_empty()
    });
    std::fs::write(ws.path().join("jobs.toml"), "[[job]]\nname = \"broken\"\n").unwrap();
    signal(&replica, Signal::SIGHUP);
    eventually("the bad file refused", BOUND, || {
        logged(&ws, "keeping the running configuration", 1)
    });
    let ticks = lines(ws.path().join("tick.txt")).len();
    eventually("ticks to go on under the old file", BOUND, || {
        lines(ws.path().join("tick.txt")).len() >= ticks + 2
    });
    std::fs::write(
        ws.path().join("jobs.toml"),
        settings("") + &every_second("tock", "shell = \"echo tock >> tock.txt\""),
    )
    .unwrap();
    signal(&replica, Signal::SIGHUP);
    eventually("the new job to fire", BOUND, || {
        !lines(ws.path().join("tock.txt")).is_empty()
    });
    let out = wait_stop(replica, &ws);
    assert!(
        out.contains("keeping the running configuration") && out.contains("jobs.toml:"),
        "{out}"
    );
}

fn wait_stop(child: Child, ws: &Workspace) -> String {
    assert_eq!(stop(child), 0);
    std::fs::read_to_string(ws.path().join("serve.log")).unwrap_or_default()
}

#[test]
fn pause_stops_a_job_on_every_replica_and_resume_restarts_it() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        &(settings("") + &every_second("tick", "shell = \"echo tick >> tick.txt\"")),
    );
    let (replica, addr) = serve_listening(&ws, &db.url, &[]);
    eventually("the first tick", BOUND, || {
        !lines(ws.path().join("tick.txt")).is_empty()
    });
    assert_eq!(
        ws.run(&["--database-url", &db.url, "pause", "tick"]).code(),
        0
    );
    // The loop has seen the pause, fired the job on once, and the runs it
    // started before have ended.
    let gauge = "scheduler_paused{job=\"tick\"}";
    eventually("the pause seen by the loop", BOUND, || {
        metric(&crate::support::http_get(&addr, "/metrics"), gauge) == Some(1.0)
    });
    crate::support::fired_on(&addr, "tick", 1);
    eventually("the runs started before the pause to end", BOUND, || {
        crate::support::count(
            &db.url,
            "SELECT count(*) FROM scheduler_claims WHERE job = 'tick' AND state = 'running'",
        ) == 0
    });
    let paused = lines(ws.path().join("tick.txt")).len();
    // Two more fires of the paused job start nothing.
    crate::support::fired_on(&addr, "tick", 2);
    assert_eq!(
        lines(ws.path().join("tick.txt")).len(),
        paused,
        "ticked while paused"
    );
    assert_eq!(
        ws.run(&["--database-url", &db.url, "resume", "tick"])
            .code(),
        0
    );
    eventually("ticks after resume", BOUND, || {
        lines(ws.path().join("tick.txt")).len() > paused
    });
    assert_eq!(stop(replica), 0);
}

#[test]
fn replicas_survive_a_database_outage_and_run_what_was_missed_once() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let (proxy, url) = crate::support::proxied(&db);
    let ws = Workspace::new(
        &(settings("")
            + &every_second("tick", "shell = \"echo $SCHEDULER_PERIOD_KEY >> runs.txt\"")),
    );
    let mut replicas = [serve(&ws, &url), serve(&ws, &url)];
    eventually("three runs", BOUND, || {
        lines(ws.path().join("runs.txt")).len() >= 3
    });
    proxy.cut();
    // Scenario time: the outage.
    std::thread::sleep(Duration::from_secs(4));
    proxy.restore();
    // What was missed is caught up while the loop runs on for 6 s.
    let on = Utc::now() + chrono::TimeDelta::seconds(6);
    eventually("runs 6 s past the outage", BOUND, || {
        seconds(&lines(ws.path().join("runs.txt")))
            .into_iter()
            .any(|t| t >= on)
    });
    for replica in &mut replicas {
        assert!(
            replica.try_wait().unwrap().is_none(),
            "a replica died during the outage"
        );
    }
    for replica in replicas {
        assert_eq!(stop(replica), 0);
    }
    let runs = seconds(&lines(ws.path().join("runs.txt")));
    assert!(runs.len() >= 12, "{runs:?}");
    assert_once_without_gaps(&runs);
}

/// A job finished just as the database went away for longer than its
/// lease, and its outcome could not be written: the other replica, back
/// first, must not take the period over while the runner, back a moment
/// later, may still write it (the double run seen once under load in the
/// test above, made certain here).
#[test]
fn a_job_that_finished_as_the_database_went_away_is_not_run_again() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let (proxy_a, url_a) = crate::support::proxied(&db);
    let (proxy_b, url_b) = crate::support::proxied(&db);
    // One fire takes `armed`, says which replica runs it, and ends as soon
    // as both replicas' connections are cut.
    let ws = Workspace::new(
        "[scheduler]\nlease = \"6s\"\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\n\n\
         [[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\n\
         shell = \"echo $SCHEDULER_PERIOD_KEY >> runs.txt; if mv armed taken 2>/dev/null; then \
         echo $REPLICA > runner; while [ ! -e cut ]; do sleep 0.01; done; fi\"\n",
    );
    let replica = |name: &str, url: &str| {
        let log = std::fs::File::create(ws.path().join(format!("serve-{name}.log"))).unwrap();
        ws.command(&["--database-url", url, "serve"])
            .env("REPLICA", name)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start serve")
    };
    let replicas = [replica("a", &url_a), replica("b", &url_b)];
    let serving = |name: &str| {
        std::fs::read_to_string(ws.path().join(format!("serve-{name}.log")))
            .is_ok_and(|l| l.contains("serving"))
    };
    eventually("both replicas serving", BOUND, || {
        serving("a") && serving("b")
    });
    std::fs::write(ws.path().join("armed"), "").unwrap();
    let mut runner = String::new();
    eventually("a replica to run the armed fire", BOUND, || {
        runner = std::fs::read_to_string(ws.path().join("runner")).unwrap_or_default();
        runner.ends_with('\n')
    });
    proxy_a.cut();
    proxy_b.cut();
    std::fs::write(ws.path().join("cut"), "").unwrap();
    // Past the lease: the runner's claim expires while it cannot write (as
    // the database itself says, asked past the cut proxies).
    let running = |lease: &str| {
        crate::support::count(
            &db.url,
            &format!("SELECT count(*) FROM scheduler_claims WHERE state = 'running'{lease}"),
        )
    };
    eventually("the runner's lease to run out", BOUND, || {
        running("") >= 1 && running(" AND lease_until >= now()") == 0
    });
    let (first, last) = if runner.trim() == "a" {
        (&proxy_b, &proxy_a)
    } else {
        (&proxy_a, &proxy_b)
    };
    first.restore();
    // Scenario time: the runner is back a moment after the other replica,
    // which scans every second meanwhile.
    std::thread::sleep(Duration::from_millis(2_500));
    last.restore();
    // Every expired claim settled, and the loop 6 s on.
    let on = Utc::now() + chrono::TimeDelta::seconds(6);
    eventually("runs 6 s past the outage", BOUND, || {
        running(" AND lease_until < now()") == 0
            && seconds(&lines(ws.path().join("runs.txt")))
                .into_iter()
                .any(|t| t >= on)
    });
    for replica in replicas {
        assert_eq!(stop(replica), 0);
    }
    let runs = seconds(&lines(ws.path().join("runs.txt")));
    assert_once_without_gaps(&runs);
}

/// Zombie processes whose parent is `pid`.
fn zombies_of(pid: u32) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("stat")).ok())
        .filter(|stat| {
            let Some((_, rest)) = stat.rsplit_once(") ") else {
                return false;
            };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            fields.first() == Some(&"Z") && fields.get(1) == Some(&pid.to_string().as_str())
        })
        .count()
}

#[test]
fn as_pid_1_it_reaps_orphans_and_still_waits_for_its_own_jobs() {
    let probe = std::process::Command::new("unshare")
        .args(["--pid", "--fork", "true"])
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        crate::support::skip("cannot make a PID namespace here (`unshare --pid --fork`)");
        return;
    }
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        &(settings("")
            + &every_second(
                "orphans",
                "shell = \"sleep 0.3 & echo $SCHEDULER_PERIOD_KEY >> runs.txt\"",
            )),
    );
    let unshare = std::process::Command::new("unshare")
        .args([
            "--pid",
            "--fork",
            "--kill-child",
            env!("CARGO_BIN_EXE_scheduler"),
            "--database-url",
            &db.url,
            "serve",
        ])
        .current_dir(ws.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let children = format!("/proc/{0}/task/{0}/children", unshare.id());
    let mut pid_1 = 0;
    eventually("the scheduler to start as PID 1", BOUND, || {
        pid_1 = std::fs::read_to_string(&children)
            .unwrap_or_default()
            .trim()
            .parse()
            .unwrap_or(0);
        pid_1 != 0
    });
    // Five runs: the orphans of the first four have ended by now.
    eventually("five runs", BOUND, || {
        lines(ws.path().join("runs.txt")).len() >= 5
    });
    let zombies = zombies_of(pid_1);
    let runs = lines(ws.path().join("runs.txt"));
    // unshare itself ignores SIGTERM while it waits; the scheduler does not.
    kill(Pid::from_raw(pid_1 as i32), Signal::SIGTERM).unwrap();
    assert_eq!(wait(unshare, BOUND).code(), 0);
    assert!(
        runs.len() >= 3,
        "its own jobs must still run and be waited for: {runs:?}"
    );
    assert!(zombies <= 1, "{zombies} orphans left unreaped");
}

#[test]
fn listen_serves_healthz_and_prometheus_metrics() {
    use std::io::{Read, Write};
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        &(settings("")
            + &every_second("tick", "command = [\"true\"]")
            + &every_second("idle", "command = [\"true\"]")),
    );
    // Seen and paused before serve starts: its fires since are skipped by
    // design, not overdue.
    for args in [&["migrate"][..], &["pause", "idle"]] {
        let mut all = vec!["--database-url", db.url.as_str()];
        all.extend_from_slice(args);
        let out = ws.run(&all);
        assert_eq!(out.code(), 0, "{args:?}: {}", out.stderr());
    }
    // Scenario time: fires of the paused job pass before serve starts.
    std::thread::sleep(Duration::from_secs(2));
    let (replica, addr) = serve_listening(&ws, &db.url, &[]);
    let get = |path: &str| -> String {
        let Ok(mut stream) = std::net::TcpStream::connect(&addr) else {
            return String::new();
        };
        let _ = write!(stream, "GET {path} HTTP/1.1\r\nhost: x\r\n\r\n");
        let mut body = String::new();
        let _ = stream.read_to_string(&mut body);
        body
    };
    eventually("/healthz", BOUND, || {
        get("/healthz").starts_with("HTTP/1.1 200 OK")
    });
    // A timed fire's run (the first run may be the first sighting's
    // catch-up, which has no lateness).
    eventually("a timed run in /metrics", BOUND, || {
        let metrics = get("/metrics");
        metrics.contains("scheduler_runs_total{job=\"tick\",outcome=\"succeeded\"}")
            && metrics.contains("scheduler_fire_lateness_seconds_bucket")
    });
    // Durations are histograms of fixed buckets (a few hundred bytes per
    // job, added up across replicas), not the exporter's summaries.
    let metrics = get("/metrics");
    for line in [
        "# TYPE scheduler_fire_lateness_seconds histogram",
        "scheduler_fire_lateness_seconds_bucket{job=\"tick\",le=\"0.01\"}",
        "# TYPE scheduler_run_duration_seconds histogram",
        "scheduler_run_duration_seconds_bucket{job=\"tick\",le=\"+Inf\"}",
    ] {
        assert!(metrics.contains(line), "no `{line}` in {metrics}");
    }
    assert!(!metrics.contains("quantile="), "{metrics}");
    assert!(
        metrics.contains("scheduler_overdue_periods{job=\"idle\"} 0"),
        "{metrics}"
    );
    // The paused gauge follows a pause, and a resume, by another process.
    let paused = |job: &str| {
        metric(
            &get("/metrics"),
            &format!("scheduler_paused{{job=\"{job}\"}}"),
        )
    };
    eventually("idle shown paused", BOUND, || paused("idle") == Some(1.0));
    assert_eq!(paused("tick"), Some(0.0));
    let resumed = ws.run(&["--database-url", &db.url, "resume", "idle"]);
    assert_eq!(resumed.code(), 0, "{}", resumed.stderr());
    eventually("idle shown resumed", BOUND, || paused("idle") == Some(0.0));
    assert!(get("/nope").starts_with("HTTP/1.1 404"));
    assert_eq!(stop(replica), 0);
}

#[test]
fn a_job_removed_by_sighup_has_its_gauges_zeroed() {
    let db = TestDb::sqlite();
    let daily = |name: &str, program: &str| {
        format!(
            "\n[[job]]\nname = \"{name}\"\nschedule = \"0 0 * * *\"\nperiod = \"day\"\ncommand = [\"{program}\"]\n"
        )
    };
    let ws = Workspace::new(&(settings("") + &daily("gone", "false") + &daily("kept", "true")));
    let failed = ws.run(&["--database-url", &db.url, "run", "gone"]);
    assert_eq!(failed.code(), 1, "{}", failed.stderr());
    let (replica, addr) = serve_listening(&ws, &db.url, &[]);
    let exhausted = "scheduler_retries_exhausted_periods{job=\"gone\"}";
    eventually("the failed period in /metrics", BOUND, || {
        metric(&crate::support::http_get(&addr, "/metrics"), exhausted) == Some(1.0)
    });
    std::fs::write(
        ws.path().join("jobs.toml"),
        settings("") + &daily("kept", "true"),
    )
    .unwrap();
    signal(&replica, Signal::SIGHUP);
    eventually("the removed job's gauge at zero", BOUND, || {
        metric(&crate::support::http_get(&addr, "/metrics"), exhausted) == Some(0.0)
    });
    assert_eq!(stop(replica), 0);
}

/// Serves `jobs_toml` (job `slow`) until `/metrics` counts `at_least`
/// dropped fires of `slow`.
fn serve_until_dropped(db: &TestDb, jobs_toml: &str, at_least: f64) {
    let ws = Workspace::new(jobs_toml);
    let (replica, addr) = serve_listening(&ws, &db.url, &[]);
    let dropped = "scheduler_periods_dropped_total{job=\"slow\"}";
    eventually("dropped fires in /metrics", BOUND, || {
        metric(&crate::support::http_get(&addr, "/metrics"), dropped) >= Some(at_least)
    });
    assert_eq!(stop(replica), 0);
}

#[test]
fn fires_that_wait_past_catch_up_for_a_slot_are_counted_as_dropped() {
    // One slot, runs of 3 s, a fire every second, a window of 1 s: most
    // fires wait longer than the window and are dropped.
    serve_until_dropped(
        &TestDb::sqlite(),
        &(settings("catch_up = \"1s\"")
            + &every_second("slow", "period = \"fire\"\ncommand = [\"sleep\", \"3\"]")),
        1.0,
    );
}

/// The binary with `args` against `db`, which must succeed.
fn ok(ws: &Workspace, db: &TestDb, args: &[&str]) {
    let out = ws.run(&[&["--database-url", db.url.as_str()], args].concat());
    assert_eq!(out.code(), 0, "{args:?}: {}", out.stderr());
}

/// Claims of job `tick` whose fire label lies between `from` and `to`.
fn tick_claims(db: &TestDb, from: &str, to: &str) -> i64 {
    crate::support::count(
        &db.url,
        &format!(
            "SELECT count(*) FROM scheduler_claims WHERE period_key BETWEEN 'tick:{from}' AND 'tick:{to}'"
        ),
    )
}

/// The label of the fire at `t`'s second (a `period = "fire"` job).
fn second(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

#[test]
fn a_resumed_job_catches_up_the_fires_it_skipped_while_paused() {
    for db in crate::support::databases() {
        let ws = Workspace::new(
            &(settings("catch_up = \"1h\"")
                + &every_second("tick", "period = \"fire\"\ncommand = [\"true\"]")),
        );
        ok(&ws, &db, &["migrate"]);
        let replica = serve(&ws, &db.url);
        eventually("a first run", BOUND, || tick_claims(&db, "0", "9") > 0);
        let paused_at = Utc::now();
        ok(&ws, &db, &["pause", "tick"]);
        // Scenario time: the pause, whose fires are skipped.
        std::thread::sleep(Duration::from_secs(4));
        ok(&ws, &db, &["resume", "tick"]);
        let resumed_at = Utc::now();
        // Every fire of the pause runs once it is over.
        let fires = resumed_at.timestamp() - paused_at.timestamp() + 1;
        eventually("every fire of the pause claimed", BOUND, || {
            tick_claims(&db, &second(paused_at), &second(resumed_at)) == fires
        });
        assert_eq!(stop(replica), 0);
    }
}

/// Fires waiting for a `concurrency` slot when the job is paused are
/// skipped fires too: the resume runs them.
#[test]
fn fires_waiting_for_a_slot_when_a_job_is_paused_run_on_resume() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        &(settings("catch_up = \"1h\"")
            + &every_second(
                "tick",
                "period = \"fire\"\nconcurrency = 1\nshell = 'if [ -e slow ]; then sleep 3; fi'",
            )),
    );
    std::fs::write(ws.path().join("slow"), "").unwrap();
    ok(&ws, &db, &["migrate"]);
    let replica = serve(&ws, &db.url);
    eventually("a first run", BOUND, || tick_claims(&db, "0", "9") > 0);
    let started = Utc::now();
    // Scenario time: runs of 3 s, a fire every second: fires pile up
    // waiting for the slot.
    std::thread::sleep(Duration::from_secs(4));
    ok(&ws, &db, &["pause", "tick"]);
    std::fs::remove_file(ws.path().join("slow")).unwrap();
    // Scenario time: the pause, whose fires are skipped.
    std::thread::sleep(Duration::from_secs(4));
    ok(&ws, &db, &["resume", "tick"]);
    let resumed_at = Utc::now();
    let fires = resumed_at.timestamp() - started.timestamp() + 1;
    eventually("every fire since the start claimed", BOUND, || {
        tick_claims(&db, &second(started), &second(resumed_at)) == fires
    });
    assert_eq!(stop(replica), 0);
}

#[test]
fn fires_that_wait_past_catch_up_for_max_running_are_dropped_and_counted() {
    let db = TestDb::sqlite();
    // One run at a time in the process, runs of 3 s, a fire every second,
    // a window of 1 s: fires wait in the backlog longer than the window.
    serve_until_dropped(
        &db,
        &(settings("catch_up = \"1s\"\nmax_running = 1")
            + &every_second(
                "slow",
                "period = \"fire\"\nconcurrency = 5\nshell = 'echo $SCHEDULER_TRIGGER >> runs.txt; sleep 3'",
            )),
        2.0,
    );
    // Nothing ran long after its fire: what waited past the window was
    // dropped, not run late.
    let late = crate::support::count(
        &db.url,
        "SELECT count(*) FROM scheduler_attempts WHERE started_at - scheduled_at > 3000",
    );
    assert_eq!(late, 0);
}

#[test]
fn a_job_paused_longer_than_catch_up_runs_the_fires_of_the_window_on_resume() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        &(settings("catch_up = \"5s\"")
            + &every_second("tick", "period = \"fire\"\ncommand = [\"true\"]")),
    );
    ok(&ws, &db, &["migrate"]);
    let replica = serve(&ws, &db.url);
    eventually("a first run", BOUND, || tick_claims(&db, "0", "9") > 0);
    ok(&ws, &db, &["pause", "tick"]);
    // Scenario time: a pause longer than the 5 s catch-up window.
    std::thread::sleep(Duration::from_secs(9));
    ok(&ws, &db, &["resume", "tick"]);
    let resumed_at = Utc::now();
    // The window's fires before the resume (its oldest may age out while
    // the scan sees the resume, so three of the last four seconds).
    let from = resumed_at - chrono::TimeDelta::seconds(3);
    eventually("the window's fires claimed", BOUND, || {
        tick_claims(&db, &second(from), &second(resumed_at)) >= 3
    });
    assert_eq!(stop(replica), 0);
}

#[test]
fn a_hand_run_while_serve_is_down_does_not_hide_the_periods_before_it_from_the_restart() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        &(settings("catch_up = \"1h\"")
            + &every_second("tick", "period = \"fire\"\ncommand = [\"true\"]")),
    );
    ok(&ws, &db, &["migrate"]);
    let replica = serve(&ws, &db.url);
    eventually("a first run", BOUND, || tick_claims(&db, "0", "9") > 0);
    assert_eq!(stop(replica), 0);
    let stopped_at = Utc::now();
    // Scenario time: the downtime whose fires are missed.
    std::thread::sleep(Duration::from_secs(4));
    let recent = second(Utc::now() - chrono::TimeDelta::seconds(1));
    ok(&ws, &db, &["run", "tick", "--period", &recent]);
    let replica = serve(&ws, &db.url);
    let gap = (
        stopped_at + chrono::TimeDelta::seconds(1),
        Utc::now() - chrono::TimeDelta::seconds(2),
    );
    let seconds = gap.1.timestamp() - gap.0.timestamp() + 1;
    eventually("the periods before the hand run caught up", BOUND, || {
        tick_claims(&db, &second(gap.0), &second(gap.1)) == seconds
    });
    assert_eq!(stop(replica), 0);
}
