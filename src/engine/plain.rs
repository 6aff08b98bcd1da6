//! Runs a plain code job's handler: as a task of its own, beside its
//! heartbeats, stopped (its token cancelled, its future dropped) when its
//! claim is lost, its `timeout` passes or shutdown's grace runs out.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use super::action::{ActionResult, Run, Stop};
use crate::handler::{Context, Failure, Plain, panicked};

/// Runs a plain handler as a task of its own until it ends, `stop`
/// resolves, or `timeout` passes. Stopped, its token is cancelled and its
/// future dropped before this returns.
pub(crate) async fn run_plain(
    plain: &Plain,
    run: &Run<'_>,
    timeout: Option<Duration>,
    stop: impl Future<Output = Stop>,
) -> ActionResult {
    let token = CancellationToken::new();
    let context = context_of(run, token.clone());
    let span = context.span();
    let task = tokio::spawn(plain(context).instrument(span));
    let abort = task.abort_handle();
    // Whatever ends this, the handler does not outlive it.
    let _dropped = AbortOnDrop(abort, token.clone());
    let limit = async {
        match timeout {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(task);
    let ended = tokio::select! {
        ended = &mut task => ended,
        why = stop => {
            token.cancel();
            task.abort();
            let _ = task.await;
            return ActionResult::Stopped(why, None);
        }
        () = limit => {
            token.cancel();
            task.abort();
            let _ = task.await;
            let limit = timeout.unwrap_or_default();
            return ActionResult::failed(format!(
                "timed out after {}",
                humantime::format_duration(limit)
            ));
        }
    };
    match ended {
        Ok(Ok(())) => ActionResult::succeeded(),
        Ok(Err(Failure::Permanent(why))) => ActionResult::permanent(why),
        Ok(Err(failure)) => ActionResult::failed(failure.message().to_owned()),
        Err(e) if e.is_panic() => ActionResult::failed(panicked(&*e.into_panic())),
        Err(_) => ActionResult::failed("the handler's task was cancelled".into()),
    }
}

/// Aborts a handler's task and cancels its token when dropped.
struct AbortOnDrop(tokio::task::AbortHandle, CancellationToken);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.1.cancel();
        self.0.abort();
    }
}

/// What the handler of `run` is given.
pub(crate) fn context_of(run: &Run<'_>, token: CancellationToken) -> Context {
    Context::new(
        &run.job.name,
        run.key.clone(),
        run.period,
        run.scheduled_at,
        (run.lease.attempt, run.lease.trigger),
        token,
    )
    .traced(run.traceparent.clone())
}
