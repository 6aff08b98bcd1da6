//! The library's read side: where jobs and periods stand, and the
//! attempts kept, read through the one view `scheduler status`,
//! `history`, the HTTP API and the console show.

use crate::engine::labels::{Names, periods_between};
use crate::engine::overview::{self, JobOverview};
use crate::engine::view::{self, PeriodView};
use crate::error::Error;
use crate::store::Attempt;

use super::Scheduler;

/// How many of each job's newest claims [`Scheduler::status`] reads, as
/// `scheduler status` does.
const RECENT: u32 = 5;

/// The most periods [`Scheduler::periods`] reads in one call.
pub const PERIODS_LIMIT: usize = 100_000;

impl Scheduler {
    /// Where `job` stands (every job with `None`), as `scheduler status`
    /// shows it: its next fire, newest claims, what runs and failed, and
    /// the periods it owes that are overdue, late, waiting, ready or stale.
    /// [`JobOverview`]s, in the order the jobs were given.
    pub async fn status(&self, job: Option<&str>) -> Result<Vec<JobOverview<'_>>, Error> {
        let jobs = match job {
            Some(name) => vec![self.job(name)?],
            None => self.config.jobs.iter().map(|j| &**j).collect(),
        };
        overview::of_jobs(self.engine.store(), &jobs, RECENT, self.engine.now()).await
    }

    /// [`Scheduler::status`] as JSON, one object per job: the shape of
    /// `scheduler status --json` and the HTTP API's `GET /v1/jobs`.
    pub async fn status_json(&self, job: Option<&str>) -> Result<Vec<serde_json::Value>, Error> {
        let now = self.engine.now();
        let overviews = self.status(job).await?;
        Ok(overviews
            .iter()
            .map(|o| overview::json(o, &self.config, now))
            .collect())
    }

    /// Each period of `job` from label `from` to `to`, both included,
    /// oldest first, as `scheduler status JOB --from --to` shows them: its
    /// state by the one rule (succeeded, failed, running, waiting, missing,
    /// not due, before the job owed it, …), its fire and its claim. At most
    /// [`PERIODS_LIMIT`] periods.
    pub async fn periods(&self, job: &str, from: &str, to: &str) -> Result<Vec<PeriodView>, Error> {
        let job = self.job(job)?;
        let periods = periods_between(job, (from, to), PERIODS_LIMIT, Names::CODE)?;
        let now = self.engine.now();
        let mut views = Vec::with_capacity(periods.len());
        for chunk in periods.chunks(view::VIEWS_PER_READ) {
            views.extend(view::periods(self.engine.store(), job, chunk, now).await?);
        }
        Ok(views)
    }

    /// The attempts of `job` (of its period `label` only, if given), newest
    /// first, at most `limit`, as `scheduler history` lists them: trigger,
    /// owner, times, outcome, error and the kept output tail.
    pub async fn history(
        &self,
        job: &str,
        label: Option<&str>,
        limit: u32,
    ) -> Result<Vec<Attempt>, Error> {
        let job = self.job(job)?;
        let store = self.engine.store();
        match label {
            Some(label) => {
                let period = crate::engine::labels::parse_label(job, label, Names::CODE.period)?;
                let key = crate::period::PeriodKey::new(&job.name, &period.label);
                store.attempts(key.as_str(), limit).await
            }
            None => store.history(&job.name, limit).await,
        }
    }
}
