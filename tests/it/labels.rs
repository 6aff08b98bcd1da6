//! Period labels for every granularity, and labels given by hand.

use crate::support::{at, job};
use scheduler::period::utc_text;

fn label(body: &str, fire: &str) -> String {
    let job = job(body);
    job.period.period_of(&job.schedule, at(fire)).label
}

#[test]
fn every_granularity_labels_the_period_containing_the_fire() {
    let cases = [
        (
            "period = \"minute\"",
            "2026-07-15T14:05:30Z",
            "2026-07-15T14:05",
        ),
        ("period = \"hour\"", "2026-07-15T14:05:00Z", "2026-07-15T14"),
        ("period = \"day\"", "2026-07-15T14:05:00Z", "2026-07-15"),
        ("period = \"week\"", "2026-07-15T14:05:00Z", "2026-W29"),
        ("period = \"month\"", "2026-07-15T14:05:00Z", "2026-07"),
        ("period = \"quarter\"", "2026-07-15T14:05:00Z", "2026-Q3"),
        ("period = \"quarter\"", "2026-12-31T23:59:00Z", "2026-Q4"),
        ("period = \"year\"", "2026-07-15T14:05:00Z", "2026"),
        (
            "period = \"fire\"",
            "2026-07-15T14:05:00Z",
            "2026-07-15T14:05:00Z",
        ),
        ("period = \"day\"", "2028-02-29T10:00:00Z", "2028-02-29"),
    ];
    for (rule, fire, want) in cases {
        let body = format!("schedule = \"* * * * *\"\n{rule}");
        assert_eq!(label(&body, fire), want, "{rule} at {fire}");
    }
}

#[test]
fn iso_weeks_belong_to_their_iso_week_year() {
    let body = "schedule = \"0 12 * * *\"\nperiod = \"week\"";
    assert_eq!(label(body, "2026-12-31T12:00:00Z"), "2026-W53");
    assert_eq!(label(body, "2027-01-01T12:00:00Z"), "2026-W53");
    assert_eq!(label(body, "2024-12-30T12:00:00Z"), "2025-W01");
}

#[test]
fn covers_previous_steps_back_across_a_year_boundary() {
    let cases = [
        ("day", "2027-01-01T02:00:00Z", "2026-12-31"),
        ("week", "2027-01-04T02:00:00Z", "2026-W53"),
        ("month", "2027-01-01T02:00:00Z", "2026-12"),
        ("quarter", "2027-01-01T02:00:00Z", "2026-Q4"),
        ("year", "2027-01-01T02:00:00Z", "2026"),
        ("day", "2028-03-01T02:00:00Z", "2028-02-29"),
    ];
    for (unit, fire, want) in cases {
        let body = format!("schedule = \"0 2 * * *\"\nperiod = \"{unit}\"\ncovers = \"previous\"");
        assert_eq!(label(&body, fire), want, "{unit} at {fire}");
    }
}

#[test]
fn a_fire_period_is_labelled_in_utc_and_previous_names_the_previous_fire() {
    let body = "schedule = \"0 9 * * *\"\ntimezone = \"Asia/Tokyo\"\nperiod = \"fire\"";
    let job = job(body);
    let period = job
        .period
        .period_of(&job.schedule, at("2026-07-15T00:00:00Z"));
    assert_eq!(period.label, "2026-07-15T00:00:00Z");
    assert_eq!(utc_text(period.end), "2026-07-16T00:00:00Z");

    let previous = crate::support::job(&format!("{body}\ncovers = \"previous\""));
    let period = previous
        .period
        .period_of(&previous.schedule, at("2026-07-15T00:00:00Z"));
    assert_eq!(period.label, "2026-07-14T00:00:00Z");
    assert_eq!(utc_text(period.end), "2026-07-15T00:00:00Z");
}

#[test]
fn period_bounds_are_utc_instants_of_local_boundaries() {
    let job = job("schedule = \"0 2 1 * *\"\ntimezone = \"Europe/Berlin\"\nperiod = \"month\"");
    let period = job
        .period
        .period_of(&job.schedule, at("2026-07-01T00:00:00Z"));
    assert_eq!(period.label, "2026-07");
    assert_eq!(utc_text(period.start), "2026-06-30T22:00:00Z");
    assert_eq!(utc_text(period.end), "2026-07-31T22:00:00Z");
}

#[test]
fn hand_given_labels_parse_back_to_their_period() {
    let cases = [
        ("minute", "2026-07-15T14:05"),
        ("hour", "2026-07-15T14"),
        ("day", "2026-02-28"),
        ("week", "2026-W53"),
        ("month", "2026-07"),
        ("quarter", "2026-Q1"),
        ("year", "2026"),
    ];
    for (unit, text) in cases {
        let job = job(&format!("schedule = \"* * * * *\"\nperiod = \"{unit}\""));
        let period = job.period.parse_label(&job.schedule, text).unwrap();
        assert_eq!(period.label, text);
    }
}

#[test]
fn a_label_in_the_wrong_format_says_which_format_is_expected() {
    let cases = [
        ("month", "2026-7", "expected YYYY-MM, e.g. `2026-07`"),
        ("month", "2026-07-01", "expected YYYY-MM"),
        (
            "week",
            "2026-W5",
            "expected an ISO week YYYY-Www, e.g. `2026-W29`",
        ),
        ("week", "2025-W53", "ISO week"),
        ("quarter", "2026-Q5", "expected YYYY-Qn"),
        ("day", "2026-02-30", "expected YYYY-MM-DD"),
        (
            "fire",
            "2026-07-15T14:05:00Z",
            "a fire time of the job's schedule",
        ),
        ("fire", "2026-07-15 14:00", "YYYY-MM-DDTHH:MM:SSZ"),
    ];
    for (unit, text, want) in cases {
        let job = job(&format!("schedule = \"0 * * * *\"\nperiod = \"{unit}\""));
        let err = job.period.parse_label(&job.schedule, text).unwrap_err();
        assert!(err.to_string().contains(want), "{unit} {text}: {err}");
    }
}

#[test]
fn a_hand_given_fire_label_must_be_a_fire_time() {
    let job = job("schedule = \"0 * * * *\"\nperiod = \"fire\"");
    let period = job
        .period
        .parse_label(&job.schedule, "2026-07-15T14:00:00Z")
        .unwrap();
    assert_eq!(utc_text(period.end), "2026-07-15T15:00:00Z");
}

/// A year is written in four digits in every label, as `%Y` writes the
/// other units' (issue 26, item 15: `--period 1` was taken for the year 1
/// and `0012` refused).
#[test]
fn a_year_label_has_four_digits_whatever_the_unit() {
    for (rule, good, bad) in [
        ("period = \"year\"", "0012", "12"),
        ("period = \"year\"", "2026", "1"),
        ("period = \"quarter\"", "0012-Q3", "12-Q3"),
        ("period = \"week\"", "0012-W05", "12-W05"),
        ("period = \"month\"", "0012-07", "12-07"),
    ] {
        let job = job(&format!("schedule = \"0 0 1 * *\"\n{rule}"));
        let parsed = job.period.parse_label(&job.schedule, good);
        assert_eq!(
            parsed.map(|p| p.label).ok().as_deref(),
            Some(good),
            "{rule}"
        );
        assert!(
            job.period.parse_label(&job.schedule, bad).is_err(),
            "{rule}: {bad}"
        );
    }
}

#[test]
fn instants_are_written_to_the_second_in_utc_with_a_z_at_every_year() {
    use chrono::{DateTime, TimeDelta, Utc};
    let cases = [
        (at("2026-07-15T14:05:30.999Z"), "2026-07-15T14:05:30Z"),
        (DateTime::UNIX_EPOCH, "1970-01-01T00:00:00Z"),
        (at("0000-01-01T00:00:00Z"), "0000-01-01T00:00:00Z"),
        (
            at("0000-01-01T00:00:00Z") - TimeDelta::seconds(1),
            "-0001-12-31T23:59:59Z",
        ),
        (DateTime::<Utc>::MAX_UTC, "+262142-12-31T23:59:59Z"),
        (DateTime::<Utc>::MIN_UTC, "-262143-01-01T00:00:00Z"),
    ];
    for (t, text) in cases {
        assert_eq!(utc_text(t), text);
    }
}
