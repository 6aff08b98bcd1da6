//! PostgreSQL's record of the jobs: first sightings, pauses, newest fires.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use futures_util::TryStreamExt;
use sqlx::Row;

use super::PgStore;
use crate::store::{JobRecord, Owes, Sighted};

impl PgStore {
    pub(in crate::store) async fn see_jobs(
        &self,
        jobs: &[String],
    ) -> Result<HashMap<String, JobRecord>, sqlx::Error> {
        let mut rows = sqlx::query(
            "INSERT INTO scheduler_jobs (name, first_seen)
             SELECT name, now() FROM unnest($1::text[]) AS name
             ON CONFLICT (name) DO UPDATE
                 SET first_seen = LEAST(scheduler_jobs.first_seen, excluded.first_seen)
             RETURNING name, first_seen, owed_from, timing, owed_period, paused, first_seen = now() AS new",
        )
        .bind(jobs)
        .fetch(&self.pool);
        // Row by row, as `first_seen` reads them.
        let mut seen = HashMap::with_capacity(jobs.len());
        while let Some(row) = rows.try_next().await? {
            let record = JobRecord {
                first_seen: row.try_get("first_seen")?,
                owed_from: row.try_get("owed_from")?,
                timing: row.try_get("timing")?,
                owed_period: row.try_get("owed_period")?,
                paused: row.try_get("paused")?,
                new: row.try_get("new")?,
            };
            seen.insert(row.try_get("name")?, record);
        }
        Ok(seen)
    }

    pub(in crate::store) async fn first_seen(
        &self,
        jobs: &[String],
    ) -> Result<HashMap<String, Sighted>, sqlx::Error> {
        let mut rows = sqlx::query(
            "SELECT name, first_seen, owed_from, timing, owed_period FROM scheduler_jobs
              WHERE name = ANY($1) AND first_seen < '9999-12-31T00:00:00Z'",
        )
        .bind(jobs)
        .fetch(&self.pool);
        // Row by row: 10,000 jobs' rows held at once were a minute's peak.
        let mut seen = HashMap::with_capacity(jobs.len());
        while let Some(row) = rows.try_next().await? {
            seen.insert(
                row.try_get("name")?,
                Sighted {
                    first_seen: row.try_get("first_seen")?,
                    owed_from: row.try_get("owed_from")?,
                    timing: row.try_get("timing")?,
                    owed_period: row.try_get("owed_period")?,
                },
            );
        }
        Ok(seen)
    }

    pub(in crate::store) async fn note_owed(&self, owed: &[Owes]) -> Result<(), sqlx::Error> {
        let jobs: Vec<&str> = owed.iter().map(|o| o.job.as_str()).collect();
        let from: Vec<DateTime<Utc>> = owed.iter().map(|o| o.from).collect();
        let period: Vec<DateTime<Utc>> = owed.iter().map(|o| o.period).collect();
        let timing: Vec<&str> = owed.iter().map(|o| o.timing.as_str()).collect();
        sqlx::query(
            "UPDATE scheduler_jobs
                SET owed_from = owed.at, owed_period = owed.period, timing = owed.timing
               FROM unnest($1::text[], $2::timestamptz[], $3::timestamptz[], $4::text[])
                    AS owed (name, at, period, timing)
              WHERE scheduler_jobs.name = owed.name
                AND (scheduler_jobs.owed_from IS NULL
                     OR scheduler_jobs.timing IS DISTINCT FROM owed.timing)",
        )
        .bind(jobs)
        .bind(from)
        .bind(period)
        .bind(timing)
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    pub(in crate::store) async fn paused_jobs(&self) -> Result<Vec<String>, sqlx::Error> {
        sqlx::query_scalar("SELECT name FROM scheduler_jobs WHERE paused")
            .fetch_all(&self.pool)
            .await
    }

    pub(in crate::store) async fn last_fires(
        &self,
        jobs: &[String],
    ) -> Result<HashMap<String, DateTime<Utc>>, sqlx::Error> {
        let rows: Vec<(String, DateTime<Utc>)> = sqlx::query_as(
            "SELECT job, max(scheduled_at) FROM scheduler_claims
             WHERE job = ANY($1) AND trigger <> 'manual' GROUP BY job",
        )
        .bind(jobs)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().collect())
    }

    pub(in crate::store) async fn set_paused(
        &self,
        job: &str,
        paused: bool,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(
            // A job only `pause` or `resume` has named is not seen yet: its
            // first sighting (`see_jobs`) sets `first_seen`, so a new job
            // paused before it is deployed still starts at its next fire.
            "INSERT INTO scheduler_jobs (name, first_seen, paused)
             VALUES ($1, '9999-12-31T00:00:00Z', $2)
             ON CONFLICT (name) DO UPDATE SET paused = excluded.paused",
        )
        .bind(job)
        .bind(paused)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
