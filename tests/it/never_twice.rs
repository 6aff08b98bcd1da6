//! Never twice under what operators do in a normal week: `release`, a
//! database away for longer than the lease, long `sql` actions, SIGHUP with
//! new settings, jobs that fork, a frozen runner, `kill -9`, and values that
//! can never work. Real processes throughout.

use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use chrono::Utc;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::serve::{serve, serve_listening, signal, stop};
use crate::support::{
    Said, TestDb, Workspace, alive, count, databases, eventually, fired_on, http_get, lines,
    listening_at, logged, more_lines, proxied, serve_log, ticker, wait, within,
};

const BOUND: Duration = Duration::from_secs(60);

/// A job that notices a second copy of itself: it holds a lock on `lock`
/// (its `sleep` inherits it) and appends `OVERLAP` if another copy holds
/// it, then `start ATTEMPT PID` to runs.txt.
fn overlap_job(name: &str) -> String {
    format!(
        "\n[[job]]\nname = \"{name}\"\nschedule = \"* * * * * *\"\nperiod = \"day\"\n\
         shell = 'exec 9>>{name}.lock; flock -n 9 || echo OVERLAP >> runs.txt; echo {name} $SCHEDULER_ATTEMPT $$ >> runs.txt; sleep 60'\n"
    )
}

/// The `(attempt, pid)` of each start of job `name`.
fn starts(ws: &Workspace, name: &str) -> Vec<(u32, i32)> {
    lines(ws.path().join("runs.txt"))
        .iter()
        .filter_map(|l| {
            let mut words = l.split_whitespace();
            (words.next()? == name).then_some(())?;
            Some((words.next()?.parse().ok()?, words.next()?.parse().ok()?))
        })
        .collect()
}

fn overlapped(ws: &Workspace) -> bool {
    lines(ws.path().join("runs.txt"))
        .iter()
        .any(|l| l == "OVERLAP")
}

fn today() -> String {
    Utc::now().format("%Y-%m-%d").to_string()
}

/// The binary with `args`, in the background, its output kept.
fn start(ws: &Workspace, args: &[&str]) -> Child {
    ws.command(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

fn log(ws: &Workspace) -> String {
    std::fs::read_to_string(ws.path().join("serve.log")).unwrap_or_default()
}

#[test]
fn release_of_a_period_serve_runs_stops_the_old_job_and_never_runs_two_at_once() {
    for db in databases() {
        let ws = Workspace::new(
            &("[scheduler]\nlease = \"6s\"\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\n"
                .to_owned()
                + &overlap_job("long")
                + &ticker("tick", "ticks.txt")),
        );
        let server = serve(&ws, &db.url);
        eventually("attempt 1", BOUND, || starts(&ws, "long").len() == 1);
        let (_, first) = starts(&ws, "long")[0];
        let released = ws.run(&[
            "--database-url",
            &db.url,
            "release",
            "long",
            "--period",
            &today(),
        ]);
        assert_eq!(released.code(), 0, "{}", released.stderr());
        let at = Instant::now();
        eventually("the released attempt to stop", BOUND, || !alive(first));
        assert!(
            at.elapsed() < Duration::from_secs(15),
            "took {:?}",
            at.elapsed()
        );
        eventually("the recovery", BOUND, || starts(&ws, "long").len() == 2);
        // No third start while the loop fires four more times.
        more_lines(ws.path().join("ticks.txt"), 4);
        assert_eq!(
            starts(&ws, "long").len(),
            2,
            "{:?}",
            lines(ws.path().join("runs.txt"))
        );
        assert!(!overlapped(&ws), "{:?}", lines(ws.path().join("runs.txt")));
        assert_eq!(stop(server), 0);
    }
}

#[test]
fn a_database_cut_longer_than_the_lease_stops_the_job_and_the_period_runs_once_more_at_most() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let (proxy, url) = proxied(&db);
    let ws = Workspace::new(
        &("[scheduler]\nlease = \"6s\"\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\n"
            .to_owned()
            + &overlap_job("long")
            + &ticker("tick", "ticks.txt")),
    );
    let server = serve(&ws, &url);
    eventually("attempt 1", BOUND, || starts(&ws, "long").len() == 1);
    let (_, first) = starts(&ws, "long")[0];
    proxy.cut();
    // The lease is 6 s; the runner stops its job 4 s after its last
    // renewal: within 10 s of the cut.
    let stopped = within(Duration::from_secs(10), || !alive(first));
    proxy.restore();
    assert!(
        stopped,
        "the job ran on past its lease while the database was away:\n{}",
        log(&ws)
    );
    eventually("the recovery", BOUND, || starts(&ws, "long").len() == 2);
    // No third start while the loop fires three more times.
    more_lines(ws.path().join("ticks.txt"), 3);
    assert_eq!(starts(&ws, "long").len(), 2);
    assert!(!overlapped(&ws), "{:?}", lines(ws.path().join("runs.txt")));
    assert_eq!(stop(server), 0);
    assert!(
        log(&ws).contains("lease not renewed in time"),
        "{}",
        log(&ws)
    );
}

/// A runner cut off from its database whose job's supervisor is frozen:
/// the runner must end the job's tree itself, within what is left of the
/// lease, and not wait for the supervisor longer than that (issue 26, item
/// 8: the old job lived on at +7 s beside the recovery of +6 s).
#[test]
fn a_fenced_job_whose_supervisor_is_frozen_is_dead_before_another_replica_takes_it_over() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let (proxy, url) = proxied(&db);
    let ws = Workspace::new(
        &("[scheduler]\nlease = \"6s\"\nscan_interval = \"500ms\"\nshutdown_grace = \"1s\"\n"
            .to_owned()
            + &overlap_job("long")),
    );
    let cut_off = serve(&ws, &url);
    eventually("attempt 1", BOUND, || starts(&ws, "long").len() == 1);
    let (_, first) = starts(&ws, "long")[0];
    let supervisor = parent(first);
    let other = serve(&ws, &db.url);
    kill(Pid::from_raw(supervisor), Signal::SIGSTOP).unwrap();
    proxy.cut();
    eventually("the takeover", BOUND, || starts(&ws, "long").len() == 2);
    let old_alive = alive(first);
    let _ = kill(Pid::from_raw(supervisor), Signal::SIGCONT);
    proxy.restore();
    // An overlap is written before the takeover's start line.
    assert!(!old_alive, "the old job was alive at the takeover");
    assert!(!overlapped(&ws), "{:?}", lines(ws.path().join("runs.txt")));
    assert_eq!(stop(other), 0);
    assert_eq!(stop(cut_off), 0);
}

/// Outages of 1.5 s, each well within the lease (9 s; a runner stops its
/// job 6 s after its last renewal): the renewal that finds the database
/// gone must be tried again before the fence, not an interval later. Five
/// of them, 3.7 s apart, so that some overlap a renewal whatever the phase.
#[test]
fn a_job_lives_through_database_outages_shorter_than_its_lease() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let (proxy, url) = proxied(&db);
    let ws = Workspace::new(
        &("[scheduler]\nlease = \"9s\"\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\n"
            .to_owned()
            + &overlap_job("long")),
    );
    let server = serve(&ws, &url);
    eventually("attempt 1", BOUND, || starts(&ws, "long").len() == 1);
    let (_, first) = starts(&ws, "long")[0];
    for _ in 0..5 {
        proxy.cut();
        // Scenario time: an outage of 1.5 s.
        std::thread::sleep(Duration::from_millis(1500));
        proxy.restore();
        // Scenario time: the gap that moves the next outage's phase.
        std::thread::sleep(Duration::from_millis(2200));
    }
    let log = log(&ws);
    assert!(alive(first), "the job was stopped:\n{log}");
    assert!(!log.contains("lease not renewed in time"), "{log}");
    assert_eq!(starts(&ws, "long").len(), 1, "{log}");
    assert_eq!(stop(server), 0);
}

#[test]
fn long_sql_actions_never_let_another_process_take_a_live_shell_claim() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let mut text =
        "[scheduler]\nlease = \"6s\"\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\n".to_owned();
    for i in 0..9 {
        text += &format!(
            "\n[[job]]\nname = \"slow{i}\"\nschedule = \"* * * * * *\"\nperiod = \"day\"\nsql = {{ statement = \"SELECT pg_sleep(16)\" }}\n"
        );
    }
    text += "\n[[job]]\nname = \"cmd\"\nschedule = \"* * * * * *\"\nperiod = \"day\"\nshell = \"echo cmd $SCHEDULER_ATTEMPT >> runs.txt; sleep 25\"\n";
    let ws = Workspace::new(&text);
    let server = serve(&ws, &db.url);
    eventually("the shell job", BOUND, || {
        !lines(ws.path().join("runs.txt")).is_empty()
    });
    // Past the lease the shell claim holds now: unless renewed meanwhile,
    // it has run out.
    let lease_until = count(
        &db.url,
        "SELECT (extract(epoch FROM lease_until) * 1000)::bigint FROM scheduler_claims WHERE job = 'cmd'",
    );
    eventually("the shell claim's lease to be past", BOUND, || {
        count(
            &db.url,
            &format!("SELECT (now() > to_timestamp({lease_until} / 1000.0))::int::bigint"),
        ) == 1
    });
    let other = ws.run(&[
        "--database-url",
        &db.url,
        "run",
        "cmd",
        "--period",
        &today(),
    ]);
    assert!(
        other.stdout().contains("skipped: running on"),
        "{}{}",
        other.stdout(),
        other.stderr()
    );
    assert_eq!(lines(ws.path().join("runs.txt")), ["cmd 1"]);
    assert_eq!(stop(server), 0);
}

#[test]
fn sighup_raising_and_lowering_max_running_then_sigterm_exits_in_the_grace_and_releases() {
    let db = TestDb::sqlite();
    let jobs = |max: u32| {
        format!(
            "[scheduler]\nlease = \"60s\"\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\nmax_running = {max}\n"
        ) + &overlap_job("a")
            + &overlap_job("b")
            + &overlap_job("c")
    };
    let ws = Workspace::new(&jobs(2));
    let running = |ws: &Workspace| {
        ["a", "b", "c"]
            .iter()
            .filter(|j| !starts(ws, j).is_empty())
            .count()
    };
    let (server, addr) = serve_listening(&ws, &db.url, &[]);
    eventually("two jobs", BOUND, || running(&ws) == 2);
    // The loop fires the third job on every second: three of its fires
    // start none of it.
    fired_on(&addr, "c", 3);
    assert_eq!(running(&ws), 2, "max_running = 2 holds");
    std::fs::write(ws.path().join("jobs.toml"), jobs(8)).unwrap();
    signal(&server, Signal::SIGHUP);
    eventually("the third job once the limit rose", BOUND, || {
        running(&ws) == 3
    });
    std::fs::write(ws.path().join("jobs.toml"), jobs(1)).unwrap();
    signal(&server, Signal::SIGHUP);
    eventually("the second reload", BOUND, || logged(&ws, "reloaded", 2));
    signal(&server, Signal::SIGTERM);
    let out = wait(server, Duration::from_secs(30));
    assert_eq!(out.code(), 0, "{}", log(&ws));
    assert_eq!(
        count(
            &db.url,
            "SELECT count(*) FROM scheduler_claims WHERE state = 'released'"
        ),
        3,
        "{}",
        log(&ws)
    );
    assert!(!overlapped(&ws));
}

#[test]
fn sighup_shortening_the_lease_while_a_job_runs_starts_no_second_attempt() {
    let db = TestDb::sqlite();
    let settings = |lease: &str| {
        format!(
            "[scheduler]\nlease = \"{lease}\"\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\n"
        )
    };
    let tick = ticker("tick", "ticks.txt");
    let ws = Workspace::new(&(settings("60s") + &overlap_job("early") + &tick));
    let server = serve(&ws, &db.url);
    eventually("the first job", BOUND, || !starts(&ws, "early").is_empty());
    // The shorter lease applies to the running claim's renewals and to the
    // claim of a job added by the same reload.
    std::fs::write(
        ws.path().join("jobs.toml"),
        settings("3s") + &overlap_job("early") + &overlap_job("late") + &tick,
    )
    .unwrap();
    signal(&server, Signal::SIGHUP);
    eventually("the added job", BOUND, || !starts(&ws, "late").is_empty());
    // Three of the short leases, counted in the loop's fires.
    more_lines(ws.path().join("ticks.txt"), 9);
    let runs = lines(ws.path().join("runs.txt"));
    assert_eq!(starts(&ws, "early").len(), 1, "{runs:?}");
    assert_eq!(starts(&ws, "late").len(), 1, "{runs:?}");
    assert!(!overlapped(&ws), "{runs:?}");
    assert_eq!(stop(server), 0);
}

/// Pids of processes whose command line is exactly `sleep SECONDS`.
fn sleeps(seconds: u32) -> Vec<i32> {
    let wanted = format!("sleep\0{seconds}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c == wanted.as_bytes())
                && alive(*pid)
        })
        .collect()
}

/// Jobs whose trees fork: a shell that forks `sleep`, a background `sleep`
/// waited for, and one moved to its own session. `base` keeps each test's
/// sleeps apart.
fn forking_jobs(base: u32) -> String {
    let jobs = [
        format!("sleep {}; echo done", base + 1),
        format!("sleep {} & wait", base + 2),
        format!("setsid sleep {} & sleep {}; echo done", base + 3, base + 4),
    ];
    let mut text =
        "[scheduler]\nlease = \"60s\"\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\n"
            .to_owned();
    for (i, shell) in jobs.iter().enumerate() {
        text += &format!(
            "\n[[job]]\nname = \"tree{i}\"\nschedule = \"* * * * * *\"\nperiod = \"day\"\nshell = \"{shell}\"\n"
        );
    }
    text
}

fn all_sleeps(base: u32) -> Vec<i32> {
    (base + 1..=base + 4).flat_map(sleeps).collect()
}

fn assert_trees_die_with(runners: Vec<Child>, base: u32) {
    eventually("every job's processes", BOUND, || {
        (base + 1..=base + 4).all(|s| !sleeps(s).is_empty())
    });
    for runner in runners {
        signal(&runner, Signal::SIGKILL);
        wait(runner, BOUND);
    }
    within(Duration::from_secs(10), || all_sleeps(base).is_empty());
    let survivors = all_sleeps(base);
    for pid in &survivors {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
    assert!(survivors.is_empty(), "left alive: {survivors:?}");
}

#[test]
fn kill_9_of_run_leaves_nothing_of_the_job_trees() {
    let db = TestDb::sqlite();
    let base = 6100 + std::process::id() % 50 * 10;
    let ws = Workspace::new(&forking_jobs(base));
    let runners: Vec<Child> = (0..3)
        .map(|i| {
            ws.command(&[
                "--database-url",
                &db.url,
                "run",
                &format!("tree{i}"),
                "--period",
                &today(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap()
        })
        .collect();
    assert_trees_die_with(runners, base);
}

#[test]
fn kill_9_of_serve_leaves_nothing_of_the_job_trees() {
    let db = TestDb::sqlite();
    let base = 6700 + std::process::id() % 50 * 10;
    let ws = Workspace::new(&forking_jobs(base));
    assert_trees_die_with(vec![serve(&ws, &db.url)], base);
}

#[test]
fn a_frozen_runners_job_is_stopped_by_its_supervisor_before_the_lease_runs_out() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&("[scheduler]\nlease = \"3s\"\n".to_owned() + &overlap_job("long")));
    let today = today();
    let args = ["--database-url", &db.url, "run", "long", "--period", &today];
    let frozen = start(&ws, &args);
    eventually("attempt 1", BOUND, || starts(&ws, "long").len() == 1);
    let (_, first) = starts(&ws, "long")[0];
    signal(&frozen, Signal::SIGSTOP);
    // Its lease is 3 s; the job would sleep for a minute.
    eventually(
        "the frozen runner's job to be stopped",
        Duration::from_secs(20),
        || !alive(first),
    );
    // Its lease may not have run out yet: the takeover waits for it.
    let takeover = start(&ws, &[&args[..], &["--wait"]].concat());
    eventually("the takeover", BOUND, || starts(&ws, "long").len() == 2);
    assert!(!overlapped(&ws), "{:?}", lines(ws.path().join("runs.txt")));
    // Thawed, it finds its fence long passed: it records nothing and says
    // the database (its lease) failed it.
    signal(&frozen, Signal::SIGCONT);
    let out = wait(frozen, BOUND);
    assert!(out.stdout().contains("fenced"), "{}", out.stdout());
    assert_eq!(out.code(), 3);
    signal(&takeover, Signal::SIGKILL);
    wait(takeover, BOUND);
}

#[test]
fn an_sql_action_on_postgres_records_when_its_statement_ended() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let ws = Workspace::new(
        "[[job]]\nname = \"slow\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\nsql = { statement = \"SELECT pg_sleep(1.5)\" }\n",
    );
    let out = ws.run(&[
        "--database-url",
        &db.url,
        "run",
        "slow",
        "--period",
        "2026-07",
    ]);
    assert_eq!(out.code(), 0, "{}{}", out.stdout(), out.stderr());
    let took = count(
        &db.url,
        "SELECT (extract(epoch FROM finished_at - started_at) * 1000)::bigint FROM scheduler_attempts",
    );
    assert!(took >= 1400, "recorded {took} ms for a 1.5 s statement");
}

/// `check` on a file whose `[scheduler]` holds `line`: exit 2 naming the
/// place and `expected`, and no database.
fn refused(line: &str, job: &str, place: &str, expected: &str) {
    let ws = Workspace::new(&format!(
        "[scheduler]\n{line}\n\n[[job]]\nname = \"a\"\nschedule = \"@daily\"\ncommand = [\"true\"]\n{job}\n"
    ));
    for command in [&["check"][..], &["run", "a"]] {
        let out = ws.run(command);
        assert_eq!(out.code(), 2, "{line}: {}", out.stderr());
        assert!(out.stderr().contains(place), "{line}: {}", out.stderr());
        assert!(out.stderr().contains(expected), "{line}: {}", out.stderr());
    }
    assert!(!ws.path().join("scheduler.db").exists());
}

#[test]
fn a_lease_under_a_second_is_refused_at_load() {
    refused("lease = \"1ns\"", "", "jobs.toml:2:9", "at least 1s");
    refused("lease = \"500ms\"", "", "jobs.toml:2:9", "at least 1s");
}

#[test]
fn a_scan_interval_under_100ms_is_refused_at_load() {
    refused(
        "scan_interval = \"1ns\"",
        "",
        "jobs.toml:2:17",
        "at least 100ms",
    );
}

#[test]
fn keep_shorter_than_catch_up_is_refused_at_load() {
    refused(
        "catch_up = \"24h\"",
        "keep = \"2s\"",
        "jobs.toml:8:8",
        "shorter than catch_up",
    );
}

#[test]
fn a_job_starts_with_no_signal_blocked_and_a_timeout_reaches_its_trap() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[[job]]\nname = \"trap\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ntimeout = \"1s\"\n\
         shell = \"grep SigBlk /proc/self/status > mask.txt; trap 'echo term >> trapped.txt; exit 3' TERM; sleep 30 & wait\"\n",
    );

    let out = ws.run(&[
        "--database-url",
        &db.url,
        "run",
        "trap",
        "--period",
        "2026-07",
    ]);
    assert_eq!(out.code(), 1, "{}{}", out.stdout(), out.stderr());
    assert!(
        out.stdout().contains("timed out after 1s"),
        "{}",
        out.stdout()
    );
    assert_eq!(
        lines(ws.path().join("mask.txt")),
        ["SigBlk:\t0000000000000000"]
    );
    // The job's own trap ran: it was sent SIGTERM, not only SIGKILL.
    assert_eq!(lines(ws.path().join("trapped.txt")), ["term"]);
}

/// Starts `run` with `args` (`--database-url URL run long --period DAY`),
/// freezes it once its job runs, and releases its period: the runner
/// cannot stop its job.
fn frozen_and_released(ws: &Workspace, args: &[&str]) -> Child {
    let frozen = start(ws, args);
    eventually("attempt 1", BOUND, || starts(ws, "long").len() == 1);
    signal(&frozen, Signal::SIGSTOP);
    let released = ws.run(&[args[0], args[1], "release", "long", "--period", args[5]]);
    assert_eq!(released.code(), 0, "{}", released.stderr());
    frozen
}

#[test]
fn release_of_a_frozen_runners_claim_waits_for_its_lease() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&("[scheduler]\nlease = \"4s\"\n".to_owned() + &overlap_job("long")));
    let today = today();
    let args = ["--database-url", &db.url, "run", "long", "--period", &today];
    let frozen = frozen_and_released(&ws, &args);
    // Its runner cannot stop the job: the period stays held until the lease
    // it was granted has run out (and the job's supervisor has stopped it).
    // A hand run of it waits for that, `--wait` or not.
    let released_at = Instant::now();
    let takeover = start(&ws, &args);
    eventually("the takeover", BOUND, || starts(&ws, "long").len() == 2);
    assert!(
        released_at.elapsed() >= Duration::from_secs(1),
        "taken over before the frozen runner's lease ran out"
    );
    assert!(!overlapped(&ws), "{:?}", lines(ws.path().join("runs.txt")));
    signal(&takeover, Signal::SIGKILL);
    wait(takeover, BOUND);
    signal(&frozen, Signal::SIGKILL);
    wait(frozen, BOUND);
}

#[test]
fn a_hand_run_right_after_release_runs_the_period_once_its_runner_has_stopped() {
    for db in databases() {
        let ws = Workspace::new(
            "[scheduler]\nlease = \"6s\"\n\n[[job]]\nname = \"long\"\nschedule = \"0 0 * * *\"\nperiod = \"day\"\n\
             shell = 'echo $SCHEDULER_ATTEMPT >> runs.txt; [ $SCHEDULER_ATTEMPT -gt 1 ] || exec sleep 60'\n",
        );
        let today = today();
        let args = ["--database-url", &db.url, "run", "long", "--period", &today];
        let first = start(&ws, &args);
        eventually("attempt 1", BOUND, || {
            lines(ws.path().join("runs.txt")) == ["1"]
        });
        let released = ws.run(&[
            "--database-url",
            &db.url,
            "release",
            "long",
            "--period",
            &today,
        ]);
        assert_eq!(released.code(), 0, "{}", released.stderr());
        // Nobody else will run the released period: the hand run waits for
        // the old runner to stop its job, then runs it.
        let again = wait(start(&ws, &args), BOUND);
        assert_eq!(again.code(), 0, "{}{}", again.stdout(), again.stderr());
        assert!(again.stdout().contains("succeeded"), "{}", again.stdout());
        assert_eq!(lines(ws.path().join("runs.txt")), ["1", "2"], "{}", db.url);
        let first = wait(first, BOUND);
        assert!(first.stdout().contains("released"), "{}", first.stdout());
    }
}

#[test]
fn a_hand_run_interrupted_while_it_waits_behind_a_release_exits_1() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&("[scheduler]\nlease = \"30s\"\n".to_owned() + &overlap_job("long")));
    let today = today();
    let args = ["--database-url", &db.url, "run", "long", "--period", &today];
    let frozen = frozen_and_released(&ws, &args);
    let waiting_log = ws.path().join("waiting.log");
    let waiting = ws
        .command(&args)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&waiting_log).unwrap())
        .spawn()
        .unwrap();
    let said = || std::fs::read_to_string(&waiting_log).unwrap_or_default();
    eventually("the hand run to wait behind the release", BOUND, || {
        said().contains("waiting for the run elsewhere")
    });
    signal(&waiting, Signal::SIGTERM);
    let out = wait(waiting, BOUND);
    assert_eq!(out.code(), 1, "{}{}", out.stdout(), said());
    assert!(out.stdout().contains("interrupted"), "{}", out.stdout());
    assert_eq!(starts(&ws, "long").len(), 1);
    signal(&frozen, Signal::SIGKILL);
    wait(frozen, BOUND);
}

/// The parent of process `pid`.
fn parent(pid: i32) -> i32 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 1..];
    after.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn kill_9_of_the_zygote_leaves_running_jobs_supervised_and_the_next_jobs_start() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        &("[scheduler]\nlease = \"60s\"\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\n"
            .to_owned()
            + &overlap_job("long")
            + "\n[[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\nperiod = \"fire\"\nshell = 'echo $SCHEDULER_PERIOD >> ticks.txt'\n"),
    );
    let server = serve(&ws, &db.url);
    eventually("attempt 1", BOUND, || starts(&ws, "long").len() == 1);
    let (_, shell) = starts(&ws, "long")[0];
    // The job's supervisor was forked by the scheduler's zygote.
    let zygote = parent(parent(shell));
    assert_ne!(zygote, server.id() as i32);
    assert_eq!(parent(zygote), server.id() as i32);
    kill(Pid::from_raw(zygote), Signal::SIGKILL).unwrap();
    let ticks = lines(ws.path().join("ticks.txt")).len();
    eventually("jobs started after the zygote died", BOUND, || {
        lines(ws.path().join("ticks.txt")).len() >= ticks + 3
    });
    assert!(
        alive(shell),
        "the running job lives on under its supervisor"
    );
    assert_eq!(starts(&ws, "long").len(), 1);
    // Its supervisor still ends the tree with the scheduler.
    signal(&server, Signal::SIGKILL);
    wait(server, BOUND);
    eventually(
        "the job to die with the scheduler",
        Duration::from_secs(10),
        || !alive(shell),
    );
}

#[test]
fn kill_9_of_a_jobs_supervisor_leaves_nothing_of_its_tree_running_beside_the_next_attempt() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        &("[scheduler]\nlease = \"3s\"\nscan_interval = \"200ms\"\nshutdown_grace = \"1s\"\n"
            .to_owned()
            + &overlap_job("long")
            + "retry = { attempts = 5, backoff = \"1s\" }\n"),
    );
    let server = serve(&ws, &db.url);
    eventually("attempt 1", BOUND, || starts(&ws, "long").len() == 1);
    let (_, shell) = starts(&ws, "long")[0];
    let supervisor = parent(shell);
    kill(Pid::from_raw(supervisor), Signal::SIGKILL).unwrap();
    eventually(
        "the job's shell to be gone",
        Duration::from_secs(10),
        || !alive(shell),
    );
    // An overlap is written before the retry's start line.
    eventually("the retry", BOUND, || starts(&ws, "long").len() == 2);
    assert!(!overlapped(&ws), "{:?}", lines(ws.path().join("runs.txt")));
    assert_eq!(stop(server), 0);
}

#[test]
fn a_stopped_sql_action_on_postgres_is_cancelled_on_the_server() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let ws = Workspace::new(
        "[scheduler]\nlease = \"3s\"\nscan_interval = \"200ms\"\nshutdown_grace = \"1s\"\n\n[[job]]\nname = \"ss\"\nschedule = \"* * * * * *\"\nperiod = \"day\"\nsql = { statement = \"SELECT pg_sleep(20)\" }\n",
    );
    let sleeping = || {
        count(
            &db.url,
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query = 'SELECT pg_sleep(20)' AND datname = current_database()",
        )
    };
    let server = serve(&ws, &db.url);
    eventually("the statement", BOUND, || sleeping() == 1);
    let released = ws.run(&[
        "--database-url",
        &db.url,
        "release",
        "ss",
        "--period",
        &today(),
    ]);
    assert_eq!(released.code(), 0, "{}", released.stderr());
    // The recovery starts a second statement only after the first is gone:
    // watched until the recovery's statement runs.
    let recovering = || {
        count(
            &db.url,
            "SELECT count(*) FROM scheduler_attempts WHERE job = 'ss' AND attempt = 2",
        ) == 1
    };
    let mut most = 0;
    eventually("the recovery's statement", BOUND, || {
        let now = sleeping();
        most = most.max(now);
        now == 1 && recovering()
    });
    most = most.max(sleeping());
    assert_eq!(
        most,
        1,
        "two statements of one period ran at once:\n{}",
        log(&ws)
    );
    assert_eq!(stop(server), 0);
}

#[test]
fn an_sql_action_on_sqlite_holds_the_writer_at_most_lease_over_3_whatever_its_timeout() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[scheduler]\nlease = \"3s\"\n\n[[job]]\nname = \"slow\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ntimeout = \"8s\"\n\
         sql = { statement = \"WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c\" }\n",
    );
    let out = ws.run(&[
        "--database-url",
        &db.url,
        "run",
        "slow",
        "--period",
        "2026-07",
    ]);
    assert_eq!(out.code(), 1, "{}{}", out.stdout(), out.stderr());
    assert!(
        out.stdout().contains("timed out after 1s"),
        "{}",
        out.stdout()
    );
}

#[test]
fn sigterm_while_the_database_path_is_stalled_exits_after_the_grace() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let (proxy, url) = proxied(&db);
    let ws = Workspace::new(
        &("[scheduler]\nlease = \"3s\"\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\n"
            .to_owned()
            + &overlap_job("long")),
    );
    let server = serve(&ws, &url);
    eventually("attempt 1", BOUND, || starts(&ws, "long").len() == 1);
    proxy.stall();
    eventually("serve to wait on the stalled path", BOUND, || {
        proxy.held() > 0
    });
    signal(&server, Signal::SIGTERM);
    let out = wait(server, Duration::from_secs(45));
    assert_eq!(out.code(), 0, "{}", log(&ws));
    proxy.restore();
}

#[test]
fn a_run_cut_off_from_its_database_stops_its_job_and_exits_3() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let (proxy, url) = proxied(&db);
    let ws = Workspace::new(&("[scheduler]\nlease = \"3s\"\n".to_owned() + &overlap_job("long")));
    let runner = ws
        .command(&["--database-url", &url, "run", "long", "--period", &today()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually("attempt 1", BOUND, || starts(&ws, "long").len() == 1);
    proxy.cut();
    let out = wait(runner, BOUND);
    assert_eq!(out.code(), 3, "{}{}", out.stdout(), out.stderr());
    assert!(out.stdout().contains("fenced"), "{}", out.stdout());
    proxy.restore();
}

#[test]
fn a_sighup_while_serve_connects_does_not_end_it() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let (proxy, url) = proxied(&db);
    proxy.stall();
    let ws = Workspace::new(
        &("[scheduler]\nlease = \"3s\"\nshutdown_grace = \"1s\"\n".to_owned()
            + &overlap_job("long")),
    );
    let mut server = serve(&ws, &url);
    eventually("serve to connect through the stalled path", BOUND, || {
        proxy.held() > 0
    });
    signal(&server, Signal::SIGHUP);
    proxy.restore();
    // The SIGHUP is taken once serve runs: it reloads, or it ended.
    eventually("the reload the SIGHUP asked for", BOUND, || {
        logged(&ws, "reloaded", 1) || server.try_wait().unwrap().is_some()
    });
    assert!(
        server.try_wait().unwrap().is_none(),
        "serve ended on a SIGHUP while it connected"
    );
    eventually("attempt 1", BOUND, || starts(&ws, "long").len() == 1);
    assert_eq!(stop(server), 0);
}

#[test]
fn a_sighup_while_serve_reads_its_jobs_does_not_end_it() {
    let db = TestDb::sqlite();
    // A file that takes a while to read: 10,000 jobs.
    let jobs: String = (0..10_000)
        .map(|i| {
            format!(
                "[[job]]\nname = \"j{i}\"\nschedule = \"0 0 1 1 *\"\nperiod = \"year\"\ncommand = [\"true\"]\n\n"
            )
        })
        .collect();
    let ws = Workspace::new(&jobs);
    let size = std::fs::metadata(ws.path().join("jobs.toml"))
        .unwrap()
        .len();
    let mut server = serve(&ws, &db.url);
    // The signal comes once the program has read jobs.toml, while it
    // parses it: its read bytes are past the file's size.
    let io = format!("/proc/{}/io", server.id());
    eventually("jobs.toml read", BOUND, || {
        std::fs::read_to_string(&io)
            .unwrap_or_default()
            .lines()
            .find_map(|l| l.strip_prefix("rchar: ")?.parse::<u64>().ok())
            .is_some_and(|read| read >= size)
    });
    signal(&server, Signal::SIGHUP);
    eventually("serve ready, or ended", BOUND, || {
        logged(&ws, "serving", 1) || server.try_wait().unwrap().is_some()
    });
    assert!(
        server.try_wait().unwrap().is_none(),
        "serve ended on a SIGHUP while it read jobs.toml"
    );
    assert_eq!(stop(server), 0);
}

#[test]
fn a_fire_that_comes_due_while_sighup_rereads_jobs_toml_still_runs() {
    let db = TestDb::sqlite();
    // 10,000 idle jobs beside the every-second one: reading them again
    // takes long enough that a reload spans its fires.
    let mut jobs = "[[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\nshell = \"echo $SCHEDULER_PERIOD >> runs.txt\"\n\n".to_owned();
    for i in 0..10_000 {
        jobs.push_str(&format!(
            "[[job]]\nname = \"j{i}\"\nschedule = \"0 0 1 1 *\"\nperiod = \"year\"\ncommand = [\"true\"]\n\n"
        ));
    }
    let ws = Workspace::new(&jobs);
    let server = serve(&ws, &db.url);
    let runs = ws.path().join("runs.txt");
    eventually("tick running", BOUND, || lines(&runs).len() >= 2);
    let reloads = || {
        std::fs::read_to_string(ws.path().join("serve.log"))
            .unwrap_or_default()
            .matches("reloaded")
            .count()
    };
    for n in 1..=3 {
        signal(&server, Signal::SIGHUP);
        eventually("the reload", BOUND, || reloads() == n);
        // Scenario time: the next reload starts at another phase of the
        // second.
        std::thread::sleep(Duration::from_millis(700));
    }
    let last = Utc::now();
    // Four seconds of fires past the last reload.
    let past = last + chrono::TimeDelta::seconds(4);
    eventually("fires past the reloads", BOUND, || {
        lines(&runs)
            .iter()
            .any(|l| l.parse::<chrono::DateTime<Utc>>().is_ok_and(|t| t >= past))
    });
    assert_eq!(stop(server), 0);
    let mut seconds: Vec<chrono::DateTime<Utc>> = lines(&runs)
        .iter()
        .map(|l| l.parse().unwrap_or_else(|_| panic!("a period label: {l}")))
        .collect();
    seconds.sort();
    let ran = seconds.len();
    seconds.dedup();
    assert_eq!(seconds.len(), ran, "a period ran twice: {seconds:?}");
    let mut at = seconds[0];
    while at < last {
        assert!(seconds.contains(&at), "{at} never ran: {seconds:?}");
        at += chrono::TimeDelta::seconds(1);
    }
}

#[test]
fn fires_of_a_job_removed_by_sighup_that_wait_for_a_slot_start_nothing() {
    let db = TestDb::sqlite();
    let job = |name: &str| {
        format!(
            "[[job]]\nname = \"{name}\"\nschedule = \"* * * * * *\"\nshell = \"echo {name} >> runs.txt; sleep 0.5\"\n\n"
        )
    };
    let kept = "[scheduler]\nmax_running = 1\n\n".to_owned() + &job("j0") + &job("j1");
    let all = (2..6).fold(kept.clone(), |all, i| all + &job(&format!("j{i}")));
    let ws = Workspace::new(&all);
    let server = serve(&ws, &db.url);
    let runs = ws.path().join("runs.txt");
    // Six every-second jobs of half a second each through one slot: a
    // backlog builds.
    eventually("a backlog", BOUND, || lines(&runs).len() >= 8);
    std::fs::write(ws.path().join("jobs.toml"), &kept).unwrap();
    signal(&server, Signal::SIGHUP);
    eventually("the reload", BOUND, || {
        std::fs::read_to_string(ws.path().join("serve.log")).is_ok_and(|l| l.contains("reloaded"))
    });
    let before = lines(&runs).len();
    // Six more runs through the one slot (3 s of them): the backlog's
    // fires of removed jobs would have come first.
    eventually("six runs since the reload", BOUND, || {
        lines(&runs).len() >= before + 6
    });
    assert_eq!(stop(server), 0);
    let after = lines(&runs);
    let removed: Vec<&String> = after[before..]
        .iter()
        .filter(|l| !matches!(l.as_str(), "j0" | "j1"))
        .collect();
    // The one run already handed to the engine may still start.
    assert!(removed.len() <= 1, "removed jobs ran: {removed:?}");
    assert!(after.len() > before + 2, "the kept jobs ran on: {after:?}");
}

#[test]
fn run_job_retries_a_failed_period_whose_retry_is_due() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[[job]]\nname = \"tick\"\nschedule = \"* * * * *\"\nperiod = \"minute\"\nretry = { attempts = 3, backoff = \"1s\" }\n\
         shell = \"echo $SCHEDULER_PERIOD $SCHEDULER_TRIGGER >> runs.txt; test ! -e fail\"\n",
    );
    let earlier = (Utc::now() - chrono::TimeDelta::minutes(2))
        .format("%Y-%m-%dT%H:%M")
        .to_string();
    std::fs::write(ws.path().join("fail"), "").unwrap();
    let failed = ws.run(&[
        "--database-url",
        &db.url,
        "run",
        "tick",
        "--period",
        &earlier,
    ]);
    assert_eq!(failed.code(), 1, "{}", failed.stdout());
    std::fs::remove_file(ws.path().join("fail")).unwrap();
    eventually("the retry to be due", BOUND, || {
        count(
            &db.url,
            "SELECT count(*) FROM scheduler_claims WHERE job = 'tick' AND state = 'failed' \
             AND retry_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER)",
        ) == 1
    });
    let again = ws.run(&["--database-url", &db.url, "run", "tick"]);
    assert_eq!(again.code(), 0, "{}{}", again.stdout(), again.stderr());
    assert!(
        again.stdout().contains(&format!(
            "tick:{earlier}  succeeded: attempt 2, trigger retry"
        )),
        "{}",
        again.stdout()
    );
}

#[test]
fn serve_runs_on_when_nothing_reads_its_log() {
    use std::io::BufRead;
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[scheduler]\nlease = \"6s\"\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\n\n[[job]]\nname = \"t\"\nschedule = \"* * * * * *\"\nshell = \"echo hello\"\n",
    );
    let mut server = ws
        .command(&["--database-url", &db.url, "serve"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The log shipper reads one line and goes away.
    let mut reader = std::io::BufReader::new(server.stderr.take().unwrap());
    let mut first = String::new();
    reader.read_line(&mut first).unwrap();
    drop(reader);
    let count = |outcome: &str| {
        count(
            &db.url,
            &format!("SELECT count(*) FROM scheduler_attempts WHERE outcome = '{outcome}'"),
        )
    };
    // Runs, each of them logged, after the reader went away (at the first
    // line, maybe before the store's tables were made).
    eventually("four runs without a log reader", BOUND, || {
        crate::support::migrated(&db.url) && count("succeeded") >= 4
    });
    assert_eq!(stop(server), 0);
    assert!(count("succeeded") >= 4, "{} succeeded", count("succeeded"));
    assert_eq!((count("lost"), count("running")), (0, 0));
}

#[test]
fn a_stalled_database_never_stops_the_serve_loop() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let (proxy, url) = proxied(&db);
    let ws = Workspace::new(
        "[scheduler]\nlease = \"2s\"\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\n\n[[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\n",
    );
    let server = ws
        .command(&["--database-url", &url, "serve", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(serve_log(&ws))
        .spawn()
        .unwrap();
    let addr = listening_at(&ws.path().join("serve.log"), 0, BOUND);
    eventually("/healthz 200", BOUND, || {
        http_get(&addr, "/healthz").starts_with("HTTP/1.1 200")
    });
    // Scans, claims and renewals now wait on a path that passes nothing;
    // the loop that fires must not.
    proxy.stall();
    let until = Instant::now() + Duration::from_secs(12);
    let mut answers = Vec::new();
    while Instant::now() < until {
        answers.push(http_get(&addr, "/healthz"));
        answers.push(http_get(&addr, "/readyz"));
        // Scenario time: probes at a probe's pace through the 12 s stall.
        std::thread::sleep(Duration::from_millis(250));
    }
    proxy.restore();
    let stuck: Vec<&String> = answers
        .iter()
        .filter(|a| a.contains("serve loop has not run"))
        .collect();
    assert!(stuck.is_empty(), "{stuck:?}");
    assert!(
        answers.iter().any(|a| a.contains("database")),
        "the stall was not noticed: {answers:?}"
    );
    assert_eq!(stop(server), 0);
}

#[test]
fn a_lease_shortened_by_sighup_still_stops_a_frozen_runners_job_before_the_takeover() {
    let db = TestDb::sqlite();
    let settings = |lease: &str| {
        format!(
            "[scheduler]\nlease = \"{lease}\"\nscan_interval = \"500ms\"\nshutdown_grace = \"1s\"\n"
        )
    };
    let ws = Workspace::new(&(settings("30s") + &overlap_job("long")));
    let first = serve(&ws, &db.url);
    eventually("attempt 1", BOUND, || starts(&ws, "long").len() == 1);
    std::fs::write(
        ws.path().join("jobs.toml"),
        settings("3s") + &overlap_job("long"),
    )
    .unwrap();
    signal(&first, Signal::SIGHUP);
    // A renewal with the short lease, then the runner freezes: its job's
    // supervisor must stop the job before that lease runs out.
    // Two of them: the first is passed on to the supervisor by the time
    // the second is written.
    let lease_until = || {
        count(
            &db.url,
            "SELECT lease_until FROM scheduler_claims WHERE job = 'long' AND state = 'running'",
        )
    };
    let now = || {
        count(
            &db.url,
            "SELECT CAST(unixepoch('subsec') * 1000 AS INTEGER)",
        )
    };
    let mut short = 0;
    eventually("a renewal with the short lease", BOUND, || {
        short = lease_until();
        short > 0 && short <= now() + 3000
    });
    eventually("a second renewal with the short lease", BOUND, || {
        lease_until() > short
    });
    signal(&first, Signal::SIGSTOP);
    let second = serve(&ws, &db.url);
    // An overlap is written before the takeover's start line.
    eventually("the takeover", BOUND, || starts(&ws, "long").len() == 2);
    assert!(!overlapped(&ws), "{:?}", lines(ws.path().join("runs.txt")));
    signal(&first, Signal::SIGKILL);
    wait(first, BOUND);
    assert_eq!(stop(second), 0);
}

#[test]
fn without_the_supervisor_binary_beside_it_the_scheduler_supervises_its_jobs_itself() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[[job]]\nname = \"who\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\n\
         shell = \"tr '\\\\0' ' ' < /proc/$PPID/cmdline > parent.txt\"\n",
    );
    // The scheduler alone, as `cargo run` leaves it.
    let alone = ws.path().join("bin");
    std::fs::create_dir(&alone).unwrap();
    std::fs::copy(env!("CARGO_BIN_EXE_scheduler"), alone.join("scheduler")).unwrap();
    let out = std::process::Command::new(alone.join("scheduler"))
        .args([
            "--database-url",
            &db.url,
            "run",
            "who",
            "--period",
            "2026-07",
        ])
        .current_dir(ws.path())
        .env_remove("DATABASE_URL")
        .env_remove("SCHEDULER_CONFIG")
        .output()
        .unwrap();
    assert_eq!(out.code(), 0, "{}{}", out.stdout(), out.stderr());
    let parent = std::fs::read_to_string(ws.path().join("parent.txt")).unwrap();
    assert!(parent.contains("__supervise"), "{parent}");
}

/// The child of `parent` started as the zygote.
fn zygote_of(parent: u32) -> Option<i32> {
    scheduler::engine::supervision::reaper::children_of(parent)
        .into_iter()
        .map(Pid::as_raw)
        .find(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|arg| arg == b"--zygote"))
        })
}

#[test]
fn a_stopped_zygote_and_a_killed_supervisor_leave_nothing_of_the_tree() {
    let db = TestDb::sqlite();
    let base = 7300 + std::process::id() % 50 * 10;
    let ws = Workspace::new(&format!(
        "[scheduler]\nlease = \"60s\"\n\n[[job]]\nname = \"tree\"\nschedule = \"0 0 * * *\"\nperiod = \"day\"\n\
         shell = 'echo $$ > shell.pid; setsid sleep {} & sleep {}'\n",
        base + 1,
        base + 2
    ));
    let runner = start(
        &ws,
        &[
            "--database-url",
            &db.url,
            "run",
            "tree",
            "--period",
            &today(),
        ],
    );
    eventually("the job's tree", BOUND, || {
        !sleeps(base + 1).is_empty() && !sleeps(base + 2).is_empty()
    });
    let shell: i32 = lines(ws.path().join("shell.pid"))[0].parse().unwrap();
    let supervisor = parent(shell);
    let zygote = parent(supervisor);
    assert_eq!(Some(zygote), zygote_of(runner.id()));
    kill(Pid::from_raw(zygote), Signal::SIGSTOP).unwrap();
    kill(Pid::from_raw(supervisor), Signal::SIGKILL).unwrap();
    // The zygote cannot sweep: the runner kills it and sweeps the tree
    // itself before it reports.
    let out = wait(runner, BOUND);
    assert_eq!(out.code(), 1, "{}", out.stderr());
    let left: Vec<i32> = [base + 1, base + 2].into_iter().flat_map(sleeps).collect();
    for pid in &left {
        let _ = kill(Pid::from_raw(*pid), Signal::SIGKILL);
    }
    let _ = kill(Pid::from_raw(zygote), Signal::SIGKILL);
    assert!(left.is_empty(), "left alive: {left:?}");
}

#[test]
fn a_stopped_zygote_is_replaced_and_jobs_go_on_starting() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[scheduler]\nscan_interval = \"1s\"\n\n[[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\nperiod = \"fire\"\nshell = 'echo $SCHEDULER_PERIOD >> ticks.txt'\n",
    );
    let server = serve(&ws, &db.url);
    let ticks = || lines(ws.path().join("ticks.txt")).len();
    eventually("ticks", BOUND, || ticks() >= 2);
    let zygote = zygote_of(server.id()).expect("a zygote");
    kill(Pid::from_raw(zygote), Signal::SIGSTOP).unwrap();
    let before = ticks();
    eventually("ticks from a new zygote", BOUND, || {
        zygote_of(server.id()).is_some_and(|z| z != zygote) && ticks() >= before + 3
    });
    assert_eq!(stop(server), 0);
    let _ = kill(Pid::from_raw(zygote), Signal::SIGKILL);
}

/// A claim the database answered later than its lease can be vouched for
/// (an exclusive lock held 5 s against a 3 s lease) renews its lease before
/// its job starts: the job runs once, under its first attempt
/// (adversarial review: the job started, was fenced a few milliseconds
/// later, and ran again as a recovery).
#[test]
fn a_claim_answered_after_its_lease_could_be_vouched_for_renews_it_before_the_job_starts() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[scheduler]\nlease = \"3s\"\n\n[[job]]\nname = \"late\"\nschedule = \"0 0 1 * *\"\nperiod = \"month\"\n\
         shell = \"echo $SCHEDULER_PERIOD_KEY $SCHEDULER_ATTEMPT >> runs.txt; sleep 1\"\n",
    );
    let migrate = ws.run(&["--database-url", &db.url, "migrate"]);
    assert_eq!(migrate.code(), 0, "{}", migrate.stderr());
    let file = db.url.trim_start_matches("sqlite://").to_owned();
    let locked = ws.path().join("locked");
    let script = format!(
        "(printf 'BEGIN EXCLUSIVE;\\n.shell touch {}\\n'; sleep 5; printf 'COMMIT;\\n') | sqlite3 {file}",
        locked.display()
    );
    let locker = std::process::Command::new("sh")
        .args(["-c", &script])
        .spawn()
        .expect("sqlite3");
    eventually("the lock", BOUND, || locked.exists());
    let out = ws.run(&[
        "--database-url",
        &db.url,
        "run",
        "late",
        "--period",
        "2026-07",
    ]);
    let _ = wait(locker, BOUND);
    assert!(
        out.stdout().contains("succeeded"),
        "{}{}",
        out.stdout(),
        out.stderr()
    );
    // Once the lease could have run out, still one run.
    let again = ws.run(&[
        "--database-url",
        &db.url,
        "run",
        "late",
        "--period",
        "2026-07",
    ]);
    assert!(
        again.stdout().contains("already succeeded"),
        "{}{}",
        again.stdout(),
        again.stderr()
    );
    assert_eq!(lines(ws.path().join("runs.txt")), ["late:2026-07 1"]);
}
