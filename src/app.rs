//! Runs a parsed command line: loads the configuration, opens the database
//! where the command needs it, and dispatches.

use chrono::Utc;
use tokio::sync::{mpsc, watch};

use crate::check;
use crate::cli::{Cli, Command};
use crate::config::Config;
use crate::error::{Error, Outcome};
use crate::inspect;
use crate::oneshot;
use crate::runner::owner_id;
use crate::scheduler::Service;
use crate::store::Store;

/// The database when nothing names one.
pub const DEFAULT_DATABASE_URL: &str = "sqlite://scheduler.db";

/// Runs `cli`'s command to completion.
pub async fn run(cli: Cli) -> Result<Outcome, Error> {
    let config = Config::load(&cli.config)?;
    let io = |e: std::io::Error| Error::Environment(e.into());
    let now = Utc::now();
    // Everything that needs no database is answered before one is opened.
    match &cli.command {
        Command::Check => {
            check::check(&config, now, &mut std::io::stdout().lock()).map_err(io)?;
            return Ok(Outcome::Done);
        }
        Command::Next { job, count, after } => {
            let job = config.job(job)?;
            check::next(
                job,
                after.unwrap_or(now),
                *count,
                &mut std::io::stdout().lock(),
            )
            .map_err(io)?;
            return Ok(Outcome::Done);
        }
        Command::Run(args) => {
            if let Some(name) = &args.job {
                config.job(name)?;
            }
            oneshot::check_labels(&config, args, now)?;
        }
        Command::Release { job, period } => {
            inspect::period_key_of(config.job(job)?, period)?;
        }
        Command::History { job, .. } | Command::Pause { job } | Command::Resume { job } => {
            config.job(job)?;
        }
        Command::Status { job: Some(job), .. } => {
            config.job(job)?;
        }
        _ => {}
    }
    let url = cli
        .database_url
        .clone()
        .or_else(|| config.settings.database_url.clone())
        .unwrap_or_else(|| DEFAULT_DATABASE_URL.to_owned());
    let store = Store::connect(&url).await?;
    store.migrate().await?;
    if matches!(cli.command, Command::Run(_) | Command::Serve { .. }) {
        crate::reaper::start_if_pid_1();
    }
    match cli.command {
        Command::Run(args) => {
            let shutdown = shutdown_signal()?;
            oneshot::run(&config, &store, &args, &owner_id(), shutdown).await
        }
        Command::Migrate => {
            println!("migrations applied");
            Ok(Outcome::Done)
        }
        Command::Status { job, json } => {
            inspect::status(&config, &store, job.as_deref(), json, now).await
        }
        Command::History { job, limit, json } => inspect::history(&store, &job, limit, json).await,
        Command::Release { job, period } => inspect::release(&config, &store, &job, &period).await,
        Command::Pause { job } => inspect::pause(&store, &job, true).await,
        Command::Resume { job } => inspect::pause(&store, &job, false).await,
        Command::Prune => inspect::prune(&config, &store).await,
        Command::Serve { listen } => {
            if let Some(addr) = listen {
                crate::server::start(addr).await?;
            }
            let shutdown = shutdown_signal()?;
            let reload = reload_signal()?;
            let service = Service::new(cli.config.clone(), config, store, owner_id(), shutdown)?;
            service.run(reload).await
        }
        Command::Check | Command::Next { .. } => Ok(Outcome::Done),
    }
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
        tracing::info!("shutting down: no new claims; running jobs get the shutdown grace");
        let _ = tx.send(true);
    });
    Ok(rx)
}
