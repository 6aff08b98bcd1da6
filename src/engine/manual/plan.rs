//! Planning: which periods of which jobs a manual run goes through, in
//! which order — a job's due periods as `serve` would take them, a label
//! or a range, the upstream periods run first (`--with-upstream`), and the
//! downstream periods the run makes ready.

use chrono::{DateTime, Utc};
use std::sync::Arc;

use super::Sink;
use super::request::{Request, manual_range};
use crate::config::{Config, Job};
use crate::engine::due::{self, Due, due};
use crate::error::Error;
use crate::period::walk::RangeWalk;
use crate::period::{Period, PeriodKey, utc_text};
use crate::store::{Store, Trigger};

/// How many periods are looked up and claimed per database round trip; a
/// range is held in memory this many at a time, whatever its length.
const CHUNK: usize = 1_000;

/// Up to how many periods a range is counted for its progress bar; a longer
/// one shows its position without a length.
const COUNT_LIMIT: u64 = 100_000;

/// One job's periods to go through, oldest first.
pub(super) struct Plan<'a> {
    pub(super) job: &'a Job,
    pub(super) periods: Periods,
    pub(super) manual: bool,
    /// Succeeded periods are run again (`--force`; never an upstream
    /// period run first by `--with-upstream`).
    pub(super) force: bool,
    /// Periods of an upstream job run first by `--with-upstream`: those
    /// already succeeded are passed over without a line.
    pub(super) upstream: bool,
    /// A job that waits for the jobs run before it (`after`): its periods
    /// noted waiting that those runs made ready, worked out when its turn
    /// comes (the drive's `Backfill::made_ready`).
    pub(super) downstream: bool,
}

/// A job's periods, handed out a chunk at a time.
pub(super) enum Periods {
    /// Worked out in full (a scheduled run: at most the catch-up window).
    Listed(std::vec::IntoIter<Due>),
    /// `--period` or `--from/--to`: walked as it goes, never stored whole.
    Range(RangeWalk),
}

impl Periods {
    /// The next [`CHUNK`] or so, as shards for a job whose periods are
    /// split.
    pub(super) fn chunk(&mut self, job: &Job, now: DateTime<Utc>) -> Vec<Due> {
        match self {
            Periods::Listed(dues) => dues.take(CHUNK).collect(),
            Periods::Range(walk) => std::iter::from_fn(|| walk.step(&job.period, &job.schedule))
                .take((CHUNK / job.policy.shards.max(1) as usize).max(1))
                .flat_map(|p| manual_due(job, p, now))
                .collect(),
        }
    }

    /// How many periods there are, if that is quick to know.
    pub(super) fn len(&self, job: &Job) -> Option<u64> {
        match self {
            Periods::Listed(dues) => Some(dues.len() as u64),
            Periods::Range(walk) => {
                let mut walk = walk.clone();
                let mut n = 0;
                while walk.step(&job.period, &job.schedule).is_some() {
                    n += 1;
                    if n > COUNT_LIMIT {
                        return None;
                    }
                }
                Some(n)
            }
        }
    }
}

/// Why `run JOB` finds nothing of `job` to run now, and when its next
/// fire is: for a job first seen now whose latest fire is older than
/// `catch_up`, that fire and how to run it all the same.
fn nothing_due(
    job: &Job,
    seen: &crate::store::JobRecord,
    owed: DateTime<Utc>,
    now: DateTime<Utc>,
) -> String {
    let timing = job.timing();
    let key_of =
        |fire: &crate::fires::Fire| PeriodKey::new(&job.name, &timing.period_of(fire).label);
    let next = match timing.next(now) {
        Some(fire) => format!("its next fire is {} ({})", utc_text(fire.at), key_of(&fire)),
        None => "it has no fire to come (past its last active date)".to_owned(),
    };
    let passed = timing.latest(now).filter(|fire| seen.new && fire.at < owed);
    match passed {
        Some(fire) => {
            let key = key_of(&fire);
            format!(
                "nothing due now: first seen now, and its latest fire ({key}, at {}) is older than catch_up ({}), so it does not run on its own (`scheduler run {} --period {}` runs it by hand; `scheduler adopt` records it as run elsewhere); {next}",
                utc_text(fire.at),
                humantime::format_duration(job.policy.catch_up),
                job.name,
                timing.period_of(&fire).label
            )
        }
        None => format!("nothing due now; {next}"),
    }
}

/// How `job` stands as `run JOB` sees it: recorded as seen (now, if this
/// is its first sighting), or, for `--dry-run`, which writes nothing, as it
/// would be: a job never seen would be seen now.
async fn sighting(
    store: &Store,
    job: &Job,
    dry_run: bool,
    now: DateTime<Utc>,
) -> Result<Option<crate::store::JobRecord>, Error> {
    let name = &[job.name.to_string()];
    if !dry_run {
        return Ok(store.see_jobs(name).await?.remove(&*job.name));
    }
    let seen = store.first_seen(name).await?.remove(&*job.name);
    let paused = store.paused_jobs().await?.iter().any(|p| *p == *job.name);
    Ok(Some(crate::store::JobRecord {
        first_seen: seen.as_ref().map_or(now, |s| s.first_seen),
        owed_from: seen.as_ref().and_then(|s| s.owed_from),
        timing: seen.as_ref().and_then(|s| s.timing.clone()),
        owed_period: seen.as_ref().and_then(|s| s.owed_period),
        paused,
        new: seen.is_none(),
    }))
}

/// How many retryable or recoverable periods of a job one `run` takes.
pub(super) const RECLAIM_LIMIT: u32 = 1_000;

/// Works out which periods `request` asks for.
pub(super) async fn plan<'a>(
    config: &'a Config,
    store: &Store,
    request: &Request,
    now: DateTime<Utc>,
    sink: &mut dyn Sink,
) -> Result<Vec<Plan<'a>>, Error> {
    let jobs: Vec<&Job> = match &request.job {
        Some(name) => vec![config.job(name)?],
        // Every job, each after the jobs it waits for: a period whose
        // upstream runs in the same `run --all` is not left waiting.
        None => in_dependency_order(&config.jobs),
    };
    let mut plans = Vec::with_capacity(jobs.len());
    for job in jobs {
        let manual = request.manual();
        let periods = if let Some(walk) = manual_range(job, request, now)? {
            if request.with_upstream {
                plans.extend(upstream_plans(config, job, walk.clone(), now)?);
            }
            Periods::Range(walk)
        } else {
            match due_periods(config, store, job, request, now, sink).await? {
                Some(listed) => Periods::Listed(listed.into_iter()),
                None => continue,
            }
        };
        plans.push(Plan {
            job,
            periods,
            manual,
            force: request.force,
            upstream: false,
            downstream: false,
        });
    }
    // A run of an upstream job runs what it made ready downstream, in a
    // platform cron container as `serve`'s scan would within seconds, not
    // at the downstream job's next fire (a month later for a monthly
    // report). `run --all` runs every job already; a dry run makes
    // nothing ready.
    if let Some(name) = request.job.as_deref().filter(|_| !request.dry_run) {
        let name = config.full_name(name);
        plans.extend(downstream_of(config, &name).into_iter().map(|job| Plan {
            job,
            periods: Periods::Listed(Vec::new().into_iter()),
            manual: false,
            force: false,
            upstream: false,
            downstream: true,
        }));
    }
    Ok(plans)
}

/// The periods of `job` a scheduled run (`run JOB`, `run --all`) takes,
/// oldest first; `None` for a job it passes over (paused, or a dry run's
/// job nothing would see).
async fn due_periods(
    config: &Config,
    store: &Store,
    job: &Job,
    request: &Request,
    now: DateTime<Utc>,
    sink: &mut dyn Sink,
) -> Result<Option<Vec<Due>>, Error> {
    let seen = sighting(store, job, request.dry_run, now).await?;
    let Some(seen) = seen else {
        return Ok(None);
    };
    if seen.paused {
        sink.paused(&job.name);
        return Ok(None);
    }
    let window = now - chrono::Duration::from_std(config.settings.catch_up).unwrap_or_default();
    // What `serve` would take at this instant (docs/commands.md,
    // "One period, one meaning"): the fires the job owes, as its
    // first sighting fixed them, within the window; the latest one
    // too only if it is owed (a job first seen days after its
    // monthly fire does not run that month on its own). A dry run
    // records nothing.
    let owed = match request.dry_run {
        true => crate::engine::owed::owing(store, [job], now)
            .await?
            .owed_at(job, now),
        false => crate::engine::owed::owed_from(store, job, &seen, now).await,
    };
    let since = window.max(owed);
    let mut listed = due(job, now, since, true);
    listed.retain(|d| d.fire >= since);
    let again = taken_again(store, job, window, now).await?;
    merge(&mut listed, again);
    listed.sort_by_key(|d| d.fire);
    // A first sighting says what it owes: with nothing to run,
    // through the line saying so.
    if listed.is_empty() {
        sink.nothing_due(&job.name, &nothing_due(job, &seen, owed, now));
    } else if seen.new && !request.dry_run {
        due::log_first_sighting(job, owed);
    }
    Ok(Some(listed))
}

/// The periods of `job` a scheduled run takes besides its due fires:
/// retries, recoveries, periods noted waiting, and succeeded ones an
/// upstream rerun made stale (reopened here).
async fn taken_again(
    store: &Store,
    job: &Job,
    window: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<Vec<Due>, Error> {
    // Failed periods whose retry is due, and claims whose lease ran
    // out or that were released, run again as `serve`'s scan would
    // take them, however old: a platform cron container may be all
    // there is, and `catch_up` bounds only periods never claimed.
    let again = store
        .reclaimable(&[job.name.to_string()], RECLAIM_LIMIT, true)
        .await?;
    // A period that waited for its upstream runs as `upstream`,
    // whether or not it is also among the due ones.
    let (reopened, _) = crate::engine::rerun::reopen_stale(store, &[job], window, now).await?;
    // Every period of the job noted waiting goes to the claim's
    // gate, which claims the ready ones: what it waits for may
    // have changed with jobs.toml since it was noted.
    let noted = store
        .waiting_periods(&[job.name.to_string()], RECLAIM_LIMIT)
        .await?;
    let again = again.into_iter().chain(noted).flat_map(|r| {
        let due = Due {
            trigger: match r.trigger {
                Trigger::Upstream => Trigger::Upstream,
                _ => Trigger::Retry,
            },
            period: r.period,
            fire: r.scheduled_at,
            shard: r.shard,
        };
        Due::sharded(job, due)
    });
    // Succeeded periods an upstream rerun made stale, for a job
    // that reruns on it, as `serve`'s scan would take them.
    Ok(again
        .chain(reopened.into_iter().map(|(_, due)| due))
        .collect())
}

/// Adds `more` to `listed`, each period (each shard) once: one listed
/// already keeps its place, and becomes `upstream` if it is one in `more`.
fn merge(listed: &mut Vec<Due>, more: Vec<Due>) {
    for due in more {
        match listed
            .iter_mut()
            .find(|d| d.period.label == due.period.label && d.shard == due.shard)
        {
            Some(listed) if due.trigger == Trigger::Upstream => {
                listed.trigger = Trigger::Upstream;
            }
            Some(_) => {}
            None => listed.push(due),
        }
    }
}

/// The jobs that wait, directly or through others, for job `name`, each
/// after every job of its `after`.
fn downstream_of<'a>(config: &'a Config, name: &str) -> Vec<&'a Job> {
    let mut reached: std::collections::HashSet<&str> = std::collections::HashSet::new();
    reached.insert(name);
    let mut found = Vec::new();
    for job in in_dependency_order(&config.jobs) {
        if job
            .after
            .upstream
            .iter()
            .any(|up| reached.contains(up.job.as_str()))
        {
            reached.insert(&job.name);
            found.push(job);
        }
    }
    found
}

/// `jobs`, each after every job of its `after`, otherwise in their order.
fn in_dependency_order(jobs: &[Arc<Job>]) -> Vec<&Job> {
    let mut ordered: Vec<&Job> = Vec::with_capacity(jobs.len());
    let mut done: std::collections::HashSet<&str> = std::collections::HashSet::new();
    let mut left: Vec<&Job> = jobs.iter().map(|j| &**j).collect();
    while !left.is_empty() {
        let before = left.len();
        left.retain(|job| {
            let ready = job
                .after
                .upstream
                .iter()
                .all(|up| done.contains(up.job.as_str()));
            if ready {
                ordered.push(job);
                done.insert(&job.name);
            }
            !ready
        });
        // No cycle passes the load; were one here, the rest in order.
        if left.len() == before {
            ordered.append(&mut left);
        }
    }
    ordered
}

/// The plans that run first, for `--with-upstream`, the upstream periods
/// of the periods of `walk`: each upstream job's due periods that they
/// need, through the upstream jobs' own `after`, a job's after all of its
/// upstream jobs'. None is forced: a succeeded one is passed over.
fn upstream_plans<'a>(
    config: &'a Config,
    job: &Job,
    mut walk: RangeWalk,
    now: DateTime<Utc>,
) -> Result<Vec<Plan<'a>>, Error> {
    // Each job reached, with the labels wanted of it; in the order their
    // plans run (a job after every job it waits for).
    let mut wanted: Vec<(&'a Job, Vec<Period>)> = Vec::new();
    let mut asked: Vec<(String, String)> = Vec::new();
    while let Some(period) = walk.step(&job.period, &job.schedule) {
        asked.extend(crate::engine::after::upstream_of(job, &period));
    }
    // Depth first: a job's upstream periods are added before it.
    fn reach<'a>(
        config: &'a Config,
        asked: Vec<(String, String)>,
        wanted: &mut Vec<(&'a Job, Vec<Period>)>,
        now: DateTime<Utc>,
    ) -> Result<(), Error> {
        let mut by_job: Vec<(String, Vec<String>)> = Vec::new();
        for (name, label) in asked {
            match by_job.iter_mut().find(|(job, _)| *job == name) {
                Some((_, labels)) => labels.push(label),
                None => by_job.push((name, vec![label])),
            }
        }
        for (name, labels) in by_job {
            let up = config.job(&name)?;
            let periods: Vec<Period> = labels
                .iter()
                .filter_map(|label| up.period.parse_label(&up.schedule, label).ok())
                .filter(|p| up.timing().of(p).is_some_and(|f| f <= now))
                .collect();
            let further: Vec<(String, String)> = periods
                .iter()
                .flat_map(|p| crate::engine::after::upstream_of(up, p))
                .collect();
            reach(config, further, wanted, now)?;
            match wanted.iter_mut().find(|(job, _)| job.name == up.name) {
                Some((_, known)) => {
                    for p in periods {
                        if !known.iter().any(|k| k.label == p.label) {
                            known.push(p);
                        }
                    }
                }
                None => wanted.push((up, periods)),
            }
        }
        Ok(())
    }
    reach(config, asked, &mut wanted, now)?;
    Ok(wanted
        .into_iter()
        .map(|(up, mut periods)| {
            periods.sort_by_key(|p| p.start);
            let dues: Vec<Due> = periods
                .into_iter()
                .flat_map(|p| manual_due(up, p, now))
                .collect();
            Plan {
                job: up,
                periods: Periods::Listed(dues.into_iter()),
                manual: true,
                force: false,
                upstream: true,
                downstream: false,
            }
        })
        .collect())
}

/// `dues` of `job` (as its shards now), each period split as it was last
/// claimed instead, where that differs: a period is never split two ways.
/// A due that names a shard of another count (a retry, a recovery) stays.
/// One read.
pub(super) async fn as_claimed(
    store: &Store,
    job: &Job,
    dues: Vec<Due>,
) -> Result<Vec<Due>, Error> {
    let mut periods: Vec<&Period> = Vec::new();
    for due in &dues {
        if periods.last().is_none_or(|p| p.label != due.period.label) {
            periods.push(&due.period);
        }
    }
    let asked: Vec<(&str, &Period, u32)> = periods
        .iter()
        .map(|period| (job.name.as_ref(), *period, job.policy.shards))
        .collect();
    let counts: std::collections::HashMap<String, u32> = crate::engine::shards::read(store, &asked)
        .await?
        .into_iter()
        .zip(&periods)
        .filter(|(claims, _)| claims.shards != job.policy.shards)
        .map(|(claims, period)| (period.label.clone(), claims.shards))
        .collect();
    if counts.is_empty() {
        return Ok(dues);
    }
    let mut split: Vec<Due> = Vec::with_capacity(dues.len());
    for due in dues {
        match counts.get(&due.period.label) {
            None => split.push(due),
            Some(shards) if due.shard.map_or(1, |s| s.of) == *shards => split.push(due),
            // The period's first due stands for it, split as claimed.
            Some(shards) if due.first_of_period() => split.extend(due.split(*shards)),
            Some(_) => {}
        }
    }
    // A shard asked for twice (a retry of it, and its period split anew)
    // is asked for once.
    let mut seen = std::collections::HashSet::new();
    split.retain(|due| seen.insert((due.period.label.clone(), due.shard)));
    Ok(split)
}

/// A period asked for by hand, as its shards for a job whose periods are
/// split.
fn manual_due(job: &Job, period: Period, now: DateTime<Utc>) -> Vec<Due> {
    let fire = job
        .timing()
        .of(&period)
        .filter(|f| *f <= now)
        .unwrap_or(now);
    Due::of(job, period, fire, Trigger::Manual)
}
