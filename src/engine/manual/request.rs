//! A manual run as every front end asks for it ([`Request`]), checked
//! before the database is opened, and the periods it names.

use std::sync::Arc;

use chrono::{DateTime, Utc};

use crate::config::{Config, Job};
use crate::engine::labels::{
    Names, bounds, parse_label, refuse_fireless, refuse_future, refuse_not_due,
};
use crate::error::Error;
use crate::period::walk::{RangeWalk, is_empty};

/// Which periods a manual run asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Selection {
    /// What is due: the periods a `serve` wake-up would take (the catch-up
    /// window, retries whose backoff is over, recoveries).
    Due,
    /// One period, by label.
    Period(String),
    /// A range of labels, both included.
    Range(String, String),
}

/// A manual run, in domain terms: what every front end turns its own
/// input (flags, a JSON body) into once.
#[derive(Debug, Clone)]
pub struct Request {
    /// One job, or every job (`None`).
    pub job: Option<String>,
    /// Which periods.
    pub periods: Selection,
    /// Also re-run succeeded periods.
    pub force: bool,
    /// Run only the periods whose latest attempt failed; pass over the
    /// rest (never claimed, succeeded, running).
    pub only_failed: bool,
    /// Also run a period whose fire is still ahead.
    pub early: bool,
    /// Wait for a period held elsewhere, or for a concurrency slot.
    pub wait: bool,
    /// Say what would be claimed; claim nothing.
    pub dry_run: bool,
    /// Run first, in dependency order, the upstream periods (`after`) the
    /// asked periods need that have not succeeded.
    pub with_upstream: bool,
    /// Only this shard (from 0) of each period: of one job, split into
    /// shards.
    pub shard: Option<u32>,
    /// How the front end names the fields, for its error messages.
    pub names: Names,
    /// Who asks: an API token's name, or `cli:` and the user; noted on
    /// each manual attempt.
    pub by: Arc<str>,
}

impl Request {
    /// Whether it names its periods (a label or a range): a run by hand.
    pub(super) fn manual(&self) -> bool {
        self.periods != Selection::Due
    }
}

/// Checks `request` against every job it applies to, before the database
/// is opened: labels, their order, periods not started or not due, and
/// force or early without periods.
pub fn check(config: &Config, request: &Request, now: DateTime<Utc>) -> Result<(), Error> {
    let n = request.names;
    let named = format!("{} LABEL or {} LABEL {} LABEL", n.period, n.from, n.to);
    if request.early && !request.manual() {
        return Err(Error::Usage(format!(
            "{}: needs {named}; a scheduled run only takes periods that are due",
            n.early
        )));
    }
    if request.force && !request.manual() {
        return Err(Error::Usage(format!(
            "{}: needs {named}; it re-runs succeeded periods, so it names them",
            n.force
        )));
    }
    if request.only_failed && !request.manual() {
        return Err(Error::Usage(format!(
            "{}: needs {named}; a scheduled run retries failed periods on its own",
            n.only_failed
        )));
    }
    if request.only_failed && request.force {
        return Err(Error::Usage(format!(
            "{}: give {} or {}, not both: one runs every period again, the other only failed ones",
            n.only_failed, n.force, n.only_failed
        )));
    }
    if request.with_upstream && !request.manual() {
        return Err(Error::Usage(format!(
            "{}: needs {named}; a scheduled run claims what waited once its upstream periods are done",
            n.with_upstream
        )));
    }
    for job in &config.jobs {
        if request
            .job
            .as_ref()
            .is_none_or(|name| config.full_name(name) == *job.name)
        {
            one_shard(job, request)?;
            manual_range(job, request, now)?;
        }
    }
    Ok(())
}

/// Refuses a shard the job does not have: any, for a job whose periods are
/// not split.
fn one_shard(job: &Job, request: &Request) -> Result<(), Error> {
    let job = (job.name.as_ref(), job.policy.shards, "its periods");
    crate::engine::labels::shard_of(job, request.shard, request.names.shard, false).map(|_| ())
}

/// The periods a manual run (`--period`, `--from/--to`) asks for, or `None`
/// for a scheduled one. The newest must have started and, unless `--early`,
/// be due.
pub(super) fn manual_range(
    job: &Job,
    request: &Request,
    now: DateTime<Utc>,
) -> Result<Option<RangeWalk>, Error> {
    let n = request.names;
    match &request.periods {
        Selection::Due => Ok(None),
        Selection::Period(label) => {
            let period = parse_label(job, label, n.period)?;
            if is_empty(&period) {
                return Err(Error::NoSuchPeriod {
                    field: n.period,
                    job: job.name.to_string(),
                    message: format!(
                        "period {} does not exist in {}: a spring-forward skips it",
                        period.label,
                        job.schedule.zone().name()
                    ),
                    label: period.label,
                });
            }
            refuse_future(job, &period, now, n.period)?;
            refuse_fireless(job, &period, n.period)?;
            if !request.early {
                refuse_not_due(job, &period, now, (n.period, n.early))?;
            }
            Ok(Some(RangeWalk::new(period.clone(), period)))
        }
        Selection::Range(from, to) => {
            let (first, last) = bounds(job, (from, to), n)?;
            refuse_future(job, &last, now, n.to)?;
            if !request.early {
                refuse_not_due(job, &last, now, (n.to, n.early))?;
            }
            Ok(Some(RangeWalk::new(first, last)))
        }
    }
}
