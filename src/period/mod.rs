//! Periods: the window of time one run covers, its label and its key.
//! Pure: derived from a fire time, or parsed from a label given by hand.

use std::fmt;

use chrono::{
    DateTime, Datelike, Days, Months, NaiveDate, NaiveDateTime, NaiveTime, Timelike, Utc,
};
use serde::Deserialize;

use crate::schedule::{Schedule, earliest_instant, local};

pub(crate) mod walk;

/// The granularity of a job's periods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unit {
    /// `2026-07-15T14:05`
    Minute,
    /// `2026-07-15T14`
    Hour,
    /// `2026-07-15`
    Day,
    /// ISO week `2026-W29`
    Week,
    /// `2026-07`
    Month,
    /// `2026-Q3`
    Quarter,
    /// `2026`
    Year,
    /// One period per fire, labelled by the fire instant in UTC.
    #[default]
    Fire,
}

/// Whether a fire covers the period it falls in or the one before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Covers {
    /// The period containing the fire.
    #[default]
    Current,
    /// The period before the one containing the fire.
    Previous,
}

/// A job's period rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PeriodRule {
    /// The granularity.
    pub unit: Unit,
    /// Which period a fire covers.
    pub covers: Covers,
}

/// One period: its label and its UTC bounds (end exclusive).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Period {
    /// `2026-07`, `2026-W29`, `2026-07-15T14:05:00Z`, …
    pub label: String,
    /// First instant of the period.
    pub start: DateTime<Utc>,
    /// First instant after the period.
    pub end: DateTime<Utc>,
}

/// The most shards a job's period may be split into. Each shard is a claim
/// row of its own, and a period's view reads all of them.
pub const MAX_SHARDS: u32 = 256;

/// One shard of a period: `index` (from 0) of `of` (2 to [`MAX_SHARDS`]).
/// Shown and keyed as `#index/of`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Shard {
    /// Which shard, from 0.
    pub index: u32,
    /// How many shards its period has.
    pub of: u32,
}

impl Shard {
    /// The shards of a period split `shards` ways; one `None` for a period
    /// not split (`shards` ≤ 1).
    pub fn all(shards: u32) -> Vec<Option<Shard>> {
        if shards <= 1 {
            return vec![None];
        }
        (0..shards)
            .map(|index| Some(Shard { index, of: shards }))
            .collect()
    }

    /// The shard a key's suffix (`3/8`, after the `#`) names.
    fn parse(text: &str) -> Option<Shard> {
        let (index, of) = text.split_once('/')?;
        let (index, of) = (index.parse().ok()?, of.parse().ok()?);
        (index < of && (2..=MAX_SHARDS).contains(&of)).then_some(Shard { index, of })
    }
}

impl fmt::Display for Shard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}/{}", self.index, self.of)
    }
}

/// `<job>:<label>`, and `#<index>/<shards>` after it for a shard: what a
/// claim is unique on, made here and nowhere else.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(transparent)]
pub struct PeriodKey(String);

impl PeriodKey {
    /// The key of `job`'s period `label`.
    pub fn new(job: &str, label: &str) -> PeriodKey {
        PeriodKey(format!("{job}:{label}"))
    }

    /// The key of `job`'s period `label`, or of one shard of it.
    pub fn of(job: &str, label: &str, shard: Option<Shard>) -> PeriodKey {
        match shard {
            Some(shard) => PeriodKey(format!("{job}:{label}{shard}")),
            None => PeriodKey::new(job, label),
        }
    }

    /// A key as a claim row stores it.
    pub fn of_stored(key: &str) -> PeriodKey {
        PeriodKey(key.to_owned())
    }

    /// The key as stored.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The job's name and the period label, a shard's suffix left out (job
    /// names hold no `:`, labels no `#`).
    pub fn parts(&self) -> (&str, &str) {
        let (job, label) = self.0.split_once(':').unwrap_or((&self.0, ""));
        (job, label.split_once('#').map_or(label, |(label, _)| label))
    }

    /// The shard it is the key of, if it is one.
    pub fn shard(&self) -> Option<Shard> {
        self.0
            .split_once('#')
            .and_then(|(_, shard)| Shard::parse(shard))
    }

    /// The key of its whole period: itself unless it is a shard's.
    pub fn period_key(&self) -> PeriodKey {
        let (job, label) = self.parts();
        PeriodKey::new(job, label)
    }
}

impl fmt::Display for PeriodKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::borrow::Borrow<str> for PeriodKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl PartialEq<&str> for PeriodKey {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

/// A label given by hand that does not name a period of the job.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "`{label}` is not a label of the job's {unit} periods: expected {expected}, e.g. `{example}`"
)]
pub struct LabelError {
    label: String,
    unit: Unit,
    expected: &'static str,
    example: &'static str,
}

impl fmt::Display for Unit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Unit::Minute => "minute",
            Unit::Hour => "hour",
            Unit::Day => "day",
            Unit::Week => "week",
            Unit::Month => "month",
            Unit::Quarter => "quarter",
            Unit::Year => "year",
            Unit::Fire => "fire",
        })
    }
}

impl fmt::Display for Covers {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Covers::Current => "current",
            Covers::Previous => "previous",
        })
    }
}

impl Unit {
    /// The label format, in words and by example.
    pub fn format(self) -> (&'static str, &'static str) {
        match self {
            Unit::Minute => ("YYYY-MM-DDTHH:MM", "2026-07-15T14:05"),
            Unit::Hour => ("YYYY-MM-DDTHH", "2026-07-15T14"),
            Unit::Day => ("YYYY-MM-DD", "2026-07-15"),
            Unit::Week => ("an ISO week YYYY-Www", "2026-W29"),
            Unit::Month => ("YYYY-MM", "2026-07"),
            Unit::Quarter => ("YYYY-Qn", "2026-Q3"),
            Unit::Year => ("YYYY", "2026"),
            Unit::Fire => (
                "a fire time in UTC, YYYY-MM-DDTHH:MM:SSZ",
                "2026-07-15T14:05:00Z",
            ),
        }
    }

    /// The first wall-clock instant of the calendar period containing `wall`.
    ///
    /// This and `step` and `label` serve calendar units; a `fire` period is
    /// bounded by fires, and every caller branches on it first (it is grouped
    /// with `day` only to keep the matches total).
    fn floor(self, wall: NaiveDateTime) -> NaiveDateTime {
        let date = wall.date();
        match self {
            Unit::Minute => wall.with_second(0).and_then(|w| w.with_nanosecond(0)),
            Unit::Hour => date.and_hms_opt(wall.hour(), 0, 0),
            Unit::Day | Unit::Fire => date.and_hms_opt(0, 0, 0),
            Unit::Week => date
                .checked_sub_days(Days::new(u64::from(date.weekday().num_days_from_monday())))
                .map(midnight),
            Unit::Month => date.with_day(1).map(midnight),
            Unit::Quarter => {
                NaiveDate::from_ymd_opt(date.year(), (date.month0() / 3) * 3 + 1, 1).map(midnight)
            }
            Unit::Year => NaiveDate::from_ymd_opt(date.year(), 1, 1).map(midnight),
        }
        .unwrap_or(wall)
    }

    /// The calendar period `steps` away from the one starting at `start`.
    fn step(self, start: NaiveDateTime, steps: i32) -> NaiveDateTime {
        let months = |n: i32| {
            if n >= 0 {
                start.checked_add_months(Months::new(n.unsigned_abs()))
            } else {
                start.checked_sub_months(Months::new(n.unsigned_abs()))
            }
        };
        let delta = |d: chrono::TimeDelta| start.checked_add_signed(d * steps);
        match self {
            Unit::Minute => delta(chrono::TimeDelta::minutes(1)),
            Unit::Hour => delta(chrono::TimeDelta::hours(1)),
            Unit::Day | Unit::Fire => delta(chrono::TimeDelta::days(1)),
            Unit::Week => delta(chrono::TimeDelta::weeks(1)),
            Unit::Month => months(steps),
            Unit::Quarter => months(steps * 3),
            Unit::Year => months(steps * 12),
        }
        .unwrap_or(start)
    }

    fn label(self, start: NaiveDateTime) -> String {
        match self {
            Unit::Minute => start.format("%Y-%m-%dT%H:%M").to_string(),
            Unit::Hour => start.format("%Y-%m-%dT%H").to_string(),
            Unit::Day | Unit::Fire => start.format("%Y-%m-%d").to_string(),
            Unit::Week => {
                let week = start.iso_week();
                format!("{:04}-W{:02}", week.year(), week.week())
            }
            Unit::Month => start.format("%Y-%m").to_string(),
            // Years in four digits, as `%Y` writes them for the other units.
            Unit::Quarter => format!("{:04}-Q{}", start.year(), start.month0() / 3 + 1),
            Unit::Year => format!("{:04}", start.year()),
        }
    }
}

fn midnight(date: NaiveDate) -> NaiveDateTime {
    date.and_time(NaiveTime::MIN)
}

/// Formats an instant as the contract writes them: RFC 3339, UTC, seconds, `Z`.
pub fn utc_text(t: DateTime<Utc>) -> String {
    // The same text as `%Y-%m-%dT%H:%M:%SZ`, without reading a format
    // string at each call (seven times as fast: every first sighting and
    // every claim writes some).
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

impl PeriodRule {
    /// The period a fire at `fire` covers.
    pub fn period_of(&self, schedule: &Schedule, fire: DateTime<Utc>) -> Period {
        if self.unit == Unit::Fire {
            let start = match self.covers {
                Covers::Current => fire,
                // A first fire has no previous one; it covers the instant itself.
                Covers::Previous => schedule.prev_before(fire).unwrap_or(fire),
            };
            return self.fire_period(schedule, start);
        }
        let zone = schedule.zone();
        let mut start = self.unit.floor(local(zone, fire));
        if self.covers == Covers::Previous {
            start = self.unit.step(start, -1);
            // An hour a spring-forward skips is no period: the fire after
            // it (or shifted out of it) covers the hour before, which
            // would otherwise be covered by no fire at all.
            for _ in 0..4 {
                let period = self.calendar_period(schedule, start);
                if period.start < period.end {
                    break;
                }
                start = self.unit.step(start, -1);
            }
        }
        self.calendar_period(schedule, start)
    }

    /// The period named by a label given by hand (`--period`).
    pub fn parse_label(&self, schedule: &Schedule, label: &str) -> Result<Period, LabelError> {
        let (expected, example) = self.unit.format();
        let error = || LabelError {
            label: label.to_owned(),
            unit: self.unit,
            expected,
            example,
        };
        if self.unit == Unit::Fire {
            let start = NaiveDateTime::parse_from_str(label, "%Y-%m-%dT%H:%M:%SZ")
                .map_err(|_| error())?
                .and_utc();
            let period = self.fire_period(schedule, start);
            // Only a fire time of the schedule names a period.
            let is_fire = schedule.next_after(start - chrono::TimeDelta::seconds(1)) == Some(start);
            return if is_fire && period.label == label {
                Ok(period)
            } else {
                Err(LabelError {
                    expected: "a fire time of the job's schedule, in UTC (see `scheduler next`)",
                    ..error()
                })
            };
        }
        let start = parse_calendar_label(self.unit, label).ok_or_else(error)?;
        let period = self.calendar_period(schedule, start);
        // Re-formatting rejects `2026-7`, `2026-W5` and other near misses.
        if period.label == label {
            Ok(period)
        } else {
            Err(error())
        }
    }

    /// The period after `period`.
    pub fn following(&self, schedule: &Schedule, period: &Period) -> Period {
        if self.unit == Unit::Fire {
            return self.fire_period(schedule, period.end);
        }
        let start = self.unit.floor(local(schedule.zone(), period.end));
        self.calendar_period(schedule, start)
    }

    /// The periods of this rule that a fire of `schedule` covers and whose
    /// windows overlap `[start, end)`, oldest first: the periods of an
    /// upstream job that a downstream period needs, whether or not they
    /// were ever claimed. A period no fire covers (a day a weekday schedule
    /// skips, an hour a spring-forward removes) is not one.
    pub fn overlapping(
        &self,
        schedule: &Schedule,
        start: DateTime<Utc>,
        end: DateTime<Utc>,
    ) -> Vec<Period> {
        let first = if self.unit == Unit::Fire {
            let at = schedule
                .prev_before(start + chrono::TimeDelta::nanoseconds(1))
                .or_else(|| schedule.next_after(start));
            let Some(at) = at else {
                return Vec::new();
            };
            self.fire_period(schedule, at)
        } else {
            let wall = self.unit.floor(local(schedule.zone(), start));
            self.calendar_period(schedule, wall)
        };
        let mut periods = Vec::new();
        let mut period = first;
        while period.start < end {
            if period.end > start && self.fire_for(schedule, &period).is_some() {
                periods.push(period.clone());
            }
            let next = self.following(schedule, &period);
            // A walk that does not move forward ends rather than loops.
            if next.start <= period.start {
                break;
            }
            period = next;
        }
        periods
    }

    /// The period before `period` that a fire covers: what the job's own
    /// run before this one covered (a day a weekday schedule skips is
    /// passed over). `None` before the schedule's first fire.
    pub fn preceding(&self, schedule: &Schedule, period: &Period) -> Option<Period> {
        // Fires of the periods before `period` come before its start, or,
        // for fires that cover the period before them, before its end.
        let before = match self.covers {
            Covers::Current => period.start,
            Covers::Previous => period.end,
        };
        let fire = schedule.prev_before(before)?;
        let preceding = self.period_of(schedule, fire);
        (preceding.label != period.label).then_some(preceding)
    }

    /// The fire that covers `period`, if the schedule has one.
    pub fn fire_for(&self, schedule: &Schedule, period: &Period) -> Option<DateTime<Utc>> {
        let from = match (self.unit, self.covers) {
            (Unit::Fire, Covers::Current) => return Some(period.start),
            (Unit::Fire, Covers::Previous) => return Some(period.end),
            (_, Covers::Current) => period.start,
            (_, Covers::Previous) => period.end,
        };
        let fire = schedule.next_after(from - chrono::TimeDelta::seconds(1))?;
        (self.period_of(schedule, fire).label == period.label).then_some(fire)
    }

    fn fire_period(&self, schedule: &Schedule, start: DateTime<Utc>) -> Period {
        Period {
            label: utc_text(start),
            start,
            end: schedule
                .next_after(start)
                .unwrap_or(DateTime::<Utc>::MAX_UTC),
        }
    }

    fn calendar_period(&self, schedule: &Schedule, start: NaiveDateTime) -> Period {
        let zone = schedule.zone();
        Period {
            label: self.unit.label(start),
            start: earliest_instant(zone, start),
            end: earliest_instant(zone, self.unit.step(start, 1)),
        }
    }
}

fn parse_calendar_label(unit: Unit, label: &str) -> Option<NaiveDateTime> {
    let date = |s: &str| NaiveDate::parse_from_str(s, "%Y-%m-%d").ok();
    match unit {
        Unit::Minute => NaiveDateTime::parse_from_str(label, "%Y-%m-%dT%H:%M").ok(),
        Unit::Hour => {
            let (day, hour) = label.split_once('T')?;
            date(day)?.and_hms_opt(hour.parse().ok()?, 0, 0)
        }
        Unit::Day => date(label).map(midnight),
        Unit::Week => {
            let (year, week) = label.split_once("-W")?;
            NaiveDate::from_isoywd_opt(year.parse().ok()?, week.parse().ok()?, chrono::Weekday::Mon)
                .map(midnight)
        }
        Unit::Month => date(&format!("{label}-01")).map(midnight),
        Unit::Quarter => {
            let (year, quarter) = label.split_once("-Q")?;
            let quarter: u32 = quarter.parse().ok()?;
            if !(1..=4).contains(&quarter) {
                return None;
            }
            NaiveDate::from_ymd_opt(year.parse().ok()?, quarter * 3 - 2, 1).map(midnight)
        }
        Unit::Year => NaiveDate::from_ymd_opt(label.parse().ok()?, 1, 1).map(midnight),
        Unit::Fire => None,
    }
}

#[cfg(test)]
mod shard_tests {
    use super::*;

    #[test]
    fn a_shards_key_names_its_period_and_its_shard() {
        let shard = Shard { index: 3, of: 8 };
        let key = PeriodKey::of("billing", "2026-11", Some(shard));
        assert_eq!(key.as_str(), "billing:2026-11#3/8");
        assert_eq!(key.parts(), ("billing", "2026-11"));
        assert_eq!(key.shard(), Some(shard));
        assert_eq!(key.period_key().as_str(), "billing:2026-11");
        let whole = PeriodKey::of("billing", "2026-11", None);
        assert_eq!(whole, PeriodKey::new("billing", "2026-11"));
        assert_eq!(whole.shard(), None);
        assert_eq!(Shard::all(1), vec![None]);
        assert_eq!(Shard::all(3).len(), 3);
        assert_eq!(Shard::all(3)[2], Some(Shard { index: 2, of: 3 }));
    }
}
