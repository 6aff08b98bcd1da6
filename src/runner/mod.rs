//! Runs one claimed period: the action, its heartbeats, its stop on
//! takeover or shutdown, and the fenced write of its outcome.

mod http;
mod process;

use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use crate::config::{Action, Job};
use crate::error::Error;
use crate::heartbeat::Heartbeats;
use crate::period::{Period, utc_text};
use crate::store::{Finish, Lease, Store};
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
    /// The claim moved on; nothing was recorded.
    Lost,
    /// Stopped by shutdown; the claim was released for another runner.
    Released,
}

/// What every run of a process shares.
#[derive(Clone)]
pub struct Context {
    /// The database.
    pub store: Store,
    /// Lease renewals.
    pub heartbeats: Heartbeats,
    /// For `http` actions.
    pub http: reqwest::Client,
    /// How long SIGTERM waits for a running job.
    pub shutdown_grace: Duration,
}

impl Context {
    /// A context on `store` with leases of `lease`.
    pub fn new(store: Store, lease: Duration, shutdown_grace: Duration) -> Result<Context, Error> {
        let http = reqwest::Client::builder()
            .user_agent(concat!("scheduler/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Environment(e.into()))?;
        Ok(Context {
            heartbeats: Heartbeats::start(store.clone(), lease),
            store,
            http,
            shutdown_grace,
        })
    }

    /// Runs the action of a claimed period to its end, with heartbeats, and
    /// records the outcome under the claim's attempt.
    pub async fn execute(
        &self,
        run: &Run<'_>,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Ending, Error> {
        let mut watch = self.heartbeats.watch(run.lease);
        let grace = self.shutdown_grace;
        let stop = async move {
            let mut shutdown = shutdown;
            tokio::select! {
                () = watch.lost() => Stop::Lost,
                () = async {
                    let _ = shutdown.wait_for(|down| *down).await;
                    tokio::time::sleep(grace).await;
                } => Stop::Shutdown,
            }
        };
        let result = match &run.job.action {
            Action::Process {
                program,
                workdir,
                env,
            } => process::run(program, workdir.as_ref(), env, run, stop).await,
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
                return match self
                    .store
                    .finish_with_sql(run.lease, statement, &params)
                    .await?
                {
                    Ok(true) => Ok(Ending::Recorded {
                        succeeded: true,
                        error: None,
                        retry_after: None,
                    }),
                    Ok(false) => Ok(Ending::Lost),
                    Err(error) => {
                        let finish = Finish {
                            error: Some(format!("SQL failed: {error}")),
                            ..Finish::default()
                        };
                        self.record(run, finish, true).await
                    }
                };
            }
        };
        match result {
            ActionResult::Stopped(Stop::Lost) => Ok(Ending::Lost),
            ActionResult::Stopped(Stop::Shutdown) => {
                self.store.release(run.lease).await?;
                Ok(Ending::Released)
            }
            ActionResult::Done(finish, retryable) => self.record(run, finish, retryable).await,
        }
    }

    async fn record(
        &self,
        run: &Run<'_>,
        mut finish: Finish,
        retryable: bool,
    ) -> Result<Ending, Error> {
        if !finish.succeeded && retryable {
            let failures = u32::try_from(run.lease.failures).unwrap_or(0) + 1;
            finish.retry_after = run.job.retry.backoff_after(failures);
        }
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
