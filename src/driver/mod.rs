//! The driver: the scheduling loop every long-running front end drives
//! (`scheduler serve`, the library's [`crate::Scheduler::start`]). One loop
//! sleeps until the earliest next fire of any job, hands each wake-up's
//! fires to the engine as one batch, and beside it a regular scan finds
//! expired, released and retryable claims to take over. Shutdown and
//! reload are inputs to the loop. It knows no HTTP: a front end serves
//! beside it ([`Companion`]) and reports its [`Health`].

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use chrono::{DateTime, TimeDelta, Utc};
use tokio::sync::{mpsc, watch};

use crate::clock::{Clock, SystemClock};
use crate::config::after::OnRerun;
use crate::config::{Config, Job, Missed, Settings};
use crate::engine::due::{Due, OverdueCount, due};
use crate::engine::{Ask, CLAIM_BATCH, Engine, Queue, Report, SQL_GROUP, Status, Taken};
use crate::error::{Error, Outcome};
use crate::period::PeriodKey;
use crate::store::{Claim, Reclaimable, Store, Trigger};
use crate::template::Secrets;

pub mod health;
mod timer;
use health::Health;
use timer::Timer;

/// The longest sleep: tokio's timer follows the monotonic clock, so a step
/// of the wall clock (NTP, suspend) is noticed at the next wake-up.
const MAX_SLEEP: Duration = Duration::from_secs(30);

/// How often the overdue and retries-exhausted gauges are counted.
const GAUGES_EVERY: Duration = Duration::from_secs(60);

/// How many claims one scan takes over at most.
const SCAN_LIMIT: u32 = 500;

/// How often a scan looks at every period waiting for upstream periods,
/// not only at those the database woke.
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// How far back from its last look a scan looks for upstream successes
/// that make periods stale.
const RERUN_MARGIN: TimeDelta = TimeDelta::minutes(1);

/// What one scan read from the database.
struct Scanned {
    paused: Result<Vec<String>, Error>,
    found: Result<Vec<Reclaimable>, Error>,
    /// Succeeded periods reopened because a period they needed succeeded
    /// again (`on_upstream_rerun = "rerun"`).
    reopened: Result<(Vec<(String, Due)>, bool), Error>,
    /// Where the scan's look for upstream successes began.
    reruns_since: DateTime<Utc>,
    /// Every waiting period was to go to the gate and could not be read:
    /// the next scan tries again.
    regate_again: bool,
}

enum Event {
    /// A scan ended.
    Scanned(Box<Scanned>),
    /// No concurrency slot (or no database): try again at the next scan,
    /// or, for a slot, when a run of the job ends here.
    Again(String, Due),
    /// Claims not decided because another claim of their jobs was under
    /// way: asked for again now, whatever the catch-up window.
    Contended(Vec<(String, Due)>),
    /// A run of this job ended here (`true`: it succeeded); its slot is
    /// free.
    Done(String, bool),
    /// A run (or an `sql` group) ended; its `max_running` slot is free.
    Free,
    /// A job was paused (`true`) or resumed through this engine (the API,
    /// the library): this loop follows at once, other processes at their
    /// next scan.
    Paused(String, bool),
}

/// How long a claim kept undecided by another claim of the same jobs waits
/// before it is asked for again: long enough for that claim, a statement of
/// a few milliseconds, to commit, so that the keys are answered without a
/// lock then.
const CONTENDED_AGAIN: Duration = Duration::from_millis(100);

/// What runs periods on the loop's engine beside it (the HTTP API): it is
/// shown the configuration each reload brings, and the loop waits for its
/// runs at shutdown, within the same grace, before it ends.
pub trait Companion: Send + Sync {
    /// A reload: `config` is in force from now on.
    fn reconfigure(&self, config: &Config);

    /// Resolves once the runs it started have ended; asked at shutdown,
    /// after the loop's own runs ended.
    fn finish_runs(&self) -> crate::handler::BoxFuture<'_, ()>;
}

/// The long-running scheduler.
pub struct Service {
    path: PathBuf,
    settings: Settings,
    /// Every secret the configuration held, and the database password
    /// given on the command line: a reload masks them still.
    secrets: Secrets,
    jobs: Vec<Arc<Job>>,
    /// Finds a job of `jobs` by name.
    by_name: Index,
    /// Paused jobs, with the instant from which their fires were skipped
    /// here: caught up from there when they are resumed.
    paused: HashMap<String, DateTime<Utc>>,
    /// From when each job owes its fires, as its first sighting fixed it
    /// ([`crate::engine::due::owed_from`]), whatever finds them (the timer
    /// resumed by a reload, a catch-up, a resume).
    owed: HashMap<String, DateTime<Utc>>,
    timer: Timer,
    /// Every fire up to this instant has been dispatched: a timer built
    /// anew (a reload) goes on from here for the jobs it had, so a fire that
    /// came due while jobs.toml was read is dispatched, not lost.
    fired_until: DateTime<Utc>,
    engine: Engine,
    /// Runs (an `sql` group counting as one) claiming or running now, at
    /// most `settings.max_running`.
    running: usize,
    /// A scan is under way.
    scanning: bool,
    /// A scan is to run at the next wake-up, whatever the interval: a job
    /// that others wait for succeeded here.
    scan_now: bool,
    /// The jobs whose periods other jobs wait for (`after`).
    upstream: HashSet<String>,
    /// Upstream successes from here on may make periods of jobs that
    /// rerun on them stale: the next scan looks from here.
    reruns_since: Option<DateTime<Utc>>,
    /// When a scan last looked at every waiting period.
    swept: Option<Instant>,
    /// The next scan hands every waiting period to the claim's gate,
    /// woken or not: at start-up and after a reload, which may have
    /// changed what they wait for (the key a row watches may be no
    /// upstream period any more).
    regate: bool,
    /// Turns true when shutdown's grace is over: running jobs stop.
    stop_now: watch::Sender<bool>,
    /// Periods waiting for a job's concurrency slot or for the database,
    /// oldest fire first.
    waiting: BTreeMap<(DateTime<Utc>, String), (String, Due)>,
    /// Fires that found all of this process's `max_running` slots taken,
    /// in fire order; each freed slot takes the next.
    backlog: VecDeque<(Arc<Job>, Due)>,
    /// Periods dispatched since the last batch went to the engine.
    pending: Vec<(Arc<Job>, Due)>,
    events: (mpsc::UnboundedSender<Event>, mpsc::UnboundedReceiver<Event>),
    shutdown: watch::Receiver<bool>,
    /// What runs periods beside the loop on its engine (the HTTP API):
    /// told of reloads, waited for at shutdown.
    companion: Option<Arc<dyn Companion>>,
    /// Whether the database-wide gauges are published (`--listen`).
    gauges: bool,
    /// The paused jobs the `scheduler_paused` gauges show; none before
    /// the first scan and after a reload.
    paused_shown: Option<HashSet<String>>,
    /// The overdue gauge's count and the gauges it sets, kept from one
    /// minute to the next; held by the count running now.
    overdue: Arc<tokio::sync::Mutex<(OverdueCount, JobGauges)>>,
    /// Whether freed heap is handed back after start-up.
    trim: bool,
    /// What time it is: the system's clock but in tests.
    clock: Arc<dyn Clock>,
    /// What this loop's `/healthz` and `/readyz` report.
    health: Arc<Health>,
    /// The configuration the deadlines and notifications follow.
    notify: watch::Sender<Arc<Config>>,
}

impl Service {
    /// A service for `config`, read from `path` (re-read on SIGHUP).
    pub fn new(
        path: PathBuf,
        config: Config,
        store: Store,
        owner: String,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Service, Error> {
        let engine = Engine::new(store, config.settings.lease, owner)?;
        Ok(Service::on(path, config, engine, shutdown).trimming_memory())
    }

    /// A service for `config` on `engine`; nothing process-wide is done
    /// unless asked for ([`Service::trimming_memory`]).
    pub fn on(
        path: PathBuf,
        config: Config,
        engine: Engine,
        shutdown: watch::Receiver<bool>,
    ) -> Service {
        let events = mpsc::unbounded_channel();
        let notify = watch::Sender::new(Arc::new(config.clone()));
        let jobs = shared(config.jobs);
        let clock: Arc<dyn Clock> = Arc::new(SystemClock);
        let now = clock.now();
        Service {
            path,
            running: 0,
            scanning: false,
            scan_now: false,
            upstream: upstream_jobs(&jobs),
            reruns_since: None,
            swept: None,
            regate: true,
            stop_now: watch::Sender::new(false),
            settings: config.settings,
            secrets: config.secrets,
            timer: Timer::new(&jobs, now),
            fired_until: now,
            by_name: Index::new(&jobs),
            jobs,
            paused: HashMap::new(),
            owed: HashMap::new(),
            engine,
            waiting: BTreeMap::new(),
            backlog: VecDeque::new(),
            pending: Vec::new(),
            events,
            shutdown,
            companion: None,
            gauges: false,
            paused_shown: None,
            overdue: Arc::default(),
            trim: false,
            clock,
            health: Arc::default(),
            notify,
        }
    }

    /// The service reading the time from `clock` (a test's), its timer
    /// starting at that clock's now.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Service {
        let now = clock.now();
        self.timer = Timer::new(&self.jobs, now);
        self.fired_until = now;
        self.clock = clock;
        self
    }

    /// Hands the heap that start-up freed back to the system once it is
    /// over (`malloc_trim`; the binary's choice, not a library's).
    pub fn trimming_memory(mut self) -> Service {
        self.trim = true;
        self
    }

    /// Sets every job's next-fire gauge (the timer moves each on as it
    /// fires).
    fn publish_next_fires(&self) {
        let now = self.clock.now();
        for job in &self.jobs {
            // At zero from the start: `increase()` misses a series' first
            // sample.
            metrics::counter!("scheduler_periods_dropped_total", "job" => job.name.clone())
                .increment(0);
            if let Some(next) = job.timing().next(now) {
                metrics::gauge!("scheduler_next_fire_timestamp_seconds", "job" => job.name.clone())
                    .set(next.at.timestamp_millis() as f64 / 1000.0);
            }
        }
    }

    /// Publishes the overdue and retries-exhausted gauges of every job
    /// (`--listen`), each minute.
    pub fn with_gauges(mut self) -> Service {
        self.gauges = true;
        self
    }

    /// Counts overdue and retries-exhausted periods per job in a task of
    /// its own, never in front of a fire; skipped while the count before
    /// is still running.
    fn publish_gauges(&self) {
        let Ok(mut held) = self.overdue.clone().try_lock_owned() else {
            return;
        };
        let jobs = self.jobs.clone();
        let paused: HashSet<String> = self.paused.keys().cloned().collect();
        let store = self.engine.store().clone();
        let catch_up = self.settings.catch_up;
        let clock = self.clock.clone();
        tokio::spawn(async move {
            let (count, gauges) = &mut *held;
            let now = clock.now();
            let overdue = count.count(&store, &jobs, catch_up, now).await;
            let exhausted = store.exhausted().await;
            // Waiting and ready as `status` has them: the one rule over
            // the periods noted waiting, for the jobs with `after`.
            let mut waiting: HashMap<String, (usize, usize)> = HashMap::new();
            for job in jobs.iter().filter(|job| job.after.any()) {
                match crate::engine::overview::waiting_and_ready(&store, job, now).await {
                    Ok((w, r)) => waiting.insert(job.name.clone(), (w.len(), r.len())),
                    Err(_) => return,
                };
            }
            let (Ok(overdue), Ok(exhausted)) = (overdue, exhausted) else {
                return;
            };
            let late = count.late(now);
            for job in &jobs {
                // A paused job skips its fires by design, as `status` has
                // it: none is overdue, none late.
                let open = |counts: &HashMap<String, usize>| match paused.contains(&job.name) {
                    true => 0,
                    false => counts.get(&job.name).copied().unwrap_or(0),
                };
                let of_job = gauges.of(job);
                of_job.overdue.set(open(&overdue) as f64);
                if let Some(gauge) = &of_job.late {
                    gauge.set(open(&late) as f64);
                }
                let spent = exhausted.get(&job.name).copied().unwrap_or(0);
                of_job.exhausted.set(spent as f64);
                if let Some((waiting_gauge, ready_gauge)) = &of_job.waiting {
                    let (w, r) = waiting.get(&job.name).copied().unwrap_or_default();
                    waiting_gauge.set(w as f64);
                    ready_gauge.set(r as f64);
                }
            }
        });
    }

    /// What this loop's `/healthz` and `/readyz` report: handed to the
    /// listener, which reads it.
    pub fn health(&self) -> Arc<Health> {
        self.health.clone()
    }

    /// The service with `companion` beside its loop: told of every
    /// reload, waited for at shutdown.
    pub fn beside(mut self, companion: Arc<dyn Companion>) -> Service {
        self.companion = Some(companion);
        self
    }

    /// The engine the loop claims and runs on.
    pub fn engine(&self) -> &Engine {
        &self.engine
    }

    /// The configuration in force (the last reload's).
    pub fn config(&self) -> Arc<Config> {
        self.notify.borrow().clone()
    }

    /// Runs until shutdown; then waits for running jobs (up to the grace,
    /// after which they are stopped and their claims released).
    pub async fn serve(
        mut self,
        mut reload: mpsc::UnboundedReceiver<()>,
    ) -> Result<Outcome, Error> {
        self.catch_up().await?;
        self.flush();
        if self.trim {
            release_free_memory();
        }
        self.health.ready();
        let notifying = crate::engine::notify::follow(
            self.engine.clone(),
            self.notify.subscribe(),
            self.shutdown.clone(),
        );
        self.publish_next_fires();
        tracing::info!(
            jobs = self.jobs.len(),
            owner = self.engine.owner(),
            next_fire = self
                .timer
                .next()
                .map_or_else(|| "none".to_owned(), crate::period::utc_text),
            "serving"
        );
        let mut next_scan = Instant::now();
        let mut next_gauges = Instant::now();
        let mut pauses = self.engine.pauses();
        loop {
            let sleep = self.sleep_for(next_scan.saturating_duration_since(Instant::now()));
            let mut shutdown = self.shutdown.clone();
            tokio::select! {
                () = tokio::time::sleep(sleep) => {}
                () = down(&mut shutdown) => break,
                Some(()) = reload.recv() => self.reload().await,
                Some(event) = self.events.1.recv() => self.handle(event),
                Some((job, paused)) = said(&mut pauses) => self.handle(Event::Paused(job, paused)),
            }
            metrics::counter!("scheduler_wakeups_total").increment(1);
            self.health.loop_alive();
            self.fire();
            let at = Instant::now();
            if at >= next_scan || (self.scan_now && !self.scanning) {
                self.scan();
                next_scan = at + self.settings.scan_interval;
            }
            if self.gauges && at >= next_gauges {
                self.publish_gauges();
                next_gauges = at + GAUGES_EVERY;
            }
            self.flush();
        }
        self.backlog.clear();
        self.waiting.clear();
        self.pending.clear();
        tracing::info!(
            running = self.running,
            shutdown_grace = %humantime::format_duration(self.settings.shutdown_grace),
            "shutting down: waiting for running jobs; past the grace they are stopped and their claims released"
        );
        // The grace in force now: a reload may have changed it.
        let grace = tokio::time::sleep(self.settings.shutdown_grace);
        tokio::pin!(grace);
        while self.running > 0 {
            tokio::select! {
                () = &mut grace, if !*self.stop_now.borrow() => {
                    tracing::info!(running = self.running, "shutdown grace over: stopping the remaining jobs and releasing their claims");
                    self.stop_now.send_replace(true);
                }
                Some(event) = self.events.1.recv() => {
                    if let Event::Free = event {
                        self.running -= 1;
                    }
                }
            }
        }
        // Runs asked for over the API end within the same grace; only then
        // has every job ended.
        if let Some(companion) = &self.companion {
            companion.finish_runs().await;
        }
        // A delivery under way is finished and its outcome written, so the
        // next replica does not send it again; a bounded wait.
        let finishing = notifying.abort_handle();
        if tokio::time::timeout(crate::engine::notify::FINISH_AT_SHUTDOWN, notifying)
            .await
            .is_err()
        {
            tracing::warn!(
                "a notification under way was not done within {}s; the next replica takes it over once its lease runs out",
                crate::engine::notify::FINISH_AT_SHUTDOWN.as_secs()
            );
            finishing.abort();
        }
        tracing::info!("all jobs ended");
        Ok(Outcome::Done)
    }

    /// How long the loop sleeps: until the earliest next fire or the next
    /// scan (`until_scan`), at most [`MAX_SLEEP`].
    fn sleep_for(&self, until_scan: Duration) -> Duration {
        let now = self.clock.now();
        let until_fire = self.timer.next().map_or(MAX_SLEEP, |at| {
            (at - now).to_std().unwrap_or(Duration::ZERO)
        });
        until_fire.min(until_scan).min(MAX_SLEEP)
    }

    /// A wake-up: every fire due by now joins what waits for the next
    /// flush, as far as [`Service::admits`] it.
    fn fire(&mut self) {
        let now = self.clock.now();
        let mut pending = std::mem::take(&mut self.pending);
        let dispatched = pending.len();
        self.timer.pop_due(&self.jobs, now, &mut pending);
        let mut at = 0;
        pending.retain(|(job, due)| {
            at += 1;
            at <= dispatched || self.admits(job, due, now)
        });
        self.pending = pending;
        self.fired_until = now;
    }

    /// Claims what was missed while nothing ran: for each job, the periods
    /// whose fires fall after the newest one ever claimed, within the
    /// catch-up window and not before the job was first seen.
    async fn catch_up(&mut self) -> Result<(), Error> {
        let names: Vec<String> = self.jobs.iter().map(|j| j.name.clone()).collect();
        let store = self.engine.store().clone();
        let records = store.see_jobs(&names).await?;
        let last_fires = store.last_fires(&names).await?;
        let now = self.clock.now();
        let window = now - TimeDelta::from_std(self.settings.catch_up).unwrap_or_default();
        self.owed.clear();
        for job in self.jobs.clone() {
            let Some(record) = records.get(&job.name) else {
                continue;
            };
            let owed = crate::engine::due::owed_from(&store, &job, record).await;
            self.owed.insert(job.name.clone(), owed);
            if record.new {
                crate::engine::due::log_first_sighting(&job, owed);
            }
            let mut since = window.max(owed);
            if let Some(last) = last_fires.get(&job.name) {
                since = since.max(*last + TimeDelta::nanoseconds(1));
            }
            if record.paused {
                self.paused.insert(job.name.clone(), since);
                continue;
            }
            self.catch_up_job(job, since, now);
        }
        Ok(())
    }

    /// Dispatches the fires of `job` from `since` on that are due now, as
    /// `missed` has them, as catch-ups: oldest first, as many as the job
    /// may run at once now, the rest as its runs end.
    fn catch_up_job(&mut self, job: Arc<Job>, since: DateTime<Utc>, now: DateTime<Utc>) {
        // Nothing older than the window is listed: it would only be dropped,
        // and listing it first would hold the window's own fires back.
        let window = TimeDelta::from_std(self.settings.catch_up).unwrap_or_default();
        let since = since
            .max(now - window)
            .max(self.owed_since(&job).unwrap_or(since));
        let with_latest = job.missed != Missed::Skip;
        let missed: Vec<Due> = due(&job, now, since, with_latest)
            .into_iter()
            .filter(|d| d.fire >= since)
            .map(|d| Due {
                trigger: Trigger::CatchUp,
                ..d
            })
            .collect();
        for (n, d) in missed.into_iter().enumerate() {
            if n < job.concurrency as usize {
                self.dispatch(job.clone(), d, now);
            } else {
                self.wait(job.name.clone(), d);
            }
        }
    }

    /// The instant from which `job`'s fires are owed; `None` for a job
    /// whose first sighting is not known here yet (the database did not
    /// answer the reload that brought it).
    fn owed_since(&self, job: &Job) -> Option<DateTime<Utc>> {
        self.owed.get(&job.name).copied()
    }

    /// Follows the pauses in the database (a scan) or the API's: a newly
    /// paused job skips its fires from now; a resumed one catches up the
    /// fires it skipped here, as `missed` and `catch_up` have them (a
    /// pause delays periods, as a suspended Kubernetes CronJob does; it
    /// does not drop them). Other replicas catch up the same fires: the
    /// claims make that once.
    fn follow_pauses(&mut self, paused: HashSet<String>) {
        let now = self.clock.now();
        for name in &paused {
            if !self.paused.contains_key(name) {
                // Its fires waiting for a slot are dropped while it is
                // paused: skipped as the ones to come are.
                let since = self.oldest_queued_fire(name).map_or(now, |f| f.min(now));
                self.paused.insert(name.clone(), since);
            }
        }
        let resumed: Vec<(String, DateTime<Utc>)> = self
            .paused
            .iter()
            .filter(|(name, _)| !paused.contains(*name))
            .map(|(name, since)| (name.clone(), *since))
            .collect();
        for (name, since) in resumed {
            self.paused.remove(&name);
            if let Some(job) = self.job(&name) {
                tracing::info!(job = name, since = %crate::period::utc_text(since), "resumed: catching up the fires skipped while paused");
                self.catch_up_job(job, since, now);
            }
        }
    }

    /// The oldest fire of job `name` that waits here for a slot.
    fn oldest_queued_fire(&self, name: &str) -> Option<DateTime<Utc>> {
        let queued = self.pending.iter().chain(&self.backlog);
        let queued = queued.map(|(job, due)| (job.name.as_str(), due));
        let waiting = self.waiting.values().map(|(job, due)| (job.as_str(), due));
        queued
            .chain(waiting)
            .filter(|(job, _)| *job == name)
            .map(|(_, due)| due.fire)
            .min()
    }

    /// The regular scan: pauses, waiting periods, and claims to take over.
    /// Starts the regular scan beside the timer (never in front of it: a
    /// slow or stalled database must not delay fires); its findings come
    /// back as [`Event::Scanned`]. One scan at a time.
    fn scan(&mut self) {
        if self.scanning {
            return;
        }
        self.scanning = true;
        self.scan_now = false;
        let store = self.engine.store().clone();
        let names: Vec<String> = self.jobs.iter().map(|j| j.name.clone()).collect();
        let events = self.events.0.clone();
        let rerun: Vec<Arc<Job>> = self
            .jobs
            .iter()
            .filter(|job| job.after.on_rerun == OnRerun::Rerun && job.after.any())
            .cloned()
            .collect();
        let now = self.clock.now();
        let window = TimeDelta::from_std(self.settings.catch_up).unwrap_or_default();
        let since = self.reruns_since.unwrap_or(now - window);
        if !rerun.is_empty() {
            // Looked at again from a minute back: the database's clock
            // records successes, this host's counts scans.
            self.reruns_since = Some(now - RERUN_MARGIN);
        }
        // Every waiting period is looked at once a minute, a safety net
        // beside the rows the database woke.
        let sweep = self.swept.is_none_or(|at| at.elapsed() >= SWEEP_EVERY);
        if sweep {
            self.swept = Some(Instant::now());
        }
        let regate = std::mem::take(&mut self.regate);
        tokio::spawn(async move {
            let paused = store.paused_jobs().await;
            let mut found = store.reclaimable(&names, SCAN_LIMIT, sweep).await;
            let mut regate_again = regate && found.is_err();
            if regate && let Ok(found) = &mut found {
                match store.waiting_periods(&names, SCAN_LIMIT).await {
                    Ok(waiting) => found.extend(waiting),
                    Err(e) => {
                        tracing::warn!("scan: cannot read the waiting periods: {e}");
                        regate_again = true;
                    }
                }
            }
            let rerun: Vec<&Job> = rerun.iter().map(|job| &**job).collect();
            let reopened = crate::engine::after::reopen_stale(&store, &rerun, since).await;
            let scanned = Scanned {
                paused,
                found,
                reopened,
                reruns_since: since,
                regate_again,
            };
            let _ = events.send(Event::Scanned(Box::new(scanned)));
        });
    }

    /// What a scan found: pauses, waiting periods, and claims to take over.
    fn scanned(&mut self, scanned: Scanned) {
        self.scanning = false;
        match scanned.paused {
            Ok(paused) => {
                let paused: HashSet<String> = paused.into_iter().collect();
                // Published when the paused jobs or the jobs change: a
                // labelled gauge is a registry search, and a scan every few
                // seconds of 10,000 jobs made 10,000 of them.
                if self.paused_shown.as_ref() != Some(&paused) {
                    for job in &self.jobs {
                        let on = f64::from(u8::from(paused.contains(&job.name)));
                        metrics::gauge!("scheduler_paused", "job" => job.name.clone()).set(on);
                    }
                    self.paused_shown = Some(paused.clone());
                }
                self.follow_pauses(paused);
            }
            Err(e) => tracing::warn!("scan: cannot read paused jobs: {e}"),
        }
        let waiting: HashSet<String> = self.waiting.values().map(|(job, _)| job.clone()).collect();
        for name in waiting {
            let slots = self.job(&name).map_or(1, |job| job.concurrency as usize);
            self.release_waiting(&name, slots);
        }
        let now = self.clock.now();
        match scanned.found {
            Ok(found) => {
                self.health.database_ok();
                tracing::debug!(claimable = found.len(), "scan");
                for r in found {
                    if let Some(job) = self.job(&r.job) {
                        let due = Due {
                            period: r.period,
                            fire: r.scheduled_at,
                            trigger: r.trigger,
                        };
                        self.dispatch(job, due, now);
                    }
                }
            }
            Err(e) => tracing::warn!("scan: cannot look for claims to take over: {e}"),
        }
        self.regate |= scanned.regate_again;
        match scanned.reopened {
            Ok((reopened, running)) => {
                // A period that needed those successes and still runs is
                // looked at again once it ends: the look starts where this
                // one did.
                if running {
                    self.reruns_since = Some(scanned.reruns_since);
                }
                for (name, due) in reopened {
                    if let Some(job) = self.job(&name) {
                        self.dispatch(job, due, now);
                    }
                }
            }
            Err(e) => {
                // Looked at again from the start of the window.
                self.reruns_since = None;
                tracing::warn!("scan: cannot look for periods an upstream rerun made stale: {e}");
            }
        }
    }

    fn wait(&mut self, job: String, due: Due) {
        let key = (
            due.fire,
            PeriodKey::new(&job, &due.period.label).to_string(),
        );
        self.waiting.insert(key, (job, due));
    }

    fn job(&self, name: &str) -> Option<Arc<Job>> {
        let i = self.by_name.find(&self.jobs, name)?;
        Some(self.jobs[i].clone())
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Scanned(scanned) => self.scanned(*scanned),
            Event::Again(name, due) => self.wait(name, due),
            Event::Contended(asks) => {
                for (name, due) in asks {
                    if let Some(job) = self.job(&name)
                        && !*self.shutdown.borrow()
                        && !self.paused.contains_key(&name)
                    {
                        self.pending.push((job, due));
                    }
                }
            }
            // A slot of this job freed here: its oldest waiting period goes next.
            Event::Done(name, succeeded) => {
                // A success of a job others wait for: the scan that claims
                // what waited on it runs now, not at its interval.
                if succeeded && self.upstream.contains(&name) {
                    self.scan_now = true;
                }
                self.release_waiting(&name, 1);
            }
            Event::Free => {
                self.running -= 1;
            }
            Event::Paused(name, paused) => {
                let mut now_paused: HashSet<String> = self.paused.keys().cloned().collect();
                match paused {
                    true => now_paused.insert(name),
                    false => now_paused.remove(&name),
                };
                self.follow_pauses(now_paused);
            }
        }
    }

    /// Dispatches the `n` oldest waiting periods of job `name`.
    /// What waited past the catch-up window is dropped on the way and
    /// takes no slot.
    fn release_waiting(&mut self, name: &str, n: usize) {
        let now = self.clock.now();
        let mut released = 0;
        while released < n {
            let Some(key) = self
                .waiting
                .iter()
                .find(|(_, (job, _))| job == name)
                .map(|(key, _)| key.clone())
            else {
                return;
            };
            let Some((name, due)) = self.waiting.remove(&key) else {
                return;
            };
            let Some(job) = self.job(&name) else {
                continue;
            };
            if !self.too_old(&job, &due, now) {
                self.dispatch(job, due, now);
                released += 1;
            }
        }
    }

    /// Queues `due` for the next flush, if [`Service::admits`] it.
    fn dispatch(&mut self, job: Arc<Job>, due: Due, now: DateTime<Utc>) {
        if self.admits(&job, &due, now) {
            self.pending.push((job, due));
        }
    }

    /// Whether a fire is dispatched: not while shutting down, not for a
    /// paused job, not past the catch-up window.
    fn admits(&self, job: &Job, due: &Due, now: DateTime<Utc>) -> bool {
        !*self.shutdown.borrow()
            && !self.paused.contains_key(&job.name)
            && !self.too_old(job, due, now)
    }

    /// Moves what was dispatched since the last flush behind the backlog
    /// (older fires go first). Into an empty backlog (the common case: a
    /// burst) the buffer itself moves, not its 10,000 fires one by one into
    /// a second buffer of the same size.
    fn take_pending(&mut self) {
        let pending = std::mem::take(&mut self.pending);
        if self.backlog.is_empty() {
            self.backlog = VecDeque::from(pending);
        } else {
            self.backlog.extend(pending);
        }
    }

    /// Whether `due` waited past the catch-up window (for a free slot):
    /// then it is dropped, logged and counted. A recovery never is, nor a
    /// period that waited for its upstream periods (however long that
    /// took, it is still to run).
    fn too_old(&self, job: &Job, due: &Due, now: DateTime<Utc>) -> bool {
        let window = TimeDelta::from_std(self.settings.catch_up).unwrap_or_default();
        let kept = matches!(due.trigger, Trigger::Recovery | Trigger::Upstream);
        let old = !kept && due.fire < now - window;
        if old {
            tracing::warn!(
                job = job.name,
                period = due.period.label,
                "dropped: older than the catch-up window"
            );
            metrics::counter!("scheduler_periods_dropped_total", "job" => job.name.clone())
                .increment(1);
        }
        old
    }

    /// Hands what was dispatched since the last call to the engine, as one
    /// batch of claims, as far as `max_running` allows: a run of a
    /// `command` or `http` job takes a slot, a group of up to [`SQL_GROUP`]
    /// `sql` periods one slot together. The rest waits in the backlog.
    fn flush(&mut self) {
        self.take_pending();
        if self.running >= self.settings.max_running {
            // Oldest first: what waited past the window goes, so that the
            // backlog of slots that never free stays within the window.
            let now = self.clock.now();
            while let Some((job, due)) = self.backlog.front()
                && self.too_old(job, due, now)
            {
                self.backlog.pop_front();
            }
            return;
        }
        if self.backlog.is_empty() {
            return;
        }
        let mut units: Vec<Vec<Ask>> = Vec::new();
        // Up to SQL_GROUP `sql` periods share a slot; the engine runs them a
        // transaction per job, side by side.
        let mut sql = None;
        let now = self.clock.now();
        while let Some((job, due)) = self.backlog.pop_front() {
            // What waited for `max_running` past the window is dropped as
            // what waited for `concurrency` is.
            if self.paused.contains_key(&job.name) || self.too_old(&job, &due, now) {
                continue;
            }
            let ask = Ask::timed(job, due);
            if let Some(i) = sql.filter(|i: &usize| ask.is_sql() && units[*i].len() < SQL_GROUP) {
                units[i].push(ask);
                continue;
            }
            if self.running + units.len() >= self.settings.max_running {
                self.backlog.push_front((ask.job, ask.due));
                break;
            }
            if ask.is_sql() {
                sql = Some(units.len());
            }
            units.push(vec![ask]);
        }
        if self.backlog.is_empty() {
            // A burst's backlog (10,000 fires) is not kept for the next.
            self.backlog = VecDeque::new();
        }
        if units.is_empty() {
            return;
        }
        self.running += units.len();
        // One batch per claiming statement, each running what it won as
        // soon as it is claimed: the first periods of a burst start while
        // the last are still being claimed. Replicas start at different
        // batches, so they claim different keys first.
        let mut batches: Vec<Batch> = Vec::new();
        for unit in units {
            let fits = batches.last().is_some_and(|b| {
                b.units.iter().map(Vec::len).sum::<usize>() + unit.len() <= CLAIM_BATCH
            });
            if !fits {
                batches.push(Batch {
                    engine: self.engine.clone(),
                    units: Vec::new(),
                    slots: Vec::new(),
                    stop_now: self.stop_now.subscribe(),
                    events: self.events.0.clone(),
                });
            }
            if let Some(batch) = batches.last_mut() {
                batch.units.push(unit);
                batch.slots.push(FreeOnDrop(self.events.0.clone()));
            }
        }
        let start = crate::engine::start_at(self.engine.owner(), batches.len());
        batches.rotate_left(start);
        for batch in batches {
            tokio::spawn(batch.go());
        }
    }

    /// Puts the jobs of a reloaded jobs.toml in place: the timer goes on
    /// from where it was for the jobs it had; fires waiting for a slot run
    /// under the job as it is now, a removed job's start nothing more.
    fn replace_jobs(&mut self, jobs: Vec<Arc<Job>>) {
        let by_name = Index::new(&jobs);
        for gone in self
            .jobs
            .iter()
            .filter(|old| by_name.find(&jobs, &old.name).is_none())
        {
            retire_gauges(&gone.name);
        }
        let (old, old_jobs, fired_until) = (&self.by_name, &self.jobs, self.fired_until);
        // A reload that makes fires due earlier (a holiday removed) goes
        // back to them, but never before what the job owes: a fire from
        // before it was first seen runs for nobody on its own.
        self.timer = Timer::resumed(
            &jobs,
            |job| {
                let was = &old_jobs[old.find(old_jobs, &job.name)?];
                let from = crate::fires::resume_from(&was.timing(), &job.timing(), fired_until);
                let owed = self
                    .owed_since(job)
                    .map(|at| at - TimeDelta::nanoseconds(1));
                Some(owed.map_or(from, |owed| from.max(owed)))
            },
            self.clock.now(),
        );
        self.by_name = by_name;
        self.upstream = upstream_jobs(&jobs);
        self.jobs = jobs;
        self.paused_shown = None;
        self.take_pending();
        let (by_name, jobs) = (&self.by_name, &self.jobs);
        self.backlog
            .retain_mut(|(job, _)| match by_name.find(jobs, &job.name) {
                Some(i) => {
                    *job = jobs[i].clone();
                    true
                }
                None => false,
            });
    }

    /// Re-reads jobs.toml and applies all of it, jobs and settings alike;
    /// a bad file is logged and the old one kept whole.
    async fn reload(&mut self) {
        self.regate = true;
        let sqlite = matches!(self.engine.store(), crate::store::Store::Sqlite(_));
        let loaded = Config::load(&self.path).and_then(|config| {
            if sqlite {
                config.check_for_sqlite()?;
            }
            Ok(config)
        });
        let mut config = match loaded {
            Ok(config) => config,
            Err(e) => {
                let e = self.secrets.mask(&e.to_string());
                tracing::error!("reload: keeping the running configuration: {e}");
                return;
            }
        };
        config.mask_also(self.secrets.values());
        self.secrets = config.secrets.clone();
        if let Some(companion) = &self.companion {
            companion.reconfigure(&config);
        }
        self.notify.send_replace(Arc::new(config.clone()));
        let jobs = shared(config.jobs);
        let names: Vec<String> = jobs.iter().map(|j| j.name.clone()).collect();
        // A job this reload shows the database for the first time owes its
        // latest fire within catch_up, as at a start (docs/commands.md).
        let mut first_sighted = Vec::new();
        let store = self.engine.store().clone();
        match store.see_jobs(&names).await {
            Ok(records) => {
                self.owed.clear();
                for job in &jobs {
                    let Some(record) = records.get(&job.name) else {
                        continue;
                    };
                    let owed = crate::engine::due::owed_from(&store, job, record).await;
                    self.owed.insert(job.name.clone(), owed);
                    if record.new {
                        crate::engine::due::log_first_sighting(job, owed);
                        if !record.paused {
                            first_sighted.push(job.clone());
                        }
                    }
                }
            }
            Err(e) => tracing::warn!("reload: cannot record new jobs yet: {e}"),
        }
        if config.settings.database_url != self.settings.database_url {
            tracing::warn!("reload: a new database_url takes effect at the next start");
        }
        self.replace_jobs(jobs);
        let now = self.clock.now();
        for job in first_sighted {
            self.catch_up_job(job, DateTime::<Utc>::MIN_UTC, now);
        }
        self.publish_next_fires();
        // Leases granted from now on, and so the heartbeat interval and the
        // fence; claims already held keep the lease they were granted until
        // their next renewal.
        self.engine.set_lease(config.settings.lease);
        self.health.watch(config.settings.lease, config.settings.scan_interval);
        self.settings = config.settings;
        tracing::info!(
            jobs = self.jobs.len(),
            lease = %humantime::format_duration(self.settings.lease),
            max_running = self.settings.max_running,
            shutdown_grace = %humantime::format_duration(self.settings.shutdown_grace),
            scan_interval = %humantime::format_duration(self.settings.scan_interval),
            catch_up = %humantime::format_duration(self.settings.catch_up),
            "reloaded {}",
            self.path.display()
        );
        if self.jobs.is_empty() {
            tracing::warn!(
                "reload: {} has no jobs; nothing is scheduled",
                self.path.display()
            );
        }
    }
}

/// Sets the gauges of a job that a reload removed to zero, so that no alert
/// goes on firing for it. The exporter cannot forget a series: they stay, at
/// zero, until the process restarts.
fn retire_gauges(job: &str) {
    for gauge in [
        "scheduler_overdue_periods",
        "scheduler_late_periods",
        "scheduler_waiting_periods",
        "scheduler_ready_periods",
        "scheduler_retries_exhausted_periods",
        "scheduler_paused",
        "scheduler_next_fire_timestamp_seconds",
    ] {
        metrics::gauge!(gauge, "job" => job.to_owned()).set(0.0);
    }
}

/// The jobs whose periods other jobs (or, by naming themselves, they
/// themselves) wait for.
fn upstream_jobs(jobs: &[Arc<Job>]) -> HashSet<String> {
    let mut upstream = HashSet::new();
    for job in jobs {
        upstream.extend(job.after.upstream.iter().map(|up| up.job.clone()));
        if job.after.previous {
            upstream.insert(job.name.clone());
        }
    }
    upstream
}

/// Resolves once `shutdown` turns true (its guard dropped at once: the
/// serve loop's future stays `Send`).
async fn down(shutdown: &mut watch::Receiver<bool>) {
    let _ = shutdown.wait_for(|down| *down).await;
}

/// The jobs, each behind an `Arc`, in a list of their own size: collected
/// in place, the list would keep the allocation of the jobs themselves
/// (3.4 MB for 10,000 jobs) to hold their pointers (80 KB).
fn shared(jobs: Vec<Job>) -> Vec<Arc<Job>> {
    let mut shared: Vec<Arc<Job>> = jobs.into_iter().map(Arc::new).collect();
    shared.shrink_to_fit();
    shared
}

/// Finds a job by name: the positions of the jobs, in the order of their
/// names. 80 KB for 10,000 jobs, where a map holding a copy of each name
/// took 850 KB.
struct Index(Vec<usize>);

impl Index {
    fn new(jobs: &[Arc<Job>]) -> Index {
        let mut order: Vec<usize> = (0..jobs.len()).collect();
        order.sort_unstable_by(|a, b| jobs[*a].name.cmp(&jobs[*b].name));
        Index(order)
    }

    /// The position in `jobs` (those it was made from) of the job `name`.
    fn find(&self, jobs: &[Arc<Job>], name: &str) -> Option<usize> {
        let at = self
            .0
            .binary_search_by(|i| jobs[*i].name.as_str().cmp(name))
            .ok()?;
        Some(self.0[at])
    }
}

/// The next pause or resume said through the engine; `None` when some
/// were missed (the scan reads them from the database).
async fn said(
    pauses: &mut tokio::sync::broadcast::Receiver<(String, bool)>,
) -> Option<(String, bool)> {
    match pauses.recv().await {
        Ok(said) => Some(said),
        Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => None,
        // The engine, which the loop holds, is the sender: never.
        Err(tokio::sync::broadcast::error::RecvError::Closed) => std::future::pending().await,
    }
}

/// Hands freed heap back to the system once start-up is over: parsing a
/// large jobs.toml leaves tens of MB that glibc would otherwise keep for the
/// life of the process (10,000 jobs: 36 MB resident for 9.5 MB live).
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages; no live allocation moves.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// One wake-up's periods: claimed together, then run, each unit (one
/// period, or an `sql` group) on its own `max_running` slot.
struct Batch {
    engine: Engine,
    units: Vec<Vec<Ask>>,
    slots: Vec<FreeOnDrop>,
    stop_now: watch::Receiver<bool>,
    events: mpsc::UnboundedSender<Event>,
}

/// Frees a `max_running` slot when dropped, however its run ends (a panic
/// unwinds through it too).
struct FreeOnDrop(mpsc::UnboundedSender<Event>);

impl Drop for FreeOnDrop {
    fn drop(&mut self) {
        let _ = self.0.send(Event::Free);
    }
}

impl Batch {
    async fn go(mut self) {
        let units = std::mem::take(&mut self.units);
        let periods: Vec<(String, Due)> = units
            .iter()
            .flatten()
            .map(|ask| (ask.job.name.clone(), ask.due.clone()))
            .collect();
        let claimed = match self.engine.take(units, Queue::Contend).await {
            Ok(claimed) => claimed,
            Err(e) => {
                tracing::warn!(periods = periods.len(), "cannot claim, will try again: {e}");
                for (job, due) in periods {
                    let _ = self.events.send(Event::Again(job, due));
                }
                return;
            }
        };
        drop(periods);
        let slots = std::mem::take(&mut self.slots);
        let mut contended = Vec::new();
        for (claimed, slot) in claimed.into_iter().zip(slots) {
            for (ask, taken) in claimed.not_won {
                if let Taken::Not(Claim::Contended) = taken {
                    Report::not_run(&ask, taken).log();
                    contended.push((ask.job.name.clone(), ask.due));
                } else {
                    self.not_won(ask, taken);
                }
            }
            if claimed.won.is_empty() {
                continue;
            }
            let engine = self.engine.clone();
            let stop_now = self.stop_now.clone();
            let events = self.events.clone();
            tokio::spawn(async move {
                let _slot = slot;
                for report in engine.run_won(claimed.won, stop_now).await {
                    let (job, _) = report.key.parts();
                    let succeeded = matches!(report.status, Status::Succeeded);
                    let _ = events.send(Event::Done(job.to_owned(), succeeded));
                }
            });
        }
        self.ask_again(contended);
    }

    /// Asks again for what another claim of the same jobs kept undecided,
    /// once that claim is likely committed (and its keys answered without
    /// a lock).
    fn ask_again(&self, contended: Vec<(String, Due)>) {
        if contended.is_empty() {
            return;
        }
        let events = self.events.clone();
        tokio::spawn(async move {
            tokio::time::sleep(CONTENDED_AGAIN).await;
            let _ = events.send(Event::Contended(contended));
        });
    }

    /// Logs an ask not won; one that found no concurrency slot waits for
    /// one: a fire as a catch-up, inside the catch-up window; a recovery as
    /// a recovery, whatever its age. Its period was claimed once and must
    /// still be finished, and, as the oldest fire waiting, it takes the
    /// next free slot (turned into a catch-up, a short `catch_up` dropped
    /// it, and newer fires took the slot at every scan).
    fn not_won(&self, ask: Ask, taken: Taken) {
        let report = Report::not_run(&ask, taken);
        report.log();
        if let Status::NotWon(Claim::Busy) = report.status {
            let trigger = match ask.due.trigger {
                Trigger::Recovery => Trigger::Recovery,
                _ => Trigger::CatchUp,
            };
            let due = Due { trigger, ..ask.due };
            let _ = self.events.send(Event::Again(ask.job.name.clone(), due));
        }
    }
}

/// The gauges of each job the minute's count sets, registered once: a
/// labelled gauge looked up again each minute made a job name, a key and
/// a registry search for each of them, three times per job.
#[derive(Default)]
struct JobGauges(HashMap<String, Gauges>);

/// One job's gauges.
struct Gauges {
    overdue: metrics::Gauge,
    /// For a job with a `deadline` only.
    late: Option<metrics::Gauge>,
    exhausted: metrics::Gauge,
    /// For a job with `after` only: its waiting and its ready periods.
    waiting: Option<(metrics::Gauge, metrics::Gauge)>,
}

impl JobGauges {
    /// The gauges of `job`; a reload that gives it a deadline adds its
    /// late gauge.
    fn of(&mut self, job: &Job) -> &Gauges {
        let gauges = self.0.entry(job.name.clone()).or_insert_with(|| Gauges {
            overdue: metrics::gauge!("scheduler_overdue_periods", "job" => job.name.clone()),
            late: None,
            waiting: None,
            exhausted: metrics::gauge!(
                "scheduler_retries_exhausted_periods",
                "job" => job.name.clone()
            ),
        });
        if job.deadline.is_some() && gauges.late.is_none() {
            gauges.late = Some(metrics::gauge!(
                "scheduler_late_periods",
                "job" => job.name.clone()
            ));
        }
        if job.after.any() && gauges.waiting.is_none() {
            gauges.waiting = Some((
                metrics::gauge!("scheduler_waiting_periods", "job" => job.name.clone()),
                metrics::gauge!("scheduler_ready_periods", "job" => job.name.clone()),
            ));
        }
        gauges
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::StoppedClock;
    use chrono::TimeZone;

    /// The periods one job's loop dispatches between `from` and `to`, the
    /// loop woken at each next fire by a stopped clock: no sleeping.
    async fn drive(job: &str, from: DateTime<Utc>, to: DateTime<Utc>) -> Vec<Due> {
        let dir = tempfile::tempdir().expect("a temp dir");
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let store = Store::connect(&url).await.expect("a SQLite store");
        let engine = Engine::new(store, Duration::from_secs(30), "t".into()).expect("an engine");
        let path = std::path::Path::new("jobs.toml");
        let config = Config::parse(path, job, &|_| None).expect("a valid job");
        let clock = Arc::new(StoppedClock::at(from));
        let (_down, shutdown) = watch::channel(false);
        let mut service =
            Service::on(path.into(), config, engine, shutdown).with_clock(clock.clone());
        let mut dispatched = Vec::new();
        loop {
            let sleep = service.sleep_for(Duration::MAX);
            clock.advance(TimeDelta::from_std(sleep).expect("a short sleep"));
            if clock.now() >= to {
                return dispatched;
            }
            service.fire();
            dispatched.extend(service.pending.drain(..).map(|(_, due)| due));
        }
    }

    #[tokio::test]
    async fn a_day_of_fires_across_both_dst_changes_is_driven_without_sleeping() {
        let job = "[[job]]\nname = \"hourly\"\nschedule = \"0 * * * *\"\ntimezone = \"Europe/Berlin\"\ncommand = [\"true\"]\n";
        let second = TimeDelta::seconds(1);
        // 29 March 2026 in Berlin, midnight to midnight: 23 hours.
        let spring = Utc.with_ymd_and_hms(2026, 3, 28, 23, 0, 0).unwrap();
        let fires = drive(job, spring - second, spring + TimeDelta::hours(23)).await;
        let at: Vec<DateTime<Utc>> = fires.iter().map(|d| d.fire).collect();
        let hourly: Vec<DateTime<Utc>> = (0..23).map(|h| spring + TimeDelta::hours(h)).collect();
        assert_eq!(at, hourly);
        let labels: HashSet<&str> = fires.iter().map(|d| d.period.label.as_str()).collect();
        assert_eq!(labels.len(), 23, "{labels:?}");
        assert!(fires.iter().all(|d| d.trigger == Trigger::Schedule));
        // 25 October 2026: 25 hours, 02:00 to 03:00 twice. The repeated
        // 02:00 fires once (`repeat = "first"`, the default) ...
        let autumn = Utc.with_ymd_and_hms(2026, 10, 24, 22, 0, 0).unwrap();
        let day = (autumn - second, autumn + TimeDelta::hours(25));
        let fires = drive(job, day.0, day.1).await;
        let at: Vec<DateTime<Utc>> = fires.iter().map(|d| d.fire).collect();
        let second_pass = autumn + TimeDelta::hours(3);
        let hourly: Vec<DateTime<Utc>> = (0..25)
            .map(|h| autumn + TimeDelta::hours(h))
            .filter(|at| *at != second_pass)
            .collect();
        assert_eq!(at, hourly);
        // ... or twice with `repeat = "both"`, both fires in one `hour`
        // period that spans both passes: one key, claimed once.
        let both = job.replace(
            "command",
            "period = \"hour\"\ndst = { repeat = \"both\" }\ncommand",
        );
        let fires = drive(&both, day.0, day.1).await;
        assert_eq!(fires.len(), 25);
        let labels: HashSet<&str> = fires.iter().map(|d| d.period.label.as_str()).collect();
        assert_eq!(labels.len(), 24, "{labels:?}");
    }

    #[tokio::test]
    async fn a_weekend_moved_to_monday_fires_all_its_periods_then_and_a_holiday_the_day_after() {
        let job = "[[calendar]]\nname = \"business\"\nholidays = [\"2027-01-12\"]\n\n\
            [[job]]\nname = \"daily\"\nschedule = \"0 6 * * *\"\nperiod = \"day\"\n\
            timezone = \"Europe/Berlin\"\ncalendar = \"business\"\non_day_off = \"next\"\n\
            command = [\"true\"]\n";
        // Friday 8 January 2027 to Thursday 14th, Tuesday 12th a holiday.
        let from = Utc.with_ymd_and_hms(2027, 1, 7, 23, 0, 0).unwrap();
        let fires = drive(job, from, from + TimeDelta::days(6)).await;
        let seen: Vec<(String, String, Trigger)> = fires
            .iter()
            .map(|d| {
                (
                    crate::period::utc_text(d.fire),
                    d.period.label.clone(),
                    d.trigger,
                )
            })
            .collect();
        let at = |fire: &str, label: &str| (fire.to_owned(), label.to_owned(), Trigger::Schedule);
        assert_eq!(
            seen,
            [
                at("2027-01-08T05:00:00Z", "2027-01-08"),
                at("2027-01-11T05:00:00Z", "2027-01-09"),
                at("2027-01-11T05:00:00Z", "2027-01-10"),
                at("2027-01-11T05:00:00Z", "2027-01-11"),
                at("2027-01-13T05:00:00Z", "2027-01-12"),
                at("2027-01-13T05:00:00Z", "2027-01-13"),
            ]
        );
    }

    /// A reload that makes a period due earlier than it was, at an instant
    /// already past, still fires it (the review found it lost: the timer
    /// went on from where it had fired other jobs up to).
    #[tokio::test]
    async fn a_reload_that_makes_a_period_due_earlier_still_fires_it() {
        let text = |jitter: &str| {
            format!(
                "[[job]]\nname = \"h\"\nschedule = \"*/5 * * * * *\"\njitter = \"{jitter}\"\ncommand = [\"true\"]\n\n\
                 [[job]]\nname = \"k\"\nschedule = \"*/5 * * * * *\"\ncommand = [\"true\"]\n"
            )
        };
        let path = std::path::Path::new("jobs.toml");
        let config = Config::parse(path, &text("1h"), &|_| None).expect("valid jobs");
        // A fire of `h` delayed three seconds or more.
        let start = Utc.with_ymd_and_hms(2027, 1, 4, 10, 0, 0).unwrap();
        let p = (0..100)
            .map(|n| start + TimeDelta::seconds(5 * n))
            .find(|p| config.jobs[0].timing().jitter(*p) >= TimeDelta::seconds(3))
            .expect("a fire delayed 3 s");
        let dir = tempfile::tempdir().expect("a temp dir");
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let store = Store::connect(&url).await.expect("a SQLite store");
        let engine = Engine::new(store, Duration::from_secs(30), "t".into()).expect("an engine");
        let clock = Arc::new(StoppedClock::at(p - TimeDelta::seconds(1)));
        let (_down, shutdown) = watch::channel(false);
        let mut service =
            Service::on(path.into(), config, engine, shutdown).with_clock(clock.clone());
        let mut fired = Vec::new();
        let mut step = |service: &mut Service, millis: i64| {
            clock.advance(TimeDelta::milliseconds(millis));
            service.fire();
            fired.extend(
                service
                    .pending
                    .drain(..)
                    .map(|(job, due)| format!("{}:{}", job.name, due.period.label)),
            );
        };
        // `k` fires at P; `h`'s P is due three seconds or more later ...
        step(&mut service, 1_000);
        step(&mut service, 2_800);
        // ... when a reload takes its jitter down to nothing: now past.
        let reloaded = Config::parse(path, &text("1s"), &|_| None).expect("valid jobs");
        service.replace_jobs(shared(reloaded.jobs));
        step(&mut service, 100);
        let label = crate::period::utc_text(p);
        assert!(fired.contains(&format!("h:{label}")), "{fired:?}");
        assert!(fired.contains(&format!("k:{label}")), "{fired:?}");
    }

    /// A reload that gives back a day its calendar took (a holiday
    /// removed) fires only what the job owes since it was first seen: the
    /// latest fire within `catch_up` of that sighting and the ones after,
    /// never the day's earlier fires (issue 39: 36 periods ran at once, 35
    /// of them from before the job existed).
    #[tokio::test]
    async fn a_reload_that_gives_a_day_back_runs_nothing_from_before_the_job_was_first_seen() {
        let text = |holidays: &str| {
            format!(
                "[scheduler]\ncatch_up = \"3h\"\n\n[[calendar]]\nname = \"c\"\nholidays = [{holidays}]\n\n\
                 [[job]]\nname = \"k\"\nschedule = \"*/5 * * * *\"\ncalendar = \"c\"\n\
                 on_day_off = \"skip\"\ncommand = [\"true\"]\n"
            )
        };
        let path = std::path::Path::new("jobs.toml");
        // Monday 4 January 2027, a holiday when the job is first seen.
        let config = Config::parse(path, &text("\"2027-01-04\""), &|_| None).expect("valid jobs");
        let seen = Utc.with_ymd_and_hms(2027, 1, 4, 16, 17, 0).unwrap();
        let dir = tempfile::tempdir().expect("a temp dir");
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let store = Store::connect(&url).await.expect("a SQLite store");
        let engine = Engine::new(store, Duration::from_secs(30), "t".into()).expect("an engine");
        let clock = Arc::new(StoppedClock::at(seen));
        let (_down, shutdown) = watch::channel(false);
        let mut service =
            Service::on(path.into(), config, engine, shutdown).with_clock(clock.clone());
        // Seen on a holiday: its latest fire (Friday's) is older than
        // catch_up, so it owes its fires from the sighting, fixed there.
        let owed = service.jobs[0].owed_since(seen);
        assert_eq!(owed, seen);
        service.owed.insert("k".into(), owed);
        clock.advance(TimeDelta::seconds(5));
        service.fire();
        assert!(service.pending.is_empty(), "a holiday fired");
        // The holiday is taken back out five seconds after the sighting.
        let reloaded = Config::parse(path, &text(""), &|_| None).expect("valid jobs");
        service.replace_jobs(shared(reloaded.jobs));
        clock.advance(TimeDelta::seconds(1));
        service.fire();
        let fired = |service: &mut Service| -> Vec<String> {
            service
                .pending
                .drain(..)
                .map(|(job, due)| format!("{}:{}", job.name, due.period.label))
                .collect()
        };
        // The day's fires before the sighting, 16:15 included, were not
        // fires when it was seen: none runs.
        assert_eq!(fired(&mut service), Vec::<String>::new());
        // The next one does, at its time.
        clock.advance(TimeDelta::minutes(3));
        service.fire();
        assert_eq!(fired(&mut service), ["k:2027-01-04T16:20:00Z"]);
    }

    #[tokio::test]
    async fn a_recovery_that_finds_no_free_slot_waits_as_a_recovery() {
        let dir = tempfile::tempdir().expect("a temp dir");
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let store = Store::connect(&url).await.expect("a SQLite store");
        store.migrate().await.expect("migrated");
        let engine =
            Engine::new(store, Duration::from_secs(30), "test".to_owned()).expect("an engine");
        let text = "[[job]]\nname = \"j\"\nschedule = \"* * * * *\"\ncommand = [\"true\"]\n";
        let mut config =
            Config::parse(std::path::Path::new("jobs.toml"), text, &|_| None).expect("a valid job");
        let job = Arc::new(config.jobs.remove(0));
        let now = Utc::now();
        let dues = due(&job, now, now - TimeDelta::minutes(3), true);
        // The latest period runs, and its claim holds the job's one slot ...
        let latest = dues.last().expect("a latest fire").clone();
        let won = engine
            .claim(&[Ask::scheduled(job.clone(), latest)])
            .await
            .expect("a claim");
        assert!(matches!(won[0], Taken::Won(_)));
        // ... when an older period comes back as a recovery.
        let recovery = Due {
            trigger: Trigger::Recovery,
            ..dues[0].clone()
        };
        let (events, mut received) = mpsc::unbounded_channel();
        let (_stop, stop_now) = watch::channel(false);
        let batch = Batch {
            engine,
            units: vec![vec![Ask::scheduled(job, recovery)]],
            slots: vec![FreeOnDrop(events.clone())],
            stop_now,
            events,
        };
        batch.go().await;
        loop {
            match received.recv().await.expect("an event") {
                Event::Again(name, due) => {
                    assert_eq!(name, "j");
                    assert_eq!(due.trigger, Trigger::Recovery);
                    break;
                }
                Event::Free => {}
                _ => panic!("neither waiting nor a freed slot"),
            }
        }
    }
}
