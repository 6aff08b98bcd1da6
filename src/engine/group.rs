//! `sql` actions in groups: the won periods of a burst run their statements
//! in one transaction, a savepoint each, their outcomes fenced and
//! committed together, so 10,000 in-database jobs are not 10,000 commits.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::heartbeat::Loss;
use super::{Ask, Engine, Report, Run, Status, Stop, Won};
use crate::config::{Action, Fingerprint, Job};
use crate::error::Error;
use crate::store::{Finish, GROUP_BUDGET, GroupedEnd, GroupedSql, Param, SqlLimits, Work};
use crate::template::Template;
use tokio_util::sync::CancellationToken;

use super::plain::context_of;

impl Engine {
    /// Runs won `sql` periods and reports each one's end: the jobs proven
    /// quick in one transaction, every other job in one of its own, side by
    /// side. What a group did not start within its budget
    /// ([`crate::store::GROUP_BUDGET`]) then runs a period per transaction,
    /// side by side. A group that cannot commit records nothing: its
    /// periods are recovered once their leases run out. `stop_now` (the end of
    /// shutdown's grace) stops the running statement and releases every
    /// claim of the group.
    pub(super) async fn run_group(
        &self,
        sql: Vec<(Ask, Won)>,
        stop_now: watch::Receiver<bool>,
    ) -> Vec<Report> {
        let mut reports = Vec::new();
        // A transaction holds periods of one job only, unless the jobs have
        // proven quick: one job's statement (slow, failing, ending its
        // connection) never touches a job that has not earned the company.
        let mut jobs: Vec<Vec<(Ask, Won)>> = Vec::new();
        for run in sql {
            match jobs.iter_mut().find(|j| j[0].0.job.name == run.0.job.name) {
                Some(job) => job.push(run),
                None => jobs.push(vec![run]),
            }
        }
        // A code job's handler runs in a transaction of its own: a handler
        // that ends its transaction itself harms no other period.
        let jobs: Vec<Vec<(Ask, Won)>> = jobs
            .into_iter()
            .flat_map(|job| match job[0].0.job.action {
                Action::Code(_) => job.into_iter().map(|run| vec![run]).collect(),
                _ => vec![job],
            })
            .collect();
        let (mut quick, unproven): (Vec<_>, Vec<_>) = jobs
            .into_iter()
            .partition(|job| self.quick.proven(&job[0].0.job));
        // A statement text not proven here yet, shared by several jobs
        // without a record here, sends one of them first: once it proved
        // quick, the others join the quick group rather than each running
        // alone (the first burst after a start, or after a strike withdrew
        // the text).
        let (probes, mut groups) = self.quick.probes(unproven);
        if !probes.is_empty() {
            reports.extend(self.side_by_side(probes, stop_now.clone()).await);
            let (proven, alone): (Vec<_>, Vec<_>) = groups
                .into_iter()
                .partition(|job| self.quick.proven(&job[0].0.job));
            quick.extend(proven);
            groups = alone;
        }
        if !quick.is_empty() {
            groups.push(quick.into_iter().flatten().collect());
        }
        reports.extend(self.side_by_side(groups, stop_now).await);
        reports
    }

    /// Runs each of `groups` as a group, side by side.
    async fn side_by_side(
        &self,
        mut groups: Vec<Vec<(Ask, Won)>>,
        stop_now: watch::Receiver<bool>,
    ) -> Vec<Report> {
        if groups.len() == 1
            && let Some(group) = groups.pop()
        {
            return self.one_group(group, stop_now).await;
        }
        let mut reports = Vec::new();
        let mut running = tokio::task::JoinSet::new();
        for group in groups {
            let engine = self.clone();
            let stop_now = stop_now.clone();
            running.spawn(async move { engine.one_group(group, stop_now).await });
        }
        while let Some(done) = running.join_next().await {
            if let Ok(done) = done {
                reports.extend(done);
            }
        }
        reports
    }

    /// Runs won `sql` periods as one group, then what the group did not
    /// start: the jobs still proven quick as a group again, the others a
    /// period per transaction, side by side.
    async fn one_group(
        &self,
        sql: Vec<(Ask, Won)>,
        stop_now: watch::Receiver<bool>,
    ) -> Vec<Report> {
        for (ask, won) in &sql {
            self.log_won(ask, won);
            won.trace.action();
        }
        let mut reports = Vec::new();
        let mut apart = tokio::task::JoinSet::new();
        let mut next = sql;
        // Each group runs one statement at least: this ends.
        while !next.is_empty() {
            let (done, later) = self.group_once(next, stop_now.clone()).await;
            reports.extend(done);
            // What the group did not start (it ran past its budget) is
            // judged again: the statement that ran long is no longer
            // proven, and a busy machine, which slows every statement a
            // little, does not send the rest to a commit each.
            let (quick, alone): (Vec<_>, Vec<_>) = later
                .into_iter()
                .partition(|(ask, _)| self.quick.proven(&ask.job));
            for run in alone {
                let engine = self.clone();
                let stop_now = stop_now.clone();
                apart.spawn(async move { engine.group_once(vec![run], stop_now).await.0 });
            }
            next = quick;
        }
        while let Some(done) = apart.join_next().await {
            if let Ok(done) = done {
                reports.extend(done);
            }
        }
        reports
    }

    /// Runs `sql` as one group: the reports of what ended, and the periods
    /// it did not start.
    async fn group_once(
        &self,
        sql: Vec<(Ask, Won)>,
        stop_now: watch::Receiver<bool>,
    ) -> (Vec<Report>, Vec<(Ask, Won)>) {
        let started = Instant::now();
        let result = self.commit_group(&sql, stop_now).await;
        let took = started.elapsed();
        let mut reports = Vec::new();
        let mut later = Vec::new();
        match result {
            Ok(Ok(ends)) => {
                for ((ask, won), end) in sql.into_iter().zip(ends) {
                    let status = match end {
                        GroupedEnd::NotStarted => {
                            later.push((ask, won));
                            continue;
                        }
                        GroupedEnd::Succeeded(took) => {
                            // A statement slower than the group's whole
                            // budget withdraws its text's proof; one merely
                            // not quick (a busy machine makes many so) only
                            // strikes its job.
                            self.quick
                                .note(&ask.job, took < QUICK, took >= GROUP_BUDGET);
                            Status::Succeeded
                        }
                        GroupedEnd::Failed(error) => {
                            self.quick.note(&ask.job, false, true);
                            let error = match &ask.job.action {
                                Action::Sql { .. } => format!("SQL failed: {error}"),
                                _ => error,
                            };
                            Status::Failed {
                                error,
                                retry_after: run_of(&ask, &won).retry_after(),
                            }
                        }
                        GroupedEnd::Permanent(error) => Status::Failed {
                            error,
                            retry_after: None,
                        },
                        GroupedEnd::Moved => Status::Lost,
                    };
                    reports.push(ended(&won, status, took));
                }
            }
            // Stopped: nothing of the group committed.
            Ok(Err(why)) => {
                for (ask, won) in sql {
                    let status = self
                        .stopped(&run_of(&ask, &won), &won.watch, why, None)
                        .await;
                    reports.push(ended(&won, status, took));
                }
            }
            // Which statement broke the transaction is not known, unless
            // the group held one job: every job of it proves itself alone
            // again.
            Err(e) => {
                let own = sql.iter().all(|(ask, _)| ask.job.name == sql[0].0.job.name);
                for (ask, won) in sql {
                    self.quick.note(&ask.job, false, own);
                    let error = ask.job.secrets.mask(&e.to_string());
                    let status = Status::Unrecorded(Error::Database(error));
                    reports.push(ended(&won, status, took));
                }
            }
        }
        for report in &reports {
            report.count();
        }
        (reports, later)
    }

    /// One transaction over `runs`, or why it was stopped: shutdown's
    /// grace ran out, or (for a group of one, run as a single `sql` action
    /// is) its claim was lost. A bigger group's claims cannot be taken
    /// over while it runs; a `release` of one of them is settled by the
    /// group's commit.
    async fn commit_group(
        &self,
        runs: &[(Ask, Won)],
        mut stop_now: watch::Receiver<bool>,
    ) -> Result<Result<Vec<GroupedEnd>, Stop>, Error> {
        // Handlers' tokens: cancelled when the group is stopped.
        let token = CancellationToken::new();
        let grouped: Vec<GroupedSql<'_>> = runs
            .iter()
            .filter_map(|(ask, won)| {
                let run = run_of(ask, won);
                let work = match &ask.job.action {
                    Action::Sql { statement, params } => Work::Statement {
                        // sqlcommenter's comment, for a database's own
                        // logs and traces to name the attempt's trace.
                        statement: match &run.traceparent {
                            Some(traceparent) => {
                                crate::trace::commented(statement, traceparent).into()
                            }
                            None => statement.as_str().into(),
                        },
                        params: params.iter().map(|p| param(p, &run)).collect(),
                    },
                    Action::Code(handler) => Work::Code {
                        handler: handler.scoped_fn()?,
                        context: context_of(&run, token.child_token()),
                    },
                    _ => return None,
                };
                Some(GroupedSql {
                    lease: &won.lease,
                    work,
                    timeout: ask.job.policy.timeout,
                    failure: run.finish(Finish::default(), true),
                    secrets: &ask.job.secrets,
                })
            })
            .collect();
        let limits = SqlLimits::new(None, self.heartbeats.interval());
        // The group writes every outcome itself; a renewal that finds a
        // claim settled from then on is not a takeover.
        let recording = || {
            for (_, won) in runs {
                won.watch.recording();
            }
        };
        let group = self.store.run_sql_group(&grouped, &limits, &recording);
        tokio::pin!(group);
        let lost = async {
            match runs {
                [(_, won)] => {
                    if won.watch.lost().await == Loss::Fenced {
                        tracing::warn!(
                            period_key = %won.lease.key,
                            attempt = won.lease.attempt,
                            "lease not renewed in time; stopping the statement before another runner may take it"
                        );
                    }
                }
                _ => std::future::pending().await,
            }
        };
        let why = tokio::select! {
            result = &mut group => return Ok(result?.ok_or(Stop::Shutdown)),
            _ = stop_now.wait_for(|now| *now) => Stop::Shutdown,
            () = lost => Stop::Lost,
        };
        limits.cancel();
        token.cancel();
        // A group that had already got as far as its commit is kept.
        Ok(group.await?.ok_or(why))
    }
}

fn run_of<'a>(ask: &'a Ask, won: &'a Won) -> Run<'a> {
    Run {
        job: &ask.job,
        period: &ask.due.period,
        key: &won.lease.key,
        lease: &won.lease,
        scheduled_at: ask.due.fire,
        traceparent: won.trace.traceparent(),
    }
}

/// The report of a grouped period's end, its trace ended with it.
fn ended(won: &Won, status: Status, took: Duration) -> Report {
    let report = Report::of(&won.lease, status, took);
    won.trace.end(&report.ended());
    report
}

/// The won periods of one job (or of several proven quick), as a group runs
/// them.
type JobRuns = Vec<(Ask, Won)>;

/// A statement this quick, ended well, proves its job (and its text): well
/// within the group's budget, and above what a busy machine adds to a
/// statement of a fraction of a millisecond (measured under the 10,000-job
/// burst: one in eight took 5–20 ms, one in seventy over 20 ms).
const QUICK: Duration = Duration::from_millis(20);

/// The most strikes a job gathers: past them it needs 1,024 quick
/// statements in a row to share again.
const MOST_STRIKES: u32 = 10;

/// Which `sql` jobs share a transaction with other jobs. A job that has not
/// run here shares if its statement text has proven quick (jobs made from
/// one template run the same statement); a job that has, once its last
/// 2^strikes statements in a row each succeeded within [`QUICK`]. A slow,
/// failing or connection-ending statement, or a shared transaction that
/// broke with the job in it, is a strike: the job runs alone again, and
/// each strike doubles the quick statements it must show before it shares
/// again, so a job that breaks its transactions now and then (a statement
/// that ends its connection every other run) soon runs alone for good.
/// A statement that is its own fault also withdraws its text's proof. Each
/// replica learns for itself.
#[derive(Default)]
pub(super) struct Quick(Mutex<Learned>);

#[derive(Default)]
struct Learned {
    /// Job name → what its statements showed here, under the definition
    /// they ran under (a reload that changes the job starts it afresh).
    jobs: HashMap<Arc<str>, Record>,
    /// Statement texts that proved quick here.
    statements: HashSet<String>,
}

#[derive(Default)]
struct Record {
    definition: Fingerprint,
    strikes: u32,
    quick_in_a_row: u32,
}

impl Learned {
    /// What `job`, as it is defined now, showed here.
    fn record(&self, job: &Job) -> Option<&Record> {
        self.jobs
            .get(&*job.name)
            .filter(|record| record.definition == job.definition)
    }
}

impl Quick {
    fn proven(&self, job: &Job) -> bool {
        // A code job's handler is the program's own code: it never shares
        // a transaction with other jobs.
        if !matches!(job.action, Action::Sql { .. }) {
            return false;
        }
        let Ok(learned) = self.0.lock() else {
            return false;
        };
        match learned.record(job) {
            Some(record) => record.quick_in_a_row >= 1 << record.strikes,
            None => statement(job).is_some_and(|s| learned.statements.contains(s)),
        }
    }

    /// Splits jobs not proven quick into the probes (one job of each
    /// statement text that several of them share and that has not proven
    /// quick here, a job with no record of its own here) and the rest.
    fn probes(&self, jobs: Vec<JobRuns>) -> (Vec<JobRuns>, Vec<JobRuns>) {
        let Ok(learned) = self.0.lock() else {
            return (Vec::new(), jobs);
        };
        let by_text = |job: &[(Ask, Won)]| {
            let job = &job[0].0.job;
            statement(job)
                .filter(|_| learned.record(job).is_none())
                .map(str::to_owned)
        };
        let mut shared: HashMap<String, usize> = HashMap::new();
        for job in &jobs {
            if let Some(text) = by_text(job) {
                *shared.entry(text).or_default() += 1;
            }
        }
        let mut sent: HashSet<String> = HashSet::new();
        jobs.into_iter().partition(|job| {
            by_text(job).is_some_and(|text| shared[&text] > 1 && sent.insert(text))
        })
    }

    /// What a statement of `job` showed: `quick` or not; `withdraw`: not
    /// quick so as to withdraw its text's proof too (it failed, or ended
    /// its connection, itself, or ran past a group's whole budget).
    fn note(&self, job: &Job, quick: bool, withdraw: bool) {
        let Ok(mut learned) = self.0.lock() else {
            return;
        };
        let record = learned.jobs.entry(job.name.clone()).or_default();
        if record.definition != job.definition {
            *record = Record {
                definition: job.definition,
                ..Record::default()
            };
        }
        if quick {
            record.quick_in_a_row = record.quick_in_a_row.saturating_add(1);
        } else {
            record.quick_in_a_row = 0;
            record.strikes = (record.strikes + 1).min(MOST_STRIKES);
        }
        let Some(text) = statement(job) else {
            return;
        };
        if quick {
            if !learned.statements.contains(text) {
                learned.statements.insert(text.to_owned());
            }
        } else if withdraw {
            learned.statements.remove(text);
        }
    }
}

fn statement(job: &Job) -> Option<&str> {
    match &job.action {
        Action::Sql { statement, .. } => Some(statement),
        _ => None,
    }
}

/// A param of `run`'s statement: an instant where it is just one, else
/// its text.
fn param(template: &Template, run: &Run<'_>) -> Param {
    match template.only_placeholder() {
        Some("period_start") => Param::Instant(run.period.start),
        Some("period_end") => Param::Instant(run.period.end),
        Some("scheduled_at") => Param::Instant(run.scheduled_at),
        _ => Param::Text(template.render(run)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Config;

    fn job(name: &str, statement: &str) -> Job {
        let text = format!(
            "[[job]]\nname = \"{name}\"\nschedule = \"* * * * *\"\nsql = {{ statement = \"{statement}\" }}\n"
        );
        let mut config = Config::parse(std::path::Path::new("jobs.toml"), &text, &|_| None)
            .expect("a valid job");
        std::sync::Arc::unwrap_or_clone(config.jobs.remove(0))
    }

    #[test]
    fn a_job_redefined_by_a_reload_proves_itself_again() {
        let quick = Quick::default();
        quick.note(&job("report", "SELECT 1"), true, true);
        assert!(quick.proven(&job("report", "SELECT 1")));
        // jobs.toml read again: the same name, a slow statement.
        let slow = job("report", "SELECT pg_sleep(3)");
        assert!(!quick.proven(&slow), "shares on the old statement's proof");
        quick.note(&slow, true, true);
        assert!(quick.proven(&slow));
    }

    #[test]
    fn each_strike_doubles_the_quick_runs_a_job_needs_to_share_again() {
        let quick = Quick::default();
        let flaky = job("flaky", "SELECT 1");
        assert!(!quick.proven(&flaky), "a new job shares before it ran");
        quick.note(&flaky, true, true);
        assert!(quick.proven(&flaky));
        for needed in [2, 4, 8] {
            // A shared transaction broke with it in: a strike.
            quick.note(&flaky, false, false);
            for _ in 1..needed {
                quick.note(&flaky, true, true);
                assert!(
                    !quick.proven(&flaky),
                    "shares again before {needed} quick runs"
                );
            }
            quick.note(&flaky, true, true);
            assert!(quick.proven(&flaky), "not back after {needed} quick runs");
        }
    }

    #[test]
    fn a_quick_text_lets_its_other_jobs_share_until_its_own_failure_withdraws_it() {
        let quick = Quick::default();
        let (first, second, third) = (
            job("a", "INSERT INTO t VALUES (1)"),
            job("b", "INSERT INTO t VALUES (1)"),
            job("c", "INSERT INTO t VALUES (1)"),
        );
        quick.note(&first, true, true);
        assert!(quick.proven(&second), "the same text has proven quick");
        // A transaction that broke around it says nothing of the text.
        quick.note(&second, false, false);
        assert!(quick.proven(&third));
        // The statement's own failure does.
        quick.note(&second, false, true);
        assert!(!quick.proven(&third));
        assert!(
            quick.proven(&first),
            "a job proven by its own runs stays so"
        );
    }
}
