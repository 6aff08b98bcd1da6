//! `scheduler check` and `scheduler next`: what the file says, read back.

use std::io::Write;

use chrono::{DateTime, Utc};

use crate::config::{Config, Job};
use crate::fires::Fire;
use crate::period::{PeriodKey, utc_text};

/// One line per fire: local time in the job's zone, UTC, period key; for
/// a fire moved to a working day the day it was moved from, for a
/// jittered one its delay; for a job with a `deadline` when the period is
/// late if not succeeded.
pub fn fire_line(job: &Job, fire: Fire) -> String {
    let zone = job.schedule.zone();
    let timing = job.timing();
    let period = timing.period_of(&fire);
    let mut notes = String::new();
    let jitter = timing.jitter(fire.nominal);
    let nominal_day = fire.nominal.with_timezone(&zone).date_naive();
    // Moved by the calendar, not carried past midnight by the jitter.
    if (fire.at - jitter).with_timezone(&zone).date_naive() != nominal_day {
        notes += &format!("  moved from {nominal_day}");
    }
    if !jitter.is_zero() {
        notes += &format!("  jitter +{}s", jitter.num_seconds());
    }
    if let Some(d) = job
        .policy
        .deadline
        .and_then(|d| chrono::TimeDelta::from_std(d).ok())
    {
        notes += &format!("  late after {}", utc_text(fire.at + d));
    }
    format!(
        "{}  {}  {}{notes}",
        fire.at.with_timezone(&zone).format("%Y-%m-%d %H:%M:%S %Z"),
        utc_text(fire.at),
        PeriodKey::new(&job.name, &period.label)
    )
}

/// Lists every job with its zone, schedule, period rule and next fire.
pub fn check(config: &Config, now: DateTime<Utc>, out: &mut dyn Write) -> std::io::Result<()> {
    writeln!(
        out,
        "{}: {} job{} OK",
        config.path.display(),
        config.jobs.len(),
        if config.jobs.len() == 1 { "" } else { "s" }
    )?;
    for job in &config.jobs {
        let next = job
            .timing()
            .next(now)
            .map_or_else(|| "never".to_owned(), |fire| fire_line(job, fire));
        let mut after: Vec<&str> = job
            .after
            .upstream
            .iter()
            .map(|up| up.job.as_str())
            .collect();
        if job.after.previous {
            after.push(&job.name);
        }
        let mut after = match after.is_empty() {
            true => String::new(),
            false => format!("  after {}", after.join(", ")),
        };
        if job.policy.shards > 1 {
            after += &format!("  shards {}", job.policy.shards);
        }
        writeln!(
            out,
            "{}  zone {}  schedule `{}`  period {} ({})  next {}{after}",
            job.name,
            job.schedule.zone(),
            job.schedule.source(),
            job.period.unit,
            job.period.covers,
            next
        )?;
    }
    Ok(())
}

/// The next `count` fires of `job` after `after`.
pub fn next(
    job: &Job,
    after: DateTime<Utc>,
    count: u32,
    out: &mut dyn Write,
) -> std::io::Result<()> {
    let timing = job.timing();
    let mut shown = 0;
    let mut from = after;
    while shown < count {
        let Some(first) = timing.next(from) else {
            break;
        };
        // Every fire due at that instant (a weekend's, moved to Monday).
        let tick = chrono::TimeDelta::nanoseconds(1);
        for fire in timing.between(first.at - tick, first.at) {
            if shown < count {
                writeln!(out, "{}", fire_line(job, fire))?;
                shown += 1;
            }
        }
        from = first.at;
    }
    if shown < count {
        // Said beside the fires, not among them: a script reads those.
        let why = match job.schedule.days().and_then(|d| d.until) {
            Some(until) => format!("its active dates end on {until}"),
            None => "within the dates the scheduler computes".to_owned(),
        };
        eprintln!(
            "{}: no {}fire after {}: {why}",
            job.name,
            if shown == 0 { "" } else { "further " },
            crate::period::utc_text(from)
        );
    }
    Ok(())
}
