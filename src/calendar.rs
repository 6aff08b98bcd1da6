//! Working days and the dates a job is active: which fires exist, and where
//! a fire that lands on a day off goes. Pure: dates in, dates out; a job's
//! zone turns its fires into dates ([`crate::schedule`]) and back.
//!
//! Holidays are a finite list, so a calendar with at least one working
//! weekday always has a working day within a bounded number of days of any
//! date ([`Calendar::longest_closure`]): every walk here ends.

use std::collections::BTreeSet;
use std::sync::Arc;

use chrono::{Datelike, NaiveDate, Weekday};
use serde::Deserialize;

/// A named set of working days: working weekdays less holidays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Calendar {
    /// Its name in `jobs.toml`.
    pub name: String,
    /// Working weekdays, Monday first.
    weekdays: [bool; 7],
    /// Dates that are not working days, whatever their weekday.
    holidays: BTreeSet<NaiveDate>,
    /// The most days off in a row ([`Calendar::longest_closure`]).
    longest: u32,
}

/// The most days off in a row a calendar may have: a year and a day. More
/// is a mistake (a file of every date), and every walk over moved fires
/// looks that far.
pub const LONGEST_CLOSURE: u32 = 366;

/// A calendar that cannot be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CalendarError {
    /// No working weekday.
    #[error(
        "calendar `{0}` has no working weekday: it excludes every day, so no fire of a job on it would ever run"
    )]
    NoWorkingDay(String),
    /// More than [`LONGEST_CLOSURE`] days off in a row.
    #[error(
        "calendar `{0}` has {1} days off in a row: at most {LONGEST_CLOSURE} (a year and a day); is every date of a span listed as a holiday?"
    )]
    TooLongClosed(String, u32),
}

impl Calendar {
    /// A calendar; refused without a working weekday.
    pub fn new(
        name: &str,
        weekdays: &[Weekday],
        holidays: impl IntoIterator<Item = NaiveDate>,
    ) -> Result<Calendar, CalendarError> {
        let mut working = [false; 7];
        for day in weekdays {
            working[day.num_days_from_monday() as usize] = true;
        }
        if !working.contains(&true) {
            return Err(CalendarError::NoWorkingDay(name.to_owned()));
        }
        let mut calendar = Calendar {
            name: name.to_owned(),
            weekdays: working,
            holidays: holidays.into_iter().collect(),
            longest: 0,
        };
        calendar.longest = calendar.measure_longest();
        if calendar.longest > LONGEST_CLOSURE {
            return Err(CalendarError::TooLongClosed(
                name.to_owned(),
                calendar.longest,
            ));
        }
        Ok(calendar)
    }

    /// Whether `date` is a working day.
    pub fn is_working(&self, date: NaiveDate) -> bool {
        self.weekdays[date.weekday().num_days_from_monday() as usize]
            && !self.holidays.contains(&date)
    }

    /// The first working day on or after `date`.
    pub fn next_working(&self, date: NaiveDate) -> Option<NaiveDate> {
        (0..=self.longest as u64)
            .filter_map(|n| date.checked_add_days(chrono::Days::new(n)))
            .find(|d| self.is_working(*d))
    }

    /// The last working day on or before `date`.
    pub fn previous_working(&self, date: NaiveDate) -> Option<NaiveDate> {
        (0..=self.longest as u64)
            .filter_map(|n| date.checked_sub_days(chrono::Days::new(n)))
            .find(|d| self.is_working(*d))
    }

    /// The most days off in a row anywhere: how far a fire can move.
    pub fn longest_closure(&self) -> u32 {
        self.longest
    }

    /// Working weekdays, Monday first.
    pub fn weekdays(&self) -> [bool; 7] {
        self.weekdays
    }

    /// The holidays, oldest first.
    pub fn holidays(&self) -> impl Iterator<Item = NaiveDate> + '_ {
        self.holidays.iter().copied()
    }

    fn measure_longest(&self) -> u32 {
        // Away from the holidays only the weekdays count: a week around
        // each end of the list covers every run of days off.
        let (Some(first), Some(last)) = (self.holidays.first(), self.holidays.last()) else {
            return self.run_from(NaiveDate::from_isoywd_opt(2001, 1, Weekday::Mon), 14);
        };
        let start = first.checked_sub_days(chrono::Days::new(8));
        let days = (*last - *first).num_days().unsigned_abs() + 16;
        self.run_from(start, days)
    }

    /// The longest run of days off among the `days` days from `start`.
    fn run_from(&self, start: Option<NaiveDate>, days: u64) -> u32 {
        let Some(start) = start else {
            return 7;
        };
        let (mut longest, mut run) = (0, 0);
        for n in 0..days {
            let Some(date) = start.checked_add_days(chrono::Days::new(n)) else {
                break;
            };
            run = if self.is_working(date) { 0 } else { run + 1 };
            longest = longest.max(run);
        }
        longest
    }
}

/// What a fire that lands on a day off does (`on_day_off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnDayOff {
    /// It does not exist: no period, never missing, never late.
    #[default]
    Skip,
    /// It fires on the next working day, at the same wall-clock time.
    Next,
    /// It fires on the previous working day, at the same wall-clock time.
    Previous,
}

impl std::fmt::Display for OnDayOff {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OnDayOff::Skip => "skip",
            OnDayOff::Next => "next",
            OnDayOff::Previous => "previous",
        })
    }
}

/// Which dates of a job's zone have fires at all: its active window, and
/// with `on_day_off = "skip"` its calendar's working days. A fire on any
/// other date does not exist.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Days {
    /// Working days only (a skipping calendar).
    pub working: Option<Arc<Calendar>>,
    /// The first active date.
    pub from: Option<NaiveDate>,
    /// The last active date.
    pub until: Option<NaiveDate>,
}

/// Where a walk over fire dates goes from a date.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Fires on this date exist.
    Here,
    /// None do; the nearest date in the walk's direction that may have them.
    To(NaiveDate),
    /// None do, nor on any date further in the walk's direction.
    End,
}

impl Days {
    /// Walking forward from `date`.
    pub fn forward(&self, date: NaiveDate) -> Step {
        if self.until.is_some_and(|until| date > until) {
            return Step::End;
        }
        if let Some(from) = self.from.filter(|from| date < *from) {
            return Step::To(from);
        }
        match &self.working {
            Some(c) if !c.is_working(date) => match c.next_working(date) {
                Some(next) if self.until.is_none_or(|until| next <= until) => Step::To(next),
                _ => Step::End,
            },
            _ => Step::Here,
        }
    }

    /// Walking backward from `date`.
    pub fn backward(&self, date: NaiveDate) -> Step {
        if self.from.is_some_and(|from| date < from) {
            return Step::End;
        }
        if let Some(until) = self.until.filter(|until| date > *until) {
            return Step::To(until);
        }
        match &self.working {
            Some(c) if !c.is_working(date) => match c.previous_working(date) {
                Some(previous) if self.from.is_none_or(|from| previous >= from) => {
                    Step::To(previous)
                }
                _ => Step::End,
            },
            _ => Step::Here,
        }
    }
}

/// One ISO date a line (`2027-01-01`); blank lines and `#` comments are
/// passed over. Every line that is not a date is named by its number.
pub fn parse_dates(text: &str) -> Result<Vec<NaiveDate>, Vec<(usize, String)>> {
    let mut dates = Vec::new();
    let mut bad = Vec::new();
    // A byte-order mark, CRLF or CR line ends: as a spreadsheet saves it.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let text = text.replace("\r\n", "\n").replace('\r', "\n");
    for (n, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        match iso_date(line) {
            Some(date) => dates.push(date),
            None => bad.push((n + 1, line.to_owned())),
        }
    }
    if bad.is_empty() { Ok(dates) } else { Err(bad) }
}

/// `YYYY-MM-DD` exactly: `2027-1-5` is refused, not read as 5 January.
pub fn iso_date(text: &str) -> Option<NaiveDate> {
    let date = NaiveDate::parse_from_str(text, "%Y-%m-%d").ok()?;
    (date.format("%Y-%m-%d").to_string() == text).then_some(date)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn date(s: &str) -> NaiveDate {
        NaiveDate::parse_from_str(s, "%Y-%m-%d").unwrap()
    }

    fn business(holidays: &[&str]) -> Calendar {
        use Weekday::*;
        Calendar::new(
            "business",
            &[Mon, Tue, Wed, Thu, Fri],
            holidays.iter().map(|d| date(d)),
        )
        .unwrap()
    }

    #[test]
    fn working_days_move_across_weekends_and_holidays() {
        let c = business(&["2027-01-01", "2026-12-25"]);
        assert_eq!(c.next_working(date("2027-01-01")), Some(date("2027-01-04")));
        assert_eq!(
            c.previous_working(date("2027-01-03")),
            Some(date("2026-12-31"))
        );
        assert_eq!(c.next_working(date("2027-01-05")), Some(date("2027-01-05")));
        // Fri 25th, Sat, Sun: three days off in a row.
        assert_eq!(c.longest_closure(), 3);
        assert_eq!(business(&[]).longest_closure(), 2);
    }

    #[test]
    fn a_calendar_without_a_working_weekday_or_with_years_off_is_refused() {
        let e = Calendar::new("never", &[], []).unwrap_err();
        assert!(e.to_string().contains("excludes every day"), "{e}");
        let start = date("1800-01-01");
        let every = (0..1_000).map(|n| start + chrono::Days::new(n));
        let e = Calendar::new("all", &[Weekday::Mon], every).unwrap_err();
        assert!(
            e.to_string().contains("days off in a row: at most 366"),
            "{e}"
        );
    }

    #[test]
    fn a_holiday_file_names_the_line_that_is_not_a_date() {
        assert_eq!(
            parse_dates("# holidays\n2027-01-01\n\n2027-12-25 # Christmas\n"),
            Ok(vec![date("2027-01-01"), date("2027-12-25")])
        );
        assert_eq!(
            parse_dates("\u{feff}2027-01-01\r2027-12-25\r\n"),
            Ok(vec![date("2027-01-01"), date("2027-12-25")])
        );
        assert_eq!(
            parse_dates("2027-01-01\n2027-13-01\n2027-1-5\n"),
            Err(vec![(2, "2027-13-01".into()), (3, "2027-1-5".into())])
        );
    }

    #[test]
    fn days_walk_to_the_active_window_and_over_days_off() {
        let days = Days {
            working: Some(Arc::new(business(&[]))),
            from: Some(date("2027-01-06")),
            until: Some(date("2027-01-29")),
        };
        assert_eq!(
            days.forward(date("2027-01-01")),
            Step::To(date("2027-01-06"))
        );
        assert_eq!(
            days.forward(date("2027-01-09")),
            Step::To(date("2027-01-11"))
        );
        assert_eq!(days.forward(date("2027-01-30")), Step::End);
        assert_eq!(
            days.backward(date("2027-02-03")),
            Step::To(date("2027-01-29"))
        );
        assert_eq!(
            days.backward(date("2027-01-10")),
            Step::To(date("2027-01-08"))
        );
        assert_eq!(days.backward(date("2027-01-05")), Step::End);
        assert_eq!(days.forward(date("2027-01-07")), Step::Here);
        assert_eq!(days.backward(date("2027-01-07")), Step::Here);
    }
}
