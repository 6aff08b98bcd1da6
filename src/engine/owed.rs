//! From when each job owes its fires: the one rule's input from the
//! database (docs/commands.md, "One period, one meaning"). A sighting
//! (`serve`'s start and reloads, `run JOB`) records it; every view reads
//! it, writing nothing.

use std::collections::HashMap;
use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::config::Job;
use crate::error::Error;
use crate::store::{Owes, Sighted, Store};

/// From when `job` owes its fires at `now`, as the database holds its
/// sighting (`seen`): as the sighting recorded it, else worked out from
/// when it was first seen ([`Job::owed_since`]), else, never seen, as a
/// first sighting now would have it. A sighting recorded under another
/// timing (the schedule, period, calendar, dates or jitter changed since)
/// is read by the rule of a change ([`Job::owed_after_change`]); `newest`
/// is the newest fire a scheduler claimed for the job, which only that
/// case reads.
pub fn owed_from_sighting(
    job: &Job,
    seen: Option<&Sighted>,
    newest: Option<DateTime<Utc>>,
    now: DateTime<Utc>,
) -> DateTime<Utc> {
    let Some(seen) = seen else {
        return job.owed_since(now);
    };
    let Some(recorded) = seen.owed_from else {
        return job.owed_since(seen.first_seen);
    };
    match timing_changed(job, seen) {
        true => job.owed_after_change(recorded, seen.owed_period, newest),
        false => recorded,
    }
}

/// Whether `job`'s timing changed since its owed instant was recorded in
/// `seen` (a row from before timings were recorded has none to compare).
fn timing_changed(job: &Job, seen: &Sighted) -> bool {
    seen.owed_from.is_some()
        && seen
            .timing
            .as_deref()
            .is_some_and(|timing| timing != job.when.as_str())
}

/// From when `job` owes its fires at `now`, as its sighting `record`
/// has it; a sighting that has not recorded it yet (the first one, a row
/// from before it was recorded, one under another timing) records it now
/// ([`owed_from_all`]).
pub async fn owed_from(
    store: &Store,
    job: &Job,
    record: &crate::store::JobRecord,
    now: DateTime<Utc>,
) -> DateTime<Utc> {
    let owed = owed_from_all(store, [(job, record)], now).await;
    owed[&*job.name]
}

/// From when each of `sighted` owes its fires at `now` ([`owed_from_sighting`]),
/// what a sighting is to record recorded in one write: the first one's
/// owed instant, worked out under the job as it is defined now, so that no
/// later edit of anything else moves it; and a change of its timing
/// ([`Job::owed_after_change`]). A failure to record is logged: the next
/// sighting records it.
pub async fn owed_from_all<'a>(
    store: &Store,
    sighted: impl IntoIterator<Item = (&'a Job, &'a crate::store::JobRecord)>,
    now: DateTime<Utc>,
) -> HashMap<Arc<str>, DateTime<Utc>> {
    let sighted: Vec<(&Job, Sighted)> = sighted
        .into_iter()
        .map(|(job, record)| (job, record.sighted()))
        .collect();
    let changed: Vec<String> = sighted
        .iter()
        .filter(|(job, seen)| timing_changed(job, seen))
        .map(|(job, _)| job.name.to_string())
        .collect();
    // A change is recorded only knowing the newest fire claimed: without
    // it, the next sighting records it, and until then the job owes
    // nothing from before now.
    let newest = match changed.is_empty() {
        true => Some(HashMap::new()),
        false => match store.last_fires(&changed).await {
            Ok(newest) => Some(newest),
            Err(e) => {
                tracing::warn!(
                    jobs = changed.len(),
                    "cannot record the change of when the jobs fire yet: {e}"
                );
                None
            }
        },
    };
    let mut owed = HashMap::new();
    let mut unrecorded = Vec::new();
    for (job, seen) in &sighted {
        let changed = timing_changed(job, seen);
        let from = match (&newest, seen.owed_from) {
            (None, Some(_)) if changed => now,
            (newest, _) => {
                let newest = newest.as_ref().and_then(|n| n.get(&*job.name)).copied();
                let from = owed_from_sighting(job, Some(seen), newest, now);
                if changed {
                    tracing::info!(
                        target: "scheduler::sighting",
                        job = &*job.name,
                        owes_from = crate::period::utc_text(from),
                        "its schedule, period, calendar, dates or jitter changed: it owes its fires as they are timed now from {} (after the newest fire claimed for it); a fire the new timing would have made before that runs only by hand",
                        crate::period::utc_text(from)
                    );
                }
                if seen.owed_from.is_none() || seen.timing.as_deref() != Some(job.when.as_str()) {
                    unrecorded.push(Owes {
                        job: job.name.to_string(),
                        from,
                        period: job.owed_period(from),
                        timing: job.when.to_string(),
                    });
                }
                from
            }
        };
        owed.insert(job.name.clone(), from);
    }
    if let Err(e) = store.note_owed(&unrecorded).await {
        tracing::warn!(
            jobs = unrecorded.len(),
            "cannot record from when the jobs seen owe their fires yet: {e}"
        );
    }
    owed
}

/// How many jobs' sightings a statement reads or writes: what is read of
/// them is freed before the next are read, and 100,000 jobs' rows are
/// never held at once.
pub const SIGHTED_AT_ONCE: usize = 1000;

/// From when each of `jobs` a `serve` or `run JOB` has seen owes its fires
/// at `now`, and when it was first seen: what every view reads, writing
/// nothing (a change of timing not recorded yet is read by the same rule).
pub async fn owing<'a>(
    store: &Store,
    jobs: impl IntoIterator<Item = &'a Job>,
    now: DateTime<Utc>,
) -> Result<Owing, Error> {
    let jobs: Vec<&Job> = jobs.into_iter().collect();
    let mut owing = HashMap::with_capacity(jobs.len());
    for jobs in jobs.chunks(SIGHTED_AT_ONCE) {
        let names: Vec<String> = jobs.iter().map(|job| job.name.to_string()).collect();
        let seen = store.first_seen(&names).await?;
        let changed: Vec<String> = jobs
            .iter()
            .filter(|job| seen.get(&*job.name).is_some_and(|s| timing_changed(job, s)))
            .map(|job| job.name.to_string())
            .collect();
        let newest = match changed.is_empty() {
            true => HashMap::new(),
            false => store.last_fires(&changed).await?,
        };
        owing.extend(jobs.iter().filter_map(|job| {
            let seen = seen.get(&*job.name)?;
            let from = owed_from_sighting(job, Some(seen), newest.get(&*job.name).copied(), now);
            Some((job.name.clone(), (seen.first_seen, from)))
        }));
    }
    Ok(Owing(owing))
}

/// What [`owing`] found: by job name, when it was first seen and from when
/// it owes its fires.
#[derive(Debug, Default)]
pub struct Owing(HashMap<Arc<str>, (DateTime<Utc>, DateTime<Utc>)>);

impl Owing {
    /// When `job` was first seen; `None`: never.
    pub fn first_seen(&self, job: &str) -> Option<DateTime<Utc>> {
        self.0.get(job).map(|(seen, _)| *seen)
    }

    /// From when `job` owes its fires; `None`: never seen.
    pub fn owed_from(&self, job: &str) -> Option<DateTime<Utc>> {
        self.0.get(job).map(|(_, from)| *from)
    }

    /// From when `job` owes its fires at `now`: never seen, as a first
    /// sighting now would have it.
    pub fn owed_at(&self, job: &Job, now: DateTime<Utc>) -> DateTime<Utc> {
        self.owed_from(&job.name)
            .unwrap_or_else(|| job.owed_since(now))
    }
}
