//! The operator's commands on the database: `status`, `history`, `release`,
//! `pause`/`resume` and `prune`.

use chrono::{DateTime, Utc};
use serde_json::json;

use crate::config::{Config, Job};
use crate::engine::due::due;
use crate::error::{Error, Outcome, Stop, say};
use crate::period::{PeriodKey, utc_text};
use crate::store::{Claim, ClaimRow, Released, Store};

/// How many recent periods `status` shows per job.
const RECENT: u32 = 5;

fn time(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(|| "-".to_owned(), utc_text)
}

/// `scheduler status [JOB] [--json]`.
pub async fn status(
    config: &Config,
    store: &Store,
    only: Option<&str>,
    as_json: bool,
    now: DateTime<Utc>,
) -> Result<Outcome, Stop> {
    let paused_jobs = store.paused_jobs().await?;
    for job in config
        .jobs
        .iter()
        .filter(|j| only.is_none_or(|name| j.name == name))
    {
        let paused = paused_jobs.contains(&job.name);
        let recent = store.recent(&job.name, RECENT).await?;
        let overdue = overdue(config, store, job, now).await?;
        let running: Vec<&ClaimRow> = recent
            .iter()
            .filter(|r| matches!(r.as_claim(), Claim::Held { .. }))
            .collect();
        let failed: Vec<&ClaimRow> = recent.iter().filter(|r| r.state == "failed").collect();
        let next = job.schedule.next_after(now);
        if as_json {
            let value = json!({
                "job": job.name,
                "schedule": job.schedule.source(),
                "timezone": job.schedule.zone().name(),
                "paused": paused,
                "next_fire": next.map(utc_text),
                "recent": recent,
                "running": running,
                "failed": failed,
                "overdue": overdue,
            });
            say(format_args!("{value}"))?;
            continue;
        }
        let next = if paused {
            format!(
                "PAUSED (nothing is scheduled; `scheduler resume {}`)",
                job.name
            )
        } else {
            format!("next {}", time(next))
        };
        say(format_args!(
            "{}  `{}` {}  {next}",
            job.name,
            job.schedule.source(),
            job.schedule.zone(),
        ))?;
        for row in &recent {
            let detail = describe(row);
            say(format_args!(
                "  {}  attempt {}  {detail}",
                row.period_key, row.attempt
            ))?;
        }
        if !overdue.is_empty() {
            let newest: Vec<&str> = overdue.iter().rev().take(5).map(String::as_str).collect();
            say(format_args!(
                "  overdue: {} period(s), newest: {}",
                overdue.len(),
                newest.join(", ")
            ))?;
        }
    }
    Ok(Outcome::Done)
}

/// One claim row in words an operator acts on.
fn describe(row: &ClaimRow) -> String {
    match (row.as_claim(), row.state.as_str()) {
        (Claim::Held { owner, until }, "released") => format!(
            "released by `scheduler release`; held until its runner {owner} confirms the job stopped, or {} at the latest",
            utc_text(until)
        ),
        (Claim::Held { owner, until }, _) => {
            format!("running on {owner} until {}", utc_text(until))
        }
        (_, "running") => format!(
            "lease expired at {} (its runner {} stopped or died); the next run or serve recovers it",
            time(row.lease_until),
            row.owner
        ),
        (_, "failed") => match row.retry_at {
            Some(at) => format!("failed {} time(s); retry at {}", row.failures, utc_text(at)),
            None => format!(
                "failed {} time(s), retries exhausted; `run --period` runs it again",
                row.failures
            ),
        },
        (_, state) => format!("{state} at {}", time(row.finished_at)),
    }
}

/// Periods due within the catch-up window, and since the job was first
/// seen, with no success and nothing running.
async fn overdue(
    config: &Config,
    store: &Store,
    job: &Job,
    now: DateTime<Utc>,
) -> Result<Vec<String>, Error> {
    let window = now - chrono::Duration::from_std(config.settings.catch_up).unwrap_or_default();
    let first_seen = store.first_seen(std::slice::from_ref(&job.name)).await?;
    let since = first_seen
        .get(&job.name)
        .map_or(now, |seen| window.max(*seen));
    let due = due(job, now, since, true);
    let keys: Vec<String> = due
        .iter()
        .map(|d| PeriodKey::new(&job.name, &d.period.label).to_string())
        .collect();
    let rows = store.rows(&keys).await?;
    Ok(keys
        .into_iter()
        .filter(|key| match rows.get(key).map(ClaimRow::as_claim) {
            None => true,
            Some(Claim::Succeeded { .. } | Claim::Held { .. }) => false,
            Some(_) => true,
        })
        .collect())
}

/// `scheduler history JOB [--limit N] [--json]`.
pub async fn history(store: &Store, job: &str, limit: u32, as_json: bool) -> Result<Outcome, Stop> {
    for attempt in store.history(job, limit).await? {
        if as_json {
            say(format_args!("{}", json!(attempt)))?;
            continue;
        }
        let code = match (attempt.exit_code, attempt.http_status) {
            (Some(code), _) => format!("  exit {code}"),
            (_, Some(status)) => format!("  HTTP {status}"),
            _ => String::new(),
        };
        let error = attempt.error.map(|e| format!("  {e}")).unwrap_or_default();
        say(format_args!(
            "{}  attempt {}  {}  {}  started {}  ended {}  on {}{code}{error}",
            attempt.period_key,
            attempt.attempt,
            attempt.outcome,
            attempt.trigger,
            utc_text(attempt.started_at),
            time(attempt.finished_at),
            attempt.owner
        ))?;
    }
    Ok(Outcome::Done)
}

/// `scheduler release JOB --period LABEL`.
pub async fn release(
    config: &Config,
    store: &Store,
    job: &str,
    label: &str,
) -> Result<Outcome, Stop> {
    let key = period_key_of(config.job(job)?, label)?;
    match store.release_key(&key).await? {
        Some(Released { owner, lease_until }) => say(format_args!(
            "{key}: released (was running on {owner}); its runner stops the job at its next heartbeat and the period can be claimed then, or at {} at the latest if that runner cannot be reached",
            lease_until.map_or_else(|| "once".to_owned(), utc_text)
        ))?,
        None => say(format_args!("{key}: no running claim to release"))?,
    }
    Ok(Outcome::Done)
}

/// The period key `--period LABEL` names for `job`.
pub fn period_key_of(job: &Job, label: &str) -> Result<String, Error> {
    let period = job
        .period
        .parse_label(&job.schedule, label)
        .map_err(|e| Error::Usage(format!("--period: {e}")))?;
    Ok(PeriodKey::new(&job.name, &period.label).to_string())
}

/// `scheduler pause JOB` / `scheduler resume JOB`.
pub async fn pause(store: &Store, job: &str, paused: bool) -> Result<Outcome, Stop> {
    store.set_paused(job, paused).await?;
    say(format_args!(
        "{job}: {}",
        if paused { "paused" } else { "resumed" }
    ))?;
    Ok(Outcome::Done)
}

/// `scheduler prune`.
pub async fn prune(config: &Config, store: &Store) -> Result<Outcome, Stop> {
    for job in &config.jobs {
        if let Some(keep) = job.keep {
            let pruned = store
                .prune(&job.name, keep, config.settings.catch_up)
                .await?;
            say(format_args!(
                "{}: pruned {pruned} finished claim(s) older than {} (periods that fired inside the catch-up window are kept)",
                job.name,
                humantime::format_duration(keep)
            ))?;
        }
    }
    if let Some(api) = &config.api {
        let pruned = store.prune_api().await?;
        say(format_args!(
            "api: pruned {pruned} Idempotency-Key(s) and run(s) older than {} (key_ttl)",
            humantime::format_duration(api.key_ttl)
        ))?;
    }
    Ok(Outcome::Done)
}
