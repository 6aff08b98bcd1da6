//! What a manual run is asked with ([`RunOptions`]) and answers
//! ([`PeriodRun`]).

use std::sync::Arc;
use std::time::Duration;

use crate::engine::manual::{Line, Sink};
use crate::error::Unread;
use crate::state::PeriodOutcome;
use crate::store::Trigger;

/// How a manual run goes. By default it waits for what stands in its way
/// (a period running elsewhere, a `concurrency` slot taken by another run
/// or by the scheduler's own retries), so every period asked for ends run
/// (or interrupted); `.wait(false)` answers such a period at once instead,
/// as `scheduler run` without `--wait` does, [`PeriodOutcome::Busy`] or
/// [`PeriodOutcome::Held`] (running elsewhere).
#[derive(Debug, Clone)]
#[non_exhaustive]
#[must_use]
pub struct RunOptions {
    /// Also re-run periods that succeeded.
    pub force: bool,
    /// Run only periods whose latest attempt failed.
    pub only_failed: bool,
    /// Also run a period whose fire is still ahead.
    pub early: bool,
    /// Wait for a period held elsewhere, or for a concurrency slot
    /// (`true` unless set otherwise).
    pub wait: bool,
    /// First run the upstream periods (`after`) the asked periods need
    /// that have not succeeded, in dependency order.
    pub with_upstream: bool,
    /// Only this shard (from 0) of each period, of a job split into
    /// shards.
    pub shard: Option<u32>,
    /// Who asks, as `history` shows it (`library` if unset).
    pub by: Option<Arc<str>>,
}

impl Default for RunOptions {
    fn default() -> RunOptions {
        RunOptions {
            force: false,
            only_failed: false,
            early: false,
            wait: true,
            with_upstream: false,
            shard: None,
            by: None,
        }
    }
}

impl RunOptions {
    /// Run only shard `k` (from 0) of each period of a job split into
    /// shards.
    pub fn shard(mut self, k: u32) -> RunOptions {
        self.shard = Some(k);
        self
    }

    /// Re-run succeeded periods too.
    pub fn force(mut self) -> RunOptions {
        self.force = true;
        self
    }

    /// Run only the periods whose latest attempt failed; pass over the
    /// rest (never claimed, succeeded, running).
    pub fn only_failed(mut self) -> RunOptions {
        self.only_failed = true;
        self
    }

    /// Run a period before its fire.
    pub fn early(mut self) -> RunOptions {
        self.early = true;
        self
    }

    /// Whether to wait for periods held elsewhere and for a free
    /// `concurrency` slot (the default), or answer them at once.
    pub fn wait(mut self, wait: bool) -> RunOptions {
        self.wait = wait;
        self
    }

    /// Run the missing upstream periods first.
    pub fn with_upstream(mut self) -> RunOptions {
        self.with_upstream = true;
        self
    }

    /// Who asks.
    pub fn by(mut self, by: &str) -> RunOptions {
        self.by = Some(by.into());
        self
    }
}

/// How one period of a manual run ended. Serialized as `scheduler run
/// --json` prints a line (`duration_ms` for `duration`; `status` is `held`
/// for a period running elsewhere, which `run` calls `skipped`); shown as
/// `scheduler run` prints it (`billing:2026-07  succeeded: attempt 1, …`).
#[derive(Debug, Clone, serde::Serialize)]
#[non_exhaustive]
pub struct PeriodRun {
    /// `<job>:<label>`.
    pub period_key: String,
    /// How it ended: `Succeeded`, `Failed`, `Skipped` (done already),
    /// `Held` (running elsewhere, with `.wait(false)`), `Busy` (every
    /// `concurrency` slot of the job was taken, with `.wait(false)`),
    /// `Waiting` (an upstream period it needs has not succeeded; claimed
    /// once they all have), `Lost`, `Released`, `Fenced` (nothing
    /// recorded), or `Interrupted` (a shutdown came while it waited).
    #[serde(rename = "status")]
    pub outcome: PeriodOutcome,
    /// The attempt that ran, or that the period's record names.
    pub attempt: Option<i32>,
    /// Why the attempt ran, for a period that ran.
    pub trigger: Option<Trigger>,
    /// What went wrong, for a failed run.
    pub error: Option<String>,
    /// What happened, in the words `scheduler run` prints.
    pub detail: String,
    /// How long it ran.
    #[serde(rename = "duration_ms", serialize_with = "as_millis")]
    pub duration: Option<Duration>,
}

/// A duration in whole milliseconds.
fn as_millis<S: serde::Serializer>(d: &Option<Duration>, to: S) -> Result<S::Ok, S::Error> {
    match d {
        Some(d) => to.serialize_some(&u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        None => to.serialize_none(),
    }
}

impl std::fmt::Display for PeriodRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}  {}: {}", self.period_key, self.outcome, self.detail)
    }
}

impl PeriodRun {
    fn of(line: &Line) -> PeriodRun {
        PeriodRun {
            period_key: line.key.clone(),
            outcome: line.status,
            attempt: line.attempt,
            trigger: line.trigger,
            error: line.error.clone(),
            detail: line.detail.clone(),
            duration: line.duration_ms.map(Duration::from_millis),
        }
    }
}

/// Keeps a manual run's lines as values.
pub(super) struct Gathered(pub(super) Vec<PeriodRun>);

impl Sink for Gathered {
    fn line(&mut self, line: &Line) -> Result<(), Unread> {
        self.0.push(PeriodRun::of(line));
        Ok(())
    }
}
