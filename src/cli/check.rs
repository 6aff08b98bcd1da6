//! `scheduler check` and `scheduler next`: what the file says, read back.

use std::io::Write;

use chrono::{DateTime, Utc};

use crate::config::{Config, Job};
use crate::period::{PeriodKey, utc_text};

/// One line per fire: local time in the job's zone, UTC, period key, and
/// for a job with a `deadline` when the period is late if not succeeded.
pub fn fire_line(job: &Job, fire: DateTime<Utc>) -> String {
    let local = fire.with_timezone(&job.schedule.zone());
    let period = job.period.period_of(&job.schedule, fire);
    let deadline = job
        .deadline
        .and_then(|d| chrono::TimeDelta::from_std(d).ok())
        .map(|d| format!("  late after {}", utc_text(fire + d)))
        .unwrap_or_default();
    format!(
        "{}  {}  {}{deadline}",
        local.format("%Y-%m-%d %H:%M:%S %Z"),
        utc_text(fire),
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
            .schedule
            .next_after(now)
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
        let after = match after.is_empty() {
            true => String::new(),
            false => format!("  after {}", after.join(", ")),
        };
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
    let fires = std::iter::successors(job.schedule.next_after(after), |t| {
        job.schedule.next_after(*t)
    });
    let mut shown = 0;
    for fire in fires.take(count as usize) {
        writeln!(out, "{}", fire_line(job, fire))?;
        shown += 1;
    }
    if shown < count {
        // Said beside the fires, not among them: a script reads those.
        eprintln!(
            "{}: no {}fire after {} within the dates the scheduler computes",
            job.name,
            if shown == 0 { "" } else { "further " },
            crate::period::utc_text(after)
        );
    }
    Ok(())
}
