//! How one asked-for period ended, as a value: what `run` prints as a line,
//! what `serve` logs, and later what the API answers, all in the same words.

use std::time::Duration;

use super::{Ask, Taken};
use crate::error::Error;
use crate::period::{PeriodKey, utc_text};
use crate::state::PeriodOutcome;
use crate::store::{Claim, Lease, Trigger};

/// How one period ended.
#[derive(Debug)]
pub struct Report {
    /// The period.
    pub key: PeriodKey,
    /// Why it ran (the claim's trigger), or was asked for.
    pub trigger: Trigger,
    /// The attempt that ran, if one did.
    pub attempt: Option<i32>,
    /// How it ended.
    pub status: Status,
    /// How long it ran.
    pub took: Duration,
    /// The job's exit code, for a `command` or `shell` run that ended.
    pub exit_code: Option<i32>,
    /// The answer's status, for an `http` run that got one.
    pub http_status: Option<i32>,
}

/// The end of one period, as far as this process knows.
#[derive(Debug)]
pub enum Status {
    /// Ran and succeeded; recorded.
    Succeeded,
    /// Ran and failed; recorded.
    Failed {
        /// What went wrong.
        error: String,
        /// When a retry is due, if any.
        retry_after: Option<Duration>,
    },
    /// The claim was taken over; the job was stopped and nothing recorded.
    Lost,
    /// `scheduler release` stopped it; nothing recorded.
    Released,
    /// The lease could not be renewed in time; the job was stopped before
    /// it ran out and nothing recorded.
    Fenced,
    /// Stopped by shutdown; the claim was released.
    Shutdown,
    /// Ran, but the outcome could not be written: the period is recovered
    /// once its lease runs out.
    Unrecorded(Error),
    /// Not claimed: this process is running it already.
    RunningHere,
    /// Not won: why, as the store said.
    NotWon(Claim),
    /// Not claimed: upstream periods it needs have not succeeded.
    Waiting(super::after::Upstream),
}

impl Status {
    /// How a run that was claimed ended, in a word (`None`: it was not
    /// claimed here).
    pub fn ended(&self) -> Option<&'static str> {
        Some(match self {
            Status::Succeeded => "succeeded",
            Status::Failed { .. } => "failed",
            Status::Lost => "lost",
            Status::Fenced => "fenced",
            Status::Released => "released",
            Status::Shutdown => "shutdown",
            Status::Unrecorded(_) => "unrecorded",
            Status::RunningHere | Status::NotWon(_) | Status::Waiting(_) => return None,
        })
    }
}

impl Report {
    /// How the run ended, for its trace.
    pub(crate) fn ended(&self) -> crate::trace::Ended<'_> {
        crate::trace::Ended {
            outcome: self.status.ended(),
            error: match &self.status {
                Status::Failed { error, .. } => Some(error),
                _ => None,
            },
            exit_code: self.exit_code,
            http_status: self.http_status,
        }
    }

    /// The report of a won claim's end.
    pub(super) fn of(lease: &Lease, status: Status, took: Duration) -> Report {
        Report {
            key: lease.key.clone(),
            trigger: lease.trigger,
            attempt: Some(lease.attempt),
            status,
            took,
            exit_code: None,
            http_status: None,
        }
    }

    /// The report of an ask that was not won.
    pub fn not_run(ask: &Ask, taken: Taken) -> Report {
        let status = match taken {
            Taken::Not(claim) => Status::NotWon(claim),
            Taken::Waiting(upstream) => Status::Waiting(upstream),
            Taken::RunningHere | Taken::Won(_) => Status::RunningHere,
        };
        Report {
            key: ask.key(),
            trigger: ask.due.trigger,
            attempt: None,
            status,
            took: Duration::ZERO,
            exit_code: None,
            http_status: None,
        }
    }

    /// One word for it: `succeeded`, `failed`, `lost`, `released`,
    /// `fenced`, `error` or `skipped`.
    pub fn outcome(&self) -> PeriodOutcome {
        match self.status {
            Status::Succeeded => PeriodOutcome::Succeeded,
            Status::Failed { .. } => PeriodOutcome::Failed,
            Status::Lost => PeriodOutcome::Lost,
            Status::Released | Status::Shutdown => PeriodOutcome::Released,
            Status::Fenced => PeriodOutcome::Fenced,
            Status::Unrecorded(_) => PeriodOutcome::Error,
            Status::RunningHere | Status::NotWon(Claim::Held { .. } | Claim::Expired { .. }) => {
                PeriodOutcome::Held
            }
            Status::NotWon(_) => PeriodOutcome::Skipped,
            Status::Waiting(_) => PeriodOutcome::Waiting,
        }
    }

    /// What happened, in words.
    pub fn detail(&self) -> String {
        let attempt = self.attempt.unwrap_or_default();
        let trigger = self.trigger.as_str();
        let took = format!("{:.2}s", self.took.as_secs_f64());
        match &self.status {
            Status::Succeeded => format!("attempt {attempt}, trigger {trigger}, {took}"),
            Status::Failed { error, retry_after } => {
                let retry = match retry_after {
                    Some(after) => format!("retry in {}", humantime::format_duration(*after)),
                    None => "no retries left".to_owned(),
                };
                format!("{error} (attempt {attempt}, trigger {trigger}, {took}; {retry})")
            }
            Status::Lost => {
                "the claim was taken over; this attempt was stopped and its outcome discarded".into()
            }
            Status::Released => "stopped by a release (`scheduler release`, or its call in the API or the library); nothing recorded and the period is not done: the next scan takes it over as a recovery, or a run of the period by hand runs it".into(),
            Status::Fenced => "the lease could not be renewed in time (the database did not answer, or this process was stopped); the job, if still running, was stopped before the lease ran out, and its outcome was not recorded: the next run or serve recovers the period (and runs it again if it had ended)".into(),
            Status::Shutdown => "interrupted by shutdown; the claim was released".into(),
            Status::Unrecorded(e) => format!(
                "cannot write to the database: {e}; the claim is taken over once its lease runs out"
            ),
            Status::RunningHere => "running in this process".into(),
            Status::NotWon(claim) => not_won(claim),
            Status::Waiting(upstream) => upstream.to_string(),
        }
    }

    /// Counts the run in `scheduler_runs_total`.
    pub(super) fn count(&self) {
        let Some(outcome) = self.status.ended() else {
            return;
        };
        let (job, _) = self.key.parts();
        metrics::counter!("scheduler_runs_total", "job" => job.to_owned(), "outcome" => outcome)
            .increment(1);
        metrics::histogram!("scheduler_run_duration_seconds", "job" => job.to_owned())
            .record(self.took.as_secs_f64());
        if matches!(self.status, Status::Succeeded) {
            let now = chrono::Utc::now().timestamp_millis() as f64 / 1000.0;
            metrics::gauge!("scheduler_last_success_timestamp_seconds", "job" => job.to_owned())
                .set(now);
        }
    }

    /// Logs it: at info what went as planned, at warn what needs a look,
    /// at error an outcome that could not be written.
    pub fn log(&self) {
        let (job, _) = self.key.parts();
        let key = self.key.as_str();
        let took_ms = self.took.as_millis() as u64;
        match &self.status {
            Status::Succeeded => {
                tracing::info!(
                    job,
                    period_key = key,
                    attempt = self.attempt,
                    took_ms,
                    "succeeded"
                );
            }
            Status::Failed { error, retry_after } => {
                let retry = retry_after.map(|d| humantime::format_duration(d).to_string());
                tracing::warn!(
                    job,
                    period_key = key,
                    attempt = self.attempt,
                    took_ms,
                    error,
                    retry_in = retry,
                    "failed"
                );
            }
            Status::Lost | Status::Released | Status::Fenced => {
                tracing::warn!(
                    job,
                    period_key = key,
                    attempt = self.attempt,
                    "{}",
                    self.detail()
                );
            }
            Status::Shutdown => {
                tracing::info!(
                    job,
                    period_key = key,
                    attempt = self.attempt,
                    "{}",
                    self.detail()
                );
            }
            Status::Unrecorded(_) => {
                tracing::error!(
                    job,
                    period_key = key,
                    attempt = self.attempt,
                    "{}",
                    self.detail()
                );
            }
            Status::RunningHere | Status::NotWon(_) | Status::Waiting(_) => self.log_not_run(),
        }
    }

    /// Logs why a period was not run here.
    fn log_not_run(&self) {
        let (job, _) = self.key.parts();
        let key = self.key.as_str();
        let trigger = self.trigger.as_str();
        match &self.status {
            Status::RunningHere => {
                tracing::debug!(
                    job,
                    period_key = key,
                    trigger,
                    "running in this process already"
                );
            }
            Status::NotWon(Claim::Held { owner, until }) => {
                tracing::info!(job, period_key = key, trigger, %owner, %until, "held elsewhere");
            }
            Status::NotWon(Claim::Expired { owner, until }) => {
                tracing::info!(
                    job,
                    period_key = key,
                    trigger,
                    %owner,
                    %until,
                    "lease ran out; left to its runner a moment longer, which may still be recording its outcome"
                );
            }
            Status::NotWon(Claim::Busy) => {
                tracing::info!(
                    job,
                    period_key = key,
                    trigger,
                    "no concurrency slot; waiting"
                );
            }
            Status::NotWon(Claim::Contended) => {
                tracing::debug!(
                    job,
                    period_key = key,
                    trigger,
                    "another claim of the job under way; asking again"
                );
            }
            Status::NotWon(Claim::Succeeded { .. }) => {
                tracing::info!(job, period_key = key, trigger, "already succeeded");
            }
            Status::NotWon(Claim::Failed { retry_at, .. }) => {
                tracing::info!(
                    job,
                    period_key = key,
                    trigger,
                    ?retry_at,
                    "failed; retry not due"
                );
            }
            Status::Waiting(upstream) => {
                tracing::info!(
                    job,
                    period_key = key,
                    trigger,
                    waiting_for = %upstream,
                    "waiting for upstream periods"
                );
            }
            Status::NotWon(Claim::Won(_)) => {}
            _ => {}
        }
    }
}

/// Why a claim was not won, in words.
pub fn not_won(claim: &Claim) -> String {
    match claim {
        Claim::Succeeded { at } => format!("already succeeded at {}", utc_text(*at)),
        Claim::Held { owner, until } => format!("running on {owner} until {}", utc_text(*until)),
        Claim::Expired { owner, until } => format!(
            "the lease of {owner} ran out at {}; left to it a moment longer, as it may still be recording its outcome",
            utc_text(*until)
        ),
        Claim::Failed {
            retry_at: Some(at), ..
        } => format!("failed, retry at {}", utc_text(*at)),
        Claim::Failed {
            retry_at: None,
            failures,
        } => format!("failed {failures} time(s), no retries left"),
        Claim::Busy => "waiting for a concurrency slot".into(),
        Claim::Contended => "another claim of the job under way".into(),
        Claim::Won(_) => "won".into(),
    }
}

/// The `result` label of `scheduler_claims_total` for a claim's answer.
pub(super) fn metric_result(claim: &Claim) -> &'static str {
    match claim {
        Claim::Won(lease) if lease.trigger == Trigger::Recovery => "recovered",
        Claim::Won(_) => "won",
        Claim::Busy => "waiting",
        Claim::Contended => "contended",
        Claim::Held { .. } | Claim::Expired { .. } => "held",
        Claim::Succeeded { .. } => "done",
        Claim::Failed { .. } => "failed",
    }
}
