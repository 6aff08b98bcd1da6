//! Fire times: a cron pattern read on a job's local wall clock, mapped to UTC
//! instants under the job's daylight-saving rule. Pure: no clock, no I/O.
//!
//! croner walks the *wall clock* (`NaiveDateTime`), so it never guesses about
//! daylight saving; this module decides what each matching wall-clock time
//! means: one instant, none (a spring-forward gap), or two (a fall-back repeat).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

use chrono::{DateTime, LocalResult, NaiveDateTime, NaiveTime, Offset, TimeDelta, TimeZone, Utc};
use chrono_tz::Tz;
use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};

use crate::calendar::{Days, Step};
use serde::Deserialize;

/// What a wall-clock fire time inside a spring-forward gap does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Gap {
    /// Fire once, at the first instant after the gap.
    #[default]
    Shift,
    /// Do not fire.
    Skip,
}

/// Which occurrence of a wall-clock time that a fall-back repeats fires.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Repeat {
    /// The earlier instant only.
    #[default]
    First,
    /// The later instant only.
    Last,
    /// Both instants.
    Both,
}

/// A job's daylight-saving rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct DstRule {
    /// What a time in a gap does.
    pub gap: Gap,
    /// What a repeated time does.
    pub repeat: Repeat,
}

/// A cron pattern that did not parse, or never matches.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct CronPatternError(String);

/// Offsets of every zone lie within ±14 h of UTC; a search window of this
/// size around a wall-clock time always contains its instants.
const OFFSET_SPAN: TimeDelta = TimeDelta::hours(15);

/// How far ahead (or behind) the offset is compared to detect a nearby
/// daylight-saving fold.
const FOLD_HORIZON: TimeDelta = TimeDelta::hours(26);

/// A parsed cron pattern in a time zone with a daylight-saving rule.
///
/// Identical patterns share one parsed `Cron` (about 5.6 KB of bitfields
/// each), so ten thousand jobs on `* * * * *` hold one copy, its text and
/// the answers of its latest walks.
#[derive(Debug, Clone)]
pub struct Schedule {
    cron: Arc<Pattern>,
    zone: Tz,
    dst: DstRule,
    /// The dates whose fires exist: an active window, working days.
    days: Option<Arc<Days>>,
}

impl Schedule {
    /// Parses a 5- or 6-field pattern (seconds first) or an `@` alias.
    pub fn parse(pattern: &str, zone: Tz, dst: DstRule) -> Result<Self, CronPatternError> {
        let pattern = pattern.trim();
        let cron = shared_cron(pattern)?;
        let schedule = Schedule {
            cron,
            zone,
            dst,
            days: None,
        };
        // A pattern such as `0 0 30 2 *` parses but never fires.
        let probe = (DateTime::UNIX_EPOCH + TimeDelta::days(365 * 56)).naive_utc();
        if schedule.cron.after(probe).is_none() {
            return Err(CronPatternError(format!(
                "`{pattern}` never matches a real date"
            )));
        }
        Ok(schedule)
    }

    /// The schedule with fires only on `days` (local dates in its zone):
    /// a fire on any other date does not exist, for every walk below.
    pub fn with_days(mut self, days: Days) -> Self {
        self.days = (days != Days::default()).then(|| Arc::new(days));
        self
    }

    /// The dates whose fires exist, if any are left out.
    pub fn days(&self) -> Option<&Days> {
        self.days.as_deref()
    }

    /// The pattern as written.
    pub fn source(&self) -> &str {
        &self.cron.source
    }

    /// The pattern in English words (`At 02:00 AM, on day 1 of the
    /// month`), as croner describes it.
    pub fn describe(&self) -> String {
        self.cron.cron.describe()
    }

    /// The zone the pattern is read in.
    pub fn zone(&self) -> Tz {
        self.zone
    }

    /// The daylight-saving rule.
    pub fn dst(&self) -> DstRule {
        self.dst
    }

    /// The first fire strictly after `t`.
    pub fn next_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        // Fires fall on whole seconds, and croner walks whole seconds.
        let t = whole_second(t);
        // Near the ends of time the wall clock cannot be shifted: no fires.
        let ahead = t.checked_add_signed(FOLD_HORIZON + OFFSET_SPAN)?;
        t.checked_sub_signed(FOLD_HORIZON + OFFSET_SPAN)?;
        // A fall-back ahead of `t` maps earlier wall-clock times to later
        // instants, so the walk starts that much earlier on the wall clock.
        let slack = (offset_at(self.zone, t) - offset_at(self.zone, ahead - OFFSET_SPAN))
            .max(TimeDelta::zero());
        let mut cursor = local(self.zone, t).checked_sub_signed(slack)?;
        let mut best: Option<(NaiveDateTime, DateTime<Utc>)> = None;
        loop {
            let wall = self.cron.after(cursor);
            let Some(wall) = wall else {
                return best.map(|(_, at)| at);
            };
            if let Some((best_wall, at)) = best
                && best_wall.checked_add_signed(slack).is_none_or(|w| wall > w)
            {
                return Some(at);
            }
            match self
                .days
                .as_ref()
                .map_or(Step::Here, |d| d.forward(wall.date()))
            {
                Step::Here => {}
                // Strictly after the second before that day begins.
                Step::To(date) => {
                    cursor = date.and_time(NaiveTime::MIN) - TimeDelta::seconds(1);
                    continue;
                }
                Step::End => return best.map(|(_, at)| at),
            }
            if let Some(at) = self.instants(wall).into_iter().flatten().find(|at| *at > t)
                && best.is_none_or(|(_, b)| at < b)
            {
                if slack.is_zero() {
                    return Some(at);
                }
                best = Some((wall, at));
            }
            cursor = wall;
        }
    }

    /// The last fire strictly before `t`.
    pub fn prev_before(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let floor = whole_second(t);
        let t = if floor < t {
            floor.checked_add_signed(TimeDelta::seconds(1))?
        } else {
            t
        };
        // Near the ends of time the wall clock cannot be shifted: no fires.
        let behind = t.checked_sub_signed(FOLD_HORIZON + OFFSET_SPAN)?;
        t.checked_add_signed(FOLD_HORIZON + OFFSET_SPAN)?;
        let slack = (offset_at(self.zone, behind + OFFSET_SPAN) - offset_at(self.zone, t))
            .max(TimeDelta::zero());
        let mut cursor = local(self.zone, t).checked_add_signed(slack)?;
        let mut best: Option<(NaiveDateTime, DateTime<Utc>)> = None;
        loop {
            let wall = self.cron.before(cursor);
            let Some(wall) = wall else {
                return best.map(|(_, at)| at);
            };
            if let Some((best_wall, at)) = best
                && best_wall.checked_sub_signed(slack).is_none_or(|w| wall < w)
            {
                return Some(at);
            }
            match self
                .days
                .as_ref()
                .map_or(Step::Here, |d| d.backward(wall.date()))
            {
                Step::Here => {}
                // Strictly before the day after it begins.
                Step::To(date) => {
                    cursor = date.succ_opt()?.and_time(NaiveTime::MIN);
                    continue;
                }
                Step::End => return best.map(|(_, at)| at),
            }
            if let Some(at) = self
                .instants(wall)
                .into_iter()
                .flatten()
                .filter(|at| *at < t)
                .max()
                && best.is_none_or(|(_, b)| at > b)
            {
                if slack.is_zero() {
                    return Some(at);
                }
                best = Some((wall, at));
            }
            cursor = wall;
        }
    }

    /// The wall-clock time the pattern matched for `fire`: its local time,
    /// or, for a fire shifted out of a spring-forward gap, the time in the
    /// gap it was written for (02:30, not the 03:00 it ran at).
    pub fn wall_of(&self, fire: DateTime<Utc>) -> NaiveDateTime {
        let wall = local(self.zone, fire);
        let before = local(self.zone, fire - TimeDelta::seconds(1));
        if wall - before <= TimeDelta::seconds(1) {
            return wall;
        }
        match self.cron.before(wall) {
            Some(matched) if matched > before => matched,
            _ => wall,
        }
    }

    /// The fires in `(after, until]`, oldest first.
    pub fn fires_between(
        &self,
        after: DateTime<Utc>,
        until: DateTime<Utc>,
    ) -> impl Iterator<Item = DateTime<Utc>> + '_ {
        std::iter::successors(self.next_after(after), move |t| self.next_after(*t))
            .take_while(move |t| *t <= until)
    }

    /// The instants a matching wall-clock time fires at, per the DST rule.
    fn instants(&self, wall: NaiveDateTime) -> [Option<DateTime<Utc>>; 2] {
        match self.zone.from_local_datetime(&wall) {
            LocalResult::Single(at) => [Some(at.to_utc()), None],
            LocalResult::Ambiguous(first, last) => match self.dst.repeat {
                Repeat::First => [Some(first.to_utc()), None],
                Repeat::Last => [Some(last.to_utc()), None],
                Repeat::Both => [Some(first.to_utc()), Some(last.to_utc())],
            },
            LocalResult::None => match self.dst.gap {
                Gap::Shift => [Some(end_of_gap(self.zone, wall)), None],
                Gap::Skip => [None, None],
            },
        }
    }
}

/// The instant a wall-clock time names: the earlier one in a repeat, the end
/// of the gap in a gap. Used for period boundaries.
pub fn earliest_instant(zone: Tz, wall: NaiveDateTime) -> DateTime<Utc> {
    match zone.from_local_datetime(&wall) {
        LocalResult::Single(at) | LocalResult::Ambiguous(at, _) => at.to_utc(),
        LocalResult::None => end_of_gap(zone, wall),
    }
}

/// `t` without its fraction of a second.
pub fn whole_second(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(t.timestamp(), 0).unwrap_or(t)
}

/// The wall-clock time in `zone` at `t`.
pub fn local(zone: Tz, t: DateTime<Utc>) -> NaiveDateTime {
    t.with_timezone(&zone).naive_local()
}

fn offset_at(zone: Tz, t: DateTime<Utc>) -> TimeDelta {
    TimeDelta::seconds(i64::from(
        zone.offset_from_utc_datetime(&t.naive_utc())
            .fix()
            .local_minus_utc(),
    ))
}

/// The first instant whose wall-clock time is past `wall`, a time that a
/// spring-forward skipped: the instant the clocks jumped.
fn end_of_gap(zone: Tz, wall: NaiveDateTime) -> DateTime<Utc> {
    // Whole seconds: every zone's transitions fall on a second.
    let at = |secs: i64| DateTime::from_timestamp(secs, 0).unwrap_or(DateTime::<Utc>::MAX_UTC);
    let mut low = wall.and_utc().timestamp() - OFFSET_SPAN.num_seconds();
    let mut high = wall.and_utc().timestamp() + OFFSET_SPAN.num_seconds();
    while high - low > 1 {
        let mid = low + (high - low) / 2;
        if local(zone, at(mid)) > wall {
            high = mid;
        } else {
            low = mid;
        }
    }
    at(high)
}

/// How many of a pattern's latest walks are kept.
const WALKS_KEPT: usize = 8;

/// A parsed pattern, shared by every job written with it, and its latest
/// walks. The jobs of one pattern ask it the same questions (the fire after
/// the same instant: at start-up, after a burst's fire), and each walk of
/// croner's counts every field's values first, some microseconds: 100,000
/// jobs on 1,500 patterns walked 100,000 times where 1,500 answer.
#[derive(Debug)]
struct Pattern {
    /// As written, trimmed: the cache's key too.
    source: Arc<str>,
    cron: Cron,
    walks: Mutex<Walks>,
}

/// A pattern's latest walks, the oldest replaced first.
#[derive(Debug, Default)]
struct Walks {
    kept: [Option<Walk>; WALKS_KEPT],
    next: usize,
}

/// One walk: the wall-clock time found strictly after (or before) `from`.
#[derive(Debug, Clone, Copy)]
struct Walk {
    from: NaiveDateTime,
    forward: bool,
    found: Option<NaiveDateTime>,
}

impl Pattern {
    /// The first matching wall-clock time strictly after `from`.
    fn after(&self, from: NaiveDateTime) -> Option<NaiveDateTime> {
        self.walk(from, true)
    }

    /// The last matching wall-clock time strictly before `from`.
    fn before(&self, from: NaiveDateTime) -> Option<NaiveDateTime> {
        self.walk(from, false)
    }

    fn walk(&self, from: NaiveDateTime, forward: bool) -> Option<NaiveDateTime> {
        let kept =
            self.walks().kept.iter().flatten().find_map(|walk| {
                (walk.from == from && walk.forward == forward).then_some(walk.found)
            });
        if let Some(found) = kept {
            return found;
        }
        let found = if forward {
            self.cron.find_next_occurrence(&from, false).ok()
        } else {
            self.cron.find_previous_occurrence(&from, false).ok()
        };
        let mut walks = self.walks();
        let at = walks.next;
        walks.kept[at] = Some(Walk {
            from,
            forward,
            found,
        });
        walks.next = (at + 1) % WALKS_KEPT;
        found
    }

    /// The kept walks. A panic cannot leave them half-written (each is
    /// written whole, in one assignment), so a poisoned lock's are used.
    fn walks(&self) -> std::sync::MutexGuard<'_, Walks> {
        self.walks.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Parses a pattern once per distinct text, for the life of the process.
fn shared_cron(pattern: &str) -> Result<Arc<Pattern>, CronPatternError> {
    static CACHE: OnceLock<Mutex<HashMap<Arc<str>, Arc<Pattern>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    if let Some(cron) = cache.lock().map_err(poisoned)?.get(pattern) {
        return Ok(cron.clone());
    }
    check_fields(pattern)?;
    let cron = CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
        .parse(&as_vixie_reads(pattern))
        .map_err(|e| {
            let reason = e.to_string();
            CronPatternError(format!(
                "`{pattern}` is not a cron pattern ({})",
                reason.trim_end_matches('.')
            ))
        })?;
    let source: Arc<str> = pattern.into();
    let cron = Arc::new(Pattern {
        source: source.clone(),
        cron,
        walks: Mutex::default(),
    });
    cache.lock().map_err(poisoned)?.insert(source, cron.clone());
    Ok(cron)
}

/// The pattern rewritten so that croner reads it as Vixie cron and cronie
/// do, where croner departs from them (a crontab moved over means what it
/// meant):
/// - a day-of-month or day-of-week field that *starts with* `*` (`*`,
///   `*/2`) leaves the other day field alone: both must match (croner's `+`
///   on the day-of-week field), not either, so `0 16 */2 * SAT` fires on
///   odd-numbered Saturdays only; with both fields restricted otherwise,
///   either matches, as in every cron;
/// - a `*` inside a list (`*,15`) stands for the whole field, written as
///   its range (croner refuses a bare `*` among other values);
/// - `@midnight` is `@daily`.
fn as_vixie_reads(pattern: &str) -> String {
    // Vixie cron's other name for `@daily`, which croner lacks.
    if pattern.eq_ignore_ascii_case("@midnight") {
        return "@daily".to_owned();
    }
    const RANGES: [&str; 6] = ["0-59", "0-59", "0-23", "1-31", "1-12", "0-6"];
    let fields: Vec<&str> = pattern.split_whitespace().collect();
    let ranges = match fields.len() {
        5 => &RANGES[1..],
        6 => &RANGES[..],
        _ => return pattern.to_owned(),
    };
    let mut fields: Vec<String> = fields
        .iter()
        .zip(ranges)
        .map(|(field, range)| match field.contains(',') {
            true => field
                .split(',')
                .map(|part| if part == "*" { *range } else { part })
                .collect::<Vec<_>>()
                .join(","),
            false => (*field).to_owned(),
        })
        .collect();
    let n = fields.len();
    let (dom, dow) = (pattern_field(pattern, n - 3), pattern_field(pattern, n - 1));
    if (dom.starts_with('*') || dow.starts_with('*')) && !fields[n - 1].starts_with('+') {
        fields[n - 1].insert(0, '+');
    }
    fields.join(" ")
}

/// The `i`th whitespace-separated field of `pattern`, as written.
fn pattern_field(pattern: &str, i: usize) -> &str {
    pattern.split_whitespace().nth(i).unwrap_or("")
}

/// Names a number out of its field's range (`hour 25 is out of range
/// 0–23`), which croner reports only as "Number out of bounds".
fn check_fields(pattern: &str) -> Result<(), CronPatternError> {
    if pattern.starts_with('@') {
        const ALIASES: [&str; 7] = [
            "@yearly",
            "@annually",
            "@monthly",
            "@weekly",
            "@daily",
            "@midnight",
            "@hourly",
        ];
        let alias = pattern.to_ascii_lowercase();
        if alias == "@reboot" {
            return Err(CronPatternError(format!(
                "`{pattern}` is not a schedule here: a job runs for a period of time, not at a start; run it from the service's start-up, or give a schedule such as @hourly or `0 2 * * *`"
            )));
        }
        if !ALIASES.contains(&alias.as_str()) {
            let hint = crate::suggest::nearest(&alias, ALIASES.iter().copied())
                .map(|n| format!("; did you mean `{n}`?"))
                .unwrap_or_default();
            return Err(CronPatternError(format!(
                "`{pattern}` is not a cron alias (expected one of {}){hint}",
                ALIASES.join(", ")
            )));
        }
        return Ok(());
    }
    const FIELDS: [(&str, u32, u32); 6] = [
        ("second", 0, 59),
        ("minute", 0, 59),
        ("hour", 0, 23),
        ("day-of-month", 1, 31),
        ("month", 1, 12),
        ("day-of-week", 0, 7),
    ];
    let fields: Vec<&str> = pattern.split_whitespace().collect();
    let named: &[(&str, u32, u32)] = match fields.len() {
        5 => &FIELDS[1..],
        6 => &FIELDS,
        n => {
            return Err(CronPatternError(format!(
                "`{pattern}` is not a cron pattern (it has {n} field(s))"
            )));
        }
    };
    for (field, (name, low, high)) in fields.iter().zip(named) {
        for part in field.split(',') {
            let (range, step) = match part.split_once('/') {
                Some((range, step)) => (range, Some(step)),
                None => (part, None),
            };
            let range = range.split('#').next().unwrap_or(range);
            for value in range.split('-') {
                let value = value.trim_end_matches(['L', 'W', 'l', 'w']);
                if let Ok(n) = value.parse::<u32>()
                    && !(*low..=*high).contains(&n)
                {
                    return Err(CronPatternError(format!(
                        "`{pattern}` is not a cron pattern ({name} {n} is out of range {low}–{high})"
                    )));
                }
            }
            if let Some(step) = step
                && step.parse::<u32>() == Ok(0)
            {
                return Err(CronPatternError(format!(
                    "`{pattern}` is not a cron pattern (a {name} step of 0 never advances)"
                )));
            }
        }
    }
    Ok(())
}

fn poisoned<T>(_: T) -> CronPatternError {
    CronPatternError("the cron pattern cache was poisoned by a panic".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().to_utc()
    }

    fn fires(pattern: &str, zone: &str, dst: DstRule, from: &str, to: &str) -> Vec<String> {
        let schedule = Schedule::parse(pattern, zone.parse().unwrap(), dst).unwrap();
        schedule
            .fires_between(at(from), at(to))
            .map(|t| t.format("%Y-%m-%dT%H:%M:%SZ").to_string())
            .collect()
    }

    #[test]
    fn a_patterns_kept_walks_answer_as_a_walk_of_its_own_does() {
        let pattern = shared_cron("7 */5 * * 1-5").unwrap();
        let fresh = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build()
            .parse("7 */5 * * 1-5")
            .unwrap();
        let start = at("2026-03-27T21:13:09Z").naive_utc();
        // Three times as many instants as are kept, asked in order, then
        // backwards: the newest are found kept, the oldest were replaced.
        let mut froms: Vec<NaiveDateTime> = (0..3 * WALKS_KEPT as i64)
            .map(|i| start + TimeDelta::minutes(i * 97))
            .collect();
        for _ in 0..2 {
            froms.reverse();
            for &from in &froms {
                let after = fresh.find_next_occurrence(&from, false).ok();
                let before = fresh.find_previous_occurrence(&from, false).ok();
                assert_eq!(pattern.after(from), after, "after {from}");
                assert_eq!(pattern.before(from), before, "before {from}");
                assert_eq!(pattern.after(from), after, "after {from}, kept");
                assert_eq!(pattern.before(from), before, "before {from}, kept");
            }
        }
    }

    #[test]
    fn a_day_field_starting_with_a_star_leaves_the_other_one_alone_as_vixie_cron_reads_it() {
        // Odd-numbered days that are Saturdays, written out by hand from a
        // 2026 calendar (January's Saturdays: 3, 10, 17, 24, 31; February's
        // and March's: 7, 14, 21, 28).
        assert_eq!(
            fires(
                "0 16 */2 * SAT",
                "UTC",
                DstRule::default(),
                "2026-01-05T00:00:00Z",
                "2026-03-31T00:00:00Z"
            ),
            [
                "2026-01-17T16:00:00Z",
                "2026-01-31T16:00:00Z",
                "2026-02-07T16:00:00Z",
                "2026-02-21T16:00:00Z",
                "2026-03-07T16:00:00Z",
                "2026-03-21T16:00:00Z",
            ]
        );
        // The day-of-week field starred: `*/3` is Sunday, Wednesday and
        // Saturday (0, 3, 6), and the 13th must be one of them.
        assert_eq!(
            fires(
                "0 9 13 * */3",
                "UTC",
                DstRule::default(),
                "2026-01-01T00:00:00Z",
                "2026-12-31T00:00:00Z"
            ),
            // The 13ths of 2026 on a Sunday, Wednesday or Saturday.
            [
                "2026-05-13T09:00:00Z",
                "2026-06-13T09:00:00Z",
                "2026-09-13T09:00:00Z",
                "2026-12-13T09:00:00Z"
            ]
        );
        // Both restricted otherwise: either matches, as in every cron (the
        // 1st and the 15th, and every Monday).
        assert_eq!(
            fires(
                "0 0 1,15 * MON",
                "UTC",
                DstRule::default(),
                "2026-05-31T12:00:00Z",
                "2026-06-16T00:00:00Z"
            ),
            [
                "2026-06-01T00:00:00Z",
                "2026-06-08T00:00:00Z",
                "2026-06-15T00:00:00Z",
            ]
        );
    }

    #[test]
    fn a_star_in_a_list_stands_for_the_whole_field() {
        assert_eq!(
            fires(
                "0 0 *,15 * *",
                "UTC",
                DstRule::default(),
                "2026-02-26T12:00:00Z",
                "2026-03-03T12:00:00Z"
            ),
            [
                "2026-02-27T00:00:00Z",
                "2026-02-28T00:00:00Z",
                "2026-03-01T00:00:00Z",
                "2026-03-02T00:00:00Z",
                "2026-03-03T00:00:00Z",
            ]
        );
        // A star that is not first: still the whole field.
        assert_eq!(
            fires(
                "30 9,* * * *",
                "UTC",
                DstRule::default(),
                "2026-01-01T00:00:00Z",
                "2026-01-01T02:59:00Z"
            ),
            [
                "2026-01-01T00:30:00Z",
                "2026-01-01T01:30:00Z",
                "2026-01-01T02:30:00Z"
            ]
        );
    }

    #[test]
    fn five_and_six_field_patterns_and_aliases_parse() {
        for p in [
            "*/5 * * * *",
            "30 */5 * * * *",
            "@daily",
            "@annually",
            "@MIDNIGHT",
            "0 0 L * *",
            "0 9 * * 1#2",
        ] {
            Schedule::parse(p, Tz::UTC, DstRule::default()).unwrap();
        }
    }

    #[test]
    fn an_alias_cron_does_not_know_here_says_what_to_write() {
        let err = Schedule::parse("@reboot", Tz::UTC, DstRule::default()).unwrap_err();
        assert!(
            err.to_string().contains("a job runs for a period of time"),
            "{err}"
        );
        let err = Schedule::parse("@dayly", Tz::UTC, DstRule::default()).unwrap_err();
        assert!(err.to_string().contains("did you mean `@daily`?"), "{err}");
        assert!(!err.to_string().contains("years are disallowed"), "{err}");
    }

    #[test]
    fn a_number_out_of_its_field_is_named_with_the_range() {
        let err = Schedule::parse("0 25 * * *", Tz::UTC, DstRule::default()).unwrap_err();
        assert!(
            err.to_string().contains("hour 25 is out of range 0–23"),
            "{err}"
        );
        let err = Schedule::parse("61 * * * * *", Tz::UTC, DstRule::default()).unwrap_err();
        assert!(err.to_string().contains("second 61"), "{err}");
    }

    #[test]
    fn fires_near_the_end_of_time_are_none_rather_than_a_panic() {
        let s = Schedule::parse("* * * * *", Tz::UTC, DstRule::default()).unwrap();
        assert_eq!(s.next_after(DateTime::<Utc>::MAX_UTC), None);
        assert_eq!(s.prev_before(DateTime::<Utc>::MIN_UTC), None);
    }

    #[test]
    fn a_pattern_that_never_matches_is_refused() {
        let err = Schedule::parse("0 0 30 2 *", Tz::UTC, DstRule::default()).unwrap_err();
        assert!(err.to_string().contains("never matches"), "{err}");
    }

    #[test]
    fn fires_between_is_exclusive_of_the_start_and_inclusive_of_the_end() {
        let got = fires(
            "0 * * * *",
            "UTC",
            DstRule::default(),
            "2026-07-15T10:00:00Z",
            "2026-07-15T12:00:00Z",
        );
        assert_eq!(got, ["2026-07-15T11:00:00Z", "2026-07-15T12:00:00Z"]);
    }

    #[test]
    fn prev_before_steps_back_one_fire() {
        let s = Schedule::parse("0 2 1 * *", Tz::UTC, DstRule::default()).unwrap();
        assert_eq!(
            s.prev_before(at("2026-07-01T02:00:00Z")),
            Some(at("2026-06-01T02:00:00Z"))
        );
    }
}
