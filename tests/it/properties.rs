//! Properties of fire times and periods over random schedules, zones, DST
//! rules and instants, biased toward daylight-saving transitions.

use chrono::{DateTime, LocalResult, TimeDelta, TimeZone, Utc};
use proptest::prelude::*;

use crate::support::{at, job};
use scheduler::config::Job;
use scheduler::period::Unit;

const PATTERNS: [&str; 8] = [
    "* * * * *",
    "*/7 * * * *",
    "30 1 * * *",
    "15,45 1-3 * * *",
    "0 2 * * 0",
    "0 0 1 * *",
    "0 0 L * *",
    "*/20 * * * * *",
];
const ZONES: [&str; 6] = [
    "UTC",
    "America/New_York",
    "Europe/Berlin",
    "Australia/Sydney",
    "Australia/Lord_Howe",
    "Asia/Kolkata",
];
const TRANSITIONS: [&str; 6] = [
    "2026-03-08T07:00:00Z",
    "2026-11-01T06:00:00Z",
    "2026-03-29T01:00:00Z",
    "2026-10-25T01:00:00Z",
    "2026-04-04T15:00:00Z",
    "2026-10-03T15:30:00Z",
];
const UNITS: [&str; 8] = [
    "minute", "hour", "day", "week", "month", "quarter", "year", "fire",
];

fn arb_job() -> impl Strategy<Value = Job> {
    (
        prop::sample::select(&PATTERNS[..]),
        prop::sample::select(&ZONES[..]),
        prop::sample::select(&["first", "last", "both"][..]),
        prop::sample::select(&["shift", "skip"][..]),
        prop::sample::select(&UNITS[..]),
        prop::sample::select(&["current", "previous"][..]),
    )
        .prop_map(|(pattern, zone, repeat, gap, unit, covers)| {
            job(&format!(
                "schedule = \"{pattern}\"\ntimezone = \"{zone}\"\nperiod = \"{unit}\"\ncovers = \"{covers}\"\ndst = {{ gap = \"{gap}\", repeat = \"{repeat}\" }}"
            ))
        })
}

fn arb_instant() -> impl Strategy<Value = DateTime<Utc>> {
    prop_oneof![
        (
            prop::sample::select(&TRANSITIONS[..]),
            -36 * 3600i64..36 * 3600
        )
            .prop_map(|(t, s)| at(t) + TimeDelta::seconds(s)),
        (0i64..4 * 365 * 86400).prop_map(|s| at("2025-01-01T00:00:00Z") + TimeDelta::seconds(s)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn fire_times_strictly_increase(job in arb_job(), t in arb_instant()) {
        let fires: Vec<_> = std::iter::successors(job.schedule.next_after(t), |f| job.schedule.next_after(*f))
            .take(40)
            .collect();
        prop_assert!(!fires.is_empty());
        prop_assert!(fires[0] > t);
        for pair in fires.windows(2) {
            prop_assert!(pair[0] < pair[1], "{} then {}", pair[0], pair[1]);
        }
    }

    #[test]
    fn stepping_back_finds_the_same_fires_as_stepping_forward(job in arb_job(), t in arb_instant()) {
        let until = t + TimeDelta::hours(30);
        let forward: Vec<_> = job.schedule.fires_between(t, until).collect();
        let mut backward: Vec<_> = std::iter::successors(
            job.schedule.prev_before(until + TimeDelta::seconds(1)),
            |f| job.schedule.prev_before(*f),
        )
        .take_while(|f| *f > t)
        .collect();
        backward.reverse();
        prop_assert_eq!(forward, backward);
    }

    #[test]
    fn with_covers_current_every_fire_lies_in_its_period(job in arb_job(), t in arb_instant()) {
        prop_assume!(job.period.covers == scheduler::period::Covers::Current);
        for fire in job.schedule.fires_between(t, t + TimeDelta::hours(6)).take(50) {
            let period = job.period.period_of(&job.schedule, fire);
            // A minute that a fall-back repeats is one label; its period has
            // the first pass's bounds, and a second-pass fire is a no-op.
            let wall = fire.with_timezone(&job.schedule.zone()).naive_local();
            let repeated = job.period.unit == Unit::Minute
                && matches!(job.schedule.zone().from_local_datetime(&wall), LocalResult::Ambiguous(..));
            prop_assert!(period.start <= fire && (fire < period.end || repeated),
                "{} not in {} [{}, {})", fire, period.label, period.start, period.end);
        }
    }

    #[test]
    fn a_label_parses_back_to_its_period(job in arb_job(), t in arb_instant()) {
        prop_assume!(job.period.unit != Unit::Fire || job.schedule.source() != "*/20 * * * * *");
        if let Some(fire) = job.schedule.next_after(t) {
            let period = job.period.period_of(&job.schedule, fire);
            let parsed = job.period.parse_label(&job.schedule, &period.label);
            prop_assert_eq!(parsed, Ok(period));
        }
    }
}
