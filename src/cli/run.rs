//! `scheduler run`: the one-shot mode for a platform cron container, and
//! manual backfill of one period or a range.

use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde_json::json;
use tokio::sync::watch;

use crate::cli::RunArgs;
use crate::cli::check::period_key;
use crate::config::{Config, Job};
use crate::engine::due::{Due, due};
use crate::engine::{Context, Ending, Run, Taken, after_grace};
use crate::error::{Error, Outcome, Stop, say};
use crate::period::{Period, utc_text};
use crate::store::{Claim, ClaimRequest, ClaimRow, Store, Trigger};

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
    fn step(&mut self, job: &Job) -> Option<Period> {
        let current = self.next.take()?;
        if current.label != self.last.label && current.start < self.last.start {
            let following = job.period.following(&job.schedule, &current);
            // A walk that does not move forward ends rather than loops.
            if following.start > current.start {
                self.next = Some(following);
            }
        }
        Some(current)
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

/// What happened to one period, printed as one line.
struct Line {
    key: String,
    status: &'static str,
    detail: String,
    attempt: Option<i32>,
}

/// Runs `scheduler run` to the end.
pub async fn run(
    config: &Config,
    store: &Store,
    args: &RunArgs,
    owner: &str,
    shutdown: watch::Receiver<bool>,
) -> Result<Outcome, Error> {
    let now = Utc::now();
    let mut plans = plan(config, store, args, now).await?;
    let total = plans
        .iter()
        .try_fold(0u64, |sum, p| Some(sum + p.periods.len(p.job)?));
    let bar = match total {
        Some(total) => ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr()),
        None => ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr()),
    };
    if total.is_some_and(|t| t < 2) {
        bar.set_draw_target(ProgressDrawTarget::hidden());
    }
    let template = match total {
        Some(_) => "{bar:40} {pos}/{len} periods, {elapsed} {msg}",
        None => "{spinner} {pos} periods, {elapsed} {msg}",
    };
    bar.set_style(
        ProgressStyle::with_template(template).unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let context = Context::new(store.clone(), config.settings.lease)?;
    let stop_now = after_grace(shutdown.clone(), config.settings.shutdown_grace);
    let mut outcome = Outcome::Done;
    let mut fenced = 0;
    for plan in &mut plans {
        loop {
            let chunk = plan.periods.chunk(plan.job, now);
            if chunk.is_empty() {
                break;
            }
            let keys: Vec<String> = chunk
                .iter()
                .map(|d| period_key(&plan.job.name, &d.period.label))
                .collect();
            // One statement per chunk tells which periods are finished, so a
            // repeated backfill claims nothing.
            let rows = store.rows(&keys).await?;
            for (due, key) in chunk.iter().zip(keys) {
                if *shutdown.borrow() {
                    return Ok(Outcome::RunFailed);
                }
                let line = if args.dry_run {
                    dry_run_line(&key, rows.get(&key), args, plan.manual)
                } else if let Some(skip) = rows
                    .get(&key)
                    .and_then(|row| skip_line(&key, row, args, plan.manual))
                {
                    skip
                } else {
                    let period_run = PeriodRun {
                        context: &context,
                        job: plan.job,
                        due,
                        key: &key,
                        owner,
                        manual: plan.manual,
                    };
                    period_run
                        .go(config, args, shutdown.clone(), stop_now.clone())
                        .await?
                };
                if matches!(line.status, "failed" | "released" | "busy") {
                    outcome = Outcome::RunFailed;
                }
                fenced += usize::from(line.status == "fenced");
                // The period is recorded; a reader that went away ends the
                // command before the next claim.
                if let Err(stop) = bar.suspend(|| print_line(&line, args.json)) {
                    bar.finish_and_clear();
                    return stop.into_result();
                }
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    if fenced > 0 {
        // Nothing is known of those periods' outcome: the database failed.
        return Err(Error::Database(format!(
            "{fenced} period(s) stopped unfinished: their lease could not be renewed in time (the database did not answer, or this process was stopped); they are recovered by the next run or serve"
        )));
    }
    Ok(outcome)
}

/// How many retryable or recoverable periods of a job one `run` takes.
const RECLAIM_LIMIT: u32 = 1_000;

/// Works out which periods `args` asks for.
async fn plan<'a>(
    config: &'a Config,
    store: &Store,
    args: &RunArgs,
    now: DateTime<Utc>,
) -> Result<Vec<Plan<'a>>, Error> {
    let jobs: Vec<&Job> = match &args.job {
        Some(name) => vec![config.job(name)?],
        None => config.jobs.iter().collect(),
    };
    let mut plans = Vec::with_capacity(jobs.len());
    for job in jobs {
        let manual = args.period.is_some() || args.from.is_some();
        let periods = if let Some(walk) = manual_range(job, args, now)? {
            Periods::Range(walk)
        } else {
            let seen = store.see_jobs(std::slice::from_ref(&job.name)).await?;
            let Some(seen) = seen.get(&job.name) else {
                continue;
            };
            if seen.paused {
                eprintln!(
                    "{}: paused; `scheduler resume {}` to run it again",
                    job.name, job.name
                );
                continue;
            }
            let window =
                now - chrono::Duration::from_std(config.settings.catch_up).unwrap_or_default();
            let since = window.max(seen.first_seen);
            let mut listed = due(job, now, since, true);
            // Failed periods whose retry is due, and claims whose lease ran
            // out or that were released, run again as `serve`'s scan would
            // take them: a platform cron container may be all there is.
            let again = store
                .reclaimable(std::slice::from_ref(&job.name), RECLAIM_LIMIT)
                .await?;
            for r in again {
                if r.scheduled_at >= window
                    && !listed.iter().any(|d| d.period.label == r.period.label)
                {
                    listed.push(Due {
                        period: r.period,
                        fire: r.scheduled_at,
                        trigger: Trigger::Retry,
                    });
                }
            }
            listed.sort_by_key(|d| d.fire);
            Periods::Listed(listed.into_iter())
        };
        plans.push(Plan {
            job,
            periods,
            manual,
        });
    }
    Ok(plans)
}

/// Checks the flags of `run` against every job they apply to, before the
/// database is opened: labels, their order, periods not started or not due,
/// and `--force` without periods.
pub fn check_args(config: &Config, args: &RunArgs, now: DateTime<Utc>) -> Result<(), Error> {
    if args.early && args.period.is_none() && args.from.is_none() {
        return Err(Error::Usage(
            "--early: needs --period LABEL or --from LABEL --to LABEL; a scheduled run only takes periods that are due".into(),
        ));
    }
    if args.force && args.period.is_none() && args.from.is_none() {
        return Err(Error::Usage(
            "--force: needs --period LABEL or --from LABEL --to LABEL; it re-runs succeeded periods, so it names them".into(),
        ));
    }
    for job in &config.jobs {
        if args.job.as_ref().is_none_or(|name| *name == job.name) {
            manual_range(job, args, now)?;
        }
    }
    Ok(())
}

/// The periods a manual run (`--period`, `--from/--to`) asks for, or `None`
/// for a scheduled one. The newest must have started and, unless `--early`,
/// be due.
fn manual_range(job: &Job, args: &RunArgs, now: DateTime<Utc>) -> Result<Option<RangeWalk>, Error> {
    if let Some(label) = &args.period {
        let period = parse_label(job, label, "--period")?;
        refuse_future(&period, now, "--period")?;
        if !args.early {
            refuse_not_due(job, &period, now, "--period")?;
        }
        return Ok(Some(RangeWalk {
            next: Some(period.clone()),
            last: period,
        }));
    }
    if let (Some(from), Some(to)) = (&args.from, &args.to) {
        let first = parse_label(job, from, "--from")?;
        let last = parse_label(job, to, "--to")?;
        if last.start < first.start {
            return Err(Error::Usage(format!(
                "--to: {} comes before --from {}",
                last.label, first.label
            )));
        }
        refuse_future(&last, now, "--to")?;
        if !args.early {
            refuse_not_due(job, &last, now, "--to")?;
        }
        return Ok(Some(RangeWalk {
            next: Some(first),
            last,
        }));
    }
    Ok(None)
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

/// A period whose fire is still ahead would, run now, turn its scheduled
/// run into a no-op (and cover a period that is not over).
fn refuse_not_due(job: &Job, period: &Period, now: DateTime<Utc>, flag: &str) -> Result<(), Error> {
    match job.period.fire_for(&job.schedule, period) {
        Some(fire) if fire > now => Err(Error::Usage(format!(
            "{flag}: {} is not due yet: its fire is at {}; run now, it would turn that scheduled run into a no-op; pass --early to run it anyway",
            period_key(&job.name, &period.label),
            utc_text(fire)
        ))),
        _ => Ok(()),
    }
}

fn manual_due(job: &Job, period: Period, now: DateTime<Utc>) -> Due {
    let fire = job
        .period
        .fire_for(&job.schedule, &period)
        .filter(|f| *f <= now)
        .unwrap_or(now);
    Due {
        period,
        fire,
        trigger: Trigger::Manual,
    }
}

/// Why a period is passed over without a claim, from its row, if it is.
fn skip_line(key: &str, row: &ClaimRow, args: &RunArgs, manual: bool) -> Option<Line> {
    let detail = match row.as_claim() {
        Claim::Succeeded { at } if !args.force => format!("already succeeded at {}", utc_text(at)),
        Claim::Held { owner, until } if !args.wait => {
            format!("running on {owner} until {}", utc_text(until))
        }
        Claim::Failed {
            retry_at: Some(at), ..
        } if !manual => format!("failed, retry at {}", utc_text(at)),
        Claim::Failed {
            retry_at: None,
            failures,
        } if !manual => {
            format!("failed {failures} time(s), no retries left; `run --period` runs it again")
        }
        _ => return None,
    };
    Some(Line {
        key: key.to_owned(),
        status: "skipped",
        detail,
        attempt: Some(row.attempt),
    })
}

fn dry_run_line(key: &str, row: Option<&ClaimRow>, args: &RunArgs, manual: bool) -> Line {
    let (status, detail) = match row {
        None => ("would claim", "new period".to_owned()),
        Some(row) => match skip_line(key, row, args, manual) {
            Some(skip) => ("skipped", skip.detail),
            None => (
                "would claim",
                match row.as_claim() {
                    Claim::Succeeded { .. } => {
                        "already succeeded; --force runs it again".to_owned()
                    }
                    Claim::Failed { .. } => format!("retry of attempt {}", row.attempt),
                    Claim::Held { owner, .. } => format!("after waiting for {owner}"),
                    _ if row.state == "running" => {
                        format!("recovery: the lease of {} expired", row.owner)
                    }
                    _ if row.state == "released" => "recovery: released".to_owned(),
                    _ => format!("retry of attempt {}", row.attempt),
                },
            ),
        },
    };
    Line {
        key: key.to_owned(),
        status,
        detail,
        attempt: row.map(|r| r.attempt),
    }
}

/// One period being claimed and run by this process.
struct PeriodRun<'a> {
    context: &'a Context,
    job: &'a Job,
    due: &'a Due,
    key: &'a str,
    owner: &'a str,
    manual: bool,
}

impl PeriodRun<'_> {
    async fn go(
        &self,
        config: &Config,
        args: &RunArgs,
        shutdown: watch::Receiver<bool>,
        stop_now: watch::Receiver<bool>,
    ) -> Result<Line, Error> {
        let request = ClaimRequest {
            job: &self.job.name,
            period: &self.due.period,
            owner: self.owner,
            lease: config.settings.lease,
            trigger: self.due.trigger,
            concurrency: self.job.concurrency,
            force: args.force,
            manual: self.manual,
            scheduled_at: self.due.fire,
        };
        let line = |status, detail: String, attempt| Line {
            key: self.key.to_owned(),
            status,
            detail,
            attempt,
        };
        loop {
            let won = match self.context.claim(&request).await? {
                Taken::Won(won) => won,
                Taken::RunningHere => {
                    return Ok(line("skipped", "running in this process".into(), None));
                }
                Taken::Not(Claim::Held { owner, until }) if args.wait => {
                    tracing::info!(period_key = self.key, %owner, %until, "waiting for the run elsewhere");
                    match self.wait_elsewhere(shutdown.clone()).await? {
                        Some(done) => return Ok(done),
                        None => continue,
                    }
                }
                Taken::Not(Claim::Busy) if args.wait => {
                    tracing::info!(period_key = self.key, "waiting for a free concurrency slot");
                    let mut shutdown = shutdown.clone();
                    tokio::select! {
                        () = tokio::time::sleep(WAIT_POLL) => continue,
                        _ = shutdown.wait_for(|down| *down) => {
                            return Ok(line("skipped", "interrupted while waiting for a concurrency slot".into(), None));
                        }
                    }
                }
                Taken::Not(Claim::Busy) if self.manual => {
                    return Ok(line(
                        "busy",
                        format!(
                            "not run: all {} concurrency slot(s) of `{}` are taken by running periods; --wait waits for one",
                            self.job.concurrency, self.job.name
                        ),
                        None,
                    ));
                }
                Taken::Not(other) => return Ok(line("skipped", not_won(&other), None)),
            };
            let lease = &won.lease;
            let started = Instant::now();
            let run = Run {
                job: self.job,
                period: &self.due.period,
                key: self.key,
                lease,
                scheduled_at: self.due.fire,
            };
            tracing::info!(
                period_key = self.key,
                attempt = lease.attempt,
                trigger = lease.trigger.as_str(),
                "claimed"
            );
            let ending = self.context.execute(&run, &won, stop_now.clone()).await?;
            let took = format!("{:.2}s", started.elapsed().as_secs_f64());
            let attempt = Some(lease.attempt);
            let trigger = lease.trigger.as_str();
            return Ok(match ending {
                Ending::Recorded {
                    succeeded: true, ..
                } => line(
                    "succeeded",
                    format!("attempt {}, trigger {trigger}, {took}", lease.attempt),
                    attempt,
                ),
                Ending::Recorded {
                    succeeded: false,
                    error,
                    retry_after,
                } => {
                    let retry = match retry_after {
                        Some(after) => format!("retry in {}", humantime::format_duration(after)),
                        None => "no retries left".to_owned(),
                    };
                    let error = error.unwrap_or_default();
                    line(
                        "failed",
                        format!(
                            "{error} (attempt {}, trigger {trigger}, {took}; {retry})",
                            lease.attempt
                        ),
                        attempt,
                    )
                }
                Ending::Lost => line(
                    "lost",
                    "the claim was taken over; this attempt was stopped and its outcome discarded".into(),
                    attempt,
                ),
                Ending::Withdrawn => line(
                    "released",
                    "stopped by `scheduler release`; nothing recorded and the period is not done: `run --period` runs it again".into(),
                    attempt,
                ),
                Ending::Fenced => line(
                    "fenced",
                    "the lease could not be renewed in time (the database did not answer, or this process was stopped); the job was stopped before the lease ran out and nothing was recorded: the next run or serve recovers the period".into(),
                    attempt,
                ),
                Ending::Released => line(
                    "released",
                    "interrupted by shutdown; the claim was released".into(),
                    attempt,
                ),
            });
        }
    }

    /// Polls a claim held elsewhere until it ends; `None` when it became
    /// claimable (expired or released), so the caller claims again.
    async fn wait_elsewhere(
        &self,
        mut shutdown: watch::Receiver<bool>,
    ) -> Result<Option<Line>, Error> {
        let line = |status, detail: String, attempt| {
            Some(Line {
                key: self.key.to_owned(),
                status,
                detail,
                attempt,
            })
        };
        loop {
            tokio::select! {
                () = tokio::time::sleep(WAIT_POLL) => {}
                _ = shutdown.wait_for(|down| *down) => {
                    return Ok(line("skipped", "interrupted while waiting".into(), None));
                }
            }
            let rows = self.context.store.rows(&[self.key.to_owned()]).await?;
            let Some(row) = rows.get(self.key) else {
                return Ok(None);
            };
            return Ok(match row.as_claim() {
                Claim::Held { .. } => continue,
                Claim::Succeeded { at } => line(
                    "succeeded",
                    format!(
                        "on {} at {} (attempt {})",
                        row.owner,
                        utc_text(at),
                        row.attempt
                    ),
                    Some(row.attempt),
                ),
                Claim::Failed { .. } => line(
                    "failed",
                    format!("on {} (attempt {})", row.owner, row.attempt),
                    Some(row.attempt),
                ),
                _ => None,
            });
        }
    }
}

fn not_won(claim: &Claim) -> String {
    match claim {
        Claim::Succeeded { at } => format!("already succeeded at {}", utc_text(*at)),
        Claim::Held { owner, until } => format!("running on {owner} until {}", utc_text(*until)),
        Claim::Failed {
            retry_at: Some(at), ..
        } => format!("failed, retry at {}", utc_text(*at)),
        Claim::Failed {
            retry_at: None,
            failures,
        } => format!("failed {failures} time(s), no retries left"),
        Claim::Busy => "waiting for a concurrency slot".into(),
        Claim::Won(_) => "won".into(),
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
