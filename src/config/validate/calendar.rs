//! A `[[calendar]]` checked: its working weekdays and holidays, written in
//! the file or read from a file of dates.

use chrono::{NaiveDate, Weekday};
use toml::Spanned;

use super::{date, kept};
use crate::calendar::{Calendar, parse_dates};
use crate::config::ConfigError;
use crate::config::locator::Locator;
use crate::config::raw::RawCalendar;
use crate::config::rules::job_name_problem;
use crate::suggest::nearest;

impl RawCalendar {
    pub(in crate::config) fn validate(self, at: &Locator) -> Result<Calendar, ConfigError> {
        let mut errors: Vec<ConfigError> = Vec::new();
        let name = self.name.get_ref();
        if let Some(problem) = job_name_problem(name) {
            errors.push(at.error(
                self.name.span(),
                problem.replace("job name", "calendar name"),
            ));
        }
        let weekdays = self.weekdays(at, &mut errors);
        let mut holidays: Vec<NaiveDate> = self
            .holidays
            .iter()
            .filter_map(|day| kept(&mut errors, date(at, day)))
            .collect();
        if let Some(file) = &self.holidays_file {
            holidays.extend(kept(&mut errors, holidays_file(at, file)).unwrap_or_default());
        }
        let calendar = Calendar::new(name, &weekdays, holidays).map_err(|e| {
            let span = self
                .working_days
                .as_ref()
                .map_or(self.name.span(), Spanned::span);
            at.error(span, e.to_string())
        });
        let calendar = kept(&mut errors, calendar);
        match calendar {
            Some(calendar) if errors.is_empty() => Ok(calendar),
            _ => Err(ConfigError::joined(errors)),
        }
    }

    /// `working_days`, Monday to Friday if not given; mistakes added to
    /// `errors`.
    fn weekdays(&self, at: &Locator, errors: &mut Vec<ConfigError>) -> Vec<Weekday> {
        match &self.working_days {
            None => vec![
                Weekday::Mon,
                Weekday::Tue,
                Weekday::Wed,
                Weekday::Thu,
                Weekday::Fri,
            ],
            Some(days) => days
                .get_ref()
                .iter()
                .filter_map(|day| {
                    kept(
                        errors,
                        day.get_ref().parse::<Weekday>().map_err(|_| {
                            const NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
                            let hint = nearest(&day.get_ref().to_lowercase(), NAMES)
                                .map(|n| format!("; did you mean `{n}`?"))
                                .unwrap_or_default();
                            at.error(
                                day.span(),
                                format!(
                                    "`{}` is not a weekday: expected `mon`, `tue`, `wed`, `thu`, `fri`, `sat` or `sun` (or the whole name){hint}",
                                    day.get_ref()
                                ),
                            )
                        }),
                    )
                })
                .collect(),
        }
    }
}

/// The dates of `holidays_file`, one ISO date a line, its path taken from
/// the directory of `jobs.toml`.
fn holidays_file(at: &Locator, file: &Spanned<String>) -> Result<Vec<NaiveDate>, ConfigError> {
    let path = at.directory().join(file.get_ref());
    std::fs::read_to_string(&path)
        .map_err(|e| {
            at.error(
                file.span(),
                format!("`holidays_file`: cannot read {}: {e}", path.display()),
            )
        })
        .and_then(|text| {
            parse_dates(&text).map_err(|bad| {
                let shown: Vec<String> = bad
                    .iter()
                    .take(5)
                    .map(|(line, text)| format!("{}:{line}: `{text}`", path.display()))
                    .collect();
                let more = match bad.len() {
                    n if n > 5 => format!(" and {} more", n - 5),
                    _ => String::new(),
                };
                at.error(
                    file.span(),
                    format!(
                        "`holidays_file`: not a date: {}{more}; expected one ISO date a line, e.g. `2027-01-01`",
                        shown.join(", ")
                    ),
                )
            })
        })
}
