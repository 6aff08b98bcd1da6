//! The operator's actions, in one place for every front end (the command
//! line, the HTTP API, the library): release a running period, pause or
//! resume a job, prune what is old.

use std::time::Duration;

use super::labels::{Names, page_between, period_of_label};
use crate::config::{Config, Job};
use crate::error::Error;
use crate::period::{Period, PeriodKey};
use crate::store::{Released, Store};

/// Ends the running claim of `period` of `job` (of its `shard`, or of
/// every running shard of a period split into shards): its runner stops
/// the job at its next heartbeat and records nothing; the period can be
/// claimed once the runner confirms, or its lease runs out. The key, and
/// what was released (`None`: nothing was running): of several shards,
/// their runners and the latest lease.
pub async fn release(
    store: &Store,
    job: &Job,
    period: &Period,
    (shard, field): (Option<u32>, &'static str),
) -> Result<(PeriodKey, Option<Released>), Error> {
    let (key, claims) = super::shards::key_of(store, job, period, (shard, field, false)).await?;
    if shard.is_some() || claims.shard_rows.is_empty() {
        let released = store.release_key(key.as_str()).await?;
        return Ok((key, released));
    }
    let mut all: Option<Released> = None;
    for (_, row) in claims
        .shard_rows
        .iter()
        .filter(|(_, row)| row.state.is_live())
    {
        if let Some(released) = store.release_key(&row.period_key).await? {
            all = Some(match all {
                None => released,
                // Each runner named once, however many shards it ran.
                Some(before) if before.owner.split(", ").any(|o| o == released.owner) => Released {
                    lease_until: before.lease_until.max(released.lease_until),
                    ..before
                },
                Some(before) => Released {
                    owner: format!("{}, {}", before.owner, released.owner),
                    lease_until: before.lease_until.max(released.lease_until),
                },
            });
        }
    }
    Ok((key, all))
}

/// Which periods `scheduler adopt` records.
#[derive(Debug, Clone, Copy)]
pub enum Adoption<'a> {
    /// Every period through this label that the scheduler would take on
    /// its own (the job owes it, within `catch_up`: for a job not seen yet,
    /// what a first run would take), and this one, if it is older.
    Through(&'a str),
    /// Every period of the range, both ends included.
    Range(&'a str, &'a str),
}

/// What `adopt` did.
#[derive(Debug)]
pub enum Adopted {
    /// These periods are recorded as adopted, oldest first.
    Recorded(Vec<PeriodKey>),
    /// Nothing written: these periods have a claim (running, succeeded,
    /// failed, released, or adopted already), with where each stands.
    Claimed(Vec<crate::store::ClaimRow>),
}

/// What the labels of an adoption are called where they were given, for
/// its messages.
#[derive(Debug, Clone, Copy)]
pub struct AdoptNames {
    /// The last period of [`Adoption::Through`].
    pub through: &'static str,
    /// The first period of [`Adoption::Range`].
    pub from: &'static str,
    /// The last period of [`Adoption::Range`].
    pub to: &'static str,
}

impl AdoptNames {
    /// The command line's flags.
    pub const FLAGS: AdoptNames = AdoptNames {
        through: "--through",
        from: "--from",
        to: "--to",
    };
    /// The HTTP API's JSON fields.
    pub const JSON: AdoptNames = AdoptNames {
        through: "through",
        from: "from",
        to: "to",
    };
}

/// How many periods one `adopt` records at most.
pub const ADOPT_LIMIT: usize = 100_000;

/// Records the periods `which` names of `job` as adopted (docs/commands.md): an
/// earlier system ran them, so no mode runs them, `after` counts them
/// succeeded and every view shows them apart. Refused (a usage error,
/// nothing written) for a label that is no period of the job or a period
/// not yet due; with nothing written when any of them has a claim.
pub async fn adopt(
    store: &Store,
    job: &Job,
    which: Adoption<'_>,
    by: &str,
    now: chrono::DateTime<chrono::Utc>,
    given: AdoptNames,
) -> Result<Adopted, Error> {
    check_adoption(job, which, now, given)?;
    let (last_name, names) = adopt_names(which, given);
    let (from, to) = match which {
        Adoption::Range(from, to) => (from.to_owned(), to),
        Adoption::Through(to) => {
            let last = period_of_label(job, to, last_name)?;
            let first = first_owed(store, job, last, now).await?;
            (first.label, to)
        }
    };
    let asked = adopted_periods(job, (&from, to), now, last_name, names)?;
    let taken = store
        .adopt(&job.name, &asked, job.policy.shards, by)
        .await?;
    if !taken.is_empty() {
        let rows = store.rows(&taken).await?;
        let mut rows: Vec<_> = rows.into_values().collect();
        rows.sort_by(|a, b| a.period_key.cmp(&b.period_key));
        return Ok(Adopted::Claimed(rows));
    }
    Ok(Adopted::Recorded(
        asked
            .iter()
            .map(|(period, _)| PeriodKey::new(&job.name, &period.label))
            .collect(),
    ))
}

/// Refuses, before any database is asked, what `which` names wrongly (a
/// usage error in the words `given`): a label that is no period of `job`,
/// a period not yet due, a range of more than [`ADOPT_LIMIT`] periods.
/// [`adopt`] asks it first.
pub fn check_adoption(
    job: &Job,
    which: Adoption<'_>,
    now: chrono::DateTime<chrono::Utc>,
    given: AdoptNames,
) -> Result<(), Error> {
    let (last_name, names) = adopt_names(which, given);
    match which {
        Adoption::Range(from, to) => {
            adopted_periods(job, (from, to), now, last_name, names)?;
        }
        Adoption::Through(to) => {
            let last = period_of_label(job, to, last_name)?;
            refuse_not_due(job, &last, now, last_name)?;
        }
    }
    Ok(())
}

/// The names of an adoption's fields, as the labels' messages use them:
/// the last label's, and the range's.
fn adopt_names(which: Adoption<'_>, given: AdoptNames) -> (&'static str, Names) {
    match which {
        Adoption::Through(_) => (
            given.through,
            Names {
                to: given.through,
                ..Names::FLAGS
            },
        ),
        Adoption::Range(..) => (
            given.to,
            Names {
                from: given.from,
                to: given.to,
                ..Names::FLAGS
            },
        ),
    }
}

/// The periods `from..=to` of `job` with their fires, each due by `now`.
fn adopted_periods(
    job: &Job,
    (from, to): (&str, &str),
    now: chrono::DateTime<chrono::Utc>,
    last_name: &'static str,
    names: Names,
) -> Result<Vec<(Period, chrono::DateTime<chrono::Utc>)>, Error> {
    period_of_label(job, from, names.from)?;
    let last = period_of_label(job, to, last_name)?;
    refuse_not_due(job, &last, now, last_name)?;
    let (periods, more) = page_between(job, (from, to), ADOPT_LIMIT, names)?;
    if more.is_some() {
        return Err(Error::Usage(format!(
            "{last_name}: the range holds more than {ADOPT_LIMIT} periods; adopt it in parts"
        )));
    }
    periods
        .into_iter()
        .map(|period| {
            let fire = refuse_not_due(job, &period, now, last_name)?;
            Ok((period, fire))
        })
        .collect()
}

/// The first period `adopt --through` records, through `last`: the
/// period of the first fire the job owes, or `last` itself.
async fn first_owed(
    store: &Store,
    job: &Job,
    last: Period,
    now: chrono::DateTime<chrono::Utc>,
) -> Result<Period, Error> {
    // From the first fire the job owes (docs/commands.md): what a first
    // run would take, for a job not seen yet.
    let owing = super::owed::owing(store, [job], now).await?;
    let window = chrono::TimeDelta::from_std(job.policy.catch_up)
        .ok()
        .and_then(|w| now.checked_sub_signed(w))
        .unwrap_or(chrono::DateTime::<chrono::Utc>::MIN_UTC);
    let owed = window.max(owing.owed_at(job, now).min(now));
    Ok(job
        .timing()
        .next(owed - chrono::TimeDelta::nanoseconds(1))
        .map(|fire| job.timing().period_of(&fire))
        .filter(|first| first.start < last.start)
        .unwrap_or(last))
}

/// The fire of `period`, refused (naming `field`) if it is still ahead:
/// no earlier system can have run a period before it was due.
fn refuse_not_due(
    job: &Job,
    period: &Period,
    now: chrono::DateTime<chrono::Utc>,
    field: &'static str,
) -> Result<chrono::DateTime<chrono::Utc>, Error> {
    let fire = job.timing().of(period);
    fire.filter(|fire| *fire <= now).ok_or_else(|| {
        let period_key = PeriodKey::new(&job.name, &period.label).to_string();
        Error::NotDue {
            field,
            message: format!(
                "{period_key} is not due yet (its fire is {}): only a period an earlier system has run can be adopted",
                fire.map_or_else(|| "never".to_owned(), crate::period::utc_text)
            ),
            period_key,
            due_at: fire.unwrap_or(chrono::DateTime::<chrono::Utc>::MAX_UTC),
            early_runs_it: false,
        }
    })
}

/// Pauses the job named `job` (`true`) or resumes it, for every replica:
/// each reads it at its next scan. A process with no loop of its own (the
/// command line) says it this way.
pub async fn pause(store: &Store, job: &str, paused: bool) -> Result<(), Error> {
    store.set_paused(job, paused).await
}

impl super::Engine {
    /// Pauses or resumes the job named `job` for every replica, as
    /// [`pause`] does, and tells every loop on this engine at once (the
    /// HTTP API's, the library's), rather than at its next scan.
    pub async fn pause(&self, job: &str, paused: bool) -> Result<(), Error> {
        pause(self.store(), job, paused).await?;
        // No loop listening is no error: the scan reads the database.
        let _ = self.pauses.send((job.to_owned(), paused));
        Ok(())
    }

    /// Pauses and resumes said through this engine, as they come.
    pub fn pauses(&self) -> tokio::sync::broadcast::Receiver<(String, bool)> {
        self.pauses.subscribe()
    }
}

/// What a prune deleted, or would.
#[derive(Debug, Default)]
pub struct Pruned {
    /// Per job with a `keep`: its name, its `keep` and the finished claims
    /// older than it (periods fired inside the catch-up window are kept).
    pub jobs: Vec<(String, Duration, u64)>,
    /// With `[api]`: its `key_ttl` and the Idempotency-Keys and runs past it.
    pub api: Option<(Duration, u64)>,
    /// Per job with a `keep_output`: its name, its `keep_output` and the
    /// chunks of output older than it.
    pub output: Vec<(String, Duration, u64)>,
}

/// Deletes (with `dry_run`, counts) the finished claims of every job with
/// `keep` older than it, and the Idempotency-Keys past `[api].key_ttl`.
pub async fn prune(config: &Config, store: &Store, dry_run: bool) -> Result<Pruned, Error> {
    let mut pruned = Pruned::default();
    for job in &config.jobs {
        if let Some(keep) = job.policy.keep {
            let n = store
                .prune(&job.name, keep, config.settings.catch_up, dry_run)
                .await?;
            pruned.jobs.push((job.name.to_string(), keep, n));
        }
        if let Some(keep) = job.policy.keep_output {
            let n = store.prune_output(&job.name, keep, dry_run).await?;
            pruned.output.push((job.name.to_string(), keep, n));
        }
    }
    if let Some(api) = &config.api {
        pruned.api = Some((api.key_ttl, store.prune_api(dry_run).await?));
    }
    Ok(pruned)
}
