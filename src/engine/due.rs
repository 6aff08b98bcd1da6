//! What is due for a job at an instant: the latest fire's period and the
//! missed ones before it. One answer for `run` and for `serve`'s scan.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};

use super::owed::SIGHTED_AT_ONCE;
use crate::config::{Job, Missed};
use crate::error::Error;
use crate::fires::Fire;
use crate::period::{Period, PeriodKey, Shard};
use crate::store::{Claim, ClaimRow, PeriodState, Store, Trigger};

/// A period to claim, with the fire it stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// The period.
    pub period: Period,
    /// The fire that covers it.
    pub fire: DateTime<Utc>,
    /// `schedule` for the latest fire, `catch-up` for older ones.
    pub trigger: Trigger,
    /// The shard of the period it is, for a job whose periods are split.
    pub shard: Option<Shard>,
}

impl Due {
    /// A due period of `job`, as its shards when its periods are split:
    /// every period a front end takes comes through here or from a claim
    /// row (a recovery, a retry), which names its shard.
    pub fn of(job: &Job, period: Period, fire: DateTime<Utc>, trigger: Trigger) -> Vec<Due> {
        let due = Due {
            period,
            fire,
            trigger,
            shard: None,
        };
        Due::sharded(job, due)
    }

    /// `due` as the shards of its period, if `job` splits them and it names
    /// no shard yet; as it is otherwise.
    pub fn sharded(job: &Job, due: Due) -> Vec<Due> {
        match due.shard {
            Some(_) => vec![due],
            None => due.split(job.policy.shards),
        }
    }

    /// Its period as `shards` shards (itself, for 1).
    pub fn split(self, shards: u32) -> Vec<Due> {
        let due = Due {
            shard: None,
            ..self
        };
        if shards <= 1 {
            return vec![due];
        }
        Shard::all(shards)
            .into_iter()
            .map(|shard| Due {
                shard,
                ..due.clone()
            })
            .collect()
    }

    /// Whether it stands for its whole period where periods are counted,
    /// not claimed: a period not split, or its first shard.
    pub fn first_of_period(&self) -> bool {
        self.shard.is_none_or(|shard| shard.index == 0)
    }

    /// The key it claims.
    pub fn key(&self, job: &str) -> PeriodKey {
        PeriodKey::of(job, &self.period.label, self.shard)
    }
}

/// Says, for a job a `serve` or `run JOB` has just seen for the first
/// time, what it owes (docs/commands.md): the latest fire within `catch_up` (and
/// its period), or nothing before the next fire. Nothing else says it.
pub fn log_first_sighting(job: &Job, first_seen: DateTime<Utc>) {
    let owed = job.owed_since(first_seen);
    let since = crate::period::utc_text(owed);
    match job.timing().latest(first_seen).filter(|f| f.at == owed) {
        Some(fire) => tracing::info!(
            target: "scheduler::sighting",
            job = &*job.name,
            owes_from = since,
            "first seen: its latest fire ({}, period {}) is within catch_up and runs; nothing older runs on its own (an adopt — `scheduler adopt`, `Scheduler::adopt` — records what an earlier system ran)",
            crate::period::utc_text(fire.at),
            job.timing().period_of(&fire).label
        ),
        None => tracing::info!(
            target: "scheduler::sighting",
            job = &*job.name,
            owes_from = since,
            "first seen: its latest fire is older than catch_up, so nothing runs before its next fire; older periods run only by hand"
        ),
    }
}

/// The periods due for `job` at `now`, oldest first.
///
/// Older periods are those whose fires lie in `[since, latest fire)`, kept
/// per `missed`: all, or none (`latest` and `skip`, for which the latest is
/// the only one). The latest fire's period comes last when `with_latest`.
pub fn due(job: &Job, now: DateTime<Utc>, since: DateTime<Utc>, with_latest: bool) -> Vec<Due> {
    let tick = TimeDelta::nanoseconds(1);
    let timing = job.timing();
    let Some(latest) = timing.latest(now) else {
        return Vec::new();
    };
    let mut fires = match job.policy.missed {
        Missed::All => timing.between(since - tick, latest.at - tick),
        _ => Vec::new(),
    };
    fires.extend(timing.between(latest.at - tick, latest.at));
    let mut due = of_fires(job, &fires);
    if !with_latest {
        due.retain(|d| d.trigger != Trigger::Schedule);
    }
    due
}

/// The periods `fires` (in the order they are due) make due, oldest first:
/// those due at the last instant as `schedule` (one fire, or several moved
/// to it: a weekend's, on Monday), the older ones as `catch-up` where
/// `missed = "all"`. A period two fires name comes once, as the newer
/// one's.
pub fn of_fires(job: &Job, fires: &[Fire]) -> Vec<Due> {
    let Some(latest) = fires.last().map(|f| f.at) else {
        return Vec::new();
    };
    let timing = job.timing();
    let mut seen = HashSet::new();
    let mut due = Vec::new();
    for fire in fires.iter().rev() {
        let trigger = if fire.at == latest {
            Trigger::Schedule
        } else if job.policy.missed == Missed::All {
            Trigger::CatchUp
        } else {
            continue;
        };
        let period = timing.period_of(fire);
        if seen.insert(period.label.clone()) {
            // Reversed below: the shards come out in order.
            due.extend(Due::of(job, period, fire.at, trigger).into_iter().rev());
        }
    }
    due.reverse();
    due
}

/// Where one period stands at an instant, as every mode and view sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Standing {
    /// Its state.
    pub state: PeriodState,
    /// The fire that makes it due, if the schedule has one.
    pub fire: Option<DateTime<Utc>>,
    /// Past its deadline and not done, though owed: the mark `late`.
    pub late: bool,
}

/// What the database says of a job and a period beyond its claim, for
/// [`standing`].
#[derive(Debug, Clone, Copy, Default)]
pub struct Sighting {
    /// From when the job owes its fires ([`super::owed::owing`]); `None`: never seen (a
    /// first sighting now would see it).
    pub owed_from: Option<DateTime<Utc>>,
    /// A gate noted the period waiting for its upstream periods (a
    /// backfill asked for it, or a scan found it): it runs once they are
    /// done, whenever it fired.
    pub noted: bool,
    /// The job is paused: nothing of it is late (its fires are caught up
    /// on `resume`, as `missed` has them).
    pub paused: bool,
}

/// How one period of `job` stands at `now` (docs/commands.md): the one rule, from
/// its claim, its fire, the job's sighting, `catch_up`, its deadline and
/// its upstream periods (`after`) as [`super::after::look`] found them.
/// Every view reads it: `status`, `status --from/--to`, the API, the
/// console, the notifications.
pub fn standing(
    job: &Job,
    period: &Period,
    row: Option<&ClaimRow>,
    sighting: Sighting,
    upstream: &super::after::Upstream,
    now: DateTime<Utc>,
) -> Standing {
    let fire = job.timing().of(period);
    let owed = sighting.owed_from.unwrap_or_else(|| job.owed_since(now));
    let window = TimeDelta::from_std(job.policy.catch_up)
        .ok()
        .and_then(|w| now.checked_sub_signed(w))
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    // A period of several fires (an hour of `*/15` fires) is owed, and
    // within the window, if any of its fires due by now is: its first
    // fire may lie before the sighting while a later one, which `serve`
    // and `run JOB` take, does not.
    let fired_since = |from: DateTime<Utc>| {
        fire.is_some_and(|f| f >= from) || fires_since(job, period, from, now)
    };
    // `missed = "latest"` or `"skip"`: an older fire nothing ran at is
    // passed over for good; only the latest is taken. Not an alarm: it
    // is never late.
    let passed_over = |f: DateTime<Utc>| {
        job.policy.missed != Missed::All
            && job.timing().latest(now).is_some_and(|latest| {
                latest.at > f && job.timing().period_of(&latest).label != period.label
            })
    };
    let mut by_design = false;
    let state = match (row, fire) {
        (None, Some(f)) if f > now => PeriodState::NotDue,
        (None, _) if sighting.noted && upstream.waiting() => PeriodState::Waiting,
        (None, _) if sighting.noted => PeriodState::Ready,
        (None, Some(_)) if !fired_since(owed) => PeriodState::BeforeFirstSeen,
        (None, _) if upstream.waiting() => PeriodState::Waiting,
        (None, Some(_)) if !fired_since(window) => PeriodState::Missed,
        (None, Some(f)) if passed_over(f) => {
            by_design = true;
            PeriodState::Missed
        }
        (None, _) if job.after.any() => PeriodState::Ready,
        (None, _) => PeriodState::Due,
        (Some(row), _) => match row.standing() {
            PeriodState::Succeeded if upstream.stale(row.started_at) => PeriodState::Stale,
            state => state,
        },
    };
    // Past its deadline and not done, an owed period is late, whatever
    // else it is (never claimed, running, failed, waiting); one from
    // before the job was first seen never is, even run by hand.
    let late = state.can_be_late()
        && !by_design
        && !sighting.paused
        && fired_since(owed)
        && job
            .policy
            .deadline
            .and_then(|d| TimeDelta::from_std(d).ok())
            .zip(fire)
            .is_some_and(|(d, fire)| fire + d <= now);
    Standing { state, fire, late }
}

/// Whether a fire of `period` at or after `from` is due by `now`. Its
/// fires are consecutive, so the first fire at or after `from` is one of
/// them if any is.
pub(crate) fn fires_since(
    job: &Job,
    period: &Period,
    from: DateTime<Utc>,
    now: DateTime<Utc>,
) -> bool {
    let timing = job.timing();
    timing
        .next(from - TimeDelta::nanoseconds(1))
        .is_some_and(|next| next.at <= now && timing.period_of(&next).label == period.label)
}

/// `serve`'s overdue gauge, counted each minute from what the count before
/// it found: a job's fires are listed once, then only the new ones, and
/// only its periods not yet found succeeded are looked up again (normally
/// the one in flight). Counting afresh each minute, as `status` does once,
/// looked up every period of the catch-up window of every job: for 10,000
/// every-minute jobs a day after they were first seen, 14 million keys a
/// minute on every replica.
///
/// A period found succeeded is not looked up again until the next full
/// count, an hour after the last: a forced rerun by hand that
/// then fails shows by then.
///
/// What it keeps is a list in the order of the jobs it is given, looked up
/// by position: a job at another position than at the count before (a
/// reload) is listed afresh, as at a full count.
#[derive(Default)]
pub struct OverdueCount {
    jobs: Vec<Option<Open>>,
    /// When every period of the window was last listed.
    listed: Option<DateTime<Utc>>,
}

/// How often the overdue gauge lists every period of the window again.
const RECOUNT_EVERY: TimeDelta = TimeDelta::hours(1);

/// A job's due periods not yet found succeeded.
struct Open {
    /// The definition they were listed under: another one (a reload) lists
    /// them afresh.
    job: Arc<Job>,
    /// Fires listed up to here.
    upto: DateTime<Utc>,
    /// The job's first fire after `upto`: until it comes, a count lists
    /// nothing new for the job (a yearly job's fire is looked for once an
    /// hour, not each minute).
    next: Option<DateTime<Utc>>,
    /// The fires of the periods still open, when due and the nominal
    /// instant that names the period, in order, each once; their keys are
    /// made again when they are looked up (a fire is 24 bytes, a key a
    /// heap string: a failing every-second job keeps 86,400 of them a
    /// day). A list, not a tree: most jobs keep one, the period in flight,
    /// and a tree's first node is 280 bytes (2.7 MiB for 10,000 jobs).
    fires: Vec<OpenFire>,
}

/// The fire of an open period: when it was due, and the nominal instant
/// that names the period.
type OpenFire = (DateTime<Utc>, DateTime<Utc>);

impl OverdueCount {
    /// The number of overdue periods of each of `jobs` (as the overview,
    /// [`super::overview::of_jobs`], has them), by job name. A count that
    /// fails half-way leaves the next one to list every period again.
    pub async fn count(
        &mut self,
        store: &Store,
        jobs: &[Arc<Job>],
        catch_up: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Result<HashMap<Arc<str>, usize>, Error> {
        let counted = self.count_on(store, jobs, catch_up, now).await;
        if counted.is_err() {
            *self = OverdueCount::default();
        }
        counted
    }

    /// How many of the periods the last count left open are late, by job
    /// name: a job with a `deadline` whose period's fire is that long ago
    /// and has not succeeded (running ones included).
    pub fn late(&self, now: DateTime<Utc>) -> HashMap<Arc<str>, usize> {
        self.jobs
            .iter()
            .flatten()
            .filter_map(|open| {
                let deadline = TimeDelta::from_std(open.job.policy.deadline?).ok()?;
                let after = (
                    now - deadline + TimeDelta::nanoseconds(1),
                    DateTime::<Utc>::MIN_UTC,
                );
                let late = open.fires.partition_point(|fire| *fire < after);
                Some((open.job.name.clone(), late))
            })
            .collect()
    }

    async fn count_on(
        &mut self,
        store: &Store,
        jobs: &[Arc<Job>],
        catch_up: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Result<HashMap<Arc<str>, usize>, Error> {
        let window = now - TimeDelta::from_std(catch_up).unwrap_or_default();
        if self.listed.is_none_or(|at| now - at >= RECOUNT_EVERY) {
            self.jobs.clear();
            self.listed = Some(now);
        }
        self.jobs.resize_with(jobs.len(), || None);
        let mut counted: HashMap<Arc<str>, usize> = HashMap::new();
        // Periods to look up, a statement's worth at a time: the new fires
        // of a minute (60 of an every-second job) are never all held.
        let mut asked: Vec<Looked> = Vec::new();
        // The jobs' sightings are read a chunk at a time too: 100,000 jobs'
        // at once were 5 MiB made and freed each minute.
        for (chunk, jobs) in jobs.chunks(SIGHTED_AT_ONCE).enumerate() {
            let owing = super::owed::owing(store, jobs.iter().map(|job| &**job), now).await?;
            for (at, job) in (chunk * SIGHTED_AT_ONCE..).zip(jobs) {
                let Some(owed) = owing.owed_from(&job.name) else {
                    // Not seen (any more): nothing is owed.
                    self.jobs[at] = None;
                    continue;
                };
                let since = window.max(owed);
                for (fire, nominal) in self.open_fires(at, job, since, now) {
                    let period = job.period.period_of(&job.schedule, nominal);
                    let key = PeriodKey::new(&job.name, &period.label).to_string();
                    asked.push(Looked {
                        at,
                        job: job.clone(),
                        fire: (fire, nominal),
                        key,
                        period,
                    });
                    if asked.len() == LOOKUP_CHUNK {
                        self.look_up(store, &mut asked, &mut counted).await?;
                    }
                }
            }
        }
        self.look_up(store, &mut asked, &mut counted).await?;
        Ok(counted)
    }

    /// The fires of job number `at` to look up, owed from `since`: those
    /// left open by the count before and those new since it, as `missed`
    /// has them. Its entry is made ready for what the look-up finds.
    fn open_fires(
        &mut self,
        at: usize,
        job: &Arc<Job>,
        since: DateTime<Utc>,
        now: DateTime<Utc>,
    ) -> Vec<OpenFire> {
        let open = self.jobs[at].get_or_insert_with(|| Open {
            job: job.clone(),
            upto: since,
            next: None,
            fires: Vec::new(),
        });
        let same = Arc::ptr_eq(&open.job, job);
        // No fire since the last count: what was open is all there is.
        let quiet = same && open.next.is_some_and(|next| next > now);
        // Only `missed = "all"` keeps what was due before: with the
        // others only the latest fire is due, listed afresh each time.
        let from = if same && (quiet || job.policy.missed == Missed::All) {
            open.upto.max(since)
        } else {
            open.fires.clear();
            since
        };
        open.job = job.clone();
        open.upto = now + TimeDelta::nanoseconds(1);
        if !quiet {
            open.next = job.timing().next(now).map(|fire| fire.at);
        }
        let mut kept = std::mem::take(&mut open.fires);
        kept.drain(..kept.partition_point(|fire| *fire < (since, DateTime::<Utc>::MIN_UTC)));
        if quiet {
            return kept;
        }
        let new = due(job, now, from, true)
            .into_iter()
            .filter(|d| d.fire >= from && d.first_of_period())
            .filter_map(|d| Some((d.fire, job.period.fire_for(&job.schedule, &d.period)?)));
        kept.extend(new);
        kept
    }

    /// Looks `asked` up, emptying it: a period found succeeded is done
    /// with, one running stays open, the rest stay open and are counted.
    async fn look_up(
        &mut self,
        store: &Store,
        asked: &mut Vec<Looked>,
        counted: &mut HashMap<Arc<str>, usize>,
    ) -> Result<(), Error> {
        if asked.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = asked.iter().map(|a| a.key.clone()).collect();
        let periods: Vec<(&str, &Period, u32)> = asked
            .iter()
            .map(|a| (a.job.name.as_ref(), &a.period, a.job.policy.shards))
            .collect();
        let claims = super::shards::read(store, &periods).await?;
        let waits = asked.iter().any(|a| a.job.after.any());
        let waiting = match waits {
            true => store.waits(&keys).await?,
            false => HashMap::new(),
        };
        for (looked, claims) in asked.drain(..).zip(claims) {
            let Looked {
                at, job, fire, key, ..
            } = looked;
            let claim = claims.row.as_ref().map(ClaimRow::as_claim);
            // Not looked up again until the next full count.
            if matches!(claim, Some(Claim::Succeeded { .. })) {
                continue;
            }
            // A period waiting for its upstream periods is not overdue:
            // it is claimed once they are done.
            if !matches!(claim, Some(Claim::Held { .. })) && !waiting.contains_key(&key) {
                *counted.entry(job.name.clone()).or_default() += 1;
            }
            if let Some(open) = self.jobs[at].as_mut()
                && let Err(at) = open.fires.binary_search(&fire)
            {
                open.fires.insert(at, fire);
            }
        }
        Ok(())
    }
}

/// How many keys one statement looks up.
const LOOKUP_CHUNK: usize = 1_000;

/// A period the overdue count looks up.
struct Looked {
    /// The job's position in the list counted.
    at: usize,
    job: Arc<Job>,
    fire: OpenFire,
    key: String,
    period: Period,
}

/// The periods of each of `jobs` that has a `deadline` that were late at
/// their deadline (owed, within the catch-up window, not succeeded by it),
/// and also those that have
/// succeeded since, after their deadline: what a `late` notification
/// tells of, whoever caught the period up first. With `checked` (the
/// instant of the check before), only the periods whose deadline passed
/// since then are looked at: a check costs the new deadlines, not the
/// whole window.
pub async fn were_late(
    store: &Store,
    jobs: &[&Job],
    catch_up: std::time::Duration,
    now: DateTime<Utc>,
    checked: Option<DateTime<Utc>>,
) -> Result<HashMap<String, Vec<(String, DateTime<Utc>)>>, Error> {
    let window = now - TimeDelta::from_std(catch_up).unwrap_or_default();
    let asked: Vec<Span> = jobs
        .iter()
        .filter_map(|job| {
            let deadline = TimeDelta::from_std(job.policy.deadline?).ok()?;
            let from = checked.map_or(window, |at| window.max(at - deadline));
            let until = now - deadline;
            // A job with no fire in its span has nothing to look up: most
            // jobs, most checks.
            let fires = job
                .timing()
                .next(from - TimeDelta::nanoseconds(1))
                .map(|fire| fire.at);
            fires
                .is_some_and(|fire| fire <= until)
                .then_some((*job, from, until))
        })
        .collect();
    if asked.is_empty() {
        return Ok(HashMap::new());
    }
    were_late_in(store, &asked).await
}

/// A job and the fires of it to look at: from, to (both included).
type Span<'a> = (&'a Job, DateTime<Utc>, DateTime<Utc>);

/// The periods of each job due within its span and owed since the job was
/// first seen that were not succeeded by their deadline: by job name, each
/// key with its fire.
async fn were_late_in(
    store: &Store,
    jobs: &[Span<'_>],
) -> Result<HashMap<String, Vec<(String, DateTime<Utc>)>>, Error> {
    let until = jobs.iter().map(|(_, _, until)| *until).max();
    let until = until.unwrap_or_default();
    let owing = super::owed::owing(store, jobs.iter().map(|(job, _, _)| *job), until).await?;
    let mut open: HashMap<String, Vec<(String, DateTime<Utc>)>> = HashMap::new();
    // Looked up a statement's worth at a time: only the open ones are
    // kept, however long the window.
    let mut asked: Vec<Asked> = Vec::new();
    for (job, from, until) in jobs {
        // Never seen: it owes nothing yet.
        let Some(owed) = owing.owed_from(&job.name) else {
            continue;
        };
        let since = (*from).max(owed);
        if *until < since {
            continue;
        }
        for d in due(job, *until, since, true)
            .into_iter()
            .filter(|d| d.fire >= since && d.first_of_period())
        {
            asked.push(Asked {
                job: job.name.to_string(),
                key: PeriodKey::new(&job.name, &d.period.label).to_string(),
                period: d.period.clone(),
                shards: job.policy.shards,
                fire: d.fire,
                deadline: job
                    .policy
                    .deadline
                    .and_then(|d| TimeDelta::from_std(d).ok())
                    .map(|deadline| d.fire + deadline),
            });
            if asked.len() == LOOKUP_CHUNK {
                keep_open(store, &mut asked, &mut open).await?;
            }
        }
    }
    keep_open(store, &mut asked, &mut open).await?;
    Ok(open)
}

/// A period [`were_late_in`] looks up.
struct Asked {
    job: String,
    key: String,
    period: Period,
    shards: u32,
    fire: DateTime<Utc>,
    /// When the period is late, for a job with a deadline.
    deadline: Option<DateTime<Utc>>,
}

/// Looks `asked` up, emptying it, and keeps in `open` the periods not
/// succeeded by their deadline.
async fn keep_open(
    store: &Store,
    asked: &mut Vec<Asked>,
    open: &mut HashMap<String, Vec<(String, DateTime<Utc>)>>,
) -> Result<(), Error> {
    if asked.is_empty() {
        return Ok(());
    }
    let periods: Vec<(&str, &Period, u32)> = asked
        .iter()
        .map(|a| (a.job.as_str(), &a.period, a.shards))
        .collect();
    let claims = super::shards::read(store, &periods).await?;
    for (asked, claims) in asked.drain(..).zip(claims) {
        let Asked {
            job,
            key,
            fire,
            deadline,
            ..
        } = asked;
        let in_time = match claims.row.as_ref().map(ClaimRow::as_claim) {
            Some(Claim::Succeeded { at }) => deadline.is_none_or(|d| at <= d),
            _ => false,
        };
        if !in_time {
            open.entry(job).or_default().push((key, fire));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
