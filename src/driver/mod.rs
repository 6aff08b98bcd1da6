//! The driver: the scheduling loop every long-running front end drives
//! (`scheduler serve`, the library's [`crate::Scheduler::start`]). One loop
//! sleeps until the earliest next fire of any job, hands each wake-up's
//! fires to the engine as one batch, and beside it a regular scan finds
//! expired, released and retryable claims to take over. Shutdown and
//! reload are inputs to the loop. It knows no HTTP: a front end serves
//! beside it ([`Companion`]) and reports its [`Health`].
//!
//! By concern: this file holds [`Service`] and its event loop; `timer` every
//! job's next fire (pure); `slots` the `max_running` slots, the periods
//! waiting for a `concurrency` slot, those being claimed and the batches of
//! claims; `backlog` the fires waiting for a `max_running` slot; `scan` the
//! regular scan; `catch_up` what was missed while nothing ran and
//! what a paused job skipped; `reload` jobs.toml read again; `gauges` the
//! per-job gauges; [`health`] what the probes report.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use chrono::{DateTime, Utc};
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;

use crate::clock::Clock;
use crate::config::{Config, Job, Settings};
use crate::engine::Engine;
use crate::engine::due::{Due, OverdueCount};
use crate::error::{Error, Outcome};
use crate::store::Store;
use crate::template::Secrets;

mod backlog;
mod catch_up;
mod gauges;
pub mod health;
mod reload;
mod scan;
mod slots;
mod timer;
use gauges::{GAUGES_EVERY, JobGauges};
use health::Health;
use scan::Scanned;
use timer::Timer;

/// The longest sleep: tokio's timer follows the monotonic clock, so a step
/// of the wall clock (NTP, suspend) is noticed at the next wake-up.
const MAX_SLEEP: Duration = Duration::from_secs(30);

/// What the loop hears from the tasks it started: scans, batches of
/// claims, runs, and the pauses said through its engine.
enum Event {
    /// A scan ended.
    Scanned(Box<Scanned>),
    /// No concurrency slot (or no database): try again at the next scan,
    /// or, for a slot, when a run of the job ends here.
    Again(Arc<str>, Due),
    /// Claims not decided because another claim of their jobs was under
    /// way: asked for again now, whatever the catch-up window.
    Contended(Vec<(Arc<str>, Due)>),
    /// A run of this job ended here (`true`: it succeeded); its slot is
    /// free.
    Done(String, bool),
    /// A period of this job was answered without a run here and without
    /// waiting (it runs elsewhere, or ran): the next of its periods
    /// waiting here is asked for.
    Answered(Arc<str>),
    /// A run (or an `sql` group) ended; its `max_running` slot is free.
    Free,
    /// The claims of these periods (job, fire) were answered: a newer
    /// period of their jobs may be asked for.
    Asked(Vec<(Arc<Job>, DateTime<Utc>)>),
    /// A job was paused (`true`) or resumed through this engine (the API,
    /// the library): this loop follows at once, other processes at their
    /// next scan.
    Paused(String, bool),
    /// The database's sighting of jobs a reload could not show it; `None`:
    /// it did not answer.
    Sighted(Option<Box<reload::Sighting>>),
}

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

/// A job's periods waiting for a slot or for the database, by fire and
/// period key.
type Waiting = BTreeMap<(DateTime<Utc>, String), Due>;

/// The long-running scheduler: the loop a front end drives
/// ([`Service::serve`]) until shutdown.
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
    /// Jobs a reload brought that the database has not been shown (it did
    /// not answer): none of them runs, as none is known to have been seen,
    /// until a scan's sighting of them is recorded
    /// ([`Service::sight_unsighted`]).
    unsighted: HashSet<Arc<str>>,
    /// A sighting of the unsighted jobs is under way.
    sighting: bool,
    /// From when each job owes its fires, as its first sighting fixed it
    /// ([`crate::engine::due::owed_from`]), whatever finds them (the timer
    /// resumed by a reload, a catch-up, a resume).
    owed: HashMap<Arc<str>, DateTime<Utc>>,
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
    upstream: HashSet<Arc<str>>,
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
    /// Periods waiting for a concurrency slot of their job or for the
    /// database: by job, oldest fire first. A job's new fires queue behind
    /// them, never overtaking.
    waiting: HashMap<Arc<str>, Waiting>,
    /// Periods whose claims were asked for here and are not answered yet:
    /// by job, their fires. A newer period of a job waits for them.
    asking: HashMap<slots::ByName, Vec<DateTime<Utc>>>,
    /// Fires that found all of this process's `max_running` slots taken,
    /// in fire order; each freed slot takes the next.
    backlog: backlog::Backlog,
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
    /// Whether freed heap is handed back after start-up, after a reload
    /// and after each minute's gauges.
    trim: bool,
    /// What time it is: the engine's clock (the system's but in tests).
    clock: Arc<dyn Clock>,
    /// What this loop's `/healthz` and `/readyz` report.
    health: Arc<Health>,
    /// The configuration the deadlines and notifications follow.
    notify: watch::Sender<Arc<Config>>,
}

impl Service {
    /// A service for `config`, read from `path` (re-read on SIGHUP), its
    /// attempts traced by `tracer`.
    pub fn new(
        path: PathBuf,
        config: Config,
        (store, tracer): (Store, crate::trace::Tracer),
        owner: String,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Service, Error> {
        let engine = Engine::new(store, config.settings.lease, owner)?.with_tracer(tracer);
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
        let jobs = config.jobs.clone();
        let (settings, secrets) = (config.settings.clone(), config.secrets.clone());
        let notify = watch::Sender::new(Arc::new(config));
        let clock = engine.clock();
        let now = clock.now();
        Service {
            backlog: backlog::Backlog::new(settings.catch_up),
            path,
            running: 0,
            scanning: false,
            scan_now: false,
            upstream: upstream_jobs(&jobs),
            reruns_since: None,
            swept: None,
            regate: true,
            stop_now: watch::Sender::new(false),
            settings,
            secrets,
            timer: Timer::new(&jobs, now),
            fired_until: now,
            by_name: Index::new(&jobs),
            jobs,
            paused: HashMap::new(),
            unsighted: HashSet::new(),
            sighting: false,
            owed: HashMap::new(),
            engine,
            waiting: HashMap::new(),
            asking: HashMap::new(),
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

    /// The service, and its engine, reading the time from `clock` (a
    /// test's), its timer starting at that clock's now.
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Service {
        let now = clock.now();
        self.timer = Timer::new(&self.jobs, now);
        self.fired_until = now;
        self.engine = self.engine.with_clock(clock.clone());
        self.clock = clock;
        self
    }

    /// Hands the heap that start-up, a reload or a minute's gauges freed
    /// back to the system once each is over (`malloc_trim`; the binary's
    /// choice, not a library's).
    pub fn trimming_memory(mut self) -> Service {
        self.trim = true;
        self
    }

    /// Publishes the overdue and retries-exhausted gauges of every job
    /// (`--listen`), each minute.
    pub fn with_gauges(mut self) -> Service {
        self.gauges = true;
        self
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
        let notifying = self.start().await?;
        self.run_until_shutdown(&mut reload).await;
        self.end_runs().await;
        // Runs asked for over the API end within the same grace; only then
        // has every job ended.
        if let Some(companion) = &self.companion {
            companion.finish_runs().await;
        }
        finish_notifying(notifying).await;
        tracing::info!("all jobs ended");
        Ok(Outcome::Done)
    }

    /// Start-up: claims what was missed while nothing ran, then counts as
    /// ready; the notifications follow the configuration from here (the
    /// task that delivers them is returned).
    async fn start(&mut self) -> Result<JoinHandle<()>, Error> {
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
        Ok(notifying)
    }

    /// The loop, until shutdown: sleeps until the next fire, the next scan
    /// or an input (a reload, an event, a pause), then dispatches what is
    /// due, starts the scan and the gauges' count when their time came,
    /// and hands what was dispatched to the engine.
    async fn run_until_shutdown(&mut self, reload: &mut mpsc::UnboundedReceiver<()>) {
        let mut next_scan = Instant::now();
        let mut next_gauges = Instant::now();
        let mut pauses = self.engine.pauses();
        loop {
            let sleep = self.sleep_for(next_scan.saturating_duration_since(Instant::now()));
            let mut shutdown = self.shutdown.clone();
            tokio::select! {
                () = tokio::time::sleep(sleep) => {}
                () = down(&mut shutdown) => return,
                Some(()) = reload.recv() => self.reload().await,
                Some(event) = self.events.1.recv() => self.handle(event),
                Some((job, paused)) = said(&mut pauses) => self.handle(Event::Paused(job, paused)),
            }
            metrics::counter!("scheduler_wakeups_total").increment(1);
            self.health.loop_alive();
            self.fire();
            let at = Instant::now();
            if at >= next_scan || (self.scan_now && !self.scanning) {
                self.sight_unsighted();
                self.scan();
                next_scan = at + self.settings.scan_interval;
            }
            if self.gauges && at >= next_gauges {
                self.publish_gauges();
                next_gauges = at + GAUGES_EVERY;
            }
            self.flush();
        }
    }

    /// After shutdown: nothing that waits starts; the running jobs get the
    /// grace, past which they are stopped and their claims released, and
    /// are waited for.
    async fn end_runs(&mut self) {
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
                        self.slot_freed();
                    }
                }
            }
        }
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
    /// flush, as far as [`Service::admits`] it. A fire of a job with
    /// periods waiting for a slot queues behind them, and the oldest of
    /// them is asked for in its place: a newer period never takes the slot
    /// an older one waits for (two replicas' every-second fires starved a
    /// period that found the slot taken, until the scan found it free).
    fn fire(&mut self) {
        let now = self.clock.now();
        let mut pending = std::mem::take(&mut self.pending);
        let dispatched = pending.len();
        self.timer.pop_due(&self.jobs, now, &mut pending);
        let mut behind = Vec::new();
        let mut at = 0;
        pending.retain(|(job, due)| {
            at += 1;
            if at <= dispatched {
                return true;
            }
            // A fire from before the job owes its fires (the timer started
            // before start-up sighted the job) is no period of the job's,
            // as every view has it (adversarial review).
            if self.owed_since(job).is_some_and(|owed| due.fire < owed) {
                return false;
            }
            if self.unsighted.contains(&job.name) || !self.admits(job, due, now) {
                return false;
            }
            if self.waiting.contains_key(&*job.name) {
                behind.push((job.name.clone(), due.clone()));
                return false;
            }
            true
        });
        self.pending = pending;
        self.fired_until = now;
        let mut asked = HashSet::new();
        for (name, due) in behind {
            self.wait(name.clone(), due);
            if asked.insert(name.clone()) {
                self.release_waiting(&name, 1);
            }
        }
    }

    fn job(&self, name: &str) -> Option<Arc<Job>> {
        let i = self.by_name.find(&self.jobs, name)?;
        Some(self.jobs[i].clone())
    }

    fn handle(&mut self, event: Event) {
        match event {
            Event::Scanned(scanned) => self.scanned(*scanned),
            Event::Sighted(sighting) => {
                self.sighting = false;
                if let Some(sighting) = sighting {
                    self.sighted(*sighting);
                }
            }
            // An answer that comes after a reload changed the job's timing
            // may be of a period the job no longer has: it goes.
            Event::Again(name, due) => {
                if self
                    .job(&name)
                    .is_some_and(|job| slots::still_timed(&job, &due))
                {
                    self.wait(name, due);
                }
            }
            Event::Contended(asks) => {
                for (name, due) in asks {
                    if let Some(job) = self.job(&name)
                        && !*self.shutdown.borrow()
                        && !self.paused.contains_key(&*name)
                        && slots::still_timed(&job, &due)
                    {
                        // Ahead of the fires queued since, its job's newer
                        // ones among them.
                        self.backlog.push_ahead((job, due));
                    }
                }
            }
            // A slot of this job freed here: its oldest waiting period goes next.
            Event::Done(name, succeeded) => {
                // A success of a job others wait for: the scan that claims
                // what waited on it runs now, not at its interval.
                if succeeded && self.upstream.contains(&*name) {
                    self.scan_now = true;
                }
                self.release_waiting(&name, 1);
            }
            Event::Answered(name) => self.release_waiting(&name, 1),
            Event::Free => self.slot_freed(),
            Event::Asked(asked) => self.answered(asked),
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
}

/// The jobs whose periods other jobs (or, by naming themselves, they
/// themselves) wait for.
fn upstream_jobs(jobs: &[Arc<Job>]) -> HashSet<Arc<str>> {
    let mut upstream = HashSet::new();
    for job in jobs {
        upstream.extend(job.after.upstream.iter().map(|up| up.job.as_str().into()));
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
            .binary_search_by(|i| jobs[*i].name.as_ref().cmp(name))
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

/// Waits for the notifications' task to end at shutdown: a delivery under
/// way is finished and its outcome written, so the next replica does not
/// send it again; a bounded wait.
async fn finish_notifying(notifying: JoinHandle<()>) {
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
}

/// Hands freed heap back to the system once start-up is over: parsing a
/// large jobs.toml leaves tens of MB that glibc would otherwise keep for the
/// life of the process (10,000 jobs: 36 MB resident for 9.5 MB live).
pub(super) fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages; no live allocation moves.
    unsafe {
        libc::malloc_trim(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::StoppedClock;
    use crate::store::Trigger;
    use chrono::{TimeDelta, TimeZone};

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
}
