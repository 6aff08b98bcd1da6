//! Daylight saving time: gaps shift or skip, repeats fire first, last or
//! both, and calendar periods still run once.

use std::collections::BTreeSet;

use crate::support::{Said, Workspace, at, job};
use scheduler::period::utc_text;

fn fires(zone: &str, schedule: &str, dst: &str, from: &str, to: &str) -> Vec<String> {
    let job = job(&format!(
        "schedule = \"{schedule}\"\ntimezone = \"{zone}\"\ndst = {{ {dst} }}"
    ));
    job.schedule
        .fires_between(at(from), at(to))
        .map(utc_text)
        .collect()
}

struct Case {
    zone: &'static str,
    schedule: &'static str,
    dst: &'static str,
    day: (&'static str, &'static str),
    want: &'static [&'static str],
}

#[test]
fn gap_and_repeat_rules_in_four_zones() {
    let cases = [
        // New York: 2026-03-08 02:00 -> 03:00, 2026-11-01 02:00 -> 01:00.
        Case {
            zone: "America/New_York",
            schedule: "30 2 * * *",
            dst: "gap = \"shift\"",
            day: ("2026-03-08T04:00:00Z", "2026-03-09T04:00:00Z"),
            want: &["2026-03-08T07:00:00Z"],
        },
        Case {
            zone: "America/New_York",
            schedule: "30 2 * * *",
            dst: "gap = \"skip\"",
            day: ("2026-03-08T04:00:00Z", "2026-03-09T04:00:00Z"),
            want: &[],
        },
        Case {
            zone: "America/New_York",
            schedule: "30 1 * * *",
            dst: "repeat = \"first\"",
            day: ("2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"),
            want: &["2026-11-01T05:30:00Z"],
        },
        Case {
            zone: "America/New_York",
            schedule: "30 1 * * *",
            dst: "repeat = \"last\"",
            day: ("2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"),
            want: &["2026-11-01T06:30:00Z"],
        },
        Case {
            zone: "America/New_York",
            schedule: "30 1 * * *",
            dst: "repeat = \"both\"",
            day: ("2026-11-01T04:00:00Z", "2026-11-02T05:00:00Z"),
            want: &["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z"],
        },
        // Berlin: 2026-03-29 02:00 -> 03:00, 2026-10-25 03:00 -> 02:00.
        Case {
            zone: "Europe/Berlin",
            schedule: "30 2 * * *",
            dst: "gap = \"shift\"",
            day: ("2026-03-28T23:00:00Z", "2026-03-29T22:00:00Z"),
            want: &["2026-03-29T01:00:00Z"],
        },
        Case {
            zone: "Europe/Berlin",
            schedule: "30 2 * * *",
            dst: "repeat = \"both\"",
            day: ("2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z"),
            want: &["2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z"],
        },
        Case {
            zone: "Europe/Berlin",
            schedule: "30 2 * * *",
            dst: "repeat = \"last\"",
            day: ("2026-10-24T22:00:00Z", "2026-10-25T23:00:00Z"),
            want: &["2026-10-25T01:30:00Z"],
        },
        // Sydney: 2026-04-05 03:00 -> 02:00, 2026-10-04 02:00 -> 03:00.
        Case {
            zone: "Australia/Sydney",
            schedule: "30 2 * * *",
            dst: "repeat = \"first\"",
            day: ("2026-04-04T13:00:00Z", "2026-04-05T14:00:00Z"),
            want: &["2026-04-04T15:30:00Z"],
        },
        Case {
            zone: "Australia/Sydney",
            schedule: "30 2 * * *",
            dst: "repeat = \"both\"",
            day: ("2026-04-04T13:00:00Z", "2026-04-05T14:00:00Z"),
            want: &["2026-04-04T15:30:00Z", "2026-04-04T16:30:00Z"],
        },
        Case {
            zone: "Australia/Sydney",
            schedule: "30 2 * * *",
            dst: "gap = \"shift\"",
            day: ("2026-10-03T14:00:00Z", "2026-10-04T13:00:00Z"),
            want: &["2026-10-03T16:00:00Z"],
        },
        Case {
            zone: "Australia/Sydney",
            schedule: "30 2 * * *",
            dst: "gap = \"skip\"",
            day: ("2026-10-03T14:00:00Z", "2026-10-04T13:00:00Z"),
            want: &[],
        },
        // Lord Howe shifts by 30 minutes: 2026-04-05 02:00 -> 01:30,
        // 2026-10-04 02:00 -> 02:30.
        Case {
            zone: "Australia/Lord_Howe",
            schedule: "45 1 * * *",
            dst: "repeat = \"both\"",
            day: ("2026-04-04T13:00:00Z", "2026-04-05T13:30:00Z"),
            want: &["2026-04-04T14:45:00Z", "2026-04-04T15:15:00Z"],
        },
        Case {
            zone: "Australia/Lord_Howe",
            schedule: "45 1 * * *",
            dst: "repeat = \"last\"",
            day: ("2026-04-04T13:00:00Z", "2026-04-05T13:30:00Z"),
            want: &["2026-04-04T15:15:00Z"],
        },
        Case {
            zone: "Australia/Lord_Howe",
            schedule: "15 2 * * *",
            dst: "gap = \"shift\"",
            day: ("2026-10-03T13:30:00Z", "2026-10-04T13:00:00Z"),
            want: &["2026-10-03T15:30:00Z"],
        },
        Case {
            zone: "Australia/Lord_Howe",
            schedule: "15 2 * * *",
            dst: "gap = \"skip\"",
            day: ("2026-10-03T13:30:00Z", "2026-10-04T13:00:00Z"),
            want: &[],
        },
    ];
    for c in cases {
        let got = fires(c.zone, c.schedule, c.dst, c.day.0, c.day.1);
        assert_eq!(got, c.want, "{} `{}` {{ {} }}", c.zone, c.schedule, c.dst);
    }
}

#[test]
fn an_every_minute_job_in_a_gap_fires_once_at_its_end() {
    let got = fires(
        "America/New_York",
        "* 2 * * *",
        "gap = \"shift\"",
        "2026-03-08T06:00:00Z",
        "2026-03-08T08:00:00Z",
    );
    assert_eq!(got, ["2026-03-08T07:00:00Z"]);
}

#[test]
fn an_every_minute_job_with_repeat_both_fires_through_both_passes() {
    let got = fires(
        "America/New_York",
        "*/20 1 * * *",
        "repeat = \"both\"",
        "2026-11-01T04:59:00Z",
        "2026-11-01T07:00:00Z",
    );
    assert_eq!(
        got,
        [
            "2026-11-01T05:00:00Z",
            "2026-11-01T05:20:00Z",
            "2026-11-01T05:40:00Z",
            "2026-11-01T06:00:00Z",
            "2026-11-01T06:20:00Z",
            "2026-11-01T06:40:00Z",
        ]
    );
}

#[test]
fn calendar_periods_keep_one_key_across_both_transitions() {
    for zone in [
        "America/New_York",
        "Europe/Berlin",
        "Australia/Sydney",
        "Australia/Lord_Howe",
    ] {
        for (unit, want) in [("day", 365), ("month", 12)] {
            let job = job(&format!(
                "schedule = \"*/30 * * * *\"\ntimezone = \"{zone}\"\nperiod = \"{unit}\"\ndst = {{ repeat = \"both\" }}"
            ));
            let labels: BTreeSet<String> = job
                .schedule
                .fires_between(at("2026-01-01T00:00:00Z"), at("2027-01-01T00:00:00Z"))
                .map(|f| job.period.period_of(&job.schedule, f))
                .filter(|p| {
                    p.start >= at("2026-01-01T00:00:00Z") && p.end <= at("2027-01-01T00:00:00Z")
                })
                .map(|p| p.label)
                .collect();
            // Periods wholly inside 2026 UTC: all but the one that straddles
            // a year boundary in the zone. A split or a stray key changes it.
            assert_eq!(labels.len(), want - 1, "{zone} {unit}");
        }
    }
}

#[test]
fn a_fall_back_day_lasts_25_hours_and_a_spring_day_23() {
    let job = job("schedule = \"0 12 * * *\"\ntimezone = \"America/New_York\"\nperiod = \"day\"");
    let fall = job.period.parse_label(&job.schedule, "2026-11-01").unwrap();
    assert_eq!((fall.end - fall.start).num_hours(), 25);
    let spring = job.period.parse_label(&job.schedule, "2026-03-08").unwrap();
    assert_eq!((spring.end - spring.start).num_hours(), 23);
}

#[test]
fn a_fire_job_with_repeat_both_gets_two_keys() {
    let job = job(
        "schedule = \"30 1 * * *\"\ntimezone = \"America/New_York\"\ndst = { repeat = \"both\" }",
    );
    let labels: Vec<String> = job
        .schedule
        .fires_between(at("2026-11-01T04:00:00Z"), at("2026-11-01T08:00:00Z"))
        .map(|f| job.period.period_of(&job.schedule, f).label)
        .collect();
    assert_eq!(labels, ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z"]);
}

/// The periods a hand run goes through when a spring-forward makes a label
/// empty: a range from that label stopped after it (exit 0, nothing else
/// run), one to it ran the hour after it, and `--period` of it ran a period
/// that does not exist.
#[test]
fn a_hand_run_skips_a_label_a_spring_forward_makes_empty_at_either_end_and_refuses_it_alone() {
    let ws = Workspace::new(
        "[[job]]\nname = \"nyhour\"\nschedule = \"0 * * * *\"\ntimezone = \"America/New_York\"\n\
         period = \"hour\"\ncommand = [\"true\"]\n",
    );
    let keys = |from: &str, to: &str| -> Vec<String> {
        let out = ws.run(&["run", "nyhour", "--from", from, "--to", to, "--dry-run"]);
        assert_eq!(out.code(), 0, "{}", out.stderr());
        out.stdout()
            .lines()
            .map(|l| l.split_whitespace().next().unwrap_or_default().to_owned())
            .collect()
    };
    let hours = |hs: &[&str]| -> Vec<String> {
        hs.iter()
            .map(|h| format!("nyhour:2026-03-08T{h}"))
            .collect()
    };
    assert_eq!(
        keys("2026-03-08T01", "2026-03-08T04"),
        hours(&["01", "03", "04"])
    );
    assert_eq!(
        keys("2026-03-08T02", "2026-03-08T05"),
        hours(&["03", "04", "05"])
    );
    assert_eq!(keys("2026-03-08T00", "2026-03-08T02"), hours(&["00", "01"]));
    // A last label in the gap before the first is a reversed range.
    let reversed = ws.run(&[
        "run",
        "nyhour",
        "--from",
        "2026-03-08T03",
        "--to",
        "2026-03-08T02",
        "--dry-run",
    ]);
    assert_eq!(reversed.code(), 2, "{}", reversed.stdout());
    assert!(
        reversed.stderr().contains("comes before"),
        "{}",
        reversed.stderr()
    );
    let alone = ws.run(&["run", "nyhour", "--period", "2026-03-08T02", "--dry-run"]);
    assert_eq!(alone.code(), 2, "{}", alone.stdout());
    for part in ["--period", "2026-03-08T02", "spring-forward"] {
        assert!(alone.stderr().contains(part), "{part}: {}", alone.stderr());
    }
}
