//! What running one action is given ([`Run`]) and answers
//! ([`ActionResult`]), and why it may be stopped ([`Stop`]): the words the
//! runners of each kind of action (`process`, `http`, `plain`) and the
//! engine that records their outcome share.

use chrono::{DateTime, Utc};

use crate::config::Job;
use crate::period::{Period, PeriodKey, utc_text};
use crate::store::{Finish, Lease};
use crate::template::Values;

/// One claimed period about to run.
pub struct Run<'a> {
    /// The job.
    pub job: &'a Job,
    /// The period it covers.
    pub period: &'a Period,
    /// `<job>:<label>`.
    pub key: &'a PeriodKey,
    /// The won claim.
    pub lease: &'a Lease,
    /// The fire it stands for.
    pub scheduled_at: DateTime<Utc>,
    /// The W3C `traceparent` of its action's span, when traces are on.
    pub traceparent: Option<String>,
}

impl Values for Run<'_> {
    fn value(&self, name: &str) -> String {
        match name {
            "job" => self.job.name.to_string(),
            "period" => self.period.label.clone(),
            "period_key" => self.key.to_string(),
            "period_start" => utc_text(self.period.start),
            "period_end" => utc_text(self.period.end),
            "scheduled_at" => utc_text(self.scheduled_at),
            "attempt" => self.lease.attempt.to_string(),
            "shard" => self
                .key
                .shard()
                .map(|s| s.index.to_string())
                .unwrap_or_default(),
            "shards" => self
                .key
                .shard()
                .map(|s| s.of.to_string())
                .unwrap_or_default(),
            _ => String::new(),
        }
    }
}

impl Run<'_> {
    /// The `SCHEDULER_*` variables a child process sees, and
    /// `TRACEPARENT` when traces are on (the OpenTelemetry convention for
    /// a trace context carried in the environment).
    pub fn environment(&self) -> Vec<(&'static str, String)> {
        let mut environment = vec![
            ("SCHEDULER_JOB", self.value("job")),
            ("SCHEDULER_PERIOD", self.value("period")),
            ("SCHEDULER_PERIOD_KEY", self.value("period_key")),
            ("SCHEDULER_PERIOD_START", self.value("period_start")),
            ("SCHEDULER_PERIOD_END", self.value("period_end")),
            ("SCHEDULER_SCHEDULED_AT", self.value("scheduled_at")),
            ("SCHEDULER_ATTEMPT", self.value("attempt")),
            ("SCHEDULER_TRIGGER", self.lease.trigger.as_str().to_owned()),
        ];
        if self.key.shard().is_some() {
            environment.push(("SCHEDULER_SHARD", self.value("shard")));
            environment.push(("SCHEDULER_SHARDS", self.value("shards")));
        }
        if let Some(traceparent) = &self.traceparent {
            environment.push(("TRACEPARENT", traceparent.clone()));
        }
        environment
    }

    /// What is recorded of this run's end, by every kind of action: a
    /// retryable failure is retried after the job's backoff for one
    /// failure more than its claim had, the job's definition is noted, and
    /// secrets are masked.
    pub fn finish(&self, mut finish: Finish, retryable: bool) -> Finish {
        if !finish.succeeded && retryable {
            finish.retry_after = self.retry_after();
        }
        finish.definition = Some(self.job.definition.to_string());
        finish.error = finish.error.map(|error| self.job.secrets.mask(&error));
        finish.output = finish.output.map(|output| self.job.secrets.mask(&output));
        finish
    }

    /// When a failure of this run is retried, if it is.
    pub fn retry_after(&self) -> Option<std::time::Duration> {
        let failures = u32::try_from(self.lease.failures).unwrap_or(0) + 1;
        self.job.policy.retry.backoff_after(failures)
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
    /// It was stopped; a process's output tail, masked.
    Stopped(Stop, Option<String>),
}

impl ActionResult {
    pub(super) fn succeeded() -> ActionResult {
        ActionResult::Done(
            Finish {
                succeeded: true,
                ..Finish::default()
            },
            false,
        )
    }

    pub(super) fn failed(error: String) -> ActionResult {
        ActionResult::Done(
            Finish {
                error: Some(error),
                ..Finish::default()
            },
            true,
        )
    }

    pub(super) fn permanent(error: String) -> ActionResult {
        ActionResult::Done(
            Finish {
                error: Some(error),
                ..Finish::default()
            },
            false,
        )
    }

    #[cfg(feature = "process-actions")]
    pub(super) fn set_exit_code(&mut self, code: i32) {
        if let ActionResult::Done(finish, _) = self {
            finish.exit_code = Some(code);
        }
    }
}
