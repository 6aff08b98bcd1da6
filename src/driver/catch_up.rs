//! The driver's catch-up: what was missed while nothing ran (at start-up,
//! for a job a reload shows the database for the first time) and the fires
//! a paused job skipped here, once it is resumed.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use chrono::{DateTime, TimeDelta, Utc};

use super::Service;
use crate::config::{Job, Missed};
use crate::engine::due::{Due, due};
use crate::error::Error;
use crate::store::Trigger;

/// How many jobs start-up shows the database a transaction. 100,000 jobs'
/// rows at once (SQLite holds a `RETURNING`'s rows until the statement
/// ends) were most of start-up's peak, and the heap they grew stayed
/// pinned by what lasts: VmHWM 161 MiB, 128 MiB in transactions of 10,000.
/// A thousand a transaction kept no less and started slower. A failure
/// part-way leaves the sightings before it recorded, as a restart would
/// have them.
const SIGHTED_AT_START: usize = 10_000;

impl Service {
    /// Claims what was missed while nothing ran: for each job, the periods
    /// whose fires fall after the newest one ever claimed, within the
    /// catch-up window and not before the job was first seen. The jobs are
    /// sighted [`SIGHTED_AT_START`] at a time.
    pub(super) async fn catch_up(&mut self) -> Result<(), Error> {
        let store = self.engine.store().clone();
        let now = self.clock.now();
        let window = now - TimeDelta::from_std(self.settings.catch_up).unwrap_or_default();
        let jobs = self.jobs.clone();
        self.owed = HashMap::with_capacity(jobs.len());
        for jobs in jobs.chunks(SIGHTED_AT_START) {
            let names: Vec<String> = jobs.iter().map(|j| j.name.to_string()).collect();
            let records = store.see_jobs(&names).await?;
            let last_fires = store.last_fires(&names).await?;
            let sighted = jobs
                .iter()
                .filter_map(|job| Some((&**job, records.get(&*job.name)?)));
            let owed = crate::engine::owed::owed_from_all(&store, sighted, now).await;
            self.owed.extend(owed);
            for job in jobs {
                let (Some(record), Some(&owed)) =
                    (records.get(&*job.name), self.owed.get(&*job.name))
                else {
                    continue;
                };
                if record.new {
                    crate::engine::due::log_first_sighting(job, owed);
                }
                let mut since = window.max(owed);
                if let Some(last) = last_fires.get(&*job.name) {
                    since = since.max(*last + TimeDelta::nanoseconds(1));
                }
                if record.paused {
                    self.paused.insert(job.name.to_string(), since);
                    continue;
                }
                let partly = partly_claimed(&store, job, window.max(owed)).await?;
                self.catch_up_job(job.clone(), since, now, partly);
            }
        }
        Ok(())
    }

    /// Dispatches the fires of `job` from `since` on that are due now, as
    /// `missed` has them, as catch-ups: oldest first, as many as the job
    /// may run at once now, the rest as its runs end. When more are due
    /// than that, they all wait, and the oldest are released from waiting
    /// ahead of the fires: dispatched among the fires, the oldest went
    /// behind a newer one released by the next scan, and a stop before it
    /// came up left it to no `serve` (adversarial review).
    /// `partly` (the periods split into shards of which some were never
    /// claimed) go first: their fires are older than `since`.
    pub(super) fn catch_up_job(
        &mut self,
        job: Arc<Job>,
        since: DateTime<Utc>,
        now: DateTime<Utc>,
        partly: Vec<Due>,
    ) {
        // Nothing older than the window is listed: it would only be dropped,
        // and listing it first would hold the window's own fires back.
        let window = TimeDelta::from_std(self.settings.catch_up).unwrap_or_default();
        let since = since
            .max(now - window)
            .max(self.owed_since(&job).unwrap_or(since));
        let with_latest = job.policy.missed != Missed::Skip;
        let missed: Vec<Due> = partly
            .into_iter()
            .chain(
                due(&job, now, since, with_latest)
                    .into_iter()
                    .filter(|d| d.fire >= since),
            )
            .map(|d| Due {
                trigger: Trigger::CatchUp,
                ..d
            })
            .collect();
        let at_once = job.policy.concurrency as usize;
        if missed.len() <= at_once {
            for d in missed {
                self.dispatch(job.clone(), d, now);
            }
            return;
        }
        for d in missed {
            self.wait(job.name.clone(), d);
        }
        self.release_waiting(&job.name, at_once);
    }

    /// The instant from which `job`'s fires are owed; `None` for a job
    /// whose first sighting is not known here yet (the database did not
    /// answer the reload that brought it).
    pub(super) fn owed_since(&self, job: &Job) -> Option<DateTime<Utc>> {
        self.owed.get(&*job.name).copied()
    }

    /// Follows the pauses in the database (a scan) or the API's: a newly
    /// paused job skips its fires from now; a resumed one catches up the
    /// fires it skipped here, as `missed` and `catch_up` have them (a
    /// pause delays periods, as a suspended Kubernetes CronJob does; it
    /// does not drop them). Other replicas catch up the same fires: the
    /// claims make that once.
    pub(super) fn follow_pauses(&mut self, paused: HashSet<String>) {
        let now = self.clock.now();
        for name in &paused {
            if !self.paused.contains_key(name) {
                // Its fires waiting for a slot are dropped while it is
                // paused: skipped as the ones to come are.
                let since = self.oldest_queued_fire(name).map_or(now, |f| f.min(now));
                self.paused.insert(name.clone(), since);
            }
        }
        let resumed: Vec<(String, DateTime<Utc>)> = self
            .paused
            .iter()
            .filter(|(name, _)| !paused.contains(*name))
            .map(|(name, since)| (name.clone(), *since))
            .collect();
        for (name, since) in resumed {
            self.paused.remove(&name);
            if let Some(job) = self.job(&name) {
                tracing::info!(job = name, since = %crate::period::utc_text(since), "resumed: catching up the fires skipped while paused");
                self.catch_up_job(job, since, now, Vec::new());
            }
        }
    }
}

/// The shards never claimed of `job`'s periods whose fires are from
/// `from` on and of which other shards were claimed: what a shutdown left
/// waiting for a slot. Restart's catch-up starts after the newest fire
/// claimed, and would pass them over. One statement, for a job split into
/// shards only.
async fn partly_claimed(
    store: &crate::store::Store,
    job: &Job,
    from: DateTime<Utc>,
) -> Result<Vec<Due>, Error> {
    if job.policy.shards <= 1 {
        return Ok(Vec::new());
    }
    let timing = job.timing();
    let Some(first) = timing.next(from - TimeDelta::nanoseconds(1)) else {
        return Ok(Vec::new());
    };
    let start = timing.period_of(&first).start;
    let mut partly = Vec::new();
    for (period, fire, shards) in store.partly_claimed(&job.name, start).await? {
        let due = Due {
            period,
            fire,
            trigger: Trigger::CatchUp,
            shard: None,
        };
        partly.extend(due.split(shards));
    }
    Ok(partly)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use chrono::DurationRound;
    use tokio::sync::watch;

    use super::*;
    use crate::clock::StoppedClock;
    use crate::config::Config;
    use crate::engine::Engine;
    use crate::store::Store;

    /// Start-up sights its jobs a transaction of [`SIGHTED_AT_START`] at a
    /// time: the job after the first transaction's is sighted too, and
    /// catches up its latest fire as the first one does (a loop over the
    /// transactions that lost the last one fails here).
    #[tokio::test]
    async fn start_up_catches_up_the_jobs_past_the_first_transaction() {
        let jobs = SIGHTED_AT_START + 1;
        let text: String = (0..jobs)
            .map(|i| {
                format!("[[job]]\nname = \"j{i}\"\nschedule = \"@daily\"\ncommand = [\"true\"]\n")
            })
            .collect();
        let path = std::path::Path::new("jobs.toml");
        let config = Config::parse(path, &text, &|_| None).expect("valid jobs");
        let dir = tempfile::tempdir().expect("a temp dir");
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let store = Store::connect(&url).await.expect("a SQLite store");
        store.migrate().await.expect("migrated");
        let engine = Engine::new(store, Duration::from_secs(30), "t".into()).expect("an engine");
        // The database's clock sights the jobs: the service's is now too,
        // away from a day's turn (the two would see different days, and
        // the jobs after the first transaction are sighted later).
        let day = |at: DateTime<Utc>| at.duration_trunc(TimeDelta::days(1)).unwrap();
        if day(Utc::now()) != day(Utc::now() + TimeDelta::minutes(1)) {
            tokio::time::sleep(Duration::from_secs(61)).await;
        }
        let now = Utc::now();
        let clock = Arc::new(StoppedClock::at(now));
        let (_down, shutdown) = watch::channel(false);
        let mut service = Service::on(path.into(), config, engine, shutdown).with_clock(clock);
        service.catch_up().await.expect("the catch-up");
        assert_eq!(service.owed.len(), jobs);
        let caught_up: Vec<String> = service
            .pending
            .iter()
            .map(|(job, due)| format!("{}:{}", job.name, due.period.label))
            .collect();
        assert_eq!(caught_up.len(), jobs);
        let midnight = crate::period::utc_text(day(now));
        for job in [0, jobs - 1] {
            let latest = format!("j{job}:{midnight}");
            assert!(caught_up.contains(&latest), "{latest} not caught up");
        }
    }

    /// The timer starts before start-up sights the jobs: a fire of a job
    /// between the two, before the job owes its fires, is not run (every
    /// view has it as no period of the job's), while the ones from then on
    /// are (adversarial review).
    #[tokio::test]
    async fn fires_from_before_a_job_owes_its_fires_are_not_run() {
        let text = "[[job]]\nname = \"k\"\nschedule = \"* * * * * *\"\nmissed = \"all\"\ncommand = [\"true\"]\n";
        let path = std::path::Path::new("jobs.toml");
        let config = Config::parse(path, text, &|_| None).expect("a valid job");
        let dir = tempfile::tempdir().expect("a temp dir");
        let url = format!("sqlite://{}", dir.path().join("s.db").display());
        let store = Store::connect(&url).await.expect("a SQLite store");
        let engine = Engine::new(store, Duration::from_secs(30), "t".into()).expect("an engine");
        let start = DateTime::parse_from_rfc3339("2027-01-04T10:00:00.5Z")
            .unwrap()
            .to_utc();
        let clock = Arc::new(StoppedClock::at(start));
        let (_down, shutdown) = watch::channel(false);
        let mut service =
            Service::on(path.into(), config, engine, shutdown).with_clock(clock.clone());
        // Sighted three seconds after the timer started: it owes its
        // fires from 10:00:03.
        service
            .owed
            .insert("k".into(), start + TimeDelta::milliseconds(2_500));
        clock.advance(TimeDelta::seconds(5));
        service.fire();
        let fired: Vec<String> = service
            .pending
            .iter()
            .map(|(job, due)| format!("{}:{}", job.name, due.period.label))
            .collect();
        assert_eq!(
            fired,
            [
                "k:2027-01-04T10:00:03Z",
                "k:2027-01-04T10:00:04Z",
                "k:2027-01-04T10:00:05Z"
            ]
        );
    }
}
