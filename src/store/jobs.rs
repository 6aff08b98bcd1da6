//! Jobs as the database knows them: when each was first seen and from when
//! it owes its fires, paused or not, its newest scheduled fire.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::Store;
use crate::error::Error;

/// A job as the database has seen it.
#[derive(Debug, Clone)]
pub struct JobRecord {
    /// When a `run` or `serve` first saw it.
    pub first_seen: DateTime<Utc>,
    /// From when it owes its fires, as its first sighting fixed it
    /// ([`Store::note_owed`]); `None` where no sighting recorded it yet.
    pub owed_from: Option<DateTime<Utc>>,
    /// When it fires, as the sighting that recorded `owed_from` saw it
    /// ([`crate::config::Job::when`]); `None` on rows from before it was
    /// recorded.
    pub timing: Option<String>,
    /// The start of the first period it owes, recorded with `timing`.
    pub owed_period: Option<DateTime<Utc>>,
    /// Seen for the first time by the call that returned this.
    pub new: bool,
    /// Paused for every replica.
    pub paused: bool,
}

/// A job's first sighting as the database holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sighted {
    /// When a `run` or `serve` first saw it.
    pub first_seen: DateTime<Utc>,
    /// From when it owes its fires, where its first sighting recorded it.
    pub owed_from: Option<DateTime<Utc>>,
    /// When it fires, as the sighting that recorded `owed_from` saw it.
    pub timing: Option<String>,
    /// The start of the first period it owes, recorded with `timing`.
    pub owed_period: Option<DateTime<Utc>>,
}

/// What a sighting records of a job: from when it owes its fires, the
/// start of the first period it owes, and the fingerprint of the timing
/// both follow from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owes {
    /// The job.
    pub job: String,
    /// From when it owes its fires.
    pub from: DateTime<Utc>,
    /// The start of the first period it owes.
    pub period: DateTime<Utc>,
    /// [`crate::config::Job::when`].
    pub timing: String,
}

impl JobRecord {
    /// The sighting as [`Store::first_seen`] reads it.
    pub fn sighted(&self) -> Sighted {
        Sighted {
            first_seen: self.first_seen,
            owed_from: self.owed_from,
            timing: self.timing.clone(),
            owed_period: self.owed_period,
        }
    }
}

impl Store {
    /// Records `jobs` as seen (now, on the database's clock) where new, in
    /// one statement, and returns each one's record.
    pub async fn see_jobs(&self, jobs: &[String]) -> Result<HashMap<String, JobRecord>, Error> {
        bounded!(self.see_jobs(jobs))
    }

    /// When each of `jobs` was first seen, and from when it owes its
    /// fires where that is recorded, for those a `serve` or `run JOB` has
    /// seen (one only `pause` named is not); reads only.
    pub async fn first_seen(&self, jobs: &[String]) -> Result<HashMap<String, Sighted>, Error> {
        bounded!(self.first_seen(jobs))
    }

    /// Records what each sighting of `owed` says a job owes: for a job
    /// seen for the first time, or whose timing changed since the last
    /// record (a row from before timings were recorded gains them). A row
    /// already holding that timing is left as it is: fixed there, so that a
    /// later edit of anything else never moves it. One statement for them
    /// all (10,000 jobs first seen are one write, not 10,000).
    pub async fn note_owed(&self, owed: &[Owes]) -> Result<(), Error> {
        if owed.is_empty() {
            return Ok(());
        }
        bounded!(self.note_owed(owed))
    }

    /// The jobs paused for every replica.
    pub async fn paused_jobs(&self) -> Result<Vec<String>, Error> {
        bounded!(self.paused_jobs())
    }

    /// For each of `jobs` with claims, the newest fire a claim was made for
    /// by a scheduler, not by hand: a hand run of a recent period says
    /// nothing of the periods before it.
    pub async fn last_fires(
        &self,
        jobs: &[String],
    ) -> Result<HashMap<String, DateTime<Utc>>, Error> {
        bounded!(self.last_fires(jobs))
    }

    /// Pauses or resumes `job` for every replica.
    pub async fn set_paused(&self, job: &str, paused: bool) -> Result<(), Error> {
        bounded!(self.set_paused(job, paused))
    }
}
