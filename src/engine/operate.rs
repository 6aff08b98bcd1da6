//! The operator's actions, in one place for every front end (the command
//! line, the HTTP API, the library): release a running period, pause or
//! resume a job, prune what is old.

use std::time::Duration;

use crate::config::{Config, Job};
use crate::error::Error;
use crate::period::{Period, PeriodKey};
use crate::store::{Released, Store};

/// Ends the running claim of `period` of `job`: its runner stops the job at
/// its next heartbeat and records nothing; the period can be claimed once
/// the runner confirms, or its lease runs out. The key, and what was
/// released (`None`: the period has no running claim).
pub async fn release(
    store: &Store,
    job: &Job,
    period: &Period,
) -> Result<(PeriodKey, Option<Released>), Error> {
    let key = PeriodKey::new(&job.name, &period.label);
    let released = store.release_key(key.as_str()).await?;
    Ok((key, released))
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
}

/// Deletes (with `dry_run`, counts) the finished claims of every job with
/// `keep` older than it, and the Idempotency-Keys past `[api].key_ttl`.
pub async fn prune(config: &Config, store: &Store, dry_run: bool) -> Result<Pruned, Error> {
    let mut pruned = Pruned::default();
    for job in &config.jobs {
        if let Some(keep) = job.keep {
            let n = store
                .prune(&job.name, keep, config.settings.catch_up, dry_run)
                .await?;
            pruned.jobs.push((job.name.clone(), keep, n));
        }
    }
    if let Some(api) = &config.api {
        pruned.api = Some((api.key_ttl, store.prune_api(dry_run).await?));
    }
    Ok(pruned)
}
