//! Issue 45, "Performance at scale": what keeps a large history from
//! slowing anything down — prunes in bounded batches, and the tables'
//! statistics refreshed by the scheduler itself after big writes.

use std::time::Duration;

use crate::support::{Said, TestDb, Workspace, count, eventually, past_sql};

/// An every-minute `sql` job kept a second, whose backfills make many
/// claims quickly.
const MINUTELY: &str = "[scheduler]\ncatch_up = \"1s\"\n\n[[job]]\nname = \"tick\"\nschedule = \"* * * * *\"\nkeep = \"1s\"\nconcurrency = 100\nsql = { statement = \"SELECT 1\" }\n";

/// `run tick` over `minutes` minutes from 2026-01-01.
fn backfill(ws: &Workspace, url: &str, minutes: i64) {
    let from = crate::support::at("2026-01-01T00:00:00Z");
    let to = from + chrono::TimeDelta::minutes(minutes - 1);
    let label = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%dT%H:%M:%SZ").to_string();
    let out = ws.run(&[
        "--database-url",
        url,
        "run",
        "tick",
        "--from",
        &label(from),
        "--to",
        &label(to),
    ]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
}

/// A prune of more claims than one batch takes deletes them all, with
/// their attempts, batch after batch; `--dry-run` counts them all.
#[test]
fn a_prune_of_many_claims_deletes_them_all_in_batches() {
    for db in crate::support::databases() {
        let ws = Workspace::new(MINUTELY);
        backfill(&ws, &db.url, 2_500);
        eventually(
            "every claim older than keep",
            Duration::from_secs(30),
            || {
                count(
                    &db.url,
                    &format!(
                        "SELECT count(*) FROM scheduler_claims WHERE {}",
                        past_sql(&db.url, "finished_at", 1000)
                    ),
                ) == 2_500
            },
        );
        let dry = ws.run(&["--database-url", &db.url, "prune", "--dry-run"]);
        assert!(
            dry.stdout()
                .contains("tick: would prune 2500 finished claim(s)"),
            "{}: {}{}",
            db.url,
            dry.stdout(),
            dry.stderr()
        );
        let pruned = ws.run(&["--database-url", &db.url, "prune"]);
        assert!(
            pruned
                .stdout()
                .contains("tick: pruned 2500 finished claim(s)"),
            "{}: {}{}",
            db.url,
            pruned.stdout(),
            pruned.stderr()
        );
        for table in ["scheduler_claims", "scheduler_attempts"] {
            assert_eq!(count(&db.url, &format!("SELECT count(*) FROM {table}")), 0);
        }
    }
}

/// With autovacuum off, a backfill and a prune of more than 10,000 claims
/// each refresh the tables' statistics themselves.
#[test]
fn a_big_backfill_and_a_big_prune_refresh_the_tables_statistics_with_autovacuum_off() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let ws = Workspace::new(MINUTELY);
    let migrate = ws.run(&["--database-url", &db.url, "migrate"]);
    assert_eq!(migrate.code(), 0, "{}", migrate.stderr());
    for table in ["scheduler_claims", "scheduler_attempts", "scheduler_output"] {
        count(
            &db.url,
            &format!("ALTER TABLE {table} SET (autovacuum_enabled = false)"),
        );
    }
    let analysed = || {
        count(
            &db.url,
            "SELECT analyze_count FROM pg_stat_user_tables WHERE relname = 'scheduler_claims'",
        )
    };
    assert_eq!(analysed(), 0);
    backfill(&ws, &db.url, 12_000);
    eventually("the backfill's refresh", Duration::from_secs(30), || {
        analysed() == 1
    });
    eventually(
        "every claim older than keep",
        Duration::from_secs(30),
        || {
            count(
                &db.url,
                &format!(
                    "SELECT count(*) FROM scheduler_claims WHERE {}",
                    past_sql(&db.url, "finished_at", 1000)
                ),
            ) == 12_000
        },
    );
    let pruned = ws.run(&["--database-url", &db.url, "prune"]);
    assert!(
        pruned.stdout().contains("tick: pruned 12000"),
        "{}{}",
        pruned.stdout(),
        pruned.stderr()
    );
    eventually("the prune's refresh", Duration::from_secs(30), || {
        analysed() == 2
    });
}

/// At start-up 100,000 hourly and daily jobs each owed their latest fire,
/// and an every-minute job's fire waited 10 to 20 s behind their catch-ups.
/// Here one `max_running` slot serves 100 hourly jobs whose catch-ups take
/// at least 20 s in all, and an every-second job's fires run between
/// them, each ahead of the catch-ups of jobs that fire later.
#[test]
fn an_every_second_jobs_fires_go_ahead_of_the_start_ups_catch_ups_of_hourly_jobs() {
    let db = TestDb::sqlite();
    let mut jobs = "[scheduler]\nmax_running = 1\nshutdown_grace = \"1s\"\n".to_owned();
    for i in 0..100 {
        jobs += &format!(
            "\n[[job]]\nname = \"h{i:03}\"\nschedule = \"0 * * * *\"\ncommand = [\"sleep\", \"0.2\"]\n"
        );
    }
    jobs += "\n[[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\nperiod = \"fire\"\ncommand = [\"true\"]\n";
    let ws = Workspace::new(&jobs);
    let migrated = ws.run(&["--database-url", &db.url, "migrate"]);
    assert_eq!(migrated.code(), 0, "{}", migrated.stderr());
    let replica = crate::serve::serve(&ws, &db.url);
    let claims = |like: &str| {
        count(
            &db.url,
            &format!("SELECT count(*) FROM scheduler_claims WHERE period_key LIKE '{like}'"),
        )
    };
    eventually("three runs of tick", Duration::from_secs(60), || {
        claims("tick:%") >= 3
    });
    let hourly = claims("h%");
    assert_eq!(crate::serve::stop(replica), 0);
    assert!(
        hourly < 100,
        "tick's third fire waited behind every hourly job's catch-up"
    );
}
