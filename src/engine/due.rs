//! What is due for a job at an instant: the latest fire's period and the
//! missed ones before it. One answer for `run` and for `serve`'s scan.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};

use crate::config::{Job, Missed};
use crate::error::Error;
use crate::fires::Fire;
use crate::period::{Period, PeriodKey};
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
            job = job.name,
            owes_from = since,
            "first seen: its latest fire ({}, period {}) is within catch_up and runs; nothing older runs on its own (`scheduler adopt` records what an earlier system ran)",
            crate::period::utc_text(fire.at),
            job.timing().period_of(&fire).label
        ),
        None => tracing::info!(
            target: "scheduler::sighting",
            job = job.name,
            owes_from = since,
            "first seen: its latest fire is older than catch_up, so nothing runs before its next fire; older periods run only by hand"
        ),
    }
}

/// From when `job` owes its fires, as its sighting `record` has it; a
/// sighting that has not recorded it yet (the first one, or a row from
/// before it was recorded) records it now, worked out from when the job
/// was first seen under the job as it is defined now, so that no later
/// change of its calendar, dates or jitter moves it. A failure to record
/// it is logged: the next sighting records it.
pub async fn owed_from(
    store: &Store,
    job: &Job,
    record: &crate::store::JobRecord,
) -> DateTime<Utc> {
    if let Some(owed) = record.owed_from {
        return owed;
    }
    let owed = job.owed_since(record.first_seen);
    if let Err(e) = store.note_owed(&job.name, owed).await {
        tracing::warn!(
            job = job.name,
            "cannot record from when the job owes its fires yet: {e}"
        );
    }
    owed
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
    let mut fires = match job.missed {
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
        } else if job.missed == Missed::All {
            Trigger::CatchUp
        } else {
            continue;
        };
        let period = timing.period_of(fire);
        if seen.insert(period.label.clone()) {
            due.push(Due {
                period,
                fire: fire.at,
                trigger,
            });
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
    /// When a `serve` or `run JOB` first saw the job; `None`: never (a
    /// first one now would see it).
    pub first_seen: Option<DateTime<Utc>>,
    /// From when it owes its fires, as its first sighting recorded it.
    pub owed_from: Option<DateTime<Utc>>,
    /// A gate noted the period waiting for its upstream periods (a
    /// backfill asked for it, or a scan found it): it runs once they are
    /// done, whenever it fired.
    pub noted: bool,
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
    let owed = job.owed_from(sighting.first_seen, sighting.owed_from, now);
    let window = TimeDelta::from_std(job.catch_up)
        .ok()
        .and_then(|w| now.checked_sub_signed(w))
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    let state = match (row, fire) {
        (None, Some(f)) if f > now => PeriodState::NotDue,
        (None, _) if sighting.noted && upstream.waiting() => PeriodState::Waiting,
        (None, _) if sighting.noted => PeriodState::Ready,
        (None, Some(f)) if f < owed => PeriodState::BeforeFirstSeen,
        (None, _) if upstream.waiting() => PeriodState::Waiting,
        (None, Some(f)) if f < window => PeriodState::Missed,
        // `missed = "latest"` or `"skip"`: an older fire nothing ran at is
        // passed over for good; only the latest is taken.
        (None, Some(f))
            if job.missed != Missed::All
                && job.timing().latest(now).is_some_and(|latest| latest.at > f) =>
        {
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
        && fire.is_some_and(|f| f >= owed)
        && job
            .deadline
            .and_then(|d| TimeDelta::from_std(d).ok())
            .zip(fire)
            .is_some_and(|(d, fire)| fire + d <= now);
    Standing { state, fire, late }
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
#[derive(Default)]
pub struct OverdueCount {
    jobs: HashMap<String, Open>,
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
    /// instant that names the period; their keys are made again when they
    /// are looked up (a fire is 24 bytes, a key a heap string: a failing
    /// every-second job keeps 86,400 of them a day).
    fires: BTreeSet<OpenFire>,
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
    ) -> Result<HashMap<String, usize>, Error> {
        let counted = self.count_on(store, jobs, catch_up, now).await;
        if counted.is_err() {
            *self = OverdueCount::default();
        }
        counted
    }

    /// How many of the periods the last count left open are late, by job
    /// name: a job with a `deadline` whose period's fire is that long ago
    /// and has not succeeded (running ones included).
    pub fn late(&self, now: DateTime<Utc>) -> HashMap<String, usize> {
        self.jobs
            .iter()
            .filter_map(|(name, open)| {
                let deadline = TimeDelta::from_std(open.job.deadline?).ok()?;
                let after = (
                    now - deadline + TimeDelta::nanoseconds(1),
                    DateTime::<Utc>::MIN_UTC,
                );
                let late = open.fires.range(..after).count();
                Some((name.clone(), late))
            })
            .collect()
    }

    async fn count_on(
        &mut self,
        store: &Store,
        jobs: &[Arc<Job>],
        catch_up: std::time::Duration,
        now: DateTime<Utc>,
    ) -> Result<HashMap<String, usize>, Error> {
        let window = now - TimeDelta::from_std(catch_up).unwrap_or_default();
        let names: Vec<String> = jobs.iter().map(|j| j.name.clone()).collect();
        let first_seen = store.first_seen(&names).await?;
        self.jobs.retain(|name, _| first_seen.contains_key(name));
        if self.listed.is_none_or(|at| now - at >= RECOUNT_EVERY) {
            self.jobs.clear();
            self.listed = Some(now);
        }
        let mut counted: HashMap<String, usize> = HashMap::new();
        // Periods to look up, a statement's worth at a time: the new fires
        // of a minute (60 of an every-second job) are never all held.
        let mut asked: Vec<(String, OpenFire, String)> = Vec::new();
        for job in jobs {
            let Some(seen) = first_seen.get(&job.name) else {
                continue;
            };
            let since = window.max(job.owed_from(Some(seen.first_seen), seen.owed_from, now));
            let open = self.jobs.entry(job.name.clone()).or_insert_with(|| Open {
                job: job.clone(),
                upto: since,
                next: None,
                fires: BTreeSet::new(),
            });
            let same = Arc::ptr_eq(&open.job, job);
            // No fire since the last count: what was open is all there is.
            let quiet = same && open.next.is_some_and(|next| next > now);
            // Only `missed = "all"` keeps what was due before: with the
            // others only the latest fire is due, listed afresh each time.
            let from = if same && (quiet || job.missed == Missed::All) {
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
            let kept = std::mem::take(&mut open.fires)
                .split_off(&(since, DateTime::<Utc>::MIN_UTC))
                .into_iter();
            let new = match quiet {
                true => Vec::new(),
                false => due(job, now, from, true),
            };
            let new = new
                .into_iter()
                .filter(|d| d.fire >= from)
                .filter_map(|d| Some((d.fire, job.period.fire_for(&job.schedule, &d.period)?)));
            for (fire, nominal) in kept.chain(new) {
                let period = job.period.period_of(&job.schedule, nominal);
                let key = PeriodKey::new(&job.name, &period.label).to_string();
                asked.push((job.name.clone(), (fire, nominal), key));
                if asked.len() == LOOKUP_CHUNK {
                    self.look_up(store, &mut asked, &mut counted).await?;
                }
            }
        }
        self.look_up(store, &mut asked, &mut counted).await?;
        Ok(counted)
    }

    /// Looks `asked` up, emptying it: a period found succeeded is done
    /// with, one running stays open, the rest stay open and are counted.
    async fn look_up(
        &mut self,
        store: &Store,
        asked: &mut Vec<(String, OpenFire, String)>,
        counted: &mut HashMap<String, usize>,
    ) -> Result<(), Error> {
        if asked.is_empty() {
            return Ok(());
        }
        let keys: Vec<String> = asked.iter().map(|(_, _, key)| key.clone()).collect();
        let rows = store.rows(&keys).await?;
        let waiting = waiting_among(store, &keys, |name| {
            self.jobs.get(name).is_some_and(|open| open.job.after.any())
        })
        .await?;
        for (name, fire, key) in asked.drain(..) {
            let claim = rows.get(&key).map(ClaimRow::as_claim);
            // Not looked up again until the next full count.
            if matches!(claim, Some(Claim::Succeeded { .. })) {
                continue;
            }
            // A period waiting for its upstream periods is not overdue:
            // it is claimed once they are done.
            if !matches!(claim, Some(Claim::Held { .. })) && !waiting.contains_key(&key) {
                *counted.entry(name.clone()).or_default() += 1;
            }
            if let Some(open) = self.jobs.get_mut(&name) {
                open.fires.insert(fire);
            }
        }
        Ok(())
    }
}

/// How many keys one statement looks up.
const LOOKUP_CHUNK: usize = 1_000;

/// Of `keys`, those noted as waiting for upstream periods, if a job
/// `waits` says may have such periods; none looked up otherwise.
async fn waiting_among(
    store: &Store,
    keys: &[String],
    waits: impl Fn(&str) -> bool,
) -> Result<HashMap<String, String>, Error> {
    let jobs = keys
        .iter()
        .map(|key| key.split_once(':').map_or("", |(job, _)| job));
    match jobs.into_iter().any(waits) {
        true => store.waits(keys).await,
        false => Ok(HashMap::new()),
    }
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
            let deadline = TimeDelta::from_std(job.deadline?).ok()?;
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
    let names: Vec<String> = jobs.iter().map(|(j, _, _)| j.name.clone()).collect();
    let first_seen = store.first_seen(&names).await?;
    let mut open: HashMap<String, Vec<(String, DateTime<Utc>)>> = HashMap::new();
    // Looked up a statement's worth at a time: only the open ones are
    // kept, however long the window.
    let mut asked: Vec<Asked> = Vec::new();
    for (job, from, until) in jobs {
        // Never seen: it owes nothing yet.
        let Some(seen) = first_seen.get(&job.name) else {
            continue;
        };
        let since = (*from).max(job.owed_from(Some(seen.first_seen), seen.owed_from, *until));
        if *until < since {
            continue;
        }
        for d in due(job, *until, since, true)
            .into_iter()
            .filter(|d| d.fire >= since)
        {
            asked.push(Asked {
                job: job.name.clone(),
                key: PeriodKey::new(&job.name, &d.period.label).to_string(),
                fire: d.fire,
                deadline: job
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
    let keys: Vec<String> = asked.iter().map(|a| a.key.clone()).collect();
    let rows = store.rows(&keys).await?;
    for Asked {
        job,
        key,
        fire,
        deadline,
    } in asked.drain(..)
    {
        let in_time = match rows.get(&key).map(ClaimRow::as_claim) {
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
mod tests {
    use super::*;
    use crate::config::Config;
    use crate::engine::{Ask, Engine, Taken};
    use crate::state::ClaimState;

    fn at(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s)
            .expect("an instant")
            .to_utc()
    }

    fn jobs(text: &str) -> Vec<Job> {
        Config::parse(std::path::Path::new("jobs.toml"), text, &|_| None)
            .expect("valid jobs")
            .jobs
    }

    /// A claim row of `label` in `state` at attempt `attempt`, its lease
    /// (for a running one) live until `until`, read at `now`.
    fn row(label: &str, state: ClaimState, attempt: i32, now: &str) -> ClaimRow {
        let now = at(now);
        ClaimRow {
            period_key: format!("x:{label}"),
            period: label.into(),
            state,
            attempt,
            failures: i32::from(state == ClaimState::Failed),
            owner: "h".into(),
            lease_until: state.is_live().then(|| now + TimeDelta::seconds(30)),
            started_at: Some(now),
            retry_at: None,
            finished_at: state.is_finished().then_some(now),
            claimable: false,
            now,
        }
    }

    fn waiting_for_ingest() -> super::super::after::Upstream {
        super::super::after::Upstream {
            waits: vec![super::super::after::Wait {
                job: "ingest".into(),
                done: 29,
                needed: 30,
                missing: vec!["2026-11-30".into()],
                claimed: vec![None],
            }],
            ..Default::default()
        }
    }

    /// The one rule (docs/commands.md), as a table: every state, a first sighting
    /// inside and outside `catch_up` (and none), each `missed` policy, the
    /// deadline's mark, upstream periods noted or not, a DST shift and a
    /// calendar's move.
    #[test]
    fn the_one_rule_decides_every_state_the_same_way() {
        let month = "[[job]]\nname = \"x\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ncovers = \"previous\"\n\
                     deadline = \"6h\"\ncommand = [\"true\"]\n";
        let job = &jobs(month)[0];
        let latest = &jobs(&month.replace("command", "missed = \"latest\"\ncommand"))[0];
        let skip = &jobs(&month.replace("command", "missed = \"skip\"\ncommand"))[0];
        let after = &jobs(&format!(
            "{month}after = [\"ingest\"]\n\n[[job]]\nname = \"ingest\"\nschedule = \"0 1 * * *\"\nperiod = \"day\"\ncommand = [\"true\"]\n"
        ))[0];
        let none = super::super::after::Upstream::default();
        let waits = waiting_for_ingest();
        use PeriodState::*;
        // (job, label, row, first seen, noted, upstream, now) -> (state, late)
        type Case<'a> = (
            &'a Job,
            &'a str,
            Option<ClaimRow>,
            Option<&'a str>,
            bool,
            &'a super::super::after::Upstream,
            &'a str,
            PeriodState,
            bool,
        );
        let dec5 = "2026-12-05T12:00:00Z";
        let cases: Vec<Case> = vec![
            // First seen 5 December: November fired 1 December, outside
            // catch_up (24h) of the sighting: before first seen, never late.
            (
                job,
                "2026-11",
                None,
                Some("2026-12-05T10:00:00Z"),
                false,
                &none,
                dec5,
                BeforeFirstSeen,
                false,
            ),
            (
                job,
                "2026-12",
                None,
                Some("2026-12-05T10:00:00Z"),
                false,
                &none,
                dec5,
                NotDue,
                false,
            ),
            // Never seen: what a first run now would take.
            (
                job,
                "2026-11",
                None,
                None,
                false,
                &none,
                dec5,
                BeforeFirstSeen,
                false,
            ),
            (
                job,
                "2026-11",
                None,
                None,
                false,
                &none,
                "2026-12-01T03:00:00Z",
                Due,
                false,
            ),
            // First seen within catch_up of the 1 December fire: owed.
            (
                job,
                "2026-11",
                None,
                Some("2026-12-01T03:00:00Z"),
                false,
                &none,
                "2026-12-01T05:00:00Z",
                Due,
                false,
            ),
            (
                job,
                "2026-11",
                None,
                Some("2026-12-01T03:00:00Z"),
                false,
                &none,
                "2026-12-01T09:00:00Z",
                Due,
                true,
            ),
            (
                job,
                "2026-11",
                None,
                Some("2026-12-01T03:00:00Z"),
                false,
                &none,
                dec5,
                Missed,
                true,
            ),
            (
                job,
                "2026-10",
                None,
                Some("2026-12-01T03:00:00Z"),
                false,
                &none,
                dec5,
                BeforeFirstSeen,
                false,
            ),
            // Seen long ago: the policies of `missed`.
            (
                job,
                "2026-10",
                None,
                Some("2026-01-01T00:00:00Z"),
                false,
                &none,
                "2026-12-01T03:00:00Z",
                Missed,
                true,
            ),
            (
                latest,
                "2026-11",
                None,
                Some("2026-01-01T00:00:00Z"),
                false,
                &none,
                "2026-12-01T03:00:00Z",
                Due,
                false,
            ),
            (
                skip,
                "2026-11",
                None,
                Some("2026-01-01T00:00:00Z"),
                false,
                &none,
                "2026-12-01T03:00:00Z",
                Due,
                false,
            ),
            // Claims, whoever made them, whenever the job was seen.
            (
                job,
                "2026-11",
                Some(row("2026-11", ClaimState::Succeeded, 1, dec5)),
                None,
                false,
                &none,
                dec5,
                Succeeded,
                false,
            ),
            (
                job,
                "2026-11",
                Some(row("2026-11", ClaimState::Succeeded, 0, dec5)),
                None,
                false,
                &none,
                dec5,
                Adopted,
                false,
            ),
            (
                job,
                "2026-11",
                Some(row("2026-11", ClaimState::Failed, 1, dec5)),
                Some("2026-12-01T03:00:00Z"),
                false,
                &none,
                dec5,
                Failed,
                true,
            ),
            (
                job,
                "2026-11",
                Some(row("2026-11", ClaimState::Running, 2, dec5)),
                Some("2026-12-01T03:00:00Z"),
                false,
                &none,
                dec5,
                Running,
                true,
            ),
            (
                job,
                "2026-11",
                Some(row("2026-11", ClaimState::Released, 2, dec5)),
                None,
                false,
                &none,
                dec5,
                Stopping,
                false,
            ),
            // Upstream periods: noted waiting runs once ready, whenever it
            // fired; not noted and owed waits; not noted and before first
            // seen is nobody's.
            (
                after,
                "2026-11",
                None,
                Some("2026-12-05T10:00:00Z"),
                true,
                &waits,
                dec5,
                Waiting,
                false,
            ),
            (
                after,
                "2026-11",
                None,
                Some("2026-12-05T10:00:00Z"),
                true,
                &none,
                dec5,
                Ready,
                false,
            ),
            (
                after,
                "2026-11",
                None,
                Some("2026-12-01T03:00:00Z"),
                false,
                &waits,
                "2026-12-01T04:00:00Z",
                Waiting,
                false,
            ),
            (
                after,
                "2026-11",
                None,
                Some("2026-12-01T03:00:00Z"),
                false,
                &none,
                "2026-12-01T04:00:00Z",
                Ready,
                false,
            ),
            (
                after,
                "2026-11",
                None,
                Some("2026-12-05T10:00:00Z"),
                false,
                &waits,
                dec5,
                BeforeFirstSeen,
                false,
            ),
        ];
        for (n, (job, label, row, seen, noted, upstream, now, state, late)) in
            cases.into_iter().enumerate()
        {
            let period = job
                .period
                .parse_label(&job.schedule, label)
                .expect("a label");
            let sighting = Sighting {
                first_seen: seen.map(at),
                owed_from: None,
                noted,
            };
            let got = standing(job, &period, row.as_ref(), sighting, upstream, at(now));
            assert_eq!(
                (got.state, got.late),
                (state, late),
                "case {n}: {label} at {now}"
            );
        }
    }

    /// The rule across a spring-forward and a calendar's move: a fire
    /// shifted out of the gap, or moved to a working day, is owed from
    /// where it runs.
    #[test]
    fn a_shifted_or_moved_fire_is_owed_from_where_it_runs() {
        let none = super::super::after::Upstream::default();
        // The state of `label` of `job`, first seen at `seen`, at `now`.
        let state = |job: &Job, label: &str, seen: &str, now: &str| {
            let period = job
                .period
                .parse_label(&job.schedule, label)
                .expect("a label");
            let sighting = Sighting {
                first_seen: Some(at(seen)),
                owed_from: None,
                noted: false,
            };
            standing(job, &period, None, sighting, &none, at(now)).state
        };
        let dst = &jobs(
            "[[job]]\nname = \"x\"\nschedule = \"30 2 * * *\"\ntimezone = \"America/New_York\"\nperiod = \"day\"\ncommand = [\"true\"]\n",
        )[0];
        // 8 March 2026: 02:30 does not exist; the fire runs at 03:00 EDT
        // (07:00Z). Seen half an hour later: owed. Seen the next morning
        // after its own fire: the 8th is history.
        assert_eq!(
            dst.owed_since(at("2026-03-08T07:30:00Z")),
            at("2026-03-08T07:00:00Z")
        );
        let (seen, now) = ("2026-03-08T07:30:00Z", "2026-03-08T08:00:00Z");
        assert_eq!(state(dst, "2026-03-08", seen, now), PeriodState::Due);
        let (seen, now) = ("2026-03-09T07:00:00Z", "2026-03-09T08:00:00Z");
        assert_eq!(
            state(dst, "2026-03-08", seen, now),
            PeriodState::BeforeFirstSeen
        );

        let moved = &jobs(
            "[[calendar]]\nname = \"business\"\n\n[[job]]\nname = \"x\"\nschedule = \"0 9 * * *\"\nperiod = \"day\"\n\
             calendar = \"business\"\non_day_off = \"next\"\ncommand = [\"true\"]\n",
        )[0];
        // Seen on Sunday 3 January 2027: Saturday's fire runs on Monday
        // at 09:00, after the sighting, so it is owed; Friday's is not.
        let sunday = "2027-01-03T12:00:00Z";
        let (sunday_later, monday) = ("2027-01-03T13:00:00Z", "2027-01-04T10:00:00Z");
        assert_eq!(
            state(moved, "2027-01-02", sunday, sunday_later),
            PeriodState::NotDue
        );
        assert_eq!(state(moved, "2027-01-02", sunday, monday), PeriodState::Due);
        assert_eq!(
            state(moved, "2027-01-01", sunday, monday),
            PeriodState::BeforeFirstSeen
        );
    }

    /// The gauge's count, kept from one count to the next, agrees with a
    /// count afresh at every step: new fires, a success, a failure, and
    /// jobs whose next fire has not come (counted from what was open).
    #[tokio::test]
    async fn the_gauge_counted_on_from_the_last_count_agrees_with_a_count_afresh() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let store = Store::connect(&url).await.expect("a SQLite store");
        store.migrate().await.expect("migrated");
        let engine = Engine::new(
            store.clone(),
            std::time::Duration::from_secs(30),
            "t".into(),
        )
        .expect("an engine");
        let text = "[[job]]\nname = \"ok\"\nschedule = \"* * * * * *\"\nsql = { statement = \"SELECT 1\" }\n\n\
                    [[job]]\nname = \"bad\"\nschedule = \"* * * * * *\"\nsql = { statement = \"SELECT nope\" }\n\n\
                    [[job]]\nname = \"latest\"\nschedule = \"* * * * * *\"\nmissed = \"latest\"\nsql = { statement = \"SELECT 1\" }\n\n\
                    [[job]]\nname = \"slow\"\nschedule = \"*/3 * * * * *\"\nmissed = \"latest\"\nsql = { statement = \"SELECT nope\" }\n\n\
                    [[job]]\nname = \"slow-all\"\nschedule = \"*/2 * * * * *\"\nsql = { statement = \"SELECT nope\" }\n";
        let config =
            Config::parse(std::path::Path::new("jobs.toml"), text, &|_| None).expect("valid jobs");
        let jobs: Vec<Arc<Job>> = config.jobs.into_iter().map(Arc::new).collect();
        let names: Vec<String> = jobs.iter().map(|j| j.name.clone()).collect();
        store.see_jobs(&names).await.expect("jobs seen");
        let catch_up = std::time::Duration::from_secs(3600);
        let mut kept = OverdueCount::default();
        // A count afresh: the one overview `status` shows, the jobs'
        // catch_up set to the count's.
        let afresh_within = |now, catch_up| {
            let store = store.clone();
            let jobs: Vec<Job> = jobs
                .iter()
                .map(|j| Job {
                    catch_up,
                    ..(**j).clone()
                })
                .collect();
            async move {
                let refs: Vec<&Job> = jobs.iter().collect();
                let all = super::super::overview::of_jobs(&store, &refs, 1, now)
                    .await
                    .expect("a count");
                all.into_iter()
                    .filter(|o| !o.overdue.is_empty())
                    .map(|o| (o.job.name.clone(), o.overdue.len()))
                    .collect::<HashMap<String, usize>>()
            }
        };
        let afresh = |now| afresh_within(now, catch_up);
        let mut seen = Vec::new();
        for step in 0..4 {
            tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
            let now = Utc::now();
            if step == 2 {
                // Run every due period of `ok` and `bad`: the first
                // succeed, the second fail for good.
                for job in &jobs[..2] {
                    let since = now - TimeDelta::seconds(10);
                    for d in due(job, now, since, true) {
                        let ask = Ask::scheduled(job.clone(), d);
                        let taken = engine
                            .claim(std::slice::from_ref(&ask))
                            .await
                            .expect("a claim");
                        if let Some(Taken::Won(won)) = taken.into_iter().next() {
                            let (_stop, stop_now) = tokio::sync::watch::channel(false);
                            engine.run(ask, won, stop_now).await;
                        }
                    }
                }
            }
            let counted = kept
                .count(&store, &jobs, catch_up, now)
                .await
                .expect("a count");
            assert_eq!(counted, afresh(now).await, "step {step}");
            // Counted again with no fire since: nothing new is listed, and
            // the answer is the same.
            let again = kept
                .count(&store, &jobs, catch_up, now)
                .await
                .expect("a count");
            assert_eq!(again, counted, "step {step}, no fire since");
            seen.push(counted);
        }
        // A succeeded period of `ok` rerun by hand with `--force` fails
        // (its statement changed meanwhile): counted again at the full
        // count of the hour.
        let now = Utc::now();
        let failing = Config::parse(
            std::path::Path::new("jobs.toml"),
            "[[job]]\nname = \"ok\"\nschedule = \"* * * * * *\"\nsql = { statement = \"SELECT nope\" }\n",
            &|_| None,
        )
        .expect("a valid job")
        .jobs
        .remove(0);
        // A fire of two seconds ago: after the first sighting, run at step 2.
        let mut fires = due(&jobs[0], now, now - TimeDelta::seconds(3), true);
        let rerun = fires.remove(fires.len() - 3);
        let mut ask = Ask::scheduled(Arc::new(failing), rerun);
        ask.mode.manual = true;
        ask.mode.force = true;
        let taken = engine
            .claim(std::slice::from_ref(&ask))
            .await
            .expect("a claim");
        let Some(Taken::Won(won)) = taken.into_iter().next() else {
            panic!("the forced rerun is not won");
        };
        let (_stop, stop_now) = tokio::sync::watch::channel(false);
        engine.run(ask, won, stop_now).await;
        let later = now + TimeDelta::minutes(61);
        let longer = std::time::Duration::from_secs(2 * 3600);
        let counted = kept
            .count(&store, &jobs, longer, later)
            .await
            .expect("a count");
        assert_eq!(counted, afresh_within(later, longer).await, "an hour on");
        assert!(seen[0].get("ok").copied().unwrap_or(0) >= 1, "{seen:?}");
        assert_eq!(seen[2].get("ok"), None, "{seen:?}");
        assert!(seen[2].get("bad").copied().unwrap_or(0) >= 3, "{seen:?}");
        assert_eq!(seen[3].get("latest"), Some(&1), "{seen:?}");
    }
}
