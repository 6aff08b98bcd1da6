//! The driver's regular scan, beside the timer: which jobs are paused,
//! which periods waiting for upstream periods may go, which claims to take
//! over (expired, released, retryable), and which succeeded periods an
//! upstream rerun made stale.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::time::Instant;

use super::{Event, Service};
use crate::config::Job;
use crate::config::after::OnRerun;
use crate::engine::due::Due;
use crate::error::Error;
use crate::store::Reclaimable;

/// How many claims one scan takes over at most.
const SCAN_LIMIT: u32 = 500;

/// How often a scan looks at every period waiting for upstream periods,
/// not only at those the database woke.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// How far back from its last look a scan looks for upstream successes
/// that make periods stale.
const RERUN_MARGIN: TimeDelta = TimeDelta::minutes(1);

/// What one scan read from the database.
pub(super) struct Scanned {
    paused: Result<Vec<String>, Error>,
    found: Result<Vec<Reclaimable>, Error>,
    /// Succeeded periods reopened because a period they needed succeeded
    /// again (`on_upstream_rerun = "rerun"`).
    reopened: Result<(crate::engine::rerun::Reopened, bool), Error>,
    /// Where the scan's look for upstream successes began.
    reruns_since: DateTime<Utc>,
    /// Every waiting period was to go to the gate and could not be read:
    /// the next scan tries again.
    regate_again: bool,
}

impl Service {
    /// The regular scan: pauses, waiting periods, and claims to take over.
    /// Starts the regular scan beside the timer (never in front of it: a
    /// slow or stalled database must not delay fires); its findings come
    /// back as [`Event::Scanned`]. One scan at a time.
    pub(super) fn scan(&mut self) {
        if self.scanning {
            return;
        }
        self.scanning = true;
        self.scan_now = false;
        let store = self.engine.store().clone();
        let names: Vec<String> = self.jobs.iter().map(|j| j.name.to_string()).collect();
        let events = self.events.0.clone();
        let rerun: Vec<Arc<Job>> = self
            .jobs
            .iter()
            .filter(|job| job.after.on_rerun == OnRerun::Rerun && job.after.any())
            .cloned()
            .collect();
        let now = self.clock.now();
        let window = TimeDelta::from_std(self.settings.catch_up).unwrap_or_default();
        let since = self.reruns_since.unwrap_or(now - window);
        if !rerun.is_empty() {
            // Looked at again from a minute back: the database's clock
            // records successes, this host's counts scans.
            self.reruns_since = Some(now - RERUN_MARGIN);
        }
        // Every waiting period is looked at once a minute, a safety net
        // beside the rows the database woke.
        let sweep = self.swept.is_none_or(|at| at.elapsed() >= SWEEP_EVERY);
        if sweep {
            self.swept = Some(Instant::now());
        }
        let regate = std::mem::take(&mut self.regate);
        tokio::spawn(async move {
            let paused = store.paused_jobs().await;
            let mut found = store.reclaimable(&names, SCAN_LIMIT, sweep).await;
            let mut regate_again = regate && found.is_err();
            if regate && let Ok(found) = &mut found {
                match store.waiting_periods(&names, SCAN_LIMIT).await {
                    Ok(waiting) => found.extend(waiting),
                    Err(e) => {
                        tracing::warn!("scan: cannot read the waiting periods: {e}");
                        regate_again = true;
                    }
                }
            }
            let rerun: Vec<&Job> = rerun.iter().map(|job| &**job).collect();
            let reopened = crate::engine::rerun::reopen_stale(&store, &rerun, since, now).await;
            let scanned = Scanned {
                paused,
                found,
                reopened,
                reruns_since: since,
                regate_again,
            };
            let _ = events.send(Event::Scanned(Box::new(scanned)));
        });
    }

    /// What a scan found: pauses, waiting periods, and claims to take over.
    pub(super) fn scanned(&mut self, scanned: Scanned) {
        self.scanning = false;
        match scanned.paused {
            Ok(paused) => {
                let paused: HashSet<String> = paused.into_iter().collect();
                self.show_paused(&paused);
                self.follow_pauses(paused);
            }
            Err(e) => tracing::warn!("scan: cannot read paused jobs: {e}"),
        }
        let waiting: Vec<String> = self.waiting.keys().map(|name| name.to_string()).collect();
        for name in waiting {
            let slots = self
                .job(&name)
                .map_or(1, |job| job.policy.concurrency as usize);
            self.release_waiting(&name, slots);
        }
        let now = self.clock.now();
        match scanned.found {
            Ok(found) => {
                self.health.database_ok();
                tracing::debug!(claimable = found.len(), "scan");
                for r in found {
                    if let Some(job) = self.job(&r.job) {
                        let due = Due {
                            period: r.period,
                            fire: r.scheduled_at,
                            trigger: r.trigger,
                            shard: r.shard,
                        };
                        for due in Due::sharded(&job, due) {
                            self.bring_back(job.clone(), due, now);
                        }
                    }
                }
            }
            Err(e) => tracing::warn!("scan: cannot look for claims to take over: {e}"),
        }
        self.regate |= scanned.regate_again;
        match scanned.reopened {
            Ok((reopened, running)) => {
                // A period that needed those successes and still runs is
                // looked at again once it ends: the look starts where this
                // one did.
                if running {
                    self.reruns_since = Some(scanned.reruns_since);
                }
                for (name, due) in reopened {
                    if let Some(job) = self.job(&name) {
                        self.dispatch(job, due, now);
                    }
                }
            }
            Err(e) => {
                // Looked at again from the start of the window.
                self.reruns_since = None;
                tracing::warn!("scan: cannot look for periods an upstream rerun made stale: {e}");
            }
        }
    }
}
