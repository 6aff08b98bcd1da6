//! Runs asked for over the API: started on this replica in a task of
//! their own, their progress written as they go, answered at once or once
//! they end within `?wait=`.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::{StatusCode, header};
use serde_json::{Value, json};
use tokio::sync::watch;

use super::idempotent::Scope;
use super::reply::Reply;
use super::{Api, RUN_TICK};
use crate::config::{Config, Token};
use crate::engine::manual::{self, Line, Request, Sink};
use crate::error::{Error, Unread};
use crate::state::PeriodOutcome;
use crate::store::{ApiRun, ApiRunState, Store};

/// What a run did so far, shared by the run and the writer that stores it.
#[derive(Default)]
pub(super) struct Progress {
    /// Claimed, not ended yet: key and attempt.
    pub(super) claimed: Vec<(String, i32)>,
    /// Ended.
    pub(super) lines: Vec<Line>,
    /// Why the run itself ended early, if it did.
    pub(super) error: Option<String>,
    /// This replica's shutdown ended it before its last period: periods
    /// were left unclaimed, or a running one was stopped and released.
    pub(super) interrupted: bool,
    /// It ended on an error of the server's side (the database), not of
    /// the request.
    pub(super) server_failure: bool,
    pub(super) done: bool,
    /// How many periods the run goes through, when that was quick to know.
    pub(super) total: Option<u64>,
}

impl Progress {
    pub(super) fn body(&self) -> Value {
        let mut periods: Vec<Value> = self.lines.iter().map(|l| json!(l)).collect();
        for (key, attempt) in &self.claimed {
            periods.push(json!({ "key": key, "status": "running", "attempt": attempt }));
        }
        let mut body = json!({
            "periods": periods,
            "outcome": self.outcome(),
            "total": self.total,
        });
        if let Some(error) = &self.error {
            body["error"] = json!(error);
        }
        body
    }

    /// Once done: `interrupted` by this replica's shutdown; `failed` for a
    /// failure, a period that found no concurrency slot, one released or
    /// stopped; `held` when a period is being run elsewhere (how it ends is
    /// not known here: never called a success); else `succeeded` (every
    /// period succeeded, here or before).
    pub(super) fn outcome(&self) -> Option<&'static str> {
        if !self.done {
            return None;
        }
        if self.interrupted {
            return Some("interrupted");
        }
        let fine = self.error.is_none()
            && self.lines.iter().all(|l| {
                matches!(
                    l.status,
                    PeriodOutcome::Succeeded | PeriodOutcome::Skipped | PeriodOutcome::Held
                )
            });
        if self.all_busy() {
            return Some("busy");
        }
        Some(match (fine, self.lines.iter().any(|l| l.held)) {
            (false, _) => "failed",
            (true, true) => "held",
            (true, false) => "succeeded",
        })
    }

    /// The run ended on a server-side failure (the database) before it
    /// claimed anything: nothing ran, so its request may be sent again.
    pub(super) fn failed_before_any_claim(&self) -> bool {
        self.server_failure && self.lines.is_empty() && self.claimed.is_empty()
    }

    /// Nothing ran here for want of a free concurrency slot: every period
    /// so far found none, or was skipped (done or running elsewhere).
    pub(super) fn all_busy(&self) -> bool {
        self.claimed.is_empty()
            && self.lines.iter().any(|l| l.status == PeriodOutcome::Busy)
            && self.lines.iter().all(|l| {
                matches!(
                    l.status,
                    PeriodOutcome::Busy | PeriodOutcome::Skipped | PeriodOutcome::Held
                )
            })
    }
}

/// The sink of an API run: it fills the shared [`Progress`].
pub(super) struct Recorder(Arc<Mutex<Progress>>, watch::Sender<u64>);

impl Sink for Recorder {
    fn total(&mut self, total: Option<u64>) {
        if let Ok(mut p) = self.0.lock() {
            p.total = total;
        }
    }

    fn claimed(&mut self, key: &str, attempt: i32) {
        if let Ok(mut p) = self.0.lock() {
            p.claimed.push((key.to_owned(), attempt));
        }
        self.1.send_modify(|n| *n += 1);
    }

    fn line(&mut self, line: &Line) -> Result<(), Unread> {
        if let Ok(mut p) = self.0.lock() {
            p.claimed.retain(|(key, _)| *key != line.key);
            p.lines.push(line.clone());
        }
        self.1.send_modify(|n| *n += 1);
        Ok(())
    }

    fn cut_short(&mut self) {
        if let Ok(mut p) = self.0.lock() {
            p.interrupted = true;
        }
    }
}

impl Api {
    /// Starts `request` on this replica: records the run, runs it in a
    /// task of its own, and answers 202 with what it did first (or, with
    /// `wait`, 200 once it ended within that).
    pub(super) async fn start(
        self: &Arc<Api>,
        config: Arc<Config>,
        request: Request,
        token: &Token,
        scope: &Scope,
        wait: Duration,
    ) -> Reply {
        let id = scope.run_id.clone();
        let Some(ttl) = config.api.as_ref().map(|a| a.key_ttl) else {
            return Reply::error(StatusCode::NOT_FOUND, "the API is off");
        };
        let job = request.job.clone().unwrap_or_default();
        let record = ApiRun {
            id: id.clone(),
            job: job.clone(),
            requested_by: token.name.clone(),
            owner: self.engine.owner().to_owned(),
            state: ApiRunState::Running,
            body: json!({ "periods": [] }).to_string(),
            alive: 1,
            created_at: 0,
        };
        let store = self.store();
        if let Err(e) = store.create_run(&record, RUN_TICK * 3, ttl).await {
            return Reply::of(&e);
        }
        if let Err(e) = scope.note_run(&id).await {
            return Reply::of(&e);
        }
        tracing::info!(run = %id, job = %job, by = %token.name, "run asked for over the API");
        let progress = Arc::new(Mutex::new(Progress::default()));
        let (changed, seen) = watch::channel(0u64);
        let sink = Recorder(progress.clone(), changed);
        let mut runs = self.runs.lock().await;
        // Runs that ended are let go of here, not kept until shutdown.
        while runs.try_join_next().is_some() {}
        runs.spawn(
            self.clone()
                .carry_out(config, request, id.clone(), ttl, sink),
        );
        drop(runs);
        let (done, mut body) = self.progress_within(&progress, seen, wait).await;
        if done {
            let p = lock(&progress);
            if p.failed_before_any_claim() {
                // Nothing ran and nothing is stored: a retry executes.
                return Reply::ok(StatusCode::SERVICE_UNAVAILABLE, body)
                    .with(header::RETRY_AFTER, "5");
            }
            if p.all_busy() {
                // Nothing ran: the answer is not stored, so a retry runs it.
                body["error"] = json!(
                    "not run: every concurrency slot of the job is taken by running periods; retry later with the same Idempotency-Key"
                );
                return Reply::ok(StatusCode::TOO_MANY_REQUESTS, body)
                    .with(header::RETRY_AFTER, "5");
            }
        }
        body["id"] = json!(id);
        body["job"] = json!(job);
        body["requested_by"] = json!(token.name);
        body["owner"] = json!(self.engine.owner());
        body["state"] = json!(if done { "done" } else { "running" });
        // A run that ended before the answer is answered as ended.
        let status = if done {
            StatusCode::OK
        } else {
            StatusCode::ACCEPTED
        };
        Reply::ok(status, body).with(header::LOCATION, format!("/v1/runs/{id}"))
    }

    /// Runs `request` to its end, writing its progress each [`RUN_TICK`]
    /// and its end once it ended.
    async fn carry_out(
        self: Arc<Api>,
        config: Arc<Config>,
        request: Request,
        id: String,
        ttl: Duration,
        mut sink: Recorder,
    ) {
        let shared = sink.0.clone();
        let store = self.store();
        let ended = {
            let run = manual::drive(
                &config,
                &self.engine,
                &request,
                self.shutdown.clone(),
                &mut sink,
            );
            tokio::pin!(run);
            loop {
                tokio::select! {
                    ended = &mut run => break ended,
                    () = tokio::time::sleep(RUN_TICK) => {
                        let body = lock(&shared).body().to_string();
                        if let Err(e) = store.update_run(&id, &body, None, RUN_TICK * 3).await {
                            tracing::warn!(run = %id, error = %e, "cannot write a run's progress");
                        }
                    }
                }
            }
        };
        let (body, forget) = {
            let mut p = lock(&shared);
            p.end(ended, *self.shutdown.borrow(), &id);
            p.done = true;
            let body = p.body().to_string();
            p.done = false;
            // A run that failed on the database before it claimed anything,
            // or found no concurrency slot for any period, ran nothing: its
            // key is freed, so the request sent again executes.
            (body, p.failed_before_any_claim() || p.all_busy())
        };
        // The last word is written before anyone is told the run ended (a
        // replay reads it).
        write_end(store, &id, &body, ttl, forget, self.shutdown.clone()).await;
        lock(&shared).done = true;
        sink.1.send_modify(|n| *n += 1);
    }

    /// Waits for the run's first news (a claim, or a line), or with `wait`
    /// for its end within that: whether it ended, and its body so far.
    async fn progress_within(
        &self,
        progress: &Mutex<Progress>,
        mut seen: watch::Receiver<u64>,
        wait: Duration,
    ) -> (bool, Value) {
        // Without `wait`, the answer comes once something happened or
        // after a second.
        let until = tokio::time::Instant::now() + wait.max(Duration::from_secs(1));
        // Shutdown ends the wait at once: the connection is closed soon
        // after, and a caller left without an answer would find its key
        // still going until the key's own wait ran out. It gets the run so
        // far, and where to follow it.
        let mut shutdown = self.shutdown.clone();
        loop {
            let (done, anything) = {
                let p = lock(progress);
                // A period that found no slot ends the run at once: its
                // answer waits for that end, so it can say so. Nor is a
                // period skipped (done or running elsewhere): the rest may
                // all find no slot, and then nothing ran here.
                let started = !p.claimed.is_empty()
                    || p.lines.iter().any(|l| {
                        !matches!(
                            l.status,
                            PeriodOutcome::Busy | PeriodOutcome::Skipped | PeriodOutcome::Held
                        )
                    });
                (p.done, started)
            };
            if done || (wait.is_zero() && anything) {
                break;
            }
            let ended = tokio::select! {
                changed = tokio::time::timeout_at(until, seen.changed()) => changed.is_err(),
                _ = shutdown.wait_for(|down| *down) => true,
            };
            if ended {
                break;
            }
        }
        let p = lock(progress);
        (p.done, p.body())
    }
}

impl Progress {
    /// Notes how the run ended: its error, and whether shutdown cut it
    /// short or stopped a period past the grace (a `release` by an
    /// operator is no interruption; a run that ended within the grace is
    /// answered as it ended).
    fn end(&mut self, ended: Result<crate::error::Outcome, Error>, shutdown: bool, id: &str) {
        if let Err(e) = ended {
            self.server_failure = matches!(e, Error::Database(_) | Error::Environment(_));
            self.error = Some(e.to_string());
        }
        self.interrupted |= shutdown
            && self.lines.iter().any(|l| {
                matches!(
                    l.status,
                    PeriodOutcome::Released | PeriodOutcome::Interrupted
                )
            });
        if self.interrupted {
            self.error.get_or_insert_with(|| {
                "this replica shut down: the periods listed as released are recovered like any others, and the periods not listed were not run; POST again with a new Idempotency-Key".into()
            });
            tracing::warn!(run = %id, "a run asked for over the API was interrupted by shutdown");
        }
    }
}

/// Writes run `id`'s end, and with `forget` frees its Idempotency-Key;
/// tried until it lands, a database that is away being waited for with a
/// backoff up to half a minute, so a live replica records the end once the
/// database is back. At shutdown a few more tries are all it gets: the run
/// is then answered `abandoned`, as for a replica that went away.
pub(super) async fn write_end(
    store: &Store,
    id: &str,
    body: &str,
    ttl: Duration,
    forget: bool,
    shutdown: watch::Receiver<bool>,
) {
    let mut delay = RUN_TICK;
    let mut left_at_shutdown = 5;
    loop {
        let written = match store.update_run(id, body, Some(ttl), RUN_TICK * 3).await {
            Ok(()) if forget => store.forget_run_key(id).await,
            other => other,
        };
        let Err(e) = written else { return };
        tracing::warn!(run = %id, error = %e, "cannot write a run's end yet");
        if *shutdown.borrow() {
            left_at_shutdown -= 1;
            if left_at_shutdown == 0 {
                tracing::error!(run = %id, "giving up writing a run's end at shutdown: it is answered `abandoned`");
                return;
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

pub(super) fn lock(progress: &Mutex<Progress>) -> std::sync::MutexGuard<'_, Progress> {
    match progress.lock() {
        Ok(p) => p,
        Err(poisoned) => poisoned.into_inner(),
    }
}
