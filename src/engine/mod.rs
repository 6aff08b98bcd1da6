//! The engine: the one claim → run → record path that every front end
//! (`serve`, `run`, and later the HTTP API and the library) drives. A front
//! end asks for periods in domain terms ([`Ask`]); the engine claims them in
//! batches, runs each won one with heartbeats and self-fencing (`sql`
//! actions in groups of one transaction), records the outcome under the
//! claim's attempt, and reports how each ended as a value ([`Report`]).

mod action;
pub mod after;
pub mod due;
mod execute;
mod group;
pub mod heartbeat;
#[cfg(feature = "http-actions")]
mod http;
pub mod labels;
pub mod manual;
pub mod notify;
pub mod operate;
mod outcomes;
#[cfg(feature = "process-actions")]
pub mod output;
pub mod overview;
pub mod owed;
mod plain;
#[cfg(feature = "process-actions")]
mod process;
mod report;
pub mod rerun;
pub mod shards;
#[cfg(feature = "process-actions")]
pub mod supervision;
pub mod view;

pub use action::{Run, Stop};
pub use report::{Report, Status};

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use tokio::sync::watch;
use tokio::time::Instant;

use crate::clock::{Clock, SystemClock};
use crate::config::Job;
use crate::error::Error;
use crate::period::PeriodKey;
use crate::store::{Asked, Claim, ClaimRequest, Lease, Store, Trigger};
use due::Due;
use heartbeat::{Heartbeats, Watch};

/// How much output is kept with an attempt.
pub const OUTPUT_TAIL: usize = 4096;

/// How many keys one claiming statement takes at most: a burst is claimed
/// in statements of this size, each a short transaction of its own.
pub const CLAIM_BATCH: usize = 200;

/// How many claiming statements of one burst run at once.
const CLAIMS_AT_ONCE: usize = 4;

/// How many `sql` periods one group runs in one transaction at most.
pub const SQL_GROUP: usize = 100;

/// A period to claim and run, as every front end asks for it.
#[derive(Debug, Clone)]
pub struct Ask {
    /// The job.
    pub job: Arc<Job>,
    /// The period, the fire it stands for and why it runs.
    pub due: Due,
    /// Manual or scheduled, forced or not.
    pub mode: Mode,
    /// Who asked for a manual run: an API token's name, or `cli:` and the
    /// user.
    pub by: Option<Arc<str>>,
    /// Asked for by `serve`'s timer at its fire: how late its claim starts
    /// is measured (`run JOB` takes a fire that may be days old).
    pub timed: bool,
}

/// How a period is asked for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Mode {
    /// A manual run (`--period`, a range, the API): a failed period is
    /// taken whatever its backoff and retry budget.
    pub manual: bool,
    /// A succeeded period is taken too.
    pub force: bool,
    /// Asked for before its fire.
    pub early: bool,
}

impl Mode {
    /// How a manual attempt was asked for, as `history` shows it.
    pub fn words(self) -> &'static str {
        match (self.force, self.early) {
            (false, false) => "manual",
            (true, false) => "manual force",
            (false, true) => "manual early",
            (true, true) => "manual force early",
        }
    }
}

impl Ask {
    /// A scheduled ask of `due`.
    pub fn scheduled(job: Arc<Job>, due: Due) -> Ask {
        Ask {
            job,
            due,
            mode: Mode::default(),
            by: None,
            timed: false,
        }
    }

    /// A scheduled ask of `due` by `serve`'s timer.
    pub fn timed(job: Arc<Job>, due: Due) -> Ask {
        Ask {
            timed: true,
            ..Ask::scheduled(job, due)
        }
    }

    /// The key it claims: its period's, or its shard's.
    pub fn key(&self) -> PeriodKey {
        self.due.key(&self.job.name)
    }

    /// Whether it runs in an `sql` group: an `sql` statement, or a code
    /// job's transaction-scoped handler.
    pub fn is_sql(&self) -> bool {
        self.job.is_sql()
    }

    fn request<'a>(&'a self, owner: &'a str, lease: Duration) -> ClaimRequest<'a> {
        ClaimRequest {
            job: &self.job.name,
            period: &self.due.period,
            shard: self.due.shard,
            owner,
            lease,
            trigger: self.due.trigger,
            concurrency: self.job.policy.concurrency,
            force: self.mode.force,
            // A period that waited for its upstream periods is claimed as
            // the schedule claims (another replica may have run it and
            // failed it for good); one an upstream rerun reopened keeps its
            // trigger `upstream` by the claim's own rule.
            manual: self.mode.manual,
            scheduled_at: self.due.fire,
            asked: self.by.as_deref().map(|by| Asked {
                how: self.mode.words(),
                by,
            }),
        }
    }
}

/// How a claim meets a period that another claim of its job is deciding
/// at the same moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Queue {
    /// Waits for it (within the database's lock timeout).
    Wait,
    /// Comes back [`Claim::Contended`], for the caller to ask again: a
    /// scheduled burst that replicas claim at the same moment (see
    /// [`Store::claim_many_unqueued`]).
    Contend,
}

/// One unit's answers from [`Engine::take`].
#[derive(Default)]
pub struct Claimed {
    /// Won here, to run.
    pub won: Vec<(Ask, Won)>,
    /// Not won, and why.
    pub not_won: Vec<(Ask, Taken)>,
}

/// The answer to one [`Ask`] of [`Engine::claim`].
pub enum Taken {
    /// This process won the claim and runs the period.
    Won(Won),
    /// Not won; why, as the store said.
    Not(Claim),
    /// This process is running the period already.
    RunningHere,
    /// Not claimed: upstream periods it needs (its job's `after`) have not
    /// succeeded.
    Waiting(after::Upstream),
}

/// A claim this process won. Its lease is renewed, and its fence counted
/// from the claiming statement, from the claim on; it marks the period as
/// running here until dropped.
pub struct Won {
    /// The won claim.
    pub lease: Lease,
    sent: Sent,
    watch: Watch,
    /// Its trace: its spans, and the context handed to its work.
    trace: crate::trace::AttemptTrace,
    _here: RunningHere,
    _counted: Counted,
}

/// When the statement that won a claim was sent, and how long it took.
#[derive(Debug, Clone, Copy)]
struct Sent {
    at: Instant,
    wall: chrono::DateTime<chrono::Utc>,
    took: Duration,
}

/// A run counted in the `scheduler_running` gauge of its job while it lives.
struct Counted(String);

impl Counted {
    fn new(job: &str) -> Counted {
        metrics::gauge!("scheduler_running", "job" => job.to_owned()).increment(1.0);
        Counted(job.to_owned())
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        metrics::gauge!("scheduler_running", "job" => std::mem::take(&mut self.0)).decrement(1.0);
    }
}

struct RunningHere {
    key: PeriodKey,
    set: Arc<Mutex<HashSet<PeriodKey>>>,
}

impl Drop for RunningHere {
    fn drop(&mut self) {
        if let Ok(mut set) = self.set.lock() {
            set.remove(&self.key);
        }
    }
}

/// What every run of a process shares.
#[derive(Clone)]
pub struct Engine {
    store: Store,
    heartbeats: Heartbeats,
    #[cfg(feature = "http-actions")]
    http: reqwest::Client,
    owner: Arc<str>,
    /// Period keys this process is running: it never claims one of them
    /// again (a released or expired claim of its own is taken over only
    /// once its job has stopped).
    running_here: Arc<Mutex<HashSet<PeriodKey>>>,
    /// How each job's supervisor is started.
    #[cfg(feature = "process-actions")]
    supervisor: Arc<supervision::Launcher>,
    /// Which `sql` jobs share a transaction with other jobs.
    quick: Arc<group::Quick>,
    /// Writes the outcomes of runs that end together in one statement.
    outcomes: Arc<outcomes::Outcomes>,
    /// Pauses and resumes said through this engine, for its loops.
    pauses: tokio::sync::broadcast::Sender<(String, bool)>,
    /// What time it is for every decision of this engine, its loop and
    /// its API made on this host's clock (the system's, or a test's);
    /// what the database decides stays on the database's clock.
    clock: Arc<dyn Clock>,
    /// Traces each attempt (or nothing).
    tracer: crate::trace::Tracer,
}

impl Engine {
    /// An engine on `store` claiming as `owner`, with leases of `lease`.
    pub fn new(store: Store, lease: Duration, owner: String) -> Result<Engine, Error> {
        #[cfg(feature = "http-actions")]
        let http = reqwest::Client::builder()
            .user_agent(concat!("scheduler/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Environment(e.into()))?;
        Ok(Engine {
            heartbeats: Heartbeats::start(store.clone(), lease),
            outcomes: Arc::new(outcomes::Outcomes::start(store.clone())),
            store,
            #[cfg(feature = "http-actions")]
            http,
            owner: owner.into(),
            running_here: Arc::default(),
            #[cfg(feature = "process-actions")]
            supervisor: Arc::new(supervision::Launcher::find()),
            quick: Arc::default(),
            pauses: tokio::sync::broadcast::Sender::new(64),
            clock: Arc::new(SystemClock),
            tracer: crate::trace::Tracer::off(),
        })
    }

    /// The engine tracing each attempt with `tracer`.
    pub fn with_tracer(mut self, tracer: crate::trace::Tracer) -> Engine {
        self.tracer = tracer;
        self
    }

    /// What traces this engine's attempts.
    pub fn tracer(&self) -> &crate::trace::Tracer {
        &self.tracer
    }

    /// The engine reading the time from `clock` (a test's) for every
    /// decision made on this host's clock.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Engine {
        self.clock = clock;
        self
    }

    /// Now, by the engine's clock.
    pub fn now(&self) -> DateTime<Utc> {
        self.clock.now()
    }

    /// The engine's clock, for the loops that run beside it.
    pub fn clock(&self) -> Arc<dyn Clock> {
        self.clock.clone()
    }

    /// Starts `command` and `shell` jobs through `launcher`.
    #[cfg(feature = "process-actions")]
    pub fn supervised_by(mut self, launcher: supervision::Launcher) -> Engine {
        self.supervisor = Arc::new(launcher);
        self
    }

    /// The database.
    pub fn store(&self) -> &Store {
        &self.store
    }

    /// Who claims.
    pub fn owner(&self) -> &str {
        &self.owner
    }

    /// The lease claims are granted now.
    pub fn lease(&self) -> Duration {
        self.heartbeats.lease()
    }

    /// The lease claims are granted from now on (a reload), and so the
    /// heartbeat interval and the fence.
    pub fn set_lease(&self, lease: Duration) {
        self.heartbeats.set_lease(lease);
    }

    /// Claims every ask, [`CLAIM_BATCH`] keys per statement; the answers
    /// come in the order of `asks`. A period this process is running
    /// already is not claimed again. An error leaves every ask unclaimed
    /// (what the chunks before it won is released for the next try).
    pub async fn claim(&self, asks: &[Ask]) -> Result<Vec<Taken>, Error> {
        self.claim_with(asks, Queue::Wait).await
    }

    /// Claims the asks of every unit together and sorts each unit's
    /// answers into what was won (for [`Engine::run_won`]) and what was
    /// not. A unit is one period, or `sql` periods that run as one group.
    /// A period of a job split into shards is asked for as it was split
    /// when first claimed ([`shards::resplit`]).
    pub async fn take(&self, units: Vec<Vec<Ask>>, queue: Queue) -> Result<Vec<Claimed>, Error> {
        let units = shards::resplit(&self.store, units).await?;
        self.take_as_split(units, queue).await
    }

    /// [`Engine::take`] of asks already split as their periods were
    /// claimed (a manual run's, which reads that per chunk).
    pub async fn take_as_split(
        &self,
        units: Vec<Vec<Ask>>,
        queue: Queue,
    ) -> Result<Vec<Claimed>, Error> {
        let sizes: Vec<usize> = units.iter().map(Vec::len).collect();
        let asks: Vec<Ask> = units.into_iter().flatten().collect();
        let taken = self.claim_with(&asks, queue).await?;
        let mut answers = asks.into_iter().zip(taken);
        Ok(sizes
            .into_iter()
            .map(|size| {
                let mut claimed = Claimed::default();
                for (ask, taken) in answers.by_ref().take(size) {
                    match taken {
                        Taken::Won(won) => claimed.won.push((ask, won)),
                        not => claimed.not_won.push((ask, not)),
                    }
                }
                claimed
            })
            .collect())
    }

    /// Claims the asks whose upstream periods are all done; the others are
    /// answered [`Taken::Waiting`] and noted as waiting, for a scan or a
    /// later `run` to claim once they are.
    async fn claim_with(&self, asks: &[Ask], queue: Queue) -> Result<Vec<Taken>, Error> {
        let mut gate = self.gate(asks).await?;
        if gate.iter().all(Option::is_none) {
            let claimed = self.claim_ready(asks, queue).await?;
            self.unwait(asks, &claimed);
            return Ok(claimed);
        }
        let ready: Vec<Ask> = asks
            .iter()
            .zip(&gate)
            .filter(|(_, waits)| waits.is_none())
            .map(|(ask, _)| ask.clone())
            .collect();
        let claimed = self.claim_ready(&ready, queue).await?;
        self.unwait(&ready, &claimed);
        let mut claimed = claimed.into_iter();
        Ok(gate
            .iter_mut()
            .map(|waits| match waits.take() {
                Some(upstream) => Taken::Waiting(upstream),
                None => claimed.next().unwrap_or(Taken::RunningHere),
            })
            .collect())
    }

    /// For each ask, what it waits for, if it does: a period of a job with
    /// `after`, due to be claimed (never claimed, or claimable again; a
    /// succeeded or running one is answered by its claim), with an
    /// upstream period not succeeded. Those that wait are noted so.
    async fn gate(&self, asks: &[Ask]) -> Result<Vec<Option<after::Upstream>>, Error> {
        let mut gate: Vec<Option<after::Upstream>> = vec![None; asks.len()];
        let gated: Vec<usize> = (0..asks.len())
            .filter(|i| asks[*i].job.after.any())
            .collect();
        if gated.is_empty() {
            return Ok(gate);
        }
        let own: Vec<String> = gated.iter().map(|i| asks[*i].key().to_string()).collect();
        let mut rows = std::collections::HashMap::new();
        for chunk in own.chunks(after::KEYS_PER_READ) {
            rows.extend(self.store.rows(chunk).await?);
        }
        let open: Vec<usize> = gated
            .into_iter()
            .zip(own)
            .filter(
                |(i, key)| match rows.get(key).map(crate::store::ClaimRow::as_claim) {
                    None => true,
                    Some(Claim::Succeeded { .. }) => asks[*i].mode.force,
                    Some(Claim::Held { .. }) => false,
                    Some(_) => true,
                },
            )
            .map(|(i, _)| i)
            .collect();
        let asked: Vec<(&Job, &crate::period::Period)> = open
            .iter()
            .map(|i| (&*asks[*i].job, &asks[*i].due.period))
            .collect();
        let looked = after::look(&self.store, &asked, self.now()).await?;
        let mut waiting = Vec::new();
        // A period is noted once, however many of its shards wait.
        let mut noted = HashSet::new();
        for (i, upstream) in open.into_iter().zip(looked) {
            if let Some(watch) = upstream.watch() {
                let ask = &asks[i];
                gate[i] = Some(upstream);
                if !noted.insert(ask.key().period_key()) {
                    continue;
                }
                waiting.push(crate::store::Waiting {
                    job: &ask.job.name,
                    period: &ask.due.period,
                    fire: ask.due.fire,
                    watch,
                    waits: gate[i]
                        .as_ref()
                        .map(ToString::to_string)
                        .unwrap_or_default(),
                });
            }
        }
        self.store.note_waiting(&waiting).await?;
        Ok(gate)
    }

    /// Forgets as waiting the periods of jobs with `after` that were just
    /// won (a shard of them, for a period split into shards), beside the
    /// runs: a row left behind is passed over (its period has a claim) and
    /// goes with the claim when it is pruned.
    fn unwait(&self, asks: &[Ask], claimed: &[Taken]) {
        let won: Vec<String> = asks
            .iter()
            .zip(claimed)
            .filter(|(ask, taken)| ask.job.after.any() && matches!(taken, Taken::Won(_)))
            .map(|(ask, _)| ask.key().period_key().to_string())
            .collect();
        if won.is_empty() {
            return;
        }
        let store = self.store.clone();
        tokio::spawn(async move {
            if let Err(e) = store.unwait(&won).await {
                tracing::debug!("cannot forget claimed periods as waiting: {e}");
            }
        });
    }

    async fn claim_ready(&self, asks: &[Ask], queue: Queue) -> Result<Vec<Taken>, Error> {
        let here = self.mark_running_here(asks);
        let answers = self.claim_chunks(asks, &here, queue == Queue::Wait).await?;
        Ok(asks
            .iter()
            .zip(answers)
            .zip(here)
            .map(|((ask, answer), here)| {
                let (Some((claim, sent)), Some(here)) = (answer, here) else {
                    return Taken::RunningHere;
                };
                let result = report::metric_result(&claim);
                metrics::counter!("scheduler_claims_total", "job" => ask.job.name.clone(), "result" => result).increment(1);
                if result == "recovered" {
                    metrics::counter!("scheduler_claims_taken_over_total").increment(1);
                }
                tracing::debug!(
                    job = &*ask.job.name,
                    period_key = %ask.key(),
                    result,
                    "claim answered"
                );
                match claim {
                    Claim::Won(won) => Taken::Won(Won {
                        watch: self.heartbeats.watch(&won, sent.at, won.granted),
                        trace: self.trace_of(ask, &won, sent),
                        sent,
                        lease: won,
                        _here: here,
                        _counted: Counted::new(&ask.job.name),
                    }),
                    other => Taken::Not(other),
                }
            })
            .collect())
    }

    /// Marks each ask's period as running here; `None` for one that is
    /// already (it is not claimed again).
    fn mark_running_here(&self, asks: &[Ask]) -> Vec<Option<RunningHere>> {
        let Ok(mut set) = self.running_here.lock() else {
            return asks.iter().map(|_| None).collect();
        };
        asks.iter()
            .map(|ask| {
                let key = ask.key();
                set.insert(key.clone()).then(|| RunningHere {
                    key,
                    set: self.running_here.clone(),
                })
            })
            .collect()
    }

    /// Claims the asks marked `here`, [`CLAIM_BATCH`] per statement, a few
    /// statements side by side; each answer with when its statement was
    /// sent. An error releases what the other statements won.
    async fn claim_chunks(
        &self,
        asks: &[Ask],
        here: &[Option<RunningHere>],
        wait: bool,
    ) -> Result<Vec<Option<(Claim, Sent)>>, Error> {
        let todo: Vec<usize> = (0..asks.len()).filter(|i| here[*i].is_some()).collect();
        let lease = self.heartbeats.lease();
        let mut chunks: Vec<Vec<usize>> = todo.chunks(CLAIM_BATCH).map(<[usize]>::to_vec).collect();
        // Replicas claiming one burst start at different chunks, so they
        // claim different keys at first rather than queue on the same rows.
        let start = start_at(&self.owner, chunks.len());
        chunks.rotate_left(start);
        let mut answers: Vec<Option<(Claim, Sent)>> = asks.iter().map(|_| None).collect();
        // Chunks are claimed side by side, a few at a time: they lock
        // disjoint jobs, and a burst is claimed in the time of its slowest
        // chunk rather than of all of them.
        let mut chunks = chunks.into_iter();
        let mut running = tokio::task::JoinSet::new();
        let mut failure = None;
        loop {
            while failure.is_none() && running.len() < CLAIMS_AT_ONCE {
                let Some(chunk) = chunks.next() else { break };
                let mine: Vec<Ask> = chunk.iter().map(|i| asks[*i].clone()).collect();
                let (store, owner) = (self.store.clone(), self.owner.clone());
                let clock = self.clock.clone();
                running.spawn(async move {
                    let requests: Vec<ClaimRequest<'_>> =
                        mine.iter().map(|ask| ask.request(&owner, lease)).collect();
                    let sent = Sent {
                        at: Instant::now(),
                        wall: clock.now(),
                        took: Duration::ZERO,
                    };
                    let claims = store.claim_batch(&requests, wait).await;
                    let sent = Sent {
                        took: sent.at.elapsed(),
                        ..sent
                    };
                    (chunk, claims, sent)
                });
            }
            let Some(done) = running.join_next().await else {
                break;
            };
            match done {
                Ok((chunk, Ok(claims), sent)) => {
                    for (i, claim) in chunk.into_iter().zip(claims) {
                        answers[i] = Some((claim, sent));
                    }
                }
                Ok((_, Err(e), _)) => failure = Some(e),
                Err(e) => failure = Some(Error::Environment(e.into())),
            }
        }
        if let Some(e) = failure {
            for (claim, _) in answers.into_iter().flatten() {
                if let Claim::Won(lease) = claim {
                    let _ = self.store.release(&lease, None).await;
                }
            }
            return Err(e);
        }
        Ok(answers)
    }

    /// The trace of `ask`'s claim, won as `lease` by a statement `sent`.
    fn trace_of(&self, ask: &Ask, lease: &Lease, sent: Sent) -> crate::trace::AttemptTrace {
        let key = lease.key.as_str();
        let answered = sent.wall + chrono::TimeDelta::from_std(sent.took).unwrap_or_default();
        self.tracer.attempt(crate::trace::Attempt {
            job: &ask.job.name,
            period: &ask.due.period.label,
            period_key: key,
            attempt: lease.attempt,
            trigger: lease.trigger,
            owner: &self.owner,
            claim: (sent.wall, answered),
        })
    }

    /// Runs a won period to its end and reports how it ended.
    pub async fn run(&self, ask: Ask, won: Won, stop_now: watch::Receiver<bool>) -> Report {
        let unreported = Report::not_run(&ask, Taken::RunningHere);
        let mut reports = self.run_won(vec![(ask, won)], stop_now).await;
        reports.pop().unwrap_or(unreported)
    }

    /// Runs what one unit won and reports how each period ended: `sql`
    /// periods as groups (one transaction each), the others side by side.
    /// The one place where a period's action chooses how it runs, and
    /// where each outcome is logged, the same whoever asked (the timer, a
    /// scan, `run`, the API, the console, the library).
    pub async fn run_won(
        &self,
        won: Vec<(Ask, Won)>,
        stop_now: watch::Receiver<bool>,
    ) -> Vec<Report> {
        let (sql, other): (Vec<_>, Vec<_>) = won.into_iter().partition(|(ask, _)| ask.is_sql());
        let apart = futures_util::future::join_all(other.into_iter().map(|(ask, won)| {
            let stop_now = stop_now.clone();
            async move { self.run_action(&ask, won, stop_now).await }
        }));
        let reports = if sql.is_empty() {
            apart.await
        } else {
            let (mut reports, grouped) = tokio::join!(apart, self.run_group(sql, stop_now));
            reports.extend(grouped);
            reports
        };
        for report in &reports {
            report.log();
        }
        reports
    }

    /// Runs the action of a won `command`, `shell` or `http` period.
    async fn run_action(&self, ask: &Ask, won: Won, stop_now: watch::Receiver<bool>) -> Report {
        self.log_won(ask, &won);
        won.trace.action();
        let run = Run {
            job: &ask.job,
            period: &ask.due.period,
            key: &won.lease.key,
            lease: &won.lease,
            scheduled_at: ask.due.fire,
            traceparent: won.trace.traceparent(),
        };
        let report = self.execute(&run, &won.watch, &won.trace, stop_now).await;
        won.trace.end(&report.ended());
        report.count();
        report
    }

    /// Says a claim was won, with how late after its fire the claim
    /// started and how long its statement took.
    fn log_won(&self, ask: &Ask, won: &Won) {
        let lease = &won.lease;
        // Lateness is the timer's: the scheduled fires of `serve`'s timer
        // only (a catch-up, retry or recovery is late by design, and `run
        // JOB` may take a fire days old).
        if ask.timed && lease.trigger == Trigger::Schedule {
            let late = (won.sent.wall - ask.due.fire).to_std().unwrap_or_default();
            metrics::histogram!("scheduler_fire_lateness_seconds", "job" => ask.job.name.clone())
                .record(late.as_secs_f64());
            tracing::info!(
                job = &*ask.job.name,
                period_key = %lease.key,
                trigger = lease.trigger.as_str(),
                attempt = lease.attempt,
                lateness_ms = millis(late),
                claim_ms = millis(won.sent.took),
                "claim won"
            );
        } else {
            tracing::info!(
                job = &*ask.job.name,
                period_key = %lease.key,
                trigger = lease.trigger.as_str(),
                attempt = lease.attempt,
                "claim won"
            );
        }
    }
}

/// A duration in milliseconds, to the microsecond.
fn millis(d: Duration) -> f64 {
    d.as_micros() as f64 / 1000.0
}

/// Where in `n` chunks of one burst this owner starts claiming, so that
/// replicas claim different keys first.
pub fn start_at(owner: &str, n: usize) -> usize {
    if n < 2 {
        return 0;
    }
    let hash = owner
        .bytes()
        .fold(0u64, |h, b| h.wrapping_mul(31).wrapping_add(u64::from(b)));
    (hash % n as u64) as usize
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
        // A shutdown flag whose sender is gone (a library call ended) is
        // no shutdown.
        tokio::select! {
            Ok(_) = shutdown.wait_for(|down| *down) => {}
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
