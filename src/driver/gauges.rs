//! The driver's gauges: each job's next fire, and, counted each minute
//! beside the loop (`--listen`), its overdue, late, retries-exhausted,
//! waiting and ready periods; a removed job's are set to zero.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use super::Service;
use crate::config::Job;

/// How often the overdue and retries-exhausted gauges are counted.
pub(super) const GAUGES_EVERY: Duration = Duration::from_secs(60);

impl Service {
    /// Sets every job's next-fire gauge, as the timer holds it (the timer
    /// moves each on as it fires): each fire is found once, not once more
    /// for the gauge (100,000 jobs' walks of their schedules at start-up).
    pub(super) fn publish_next_fires(&self) {
        for job in &self.jobs {
            // At zero from the start: `increase()` misses a series' first
            // sample.
            metrics::counter!("scheduler_periods_dropped_total", "job" => job.name.clone())
                .increment(0);
        }
        let now = self.clock.now();
        for (i, next) in self.timer.nexts() {
            let job = &self.jobs[i];
            // Due already (start-up took a while): the fire after it is
            // next once the loop wakes.
            let next = match next > now {
                true => Some(next),
                false => job.timing().next(now).map(|fire| fire.at),
            };
            if let Some(next) = next {
                metrics::gauge!("scheduler_next_fire_timestamp_seconds", "job" => job.name.clone())
                    .set(next.timestamp_millis() as f64 / 1000.0);
            }
        }
    }

    /// Sets the `scheduler_paused` gauges to what a scan read. Published
    /// when the paused jobs or the jobs change: a labelled gauge is a
    /// registry search, and a scan every few seconds of 10,000 jobs made
    /// 10,000 of them.
    pub(super) fn show_paused(&mut self, paused: &HashSet<String>) {
        if self.paused_shown.as_ref() != Some(paused) {
            for job in &self.jobs {
                let on = f64::from(u8::from(paused.contains(&*job.name)));
                metrics::gauge!("scheduler_paused", "job" => job.name.clone()).set(on);
            }
            self.paused_shown = Some(paused.clone());
        }
    }

    /// Counts overdue and retries-exhausted periods per job in a task of
    /// its own, never in front of a fire; skipped while the count before
    /// is still running.
    pub(super) fn publish_gauges(&self) {
        let Ok(mut held) = self.overdue.clone().try_lock_owned() else {
            return;
        };
        let jobs = self.jobs.clone();
        let paused: HashSet<String> = self.paused.keys().cloned().collect();
        let store = self.engine.store().clone();
        let catch_up = self.settings.catch_up;
        let clock = self.clock.clone();
        let trim = self.trim;
        tokio::spawn(async move {
            let (count, gauges) = &mut *held;
            let now = clock.now();
            let overdue = count.count(&store, &jobs, catch_up, now).await;
            let exhausted = store.exhausted().await;
            // Waiting and ready as `status` has them: the one rule over
            // the periods noted waiting, for the jobs with `after`.
            let mut waiting: HashMap<Arc<str>, (usize, usize)> = HashMap::new();
            for job in jobs.iter().filter(|job| job.after.any()) {
                match crate::engine::overview::waiting_and_ready(&store, job, now).await {
                    Ok((w, r)) => waiting.insert(job.name.clone(), (w.len(), r.len())),
                    Err(_) => return,
                };
            }
            let (Ok(overdue), Ok(exhausted)) = (overdue, exhausted) else {
                return;
            };
            let late = count.late(now);
            for job in &jobs {
                // A paused job skips its fires by design, as `status` has
                // it: none is overdue, none late.
                let open = |counts: &HashMap<Arc<str>, usize>| match paused.contains(&*job.name) {
                    true => 0,
                    false => counts.get(&*job.name).copied().unwrap_or(0),
                };
                let gauge = |name: &'static str| metrics::gauge!(name, "job" => job.name.clone());
                gauge("scheduler_overdue_periods").set(open(&overdue) as f64);
                let spent = exhausted.get(&*job.name).copied().unwrap_or(0);
                gauge("scheduler_retries_exhausted_periods").set(spent as f64);
                if gauges.late(job) {
                    gauge("scheduler_late_periods").set(open(&late) as f64);
                }
                if gauges.waiting(job) {
                    let (w, r) = waiting.get(&*job.name).copied().unwrap_or_default();
                    gauge("scheduler_waiting_periods").set(w as f64);
                    gauge("scheduler_ready_periods").set(r as f64);
                }
            }
            // The count read every job's periods, and freed them.
            if trim {
                super::release_free_memory();
            }
        });
    }
}

/// Sets the gauges of a job that a reload removed to zero, so that no alert
/// goes on firing for it. The series stay, at zero, until the process
/// restarts.
pub(super) fn retire_gauges(job: &str) {
    for gauge in [
        "scheduler_overdue_periods",
        "scheduler_late_periods",
        "scheduler_waiting_periods",
        "scheduler_ready_periods",
        "scheduler_retries_exhausted_periods",
        "scheduler_paused",
        "scheduler_next_fire_timestamp_seconds",
    ] {
        metrics::gauge!(gauge, "job" => job.to_owned()).set(0.0);
    }
}

/// The jobs that have a late gauge (they had a `deadline`), and those
/// that have waiting and ready gauges (they had `after`): a reload that
/// takes the setting away leaves the gauge, counted (at zero), rather than
/// at its last value for good. Every job's other gauges are looked up in
/// the recorder's table each minute, an index into a slot.
#[derive(Default)]
pub(super) struct JobGauges {
    late: HashSet<Arc<str>>,
    waiting: HashSet<Arc<str>>,
}

impl JobGauges {
    /// Whether `job` has a late gauge to set; one with a `deadline` gets it.
    fn late(&mut self, job: &Job) -> bool {
        if job.policy.deadline.is_some() && !self.late.contains(&*job.name) {
            self.late.insert(job.name.clone());
        }
        self.late.contains(&*job.name)
    }

    /// Whether `job` has waiting and ready gauges to set; one with `after`
    /// gets them.
    fn waiting(&mut self, job: &Job) -> bool {
        if job.after.any() && !self.waiting.contains(&*job.name) {
            self.waiting.insert(job.name.clone());
        }
        self.waiting.contains(&*job.name)
    }
}
