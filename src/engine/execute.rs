//! Runs one claimed period: the action, its stop on takeover or shutdown,
//! and the fenced write of its outcome.

use std::time::Duration;

use tokio::sync::watch;

use super::Engine;
use super::action::{ActionResult, Run, Stop};
use super::heartbeat::{Loss, Watch};
#[cfg(feature = "http-actions")]
use super::http;
use super::plain;
#[cfg(feature = "process-actions")]
use super::process;
use super::report::{Report, Status};
use crate::config::Action;
use crate::handler::Handler;
use crate::store::Finish;

/// How long a finished job's outcome is tried again while the database
/// is away before the run gives up (exit 3; the period is then recovered
/// once its lease runs out).
const RECORD_PATIENCE: Duration = Duration::from_secs(600);

impl Engine {
    /// Runs the action of a won claim to its end, with heartbeats, and
    /// records the outcome under the claim's attempt. `stop_now` turning
    /// true (shutdown, once the grace is over) stops the job and releases
    /// the claim.
    pub(super) async fn execute(
        &self,
        run: &Run<'_>,
        watch: &Watch,
        trace: &crate::trace::AttemptTrace,
        stop_now: watch::Receiver<bool>,
    ) -> Report {
        let started = std::time::Instant::now();
        if !self.vouched_for(run, watch).await {
            return Report::of(run.lease, Status::Fenced, started.elapsed());
        }
        let stop = async {
            let mut stop_now = stop_now;
            tokio::select! {
                loss = watch.lost() => {
                    if loss == Loss::Fenced {
                        tracing::warn!(
                            period_key = run.key.as_str(),
                            attempt = run.lease.attempt,
                            "lease not renewed in time; stopping the job before another runner may take it"
                        );
                    }
                    Stop::Lost
                }
                _ = stop_now.wait_for(|now| *now) => Stop::Shutdown,
            }
        };
        let result = self.act(run, watch, stop).await;
        let (status, codes) = match result {
            ActionResult::Stopped(why, output) => {
                (self.stopped(run, watch, why, output.as_deref()).await, None)
            }
            // A failure seen after the fence may be the fence's own doing
            // (the supervisor stops a job whose lease it cannot vouch for):
            // it is not the job's failure, and the period is recovered.
            ActionResult::Done(finish, _) if !finish.succeeded && watch.fenced() => {
                (Status::Fenced, None)
            }
            ActionResult::Done(finish, retryable) => {
                let codes = (finish.exit_code, finish.http_status);
                trace.record();
                let status = self.record(run, watch, finish, retryable).await;
                // The codes of an end this attempt recorded, not of one
                // whose write was fenced off.
                let recorded = matches!(status, Status::Succeeded | Status::Failed { .. });
                (status, recorded.then_some(codes))
            }
        };
        let mut report = Report::of(run.lease, status, started.elapsed());
        (report.exit_code, report.http_status) = codes.unwrap_or_default();
        report
    }

    /// Whether the lease of `run` can be vouched for as its job starts. A
    /// claim answered later than that (the database held the statement: a
    /// lock, an overload) is renewed first, at once; if the renewal does
    /// not get through in time either, the period may already be another
    /// runner's to take: nothing starts, and it is recovered once its
    /// lease runs out.
    async fn vouched_for(&self, run: &Run<'_>, watch: &Watch) -> bool {
        if !watch.fenced() {
            return true;
        }
        self.heartbeats.renew_now().await;
        if !watch.fenced() {
            return true;
        }
        tracing::warn!(
            period_key = run.key.as_str(),
            attempt = run.lease.attempt,
            "the claim was answered too late to vouch for its lease, and renewing it did not get through in time; the job is not started, and the period is recovered once the lease runs out"
        );
        false
    }

    /// Runs the action of `run` until it ends or `stop` resolves.
    #[cfg_attr(not(feature = "process-actions"), allow(unused_variables))]
    async fn act(
        &self,
        run: &Run<'_>,
        watch: &Watch,
        stop: impl std::future::Future<Output = Stop>,
    ) -> ActionResult {
        match &run.job.action {
            #[cfg(not(feature = "process-actions"))]
            Action::Process(_) => ActionResult::permanent(crate::config::NO_PROCESS.into()),
            #[cfg(feature = "process-actions")]
            Action::Process(action) => {
                let spawn = process::Spawn {
                    supervisor: &self.supervisor,
                    fence_at: watch.fence_at(),
                    heartbeats: &self.heartbeats,
                    store: &self.store,
                };
                process::run_supervised(action, run, spawn, stop).await
            }
            #[cfg(not(feature = "http-actions"))]
            Action::Http(_) => ActionResult::permanent(crate::config::NO_HTTP.into()),
            #[cfg(feature = "http-actions")]
            Action::Http(action) => {
                let request = http::Request {
                    url: &action.url,
                    method: &action.method,
                    headers: &action.headers,
                    body: action.body.as_ref(),
                    // The job's `timeout` bounds its whole run, whatever
                    // the action.
                    timeout: run
                        .job
                        .policy
                        .timeout
                        .map_or(action.timeout, |job| job.min(action.timeout)),
                };
                http::send(&self.http, request, run, stop).await
            }
            Action::Code(Handler::Plain(plain)) => {
                plain::run_plain(&**plain, run, run.job.policy.timeout, stop).await
            }
            // Run by the group path (`Engine::run_group`), never here.
            Action::Sql { .. } | Action::Code(Handler::Transaction(_)) => {
                ActionResult::permanent("an sql action runs in a group".into())
            }
        }
    }

    /// After the job was stopped: a shutdown releases the claim; a takeover
    /// or a `release` is confirmed (the job is gone, so a released period
    /// may be claimed at once); a fence leaves the claim to expire. A
    /// released attempt keeps the job's `output` tail.
    pub(super) async fn stopped(
        &self,
        run: &Run<'_>,
        watch: &Watch,
        why: Stop,
        output: Option<&str>,
    ) -> Status {
        match why {
            Stop::Shutdown => match self.store.release(run.lease, output).await {
                Ok(true) => Status::Shutdown,
                Ok(false) => Status::Lost,
                Err(e) => Status::Unrecorded(e),
            },
            Stop::Lost if watch.fenced() => Status::Fenced,
            Stop::Lost => match self.store.confirm_stopped(run.lease, output).await {
                // Still this attempt, released: `scheduler release` did it.
                Ok(true) => Status::Released,
                Ok(false) => Status::Lost,
                Err(e) => {
                    tracing::warn!(
                        period_key = run.key.as_str(),
                        "cannot confirm that the released job stopped ({e}); the period can be claimed when its lease runs out"
                    );
                    Status::Lost
                }
            },
        }
    }

    async fn record(
        &self,
        run: &Run<'_>,
        watch: &Watch,
        finish: Finish,
        retryable: bool,
    ) -> Status {
        let finish = run.finish(finish, retryable);
        // The lease is still renewed while the outcome is written; a claim
        // that the write itself settles is not a takeover.
        watch.recording();
        // A database that is away is waited for, and tried again at least
        // every half heartbeat interval: the job has finished, and if its
        // end is not written the period runs again once the lease is taken
        // over. The renewals go on meanwhile and hold the lease (an expired
        // one too, while no one took it); replicas that saw the outage
        // leave it alone for a lease after it ends, a process that has just
        // started for an interval (`store::outage`), so the write gets in
        // first. The attempt fences a write that comes too late.
        let every = (self.heartbeats.interval() / 2).max(Duration::from_millis(100));
        let mut delay = Duration::from_millis(100);
        let patience = tokio::time::Instant::now() + RECORD_PATIENCE;
        let recorded = loop {
            match self.outcomes.finish(run.lease, &finish).await {
                Ok(recorded) => break recorded,
                Err(e) if tokio::time::Instant::now() < patience => {
                    tracing::warn!(
                        period_key = run.key.as_str(),
                        "cannot record the outcome yet: {e}"
                    );
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(every);
                }
                Err(e) => return Status::Unrecorded(e),
            }
        };
        match (recorded, finish.succeeded) {
            (false, _) => Status::Lost,
            (true, true) => Status::Succeeded,
            (true, false) => Status::Failed {
                error: finish.error.unwrap_or_default(),
                retry_after: finish.retry_after,
            },
        }
    }
}
