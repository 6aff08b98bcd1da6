//! Runs asked for by hand or by a one-shot step, for every front end that
//! asks (`scheduler run`, the HTTP API): the due periods of a job as one
//! `serve` wake-up would take them, one period, or a range, streamed a
//! chunk at a time. Each period ends as a [`Line`] handed to a [`Sink`].

use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use serde::Serialize;
use tokio::sync::watch;

use super::due::{Due, due};
use super::{Ask, Claimed, Engine, Mode, Queue, Report, SQL_GROUP, Status, Taken, after_grace};
use crate::config::{Config, Job};
use crate::error::{Error, Outcome, Unread};
use crate::period::{Period, PeriodKey, utc_text};
use crate::state::PeriodOutcome;
use crate::store::{ADOPTED_ATTEMPT, Claim, ClaimRow, ClaimState, Store, Trigger};

/// How often `--wait` looks at a claim held elsewhere.
const WAIT_POLL: Duration = Duration::from_millis(500);

/// How many periods are looked up and claimed per database round trip; a
/// range is held in memory this many at a time, whatever its length.
const CHUNK: usize = 1_000;

/// Up to how many periods a range is counted for its progress bar; a longer
/// one shows its position without a length.
const COUNT_LIMIT: u64 = 100_000;

/// One job's periods to go through, oldest first.
struct Plan<'a> {
    job: &'a Job,
    periods: Periods,
    manual: bool,
    /// Succeeded periods are run again (`--force`; never an upstream
    /// period run first by `--with-upstream`).
    force: bool,
    /// Periods of an upstream job run first by `--with-upstream`: those
    /// already succeeded are passed over without a line.
    upstream: bool,
    /// A job that waits for the jobs run before it (`after`): its periods
    /// noted waiting that those runs made ready, worked out when its turn
    /// comes ([`Backfill::made_ready`]).
    downstream: bool,
}

/// A job's periods, handed out a chunk at a time.
enum Periods {
    /// Worked out in full (a scheduled run: at most the catch-up window).
    Listed(std::vec::IntoIter<Due>),
    /// `--period` or `--from/--to`: walked as it goes, never stored whole.
    Range(RangeWalk),
}

/// The periods from one label to another, walked one `following` at a time.
#[derive(Clone)]
struct RangeWalk {
    next: Option<Period>,
    last: Period,
}

impl RangeWalk {
    /// The next period a fire covers: a day the schedule, its calendar or
    /// its active dates leave out is no period, and is passed over.
    fn step(&mut self, job: &Job) -> Option<Period> {
        loop {
            let current = self.next.take()?;
            // A last label a spring-forward makes empty ends the walk
            // before the period that starts at its instant (the hour after
            // it).
            if is_empty(&self.last)
                && current.label != self.last.label
                && current.start >= self.last.start
            {
                return None;
            }
            if current.label != self.last.label && current.start < self.last.start {
                let following = job.period.following(&job.schedule, &current);
                // A walk that does not move forward ends rather than loops.
                if following.start > current.start {
                    self.next = Some(following);
                }
            }
            if job.period.fire_for(&job.schedule, &current).is_some() {
                return Some(current);
            }
        }
    }
}

impl Periods {
    fn chunk(&mut self, job: &Job, now: DateTime<Utc>) -> Vec<Due> {
        match self {
            Periods::Listed(dues) => dues.take(CHUNK).collect(),
            Periods::Range(walk) => std::iter::from_fn(|| walk.step(job))
                .take(CHUNK)
                .map(|p| manual_due(job, p, now))
                .collect(),
        }
    }

    /// How many periods there are, if that is quick to know.
    fn len(&self, job: &Job) -> Option<u64> {
        match self {
            Periods::Listed(dues) => Some(dues.len() as u64),
            Periods::Range(walk) => {
                let mut walk = walk.clone();
                let mut n = 0;
                while walk.step(job).is_some() {
                    n += 1;
                    if n > COUNT_LIMIT {
                        return None;
                    }
                }
                Some(n)
            }
        }
    }
}

/// What happened to one period: `run` prints it as one line.
#[derive(Debug, Clone, Serialize)]
pub struct Line {
    /// The period key.
    pub key: String,
    /// What became of it.
    pub status: PeriodOutcome,
    /// The rest, in words.
    pub detail: String,
    /// The attempt it names, if any.
    pub attempt: Option<i32>,
    /// Why the attempt ran, for a period that ran.
    pub trigger: Option<Trigger>,
    /// For a period run by hand, how it was asked for, as `history` says
    /// it: `manual`, `manual force`, `manual early`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub asked: Option<&'static str>,
    /// The job's exit code.
    pub exit_code: Option<i32>,
    /// The HTTP status the job's request got.
    pub http_status: Option<i32>,
    /// What went wrong, for a failed run.
    pub error: Option<String>,
    /// When a failed period is retried, if it is.
    pub retry_at: Option<String>,
    /// How long it ran.
    pub duration_ms: Option<u64>,
    /// Passed over because a live claim elsewhere holds it: how it ends is
    /// not known here.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub held: bool,
}

/// Which periods a manual run asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// What is due: the periods a `serve` wake-up would take (the catch-up
    /// window, retries whose backoff is over, recoveries).
    Due,
    /// One period, by label.
    Period(String),
    /// A range of labels, both included.
    Range(String, String),
}

/// A manual run, in domain terms: what every front end turns its own
/// input (flags, a JSON body) into once.
#[derive(Debug, Clone)]
pub struct Request {
    /// One job, or every job (`None`).
    pub job: Option<String>,
    /// Which periods.
    pub periods: Selection,
    /// Also re-run succeeded periods.
    pub force: bool,
    /// Run only the periods whose latest attempt failed; pass over the
    /// rest (never claimed, succeeded, running).
    pub only_failed: bool,
    /// Also run a period whose fire is still ahead.
    pub early: bool,
    /// Wait for a period held elsewhere, or for a concurrency slot.
    pub wait: bool,
    /// Say what would be claimed; claim nothing.
    pub dry_run: bool,
    /// Run first, in dependency order, the upstream periods (`after`) the
    /// asked periods need that have not succeeded.
    pub with_upstream: bool,
    /// How the front end names the fields, for its error messages.
    pub names: Names,
    /// Who asks: an API token's name, or `cli:` and the user; noted on
    /// each manual attempt.
    pub by: Arc<str>,
}

/// How a front end names a request's fields in its messages.
#[derive(Debug, Clone, Copy)]
pub struct Names {
    /// The one-period field.
    pub period: &'static str,
    /// The start of a range.
    pub from: &'static str,
    /// The end of a range.
    pub to: &'static str,
    /// Running a period not yet due.
    pub early: &'static str,
    /// Re-running succeeded periods.
    pub force: &'static str,
    /// Waiting for a period held elsewhere.
    pub wait: &'static str,
    /// Running the upstream periods first.
    pub with_upstream: &'static str,
    /// Running only failed periods.
    pub only_failed: &'static str,
}

impl Names {
    /// The command line's flags.
    pub const FLAGS: Names = Names {
        period: "--period",
        from: "--from",
        to: "--to",
        early: "--early",
        force: "--force",
        wait: "--wait",
        with_upstream: "--with-upstream",
        only_failed: "--only-failed",
    };
    /// A period label in an HTTP API path.
    pub const PATH: Names = Names {
        period: "label",
        from: "label",
        to: "label",
        early: "early",
        force: "force",
        wait: "wait",
        with_upstream: "with_upstream",
        only_failed: "only_failed",
    };
    /// The HTTP API's JSON fields.
    pub const JSON: Names = Names {
        period: "period",
        from: "from",
        to: "to",
        early: "early",
        force: "force",
        wait: "wait",
        with_upstream: "with_upstream",
        only_failed: "only_failed",
    };
}

impl Request {
    fn manual(&self) -> bool {
        self.periods != Selection::Due
    }
}

/// Where a manual run's lines go.
pub trait Sink: Send + Sync {
    /// How many periods the run goes through, when that is quick to know;
    /// said once, before the first line.
    fn total(&mut self, total: Option<u64>) {
        let _ = total;
    }

    /// `job` is paused: none of its due periods are run.
    fn paused(&mut self, job: &str) {
        tracing::info!(job, "paused: its due periods are not run");
    }

    /// `run JOB` found nothing of `job` to run now; `words` say why and
    /// when its next fire is.
    fn nothing_due(&mut self, job: &str, words: &str) {
        tracing::info!(target: "scheduler::sighting", job, "{words}");
    }

    /// A period was claimed and starts to run.
    fn claimed(&mut self, key: &str, attempt: i32) {
        let _ = (key, attempt);
    }

    /// One period ended; `Err` ends the run before its next claim (the
    /// reader went away).
    fn line(&mut self, line: &Line) -> Result<(), Unread>;

    /// Shutdown ended the run before its last period: the periods after
    /// the lines said so far were not run.
    fn cut_short(&mut self) {}
}

/// Runs `request` to the end on `engine`, each period's line to `sink`.
/// `shutdown` claims nothing more; the settings' grace after it stops the
/// running periods and releases their claims.
pub async fn drive(
    config: &Config,
    engine: &Engine,
    request: &Request,
    shutdown: watch::Receiver<bool>,
    sink: &mut dyn Sink,
) -> Result<Outcome, Error> {
    let now = engine.now();
    let mut plans = plan(config, engine.store(), request, now, sink).await?;
    let total = plans
        .iter()
        .try_fold(0u64, |sum, p| Some(sum + p.periods.len(p.job)?));
    sink.total(total);
    let mut backfill = Backfill {
        engine,
        request,
        stop_now: after_grace(shutdown.clone(), config.settings.shutdown_grace),
        shutdown,
        sink,
        outcome: Outcome::Done,
        fenced: 0,
        out_of_slots: false,
        changed: std::collections::HashMap::new(),
        max_running: config.settings.max_running,
        config,
    };
    if let Err(stop) = backfill.plans(&mut plans, now).await? {
        return stop.into_result();
    }
    if backfill.fenced > 0 {
        // Nothing is known of those periods' outcome: the database failed.
        return Err(Error::Database(format!(
            "{} period(s) stopped unfinished: their lease could not be renewed in time (the database did not answer, or this process was stopped); they are recovered by the next run or serve",
            backfill.fenced
        )));
    }
    Ok(backfill.outcome)
}

/// `run` going through its plans, oldest period first, a batch of periods
/// side by side where the job's `concurrency` (and `max_running`) allows.
struct Backfill<'a> {
    engine: &'a Engine,
    config: &'a Config,
    request: &'a Request,
    shutdown: watch::Receiver<bool>,
    stop_now: watch::Receiver<bool>,
    sink: &'a mut dyn Sink,
    outcome: Outcome,
    fenced: usize,
    /// Forced reruns whose last attempt ran under another definition of
    /// the job: their line says so. Key → that attempt.
    changed: std::collections::HashMap<String, i32>,
    /// Runs at once in this process.
    max_running: usize,
    /// A period of the job being gone through found no free slot: its
    /// later periods are not claimed either (a slot freed meanwhile would
    /// run them before it, out of order).
    out_of_slots: bool,
}

impl Backfill<'_> {
    async fn plans(
        &mut self,
        plans: &mut [Plan<'_>],
        now: DateTime<Utc>,
    ) -> Result<Result<(), Unread>, Error> {
        for plan in plans {
            self.out_of_slots = false;
            if plan.downstream {
                match self.made_ready(plan.job, now).await? {
                    Some(ready) => plan.periods = Periods::Listed(ready.into_iter()),
                    None => continue,
                }
            }
            let job = Arc::new(plan.job.clone());
            let request = Request {
                force: plan.force,
                only_failed: self.request.only_failed && !plan.upstream && !plan.downstream,
                ..self.request.clone()
            };
            let mode = Mode {
                manual: plan.manual,
                force: plan.force,
                early: self.request.early,
            };
            // A batch runs its periods side by side: at most as many as
            // the job may run at once, and (but for an `sql` group, one
            // slot) as this process may.
            let mut batch = (job.concurrency as usize).clamp(1, SQL_GROUP);
            if !matches!(job.action, crate::config::Action::Sql { .. }) {
                batch = batch.min(self.max_running.max(1));
            }
            loop {
                let chunk = plan.periods.chunk(plan.job, now);
                if chunk.is_empty() {
                    break;
                }
                let keys: Vec<PeriodKey> = chunk
                    .iter()
                    .map(|d| PeriodKey::new(&job.name, &d.period.label))
                    .collect();
                let rows = self.look_up(&job, &keys).await?;
                // A dry run says what the claim's gate would: a period whose
                // upstream is not done waits.
                let mut waits = match request.dry_run && job.after.any() {
                    true => {
                        let asked: Vec<(&Job, &Period)> =
                            chunk.iter().map(|d| (&*job, &d.period)).collect();
                        super::after::look(self.engine.store(), &asked, now).await?
                    }
                    false => Vec::new(),
                }
                .into_iter();
                let mut asks = Vec::new();
                for (due, key) in chunk.into_iter().zip(keys) {
                    let upstream = waits.next().filter(|up| up.waiting());
                    if *self.shutdown.borrow() {
                        self.cut_short();
                        return Ok(Ok(()));
                    }
                    let row = rows.get(key.as_str());
                    let done = row.is_some_and(|r| matches!(r.as_claim(), Claim::Succeeded { .. }));
                    if plan.upstream && done {
                        continue;
                    }
                    let claimable = row.is_none_or(|row| {
                        !matches!(row.as_claim(), Claim::Succeeded { .. } | Claim::Held { .. })
                    });
                    let failed = row.is_some_and(|r| matches!(r.as_claim(), Claim::Failed { .. }));
                    let skip = if request.only_failed && !failed {
                        Some(Line {
                            attempt: row.map(|r| r.attempt),
                            ..Line::bare(
                                key.as_str(),
                                format!("not failed ({}): passed over", state_word(row)),
                            )
                        })
                    } else if let Some(upstream) = upstream.filter(|_| claimable) {
                        Some(Line::new(
                            &key,
                            PeriodOutcome::Waiting,
                            upstream.to_string(),
                            None,
                        ))
                    } else if request.dry_run {
                        Some(dry_run_line(key.as_str(), row, &request))
                    } else {
                        row.and_then(|row| skip_line(key.as_str(), row, &request))
                    };
                    match skip {
                        Some(line) => {
                            if let Err(stop) = self.go(std::mem::take(&mut asks)).await? {
                                return Ok(Err(stop));
                            }
                            if let Err(stop) = self.emit(&line) {
                                return Ok(Err(stop));
                            }
                        }
                        None => {
                            asks.push(Ask {
                                job: job.clone(),
                                due,
                                mode,
                                by: plan.manual.then(|| self.request.by.clone()),
                                timed: false,
                            });
                            if asks.len() >= batch
                                && let Err(stop) = self.go(std::mem::take(&mut asks)).await?
                            {
                                return Ok(Err(stop));
                            }
                        }
                    }
                }
                if let Err(stop) = self.go(asks).await? {
                    return Ok(Err(stop));
                }
            }
        }
        Ok(Ok(()))
    }

    /// The periods of `job` noted waiting whose upstream periods have all
    /// succeeded now (the runs before made them ready), oldest first;
    /// `None` if there are none, if the job is paused, or if this run
    /// cannot run the job (its `${VAR}`s were not given: it names them and
    /// the command to run).
    async fn made_ready(&self, job: &Job, now: DateTime<Utc>) -> Result<Option<Vec<Due>>, Error> {
        let store = self.engine.store();
        // A paused job runs only by hand.
        if store.paused_jobs().await?.contains(&job.name) {
            return Ok(None);
        }
        let noted = store
            .waiting_periods(std::slice::from_ref(&job.name), RECLAIM_LIMIT)
            .await?;
        let asked: Vec<(&Job, &Period)> = noted.iter().map(|w| (job, &w.period)).collect();
        let standing = super::after::look(store, &asked, now).await?;
        let ready: Vec<Due> = noted
            .iter()
            .zip(standing)
            .filter(|(_, up)| !up.waiting())
            .map(|(w, _)| Due {
                period: w.period.clone(),
                fire: w.scheduled_at,
                trigger: Trigger::Upstream,
            })
            .collect();
        if ready.is_empty() {
            return Ok(None);
        }
        if let Some((_, var)) = self
            .config
            .incomplete
            .iter()
            .find(|(name, _)| *name == job.name)
        {
            tracing::warn!(
                job = job.name,
                ready = ready.len(),
                "ready: its upstream periods are done, but this run was not given {var}, which the job needs; `scheduler run {}` runs them (so does any `serve`, within a scan)",
                job.name
            );
            return Ok(None);
        }
        Ok(Some(ready))
    }

    /// The claims of a chunk's periods, in one statement, so a repeated
    /// backfill claims nothing; a forced rerun also notes which of them
    /// last ran under another definition of the job.
    async fn look_up(
        &mut self,
        job: &Job,
        keys: &[PeriodKey],
    ) -> Result<std::collections::HashMap<String, ClaimRow>, Error> {
        let names: Vec<String> = keys.iter().map(ToString::to_string).collect();
        let rows = self.engine.store().rows(&names).await?;
        if self.request.force && !self.request.dry_run {
            // A rerun under a changed definition says so: the last
            // attempts of the chunk's periods that ran tell, in one
            // statement.
            let ran: Vec<String> = rows.keys().cloned().collect();
            for (key, (attempt, definition)) in self.engine.store().last_definitions(&ran).await? {
                if definition.is_some_and(|d| d != job.definition.as_str()) {
                    self.changed.insert(key, attempt);
                }
            }
        }
        Ok(rows)
    }

    /// Claims `asks` in one statement, runs what was won side by side
    /// (`sql` periods as one group) and prints a line for each, in order.
    async fn go(&mut self, asks: Vec<Ask>) -> Result<Result<(), Unread>, Error> {
        if asks.is_empty() {
            return Ok(Ok(()));
        }
        if *self.shutdown.borrow() {
            self.cut_short();
            return Ok(Ok(()));
        }
        if self.out_of_slots && !self.request.wait {
            for ask in asks {
                let line = self.not_run_line(&ask, Taken::Not(Claim::Busy));
                if let Err(stop) = self.emit(&line) {
                    return Ok(Err(stop));
                }
            }
            return Ok(Ok(()));
        }
        // Where each period's line goes among the batch's: lines are
        // printed in period order, whichever ended first.
        let place: std::collections::HashMap<PeriodKey, usize> = asks
            .iter()
            .enumerate()
            .map(|(i, ask)| (ask.key(), i))
            .collect();
        let claimed = self.engine.take(vec![asks], Queue::Wait).await?;
        let Claimed { won, not_won } = claimed.into_iter().next().unwrap_or_default();
        let mut lines = Vec::new();
        // Periods that found no slot while this batch took one: the slot
        // may be a batch mate's, freed when the batch ends.
        let mut again = Vec::new();
        // Periods whose lease ran out, left to their runners a while.
        let mut expired = Vec::new();
        for (_, w) in &won {
            self.sink.claimed(w.lease.key.as_str(), w.lease.attempt);
        }
        for (ask, taken) in not_won {
            match taken {
                // A lease that ran out while this process holds recoveries
                // (it has just started, or saw the database fail) is left
                // to its runner for that long, then claimed again.
                Taken::Not(Claim::Expired { owner, until }) => expired.push((ask, owner, until)),
                Taken::Not(Claim::Held { .. } | Claim::Busy) if self.request.wait => {
                    lines.push((ask, None));
                }
                Taken::Not(Claim::Busy) if !won.is_empty() => again.push(ask),
                not => {
                    let line = self.not_run_line(&ask, not);
                    lines.push((ask, Some(line)));
                }
            }
        }
        self.wait_for_released(&mut lines).await?;
        // How each was asked for, said on its line as `history` says it.
        let modes: std::collections::HashMap<String, Mode> = won
            .iter()
            .map(|(ask, _)| (ask.key().to_string(), ask.mode))
            .collect();
        let reports = self.engine.run_won(won, self.stop_now.clone()).await;
        let mut ended: Vec<(usize, Line)> = Vec::with_capacity(place.len());
        for report in reports {
            let at = place.get(&report.key).copied().unwrap_or(usize::MAX);
            let mut line = Line::of(report, self.engine.now())?;
            line.asked = modes.get(&line.key).filter(|m| m.manual).map(|m| m.words());
            ended.push((at, line));
        }
        for ask in again {
            if *self.shutdown.borrow() {
                self.cut_short();
                break;
            }
            let at = place.get(&ask.key()).copied().unwrap_or(usize::MAX);
            if let Some(line) = self.again(ask).await? {
                ended.push((at, line));
            }
        }
        for (ask, owner, until) in expired {
            let at = place.get(&ask.key()).copied().unwrap_or(usize::MAX);
            let line = self.after_the_hold(&ask, &owner, until).await?;
            ended.push((at, line));
        }
        // A period run elsewhere is waited for after the batch's own runs
        // ended (it may be waiting for one of them to free a slot).
        for (ask, line) in lines {
            let line = match line {
                Some(line) => line,
                None => self.wait_and_run(&ask).await?,
            };
            let at = place.get(&ask.key()).copied().unwrap_or(usize::MAX);
            ended.push((at, line));
        }
        ended.sort_by_key(|(at, _)| *at);
        for (_, line) in ended {
            if let Err(stop) = self.emit(&line) {
                return Ok(Err(stop));
            }
        }
        Ok(Ok(()))
    }

    /// A period that found no slot while its batch took one, asked again
    /// now that the batch's own runs ended; busy still, it is busy
    /// elsewhere.
    async fn again(&mut self, ask: Ask) -> Result<Option<Line>, Error> {
        Ok(
            match self.engine.claim(std::slice::from_ref(&ask)).await?.pop() {
                Some(Taken::Won(w)) => {
                    self.sink.claimed(w.lease.key.as_str(), w.lease.attempt);
                    let report = self.engine.run(ask, w, self.stop_now.clone()).await;
                    Some(Line::of(report, self.engine.now())?)
                }
                Some(not) => Some(self.not_run_line(&ask, not)),
                None => None,
            },
        )
    }

    /// A period asked for by hand that `scheduler release` ended is
    /// waited for, `--wait` or not: its runner is stopping the job (within
    /// a heartbeat, or the lease at most), and nobody else will run the
    /// period, so "skipped: running on …" would leave it undone.
    async fn wait_for_released(&self, lines: &mut [(Ask, Option<Line>)]) -> Result<(), Error> {
        if !self.request.manual() || self.request.wait {
            return Ok(());
        }
        let held: Vec<String> = lines
            .iter()
            .filter(|(_, line)| {
                line.as_ref()
                    .is_some_and(|l| l.status == PeriodOutcome::Skipped)
            })
            .map(|(ask, _)| ask.key().to_string())
            .collect();
        if held.is_empty() {
            return Ok(());
        }
        let rows = self.engine.store().rows(&held).await?;
        for (ask, line) in lines.iter_mut() {
            let released = rows
                .get(ask.key().as_str())
                .is_some_and(|row| row.state == ClaimState::Released);
            if released
                && line
                    .as_ref()
                    .is_some_and(|l| l.status == PeriodOutcome::Skipped)
            {
                *line = None;
            }
        }
        Ok(())
    }

    /// `--wait`: polls a period held elsewhere, or waiting for a
    /// concurrency slot, until it ends or can be claimed, and runs it then.
    async fn wait_and_run(&mut self, ask: &Ask) -> Result<Line, Error> {
        let key = ask.key();
        // The wait for a slot is said once, not at every poll.
        let mut said_busy = false;
        loop {
            let won = match self.engine.claim(std::slice::from_ref(ask)).await?.pop() {
                Some(Taken::Won(won)) => won,
                Some(Taken::Not(Claim::Held { owner, until })) => {
                    tracing::info!(period_key = %key, %owner, %until, "waiting for the run elsewhere");
                    match self.wait_elsewhere(&key).await? {
                        Some(done) => return Ok(done),
                        None => continue,
                    }
                }
                // Left to its runner a while (`after_the_hold`), then
                // waited for as a run elsewhere is.
                Some(Taken::Not(Claim::Expired { .. })) => {
                    match self.sit_out_the_hold(&key).await {
                        Some(interrupted) => return Ok(interrupted),
                        None => continue,
                    }
                }
                Some(Taken::Not(Claim::Busy)) => {
                    if !std::mem::replace(&mut said_busy, true) {
                        tracing::info!(period_key = %key, "waiting for a free concurrency slot");
                    }
                    let mut shutdown = self.shutdown.clone();
                    tokio::select! {
                        () = tokio::time::sleep(WAIT_POLL) => continue,
                        _ = shutdown.wait_for(|down| *down) => {
                            return Ok(Line::new(&key, PeriodOutcome::Interrupted, "while waiting for a concurrency slot; not run".into(), None));
                        }
                    }
                }
                Some(not) => return Ok(self.not_run_line(ask, not)),
                None => return Ok(self.not_run_line(ask, Taken::RunningHere)),
            };
            self.sink.claimed(won.lease.key.as_str(), won.lease.attempt);
            let report = self
                .engine
                .run(ask.clone(), won, self.stop_now.clone())
                .await;
            return Line::of(report, self.engine.now());
        }
    }

    /// A period whose lease ran out, left to its runner while this process
    /// holds expired leases ([`crate::store::Store::holding`]): claimed
    /// again once the hold is over, and run, or told why not (most often
    /// `already succeeded`: the runner wrote its outcome meanwhile).
    async fn after_the_hold(
        &mut self,
        ask: &Ask,
        owner: &str,
        until: chrono::DateTime<chrono::Utc>,
    ) -> Result<Line, Error> {
        let key = ask.key();
        let left = self.engine.store().holding(self.engine.lease());
        let wait = Duration::from_millis(
            u64::try_from(left.unwrap_or_default().as_millis().div_ceil(100) * 100)
                .unwrap_or(u64::MAX),
        );
        tracing::info!(
            period_key = %key,
            "the lease of {owner} ran out at {}; waiting {} in case it is still recording its outcome",
            utc_text(until),
            humantime::format_duration(wait)
        );
        loop {
            if let Some(interrupted) = self.sit_out_the_hold(&key).await {
                return Ok(interrupted);
            }
            match self.engine.claim(std::slice::from_ref(ask)).await?.pop() {
                Some(Taken::Not(Claim::Expired { .. })) => continue,
                Some(Taken::Won(won)) => {
                    self.sink.claimed(won.lease.key.as_str(), won.lease.attempt);
                    let report = self
                        .engine
                        .run(ask.clone(), won, self.stop_now.clone())
                        .await;
                    return Line::of(report, self.engine.now());
                }
                Some(not) => return Ok(self.not_run_line(ask, not)),
                None => return Ok(self.not_run_line(ask, Taken::RunningHere)),
            }
        }
    }

    /// Sleeps while this process leaves expired leases to their runners;
    /// the line of `key` when a shutdown cut the wait short.
    async fn sit_out_the_hold(&self, key: &PeriodKey) -> Option<Line> {
        let left = self.engine.store().holding(self.engine.lease());
        let mut shutdown = self.shutdown.clone();
        tokio::select! {
            () = tokio::time::sleep(left.unwrap_or_default().max(Duration::from_millis(50))) => None,
            _ = shutdown.wait_for(|down| *down) => Some(Line::new(
                key,
                PeriodOutcome::Interrupted,
                "while leaving an expired claim to its runner; not run".into(),
                None,
            )),
        }
    }

    /// Polls a claim held elsewhere until it ends; `None` when it became
    /// claimable (expired or released), so the caller claims again.
    async fn wait_elsewhere(&self, key: &PeriodKey) -> Result<Option<Line>, Error> {
        let mut shutdown = self.shutdown.clone();
        loop {
            tokio::select! {
                () = tokio::time::sleep(WAIT_POLL) => {}
                _ = shutdown.wait_for(|down| *down) => {
                    return Ok(Some(Line::new(key, PeriodOutcome::Interrupted, "while waiting for the run elsewhere; not run here".into(), None)));
                }
            }
            let rows = self.engine.store().rows(&[key.to_string()]).await?;
            let Some(row) = rows.get(key.as_str()) else {
                return Ok(None);
            };
            let attempt = Some(row.attempt);
            return Ok(match row.as_claim() {
                Claim::Held { .. } => continue,
                Claim::Succeeded { at } => Some(Line::new(
                    key,
                    PeriodOutcome::Succeeded,
                    format!(
                        "on {} at {} (attempt {})",
                        row.owner,
                        utc_text(at),
                        row.attempt
                    ),
                    attempt,
                )),
                Claim::Failed { .. } => Some(Line::new(
                    key,
                    PeriodOutcome::Failed,
                    format!("on {} (attempt {})", row.owner, row.attempt),
                    attempt,
                )),
                _ => None,
            });
        }
    }

    /// The line of an ask that was not won; a manual run that found no
    /// free concurrency slot is `busy`, and fails the command.
    fn not_run_line(&self, ask: &Ask, taken: Taken) -> Line {
        if ask.mode.manual && matches!(taken, Taken::Not(Claim::Busy)) {
            return Line::new(
                &ask.key(),
                PeriodOutcome::Busy,
                format!(
                    "not run: all {} concurrency slot(s) of `{}` are taken by running periods; --wait waits for one",
                    ask.job.concurrency, ask.job.name
                ),
                None,
            );
        }
        let held = matches!(taken, Taken::Not(Claim::Held { .. }));
        let waiting = matches!(taken, Taken::Waiting(_));
        let report = Report::not_run(ask, taken);
        if waiting && ask.mode.manual {
            // Noted as waiting, it is claimed once they have: said, so that
            // its later run is no surprise.
            let detail = format!(
                "{}; it runs once they have succeeded (serve's scan, or the next `run {}`)",
                report.detail(),
                ask.job.name
            );
            return Line::new(&report.key, report.outcome(), detail, None);
        }
        Line {
            held,
            ..Line::new(&report.key, report.outcome(), report.detail(), None)
        }
    }

    /// Shutdown ended the run before its last period: nothing more is
    /// claimed, and the periods left are not run.
    fn cut_short(&mut self) {
        self.outcome = Outcome::RunFailed;
        self.sink.cut_short();
    }

    /// Hands a line on and counts what it says; a sink that went away
    /// ends the run before the next claim.
    fn emit(&mut self, line: &Line) -> Result<(), Unread> {
        // An interrupted run exits 1 whatever it was doing: the period may
        // be nobody's now (a released one it was waiting for).
        if matches!(
            line.status,
            PeriodOutcome::Failed
                | PeriodOutcome::Released
                | PeriodOutcome::Busy
                | PeriodOutcome::Interrupted
        ) || (line.status == PeriodOutcome::Waiting && self.request.manual())
        {
            // A period asked for by hand that waits is not done; a due one
            // that waits runs once its upstream periods are.
            self.outcome = Outcome::RunFailed;
        }
        self.out_of_slots |= line.status == PeriodOutcome::Busy;
        self.fenced += usize::from(line.status == PeriodOutcome::Fenced);
        match self.changed.remove(&line.key) {
            Some(attempt) if line.attempt.is_some_and(|a| a > attempt) => {
                let mut line = line.clone();
                line.detail = format!(
                    "{}; the job's definition changed since attempt {attempt}",
                    line.detail
                );
                self.sink.line(&line)
            }
            _ => self.sink.line(line),
        }
    }
}

/// Why `run JOB` finds nothing of `job` to run now, and when its next
/// fire is: for a job first seen now whose latest fire is older than
/// `catch_up`, that fire and how to run it all the same.
fn nothing_due(job: &Job, seen: &crate::store::JobRecord, now: DateTime<Utc>) -> String {
    let timing = job.timing();
    let key_of =
        |fire: &crate::fires::Fire| PeriodKey::new(&job.name, &timing.period_of(fire).label);
    let next = match timing.next(now) {
        Some(fire) => format!("its next fire is {} ({})", utc_text(fire.at), key_of(&fire)),
        None => "it has no fire to come (past its last active date)".to_owned(),
    };
    let passed = timing.latest(now).filter(|fire| {
        seen.new && fire.at < job.owed_from(Some(seen.first_seen), seen.owed_from, now)
    });
    match passed {
        Some(fire) => {
            let key = key_of(&fire);
            format!(
                "nothing due now: first seen now, and its latest fire ({key}, at {}) is older than catch_up ({}), so it does not run on its own (`scheduler run {} --period {}` runs it by hand; `scheduler adopt` records it as run elsewhere); {next}",
                utc_text(fire.at),
                humantime::format_duration(job.catch_up),
                job.name,
                timing.period_of(&fire).label
            )
        }
        None => format!("nothing due now; {next}"),
    }
}

/// How `job` stands as `run JOB` sees it: recorded as seen (now, if this
/// is its first sighting), or, for `--dry-run`, which writes nothing, as it
/// would be: a job never seen would be seen now.
async fn sighting(
    store: &Store,
    job: &Job,
    dry_run: bool,
    now: DateTime<Utc>,
) -> Result<Option<crate::store::JobRecord>, Error> {
    let name = std::slice::from_ref(&job.name);
    if !dry_run {
        return Ok(store.see_jobs(name).await?.remove(&job.name));
    }
    let seen = store.first_seen(name).await?.remove(&job.name);
    let paused = store.paused_jobs().await?.contains(&job.name);
    Ok(Some(crate::store::JobRecord {
        first_seen: seen.map_or(now, |s| s.first_seen),
        owed_from: seen.and_then(|s| s.owed_from),
        paused,
        new: seen.is_none(),
    }))
}

/// How many retryable or recoverable periods of a job one `run` takes.
const RECLAIM_LIMIT: u32 = 1_000;

/// Works out which periods `request` asks for.
async fn plan<'a>(
    config: &'a Config,
    store: &Store,
    request: &Request,
    now: DateTime<Utc>,
    sink: &mut dyn Sink,
) -> Result<Vec<Plan<'a>>, Error> {
    let jobs: Vec<&Job> = match &request.job {
        Some(name) => vec![config.job(name)?],
        // Every job, each after the jobs it waits for: a period whose
        // upstream runs in the same `run --all` is not left waiting.
        None => in_dependency_order(&config.jobs),
    };
    let mut plans = Vec::with_capacity(jobs.len());
    for job in jobs {
        let manual = request.manual();
        let periods = if let Some(walk) = manual_range(job, request, now)? {
            if request.with_upstream {
                plans.extend(upstream_plans(config, job, walk.clone(), now)?);
            }
            Periods::Range(walk)
        } else {
            let seen = sighting(store, job, request.dry_run, now).await?;
            let Some(seen) = seen else {
                continue;
            };
            if seen.paused {
                sink.paused(&job.name);
                continue;
            }
            let window =
                now - chrono::Duration::from_std(config.settings.catch_up).unwrap_or_default();
            // What `serve` would take at this instant (docs/commands.md,
            // "One period, one meaning"): the fires the job owes, as its
            // first sighting fixed them, within the window; the latest one
            // too only if it is owed (a job first seen days after its
            // monthly fire does not run that month on its own). A dry run
            // records nothing.
            let owed = match request.dry_run {
                true => job.owed_from(Some(seen.first_seen), seen.owed_from, now),
                false => super::due::owed_from(store, job, &seen).await,
            };
            let since = window.max(owed);
            let mut listed = due(job, now, since, true);
            listed.retain(|d| d.fire >= since);
            // Failed periods whose retry is due, and claims whose lease ran
            // out or that were released, run again as `serve`'s scan would
            // take them, however old: a platform cron container may be all
            // there is, and `catch_up` bounds only periods never claimed.
            let again = store
                .reclaimable(std::slice::from_ref(&job.name), RECLAIM_LIMIT, true)
                .await?;
            // A period that waited for its upstream runs as `upstream`,
            // whether or not it is also among the due ones.
            let (reopened, _) = super::rerun::reopen_stale(store, &[job], window, now).await?;
            // Every period of the job noted waiting goes to the claim's
            // gate, which claims the ready ones: what it waits for may
            // have changed with jobs.toml since it was noted.
            let noted = store
                .waiting_periods(std::slice::from_ref(&job.name), RECLAIM_LIMIT)
                .await?;
            let again = again.into_iter().chain(noted).map(|r| Due {
                trigger: match r.trigger {
                    Trigger::Upstream => Trigger::Upstream,
                    _ => Trigger::Retry,
                },
                period: r.period,
                fire: r.scheduled_at,
            });
            // Succeeded periods an upstream rerun made stale, for a job
            // that reruns on it, as `serve`'s scan would take them.
            for due in again.chain(reopened.into_iter().map(|(_, due)| due)) {
                match listed
                    .iter_mut()
                    .find(|d| d.period.label == due.period.label)
                {
                    Some(listed) if due.trigger == Trigger::Upstream => {
                        listed.trigger = Trigger::Upstream;
                    }
                    Some(_) => {}
                    None => listed.push(due),
                }
            }
            listed.sort_by_key(|d| d.fire);
            // A first sighting says what it owes: with nothing to run,
            // through the line saying so.
            if listed.is_empty() {
                sink.nothing_due(&job.name, &nothing_due(job, &seen, now));
            } else if seen.new && !request.dry_run {
                super::due::log_first_sighting(job, owed);
            }
            Periods::Listed(listed.into_iter())
        };
        plans.push(Plan {
            job,
            periods,
            manual,
            force: request.force,
            upstream: false,
            downstream: false,
        });
    }
    // A run of an upstream job runs what it made ready downstream, in a
    // platform cron container as `serve`'s scan would within seconds, not
    // at the downstream job's next fire (a month later for a monthly
    // report). `run --all` runs every job already; a dry run makes
    // nothing ready.
    if let Some(name) = request.job.as_deref().filter(|_| !request.dry_run) {
        let name = config.full_name(name);
        plans.extend(downstream_of(config, &name).into_iter().map(|job| Plan {
            job,
            periods: Periods::Listed(Vec::new().into_iter()),
            manual: false,
            force: false,
            upstream: false,
            downstream: true,
        }));
    }
    Ok(plans)
}

/// The jobs that wait, directly or through others, for job `name`, each
/// after every job of its `after`.
fn downstream_of<'a>(config: &'a Config, name: &str) -> Vec<&'a Job> {
    let mut reached: std::collections::HashSet<&str> = std::collections::HashSet::new();
    reached.insert(name);
    let mut found = Vec::new();
    for job in in_dependency_order(&config.jobs) {
        if job
            .after
            .upstream
            .iter()
            .any(|up| reached.contains(up.job.as_str()))
        {
            reached.insert(&job.name);
            found.push(job);
        }
    }
    found
}

/// `jobs`, each after every job of its `after`, otherwise in their order.
fn in_dependency_order(jobs: &[Job]) -> Vec<&Job> {
    let mut ordered: Vec<&Job> = Vec::with_capacity(jobs.len());
    let mut done: std::collections::HashSet<&str> = std::collections::HashSet::new();
    let mut left: Vec<&Job> = jobs.iter().collect();
    while !left.is_empty() {
        let before = left.len();
        left.retain(|job| {
            let ready = job
                .after
                .upstream
                .iter()
                .all(|up| done.contains(up.job.as_str()));
            if ready {
                ordered.push(job);
                done.insert(&job.name);
            }
            !ready
        });
        // No cycle passes the load; were one here, the rest in order.
        if left.len() == before {
            ordered.append(&mut left);
        }
    }
    ordered
}

/// The plans that run first, for `--with-upstream`, the upstream periods
/// of the periods of `walk`: each upstream job's due periods that they
/// need, through the upstream jobs' own `after`, a job's after all of its
/// upstream jobs'. None is forced: a succeeded one is passed over.
fn upstream_plans<'a>(
    config: &'a Config,
    job: &Job,
    mut walk: RangeWalk,
    now: DateTime<Utc>,
) -> Result<Vec<Plan<'a>>, Error> {
    // Each job reached, with the labels wanted of it; in the order their
    // plans run (a job after every job it waits for).
    let mut wanted: Vec<(&'a Job, Vec<Period>)> = Vec::new();
    let mut asked: Vec<(String, String)> = Vec::new();
    while let Some(period) = walk.step(job) {
        asked.extend(super::after::upstream_of(job, &period));
    }
    // Depth first: a job's upstream periods are added before it.
    fn reach<'a>(
        config: &'a Config,
        asked: Vec<(String, String)>,
        wanted: &mut Vec<(&'a Job, Vec<Period>)>,
        now: DateTime<Utc>,
    ) -> Result<(), Error> {
        let mut by_job: Vec<(String, Vec<String>)> = Vec::new();
        for (name, label) in asked {
            match by_job.iter_mut().find(|(job, _)| *job == name) {
                Some((_, labels)) => labels.push(label),
                None => by_job.push((name, vec![label])),
            }
        }
        for (name, labels) in by_job {
            let up = config.job(&name)?;
            let periods: Vec<Period> = labels
                .iter()
                .filter_map(|label| up.period.parse_label(&up.schedule, label).ok())
                .filter(|p| up.timing().of(p).is_some_and(|f| f <= now))
                .collect();
            let further: Vec<(String, String)> = periods
                .iter()
                .flat_map(|p| super::after::upstream_of(up, p))
                .collect();
            reach(config, further, wanted, now)?;
            match wanted.iter_mut().find(|(job, _)| job.name == up.name) {
                Some((_, known)) => {
                    for p in periods {
                        if !known.iter().any(|k| k.label == p.label) {
                            known.push(p);
                        }
                    }
                }
                None => wanted.push((up, periods)),
            }
        }
        Ok(())
    }
    reach(config, asked, &mut wanted, now)?;
    Ok(wanted
        .into_iter()
        .map(|(up, mut periods)| {
            periods.sort_by_key(|p| p.start);
            let dues: Vec<Due> = periods
                .into_iter()
                .map(|p| manual_due(up, p, now))
                .collect();
            Plan {
                job: up,
                periods: Periods::Listed(dues.into_iter()),
                manual: true,
                force: false,
                upstream: true,
                downstream: false,
            }
        })
        .collect())
}

/// Checks `request` against every job it applies to, before the database
/// is opened: labels, their order, periods not started or not due, and
/// force or early without periods.
pub fn check(config: &Config, request: &Request, now: DateTime<Utc>) -> Result<(), Error> {
    let n = request.names;
    let named = format!("{} LABEL or {} LABEL {} LABEL", n.period, n.from, n.to);
    if request.early && !request.manual() {
        return Err(Error::Usage(format!(
            "{}: needs {named}; a scheduled run only takes periods that are due",
            n.early
        )));
    }
    if request.force && !request.manual() {
        return Err(Error::Usage(format!(
            "{}: needs {named}; it re-runs succeeded periods, so it names them",
            n.force
        )));
    }
    if request.only_failed && !request.manual() {
        return Err(Error::Usage(format!(
            "{}: needs {named}; a scheduled run retries failed periods on its own",
            n.only_failed
        )));
    }
    if request.only_failed && request.force {
        return Err(Error::Usage(format!(
            "{}: give {} or {}, not both: one runs every period again, the other only failed ones",
            n.only_failed, n.force, n.only_failed
        )));
    }
    if request.with_upstream && !request.manual() {
        return Err(Error::Usage(format!(
            "{}: needs {named}; a scheduled run claims what waited once its upstream periods are done",
            n.with_upstream
        )));
    }
    for job in &config.jobs {
        if request
            .job
            .as_ref()
            .is_none_or(|name| config.full_name(name) == job.name)
        {
            manual_range(job, request, now)?;
        }
    }
    Ok(())
}

/// The periods a manual run (`--period`, `--from/--to`) asks for, or `None`
/// for a scheduled one. The newest must have started and, unless `--early`,
/// be due.
fn manual_range(
    job: &Job,
    request: &Request,
    now: DateTime<Utc>,
) -> Result<Option<RangeWalk>, Error> {
    let n = request.names;
    match &request.periods {
        Selection::Due => Ok(None),
        Selection::Period(label) => {
            let period = parse_label(job, label, n.period)?;
            if is_empty(&period) {
                return Err(Error::Usage(format!(
                    "{}: period {} does not exist in {}: a spring-forward skips it",
                    n.period,
                    period.label,
                    job.schedule.zone().name()
                )));
            }
            refuse_future(&period, now, n.period)?;
            refuse_fireless(job, &period, n.period)?;
            if !request.early {
                refuse_not_due(job, &period, now, (n.period, n.early))?;
            }
            Ok(Some(RangeWalk {
                next: Some(period.clone()),
                last: period,
            }))
        }
        Selection::Range(from, to) => {
            let (first, last) = bounds(job, (from, to), n)?;
            refuse_future(&last, now, n.to)?;
            if !request.early {
                refuse_not_due(job, &last, now, (n.to, n.early))?;
            }
            Ok(Some(RangeWalk {
                next: Some(first),
                last,
            }))
        }
    }
}

/// The periods of `job` from label `from` to `to`, both included; more
/// than `limit` of them is a usage error.
pub fn periods_between(
    job: &Job,
    (from, to): (&str, &str),
    limit: usize,
    names: Names,
) -> Result<Vec<Period>, Error> {
    match page_between(job, (from, to), limit, names)? {
        (periods, None) => Ok(periods),
        (_, Some(_)) => Err(Error::Usage(format!(
            "{}: the range holds more than {limit} periods; ask for a shorter one",
            names.to
        ))),
    }
}

/// The first `limit` periods of the range `from..=to`, oldest first, and
/// the label of the period after them if the range goes on: one page.
pub fn page_between(
    job: &Job,
    (from, to): (&str, &str),
    limit: usize,
    names: Names,
) -> Result<(Vec<Period>, Option<String>), Error> {
    let (first, last) = bounds(job, (from, to), names)?;
    let mut walk = RangeWalk {
        next: Some(first),
        last,
    };
    let mut periods = Vec::new();
    while let Some(period) = walk.step(job) {
        if periods.len() == limit {
            return Ok((periods, Some(period.label)));
        }
        periods.push(period);
    }
    Ok((periods, None))
}

/// The last `count` periods of `job` that a fire covers, up to the one
/// labelled `to` or else up to the latest fire at `now`, oldest first, and
/// the label of the period before them, if there is one.
pub fn periods_up_to(
    job: &Job,
    to: Option<&str>,
    count: usize,
    names: Names,
    now: DateTime<Utc>,
) -> Result<(Vec<Period>, Option<String>), Error> {
    let last = match to {
        Some(label) => parse_label(job, label, names.to)?,
        None => match job.timing().latest(now) {
            Some(fire) => job.timing().period_of(&fire),
            None => return Ok((Vec::new(), None)),
        },
    };
    let mut periods = vec![last];
    let mut before = None;
    while let Some(oldest) = periods.last() {
        let Some(preceding) = job.period.preceding(&job.schedule, oldest) else {
            break;
        };
        if periods.len() == count {
            before = Some(preceding.label);
            break;
        }
        periods.push(preceding);
    }
    periods.reverse();
    Ok((periods, before))
}

/// A label a spring-forward skips: a period that starts where it ends.
fn is_empty(period: &Period) -> bool {
    period.start >= period.end
}

/// The first and last period of a range, in order.
fn bounds(job: &Job, (from, to): (&str, &str), names: Names) -> Result<(Period, Period), Error> {
    let mut first = parse_label(job, from, names.from)?;
    let last = parse_label(job, to, names.to)?;
    // A first label a spring-forward skips starts the range at the period
    // after it (an empty period's `following` starts at the same instant).
    if is_empty(&first) {
        let skipped = first.label.clone();
        first = job.period.following(&job.schedule, &first);
        if is_empty(&first) || (first.start >= last.start && is_empty(&last)) {
            return Err(Error::Usage(format!(
                "{}: the range holds no period: a spring-forward skips {skipped} in {}",
                names.from,
                job.schedule.zone().name()
            )));
        }
    }
    // A last label a spring-forward makes empty comes before a first one
    // that starts at its instant or later.
    let reversed = is_empty(&last) && first.label != last.label && first.start >= last.start;
    if last.start < first.start || reversed {
        return Err(Error::Usage(format!(
            "{}: {} comes before {} {}",
            names.to, last.label, names.from, first.label
        )));
    }
    Ok((first, last))
}

/// The period `label` names for `job`, refused (naming `flag` and why) if
/// it is no period of the job: not a label of its period rule, a period a
/// spring-forward skips, or one no fire covers (a day off its calendar
/// skips, a date outside its active dates).
pub fn period_of_label(job: &Job, label: &str, flag: &str) -> Result<Period, Error> {
    let period = parse_label(job, label, flag)?;
    refuse_fireless(job, &period, flag)?;
    Ok(period)
}

fn parse_label(job: &Job, label: &str, flag: &str) -> Result<Period, Error> {
    job.period.parse_label(&job.schedule, label).map_err(|e| {
        Error::Usage(format!(
            "{flag}: {e} (job `{}` has {} periods)",
            job.name, job.period.unit
        ))
    })
}

fn refuse_future(period: &Period, now: DateTime<Utc>, flag: &str) -> Result<(), Error> {
    if period.start > now {
        return Err(Error::Usage(format!(
            "{flag}: period {} starts at {}, after now; only a period that has started can be run",
            period.label,
            utc_text(period.start)
        )));
    }
    Ok(())
}

/// A period no fire covers (a day the schedule, its calendar or its
/// active dates leave out) is no period of the job: there is nothing to
/// run, and a run of it would be one no schedule ever asks for.
fn refuse_fireless(job: &Job, period: &Period, flag: &str) -> Result<(), Error> {
    if job.period.fire_for(&job.schedule, period).is_some() {
        return Ok(());
    }
    Err(Error::Usage(format!(
        "{flag}: no fire of job `{}` covers {}: it is not a period of the job ({} it out; see `scheduler next {}`)",
        job.name,
        period.label,
        match job.schedule.days() {
            Some(_) => "its schedule, calendar or active dates leave",
            None => "its schedule leaves",
        },
        job.name
    )))
}

/// A period whose fire is still ahead would, run now, turn its scheduled
/// run into a no-op (and cover a period that is not over).
fn refuse_not_due(
    job: &Job,
    period: &Period,
    now: DateTime<Utc>,
    (field, early): (&str, &str),
) -> Result<(), Error> {
    match job.timing().of(period) {
        Some(fire) if fire > now => Err(Error::Usage(format!(
            "{field}: {} is not due yet: its fire is at {}; run now, it would turn that scheduled run into a no-op; pass {early} to run it anyway",
            PeriodKey::new(&job.name, &period.label),
            utc_text(fire),
        ))),
        _ => Ok(()),
    }
}

fn manual_due(job: &Job, period: Period, now: DateTime<Utc>) -> Due {
    let fire = job
        .timing()
        .of(&period)
        .filter(|f| *f <= now)
        .unwrap_or(now);
    Due {
        period,
        fire,
        trigger: Trigger::Manual,
    }
}

/// Why a period is passed over without a claim, from its row, if it is.
fn skip_line(key: &str, row: &ClaimRow, request: &Request) -> Option<Line> {
    let manual = request.manual();
    let detail = match row.as_claim() {
        Claim::Succeeded { at } if !request.force && row.attempt == ADOPTED_ATTEMPT => {
            format!("adopted at {} (an earlier system ran it)", utc_text(at))
        }
        Claim::Succeeded { at } if !request.force => {
            format!("already succeeded at {}", utc_text(at))
        }
        // A released period asked for by hand is claimed once its runner
        // has stopped (`wait_for_released`).
        Claim::Held { owner, until }
            if !(request.wait || manual && row.state == ClaimState::Released) =>
        {
            return Some(Line {
                attempt: Some(row.attempt),
                held: true,
                ..Line::bare(key, format!("running on {owner} until {}", utc_text(until)))
            });
        }
        // A failed period is not done: `run JOB` says so and exits 1, so a
        // platform cron container's failed period is never a green job.
        Claim::Failed {
            retry_at: Some(at), ..
        } if !manual => {
            return Some(failed_line(
                key,
                row,
                format!("retry at {} (not due yet)", utc_text(at)),
            ));
        }
        Claim::Failed {
            retry_at: None,
            failures,
        } if !manual => {
            let detail =
                format!("{failures} time(s), no retries left; `run --period` runs it again");
            return Some(failed_line(key, row, detail));
        }
        _ => return None,
    };
    Some(Line {
        status: PeriodOutcome::Skipped,
        attempt: Some(row.attempt),
        ..Line::bare(key, detail)
    })
}

/// Where a period stands by its claim row alone, in a word.
fn state_word(row: Option<&ClaimRow>) -> &'static str {
    row.map_or("never claimed", |row| row.standing().as_str())
}

/// The line of a period found failed and not run.
fn failed_line(key: &str, row: &ClaimRow, detail: String) -> Line {
    Line {
        status: PeriodOutcome::Failed,
        attempt: Some(row.attempt),
        ..Line::bare(key, detail)
    }
}

fn dry_run_line(key: &str, row: Option<&ClaimRow>, request: &Request) -> Line {
    let (status, detail) = match row {
        None => (PeriodOutcome::WouldClaim, "new period".to_owned()),
        Some(row) => match skip_line(key, row, request) {
            Some(skip) => (skip.status, skip.detail),
            None => (
                PeriodOutcome::WouldClaim,
                match row.as_claim() {
                    Claim::Succeeded { .. } => {
                        "already succeeded; --force runs it again".to_owned()
                    }
                    Claim::Failed { .. } => format!("retry of attempt {}", row.attempt),
                    Claim::Held { owner, .. } => format!("after waiting for {owner}"),
                    _ if row.state == ClaimState::Running => {
                        format!("recovery: the lease of {} expired", row.owner)
                    }
                    _ if row.state == ClaimState::Released => "recovery: released".to_owned(),
                    _ => format!("retry of attempt {}", row.attempt),
                },
            ),
        },
    };
    Line {
        status,
        attempt: row.map(|r| r.attempt),
        ..Line::bare(key, detail)
    }
}

impl Line {
    fn new(key: &PeriodKey, status: PeriodOutcome, detail: String, attempt: Option<i32>) -> Line {
        Line {
            status,
            attempt,
            ..Line::bare(key.as_str(), detail)
        }
    }

    fn bare(key: &str, detail: String) -> Line {
        Line {
            key: key.to_owned(),
            status: PeriodOutcome::Skipped,
            detail,
            attempt: None,
            trigger: None,
            asked: None,
            exit_code: None,
            http_status: None,
            error: None,
            retry_at: None,
            duration_ms: None,
            held: false,
        }
    }

    /// The line of a run; an outcome that could not be written ends the
    /// command with the database's error.
    fn of(report: Report, now: DateTime<Utc>) -> Result<Line, Error> {
        let report = match report {
            Report {
                status: Status::Unrecorded(e),
                ..
            } => return Err(e),
            report => report,
        };
        let (error, retry_at) = match &report.status {
            Status::Failed { error, retry_after } => (
                Some(error.clone()),
                retry_after
                    .and_then(|after| chrono::Duration::from_std(after).ok())
                    .map(|after| utc_text(now + after)),
            ),
            _ => (None, None),
        };
        Ok(Line {
            trigger: Some(report.trigger),
            exit_code: report.exit_code,
            http_status: report.http_status,
            error,
            retry_at,
            duration_ms: Some(u64::try_from(report.took.as_millis()).unwrap_or(u64::MAX)),
            ..Line::new(
                &report.key,
                report.outcome(),
                report.detail(),
                report.attempt,
            )
        })
    }
}
