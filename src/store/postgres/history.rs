//! PostgreSQL's attempts as `history` reads them, the rows `status`
//! shows, and pruning.

use std::time::Duration;

use sqlx::Row;

use super::{PgStore, claim_row, millis};
use crate::store::{Attempt, ClaimRow};

impl PgStore {
    /// The attempts whose `column` (`job` or `period_key`) is `value`.
    pub(in crate::store) async fn history(
        &self,
        column: &'static str,
        value: &str,
        limit: u32,
    ) -> Result<Vec<Attempt>, sqlx::Error> {
        let rows = sqlx::query(&format!(
            "SELECT * FROM scheduler_attempts WHERE {column} = $1
              ORDER BY started_at DESC, attempt DESC LIMIT $2"
        ))
        .bind(value)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(Attempt {
                    period_key: row.try_get("period_key")?,
                    attempt: row.try_get("attempt")?,
                    trigger: crate::store::trigger(row.try_get("trigger")?)?,
                    owner: row.try_get("owner")?,
                    scheduled_at: row.try_get("scheduled_at")?,
                    started_at: row.try_get("started_at")?,
                    finished_at: row.try_get("finished_at")?,
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
        let rows = sqlx::query(
            "SELECT c.*, scheduler_claimable(c.state, c.lease_until, c.retry_at, false, false) AS claimable,
                    now() AS now
               FROM scheduler_claims c
              WHERE c.period_key IN (
                    (SELECT period_key FROM scheduler_claims WHERE job = $1
                      ORDER BY period_start DESC LIMIT $2)
                    UNION
                    (SELECT period_key FROM scheduler_claims
                      WHERE job = $1 AND state IN ('running', 'released', 'failed')
                      ORDER BY period_start DESC LIMIT $3)
                    UNION
                    (SELECT period_key FROM scheduler_claims
                      WHERE job = $1 AND finished_at IS NOT NULL
                      ORDER BY finished_at DESC LIMIT 1))
              ORDER BY c.period_start DESC",
        )
        .bind(job)
        .bind(i64::from(limit))
        .bind(i64::from(crate::store::UNSETTLED_SHOWN))
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
        const DOOMED: &str = "SELECT period_key FROM scheduler_claims
              WHERE job = $1 AND state IN ('succeeded', 'failed')
                AND finished_at < now() - $2 * interval '1 millisecond'
                AND scheduled_at < now() - $3 * interval '1 millisecond'
                AND NOT EXISTS (
                    SELECT 1 FROM scheduler_waiting w
                     WHERE w.period_start <= (extract(epoch from scheduler_claims.period_end) * 1000)::bigint
                       AND w.period_end >= (extract(epoch from scheduler_claims.period_start) * 1000)::bigint
                       AND NOT EXISTS (SELECT 1 FROM scheduler_claims o
                                        WHERE o.period_key = w.period_key))";
        // On the actions' pool: a large count may outlast the control
        // pool's statement timeout.
        if dry_run {
            let doomed: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM ({DOOMED}) d"))
                .bind(job)
                .bind(millis(keep))
                .bind(millis(window))
                .fetch_one(&self.actions)
                .await?;
            return Ok(doomed as u64);
        }
        let mut pruned = 0;
        loop {
            // A batch per transaction: each holds its rows' locks briefly,
            // and what it deleted stays deleted if a later one fails.
            let batch: i64 = sqlx::query_scalar(&format!(
                "WITH c AS (
                    DELETE FROM scheduler_claims
                     WHERE period_key IN ({DOOMED} ORDER BY period_start LIMIT $4)
                 RETURNING period_key),
                 a AS (DELETE FROM scheduler_attempts a USING c WHERE a.period_key = c.period_key),
                 o AS (DELETE FROM scheduler_output o USING c WHERE o.period_key = c.period_key),
                 -- A waiting row a crash left beside its claim would, the
                 -- claim gone, read as a period never run.
                 w AS (DELETE FROM scheduler_waiting w USING c WHERE w.period_key = c.period_key)
                 SELECT count(*) FROM c"
            ))
            .bind(job)
            .bind(millis(keep))
            .bind(millis(window))
            .bind(i64::from(crate::store::PRUNE_BATCH))
            .fetch_one(&self.actions)
            .await?;
            pruned += batch as u64;
            if batch < i64::from(crate::store::PRUNE_BATCH) {
                return Ok(pruned);
            }
        }
    }
}
