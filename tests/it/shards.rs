//! Periods split into shards (`shards = N`): each shard claimed, run and
//! recorded once under its own key, the period standing as its shards
//! do, `--shard` for one of them, `after` waiting for all of them, and
//! the mistakes a user can make with them.

use std::time::Duration;

use crate::support::{Said, TestDb, Workspace, count, databases, wait};

const BOUND: Duration = Duration::from_secs(60);

/// A monthly `billing` job split four ways whose command notes each run's
/// shard (from its environment and its placeholders) in `runs`, and fails
/// shard 1 while the file `fail-1` exists.
fn billing(more: &str) -> Workspace {
    Workspace::new(&format!(
        "[scheduler]\nlease = \"5s\"\n\n[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\n\
         period = \"month\"\ncovers = \"previous\"\nshards = 4\n\
         shell = \"echo $SCHEDULER_PERIOD_KEY $SCHEDULER_SHARD/$SCHEDULER_SHARDS {{shard}}/{{shards}} >> runs; \
         test ! -e fail-$SCHEDULER_SHARD\"\n{more}"
    ))
}

fn scheduler(ws: &Workspace, db: &TestDb, args: &[&str]) -> std::process::Output {
    let mut all = vec!["--database-url", db.url.as_str()];
    all.extend_from_slice(args);
    let child = ws
        .command(&all)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn scheduler");
    wait(child, BOUND)
}

/// The lines of `runs`, sorted.
fn runs(ws: &Workspace) -> Vec<String> {
    let text = std::fs::read_to_string(ws.path().join("runs")).unwrap_or_default();
    let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
    lines.sort();
    lines
}

/// The state `status --json` gives the period, and each shard's.
fn states(ws: &Workspace, db: &TestDb, label: &str) -> (String, Vec<String>) {
    let out = scheduler(
        ws,
        db,
        &[
            "status", "billing", "--from", label, "--to", label, "--json",
        ],
    );
    assert_eq!(out.code(), 0, "{}", out.stderr());
    let line = out.stdout();
    let view: serde_json::Value = serde_json::from_str(line.lines().next().unwrap_or_default())
        .unwrap_or_else(|e| panic!("{e}: {line}"));
    let state = view["state"].as_str().unwrap_or_default().to_owned();
    let shards = view["shards"]
        .as_array()
        .map(|all| {
            all.iter()
                .map(|s| s["state"].as_str().unwrap_or_default().to_owned())
                .collect()
        })
        .unwrap_or_default();
    (state, shards)
}

#[test]
fn each_shard_of_a_period_runs_once_with_its_shard_in_its_environment() {
    for db in databases() {
        let ws = billing("");
        let out = scheduler(&ws, &db, &["run", "billing", "--period", "2026-01"]);
        assert_eq!(out.code(), 0, "{}{}", out.stdout(), out.stderr());
        let expected: Vec<String> = (0..4)
            .map(|k| format!("billing:2026-01#{k}/4 {k}/4 {k}/4"))
            .collect();
        assert_eq!(runs(&ws), expected, "{}", db.url);
        // One line per shard, each under its own key.
        for k in 0..4 {
            assert!(
                out.stdout().contains(&format!("billing:2026-01#{k}/4")),
                "{}",
                out.stdout()
            );
        }
        // Asked again, nothing runs: every shard succeeded.
        let again = scheduler(&ws, &db, &["run", "billing", "--period", "2026-01"]);
        assert_eq!(again.code(), 0, "{}", again.stderr());
        assert_eq!(runs(&ws).len(), 4, "{}", db.url);
        let (state, shards) = states(&ws, &db, "2026-01");
        assert_eq!(state, "succeeded");
        assert_eq!(shards, vec!["succeeded"; 4]);
        let rows = count(
            &db.url,
            "SELECT count(*) FROM scheduler_claims WHERE job = 'billing'",
        );
        assert_eq!(rows, 4, "one claim row per shard");
    }
}

#[test]
fn a_failed_shard_fails_its_period_and_a_rerun_runs_only_that_shard() {
    for db in databases() {
        let ws = billing("");
        std::fs::write(ws.path().join("fail-1"), "").expect("a marker");
        let out = scheduler(&ws, &db, &["run", "billing", "--period", "2026-01"]);
        assert_eq!(out.code(), 1, "{}{}", out.stdout(), out.stderr());
        let (state, shards) = states(&ws, &db, "2026-01");
        assert_eq!(state, "failed", "{}", db.url);
        assert_eq!(shards, ["succeeded", "failed", "succeeded", "succeeded"]);
        std::fs::remove_file(ws.path().join("fail-1")).expect("marker gone");
        let out = scheduler(&ws, &db, &["run", "billing", "--period", "2026-01"]);
        assert_eq!(out.code(), 0, "{}{}", out.stdout(), out.stderr());
        let shard_1 = runs(&ws)
            .iter()
            .filter(|l| l.starts_with("billing:2026-01#1/4"))
            .count();
        assert_eq!(shard_1, 2, "shard 1 ran twice: failed, then again");
        assert_eq!(runs(&ws).len(), 5, "the others ran once: {:?}", runs(&ws));
        assert_eq!(states(&ws, &db, "2026-01").0, "succeeded");
    }
}

#[test]
fn one_shard_runs_by_hand_and_the_period_waits_for_the_rest() {
    for db in databases() {
        let ws = billing("");
        let out = scheduler(
            &ws,
            &db,
            &["run", "billing", "--period", "2026-01", "--shard", "2"],
        );
        assert_eq!(out.code(), 0, "{}{}", out.stdout(), out.stderr());
        assert_eq!(runs(&ws), ["billing:2026-01#2/4 2/4 2/4"]);
        let (state, shards) = states(&ws, &db, "2026-01");
        assert_ne!(state, "succeeded", "three shards never ran");
        assert_eq!(shards[2], "succeeded");
        // Forced, the one shard runs again, alone.
        let out = scheduler(
            &ws,
            &db,
            &[
                "run", "billing", "--period", "2026-01", "--shard", "2", "--force",
            ],
        );
        assert_eq!(out.code(), 0, "{}{}", out.stdout(), out.stderr());
        assert_eq!(runs(&ws).len(), 2);
    }
}

#[test]
fn a_shard_the_job_does_not_have_is_refused_with_the_range() {
    let db = TestDb::sqlite();
    let ws = billing("");
    let out = scheduler(
        &ws,
        &db,
        &["run", "billing", "--period", "2026-01", "--shard", "4"],
    );
    assert_eq!(out.code(), 2, "{}", out.stderr());
    assert!(
        out.stderr()
            .contains("--shard 4 is out of range: job `billing` has 4 shards, 0 to 3"),
        "{}",
        out.stderr()
    );
    let plain = Workspace::new(
        "[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ncommand = [\"true\"]\n",
    );
    let out = scheduler(
        &plain,
        &db,
        &["run", "billing", "--period", "2026-01", "--shard", "0"],
    );
    assert_eq!(out.code(), 2, "{}", out.stderr());
    assert!(
        out.stderr()
            .contains("--shard 0: job `billing` is not split into shards"),
        "{}",
        out.stderr()
    );
    assert!(runs(&ws).is_empty() && runs(&plain).is_empty());
}

#[test]
fn a_downstream_period_waits_for_every_shard_upstream() {
    for db in databases() {
        let ws = billing(
            "\n[[job]]\nname = \"report\"\nschedule = \"0 3 1 * *\"\nperiod = \"month\"\n\
             covers = \"previous\"\nafter = [\"billing\"]\nshell = \"echo report >> reports\"\n",
        );
        std::fs::write(ws.path().join("fail-3"), "").expect("a marker");
        let out = scheduler(&ws, &db, &["run", "billing", "--period", "2026-01"]);
        assert_eq!(out.code(), 1, "{}{}", out.stdout(), out.stderr());
        let out = scheduler(&ws, &db, &["run", "report", "--period", "2026-01"]);
        assert!(
            out.stdout().contains("waiting") && out.stdout().contains("billing"),
            "{}{}",
            out.stdout(),
            out.stderr()
        );
        assert!(!ws.path().join("reports").exists(), "ran before shard 3");
        std::fs::remove_file(ws.path().join("fail-3")).expect("marker gone");
        // The billing run that finishes shard 3 runs what waited for it.
        let out = scheduler(&ws, &db, &["run", "billing", "--period", "2026-01"]);
        assert_eq!(out.code(), 0, "{}{}", out.stdout(), out.stderr());
        let reports = std::fs::read_to_string(ws.path().join("reports")).unwrap_or_default();
        assert_eq!(reports.lines().count(), 1, "{}{}", out.stdout(), db.url);
    }
}

#[test]
fn shard_mistakes_in_jobs_toml_name_their_place() {
    let job = "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\n";
    let cases: &[(String, &[&str])] = &[
        (
            format!("{job}shards = 0\ncommand = [\"true\"]\n"),
            &[
                "jobs.toml:4:10",
                "`0` is out of range",
                "from 1 (not split) to 256",
            ],
        ),
        (
            format!("{job}shards = 257\ncommand = [\"true\"]\n"),
            &["jobs.toml:4:10", "`257` is out of range"],
        ),
        (
            format!("{job}shards = 1.5\ncommand = [\"true\"]\n"),
            &["jobs.toml:4:10", "1.5"],
        ),
        (
            format!("{job}command = [\"echo\", \"{{shard}}\"]\n"),
            &[
                "jobs.toml:4:21",
                "`{shard}` in job `a`, whose periods are not split into shards",
                "set `shards = N`",
            ],
        ),
        (
            format!("{job}shards = 1\nhttp = {{ url = \"http://x/{{shards}}\" }}\n"),
            &["jobs.toml:5", "`{shards}` in job `a`"],
        ),
    ];
    for (toml, parts) in cases {
        let ws = Workspace::new(toml);
        let out = ws.run(&["check"]);
        assert_eq!(out.code(), 2, "{toml}\n{}", out.stderr());
        for part in *parts {
            assert!(
                out.stderr().contains(part),
                "{part:?} in:\n{}",
                out.stderr()
            );
        }
    }
}
