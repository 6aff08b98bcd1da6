//! Runs one claimed period: the action, its heartbeats, its stop on
//! takeover or shutdown, and the fenced write of its outcome.

pub mod due;
pub mod heartbeat;
mod http;
mod process;
pub mod reaper;
pub mod supervisor;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::cli::check::period_key;
use crate::config::{Action, Job};
use crate::engine::heartbeat::{Heartbeats, Loss, Watch};
use crate::error::Error;
use crate::period::{Period, utc_text};
use crate::store::{Claim, ClaimRequest, Finish, Lease, SqlLimits, Store};
use crate::template::Values;

/// How much output is kept with an attempt.
pub const OUTPUT_TAIL: usize = 4096;

/// One claimed period about to run.
pub struct Run<'a> {
    /// The job.
    pub job: &'a Job,
    /// The period it covers.
    pub period: &'a Period,
    /// `<job>:<label>`.
    pub key: &'a str,
    /// The won claim.
    pub lease: &'a Lease,
    /// The fire it stands for.
    pub scheduled_at: DateTime<Utc>,
}

impl Values for Run<'_> {
    fn value(&self, name: &str) -> String {
        match name {
            "job" => self.job.name.clone(),
            "period" => self.period.label.clone(),
            "period_key" => self.key.to_owned(),
            "period_start" => utc_text(self.period.start),
            "period_end" => utc_text(self.period.end),
            "scheduled_at" => utc_text(self.scheduled_at),
            "attempt" => self.lease.attempt.to_string(),
            _ => String::new(),
        }
    }
}

impl Run<'_> {
    /// The `SCHEDULER_*` variables a child process sees.
    pub fn environment(&self) -> [(&'static str, String); 8] {
        [
            ("SCHEDULER_JOB", self.value("job")),
            ("SCHEDULER_PERIOD", self.value("period")),
            ("SCHEDULER_PERIOD_KEY", self.value("period_key")),
            ("SCHEDULER_PERIOD_START", self.value("period_start")),
            ("SCHEDULER_PERIOD_END", self.value("period_end")),
            ("SCHEDULER_SCHEDULED_AT", self.value("scheduled_at")),
            ("SCHEDULER_ATTEMPT", self.value("attempt")),
            ("SCHEDULER_TRIGGER", self.lease.trigger.as_str().to_owned()),
        ]
    }
}

/// Why a running action was stopped before it ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// The claim was taken over: stop now, record nothing.
    Lost,
    /// Shutdown and the grace ran out: stop, release the claim.
    Shutdown,
}

/// What an action reports.
pub(crate) enum ActionResult {
    /// It ended; `retryable` says whether a failure may be retried.
    Done(Finish, bool),
    /// It was stopped.
    Stopped(Stop),
}

impl ActionResult {
    fn succeeded() -> ActionResult {
        ActionResult::Done(
            Finish {
                succeeded: true,
                ..Finish::default()
            },
            false,
        )
    }

    fn failed(error: String) -> ActionResult {
        ActionResult::Done(
            Finish {
                error: Some(error),
                ..Finish::default()
            },
            true,
        )
    }

    fn permanent(error: String) -> ActionResult {
        ActionResult::Done(
            Finish {
                error: Some(error),
                ..Finish::default()
            },
            false,
        )
    }

    fn set_exit_code(&mut self, code: i32) {
        if let ActionResult::Done(finish, _) = self {
            finish.exit_code = Some(code);
        }
    }
}

/// How a run ended, as far as the caller is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Ending {
    /// The outcome was recorded.
    Recorded {
        /// Whether it succeeded.
        succeeded: bool,
        /// What went wrong.
        error: Option<String>,
        /// When a retry is due, if any.
        retry_after: Option<Duration>,
    },
    /// The claim was taken over; nothing was recorded.
    Lost,
    /// `scheduler release` ended this attempt: the job was stopped, nothing
    /// recorded, and the period is not done.
    Withdrawn,
    /// The lease could not be renewed in time (the database did not
    /// answer): the job was stopped and nothing recorded; the period is
    /// recovered once its lease has run out.
    Fenced,
    /// Stopped by shutdown; the claim was released for another runner.
    Released,
}

/// What every run of a process shares.
#[derive(Clone)]
pub struct Context {
    /// The database.
    pub store: Store,
    /// Lease renewals and the fence.
    pub heartbeats: Heartbeats,
    /// For `http` actions.
    pub http: reqwest::Client,
    /// Period keys this process is running: it never claims one of them
    /// again (a released or expired claim of its own is taken over only
    /// once its job has stopped).
    running_here: Arc<Mutex<HashSet<String>>>,
    /// How each job's supervisor is started.
    supervisor: Arc<supervisor::Launcher>,
}

/// The result of [`Context::claim`].
pub enum Taken {
    /// This process won the claim and runs the period.
    Won(Won),
    /// Not won; why, as the store said.
    Not(Claim),
    /// This process is running the period already.
    RunningHere,
}

/// A claim this process won, with what its fence is measured from. It
/// marks the period as running here until dropped.
pub struct Won {
    /// The won claim.
    pub lease: Lease,
    /// When the claiming statement was sent.
    sent: Instant,
    /// The lease it asked for.
    granted: Duration,
    _here: RunningHere,
}

struct RunningHere {
    key: String,
    set: Arc<Mutex<HashSet<String>>>,
}

impl Drop for RunningHere {
    fn drop(&mut self) {
        if let Ok(mut set) = self.set.lock() {
            set.remove(&self.key);
        }
    }
}

impl Context {
    /// A context on `store` with leases of `lease`.
    pub fn new(store: Store, lease: Duration) -> Result<Context, Error> {
        let http = reqwest::Client::builder()
            .user_agent(concat!("scheduler/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Environment(e.into()))?;
        Ok(Context {
            heartbeats: Heartbeats::start(store.clone(), lease),
            store,
            http,
            running_here: Arc::default(),
            supervisor: Arc::new(supervisor::Launcher::find()),
        })
    }

    /// Claims a period, unless this process is running it already.
    pub async fn claim(&self, request: &ClaimRequest<'_>) -> Result<Taken, Error> {
        let key = period_key(request.job, &request.period.label);
        let here = {
            let Ok(mut set) = self.running_here.lock() else {
                return Ok(Taken::RunningHere);
            };
            if !set.insert(key.clone()) {
                return Ok(Taken::RunningHere);
            }
            RunningHere {
                key,
                set: self.running_here.clone(),
            }
        };
        let sent = Instant::now();
        Ok(match self.store.claim(request).await? {
            Claim::Won(lease) => Taken::Won(Won {
                lease,
                sent,
                granted: request.lease,
                _here: here,
            }),
            other => Taken::Not(other),
        })
    }

    /// Runs the action of a won claim to its end, with heartbeats, and
    /// records the outcome under the claim's attempt. `stop_now` turning
    /// true (shutdown, once the grace is over) stops the job and releases
    /// the claim.
    pub async fn execute(
        &self,
        run: &Run<'_>,
        won: &Won,
        stop_now: watch::Receiver<bool>,
    ) -> Result<Ending, Error> {
        let watch = self.heartbeats.watch(&won.lease, won.sent, won.granted);
        let stop = async {
            let mut stop_now = stop_now;
            tokio::select! {
                loss = watch.lost() => {
                    if loss == Loss::Fenced {
                        tracing::warn!(
                            period_key = run.key,
                            attempt = won.lease.attempt,
                            "lease not renewed in time; stopping the job before another runner may take it"
                        );
                    }
                    Stop::Lost
                }
                _ = stop_now.wait_for(|now| *now) => Stop::Shutdown,
            }
        };
        let result = match &run.job.action {
            Action::Process {
                program,
                workdir,
                env,
            } => {
                let spawn = process::Spawn {
                    supervisor: &self.supervisor,
                    fence_at: watch.fence_at(),
                    heartbeats: &self.heartbeats,
                };
                process::run(program, workdir.as_ref(), env, run, spawn, stop).await
            }
            Action::Http {
                url,
                method,
                headers,
                body,
                timeout,
            } => {
                let request = http::Request {
                    url,
                    method,
                    headers,
                    body: body.as_ref(),
                    timeout: *timeout,
                };
                http::run(&self.http, request, run, stop).await
            }
            Action::Sql { statement, params } => {
                let params: Vec<String> = params.iter().map(|p| p.render(run)).collect();
                let limits = SqlLimits::new(run.job.timeout, self.heartbeats.interval());
                let recording = || watch.recording();
                let sql = self
                    .store
                    .finish_with_sql(run.lease, statement, &params, &limits, &recording);
                tokio::pin!(sql);
                let stopped = tokio::select! {
                    result = &mut sql => Ok(result),
                    why = stop => Err(why),
                };
                let result = match stopped {
                    Ok(result) => result,
                    Err(why) => {
                        // The statement is stopped (SQLite interrupts it,
                        // PostgreSQL cancels it); its transaction commits
                        // only if it had already got that far.
                        limits.cancel();
                        if let Ok(Ok(true)) = sql.await {
                            return Ok(Ending::Recorded {
                                succeeded: true,
                                error: None,
                                retry_after: None,
                            });
                        }
                        return self.stopped(run, &watch, why).await;
                    }
                };
                return match result? {
                    Ok(true) => Ok(Ending::Recorded {
                        succeeded: true,
                        error: None,
                        retry_after: None,
                    }),
                    Ok(false) => Ok(Ending::Lost),
                    Err(_) if watch.fenced() => Ok(Ending::Fenced),
                    Err(error) => {
                        let finish = Finish {
                            error: Some(format!("SQL failed: {error}")),
                            ..Finish::default()
                        };
                        self.record(run, &watch, finish, true).await
                    }
                };
            }
        };
        match result {
            ActionResult::Stopped(why) => self.stopped(run, &watch, why).await,
            // A failure seen after the fence may be the fence's own doing
            // (the supervisor stops a job whose lease it cannot vouch for):
            // it is not the job's failure, and the period is recovered.
            ActionResult::Done(finish, _) if !finish.succeeded && watch.fenced() => {
                Ok(Ending::Fenced)
            }
            ActionResult::Done(finish, retryable) => {
                self.record(run, &watch, finish, retryable).await
            }
        }
    }

    /// After the job was stopped: a shutdown releases the claim; a takeover
    /// or a `release` is confirmed (the job is gone, so a released period
    /// may be claimed at once); a fence leaves the claim to expire.
    async fn stopped(&self, run: &Run<'_>, watch: &Watch, why: Stop) -> Result<Ending, Error> {
        match why {
            Stop::Shutdown => Ok(if self.store.release(run.lease).await? {
                Ending::Released
            } else {
                Ending::Lost
            }),
            Stop::Lost if watch.fenced() => Ok(Ending::Fenced),
            Stop::Lost => match self.store.confirm_stopped(run.lease).await {
                // Still this attempt, released: `scheduler release` did it.
                Ok(true) => Ok(Ending::Withdrawn),
                Ok(false) => Ok(Ending::Lost),
                Err(e) => {
                    tracing::warn!(
                        period_key = run.key,
                        "cannot confirm that the released job stopped ({e}); the period can be claimed when its lease runs out"
                    );
                    Ok(Ending::Lost)
                }
            },
        }
    }

    async fn record(
        &self,
        run: &Run<'_>,
        watch: &Watch,
        mut finish: Finish,
        retryable: bool,
    ) -> Result<Ending, Error> {
        if !finish.succeeded && retryable {
            let failures = u32::try_from(run.lease.failures).unwrap_or(0) + 1;
            finish.retry_after = run.job.retry.backoff_after(failures);
        }
        // The lease is still renewed while the outcome is written; a claim
        // that the write itself settles is not a takeover.
        watch.recording();
        // A database that is briefly away is waited for; the fence keeps a
        // late write from landing on a claim that moved on.
        let mut delay = Duration::from_millis(100);
        let mut tries = 0;
        let recorded = loop {
            match self.store.finish(run.lease, &finish).await {
                Ok(recorded) => break recorded,
                Err(e) if tries < 8 => {
                    tracing::warn!(period_key = run.key, "cannot record the outcome yet: {e}");
                    tries += 1;
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(Duration::from_secs(5));
                }
                Err(e) => return Err(e),
            }
        };
        Ok(if recorded {
            Ending::Recorded {
                succeeded: finish.succeeded,
                error: finish.error,
                retry_after: finish.retry_after,
            }
        } else {
            Ending::Lost
        })
    }
}

/// Who claims: host, pid and a start stamp, so that a restarted container
/// with the same host name and pid 1 is still told apart.
pub fn owner_id() -> String {
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "unknown".into());
    let stamp = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_micros())
        .unwrap_or_default();
    format!("{host}:{}:{stamp:x}", std::process::id())
}

/// A flag that turns true `grace` after `shutdown` does: when running jobs
/// are stopped and their claims released.
pub fn after_grace(mut shutdown: watch::Receiver<bool>, grace: Duration) -> watch::Receiver<bool> {
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = shutdown.wait_for(|down| *down) => {}
            () = tx.closed() => return,
        }
        tracing::info!(
            "a running job gets {} (shutdown_grace) to end; then it is stopped and its claim released",
            humantime::format_duration(grace)
        );
        tokio::select! {
            () = tokio::time::sleep(grace) => {}
            () = tx.closed() => return,
        }
        let _ = tx.send(true);
    });
    rx
}
