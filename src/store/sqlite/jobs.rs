//! SQLite's record of the jobs: first sightings, pauses, newest fires.

use std::collections::HashMap;

use chrono::{DateTime, Utc};
use futures_util::TryStreamExt;
use sqlx::Row;

use super::{NOT_SEEN, NOW, SqliteStore, ms, opt_time, time};
use crate::store::{JobRecord, Owes, Sighted};

/// How many names one statement of [`SqliteStore::see_jobs`] sights.
const SEEN_AT_ONCE: usize = 1_000;

impl SqliteStore {
    pub(in crate::store) async fn see_jobs(
        &self,
        jobs: &[String],
    ) -> Result<HashMap<String, JobRecord>, sqlx::Error> {
        let mut tx = self.begin().await?;
        // One instant for every row, read once: a row that holds it after
        // the statement was seen for the first time by it.
        let now: i64 = sqlx::query_scalar(&format!("SELECT {NOW}"))
            .fetch_one(&mut *tx)
            .await?;
        let mut seen = HashMap::with_capacity(jobs.len());
        // SQLite holds a statement's RETURNING rows until it ends: 10,000
        // names in one statement were the peak of a start-up of 10,000
        // idle jobs. A statement per thousand, in the one transaction.
        for names in jobs.chunks(SEEN_AT_ONCE) {
            let names = serde_json::to_string(names).unwrap_or_else(|_| "[]".into());
            let mut rows = sqlx::query(
                "INSERT INTO scheduler_jobs (name, first_seen)
                 SELECT value, ?2 FROM json_each(?1) WHERE true
                 ON CONFLICT (name) DO UPDATE
                     SET first_seen = min(scheduler_jobs.first_seen, excluded.first_seen)
                 RETURNING name, first_seen, owed_from, timing, owed_period, paused",
            )
            .bind(names)
            .bind(now)
            .fetch(&mut *tx);
            while let Some(row) = rows.try_next().await? {
                let first_seen: i64 = row.try_get("first_seen")?;
                let record = JobRecord {
                    first_seen: time(first_seen),
                    owed_from: opt_time(&row, "owed_from")?,
                    timing: row.try_get("timing")?,
                    owed_period: opt_time(&row, "owed_period")?,
                    paused: row.try_get("paused")?,
                    new: first_seen == now,
                };
                seen.insert(row.try_get("name")?, record);
            }
        }
        tx.commit().await?;
        Ok(seen)
    }

    pub(in crate::store) async fn first_seen(
        &self,
        jobs: &[String],
    ) -> Result<HashMap<String, Sighted>, sqlx::Error> {
        let names = serde_json::to_string(jobs).unwrap_or_else(|_| "[]".into());
        let statement = format!(
            "SELECT name, first_seen, owed_from, timing, owed_period FROM scheduler_jobs
              WHERE name IN (SELECT value FROM json_each(?1)) AND first_seen < {NOT_SEEN}"
        );
        let mut rows = sqlx::query(&statement).bind(names).fetch(&self.pool);
        // Row by row: 10,000 jobs' rows held at once were a minute's peak.
        let mut seen = HashMap::with_capacity(jobs.len());
        while let Some(row) = rows.try_next().await? {
            seen.insert(
                row.try_get("name")?,
                Sighted {
                    first_seen: time(row.try_get("first_seen")?),
                    owed_from: opt_time(&row, "owed_from")?,
                    timing: row.try_get("timing")?,
                    owed_period: opt_time(&row, "owed_period")?,
                },
            );
        }
        Ok(seen)
    }

    pub(in crate::store) async fn note_owed(&self, owed: &[Owes]) -> Result<(), sqlx::Error> {
        let rows: Vec<(&str, i64, i64, &str)> = owed
            .iter()
            .map(|o| (o.job.as_str(), ms(o.from), ms(o.period), o.timing.as_str()))
            .collect();
        let rows = serde_json::to_string(&rows).unwrap_or_else(|_| "[]".into());
        let mut tx = self.begin().await?;
        sqlx::query(
            "UPDATE scheduler_jobs
                SET owed_from = json_extract(owed.value, '$[1]'),
                    owed_period = json_extract(owed.value, '$[2]'),
                    timing = json_extract(owed.value, '$[3]')
               FROM json_each(?1) AS owed
              WHERE scheduler_jobs.name = json_extract(owed.value, '$[0]')
                AND (scheduler_jobs.owed_from IS NULL
                     OR scheduler_jobs.timing IS NOT json_extract(owed.value, '$[3]'))",
        )
        .bind(rows)
        .execute(&mut *tx)
        .await?;
        tx.commit().await
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
        let names = serde_json::to_string(jobs).unwrap_or_else(|_| "[]".into());
        let rows: Vec<(String, i64)> = sqlx::query_as(
            "SELECT job, max(scheduled_at) FROM scheduler_claims
              WHERE job IN (SELECT value FROM json_each(?1)) AND trigger <> 'manual'
              GROUP BY job",
        )
        .bind(names)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows.into_iter().map(|(job, at)| (job, time(at))).collect())
    }

    pub(in crate::store) async fn set_paused(
        &self,
        job: &str,
        paused: bool,
    ) -> Result<(), sqlx::Error> {
        sqlx::query(&format!(
            "INSERT INTO scheduler_jobs (name, first_seen, paused) VALUES (?1, {NOT_SEEN}, ?2)
             ON CONFLICT (name) DO UPDATE SET paused = excluded.paused"
        ))
        .bind(job)
        .bind(paused)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
