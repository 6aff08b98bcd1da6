//! `scheduler run`: the one-shot mode for a platform cron container, and
//! manual backfill of one period or a range. The flags become one
//! [`Request`] for the engine; this file draws the progress bar and prints
//! each period's line.

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use tokio::sync::watch;

use crate::cli::RunArgs;
use crate::config::Config;
use crate::engine::Engine;
use crate::engine::manual::{self, Line, Names, Request, Selection, Sink};
use crate::error::{Error, Outcome, Unread, say};

/// The request the flags of `run` make.
pub fn request(args: &RunArgs) -> Request {
    let periods = match (&args.period, &args.from, &args.to) {
        (Some(label), _, _) => Selection::Period(label.clone()),
        (None, Some(from), Some(to)) => Selection::Range(from.clone(), to.clone()),
        _ => Selection::Due,
    };
    Request {
        job: args.job.clone(),
        periods,
        force: args.force,
        only_failed: args.only_failed,
        early: args.early,
        wait: args.wait,
        dry_run: args.dry_run,
        with_upstream: args.with_upstream,
        shard: args.shard,
        names: Names::FLAGS,
        by: format!("cli:{}", user()).into(),
    }
}

/// Who runs this command, by the name of their user.
pub(crate) fn user() -> String {
    nix::unistd::User::from_uid(nix::unistd::getuid())
        .ok()
        .flatten()
        .map_or_else(|| nix::unistd::getuid().to_string(), |u| u.name)
}

/// Runs `scheduler run` to the end.
pub async fn command(
    config: &Config,
    engine: &Engine,
    request: &Request,
    json: bool,
    shutdown: watch::Receiver<bool>,
) -> Result<Outcome, Error> {
    let mut printer = Printer {
        bar: ProgressBar::hidden(),
        json,
    };
    let shutdown_seen = shutdown.clone();
    let result = manual::drive(config, engine, request, shutdown, &mut printer).await;
    if let Ok(mut shown) = BAR.lock() {
        *shown = None;
    }
    printer.bar.finish_and_clear();
    if !request.dry_run && !*shutdown_seen.borrow() {
        engine
            .notify_after_run(config, request.job.as_deref())
            .await;
    }
    result
}

/// The progress bar on screen, if one is: log lines are drawn around it.
static BAR: std::sync::Mutex<Option<ProgressBar>> = std::sync::Mutex::new(None);

/// Where the log's own thread writes its lines: standard error, each line
/// with the progress bar of a `run` lifted off the screen, so none leaves
/// a copy of it behind. A line that cannot be written (the log's reader
/// went away) is dropped.
pub struct Stderr;

impl std::io::Write for Stderr {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        let write = || {
            let _ = std::io::stderr().lock().write_all(bytes);
        };
        let bar = BAR.lock().ok().and_then(|bar| bar.clone());
        match bar {
            Some(bar) => bar.suspend(write),
            None => write(),
        }
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Prints each line, with a progress bar on standard error for a range.
struct Printer {
    bar: ProgressBar,
    json: bool,
}

impl Sink for Printer {
    fn paused(&mut self, job: &str) {
        eprintln!("{job}: paused; `scheduler resume {job}` to run it again");
    }

    fn nothing_due(&mut self, job: &str, words: &str) {
        eprintln!("{job}: {words}");
    }

    fn total(&mut self, total: Option<u64>) {
        if total.is_some_and(|t| t < 2) {
            return;
        }
        self.bar = ProgressBar::with_draw_target(total, ProgressDrawTarget::stderr());
        let template = match total {
            Some(_) => "{bar:40} {pos}/{len} periods, {elapsed} {msg}",
            None => "{spinner} {pos} periods, {elapsed} {msg}",
        };
        self.bar.set_style(
            ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        // Log lines (the jobs' output among them) are drawn around it.
        if let Ok(mut shown) = BAR.lock() {
            *shown = Some(self.bar.clone());
        }
    }

    fn line(&mut self, line: &Line) -> Result<(), Unread> {
        self.bar.suspend(|| print_line(line, self.json))?;
        self.bar.inc(1);
        Ok(())
    }
}

fn print_line(line: &Line, as_json: bool) -> Result<(), Unread> {
    if as_json {
        let (job, period) = line.key.split_once(':').unwrap_or((&line.key, ""));
        let value = json!({
            "key": line.key,
            "period_key": line.key,
            "job": job,
            "period": period,
            "status": line.status.printed(),
            "attempt": line.attempt,
            "trigger": line.trigger,
            "asked": line.asked,
            "exit_code": line.exit_code,
            "http_status": line.http_status,
            "error": line.error,
            "retry_at": line.retry_at,
            "duration_ms": line.duration_ms,
            "detail": line.detail,
        });
        say(format_args!("{value}"))
    } else if line.status == crate::state::PeriodOutcome::Waiting {
        say(format_args!("{}  waiting for {}", line.key, line.detail))
    } else {
        say(format_args!(
            "{}  {}: {}",
            line.key,
            line.status.printed(),
            line.detail
        ))
    }
}
