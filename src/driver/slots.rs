//! The driver's slots: `max_running` slots of this process, each held by a
//! run (or an `sql` group) from its claim to its end, and the periods that
//! wait for one (the backlog) or for a slot of their job's `concurrency`
//! (`waiting`). A job's periods are asked for in fire order: none while an
//! older one waits here, or while as many older ones as the job may run at
//! once are being claimed here (`asking`). What waited past the catch-up
//! window is dropped.

use std::collections::HashMap;
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
    pub(super) fn wait(&mut self, job: Arc<str>, due: Due) {
        let key = (due.fire, due.key(&job).to_string());
        self.waiting.entry(job).or_default().insert(key, due);
    }

    /// Dispatches the `n` oldest waiting periods of job `name`, ahead of
    /// every fire queued here: a fire of the job queued since is newer,
    /// and must not take the slot they waited for (behind them in the
    /// backlog, it did, again and again, while the burst lasted). What
    /// waited past the catch-up window is dropped on the way and takes no
    /// slot.
    pub(super) fn release_waiting(&mut self, name: &str, n: usize) {
        let now = self.clock.now();
        let mut released = Vec::new();
        let mut asked = 0;
        while asked < n {
            let Some(queue) = self.waiting.get_mut(name) else {
                break;
            };
            let oldest = queue.pop_first();
            if queue.is_empty() {
                self.waiting.remove(name);
            }
            let Some((_, due)) = oldest else {
                break;
            };
            let Some(job) = self.job(name) else {
                continue;
            };
            if self.too_old(&job, &due, now) {
                continue;
            }
            asked += 1;
            if self.admits(&job, &due, now) {
                released.push((job, due));
            }
        }
        for first in released {
            self.backlog.push_ahead(first);
        }
    }

    /// Whether `due` would overtake older periods of its job: one waiting
    /// here for a slot, or as many as the job may run at once being asked
    /// for here. Asked for now, it could take the slot they are owed. So a
    /// replica asks for a job's periods in fire order, and as every
    /// replica does, a period is claimed before any newer one of its job
    /// is asked for anywhere (but on a replica that never saw it fire).
    fn overtakes(&self, job: &Job, due: &Due) -> bool {
        let waits = self
            .waiting
            .get(&*job.name)
            .and_then(|queue| queue.first_key_value())
            .is_some_and(|((oldest, _), _)| *oldest < due.fire);
        let asked = self.asking.get(job.name.as_ref()).map_or(0, |fires| {
            fires.iter().filter(|fire| **fire < due.fire).count()
        });
        waits || asked >= job.policy.concurrency as usize
    }

    /// The claims of `asked` were answered (what they found is handled
    /// already): they are no longer being asked for.
    pub(super) fn answered(&mut self, asked: Vec<(Arc<Job>, DateTime<Utc>)>) {
        for (job, fire) in asked {
            let Some(fires) = self.asking.get_mut(job.name.as_ref()) else {
                continue;
            };
            if let Some(at) = fires.iter().position(|f| *f == fire) {
                fires.swap_remove(at);
            }
            if fires.is_empty() {
                self.asking.remove(job.name.as_ref());
            }
        }
        // A burst's 10,000 entries are not kept for the next.
        if self.asking.is_empty() && self.asking.capacity() > 1024 {
            self.asking = HashMap::new();
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

    /// Queues `due`, a period a scan found claimed before (to take over,
    /// to retry, or waiting for its upstream periods), ahead of every fire
    /// in fire order, once however many scans find it. Among the fires,
    /// a recovery never got a slot while the job's periods released from
    /// waiting kept coming ahead of it, and a replica killed under a
    /// steady load left its periods unrun (adversarial review).
    /// One that waits here for its job's slot keeps its place there, as
    /// what the scan found it to be (queued again, it was asked for from
    /// both places: adversarial review).
    pub(super) fn bring_back(&mut self, job: Arc<Job>, due: Due, now: DateTime<Utc>) {
        let key = (due.fire, due.key(&job.name).to_string());
        let waits = self.waiting.get_mut(&*job.name);
        if let Some(waits) = waits.and_then(|queue| queue.get_mut(&key)) {
            waits.trigger = due.trigger;
            return;
        }
        if self.admits(&job, &due, now) && !self.backlog.holds_ahead(&job.name, &due) {
            self.backlog.push_ahead((job, due));
        }
    }

    /// Whether a fire is dispatched: not while shutting down, not for a
    /// paused job, not past the catch-up window.
    pub(super) fn admits(&self, job: &Job, due: &Due, now: DateTime<Utc>) -> bool {
        !*self.shutdown.borrow()
            && !self.paused.contains_key(&*job.name)
            && !self.too_old(job, due, now)
    }

    /// Moves what was dispatched since the last flush into the backlog,
    /// each by when it is needed. Fires needed by the same instant (a
    /// burst's) go in the order they came, from a place of this replica's
    /// own: replicas claim different keys first, all the burst through,
    /// not the same ones in turn.
    pub(super) fn take_pending(&mut self) {
        let mut pending = std::mem::take(&mut self.pending);
        let start = crate::engine::start_at(self.engine.owner(), pending.len());
        pending.rotate_left(start);
        self.backlog.push_fires(pending);
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
                job = &*job.name,
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

    /// With every `max_running` slot taken: from the front, what waited
    /// past the window goes, so that the backlog of slots that never free
    /// stays within the window (a fire past it was needed before now, and
    /// so is near the front).
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
        while let Some((job, due)) = self.backlog.front() {
            // What waited for `max_running` past the window is dropped as
            // what waited for `concurrency` is.
            let dropped = self.paused.contains_key(&*job.name) || self.too_old(job, due, now);
            // Fired before an older period of its job found no slot: it
            // waits behind that period, as a fire after it does.
            let waits = !dropped && self.overtakes(job, due);
            let joins = sql.filter(|i: &usize| job.is_sql() && units[*i].len() < SQL_GROUP);
            let fits = joins.is_some() || self.running + units.len() < self.settings.max_running;
            if !dropped && !waits && !fits {
                break;
            }
            let Some((job, due)) = self.backlog.pop_front() else {
                break;
            };
            if dropped {
                continue;
            }
            if waits {
                self.wait(job.name.clone(), due);
                continue;
            }
            let ask = Ask::timed(job, due);
            let asking = self.asking.entry(ByName(ask.job.clone()));
            let asking = asking.or_insert_with(|| Vec::with_capacity(1));
            asking.push(ask.due.fire);
            match joins {
                Some(i) => units[i].push(ask),
                None => {
                    if ask.is_sql() {
                        sql = Some(units.len());
                    }
                    units.push(vec![ask]);
                }
            }
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
                    asked: AnsweredOnDrop::new(self.events.0.clone()),
                    stop_now: self.stop_now.subscribe(),
                    events: self.events.0.clone(),
                });
            }
            if let Some(batch) = batches.last_mut() {
                let asked = unit.iter().map(|ask| (ask.job.clone(), ask.due.fire));
                batch.asked.0.extend(asked);
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
        let queued = self.pending.iter().chain(self.backlog.iter());
        let queued = queued.map(|(job, due)| (job.name.as_ref(), due));
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

/// A job as a key, by its name: found by `&str`, kept without a copy of
/// the name.
pub(super) struct ByName(Arc<Job>);

impl PartialEq for ByName {
    fn eq(&self, other: &ByName) -> bool {
        self.0.name == other.0.name
    }
}

impl Eq for ByName {}

impl std::hash::Hash for ByName {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.0.name.as_ref().hash(state);
    }
}

impl std::borrow::Borrow<str> for ByName {
    fn borrow(&self) -> &str {
        &self.0.name
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
    /// Its periods, being asked for until it has answered them.
    asked: AnsweredOnDrop,
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

/// Periods (job, fire) being asked for: said to be answered when dropped,
/// after what their claims found was sent, however the batch ends.
struct AnsweredOnDrop(Vec<(Arc<Job>, DateTime<Utc>)>, mpsc::UnboundedSender<Event>);

impl AnsweredOnDrop {
    fn new(events: mpsc::UnboundedSender<Event>) -> AnsweredOnDrop {
        AnsweredOnDrop(Vec::new(), events)
    }

    /// Those of `periods` among these, taken out: answered when the
    /// returned guard is dropped, not this one.
    fn split(&mut self, periods: &[(Arc<str>, Due)]) -> AnsweredOnDrop {
        let mut split = AnsweredOnDrop::new(self.1.clone());
        for (job, due) in periods {
            let at = self
                .0
                .iter()
                .position(|(j, f)| *j.name == **job && *f == due.fire);
            if let Some(at) = at {
                split.0.push(self.0.swap_remove(at));
            }
        }
        split
    }
}

impl Drop for AnsweredOnDrop {
    fn drop(&mut self) {
        if !self.0.is_empty() {
            let _ = self.1.send(Event::Asked(std::mem::take(&mut self.0)));
        }
    }
}

impl Batch {
    async fn go(mut self) {
        let units = std::mem::take(&mut self.units);
        let periods: Vec<(Arc<str>, Due)> = units
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
        let mut runs = Vec::new();
        let mut answered_elsewhere = Vec::new();
        for (claimed, slot) in claimed.into_iter().zip(slots) {
            for (ask, taken) in claimed.not_won {
                if let Taken::Not(Claim::Contended) = taken {
                    Report::not_run(&ask, taken).log();
                    contended.push((ask.job.name.clone(), ask.due));
                } else if let Some(answered) = self.not_won(ask, taken) {
                    answered_elsewhere.push(answered);
                }
            }
            if !claimed.won.is_empty() {
                runs.push((claimed.won, slot));
            }
        }
        self.ask_again(contended);
        // Answered, before a run can end and free its job's slot for the
        // next period.
        drop(std::mem::replace(
            &mut self.asked,
            AnsweredOnDrop::new(self.events.clone()),
        ));
        // A job's next waiting period is asked for once these are no
        // longer being asked for, not deferred behind them.
        for answered in answered_elsewhere {
            let _ = self.events.send(answered);
        }
        for (won, slot) in runs {
            let engine = self.engine.clone();
            let stop_now = self.stop_now.clone();
            let events = self.events.clone();
            tokio::spawn(async move {
                let _slot = slot;
                for report in engine.run_won(won, stop_now).await {
                    let (job, _) = report.key.parts();
                    let succeeded = matches!(report.status, Status::Succeeded);
                    let _ = events.send(Event::Done(job.to_owned(), succeeded));
                }
            });
        }
    }

    /// Asks again for what another claim of the same jobs kept undecided,
    /// once that claim is likely committed (and its keys answered without
    /// a lock). They count as being asked for until then.
    fn ask_again(&mut self, contended: Vec<(Arc<str>, Due)>) {
        if contended.is_empty() {
            return;
        }
        let asked = self.asked.split(&contended);
        let events = self.events.clone();
        tokio::spawn(async move {
            tokio::time::sleep(CONTENDED_AGAIN).await;
            let _ = events.send(Event::Contended(contended));
            drop(asked);
        });
    }

    /// Logs an ask not won; one that found no concurrency slot waits for
    /// one: a fire as a catch-up, inside the catch-up window; a recovery as
    /// a recovery, and a period that waited for its upstream periods as
    /// such, whatever its age. A recovery's period was claimed once and
    /// must still be finished, and, as the oldest fire waiting, it takes
    /// the next free slot (turned into a catch-up, a short `catch_up`
    /// dropped it, and newer fires took the slot at every scan). One answered
    /// elsewhere (run, or running elsewhere) is returned, to be said once
    /// the batch's periods are no longer being asked for.
    fn not_won(&self, ask: Ask, taken: Taken) -> Option<Event> {
        let report = Report::not_run(&ask, taken);
        report.log();
        let name = ask.job.name.clone();
        match report.status {
            Status::NotWon(Claim::Busy) => {
                let trigger = match ask.due.trigger {
                    kept @ (Trigger::Recovery | Trigger::Upstream) => kept,
                    _ => Trigger::CatchUp,
                };
                let _ = self
                    .events
                    .send(Event::Again(name, Due { trigger, ..ask.due }));
                None
            }
            // Waiting for its upstream periods, or running here already:
            // it holds the job's turn.
            Status::Waiting(_) | Status::RunningHere => None,
            _ => Some(Event::Answered(name)),
        }
    }
}

#[cfg(test)]
mod tests;
