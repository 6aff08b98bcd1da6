//! Calendars, active windows and jitter: which fires exist, where a fire
//! on a day off goes, and a delay every process computes alike; each seen
//! through the command line and the one enumeration behind every front end.

use std::collections::{BTreeSet, HashMap};

use chrono::TimeDelta;
use proptest::prelude::*;

use crate::support::{Said, TestDb, Workspace, at, count, databases, job, lines};
use scheduler::period::utc_text;

const BUSINESS: &str = "[scheduler]\ntimezone = \"Europe/Berlin\"\ncatch_up = \"60d\"\n\n\
[[calendar]]\nname = \"business\"\nholidays = [\"2027-01-01\"]\n";

/// The (local fire, key) pairs of `scheduler next` lines.
fn fires_and_keys(out: &str) -> Vec<(String, String)> {
    out.lines()
        .map(|line| {
            let cols: Vec<&str> = line.split("  ").collect();
            (cols[0].to_owned(), cols[2].to_owned())
        })
        .collect()
}

#[test]
fn the_first_or_the_next_business_day_over_a_year_with_new_year_a_holiday() {
    let ws = Workspace::new(
        &(BUSINESS.to_owned()
            + "\n[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\n\
               covers = \"previous\"\ncalendar = \"business\"\non_day_off = \"next\"\n\
               command = [\"true\"]\n"),
    );
    let out = ws.run(&["next", "billing", "-n", "12", "--after", "2026-12-02"]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
    // By hand: the first weekday of each month, 2027-01-01 a holiday.
    let want = [
        ("2027-01-04 02:00:00 CET", "billing:2026-12"),
        ("2027-02-01 02:00:00 CET", "billing:2027-01"),
        ("2027-03-01 02:00:00 CET", "billing:2027-02"),
        ("2027-04-01 02:00:00 CEST", "billing:2027-03"),
        ("2027-05-03 02:00:00 CEST", "billing:2027-04"),
        ("2027-06-01 02:00:00 CEST", "billing:2027-05"),
        ("2027-07-01 02:00:00 CEST", "billing:2027-06"),
        ("2027-08-02 02:00:00 CEST", "billing:2027-07"),
        ("2027-09-01 02:00:00 CEST", "billing:2027-08"),
        ("2027-10-01 02:00:00 CEST", "billing:2027-09"),
        ("2027-11-01 02:00:00 CET", "billing:2027-10"),
        ("2027-12-01 02:00:00 CET", "billing:2027-11"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(fires_and_keys(&out.stdout()), want, "{}", out.stdout());
    assert!(
        out.stdout()
            .lines()
            .next()
            .is_some_and(|l| l.ends_with("moved from 2027-01-01")),
        "{}",
        out.stdout()
    );
}

#[test]
fn the_last_business_day_of_each_month_of_2027_in_berlin() {
    let ws = Workspace::new(
        &(BUSINESS.to_owned()
            + "\n[[job]]\nname = \"close\"\nschedule = \"0 18 L * *\"\nperiod = \"month\"\n\
               calendar = \"business\"\non_day_off = \"previous\"\ncommand = [\"true\"]\n"),
    );
    let out = ws.run(&["next", "close", "-n", "12", "--after", "2027-01-01"]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
    // By hand, from a 2027 wall calendar: the month's last Monday to Friday.
    let want = [
        ("2027-01-29 18:00:00 CET", "close:2027-01"),
        ("2027-02-26 18:00:00 CET", "close:2027-02"),
        ("2027-03-31 18:00:00 CEST", "close:2027-03"),
        ("2027-04-30 18:00:00 CEST", "close:2027-04"),
        ("2027-05-31 18:00:00 CEST", "close:2027-05"),
        ("2027-06-30 18:00:00 CEST", "close:2027-06"),
        ("2027-07-30 18:00:00 CEST", "close:2027-07"),
        ("2027-08-31 18:00:00 CEST", "close:2027-08"),
        ("2027-09-30 18:00:00 CEST", "close:2027-09"),
        ("2027-10-29 18:00:00 CEST", "close:2027-10"),
        ("2027-11-30 18:00:00 CET", "close:2027-11"),
        ("2027-12-31 18:00:00 CET", "close:2027-12"),
    ];
    let want: Vec<(String, String)> = want
        .iter()
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .collect();
    assert_eq!(fires_and_keys(&out.stdout()), want, "{}", out.stdout());
}

/// November 2026: 21 weekdays, the 11th a holiday.
const DAILY: &str = "[scheduler]\ntimezone = \"Europe/Berlin\"\ncatch_up = \"60d\"\n\n\
[[calendar]]\nname = \"business\"\nholidays_file = \"holidays.txt\"\n\n\
[[job]]\nname = \"daily\"\nschedule = \"0 6 * * *\"\nperiod = \"day\"\ncalendar = \"business\"\n\
deadline = \"2h\"\nshell = \"echo $SCHEDULER_PERIOD_KEY >> runs.txt\"\n";

fn november_working_days(from: u32, to: u32) -> Vec<String> {
    (from..=to)
        .map(|d| format!("2026-11-{d:02}"))
        .filter(|d| {
            let date = chrono::NaiveDate::parse_from_str(d, "%Y-%m-%d").unwrap();
            use chrono::Datelike;
            date.weekday().num_days_from_monday() < 5 && d != "2026-11-11"
        })
        .collect()
}

#[test]
fn a_skipped_holiday_is_never_missing_nor_late_and_a_backfill_runs_only_working_days() {
    for db in databases() {
        let ws = Workspace::new(DAILY);
        std::fs::write(
            ws.path().join("holidays.txt"),
            "# team holidays\n2026-11-11\n2026-12-25\n",
        )
        .unwrap();
        let url = db.url.as_str();
        // Half the month by hand: working days only.
        let out = ws.run(&[
            "--database-url",
            url,
            "run",
            "daily",
            "--from",
            "2026-11-01",
            "--to",
            "2026-11-13",
        ]);
        assert_eq!(out.code(), 0, "{}{}", out.stdout(), out.stderr());
        let ran: Vec<String> = lines(ws.path().join("runs.txt"));
        let want: Vec<String> = november_working_days(1, 13)
            .into_iter()
            .map(|d| format!("daily:{d}"))
            .collect();
        assert_eq!(ran, want, "{}", db.url);
        // What serve counts overdue and late over the month, the job seen
        // since November began: the working days not run, never the
        // holiday, and the latest fire before the sighting (Friday 30
        // October: within catch_up of it, so owed).
        let late = overdue_and_late(&db, &ws);
        let want: Vec<String> = std::iter::once("2026-10-30".to_owned())
            .chain(november_working_days(14, 30))
            .map(|d| format!("daily:{d}"))
            .collect();
        assert_eq!(late, (want.clone(), want), "{}", db.url);
        // The month as `status` (and the console's grid) lists it: the
        // days off are not periods, the rest of the working days due and
        // marked late (past their deadline).
        let out = ws.run(&[
            "--database-url",
            url,
            "status",
            "daily",
            "--from",
            "2026-11-01",
            "--to",
            "2026-11-30",
            "--json",
        ]);
        assert_eq!(out.code(), 0, "{}", out.stderr());
        let periods: Vec<serde_json::Value> = out
            .stdout()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let by_state = |state: &str| -> Vec<String> {
            periods
                .iter()
                .filter(|p| p["state"] == state)
                .map(|p| p["period"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(by_state("succeeded"), november_working_days(1, 13));
        assert_eq!(by_state("due"), november_working_days(14, 30));
        let late: Vec<String> = periods
            .iter()
            .filter(|p| p["late"] == true)
            .map(|p| p["period"].as_str().unwrap().to_owned())
            .collect();
        assert_eq!(late, november_working_days(14, 30));
        assert_eq!(periods.len(), november_working_days(1, 30).len());
    }
}

/// The overdue and the late keys of `daily` on 2026-12-01, the job first
/// seen on 2026-11-01.
fn overdue_and_late(db: &TestDb, ws: &Workspace) -> (Vec<String>, Vec<String>) {
    let config = scheduler::config::Config::load(&ws.path().join("jobs.toml")).unwrap();
    let job = config.job("daily").unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let store = runtime.block_on(async {
        let store = scheduler::store::Store::connect(&db.url).await.unwrap();
        store.see_jobs(&["daily".to_owned()]).await.unwrap();
        store
    });
    let seen = at("2026-11-01T00:00:00Z");
    let set = if db.url.starts_with("sqlite:") {
        format!(
            "UPDATE scheduler_jobs SET first_seen = {}",
            seen.timestamp_millis()
        )
    } else {
        format!(
            "UPDATE scheduler_jobs SET first_seen = '{}'",
            utc_text(seen)
        )
    };
    count(&db.url, &set);
    runtime.block_on(async {
        // The one overview `status` and the API show, on 1 December.
        let now = at("2026-12-01T00:00:00Z");
        let jobs = [job];
        let mut all = scheduler::engine::overview::of_jobs(&store, &jobs, 1, now)
            .await
            .unwrap();
        let daily = all.remove(0);
        let (mut overdue, mut late) = (daily.overdue, daily.late);
        overdue.sort();
        late.sort();
        (overdue, late)
    })
}

#[test]
fn an_active_window_has_no_fire_before_its_first_day_or_after_its_last() {
    let job = job("schedule = \"0 9 * * *\"\ntimezone = \"Europe/Berlin\"\n\
         active_from = \"2027-03-10\"\nactive_until = \"2027-03-12\"");
    let timing = job.timing();
    let fires: Vec<String> = timing
        .between(at("2027-01-01T00:00:00Z"), at("2028-01-01T00:00:00Z"))
        .into_iter()
        .map(|f| utc_text(f.at))
        .collect();
    assert_eq!(
        fires,
        [
            "2027-03-10T08:00:00Z",
            "2027-03-11T08:00:00Z",
            "2027-03-12T08:00:00Z"
        ]
    );
    assert_eq!(timing.latest(at("2027-03-09T23:00:00Z")), None);
    assert_eq!(timing.next(at("2027-03-12T09:00:00Z")), None);
    // Catch-up never reaches before the first day, however wide its window.
    let since = at("2026-01-01T00:00:00Z");
    let due = scheduler::engine::due::due(&job, at("2027-03-11T12:00:00Z"), since, true);
    let labels: Vec<&str> = due.iter().map(|d| d.period.label.as_str()).collect();
    assert_eq!(
        labels,
        ["2027-03-10T08:00:00Z", "2027-03-11T08:00:00Z"],
        "{due:?}"
    );
}

#[test]
fn an_active_window_holds_for_serve_and_for_backfill() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[[job]]\nname = \"w\"\nschedule = \"0 9 * * *\"\nperiod = \"day\"\n\
         active_from = \"2026-11-10\"\nactive_until = \"2026-11-12\"\n\
         shell = \"echo $SCHEDULER_PERIOD_KEY >> runs.txt\"\n",
    );
    let out = ws.run(&[
        "--database-url",
        &db.url,
        "run",
        "w",
        "--from",
        "2026-11-01",
        "--to",
        "2026-11-30",
    ]);
    assert_eq!(out.code(), 0, "{}{}", out.stdout(), out.stderr());
    assert_eq!(
        lines(ws.path().join("runs.txt")),
        ["w:2026-11-10", "w:2026-11-11", "w:2026-11-12"]
    );
    let out = ws.run(&[
        "--database-url",
        &db.url,
        "run",
        "w",
        "--period",
        "2026-11-13",
    ]);
    assert_eq!(out.code(), 2, "{}", out.stderr());
    assert!(
        out.stderr()
            .contains("no fire of job `w` covers 2026-11-13"),
        "{}",
        out.stderr()
    );
    // Past its last date: `next` says so, and `run w` has nothing due (its
    // last period is weeks past the catch-up window), as `serve` would.
    let out = ws.run(&["next", "w", "--after", "2026-11-11T12:00:00Z"]);
    assert_eq!(out.stdout().lines().count(), 1, "{}", out.stdout());
    assert!(
        out.stderr().contains(
            "no further fire after 2026-11-12T09:00:00Z: its active dates end on 2026-11-12"
        ),
        "{}",
        out.stderr()
    );
    std::fs::remove_file(ws.path().join("runs.txt")).unwrap();
    let db = TestDb::sqlite();
    let out = ws.run(&["--database-url", &db.url, "run", "w"]);
    assert_eq!(out.code(), 0, "{}{}", out.stdout(), out.stderr());
    assert!(
        lines(ws.path().join("runs.txt")).is_empty(),
        "{}",
        out.stdout()
    );
}

#[test]
fn a_move_to_the_working_day_before_never_runs_a_period_before_it_may() {
    let job_with = |extra: &str| {
        job(&format!(
            "schedule = \"0 2 * * *\"\ntimezone = \"Europe/Berlin\"\ncalendar = \"business\"\n\
             on_day_off = \"previous\"\n{extra}\n\n\
             [[calendar]]\nname = \"business\"\nholidays = [\"2027-01-01\"]"
        ))
    };
    let fire = |job: &scheduler::config::Job, nominal: &str| utc_text(job.timing().at(at(nominal)));
    // A day period: Saturday's fire is not run on Friday, before Saturday
    // begins, but on Monday.
    let daily = job_with("period = \"day\"");
    assert_eq!(fire(&daily, "2027-01-09T01:00:00Z"), "2027-01-11T01:00:00Z");
    // A month it covers as `previous`: December is billed after it ends.
    let billing = job_with("period = \"month\"\ncovers = \"previous\"");
    assert_eq!(
        fire(&billing, "2027-01-01T01:00:00Z"),
        "2027-01-04T01:00:00Z"
    );
    // A month it covers as `current`: the last business day, in the month.
    let close = job_with("period = \"month\"");
    assert_eq!(fire(&close, "2027-01-31T01:00:00Z"), "2027-01-29T01:00:00Z");
    // A `fire` period moves back as asked.
    let plain = job_with("");
    assert_eq!(fire(&plain, "2027-01-09T01:00:00Z"), "2027-01-08T01:00:00Z");
    // A 02:30 fire that spring-forward shifted to 03:00 moves as 02:30.
    let gap = job(
        "schedule = \"30 2 * * *\"\ntimezone = \"Europe/Berlin\"\ncalendar = \"b\"\n\
         on_day_off = \"previous\"\n\n[[calendar]]\nname = \"b\"",
    );
    assert_eq!(fire(&gap, "2027-03-28T01:00:00Z"), "2027-03-26T01:30:00Z");
}

#[test]
fn jitter_is_the_same_in_three_processes_below_its_bound_and_before_the_next_fire() {
    let ws = Workspace::new(
        "[[job]]\nname = \"spread\"\nschedule = \"* * * * *\"\nperiod = \"minute\"\n\
         jitter = \"45s\"\ncommand = [\"true\"]\n",
    );
    let args = [
        "next",
        "spread",
        "-n",
        "10000",
        "--after",
        "2027-01-01T00:00:00Z",
    ];
    let children: Vec<_> = (0..3)
        .map(|_| {
            ws.command(&args)
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<String> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap().stdout())
        .collect();
    assert_eq!(outputs[0], outputs[1]);
    assert_eq!(outputs[0], outputs[2]);
    let mut offsets = BTreeSet::new();
    let lines: Vec<&str> = outputs[0].lines().collect();
    assert_eq!(lines.len(), 10_000);
    for line in lines {
        let cols: Vec<&str> = line.split("  ").collect();
        let fire = at(cols[1]);
        let minute = cols[2].strip_prefix("spread:").unwrap();
        let nominal = at(&format!("{minute}:00Z"));
        let offset = fire - nominal;
        assert!(
            offset >= TimeDelta::zero() && offset < TimeDelta::seconds(45),
            "{line}"
        );
        offsets.insert(offset.num_seconds());
    }
    // Spread over the bound, not bunched.
    assert_eq!(offsets.len(), 45, "{offsets:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Below the bound and before the next fire, for any job, schedule and
    /// bound; computed twice alike.
    #[test]
    fn jitter_stays_below_its_bound_and_before_the_next_fire(
        name in "[a-z][a-z0-9_-]{0,20}",
        schedule in prop::sample::select(vec![
            "* * * * *", "*/5 * * * *", "0 * * * *", "30 2 * * *", "0 0 1 * *", "*/7 * * * * *",
        ]),
        bound in 1u64..7_200,
        start in 0i64..(3 * 365 * 86_400),
    ) {
        let job = job(&format!(
            "schedule = \"{schedule}\"\ntimezone = \"Europe/Berlin\"\njitter = \"{bound}s\""
        ));
        let job = scheduler::config::Job { name: name.into(), ..job };
        let timing = job.timing();
        let from = at("2026-01-01T00:00:00Z") + TimeDelta::seconds(start);
        let mut t = from;
        for _ in 0..50 {
            let fire = timing.next(t).unwrap();
            let next_nominal = job.schedule.next_after(fire.nominal).unwrap();
            prop_assert!(fire.at >= fire.nominal);
            prop_assert!(fire.at - fire.nominal < TimeDelta::seconds(bound as i64));
            prop_assert!(fire.at < next_nominal, "{fire:?} past {next_nominal}");
            prop_assert_eq!(timing.at(fire.nominal), fire.at);
            t = fire.at;
        }
    }
}

#[test]
fn a_burst_of_a_thousand_jittered_jobs_spreads_its_starts_over_the_bound() {
    let db = TestDb::sqlite();
    // `sql` actions: the starts are the claims, with no process to spawn.
    let mut toml = String::from("[scheduler]\nmax_running = 100\n");
    for i in 0..1_000 {
        toml += &format!(
            "\n[[job]]\nname = \"j{i}\"\nschedule = \"*/30 * * * * *\"\njitter = \"20s\"\n\
             sql = {{ statement = \"SELECT 1\" }}\n"
        );
    }
    let ws = Workspace::new(&toml);
    // Killed if the test fails before it stops it.
    let mut serve = Replica(Some(crate::serve::serve(&ws, &db.url)));
    let file = std::path::PathBuf::from(db.url.strip_prefix("sqlite://").unwrap());
    crate::support::eventually("the database", std::time::Duration::from_secs(60), || {
        file.exists()
            && count(
                &db.url,
                "SELECT count(*) FROM sqlite_master WHERE name = 'scheduler_attempts'",
            ) == 1
    });
    // One half-minute's fires, all of them started: (start, boundary) in
    // milliseconds.
    let mut starts: Vec<(i64, i64)> = Vec::new();
    let complete = |starts: &[(i64, i64)]| {
        let mut per_boundary: HashMap<i64, usize> = HashMap::new();
        for (_, boundary) in starts {
            *per_boundary.entry(*boundary).or_default() += 1;
        }
        per_boundary
            .into_iter()
            .find(|(_, n)| *n == 1_000)
            .map(|(b, _)| b)
    };
    crate::support::eventually(
        "a half-minute's 1,000 fires",
        std::time::Duration::from_secs(240),
        || {
            starts = crate::support::sqlite_rows(
                &db.url,
                // The timer's fires: at start each job also takes its
                // latest fire, before it was first seen, as a catch-up.
                "SELECT started_at || ' ' || (scheduled_at / 30000 * 30000) FROM scheduler_attempts
                  WHERE trigger = 'schedule'",
            )
            .iter()
            .filter_map(|row| {
                let (start, boundary) = row.split_once(' ')?;
                Some((start.parse().ok()?, boundary.parse().ok()?))
            })
            .collect();
            complete(&starts).is_some()
        },
    );
    assert_eq!(crate::serve::stop(serve.0.take().unwrap()), 0);
    let boundary = complete(&starts).unwrap();
    // Every second of the bound has starts, none more than a tenth.
    let mut per_second = [0usize; 21];
    for (start, _) in starts.iter().filter(|(_, b)| *b == boundary) {
        let offset = (start - boundary) as f64 / 1000.0;
        assert!(
            (0.0..21.0).contains(&offset),
            "started {offset:.3}s after the boundary"
        );
        per_second[offset as usize] += 1;
    }
    assert!(
        per_second[..20].iter().all(|n| *n > 0 && *n < 100),
        "{per_second:?}"
    );
}

#[test]
fn the_api_shows_a_jobs_calendar_its_moved_next_fire_and_no_day_off_in_a_grid() {
    use crate::api::{CI, Server, with_api};
    let db = TestDb::sqlite();
    let ws = Workspace::new(&with_api(
        "\n[[calendar]]\nname = \"business\"\nholidays = [\"2026-11-11\"]\n\n\
         [[job]]\nname = \"daily\"\nschedule = \"0 6 * * *\"\nperiod = \"day\"\n\
         calendar = \"business\"\nactive_from = \"2026-11-01\"\njitter = \"10m\"\n\
         command = [\"true\"]\n",
    ));
    let server = Server::start(&ws, &db.url);
    let jobs: serde_json::Value = server.get(crate::api::CI, "/v1/jobs").json().unwrap();
    let job = &jobs["jobs"][0];
    assert_eq!(
        job["calendar"],
        serde_json::json!({
            "name": "business", "on_day_off": "skip", "active_from": "2026-11-01",
            "active_until": null, "jitter": "10m",
        })
    );
    // The next fire is the next working day's, delayed by its jitter.
    let next = at(job["next_fire"].as_str().unwrap());
    let key = job["next_key"].as_str().unwrap();
    let day = key.strip_prefix("daily:").unwrap();
    let nominal = at(&format!("{day}T06:00:00Z"));
    assert!(
        next >= nominal && next - nominal < TimeDelta::minutes(10),
        "{job}"
    );
    let grid: serde_json::Value = server
        .get(CI, "/v1/jobs/daily/periods?from=2026-11-09&to=2026-11-15")
        .json()
        .unwrap();
    let labels: Vec<&str> = grid["periods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["period"].as_str().unwrap())
        .collect();
    assert_eq!(
        labels,
        ["2026-11-09", "2026-11-10", "2026-11-12", "2026-11-13"]
    );
    // A day off is no period: 404 (the server once panicked on it).
    for day_off in ["2026-11-11", "2026-11-14", "2026-10-30"] {
        let answer = server.get(CI, &format!("/v1/jobs/daily/periods/{day_off}"));
        assert_eq!(answer.status().as_u16(), 404, "{day_off}");
        let body: serde_json::Value = answer.json().unwrap();
        assert!(
            body["error"]
                .as_str()
                .unwrap()
                .contains("it is not a period of the job"),
            "{body}"
        );
    }
    assert_eq!(server.stop(), 0);
}

/// A `serve` killed when dropped, unless stopped first.
struct Replica(Option<std::process::Child>);

impl Drop for Replica {
    fn drop(&mut self) {
        if let Some(mut child) = self.0.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The reload the review found losing a period, on a real `serve`: a
/// SIGHUP that takes a job's jitter down makes its pending period due at
/// an instant already past; it runs, once.
#[test]
fn a_sighup_that_makes_a_period_due_earlier_runs_it_once() {
    let db = TestDb::sqlite();
    let toml = |jitter: &str| {
        format!(
            "[scheduler]\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\n\n\
             [[job]]\nname = \"h\"\nschedule = \"*/10 * * * * *\"\njitter = \"{jitter}\"\n\
             shell = \"echo $SCHEDULER_PERIOD_KEY >> runs.txt\"\n\n\
             [[job]]\nname = \"k\"\nschedule = \"*/10 * * * * *\"\ncommand = [\"true\"]\n"
        )
    };
    let ws = Workspace::new(&toml("1h"));
    let mut serve = Replica(Some(crate::serve::serve(&ws, &db.url)));
    crate::support::eventually("serve serving", std::time::Duration::from_secs(60), || {
        crate::support::logged(&ws, "serving", 1)
    });
    // A fire of `h` delayed six seconds or more, three seconds away or more.
    let out = ws.run(&["next", "h", "-n", "30"]);
    let now = chrono::Utc::now();
    let nominal = out
        .stdout()
        .lines()
        .find_map(|line| {
            let cols: Vec<&str> = line.split("  ").collect();
            let nominal = at(cols[2].strip_prefix("h:")?);
            let jitter: i64 = cols
                .get(3)?
                .strip_prefix("jitter +")?
                .strip_suffix('s')?
                .parse()
                .ok()?;
            (jitter >= 6 && nominal - now >= TimeDelta::seconds(3)).then_some(nominal)
        })
        .unwrap_or_else(|| panic!("no fire delayed 6 s in:\n{}", out.stdout()));
    // Scenario time: the clock reaching instants of the schedule.
    let until = |t: chrono::DateTime<chrono::Utc>| {
        let wait = (t - chrono::Utc::now()).to_std().unwrap_or_default();
        std::thread::sleep(wait);
    };
    // `k` has fired at the nominal instant; `h`'s period is still ahead ...
    until(nominal + TimeDelta::seconds(3));
    // ... when a reload takes the jitter down to nothing: now past.
    std::fs::write(ws.path().join("jobs.toml"), toml("1s")).unwrap();
    crate::serve::signal(serve.0.as_ref().unwrap(), nix::sys::signal::Signal::SIGHUP);
    until(nominal + TimeDelta::seconds(14));
    assert_eq!(crate::serve::stop(serve.0.take().unwrap()), 0);
    let key = format!("h:{}", utc_text(nominal));
    let runs = lines(ws.path().join("runs.txt"));
    assert_eq!(
        runs.iter().filter(|r| **r == key).count(),
        1,
        "{key} in {runs:?}"
    );
}
