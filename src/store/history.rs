//! Attempts as `history` shows them, the claim rows `status` shows, and
//! pruning what is kept past its time.

use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;

use super::{AttemptOutcome, ClaimRow, Store, Trigger, query_error};
use crate::error::Error;

/// One recorded attempt, for `history` and `status`.
#[derive(Debug, Clone, Serialize)]
pub struct Attempt {
    /// `<job>:<label>`.
    pub period_key: String,
    /// The attempt number.
    pub attempt: i32,
    /// Why it ran.
    pub trigger: Trigger,
    /// Who ran it.
    pub owner: String,
    /// The fire it stood for.
    pub scheduled_at: Option<DateTime<Utc>>,
    /// When it was claimed.
    pub started_at: DateTime<Utc>,
    /// When it ended.
    pub finished_at: Option<DateTime<Utc>>,
    /// How it ended.
    pub outcome: AttemptOutcome,
    /// The process exit code.
    pub exit_code: Option<i32>,
    /// The HTTP status.
    pub http_status: Option<i32>,
    /// What went wrong.
    pub error: Option<String>,
    /// The output tail.
    pub output: Option<String>,
    /// For a manual attempt, how it was asked for: `manual`, with `force`
    /// and `early` where given.
    pub asked: Option<String>,
    /// For a manual attempt, who asked: the API token's name, or `cli:` and
    /// the user.
    pub requested_by: Option<String>,
    /// The fingerprint of the job's definition it ran under, once it ended.
    pub definition: Option<String>,
    /// The id of its trace: what a scheduler exporting traces (`OTEL_*`)
    /// sent its spans under, worked out from its period key, attempt and
    /// owner ([`crate::trace::trace_id`]).
    pub trace_id: String,
}

impl Attempt {
    /// The attempt with its trace id worked out.
    pub(super) fn traced(mut self) -> Attempt {
        self.trace_id = crate::trace::trace_id(&self.period_key, self.attempt, &self.owner);
        self
    }
}

impl Store {
    /// The attempts of `job`, newest first.
    pub async fn history(&self, job: &str, limit: u32) -> Result<Vec<Attempt>, Error> {
        bounded!(self.history("job", job, limit))
    }

    /// The attempts of one period, newest first.
    pub async fn attempts(&self, key: &str, limit: u32) -> Result<Vec<Attempt>, Error> {
        bounded!(self.history("period_key", key, limit))
    }

    /// The claim rows of `job` that `status` shows, newest period first:
    /// the `limit` newest periods, every running, released or failed one
    /// however old (up to [`UNSETTLED_SHOWN`](super::UNSETTLED_SHOWN): a stuck backfill period is
    /// what on-call looks for), and the one that finished last.
    pub async fn recent(&self, job: &str, limit: u32) -> Result<Vec<ClaimRow>, Error> {
        bounded!(self.recent(job, limit))
    }

    /// Deletes finished claims of `job` (and their attempts) that finished
    /// more than `keep` ago and whose fire lies before the catch-up
    /// `window` (a pruned period inside it could be claimed again); returns
    /// how many claims went (`dry_run`: would go; nothing is deleted). In
    /// batches of [`PRUNE_BATCH`](super::PRUNE_BATCH) claims, a transaction each.
    pub async fn prune(
        &self,
        job: &str,
        keep: Duration,
        window: Duration,
        dry_run: bool,
    ) -> Result<u64, Error> {
        let pruned = dispatch!(self.prune(job, keep, window, dry_run)).map_err(query_error)?;
        if !dry_run {
            self.wrote_last(pruned).await;
        }
        Ok(pruned)
    }
}
