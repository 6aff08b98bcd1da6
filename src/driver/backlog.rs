//! The backlog: fires waiting for one of this process's `max_running`
//! slots, in the order they take one. Periods that come back to be asked
//! for again (released from waiting for their job's slot, or kept
//! undecided by another claim of their job) queue ahead of every fire, in
//! fire order among themselves: each was owed before the fires queued
//! behind it.

use std::collections::VecDeque;
use std::sync::Arc;

use crate::config::Job;
use crate::engine::due::Due;

/// A fire waiting for a `max_running` slot.
pub(super) type Queued = (Arc<Job>, Due);

#[derive(Default)]
pub(super) struct Backlog {
    queue: VecDeque<Queued>,
    /// How many at the front are queued ahead (in fire order).
    ahead: usize,
}

impl Backlog {
    pub(super) fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    pub(super) fn front(&self) -> Option<&Queued> {
        self.queue.front()
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Queued> {
        self.queue.iter()
    }

    /// Whether the front one was queued ahead.
    pub(super) fn front_is_ahead(&self) -> bool {
        self.ahead > 0
    }

    pub(super) fn pop_front(&mut self) -> Option<Queued> {
        let front = self.queue.pop_front()?;
        self.ahead = self.ahead.saturating_sub(1);
        if self.queue.is_empty() {
            // A burst's backlog (10,000 fires) is not kept for the next.
            self.queue = VecDeque::new();
        }
        Some(front)
    }

    /// Puts back at the front what was just taken from it (`ahead`: it
    /// was queued ahead).
    pub(super) fn put_back(&mut self, queued: Queued, ahead: bool) {
        self.queue.push_front(queued);
        self.ahead += usize::from(ahead);
    }

    /// Queues `queued` ahead of every fire, behind what is queued ahead
    /// with an older or the same fire.
    pub(super) fn push_ahead(&mut self, queued: Queued) {
        self.ahead = self.ahead.min(self.queue.len());
        let fire = queued.1.fire;
        let at = (0..self.ahead)
            .find(|i| self.queue[*i].1.fire > fire)
            .unwrap_or(self.ahead);
        self.queue.insert(at, queued);
        self.ahead += 1;
    }

    /// Queues `fires` behind everything. Into an empty backlog (the common
    /// case: a burst) the buffer itself moves, not its 10,000 fires one by
    /// one into a second buffer of the same size.
    pub(super) fn push_back_all(&mut self, fires: Vec<Queued>) {
        if self.queue.is_empty() {
            self.queue = VecDeque::from(fires);
        } else {
            self.queue.extend(fires);
        }
    }

    /// Keeps what `keep` says, in order, and what is left of those queued
    /// ahead still ahead.
    pub(super) fn retain_mut(&mut self, mut keep: impl FnMut(&mut Queued) -> bool) {
        let (mut at, mut ahead) = (0, 0);
        self.queue.retain_mut(|queued| {
            let kept = keep(queued);
            if kept && at < self.ahead {
                ahead += 1;
            }
            at += 1;
            kept
        });
        self.ahead = ahead;
    }

    pub(super) fn clear(&mut self) {
        self.queue = VecDeque::new();
        self.ahead = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use chrono::{DateTime, Utc};

    fn queued(job: &Arc<Job>, fire: DateTime<Utc>) -> Queued {
        let due = crate::engine::due::due(job, fire, fire, true)
            .pop()
            .expect("a fire");
        (job.clone(), due)
    }

    /// Periods queued ahead one at a time (each release of a job's waiting
    /// period, a later one newer) go in fire order, not last first, and
    /// ahead of the fires queued before them (adversarial review: pushed
    /// to the front one by one, the newest was asked for first, again and
    /// again).
    #[test]
    fn what_is_queued_ahead_goes_in_fire_order_ahead_of_the_fires() {
        let text = "[[job]]\nname = \"j\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\n";
        let config =
            Config::parse(std::path::Path::new("jobs.toml"), text, &|_| None).expect("a valid job");
        let job = &config.jobs[0];
        let at = |s: i64| DateTime::from_timestamp(1_800_000_000 + s, 0).expect("an instant");
        let mut backlog = Backlog::default();
        backlog.push_back_all(vec![queued(job, at(9))]);
        backlog.push_ahead(queued(job, at(2)));
        backlog.push_ahead(queued(job, at(3)));
        backlog.push_ahead(queued(job, at(1)));
        let fires = |b: &Backlog| -> Vec<DateTime<Utc>> { b.iter().map(|q| q.1.fire).collect() };
        assert_eq!(fires(&backlog), [at(1), at(2), at(3), at(9)]);
        // Taken and put back, the front is still ahead of the fires.
        let ahead = backlog.front_is_ahead();
        let front = backlog.pop_front().expect("a front");
        backlog.put_back(front, ahead);
        backlog.push_ahead(queued(job, at(4)));
        assert_eq!(fires(&backlog), [at(1), at(2), at(3), at(4), at(9)]);
        // A retain keeps what is left ahead, ahead.
        backlog.retain_mut(|q| q.1.fire != at(2));
        backlog.push_ahead(queued(job, at(5)));
        assert_eq!(fires(&backlog), [at(1), at(3), at(4), at(5), at(9)]);
    }
}
