//! The drive: a manual run's plans gone through, oldest period first, a
//! batch of periods claimed and run side by side, each one's line handed to
//! the sink in period order.

use std::collections::HashMap;
use std::ops::ControlFlow;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;

use super::Sink;
use super::line::{Line, passed_over};
use super::plan::{Periods, Plan, RECLAIM_LIMIT, plan};
use super::request::Request;
use crate::config::{Config, Job};
use crate::engine::after::Upstream;
use crate::engine::due::Due;
use crate::engine::{
    Ask, Claimed, Engine, Mode, Queue, Report, SQL_GROUP, Taken, Won, after_grace,
};
use crate::error::{Error, Outcome, Unread};
use crate::period::{Period, PeriodKey, utc_text};
use crate::state::PeriodOutcome;
use crate::store::{Claim, ClaimRow, ClaimState, Trigger};

/// How often `--wait` looks at a claim held elsewhere.
const WAIT_POLL: Duration = Duration::from_millis(500);

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

/// Whether a run goes on (`Continue`), or ends: cut short by shutdown
/// (`Break(Ok)`), or its sink gone (`Break(Err)`).
type Flow = ControlFlow<Result<(), Unread>>;

/// How the periods of one plan are asked for.
struct Asking {
    job: Arc<Job>,
    /// The run's request, as it applies to the plan.
    request: Request,
    mode: Mode,
    /// How many periods are claimed and run side by side.
    batch: usize,
    /// Asked for by hand: who asked is noted on each attempt.
    manual: bool,
    /// Upstream periods run first (`--with-upstream`): those already
    /// succeeded are passed over without a line.
    upstream: bool,
}

/// The asks of a batch that were not won, by what comes of them.
#[derive(Default)]
struct NotWon {
    /// Each with its line; `None` for one to wait for (`--wait`, or
    /// released by hand: `wait_for_released`).
    lines: Vec<(Ask, Option<Line>)>,
    /// Periods that found no slot while this batch took one: the slot
    /// may be a batch mate's, freed when the batch ends.
    again: Vec<Ask>,
    /// Periods whose lease ran out, left to their runners a while: who
    /// held each, and when its lease ran out.
    expired: Vec<(Ask, String, DateTime<Utc>)>,
}

impl Backfill<'_> {
    /// Goes through `plans` in order; a job that waits for the jobs run
    /// before it finds its periods when its turn comes.
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
            if let ControlFlow::Break(end) = self.plan(plan, now).await? {
                return Ok(end);
            }
        }
        Ok(Ok(()))
    }

    /// Goes through one plan's periods, a chunk at a time.
    async fn plan(&mut self, plan: &mut Plan<'_>, now: DateTime<Utc>) -> Result<Flow, Error> {
        let asking = Asking {
            job: Arc::new(plan.job.clone()),
            request: Request {
                force: plan.force,
                only_failed: self.request.only_failed && !plan.upstream && !plan.downstream,
                shard: self
                    .request
                    .shard
                    .filter(|_| !plan.upstream && !plan.downstream),
                ..self.request.clone()
            },
            mode: Mode {
                manual: plan.manual,
                force: plan.force,
                early: self.request.early,
            },
            batch: self.batch(plan.job),
            manual: plan.manual,
            upstream: plan.upstream,
        };
        loop {
            let chunk = plan.periods.chunk(plan.job, now);
            if chunk.is_empty() {
                return Ok(ControlFlow::Continue(()));
            }
            let (chunk, absent) = self.split(plan, chunk, asking.request.shard).await?;
            for line in &absent {
                if let Err(stop) = self.emit(line) {
                    return Ok(ControlFlow::Break(Err(stop)));
                }
            }
            if chunk.is_empty() {
                continue;
            }
            let flow = self.chunk(&asking, chunk, now).await?;
            if flow.is_break() {
                return Ok(flow);
            }
        }
    }

    /// `chunk` of `plan`, each period split into shards as it was last
    /// claimed (never two ways, whatever `shards` says now), only shard
    /// `shard` if one is asked for.
    async fn split(
        &self,
        plan: &Plan<'_>,
        chunk: Vec<Due>,
        shard: Option<u32>,
    ) -> Result<(Vec<Due>, Vec<Line>), Error> {
        let chunk = super::plan::as_claimed(self.engine.store(), plan.job, chunk).await?;
        let Some(k) = shard else {
            return Ok((chunk, Vec::new()));
        };
        // A period split fewer ways than K (before `shards` grew) says so,
        // rather than nothing.
        let mut absent = Vec::new();
        for due in chunk.iter().filter(|due| due.first_of_period()) {
            let n = due.shard.map_or(1, |s| s.of);
            if k >= n {
                let key = PeriodKey::new(&plan.job.name, &due.period.label);
                let detail = format!(
                    "no shard {k}: the period was split {n} way(s) when first claimed (shards 0 to {})",
                    n - 1
                );
                absent.push(Line::bare(key.as_str(), detail));
            }
        }
        let kept = chunk
            .into_iter()
            .filter(|due| due.shard.is_some_and(|s| s.index == k))
            .collect();
        Ok((kept, absent))
    }

    /// How many periods of `job` are claimed and run side by side.
    fn batch(&self, job: &Job) -> usize {
        // A batch runs its periods side by side: at most as many as
        // the job may run at once, and (but for an `sql` group, one
        // slot) as this process may.
        let mut batch = (job.policy.concurrency as usize).clamp(1, SQL_GROUP);
        if !matches!(job.action, crate::config::Action::Sql { .. }) {
            batch = batch.min(self.max_running.max(1));
        }
        batch
    }

    /// Looks up one chunk of a plan's periods and claims and runs them, a
    /// batch at a time; a period passed over gets its line in its place.
    async fn chunk(
        &mut self,
        asking: &Asking,
        chunk: Vec<Due>,
        now: DateTime<Utc>,
    ) -> Result<Flow, Error> {
        let job = &asking.job;
        let keys: Vec<PeriodKey> = chunk.iter().map(|d| d.key(&job.name)).collect();
        let rows = self.look_up(job, &keys).await?;
        let mut waits = self.gate(asking, &chunk, now).await?.into_iter();
        let mut asks = Vec::new();
        for (due, key) in chunk.into_iter().zip(keys) {
            let upstream = waits.next().filter(|up| up.waiting());
            if *self.shutdown.borrow() {
                self.cut_short();
                return Ok(ControlFlow::Break(Ok(())));
            }
            let row = rows.get(key.as_str());
            let done = row.is_some_and(|r| matches!(r.as_claim(), Claim::Succeeded { .. }));
            if asking.upstream && done {
                continue;
            }
            match passed_over(&asking.request, &key, row, upstream) {
                Some(line) => {
                    if let Err(stop) = self.go(std::mem::take(&mut asks)).await? {
                        return Ok(ControlFlow::Break(Err(stop)));
                    }
                    if let Err(stop) = self.emit(&line) {
                        return Ok(ControlFlow::Break(Err(stop)));
                    }
                }
                None => {
                    asks.push(Ask {
                        job: job.clone(),
                        due,
                        mode: asking.mode,
                        by: asking.manual.then(|| self.request.by.clone()),
                        timed: false,
                    });
                    if asks.len() >= asking.batch
                        && let Err(stop) = self.go(std::mem::take(&mut asks)).await?
                    {
                        return Ok(ControlFlow::Break(Err(stop)));
                    }
                }
            }
        }
        if let Err(stop) = self.go(asks).await? {
            return Ok(ControlFlow::Break(Err(stop)));
        }
        Ok(ControlFlow::Continue(()))
    }

    /// Where the upstream periods of each period of `chunk` stand, for a
    /// dry run of a job with `after`; nothing otherwise.
    async fn gate(
        &self,
        asking: &Asking,
        chunk: &[Due],
        now: DateTime<Utc>,
    ) -> Result<Vec<Upstream>, Error> {
        // A dry run says what the claim's gate would: a period whose
        // upstream is not done waits.
        if !(asking.request.dry_run && asking.job.after.any()) {
            return Ok(Vec::new());
        }
        let asked: Vec<(&Job, &Period)> = chunk.iter().map(|d| (&*asking.job, &d.period)).collect();
        crate::engine::after::look(self.engine.store(), &asked, now).await
    }

    /// The periods of `job` noted waiting whose upstream periods have all
    /// succeeded now (the runs before made them ready), oldest first;
    /// `None` if there are none, if the job is paused, or if this run
    /// cannot run the job (its `${VAR}`s were not given: it names them and
    /// the command to run).
    async fn made_ready(&self, job: &Job, now: DateTime<Utc>) -> Result<Option<Vec<Due>>, Error> {
        let store = self.engine.store();
        // A paused job runs only by hand.
        if store.paused_jobs().await?.iter().any(|p| *p == *job.name) {
            return Ok(None);
        }
        let noted = store
            .waiting_periods(&[job.name.to_string()], RECLAIM_LIMIT)
            .await?;
        let asked: Vec<(&Job, &Period)> = noted.iter().map(|w| (job, &w.period)).collect();
        let standing = crate::engine::after::look(store, &asked, now).await?;
        let ready: Vec<Due> = noted
            .iter()
            .zip(standing)
            .filter(|(_, up)| !up.waiting())
            .flat_map(|(w, _)| Due::of(job, w.period.clone(), w.scheduled_at, Trigger::Upstream))
            .collect();
        if ready.is_empty() {
            return Ok(None);
        }
        if let Some((_, var)) = self
            .config
            .incomplete
            .iter()
            .find(|(name, _)| *name == *job.name)
        {
            tracing::warn!(
                job = &*job.name,
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
        let place: HashMap<PeriodKey, usize> = asks
            .iter()
            .enumerate()
            .map(|(i, ask)| (ask.key(), i))
            .collect();
        let claimed = self.engine.take_as_split(vec![asks], Queue::Wait).await?;
        let Claimed { won, not_won } = claimed.into_iter().next().unwrap_or_default();
        for (_, w) in &won {
            self.sink.claimed(w.lease.key.as_str(), w.lease.attempt);
        }
        let mut left = self.not_won(not_won, !won.is_empty());
        self.wait_for_released(&mut left.lines).await?;
        let mut ended = self.run_won(won, &place).await?;
        self.after_the_batch(left, &place, &mut ended).await?;
        ended.sort_by_key(|(at, _)| *at);
        for (_, line) in ended {
            if let Err(stop) = self.emit(&line) {
                return Ok(Err(stop));
            }
        }
        Ok(Ok(()))
    }

    /// Sorts the asks of a batch that were not won by what comes of them
    /// (`any_won`: the batch won some).
    fn not_won(&self, not_won: Vec<(Ask, Taken)>, any_won: bool) -> NotWon {
        let mut left = NotWon::default();
        for (ask, taken) in not_won {
            match taken {
                // A lease that ran out while this process holds recoveries
                // (it has just started, or saw the database fail) is left
                // to its runner for that long, then claimed again.
                Taken::Not(Claim::Expired { owner, until }) => {
                    left.expired.push((ask, owner, until));
                }
                Taken::Not(Claim::Held { .. } | Claim::Busy) | Taken::RunningHere
                    if self.request.wait =>
                {
                    left.lines.push((ask, None));
                }
                Taken::Not(Claim::Busy) if any_won => left.again.push(ask),
                not => {
                    let line = self.not_run_line(&ask, not);
                    left.lines.push((ask, Some(line)));
                }
            }
        }
        left
    }

    /// Runs what a batch won side by side: each one's line, with its place.
    async fn run_won(
        &mut self,
        won: Vec<(Ask, Won)>,
        place: &HashMap<PeriodKey, usize>,
    ) -> Result<Vec<(usize, Line)>, Error> {
        // How each was asked for, said on its line as `history` says it.
        let modes: HashMap<String, Mode> = won
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
        Ok(ended)
    }

    /// The lines of the asks a batch did not win, once its own runs ended,
    /// each with its place, added to `ended`.
    async fn after_the_batch(
        &mut self,
        left: NotWon,
        place: &HashMap<PeriodKey, usize>,
        ended: &mut Vec<(usize, Line)>,
    ) -> Result<(), Error> {
        let at = |ask: &Ask| place.get(&ask.key()).copied().unwrap_or(usize::MAX);
        for ask in left.again {
            if *self.shutdown.borrow() {
                self.cut_short();
                break;
            }
            let at = at(&ask);
            if let Some(line) = self.again(ask).await? {
                ended.push((at, line));
            }
        }
        for (ask, owner, until) in left.expired {
            let line = self.after_the_hold(&ask, &owner, until).await?;
            ended.push((at(&ask), line));
        }
        // A period run elsewhere is waited for after the batch's own runs
        // ended (it may be waiting for one of them to free a slot).
        for (ask, line) in left.lines {
            let line = match line {
                Some(line) => line,
                None => self.wait_and_run(&ask).await?,
            };
            ended.push((at(&ask), line));
        }
        Ok(())
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
                    .is_some_and(|l| l.status == PeriodOutcome::Held)
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
                    .is_some_and(|l| l.status == PeriodOutcome::Held)
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
                // Running in this process (its loop, or another call of
                // the library's): waited for as a run elsewhere is.
                Some(Taken::RunningHere) | None => match self.wait_elsewhere(&key).await? {
                    Some(done) => return Ok(done),
                    None => continue,
                },
                Some(not) => return Ok(self.not_run_line(ask, not)),
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
                    "not run: all {} concurrency slot(s) of `{}` are taken by running periods; {}",
                    ask.job.policy.concurrency, ask.job.name, self.request.names.busy
                ),
                None,
            );
        }
        let waiting = matches!(taken, Taken::Waiting(_));
        let report = Report::not_run(ask, taken);
        if waiting && ask.mode.manual {
            // Noted as waiting, it is claimed once they have: said, so that
            // its later run is no surprise.
            let detail = format!(
                "{}; it runs once they have succeeded ({})",
                report.detail(),
                self.request.names.later
            );
            return Line::new(&report.key, report.outcome(), detail, None);
        }
        Line {
            held: report.outcome() == PeriodOutcome::Held,
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
