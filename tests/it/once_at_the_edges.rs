//! Once at the edges: what happens in the first second after a database
//! comes back, and notifications told once through cuts and deploys.

use std::process::Stdio;
use std::time::Duration;

use crate::support::{Said, TestDb, Workspace, count, eventually, lines, proxied, wait};

/// Generous bound for a process to exit: hang detection only.
const BOUND: Duration = Duration::from_secs(90);

/// A job that ends half a second after `cut` appears, noting each start.
const ENDS_IN_THE_CUT: &str = "[scheduler]\nlease = \"6s\"\n\n\
     [[job]]\nname = \"w\"\nschedule = \"0 0 * * *\"\nperiod = \"day\"\n\
     shell = \"echo $SCHEDULER_PERIOD_KEY >> runs.txt; while [ ! -e cut ]; do sleep 0.01; done; sleep 0.5\"\n";

/// One round: a one-shot `run` whose job ends 0.5 s into a 12 s cut, and a
/// second one-shot `run` of the same period started the instant the
/// database passes again. How many times the job started, and what the
/// second run said.
fn a_run_at_the_return(db: &TestDb, period: &str) -> (usize, String) {
    let (proxy, url) = proxied(db);
    let ws = Workspace::new(ENDS_IN_THE_CUT);
    let runner = ws
        .command(&["--database-url", &url, "run", "w", "--period", period])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the runner");
    eventually("the job to start", BOUND, || {
        !lines(ws.path().join("runs.txt")).is_empty()
    });
    proxy.cut();
    std::fs::write(ws.path().join("cut"), "").unwrap();
    std::thread::sleep(Duration::from_secs(12));
    proxy.restore();
    let second = ws
        .command(&["--database-url", &url, "run", "w", "--period", period])
        .output()
        .expect("run at the return");
    let first = wait(runner, BOUND);
    assert_eq!(first.code(), 0, "{}", first.stderr());
    (
        lines(ws.path().join("runs.txt")).len(),
        format!("{}{}", second.stdout(), second.stderr()),
    )
}

/// Item 4: a platform cron tick that lands the instant a database comes
/// back, with a run elsewhere whose job ended during the outage, never
/// runs the period again: a process that has just started leaves an
/// expired lease to its runner for a heartbeat interval. Ten rounds side
/// by side, each with its own database and proxy.
#[test]
fn a_run_started_as_the_database_returns_never_runs_a_period_that_ended_in_the_outage() {
    let Some(_) = TestDb::postgres_blocking() else {
        return;
    };
    let period = (chrono::Utc::now().date_naive() - chrono::Days::new(1)).to_string();
    let rounds: Vec<_> = (0..10)
        .map(|_| {
            let period = period.clone();
            std::thread::spawn(move || {
                let db = TestDb::postgres_blocking().expect("the server answered before");
                let (starts, said) = a_run_at_the_return(&db, &period);
                let attempts = count(
                    &db.url,
                    "SELECT count(*) FROM scheduler_attempts WHERE job = 'w'",
                );
                (starts, attempts, said)
            })
        })
        .collect();
    for round in rounds {
        let (starts, attempts, said) = round.join().expect("round");
        assert_eq!((starts, attempts), (1, 1), "run again: {said}");
        assert!(said.contains("skipped"), "{said}");
    }
}
