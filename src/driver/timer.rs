//! The driver's timer: every job's next fire in a heap, popped when due.
//! Pure: it takes `now` and never sleeps, so it is tested one step at a time.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::config::Job;
use crate::engine::due::Due;

/// The next fire of every job, earliest first.
#[derive(Default)]
pub(super) struct Timer {
    heap: BinaryHeap<Reverse<Next>>,
}

/// When a job's next fire is due, the job's index, and the instant its
/// fires were last taken up to: 28 bytes, 2.7 MiB for 100,000 jobs.
type Next = (DateTime<Utc>, u32, DateTime<Utc>);

impl Timer {
    /// A timer with each job's first fire after `now`.
    pub(super) fn new(jobs: &[Arc<Job>], now: DateTime<Utc>) -> Timer {
        Timer::resumed(jobs, |_| None, now)
    }

    /// A timer for jobs.toml read again: a job it had before goes on from
    /// where `known` says (where its fires were taken up to, or earlier
    /// if the reload changed them: [`crate::fires::resume_from`]), so its
    /// fires since then are due; a new one starts after `now`.
    pub(super) fn resumed(
        jobs: &[Arc<Job>],
        known: impl Fn(&Job) -> Option<DateTime<Utc>>,
        now: DateTime<Utc>,
    ) -> Timer {
        // Sized once: grown by doubling, a third of it stayed unused.
        let mut nexts = Vec::with_capacity(jobs.len());
        nexts.extend(jobs.iter().zip(0..).filter_map(|(job, i)| {
            let from = known(job).unwrap_or(now);
            job.timing()
                .next(from)
                .map(|fire| Reverse((fire.at, i, from)))
        }));
        Timer {
            heap: BinaryHeap::from(nexts),
        }
    }

    /// Each job's next fire, by the job's index, in no order.
    pub(super) fn nexts(&self) -> impl Iterator<Item = (usize, DateTime<Utc>)> + '_ {
        self.heap
            .iter()
            .map(|Reverse((at, i, _))| (*i as usize, *at))
    }

    pub(super) fn next(&self) -> Option<DateTime<Utc>> {
        self.heap.peek().map(|Reverse((at, _, _))| *at)
    }

    /// Every fire at or before `now`, as (job, fire), added to `fired`
    /// (a burst's 10,000 go straight where they wait, not through a list of
    /// their own). A job whose fires were slept through (a suspend, a clock
    /// step) gets its latest as `schedule` and, with `missed = "all"`, the
    /// older ones as `catch-up`; fires moved to the same instant (a
    /// weekend's, moved to Monday) are all `schedule`. Each job's fires are
    /// taken up from where the last ones were.
    pub(super) fn pop_due(
        &mut self,
        jobs: &[Arc<Job>],
        now: DateTime<Utc>,
        fired: &mut Vec<(Arc<Job>, Due)>,
    ) {
        while let Some(Reverse((at, i, from))) = self.heap.peek().copied() {
            if at > now {
                break;
            }
            self.heap.pop();
            let job = &jobs[i as usize];
            let timing = job.timing();
            let fires = timing.between(from, now);
            if let Some(next) = timing.next(now) {
                self.heap.push(Reverse((next.at, i, now)));
                metrics::gauge!("scheduler_next_fire_timestamp_seconds", "job" => job.name.clone())
                    .set(next.at.timestamp_millis() as f64 / 1000.0);
            }
            let due = crate::engine::due::of_fires(job, &fires);
            fired.extend(due.into_iter().map(|d| (job.clone(), d)));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::Config;

    fn jobs(toml: &str) -> Vec<Arc<Job>> {
        let config = Config::parse(Path::new("jobs.toml"), toml, &|_| None).unwrap();
        config.jobs
    }

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).unwrap().to_utc()
    }

    fn popped(timer: &mut Timer, jobs: &[Arc<Job>], now: &str) -> Vec<(String, &'static str)> {
        let mut fired = Vec::new();
        timer.pop_due(jobs, at(now), &mut fired);
        fired
            .into_iter()
            .map(|(job, due)| {
                (
                    crate::period::PeriodKey::new(&job.name, &due.period.label).to_string(),
                    due.trigger.as_str(),
                )
            })
            .collect()
    }

    const TWO_JOBS: &str = "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\nperiod = \"minute\"\ncommand = [\"true\"]\n\
        [[job]]\nname = \"b\"\nschedule = \"*/2 * * * *\"\nperiod = \"minute\"\ncommand = [\"true\"]\n";

    #[test]
    fn nothing_is_due_before_the_earliest_fire_and_each_fire_is_popped_once() {
        let jobs = jobs(TWO_JOBS);
        let mut timer = Timer::new(&jobs, at("2026-07-15T10:00:30Z"));
        assert_eq!(timer.next(), Some(at("2026-07-15T10:01:00Z")));
        assert!(popped(&mut timer, &jobs, "2026-07-15T10:00:59Z").is_empty());
        assert_eq!(
            popped(&mut timer, &jobs, "2026-07-15T10:01:00Z"),
            [("a:2026-07-15T10:01".into(), "schedule")]
        );
        assert!(popped(&mut timer, &jobs, "2026-07-15T10:01:00Z").is_empty());
        let mut both = popped(&mut timer, &jobs, "2026-07-15T10:02:00Z");
        both.sort();
        assert_eq!(
            both,
            [
                ("a:2026-07-15T10:02".into(), "schedule"),
                ("b:2026-07-15T10:02".into(), "schedule")
            ]
        );
    }

    #[test]
    fn fires_slept_through_come_back_as_catch_up_then_the_latest_as_schedule() {
        let jobs = jobs(TWO_JOBS);
        let mut timer = Timer::new(&jobs, at("2026-07-15T10:00:30Z"));
        let a: Vec<_> = popped(&mut timer, &jobs, "2026-07-15T10:03:10Z")
            .into_iter()
            .filter(|(key, _)| key.starts_with("a:"))
            .collect();
        assert_eq!(
            a,
            [
                ("a:2026-07-15T10:01".into(), "catch-up"),
                ("a:2026-07-15T10:02".into(), "catch-up"),
                ("a:2026-07-15T10:03".into(), "schedule"),
            ]
        );
        assert_eq!(timer.next(), Some(at("2026-07-15T10:04:00Z")));
    }

    #[test]
    fn with_missed_skip_only_the_latest_slept_through_fire_runs() {
        let jobs = jobs(
            "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\nmissed = \"skip\"\ncommand = [\"true\"]\n",
        );
        let mut timer = Timer::new(&jobs, at("2026-07-15T10:00:30Z"));
        assert_eq!(
            popped(&mut timer, &jobs, "2026-07-15T10:05:00Z"),
            [("a:2026-07-15T10:05:00Z".into(), "schedule")]
        );
    }

    #[test]
    fn a_timer_resumed_after_a_reload_owes_the_known_jobs_their_fires_and_the_new_ones_none() {
        let jobs = jobs(TWO_JOBS);
        let mut timer = Timer::resumed(
            &jobs,
            |job| (&*job.name == "a").then(|| at("2026-07-15T10:00:30Z")),
            at("2026-07-15T10:03:30Z"),
        );
        let mut due = popped(&mut timer, &jobs, "2026-07-15T10:03:30Z");
        due.sort();
        assert_eq!(
            due,
            [
                ("a:2026-07-15T10:01".into(), "catch-up"),
                ("a:2026-07-15T10:02".into(), "catch-up"),
                ("a:2026-07-15T10:03".into(), "schedule"),
            ]
        );
        assert_eq!(timer.next(), Some(at("2026-07-15T10:04:00Z")));
    }

    #[test]
    fn a_stall_inside_one_period_dispatches_that_period_once() {
        let jobs = jobs(
            "[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\nperiod = \"hour\"\ncommand = [\"true\"]\n",
        );
        let mut timer = Timer::new(&jobs, at("2026-07-15T10:00:30Z"));
        assert_eq!(
            popped(&mut timer, &jobs, "2026-07-15T10:04:10Z"),
            [("a:2026-07-15T10".into(), "schedule")]
        );
    }
}
