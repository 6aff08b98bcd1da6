//! `after`: the jobs whose periods a job's periods wait for, linked once
//! every job is known (the file's and the library's), and checked: every
//! name a job, no cycle, and nothing that could never be satisfied.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;

use super::{Config, ConfigError, Job, short};
use crate::period::{PeriodRule, Unit};
use crate::schedule::Schedule;
use crate::suggest::nearest;

/// What a job's periods wait for: `after` in `jobs.toml`.
#[derive(Debug, Clone, Default)]
pub struct After {
    /// The jobs named, as written, each with where it is written.
    pub named: Vec<Named>,
    /// The other jobs named, linked: what a period of this job needs of
    /// each is the periods of it whose windows overlap its own.
    pub upstream: Vec<Upstream>,
    /// The job names itself: each period also needs the job's period
    /// before it (an incremental job).
    pub previous: bool,
    /// What becomes of a succeeded period when a period it needed succeeds
    /// again.
    pub on_rerun: OnRerun,
}

impl After {
    /// Waiting for nothing: one value, shared by every job that waits for
    /// nothing (56 bytes a job, 5.3 MiB for 100,000 jobs, otherwise).
    pub fn nothing() -> Arc<After> {
        static NOTHING: std::sync::LazyLock<Arc<After>> = std::sync::LazyLock::new(Arc::default);
        NOTHING.clone()
    }

    /// Whether the job's periods wait for anything.
    pub fn any(&self) -> bool {
        self.previous || !self.upstream.is_empty()
    }
}

/// A job name in `after`, with its place (`FILE:LINE:COLUMN`, or the code
/// job), for the errors about it.
#[derive(Debug, Clone)]
pub struct Named {
    /// As written.
    pub name: String,
    /// Where.
    pub place: String,
}

/// An upstream job as its downstream jobs need it: what makes its periods.
#[derive(Debug, Clone)]
pub struct Upstream {
    /// Its name, as the database knows it.
    pub job: String,
    /// Its schedule and zone.
    pub schedule: Schedule,
    /// Its period rule.
    pub period: PeriodRule,
    /// How its fires move and are delayed.
    pub fires: crate::fires::FireRules,
    /// Into how many shards its periods are split (1: not split).
    pub shards: u32,
}

impl Upstream {
    /// Its fires as they run.
    pub fn timing(&self) -> crate::fires::Timing<'_> {
        crate::fires::Timing::new(&self.job, &self.schedule, &self.period, &self.fires)
    }
}

/// `on_upstream_rerun`: what a succeeded period becomes when a period it
/// needed succeeds again (a forced rerun).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnRerun {
    /// It is shown `stale`; nothing runs on its own (a second run of a
    /// period is what this scheduler exists to prevent: an operator
    /// decides, with `run JOB --period LABEL --force`).
    #[default]
    Stale,
    /// It runs again once, trigger `upstream`.
    Rerun,
}

impl std::fmt::Display for OnRerun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            OnRerun::Stale => "stale",
            OnRerun::Rerun => "rerun",
        })
    }
}

/// For each job, the jobs it waits for: the position of each, and where
/// it is named.
type Edges<'c> = Vec<Vec<(usize, &'c Named)>>;

impl Config {
    /// Links every job's `after` to the jobs it names (by their names in
    /// the database, the namespace included), and refuses unknown names,
    /// cycles and upstream jobs that could never satisfy it. Every mistake
    /// is reported at once.
    pub(crate) fn link_after(&mut self) -> Result<(), ConfigError> {
        let mut errors = Vec::new();
        // For each job, the jobs it waits for (its position, and where).
        let (edges, previous) = self.after_edges(&mut errors);
        if let Some((cycle, named)) = first_cycle(&edges) {
            let path: Vec<&str> = cycle
                .iter()
                .map(|i| self.short_name(&self.jobs[*i]))
                .collect();
            errors.push(named.error(format!(
                "`after`: a cycle: {}; each would wait for the other for ever (a job waits for its own previous period by naming itself)",
                path.join(" → ")
            )));
        }
        if !errors.is_empty() {
            return Err(ConfigError::joined(errors));
        }
        let upstream: Vec<Vec<Upstream>> = edges
            .iter()
            .map(|ups| {
                ups.iter()
                    .map(|(up, _)| {
                        let up = &self.jobs[*up];
                        Upstream {
                            job: up.name.to_string(),
                            schedule: up.schedule.clone(),
                            period: up.period,
                            fires: up.policy.fires.clone(),
                            shards: up.policy.shards,
                        }
                    })
                    .collect()
            })
            .collect();
        for ((job, upstream), previous) in self.jobs.iter_mut().zip(upstream).zip(previous) {
            if upstream.is_empty() && !previous && !job.after.any() {
                continue;
            }
            // Unshared while the file is read: no copy is made.
            let after = Arc::make_mut(&mut Arc::make_mut(job).after);
            after.upstream = upstream;
            after.previous = previous;
        }
        Ok(())
    }

    /// For each job, the jobs its `after` names (their position, and where
    /// each is named), and whether it waits for its own previous period;
    /// mistakes added to `errors`.
    fn after_edges(&self, errors: &mut Vec<ConfigError>) -> (Edges<'_>, Vec<bool>) {
        let by_name: HashMap<&str, usize> = self
            .jobs
            .iter()
            .enumerate()
            .map(|(i, job)| (job.name.as_ref(), i))
            .collect();
        let mut edges: Edges = vec![Vec::new(); self.jobs.len()];
        let mut previous = vec![false; self.jobs.len()];
        for (i, job) in self.jobs.iter().enumerate() {
            for named in &job.after.named {
                let full = self.full_name(&named.name);
                if full == *job.name {
                    if job.policy.missed != super::Missed::All {
                        errors.push(named.error(format!(
                            "`after`: `{}` waits for its own previous period, but `missed = \"{}\"` skips the periods missed while nothing ran: the one after a skipped period would wait for it for ever; use `missed = \"all\"` (the default)",
                            job.name,
                            match job.policy.missed {
                                super::Missed::Latest => "latest",
                                _ => "skip",
                            }
                        )));
                    }
                    previous[i] = true;
                    continue;
                }
                match by_name.get(full.as_ref()) {
                    Some(&up) => {
                        if let Some(problem) =
                            never_satisfied(job, &self.jobs[up], self.settings.catch_up)
                        {
                            errors.push(named.error(problem));
                        }
                        edges[i].push((up, named));
                    }
                    None => {
                        let names = self.jobs.iter().map(|j| self.short_name(j));
                        let hint = nearest(&named.name, names)
                            .map(|n| format!("; did you mean `{n}`?"))
                            .unwrap_or_default();
                        errors.push(
                            named.error(format!("`after`: no job named `{}`{hint}", named.name)),
                        );
                    }
                }
            }
        }
        (edges, previous)
    }
}

impl After {
    /// The names of `after` that are none of `names` (every job's name as
    /// written, the job's own included), each as the mistake `link_after`
    /// reports.
    #[cfg(feature = "config-file")]
    pub(crate) fn unknown_names(&self, names: &[String]) -> Vec<ConfigError> {
        self.named
            .iter()
            .filter(|named| !names.contains(&named.name))
            .map(|named| {
                let hint = nearest(&named.name, names.iter().map(String::as_str))
                    .map(|n| format!("; did you mean `{n}`?"))
                    .unwrap_or_default();
                named.error(format!("`after`: no job named `{}`{hint}", named.name))
            })
            .collect()
    }
}

impl Named {
    fn error(&self, message: String) -> ConfigError {
        ConfigError {
            place: self.place.clone(),
            message,
        }
    }
}

/// How many periods of an upstream job one period may need at most: each
/// is looked up whenever the period is claimed or shown.
pub const MOST_NEEDED: u64 = 100_000;

/// Why `up` could never satisfy `job`'s `after`, if so: its finished
/// claims may be pruned (`keep`) before a period of `job` that needs them
/// is due (a pruned claim reads as a period never run), or one period of
/// `job` would need more of its periods than can be looked up.
fn never_satisfied(job: &Job, up: &Job, catch_up: Duration) -> Option<String> {
    let shortest = shortest(up.period.unit, &up.schedule).as_secs().max(1);
    let most = longest(job.period.unit, &job.schedule).as_secs() / shortest;
    if most > MOST_NEEDED {
        return Some(format!(
            "`after`: a period of `{}` ({}) overlaps up to {most} periods of `{}` ({}), each looked up whenever it is claimed or shown; at most {MOST_NEEDED} can be: give `{}` a longer `period`, or wait for a job that sums it up",
            job.name, job.period.unit, up.name, up.period.unit, up.name
        ));
    }
    let keep = up.policy.keep?;
    // A period of `job` is due up to one of its periods after its upstream
    // periods began (a fire covering the period before it), and waits in
    // the catch-up window; its upstream claims must last that long.
    let needed = longest(job.period.unit, &job.schedule) * 2 + catch_up;
    // Said in whole days.
    let days = needed.as_secs().div_ceil(86_400);
    (keep < needed).then(|| {
        format!(
            "`after`: `{}` keeps its finished claims for {} (`keep`), but a period of `{}` ({}) may need them for up to {days} days: pruned, they read as never run, and `{}` would wait for them for ever; raise `keep` of `{}` to at least \"{days}d\"",
            up.name,
            short(keep),
            job.name,
            job.period.unit,
            job.name,
            up.name,
        )
    })
}

/// The longest period of `unit` (for `fire`, the longest gap between the
/// schedule's next fires, looked at over a year).
fn longest(unit: Unit, schedule: &Schedule) -> Duration {
    const HOUR: u64 = 3600;
    const DAY: u64 = 24 * HOUR;
    let secs = match unit {
        Unit::Minute => 60,
        Unit::Hour => 2 * HOUR,
        Unit::Day => DAY + HOUR,
        Unit::Week => 7 * DAY + HOUR,
        Unit::Month => 31 * DAY + HOUR,
        Unit::Quarter => 92 * DAY + HOUR,
        Unit::Year => 366 * DAY + HOUR,
        // A schedule that fires once a year or less: a year at least.
        Unit::Fire => gaps(schedule, chrono::TimeDelta::days(366))
            .max()
            .unwrap_or(366 * DAY),
    };
    Duration::from_secs(secs)
}

/// The shortest period of `unit` (for `fire`, the shortest gap between
/// the schedule's next fires, looked at over a day).
fn shortest(unit: Unit, schedule: &Schedule) -> Duration {
    const HOUR: u64 = 3600;
    const DAY: u64 = 24 * HOUR;
    let secs = match unit {
        Unit::Minute => 60,
        Unit::Hour => HOUR,
        Unit::Day => DAY - HOUR,
        Unit::Week => 7 * DAY - HOUR,
        Unit::Month => 28 * DAY - HOUR,
        Unit::Quarter => 89 * DAY - HOUR,
        Unit::Year => 365 * DAY - HOUR,
        Unit::Fire => gaps(schedule, chrono::TimeDelta::days(1))
            .min()
            .unwrap_or(DAY),
    };
    Duration::from_secs(secs)
}

/// The gaps between the schedule's next fires, in seconds, over `ahead`
/// (10,000 at most).
fn gaps(schedule: &Schedule, ahead: chrono::TimeDelta) -> impl Iterator<Item = u64> + '_ {
    let now = chrono::Utc::now();
    let fires = std::iter::successors(schedule.next_after(now), |fire| schedule.next_after(*fire))
        .take_while(move |fire| *fire < now + ahead)
        .take(10_000);
    fires
        .clone()
        .zip(fires.skip(1))
        .map(|(fire, next)| (next - fire).num_seconds().max(1) as u64)
}

/// The first cycle among `edges` (each job's upstream jobs), as the jobs
/// along it from one back to itself, with the `after` entry that closes it.
fn first_cycle<'a>(edges: &[Vec<(usize, &'a Named)>]) -> Option<(Vec<usize>, &'a Named)> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        New,
        OnPath,
        Done,
    }
    let mut marks = vec![Mark::New; edges.len()];
    for root in 0..edges.len() {
        if marks[root] != Mark::New {
            continue;
        }
        // Depth first, without recursion: each frame a job and the next
        // of its edges to follow.
        let mut path: Vec<(usize, usize)> = vec![(root, 0)];
        marks[root] = Mark::OnPath;
        while let Some(&mut (job, ref mut next)) = path.last_mut() {
            let Some(&(up, named)) = edges[job].get(*next) else {
                marks[job] = Mark::Done;
                path.pop();
                continue;
            };
            *next += 1;
            match marks[up] {
                Mark::OnPath => {
                    let from = path.iter().position(|(j, _)| *j == up).unwrap_or(0);
                    let mut cycle: Vec<usize> = path[from..].iter().map(|(j, _)| *j).collect();
                    cycle.push(up);
                    return Some((cycle, named));
                }
                Mark::New => {
                    marks[up] = Mark::OnPath;
                    path.push((up, 0));
                }
                Mark::Done => {}
            }
        }
    }
    None
}
