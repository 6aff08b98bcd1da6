//! SQLite's attempts as `history` reads them, the rows `status` shows,
//! and pruning.

use std::time::Duration;

use sqlx::Row;

use super::claims::claimable;
use super::{NOW, SqliteStore, claim_row, opt_time, time};
use crate::store::{Attempt, ClaimRow};

impl SqliteStore {
    /// The attempts whose `column` (`job` or `period_key`) is `value`.
    pub(in crate::store) async fn history(
        &self,
        column: &'static str,
        value: &str,
        limit: u32,
    ) -> Result<Vec<Attempt>, sqlx::Error> {
        let rows = sqlx::query(&format!(
            "SELECT * FROM scheduler_attempts WHERE {column} = ?1
              ORDER BY started_at DESC, attempt DESC LIMIT ?2"
        ))
        .bind(value)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(Attempt {
                    period_key: row.try_get("period_key")?,
                    attempt: row.try_get("attempt")?,
                    trigger: crate::store::trigger(row.try_get("trigger")?)?,
                    owner: row.try_get("owner")?,
                    scheduled_at: opt_time(row, "scheduled_at")?,
                    started_at: time(row.try_get("started_at")?),
                    finished_at: opt_time(row, "finished_at")?,
                    outcome: crate::store::attempt_outcome(row.try_get("outcome")?)?,
                    exit_code: row.try_get("exit_code")?,
                    http_status: row.try_get("http_status")?,
                    error: row.try_get("error")?,
                    output: row.try_get("output")?,
                    asked: row.try_get("asked")?,
                    requested_by: row.try_get("requested_by")?,
                    definition: row.try_get("definition")?,
                    trace_id: String::new(),
                }
                .traced())
            })
            .collect()
    }

    pub(in crate::store) async fn recent(
        &self,
        job: &str,
        limit: u32,
    ) -> Result<Vec<ClaimRow>, sqlx::Error> {
        let rows = sqlx::query(&format!(
            "SELECT c.*, {} AS claimable, {NOW} AS now FROM scheduler_claims c
              WHERE c.period_key IN (
                    SELECT period_key FROM (SELECT period_key FROM scheduler_claims WHERE job = ?1
                                             ORDER BY period_start DESC LIMIT ?2)
                    UNION
                    SELECT period_key FROM (SELECT period_key FROM scheduler_claims
                                             WHERE job = ?1 AND state IN ('running', 'released', 'failed')
                                             ORDER BY period_start DESC LIMIT ?3)
                    UNION
                    SELECT period_key FROM (SELECT period_key FROM scheduler_claims
                                             WHERE job = ?1 AND finished_at IS NOT NULL
                                             ORDER BY finished_at DESC LIMIT 1))
              ORDER BY c.period_start DESC",
            claimable("0", "0", "0")
        ))
        .bind(job)
        .bind(limit)
        .bind(crate::store::UNSETTLED_SHOWN)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(claim_row).collect()
    }

    pub(in crate::store) async fn prune(
        &self,
        job: &str,
        keep: Duration,
        window: Duration,
        dry_run: bool,
    ) -> Result<u64, sqlx::Error> {
        // The claims to go, oldest first. A period still waiting may need
        // one, however long it waits: a pruned claim reads as a period
        // never run.
        const DOOMED: &str = "SELECT period_key FROM scheduler_claims c
                       WHERE job = ?1 AND state IN ('succeeded', 'failed')
                         AND finished_at < ?2 AND scheduled_at < ?3
                         AND NOT EXISTS (
                             SELECT 1 FROM scheduler_waiting w
                              WHERE w.period_start <= c.period_end
                                AND w.period_end >= c.period_start
                                AND NOT EXISTS (SELECT 1 FROM scheduler_claims o
                                                 WHERE o.period_key = w.period_key))";
        // One cutoff for every batch: SQLite's clock moves between them,
        // and claims deleted without their attempts would leave rows that
        // block the period's next claim.
        let now: i64 = sqlx::query_scalar(&format!("SELECT {NOW}"))
            .fetch_one(&self.pool)
            .await?;
        let finished_before = now.saturating_sub(keep.as_millis() as i64);
        let fired_before = now.saturating_sub(window.as_millis() as i64);
        if dry_run {
            let doomed: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM ({DOOMED})"))
                .bind(job)
                .bind(finished_before)
                .bind(fired_before)
                .fetch_one(&self.pool)
                .await?;
            return Ok(doomed as u64);
        }
        // A batch per transaction, so that the claims of other processes
        // wait for one batch at most, never for the whole prune. Within
        // one, each table's delete picks the same keys: the same oldest
        // ones, and nothing else writes meanwhile.
        let batch = format!(
            "{DOOMED} ORDER BY period_start, period_key LIMIT {}",
            crate::store::PRUNE_BATCH
        );
        let mut pruned = 0;
        loop {
            let mut tx = self.begin().await?;
            let mut claims = 0;
            // A waiting row a crash left beside its claim would, the claim
            // gone, read as a period never run. The claims go last.
            for table in [
                "scheduler_output",
                "scheduler_attempts",
                "scheduler_waiting",
                "scheduler_claims",
            ] {
                claims = sqlx::query(&format!(
                    "DELETE FROM {table} WHERE period_key IN ({batch})"
                ))
                .bind(job)
                .bind(finished_before)
                .bind(fired_before)
                .execute(&mut *tx)
                .await?
                .rows_affected();
            }
            tx.commit().await?;
            pruned += claims;
            if claims < u64::from(crate::store::PRUNE_BATCH) {
                return Ok(pruned);
            }
        }
    }
}
