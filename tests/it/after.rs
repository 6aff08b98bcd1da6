//! `after`: periods that wait for other jobs' periods (or their own
//! previous one), with real processes on both backends: the month that
//! waits for its last day, replicas that claim it once, reruns upstream,
//! backfill with its upstream, load-time checks and a killed replica.

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;
use serde_json::json;

use crate::serve::{serve, serve_listening, signal, stop};
use crate::support::{
    Said, TestDb, Workspace, count, databases, eventually, fired_on_each, lines, ticker, wait,
    within,
};

const BOUND: Duration = Duration::from_secs(60);

/// A daily `ingest` and a monthly `report` of the month before, after
/// it; each run appends a line to runs.txt. `extra` goes into `report`.
fn daily_and_monthly(extra: &str) -> String {
    format!(
        "[scheduler]\nlease = \"2s\"\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\n{}",
        daily_and_monthly_jobs(extra)
    )
}

/// The jobs of [`daily_and_monthly`].
fn daily_and_monthly_jobs(extra: &str) -> String {
    format!(
        "\n[[job]]\nname = \"ingest\"\nschedule = \"0 1 * * *\"\nperiod = \"day\"\n\
         shell = \"echo ingest $SCHEDULER_PERIOD >> runs.txt\"\n\n\
         [[job]]\nname = \"report\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ncovers = \"previous\"\n\
         after = [\"ingest\"]\n{extra}\n\
         shell = \"echo report $SCHEDULER_PERIOD $SCHEDULER_TRIGGER >> runs.txt\"\n"
    )
}

fn runs(ws: &Workspace) -> Vec<String> {
    lines(ws.path().join("runs.txt"))
}

/// A job beside the ones under test whose fires count each replica's
/// progress (its next-fire gauge).
fn witness() -> String {
    ticker("witness", "ticks.txt")
}

/// `count` replicas listening, and their addresses.
fn replicas(ws: &Workspace, db: &TestDb, count: usize) -> (Vec<std::process::Child>, Vec<String>) {
    (0..count)
        .map(|_| serve_listening(ws, &db.url, &[]))
        .unzip()
}

/// Waits until every replica at `addrs` has fired the witness three more
/// times: several scans of each (one a second).
fn several_scans(addrs: &[String]) {
    let addrs: Vec<&str> = addrs.iter().map(String::as_str).collect();
    fired_on_each(&addrs, "witness", 3);
}

/// `scheduler --database-url URL ARGS…`.
fn said(ws: &Workspace, db: &TestDb, args: &[&str]) -> std::process::Output {
    ws.run(&[&["--database-url", &db.url], args].concat())
}

/// `scheduler --database-url URL ARGS…`, which must exit 0.
fn ok(ws: &Workspace, db: &TestDb, args: &[&str]) -> String {
    let out = said(ws, db, args);
    assert_eq!(out.code(), 0, "{args:?}: {}{}", out.stdout(), out.stderr());
    out.stdout()
}

/// Runs `ingest` from 1 to 30 October, then `report` for October, which
/// waits for the 31st: what `run report` said.
fn thirty_days_then_the_month(ws: &Workspace, db: &TestDb) -> std::process::Output {
    ok(
        ws,
        db,
        &[
            "run",
            "ingest",
            "--from",
            "2026-10-01",
            "--to",
            "2026-10-30",
        ],
    );
    said(ws, db, &["run", "report", "--period", "2026-10"])
}

/// Runs `ingest` (which succeeds only while the file `ok` exists) from
/// `first` to 30 October, and 31 October failing, to be retried.
fn the_last_day_fails(ws: &Workspace, db: &TestDb, first: &str) {
    std::fs::write(ws.path().join("ok"), "").expect("ok");
    ok(
        ws,
        db,
        &["run", "ingest", "--from", first, "--to", "2026-10-30"],
    );
    std::fs::remove_file(ws.path().join("ok")).expect("rm ok");
    let out = said(ws, db, &["run", "ingest", "--period", "2026-10-31"]);
    assert_eq!(out.code(), 1, "{}{}", out.stdout(), out.stderr());
}

fn attempts(db: &TestDb, key: &str) -> i64 {
    count(
        &db.url,
        &format!("SELECT count(*) FROM scheduler_attempts WHERE period_key = '{key}'"),
    )
}

/// 30 of 31 days done: the month waits and `status` names the day; the
/// 31st done by hand: one of three replicas claims the month within a
/// scan, once.
#[test]
fn the_month_waits_for_its_last_day_and_runs_once_across_three_replicas() {
    for db in databases() {
        let ws = Workspace::new(&(daily_and_monthly("") + &witness()));
        let out = thirty_days_then_the_month(&ws, &db);
        assert_eq!(out.code(), 1, "{}{}", out.stdout(), out.stderr());
        assert!(
            out.stdout()
                .contains("report:2026-10  waiting for ingest: 30/31, missing 2026-10-31"),
            "{}",
            out.stdout()
        );
        let status = ok(&ws, &db, &["status", "report"]);
        assert!(
            status.contains("report:2026-10  waiting for ingest: 30/31, missing 2026-10-31"),
            "{status}"
        );
        let range = ok(
            &ws,
            &db,
            &["status", "report", "--from", "2026-10", "--to", "2026-10"],
        );
        assert!(range.contains("report:2026-10  waiting"), "{range}");
        let (replicas, addrs) = replicas(&ws, &db, 3);
        // Several scans of every replica: nothing claims the month.
        several_scans(&addrs);
        assert_eq!(attempts(&db, "report:2026-10"), 0);
        ok(&ws, &db, &["run", "ingest", "--period", "2026-10-31"]);
        eventually("the month runs", BOUND, || {
            runs(&ws).iter().any(|l| l.starts_with("report"))
        });
        // A few more scans of every replica: nothing runs it again.
        several_scans(&addrs);
        for replica in replicas {
            assert_eq!(stop(replica), 0);
        }
        let reports: Vec<String> = runs(&ws)
            .into_iter()
            .filter(|l| l.starts_with("report"))
            .collect();
        assert_eq!(reports, ["report 2026-10 upstream"], "{}", db.url);
        assert_eq!(attempts(&db, "report:2026-10"), 1);
        let status = ok(
            &ws,
            &db,
            &["status", "report", "--from", "2026-10", "--to", "2026-10"],
        );
        assert!(status.contains("report:2026-10  succeeded"), "{status}");
    }
}

/// A daily job with a monthly upstream waits for its month, on both
/// backends; the hours an hourly job of the hour before needs, across
/// both changes of 2026 in Berlin, are those of the same wall-clock hour.
#[test]
fn a_day_waits_for_its_month_and_hours_map_across_dst_in_berlin() {
    let text = "[scheduler]\ntimezone = \"Europe/Berlin\"\n\n\
                [[job]]\nname = \"month\"\nschedule = \"0 3 1 * *\"\nperiod = \"month\"\ncovers = \"previous\"\ncommand = [\"true\"]\n\n\
                [[job]]\nname = \"day\"\nschedule = \"0 4 * * *\"\nperiod = \"day\"\nafter = [\"month\"]\ncommand = [\"true\"]\n\n\
                [[job]]\nname = \"ingest\"\nschedule = \"0 * * * *\"\nperiod = \"hour\"\ncommand = [\"true\"]\n\n\
                [[job]]\nname = \"rollup\"\nschedule = \"5 * * * *\"\nperiod = \"hour\"\ncovers = \"previous\"\nafter = [\"ingest\"]\ncommand = [\"true\"]\n";
    for db in databases() {
        let ws = Workspace::new(text);
        let out = said(&ws, &db, &["run", "day", "--period", "2026-10-15"]);
        assert_eq!(out.code(), 1, "{}{}", out.stdout(), out.stderr());
        assert!(
            out.stdout()
                .contains("day:2026-10-15  waiting for month: 0/1, missing 2026-10"),
            "{}",
            out.stdout()
        );
        // The month's run runs the day it made ready, as a cron container
        // of `month` would.
        let out = ok(&ws, &db, &["run", "month", "--period", "2026-10"]);
        assert!(out.contains("day:2026-10-15  succeeded"), "{out}");
        let out = ok(&ws, &db, &["run", "day", "--period", "2026-10-15"]);
        assert!(
            out.contains("day:2026-10-15  skipped: already succeeded"),
            "{out}"
        );
    }
    let config =
        scheduler::config::Config::parse(Path::new("jobs.toml"), text, &|_| None).expect("valid");
    let rollup = config
        .jobs
        .iter()
        .find(|j| &*j.name == "rollup")
        .expect("rollup");
    let needs = |from: &str, to: &str| -> Vec<(String, String)> {
        let from = crate::support::at(from);
        let to = crate::support::at(to);
        rollup
            .schedule
            .fires_between(from, to)
            .map(|fire| {
                let period = rollup.period.period_of(&rollup.schedule, fire);
                let needed = scheduler::engine::after::upstream_of(rollup, &period);
                let labels: Vec<String> = needed.into_iter().map(|(_, label)| label).collect();
                (period.label, labels.join(" "))
            })
            .fold(Vec::new(), |mut periods, period| {
                // Two fires of one period (a shifted one beside it) are
                // one period.
                if periods.last() != Some(&period) {
                    periods.push(period);
                }
                periods
            })
    };
    let same_hour = |label: &str| (label.to_owned(), label.to_owned());
    // 29 March: 02:00 to 03:00 does not exist; the fire of 02:05, shifted
    // to 03:00 (CEST), and the one of 03:05 cover the hour 01 (the hour 02
    // is no period); 04:05 covers 03, the hour after the change, which
    // ingest's shifted 02:00 and its 03:00 fill.
    assert_eq!(
        needs("2026-03-28T23:30:00Z", "2026-03-29T03:30:00Z"),
        [
            same_hour("2026-03-29T00"),
            same_hour("2026-03-29T01"),
            same_hour("2026-03-29T03"),
            same_hour("2026-03-29T04"),
        ]
    );
    // 25 October: 02:00 to 03:00 comes twice; the hour 02 spans both
    // passes, and the fire at 03:05 (CET) covers it: it needs ingest's one
    // period 02 (ingest fires at the first 02:00 only).
    assert_eq!(
        needs("2026-10-24T22:30:00Z", "2026-10-25T03:30:00Z"),
        [
            same_hour("2026-10-25T00"),
            same_hour("2026-10-25T01"),
            same_hour("2026-10-25T02"),
            same_hour("2026-10-25T03"),
        ]
    );
}

/// A forced rerun of one day makes the month stale (the default); a job
/// that reruns on it (`on_upstream_rerun = "rerun"`) runs again once,
/// trigger `upstream`, however many replicas find it stale.
#[test]
fn a_forced_rerun_of_a_day_marks_the_month_stale_or_reruns_it_once() {
    for db in databases() {
        let mut text = daily_and_monthly("");
        text.push_str(
            "\n[[job]]\nname = \"bill\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ncovers = \"previous\"\n\
             after = [\"ingest\"]\non_upstream_rerun = \"rerun\"\n\
             shell = \"echo bill $SCHEDULER_PERIOD $SCHEDULER_TRIGGER >> runs.txt\"\n",
        );
        text.push_str(&witness());
        let ws = Workspace::new(&text);
        ok(
            &ws,
            &db,
            &[
                "run",
                "ingest",
                "--from",
                "2026-10-01",
                "--to",
                "2026-10-31",
            ],
        );
        ok(&ws, &db, &["run", "report", "--period", "2026-10"]);
        ok(&ws, &db, &["run", "bill", "--period", "2026-10"]);
        let before = ok(
            &ws,
            &db,
            &["status", "report", "--from", "2026-10", "--to", "2026-10"],
        );
        assert!(before.contains("report:2026-10  succeeded"), "{before}");
        ok(
            &ws,
            &db,
            &["run", "ingest", "--period", "2026-10-15", "--force"],
        );
        let after = ok(
            &ws,
            &db,
            &["status", "report", "--from", "2026-10", "--to", "2026-10"],
        );
        assert!(
            after.contains("report:2026-10  stale")
                && after.contains("stale: ingest:2026-10-15 succeeded again at"),
            "{after}"
        );
        let status = ok(&ws, &db, &["status", "report"]);
        assert!(
            status.contains("stale (1):\n  report:2026-10  ingest:2026-10-15 succeeded again at"),
            "{status}"
        );
        // Two replicas find `bill` stale: one reruns it.
        let (replicas, addrs) = replicas(&ws, &db, 2);
        eventually("the rerun of bill", BOUND, || {
            runs(&ws).iter().any(|l| l == "bill 2026-10 upstream")
        });
        // Several scans of both: neither reruns anything again.
        several_scans(&addrs);
        for replica in replicas {
            assert_eq!(stop(replica), 0);
        }
        let bills: Vec<String> = runs(&ws)
            .into_iter()
            .filter(|l| l.starts_with("bill"))
            .collect();
        assert_eq!(bills, ["bill 2026-10 manual", "bill 2026-10 upstream"]);
        assert_eq!(attempts(&db, "bill:2026-10"), 2);
        // `report` was left stale: nothing ran it.
        assert_eq!(attempts(&db, "report:2026-10"), 1);
        let bill = ok(
            &ws,
            &db,
            &["status", "bill", "--from", "2026-10", "--to", "2026-10"],
        );
        assert!(bill.contains("bill:2026-10  succeeded"), "{bill}");
        // A scheduled `run` finds nothing stale any more.
        ok(&ws, &db, &["run", "bill"]);
        assert_eq!(attempts(&db, "bill:2026-10"), 2);
    }
}

/// Without `--with-upstream` a backfill says what each period waits for;
/// with it, the days run first, in order, then the months, each once; a
/// second backfill runs nothing. The HTTP API's runs take the same option.
#[test]
fn a_backfill_with_its_upstream_runs_the_days_then_the_months_each_once() {
    for db in databases() {
        let ws = Workspace::new(&daily_and_monthly(""));
        let out = said(
            &ws,
            &db,
            &["run", "report", "--from", "2026-09", "--to", "2026-10"],
        );
        assert_eq!(out.code(), 1, "{}{}", out.stdout(), out.stderr());
        let said = out.stdout();
        assert!(
            said.contains("report:2026-09  waiting for ingest: 0/30, missing 2026-09-01, 2026-09-02, 2026-09-03 and 27 more")
                && said.contains("report:2026-10  waiting for ingest: 0/31"),
            "{said}"
        );
        assert!(runs(&ws).is_empty());
        let backfill = [
            "run",
            "report",
            "--from",
            "2026-09",
            "--to",
            "2026-10",
            "--with-upstream",
        ];
        ok(&ws, &db, &backfill);
        let ran = runs(&ws);
        let mut expected: Vec<String> = Vec::new();
        for (month, days) in [("09", 30), ("10", 31)] {
            for day in 1..=days {
                expected.push(format!("ingest 2026-{month}-{day:02}"));
            }
        }
        expected.push("report 2026-09 manual".into());
        expected.push("report 2026-10 manual".into());
        assert_eq!(ran, expected);
        ok(&ws, &db, &backfill);
        assert_eq!(runs(&ws).len(), expected.len());
    }
    let db = TestDb::postgres_blocking().unwrap_or_else(TestDb::sqlite);
    let ws = Workspace::new(&crate::api::with_api(&daily_and_monthly_jobs("")));
    let server = crate::api::Server::start(&ws, &db.url);
    // `serve` runs the latest day of `ingest` when it first sees it; while
    // that run holds the job's one concurrency slot a day of the backfill
    // would be `busy` (and the month left waiting), so the backfill is
    // asked for once that run has ended.
    eventually("serve's first run of ingest ended", BOUND, || {
        count(
            &db.url,
            "SELECT count(*) FROM scheduler_claims WHERE job = 'ingest' AND state = 'succeeded'",
        ) == 1
    });
    let body = json!({ "period": "2026-08", "with_upstream": true });
    let (status, _, _, answer) =
        crate::api::answer(server.post(crate::api::CI, "/v1/jobs/report/runs", "aug", &body));
    assert_eq!(status, reqwest::StatusCode::ACCEPTED, "{answer}");
    let month_ran = within(BOUND, || {
        runs(&ws).iter().any(|l| l.starts_with("report 2026-08"))
    });
    assert!(
        month_ran,
        "the month did not run: {:?}\n{}",
        runs(&ws),
        std::fs::read_to_string(ws.path().join("serve.log")).unwrap_or_default()
    );
    // August's 31 days, then its month (`serve` may also have run a job's
    // latest fire when it first saw it).
    let ran: Vec<String> = runs(&ws)
        .into_iter()
        .filter(|l| l.contains("2026-08"))
        .collect();
    assert_eq!(ran.len(), 32, "{ran:?}");
    assert_eq!(
        ran.last().map(String::as_str),
        Some("report 2026-08 manual")
    );
    assert_eq!(server.stop(), 0);
}

/// An unknown name, a cycle, an upstream whose claims are pruned before
/// its downstream needs them, and one with too many periods to look up
/// for each downstream period are each refused at load, with their place;
/// `check` says all of them.
#[test]
fn a_cycle_an_unknown_name_and_a_dependency_never_satisfied_are_refused_at_load() {
    let text = "[[job]]\nname = \"ingest\"\nschedule = \"0 1 * * *\"\nperiod = \"day\"\nkeep = \"7d\"\ncommand = [\"true\"]\n\n\
                [[job]]\nname = \"report\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\nafter = [\"ingest\", \"ingset\"]\ncommand = [\"true\"]\n\n\
                [[job]]\nname = \"a\"\nschedule = \"0 1 * * *\"\nafter = [\"b\"]\ncommand = [\"true\"]\n\n\
                [[job]]\nname = \"b\"\nschedule = \"0 1 * * *\"\nafter = [\"c\"]\ncommand = [\"true\"]\n\n\
                [[job]]\nname = \"c\"\nschedule = \"0 1 * * *\"\nafter = [\"a\"]\ncommand = [\"true\"]\n";
    let ws = Workspace::new(text);
    let out = ws.run(&["check"]);
    assert_eq!(out.code(), 2, "{}{}", out.stdout(), out.stderr());
    let said = out.stderr();
    assert!(
        said.contains("jobs.toml:12:20: `after`: no job named `ingset`; did you mean `ingest`?"),
        "{said}"
    );
    assert!(
        said.contains("jobs.toml:12:10: `after`: `ingest` keeps its finished claims for 7d"),
        "{said}"
    );
    assert!(
        said.contains("`after`: a cycle: a → b → c → a; each would wait for the other for ever"),
        "{said}"
    );
    // Placed at the entry that closes the cycle: `c`'s `after`.
    assert!(said.contains("jobs.toml:30:10: `after`: a cycle"), "{said}");
    // A year of minutes is more than one period may need.
    let ws = Workspace::new(
        "[[job]]\nname = \"ticks\"\nschedule = \"* * * * *\"\nperiod = \"minute\"\ncommand = [\"true\"]\n\n\
         [[job]]\nname = \"archive\"\nschedule = \"0 0 1 1 *\"\nperiod = \"year\"\nafter = [\"ticks\"]\ncommand = [\"true\"]\n",
    );
    let out = ws.run(&["check"]);
    assert_eq!(out.code(), 2, "{}{}", out.stdout(), out.stderr());
    assert!(
        out.stderr().contains("jobs.toml:11:10: `after`: a period of `archive` (year) overlaps up to 527100 periods of `ticks` (minute)"),
        "{}",
        out.stderr()
    );
    // `on_upstream_rerun` alone says nothing; waiting for its own previous
    // period while skipping missed ones would stall.
    let lone = "[[job]]\nname = \"lone\"\nschedule = \"0 1 * * *\"\non_upstream_rerun = \"rerun\"\ncommand = [\"true\"]\n";
    let out = Workspace::new(lone).run(&["check"]);
    assert_eq!(out.code(), 2, "{}{}", out.stdout(), out.stderr());
    assert!(
        out.stderr()
            .contains("jobs.toml:4:21: `on_upstream_rerun` without `after`"),
        "{}",
        out.stderr()
    );
    let inc = "[[job]]\nname = \"inc\"\nschedule = \"0 1 * * *\"\nperiod = \"day\"\nmissed = \"latest\"\nafter = [\"inc\"]\ncommand = [\"true\"]\n";
    let out = Workspace::new(inc).run(&["check"]);
    assert_eq!(out.code(), 2, "{}{}", out.stdout(), out.stderr());
    assert!(
        out.stderr().contains("jobs.toml:6:10: `after`: `inc` waits for its own previous period, but `missed = \"latest\"`"),
        "{}",
        out.stderr()
    );
    let ws = Workspace::new(
        "[[job]]\nname = \"a\"\nschedule = \"0 1 * * *\"\nafter = \"b\"\ncommand = [\"true\"]\n",
    );
    let out = ws.run(&["check"]);
    assert_eq!(out.code(), 2);
    assert!(
        out.stderr()
            .contains("`after` is a string, but it must be an array of job names: after = [\"b\"]"),
        "{}",
        out.stderr()
    );
    // A job may wait for its own previous period: no cycle.
    let ws = Workspace::new(
        "[[job]]\nname = \"inc\"\nschedule = \"0 1 * * *\"\nperiod = \"day\"\nafter = [\"inc\"]\ncommand = [\"true\"]\n",
    );
    let out = ws.run(&["check"]);
    assert_eq!(out.code(), 0, "{}{}", out.stdout(), out.stderr());
}

/// The replica that recorded the month's last day is killed before it
/// could claim the month (its one slot was taken): another replica runs
/// the month, once.
#[test]
fn kill_9_of_the_replica_that_recorded_the_last_day_before_it_claimed_the_month() {
    for db in databases() {
        let text = "[scheduler]\nlease = \"2s\"\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\n\n\
                    [[job]]\nname = \"ingest\"\nschedule = \"0 1 * * *\"\nperiod = \"day\"\n\
                    retry = { attempts = 5, backoff = \"1s\" }\n\
                    shell = \"test -f ok && echo ingest $SCHEDULER_PERIOD >> runs.txt\"\n\n\
                    [[job]]\nname = \"report\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ncovers = \"previous\"\n\
                    after = [\"ingest\"]\nconcurrency = 1\n\
                    shell = \"echo start $SCHEDULER_PERIOD >> runs.txt; if [ $SCHEDULER_PERIOD = 2026-09 ]; then sleep 8; fi; echo report $SCHEDULER_PERIOD >> runs.txt\"\n";
        let ws = Workspace::new(&(text.to_owned() + &witness()));
        the_last_day_fails(&ws, &db, "2026-09-01");
        let out = said(&ws, &db, &["run", "report", "--period", "2026-10"]);
        assert!(
            out.stdout().contains("waiting for ingest: 30/31"),
            "{}",
            out.stdout()
        );
        // September holds the month's one slot for 8 s.
        let september = ws
            .command(&[
                "--database-url",
                &db.url,
                "run",
                "report",
                "--period",
                "2026-09",
            ])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("run september");
        eventually("september runs", BOUND, || {
            runs(&ws).iter().any(|l| l == "start 2026-09")
        });
        std::fs::write(ws.path().join("ok"), "").expect("ok");
        // The replica retries the last day, records it, and finds the
        // month's slot taken.
        let recorder = serve(&ws, &db.url);
        eventually("the last day recorded", BOUND, || {
            count(
                &db.url,
                "SELECT count(*) FROM scheduler_claims WHERE period_key = 'ingest:2026-10-31' AND state = 'succeeded'",
            ) == 1
        });
        eventually("the month found its slot taken", BOUND, || {
            std::fs::read_to_string(ws.path().join("serve.log"))
                .unwrap_or_default()
                .contains("no concurrency slot")
        });
        signal(&recorder, Signal::SIGKILL);
        let _ = wait(recorder, BOUND);
        assert_eq!(
            attempts(&db, "report:2026-10"),
            0,
            "claimed before the kill"
        );
        let (mut other, addrs) = replicas(&ws, &db, 1);
        eventually("the month runs", BOUND, || {
            runs(&ws).iter().any(|l| l == "report 2026-10")
        });
        let _ = wait(september, BOUND);
        // Several scans of the other: it starts the month no more.
        several_scans(&addrs);
        assert_eq!(stop(other.remove(0)), 0);
        let starts = runs(&ws)
            .iter()
            .filter(|l| l.as_str() == "start 2026-10")
            .count();
        assert_eq!(starts, 1, "{:?}", runs(&ws));
        assert_eq!(attempts(&db, "report:2026-10"), 1);
    }
}

/// On the replica that records the last upstream success, the waiting
/// period is claimed at once, not at the next scan (here 30 s away).
#[test]
fn the_replica_that_records_the_last_day_claims_the_month_at_once() {
    let db = TestDb::sqlite();
    let text = daily_and_monthly("")
        .replace("scan_interval = \"1s\"", "scan_interval = \"30s\"")
        .replace(
            "shell = \"echo ingest",
            "retry = { attempts = 5, backoff = \"1s\" }\nshell = \"test -f ok && echo ingest",
        );
    let ws = Workspace::new(&text);
    the_last_day_fails(&ws, &db, "2026-10-01");
    let out = said(&ws, &db, &["run", "report", "--period", "2026-10"]);
    assert!(out.stdout().contains("waiting"), "{}", out.stdout());
    std::fs::write(ws.path().join("ok"), "").expect("ok");
    // The retry is due by the first scan, at start-up.
    eventually("the last day's retry due", BOUND, || {
        count(
            &db.url,
            "SELECT count(*) FROM scheduler_claims WHERE period_key = 'ingest:2026-10-31' \
             AND retry_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER)",
        ) == 1
    });
    let started = std::time::Instant::now();
    let replica = serve(&ws, &db.url);
    eventually("the month runs", BOUND, || {
        runs(&ws).iter().any(|l| l.starts_with("report"))
    });
    // Well before the second scan of the interval.
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(stop(replica), 0);
    assert!(runs(&ws).contains(&"report 2026-10 upstream".to_owned()));
}

/// A scheduled `run JOB` claims a period that waited as `upstream` once
/// its upstream is done; before, a dry run says it waits; `run --all`
/// runs a job after the jobs it waits for, whatever their order in the
/// file.
#[test]
fn a_scheduled_run_claims_what_waited_as_upstream_and_run_all_goes_upstream_first() {
    for db in databases() {
        let ws = Workspace::new(&daily_and_monthly(""));
        let out = thirty_days_then_the_month(&ws, &db);
        assert!(
            out.stdout().contains("it runs once they have succeeded"),
            "{}",
            out.stdout()
        );
        let dry = said(
            &ws,
            &db,
            &["run", "report", "--period", "2026-10", "--dry-run"],
        );
        assert!(
            dry.stdout()
                .contains("report:2026-10  waiting for ingest: 30/31, missing 2026-10-31"),
            "{}",
            dry.stdout()
        );
        // The 31st recorded as run elsewhere (`adopt` runs nothing
        // downstream): the next scheduled `run report` takes the month.
        ok(
            &ws,
            &db,
            &[
                "adopt",
                "ingest",
                "--from",
                "2026-10-31",
                "--to",
                "2026-10-31",
            ],
        );
        let out = ok(&ws, &db, &["run", "report"]);
        assert!(
            out.contains("report:2026-10  succeeded: attempt 1, trigger upstream"),
            "{out}"
        );
        assert!(runs(&ws).contains(&"report 2026-10 upstream".to_owned()));
    }
    // The day's report is listed before its ingest.
    let ws = Workspace::new(
        "[[job]]\nname = \"report\"\nschedule = \"0 0 * * *\"\nperiod = \"day\"\nafter = [\"ingest\"]\n\
         shell = \"echo report >> runs.txt\"\n\n\
         [[job]]\nname = \"ingest\"\nschedule = \"0 0 * * *\"\nperiod = \"day\"\n\
         shell = \"echo ingest >> runs.txt\"\n",
    );
    let db = TestDb::sqlite();
    ok(&ws, &db, &["run", "--all"]);
    assert_eq!(runs(&ws), ["ingest", "report"]);
}
