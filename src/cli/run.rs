//! `scheduler run`: the one-shot mode for a platform cron container, and
//! manual backfill of one period or a range. The flags become one
//! [`Request`] for the engine; this file draws the progress bar and prints
//! each period's line.

use chrono::{DateTime, Utc};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use tokio::sync::watch;

use crate::cli::RunArgs;
use crate::config::Config;
use crate::engine::Engine;
use crate::engine::manual::{self, Line, Names, Request, Selection, Sink};
use crate::error::{Error, Outcome, Stop, say};
use crate::store::Store;

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
        early: args.early,
        wait: args.wait,
        dry_run: args.dry_run,
        names: Names::FLAGS,
    }
}

/// Checks the flags of `run` before the database is opened.
pub fn check_args(config: &Config, args: &RunArgs, now: DateTime<Utc>) -> Result<(), Error> {
    manual::check(config, &request(args), now)
}

/// Runs `scheduler run` to the end.
pub async fn run(
    config: &Config,
    store: &Store,
    args: &RunArgs,
    owner: &str,
    shutdown: watch::Receiver<bool>,
) -> Result<Outcome, Error> {
    let engine = Engine::new(store.clone(), config.settings.lease, owner.to_owned())?;
    let mut printer = Printer {
        bar: ProgressBar::hidden(),
        json: args.json,
    };
    let result = manual::run(config, &engine, &request(args), shutdown, &mut printer).await;
    printer.bar.finish_and_clear();
    result
}

/// Prints each line, with a progress bar on standard error for a range.
struct Printer {
    bar: ProgressBar,
    json: bool,
}

impl Sink for Printer {
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
    }

    fn line(&mut self, line: &Line) -> Result<(), Stop> {
        self.bar.suspend(|| print_line(line, self.json))?;
        self.bar.inc(1);
        Ok(())
    }
}

fn print_line(line: &Line, as_json: bool) -> Result<(), Stop> {
    if as_json {
        let (job, period) = line.key.split_once(':').unwrap_or((&line.key, ""));
        let value = json!({
            "period_key": line.key,
            "job": job,
            "period": period,
            "status": line.status,
            "detail": line.detail,
            "attempt": line.attempt,
        });
        say(format_args!("{value}"))
    } else {
        say(format_args!(
            "{}  {}: {}",
            line.key, line.status, line.detail
        ))
    }
}
