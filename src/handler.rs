//! Jobs written as async Rust functions (the library's code jobs): what a
//! handler is given and what it answers. A plain handler runs like a
//! `command`: beside its heartbeats, stopped when its claim is lost. A
//! transaction-scoped one runs like an `sql` statement, in the transaction
//! that records its outcome. The vocabulary only: `config` declares jobs
//! with it, the store and the engine run them.

use std::fmt;
use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use futures_util::FutureExt;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::period::{Period, PeriodKey};
use crate::state::Trigger;

/// A boxed future, as a transaction-scoped handler returns it.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What a handler answers: `Ok(())` records the period succeeded.
pub type Handled = Result<(), Failure>;

/// Why a handler's run failed. Any error converts into a retryable one, so
/// `?` works in a handler.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub enum Failure {
    /// Recorded failed; retried by the job's `retry` policy.
    Retry(String),
    /// Recorded failed; never retried by the schedule (a manual run can
    /// still run it again).
    Permanent(String),
}

impl Failure {
    /// A failure worth retrying.
    pub fn retry(why: impl fmt::Display) -> Failure {
        Failure::Retry(why.to_string())
    }

    /// A failure that no retry mends.
    pub fn permanent(why: impl fmt::Display) -> Failure {
        Failure::Permanent(why.to_string())
    }

    /// What went wrong, in words.
    pub fn message(&self) -> &str {
        match self {
            Failure::Retry(why) | Failure::Permanent(why) => why,
        }
    }

    /// Whether the job's retry policy applies.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Failure::Retry(_))
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.message())
    }
}

/// Any standard error, with its sources (`anyhow::Error` and boxed errors
/// are not standard errors: `.map_err(Failure::retry)` takes them).
impl<E: std::error::Error + Send + Sync + 'static> From<E> for Failure {
    fn from(e: E) -> Failure {
        let mut why = e.to_string();
        let mut source = e.source();
        while let Some(cause) = source {
            // An error that already quotes its cause (sqlx's database
            // error does) says it once.
            let cause_text = cause.to_string();
            if !why.ends_with(&cause_text) {
                why.push_str(&format!(": {cause_text}"));
            }
            source = cause.source();
        }
        Failure::Retry(why)
    }
}

/// What a handler knows of the period it runs.
#[derive(Debug, Clone)]
pub struct Context {
    job: Arc<str>,
    key: PeriodKey,
    label: String,
    start: DateTime<Utc>,
    end: DateTime<Utc>,
    scheduled_at: DateTime<Utc>,
    attempt: i32,
    trigger: Trigger,
    token: CancellationToken,
    traceparent: Option<String>,
}

impl Context {
    /// What a handler running `period` of `job` under `attempt` is given.
    pub(crate) fn new(
        job: &str,
        key: PeriodKey,
        period: &Period,
        scheduled_at: DateTime<Utc>,
        (attempt, trigger): (i32, Trigger),
        token: CancellationToken,
    ) -> Context {
        Context {
            job: job.into(),
            key,
            label: period.label.clone(),
            start: period.start,
            end: period.end,
            scheduled_at,
            attempt,
            trigger,
            token,
            traceparent: None,
        }
    }

    /// The context carrying the attempt's trace context.
    pub(crate) fn traced(mut self, traceparent: Option<String>) -> Context {
        self.traceparent = traceparent;
        self
    }

    /// The span a handler runs in: what it logs carries its job, period
    /// key and attempt.
    pub(crate) fn span(&self) -> tracing::Span {
        tracing::info_span!(
            "run",
            job = &*self.job,
            period_key = self.key.as_str(),
            attempt = self.attempt
        )
    }

    /// The job's name (with the namespace, if one is set).
    pub fn job(&self) -> &str {
        &self.job
    }

    /// `<job>:<label>`, and `#<shard>/<shards>` after it for a shard:
    /// unique per period (per shard), a good Idempotency-Key for what the
    /// handler asks of other services.
    pub fn period_key(&self) -> &str {
        self.key.as_str()
    }

    /// Which shard of its period this run is (`index` from 0, `of` in
    /// all), for a job whose periods are split ([`CodeJob::shards`](crate::CodeJob::shards));
    /// `None` otherwise.
    pub fn shard(&self) -> Option<crate::period::Shard> {
        self.key.shard()
    }

    /// The period's label: `2026-07`, `2026-W29`, `2026-07-15T14:05:00Z`.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// The period's first instant.
    pub fn start(&self) -> DateTime<Utc> {
        self.start
    }

    /// The first instant after the period.
    pub fn end(&self) -> DateTime<Utc> {
        self.end
    }

    /// The fire this run stands for.
    pub fn scheduled_at(&self) -> DateTime<Utc> {
        self.scheduled_at
    }

    /// The W3C `traceparent` of this attempt's action span when the
    /// scheduler exports traces (`OTEL_EXPORTER_OTLP_ENDPOINT`), for the
    /// handler's own spans to join the attempt's trace: a
    /// `TraceContextPropagator` extracts it into an OpenTelemetry context,
    /// and `tracing-opentelemetry`'s `set_parent` hangs a `tracing` span
    /// under it. `None` with traces off.
    pub fn traceparent(&self) -> Option<&str> {
        self.traceparent.as_deref()
    }

    /// The attempt: the fencing token of this run, 1 for the first.
    pub fn attempt(&self) -> i32 {
        self.attempt
    }

    /// Why it runs.
    pub fn trigger(&self) -> Trigger {
        self.trigger
    }

    /// Cancelled when this run must stop: its claim was lost (released,
    /// taken over) or could not be renewed in time, its `timeout` passed,
    /// or shutdown's grace ran out. The handler's future is dropped right
    /// after; tasks it spawned should watch this token.
    pub fn token(&self) -> &CancellationToken {
        &self.token
    }
}

/// The transaction a transaction-scoped handler writes in: it commits
/// together with the period's success, or not at all. The handler must not
/// commit or roll it back itself.
pub struct Transaction<'t>(Conn<'t>);

enum Conn<'t> {
    #[cfg(feature = "postgres")]
    Postgres(&'t mut sqlx::PgConnection),
    #[cfg(feature = "sqlite")]
    Sqlite(&'t mut sqlx::SqliteConnection),
}

impl<'t> Transaction<'t> {
    #[cfg(feature = "postgres")]
    pub(crate) fn postgres_of(conn: &'t mut sqlx::PgConnection) -> Transaction<'t> {
        Transaction(Conn::Postgres(conn))
    }

    #[cfg(feature = "sqlite")]
    pub(crate) fn sqlite_of(conn: &'t mut sqlx::SqliteConnection) -> Transaction<'t> {
        Transaction(Conn::Sqlite(conn))
    }

    /// Whether the database is PostgreSQL (else SQLite).
    pub fn is_postgres(&self) -> bool {
        match self.0 {
            #[cfg(feature = "postgres")]
            Conn::Postgres(_) => true,
            #[cfg(feature = "sqlite")]
            Conn::Sqlite(_) => false,
        }
    }

    /// The transaction's connection on PostgreSQL; a permanent failure on
    /// SQLite.
    #[cfg(feature = "postgres")]
    pub fn postgres(&mut self) -> Result<&mut sqlx::PgConnection, Failure> {
        match &mut self.0 {
            Conn::Postgres(conn) => Ok(conn),
            #[cfg(feature = "sqlite")]
            Conn::Sqlite(_) => Err(Failure::permanent(
                "this handler writes to PostgreSQL, but the scheduler runs on SQLite",
            )),
        }
    }

    /// The transaction's connection on SQLite; a permanent failure on
    /// PostgreSQL.
    #[cfg(feature = "sqlite")]
    pub fn sqlite(&mut self) -> Result<&mut sqlx::SqliteConnection, Failure> {
        match &mut self.0 {
            Conn::Sqlite(conn) => Ok(conn),
            #[cfg(feature = "postgres")]
            Conn::Postgres(_) => Err(Failure::permanent(
                "this handler writes to SQLite, but the scheduler runs on PostgreSQL",
            )),
        }
    }
}

/// A plain handler's function.
pub type Plain = dyn Fn(Context) -> BoxFuture<'static, Handled> + Send + Sync;
/// A transaction-scoped handler's function.
pub type Scoped = dyn for<'t> Fn(Context, Transaction<'t>) -> BoxFuture<'t, Handled> + Send + Sync;

/// A code job's function.
#[derive(Clone)]
pub enum Handler {
    /// Runs beside its heartbeats; its outcome is recorded after it.
    Plain(Arc<Plain>),
    /// Runs in the transaction that records its outcome.
    Transaction(Arc<Scoped>),
}

impl fmt::Debug for Handler {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Handler::Plain(_) => "Handler::Plain",
            Handler::Transaction(_) => "Handler::Transaction",
        })
    }
}

impl Handler {
    /// A plain handler of `f`.
    pub fn plain<F, Fut>(f: F) -> Handler
    where
        F: Fn(Context) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Handled> + Send + 'static,
    {
        Handler::Plain(Arc::new(move |cx| Box::pin(f(cx))))
    }

    /// A transaction-scoped handler of `f`.
    pub fn scoped<F>(f: F) -> Handler
    where
        F: for<'t> Fn(Context, Transaction<'t>) -> BoxFuture<'t, Handled> + Send + Sync + 'static,
    {
        Handler::Transaction(Arc::new(f))
    }

    /// Runs a scoped handler in `tx`, within `timeout`; a panic is a
    /// failure of the run.
    pub(crate) async fn in_transaction(
        scoped: &Scoped,
        context: Context,
        tx: Transaction<'_>,
        timeout: Option<Duration>,
    ) -> Handled {
        let token = context.token.clone();
        let span = context.span();
        let run = AssertUnwindSafe(scoped(context, tx).instrument(span)).catch_unwind();
        let ended = match timeout {
            Some(limit) => match tokio::time::timeout(limit, run).await {
                Ok(ended) => ended,
                Err(_) => {
                    token.cancel();
                    return Err(Failure::retry(format!(
                        "timed out after {}",
                        humantime::format_duration(limit)
                    )));
                }
            },
            None => run.await,
        };
        ended.unwrap_or_else(|panic| Err(Failure::retry(panicked(&*panic))))
    }

    /// The scoped function, if it is one.
    pub(crate) fn scoped_fn(&self) -> Option<&Scoped> {
        match self {
            Handler::Transaction(f) => Some(&**f),
            Handler::Plain(_) => None,
        }
    }
}

/// What a handler that panicked is reported as.
pub(crate) fn panicked(panic: &(dyn std::any::Any + Send)) -> String {
    let said = panic
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| panic.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "a value that is not text".into());
    format!("the handler panicked: {said}")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An error that quotes its cause, as sqlx's database error does.
    #[derive(Debug, thiserror::Error)]
    #[error("error returned from database: {0}")]
    struct Quoting(#[source] Cause);

    #[derive(Debug, thiserror::Error)]
    #[error("duplicate key")]
    struct Cause;

    /// An error that does not.
    #[derive(Debug, thiserror::Error)]
    #[error("cannot bill")]
    struct Wrapping(#[source] Cause);

    #[test]
    fn a_failure_says_each_cause_once() {
        let said = |f: Failure| match f {
            Failure::Retry(why) => why,
            Failure::Permanent(why) => why,
        };
        assert_eq!(
            said(Quoting(Cause).into()),
            "error returned from database: duplicate key"
        );
        assert_eq!(said(Wrapping(Cause).into()), "cannot bill: duplicate key");
    }
}
