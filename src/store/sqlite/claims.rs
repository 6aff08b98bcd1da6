//! SQLite's claims: taken in a `BEGIN IMMEDIATE` transaction, renewed,
//! recorded, released and recovered; periods adopted.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{Row, Sqlite, Transaction};

use super::{NOW, SqliteStore, claim_row, ms, opt_time, time};
use crate::period::{Period, PeriodKey};
use crate::store::{
    ADOPTED_ATTEMPT, Claim, ClaimRequest, ClaimRow, Finish, GroupedSql, Lease, Reclaimable,
    Released,
};

impl SqliteStore {
    /// `_wait`: claims take turns through the write lock, whatever it says.
    /// `hold`: an expired lease is answered as held, not taken over
    /// ([`crate::store::outage`]).
    pub(in crate::store) async fn claim_many(
        &self,
        requests: &[ClaimRequest<'_>],
        _wait: bool,
        hold: bool,
    ) -> Result<Vec<Claim>, sqlx::Error> {
        // One write transaction, so one commit for the whole batch; inside
        // it each key is the one-key claim statement, which sees what the
        // batch claimed before it.
        let mut tx = self.begin().await?;
        let mut claims = Vec::with_capacity(requests.len());
        for r in requests {
            claims.push(claim(&mut tx, r, hold).await?);
        }
        // How manual runs were asked for, on the attempts won, in the same
        // commit and one statement; (key, attempt, how, by) travel as one
        // JSON array.
        let asked: Vec<(&str, i32, &str, &str)> = requests
            .iter()
            .zip(&claims)
            .filter_map(|(r, claim)| match (r.asked, claim) {
                (Some(asked), Claim::Won(lease)) => {
                    Some((lease.key.as_str(), lease.attempt, asked.how, asked.by))
                }
                _ => None,
            })
            .collect();
        if !asked.is_empty() {
            sqlx::query(
                "UPDATE scheduler_attempts SET asked = h.value ->> 2, requested_by = h.value ->> 3
                   FROM json_each(?1) AS h
                  WHERE period_key = h.value ->> 0 AND attempt = h.value ->> 1",
            )
            .bind(serde_json::to_string(&asked).unwrap_or_else(|_| "[]".into()))
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(claims)
    }

    pub(in crate::store) async fn renew(
        &self,
        leases: &[&Lease],
        lease: Duration,
    ) -> Result<Vec<bool>, sqlx::Error> {
        let mut tx = self.begin().await?;
        let mut renewed = Vec::with_capacity(leases.len());
        for l in leases {
            let done = sqlx::query(&format!(
                "UPDATE scheduler_claims SET lease_until = {NOW} + ?3
                  WHERE period_key = ?1 AND attempt = ?2 AND state = 'running'"
            ))
            .bind(l.key.as_str())
            .bind(l.attempt)
            .bind(lease.as_millis() as i64)
            .execute(&mut *tx)
            .await?;
            renewed.push(done.rows_affected() == 1);
        }
        tx.commit().await?;
        Ok(renewed)
    }

    pub(in crate::store) async fn finish_many(
        &self,
        outcomes: &[(&Lease, Finish)],
    ) -> Result<std::collections::HashSet<String>, sqlx::Error> {
        let mut conn = self.pool.acquire().await?;
        record_many(&mut conn, outcomes).await
    }

    pub(in crate::store) async fn release(
        &self,
        lease: &Lease,
        output: Option<&str>,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.begin().await?;
        let done = sqlx::query(&format!(
            "UPDATE scheduler_claims SET state = 'released', lease_until = NULL, finished_at = {NOW}
              WHERE period_key = ?1 AND attempt = ?2 AND state = 'running'"
        ))
        .bind(lease.key.as_str())
        .bind(lease.attempt)
        .execute(&mut *tx)
        .await?;
        let released = done.rows_affected() == 1;
        if released {
            mark_attempt(&mut tx, lease.key.as_str(), lease.attempt, "released").await?;
            keep_output(&mut tx, lease, output).await?;
        }
        tx.commit().await?;
        Ok(released)
    }

    pub(in crate::store) async fn confirm_stopped(
        &self,
        lease: &Lease,
        output: Option<&str>,
    ) -> Result<bool, sqlx::Error> {
        let mut tx = self.begin().await?;
        let done = sqlx::query(
            "UPDATE scheduler_claims SET lease_until = NULL
              WHERE period_key = ?1 AND attempt = ?2 AND state = 'released'",
        )
        .bind(lease.key.as_str())
        .bind(lease.attempt)
        .execute(&mut *tx)
        .await?;
        let confirmed = done.rows_affected() == 1;
        if confirmed {
            keep_output(&mut tx, lease, output).await?;
        }
        tx.commit().await?;
        Ok(confirmed)
    }

    pub(in crate::store) async fn release_key(
        &self,
        key: &str,
    ) -> Result<Option<Released>, sqlx::Error> {
        let mut tx = self.begin().await?;
        let row = sqlx::query(&format!(
            "UPDATE scheduler_claims SET state = 'released', finished_at = {NOW}
              WHERE period_key = ?1 AND state = 'running' RETURNING owner, attempt, lease_until"
        ))
        .bind(key)
        .fetch_optional(&mut *tx)
        .await?;
        let released = match row {
            Some(row) => {
                mark_attempt(&mut tx, key, row.try_get("attempt")?, "released").await?;
                Some(Released {
                    owner: row.try_get("owner")?,
                    lease_until: opt_time(&row, "lease_until")?,
                })
            }
            None => None,
        };
        tx.commit().await?;
        Ok(released)
    }

    pub(in crate::store) async fn rows(
        &self,
        keys: &[String],
    ) -> Result<Vec<ClaimRow>, sqlx::Error> {
        // One statement for many keys: the keys travel as one JSON array.
        let keys = serde_json::to_string(keys).unwrap_or_else(|_| "[]".into());
        let rows = sqlx::query(&format!(
            "SELECT c.*, {} AS claimable, {NOW} AS now FROM scheduler_claims c
              WHERE c.period_key IN (SELECT value FROM json_each(?1))",
            claimable("0", "0", "0")
        ))
        .bind(keys)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(claim_row).collect()
    }

    pub(in crate::store) async fn period_rows(
        &self,
        periods: &[(&str, &Period)],
    ) -> Result<Vec<ClaimRow>, sqlx::Error> {
        let periods: Vec<(&str, i64, &str)> = periods
            .iter()
            .map(|(job, p)| (*job, ms(p.start), p.label.as_str()))
            .collect();
        let periods = serde_json::to_string(&periods).unwrap_or_else(|_| "[]".into());
        let rows = sqlx::query(&format!(
            "SELECT c.*, {} AS claimable, {NOW} AS now FROM scheduler_claims c
               JOIN (SELECT value ->> 0 AS job, value ->> 1 AS period_start, value ->> 2 AS period
                       FROM json_each(?1)) x
                 ON c.job = x.job AND c.period_start = x.period_start AND c.period = x.period",
            claimable("0", "0", "0")
        ))
        .bind(periods)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(claim_row).collect()
    }

    pub(in crate::store) async fn partly_claimed(
        &self,
        job: &str,
        from: DateTime<Utc>,
    ) -> Result<Vec<(Period, DateTime<Utc>, u32)>, sqlx::Error> {
        let rows: Vec<(String, i64, i64, i64, i64)> = sqlx::query_as(&format!(
            "SELECT o.period, o.period_start, o.period_end, max(o.scheduled_at), max({SHARD_COUNT})
               FROM scheduler_claims o
              WHERE o.job = ?1 AND o.period_start >= ?2
              GROUP BY o.period, o.period_start, o.period_end
             HAVING count(*) < max({SHARD_COUNT})
              ORDER BY o.period_start LIMIT 1000"
        ))
        .bind(job)
        .bind(ms(from))
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(label, start, end, fire, shards)| {
                let period = Period {
                    label,
                    start: time(start),
                    end: time(end),
                };
                (period, time(fire), u32::try_from(shards).unwrap_or(1))
            })
            .collect())
    }

    pub(in crate::store) async fn reclaimable(
        &self,
        jobs: &[String],
        limit: u32,
    ) -> Result<Vec<Reclaimable>, sqlx::Error> {
        let jobs = serde_json::to_string(jobs).unwrap_or_else(|_| "[]".into());
        let rows = sqlx::query(&format!(
            "SELECT period_key, job, period, period_start, period_end, scheduled_at, state, trigger
               FROM scheduler_claims
              WHERE job IN (SELECT value FROM json_each(?1)) AND {}
              ORDER BY period_start LIMIT ?2",
            claimable("0", "0", "0")
        ))
        .bind(jobs)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(Reclaimable {
                    job: row.try_get("job")?,
                    period: Period {
                        label: row.try_get("period")?,
                        start: time(row.try_get("period_start")?),
                        end: time(row.try_get("period_end")?),
                    },
                    scheduled_at: time(row.try_get("scheduled_at")?),
                    shard: PeriodKey::of_stored(row.try_get("period_key")?).shard(),
                    trigger: crate::store::claims::taken_as(
                        row.try_get("state")?,
                        row.try_get("trigger")?,
                    ),
                })
            })
            .collect()
    }

    pub(in crate::store) async fn adopt(
        &self,
        job: &str,
        periods: &[(String, &Period, DateTime<Utc>)],
        by: &str,
    ) -> Result<Vec<String>, sqlx::Error> {
        let rows: Vec<serde_json::Value> = periods
            .iter()
            .map(|(key, period, fire)| {
                serde_json::json!([
                    key,
                    period.label,
                    ms(period.start),
                    ms(period.end),
                    ms(*fire)
                ])
            })
            .collect();
        let rows = serde_json::Value::from(rows).to_string();
        let mut tx = self.begin().await?;
        let taken: Vec<String> = sqlx::query_scalar(
            "SELECT c.period_key FROM json_each(?1) AS r
               JOIN scheduler_claims AS c ON c.period_key = r.value ->> 0",
        )
        .bind(&rows)
        .fetch_all(&mut *tx)
        .await?;
        if !taken.is_empty() {
            return Ok(taken);
        }
        // The trigger `scheduler_claims_attempt_new` writes the attempt row;
        // recording its outcome settles the claim, as every outcome does.
        sqlx::query(&format!(
            "INSERT INTO scheduler_claims
                (period_key, job, period, period_start, period_end, scheduled_at, state,
                 attempt, failures, trigger, owner, lease_until, started_at)
             SELECT r.value ->> 0, ?2, r.value ->> 1, r.value ->> 2, r.value ->> 3,
                    r.value ->> 4, 'running', {ADOPTED_ATTEMPT}, 0, 'adopted', ?3, {NOW}, {NOW}
               FROM json_each(?1) AS r"
        ))
        .bind(&rows)
        .bind(job)
        .bind(by)
        .execute(&mut *tx)
        .await?;
        sqlx::query(&format!(
            "UPDATE scheduler_attempts
                SET outcome = 'succeeded', finished_at = {NOW}, asked = 'adopt', requested_by = ?2
              WHERE attempt = {ADOPTED_ATTEMPT}
                AND period_key IN (SELECT value ->> 0 FROM json_each(?1))"
        ))
        .bind(&rows)
        .bind(by)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Vec::new())
    }
}

/// Which claims can be taken again: SQLite's claim rule, read from
/// `schema/sqlite/claimable.sql` (beside PostgreSQL's), with `manual`,
/// `force` and `hold` (SQL: a parameter or a literal) and the clock put in.
pub(super) fn claimable(manual: &str, force: &str, hold: &str) -> String {
    static RULE: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
        include_str!("../../../schema/sqlite/claimable.sql")
            .lines()
            .filter(|line| !line.starts_with("--"))
            .collect::<Vec<_>>()
            .join("\n")
            .replace(":now", NOW)
    });
    RULE.replace(":manual", manual)
        .replace(":force", force)
        .replace(":hold", hold)
}

/// The claim of one key, inside a write transaction. The attempt row is
/// written by the trigger `scheduler_claims_attempt_*`. The concurrency
/// count gates the row the upsert inserts: with no free slot there is no
/// row, so no insert and no takeover either. The counts name their partial
/// indexes: without statistics SQLite would count the released claims
/// through the job's index, every claim of the job, which grows with
/// history.
/// How many shards claim row `o`'s key is one of: 1 for a period's own key
/// (`billing:2026-11`), 8 for `billing:2026-11#3/8` (labels and job names
/// hold no `#`).
const SHARD_COUNT: &str = "(CASE WHEN instr(o.period_key, '#') = 0 THEN 1
      ELSE CAST(substr(substr(o.period_key, instr(o.period_key, '#') + 1),
                       instr(substr(o.period_key, instr(o.period_key, '#') + 1), '/') + 1)
                AS INTEGER) END)";

/// The claim of one key: a new row, or a claimable one taken again.
static CLAIM: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "INSERT INTO scheduler_claims
            (period_key, job, period, period_start, period_end, scheduled_at, state, attempt,
             failures, trigger, owner, lease_until, started_at)
         SELECT ?1, ?2, ?3, ?4, ?5, ?12, 'running', 1, 0, ?6, ?7, {NOW} + ?8, {NOW}
          WHERE (SELECT count(*) FROM scheduler_claims INDEXED BY scheduler_claims_running
                  WHERE job = ?2 AND state = 'running' AND lease_until >= {NOW}
                    AND period_key <> ?1)
              + (SELECT count(*) FROM scheduler_claims INDEXED BY scheduler_claims_released
                  WHERE job = ?2 AND state = 'released' AND lease_until >= {NOW}
                    AND period_key <> ?1) < ?11
            -- A new key of a period claimed split another way is never
            -- taken (see `scheduler_split_otherwise` on PostgreSQL).
            AND (EXISTS (SELECT 1 FROM scheduler_claims WHERE period_key = ?1)
                 OR NOT EXISTS (SELECT 1 FROM scheduler_claims o
                                 WHERE o.job = ?2 AND o.period_start = ?4 AND o.period = ?3
                                   AND {SHARD_COUNT} <> ?14))
         ON CONFLICT (period_key) DO UPDATE SET
            state = 'running',
            attempt = scheduler_claims.attempt + 1,
            trigger = CASE
                WHEN ?9 THEN ?6
                WHEN scheduler_claims.state = 'released'
                     AND scheduler_claims.trigger = 'upstream' THEN 'upstream'
                WHEN scheduler_claims.state IN ('running', 'released') THEN 'recovery'
                WHEN scheduler_claims.state = 'failed' THEN 'retry'
                ELSE ?6 END,
            owner = excluded.owner,
            lease_until = excluded.lease_until,
            retry_at = NULL,
            started_at = excluded.started_at,
            finished_at = NULL
         WHERE {}
         RETURNING attempt, failures, trigger",
        claimable("?9", "?10", "?13")
    )
});
/// A key's row as it stands, when the claim did not take it.
static CURRENT: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    format!(
        "SELECT *, {} AS claimable, {NOW} AS now FROM scheduler_claims WHERE period_key = ?1",
        claimable("?2", "?3", "?4")
    )
});

async fn claim(
    tx: &mut Transaction<'static, Sqlite>,
    r: &ClaimRequest<'_>,
    hold: bool,
) -> Result<Claim, sqlx::Error> {
    let key = r.key();
    let won = sqlx::query(&CLAIM)
        .bind(key.as_str())
        .bind(r.job)
        .bind(&r.period.label)
        .bind(ms(r.period.start))
        .bind(ms(r.period.end))
        .bind(r.trigger.as_str())
        .bind(r.owner)
        .bind(r.lease.as_millis() as i64)
        .bind(r.manual)
        .bind(r.force)
        .bind(r.concurrency)
        .bind(ms(r.scheduled_at))
        .bind(hold)
        .bind(r.shard.map_or(1, |s| s.of))
        .fetch_optional(&mut **tx)
        .await?;
    if let Some(row) = won {
        return Ok(Claim::Won(Lease {
            key,
            attempt: row.try_get("attempt")?,
            failures: row.try_get("failures")?,
            trigger: crate::store::trigger(row.try_get("trigger")?)?,
            granted: r.lease,
        }));
    }
    let row = sqlx::query(&CURRENT)
        .bind(key.as_str())
        .bind(r.manual)
        .bind(r.force)
        .bind(hold)
        .fetch_optional(&mut **tx)
        .await?;
    Ok(match row {
        Some(row) => claim_row(&row)?.as_claim(),
        None => Claim::Busy,
    })
}

/// Writes outcomes in one statement, each only if its claim is still at
/// that attempt (running, or released by `scheduler release` and not
/// claimed since); the trigger `scheduler_attempts_outcome` settles each
/// claim in the same statement. How many were written.
pub(super) async fn record_many(
    conn: &mut sqlx::SqliteConnection,
    outcomes: &[(&Lease, Finish)],
) -> Result<std::collections::HashSet<String>, sqlx::Error> {
    if outcomes.is_empty() {
        return Ok(std::collections::HashSet::new());
    }
    let rows: Vec<serde_json::Value> = outcomes
        .iter()
        .map(|(lease, f)| {
            serde_json::json!([
                lease.key.as_str(),
                lease.attempt,
                if f.succeeded { "succeeded" } else { "failed" },
                f.exit_code,
                f.http_status,
                f.error,
                f.output,
                f.retry_after.map(|d| d.as_millis() as i64),
                f.definition,
            ])
        })
        .collect();
    let rows = serde_json::Value::Array(rows).to_string();
    let done = sqlx::query(&format!(
        "UPDATE scheduler_attempts
            SET outcome = h.outcome, finished_at = {NOW}, exit_code = h.exit_code,
                http_status = h.http_status, error = h.error, output = h.output,
                retry_after = h.retry_after, definition = h.definition
           FROM (SELECT json_extract(value, '$[0]') AS key, json_extract(value, '$[1]') AS attempt,
                        json_extract(value, '$[2]') AS outcome, json_extract(value, '$[3]') AS exit_code,
                        json_extract(value, '$[4]') AS http_status, json_extract(value, '$[5]') AS error,
                        json_extract(value, '$[6]') AS output, json_extract(value, '$[7]') AS retry_after,
                        json_extract(value, '$[8]') AS definition
                   FROM json_each(?1)) AS h
          WHERE scheduler_attempts.period_key = h.key AND scheduler_attempts.attempt = h.attempt
            AND scheduler_attempts.outcome IN ('running', 'released')
            AND EXISTS (SELECT 1 FROM scheduler_claims c
                         WHERE c.period_key = h.key AND c.attempt = h.attempt
                           AND c.state IN ('running', 'released'))
         RETURNING scheduler_attempts.period_key"
    ))
    .bind(rows)
    .fetch_all(conn)
    .await?;
    done.iter().map(|row| row.try_get(0)).collect()
}

/// Keeps the output tail of a job stopped by a release or a shutdown with
/// its attempt.
async fn keep_output(
    tx: &mut Transaction<'static, Sqlite>,
    lease: &Lease,
    output: Option<&str>,
) -> Result<(), sqlx::Error> {
    if let Some(output) = output {
        sqlx::query(
            "UPDATE scheduler_attempts SET output = ?3 WHERE period_key = ?1 AND attempt = ?2",
        )
        .bind(lease.key.as_str())
        .bind(lease.attempt)
        .bind(output)
        .execute(&mut **tx)
        .await?;
    }
    Ok(())
}

async fn mark_attempt(
    tx: &mut Transaction<'static, Sqlite>,
    key: &str,
    attempt: i32,
    outcome: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(&format!(
        "UPDATE scheduler_attempts SET outcome = ?3, finished_at = {NOW}
          WHERE period_key = ?1 AND attempt = ?2"
    ))
    .bind(key)
    .bind(attempt)
    .bind(outcome)
    .execute(&mut **tx)
    .await?;
    Ok(())
}

/// The keys of `runs` whose claims are still at their attempts, in one
/// statement.
pub(super) async fn owned(
    tx: &mut sqlx::SqliteConnection,
    runs: &[GroupedSql<'_>],
) -> Result<std::collections::HashSet<String>, sqlx::Error> {
    let pairs: Vec<(&str, i32)> = runs
        .iter()
        .map(|r| (r.lease.key.as_str(), r.lease.attempt))
        .collect();
    let pairs = serde_json::to_string(&pairs).unwrap_or_else(|_| "[]".into());
    let keys: Vec<String> = sqlx::query_scalar(
        "SELECT c.period_key FROM scheduler_claims c
           JOIN json_each(?1) AS h
             ON c.period_key = json_extract(h.value, '$[0]')
            AND c.attempt = json_extract(h.value, '$[1]')
          WHERE c.state IN ('running', 'released')",
    )
    .bind(pairs)
    .fetch_all(tx)
    .await?;
    Ok(keys.into_iter().collect())
}
