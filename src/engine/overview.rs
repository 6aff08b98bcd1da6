//! The one overview of a job: what `status`, `GET /v1/jobs` and the
//! console's jobs view show of it, composed once from the one period rule
//! ([`super::due::standing`]), a thousand periods per statement across
//! jobs.
//! The edges only turn it into words or JSON.

use chrono::{DateTime, TimeDelta, Utc};

use super::view;
use crate::config::{Config, Job};
use crate::error::Error;
use crate::period::{Period, PeriodKey};
use crate::state::{ClaimState, PeriodState};
use crate::store::{ClaimRow, Store};

/// How many noted waiting periods of one job an overview looks at.
const NOTED_LOOKED_AT: u32 = 1_000;

/// One job as it stands at an instant.
#[derive(Debug, Clone)]
pub struct JobOverview<'a> {
    /// The job.
    pub job: &'a Job,
    /// Paused for every replica: its fires are skipped, so nothing of it
    /// is overdue or late.
    pub paused: bool,
    /// When a `serve` or `run JOB` first saw it; `None`: never.
    pub first_seen: Option<DateTime<Utc>>,
    /// Its next fire and that fire's key; none while paused.
    pub next: Option<(DateTime<Utc>, PeriodKey)>,
    /// Its newest claims, every unsettled one, and the one that finished
    /// last ([`Store::recent`]).
    pub recent: Vec<ClaimRow>,
    /// Owed, within `catch_up`, not succeeded and nothing running (never
    /// claimed, failed, released, its lease expired), not waiting for an
    /// upstream period and not ready (listed apart).
    pub overdue: Vec<String>,
    /// Owed, within `catch_up`, past the deadline and not done.
    pub late: Vec<String>,
    /// Noted waiting, an upstream period still not succeeded: each key with
    /// what it waits for.
    pub waiting: Vec<(String, String)>,
    /// Noted waiting, every upstream period succeeded since, not claimed
    /// yet: the next scan or `run` (of it, or of its upstream job) takes it.
    pub ready: Vec<String>,
    /// Of the recent periods, the succeeded ones an upstream period made
    /// stale: each key with that upstream period and when it succeeded.
    pub stale: Vec<(String, String, DateTime<Utc>)>,
    /// For a job no process has seen yet: the keys a first `serve` or
    /// `run JOB` would take now (the latest fire, if within `catch_up`).
    pub first_run: Option<Vec<String>>,
}

impl JobOverview<'_> {
    /// The period that finished last (succeeded or failed).
    pub fn last(&self) -> Option<&ClaimRow> {
        ClaimRow::finished_last(&self.recent)
    }

    /// The recent claims an attempt may still run under.
    pub fn running(&self) -> impl Iterator<Item = &ClaimRow> {
        self.recent.iter().filter(|r| r.state.is_live())
    }

    /// The recent failed claims.
    pub fn failed(&self) -> impl Iterator<Item = &ClaimRow> {
        self.recent.iter().filter(|r| r.state == ClaimState::Failed)
    }

    /// How many retries a failed period has left.
    pub fn retries_left(&self, row: &ClaimRow) -> u32 {
        let failures = u32::try_from(row.failures).unwrap_or(0);
        match row.retry_at {
            Some(_) => self
                .job
                .policy
                .retry
                .attempts
                .saturating_sub(failures)
                .max(1),
            None => 0,
        }
    }
}

/// The overviews of `jobs` at `now`, in their order, each with its
/// `recent` newest claims. Its periods are classified by the one rule
/// ([`view::of_jobs`]), the same that `status --from/--to` and the grid
/// show: the periods a job owes within `catch_up` (those a first run
/// would take, for a job never seen) and the ones a gate noted waiting,
/// [`view::VIEWS_PER_READ`] at a time across jobs, keeping only the keys
/// each list needs; then each job's claims.
pub async fn of_jobs<'a>(
    store: &Store,
    jobs: &[&'a Job],
    recent: u32,
    now: DateTime<Utc>,
) -> Result<Vec<JobOverview<'a>>, Error> {
    let paused = store.paused_jobs().await?;
    let owing = super::owed::owing(store, jobs.iter().copied(), now).await?;
    let mut all = Vec::with_capacity(jobs.len());
    for job in jobs.iter().copied() {
        let paused = paused.iter().any(|p| *p == *job.name);
        let rows = store.recent(&job.name, recent).await?;
        all.push(JobOverview {
            job,
            paused,
            first_seen: owing.first_seen(&job.name),
            next: (!paused).then(|| next(job, now)).flatten(),
            stale: stale(store, job, &rows, now).await?,
            recent: rows,
            overdue: Vec::new(),
            late: Vec::new(),
            waiting: Vec::new(),
            ready: Vec::new(),
            first_run: None,
        });
    }
    // The periods to classify, a statement's worth at a time: a day of an
    // every-minute job's periods is never all held.
    let mut batch: Vec<(usize, Period)> = Vec::new();
    for (i, job) in jobs.iter().enumerate() {
        let from = owing.owed_at(job, now);
        let mut labels = std::collections::HashSet::new();
        for due in owed(job, from, now) {
            labels.insert(due.period.label.clone());
            batch.push((i, due.period));
            if batch.len() >= view::VIEWS_PER_READ {
                classify(store, &mut all, &mut batch, now).await?;
            }
        }
        if job.after.any() {
            let noted = store
                .waiting_periods(&[job.name.to_string()], NOTED_LOOKED_AT)
                .await?;
            for w in noted
                .into_iter()
                .filter(|w| !labels.contains(&w.period.label))
            {
                batch.push((i, w.period));
            }
        }
    }
    classify(store, &mut all, &mut batch, now).await?;
    for overview in all.iter_mut().filter(|o| o.first_seen.is_none()) {
        // What a first `serve` or `run JOB` would take now: what it owes,
        // and what waited and is ready.
        let mut first: Vec<String> = overview.overdue.clone();
        first.extend(overview.ready.iter().cloned());
        overview.first_run = Some(first);
    }
    Ok(all)
}

/// Classifies the periods of `batch` (each with the index of its job in
/// `all`) by the one rule into their jobs' lists, emptying it.
async fn classify(
    store: &Store,
    all: &mut [JobOverview<'_>],
    batch: &mut Vec<(usize, Period)>,
    now: DateTime<Utc>,
) -> Result<(), Error> {
    if batch.is_empty() {
        return Ok(());
    }
    // Consecutive periods of one job go together.
    let mut asked: Vec<(usize, Vec<Period>)> = Vec::new();
    for (i, period) in batch.drain(..) {
        match asked.last_mut() {
            Some((j, periods)) if *j == i => periods.push(period),
            _ => asked.push((i, vec![period])),
        }
    }
    let pairs: Vec<(&Job, &[Period])> = asked
        .iter()
        .map(|(i, periods)| (all[*i].job, periods.as_slice()))
        .collect();
    let views = view::of_jobs(store, &pairs, now).await?;
    for ((i, periods), views) in asked.iter().zip(views) {
        let overview = &mut all[*i];
        let window = window_start(overview.job, now);
        for (v, period) in views.into_iter().zip(periods) {
            let key = v.key.to_string();
            // Any of its fires due by now within the window: a period of
            // several fires is judged by its latest, as the runs take it.
            let in_window = v.fire.is_some_and(|f| f >= window)
                || super::due::fires_since(overview.job, period, window, now);
            match v.state {
                PeriodState::Waiting => {
                    overview.waiting.push((key.clone(), v.upstream.to_string()))
                }
                PeriodState::Ready => overview.ready.push(key.clone()),
                // A paused job skips its fires by design: none is overdue
                // or late.
                PeriodState::Due
                | PeriodState::Failed
                | PeriodState::Released
                | PeriodState::LeaseExpired
                    if in_window && !overview.paused =>
                {
                    overview.overdue.push(key.clone());
                }
                _ => {}
            }
            if v.late && in_window && !overview.paused {
                overview.late.push(key);
            }
        }
    }
    Ok(())
}

/// The start of `job`'s catch-up window at `now`.
fn window_start(job: &Job, now: DateTime<Utc>) -> DateTime<Utc> {
    TimeDelta::from_std(job.policy.catch_up)
        .ok()
        .and_then(|w| now.checked_sub_signed(w))
        .unwrap_or(DateTime::<Utc>::MIN_UTC)
}

/// The periods `job`, owing its fires from `from`, owes within `catch_up`
/// at `now` (as `missed` keeps them): what a wake-up, a scan or `run JOB`
/// takes if nothing ran them.
fn owed(job: &Job, from: DateTime<Utc>, now: DateTime<Utc>) -> Vec<super::due::Due> {
    let since = window_start(job, now).max(from);
    super::due::due(job, now, since, true)
        .into_iter()
        .filter(|d| d.fire >= since && d.first_of_period())
        .collect()
}

/// A job's next fire and its key.
fn next(job: &Job, now: DateTime<Utc>) -> Option<(DateTime<Utc>, PeriodKey)> {
    let timing = job.timing();
    let fire = timing.next(now)?;
    let period = timing.period_of(&fire);
    Some((fire.at, PeriodKey::new(&job.name, &period.label)))
}

/// The periods of `job` noted waiting and not yet claimed, split by the
/// one rule into those still waiting (with what for) and those ready.
pub async fn waiting_and_ready(
    store: &Store,
    job: &Job,
    now: DateTime<Utc>,
) -> Result<(Vec<(String, String)>, Vec<String>), Error> {
    if !job.after.any() {
        return Ok((Vec::new(), Vec::new()));
    }
    let noted = store
        .waiting_periods(&[job.name.to_string()], NOTED_LOOKED_AT)
        .await?;
    let periods: Vec<Period> = noted.into_iter().map(|w| w.period).collect();
    let mut waiting = Vec::new();
    let mut ready = Vec::new();
    for chunk in periods.chunks(view::VIEWS_PER_READ) {
        for v in view::periods(store, job, chunk, now).await? {
            match v.state {
                PeriodState::Waiting => waiting.push((v.key.to_string(), v.upstream.to_string())),
                PeriodState::Ready | PeriodState::Due | PeriodState::Missed => {
                    ready.push(v.key.to_string());
                }
                _ => {}
            }
        }
    }
    Ok((waiting, ready))
}

/// Of `recent` (claim rows of `job`), the succeeded ones made stale by an
/// upstream period that succeeded again since they started.
async fn stale(
    store: &Store,
    job: &Job,
    recent: &[ClaimRow],
    now: DateTime<Utc>,
) -> Result<Vec<(String, String, DateTime<Utc>)>, Error> {
    if !job.after.any() {
        return Ok(Vec::new());
    }
    let periods: Vec<Period> = recent
        .iter()
        .filter(|row| row.state == ClaimState::Succeeded)
        .filter_map(|row| job.period.parse_label(&job.schedule, &row.period).ok())
        .collect();
    Ok(view::periods(store, job, &periods, now)
        .await?
        .iter()
        .filter_map(|v| {
            let (upstream, at) = v.stale_by()?;
            Some((v.key.to_string(), upstream.to_owned(), at))
        })
        .collect())
}

/// [`of_jobs`] as JSON per job, one shape for `status --json` and
/// `GET /v1/jobs`: its schedule (in words too), calendar, `after`, next
/// fire, last claim, running and failed ones, overdue, late, waiting,
/// ready and stale periods, and for a job never seen what a first run
/// would take.
pub fn json(o: &JobOverview<'_>, config: &Config, now: DateTime<Utc>) -> serde_json::Value {
    use crate::period::utc_text;
    let running: Vec<serde_json::Value> = o
        .running()
        .map(|row| {
            let held = matches!(row.as_claim(), crate::store::Claim::Held { .. });
            serde_json::json!({
                "period_key": row.period_key,
                "attempt": row.attempt,
                "owner": row.owner,
                "state": row.state,
                "lease_until": row.lease_until.map(utc_text),
                "lease_left_s": row.lease_until.filter(|_| held).map(|u| (u - now).num_seconds().max(0)),
                "lease_expired": !held && row.state == ClaimState::Running,
            })
        })
        .collect();
    let failed: Vec<serde_json::Value> = o
        .failed()
        .map(|row| {
            serde_json::json!({
                "period_key": row.period_key,
                "attempt": row.attempt,
                "failures": row.failures,
                "retry_at": row.retry_at.map(utc_text),
                "retries_left": o.retries_left(row),
                "retries_exhausted": row.retry_at.is_none(),
            })
        })
        .collect();
    let job = o.job;
    let after: Vec<String> = job
        .after
        .named
        .iter()
        .map(|n| config.full_name(&n.name).into_owned())
        .collect();
    serde_json::json!({
        "job": job.name,
        "schedule": job.schedule.source(),
        "schedule_words": job.schedule.describe(),
        "calendar": calendar_of(job),
        "after": after,
        "on_upstream_rerun": job.after.any().then(|| job.after.on_rerun.to_string()),
        "timezone": job.schedule.zone().name(),
        "period": job.period.unit.to_string(),
        "covers": job.period.covers.to_string(),
        "paused": o.paused,
        "first_seen": o.first_seen.map(utc_text),
        "first_run": o.first_run,
        "next_fire": o.next.as_ref().map(|(fire, _)| utc_text(*fire)),
        "next_key": o.next.as_ref().map(|(_, key)| key.to_string()),
        "last": o.last(),
        "running": running,
        "failed": failed,
        "overdue": o.overdue,
        "deadline": job.policy.deadline.map(crate::config::short),
        "late": o.late,
        "waiting": o.waiting.len(),
        "waiting_periods": o
            .waiting
            .iter()
            .map(|(key, waits)| serde_json::json!({ "period_key": key, "waiting_for": waits }))
            .collect::<Vec<_>>(),
        "ready": o.ready,
        "stale": o
            .stale
            .iter()
            .map(|(key, upstream, at)| serde_json::json!({ "period_key": key, "upstream": upstream, "succeeded_at": utc_text(*at) }))
            .collect::<Vec<_>>(),
    })
}

/// A job's calendar, active dates and jitter, `null` where it has none.
fn calendar_of(job: &Job) -> serde_json::Value {
    let days = job.schedule.days();
    let (name, on_day_off) = match (
        &job.policy.fires.shift,
        days.and_then(|d| d.working.as_ref()),
    ) {
        (Some(shift), _) => (Some(shift.calendar.name.clone()), shift.to),
        (None, Some(calendar)) => (Some(calendar.name.clone()), Default::default()),
        (None, None) => (None, Default::default()),
    };
    let active_from = days.and_then(|d| d.from).map(|d| d.to_string());
    let active_until = days.and_then(|d| d.until).map(|d| d.to_string());
    let jitter = job.policy.fires.jitter.map(crate::config::short);
    if name.is_none() && active_from.is_none() && active_until.is_none() && jitter.is_none() {
        return serde_json::Value::Null;
    }
    serde_json::json!({
        "name": name,
        "on_day_off": name.is_some().then(|| on_day_off.to_string()),
        "active_from": active_from,
        "active_until": active_until,
        "jitter": jitter,
    })
}
