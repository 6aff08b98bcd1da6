//! The periods from one label to another, walked one `following` at a
//! time, never held whole: the range of a manual run, a page of periods.

use super::{Period, PeriodRule};
use crate::schedule::Schedule;

/// The periods from one label to another, walked one `following` at a time.
#[derive(Clone)]
pub(crate) struct RangeWalk {
    next: Option<Period>,
    last: Period,
}

impl RangeWalk {
    /// The walk from `first` to `last`, both included.
    pub(crate) fn new(first: Period, last: Period) -> RangeWalk {
        RangeWalk {
            next: Some(first),
            last,
        }
    }

    /// The next period a fire covers: a day the schedule, its calendar or
    /// its active dates leave out is no period, and is passed over.
    pub(crate) fn step(&mut self, rule: &PeriodRule, schedule: &Schedule) -> Option<Period> {
        loop {
            let current = self.next.take()?;
            // A last label a spring-forward makes empty ends the walk
            // before the period that starts at its instant (the hour after
            // it).
            if is_empty(&self.last)
                && current.label != self.last.label
                && current.start >= self.last.start
            {
                return None;
            }
            if current.label != self.last.label && current.start < self.last.start {
                let following = rule.following(schedule, &current);
                // A walk that does not move forward ends rather than loops.
                if following.start > current.start {
                    self.next = Some(following);
                }
            }
            if rule.fire_for(schedule, &current).is_some() {
                return Some(current);
            }
        }
    }
}

/// A label a spring-forward skips: a period that starts where it ends.
pub(crate) fn is_empty(period: &Period) -> bool {
    period.start >= period.end
}
