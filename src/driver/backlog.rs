//! The backlog: fires waiting for one of this process's `max_running`
//! slots, in the order they take one. Periods that come back to be asked
//! for again (released from waiting for their job's slot, or kept
//! undecided by another claim of their job) queue ahead of every fire, in
//! fire order among themselves: each was owed before the fires queued
//! behind it. The fires go by deadline, the soonest first: a fire's
//! deadline is its job's next fire, when the period is overtaken by the
//! next, or the end of its catch-up window if that comes sooner. An
//! every-minute job's fire does not wait behind 100,000 hourly and daily
//! jobs' catch-ups at start-up; a job's own periods still go in fire
//! order, as its deadlines follow its fires.

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
    /// The fires, the soonest deadline on top.
    fires: BinaryHeap<Reverse<Fire>>,
    /// Fires queued so far: those with one deadline and fire instant
    /// (a burst's, a period's shards) go in the order they came.
    queued: u64,
    /// The catch-up window: no fire's deadline is later than its end.
    window: TimeDelta,
}

/// A queued fire and the order it goes in.
struct Fire {
    deadline: DateTime<Utc>,
    queued: u64,
    period: Queued,
}

impl Fire {
    fn order(&self) -> (DateTime<Utc>, DateTime<Utc>, u64) {
        (self.deadline, self.period.1.fire, self.queued)
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

/// When `due` of `job` is overtaken: the job's next fire after it, or the
/// end of the catch-up window `window` if that comes sooner. It never
/// comes before a later fire's of the same job, so a job's periods go in
/// fire order.
fn deadline(job: &Job, due: &Due, window: TimeDelta) -> DateTime<Utc> {
    let end = due.fire.checked_add_signed(window);
    let end = end.unwrap_or(DateTime::<Utc>::MAX_UTC);
    job.timing()
        .next(due.fire)
        .map_or(end, |next| next.at.min(end))
}

impl Backlog {
    /// An empty backlog for the catch-up window `window`.
    pub(super) fn new(window: std::time::Duration) -> Backlog {
        Backlog {
            again: VecDeque::new(),
            fires: BinaryHeap::new(),
            queued: 0,
            window: TimeDelta::from_std(window).unwrap_or(TimeDelta::MAX),
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

    /// Queues `queued` ahead of every fire, behind what is queued ahead
    /// with an older or the same fire.
    pub(super) fn push_ahead(&mut self, queued: Queued) {
        let fire = queued.1.fire;
        let at = self.again.partition_point(|(_, due)| due.fire <= fire);
        self.again.insert(at, queued);
    }

    /// Queues `fires` by their deadlines.
    pub(super) fn push_fires(&mut self, fires: Vec<Queued>) {
        let (window, first) = (self.window, self.queued);
        let count = fires.len() as u64;
        let fires = fires.into_iter().zip(first..).map(|(period, queued)| {
            let deadline = deadline(&period.0, &period.1, window);
            Reverse(Fire {
                deadline,
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

    /// Orders the fires by their deadlines under their jobs' timings as
    /// they are now and the catch-up window `window` (a reload may have
    /// changed both), keeping the order they came in among equals.
    pub(super) fn rekey(&mut self, window: std::time::Duration) {
        self.window = TimeDelta::from_std(window).unwrap_or(TimeDelta::MAX);
        let mut fires = std::mem::take(&mut self.fires).into_vec();
        for Reverse(fire) in &mut fires {
            fire.deadline = deadline(&fire.period.0, &fire.period.1, self.window);
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

    /// A job's own periods go in fire order, whatever came first: its
    /// deadline follows its fire, cut off by the catch-up window or not.
    /// Fires with the same deadline and instant go in the order they came.
    #[test]
    fn a_jobs_periods_go_in_fire_order_and_equals_in_the_order_they_came() {
        let jobs = jobs();
        let (m, h, d) = (&jobs[1], &jobs[2], &jobs[3]);
        // A window of 30 minutes cuts off the hourly and daily deadlines.
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
