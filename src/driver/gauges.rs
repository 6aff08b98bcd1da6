//! The driver's gauges: each job's next fire, and, counted each minute
//! beside the loop (`--listen`), its overdue, late, retries-exhausted,
//! waiting and ready periods; a removed job's are set to zero.

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use super::Service;
use crate::config::Job;

/// How often the overdue and retries-exhausted gauges are counted.
pub(super) const GAUGES_EVERY: Duration = Duration::from_secs(60);

impl Service {
    /// Sets every job's next-fire gauge (the timer moves each on as it
    /// fires).
    pub(super) fn publish_next_fires(&self) {
        let now = self.clock.now();
        for job in &self.jobs {
            // At zero from the start: `increase()` misses a series' first
            // sample.
            metrics::counter!("scheduler_periods_dropped_total", "job" => job.name.clone())
                .increment(0);
            if let Some(next) = job.timing().next(now) {
                metrics::gauge!("scheduler_next_fire_timestamp_seconds", "job" => job.name.clone())
                    .set(next.at.timestamp_millis() as f64 / 1000.0);
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
                let on = f64::from(u8::from(paused.contains(&job.name)));
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
        tokio::spawn(async move {
            let (count, gauges) = &mut *held;
            let now = clock.now();
            let overdue = count.count(&store, &jobs, catch_up, now).await;
            let exhausted = store.exhausted().await;
            // Waiting and ready as `status` has them: the one rule over
            // the periods noted waiting, for the jobs with `after`.
            let mut waiting: HashMap<String, (usize, usize)> = HashMap::new();
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
                let open = |counts: &HashMap<String, usize>| match paused.contains(&job.name) {
                    true => 0,
                    false => counts.get(&job.name).copied().unwrap_or(0),
                };
                let of_job = gauges.of(job);
                of_job.overdue.set(open(&overdue) as f64);
                if let Some(gauge) = &of_job.late {
                    gauge.set(open(&late) as f64);
                }
                let spent = exhausted.get(&job.name).copied().unwrap_or(0);
                of_job.exhausted.set(spent as f64);
                if let Some((waiting_gauge, ready_gauge)) = &of_job.waiting {
                    let (w, r) = waiting.get(&job.name).copied().unwrap_or_default();
                    waiting_gauge.set(w as f64);
                    ready_gauge.set(r as f64);
                }
            }
        });
    }
}

/// Sets the gauges of a job that a reload removed to zero, so that no alert
/// goes on firing for it. The exporter cannot forget a series: they stay, at
/// zero, until the process restarts.
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

/// The gauges of each job the minute's count sets, registered once: a
/// labelled gauge looked up again each minute made a job name, a key and
/// a registry search for each of them, three times per job.
#[derive(Default)]
pub(super) struct JobGauges(HashMap<String, Gauges>);

/// One job's gauges.
struct Gauges {
    overdue: metrics::Gauge,
    /// For a job with a `deadline` only.
    late: Option<metrics::Gauge>,
    exhausted: metrics::Gauge,
    /// For a job with `after` only: its waiting and its ready periods.
    waiting: Option<(metrics::Gauge, metrics::Gauge)>,
}

impl JobGauges {
    /// The gauges of `job`; a reload that gives it a deadline adds its
    /// late gauge.
    fn of(&mut self, job: &Job) -> &Gauges {
        let gauges = self.0.entry(job.name.clone()).or_insert_with(|| Gauges {
            overdue: metrics::gauge!("scheduler_overdue_periods", "job" => job.name.clone()),
            late: None,
            waiting: None,
            exhausted: metrics::gauge!(
                "scheduler_retries_exhausted_periods",
                "job" => job.name.clone()
            ),
        });
        if job.deadline.is_some() && gauges.late.is_none() {
            gauges.late = Some(metrics::gauge!(
                "scheduler_late_periods",
                "job" => job.name.clone()
            ));
        }
        if job.after.any() && gauges.waiting.is_none() {
            gauges.waiting = Some((
                metrics::gauge!("scheduler_waiting_periods", "job" => job.name.clone()),
                metrics::gauge!("scheduler_ready_periods", "job" => job.name.clone()),
            ));
        }
        gauges
    }
}
