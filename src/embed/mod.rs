//! The scheduler as a library: period-keyed jobs as async functions inside
//! a service, on the service's own database, driven by the same engine as
//! `scheduler serve` and `scheduler run` (claims, leases, self-fencing,
//! catch-up, retries, backfill, shutdown).
//!
//! The smallest program (docs/embedding.md):
//!
//! ```no_run
//! use scheduler::{CodeJob, Scheduler, Unit};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), scheduler::Error> {
//!     let scheduler = Scheduler::builder()
//!         .database_url("sqlite://app.db")
//!         .job(CodeJob::new("report", "0 * * * *").period(Unit::Hour).handler(|cx| async move {
//!             println!("the report of {}", cx.label()); // 2026-07-15T14
//!             Ok(())
//!         }))
//!         .build()
//!         .await?;
//!     let handle = scheduler.start(async { let _ = tokio::signal::ctrl_c().await; });
//!     handle.stopped().await
//! }
//! ```
//!
//! Nothing process-wide happens unless asked for: no signal handler, no
//! global tracing subscriber (the scheduler logs through `tracing`, a span
//! per run carrying `job`, `period_key` and `attempt`), no `malloc_trim`,
//! no reaping of orphans (`Builder::reap_orphans`, with `process-actions`). Metrics go to the
//! `metrics` recorder the application installed, if any.

mod read;
mod runs;

pub use read::PERIODS_LIMIT;
use runs::Gathered;
pub use runs::{PeriodRun, RunOptions};

use std::future::Future;
#[cfg(any(feature = "config-file", feature = "process-actions"))]
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use chrono_tz::Tz;
use tokio::sync::{mpsc, watch};

use crate::config::code::CodeJob;
use crate::config::{Config, ConfigError, Settings};
use crate::driver::Service;
use crate::engine::manual::{self, Names, Selection};
#[cfg(feature = "process-actions")]
use crate::engine::supervision as supervisor;
use crate::engine::{Engine, operate};
use crate::error::Error;
use crate::store::{DatabaseUrl, Store};

/// Where the scheduler's tables are.
enum Database {
    Url(String),
    #[cfg(feature = "postgres")]
    Postgres(sqlx::PgPool),
    #[cfg(feature = "sqlite")]
    Sqlite(sqlx::SqlitePool),
}

/// Builds a [`Scheduler`]: its database, its jobs (from `jobs.toml`, from
/// code, or both) and its settings.
#[must_use]
pub struct Builder {
    database: Option<Database>,
    #[cfg(feature = "config-file")]
    config_file: Option<PathBuf>,
    jobs: Vec<CodeJob>,
    timezone: Option<Tz>,
    lease: Option<Duration>,
    catch_up: Option<Duration>,
    shutdown_grace: Option<Duration>,
    max_running: Option<usize>,
    scan_interval: Option<Duration>,
    namespace: Option<String>,
    #[cfg(feature = "process-actions")]
    supervisor: Option<PathBuf>,
    #[cfg(feature = "process-actions")]
    reap_orphans: bool,
    #[cfg(feature = "otel")]
    traces: bool,
    owner: Option<String>,
    clock: Option<Arc<dyn crate::clock::Clock>>,
}

/// A scheduler, built; [`Scheduler::start`] serves its schedules, the
/// `run_*` calls run periods by hand. Cloning shares it.
#[derive(Clone)]
pub struct Scheduler {
    config: Arc<Config>,
    engine: Engine,
}

/// A started scheduler: [`Handle::stopped`] waits for its end. Dropped,
/// the scheduler serves on until its `shutdown` future resolves.
#[must_use = "a dropped handle cannot stop the scheduler or wait for its end"]
pub struct Handle {
    stop: Arc<watch::Sender<bool>>,
    task: tokio::task::JoinHandle<Result<crate::error::Outcome, Error>>,
}

impl Scheduler {
    /// A builder with nothing set.
    pub fn builder() -> Builder {
        Builder {
            database: None,
            #[cfg(feature = "config-file")]
            config_file: None,
            jobs: Vec::new(),
            timezone: None,
            lease: None,
            catch_up: None,
            shutdown_grace: None,
            max_running: None,
            scan_interval: None,
            namespace: None,
            #[cfg(feature = "process-actions")]
            supervisor: None,
            #[cfg(feature = "process-actions")]
            reap_orphans: false,
            #[cfg(feature = "otel")]
            traces: false,
            owner: None,
            clock: None,
        }
    }

    /// Serves every job's schedule, as `scheduler serve` does, until
    /// `shutdown` resolves (or [`Handle::shutdown`]): then no new claims;
    /// running handlers get `shutdown_grace` to end, after which their
    /// tokens are cancelled, their futures dropped and their claims
    /// released (no retry spent). Must be called inside a tokio runtime.
    pub fn start(&self, shutdown: impl Future<Output = ()> + Send + 'static) -> Handle {
        let (stop, stopping) = watch::channel(false);
        let stop = Arc::new(stop);
        let on_signal = stop.clone();
        tokio::spawn(async move {
            tokio::select! {
                () = shutdown => {
                    tracing::info!("shutting down: no new claims");
                    on_signal.send_replace(true);
                }
                () = on_signal.closed() => {}
            }
        });
        let service = Service::on(
            self.config.path.clone(),
            (*self.config).clone(),
            self.engine.clone(),
            stopping,
        );
        // No reload: the jobs are the program's.
        let (_, no_reload) = mpsc::unbounded_channel();
        let tracer = self.engine.tracer().clone();
        let task = tokio::spawn(async move {
            let served = service.serve(no_reload).await;
            tracer.shutdown().await;
            served
        });
        Handle { stop, task }
    }

    /// Runs what is due of `job` (every job with `None`), as `scheduler run
    /// [JOB]` does: the periods `serve` would take now.
    pub async fn run_due(&self, job: Option<&str>) -> Result<Vec<PeriodRun>, Error> {
        self.ask(job, Selection::Due, RunOptions::default()).await
    }

    /// Runs one period of `job` by its label (`2026-07`), as `scheduler run
    /// JOB --period LABEL` does.
    pub async fn run_period(
        &self,
        job: &str,
        label: &str,
        options: RunOptions,
    ) -> Result<Vec<PeriodRun>, Error> {
        self.ask(Some(job), Selection::Period(label.into()), options)
            .await
    }

    /// Runs the periods of `job` from label `from` to `to`, both included,
    /// oldest first, as `scheduler run JOB --from FROM --to TO` does.
    pub async fn run_range(
        &self,
        job: &str,
        from: &str,
        to: &str,
        options: RunOptions,
    ) -> Result<Vec<PeriodRun>, Error> {
        self.ask(Some(job), Selection::Range(from.into(), to.into()), options)
            .await
    }

    async fn ask(
        &self,
        job: Option<&str>,
        periods: Selection,
        options: RunOptions,
    ) -> Result<Vec<PeriodRun>, Error> {
        if let Some(job) = job {
            self.job(job)?;
        }
        let request = manual::Request {
            job: job.map(str::to_owned),
            periods,
            force: options.force,
            only_failed: options.only_failed,
            early: options.early,
            wait: options.wait,
            dry_run: false,
            with_upstream: options.with_upstream,
            shard: options.shard,
            names: Names::CODE,
            by: options.by.unwrap_or_else(|| "library".into()),
        };
        manual::check(&self.config, &request, self.engine.now())?;
        let mut collected = Gathered(Vec::new());
        // Dropping this future stops its runs; their periods are recovered
        // once their leases run out.
        let (_never, shutdown) = watch::channel(false);
        manual::drive(
            &self.config,
            &self.engine,
            &request,
            shutdown,
            &mut collected,
        )
        .await?;
        // As `scheduler run` does: what the run made late, failed for good
        // or recovered is told, whether or not a loop is started.
        self.engine.notify_after_run(&self.config, job).await;
        Ok(collected.0)
    }
}

impl Scheduler {
    /// The job called `name`, or [`Error::UnknownJob`].
    fn job(&self, name: &str) -> Result<&crate::config::Job, Error> {
        self.config.job(name).map_err(|e| Error::UnknownJob {
            job: name.to_owned(),
            message: e.message,
        })
    }

    /// Ends the running attempt of `job`'s period `label`, as `scheduler
    /// release` does: its runner stops it at its next heartbeat and records
    /// nothing; the period is claimable once the runner confirms or its
    /// lease runs out. `false` if nothing was running.
    pub async fn release(&self, job: &str, label: &str) -> Result<bool, Error> {
        let job = self.job(job)?;
        let period = crate::engine::labels::parse_label(job, label, Names::CODE.period)?;
        let (_, released) =
            operate::release(self.engine.store(), job, &period, (None, "shard")).await?;
        Ok(released.is_some())
    }

    /// Records the periods of `job` that `which` names as adopted, as
    /// `scheduler adopt` does: an earlier system ran them, so no replica
    /// runs them and `after` counts them succeeded. Nothing is written if
    /// any of them has a claim ([`operate::Adopted::Claimed`] says which);
    /// a label that is no period of the job, or a period not yet due, is an
    /// [`Error::Usage`].
    pub async fn adopt(
        &self,
        job: &str,
        which: operate::Adoption<'_>,
    ) -> Result<operate::Adopted, Error> {
        let job = self.job(job)?;
        let by = format!("library:{}", self.engine.owner());
        let names = operate::AdoptNames::JSON;
        operate::adopt(
            self.engine.store(),
            job,
            which,
            &by,
            self.engine.now(),
            names,
        )
        .await
    }

    /// Pauses `job` (`true`) or resumes it, for every replica, as `scheduler
    /// pause` and `resume` do.
    pub async fn pause(&self, job: &str, paused: bool) -> Result<(), Error> {
        let job = self.job(job)?;
        self.engine.pause(&job.name, paused).await
    }

    /// Deletes the finished claims of every job with `keep` that are older
    /// than it (periods that fired inside the catch-up window are kept), as
    /// `scheduler prune` does; how many went.
    pub async fn prune(&self) -> Result<u64, Error> {
        let pruned = operate::prune(&self.config, self.engine.store(), false).await?;
        Ok(pruned.jobs.iter().map(|(_, _, n)| n).sum())
    }
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let jobs: Vec<&str> = self.config.jobs.iter().map(|j| j.name.as_ref()).collect();
        f.debug_struct("Scheduler")
            .field("owner", &self.engine.owner())
            .field("jobs", &jobs)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Builder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let jobs: Vec<&str> = self.jobs.iter().map(CodeJob::name).collect();
        let mut builder = f.debug_struct("Builder");
        #[cfg(feature = "config-file")]
        builder.field("config_file", &self.config_file);
        builder
            .field("jobs", &jobs)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Handle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Handle")
            .field("stopping", &*self.stop.borrow())
            .field("stopped", &self.task.is_finished())
            .finish()
    }
}

impl Handle {
    /// Starts the shutdown now, as the `shutdown` future would. Manual
    /// runs (`run_period`, …) under way are not stopped by it: they end
    /// when their periods do, or when their futures are dropped.
    pub fn shutdown(&self) {
        self.stop.send_replace(true);
    }

    /// Waits until the scheduler has shut down and every run ended.
    pub async fn stopped(self) -> Result<(), Error> {
        match self.task.await {
            Ok(result) => result.map(|_| ()),
            Err(e) => Err(Error::Environment(e.into())),
        }
    }
}

impl Builder {
    /// The database: `sqlite://FILE` (created if missing; a relative path
    /// from the working directory) or `postgres://…`.
    pub fn database_url(mut self, url: impl Into<String>) -> Builder {
        self.database = Some(Database::Url(url.into()));
        self
    }

    /// The application's PostgreSQL pool. Transaction-scoped handlers and
    /// heartbeats take connections from it: size it for `max_running`
    /// and a few more.
    #[cfg(feature = "postgres")]
    pub fn postgres_pool(mut self, pool: sqlx::PgPool) -> Builder {
        self.database = Some(Database::Postgres(pool));
        self
    }

    /// The application's SQLite pool (WAL and `synchronous = FULL`
    /// recommended: an acknowledged claim then survives a power cut).
    #[cfg(feature = "sqlite")]
    pub fn sqlite_pool(mut self, pool: sqlx::SqlitePool) -> Builder {
        self.database = Some(Database::Sqlite(pool));
        self
    }

    /// Jobs and `[scheduler]` settings from a `jobs.toml`, beside those
    /// given in code (which take precedence for settings). Its
    /// `database_url` is used if no database is given here. (With the
    /// `config-file` feature.)
    #[cfg(feature = "config-file")]
    pub fn config_file(mut self, path: impl Into<PathBuf>) -> Builder {
        self.config_file = Some(path.into());
        self
    }

    /// A job declared in code.
    pub fn job(mut self, job: CodeJob) -> Builder {
        self.jobs.push(job);
        self
    }

    /// The zone of schedules that name none (default UTC).
    pub fn timezone(mut self, zone: Tz) -> Builder {
        self.timezone = Some(zone);
        self
    }

    /// How long a claim stays valid without a heartbeat (default 60 s, at
    /// least 1 s).
    pub fn lease(mut self, lease: Duration) -> Builder {
        self.lease = Some(lease);
        self
    }

    /// How far back missed periods are looked for (default 24 h).
    pub fn catch_up(mut self, window: Duration) -> Builder {
        self.catch_up = Some(window);
        self
    }

    /// How long shutdown waits for running handlers (default 30 s).
    pub fn shutdown_grace(mut self, grace: Duration) -> Builder {
        self.shutdown_grace = Some(grace);
        self
    }

    /// Runs at once in this scheduler (default 16).
    pub fn max_running(mut self, n: usize) -> Builder {
        self.max_running = Some(n);
        self
    }

    /// How often missed, retryable and expired claims are looked for
    /// (default 5 s, at least 100 ms).
    pub fn scan_interval(mut self, interval: Duration) -> Builder {
        self.scan_interval = Some(interval);
        self
    }

    /// The prefix (`staging`) of every job's name in the database, so
    /// several deployments share one database.
    pub fn namespace(mut self, namespace: impl Into<String>) -> Builder {
        self.namespace = Some(namespace.into());
        self
    }

    /// The `scheduler-supervise` binary that `command` and `shell` jobs of
    /// a `jobs.toml` are started through (looked for beside the program
    /// and on `PATH` otherwise). (With the `process-actions` feature.)
    #[cfg(feature = "process-actions")]
    pub fn supervisor(mut self, path: impl Into<PathBuf>) -> Builder {
        self.supervisor = Some(path.into());
        self
    }

    /// Makes this process a child subreaper that reaps orphaned processes,
    /// as `scheduler serve` does: only for a program that starts no child
    /// processes of its own, whose exit statuses it would take. (With the
    /// `process-actions` feature.)
    #[cfg(feature = "process-actions")]
    pub fn reap_orphans(mut self, reap: bool) -> Builder {
        self.reap_orphans = reap;
        self
    }

    /// Traces every attempt over OTLP/HTTP as the OpenTelemetry
    /// environment variables say (`OTEL_EXPORTER_OTLP_ENDPOINT`, …), as
    /// `scheduler` does; a bad value fails [`Builder::build`] naming it.
    /// Off by default: a service's own exporter is its own. (With the
    /// `otel` feature.)
    #[cfg(feature = "otel")]
    pub fn traces_from_env(mut self, on: bool) -> Builder {
        self.traces = on;
        self
    }

    /// Who this scheduler claims as (default: host, process id and a
    /// stamp, unique per scheduler).
    pub fn owner(mut self, owner: impl Into<String>) -> Builder {
        self.owner = Some(owner.into());
        self
    }

    /// What time it is for every decision the scheduler makes on this
    /// host's clock (which periods are due, deadlines, the loop's fires):
    /// the system's clock by default; in a service's own tests a
    /// [`StoppedClock`](crate::clock::StoppedClock) moved by hand, so a
    /// day of periods runs without sleeping. Leases, retries and claims
    /// keep the database's clock.
    pub fn clock(mut self, clock: Arc<dyn crate::clock::Clock>) -> Builder {
        self.clock = Some(clock);
        self
    }

    /// Checks every job and setting by the rules of `jobs.toml`, opens the
    /// database and brings its tables up to date (beside the
    /// application's own sqlx migrations, see docs/embedding.md).
    pub async fn build(self) -> Result<Scheduler, Error> {
        let mut config = self.config()?;
        config.settings.check()?;
        for job in self.jobs {
            let mut job = job.validate(&config.settings)?;
            job.name = config.full_name(&job.name).into();
            if config.jobs.iter().any(|j| j.name == job.name) {
                return Err(Error::Config(ConfigError {
                    place: format!("code job `{}`", job.name),
                    message: format!(
                        "job name `{}` is used twice; job names must be unique",
                        job.name
                    ),
                }));
            }
            config.jobs.push(Arc::new(job));
        }
        config.link_after()?;
        #[cfg(feature = "process-actions")]
        let launcher = launcher(&config, self.supervisor)?;
        let store = open(self.database, &config).await?;
        if !store.is_postgres() {
            config.check_for_sqlite()?;
        }
        store.migrate().await?;
        #[cfg(feature = "process-actions")]
        if self.reap_orphans {
            crate::engine::supervision::reaper::start();
        }
        let owner = self.owner.unwrap_or_else(unique_owner);
        let mut engine = Engine::new(store, config.settings.lease, owner)?;
        #[cfg(feature = "process-actions")]
        {
            engine = engine.supervised_by(launcher);
        }
        if let Some(clock) = self.clock {
            engine = engine.with_clock(clock);
        }
        #[cfg(feature = "otel")]
        if self.traces {
            engine = engine.with_tracer(crate::trace::Tracer::from_env()?);
        }
        Ok(Scheduler {
            config: Arc::new(config),
            engine,
        })
    }

    /// The file's configuration, with `adjust` applied to its settings,
    /// if a file was given.
    #[cfg(feature = "config-file")]
    fn file(&self, adjust: &dyn Fn(&mut Settings)) -> Result<Option<Config>, Error> {
        match &self.config_file {
            Some(path) => Ok(Some(Config::load_adjusted(path, adjust)?)),
            None => Ok(None),
        }
    }

    /// No file: a build without `config-file` reads none.
    #[cfg(not(feature = "config-file"))]
    fn file(&self, _adjust: &dyn Fn(&mut Settings)) -> Result<Option<Config>, Error> {
        Ok(None)
    }

    /// The configuration: the file's (if any) with the settings given in
    /// code, and the namespace given once.
    fn config(&self) -> Result<Config, Error> {
        // Settings given in code apply before any job is checked, the
        // file's jobs included (their zone, `keep` against `catch_up`).
        let adjust = |settings: &mut Settings| {
            if let Some(zone) = self.timezone {
                settings.timezone = zone;
            }
            let overrides = [
                (&mut settings.lease, self.lease),
                (&mut settings.catch_up, self.catch_up),
                (&mut settings.shutdown_grace, self.shutdown_grace),
                (&mut settings.scan_interval, self.scan_interval),
            ];
            for (setting, given) in overrides {
                if let Some(given) = given {
                    *setting = given;
                }
            }
            if let Some(n) = self.max_running {
                settings.max_running = n;
            }
        };
        let mut config = self.file(&adjust)?.unwrap_or_else(|| {
            let mut settings = Settings::defaults();
            adjust(&mut settings);
            Config::in_code(settings)
        });
        let settings = &mut config.settings;
        match (&settings.namespace, &self.namespace) {
            (Some(file), Some(code)) if file != code => {
                return Err(Error::Config(ConfigError {
                    place: config.path.display().to_string(),
                    message: format!(
                        "namespace `{code}` is given in code, but the file says `{file}`: say it once"
                    ),
                }));
            }
            (None, Some(code)) => {
                settings.namespace = Some(code.clone());
                config.put_in_namespace(code);
            }
            _ => {}
        }
        Ok(config)
    }
}

/// The database the builder was given, opened and ready for migrating:
/// a pool, a URL, or the configuration file's `database_url`.
async fn open(database: Option<Database>, config: &Config) -> Result<Store, Error> {
    Ok(match database {
        #[cfg(feature = "postgres")]
        Some(Database::Postgres(pool)) => Store::from_postgres_pool(pool),
        #[cfg(feature = "sqlite")]
        Some(Database::Sqlite(pool)) => Store::from_sqlite_pool(pool),
        Some(Database::Url(url)) => {
            let cwd = std::env::current_dir().map_err(|e| Error::Environment(e.into()))?;
            let url = DatabaseUrl::parse(&url, &cwd).map_err(|message| {
                Error::Config(ConfigError {
                    place: "database URL".into(),
                    message,
                })
            })?;
            Store::open(&url, true).await?
        }
        None => match &config.settings.database_url {
            Some(url) => Store::open(url, true).await?,
            None => {
                // The pools this build can take.
                let pools = [
                    cfg!(feature = "postgres").then_some("`.postgres_pool(…)`"),
                    cfg!(feature = "sqlite").then_some("`.sqlite_pool(…)`"),
                ];
                let pools: Vec<&str> = pools.into_iter().flatten().collect();
                return Err(Error::Usage(format!(
                    "no database: give one with `.database_url(…)` or {}, or a `database_url` in the configuration file",
                    pools.join(" or ")
                )));
            }
        },
    })
}

/// [`crate::engine::owner_id`], told apart from the other schedulers of
/// this process.
fn unique_owner() -> String {
    static BUILT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = BUILT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    format!("{}-{n}", crate::engine::owner_id())
}

/// How `command` and `shell` jobs are started: through `scheduler-supervise`
/// (this program is not the scheduler binary that could supervise them).
#[cfg(feature = "process-actions")]
fn launcher(config: &Config, given: Option<PathBuf>) -> Result<supervisor::Launcher, Error> {
    let found = given.or_else(supervisor::Launcher::installed);
    let needs = config
        .jobs
        .iter()
        .find(|job| matches!(job.action, crate::config::Action::Process(_)));
    match (found, needs) {
        (Some(program), _) => Ok(supervisor::Launcher::new(program, Vec::new())),
        (None, None) => Ok(supervisor::Launcher::find()),
        (None, Some(job)) => Err(Error::Config(ConfigError {
            place: format!("job `{}`", job.name),
            message: format!(
                "it starts a process, which the library does through the `{}` binary: none is beside this program or on PATH; install it (`cargo install scheduler`) or name it with `.supervisor(path)`",
                supervisor::BINARY
            ),
        })),
    }
}
