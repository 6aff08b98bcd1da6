//! Bad input, as a user meets it: every mistake in jobs.toml or on the
//! command line exits 2 with its place, what was expected and, where there is
//! one, the nearest valid value; the database is never touched.

use crate::support::{Said, Workspace};

const GOOD_JOB: &str = "[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ncommand = [\"true\"]\n";

/// Runs `scheduler check` on `toml` and returns stderr, asserting exit 2 and
/// that no database file appeared.
fn check_fails(toml: &str) -> String {
    let ws = Workspace::new(toml);
    let out = ws.run(&["check"]);
    assert_eq!(
        out.code(),
        2,
        "stdout: {}\nstderr: {}",
        out.stdout(),
        out.stderr()
    );
    assert!(
        !ws.path().join("scheduler.db").exists(),
        "the database was touched"
    );
    out.stderr()
}

fn assert_says(stderr: &str, parts: &[&str]) {
    for part in parts {
        assert!(stderr.contains(part), "expected {part:?} in:\n{stderr}");
    }
}

#[test]
fn config_mistakes_name_their_place_and_the_expected_value() {
    let cases: &[(&str, &[&str])] = &[
        (
            "[[job]]\nname = \"a\"\nschedul = \"* * * * *\"\ncommand = [\"x\"]\n",
            &[
                "jobs.toml:3:1",
                "unknown field `schedul`",
                "did you mean `schedule`?",
            ],
        ),
        (
            "[scheduler]\nleese = \"60s\"\n",
            &[
                "jobs.toml:2:1",
                "unknown field `leese`",
                "did you mean `lease`?",
            ],
        ),
        (
            "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\nperiod = \"mnth\"\ncommand = [\"x\"]\n",
            &[
                "jobs.toml:4:10",
                "unknown variant `mnth`",
                "did you mean `month`?",
            ],
        ),
        (
            "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\ncovers = \"prev\"\ncommand = [\"x\"]\n",
            &[
                "jobs.toml:4:10",
                "expected `current` or `previous`",
                "did you mean `previous`?",
            ],
        ),
        (
            "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\nmissed = \"none\"\ncommand = [\"x\"]\n",
            &["jobs.toml:4:10", "`all`, `latest`, `skip`"],
        ),
        (
            "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\ndst = { gap = \"jump\" }\ncommand = [\"x\"]\n",
            &["jobs.toml:4:15", "expected `shift` or `skip`"],
        ),
        (
            "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\ntimezone = \"Europe/Berln\"\ncommand = [\"x\"]\n",
            &[
                "jobs.toml:4:12",
                "not a time zone",
                "did you mean `Europe/Berlin`?",
            ],
        ),
        (
            "[scheduler]\ntimezone = \"Mars/Olympus\"\n",
            &["jobs.toml:2:12", "not a time zone", "IANA name"],
        ),
        (
            "[[job]]\nname = \"a\"\nschedule = \"* * * *\"\ncommand = [\"x\"]\n",
            &["jobs.toml:3:12", "not a cron pattern", "expected 5 fields"],
        ),
        (
            "[[job]]\nname = \"a\"\nschedule = \"61 * * * *\"\ncommand = [\"x\"]\n",
            &["jobs.toml:3:12", "not a cron pattern"],
        ),
        (
            "[[job]]\nname = \"a\"\nschedule = \"0 0 30 2 *\"\ncommand = [\"x\"]\n",
            &["jobs.toml:3:12", "never matches"],
        ),
        (
            "[[job]]\nname = \"Billing!\"\nschedule = \"* * * * *\"\ncommand = [\"x\"]\n",
            &["jobs.toml:2:8", "not a valid job name", "a-z, 0-9"],
        ),
        (
            &format!("{GOOD_JOB}{GOOD_JOB}"),
            &["jobs.toml:7:8", "`billing` is already used at line 2"],
        ),
        (
            "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\n",
            &[
                "jobs.toml:2:8",
                "no action",
                "exactly one of `command`, `shell`, `http` or `sql`",
            ],
        ),
        (
            "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\ncommand = [\"x\"]\nshell = \"x\"\n",
            &[
                "jobs.toml:5:9",
                "has `command` and `shell`",
                "exactly one action",
            ],
        ),
        (
            "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\ncommand = []\n",
            &["jobs.toml:4:11", "`command` is empty"],
        ),
        (
            "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\ncommand = [\"x\", \"{perod}\"]\n",
            &[
                "jobs.toml:4:18",
                "unknown placeholder `{perod}`",
                "did you mean `{period}`?",
            ],
        ),
        (
            "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\ntimeout = \"5 parsecs\"\ncommand = [\"x\"]\n",
            &["jobs.toml:4:11", "not a duration", "e.g. `90s`"],
        ),
        (
            "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\ntimeout = \"0s\"\ncommand = [\"x\"]\n",
            &["jobs.toml:4:11", "longer than zero"],
        ),
        (
            "[scheduler]\nlease = \"0s\"\n",
            &[
                "jobs.toml:2:9",
                "lease = `0s` is too short: expected at least 1s",
            ],
        ),
        (
            "[job]\nname = \"a\"\nschedule = \"* * * * *\"\ncommand = [\"x\"]\n",
            &["jobs.toml:1:1", "`[job]` is one table", "write `[[job]]`"],
        ),
        (
            "[scheduler]\nlease = 60\n",
            &[
                "jobs.toml:2:9",
                "`lease` is a number, but it must be a duration in quotes: lease = \"60s\"",
            ],
        ),
        (
            "[scheduler]\nmax_running = 0\n",
            &["jobs.toml:2:15", "out of range", "from 1"],
        ),
        (
            "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\nconcurrency = -1\ncommand = [\"x\"]\n",
            &["jobs.toml:4:15", "out of range"],
        ),
        (
            "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\nretry = { attempts = 3, backof = \"1m\" }\ncommand = [\"x\"]\n",
            &[
                "jobs.toml:4:",
                "unknown field `backof`",
                "did you mean `backoff`?",
            ],
        ),
        (
            "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\nhttp = { url = \"ftp://x\" }\n",
            &["jobs.toml:4:", "http:// or https://"],
        ),
        (
            "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\nhttp = { url = \"http://x\", method = \"FETCH\" }\n",
            &["jobs.toml:4:", "not an HTTP method"],
        ),
        (
            "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\nsql = { statement = \"select 1\" }\nworkdir = \"/tmp\"\n",
            &[
                "jobs.toml:5:11",
                "`workdir` applies only to `command` and `shell`",
            ],
        ),
        (
            "[[job]]\nname = \"a\n",
            &["jobs.toml:2:10", "invalid basic string"],
        ),
    ];
    for (toml, parts) in cases {
        assert_says(&check_fails(toml), parts);
    }
}

#[test]
fn a_missing_config_file_is_a_configuration_error() {
    let ws = Workspace::new(GOOD_JOB);
    let out = ws.run(&["--config", "nope.toml", "check"]);
    assert_eq!(out.code(), 2);
    assert_says(
        &out.stderr(),
        &[
            "nope.toml",
            "cannot read the configuration file",
            "--config",
        ],
    );
}

#[test]
fn scheduler_config_names_the_file_when_no_flag_does() {
    let ws = Workspace::new("");
    std::fs::write(ws.path().join("other.toml"), GOOD_JOB).unwrap();
    let out = ws
        .command(&["check"])
        .env("SCHEDULER_CONFIG", "other.toml")
        .output()
        .unwrap();
    assert_eq!(out.code(), 0, "{}", out.stderr());
    assert_says(&out.stdout(), &["other.toml: 1 job OK", "billing"]);
}

#[test]
fn bad_flags_exit_2_and_name_the_flag() {
    let ws = Workspace::new(GOOD_JOB);
    let cases: &[(&[&str], &[&str])] = &[
        (
            &["chek"],
            &["unrecognized subcommand 'chek'", "similar", "check"],
        ),
        (&["check", "--jason"], &["unexpected argument '--jason'"]),
        (
            &["next", "billing", "-n", "zero"],
            &["'-n <COUNT>'", "invalid"],
        ),
        (
            &["next", "billing", "-n", "0"],
            &["'-n <COUNT>'", "not in 1..=10000"],
        ),
        (
            &["next", "billing", "--after", "yesterday"],
            &["'--after <AFTER>'", "invalid"],
        ),
        (
            &["--log-format", "xml", "check"],
            &["'--log-format <LOG_FORMAT>'", "text, json"],
        ),
        (&["run"], &["required", "<JOB|--all>"]),
        (&["run", "billing", "--all"], &["cannot be used with"]),
        (&["run", "billing", "--from", "2026-01"], &["--to"]),
    ];
    for (args, parts) in cases {
        let out = ws.run(args);
        assert_eq!(out.code(), 2, "{args:?}: {}", out.stderr());
        assert_says(&out.stderr(), parts);
    }
}

#[test]
fn an_unknown_job_name_suggests_the_nearest() {
    let ws = Workspace::new(GOOD_JOB);
    let out = ws.run(&["next", "biling"]);
    assert_eq!(out.code(), 2);
    assert_says(
        &out.stderr(),
        &["no job named `biling`", "did you mean `billing`?"],
    );
}

#[test]
fn check_lists_each_job_with_zone_period_rule_and_next_fire() {
    let ws = Workspace::new(
        "[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\ntimezone = \"Europe/Berlin\"\nperiod = \"month\"\ncovers = \"previous\"\ncommand = [\"true\"]\n",
    );
    let out = ws.run(&["check"]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
    assert_says(
        &out.stdout(),
        &[
            "1 job OK",
            "billing",
            "Europe/Berlin",
            "month (previous)",
            "next 20",
        ],
    );
}

#[test]
fn next_prints_fires_in_the_zone_and_in_utc_with_period_keys() {
    let ws = Workspace::new(
        "[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\ntimezone = \"Europe/Berlin\"\nperiod = \"month\"\ncovers = \"previous\"\ncommand = [\"true\"]\n",
    );
    let out = ws.run(&[
        "next",
        "billing",
        "-n",
        "2",
        "--after",
        "2026-06-15T00:00:00+02:00",
    ]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
    assert_eq!(
        out.stdout(),
        "2026-07-01 02:00:00 CEST  2026-07-01T00:00:00Z  billing:2026-06\n\
         2026-08-01 02:00:00 CEST  2026-08-01T00:00:00Z  billing:2026-07\n"
    );
}

#[test]
fn next_past_the_last_representable_fire_says_so() {
    let ws = Workspace::new(GOOD_JOB);
    let out = ws.run(&[
        "next",
        "billing",
        "-n",
        "3",
        "--after",
        "9999-12-01T00:00:00Z",
    ]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
    assert_eq!(out.stdout(), "");
    assert!(
        out.stderr().contains("no fire after 9999-12-01T00:00:00Z"),
        "{}",
        out.stderr()
    );
}

#[test]
fn the_shipped_jobs_toml_is_valid() {
    let shipped =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/jobs.toml")).unwrap();
    let ws = Workspace::new(&shipped);
    let out = ws.run(&["check"]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
}

#[test]
fn bad_period_labels_exit_2_before_the_database_is_opened() {
    let ws = Workspace::new(GOOD_JOB);
    let cases: &[(&[&str], &str)] = &[
        (
            &["run", "billing", "--period", "2026-7"],
            "--period: `2026-7` is not a label of the job's month periods: expected YYYY-MM, e.g. `2026-07`",
        ),
        (
            &["run", "billing", "--period", "2999-01"],
            "--period: period 2999-01 starts at 2999-01-01T00:00:00Z, after now",
        ),
        (
            &["run", "billing", "--from", "2026-05", "--to", "2026-02"],
            "--to: 2026-02 comes before --from 2026-05",
        ),
        (
            &["run", "billing", "--from", "2026-01", "--to", "2026-13"],
            "--to: `2026-13` is not a label of the job's month periods",
        ),
        (
            &["release", "billing", "--period", "July"],
            "--period: `July` is not a label of the job's month periods",
        ),
        (
            &["run", "bililng", "--period", "2026-07"],
            "no job named `bililng`",
        ),
    ];
    for (args, want) in cases {
        let out = ws.run(args);
        assert_eq!(out.code(), 2, "{args:?}: {}", out.stderr());
        assert_says(&out.stderr(), &[want]);
        assert!(
            !ws.path().join("scheduler.db").exists(),
            "{args:?} opened the database"
        );
    }
}

#[test]
fn an_sql_statement_that_would_end_the_transaction_is_a_configuration_error() {
    for statement in [
        "COMMIT",
        "  rollback",
        "-- done\nEND",
        "/* x */ begin",
        "Savepoint s",
        "INSERT INTO t VALUES ('a;b'); COMMIT",
        "/* nested /* c */ */ COMMIT",
        "-- a comment ended by a carriage return\rCOMMIT",
        "UPDATE t SET n = 1; /* ; */ -- ;\n rollback",
    ] {
        let ws = crate::support::Workspace::new(&format!(
            "[[job]]\nname = \"t\"\nschedule = \"* * * * *\"\nsql = {{ statement = {statement:?} }}\n"
        ));
        let out = ws.run(&["check"]);
        assert_eq!(out.code(), 2, "{statement:?}: {}", out.stderr());
        assert!(
            out.stderr().contains("must not end or split it")
                && out.stderr().contains("jobs.toml:4:"),
            "{statement:?}: {}",
            out.stderr()
        );
    }
    for statement in [
        "UPDATE ends SET committed = true",
        "INSERT INTO t VALUES ('; COMMIT', $1)",
        "INSERT INTO \"x;end\" VALUES (1)",
        "DO $body$ BEGIN PERFORM 1; END $body$",
        "SELECT $$;rollback$$, $1",
        "-- ; commit\nSELECT 1",
    ] {
        let fine = crate::support::Workspace::new(&format!(
            "[[job]]\nname = \"t\"\nschedule = \"* * * * *\"\nsql = {{ statement = {statement:?} }}\n"
        ));
        let out = fine.run(&["check"]);
        assert_eq!(out.code(), 0, "{statement:?}: {}", out.stderr());
    }
}

#[test]
fn a_text_that_ends_the_transaction_as_sqlite_reads_it_is_refused_before_sqlite_runs_it() {
    let db = crate::support::TestDb::sqlite();
    for statement in [
        "insert into t select 1 as [$x$]; rollback; select [$x$] from (select 1 as [$x$])",
        "insert into t select 1 as `$x$`; commit; select `$x$`",
    ] {
        let ws = crate::support::Workspace::new(&format!(
            "[[job]]\nname = \"brk\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\nsql = {{ statement = {statement:?} }}\n"
        ));
        let out = ws.run(&[
            "--database-url",
            &db.url,
            "run",
            "brk",
            "--period",
            "2026-07",
        ]);
        assert_eq!(out.code(), 2, "{statement}: {}", out.stderr());
        assert!(
            out.stderr().contains("job `brk`") && out.stderr().contains("as SQLite reads it"),
            "{statement}: {}",
            out.stderr()
        );
    }
    assert!(
        !std::path::Path::new(db.url.trim_start_matches("sqlite://")).exists(),
        "the database was opened"
    );
}

/// One `check` says every mistake of a job, not one per round (issue 26,
/// item 15: cron, then the zone, then a placeholder, one `check` each).
#[test]
fn check_reports_every_mistake_of_a_job_at_once() {
    let ws = Workspace::new(
        "[[job]]\nname = \"a\"\nschedule = \"61 * * * *\"\ntimezone = \"Europe/Berlim\"\n\
         command = [\"x\", \"{perod}\"]\nretry = { attempts = 0 }\ntimeout = \"soon\"\n",
    );
    let out = ws.run(&["check"]);
    assert_eq!(out.code(), 2, "{}", out.stderr());
    for place in [
        "jobs.toml:3:12: `61 * * * *` is not a cron pattern",
        "jobs.toml:4:12: `Europe/Berlim` is not a time zone",
        "jobs.toml:5:18: unknown placeholder `{perod}`",
        "jobs.toml:6:22: `0` is out of range",
        "jobs.toml:7:11: `soon` is not a duration",
    ] {
        assert!(
            out.stderr().contains(place),
            "no {place} in:\n{}",
            out.stderr()
        );
    }
}

/// The settings' mistakes, and every bad `inherit` entry, come at once too
/// (found by the new-user review: one per `check`).
#[test]
fn check_reports_every_bad_setting_and_inherit_entry_at_once() {
    let ws = Workspace::new(
        "[scheduler]\nlease = \"500ms\"\nscan_interval = \"10ms\"\n\n[[job]]\nname = \"a\"\nschedule = \"@daily\"\n\
         command = [\"true\"]\ninherit = [\"bad name\", \"PATH\", \"PATH\", \"\", \"A=B\"]\n",
    );
    let out = ws.run(&["check"]);
    assert_eq!(out.code(), 2, "{}", out.stderr());
    for part in [
        "jobs.toml:2:9: lease",
        "jobs.toml:3:17: scan_interval",
        "`bad name` is not an environment variable name",
        "`PATH` is listed twice",
        "`` is not an environment variable name",
        "`A=B` is not an environment variable name",
    ] {
        assert!(
            out.stderr().contains(part),
            "no {part} in:\n{}",
            out.stderr()
        );
    }
}

#[test]
fn a_bad_setting_does_not_turn_a_keep_the_file_allows_into_an_error() {
    // catch_up is 1h and keep 3h: fine, whatever else `[scheduler]` gets
    // wrong (a bad zone had keep checked against the default, 24h).
    let ws = Workspace::new(
        "[scheduler]\ntimezone = \"Mars/Olympus\"\ncatch_up = \"1h\"\n\n[[job]]\nname = \"a\"\nschedule = \"@daily\"\n\
         command = [\"true\"]\nkeep = \"3h\"\n",
    );
    let out = ws.run(&["check"]);
    assert_eq!(out.code(), 2, "{}", out.stderr());
    assert!(out.stderr().contains("Mars/Olympus"), "{}", out.stderr());
    assert!(!out.stderr().contains("keep"), "{}", out.stderr());
}

#[test]
fn a_listen_address_without_an_ip_says_what_to_write() {
    let ws = Workspace::new("");
    for (given, port) in [(":9400", "9400"), ("localhost:9400", "9400")] {
        let out = ws.run(&["serve", "--listen", given]);
        assert_eq!(out.code(), 2, "{}", out.stderr());
        for part in [
            "--listen".to_owned(),
            format!("127.0.0.1:{port}"),
            format!("0.0.0.0:{port}"),
        ] {
            assert!(
                out.stderr().contains(&part),
                "no {part} in {}",
                out.stderr()
            );
        }
    }
}

#[test]
fn calendar_mistakes_are_refused_with_their_place() {
    let job = |extra: &str| {
        format!("[[job]]\nname = \"a\"\nschedule = \"0 2 1 * *\"\n{extra}\ncommand = [\"x\"]\n")
    };
    let cases: Vec<(String, &[&str])> = vec![
        (
            "[[calendar]]\nname = \"never\"\nworking_days = []\n".to_owned() + &job(""),
            &[
                "jobs.toml:3:16",
                "calendar `never` has no working weekday: it excludes every day",
            ],
        ),
        (
            "[[calendar]]\nname = \"business\"\n".to_owned() + &job("calendar = \"busines\""),
            &[
                "jobs.toml:6:12",
                "unknown calendar `busines` (calendars: `business`)",
                "did you mean `business`?",
            ],
        ),
        (
            job("calendar = \"business\""),
            &[
                "jobs.toml:4:12",
                "unknown calendar `business` (the file has no `[[calendar]]`)",
            ],
        ),
        (
            "[[calendar]]\nname = \"b\"\nholidays = [\"2027-02-30\"]\n".to_owned() + &job(""),
            &[
                "jobs.toml:3:13",
                "`2027-02-30` is not a date: expected `YYYY-MM-DD`",
            ],
        ),
        (
            "[[calendar]]\nname = \"b\"\nworking_days = [\"mon\", \"fry\"]\n".to_owned() + &job(""),
            &["jobs.toml:3:24", "`fry` is not a weekday"],
        ),
        (
            job("on_day_off = \"next\""),
            &["jobs.toml:4:14", "`on_day_off` without `calendar`"],
        ),
        (
            job("active_from = \"2027-03-01\"\nactive_until = \"2027-02-01\""),
            &[
                "jobs.toml:5:16",
                "`active_until` 2027-02-01 comes before `active_from` 2027-03-01",
            ],
        ),
        (
            job("active_from = \"March\""),
            &["jobs.toml:4:15", "`March` is not a date"],
        ),
        (
            job("jitter = \"soon\""),
            &["jobs.toml:4:10", "`soon` is not a duration"],
        ),
        (
            "[[calendar]]\nname = \"b\"\n".to_owned()
                + &job("calendar = \"b\"\non_day_off = \"next\"")
                    .replace("0 2 1 * *", "*/5 * * * *"),
            &[
                "jobs.toml:7:14",
                "fires more than 24 times a day",
                "(use `on_day_off = \"skip\"`)",
            ],
        ),
        (
            "[[calendar]]\nname = \"b\"\n[[calendar]]\nname = \"b\"\n".to_owned() + &job(""),
            &["jobs.toml:3:1", "calendar name `b` is used twice"],
        ),
        (
            job("active_from = \"2027-1-5\""),
            &[
                "jobs.toml:4:15",
                "`2027-1-5` is not a date: expected `YYYY-MM-DD`",
            ],
        ),
        (
            job("active_from = 2027-06-01T10:00:00"),
            &["jobs.toml:4:15", "`2027-06-01T10:00:00` is not a date"],
        ),
        (
            "[[calendar]]\nname = \"b\"\nworking_days = [\"tues\"]\n".to_owned() + &job(""),
            &[
                "jobs.toml:3:17",
                "`tues` is not a weekday",
                "did you mean `tue`?",
            ],
        ),
    ];
    for (toml, parts) in &cases {
        assert_says(&check_fails(toml), parts);
    }
}

#[test]
fn a_holidays_file_line_that_is_not_a_date_is_named() {
    let ws = Workspace::new(
        "[[calendar]]\nname = \"b\"\nholidays_file = \"holidays.txt\"\n\n\
         [[job]]\nname = \"a\"\nschedule = \"0 2 1 * *\"\ncalendar = \"b\"\ncommand = [\"x\"]\n",
    );
    std::fs::write(
        ws.path().join("holidays.txt"),
        "# generated\n2027-01-01\n\n2027-13-01\n",
    )
    .unwrap();
    let out = ws.run(&["check"]);
    assert_eq!(out.code(), 2, "{}", out.stdout());
    assert_says(
        &out.stderr(),
        &[
            "jobs.toml:3:17",
            "holidays.txt:4: `2027-13-01`; expected one ISO date a line",
        ],
    );
    std::fs::remove_file(ws.path().join("holidays.txt")).unwrap();
    let out = ws.run(&["check"]);
    assert_eq!(out.code(), 2, "{}", out.stdout());
    assert_says(
        &out.stderr(),
        &["jobs.toml:3:17", "`holidays_file`: cannot read"],
    );
}

#[test]
fn a_calendar_with_a_mistake_is_not_also_called_unknown_and_toml_dates_are_dates() {
    let text = "[[calendar]]\nname = \"b\"\nholidays = [2027-01-01, \"2027-02-30\"]\n\n\
                [[job]]\nname = \"a\"\nschedule = \"0 2 1 * *\"\ncalendar = \"b\"\n\
                active_from = 2027-01-01\ncommand = [\"x\"]\n";
    let stderr = check_fails(text);
    assert_says(&stderr, &["jobs.toml:3:25", "`2027-02-30` is not a date"]);
    assert!(!stderr.contains("unknown calendar"), "{stderr}");
    let ws = Workspace::new(&text.replace(", \"2027-02-30\"", ""));
    let out = ws.run(&["check"]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
}

#[test]
fn a_calendar_of_years_off_and_a_job_that_would_never_fire_are_refused() {
    let ws = Workspace::new(
        "[[calendar]]\nname = \"all\"\nholidays_file = \"every-day.txt\"\n\n\
         [[job]]\nname = \"a\"\nschedule = \"0 7 * * *\"\ncalendar = \"all\"\non_day_off = \"next\"\n\
         command = [\"x\"]\n",
    );
    let start = chrono::NaiveDate::from_ymd_opt(1800, 1, 1).unwrap();
    let every: Vec<String> = (0..100_000)
        .map(|n| (start + chrono::Days::new(n)).to_string())
        .collect();
    std::fs::write(ws.path().join("every-day.txt"), every.join("\n")).unwrap();
    let out = ws.run(&["check"]);
    assert_eq!(out.code(), 2, "{}", out.stdout());
    assert_says(
        &out.stderr(),
        &[
            "jobs.toml:2:8",
            "calendar `all` has 100000 days off in a row: at most 366",
        ],
    );
    let stderr = check_fails(
        "[[calendar]]\nname = \"b\"\n\n[[job]]\nname = \"sat\"\nschedule = \"0 7 * * 6\"\n\
         calendar = \"b\"\ncommand = [\"x\"]\n",
    );
    assert_says(
        &stderr,
        &[
            "jobs.toml:7:12",
            "job `sat` would never fire: `0 7 * * 6` falls only on days its calendar skips",
        ],
    );
}

/// A value of the wrong type is answered in the file's words, with what to
/// write, never with the name of an internal type (issue 39, item 8).
#[test]
fn a_value_of_the_wrong_type_says_what_to_write() {
    let job = "[[job]]\nname = \"a\"\nschedule = \"@daily\"\n";
    let cases: &[(&str, &[&str])] = &[
        (
            "sql = \"SELECT 1\"\n",
            &["`sql` is a string, but it must be a table: sql = { statement = \"SELECT 1\" }"],
        ),
        (
            "http = \"https://example.com/x\"\n",
            &[
                "`http` is a string, but it must be a table: http = { url = \"https://example.com/x\" }",
            ],
        ),
        (
            "command = [\"true\"]\nretry = 3\n",
            &[
                "`retry` is a number, but it must be a table: retry = { attempts = 3, backoff = \"1m\" }",
            ],
        ),
        (
            "command = [\"true\"]\nconcurrency = \"2\"\n",
            &[
                "`concurrency` is a string, but it must be a whole number, without quotes: concurrency = 2",
            ],
        ),
        (
            "command = [\"true\"]\nenv = [\"A=1\"]\n",
            &[
                "`env` is an array, but it must be a table of names and values: env = { NAME = \"value\" }",
            ],
        ),
        (
            "command = [\"true\"]\ntimeout = 30\n",
            &["`timeout` is a number, but it must be a duration in quotes: timeout = \"30s\""],
        ),
        (
            "command = [\"true\"]\ndeadline = 5\n",
            &["`deadline` is a number, but it must be a duration in quotes: deadline = \"5s\""],
        ),
    ];
    for (body, parts) in cases {
        let stderr = check_fails(&format!("{job}{body}"));
        assert_says(&stderr, parts);
        for internal in ["struct", "Raw", "i64", "u32", "a map"] {
            assert!(
                !stderr.contains(internal),
                "{internal:?} reached the user:\n{stderr}"
            );
        }
    }
}

/// An `after` that names no job is told with the file's other mistakes,
/// not in a later round once they are fixed (issue 39, item 6).
#[test]
fn an_after_typo_is_told_with_the_other_mistakes_at_once() {
    let stderr = check_fails(
        "[[job]]\nname = \"ingest\"\nschedule = \"0 1 * * *\"\ncommand = [\"true\"]\ntimeout = 30\n\n\
         [[job]]\nname = \"report\"\nschedule = \"0 2 1 * *\"\nafter = [\"ingset\"]\ncommand = [\"true\"]\n",
    );
    assert_says(
        &stderr,
        &[
            "`timeout` is a number, but it must be a duration in quotes",
            "`after`: no job named `ingset`; did you mean `ingest`?",
        ],
    );
}
