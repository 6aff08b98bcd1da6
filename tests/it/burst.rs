//! A burst as a test can afford it: hundreds of `sql` jobs firing every
//! second on several replicas of one database, each period run once.

use std::process::Child;
use std::time::Duration;

use chrono::{DateTime, SubsecRound, TimeDelta, Utc};

use crate::serve::{serve, stop};
use crate::support::{Said, Workspace, count, databases, migrated, polled};

const JOBS: usize = 500;

/// Generous: only there to catch a hang.
const BOUND: Duration = Duration::from_secs(60);

/// How often a test asks the database of a burst how far it got: each
/// question is a connection of its own, beside the replicas'.
const POLL: Duration = Duration::from_millis(200);

/// Polls `check` every [`POLL`] until it is true, failing after [`BOUND`].
fn eventually(what: &str, check: impl FnMut() -> bool) {
    assert!(polled(POLL, BOUND, check), "timed out waiting for {what}");
}

/// The label of `t`'s second.
fn label(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// Whether `burst_runs` holds a period of a job named `like` whose second
/// is `at` or later: the replicas have fired that far.
fn ran_past(url: &str, like: &str, at: DateTime<Utc>) -> bool {
    count(
        url,
        &format!(
            // A label is the last 20 characters of a key.
            "SELECT count(*) FROM burst_runs WHERE period_key LIKE '{like}:%' \
             AND substr(period_key, length(period_key) - 19) >= '{}'",
            label(at)
        ),
    ) > 0
}

/// When the last of `replicas` said it was serving, from their log.
fn all_serving(ws: &Workspace, replicas: usize) -> DateTime<Utc> {
    let log = ws.path().join("serve.log");
    let mut at = Vec::new();
    eventually("every replica serving", || {
        at = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(" serving "))
            .filter_map(|l| DateTime::parse_from_rfc3339(l.split_whitespace().next()?).ok())
            .map(|t| t.to_utc())
            .collect();
        at.len() >= replicas
    });
    at.into_iter().max().expect("a serving line")
}

fn jobs_toml() -> String {
    let mut toml = String::from("[scheduler]\nlease = \"10s\"\nshutdown_grace = \"5s\"\n");
    for i in 0..JOBS {
        toml.push_str(&format!(
            "\n[[job]]\nname = \"j{i}\"\nschedule = \"* * * * * *\"\nmissed = \"all\"\n\
             sql = {{ statement = \"INSERT INTO burst_runs VALUES ($1)\", params = [\"{{period_key}}\"] }}\n"
        ));
    }
    toml
}

#[test]
fn a_burst_of_500_every_second_sql_jobs_on_several_replicas_runs_every_period_once() {
    for db in databases() {
        let sqlite = db.url.starts_with("sqlite:");
        let replicas = if sqlite { 2 } else { 3 };
        count(
            &db.url,
            "CREATE TABLE burst_runs (period_key TEXT NOT NULL)",
        );
        let ws = Workspace::new(&jobs_toml());
        let started = Utc::now();
        let servers: Vec<Child> = (0..replicas).map(|_| serve(&ws, &db.url)).collect();
        // The middle of the run, to be judged, starts 3 s in, or a second
        // after the last replica is serving if that is later (a loaded
        // machine starts 500 jobs slowly; a fire before any replica has
        // seen its job is owed by none); it is three seconds long at least
        // once the replicas have fired 4 s past it.
        let serving = all_serving(&ws, replicas);
        let first: DateTime<Utc> = (started.trunc_subsecs(0) + TimeDelta::seconds(3))
            .max(serving.trunc_subsecs(0) + TimeDelta::seconds(1));
        let past = first + TimeDelta::seconds(2 + 4);
        assert!(
            polled(Duration::from_millis(500), BOUND, || ran_past(
                &db.url, "j%", past
            )),
            "the replicas never fired past {past}"
        );
        let stopped = Utc::now();
        // Every job's every fire in the middle of the run must run; on a
        // loaded machine a claim that found the database busy waits for the
        // next scan, so the replicas go on until those fires have run (or
        // a generous bound).
        let last = stopped - TimeDelta::seconds(4);
        let middle = format!(
            // A label is the last 20 characters of a key.
            "SELECT count(*) FROM burst_runs WHERE substr(period_key, length(period_key) - 19) BETWEEN '{}' AND '{}'",
            first.format("%Y-%m-%dT%H:%M:%SZ"),
            last.format("%Y-%m-%dT%H:%M:%SZ")
        );
        let expected = JOBS as i64 * ((last - first).num_seconds() + 1);
        polled(Duration::from_millis(500), Duration::from_secs(40), || {
            count(&db.url, &middle) >= expected
        });
        for server in servers {
            assert_eq!(stop(server), 0, "a replica did not stop cleanly");
        }
        let log = std::fs::read_to_string(ws.path().join("serve.log")).unwrap_or_default();
        assert_eq!(
            count(
                &db.url,
                "SELECT count(*) - count(DISTINCT period_key) FROM burst_runs"
            ),
            0,
            "a period ran twice"
        );
        assert_eq!(
            count(
                &db.url,
                "SELECT count(*) FROM burst_runs r WHERE NOT EXISTS (SELECT 1 FROM scheduler_claims c
                  WHERE c.period_key = r.period_key AND c.state = 'succeeded')"
            ),
            0,
            "a statement committed without its success"
        );
        assert_eq!(
            count(
                &db.url,
                "SELECT count(*) FROM scheduler_claims c WHERE c.state = 'succeeded' AND NOT EXISTS
                  (SELECT 1 FROM burst_runs r WHERE r.period_key = c.period_key)"
            ),
            0,
            "a success was recorded without its statement"
        );
        // Every job's every fire in the middle of the run: none missed.
        let mut second = first;
        let mut seconds = 0;
        while second <= last {
            let label = second.format("%Y-%m-%dT%H:%M:%SZ");
            let ran = count(
                &db.url,
                &format!("SELECT count(*) FROM burst_runs WHERE period_key LIKE '%:{label}'"),
            );
            if ran != JOBS as i64 {
                // What became of the missing ones, and what the replicas
                // warned of.
                let states: Vec<String> = ["running", "released", "failed", "succeeded"]
                    .iter()
                    .map(|state| {
                        let n = count(
                            &db.url,
                            &format!(
                                "SELECT count(*) FROM scheduler_claims WHERE period_key LIKE '%:{label}' AND state = '{state}'"
                            ),
                        );
                        format!("{state} {n}")
                    })
                    .collect();
                // Heartbeat warnings only say the machine was slow; the
                // rest, and each replica's start, say where fires went.
                let warned: Vec<&str> = log
                    .lines()
                    .filter(|l| {
                        ((l.contains("WARN") || l.contains("ERROR")) && !l.contains("heartbeat"))
                            || l.contains("serving")
                    })
                    .take(30)
                    .collect();
                // What the replicas said of the missing second's periods.
                let said: Vec<&str> = log
                    .lines()
                    .filter(|l| l.contains(&format!(":{label}")) && !l.contains("succeeded"))
                    .take(20)
                    .collect();
                // The whole log, kept past the workspace for a reader.
                let kept = std::env::temp_dir().join(format!("burst-{}.log", std::process::id()));
                let kept = match std::fs::write(&kept, &log) {
                    Ok(()) => format!("the replicas' whole log is kept in {}", kept.display()),
                    Err(e) => format!("the replicas' log could not be kept: {e}"),
                };
                panic!(
                    "{label}: {ran} of {JOBS} periods ran ({replicas} replicas; {kept}); its claims: {}\n{}\n…\n{}\n…\n{}",
                    states.join(", "),
                    warned.join("\n"),
                    said.join("\n"),
                    log.lines().rev().take(10).collect::<Vec<_>>().join("\n")
                );
            }
            second += TimeDelta::seconds(1);
            seconds += 1;
        }
        assert!(seconds >= 3, "the run was too short to judge");
    }
}

/// `n` every-second `sql` jobs, `good0`…, each inserting its period key
/// into `burst_runs`.
fn good_jobs(n: usize) -> String {
    (0..n)
        .map(|i| {
            format!(
                "\n[[job]]\nname = \"good{i}\"\nschedule = \"* * * * * *\"\n\
                 sql = {{ statement = \"INSERT INTO burst_runs VALUES ($1)\", params = [\"{{period_key}}\"] }}\n"
            )
        })
        .collect()
}

/// Takes about a second per million of `n` on SQLite, far less otherwise:
/// a write whose time depends on its period.
const SLOW_FOR_MINUTE_00: &str = "INSERT INTO group_runs SELECT $1, max(x) FROM (WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c WHERE x < CASE WHEN $1 LIKE '%:00' THEN 1000000000 ELSE 10 END) SELECT x FROM c)";

#[test]
fn a_sqlite_write_stopped_at_the_writer_bound_fails_alone_and_the_group_goes_on() {
    let db = crate::support::TestDb::sqlite();
    count(&db.url, "CREATE TABLE group_runs (period TEXT, n INTEGER)");
    let ws = Workspace::new(&format!(
        "[scheduler]\nlease = \"3s\"\n\n[[job]]\nname = \"slow\"\nschedule = \"* * * * *\"\nperiod = \"minute\"\nconcurrency = 4\n\
         sql = {{ statement = \"{SLOW_FOR_MINUTE_00}\", params = [\"{{period}}\"] }}\n"
    ));
    let out = ws.run(&[
        "--database-url",
        &db.url,
        "run",
        "slow",
        "--from",
        "2026-01-01T00:00",
        "--to",
        "2026-01-01T00:03",
    ]);
    assert_eq!(out.code(), 1, "{}{}", out.stdout(), out.stderr());
    assert!(
        out.stdout()
            .contains("slow:2026-01-01T00:00  failed: SQL failed: timed out after 1s"),
        "{}",
        out.stdout()
    );
    for minute in ["01", "02", "03"] {
        assert!(
            out.stdout()
                .contains(&format!("slow:2026-01-01T00:{minute}  succeeded")),
            "{}",
            out.stdout()
        );
    }
    assert_eq!(count(&db.url, "SELECT count(*) FROM group_runs"), 3);
    // The database is fine afterwards: a rerun claims nothing new and the
    // failed period runs again by hand.
    let again = ws.run(&["--database-url", &db.url, "status", "slow"]);
    assert_eq!(again.code(), 0, "{}", again.stderr());
}

#[test]
fn a_slow_statement_does_not_hold_back_the_rest_of_its_group() {
    let Some(db) = crate::support::TestDb::postgres_blocking() else {
        return;
    };
    let ws = Workspace::new(
        "[[job]]\nname = \"nap\"\nschedule = \"* * * * *\"\nperiod = \"minute\"\nconcurrency = 6\n\
         sql = { statement = \"SELECT pg_sleep(2)\" }\n",
    );
    let run = ws
        .command(&[
            "--database-url",
            &db.url,
            "run",
            "nap",
            "--from",
            "2026-01-01T00:00",
            "--to",
            "2026-01-01T00:05",
        ])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let active = "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query = 'SELECT pg_sleep(2)' AND datname = current_database()";
    let mut most = 0;
    polled(POLL, Duration::from_secs(20), || {
        most = most.max(count(&db.url, active));
        most >= 2
    });
    let out = crate::support::wait(run, Duration::from_secs(60));
    assert_eq!(out.code(), 0, "{}{}", out.stdout(), out.stderr());
    assert_eq!(
        out.stdout().matches("succeeded").count(),
        6,
        "{}",
        out.stdout()
    );
    assert!(
        most >= 2,
        "the statements of the group ran one after another"
    );
}

#[test]
fn a_job_whose_statement_ends_its_own_connection_harms_no_other_job() {
    let Some(db) = crate::support::TestDb::postgres_blocking() else {
        return;
    };
    count(
        &db.url,
        "CREATE TABLE burst_runs (period_key TEXT NOT NULL)",
    );
    let mut toml = String::from(
        "[scheduler]\nlease = \"6s\"\nscan_interval = \"1s\"\n\n[[job]]\nname = \"evil\"\nschedule = \"* * * * * *\"\n\
         sql = { statement = \"SELECT pg_terminate_backend(pg_backend_pid())\" }\n",
    );
    toml.push_str(&good_jobs(5));
    let ws = Workspace::new(&toml);
    let started = Utc::now();
    let server = serve(&ws, &db.url);
    // The seconds judged end 5 s in; the good jobs have run 2 s past them.
    let past = started.trunc_subsecs(0) + TimeDelta::seconds(7);
    eventually("the good jobs 7 s in", || ran_past(&db.url, "good_", past));
    assert_eq!(stop(server), 0);
    let mut second = started.trunc_subsecs(0) + TimeDelta::seconds(2);
    while second <= started + TimeDelta::seconds(5) {
        let label = second.format("%Y-%m-%dT%H:%M:%SZ");
        let ran = count(
            &db.url,
            &format!("SELECT count(*) FROM burst_runs WHERE period_key LIKE '%:{label}'"),
        );
        assert_eq!(ran, 5, "{label}: {ran} of the 5 good jobs ran");
        second += TimeDelta::seconds(1);
    }
}

#[test]
fn quick_jobs_share_a_transaction_and_one_that_turns_bad_goes_back_to_its_own() {
    let Some(db) = crate::support::TestDb::postgres_blocking() else {
        return;
    };
    count(
        &db.url,
        "CREATE TABLE burst_runs (period_key TEXT NOT NULL, tx BIGINT NOT NULL)",
    );
    count(&db.url, "CREATE TABLE turned (bad BOOLEAN)");
    // Quick until `turned` has a row; then its statement ends its own
    // connection, and with it whatever transaction it shares.
    let mut toml = String::from(
        "[scheduler]\nlease = \"4s\"\nscan_interval = \"1s\"\n\n[[job]]\nname = \"turncoat\"\nschedule = \"* * * * * *\"\n\
         sql = { statement = \"INSERT INTO burst_runs SELECT $1, txid_current() WHERE CASE WHEN EXISTS (SELECT 1 FROM turned) THEN pg_terminate_backend(pg_backend_pid()) ELSE true END\", params = [\"{period_key}\"] }\n",
    );
    for i in 0..5 {
        toml.push_str(&format!(
            "\n[[job]]\nname = \"good{i}\"\nschedule = \"* * * * * *\"\n\
             sql = {{ statement = \"INSERT INTO burst_runs VALUES ($1, txid_current())\", params = [\"{{period_key}}\"] }}\n"
        ));
    }
    let ws = Workspace::new(&toml);
    let started = Utc::now();
    let server = serve(&ws, &db.url);
    let shared =
        "SELECT count(*) FROM (SELECT tx FROM burst_runs GROUP BY tx HAVING count(*) = 6) AS t";
    assert!(
        polled(POLL, Duration::from_secs(30), || count(&db.url, shared) > 0),
        "the six quick jobs never shared a transaction"
    );
    count(&db.url, "INSERT INTO turned VALUES (true)");
    let turned = Utc::now();
    // The good jobs fired past the seconds judged (to 5 s after the turn),
    // and every period of theirs up to then has ended: those of the broken
    // group recovered past its lease.
    let end = turned.trunc_subsecs(0) + TimeDelta::seconds(5);
    let unsettled = format!(
        "SELECT count(*) FROM scheduler_claims WHERE job LIKE 'good_' AND state = 'running' \
         AND substr(period_key, 7) <= '{}'",
        label(end)
    );
    eventually("the good jobs' periods to the end settled", || {
        ran_past(&db.url, "good_", end + TimeDelta::seconds(1)) && count(&db.url, &unsettled) == 0
    });
    assert_eq!(stop(server), 0);
    let twice = count(
        &db.url,
        "SELECT count(*) FROM (SELECT period_key FROM burst_runs GROUP BY period_key HAVING count(*) > 1) AS t",
    );
    assert_eq!(twice, 0, "a period ran twice");
    let mut second = started.trunc_subsecs(0) + TimeDelta::seconds(2);
    while second <= turned + TimeDelta::seconds(4) {
        let label = second.format("%Y-%m-%dT%H:%M:%SZ");
        let ran = count(
            &db.url,
            &format!("SELECT count(*) FROM burst_runs WHERE period_key LIKE 'good_:{label}'"),
        );
        assert_eq!(ran, 5, "{label}: {ran} of the 5 good jobs ran");
        second += TimeDelta::seconds(1);
    }
    // Once the turncoat broke its group, the good jobs ran without it:
    // on their first attempt, not recovered after its lease.
    for late in 3..=5 {
        let label =
            (turned.trunc_subsecs(0) + TimeDelta::seconds(late)).format("%Y-%m-%dT%H:%M:%SZ");
        let first = count(
            &db.url,
            &format!(
                "SELECT count(*) FROM scheduler_claims WHERE period_key LIKE 'good_:{label}' AND attempt = 1 AND state = 'succeeded'"
            ),
        );
        assert_eq!(first, 5, "{label}: {first} of the 5 good jobs ran at once");
    }
}

#[test]
fn a_job_that_breaks_its_transaction_every_other_run_soon_runs_alone_for_good() {
    let Some(db) = crate::support::TestDb::postgres_blocking() else {
        return;
    };
    count(
        &db.url,
        "CREATE TABLE burst_runs (period_key TEXT NOT NULL)",
    );
    // Quick on odd seconds; on even ones it ends its own connection, and
    // with it whatever transaction it shares.
    let mut toml = String::from(
        "[scheduler]\nlease = \"3s\"\nscan_interval = \"1s\"\n\n[[job]]\nname = \"flaky\"\nschedule = \"* * * * * *\"\n\
         sql = { statement = \"SELECT CASE WHEN extract(second from now())::int % 2 = 0 THEN pg_terminate_backend(pg_backend_pid()) ELSE true END\" }\n",
    );
    toml.push_str(&good_jobs(3));
    let ws = Workspace::new(&toml);
    let server = serve(&ws, &db.url);
    // Fourteen seconds of the good jobs' fires.
    eventually("fourteen seconds run", || {
        count(
            &db.url,
            "SELECT count(DISTINCT substr(period_key, length(period_key) - 19)) FROM burst_runs",
        ) >= 14
    });
    assert_eq!(stop(server), 0);
    // Periods of the good jobs a broken shared transaction took down, and
    // that were recovered after the lease: a few transactions' worth (each
    // strike doubles the quick runs the flaky job must show; a recovery
    // run can make two quick ones in a row), not one every other second.
    let broken = count(
        &db.url,
        "SELECT count(*) FROM scheduler_claims WHERE job LIKE 'good%' AND attempt > 1",
    );
    assert!(
        broken <= 15,
        "{broken} periods of the good jobs went down with the flaky one's transactions"
    );
    let twice = count(
        &db.url,
        "SELECT count(*) FROM (SELECT period_key FROM burst_runs GROUP BY period_key HAVING count(*) > 1) AS t",
    );
    assert_eq!(twice, 0);
}

#[test]
fn the_statements_of_a_group_plan_as_the_session_would_the_groups_own_generic() {
    let Some(db) = crate::support::TestDb::postgres_blocking() else {
        return;
    };
    // A setting of the database's own, which the actions must see whatever
    // the group's own statements use.
    count(
        &db.url,
        "DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET plan_cache_mode = force_custom_plan', current_database()); END $$",
    );
    count(
        &db.url,
        "CREATE TABLE burst_runs (period_key TEXT NOT NULL, mode TEXT NOT NULL)",
    );
    let mut toml = String::from("[scheduler]\nlease = \"4s\"\n");
    for i in 0..3 {
        toml.push_str(&format!(
            "\n[[job]]\nname = \"j{i}\"\nschedule = \"* * * * * *\"\n\
             sql = {{ statement = \"INSERT INTO burst_runs VALUES ($1, current_setting('plan_cache_mode'))\", params = [\"{{period_key}}\"] }}\n"
        ));
    }
    let ws = Workspace::new(&toml);
    let server = serve(&ws, &db.url);
    // Enough runs for the jobs to prove quick and share a transaction.
    assert!(
        polled(POLL, Duration::from_secs(30), || count(
            &db.url,
            "SELECT count(*) FROM burst_runs"
        ) >= 12),
        "the jobs did not run"
    );
    assert_eq!(stop(server), 0);
    let other = count(
        &db.url,
        "SELECT count(*) FROM burst_runs WHERE mode <> 'force_custom_plan'",
    );
    assert_eq!(other, 0, "an action ran under the group's plan cache mode");
}

#[test]
fn templated_jobs_a_little_slow_share_few_transactions_from_their_first_fire() {
    let Some(db) = crate::support::TestDb::postgres_blocking() else {
        return;
    };
    count(
        &db.url,
        "CREATE TABLE burst_runs (period_key TEXT NOT NULL, tx BIGINT NOT NULL)",
    );
    // 40 jobs of one statement of ~5 ms each: a second's fires take twice
    // a group's budget, and no job has run before the first. `missed =
    // "skip"`: the timer's fires only, without the latest fire each job
    // owes at its first sighting (a catch-up at start, whose groups would
    // still be running when the first timer fire comes).
    let mut toml = String::from("[scheduler]\nlease = \"10s\"\n");
    for i in 0..40 {
        toml.push_str(&format!(
            "\n[[job]]\nname = \"t{i}\"\nschedule = \"* * * * * *\"\nmissed = \"skip\"\n\
             sql = {{ statement = \"INSERT INTO burst_runs SELECT $1, txid_current() FROM pg_sleep(0.005)\", params = [\"{{period_key}}\"] }}\n"
        ));
    }
    let ws = Workspace::new(&toml);
    let server = serve(&ws, &db.url);
    let fired =
        "SELECT count(DISTINCT substr(period_key, length(period_key) - 19)) FROM burst_runs";
    assert!(
        polled(POLL, Duration::from_secs(30), || count(&db.url, fired) > 0),
        "nothing ran"
    );
    // Five fires: the first and four more.
    eventually("five fires", || count(&db.url, fired) >= 5);
    assert_eq!(stop(server), 0);
    // Per fire: how many of the 40 ran, and in how many transactions
    // (the first fire included). A transaction each would be 40; a
    // commit for every period past a group's budget, 20.
    let fires: Vec<(String, i64, i64)> = tokio::runtime::Runtime::new().unwrap().block_on(async {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query_as(
            "SELECT substr(period_key, length(period_key) - 19), count(*), count(DISTINCT tx)
                   FROM burst_runs GROUP BY 1 ORDER BY 1",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap()
    });
    assert!(fires.len() >= 3, "too few fires to judge: {fires:?}");
    // The last fire may have been cut by the stop.
    for (label, ran, transactions) in &fires[..fires.len() - 1] {
        assert_eq!(*ran, 40, "{label}: {ran} of 40 ran: {fires:?}");
        assert!(
            *transactions <= 10,
            "{label}: 40 periods in {transactions} transactions: {fires:?}"
        );
    }
}

#[test]
fn a_burst_whose_job_another_transaction_is_claiming_runs_its_periods_once_the_claim_is_over() {
    let Some(db) = crate::support::TestDb::postgres_blocking() else {
        return;
    };
    count(
        &db.url,
        "CREATE TABLE burst_runs (period_key TEXT NOT NULL, at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp())",
    );
    let mut toml = String::new();
    for name in ["a", "b", "c"] {
        toml.push_str(&format!(
            "\n[[job]]\nname = \"{name}\"\nschedule = \"* * * * * *\"\n\
             sql = {{ statement = \"INSERT INTO burst_runs VALUES ($1)\", params = [\"{{period_key}}\"] }}\n"
        ));
    }
    let ws = Workspace::new(&toml);
    let server = serve(&ws, &db.url);
    assert!(
        polled(POLL, Duration::from_secs(30), || count(
            &db.url,
            "SELECT count(*) FROM burst_runs"
        ) > 0),
        "nothing ran"
    );
    // Job b's lock held for 3 s by another transaction, as another
    // replica's claim (or anything stuck) holds it: its fires meanwhile are
    // asked for again until they can be decided, and the jobs before and
    // after it in name order run meanwhile.
    let (url, (held_tx, held_rx)) = (db.url.clone(), std::sync::mpsc::channel());
    let holder = std::thread::spawn(move || {
        tokio::runtime::Runtime::new().unwrap().block_on(async {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
            let mut tx = conn.begin().await.unwrap();
            sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('scheduler_claims:b', 0))")
                .execute(&mut *tx)
                .await
                .unwrap();
            held_tx.send(Utc::now()).unwrap();
            tokio::time::sleep(Duration::from_secs(3)).await;
            let released = Utc::now();
            tx.commit().await.unwrap();
            released
        })
    });
    let held = held_rx.recv().unwrap();
    let released = holder.join().unwrap();
    // Every job has run each second judged (to 4 s after the lock), and
    // fired a second past them; the assertions below say what is missing.
    let end = held.trunc_subsecs(0) + TimeDelta::seconds(4);
    let judged = format!(
        "SELECT count(DISTINCT period_key) FROM burst_runs WHERE substr(period_key, 3) BETWEEN '{}' AND '{}'",
        label(held.trunc_subsecs(0) + TimeDelta::seconds(1)),
        label(end)
    );
    polled(POLL, BOUND, || {
        ["a", "b", "c"]
            .iter()
            .all(|job| ran_past(&db.url, job, end + TimeDelta::seconds(1)))
            && count(&db.url, &judged) == 3 * 4
    });
    assert_eq!(stop(server), 0);
    let mut second = held.trunc_subsecs(0) + TimeDelta::seconds(1);
    while second <= held + TimeDelta::seconds(4) {
        let label = second.format("%Y-%m-%dT%H:%M:%SZ");
        for job in ["a", "b", "c"] {
            let ran = count(
                &db.url,
                &format!("SELECT count(*) FROM burst_runs WHERE period_key = '{job}:{label}'"),
            );
            assert_eq!(ran, 1, "{job}:{label} ran {ran} times");
        }
        second += TimeDelta::seconds(1);
    }
    let contended = count(
        &db.url,
        "SELECT count(*) FROM scheduler_attempts WHERE period_key LIKE 'b:%' AND attempt > 1",
    );
    assert_eq!(
        contended, 0,
        "a period of b was taken over rather than claimed once"
    );
    // The other jobs did not wait for b's lock: what fired while it was
    // held ran before it was given back.
    let first = held.trunc_subsecs(0) + TimeDelta::seconds(1);
    let last = released.trunc_subsecs(0) - TimeDelta::seconds(1);
    assert!(first < last, "the lock was held too short to judge");
    let late = count(
        &db.url,
        &format!(
            "SELECT count(*) FROM burst_runs WHERE period_key !~ '^b:'
              AND substr(period_key, 3) BETWEEN '{}' AND '{}' AND at >= '{}'",
            first.format("%Y-%m-%dT%H:%M:%SZ"),
            last.format("%Y-%m-%dT%H:%M:%SZ"),
            released.to_rfc3339()
        ),
    );
    assert_eq!(late, 0, "periods of a and c waited for b's lock");
}

#[test]
fn a_statement_that_ends_its_own_connection_fails_its_period_and_is_not_recovered_again_and_again()
{
    let Some(db) = crate::support::TestDb::postgres_blocking() else {
        return;
    };
    count(
        &db.url,
        "CREATE TABLE burst_runs (period_key TEXT NOT NULL)",
    );
    // Alone (it never proves quick), and beside quick jobs.
    let mut toml = String::from(
        "[scheduler]\nlease = \"3s\"\nscan_interval = \"1s\"\n\n[[job]]\nname = \"evil\"\nschedule = \"* * * * * *\"\n\
         sql = { statement = \"SELECT pg_terminate_backend(pg_backend_pid())\" }\n",
    );
    toml.push_str(&good_jobs(3));
    let ws = Workspace::new(&toml);
    let server = serve(&ws, &db.url);
    // Three periods of evil claimed longer ago than a lease (3 s) and two
    // scans: any of them left running would have been recovered by now.
    eventually("three periods of evil past their lease", || {
        migrated(&db.url)
            && count(
                &db.url,
                "SELECT count(*) FROM scheduler_attempts WHERE period_key LIKE 'evil:%' \
                 AND attempt = 1 AND started_at < now() - interval '5 seconds'",
            ) >= 3
    });
    assert_eq!(stop(server), 0);
    // Each period of evil failed at its first attempt (no retries are
    // configured): none was left running for a recovery after its lease.
    let failed = count(
        &db.url,
        "SELECT count(*) FROM scheduler_claims WHERE job = 'evil' AND state = 'failed' AND attempt = 1",
    );
    let again = count(
        &db.url,
        "SELECT count(*) FROM scheduler_claims WHERE attempt > 1",
    );
    assert!(failed >= 3, "{failed} periods of evil failed at once");
    assert_eq!(again, 0, "{again} periods were recovered after their lease");
    let error = count(
        &db.url,
        "SELECT count(*) FROM scheduler_attempts WHERE period_key LIKE 'evil:%' AND outcome = 'failed' AND error LIKE 'SQL failed:%'",
    );
    assert!(error >= 3, "the failures do not say the statement failed");
}
