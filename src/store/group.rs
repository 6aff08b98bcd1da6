//! One pass over a group of `sql` actions, written once for both
//! databases: each action in turn in the group's transaction, a savepoint
//! each when the pass is careful (or the action is a handler), none
//! started past the group's budget, a claim that moved on skipped. What
//! differs per database (how a statement is bounded, bound, stopped and
//! told) is the backend's [`GroupTx`]; beginning, locking, recording and
//! committing the transaction stay with each backend.

use std::collections::HashSet;
use std::future::Future;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};

use super::{Finish, Lease, Store, query_error};
use crate::error::Error;
use crate::handler::{Context, Failure, Handled, Handler, Scoped, Transaction};

/// Why a statement of a group did not succeed.
pub(super) enum Refused {
    /// The group was stopped (its claim lost, or shutdown's grace over).
    Stopped,
    /// It failed: the error, secrets masked.
    Failed(String),
}

/// A backend's transaction as a pass drives it.
pub(super) trait GroupTx: Send {
    /// Bounds the action about to run by its job's `timeout`: how long a
    /// handler may run, if bounded.
    fn bound(
        &mut self,
        timeout: Option<Duration>,
    ) -> impl Future<Output = Result<Option<Duration>, sqlx::Error>> + Send;

    /// The action ended: the group's own statements are not bounded by it.
    fn unbound(&mut self);

    /// Runs one of the group's own statements (savepoints).
    fn execute(
        &mut self,
        sql: &'static str,
    ) -> impl Future<Output = Result<(), sqlx::Error>> + Send;

    /// Runs an `sql` action's statement with its params.
    fn statement(
        &mut self,
        run: &GroupedSql<'_>,
        statement: &str,
        params: &[Param],
    ) -> impl Future<Output = Result<(), Refused>> + Send;

    /// The transaction, as a handler is given it.
    fn transaction(&mut self) -> Transaction<'_>;

    /// How an action stopped at its bound is told.
    fn timed_out(&self) -> String;

    /// Whether the last action was stopped at its bound by the database.
    fn expired(&self) -> bool;
}

/// How one pass went.
pub(super) enum Pass {
    /// Every action ran, or was left for later; `ends` says how.
    Done,
    /// Stopped through the cancel.
    Stopped,
    /// Action `i` failed outside a savepoint, or ended the connection: the
    /// transaction is lost, and the next pass is careful.
    FailedAt(usize, String),
    /// Handler `i`'s transaction is gone (it ended it, or the session was
    /// ended under it): its end is recorded on its own.
    Ended(usize, GroupedEnd),
}

/// What one pass runs, and how.
pub(super) struct PassOver<'p> {
    pub(super) runs: &'p [GroupedSql<'p>],
    /// The keys still at their attempts.
    pub(super) ours: &'p HashSet<String>,
    /// Actions a pass before found failing.
    pub(super) failed: &'p [Option<String>],
    /// Each action in a savepoint of its own.
    pub(super) careful: bool,
    pub(super) limits: &'p SqlLimits,
    /// From when the group's budget counts.
    pub(super) started: Instant,
    /// What a round trip takes now; taken off each statement's time, so a
    /// busy machine does not make quick statements look slow.
    pub(super) round_trip: Duration,
}

/// Runs the group's actions once, in `tx`, each one's end pushed to
/// `ends`.
pub(super) async fn run_pass<T: GroupTx>(
    tx: &mut T,
    pass: PassOver<'_>,
    ends: &mut Vec<GroupedEnd>,
) -> Result<Pass, sqlx::Error> {
    let mut ran = false;
    for (i, run) in pass.runs.iter().enumerate() {
        if !pass.ours.contains(run.lease.key.as_str()) {
            ends.push(GroupedEnd::Moved);
            continue;
        }
        if let Some(error) = &pass.failed[i] {
            ends.push(GroupedEnd::Failed(error.clone()));
            continue;
        }
        if ran && pass.started.elapsed() >= GROUP_BUDGET {
            ends.push(GroupedEnd::NotStarted);
            continue;
        }
        ran = true;
        // A handler runs once: in a savepoint, never in a pass that a
        // failure would make run again.
        let careful = pass.careful || run.work.is_code();
        if careful {
            tx.execute("SAVEPOINT period").await?;
        }
        let bound = tx.bound(run.timeout).await?;
        let action_started = Instant::now();
        let failure = match &run.work {
            Work::Statement { statement, params } => {
                match tx.statement(run, statement, params).await {
                    Ok(()) => None,
                    Err(Refused::Stopped) => return Ok(Pass::Stopped),
                    Err(Refused::Failed(error)) if !careful => {
                        return Ok(Pass::FailedAt(i, error));
                    }
                    Err(Refused::Failed(error)) => Some(GroupedEnd::Failed(error)),
                }
            }
            Work::Code { handler, context } => {
                let timed_out = tx.timed_out();
                let over = Over {
                    bound,
                    timed_out: &timed_out,
                    limits: pass.limits,
                };
                let handled = handle(tx.transaction(), *handler, context, over);
                match handled.await {
                    None => return Ok(Pass::Stopped),
                    Some(Ok(())) => None,
                    Some(Err(_)) if *pass.limits.cancel.borrow() => return Ok(Pass::Stopped),
                    Some(Err(_)) if tx.expired() => Some(GroupedEnd::Failed(timed_out)),
                    Some(Err(Failure::Permanent(why))) => Some(GroupedEnd::Permanent(why)),
                    Some(Err(failure)) => Some(GroupedEnd::Failed(failure.message().to_owned())),
                }
            }
        };
        let took = action_started.elapsed();
        tx.unbound();
        if careful && let Some(lost) = end_savepoint(tx, run, &failure, i).await? {
            return Ok(lost);
        }
        ends.push(failure.unwrap_or(GroupedEnd::Succeeded(took.saturating_sub(pass.round_trip))));
    }
    Ok(Pass::Done)
}

/// The ends of a group whose handler `i` lost its transaction
/// ([`Pass::Ended`]): that one ended as `end`, the others never started;
/// and the one outcome to record, outside the lost transaction.
pub(super) fn alone<'a>(
    runs: &[GroupedSql<'a>],
    i: usize,
    end: GroupedEnd,
) -> (Vec<GroupedEnd>, Vec<(&'a Lease, Finish)>) {
    let mut ends = vec![GroupedEnd::NotStarted; runs.len()];
    ends[i] = end;
    let outcomes = group_outcomes(runs, &ends);
    (ends, outcomes)
}

/// Releases an action's savepoint, rolled back first if it failed: `Some`
/// when that could not be done and the pass is lost.
async fn end_savepoint<T: GroupTx>(
    tx: &mut T,
    run: &GroupedSql<'_>,
    failure: &Option<GroupedEnd>,
    i: usize,
) -> Result<Option<Pass>, sqlx::Error> {
    let ending = match failure {
        None => "RELEASE SAVEPOINT period",
        Some(_) => "ROLLBACK TO SAVEPOINT period; RELEASE SAVEPOINT period",
    };
    let Err(e) = tx.execute(ending).await else {
        return Ok(None);
    };
    match failure {
        // The handler's transaction is gone: it ended it itself, or the
        // server ended the session under it.
        _ if run.work.is_code() => Ok(Some(Pass::Ended(i, lost_transaction(&e)))),
        // The statement failed and the transaction with it (a statement
        // that ends its own session): its failure is known, the pass is
        // lost.
        Some(GroupedEnd::Failed(error)) => Ok(Some(Pass::FailedAt(i, error.clone()))),
        _ => Err(e),
    }
}

/// What ends a handler before it returns.
struct Over<'o> {
    /// Its bound, if any.
    bound: Option<Duration>,
    /// How it is told that it ran past its bound.
    timed_out: &'o str,
    /// Their cancel stops the group.
    limits: &'o SqlLimits,
}

/// Runs a transaction-scoped handler in `transaction` until it returns or
/// `over`: how it ended, or `None` when the group was stopped.
async fn handle(
    transaction: Transaction<'_>,
    handler: &Scoped,
    context: &Context,
    over: Over<'_>,
) -> Option<Handled> {
    let token = context.token().clone();
    let handled = Handler::in_transaction(handler, context.clone(), transaction, None);
    let bound = async {
        match over.bound {
            Some(bound) => tokio::time::sleep(bound).await,
            None => std::future::pending().await,
        }
    };
    // Stopped, or past its bound, the handler is dropped at once, even
    // while it awaits something else than the database.
    tokio::select! {
        handled = handled => Some(handled),
        () = bound => {
            token.cancel();
            Some(Err(Failure::retry(over.timed_out.to_owned())))
        }
        () = over.limits.cancelled_wait() => None,
    }
}

/// What is recorded of a transaction-scoped handler whose transaction is
/// gone by the time it returned: a permanent failure when the database
/// says there is no transaction (the handler committed or rolled back
/// itself: what it wrote may have committed without the period's
/// outcome); else (the connection was lost, say past PostgreSQL's
/// `idle_in_transaction_session_timeout`) a failure under the retry
/// policy, nothing of it committed.
fn lost_transaction(e: &sqlx::Error) -> GroupedEnd {
    match e {
        sqlx::Error::Database(_) => GroupedEnd::Permanent(format!(
            "the handler ended its transaction itself (COMMIT or ROLLBACK): what it wrote may have committed without the period's outcome; not retried ({e})"
        )),
        _ => GroupedEnd::Failed(format!("the handler's transaction was lost: {e}")),
    }
}

/// One `sql` action of a group committed together.
#[derive(Debug)]
pub struct GroupedSql<'a> {
    /// Its won claim.
    pub lease: &'a Lease,
    /// What it runs.
    pub work: Work<'a>,
    /// How long the statement may run: the job's `timeout`.
    pub timeout: Option<Duration>,
    /// What is recorded if the statement fails (its error filled in).
    pub failure: Finish,
    /// Values masked in its error (a bound param may hold a secret, and
    /// the database quotes bad values back).
    pub secrets: &'a crate::template::Secrets,
}

impl GroupedSql<'_> {
    /// How the database's error about it is told, secrets masked.
    pub(super) fn error(&self, e: &dyn std::fmt::Display) -> String {
        self.secrets.mask(&e.to_string())
    }
}

/// What one action of a group runs in the group's transaction.
pub enum Work<'a> {
    /// An `sql` job's statement.
    Statement {
        /// With `$1`, `$2`, … for the params (and, when traces are on, the
        /// attempt's trace context in a comment).
        statement: std::borrow::Cow<'a, str>,
        /// Its params, rendered.
        params: Vec<Param>,
    },
    /// A code job's transaction-scoped handler: always in a savepoint of
    /// its own, and run once (a failure is rolled back alone, never run
    /// again in a second pass).
    Code {
        /// The handler.
        handler: &'a crate::handler::Scoped,
        /// What it is told, its token cancelled when the group is stopped.
        context: crate::handler::Context,
    },
}

/// A bound param of an `sql` statement.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Param {
    /// Text.
    Text(String),
    /// An instant (a param that is just `{period_start}`, `{period_end}` or
    /// `{scheduled_at}`): a `timestamptz` on PostgreSQL, so that a
    /// procedure taking one is called as written; RFC 3339 text on SQLite,
    /// which has no such type.
    Instant(DateTime<Utc>),
}

impl Param {
    /// Its value as text, as SQLite is given it.
    pub fn text(&self) -> String {
        match self {
            Param::Text(text) => text.clone(),
            Param::Instant(at) => crate::period::utc_text(*at),
        }
    }
}

impl std::fmt::Debug for Work<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Work::Statement { statement, .. } => write!(f, "Statement({statement:?})"),
            Work::Code { context, .. } => write!(f, "Code({})", context.period_key()),
        }
    }
}

impl Work<'_> {
    /// Whether it is a handler.
    pub(super) fn is_code(&self) -> bool {
        matches!(self, Work::Code { .. })
    }

    /// How a failure of it is told.
    pub(super) fn failed(&self, error: &str) -> String {
        match self {
            Work::Statement { .. } => format!("SQL failed: {error}"),
            Work::Code { .. } => error.to_owned(),
        }
    }
}

/// How one action of a group ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GroupedEnd {
    /// Its statement and its success committed together; how long the
    /// statement ran (on PostgreSQL, beyond a round trip of the moment).
    Succeeded(Duration),
    /// Its statement failed and was rolled back; the failure is recorded.
    Failed(String),
    /// Its handler failed for good and was rolled back; the failure is
    /// recorded, no retry due.
    Permanent(String),
    /// Its claim had moved on: nothing of it ran.
    Moved,
    /// Not started: the group had run its [`GROUP_BUDGET`].
    NotStarted,
}

/// How long a group of `sql` actions runs before it starts no more
/// statements: it commits what it ran and leaves the rest
/// ([`GroupedEnd::NotStarted`]) to run apart, so a slow statement delays
/// the others of its group once at most.
pub const GROUP_BUDGET: Duration = Duration::from_millis(100);

/// What a group records: each success, and each failure with its error.
pub(super) fn group_outcomes<'a>(
    runs: &[GroupedSql<'a>],
    ends: &[GroupedEnd],
) -> Vec<(&'a Lease, Finish)> {
    runs.iter()
        .zip(ends)
        .filter_map(|(run, end)| match end {
            GroupedEnd::Succeeded(_) => Some((
                run.lease,
                Finish {
                    succeeded: true,
                    definition: run.failure.definition.clone(),
                    ..Finish::default()
                },
            )),
            GroupedEnd::Failed(error) => Some((
                run.lease,
                Finish {
                    error: Some(run.work.failed(error)),
                    ..run.failure.clone()
                },
            )),
            GroupedEnd::Permanent(error) => Some((
                run.lease,
                Finish {
                    error: Some(run.work.failed(error)),
                    retry_after: None,
                    ..run.failure.clone()
                },
            )),
            GroupedEnd::Moved | GroupedEnd::NotStarted => None,
        })
        .collect()
}

/// The bounds of an `sql` action's statement.
#[derive(Debug)]
pub struct SqlLimits {
    /// How long the statement may run: the job's `timeout`.
    pub timeout: Option<Duration>,
    /// How long a statement may hold SQLite's one writer at most, whatever
    /// its `timeout` (heartbeats and claims wait for it meanwhile).
    pub writer_timeout: Duration,
    /// Turned true to stop the statement: its claim was lost or shutdown
    /// came. A channel, so a waiter sleeps until it turns and SQLite's
    /// progress handler can read it too.
    pub cancel: tokio::sync::watch::Sender<bool>,
}

impl SqlLimits {
    /// Limits with no cancel yet.
    pub fn new(timeout: Option<Duration>, writer_timeout: Duration) -> SqlLimits {
        SqlLimits {
            timeout,
            writer_timeout,
            cancel: tokio::sync::watch::Sender::new(false),
        }
    }

    /// Stops the statement.
    pub fn cancel(&self) {
        self.cancel.send_replace(true);
    }

    /// Resolves once the statement is to stop.
    pub(super) async fn cancelled_wait(&self) {
        let _ = self
            .cancel
            .subscribe()
            .wait_for(|cancelled| *cancelled)
            .await;
    }
}

impl Store {
    /// Runs a group of `sql` actions in one transaction and one commit:
    /// each statement in a savepoint of its own, so a failing one fails
    /// only its own period, and every outcome fenced by its attempt. While
    /// the group runs its claims cannot be taken over (PostgreSQL: a key
    /// share lock each, which renewals pass and other replicas' claims
    /// report as held; SQLite: the one writer). A group that fails to
    /// commit records nothing. `recording` is called just before the
    /// outcomes are written. `Ok(None)`: stopped through `limits.cancel`,
    /// nothing committed.
    pub async fn run_sql_group(
        &self,
        runs: &[GroupedSql<'_>],
        limits: &SqlLimits,
        recording: &(dyn Fn() + Sync),
    ) -> Result<Option<Vec<GroupedEnd>>, Error> {
        dispatch!(self.run_sql_group(runs, limits, recording)).map_err(query_error)
    }
}
