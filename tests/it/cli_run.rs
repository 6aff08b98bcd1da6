//! `scheduler run` as a user (or a platform cron container) runs it: real
//! processes against a real SQLite file and a real PostgreSQL database.

use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::support::{
    Said, TestDb, Workspace, alive, count, databases, eventually, lease_over, lines, wait,
};

const BOUND: Duration = Duration::from_secs(60);

fn workspace(job_body: &str) -> Workspace {
    Workspace::new(&format!(
        "[scheduler]\nlease = \"2s\"\n\n[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ncovers = \"previous\"\n{job_body}\n"
    ))
}

/// `scheduler run billing ARGS…`, started in the background.
fn start(ws: &Workspace, db: &TestDb, args: &[&str]) -> std::process::Child {
    let mut all = vec!["--database-url", db.url.as_str(), "run", "billing"];
    all.extend_from_slice(args);
    ws.command(&all)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// `scheduler run billing ARGS…` to its end.
fn run(ws: &Workspace, db: &TestDb, args: &[&str]) -> std::process::Output {
    wait(start(ws, db, args), BOUND)
}

/// The period key each line of a run's output starts with.
fn keys(out: &std::process::Output) -> Vec<String> {
    out.stdout()
        .lines()
        .map(|l| l.split_whitespace().next().unwrap_or_default().to_owned())
        .collect()
}

/// `run billing --period 2026-01` in the background, once its claim is
/// running: the period (and a concurrency slot) held elsewhere.
fn hold_january(ws: &Workspace, db: &TestDb) -> std::process::Child {
    let holder = start(ws, db, &["--period", "2026-01"]);
    eventually("2026-01 claimed elsewhere", BOUND, || {
        ws.run(&[
            "--database-url",
            &db.url,
            "status",
            "billing",
            "--from",
            "2026-01",
            "--to",
            "2026-01",
        ])
        .stdout()
        .contains("running")
    });
    holder
}

#[test]
fn sixteen_concurrent_runs_of_one_period_execute_it_once() {
    for db in databases() {
        let ws = workspace("shell = \"echo run >> runs.txt; sleep 0.3\"");
        let children: Vec<_> = (0..16)
            .map(|_| start(&ws, &db, &["--period", "2026-07"]))
            .collect();
        for child in children {
            let out = wait(child, BOUND);
            assert_eq!(
                out.code(),
                0,
                "{}: {}{}",
                db.url,
                out.stdout(),
                out.stderr()
            );
        }
        assert_eq!(lines(ws.path().join("runs.txt")).len(), 1, "{}", db.url);
    }
}

#[test]
fn a_killed_runner_holds_its_period_until_the_lease_ends_then_attempt_2_takes_it() {
    for db in databases() {
        let ws = workspace(
            "shell = \"echo $SCHEDULER_ATTEMPT >> attempts.txt; if [ $SCHEDULER_ATTEMPT = 1 ]; then echo $$ > job.pid; exec sleep 30; fi\"",
        );
        let runner = start(&ws, &db, &["--period", "2026-07"]);
        let pid_file = ws.path().join("job.pid");
        eventually("the job to start", BOUND, || lines(&pid_file).len() == 1);
        let job_pid: i32 = lines(&pid_file)[0].parse().unwrap();
        kill(Pid::from_raw(runner.id() as i32), Signal::SIGKILL).unwrap();
        wait(runner, BOUND);
        eventually(
            "the job to die with its runner",
            Duration::from_secs(10),
            || !alive(job_pid),
        );

        let held = run(&ws, &db, &["--period", "2026-07"]);
        assert_eq!(held.code(), 0, "{}", held.stderr());
        assert!(
            held.stdout().contains("skipped: running on"),
            "{}",
            held.stdout()
        );

        eventually("the lease to run out", BOUND, || {
            lease_over(&db.url, "billing:2026-07")
        });
        let taken = run(&ws, &db, &["--period", "2026-07"]);
        assert_eq!(taken.code(), 0, "{}", taken.stderr());
        assert!(
            taken.stdout().contains("succeeded: attempt 2"),
            "{}",
            taken.stdout()
        );
        assert_eq!(
            lines(ws.path().join("attempts.txt")),
            ["1", "2"],
            "{}",
            db.url
        );
    }
}

#[test]
fn a_frozen_runner_cannot_overwrite_the_takeover_and_its_job_is_stopped() {
    for db in databases() {
        let ws = workspace(
            "shell = \"if [ $SCHEDULER_ATTEMPT = 1 ]; then echo $$ > job.pid; sleep 8; echo late >> late.txt; else echo ok >> done.txt; fi\"",
        );
        let frozen = start(&ws, &db, &["--period", "2026-07"]);
        let pid_file = ws.path().join("job.pid");
        eventually("the job to start", BOUND, || lines(&pid_file).len() == 1);
        let job_pid: i32 = lines(&pid_file)[0].parse().unwrap();
        let frozen_pid = Pid::from_raw(frozen.id() as i32);
        kill(frozen_pid, Signal::SIGSTOP).unwrap();
        eventually("the frozen runner's lease to run out", BOUND, || {
            lease_over(&db.url, "billing:2026-07")
        });

        let takeover = run(&ws, &db, &["--period", "2026-07"]);
        assert!(
            takeover.stdout().contains("succeeded: attempt 2"),
            "{}",
            takeover.stdout()
        );

        kill(frozen_pid, Signal::SIGCONT).unwrap();
        // Thawed past its fence: nothing recorded, and the exit says the
        // database (its lease) failed it.
        let out = wait(frozen, BOUND);
        assert_eq!(out.code(), 3, "{}", out.stderr());
        assert!(out.stdout().contains("fenced"), "{}", out.stdout());
        eventually(
            "the frozen runner's job to be stopped",
            Duration::from_secs(5),
            || !alive(job_pid),
        );
        // Its shell writes late.txt itself: gone, it has written it or
        // never will.
        assert!(
            lines(ws.path().join("late.txt")).is_empty(),
            "the stopped job finished anyway"
        );

        let history = wait(
            ws.command(&["--database-url", &db.url, "history", "billing"])
                .stdout(Stdio::piped())
                .spawn()
                .unwrap(),
            BOUND,
        );
        let text = history.stdout();
        assert!(text.contains("attempt 2  succeeded"), "{text}");
        assert!(text.contains("attempt 1  lost"), "{text}");
    }
}

#[test]
fn a_failure_exits_1_and_a_manual_run_retries_with_a_higher_attempt() {
    for db in databases() {
        let ws = workspace("shell = \"echo $SCHEDULER_ATTEMPT >> attempts.txt; test ! -e fail\"");
        std::fs::write(ws.path().join("fail"), "").unwrap();
        let failed = run(&ws, &db, &["--period", "2026-07"]);
        assert_eq!(failed.code(), 1, "{}", failed.stderr());
        assert!(
            failed
                .stdout()
                .contains("failed: exited with status 1 (attempt 1"),
            "{}",
            failed.stdout()
        );

        std::fs::remove_file(ws.path().join("fail")).unwrap();
        let retried = run(&ws, &db, &["--period", "2026-07"]);
        assert_eq!(retried.code(), 0, "{}", retried.stderr());
        assert!(
            retried
                .stdout()
                .contains("succeeded: attempt 2, trigger manual"),
            "{}",
            retried.stdout()
        );

        let again = run(&ws, &db, &["--period", "2026-07"]);
        assert!(
            again.stdout().contains("skipped: already succeeded at"),
            "{}",
            again.stdout()
        );
        let forced = run(&ws, &db, &["--period", "2026-07", "--force"]);
        assert!(
            forced.stdout().contains("succeeded: attempt 3"),
            "{}",
            forced.stdout()
        );
        assert_eq!(lines(ws.path().join("attempts.txt")), ["1", "2", "3"]);
    }
}

#[test]
fn dry_run_claims_nothing() {
    for db in databases() {
        let ws = workspace("shell = \"echo run >> runs.txt\"");
        let out = run(
            &ws,
            &db,
            &["--from", "2026-06", "--to", "2026-07", "--dry-run"],
        );
        assert_eq!(out.code(), 0, "{}", out.stderr());
        assert_eq!(
            out.stdout(),
            "billing:2026-06  would claim: new period\nbilling:2026-07  would claim: new period\n"
        );
        assert!(lines(ws.path().join("runs.txt")).is_empty());
        let real = run(&ws, &db, &["--period", "2026-07"]);
        assert!(
            real.stdout().contains("attempt 1"),
            "nothing was claimed before: {}",
            real.stdout()
        );
    }
}

#[test]
fn only_failed_runs_the_failed_periods_of_a_range_and_passes_over_the_rest() {
    for db in databases() {
        let ws = workspace(
            "command = [\"sh\", \"-c\", \"echo {period} >> runs.txt; test ! -e fail-{period}\"]",
        );
        std::fs::write(ws.path().join("fail-2026-03"), "").unwrap();
        assert_eq!(run(&ws, &db, &["--period", "2026-02"]).code(), 0);
        assert_eq!(run(&ws, &db, &["--period", "2026-03"]).code(), 1);
        std::fs::remove_file(ws.path().join("fail-2026-03")).unwrap();
        let out = run(
            &ws,
            &db,
            &["--from", "2026-02", "--to", "2026-04", "--only-failed"],
        );
        assert_eq!(out.code(), 0, "{}{}", out.stdout(), out.stderr());
        // 2026-03 again; 2026-04, never claimed, left alone.
        assert_eq!(
            lines(ws.path().join("runs.txt")),
            ["2026-02", "2026-03", "2026-03"]
        );
        let said = out.stdout();
        assert!(
            said.contains("billing:2026-04  skipped: not failed (never claimed)"),
            "{said}"
        );
        assert!(
            said.contains("billing:2026-02  skipped: not failed (succeeded)"),
            "{said}"
        );
        for (args, message) in [
            (
                &["--only-failed"][..],
                "--only-failed: needs --period LABEL",
            ),
            (
                &["--period", "2026-02", "--only-failed", "--force"][..],
                "cannot be used with",
            ),
        ] {
            let refused = run(&ws, &db, args);
            assert_eq!(refused.code(), 2, "{args:?}");
            assert!(refused.stderr().contains(message), "{}", refused.stderr());
        }
    }
}

#[test]
fn a_range_runs_oldest_first_and_a_repeat_runs_none() {
    for db in databases() {
        let ws = workspace("command = [\"sh\", \"-c\", \"echo {period} >> runs.txt\"]");
        let out = run(&ws, &db, &["--from", "2026-02", "--to", "2026-06"]);
        assert_eq!(out.code(), 0, "{}", out.stderr());
        assert_eq!(
            lines(ws.path().join("runs.txt")),
            ["2026-02", "2026-03", "2026-04", "2026-05", "2026-06"]
        );
        let repeat = run(
            &ws,
            &db,
            &["--from", "2026-02", "--to", "2026-06", "--json"],
        );
        assert_eq!(repeat.code(), 0);
        let statuses: Vec<serde_json::Value> = repeat
            .stdout()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(statuses.len(), 5);
        assert!(
            statuses.iter().all(|s| s["status"] == "skipped"),
            "{}",
            repeat.stdout()
        );
        assert_eq!(lines(ws.path().join("runs.txt")).len(), 5);
    }
}

#[test]
fn a_backfill_runs_as_many_periods_at_once_as_its_concurrency_allows_and_prints_them_in_order() {
    for db in databases() {
        let ws = workspace(
            "concurrency = 3\nshell = \"echo start >> runs.txt; sleep 0.5; echo end >> runs.txt\"",
        );
        let out = run(&ws, &db, &["--from", "2026-01", "--to", "2026-06"]);
        assert_eq!(out.code(), 0, "{}", out.stderr());
        // The most runs between a start and an end, read from the log.
        let (mut now, mut most) = (0, 0);
        for line in lines(ws.path().join("runs.txt")) {
            now += if line == "start" { 1 } else { -1 };
            most = most.max(now);
        }
        assert_eq!(most, 3, "runs at once");
        let printed = keys(&out);
        let months: Vec<String> = (1..=6).map(|m| format!("billing:2026-0{m}")).collect();
        assert_eq!(printed, months, "{}", out.stdout());
    }
}

/// A `--wait` range printed the periods it ran itself before an earlier
/// one it waited for elsewhere.
#[test]
fn a_waiting_range_prints_a_period_it_waited_for_before_the_later_ones() {
    for db in databases() {
        let ws = workspace("concurrency = 2\nshell = \"sleep 2\"");
        let elsewhere = hold_january(&ws, &db);
        let out = run(
            &ws,
            &db,
            &["--from", "2026-01", "--to", "2026-02", "--wait"],
        );
        assert_eq!(out.code(), 0, "{}", out.stderr());
        let printed = keys(&out);
        assert_eq!(
            printed,
            ["billing:2026-01", "billing:2026-02"],
            "{}",
            out.stdout()
        );
        assert_eq!(wait(elsewhere, BOUND).code(), 0);
    }
}

/// With one of two slots taken elsewhere, a range's batch of two claimed
/// one period and answered the other busy (its own batch mate held the
/// slot): every other period was skipped.
#[test]
fn a_range_with_a_slot_taken_elsewhere_runs_every_period_its_one_slot_allows() {
    for db in databases() {
        let ws = workspace(
            "concurrency = 2\nshell = \"case $SCHEDULER_PERIOD in 2026-01) sleep 4;; *) sleep 0.3;; esac\"",
        );
        let elsewhere = hold_january(&ws, &db);
        let out = run(&ws, &db, &["--from", "2026-02", "--to", "2026-05"]);
        assert_eq!(out.code(), 0, "{}\n{}", out.stdout(), out.stderr());
        let printed: Vec<String> = out
            .stdout()
            .lines()
            .map(|l| l.split_whitespace().take(2).collect::<Vec<_>>().join(" "))
            .collect();
        let months: Vec<String> = (2..=5)
            .map(|m| format!("billing:2026-0{m} succeeded:"))
            .collect();
        assert_eq!(printed, months, "{}", out.stdout());
        assert_eq!(wait(elsewhere, BOUND).code(), 0);
    }
}

/// The wait for a free concurrency slot logged the same line every 500 ms.
#[test]
fn a_wait_for_a_concurrency_slot_is_said_once() {
    let db = TestDb::sqlite();
    let ws = workspace("shell = \"sleep 2\"");
    let first = hold_january(&ws, &db);
    let out = run(&ws, &db, &["--period", "2026-02", "--wait"]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
    let said = out
        .stderr()
        .matches("waiting for a free concurrency slot")
        .count();
    assert_eq!(said, 1, "{}", out.stderr());
    assert_eq!(wait(first, BOUND).code(), 0);
}

#[test]
fn the_job_sees_its_period_in_placeholders_and_environment() {
    let db = TestDb::sqlite();
    let ws = workspace(
        "command = [\"sh\", \"-c\", \"env | grep ^SCHEDULER_ | sort > env.txt; echo $0 > args.txt\", \"{period_key}|{period_start}|{period_end}|{attempt}\"]",
    );
    let out = run(&ws, &db, &["--period", "2026-07"]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
    assert_eq!(
        lines(ws.path().join("args.txt")),
        ["billing:2026-07|2026-07-01T00:00:00Z|2026-08-01T00:00:00Z|1"]
    );
    let env = lines(ws.path().join("env.txt"));
    for expected in [
        "SCHEDULER_ATTEMPT=1",
        "SCHEDULER_JOB=billing",
        "SCHEDULER_PERIOD=2026-07",
        "SCHEDULER_PERIOD_END=2026-08-01T00:00:00Z",
        "SCHEDULER_PERIOD_KEY=billing:2026-07",
        "SCHEDULER_PERIOD_START=2026-07-01T00:00:00Z",
        "SCHEDULER_SCHEDULED_AT=2026-08-01T02:00:00Z",
        "SCHEDULER_TRIGGER=manual",
    ] {
        assert!(
            env.iter().any(|l| l == expected),
            "{expected} missing from {env:?}"
        );
    }
}

#[test]
fn a_first_seen_job_runs_its_latest_due_period_with_trigger_schedule() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[[job]]\nname = \"tick\"\nschedule = \"* * * * *\"\nperiod = \"minute\"\nshell = \"echo $SCHEDULER_TRIGGER >> runs.txt\"\n",
    );
    let out = wait(
        ws.command(&["--database-url", &db.url, "run", "tick"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
        BOUND,
    );
    assert_eq!(out.code(), 0);
    assert_eq!(
        out.stdout().lines().count(),
        1,
        "only the latest period: {}",
        out.stdout()
    );
    assert_eq!(lines(ws.path().join("runs.txt")), ["schedule"]);
}

#[test]
fn a_timeout_kills_the_job_and_counts_as_a_failure() {
    let db = TestDb::sqlite();
    let ws = workspace("timeout = \"1s\"\nshell = \"echo $$ > job.pid; sleep 30 & wait\"");
    let started = std::time::Instant::now();
    let out = run(&ws, &db, &["--period", "2026-07"]);
    assert_eq!(out.code(), 1, "{}", out.stderr());
    assert!(
        out.stdout().contains("timed out after 1s"),
        "{}",
        out.stdout()
    );
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the group was not killed"
    );
}

#[test]
fn an_unreachable_database_exits_3_with_the_password_masked() {
    let ws = workspace("command = [\"true\"]");
    let out = ws.run(&[
        "--database-url",
        "postgres://postgres:s3cret@127.0.0.1:1/test",
        "run",
        "billing",
    ]);
    assert_eq!(out.code(), 3, "{}", out.stderr());
    assert!(
        out.stderr()
            .contains("cannot connect to the database at postgres://postgres:***@127.0.0.1:1/test"),
        "{}",
        out.stderr()
    );
    assert!(!out.stderr().contains("s3cret") && !out.stdout().contains("s3cret"));
    assert!(
        out.stderr().contains("is the server running"),
        "{}",
        out.stderr()
    );
}

/// A PostgreSQL server that answers but has no such database says how to
/// fix it, and exits 3.
#[test]
fn a_database_that_does_not_exist_says_to_create_it() {
    if TestDb::postgres_blocking().is_none() {
        return;
    }
    let mut url = url::Url::parse(&crate::support::postgres_admin_url()).unwrap();
    url.set_path("scheduler_test_no_such_database");
    let ws = workspace("command = [\"true\"]");
    let out = ws.run(&["--database-url", url.as_str(), "status"]);
    assert_eq!(out.code(), 3, "{}", out.stderr());
    assert!(
        out.stderr().contains("does not exist") && out.stderr().contains("create it first"),
        "{}",
        out.stderr()
    );
}

#[test]
fn a_database_url_that_is_neither_sqlite_nor_postgres_is_a_usage_error() {
    let ws = workspace("command = [\"true\"]");
    let out = ws.run(&[
        "--database-url",
        "mysql://root:pw@localhost/x",
        "run",
        "billing",
    ]);
    assert_eq!(out.code(), 2);
    assert!(
        out.stderr().contains("--database-url")
            && out.stderr().contains("mysql://root:***@localhost/x"),
        "{}",
        out.stderr()
    );
}

#[test]
fn a_future_period_is_refused_before_any_claim() {
    let db = TestDb::sqlite();
    let ws = workspace("command = [\"true\"]");
    let out = run(&ws, &db, &["--period", "2999-01"]);
    assert_eq!(out.code(), 2);
    assert!(
        out.stderr()
            .contains("--period: period 2999-01 starts at 2999-01-01T00:00:00Z, after now"),
        "{}",
        out.stderr()
    );
}

#[test]
fn the_database_url_flag_wins_over_the_environment_which_wins_over_the_file() {
    let ws = Workspace::new(
        "[scheduler]\ndatabase_url = \"sqlite://file.db\"\n\n[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ncommand = [\"true\"]\n",
    );
    let with_env = |args: &[&str]| {
        ws.command(args)
            .env("DATABASE_URL", "sqlite://env.db")
            .output()
            .unwrap()
    };
    assert_eq!(
        with_env(&["--database-url", "sqlite://flag.db", "migrate"]).code(),
        0
    );
    assert!(ws.path().join("flag.db").exists() && !ws.path().join("env.db").exists());
    assert_eq!(with_env(&["migrate"]).code(), 0);
    assert!(ws.path().join("env.db").exists() && !ws.path().join("file.db").exists());
    assert_eq!(ws.run(&["migrate"]).code(), 0);
    assert!(ws.path().join("file.db").exists());
}

#[test]
fn wait_reports_the_outcome_of_a_run_held_elsewhere() {
    for db in databases() {
        let ws = workspace("shell = \"echo run >> runs.txt; sleep 1.5\"");
        let first = start(&ws, &db, &["--period", "2026-07"]);
        eventually("the first run to start", BOUND, || {
            lines(ws.path().join("runs.txt")).len() == 1
        });
        let waited = run(&ws, &db, &["--period", "2026-07", "--wait"]);
        assert_eq!(waited.code(), 0, "{}", waited.stderr());
        assert!(
            waited.stdout().contains("succeeded: on "),
            "{}",
            waited.stdout()
        );
        assert_eq!(wait(first, BOUND).code(), 0);
        assert_eq!(
            lines(ws.path().join("runs.txt")).len(),
            1,
            "the waiter must not run it again"
        );
    }
}

#[test]
fn release_stops_the_running_job_and_frees_the_period_once_its_runner_confirms() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[scheduler]\nlease = \"3s\"\n\n[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\n\
         shell = \"echo $SCHEDULER_ATTEMPT $SCHEDULER_TRIGGER >> runs.txt; if [ $SCHEDULER_ATTEMPT = 1 ]; then exec sleep 30; fi\"\n",
    );
    let stuck = start(&ws, &db, &["--period", "2026-07"]);
    eventually("the stuck run", BOUND, || {
        lines(ws.path().join("runs.txt")).len() == 1
    });
    let held = run(&ws, &db, &["--period", "2026-07"]);
    assert!(
        held.stdout().contains("skipped: running on"),
        "{}",
        held.stdout()
    );
    let released = ws.run(&[
        "--database-url",
        &db.url,
        "release",
        "billing",
        "--period",
        "2026-07",
    ]);
    assert_eq!(released.code(), 0);
    assert!(
        released
            .stdout()
            .contains("billing:2026-07: released (was running on"),
        "{}",
        released.stdout()
    );
    // The runner stops its job at its next heartbeat and says the period is
    // not done (exit 1: nobody else is doing it).
    let out = wait(stuck, BOUND);
    assert!(
        out.stdout()
            .contains("released: stopped by a release (`scheduler release`"),
        "{}",
        out.stdout()
    );
    assert_eq!(out.code(), 1);
    let taken = run(&ws, &db, &["--period", "2026-07"]);
    assert!(
        taken.stdout().contains("succeeded: attempt 2"),
        "{}",
        taken.stdout()
    );
    assert_eq!(lines(ws.path().join("runs.txt")), ["1 manual", "2 manual"]);
}

#[test]
fn status_history_and_prune_report_what_the_database_holds() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[scheduler]\ncatch_up = \"1s\"\n[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\nkeep = \"1s\"\nshell = \"test ! -e fail\"\n",
    );
    let url = db.url.as_str();
    assert_eq!(
        ws.run(&[
            "--database-url",
            url,
            "run",
            "billing",
            "--period",
            "2026-06"
        ])
        .code(),
        0
    );
    std::fs::write(ws.path().join("fail"), "").unwrap();
    assert_eq!(
        ws.run(&[
            "--database-url",
            url,
            "run",
            "billing",
            "--period",
            "2026-07"
        ])
        .code(),
        1
    );

    let status = ws.run(&["--database-url", url, "status", "--json"]);
    assert_eq!(status.code(), 0);
    let value: serde_json::Value = serde_json::from_str(status.stdout().trim()).unwrap();
    assert_eq!(value["job"], "billing");
    assert_eq!(value["failed"][0]["period_key"], "billing:2026-07");
    assert_eq!(value["recent"].as_array().unwrap().len(), 2);

    let history = ws.run(&["--database-url", url, "history", "billing", "--json"]);
    let attempts: Vec<serde_json::Value> = history
        .stdout()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(attempts.len(), 2);
    assert_eq!(
        (
            attempts[0]["outcome"].as_str(),
            attempts[0]["exit_code"].as_i64()
        ),
        (Some("failed"), Some(1))
    );

    eventually("both claims older than `keep`", BOUND, || {
        count(
            url,
            "SELECT count(*) FROM scheduler_claims \
             WHERE finished_at + 1000 < CAST(unixepoch('subsec') * 1000 AS INTEGER)",
        ) == 2
    });
    let pruned = ws.run(&["--database-url", url, "prune"]);
    assert!(
        pruned
            .stdout()
            .contains("billing: pruned 2 finished claim(s)"),
        "{}",
        pruned.stdout()
    );
    let history = ws.run(&["--database-url", url, "history", "billing"]);
    assert_eq!(history.stdout(), "");
}

/// Each job's latest fire within catch_up, seen for the first time; a job
/// whose latest fire is older (here: its last active day long past) runs
/// nothing.
#[test]
fn run_all_runs_the_latest_period_of_every_job() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[[job]]\nname = \"a\"\nschedule = \"*/5 * * * *\"\nperiod = \"hour\"\nshell = \"echo a >> runs.txt\"\n\n\
         [[job]]\nname = \"b\"\nschedule = \"0 3 * * *\"\nperiod = \"day\"\nmissed = \"skip\"\nshell = \"echo b >> runs.txt\"\n\n\
         [[job]]\nname = \"c\"\nschedule = \"0 3 * * *\"\nperiod = \"day\"\nactive_until = \"2020-01-01\"\nshell = \"echo c >> runs.txt\"\n",
    );
    let out = ws.run(&["--database-url", &db.url, "run", "--all"]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
    let mut ran = lines(ws.path().join("runs.txt"));
    ran.sort();
    assert_eq!(ran, ["a", "b"]);
}

#[test]
fn a_wrong_password_exits_3_and_never_shows_the_password() {
    let Some(server) = crate::support::PrivatePostgres::start("right-pass") else {
        return;
    };
    let ws = workspace("command = [\"true\"]");
    let right = format!(
        "postgres://postgres:right-pass@127.0.0.1:{}/postgres",
        server.port
    );
    assert_eq!(
        ws.run(&["--database-url", &right, "migrate"]).code(),
        0,
        "the right password works"
    );
    let wrong = format!(
        "postgres://postgres:wr0ng-pass@127.0.0.1:{}/postgres",
        server.port
    );
    let out = ws.run(&["--database-url", &wrong, "run", "billing"]);
    assert_eq!(out.code(), 3, "{}", out.stderr());
    assert!(
        out.stderr().contains("password authentication failed"),
        "{}",
        out.stderr()
    );
    assert!(
        out.stderr().contains(&format!(
            "postgres://postgres:***@127.0.0.1:{}/postgres",
            server.port
        )),
        "{}",
        out.stderr()
    );
    assert!(!out.stderr().contains("wr0ng-pass") && !out.stdout().contains("wr0ng-pass"));
}

#[test]
fn changing_the_schedule_never_reruns_a_succeeded_period() {
    let db = TestDb::sqlite();
    let ws = workspace("shell = \"echo run >> runs.txt\"");
    assert_eq!(run(&ws, &db, &["--period", "2026-07"]).code(), 0);
    std::fs::write(
        ws.path().join("jobs.toml"),
        "[[job]]\nname = \"billing\"\nschedule = \"30 4 15 * *\"\ntimezone = \"Asia/Tokyo\"\nperiod = \"month\"\ncovers = \"previous\"\nshell = \"echo run >> runs.txt\"\n",
    )
    .unwrap();
    let again = run(&ws, &db, &["--period", "2026-07"]);
    assert!(
        again.stdout().contains("skipped: already succeeded"),
        "{}",
        again.stdout()
    );
    let scheduled = run(&ws, &db, &["--from", "2026-06", "--to", "2026-07"]);
    assert!(
        scheduled.stdout().contains("billing:2026-07  skipped"),
        "{}",
        scheduled.stdout()
    );
    assert_eq!(
        lines(ws.path().join("runs.txt")).len(),
        2,
        "only 2026-06 ran after the change"
    );
}

#[test]
fn status_counts_nothing_overdue_from_before_a_job_was_first_seen() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[[job]]\nname = \"tick\"\nschedule = \"* * * * *\"\nperiod = \"minute\"\ncommand = [\"true\"]\n",
    );
    let url = db.url.as_str();
    // `status` reads a database but never creates one.
    assert_eq!(ws.run(&["--database-url", url, "migrate"]).code(), 0);
    let never_run = ws.run(&["--database-url", url, "status", "--json"]);
    let value: serde_json::Value = serde_json::from_str(never_run.stdout().trim()).unwrap();
    // Never seen: a first `serve` or `run tick` now would take its latest
    // minute, and nothing older: that one is overdue, and `first_run`
    // names it.
    let overdue = value["overdue"].as_array().unwrap();
    assert_eq!(overdue.len(), 1, "{value}");
    assert_eq!(value["first_run"], value["overdue"], "{value}");
    assert_eq!(ws.run(&["--database-url", url, "run", "tick"]).code(), 0);
    let status = ws.run(&["--database-url", url, "status", "--json"]);
    let value: serde_json::Value = serde_json::from_str(status.stdout().trim()).unwrap();
    let overdue = value["overdue"].as_array().unwrap();
    // The minute may turn between `run` and `status`: at most that one.
    assert!(overdue.len() <= 1, "{overdue:?}");
}

#[test]
fn a_range_shows_a_progress_bar_on_a_terminal_and_plain_lines_otherwise() {
    let db = TestDb::sqlite();
    let ws = workspace("command = [\"true\"]");
    let plain = run(&ws, &db, &["--from", "2026-01", "--to", "2026-03", "-q"]);
    assert!(!plain.stderr().contains("periods"), "{}", plain.stderr());
    assert_eq!(plain.stdout().lines().count(), 3);
    let command = format!(
        "{} -q --database-url {} run billing --from 2026-04 --to 2026-06",
        env!("CARGO_BIN_EXE_scheduler"),
        db.url
    );
    // `script` runs the command on a pseudo-terminal.
    let Ok(out) = std::process::Command::new("script")
        .args(["-qec", &command, "/dev/null"])
        .current_dir(ws.path())
        .output()
    else {
        crate::support::skip("no `script` to make a terminal");
        return;
    };
    let screen = out.stdout();
    assert!(screen.contains("/3 periods"), "{screen}");
    assert!(screen.contains("billing:2026-06  succeeded"), "{screen}");
}

#[test]
fn sigterm_stops_a_one_shot_run_releases_its_claim_and_exits_1() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[scheduler]\nlease = \"1h\"\nshutdown_grace = \"1s\"\n\n[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\n\
         shell = \"echo $SCHEDULER_ATTEMPT >> runs.txt; if [ $SCHEDULER_ATTEMPT = 1 ]; then exec sleep 30; fi\"\n",
    );
    let first = start(&ws, &db, &["--period", "2026-07"]);
    eventually("the job to start", BOUND, || {
        lines(ws.path().join("runs.txt")).len() == 1
    });
    kill(Pid::from_raw(first.id() as i32), Signal::SIGTERM).unwrap();
    let out = wait(first, Duration::from_secs(20));
    assert_eq!(out.code(), 1, "{}", out.stderr());
    assert!(
        out.stdout().contains("released: interrupted by shutdown"),
        "{}",
        out.stdout()
    );
    let again = run(&ws, &db, &["--period", "2026-07"]);
    assert!(
        again.stdout().contains("succeeded: attempt 2"),
        "no wait for the 1 h lease: {}",
        again.stdout()
    );
}

#[test]
fn json_logs_are_one_object_per_line() {
    let db = TestDb::sqlite();
    let ws = workspace("shell = \"echo hello from the job\"");
    let out = run(&ws, &db, &["--period", "2026-07", "--log-format", "json"]);
    assert_eq!(out.code(), 0);
    let logs: Vec<serde_json::Value> = out
        .stderr()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l}: {e}")))
        .collect();
    assert!(
        logs.iter()
            .any(|l| l["fields"]["message"] == "hello from the job"
                && l["fields"]["period_key"] == "billing:2026-07"),
        "{logs:?}"
    );
}

#[test]
fn status_says_paused_lease_expired_and_retries_exhausted_in_words() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[scheduler]\nlease = \"1s\"\n\n[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\n\
         shell = \"if [ $SCHEDULER_PERIOD = 2026-06 ]; then exit 4; fi; exec sleep 30\"\n",
    );
    assert_eq!(run(&ws, &db, &["--period", "2026-06"]).code(), 1);
    let runner = start(&ws, &db, &["--period", "2026-07"]);
    eventually("the running claim", BOUND, || {
        ws.run(&["--database-url", &db.url, "status", "billing"])
            .stdout()
            .contains("running on")
    });
    kill(Pid::from_raw(runner.id() as i32), Signal::SIGKILL).unwrap();
    wait(runner, BOUND);
    eventually("the lease to run out", BOUND, || {
        lease_over(&db.url, "billing:2026-07")
    });
    assert_eq!(
        ws.run(&["--database-url", &db.url, "pause", "billing"])
            .code(),
        0
    );
    let text = ws
        .run(&["--database-url", &db.url, "status", "billing"])
        .stdout();
    assert!(
        text.lines()
            .nth(1)
            .is_some_and(|row| row.contains("paused")),
        "{text}"
    );
    assert!(
        text.contains("billing:2026-07  attempt 1  lease expired at"),
        "{text}"
    );
    assert!(
        text.contains("billing:2026-06  attempt 1  failed 1 time(s), retries exhausted"),
        "{text}"
    );
    let json = ws
        .run(&["--database-url", &db.url, "status", "billing", "--json"])
        .stdout();
    let value: serde_json::Value = serde_json::from_str(json.trim()).unwrap();
    assert_eq!(value["paused"], true);
}

/// A platform cron container may be all there is: `run JOB` takes a failed
/// period whose retry is due and a released claim however far back they
/// lie, as `serve`'s scan would (issue 26, item 9: they were left for good
/// once older than `catch_up`).
#[test]
fn run_job_takes_due_retries_and_released_claims_older_than_catch_up() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[scheduler]\nlease = \"2s\"\ncatch_up = \"2s\"\nshutdown_grace = \"1s\"\n\n\
         [[job]]\nname = \"flaky\"\nschedule = \"* * * * * *\"\nperiod = \"fire\"\nmissed = \"latest\"\n\
         retry = { attempts = 3, backoff = \"1s\" }\nshell = \"exit 1\"\n\n\
         [[job]]\nname = \"long\"\nschedule = \"* * * * * *\"\nperiod = \"fire\"\nmissed = \"latest\"\n\
         shell = \"echo $SCHEDULER_PERIOD >> long.txt; sleep 60\"\n",
    );
    let url = db.url.as_str();
    let failed = ws.run(&["--database-url", url, "run", "flaky"]);
    assert_eq!(failed.code(), 1, "{}", failed.stderr());
    let long = ws
        .command(&["--database-url", url, "run", "long"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually("the long job to start", BOUND, || {
        !lines(ws.path().join("long.txt")).is_empty()
    });
    kill(Pid::from_raw(long.id() as i32), Signal::SIGTERM).unwrap();
    let released = wait(long, BOUND);
    assert_ne!(released.code(), 0, "{}", released.stderr());
    let first_long = lines(ws.path().join("long.txt"))[0].clone();
    // Past the catch-up window of both periods, and the retry due.
    eventually("both periods older than catch_up", BOUND, || {
        count(
            url,
            "SELECT count(*) FROM scheduler_claims \
             WHERE max(scheduled_at, period_end) + 2000 < CAST(unixepoch('subsec') * 1000 AS INTEGER) \
             AND (state <> 'failed' OR retry_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER))",
        ) == 2
    });
    let flaky_key = keys(&failed)[0].clone();
    for (job, key) in [("flaky", flaky_key), ("long", format!("long:{first_long}"))] {
        let plan = ws.run(&["--database-url", url, "run", job, "--dry-run"]);
        assert_eq!(plan.code(), 0, "{}", plan.stderr());
        assert!(
            plan.stdout()
                .lines()
                .any(|l| l.starts_with(&key) && l.contains("would claim")),
            "{key} is not taken again:\n{}",
            plan.stdout()
        );
    }
}

/// Lateness is the timer's: `serve` logs it for the fires it claims on
/// time, `run JOB` does not for a fire that may be days old (issue 26,
/// item 15: a hand run logged a multi-day `lateness_ms`).
#[test]
fn only_serves_timer_logs_lateness() {
    let db = TestDb::sqlite();
    let ws = workspace("command = [\"true\"]");
    let out = ws.run(&[
        "--database-url",
        &db.url,
        "run",
        "billing",
        "--period",
        "2026-11",
    ]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
    assert!(out.stderr().contains("claim won"), "{}", out.stderr());
    assert!(!out.stderr().contains("lateness_ms"), "{}", out.stderr());
    let ticking = Workspace::new(
        "[[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\nperiod = \"fire\"\ncommand = [\"true\"]\n",
    );
    let server = crate::serve::serve(&ticking, &db.url);
    eventually("a timed claim", BOUND, || {
        std::fs::read_to_string(ticking.path().join("serve.log"))
            .unwrap_or_default()
            .contains("lateness_ms")
    });
    assert_eq!(crate::serve::stop(server), 0);
}

/// A job stopped by `release` or by a shutdown keeps what it printed with
/// its attempt, on both backends (issue 26, item 15: the released attempt
/// lost its output tail).
#[test]
fn a_released_or_shut_down_attempt_keeps_its_output_tail() {
    for db in databases() {
        let ws = Workspace::new(
            "[scheduler]\nlease = \"3s\"\nshutdown_grace = \"1s\"\n\n[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\n\
             shell = \"echo working on $SCHEDULER_PERIOD; echo x >> runs.txt; exec sleep 30\"\n",
        );
        let released = start(&ws, &db, &["--period", "2026-07"]);
        eventually("the run", BOUND, || {
            lines(ws.path().join("runs.txt")).len() == 1
        });
        let out = ws.run(&[
            "--database-url",
            &db.url,
            "release",
            "billing",
            "--period",
            "2026-07",
        ]);
        assert_eq!(out.code(), 0, "{}", out.stderr());
        assert_eq!(wait(released, BOUND).code(), 1);
        let shut = start(&ws, &db, &["--period", "2026-08"]);
        eventually("the second run", BOUND, || {
            lines(ws.path().join("runs.txt")).len() == 2
        });
        kill(Pid::from_raw(shut.id() as i32), Signal::SIGTERM).unwrap();
        wait(shut, BOUND);
        for period in ["2026-07", "2026-08"] {
            let history = ws.run(&[
                "--database-url",
                &db.url,
                "history",
                "billing",
                "--period",
                period,
                "--output",
            ]);
            assert!(
                history.stdout().contains("released")
                    && history.stdout().contains(&format!("working on {period}")),
                "{}: {}",
                db.url,
                history.stdout()
            );
        }
    }
}

/// On a terminal the backfill's progress bar is lifted off the screen for
/// each log line, so no line carries a piece of it (issue 26, item 15:
/// stale bar fragments were glued to log lines). `script` gives the run a
/// terminal.
#[test]
fn log_lines_on_a_terminal_carry_no_piece_of_the_progress_bar() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[[job]]\nname = \"d\"\nschedule = \"0 0 * * *\"\nperiod = \"day\"\nshell = \"echo out $SCHEDULER_PERIOD; sleep 0.1\"\n",
    );
    let line = format!(
        "{} --database-url {} run d --from 2026-01-01 --to 2026-01-06",
        env!("CARGO_BIN_EXE_scheduler"),
        db.url
    );
    let Ok(out) = std::process::Command::new("script")
        .args(["-qfec", &line, "/dev/null"])
        .current_dir(ws.path())
        .env("NO_COLOR", "1")
        .env_remove("SCHEDULER_LOG")
        .env_remove("SCHEDULER_CONFIG")
        .stdin(Stdio::null())
        .output()
    else {
        eprintln!("no `script` here: the terminal is not tested");
        return;
    };
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(text.contains("periods,"), "no progress bar drawn:\n{text}");
    assert!(text.contains("out 2026-01-06"), "{text}");
    for line in text.split('\n') {
        let shown = line.rsplit("\u{1b}[2K").next().unwrap_or_default();
        assert!(
            !(shown.contains("periods,") && shown.contains("INFO")),
            "a log line glued to the bar: {shown:?}"
        );
    }
}

/// Issue 26, item 7: a forced claim that met its row locked by another
/// transaction (a heartbeat, an outcome being written, an operator's
/// `SELECT … FOR UPDATE`) skipped it and said `skipped: already succeeded`.
/// It waits for the lock, then runs the period: one period and a range.
#[test]
fn a_forced_run_waits_for_a_row_another_transaction_holds_and_runs_it() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let ws = workspace("shell = \"echo {period} >> runs.txt\"");
    let first = run(&ws, &db, &["--from", "2026-06", "--to", "2026-07"]);
    assert_eq!(first.code(), 0, "{}", first.stderr());
    let runtime = tokio::runtime::Runtime::new().unwrap();
    for (args, periods) in [
        (&["--period", "2026-07", "--force"][..], &["2026-07"][..]),
        (
            &["--from", "2026-06", "--to", "2026-07", "--force"][..],
            &["2026-06", "2026-07"][..],
        ),
    ] {
        let (holder, locked) = runtime.block_on(async {
            let pool = sqlx::PgPool::connect(&db.url).await.unwrap();
            let mut tx = pool.begin().await.unwrap();
            let locked = sqlx::query(
                "SELECT period_key FROM scheduler_claims WHERE period_key = 'billing:2026-07' FOR UPDATE",
            )
            .fetch_all(&mut *tx)
            .await
            .unwrap()
            .len();
            (tx, locked)
        });
        assert_eq!(locked, 1);
        let before = lines(ws.path().join("runs.txt")).len();
        let forced = start(&ws, &db, args);
        eventually("the forced run to wait for the lock", BOUND, || {
            count(
                &db.url,
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            ) > 0
        });
        runtime.block_on(holder.commit()).unwrap();
        let forced = wait(forced, BOUND);
        assert_eq!(forced.code(), 0, "{}", forced.stderr());
        assert!(
            !forced.stdout().contains("skipped"),
            "a forced run waits for the lock: {}",
            forced.stdout()
        );
        let ran = lines(ws.path().join("runs.txt"));
        let mut new = ran[before..].to_vec();
        new.sort();
        assert_eq!(new, periods, "{}", forced.stdout());
    }
}

#[test]
fn run_of_a_paused_job_runs_nothing_and_says_how_to_resume_it() {
    let db = TestDb::sqlite();
    let ws = workspace("shell = \"echo ran >> runs.txt\"");
    // `run` first sees the job (a job never seen cannot be paused).
    assert_eq!(run(&ws, &db, &[]).code(), 0);
    let paused = ws.run(&["--database-url", &db.url, "pause", "billing"]);
    assert_eq!(paused.code(), 0, "{}", paused.stderr());
    let ran = lines(ws.path().join("runs.txt")).len();
    let out = run(&ws, &db, &[]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
    assert!(
        out.stderr()
            .contains("billing: paused; `scheduler resume billing` to run it again"),
        "{}",
        out.stderr()
    );
    assert_eq!(lines(ws.path().join("runs.txt")).len(), ran);
}

/// `run JOB` exits 1 while a period of its window is failed, whether its
/// retry is not due yet or no retry is left: a failed period is not done,
/// and a platform cron container must not go green over it.
#[test]
fn run_job_exits_1_while_a_period_of_its_window_is_failed() {
    let ws = Workspace::new(
        "[[job]]\nname = \"pending\"\nschedule = \"0 * * * *\"\ncommand = [\"false\"]\nretry = { attempts = 3, backoff = \"1h\" }\n\n\
         [[job]]\nname = \"spent\"\nschedule = \"0 * * * *\"\ncommand = [\"false\"]\n",
    );
    let db = TestDb::sqlite();
    for job in ["pending", "spent"] {
        let first = ws.run(&["--database-url", &db.url, "run", job]);
        assert_eq!(first.code(), 1, "{}{}", first.stdout(), first.stderr());
        let again = ws.run(&["--database-url", &db.url, "run", job]);
        assert_eq!(again.code(), 1, "{}{}", again.stdout(), again.stderr());
        let said = again.stdout();
        let why = if job == "pending" {
            "not due yet"
        } else {
            "no retries left"
        };
        assert!(said.contains("failed: ") && said.contains(why), "{said}");
    }
}
