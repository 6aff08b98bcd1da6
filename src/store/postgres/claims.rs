//! PostgreSQL's claims: `scheduler_claim_many` and its answers, renewals,
//! outcomes, releases and recoveries; periods adopted.

use std::borrow::Cow;
use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::Row;
use sqlx::postgres::PgRow;

use super::{PgStore, claim_row, millis, without_nul};
use crate::period::{Period, PeriodKey};
use crate::store::{
    ADOPTED_ATTEMPT, Claim, ClaimRequest, ClaimRow, Finish, Lease, Reclaimable, Released,
    claim_state,
};

/// One row of `scheduler_claim_many`: won, or the row as it stands.
fn claim_of(
    row: &PgRow,
    request: &ClaimRequest<'_>,
    key: &PeriodKey,
) -> Result<Claim, sqlx::Error> {
    let label = request.period.label.as_str();
    if row.try_get("o_won")? {
        // The lease counts from the instant the row was won, which is after
        // any wait for a lock; the statement began at `o_now`.
        let until: Option<DateTime<Utc>> = row.try_get("o_lease_until")?;
        let began: DateTime<Utc> = row.try_get("o_now")?;
        let granted = until.map_or(request.lease, |until| {
            (until - began).to_std().unwrap_or(Duration::ZERO)
        });
        return Ok(Claim::Won(Lease {
            key: key.clone(),
            attempt: row.try_get("o_attempt")?,
            failures: row.try_get("o_failures")?,
            trigger: crate::store::trigger(row.try_get("o_trigger")?)?,
            granted,
        }));
    }
    if row.try_get("o_contended")? {
        return Ok(Claim::Contended);
    }
    let Some(state) = row.try_get::<Option<&str>, _>("o_state")? else {
        return Ok(Claim::Busy);
    };
    let state = claim_state(state)?;
    let current = ClaimRow {
        period_key: key.to_string(),
        period: label.to_owned(),
        state,
        attempt: row.try_get("o_attempt")?,
        failures: row.try_get("o_failures")?,
        owner: row
            .try_get::<Option<String>, _>("o_owner")?
            .unwrap_or_default(),
        lease_until: row.try_get("o_lease_until")?,
        started_at: None,
        retry_at: row.try_get("o_retry_at")?,
        finished_at: row.try_get("o_finished_at")?,
        claimable: row
            .try_get::<Option<bool>, _>("o_claimable")?
            .unwrap_or(false),
        now: row.try_get("o_now")?,
    };
    Ok(current.as_claim())
}

/// Records outcomes and their attempt rows in one statement, each fenced
/// by its attempt (running, or released by `scheduler release` and not
/// claimed since: finished work is kept rather than run again). The rows
/// are locked in the order claims and renewals lock them. The end is the
/// clock at the write (`clock_timestamp()`), not the transaction's start:
/// an `sql` action's statement runs before it.
const RECORD: &str = "
    WITH h AS (
        SELECT * FROM unnest($1::text[], $2::int[], $3::text[], $4::int[], $5::bigint[],
                             $6::int[], $7::int[], $8::text[], $9::text[], $10::text[])
            AS h(key, attempt, state, failed, retry_ms, exit_code, http_status, error, output,
                 definition)
    ), mine AS (
        SELECT c.period_key FROM scheduler_claims c JOIN h ON c.period_key = h.key
         WHERE c.attempt = h.attempt AND c.state IN ('running', 'released')
         ORDER BY c.job COLLATE \"C\", c.period_key COLLATE \"C\"
           FOR NO KEY UPDATE OF c
    ), c AS (
        UPDATE scheduler_claims c
           SET state = h.state, finished_at = clock_timestamp(), lease_until = NULL,
               failures = c.failures + h.failed,
               retry_at = clock_timestamp() + h.retry_ms * interval '1 millisecond'
          FROM h JOIN mine ON mine.period_key = h.key
         WHERE c.period_key = h.key
     RETURNING c.period_key, c.attempt, c.finished_at)
    UPDATE scheduler_attempts a
       SET outcome = h.state, finished_at = c.finished_at, exit_code = h.exit_code,
           http_status = h.http_status, error = h.error, output = h.output,
           definition = h.definition
      FROM c JOIN h ON h.key = c.period_key
     WHERE a.period_key = c.period_key AND a.attempt = c.attempt
    RETURNING a.period_key";

impl PgStore {
    /// `wait`: for the jobs' locks, or else answer the keys of a job whose
    /// lock another transaction holds contended (a batch of several keys).
    /// `hold`: an expired lease is answered as held, not taken over
    /// ([`crate::store::outage`]): the claim runs in a transaction that says so to
    /// `scheduler_claimable`, three more round trips, only after an outage.
    pub(in crate::store) async fn claim_many(
        &self,
        requests: &[ClaimRequest<'_>],
        wait: bool,
        hold: bool,
    ) -> Result<Vec<Claim>, sqlx::Error> {
        let keys: Vec<PeriodKey> = requests.iter().map(ClaimRequest::key).collect();
        let column = |f: &dyn Fn(&ClaimRequest<'_>) -> String| -> Vec<String> {
            requests.iter().map(f).collect()
        };
        let jobs = column(&|r| r.job.to_owned());
        let labels = column(&|r| r.period.label.clone());
        let triggers = column(&|r| r.trigger.as_str().to_owned());
        let starts: Vec<DateTime<Utc>> = requests.iter().map(|r| r.period.start).collect();
        let ends: Vec<DateTime<Utc>> = requests.iter().map(|r| r.period.end).collect();
        let scheduled: Vec<DateTime<Utc>> = requests.iter().map(|r| r.scheduled_at).collect();
        let concurrency: Vec<i32> = requests
            .iter()
            .map(|r| i32::try_from(r.concurrency).unwrap_or(i32::MAX))
            .collect();
        let force: Vec<bool> = requests.iter().map(|r| r.force).collect();
        let manual: Vec<bool> = requests.iter().map(|r| r.manual).collect();
        let key_texts: Vec<&str> = keys.iter().map(PeriodKey::as_str).collect();
        // How manual runs were asked for is written on the attempts won by
        // the claiming statement itself: one round trip, one commit.
        let how: Vec<Option<&str>> = requests.iter().map(|r| r.asked.map(|a| a.how)).collect();
        let by: Vec<Option<&str>> = requests.iter().map(|r| r.asked.map(|a| a.by)).collect();
        let noting = how.iter().any(Option::is_some);
        let call = if noting {
            "SELECT * FROM scheduler_claim_many_asked($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)"
        } else {
            "SELECT * FROM scheduler_claim_many($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)"
        };
        let mut statement = sqlx::query(call)
            .bind(&key_texts)
            .bind(&jobs)
            .bind(&labels)
            .bind(&starts)
            .bind(&ends)
            .bind(&scheduled)
            .bind(&triggers)
            .bind(&concurrency)
            .bind(&force)
            .bind(&manual)
            .bind(requests[0].owner)
            .bind(millis(requests[0].lease))
            .bind(wait);
        if noting {
            statement = statement.bind(&how).bind(&by);
        }
        let rows = if hold {
            let mut tx = self.pool.begin().await?;
            sqlx::query("SELECT set_config('scheduler.recovery', 'hold', true)")
                .execute(&mut *tx)
                .await?;
            let rows = statement.fetch_all(&mut *tx).await?;
            tx.commit().await?;
            rows
        } else {
            statement.fetch_all(&self.pool).await?
        };
        let mut claims: Vec<Option<Claim>> = vec![None; requests.len()];
        for row in &rows {
            let ord: i32 = row.try_get("o_ord")?;
            let Some(i) = usize::try_from(ord).ok().and_then(|o| o.checked_sub(1)) else {
                continue;
            };
            let Some(slot) = claims.get_mut(i) else {
                continue;
            };
            *slot = Some(claim_of(row, &requests[i], &keys[i])?);
        }
        Ok(claims.into_iter().flatten().collect())
    }

    pub(in crate::store) async fn renew(
        &self,
        leases: &[&Lease],
        lease: Duration,
    ) -> Result<Vec<bool>, sqlx::Error> {
        let keys: Vec<&str> = leases.iter().map(|l| l.key.as_str()).collect();
        let attempts: Vec<i32> = leases.iter().map(|l| l.attempt).collect();
        // Rows locked in the order a batch claim takes them (job, then key),
        // so a renewal never deadlocks with another replica's claim of the
        // same keys; a no-key lock, which an sql group's key share passes.
        let renewed: Vec<(String, i32)> = sqlx::query_as(
            "WITH mine AS (
                SELECT c.period_key FROM scheduler_claims c
                  JOIN unnest($1::text[], $2::int[]) AS h(key, attempt)
                    ON c.period_key = h.key AND c.attempt = h.attempt
                 WHERE c.state = 'running'
                 ORDER BY c.job COLLATE \"C\", c.period_key COLLATE \"C\"
                   FOR NO KEY UPDATE OF c)
             UPDATE scheduler_claims c
                SET lease_until = now() + $3 * interval '1 millisecond'
               FROM mine
              WHERE c.period_key = mine.period_key
          RETURNING c.period_key, c.attempt",
        )
        .bind(&keys)
        .bind(&attempts)
        .bind(millis(lease))
        .fetch_all(&self.pool)
        .await?;
        let renewed: std::collections::HashSet<(&str, i32)> = renewed
            .iter()
            .map(|(key, attempt)| (key.as_str(), *attempt))
            .collect();
        Ok(leases
            .iter()
            .map(|l| renewed.contains(&(l.key.as_str(), l.attempt)))
            .collect())
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
        let released = sqlx::query(
            "WITH c AS (
                UPDATE scheduler_claims
                   SET state = 'released', lease_until = NULL, finished_at = now()
                 WHERE period_key = $1 AND attempt = $2 AND state = 'running'
             RETURNING period_key, attempt)
             UPDATE scheduler_attempts a SET outcome = 'released', finished_at = now(),
                    output = COALESCE($3::text, a.output)
               FROM c WHERE a.period_key = c.period_key AND a.attempt = c.attempt
             RETURNING 1",
        )
        .bind(lease.key.as_str())
        .bind(lease.attempt)
        .bind(output.map(without_nul))
        .fetch_optional(&self.pool)
        .await?;
        Ok(released.is_some())
    }

    pub(in crate::store) async fn confirm_stopped(
        &self,
        lease: &Lease,
        output: Option<&str>,
    ) -> Result<bool, sqlx::Error> {
        let (confirmed,): (i64,) = sqlx::query_as(
            "WITH c AS (
                UPDATE scheduler_claims SET lease_until = NULL
                 WHERE period_key = $1 AND attempt = $2 AND state = 'released'
             RETURNING period_key, attempt),
             a AS (
                UPDATE scheduler_attempts a SET output = COALESCE($3::text, a.output)
                  FROM c WHERE a.period_key = c.period_key AND a.attempt = c.attempt)
             SELECT count(*) FROM c",
        )
        .bind(lease.key.as_str())
        .bind(lease.attempt)
        .bind(output.map(without_nul))
        .fetch_one(&self.pool)
        .await?;
        Ok(confirmed == 1)
    }

    pub(in crate::store) async fn release_key(
        &self,
        key: &str,
    ) -> Result<Option<Released>, sqlx::Error> {
        // The lease stays: the runner may be cut off and unable to stop its
        // job; the period is claimable once that runner confirms the job
        // stopped, or once the lease it was granted has run out.
        let row: Option<(String, Option<DateTime<Utc>>)> = sqlx::query_as(
            "WITH c AS (
                UPDATE scheduler_claims
                   SET state = 'released', finished_at = now()
                 WHERE period_key = $1 AND state = 'running'
             RETURNING period_key, attempt, owner, lease_until),
             a AS (
                UPDATE scheduler_attempts a SET outcome = 'released', finished_at = now()
                  FROM c WHERE a.period_key = c.period_key AND a.attempt = c.attempt)
             SELECT owner, lease_until FROM c",
        )
        .bind(key)
        .fetch_optional(&self.pool)
        .await?;
        Ok(row.map(|(owner, lease_until)| Released { owner, lease_until }))
    }

    pub(in crate::store) async fn rows(
        &self,
        keys: &[String],
    ) -> Result<Vec<ClaimRow>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT c.*, scheduler_claimable(c.state, c.lease_until, c.retry_at, false, false) AS claimable,
                    now() AS now
               FROM scheduler_claims c WHERE c.period_key = ANY($1)",
        )
        .bind(keys)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(claim_row).collect()
    }

    pub(in crate::store) async fn period_rows(
        &self,
        periods: &[(&str, &Period)],
    ) -> Result<Vec<ClaimRow>, sqlx::Error> {
        let jobs: Vec<&str> = periods.iter().map(|(job, _)| *job).collect();
        let starts: Vec<DateTime<Utc>> = periods.iter().map(|(_, p)| p.start).collect();
        let labels: Vec<&str> = periods.iter().map(|(_, p)| p.label.as_str()).collect();
        let rows = sqlx::query(
            "SELECT c.*, scheduler_claimable(c.state, c.lease_until, c.retry_at, false, false) AS claimable,
                    now() AS now
               FROM scheduler_claims c
               JOIN unnest($1::text[], $2::timestamptz[], $3::text[]) AS x(job, period_start, period)
                 ON c.job = x.job AND c.period_start = x.period_start AND c.period = x.period",
        )
        .bind(jobs)
        .bind(starts)
        .bind(labels)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(claim_row).collect()
    }

    pub(in crate::store) async fn partly_claimed(
        &self,
        job: &str,
        from: DateTime<Utc>,
    ) -> Result<Vec<(Period, DateTime<Utc>, u32)>, sqlx::Error> {
        /// Label, start, end, newest fire, count of shards.
        type Row = (String, DateTime<Utc>, DateTime<Utc>, DateTime<Utc>, i32);
        let rows: Vec<Row> = sqlx::query_as(
            "SELECT period, period_start, period_end, max(scheduled_at),
                    max(scheduler_shard_count(period_key))
               FROM scheduler_claims
              WHERE job = $1 AND period_start >= $2
              GROUP BY period, period_start, period_end
             HAVING count(*) < max(scheduler_shard_count(period_key))
              ORDER BY period_start LIMIT 1000",
        )
        .bind(job)
        .bind(from)
        .fetch_all(&self.pool)
        .await?;
        Ok(rows
            .into_iter()
            .map(|(label, start, end, fire, shards)| {
                let period = Period { label, start, end };
                (period, fire, u32::try_from(shards).unwrap_or(1))
            })
            .collect())
    }

    pub(in crate::store) async fn reclaimable(
        &self,
        jobs: &[String],
        limit: u32,
    ) -> Result<Vec<Reclaimable>, sqlx::Error> {
        let rows = sqlx::query(
            "SELECT period_key, job, period, period_start, period_end, scheduled_at, state, trigger
               FROM scheduler_claims
              WHERE job = ANY($1)
                AND scheduler_claimable(state, lease_until, retry_at, false, false)
              ORDER BY period_start LIMIT $2",
        )
        .bind(jobs)
        .bind(i64::from(limit))
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|row| {
                Ok(Reclaimable {
                    job: row.try_get("job")?,
                    period: Period {
                        label: row.try_get("period")?,
                        start: row.try_get("period_start")?,
                        end: row.try_get("period_end")?,
                    },
                    scheduled_at: row.try_get("scheduled_at")?,
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
        let keys: Vec<String> = periods.iter().map(|(k, _, _)| k.clone()).collect();
        let labels: Vec<&str> = periods.iter().map(|(_, p, _)| p.label.as_str()).collect();
        let starts: Vec<DateTime<Utc>> = periods.iter().map(|(_, p, _)| p.start).collect();
        let ends: Vec<DateTime<Utc>> = periods.iter().map(|(_, p, _)| p.end).collect();
        let fires: Vec<DateTime<Utc>> = periods.iter().map(|(_, _, f)| *f).collect();
        let mut tx = self.pool.begin().await?;
        // The job's claim lock, as every claim of it takes: a claim that
        // read no row before this commits waits for it and then finds the
        // period done, rather than take the row at attempt 0 for its own.
        sqlx::query("SELECT pg_advisory_xact_lock(hashtextextended('scheduler_claims:' || $1, 0))")
            .bind(job)
            .execute(&mut *tx)
            .await?;
        // Inserted as running and then settled, so that what a success
        // wakes (periods waiting for it) wakes; every row or none.
        let inserted: Vec<String> = sqlx::query_scalar(&format!(
            "INSERT INTO scheduler_claims
                (period_key, job, period, period_start, period_end, scheduled_at, state,
                 attempt, failures, trigger, owner, started_at)
             SELECT k, $6, l, s, e, f, 'running', {ADOPTED_ATTEMPT}, 0, 'adopted', $7, now()
               FROM unnest($1::text[], $2::text[], $3::timestamptz[], $4::timestamptz[],
                           $5::timestamptz[]) AS r(k, l, s, e, f)
             ON CONFLICT (period_key) DO NOTHING
             RETURNING period_key"
        ))
        .bind(&keys)
        .bind(&labels)
        .bind(&starts)
        .bind(&ends)
        .bind(&fires)
        .bind(job)
        .bind(by)
        .fetch_all(&mut *tx)
        .await?;
        if inserted.len() < keys.len() {
            let inserted: std::collections::HashSet<String> = inserted.into_iter().collect();
            tx.rollback().await?;
            return Ok(keys.into_iter().filter(|k| !inserted.contains(k)).collect());
        }
        sqlx::query(&format!(
            "INSERT INTO scheduler_attempts
                (period_key, attempt, job, trigger, owner, scheduled_at, started_at,
                 finished_at, outcome, asked, requested_by)
             SELECT period_key, attempt, job, trigger, owner, scheduled_at, started_at,
                    now(), 'succeeded', 'adopt', $2
               FROM scheduler_claims WHERE period_key = ANY($1) AND attempt = {ADOPTED_ATTEMPT}"
        ))
        .bind(&keys)
        .bind(by)
        .execute(&mut *tx)
        .await?;
        sqlx::query(
            "UPDATE scheduler_claims SET state = 'succeeded', finished_at = now()
              WHERE period_key = ANY($1)",
        )
        .bind(&keys)
        .execute(&mut *tx)
        .await?;
        tx.commit().await?;
        Ok(Vec::new())
    }
}

/// Writes outcomes with [`RECORD`]; the keys of those still at their
/// attempt.
pub(super) async fn record_many(
    conn: &mut sqlx::PgConnection,
    outcomes: &[(&Lease, Finish)],
) -> Result<std::collections::HashSet<String>, sqlx::Error> {
    let keys: Vec<&str> = outcomes.iter().map(|(l, _)| l.key.as_str()).collect();
    let attempts: Vec<i32> = outcomes.iter().map(|(l, _)| l.attempt).collect();
    let states: Vec<&str> = outcomes
        .iter()
        .map(|(_, f)| if f.succeeded { "succeeded" } else { "failed" })
        .collect();
    let failed: Vec<i32> = outcomes
        .iter()
        .map(|(_, f)| i32::from(!f.succeeded))
        .collect();
    let retry: Vec<Option<i64>> = outcomes
        .iter()
        .map(|(_, f)| f.retry_after.map(millis))
        .collect();
    let exit_codes: Vec<Option<i32>> = outcomes.iter().map(|(_, f)| f.exit_code).collect();
    let statuses: Vec<Option<i32>> = outcomes.iter().map(|(_, f)| f.http_status).collect();
    let errors: Vec<Option<Cow<'_, str>>> = outcomes
        .iter()
        .map(|(_, f)| f.error.as_deref().map(without_nul))
        .collect();
    let output: Vec<Option<Cow<'_, str>>> = outcomes
        .iter()
        .map(|(_, f)| f.output.as_deref().map(without_nul))
        .collect();
    let definitions: Vec<Option<&str>> = outcomes
        .iter()
        .map(|(_, f)| f.definition.as_deref())
        .collect();
    let rows = sqlx::query(RECORD)
        .bind(&keys)
        .bind(&attempts)
        .bind(&states)
        .bind(&failed)
        .bind(&retry)
        .bind(&exit_codes)
        .bind(&statuses)
        .bind(&errors)
        .bind(&output)
        .bind(&definitions)
        .fetch_all(conn)
        .await?;
    rows.iter().map(|row| row.try_get(0)).collect()
}
