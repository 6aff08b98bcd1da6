//! The raw shape of `jobs.toml` as serde reads it (spans kept), and its
//! validation into [`Config`](super::Config) values.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use chrono::{NaiveDate, Weekday};
use chrono_tz::Tz;
use serde::Deserialize;
use toml::Spanned;

use super::DatabaseUrl;
use super::environment::Inherit;
use super::{
    Action, Allow, ApiSettings, ConfigError, Fingerprint, HttpAction, Job, Locator, Missed,
    ProcessAction, Program, Retry, Secret, Settings, Token,
};
use crate::calendar::{Calendar, Days, OnDayOff, parse_dates};
use crate::fires::{FireRules, Shift};
use crate::period::{Covers, PeriodRule, Unit};
use crate::schedule::{DstRule, Gap, Repeat, Schedule};
use crate::suggest::nearest;
use crate::template::Template;

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawSettings {
    timezone: Option<Spanned<String>>,
    lease: Option<Spanned<String>>,
    catch_up: Option<Spanned<String>>,
    shutdown_grace: Option<Spanned<String>>,
    max_running: Option<Spanned<i64>>,
    scan_interval: Option<Spanned<String>>,
    database_url: Option<Spanned<String>>,
    namespace: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawJob {
    pub(super) name: Spanned<String>,
    schedule: Spanned<String>,
    timezone: Option<Spanned<String>>,
    #[serde(default)]
    period: Unit,
    #[serde(default)]
    covers: Covers,
    command: Option<Spanned<Vec<Spanned<String>>>>,
    shell: Option<Spanned<String>>,
    http: Option<Spanned<RawHttp>>,
    sql: Option<Spanned<RawSql>>,
    workdir: Option<Spanned<String>>,
    env: Option<Spanned<BTreeMap<String, Spanned<String>>>>,
    inherit: Option<Spanned<Vec<Spanned<String>>>>,
    timeout: Option<Spanned<String>>,
    concurrency: Option<Spanned<i64>>,
    #[serde(default)]
    missed: Missed,
    retry: Option<RawRetry>,
    keep: Option<Spanned<String>>,
    deadline: Option<Spanned<String>>,
    after: Option<Spanned<Vec<Spanned<String>>>>,
    on_upstream_rerun: Option<Spanned<super::after::OnRerun>>,
    #[serde(default)]
    dst: RawDst,
    calendar: Option<Spanned<String>>,
    on_day_off: Option<Spanned<OnDayOff>>,
    active_from: Option<Spanned<toml::Value>>,
    active_until: Option<Spanned<toml::Value>>,
    jitter: Option<Spanned<String>>,
}

/// `[[calendar]]`: working weekdays and holidays, shared by jobs.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawCalendar {
    name: Spanned<String>,
    working_days: Option<Spanned<Vec<Spanned<String>>>>,
    #[serde(default)]
    holidays: Vec<Spanned<toml::Value>>,
    holidays_file: Option<Spanned<String>>,
}

/// The calendars of a file by name; `None` for one with a mistake (which
/// is reported on its own).
pub(super) type Calendars = BTreeMap<String, Option<Arc<Calendar>>>;

impl RawCalendar {
    /// The name as written.
    pub(super) fn name(&self) -> &str {
        self.name.get_ref()
    }

    pub(super) fn validate(self, at: &Locator) -> Result<Calendar, ConfigError> {
        let mut errors: Vec<ConfigError> = Vec::new();
        let name = self.name.get_ref();
        if let Some(problem) = job_name_problem(name) {
            errors.push(at.error(
                self.name.span(),
                problem.replace("job name", "calendar name"),
            ));
        }
        let weekdays: Vec<Weekday> = match &self.working_days {
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
                        &mut errors,
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
        };
        let mut holidays: Vec<NaiveDate> = self
            .holidays
            .iter()
            .filter_map(|day| kept(&mut errors, date(at, day)))
            .collect();
        if let Some(file) = &self.holidays_file {
            let path = at.directory().join(file.get_ref());
            let read = std::fs::read_to_string(&path)
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
                });
            holidays.extend(kept(&mut errors, read).unwrap_or_default());
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
}

/// A local date: a string `"YYYY-MM-DD"`, or a TOML date (`2027-01-01`
/// unquoted) without a time.
fn date(at: &Locator, value: &Spanned<toml::Value>) -> Result<NaiveDate, ConfigError> {
    let date = match value.get_ref() {
        toml::Value::String(text) => crate::calendar::iso_date(text),
        toml::Value::Datetime(d) if d.time.is_none() && d.offset.is_none() => d
            .date
            .and_then(|d| NaiveDate::from_ymd_opt(i32::from(d.year), d.month.into(), d.day.into())),
        _ => None,
    };
    date.ok_or_else(|| {
        at.error(
            value.span(),
            format!(
                "`{}` is not a date: expected `YYYY-MM-DD`, e.g. `2027-01-01`",
                match value.get_ref() {
                    toml::Value::String(text) => text.clone(),
                    other => other.to_string(),
                }
            ),
        )
    })
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawHttp {
    url: Spanned<String>,
    method: Option<Spanned<String>>,
    #[serde(default)]
    headers: BTreeMap<String, Spanned<String>>,
    body: Option<Spanned<String>>,
    timeout: Option<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSql {
    statement: Spanned<String>,
    #[serde(default)]
    params: Vec<Spanned<String>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRetry {
    attempts: Option<Spanned<i64>>,
    backoff: Option<Spanned<String>>,
    max_backoff: Option<Spanned<String>>,
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawDst {
    #[serde(default)]
    gap: Gap,
    #[serde(default)]
    repeat: Repeat,
}

/// How `${NAME}` is looked up while a file is validated: strictly (an unset
/// name is an error), or leniently for commands that run no action (an
/// unset name reads as empty and is recorded for a warning).
pub(super) struct Vars<'a> {
    lookup: &'a dyn Fn(&str) -> Option<String>,
    unset: Option<RefCell<Vec<String>>>,
    /// Every variable read and its value, in the order read: the
    /// scheduler's secrets.
    read: RefCell<Vec<(String, String)>>,
    /// Every unset variable read leniently, each time it was read.
    missed: RefCell<Vec<String>>,
}

impl<'a> Vars<'a> {
    pub(super) fn new(lookup: &'a dyn Fn(&str) -> Option<String>, lenient: bool) -> Vars<'a> {
        Vars {
            lookup,
            unset: lenient.then(RefCell::default),
            read: RefCell::default(),
            missed: RefCell::default(),
        }
    }

    /// The value of `name`, noted as read.
    fn read(&self, name: &str) -> Option<String> {
        let value = (self.lookup)(name)?;
        self.read
            .borrow_mut()
            .push((name.to_owned(), value.clone()));
        Some(value)
    }

    /// How many reads so far: a mark for [`Vars::names_since`] and
    /// [`Vars::missed_since`].
    pub(super) fn mark(&self) -> (usize, usize) {
        (self.read.borrow().len(), self.missed.borrow().len())
    }

    /// The names read since `mark`, each once.
    pub(super) fn names_since(&self, mark: (usize, usize)) -> Vec<String> {
        let mut names: Vec<String> = self.read.borrow()[mark.0..]
            .iter()
            .map(|(name, _)| name.clone())
            .collect();
        names.sort();
        names.dedup();
        names
    }

    /// The unset names read leniently since `mark`, each once.
    pub(super) fn missed_since(&self, mark: (usize, usize)) -> Vec<String> {
        let mut names: Vec<String> = self.missed.borrow()[mark.1..].to_vec();
        names.sort();
        names.dedup();
        names
    }

    /// Every variable read and its value.
    pub(super) fn read_all(&self) -> Vec<(String, String)> {
        self.read.borrow().clone()
    }

    /// Notes `value` as a secret read from the file itself (a token
    /// written in it).
    pub(super) fn note_secret(&self, value: &str) {
        self.read
            .borrow_mut()
            .push((String::new(), value.to_owned()));
    }

    /// The value of `name`; in lenient mode, empty (and recorded) if unset.
    pub(super) fn get(&self, name: &str) -> Option<String> {
        match (self.read(name), &self.unset) {
            (Some(value), _) => Some(value),
            (None, Some(unset)) => {
                self.missed.borrow_mut().push(name.to_owned());
                let mut unset = unset.borrow_mut();
                if !unset.iter().any(|n| n == name) {
                    unset.push(name.to_owned());
                }
                Some(String::new())
            }
            (None, None) => None,
        }
    }

    /// The value of `name`, unset being an error in either mode.
    fn strict(&self, name: &str) -> Option<String> {
        self.read(name)
    }

    fn is_lenient(&self) -> bool {
        self.unset.is_some()
    }

    fn unset_count(&self) -> usize {
        self.unset.as_ref().map_or(0, |u| u.borrow().len())
    }

    /// The unset names met, in the order first met.
    pub(super) fn unset(&self) -> Vec<String> {
        self.unset
            .as_ref()
            .map(|u| u.borrow().clone())
            .unwrap_or_default()
    }
}

type Env<'a> = &'a Vars<'a>;

/// The longest duration accepted: far beyond any sensible window, and far
/// inside what instants can be shifted by.
const LONGEST: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

fn duration(
    at: &Locator,
    value: Option<&Spanned<String>>,
    default: &str,
) -> Result<Duration, ConfigError> {
    let Some(value) = value else {
        return Ok(humantime::parse_duration(default).unwrap_or_default());
    };
    match humantime::parse_duration(value.get_ref()) {
        Ok(d) => match duration_problem(d, value.get_ref()) {
            Some(problem) => Err(at.error(value.span(), problem)),
            None => Ok(d),
        },
        Err(e) => Err(at.error(
            value.span(),
            format!(
                "`{}` is not a duration ({e}): expected a number and a unit, e.g. `90s`, `5m`, `24h`, `7d`",
                value.get_ref()
            ),
        )),
    }
}

/// What is wrong with a duration (written `written`), if anything: the
/// rule of every duration, in jobs.toml and in code.
pub(super) fn duration_problem(d: Duration, written: &str) -> Option<String> {
    if d > LONGEST || chrono::TimeDelta::from_std(d).is_err() {
        return Some(format!(
            "`{written}` is too long: expected at most 100 years"
        ));
    }
    d.is_zero()
        .then(|| "a duration must be longer than zero".to_owned())
}

/// What is wrong with `key = written` (`d`) of at least `floor`, if
/// anything.
pub(super) fn floor_problem(
    key: &str,
    written: &str,
    d: Duration,
    floor: Duration,
) -> Option<String> {
    (d < floor).then(|| {
        format!(
            "{key} = `{written}` is too short: expected at least {}",
            short(floor)
        )
    })
}

/// The shortest lease: heartbeats come every lease/3 and a runner stops
/// its job a heartbeat before its lease runs out; below a second that
/// leaves no time for a database round trip.
pub(super) const SHORTEST_LEASE: Duration = Duration::from_secs(1);

/// The shortest scan interval.
pub(super) const SHORTEST_SCAN: Duration = Duration::from_millis(100);

/// What is wrong with a job name, if anything.
pub(super) fn job_name_problem(name: &str) -> Option<String> {
    (!valid_name(name)).then(|| {
        format!(
            "`{name}` is not a valid job name: expected 1 to 63 of a-z, 0-9, `_` and `-`, starting with a letter or digit"
        )
    })
}

/// What is wrong with a namespace, if anything.
pub(super) fn namespace_problem(namespace: &str) -> Option<String> {
    (!valid_name(namespace)).then(|| {
        format!(
            "`{namespace}` is not a valid namespace: expected 1 to 63 of a-z, 0-9, `_` and `-`, starting with a letter or digit (e.g. \"staging\")"
        )
    })
}

/// A schedule, or what is wrong with it.
pub(super) fn schedule(text: &str, zone: Tz, dst: DstRule) -> Result<Schedule, String> {
    Schedule::parse(text, zone, dst).map_err(|e| {
        format!("{e}: expected 5 fields (minute hour day-of-month month day-of-week), 6 with seconds first, or @hourly/@daily/@weekly/@monthly/@yearly")
    })
}

/// What is wrong with `keep` (written `written`) under a catch-up window
/// of `catch_up`, if anything: a period pruned inside the window would be
/// claimed, and run, again.
pub(super) fn keep_problem(written: &str, keep: Duration, catch_up: Duration) -> Option<String> {
    (keep < catch_up).then(|| {
        format!(
            "keep = `{written}` is shorter than catch_up ({}): a period pruned inside the catch-up window would run again; expected at least `{}`",
            short(catch_up),
            short(catch_up)
        )
    })
}

/// What is wrong with a count that must be at least 1 (`concurrency`,
/// `max_running`, `retry.attempts`), if anything.
pub(super) fn count_problem(n: i64) -> Option<String> {
    (u32::try_from(n).map_or(true, |n| n < 1))
        .then(|| format!("`{n}` is out of range: expected a whole number from 1"))
}

/// A duration of at least `floor` (`floor_text` in messages).
fn at_least(
    at: &Locator,
    (key, value): (&str, Option<&Spanned<String>>),
    default: &str,
    floor: Duration,
) -> Result<Duration, ConfigError> {
    // Under the floor, zero included, the message names the key and the
    // floor.
    if let Some(value) = value
        && let Ok(d) = humantime::parse_duration(value.get_ref())
        && let Some(problem) = floor_problem(key, value.get_ref(), d, floor)
    {
        return Err(at.error(value.span(), problem));
    }
    duration(at, value, default)
}

/// A duration as a person writes it: `24h`, `90s`, `100ms`.
/// 1 to 63 of a-z, 0-9, `_` and `-`, starting with a letter or digit: a
/// job name, and a namespace.
fn valid_name(name: &str) -> bool {
    name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit())
        && name
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '-')
}

/// Why `deadline` cannot be, against `catch_up`.
pub(crate) fn deadline_problem(deadline: Duration, catch_up: Duration) -> Option<String> {
    (deadline >= catch_up).then(|| {
        format!(
            "`deadline` ({}) must be shorter than `catch_up` ({}): late periods are looked for within the catch-up window, and one older than it is not run any more; raise `catch_up` in [scheduler]",
            short(deadline),
            short(catch_up)
        )
    })
}

pub(crate) fn short(d: Duration) -> String {
    let secs = d.as_secs();
    match (secs, d.subsec_nanos()) {
        (0, _) => humantime::format_duration(d).to_string(),
        (s, 0) if s % 86_400 == 0 => format!("{}d", s / 86_400),
        (s, 0) if s % 3_600 == 0 => format!("{}h", s / 3_600),
        (s, 0) if s % 60 == 0 => format!("{}m", s / 60),
        (s, 0) => format!("{s}s"),
        _ => humantime::format_duration(d).to_string(),
    }
}

fn positive(at: &Locator, value: Option<&Spanned<i64>>, default: u32) -> Result<u32, ConfigError> {
    match value {
        None => Ok(default),
        Some(v) => match count_problem(*v.get_ref()) {
            Some(problem) => Err(at.error(v.span(), problem)),
            None => Ok(u32::try_from(*v.get_ref()).unwrap_or(default)),
        },
    }
}

fn zone(at: &Locator, value: &Spanned<String>) -> Result<Tz, ConfigError> {
    value.get_ref().parse::<Tz>().map_err(|_| {
        let names = chrono_tz::TZ_VARIANTS.iter().map(|tz| tz.name());
        let hint = nearest(value.get_ref(), names)
            .map(|n| format!("; did you mean `{n}`?"))
            .unwrap_or_default();
        at.error(
            value.span(),
            format!(
                "`{}` is not a time zone: expected an IANA name such as `UTC` or `Europe/Berlin`{hint}",
                value.get_ref()
            ),
        )
    })
}

fn template(at: &Locator, value: &Spanned<String>, env: Env) -> Result<Template, ConfigError> {
    no_nul(at, value)?;
    Template::load(value.get_ref(), &|name| env.get(name))
        .map_err(|e| at.template_error(value.span(), e))
}

/// A NUL byte cannot reach a program, its environment or a path.
fn no_nul(at: &Locator, value: &Spanned<String>) -> Result<(), ConfigError> {
    match value.get_ref().find('\0') {
        Some(i) => Err(at.error(
            value.span().start + 1 + i..value.span().end,
            "a NUL byte (\\u0000) cannot be passed to a program, its environment or a path".into(),
        )),
        None => Ok(()),
    }
}

fn templates<'a>(
    at: &Locator,
    values: impl IntoIterator<Item = (&'a String, &'a Spanned<String>)>,
    env: Env,
) -> Result<Vec<(String, Template)>, ConfigError> {
    values
        .into_iter()
        .map(|(k, v)| Ok((k.clone(), template(at, v, env)?)))
        .collect()
}

/// The settings of an empty `[scheduler]` table.
pub(super) fn default_settings() -> Settings {
    let at = Locator {
        path: std::path::Path::new(""),
        text: "",
    };
    let none = |_: &str| None;
    let vars = Vars::new(&none, false);
    RawSettings::default()
        .validate(&at, &vars)
        .unwrap_or_else(|e| unreachable!("the defaults are valid: {e}"))
}

impl RawSettings {
    pub(super) fn validate(self, at: &Locator, env: Env) -> Result<Settings, ConfigError> {
        let (database_url, database_url_error) = self.database_url(at, env)?;
        let namespace = match &self.namespace {
            Some(ns) if ns.get_ref().is_empty() => None,
            Some(ns) if let Some(problem) = namespace_problem(ns.get_ref()) => {
                return Err(at.error(ns.span(), problem));
            }
            Some(ns) => Some(ns.get_ref().clone()),
            None => None,
        };
        // Every mistake of the section at once.
        let mut errors = Vec::new();
        let timezone = kept(
            &mut errors,
            self.timezone.as_ref().map_or(Ok(Tz::UTC), |z| zone(at, z)),
        );
        // Heartbeats come every lease/3 and a runner stops its job a
        // heartbeat before its lease runs out: below a second that leaves
        // no time for a database round trip.
        let lease = kept(
            &mut errors,
            at_least(at, ("lease", self.lease.as_ref()), "60s", SHORTEST_LEASE),
        );
        let catch_up = kept(&mut errors, duration(at, self.catch_up.as_ref(), "24h"));
        let grace = kept(
            &mut errors,
            duration(at, self.shutdown_grace.as_ref(), "30s"),
        );
        let max_running = kept(&mut errors, positive(at, self.max_running.as_ref(), 16));
        let scan_interval = kept(
            &mut errors,
            at_least(
                at,
                ("scan_interval", self.scan_interval.as_ref()),
                "5s",
                SHORTEST_SCAN,
            ),
        );
        let (
            Some(timezone),
            Some(lease),
            Some(catch_up),
            Some(shutdown_grace),
            Some(max_running),
            Some(scan_interval),
        ) = (timezone, lease, catch_up, grace, max_running, scan_interval)
        else {
            return Err(ConfigError::joined(errors));
        };
        Ok(Settings {
            namespace,
            timezone,
            lease,
            catch_up,
            shutdown_grace,
            max_running: max_running as usize,
            scan_interval,
            database_url,
            database_url_error,
        })
    }

    /// `database_url`, its `${VAR}`s expanded; read leniently (`check`),
    /// the error of a URL whose variable is unset, kept for the command
    /// that opens the database.
    fn database_url(
        &self,
        at: &Locator,
        env: Env,
    ) -> Result<(Option<DatabaseUrl>, Option<ConfigError>), ConfigError> {
        let mut database_url_error = None;
        let database_url = match &self.database_url {
            Some(url) => {
                let expanded = crate::template::expand_env(url.get_ref(), &|name| env.strict(name))
                    .map_err(|e| at.template_error(url.span(), e));
                match expanded {
                    Ok(expanded) => Some(
                        DatabaseUrl::parse(&expanded, &at.directory())
                            .map_err(|e| at.error(url.span(), format!("`database_url`: {e}")))?,
                    ),
                    // Read leniently (`check`), an unset variable in the URL
                    // is a warning; a command that opens the database says
                    // it is missing. The URL is never guessed without it.
                    Err(e) if env.is_lenient() => {
                        let before = env.unset_count();
                        let _ = crate::template::expand_env(url.get_ref(), &|name| env.get(name));
                        if env.unset_count() == before {
                            return Err(e);
                        }
                        database_url_error = Some(e);
                        None
                    }
                    Err(e) => return Err(e),
                }
            }
            None => None,
        };
        Ok((database_url, database_url_error))
    }
}

impl RawJob {
    pub(super) fn validate(
        self,
        at: &Locator,
        settings: &Settings,
        env: Env,
        calendars: &Calendars,
    ) -> Result<Job, ConfigError> {
        // Every mistake of the job is reported at once, not one per `check`.
        let mut errors: Vec<ConfigError> = Vec::new();
        let name = self.name.get_ref();
        if let Some(problem) = job_name_problem(name) {
            kept(
                &mut errors,
                Err::<(), _>(at.error(self.name.span(), problem)),
            );
        }
        let zone = match &self.timezone {
            Some(z) => kept(&mut errors, zone(at, z)),
            None => Some(settings.timezone),
        };
        let dst = DstRule {
            gap: self.dst.gap,
            repeat: self.dst.repeat,
        };
        // Checked in UTC where the zone is wrong, so that both are said.
        let schedule = kept(
            &mut errors,
            schedule(self.schedule.get_ref(), zone.unwrap_or(Tz::UTC), dst)
                .map_err(|problem| at.error(self.schedule.span(), problem)),
        )
        .filter(|_| zone.is_some());
        let (days, fires_rules) = self.days_and_fires(at, calendars, &mut errors);
        let schedule = schedule.map(|s| s.with_days(days));
        if let Some(schedule) = &schedule
            && schedule.days().is_some()
            && schedule.next_after(chrono::DateTime::UNIX_EPOCH).is_none()
        {
            let span = self
                .calendar
                .as_ref()
                .map_or(self.schedule.span(), Spanned::span);
            errors.push(at.error(
                span,
                format!(
                    "job `{name}` would never fire: `{}` falls only on days its calendar skips or outside its active dates",
                    schedule.source()
                ),
            ));
        }
        if let (Some(schedule), Some(shift)) = (&schedule, &fires_rules.shift)
            && let Some(problem) = too_frequent_to_move(schedule)
        {
            errors.push(
                at.error(
                    self.on_day_off
                        .as_ref()
                        .map_or(self.schedule.span(), Spanned::span),
                    format!("`on_day_off = \"{}\"`: {problem}", shift.to),
                ),
            );
        }
        let action = kept(&mut errors, self.action(at, env));
        let retry = self.retry(at, &mut errors);
        let timeout = kept(
            &mut errors,
            self.timeout
                .as_ref()
                .map(|t| duration(at, Some(t), ""))
                .transpose(),
        );
        let concurrency = kept(&mut errors, positive(at, self.concurrency.as_ref(), 1));
        let keep = kept(&mut errors, self.keep(at, settings));
        let deadline = kept(&mut errors, self.deadline(at, settings));
        let after = kept(&mut errors, self.after(at));
        let (
            Some(schedule),
            Some(action),
            Some(retry),
            Some(timeout),
            Some(concurrency),
            Some(keep),
            Some(deadline),
        ) = (
            schedule,
            action,
            retry,
            timeout,
            concurrency,
            keep,
            deadline,
        )
        else {
            return Err(ConfigError::joined(errors));
        };
        if !errors.is_empty() {
            return Err(ConfigError::joined(errors));
        }
        Ok(Job {
            name: name.clone(),
            schedule,
            period: PeriodRule {
                unit: self.period,
                covers: self.covers,
            },
            fires: fires_rules,
            action,
            timeout,
            concurrency,
            missed: self.missed,
            retry,
            keep,
            deadline,
            after: after.unwrap_or_default(),
            catch_up: settings.catch_up,
            definition: Fingerprint::default(),
            secrets: Default::default(),
        })
    }

    /// Which fires exist (`active_from`, `active_until`, a calendar with
    /// `on_day_off = "skip"`) and how they move and are delayed (a calendar
    /// with `next` or `previous`, `jitter`); mistakes added to `errors`.
    fn days_and_fires(
        &self,
        at: &Locator,
        calendars: &Calendars,
        errors: &mut Vec<ConfigError>,
    ) -> (Days, FireRules) {
        let mut days = Days {
            from: self
                .active_from
                .as_ref()
                .and_then(|d| kept(errors, date(at, d))),
            until: self
                .active_until
                .as_ref()
                .and_then(|d| kept(errors, date(at, d))),
            ..Days::default()
        };
        if let (Some(from), Some(until), Some(written)) =
            (days.from, days.until, &self.active_until)
            && until < from
        {
            errors.push(at.error(
                written.span(),
                format!("`active_until` {until} comes before `active_from` {from}: the job would never fire"),
            ));
        }
        let on_day_off = self.on_day_off.as_ref().map(|o| *o.get_ref());
        let calendar = match &self.calendar {
            Some(name) => match calendars.get(name.get_ref()) {
                Some(calendar) => calendar.clone(),
                None => {
                    let hint = nearest(name.get_ref(), calendars.keys().map(String::as_str))
                        .map(|n| format!("; did you mean `{n}`?"))
                        .unwrap_or_default();
                    let known = if calendars.is_empty() {
                        "the file has no `[[calendar]]`".to_owned()
                    } else {
                        let names: Vec<String> =
                            calendars.keys().map(|n| format!("`{n}`")).collect();
                        format!("calendars: {}", names.join(", "))
                    };
                    errors.push(at.error(
                        name.span(),
                        format!("unknown calendar `{}` ({known}){hint}", name.get_ref()),
                    ));
                    None
                }
            },
            None => {
                if let Some(written) = &self.on_day_off {
                    errors.push(at.error(
                        written.span(),
                        "`on_day_off` without `calendar`: no day is a day off for this job; name a `[[calendar]]`".into(),
                    ));
                }
                None
            }
        };
        let mut rules = FireRules::default();
        match (calendar, on_day_off.unwrap_or_default()) {
            (Some(calendar), OnDayOff::Skip) => days.working = Some(calendar),
            (Some(calendar), to) => rules.shift = Some(Shift { calendar, to }),
            (None, _) => {}
        }
        if let Some(written) = &self.jitter {
            match duration(at, Some(written), "") {
                Ok(jitter) if jitter < Duration::from_secs(1) => errors.push(at.error(
                    written.span(),
                    "`jitter` must be at least `1s`: fires are delayed by whole seconds".into(),
                )),
                Ok(jitter) => rules.jitter = Some(jitter),
                Err(e) => errors.push(e),
            }
        }
        (days, rules)
    }

    /// `after` as written, each name with its place; linked to the jobs it
    /// names once all are read. `on_upstream_rerun` without it says
    /// nothing, and is refused as the mistake it is.
    fn after(&self, at: &Locator) -> Result<super::after::After, ConfigError> {
        let named = self.after.as_ref().map_or(&[][..], |a| a.get_ref());
        if let Some(on_rerun) = &self.on_upstream_rerun
            && named.is_empty()
        {
            return Err(at.error(
                on_rerun.span(),
                "`on_upstream_rerun` without `after`: the job waits for no other job's periods, so no rerun upstream concerns it".into(),
            ));
        }
        Ok(super::after::After {
            named: named
                .iter()
                .map(|name| super::after::Named {
                    name: name.get_ref().clone(),
                    place: at.error(name.span(), String::new()).place,
                })
                .collect(),
            on_rerun: self
                .on_upstream_rerun
                .as_ref()
                .map(|r| *r.get_ref())
                .unwrap_or_default(),
            ..Default::default()
        })
    }

    /// `deadline`, which must be shorter than the catch-up window: a period
    /// older than the window is not run any more, nor looked at, so it
    /// could never be told late.
    fn deadline(&self, at: &Locator, settings: &Settings) -> Result<Option<Duration>, ConfigError> {
        let Some(written) = &self.deadline else {
            return Ok(None);
        };
        let deadline = duration(at, Some(written), "")?;
        match deadline_problem(deadline, settings.catch_up) {
            Some(problem) => Err(at.error(written.span(), problem)),
            None => Ok(Some(deadline)),
        }
    }

    /// `retry`, its mistakes added to `errors`.
    fn retry(&self, at: &Locator, errors: &mut Vec<ConfigError>) -> Option<Retry> {
        let Some(r) = &self.retry else {
            return Some(Retry::default());
        };
        let attempts = kept(errors, positive(at, r.attempts.as_ref(), 1));
        let backoff = kept(errors, duration(at, r.backoff.as_ref(), "1m"));
        let max_backoff = kept(errors, duration(at, r.max_backoff.as_ref(), "1h"));
        Some(Retry {
            attempts: attempts?,
            backoff: backoff?,
            max_backoff: max_backoff?,
        })
    }

    /// `keep`, which may not be shorter than the catch-up window: a period
    /// pruned inside it would be claimed, and run, again.
    fn keep(&self, at: &Locator, settings: &Settings) -> Result<Option<Duration>, ConfigError> {
        let Some(keep) = &self.keep else {
            return Ok(None);
        };
        let parsed = duration(at, Some(keep), "")?;
        match keep_problem(keep.get_ref(), parsed, settings.catch_up) {
            Some(problem) => Err(at.error(keep.span(), problem)),
            None => Ok(Some(parsed)),
        }
    }

    fn action(&self, at: &Locator, env: Env) -> Result<Action, ConfigError> {
        let given: Vec<(&str, Range<usize>)> = [
            self.command.as_ref().map(|c| ("command", c.span())),
            self.shell.as_ref().map(|c| ("shell", c.span())),
            self.http.as_ref().map(|c| ("http", c.span())),
            self.sql.as_ref().map(|c| ("sql", c.span())),
        ]
        .into_iter()
        .flatten()
        .collect();
        let name_span = self.name.span();
        match given.as_slice() {
            [] => {
                return Err(at.error(
                    name_span,
                    format!(
                        "job `{}` has no action: expected exactly one of `command`, `shell`, `http` or `sql`",
                        self.name.get_ref()
                    ),
                ));
            }
            [_] => {}
            [_, (second, span), ..] => {
                return Err(at.error(
                    span.clone(),
                    format!(
                        "job `{}` has `{}` and `{second}`: expected exactly one action",
                        self.name.get_ref(),
                        given[0].0
                    ),
                ));
            }
        }
        let process_only = [
            ("workdir", self.workdir.as_ref().map(Spanned::span)),
            ("env", self.env.as_ref().map(Spanned::span)),
            ("inherit", self.inherit.as_ref().map(Spanned::span)),
        ];
        if (self.http.is_some() || self.sql.is_some())
            && let Some((key, Some(span))) = process_only.into_iter().find(|(_, s)| s.is_some())
        {
            return Err(at.error(
                span,
                format!("`{key}` applies only to `command` and `shell` actions"),
            ));
        }
        if let Some(command) = &self.command {
            self.check_process_env(at)?;
            return self.command(at, env, command);
        }
        if let Some(shell) = &self.shell {
            self.check_process_env(at)?;
            return self.shell(at, env, shell);
        }
        if let Some(http) = &self.http {
            return http_action(at, env, http.get_ref());
        }
        let Some(sql) = self.sql.as_ref().map(Spanned::get_ref) else {
            return Err(at.error(name_span, "no action".into()));
        };
        sql_action(at, env, sql)
    }

    /// What is wrong with the names of `env` and `inherit`: every bad
    /// entry of `inherit` at once, each with its place.
    fn check_process_env(&self, at: &Locator) -> Result<(), ConfigError> {
        if let Some(vars) = &self.env
            && let Some(bad) = vars
                .get_ref()
                .keys()
                .find(|k| k.is_empty() || k.contains(['=', '\0']))
        {
            return Err(at.error(
                vars.span(),
                format!(
                    "`{}` is not an environment variable name: expected a non-empty name without `=` or NUL",
                    bad.escape_default()
                ),
            ));
        }
        let mut listed: Vec<&str> = Vec::new();
        let bad: Vec<ConfigError> = self
            .inherit
            .iter()
            .flat_map(|i| i.get_ref())
            .filter_map(|name| {
                let text = name.get_ref().as_str();
                let valid = text.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
                    && text.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
                let problem = if !valid {
                    format!(
                        "`{}` is not an environment variable name: expected letters, digits and `_`, not starting with a digit, e.g. inherit = [\"PATH\", \"HOME\"]",
                        text.escape_default()
                    )
                } else if listed.contains(&text) {
                    format!("`{text}` is listed twice in `inherit`: list each variable once")
                } else {
                    listed.push(text);
                    return None;
                };
                Some(at.error(name.span(), problem))
            })
            .collect();
        if !bad.is_empty() {
            return Err(ConfigError::joined(bad));
        }
        Ok(())
    }

    /// A `command` or `shell` action running `program`, with the job's
    /// `workdir`, `env` and `inherit`.
    fn process(&self, at: &Locator, env: Env, program: Program) -> Result<Action, ConfigError> {
        Ok(Action::Process(Box::new(ProcessAction {
            program,
            workdir: self
                .workdir
                .as_ref()
                .map(|w| template(at, w, env))
                .transpose()?,
            env: match &self.env {
                Some(vars) => templates(at, vars.get_ref(), env)?,
                None => Vec::new(),
            },
            inherit: Inherit {
                only: self.inherit.as_ref().map(|names| {
                    names
                        .get_ref()
                        .iter()
                        .map(|n| n.get_ref().clone())
                        .collect()
                }),
                ..Inherit::default()
            },
        })))
    }

    /// The `command` action.
    fn command(
        &self,
        at: &Locator,
        env: Env,
        command: &Spanned<Vec<Spanned<String>>>,
    ) -> Result<Action, ConfigError> {
        if command.get_ref().is_empty() {
            return Err(at.error(
                command.span(),
                "`command` is empty: expected the program and its arguments, e.g. [\"./bin/bill\", \"{period}\"]".into(),
            ));
        }
        let program = &command.get_ref()[0];
        let unset_before = env.unset_count();
        let argv: Vec<Template> = command
            .get_ref()
            .iter()
            .map(|a| template(at, a, env))
            .collect::<Result<_, _>>()?;
        // Empty as written, or after expansion unless a lenient load
        // left a variable empty.
        let empty = program.get_ref().trim().is_empty()
            || (argv[0].render(&NoValues).trim().is_empty() && env.unset_count() == unset_before);
        if empty {
            return Err(at.error(
                program.span(),
                "the program name is empty: expected the program to run first, e.g. [\"./bin/bill\", \"{period}\"]".into(),
            ));
        }
        self.process(at, env, Program::Command(argv))
    }

    /// The `shell` action: `${NAME}` stays in the script for /bin/sh.
    fn shell(
        &self,
        at: &Locator,
        env: Env,
        shell: &Spanned<String>,
    ) -> Result<Action, ConfigError> {
        let env_names: Vec<&str> = self
            .env
            .as_ref()
            .map(|vars| vars.get_ref().keys().map(String::as_str).collect())
            .unwrap_or_default();
        no_nul(at, shell)?;
        // `${NAME}` stays in the script for /bin/sh; it must be set in the
        // scheduler's environment, the job's `env` or `SCHEDULER_*`.
        let known = |name: &str| {
            if env_names.contains(&name) || SCHEDULER_VARIABLES.contains(&name) {
                Some(String::new())
            } else {
                env.get(name)
            }
        };
        let script = Template::load_shell(shell.get_ref(), &known)
            .map_err(|e| at.template_error(shell.span(), e))?;
        if script.render(&NoValues).trim().is_empty() {
            return Err(at.error(
                shell.span(),
                "`shell` is empty: expected a command line for /bin/sh".into(),
            ));
        }
        self.process(at, env, Program::Shell(script))
    }
}

/// The `http` action.
fn http_action(at: &Locator, env: Env, http: &RawHttp) -> Result<Action, ConfigError> {
    let method = match &http.method {
        None => "POST".to_owned(),
        Some(m) => {
            let upper = m.get_ref().to_ascii_uppercase();
            const METHODS: [&str; 7] = ["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"];
            if !METHODS.contains(&upper.as_str()) {
                return Err(at.error(
                    m.span(),
                    format!(
                        "`{}` is not an HTTP method: expected one of {}",
                        m.get_ref().escape_default(),
                        METHODS.join(", ")
                    ),
                ));
            }
            upper
        }
    };
    let unset_before = env.unset_count();
    let url = template(at, &http.url, env)?;
    // Checked after `${NAME}` expansion, unless a lenient load left a
    // variable empty.
    let prefix = url.prefix().to_ascii_lowercase();
    let scheme_ok = ["http://", "https://"]
        .iter()
        .any(|s| prefix.starts_with(s));
    if !scheme_ok && env.unset_count() == unset_before {
        return Err(at.error(
                http.url.span(),
                "`url` must start with http:// or https:// (after `${NAME}` expansion); other schemes are not sent".into(),
            ));
    }
    // Placeholders filled with a sample; the error names no value
    // (one may be a secret).
    if env.unset_count() == unset_before
        && let Err(e) = url::Url::parse(&url.render(&SampleValues))
    {
        return Err(at.error(
                http.url.span(),
                format!("`url` is not a valid URL after `${{NAME}}` expansion ({e}): expected http(s)://HOST[:PORT]/PATH"),
            ));
    }
    for (name, value) in &http.headers {
        if reqwest::header::HeaderName::from_bytes(name.as_bytes()).is_err() {
            return Err(at.error(
                    value.span(),
                    format!(
                        "`{}` is not a valid header name: expected letters, digits and `-` (no spaces or `:`)",
                        name.escape_default()
                    ),
                ));
        }
    }
    let headers = templates(at, &http.headers, env)?;
    for ((name, template), (_, value)) in headers.iter().zip(&http.headers) {
        let valid = template
            .literals()
            .all(|text| reqwest::header::HeaderValue::from_str(text).is_ok());
        if !valid {
            return Err(at.error(
                    value.span(),
                    format!(
                        "the value of header `{name}` has a character a header cannot carry (a control character such as a newline)"
                    ),
                ));
        }
    }
    Ok(Action::Http(Box::new(HttpAction {
        url,
        method,
        headers,
        body: http
            .body
            .as_ref()
            .map(|b| template(at, b, env))
            .transpose()?,
        timeout: duration(at, http.timeout.as_ref(), "30s")?,
    })))
}

/// The `sql` action.
fn sql_action(at: &Locator, env: Env, sql: &RawSql) -> Result<Action, ConfigError> {
    if sql.statement.get_ref().contains('\0') {
        no_nul(at, &sql.statement)?;
    }
    if let Some(name) = variable_in(sql.statement.get_ref()) {
        return Err(at.error(
            sql.statement.span(),
            format!(
                "`${{{name}}}` in an SQL statement is not expanded: a value is never spliced into SQL text; pass it as a param, e.g. statement = \"... $1\", params = [\"${{{name}}}\"]"
            ),
        ));
    }
    if let Some(word) = ends_the_transaction(sql.statement.get_ref(), Dialect::POSTGRES) {
        return Err(at.error(
            sql.statement.span(),
            format!(
                "the SQL statement runs `{word}`: a statement runs inside the transaction that records its outcome, and must not end or split it; expected a statement such as \"INSERT INTO t VALUES ($1)\""
            ),
        ));
    }
    if [Dialect::POSTGRES, Dialect::SQLITE]
        .into_iter()
        .any(|dialect| is_empty_in_effect(sql.statement.get_ref(), dialect))
    {
        return Err(at.error(
            sql.statement.span(),
            "the SQL statement is empty (nothing but blanks, comments and `;`): expected a statement, e.g. \"INSERT INTO t VALUES ($1)\"".into(),
        ));
    }
    Ok(Action::Sql {
        statement: sql.statement.get_ref().clone(),
        params: sql
            .params
            .iter()
            .map(|p| template(at, p, env))
            .collect::<Result<_, _>>()?,
    })
}

/// The name of the first `${NAME}` in `text`, if any.
fn variable_in(text: &str) -> Option<&str> {
    text.match_indices("${").find_map(|(at, _)| {
        let rest = &text[at + 2..];
        let name = &rest[..rest.find('}')?];
        let valid = name.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        valid.then_some(name)
    })
}

/// The value of `result`, or `None` with its error added to `errors`.
/// Why fires of `schedule` cannot be moved to working days: moving is for
/// schedules of at most 24 fires a day (every walk over moved fires looks
/// at every fire within the calendar's longest closure).
fn too_frequent_to_move(schedule: &Schedule) -> Option<String> {
    // A week of the pattern, read in UTC: how often it fires, not where.
    let start = chrono::DateTime::UNIX_EPOCH + chrono::TimeDelta::days(365 * 57);
    let week = start + chrono::TimeDelta::days(7);
    let fires = schedule.fires_between(start, week).take(24 * 7 + 1).count();
    (fires > 24 * 7).then(|| {
        format!(
            "`{}` fires more than 24 times a day; a fire is moved to a working day only for schedules of at most hourly fires (use `on_day_off = \"skip\"`)",
            schedule.source()
        )
    })
}

fn kept<T>(errors: &mut Vec<ConfigError>, result: Result<T, ConfigError>) -> Option<T> {
    result.map_err(|e| errors.push(e)).ok()
}

/// The variables every job process gets from the scheduler.
const SCHEDULER_VARIABLES: [&str; 8] = [
    "SCHEDULER_JOB",
    "SCHEDULER_PERIOD",
    "SCHEDULER_PERIOD_KEY",
    "SCHEDULER_PERIOD_START",
    "SCHEDULER_PERIOD_END",
    "SCHEDULER_SCHEDULED_AT",
    "SCHEDULER_ATTEMPT",
    "SCHEDULER_TRIGGER",
];

/// Renders every placeholder as a value any of them could have in a URL.
struct SampleValues;

impl crate::template::Values for SampleValues {
    fn value(&self, _: &str) -> String {
        "2026-07".to_owned()
    }
}

/// Renders placeholders as nothing, to look at a template's literal text.
struct NoValues;

impl crate::template::Values for NoValues {
    fn value(&self, _: &str) -> String {
        String::new()
    }
}

/// How a database reads a statement's text, as far as splitting it goes.
#[derive(Clone, Copy)]
pub(super) struct Dialect {
    /// `$tag$ … $tag$` bodies (PostgreSQL).
    dollar_quotes: bool,
    /// `[name]` and `` `name` `` identifiers (SQLite).
    bracketed_names: bool,
    /// `/* /* … */ */` comments nest (PostgreSQL).
    nested_comments: bool,
    /// A `--` comment ends at `\r` as well as `\n` (PostgreSQL; SQLite's
    /// runs to `\n`).
    comment_ends_at_cr: bool,
}

impl Dialect {
    /// PostgreSQL's reading; also the load-time check, before the backend is
    /// known (PostgreSQL runs only the first statement of a text anyway).
    pub(super) const POSTGRES: Dialect = Dialect {
        dollar_quotes: true,
        bracketed_names: false,
        nested_comments: true,
        comment_ends_at_cr: true,
    };
    /// SQLite's reading: it runs every statement of a text.
    pub(super) const SQLITE: Dialect = Dialect {
        dollar_quotes: false,
        bracketed_names: true,
        nested_comments: false,
        comment_ends_at_cr: false,
    };

    /// Where the comment that starts at `i` ends (the index after it), if
    /// one starts there: `--` to the end of the line, or a
    /// block comment, nested where the dialect nests them. An unclosed
    /// one runs to the end.
    fn comment_end(self, bytes: &[u8], i: usize) -> Option<usize> {
        match (bytes.get(i), bytes.get(i + 1)) {
            (Some(b'-'), Some(b'-')) => Some(
                bytes[i..]
                    .iter()
                    .position(|b| *b == b'\n' || (self.comment_ends_at_cr && *b == b'\r'))
                    .map_or(bytes.len(), |at| i + at + 1),
            ),
            (Some(b'/'), Some(b'*')) => {
                let (mut depth, mut j) = (1usize, i + 2);
                while j < bytes.len() {
                    match (bytes[j], bytes.get(j + 1)) {
                        (b'*', Some(b'/')) => {
                            depth -= 1;
                            j += 2;
                            if depth == 0 {
                                return Some(j);
                            }
                        }
                        (b'/', Some(b'*')) if self.nested_comments => {
                            depth += 1;
                            j += 2;
                        }
                        _ => j += 1,
                    }
                }
                Some(bytes.len())
            }
            _ => None,
        }
    }
}

/// The statements of `text` as `dialect` reads it: split at each `;`
/// outside quotes, quoted names, comments and (PostgreSQL) dollar-quoted
/// bodies.
pub(super) fn statements(text: &str, dialect: Dialect) -> Vec<&str> {
    let bytes = text.as_bytes();
    let skip_to = |from: usize, end: &[u8]| {
        bytes[from.min(bytes.len())..]
            .windows(end.len())
            .position(|w| w == end)
            .map_or(bytes.len(), |at| from + at + end.len() - 1)
    };
    let mut pieces = Vec::new();
    let (mut start, mut i) = (0, 0);
    while i < bytes.len() {
        match bytes[i] {
            quote @ (b'\'' | b'"') => i = skip_to(i + 1, &[quote]),
            b'`' if dialect.bracketed_names => i = skip_to(i + 1, b"`"),
            b'[' if dialect.bracketed_names => i = skip_to(i + 1, b"]"),
            b'-' | b'/' if dialect.comment_end(bytes, i).is_some() => {
                // Just before the comment's end: the loop steps past it.
                i = dialect.comment_end(bytes, i).unwrap_or(bytes.len()) - 1;
            }
            b'$' if dialect.dollar_quotes => {
                let tag = bytes[i + 1..]
                    .iter()
                    .take_while(|b| b.is_ascii_alphanumeric() || **b == b'_')
                    .count();
                let close = i + 1 + tag;
                let numbered = bytes.get(i + 1).is_some_and(u8::is_ascii_digit);
                if !numbered && bytes.get(close) == Some(&b'$') {
                    i = skip_to(close + 1, &bytes[i..=close]);
                }
            }
            b';' => {
                pieces.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    pieces.push(&text[start..]);
    pieces
}

/// The first transaction-control keyword among the statements of `text`
/// as `dialect` reads it.
pub(super) fn ends_the_transaction(text: &str, dialect: Dialect) -> Option<String> {
    statements(text, dialect)
        .into_iter()
        .find_map(|statement| transaction_control(statement, dialect))
}

/// Whether `text` holds no statement at all as `dialect` reads it: only
/// blanks, comments and `;`. The database would "run" it and succeed.
fn is_empty_in_effect(text: &str, dialect: Dialect) -> bool {
    statements(text, dialect)
        .into_iter()
        .all(|statement| after_comments(statement, dialect).is_empty())
}

/// A statement after its leading blanks and `--` or `/* */` comments.
fn after_comments(statement: &str, dialect: Dialect) -> &str {
    let mut rest = statement.trim_start();
    while let Some(end) = dialect.comment_end(rest.as_bytes(), 0) {
        rest = rest[end..].trim_start();
    }
    rest
}

/// The first word of a statement, upper-cased, after blanks and `--` or
/// `/* */` comments.
fn first_word(statement: &str, dialect: Dialect) -> String {
    after_comments(statement, dialect)
        .chars()
        .take_while(|c| c.is_ascii_alphabetic())
        .collect::<String>()
        .to_ascii_uppercase()
}

/// The transaction-control keyword a statement starts with, if any (after
/// blanks and `--` or `/* */` comments).
fn transaction_control(statement: &str, dialect: Dialect) -> Option<String> {
    let word = first_word(statement, dialect);
    const CONTROL: [&str; 9] = [
        "BEGIN",
        "START",
        "COMMIT",
        "END",
        "ROLLBACK",
        "ABORT",
        "SAVEPOINT",
        "RELEASE",
        "PREPARE",
    ];
    CONTROL.contains(&word.as_str()).then_some(word)
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(super) struct RawApi {
    key_ttl: Option<Spanned<String>>,
    #[serde(default)]
    tokens: Vec<Spanned<RawToken>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawToken {
    name: Spanned<String>,
    secret: Spanned<String>,
    allow: Spanned<Vec<Spanned<String>>>,
}

/// The shortest secret a token may have: long enough not to be guessed.
const SHORTEST_SECRET: usize = 16;

impl RawApi {
    pub(super) fn validate(self, at: &Locator, env: Env) -> Result<ApiSettings, ConfigError> {
        let key_ttl = at_least(
            at,
            ("key_ttl", self.key_ttl.as_ref()),
            "24h",
            Duration::from_secs(60),
        )?;
        let mut tokens: Vec<Token> = Vec::with_capacity(self.tokens.len());
        for raw in self.tokens {
            let raw = raw.into_inner();
            let name = raw.name.get_ref();
            let name_ok = !name.is_empty()
                && name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
            if !name_ok {
                return Err(at.error(
                    raw.name.span(),
                    format!("token name `{name}`: expected letters, digits, `-`, `_` or `.`, e.g. \"ci\""),
                ));
            }
            if tokens.iter().any(|t| t.name == *name) {
                return Err(at.error(
                    raw.name.span(),
                    format!("token name `{name}` is used twice; each token needs its own name"),
                ));
            }
            let unset = env.unset_count();
            let secret = crate::template::expand_env(raw.secret.get_ref(), &|n| env.get(n))
                .map_err(|e| at.template_error(raw.secret.span(), e))?;
            // Read leniently (`check`, `status`), an unset variable leaves
            // the secret empty (a warning): those commands serve no API.
            let complete = env.unset_count() == unset;
            if complete && secret.trim() != secret {
                return Err(at.error(
                    raw.secret.span(),
                    format!("the secret of token `{name}` begins or ends with blanks, which no Authorization header can carry; expected e.g. the output of `openssl rand -hex 32`"),
                ));
            }
            if complete && secret.chars().count() < SHORTEST_SECRET {
                return Err(at.error(
                    raw.secret.span(),
                    format!(
                        "the secret of token `{name}` is {} character(s) long: expected at least {SHORTEST_SECRET}, e.g. from `openssl rand -hex 32`",
                        secret.chars().count()
                    ),
                ));
            }
            env.note_secret(&secret);
            let secret = Secret::new(&secret);
            if !secret.is_empty() && tokens.iter().any(|t| t.secret == secret) {
                return Err(at.error(
                    raw.secret.span(),
                    format!("the secret of token `{name}` is another token's too; each token needs its own"),
                ));
            }
            let allow = allowed(at, &raw.allow, name)?;
            tokens.push(Token {
                name: name.clone(),
                secret,
                allow,
            });
        }
        Ok(ApiSettings { key_ttl, tokens })
    }
}

/// What a token's `allow` list allows; it must allow something.
fn allowed(
    at: &Locator,
    words: &toml::Spanned<Vec<toml::Spanned<String>>>,
    name: &str,
) -> Result<Allow, ConfigError> {
    let mut allow = Allow::default();
    for word in words.get_ref() {
        match word.get_ref().as_str() {
            "read" => allow.read = true,
            "trigger" => allow.trigger = true,
            "operate" => allow.operate = true,
            other => {
                let hint = nearest(other, ["read", "trigger", "operate"])
                    .map(|n| format!("; did you mean `{n}`?"))
                    .unwrap_or_default();
                return Err(at.error(
                    word.span(),
                    format!("unknown permission `{other}`, expected `read`, `trigger` or `operate`{hint}"),
                ));
            }
        }
    }
    if allow == Allow::default() {
        return Err(at.error(
            words.span(),
            format!(
                "token `{name}` allows nothing: expected some of \"read\", \"trigger\", \"operate\""
            ),
        ));
    }
    Ok(allow)
}
