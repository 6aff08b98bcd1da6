//! Runs a parsed command line: loads the configuration, opens the database
//! where the command needs it, and dispatches.

use chrono::Utc;
use tokio::sync::{mpsc, watch};

use crate::cli::check;
use crate::cli::inspect;
use crate::cli::plan::Plan;
use crate::cli::run;
use crate::cli::{After, Cli, Command};
use crate::config::{Config, ConfigError};
use crate::driver::Service;
use crate::engine::owner_id;
use crate::error::{Error, Outcome, Unread, say};
use crate::store::{DatabaseUrl, Store};

/// The database when nothing names one: `scheduler.db` next to jobs.toml.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://scheduler.db";

/// Runs `cli`'s command to completion.
pub async fn execute(cli: Cli) -> Result<Outcome, Error> {
    // Completions, the man page and the health probe need no jobs.toml.
    match &cli.command {
        Command::Completions { shell } => return completions(*shell),
        Command::Man => return man(),
        Command::Health { url } => return health(url).await,
        _ => {}
    }
    // `serve` listens for SIGHUP before it reads jobs.toml: one sent once
    // the file is written is never lost to a read that came before it.
    let reload = match cli.command {
        Command::Serve { .. } => Some(reload_signal()?),
        _ => None,
    };
    let (mut config, unset) = load(&cli)?;
    let now = Utc::now();
    // Everything that needs no database is checked, or answered, before
    // one is opened.
    let plan = Plan::of(cli.command, &mut config, &unset, now)?;
    match &plan {
        Plan::Check { strict } => return check_config(&config, &unset, *strict, now),
        Plan::Next { job, count, after } => {
            return next_fires(&config, job, *count, after.as_ref(), now);
        }
        _ => {}
    }
    // A port that is taken is a usage error found before any database is
    // created or migrated.
    let listener = match &plan {
        Plan::Serve { listen: Some(addr) } => Some(crate::serve::server::bind(*addr).await?),
        _ => None,
    };
    // SIGTERM and SIGINT are taken over before the database is opened: one
    // that comes while it connects must not end the process by the default
    // action.
    let shutdown = if plan.runs_actions() {
        shutdown_signal()?
    } else {
        watch::channel(false).1
    };
    // A bad `OTEL_*` value is a mistake to fix before anything runs.
    let tracer = match plan.runs_actions() {
        true => crate::trace::Tracer::from_env()?,
        false => crate::trace::Tracer::off(),
    };
    let (store, applied) = open(&plan, cli.database_url.as_deref(), &mut config).await?;
    let ran = match plan {
        Plan::Run { request, json } => {
            let engine = crate::engine::Engine::new(store, config.settings.lease, owner_id())?
                .with_tracer(tracer.clone());
            run::command(&config, &engine, &request, json, shutdown).await
        }
        Plan::Serve { .. } => {
            let reload = reload.unwrap_or_else(|| mpsc::unbounded_channel().1);
            let store = (store, tracer.clone());
            serve(&cli.config, config, store, (reload, listener, shutdown)).await
        }
        plan => inspect_database(plan, &config, &store, &applied, now)
            .await
            .or_else(Unread::into_result),
    };
    tracer.shutdown().await;
    ran
}

/// The commands that read or change the database without running jobs:
/// `migrate`, `status`, `history`, `release`, `adopt`, `pause`, `resume`,
/// `prune`.
async fn inspect_database(
    plan: Plan,
    config: &Config,
    store: &Store,
    applied: &[String],
    now: chrono::DateTime<Utc>,
) -> Result<Outcome, Unread> {
    match plan {
        Plan::Migrate => migrated(applied),
        Plan::Range { job, periods, json } => {
            inspect::range(config.job(&job)?, store, &periods, json, now).await
        }
        Plan::Status { job, json } => {
            inspect::status(config, store, job.as_deref(), json, now).await
        }
        Plan::History { job, period, shown } => {
            let defined = config.find(&job).ok();
            let period = period.as_ref().map(|(key, period)| (key.as_str(), period));
            inspect::history(store, &config.full_name(&job), defined, period, shown).await
        }
        Plan::Logs {
            job,
            period,
            shard,
            mut asked,
        } => {
            let job = config.job(&job)?;
            let asking = (shard, "--shard", true);
            let (key, _) = crate::engine::shards::key_of(store, job, &period, asking).await?;
            asked.key = key.to_string();
            super::logs::logs(store, &asked).await
        }
        Plan::Release { job, period, shard } => {
            inspect::release(config.job(&job)?, store, &period, shard).await
        }
        Plan::Adopt { job, which } => {
            inspect::adopt(config.job(&job)?, store, which.borrowed(), now).await
        }
        Plan::Pause { job, paused } => inspect::pause(store, &config.full_name(&job), paused).await,
        Plan::Prune { dry_run } => inspect::prune(config, store, dry_run).await,
        Plan::Run { .. } | Plan::Serve { .. } | Plan::Check { .. } | Plan::Next { .. } => {
            Ok(Outcome::Done)
        }
    }
}

/// `migrate`: the migrations it applied, or that there was none.
fn migrated(applied: &[String]) -> Result<Outcome, Unread> {
    if applied.is_empty() {
        say(format_args!("up to date: no migration to apply"))?;
    }
    for m in applied {
        say(format_args!("applied {m}"))?;
    }
    Ok(Outcome::Done)
}

/// The configuration `cli`'s command needs, and the `${VAR}`s it left
/// unset: only the commands that run actions need every one; the others
/// read the file leniently and `check` reports what is unset.
fn load(cli: &Cli) -> Result<(Config, Vec<ConfigError>), Error> {
    let loaded = match cli.command {
        Command::Run(_) => Config::load_to_run(&cli.config),
        Command::Serve { .. } => Config::load(&cli.config).map(|config| (config, Vec::new())),
        _ => Config::load_lenient(&cli.config),
    };
    Ok(loaded.map_err(|mut e| {
        if e.message.starts_with(crate::config::UNREADABLE) {
            e.message
                .push_str("; pass --config PATH or set SCHEDULER_CONFIG");
        }
        e
    })?)
}

/// `check [--strict]`: the configuration checked, each `${VAR}` it left
/// unset said (and refused with `--strict`).
fn check_config(
    config: &Config,
    unset: &[ConfigError],
    strict: bool,
    now: chrono::DateTime<Utc>,
) -> Result<Outcome, Error> {
    let io = |e: std::io::Error| Unread::from(e).into_result();
    if strict && !unset.is_empty() {
        return Err(Error::Config(ConfigError::joined(unset.to_vec())));
    }
    for warning in unset {
        eprintln!(
            "warning: {warning}; `serve` needs it, and so does `run` of a job that uses it (in its action, or through a [[notify]] told of the job)"
        );
    }
    Ok(
        match check::check(config, now, &mut std::io::stdout().lock()) {
            Ok(()) => Outcome::Done,
            Err(e) => io(e)?,
        },
    )
}

/// `next JOB [--count N] [--after WHEN]`: its next fires.
fn next_fires(
    config: &Config,
    job: &str,
    count: u32,
    after: Option<&After>,
    now: chrono::DateTime<Utc>,
) -> Result<Outcome, Error> {
    let io = |e: std::io::Error| Unread::from(e).into_result();
    let job = config.job(job)?;
    let after = match after {
        Some(after) => after.resolve(job.schedule.zone()),
        None => now,
    };
    Ok(
        match check::next(job, after, count, &mut std::io::stdout().lock()) {
            Ok(()) => Outcome::Done,
            Err(e) => io(e)?,
        },
    )
}

/// Opens (creating it for `run`, `serve` and `migrate`) and migrates the
/// database; the migrations it applied.
async fn open(
    plan: &Plan,
    flag: Option<&str>,
    config: &mut Config,
) -> Result<(Store, Vec<String>), Error> {
    let runs_actions = plan.runs_actions();
    let url = database_url(flag, config)?;
    if let Some(flag) = flag {
        config.mask_also(&crate::config::address::url_passwords(flag));
    }
    let creates = plan.creates();
    if matches!(url, DatabaseUrl::Sqlite { .. }) && runs_actions {
        config.check_for_sqlite()?;
    }
    let store = Store::open(&url, creates).await?;
    // Only `run`, `serve` and `migrate` make a database the scheduler's
    // and bring it up to date; the other commands only read where it
    // stands (a read-only role suffices), and refuse one that needs
    // migrating: moving an earlier release's record is one-way.
    if !creates && !store.has_schema().await? {
        return Err(Error::Database(format!(
            "no scheduler tables in the database at {}: nothing has run against it yet, or this is not the right one; `scheduler migrate` creates them",
            url
        )));
    }
    let applied = if creates {
        store.migrate().await?
    } else if let Some(left) = store.needs_migrating().await? {
        return Err(Error::Database(format!(
            "the database at {url} needs migrating ({left}); `scheduler migrate` does it (so do `run` and `serve`), after which a release before this one cannot open it"
        )));
    } else {
        Vec::new()
    };
    if runs_actions {
        crate::engine::supervision::reaper::start();
    }
    Ok((store, applied))
}

/// `scheduler serve`, on an opened database: until shutdown, with the
/// probes, metrics and API on `listener` if it listens.
async fn serve(
    path: &std::path::Path,
    config: Config,
    store: (Store, crate::trace::Tracer),
    (reload, listener, shutdown): (
        mpsc::UnboundedReceiver<()>,
        Option<tokio::net::TcpListener>,
        watch::Receiver<bool>,
    ),
) -> Result<Outcome, Error> {
    let (lease, scan_interval) = (config.settings.lease, config.settings.scan_interval);
    let service = Service::new(
        path.to_path_buf(),
        config,
        store,
        owner_id(),
        shutdown.clone(),
    )?;
    let health = service.health();
    health.watch(lease, scan_interval);
    // Migrations just answered: the database is reachable. The loop
    // counts as alive from its first wake-up, after the catch-up.
    health.database_ok();
    let service = match listener {
        Some(listener) => crate::serve::listen(service, listener, shutdown)?,
        None => service,
    };
    // It waits for the runs asked for over the API too.
    service.serve(reload).await
}

/// `scheduler completions SHELL`: clap's own generator.
fn completions(shell: clap_complete::Shell) -> Result<Outcome, Error> {
    let mut command = <Cli as clap::CommandFactory>::command();
    let mut out = Vec::new();
    clap_complete::generate(shell, &mut command, "scheduler", &mut out);
    write_out(&out)
}

/// `scheduler man`: clap's own man page generator.
fn man() -> Result<Outcome, Error> {
    let out = crate::cli::man::page().map_err(|e| Error::Environment(e.into()))?;
    write_out(&out)
}

/// `scheduler health --url URL`: the probe's answer on stdout; exit 0 for
/// a 200, 1 for another status, 3 when nothing answers.
async fn health(url: &str) -> Result<Outcome, Error> {
    let parsed = url::Url::parse(url).map_err(|e| {
        Error::Usage(format!(
            "--url: `{url}`: {e}; expected e.g. http://127.0.0.1:9090/healthz"
        ))
    })?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(Error::Usage(format!(
            "--url: `{url}`: expected an http:// or https:// URL"
        )));
    }
    let client = reqwest::Client::builder()
        .timeout(std::time::Duration::from_secs(5))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .map_err(|e| Error::Environment(e.into()))?;
    let response = client.get(url).send().await.map_err(|e| {
        Error::Environment(anyhow::anyhow!(
            "health: no answer from {url}: {e}; is `serve --listen` running there?"
        ))
    })?;
    let status = response.status();
    let body = response.text().await.unwrap_or_default();
    let said = say(format_args!("{} {}", status.as_u16(), body.trim_end()));
    if let Err(stop) = said {
        return stop.into_result();
    }
    Ok(if status == reqwest::StatusCode::OK {
        Outcome::Done
    } else {
        Outcome::RunFailed
    })
}

fn write_out(bytes: &[u8]) -> Result<Outcome, Error> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(bytes).and_then(|()| stdout.flush()) {
        Ok(()) => Ok(Outcome::Done),
        Err(e) => Unread::from(e).into_result(),
    }
}

/// The database to open: `--database-url` (or `DATABASE_URL`), relative to
/// the working directory, over `[scheduler].database_url`, over the default;
/// those two relative to the directory of jobs.toml.
fn database_url(flag: Option<&str>, config: &Config) -> Result<DatabaseUrl, Error> {
    if let Some(url) = flag {
        let cwd = std::env::current_dir().map_err(|e| Error::Environment(e.into()))?;
        let from_env = std::env::var("DATABASE_URL").is_ok_and(|v| v == url);
        let name = if from_env {
            "DATABASE_URL"
        } else {
            "--database-url"
        };
        return DatabaseUrl::parse(url, &cwd).map_err(|e| Error::Usage(format!("{name}: {e}")));
    }
    if let Some(e) = &config.settings.database_url_error {
        return Err(Error::Config(e.clone()));
    }
    if let Some(url) = &config.settings.database_url {
        return Ok(url.clone());
    }
    let dir = config
        .path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    let dir = std::path::absolute(dir).map_err(|e| Error::Environment(e.into()))?;
    DatabaseUrl::parse(DEFAULT_DATABASE_URL, &dir).map_err(Error::Usage)
}

/// A message per SIGHUP.
pub fn reload_signal() -> Result<mpsc::UnboundedReceiver<()>, Error> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut hup = signal(SignalKind::hangup()).map_err(|e| Error::Environment(e.into()))?;
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(async move {
        while hup.recv().await.is_some() {
            if tx.send(()).is_err() {
                return;
            }
        }
    });
    Ok(rx)
}

/// A flag that turns true on SIGTERM or SIGINT.
pub fn shutdown_signal() -> Result<watch::Receiver<bool>, Error> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate()).map_err(|e| Error::Environment(e.into()))?;
    let mut int = signal(SignalKind::interrupt()).map_err(|e| Error::Environment(e.into()))?;
    let (tx, rx) = watch::channel(false);
    tokio::spawn(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        tracing::info!("shutting down: no new claims");
        let _ = tx.send(true);
    });
    Ok(rx)
}
