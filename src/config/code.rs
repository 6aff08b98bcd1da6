//! Jobs and settings declared in Rust code (the library): the knobs of
//! `jobs.toml` as typed builder methods, checked by the same rules
//! (those of `jobs.toml`) into the same [`Job`] and [`Settings`] values.

use std::sync::Arc;
use std::time::Duration;

use chrono_tz::Tz;

use super::after::{After, Named, OnRerun};
use super::rules::{
    SHORTEST_LEASE, SHORTEST_SCAN, count_problem, duration_problem, floor_problem,
    job_name_problem, keep_problem, namespace_problem, schedule,
};
use super::{Action, ConfigError, Fingerprint, Job, Missed, Policy, Retry, Settings, short};
use crate::handler::{BoxFuture, Context, Handled, Handler, Transaction};
use crate::period::{Covers, PeriodRule, Unit};
use crate::schedule::DstRule;

/// A job whose action is an async function of this program.
///
/// The same knobs as a `[[job]]` of `jobs.toml`, with the same defaults
/// and the same checks (made when the scheduler is built):
///
/// ```
/// use scheduler::{CodeJob, Covers, Unit};
///
/// let job = CodeJob::new("billing", "0 3 1 * *")
///     .timezone(scheduler::chrono_tz::Europe::Berlin)
///     .period(Unit::Month)
///     .covers(Covers::Previous)
///     .handler(|cx| async move {
///         println!("billing {}", cx.label());
///         Ok(())
///     });
/// # let _ = job;
/// ```
#[derive(Debug, Clone)]
#[must_use]
pub struct CodeJob {
    name: String,
    schedule: String,
    timezone: Option<Tz>,
    period: PeriodRule,
    dst: DstRule,
    concurrency: Option<u32>,
    shards: u32,
    missed: Missed,
    retry: Retry,
    timeout: Option<Duration>,
    keep: Option<Duration>,
    deadline: Option<Duration>,
    after: Vec<String>,
    on_upstream_rerun: Option<OnRerun>,
    handler: Option<Handler>,
}

impl CodeJob {
    /// A job called `name` firing on `schedule` (5 cron fields, 6 with
    /// seconds first, or `@hourly`, `@daily`, …), in the scheduler's zone,
    /// each fire a period of its own ([`Unit::Fire`]) until
    /// [`CodeJob::period`] says otherwise.
    pub fn new(name: impl Into<String>, schedule: impl Into<String>) -> CodeJob {
        CodeJob {
            name: name.into(),
            schedule: schedule.into(),
            timezone: None,
            period: PeriodRule::default(),
            dst: DstRule::default(),
            concurrency: None,
            shards: 1,
            missed: Missed::default(),
            retry: Retry::default(),
            timeout: None,
            keep: None,
            deadline: None,
            after: Vec::new(),
            on_upstream_rerun: None,
            handler: None,
        }
    }

    /// The zone its schedule and periods are read in.
    pub fn timezone(mut self, zone: Tz) -> CodeJob {
        self.timezone = Some(zone);
        self
    }

    /// The granularity of its periods.
    pub fn period(mut self, unit: Unit) -> CodeJob {
        self.period.unit = unit;
        self
    }

    /// Whether a fire covers the period it falls in or the one before.
    pub fn covers(mut self, covers: Covers) -> CodeJob {
        self.period.covers = covers;
        self
    }

    /// What fires in a daylight-saving gap or repeat do.
    pub fn dst(mut self, dst: DstRule) -> CodeJob {
        self.dst = dst;
        self
    }

    /// Periods (shards, of a job whose periods are split) of this job
    /// running at once, across all replicas (at least 1; by default 1, or
    /// [`CodeJob::shards`]).
    pub fn concurrency(mut self, n: u32) -> CodeJob {
        self.concurrency = Some(n);
        self
    }

    /// Splits each period into `n` shards (2 to
    /// [`MAX_SHARDS`](crate::period::MAX_SHARDS); 1, the default, splits
    /// nothing), each claimed, run and recorded on its own; the handler
    /// reads its shard from [`Context::shard`](crate::Context::shard).
    pub fn shards(mut self, n: u32) -> CodeJob {
        self.shards = n;
        self
    }

    /// What happens to periods missed while nothing ran.
    pub fn missed(mut self, missed: Missed) -> CodeJob {
        self.missed = missed;
        self
    }

    /// Retries of failures the handler reports as retryable.
    pub fn retry(mut self, retry: Retry) -> CodeJob {
        self.retry = retry;
        self
    }

    /// How long a run may take: past it the handler's token is cancelled,
    /// its future dropped and the run recorded failed.
    pub fn timeout(mut self, timeout: Duration) -> CodeJob {
        self.timeout = Some(timeout);
        self
    }

    /// How long finished periods are kept before `prune` may delete them
    /// (at least the catch-up window).
    pub fn keep(mut self, keep: Duration) -> CodeJob {
        self.keep = Some(keep);
        self
    }

    /// How long after its fire a period must have succeeded, or it is late
    /// (as `deadline` in `jobs.toml`).
    pub fn deadline(mut self, deadline: Duration) -> CodeJob {
        self.deadline = Some(deadline);
        self
    }

    /// The jobs (of the file or of code) whose periods each of its
    /// periods waits for, as `after` in `jobs.toml`: those whose windows
    /// overlap its own; its own name makes each period wait for its
    /// previous one.
    pub fn after<I, S>(mut self, jobs: I) -> CodeJob
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.after = jobs.into_iter().map(Into::into).collect();
        self
    }

    /// What a succeeded period becomes when a period it needed succeeds
    /// again, as `on_upstream_rerun` in `jobs.toml` (shown `stale` by
    /// default).
    pub fn on_upstream_rerun(mut self, on_rerun: OnRerun) -> CodeJob {
        self.on_upstream_rerun = Some(on_rerun);
        self
    }

    /// Its action: `f` runs for each claimed period; its outcome is
    /// recorded after it returns.
    pub fn handler<F, Fut>(mut self, f: F) -> CodeJob
    where
        F: Fn(Context) -> Fut + Send + Sync + 'static,
        Fut: std::future::Future<Output = Handled> + Send + 'static,
    {
        self.handler = Some(Handler::plain(f));
        self
    }

    /// Its action, transaction-scoped: `f` runs in the database
    /// transaction that records the period's success, so what it writes
    /// there commits together with that success, or not at all. Like an
    /// `sql` job it holds a transaction while it runs: keep it short (on
    /// SQLite it holds the one writer, at most lease/3).
    ///
    /// ```
    /// use scheduler::{CodeJob, Context, Handled, Transaction, Unit};
    ///
    /// async fn bill(cx: Context, mut tx: Transaction<'_>) -> Handled {
    ///     sqlx::query("INSERT INTO invoices (month) VALUES ($1)")
    ///         .bind(cx.label().to_owned())
    ///         .execute(tx.postgres()?)
    ///         .await?;
    ///     Ok(())
    /// }
    ///
    /// let job = CodeJob::new("billing", "0 3 1 * *")
    ///     .period(Unit::Month)
    ///     .transaction(|cx, tx| Box::pin(bill(cx, tx)));
    /// # let _ = job;
    /// ```
    pub fn transaction<F>(mut self, f: F) -> CodeJob
    where
        F: for<'t> Fn(Context, Transaction<'t>) -> BoxFuture<'t, Handled> + Send + Sync + 'static,
    {
        self.handler = Some(Handler::scoped(f));
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Checks it by the rules of `jobs.toml` under `settings`.
    pub(crate) fn validate(mut self, settings: &Settings) -> Result<Job, ConfigError> {
        let place = format!("code job `{}`", self.name);
        let fail = |message: String| ConfigError {
            place: place.clone(),
            message,
        };
        if let Some(problem) = job_name_problem(&self.name) {
            return Err(fail(problem));
        }
        let zone = self.timezone.unwrap_or(settings.timezone);
        let schedule = schedule(&self.schedule, zone, self.dst).map_err(fail)?;
        let Some(handler) = self.handler.take() else {
            return Err(fail(
                "no action: give it one with `.handler(…)` or `.transaction(…)`".into(),
            ));
        };
        if let Some(problem) = self.problem(settings) {
            return Err(fail(problem));
        }
        let concurrency = self.slots();
        let mut job = Job {
            name: self.name.into(),
            schedule,
            period: self.period,
            action: Action::Code(handler),
            policy: Arc::new(Policy {
                fires: Default::default(),
                timeout: self.timeout,
                concurrency,
                shards: self.shards,
                missed: self.missed,
                retry: self.retry,
                keep: self.keep,
                output_max: super::OUTPUT_MAX,
                keep_output: None,
                deadline: self.deadline,
                catch_up: settings.catch_up,
            }),
            after: Arc::new(After {
                named: self
                    .after
                    .into_iter()
                    .map(|name| Named {
                        name,
                        place: place.clone(),
                    })
                    .collect(),
                on_rerun: self.on_upstream_rerun.unwrap_or_default(),
                ..After::default()
            }),
            definition: Fingerprint::default(),
            when: Fingerprint::default(),
            secrets: Default::default(),
        };
        job.derive();
        Ok(job)
    }

    /// Its concurrency: as set, or one slot per shard.
    fn slots(&self) -> u32 {
        self.concurrency.unwrap_or(self.shards.max(1))
    }

    /// What breaks a rule of `jobs.toml` under `settings` among its counts,
    /// durations, `keep`, `deadline` and `after`, if anything: the first.
    fn problem(&self, settings: &Settings) -> Option<String> {
        let counts = [
            ("concurrency", self.slots()),
            ("retry attempts", self.retry.attempts),
        ];
        for (what, n) in counts {
            if let Some(problem) = count_problem(i64::from(n)) {
                return Some(format!("{what}: {problem}"));
            }
        }
        let most = crate::period::MAX_SHARDS;
        if !(1..=most).contains(&self.shards) {
            return Some(format!(
                "shards: `{}` is out of range: expected a whole number of shards from 1 (not split) to {most}",
                self.shards
            ));
        }
        let durations = [
            ("timeout", self.timeout),
            ("keep", self.keep),
            ("retry backoff", Some(self.retry.backoff)),
            ("retry max_backoff", Some(self.retry.max_backoff)),
        ];
        for (what, d) in durations {
            if let Some(problem) = d.and_then(|d| duration_problem(d, &short(d))) {
                return Some(format!("{what}: {problem}"));
            }
        }
        if let Some(problem) = self
            .keep
            .and_then(|keep| keep_problem(&short(keep), keep, settings.catch_up))
        {
            return Some(problem);
        }
        if let Some(problem) = self
            .deadline
            .and_then(|deadline| super::rules::deadline_problem(deadline, settings.catch_up))
        {
            return Some(problem);
        }
        if self.on_upstream_rerun.is_some() && self.after.is_empty() {
            return Some(
                "`on_upstream_rerun` without `after`: the job waits for no other job's periods, so no rerun upstream concerns it".into(),
            );
        }
        None
    }
}

impl Default for Retry {
    /// One attempt (no retry); were there more, a minute after the first
    /// failure, doubling up to an hour.
    fn default() -> Retry {
        Retry {
            attempts: 1,
            backoff: Duration::from_secs(60),
            max_backoff: Duration::from_secs(3600),
        }
    }
}

impl Retry {
    /// `attempts` in all, the first included, with the default backoff.
    pub fn attempts(attempts: u32) -> Retry {
        Retry {
            attempts,
            ..Retry::default()
        }
    }

    /// The wait after the first failure; doubled after each further one.
    pub fn backoff(mut self, backoff: Duration) -> Retry {
        self.backoff = backoff;
        self
    }

    /// The longest wait.
    pub fn max_backoff(mut self, max_backoff: Duration) -> Retry {
        self.max_backoff = max_backoff;
        self
    }
}

impl Settings {
    /// Checks settings given in code by the rules of `[scheduler]`.
    pub(crate) fn check(&self) -> Result<(), ConfigError> {
        let fail = |message: String| ConfigError {
            place: "scheduler settings".into(),
            message,
        };
        let durations = [
            ("lease", self.lease),
            ("catch_up", self.catch_up),
            ("shutdown_grace", self.shutdown_grace),
            ("scan_interval", self.scan_interval),
        ];
        for (what, d) in durations {
            if let Some(problem) = duration_problem(d, &short(d)) {
                return Err(fail(format!("{what}: {problem}")));
            }
        }
        let floors = [
            ("lease", self.lease, SHORTEST_LEASE),
            ("scan_interval", self.scan_interval, SHORTEST_SCAN),
        ];
        for (what, d, floor) in floors {
            if let Some(problem) = floor_problem(what, &short(d), d, floor) {
                return Err(fail(problem));
            }
        }
        if let Some(problem) = count_problem(i64::try_from(self.max_running).unwrap_or(0)) {
            return Err(fail(format!("max_running: {problem}")));
        }
        if let Some(problem) = self.namespace.as_deref().and_then(namespace_problem) {
            return Err(fail(problem));
        }
        Ok(())
    }
}
