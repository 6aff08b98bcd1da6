//! The backlog: fires waiting for one of this process's `max_running`
//! slots, in the order they take one. Periods that come back to be asked
//! for again (released from waiting for their job's slot, or kept
//! undecided by another claim of their job) queue ahead of every fire, in
//! fire order among themselves: each was owed before the fires queued
//! behind it. The fires go by when they are needed, the soonest first: a
//! fire is needed by its job's next fire, when the period is overtaken by
//! the next, or halfway through its catch-up window if that comes sooner. An
//! every-minute job's fire does not wait behind 100,000 hourly and daily
//! jobs' catch-ups at start-up; a fire past its next one but still in its
//! window (not dropped) does not keep an infrequent job's fire waiting
//! until it is dropped: that goes first from halfway through its window.
//! A job's own periods still go in fire order, as when they are needed
//! follows their fires.

use std::cmp::{Ordering, Reverse};
use std::collections::{BinaryHeap, VecDeque};
use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};

use crate::config::Job;
use crate::engine::due::Due;

/// A fire waiting for a `max_running` slot.
pub(super) type Queued = (Arc<Job>, Due);

pub(super) struct Backlog {
    /// Periods queued ahead of the fires, in fire order.
    again: VecDeque<Queued>,
    /// The fires, the one needed soonest on top.
    fires: BinaryHeap<Reverse<Fire>>,
    /// Fires queued so far: those needed by one instant, of one fire
    /// (a burst's, a period's shards) go in the order they came.
    queued: u64,
    /// Half the catch-up window: no fire is needed by later after it.
    halfway: TimeDelta,
}

/// A queued fire and the order it goes in.
struct Fire {
    needed_by: DateTime<Utc>,
    queued: u64,
    period: Queued,
}

impl Fire {
    fn order(&self) -> (DateTime<Utc>, DateTime<Utc>, u64) {
        (self.needed_by, self.period.1.fire, self.queued)
    }
}

impl PartialEq for Fire {
    fn eq(&self, other: &Fire) -> bool {
        self.order() == other.order()
    }
}

impl Eq for Fire {}

impl PartialOrd for Fire {
    fn partial_cmp(&self, other: &Fire) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for Fire {
    fn cmp(&self, other: &Fire) -> Ordering {
        self.order().cmp(&other.order())
    }
}

/// When `due` of `job` is needed by: the job's next fire after it (when
/// its period is overtaken), or `halfway` through the catch-up window if
/// that comes sooner (with the window's end instead, the fires of an
/// every-second job that had passed their next fires went ahead of an
/// every-minute job's until it was dropped: adversarial review). It never
/// comes after a later fire's of the same job, so a job's periods go in
/// fire order.
fn needed_by(job: &Job, due: &Due, halfway: TimeDelta) -> DateTime<Utc> {
    let end = due.fire.checked_add_signed(halfway);
    let end = end.unwrap_or(DateTime::<Utc>::MAX_UTC);
    job.timing()
        .next(due.fire)
        .map_or(end, |next| next.at.min(end))
}

/// Half the catch-up window `window`.
fn halfway(window: std::time::Duration) -> TimeDelta {
    TimeDelta::from_std(window / 2).unwrap_or(TimeDelta::MAX)
}

impl Backlog {
    /// An empty backlog for the catch-up window `window`.
    pub(super) fn new(window: std::time::Duration) -> Backlog {
        Backlog {
            again: VecDeque::new(),
            fires: BinaryHeap::new(),
            queued: 0,
            halfway: halfway(window),
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.again.is_empty() && self.fires.is_empty()
    }

    /// What goes next.
    pub(super) fn front(&self) -> Option<&Queued> {
        self.again
            .front()
            .or_else(|| self.fires.peek().map(|Reverse(fire)| &fire.period))
    }

    /// Everything queued, in no order.
    pub(super) fn iter(&self) -> impl Iterator<Item = &Queued> {
        let fires = self.fires.iter().map(|Reverse(fire)| &fire.period);
        self.again.iter().chain(fires)
    }

    pub(super) fn pop_front(&mut self) -> Option<Queued> {
        let front = match self.again.pop_front() {
            Some(again) => Some(again),
            None => self.fires.pop().map(|Reverse(fire)| fire.period),
        };
        if self.is_empty() {
            // A burst's backlog (10,000 fires) is not kept for the next.
            self.again = VecDeque::new();
            self.fires = BinaryHeap::new();
        }
        front
    }

    /// Whether `due` of job `job` is queued ahead of the fires.
    pub(super) fn holds_ahead(&self, job: &str, due: &Due) -> bool {
        self.again.iter().any(|(queued, ahead)| {
            *queued.name == *job
                && ahead.fire == due.fire
                && ahead.shard == due.shard
                && ahead.period.label == due.period.label
        })
    }

    /// Queues `queued` ahead of every fire, behind what is queued ahead
    /// with an older or the same fire.
    pub(super) fn push_ahead(&mut self, queued: Queued) {
        let fire = queued.1.fire;
        let at = self.again.partition_point(|(_, due)| due.fire <= fire);
        self.again.insert(at, queued);
    }

    /// Queues `fires` by when they are needed.
    pub(super) fn push_fires(&mut self, fires: Vec<Queued>) {
        let (halfway, first) = (self.halfway, self.queued);
        let count = fires.len() as u64;
        let fires = fires.into_iter().zip(first..).map(|(period, queued)| {
            let needed_by = needed_by(&period.0, &period.1, halfway);
            Reverse(Fire {
                needed_by,
                queued,
                period,
            })
        });
        if self.fires.is_empty() {
            self.fires = BinaryHeap::from(fires.collect::<Vec<_>>());
        } else {
            self.fires.extend(fires);
        }
        self.queued = first + count;
    }

    /// Keeps what `keep` says, in order; it may change a period's job (to
    /// the job as reloaded, of the same timing: see [`Backlog::rekey`]).
    pub(super) fn retain_mut(&mut self, mut keep: impl FnMut(&mut Queued) -> bool) {
        self.again.retain_mut(&mut keep);
        let mut fires = std::mem::take(&mut self.fires).into_vec();
        fires.retain_mut(|Reverse(fire)| keep(&mut fire.period));
        self.fires = BinaryHeap::from(fires);
    }

    /// Orders the fires by when they are needed under their jobs' timings as
    /// they are now and the catch-up window `window` (a reload may have
    /// changed both), keeping the order they came in among equals.
    pub(super) fn rekey(&mut self, window: std::time::Duration) {
        self.halfway = halfway(window);
        let mut fires = std::mem::take(&mut self.fires).into_vec();
        for Reverse(fire) in &mut fires {
            fire.needed_by = needed_by(&fire.period.0, &fire.period.1, self.halfway);
        }
        self.fires = BinaryHeap::from(fires);
    }

    pub(super) fn clear(&mut self) {
        self.again = VecDeque::new();
        self.fires = BinaryHeap::new();
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use std::time::Duration;

    const DAY: Duration = Duration::from_secs(24 * 3600);

    /// Jobs `j` (every second), `m` and `n` (every minute), `h` (hourly)
    /// and `d` (daily).
    fn jobs() -> Vec<Arc<Job>> {
        let job = |name: &str, schedule: &str| {
            format!("[[job]]\nname = \"{name}\"\nschedule = \"{schedule}\"\ncommand = [\"true\"]\n")
        };
        let text = [
            job("j", "* * * * * *"),
            job("m", "* * * * *"),
            job("h", "0 * * * *"),
            job("d", "0 0 * * *"),
            job("n", "* * * * *"),
        ]
        .join("\n");
        let path = std::path::Path::new("jobs.toml");
        Config::parse(path, &text, &|_| None)
            .expect("valid jobs")
            .jobs
    }

    /// An instant `s` seconds after a midnight.
    fn at(s: i64) -> DateTime<Utc> {
        DateTime::from_timestamp(1_799_971_200 + s, 0).expect("an instant")
    }

    fn queued(job: &Arc<Job>, fire: DateTime<Utc>) -> Queued {
        let due = crate::engine::due::due(job, fire, fire, true)
            .pop()
            .expect("a fire");
        (job.clone(), due)
    }

    /// Each queued period, as `job@seconds`, in the order they go.
    fn order(mut backlog: Backlog) -> Vec<String> {
        let mut order = Vec::new();
        while let Some((job, due)) = backlog.pop_front() {
            order.push(format!("{}@{}", job.name, (due.fire - at(0)).num_seconds()));
        }
        order
    }

    /// Periods queued ahead one at a time (each release of a job's waiting
    /// period, a later one newer) go in fire order, not last first, and
    /// ahead of the fires queued before them (adversarial review: pushed
    /// to the front one by one, the newest was asked for first, again and
    /// again).
    #[test]
    fn what_is_queued_ahead_goes_in_fire_order_ahead_of_the_fires() {
        let jobs = jobs();
        let j = &jobs[0];
        let mut backlog = Backlog::new(DAY);
        backlog.push_fires(vec![queued(j, at(9))]);
        backlog.push_ahead(queued(j, at(2)));
        backlog.push_ahead(queued(j, at(3)));
        backlog.push_ahead(queued(j, at(1)));
        backlog.push_ahead(queued(j, at(4)));
        // A retain keeps what is left ahead, ahead.
        backlog.retain_mut(|q| q.1.fire != at(2));
        backlog.push_ahead(queued(j, at(5)));
        assert_eq!(order(backlog), ["j@1", "j@3", "j@4", "j@5", "j@9"]);
    }

    /// At start-up 100,000 hourly and daily jobs owed their latest fires,
    /// and an every-minute job's fire waited 10 to 20 s behind them, oldest
    /// first. Now the fire whose job fires next soonest goes first: the
    /// every-minute job's, then the hourly's, then the daily's.
    #[test]
    fn a_fire_goes_ahead_of_the_catch_ups_of_jobs_that_fire_later() {
        let jobs = jobs();
        let (j, m, h, d) = (&jobs[0], &jobs[1], &jobs[2], &jobs[3]);
        let mut backlog = Backlog::new(DAY);
        // At 01:00:30, what each job owes on its first sighting ...
        backlog.push_fires(vec![
            queued(d, at(0)),
            queued(h, at(3600)),
            queued(m, at(3600)),
            queued(j, at(3630)),
        ]);
        // ... and a second later, the every-second job's next fire.
        backlog.push_fires(vec![queued(j, at(3631))]);
        assert_eq!(
            order(backlog),
            ["j@3630", "j@3631", "m@3600", "h@3600", "d@0"]
        );
    }

    /// With a catch-up window of 5 s, an every-minute job's fire goes
    /// ahead of an every-second job's fires from halfway through it on,
    /// whether or not they have passed their next fires. With the window's
    /// end instead, it went behind every one of them still in
    /// their windows, and under a steady load it was dropped each minute
    /// while the every-second job's fires ran (adversarial review).
    #[test]
    fn a_fire_halfway_through_its_window_goes_ahead_of_more_frequent_jobs_fires() {
        let jobs = jobs();
        let (j, m) = (&jobs[0], &jobs[1]);
        let mut backlog = Backlog::new(Duration::from_secs(5));
        backlog.push_fires((0..5).map(|s| queued(j, at(s))).collect());
        backlog.push_fires(vec![queued(m, at(0))]);
        assert_eq!(order(backlog), ["j@0", "j@1", "m@0", "j@2", "j@3", "j@4"]);
    }

    /// A job's own periods go in fire order, whatever came first: its
    /// needed-by instant follows its fire, cut off by the catch-up window
    /// or not. Fires needed by one instant, of one fire, go in the order
    /// they came.
    #[test]
    fn a_jobs_periods_go_in_fire_order_and_equals_in_the_order_they_came() {
        let jobs = jobs();
        let (m, h, d) = (&jobs[1], &jobs[2], &jobs[3]);
        // A window of 30 minutes cuts off when the hourly and daily are needed.
        let mut backlog = Backlog::new(Duration::from_secs(1800));
        backlog.push_fires(vec![queued(d, at(86400)), queued(h, at(7200))]);
        backlog.push_fires(vec![queued(h, at(3600)), queued(d, at(0))]);
        backlog.push_fires(vec![queued(m, at(7200))]);
        assert_eq!(
            order(backlog),
            ["d@0", "h@3600", "m@7200", "h@7200", "d@86400"]
        );
        let n = &jobs[4];
        let mut same = Backlog::new(DAY);
        same.push_fires(vec![queued(n, at(60)), queued(m, at(60))]);
        same.push_fires(vec![queued(m, at(120)), queued(n, at(120))]);
        assert_eq!(order(same), ["n@60", "m@60", "m@120", "n@120"]);
    }
}
