//! The driver's slots: `max_running` slots of this process, each held by a
//! run (or an `sql` group) from its claim to its end, and the periods that
//! wait for one (the backlog) or for a slot of their job's `concurrency`
//! (`waiting`). What waited past the catch-up window is dropped.

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::sync::{mpsc, watch};

use super::{Event, Service};
use crate::config::Job;
use crate::engine::due::Due;
use crate::engine::{Ask, CLAIM_BATCH, Engine, Queue, Report, SQL_GROUP, Status, Taken};
use crate::store::{Claim, Trigger};

/// How long a claim kept undecided by another claim of the same jobs waits
/// before it is asked for again: long enough for that claim, a statement of
/// a few milliseconds, to commit, so that the keys are answered without a
/// lock then.
const CONTENDED_AGAIN: Duration = Duration::from_millis(100);

impl Service {
    /// Queues `due` of job `job` to wait for a concurrency slot (or the
    /// database), in fire order behind the job's other waiting periods.
    pub(super) fn wait(&mut self, job: String, due: Due) {
        let key = (due.fire, due.key(&job).to_string());
        self.waiting.entry(job).or_default().insert(key, due);
    }

    /// Dispatches the `n` oldest waiting periods of job `name`.
    /// What waited past the catch-up window is dropped on the way and
    /// takes no slot.
    pub(super) fn release_waiting(&mut self, name: &str, n: usize) {
        let now = self.clock.now();
        let mut released = 0;
        while released < n {
            let Some(queue) = self.waiting.get_mut(name) else {
                return;
            };
            let oldest = queue.pop_first();
            if queue.is_empty() {
                self.waiting.remove(name);
            }
            let Some((_, due)) = oldest else {
                return;
            };
            let Some(job) = self.job(name) else {
                continue;
            };
            if !self.too_old(&job, &due, now) {
                self.dispatch(job, due, now);
                released += 1;
            }
        }
    }

    /// A run (or an `sql` group) ended: its `max_running` slot is free.
    pub(super) fn slot_freed(&mut self) {
        debug_assert!(
            self.running > 0,
            "a max_running slot freed that no run held"
        );
        self.running -= 1;
    }

    /// Queues `due` for the next flush, if [`Service::admits`] it.
    pub(super) fn dispatch(&mut self, job: Arc<Job>, due: Due, now: DateTime<Utc>) {
        if self.admits(&job, &due, now) {
            self.pending.push((job, due));
        }
    }

    /// Whether a fire is dispatched: not while shutting down, not for a
    /// paused job, not past the catch-up window.
    pub(super) fn admits(&self, job: &Job, due: &Due, now: DateTime<Utc>) -> bool {
        !*self.shutdown.borrow()
            && !self.paused.contains_key(&job.name)
            && !self.too_old(job, due, now)
    }

    /// Moves what was dispatched since the last flush behind the backlog
    /// (older fires go first). Into an empty backlog (the common case: a
    /// burst) the buffer itself moves, not its 10,000 fires one by one into
    /// a second buffer of the same size.
    pub(super) fn take_pending(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        if self.backlog.is_empty() {
            self.backlog = VecDeque::from(pending);
        } else {
            self.backlog.extend(pending);
        }
    }

    /// Whether `due` waited past the catch-up window (for a free slot):
    /// then it is dropped, logged and counted. A recovery never is, nor a
    /// period that waited for its upstream periods (however long that
    /// took, it is still to run).
    pub(super) fn too_old(&self, job: &Job, due: &Due, now: DateTime<Utc>) -> bool {
        let window = TimeDelta::from_std(self.settings.catch_up).unwrap_or_default();
        let kept = matches!(due.trigger, Trigger::Recovery | Trigger::Upstream);
        let old = !kept && due.fire < now - window;
        if old {
            tracing::warn!(
                job = job.name,
                period = due.period.label,
                "dropped: older than the catch-up window"
            );
            metrics::counter!("scheduler_periods_dropped_total", "job" => job.name.clone())
                .increment(1);
        }
        old
    }

    /// Hands what was dispatched since the last call to the engine, as one
    /// batch of claims, as far as `max_running` allows: a run of a
    /// `command` or `http` job takes a slot, a group of up to [`SQL_GROUP`]
    /// `sql` periods one slot together. The rest waits in the backlog.
    pub(super) fn flush(&mut self) {
        self.take_pending();
        if self.running >= self.settings.max_running {
            self.drop_too_old_backlog();
            return;
        }
        if self.backlog.is_empty() {
            return;
        }
        let units = self.units_that_fit();
        if units.is_empty() {
            return;
        }
        debug_assert!(
            self.running + units.len() <= self.settings.max_running,
            "more runs than max_running slots"
        );
        self.running += units.len();
        for batch in self.batches(units) {
            tokio::spawn(batch.go());
        }
    }

    /// With every `max_running` slot taken: oldest first, what waited past
    /// the window goes, so that the backlog of slots that never free stays
    /// within the window.
    fn drop_too_old_backlog(&mut self) {
        let now = self.clock.now();
        while let Some((job, due)) = self.backlog.front()
            && self.too_old(job, due, now)
        {
            self.backlog.pop_front();
        }
    }

    /// Takes from the front of the backlog as many units (a period, or an
    /// `sql` group) as there are free `max_running` slots; what a paused
    /// job or the catch-up window no longer admits is dropped on the way.
    fn units_that_fit(&mut self) -> Vec<Vec<Ask>> {
        let mut units: Vec<Vec<Ask>> = Vec::new();
        // Up to SQL_GROUP `sql` periods share a slot; the engine runs them a
        // transaction per job, side by side.
        let mut sql = None;
        let now = self.clock.now();
        while let Some((job, due)) = self.backlog.pop_front() {
            // What waited for `max_running` past the window is dropped as
            // what waited for `concurrency` is.
            if self.paused.contains_key(&job.name) || self.too_old(&job, &due, now) {
                continue;
            }
            let ask = Ask::timed(job, due);
            if let Some(i) = sql.filter(|i: &usize| ask.is_sql() && units[*i].len() < SQL_GROUP) {
                units[i].push(ask);
                continue;
            }
            if self.running + units.len() >= self.settings.max_running {
                self.backlog.push_front((ask.job, ask.due));
                break;
            }
            if ask.is_sql() {
                sql = Some(units.len());
            }
            units.push(vec![ask]);
        }
        if self.backlog.is_empty() {
            // A burst's backlog (10,000 fires) is not kept for the next.
            self.backlog = VecDeque::new();
        }
        debug_assert!(
            units
                .iter()
                .all(|unit| (1..=SQL_GROUP).contains(&unit.len())),
            "a unit holds one period, or an sql group of at most SQL_GROUP"
        );
        units
    }

    /// One batch per claiming statement, each running what it won as
    /// soon as it is claimed: the first periods of a burst start while
    /// the last are still being claimed. Replicas start at different
    /// batches, so they claim different keys first. Each unit takes its
    /// `max_running` slot with it, freed when its run ends.
    fn batches(&self, units: Vec<Vec<Ask>>) -> Vec<Batch> {
        let mut batches: Vec<Batch> = Vec::new();
        for unit in units {
            let fits = batches.last().is_some_and(|b| {
                b.units.iter().map(Vec::len).sum::<usize>() + unit.len() <= CLAIM_BATCH
            });
            if !fits {
                batches.push(Batch {
                    engine: self.engine.clone(),
                    units: Vec::new(),
                    slots: Vec::new(),
                    stop_now: self.stop_now.subscribe(),
                    events: self.events.0.clone(),
                });
            }
            if let Some(batch) = batches.last_mut() {
                batch.units.push(unit);
                batch.slots.push(FreeOnDrop(self.events.0.clone()));
            }
        }
        debug_assert!(
            batches.iter().all(|b| b.slots.len() == b.units.len()),
            "one max_running slot per unit"
        );
        let start = crate::engine::start_at(self.engine.owner(), batches.len());
        batches.rotate_left(start);
        batches
    }

    /// The oldest fire of job `name` that waits here for a slot.
    pub(super) fn oldest_queued_fire(&self, name: &str) -> Option<DateTime<Utc>> {
        let queued = self.pending.iter().chain(&self.backlog);
        let queued = queued.map(|(job, due)| (job.name.as_str(), due));
        let queued = queued
            .filter(|(job, _)| *job == name)
            .map(|(_, due)| due.fire)
            .min();
        let waiting = self
            .waiting
            .get(name)
            .and_then(|queue| queue.first_key_value());
        match (queued, waiting.map(|((fire, _), _)| *fire)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// Whether `due` is still a period of `job` as it is timed now. A fire
/// asked for under a timing a reload has since changed (its claim answered
/// after the reload: busy, or held up by the database) is not, and is not
/// asked for again; a period claimed before (a recovery, a retry, one its
/// upstream periods woke) is finished whatever its timing.
pub(super) fn still_timed(job: &Job, due: &Due) -> bool {
    if matches!(
        due.trigger,
        Trigger::Recovery | Trigger::Retry | Trigger::Upstream
    ) {
        return true;
    }
    let timing = job.timing();
    timing
        .between(due.fire - TimeDelta::nanoseconds(1), due.fire)
        .iter()
        .any(|fire| timing.period_of(fire).label == due.period.label)
}

/// One wake-up's periods: claimed together, then run, each unit (one
/// period, or an `sql` group) on its own `max_running` slot.
struct Batch {
    engine: Engine,
    units: Vec<Vec<Ask>>,
    slots: Vec<FreeOnDrop>,
    stop_now: watch::Receiver<bool>,
    events: mpsc::UnboundedSender<Event>,
}

/// Frees a `max_running` slot when dropped, however its run ends (a panic
/// unwinds through it too).
struct FreeOnDrop(mpsc::UnboundedSender<Event>);

impl Drop for FreeOnDrop {
    fn drop(&mut self) {
        let _ = self.0.send(Event::Free);
    }
}

impl Batch {
    async fn go(mut self) {
        let units = std::mem::take(&mut self.units);
        let periods: Vec<(String, Due)> = units
            .iter()
            .flatten()
            .map(|ask| (ask.job.name.clone(), ask.due.clone()))
            .collect();
        let claimed = match self.engine.take(units, Queue::Contend).await {
            Ok(claimed) => claimed,
            Err(e) => {
                tracing::warn!(periods = periods.len(), "cannot claim, will try again: {e}");
                for (job, due) in periods {
                    let _ = self.events.send(Event::Again(job, due));
                }
                return;
            }
        };
        drop(periods);
        let slots = std::mem::take(&mut self.slots);
        debug_assert_eq!(
            claimed.len(),
            slots.len(),
            "the engine answers every unit, and each unit holds a slot"
        );
        let mut contended = Vec::new();
        for (claimed, slot) in claimed.into_iter().zip(slots) {
            for (ask, taken) in claimed.not_won {
                if let Taken::Not(Claim::Contended) = taken {
                    Report::not_run(&ask, taken).log();
                    contended.push((ask.job.name.clone(), ask.due));
                } else {
                    self.not_won(ask, taken);
                }
            }
            if claimed.won.is_empty() {
                continue;
            }
            let engine = self.engine.clone();
            let stop_now = self.stop_now.clone();
            let events = self.events.clone();
            tokio::spawn(async move {
                let _slot = slot;
                for report in engine.run_won(claimed.won, stop_now).await {
                    let (job, _) = report.key.parts();
                    let succeeded = matches!(report.status, Status::Succeeded);
                    let _ = events.send(Event::Done(job.to_owned(), succeeded));
                }
            });
        }
        self.ask_again(contended);
    }

    /// Asks again for what another claim of the same jobs kept undecided,
    /// once that claim is likely committed (and its keys answered without
    /// a lock).
    fn ask_again(&self, contended: Vec<(String, Due)>) {
        if contended.is_empty() {
            return;
        }
        let events = self.events.clone();
        tokio::spawn(async move {
            tokio::time::sleep(CONTENDED_AGAIN).await;
            let _ = events.send(Event::Contended(contended));
        });
    }

    /// Logs an ask not won; one that found no concurrency slot waits for
    /// one: a fire as a catch-up, inside the catch-up window; a recovery as
    /// a recovery, whatever its age. Its period was claimed once and must
    /// still be finished, and, as the oldest fire waiting, it takes the
    /// next free slot (turned into a catch-up, a short `catch_up` dropped
    /// it, and newer fires took the slot at every scan).
    fn not_won(&self, ask: Ask, taken: Taken) {
        let report = Report::not_run(&ask, taken);
        report.log();
        let name = ask.job.name.clone();
        let event = match report.status {
            Status::NotWon(Claim::Busy) => {
                let trigger = match ask.due.trigger {
                    Trigger::Recovery => Trigger::Recovery,
                    _ => Trigger::CatchUp,
                };
                Event::Again(name, Due { trigger, ..ask.due })
            }
            // Waiting for its upstream periods, or running here already:
            // it holds the job's turn.
            Status::Waiting(_) | Status::RunningHere => return,
            _ => Event::Answered(name),
        };
        let _ = self.events.send(event);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::engine::due::due;
    use crate::store::Store;

    #[tokio::test]
    async fn a_recovery_that_finds_no_free_slot_waits_as_a_recovery() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let store = Store::connect(&url).await.expect("a SQLite store");
        store.migrate().await.expect("migrated");
        let engine =
            Engine::new(store, Duration::from_secs(30), "test".to_owned()).expect("an engine");
        let text = "[[job]]\nname = \"j\"\nschedule = \"* * * * *\"\ncommand = [\"true\"]\n";
        let mut config =
            Config::parse(std::path::Path::new("jobs.toml"), text, &|_| None).expect("a valid job");
        let job = config.jobs.remove(0);
        let now = Utc::now();
        let dues = due(&job, now, now - TimeDelta::minutes(3), true);
        // The latest period runs, and its claim holds the job's one slot ...
        let latest = dues.last().expect("a latest fire").clone();
        let won = engine
            .claim(&[Ask::scheduled(job.clone(), latest)])
            .await
            .expect("a claim");
        assert!(matches!(won[0], Taken::Won(_)));
        // ... when an older period comes back as a recovery.
        let recovery = Due {
            trigger: Trigger::Recovery,
            ..dues[0].clone()
        };
        let (events, mut received) = mpsc::unbounded_channel();
        let (_stop, stop_now) = watch::channel(false);
        let batch = Batch {
            engine,
            units: vec![vec![Ask::scheduled(job, recovery)]],
            slots: vec![FreeOnDrop(events.clone())],
            stop_now,
            events,
        };
        batch.go().await;
        loop {
            match received.recv().await.expect("an event") {
                Event::Again(name, due) => {
                    assert_eq!(name, "j");
                    assert_eq!(due.trigger, Trigger::Recovery);
                    break;
                }
                Event::Free => {}
                _ => panic!("neither waiting nor a freed slot"),
            }
        }
    }
}
