//! A job's fires as they run: the schedule's fire (the *nominal* instant,
//! which names the period) moved off a day off to a working day, then
//! delayed by the job's jitter. Pure, and the one place every front end
//! asks when a period is due: the timer, catch-up, `run`, backfill,
//! dependencies, deadlines, `next`, `status` and the API.
//!
//! Which fires exist at all (the active window, a skipping calendar) is
//! decided a level down, by the schedule's [`crate::calendar::Days`]: a
//! fire that does not exist is no period, so never missing nor late.

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, NaiveDate, TimeDelta, Utc};

use crate::calendar::{Calendar, OnDayOff};
use crate::period::{Covers, Period, PeriodKey, PeriodRule, Unit};
use crate::schedule::{Schedule, earliest_instant};

/// How a job's fires are moved and delayed.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct FireRules {
    /// Fires on a day off of this calendar go to a working day.
    pub shift: Option<Shift>,
    /// Each period's fire is delayed by less than this.
    pub jitter: Option<Duration>,
}

/// Where a fire on a day off goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shift {
    /// Whose working days.
    pub calendar: Arc<Calendar>,
    /// [`OnDayOff::Next`] or [`OnDayOff::Previous`].
    pub to: OnDayOff,
}

/// By the calendar's name and the direction: a hash to find equal rules
/// by (the jobs of a file share equal policies) without walking the
/// holidays; equal rules compare them.
impl std::hash::Hash for Shift {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.calendar.name.hash(state);
        self.to.hash(state);
    }
}

/// One fire: the instant its period is named by, and the instant it runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fire {
    /// The schedule's own instant: the period comes from it.
    pub nominal: DateTime<Utc>,
    /// When it is due: moved and delayed.
    pub at: DateTime<Utc>,
}

/// A job's fires: its name (for the jitter), schedule, period rule and
/// rules, borrowed.
#[derive(Clone, Copy)]
pub struct Timing<'a> {
    job: &'a str,
    schedule: &'a Schedule,
    period: &'a PeriodRule,
    rules: &'a FireRules,
}

impl<'a> Timing<'a> {
    /// The fires of job `job`.
    pub fn new(
        job: &'a str,
        schedule: &'a Schedule,
        period: &'a PeriodRule,
        rules: &'a FireRules,
    ) -> Timing<'a> {
        Timing {
            job,
            schedule,
            period,
            rules,
        }
    }

    /// When the fire of nominal instant `nominal` runs.
    pub fn at(&self, nominal: DateTime<Utc>) -> DateTime<Utc> {
        let mut at = nominal;
        if let Some(shift) = &self.rules.shift {
            let zone = self.schedule.zone();
            let wall = self.schedule.wall_of(nominal);
            let date = wall.date();
            if !shift.calendar.is_working(date) {
                let on = |day: NaiveDate| earliest_instant(zone, day.and_time(wall.time()));
                let next = || shift.calendar.next_working(date).map(on);
                let moved = match shift.to {
                    OnDayOff::Next => next(),
                    // Never before the period may run: a day period before
                    // its day, a covered month before its end. Where the
                    // working day before is too early, the one after.
                    OnDayOff::Previous => {
                        let earliest = self.earliest(nominal);
                        match shift.calendar.previous_working(date).map(on) {
                            Some(before) if earliest.is_none_or(|e| before >= e) => Some(before),
                            _ => next(),
                        }
                    }
                    OnDayOff::Skip => None,
                };
                if let Some(moved) = moved {
                    at = moved;
                }
            }
        }
        at + self.jitter(nominal)
    }

    /// The earliest instant a fire of `nominal` may run on another day:
    /// the start of a calendar period it covers as `current`, the end of
    /// one it covers as `previous`. A `fire` period is its fire's own.
    fn earliest(&self, nominal: DateTime<Utc>) -> Option<DateTime<Utc>> {
        if self.period.unit == Unit::Fire {
            return None;
        }
        let period = self.period.period_of(self.schedule, nominal);
        Some(match self.period.covers {
            Covers::Current => period.start,
            Covers::Previous => period.end,
        })
    }

    /// The jitter of the fire of `nominal`: from a hash of the period key,
    /// in whole seconds, below the bound and below the time to the next
    /// fire; the same in every process and every version.
    pub fn jitter(&self, nominal: DateTime<Utc>) -> TimeDelta {
        let Some(bound) = self.rules.jitter else {
            return TimeDelta::zero();
        };
        let mut limit = bound.as_secs();
        if let Some(next) = self.schedule.next_after(nominal) {
            limit = limit.min((next - nominal).num_seconds().max(0).unsigned_abs());
        }
        if limit <= 1 {
            return TimeDelta::zero();
        }
        let period = self.period.period_of(self.schedule, nominal);
        let key = PeriodKey::new(self.job, &period.label);
        TimeDelta::seconds((stable_hash(key.as_str()) % limit) as i64)
    }

    /// When `period` is due, if a fire covers it.
    pub fn of(&self, period: &Period) -> Option<DateTime<Utc>> {
        self.period
            .fire_for(self.schedule, period)
            .map(|nominal| self.at(nominal))
    }

    /// The period a fire names.
    pub fn period_of(&self, fire: &Fire) -> Period {
        self.period.period_of(self.schedule, fire.nominal)
    }

    /// The first fire due strictly after `t`.
    pub fn next(&self, t: DateTime<Utc>) -> Option<Fire> {
        if self.is_plain() {
            return self.schedule.next_after(t).map(plain);
        }
        let (back, ahead) = self.reach();
        let mut best: Option<Fire> = None;
        let mut nominal = self.first_after(t - ahead);
        while let Some(n) = nominal {
            // Later ones run at `n - back` at the earliest.
            if best.is_some_and(|b| n - back > b.at) {
                break;
            }
            let at = self.at(n);
            if at > t && best.is_none_or(|b| at < b.at) {
                best = Some(Fire { nominal: n, at });
            }
            nominal = self.schedule.next_after(n);
        }
        best
    }

    /// The fires due in `(after, until]`, by when they are due (then by
    /// nominal instant).
    pub fn between(&self, after: DateTime<Utc>, until: DateTime<Utc>) -> Vec<Fire> {
        if self.is_plain() {
            return self
                .schedule
                .fires_between(after, until)
                .map(plain)
                .collect();
        }
        let (back, ahead) = self.reach();
        let first = self.first_after(after - ahead);
        let mut fires: Vec<Fire> = std::iter::successors(first, |n| self.schedule.next_after(*n))
            .take_while(|n| *n <= until + back)
            .map(|n| Fire {
                nominal: n,
                at: self.at(n),
            })
            .filter(|f| f.at > after && f.at <= until)
            .collect();
        fires.sort_by_key(|f| (f.at, f.nominal));
        fires
    }

    /// The last fire due at or before `now`.
    pub fn latest(&self, now: DateTime<Utc>) -> Option<Fire> {
        let tick = TimeDelta::nanoseconds(1);
        if self.is_plain() {
            return self.schedule.prev_before(now + tick).map(plain);
        }
        let (back, ahead) = self.reach();
        let mut best: Option<Fire> = None;
        // A nominal fire after `now + back` runs after `now`.
        let mut nominal = self.schedule.prev_before(now + back + tick);
        let mut later = nominal.and_then(|n| self.schedule.next_after(n));
        while let Some(n) = nominal {
            // This one and earlier ones run before `later + ahead`.
            if let (Some(b), Some(l)) = (best, later)
                && l + ahead <= b.at
            {
                break;
            }
            let at = self.at(n);
            if at <= now && best.is_none_or(|b| at > b.at) {
                best = Some(Fire { nominal: n, at });
            }
            later = Some(n);
            nominal = self.schedule.prev_before(n);
        }
        best
    }

    fn is_plain(&self) -> bool {
        self.rules.shift.is_none() && self.rules.jitter.is_none()
    }

    /// The first nominal fire that can run after `t`, given that a fire
    /// moved on by at most `ahead` still runs before its successor's
    /// nominal instant plus `ahead` (the jitter stays below the gap): the
    /// last one at or before `t`, else the first after it.
    fn first_after(&self, t: DateTime<Utc>) -> Option<DateTime<Utc>> {
        self.schedule
            .prev_before(t + TimeDelta::nanoseconds(1))
            .or_else(|| self.schedule.next_after(t))
    }

    /// How far before its nominal instant a fire can run (moved to a
    /// previous working day), and how far after its *next* fire's nominal
    /// instant (moved on; the jitter, below the gap, adds nothing past
    /// that); a day more than the calendar's longest closure covers a
    /// daylight-saving change on the way.
    fn reach(&self) -> (TimeDelta, TimeDelta) {
        let days = |c: &Calendar| TimeDelta::days(i64::from(c.longest_closure()) + 1);
        match &self.rules.shift {
            // Moved back, or on where back is too early.
            Some(Shift {
                calendar,
                to: OnDayOff::Previous,
            }) => (days(calendar), days(calendar)),
            Some(Shift {
                calendar,
                to: OnDayOff::Next,
            }) => (TimeDelta::zero(), days(calendar)),
            _ => (TimeDelta::zero(), TimeDelta::zero()),
        }
    }
}

/// Where a job's fires are taken up again after a reload changed how they
/// run (`old` → `new`): from the earliest fire the old rules may not have
/// run by `fired_until`, so that one the new rules make due earlier (a
/// smaller jitter, a holiday taken out) is not lost; what already ran is
/// answered done by its claim. Unchanged rules go on from `fired_until`.
pub fn resume_from(old: &Timing, new: &Timing, fired_until: DateTime<Utc>) -> DateTime<Utc> {
    let same = old.schedule.source() == new.schedule.source()
        && old.schedule.zone() == new.schedule.zone()
        && old.schedule.dst() == new.schedule.dst()
        && old.schedule.days() == new.schedule.days()
        && old.period == new.period
        && old.rules == new.rules;
    if same {
        return fired_until;
    }
    let (_, ahead) = old.reach();
    let (back, _) = new.reach();
    old.first_after(fired_until - ahead)
        .map_or(fired_until, |n| {
            (n - back - TimeDelta::nanoseconds(1)).min(fired_until)
        })
}

fn plain(nominal: DateTime<Utc>) -> Fire {
    Fire {
        nominal,
        at: nominal,
    }
}

/// The first eight bytes of the SHA-256 of `text`: fixed by the standard,
/// so no process, platform or release computes another jitter.
fn stable_hash(text: &str) -> u64 {
    use sha2::Digest;
    let hash = sha2::Sha256::digest(text.as_bytes());
    let mut first = [0; 8];
    first.copy_from_slice(&hash[..8]);
    u64::from_be_bytes(first)
}
