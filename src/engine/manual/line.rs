//! The printed lines: what became of each period of a manual run, as
//! `run` prints it and the API lists it, from a run's report or from the
//! period's claim row when it is passed over.

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::request::Request;
use crate::engine::after::Upstream;
use crate::engine::{Report, Status};
use crate::error::Error;
use crate::period::{PeriodKey, utc_text};
use crate::state::PeriodOutcome;
use crate::store::{ADOPTED_ATTEMPT, Claim, ClaimRow, ClaimState, Trigger};

/// What happened to one period: `run` prints it as one line.
#[derive(Debug, Clone, Serialize)]
pub struct Line {
    /// The period key.
    pub key: String,
    /// What became of it, in the word `run` prints
    /// ([`PeriodOutcome::printed`]).
    #[serde(serialize_with = "printed")]
    pub status: PeriodOutcome,
    /// The rest, in words.
    pub detail: String,
    /// The attempt it names, if any.
    pub attempt: Option<i32>,
    /// Why the attempt ran, for a period that ran.
    pub trigger: Option<Trigger>,
    /// For a period run by hand, how it was asked for, as `history` says
    /// it: `manual`, `manual force`, `manual early`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asked: Option<&'static str>,
    /// The job's exit code.
    pub exit_code: Option<i32>,
    /// The HTTP status the job's request got.
    pub http_status: Option<i32>,
    /// What went wrong, for a failed run.
    pub error: Option<String>,
    /// When a failed period is retried, if it is.
    pub retry_at: Option<String>,
    /// How long it ran.
    pub duration_ms: Option<u64>,
    /// Passed over because a live claim elsewhere holds it: how it ends is
    /// not known here.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
}

/// A line's outcome as `run` prints it.
fn printed<S: serde::Serializer>(outcome: &PeriodOutcome, to: S) -> Result<S::Ok, S::Error> {
    to.serialize_str(outcome.printed())
}

/// The line of a period passed over without a claim, if it is: not
/// failed under `--only-failed`, waiting for its upstream periods
/// (`upstream`, as a dry run's gate found them), said by a dry run, or
/// settled by its claim row.
pub(super) fn passed_over(
    request: &Request,
    key: &PeriodKey,
    row: Option<&ClaimRow>,
    upstream: Option<Upstream>,
) -> Option<Line> {
    let claimable = row
        .is_none_or(|row| !matches!(row.as_claim(), Claim::Succeeded { .. } | Claim::Held { .. }));
    // By its stored state: a failed period whose retry is due reads as
    // claimable, and is failed all the same.
    let failed = row.is_some_and(|r| r.state == ClaimState::Failed);
    if request.only_failed && !failed {
        Some(Line {
            attempt: row.map(|r| r.attempt),
            ..Line::bare(
                key.as_str(),
                format!("not failed ({}): passed over", state_word(row)),
            )
        })
    } else if let Some(upstream) = upstream.filter(|_| claimable) {
        Some(Line::new(
            key,
            PeriodOutcome::Waiting,
            upstream.to_string(),
            None,
        ))
    } else if request.dry_run {
        Some(dry_run_line(key.as_str(), row, request))
    } else {
        row.and_then(|row| skip_line(key.as_str(), row, request))
    }
}

/// Why a period is passed over without a claim, from its row, if it is.
fn skip_line(key: &str, row: &ClaimRow, request: &Request) -> Option<Line> {
    let manual = request.manual();
    let detail = match row.as_claim() {
        Claim::Succeeded { at } if !request.force && row.attempt == ADOPTED_ATTEMPT => {
            format!("adopted at {} (an earlier system ran it)", utc_text(at))
        }
        Claim::Succeeded { at } if !request.force => {
            format!("already succeeded at {}", utc_text(at))
        }
        // A released period asked for by hand is claimed once its runner
        // has stopped (`wait_for_released`).
        Claim::Held { owner, until }
            if !(request.wait || manual && row.state == ClaimState::Released) =>
        {
            return Some(Line {
                status: PeriodOutcome::Held,
                attempt: Some(row.attempt),
                held: true,
                ..Line::bare(key, format!("running on {owner} until {}", utc_text(until)))
            });
        }
        // A failed period is not done: `run JOB` says so and exits 1, so a
        // platform cron container's failed period is never a green job.
        Claim::Failed {
            retry_at: Some(at), ..
        } if !manual => {
            return Some(Line {
                retry_at: Some(utc_text(at)),
                ..failed_line(key, row, format!("retry at {} (not due yet)", utc_text(at)))
            });
        }
        Claim::Failed {
            retry_at: None,
            failures,
        } if !manual => {
            let detail = format!(
                "{failures} time(s), no retries left; {} runs it again",
                request.names.rerun
            );
            return Some(failed_line(key, row, detail));
        }
        _ => return None,
    };
    Some(Line {
        status: PeriodOutcome::Skipped,
        attempt: Some(row.attempt),
        ..Line::bare(key, detail)
    })
}

/// Where a period stands by its claim row alone, in a word.
fn state_word(row: Option<&ClaimRow>) -> &'static str {
    row.map_or("never claimed", |row| row.standing().as_str())
}

/// The line of a period found failed and not run.
fn failed_line(key: &str, row: &ClaimRow, detail: String) -> Line {
    Line {
        status: PeriodOutcome::Failed,
        attempt: Some(row.attempt),
        ..Line::bare(key, detail)
    }
}

fn dry_run_line(key: &str, row: Option<&ClaimRow>, request: &Request) -> Line {
    let (status, detail) = match row {
        None => (PeriodOutcome::WouldClaim, "new period".to_owned()),
        Some(row) => match skip_line(key, row, request) {
            Some(skip) => (skip.status, skip.detail),
            None => (
                PeriodOutcome::WouldClaim,
                match row.as_claim() {
                    Claim::Succeeded { .. } => {
                        format!("already succeeded; {} runs it again", request.names.force)
                    }
                    Claim::Failed { .. } => format!("retry of attempt {}", row.attempt),
                    Claim::Held { owner, .. } => format!("after waiting for {owner}"),
                    _ if row.state == ClaimState::Running => {
                        format!("recovery: the lease of {} expired", row.owner)
                    }
                    _ if row.state == ClaimState::Released => "recovery: released".to_owned(),
                    _ => format!("retry of attempt {}", row.attempt),
                },
            ),
        },
    };
    Line {
        status,
        attempt: row.map(|r| r.attempt),
        ..Line::bare(key, detail)
    }
}

impl Line {
    pub(super) fn new(
        key: &PeriodKey,
        status: PeriodOutcome,
        detail: String,
        attempt: Option<i32>,
    ) -> Line {
        Line {
            status,
            attempt,
            ..Line::bare(key.as_str(), detail)
        }
    }

    pub(super) fn bare(key: &str, detail: String) -> Line {
        Line {
            key: key.to_owned(),
            status: PeriodOutcome::Skipped,
            detail,
            attempt: None,
            trigger: None,
            asked: None,
            exit_code: None,
            http_status: None,
            error: None,
            retry_at: None,
            duration_ms: None,
            held: false,
        }
    }

    /// The line of a run; an outcome that could not be written ends the
    /// command with the database's error.
    pub(super) fn of(report: Report, now: DateTime<Utc>) -> Result<Line, Error> {
        let report = match report {
            Report {
                status: Status::Unrecorded(e),
                ..
            } => return Err(e),
            report => report,
        };
        let (error, retry_at) = match &report.status {
            Status::Failed { error, retry_after } => (
                Some(error.clone()),
                retry_after
                    .and_then(|after| chrono::Duration::from_std(after).ok())
                    .map(|after| utc_text(now + after)),
            ),
            _ => (None, None),
        };
        Ok(Line {
            held: report.outcome() == PeriodOutcome::Held,
            trigger: Some(report.trigger),
            exit_code: report.exit_code,
            http_status: report.http_status,
            error,
            retry_at,
            duration_ms: Some(u64::try_from(report.took.as_millis()).unwrap_or(u64::MAX)),
            ..Line::new(
                &report.key,
                report.outcome(),
                report.detail(),
                report.attempt,
            )
        })
    }
}
