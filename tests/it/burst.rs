//! A burst as a test can afford it: hundreds of `sql` jobs firing every
//! second on several replicas of one database, each period run once.

use std::process::Child;
use std::time::Duration;

use chrono::{DateTime, SubsecRound, TimeDelta, Utc};

use crate::serve::{serve, stop};
use crate::support::{Workspace, count, databases};

const JOBS: usize = 500;

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
        std::thread::sleep(Duration::from_secs(10));
        let stopped = Utc::now();
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
        let mut second: DateTime<Utc> = started.trunc_subsecs(0) + TimeDelta::seconds(3);
        let last = stopped - TimeDelta::seconds(4);
        let mut seconds = 0;
        while second <= last {
            let label = second.format("%Y-%m-%dT%H:%M:%SZ");
            let ran = count(
                &db.url,
                &format!("SELECT count(*) FROM burst_runs WHERE period_key LIKE '%:{label}'"),
            );
            assert_eq!(
                ran,
                JOBS as i64,
                "{label}: {ran} of {JOBS} periods ran ({replicas} replicas)\n{}",
                log.lines().rev().take(20).collect::<Vec<_>>().join("\n")
            );
            second += TimeDelta::seconds(1);
            seconds += 1;
        }
        assert!(seconds >= 3, "the run was too short to judge");
    }
}
