//! Periods a front end names by label for a job: one label, a range
//! (`from..=to`), a page of one, the last few. Each is refused, in the
//! words of the front end's fields ([`Names`]), where it is no period of
//! the job, and a manual run's where it may not run yet.

use chrono::{DateTime, Utc};

use crate::config::Job;
use crate::error::Error;
use crate::period::walk::{RangeWalk, is_empty};
use crate::period::{Period, PeriodKey, utc_text};

/// How a front end names a request's fields in its messages.
#[derive(Debug, Clone, Copy)]
pub struct Names {
    /// The one-period field.
    pub period: &'static str,
    /// The start of a range.
    pub from: &'static str,
    /// The end of a range.
    pub to: &'static str,
    /// Running a period not yet due.
    pub early: &'static str,
    /// Re-running succeeded periods.
    pub force: &'static str,
    /// Waiting for a period held elsewhere.
    pub wait: &'static str,
    /// Running the upstream periods first.
    pub with_upstream: &'static str,
    /// Running only failed periods.
    pub only_failed: &'static str,
    /// What runs one period again by hand.
    pub rerun: &'static str,
    /// What runs a period later that waits for its upstream.
    pub later: &'static str,
    /// What to do when every concurrency slot of the job is taken.
    pub busy: &'static str,
    /// One shard of each period.
    pub shard: &'static str,
}

impl Names {
    /// The command line's flags.
    pub const FLAGS: Names = Names {
        period: "--period",
        from: "--from",
        to: "--to",
        early: "--early",
        force: "--force",
        wait: "--wait",
        with_upstream: "--with-upstream",
        only_failed: "--only-failed",
        rerun: "`run --period`",
        later: "serve's scan, or the next `run` of the job; --with-upstream runs them first",
        busy: "--wait waits for one",
        shard: "--shard",
    };
    /// A period label in an HTTP API path.
    pub const PATH: Names = Names {
        period: "label",
        from: "label",
        to: "label",
        ..Names::JSON
    };
    /// The HTTP API's JSON fields.
    pub const JSON: Names = Names {
        period: "period",
        from: "from",
        to: "to",
        early: "early",
        force: "force",
        wait: "wait",
        with_upstream: "with_upstream",
        only_failed: "only_failed",
        rerun: "a run with `period`",
        later: "serve's scan; `with_upstream` runs them first",
        busy: "ask again once one is free",
        shard: "shard",
    };
    /// The library's calls and their options.
    pub const CODE: Names = Names {
        period: "label",
        from: "from",
        to: "to",
        early: "RunOptions::early",
        force: "RunOptions::force",
        wait: "RunOptions::wait(true)",
        with_upstream: "RunOptions::with_upstream",
        only_failed: "RunOptions::only_failed",
        rerun: "`run_period`",
        later: "the scan of `start`, or the next `run_due`; `RunOptions::with_upstream` runs them first",
        busy: "`RunOptions::wait(true)` (the default) waits for one",
        shard: "RunOptions::shard",
    };
}

/// The periods of `job` from label `from` to `to`, both included; more
/// than `limit` of them is a usage error.
pub fn periods_between(
    job: &Job,
    (from, to): (&str, &str),
    limit: usize,
    names: Names,
) -> Result<Vec<Period>, Error> {
    match page_between(job, (from, to), limit, names)? {
        (periods, None) => Ok(periods),
        (_, Some(_)) => Err(Error::Usage(format!(
            "{}: the range holds more than {limit} periods; ask for a shorter one",
            names.to
        ))),
    }
}

/// The first `limit` periods of the range `from..=to`, oldest first, and
/// the label of the period after them if the range goes on: one page.
pub fn page_between(
    job: &Job,
    (from, to): (&str, &str),
    limit: usize,
    names: Names,
) -> Result<(Vec<Period>, Option<String>), Error> {
    let (first, last) = bounds(job, (from, to), names)?;
    let mut walk = RangeWalk::new(first, last);
    let mut periods = Vec::new();
    while let Some(period) = walk.step(&job.period, &job.schedule) {
        if periods.len() == limit {
            return Ok((periods, Some(period.label)));
        }
        periods.push(period);
    }
    Ok((periods, None))
}

/// The last `count` periods of `job` that a fire covers, up to the one
/// labelled `to` or else up to the latest fire at `now`, oldest first, and
/// the label of the period before them, if there is one.
pub fn periods_up_to(
    job: &Job,
    to: Option<&str>,
    count: usize,
    names: Names,
    now: DateTime<Utc>,
) -> Result<(Vec<Period>, Option<String>), Error> {
    let last = match to {
        Some(label) => parse_label(job, label, names.to)?,
        None => match job.timing().latest(now) {
            Some(fire) => job.timing().period_of(&fire),
            None => return Ok((Vec::new(), None)),
        },
    };
    let mut periods = vec![last];
    let mut before = None;
    while let Some(oldest) = periods.last() {
        let Some(preceding) = job.period.preceding(&job.schedule, oldest) else {
            break;
        };
        if periods.len() == count {
            before = Some(preceding.label);
            break;
        }
        periods.push(preceding);
    }
    periods.reverse();
    Ok((periods, before))
}

/// The first and last period of a range, in order.
pub(super) fn bounds(
    job: &Job,
    (from, to): (&str, &str),
    names: Names,
) -> Result<(Period, Period), Error> {
    let mut first = parse_label(job, from, names.from)?;
    let last = parse_label(job, to, names.to)?;
    // A first label a spring-forward skips starts the range at the period
    // after it (an empty period's `following` starts at the same instant).
    if is_empty(&first) {
        let skipped = first.label.clone();
        first = job.period.following(&job.schedule, &first);
        if is_empty(&first) || (first.start >= last.start && is_empty(&last)) {
            return Err(Error::NoSuchPeriod {
                field: names.from,
                job: job.name.to_string(),
                message: format!(
                    "the range holds no period: a spring-forward skips {skipped} in {}",
                    job.schedule.zone().name()
                ),
                label: skipped,
            });
        }
    }
    // A last label a spring-forward makes empty comes before a first one
    // that starts at its instant or later.
    let reversed = is_empty(&last) && first.label != last.label && first.start >= last.start;
    if last.start < first.start || reversed {
        return Err(Error::NoSuchPeriod {
            field: names.to,
            job: job.name.to_string(),
            message: format!("{} comes before {} {}", last.label, names.from, first.label),
            label: last.label,
        });
    }
    Ok((first, last))
}

/// The period `label` names for `job`, refused (naming `flag` and why) if
/// it is no period of the job: not a label of its period rule, a period a
/// spring-forward skips, or one no fire covers (a day off its calendar
/// skips, a date outside its active dates).
pub fn period_of_label(job: &Job, label: &str, flag: &'static str) -> Result<Period, Error> {
    let period = parse_label(job, label, flag)?;
    refuse_fireless(job, &period, flag)?;
    Ok(period)
}

/// The period `label` names for `job`, or a usage error in `flag`'s words.
pub fn parse_label(job: &Job, label: &str, flag: &'static str) -> Result<Period, Error> {
    job.period
        .parse_label(&job.schedule, label)
        .map_err(|e| Error::NoSuchPeriod {
            field: flag,
            job: job.name.to_string(),
            label: label.to_owned(),
            message: format!("{e} (job `{}` has {} periods)", job.name, job.period.unit),
        })
}

pub(super) fn refuse_future(
    job: &Job,
    period: &Period,
    now: DateTime<Utc>,
    flag: &'static str,
) -> Result<(), Error> {
    if period.start > now {
        return Err(Error::NotDue {
            field: flag,
            period_key: PeriodKey::new(&job.name, &period.label).to_string(),
            due_at: period.start,
            early_runs_it: false,
            message: format!(
                "period {} starts at {}, after now; only a period that has started can be run",
                period.label,
                utc_text(period.start)
            ),
        });
    }
    Ok(())
}

/// A period no fire covers (a day the schedule, its calendar or its
/// active dates leave out) is no period of the job: there is nothing to
/// run, and a run of it would be one no schedule ever asks for.
pub(super) fn refuse_fireless(job: &Job, period: &Period, flag: &'static str) -> Result<(), Error> {
    if job.period.fire_for(&job.schedule, period).is_some() {
        return Ok(());
    }
    Err(Error::NoSuchPeriod {
        field: flag,
        job: job.name.to_string(),
        label: period.label.clone(),
        message: format!(
            "no fire of job `{}` covers {}: it is not a period of the job ({} it out; its next fires say which periods it has)",
            job.name,
            period.label,
            match job.schedule.days() {
                Some(_) => "its schedule, calendar or active dates leave",
                None => "its schedule leaves",
            },
        ),
    })
}

/// A period whose fire is still ahead would, run now, turn its scheduled
/// run into a no-op (and cover a period that is not over).
pub(super) fn refuse_not_due(
    job: &Job,
    period: &Period,
    now: DateTime<Utc>,
    (field, early): (&'static str, &str),
) -> Result<(), Error> {
    match job.timing().of(period) {
        Some(fire) if fire > now => {
            let period_key = PeriodKey::new(&job.name, &period.label).to_string();
            Err(Error::NotDue {
                field,
                message: format!(
                    "{period_key} is not due yet: its fire is at {}; run now, it would turn that scheduled run into a no-op; pass {early} to run it anyway",
                    utc_text(fire),
                ),
                period_key,
                due_at: fire,
                early_runs_it: true,
            })
        }
        _ => Ok(()),
    }
}

/// Shard `k` of `whose` (`this period`, or `its periods` for the job's
/// `shards` now) of job `job`, split `shards` ways, given as `field`:
/// refused for a period not split, or past its last shard; `None` without
/// `k`, refused instead if the period is split and one is `needed` (the
/// output of one attempt of one shard). Each message starts with `field`
/// and a colon, as the API's `field` reads it.
pub fn shard_of(
    (job, shards, whose): (&str, u32, &str),
    k: Option<u32>,
    field: &'static str,
    needed: bool,
) -> Result<Option<crate::period::Shard>, Error> {
    let n = shards;
    match k {
        None if needed && n > 1 => Err(Error::Usage(format!(
            "{field}: job `{job}` splits {whose} into {n} shards: give {field} K (0 to {})",
            n - 1
        ))),
        None => Ok(None),
        Some(k) if n <= 1 => Err(Error::Usage(format!(
            "{field}: job `{job}` does not split {whose} into shards (its `shards` is 1 or unset), so there is no shard {k}"
        ))),
        Some(k) if k >= n => Err(Error::Usage(format!(
            "{field}: {k} is out of range: job `{job}` splits {whose} into {n} shards, 0 to {}",
            n - 1
        ))),
        Some(index) => Ok(Some(crate::period::Shard { index, of: n })),
    }
}
