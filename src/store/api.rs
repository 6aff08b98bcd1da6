//! Statements written once for both backends (times are milliseconds on
//! the database's clock; only the clock's spelling differs): what the HTTP
//! API keeps — Idempotency-Keys and the runs it started — and the counts
//! behind `/metrics`' gauges.

use std::collections::HashMap;
use std::time::Duration;

use super::{ApiRunState, KeyState, Store};
use crate::error::Error;

/// How an Idempotency-Key was claimed.
#[derive(Debug)]
pub enum KeyClaim {
    /// New (or its earlier record expired, or was left in progress past
    /// its bound, before any run started, by a replica that went away):
    /// this request executes.
    New,
    /// Known: what the first request left.
    Known(KeyRecord),
}

/// A stored Idempotency-Key.
#[derive(Debug)]
pub struct KeyRecord {
    /// The hash of the first request's method, path and body.
    pub request: String,
    /// Being answered, or answered.
    pub state: KeyState,
    /// The stored answer.
    pub status: Option<i32>,
    /// Its body.
    pub body: Option<String>,
    /// Its `Location`.
    pub location: Option<String>,
    /// The run the request started, if it got that far.
    pub run_id: Option<String>,
    /// 1 when a record in progress is past its bound: the replica that
    /// answered it went away.
    pub stale: i32,
    /// 1 while the run it started is still going.
    pub run_going: i32,
}

/// A run asked for over the API, as stored.
#[derive(Debug)]
pub struct ApiRun {
    /// Its id.
    pub id: String,
    /// The job.
    pub job: String,
    /// The token's name that asked for it.
    pub requested_by: String,
    /// The replica running it.
    pub owner: String,
    /// Running or done.
    pub state: ApiRunState,
    /// What each period did, as JSON.
    pub body: String,
    /// 1 while its replica keeps it alive.
    pub alive: i32,
    /// When it was asked for (milliseconds since the epoch); read only by
    /// [`Store::api_runs`], 0 elsewhere.
    pub created_at: i64,
}

use super::ms;

from_row!(KeyRecord {
    request,
    state: word,
    status,
    body,
    location,
    run_id,
    stale,
    run_going,
});
from_row!(ApiRun {
    id,
    job,
    requested_by,
    owner,
    state: word,
    body,
    alive,
    created_at: default,
});

impl Store {
    /// Claims the Idempotency-Key `scope` for a request hashed `request`,
    /// in one statement decided by the primary key: new, or what is known.
    /// `location` is where the run the request may start will be, so that
    /// a retry while it is answered is pointed there.
    /// A record in progress past its bound (its replica went away) is
    /// taken over by the same request; an expired one by any.
    pub async fn claim_key(
        &self,
        scope: &str,
        request: &str,
        bound: Duration,
        ttl: Duration,
        location: Option<&str>,
    ) -> Result<KeyClaim, Error> {
        loop {
            let claimed = on_pool!(self, |pool, now| {
                sqlx::query(&format!(
                    "INSERT INTO scheduler_idempotency (scope, request, state, bound_at, expires_at, location)
                     VALUES ($1, $2, 'running', {now} + $3, {now} + $4, $5)
                     ON CONFLICT (scope) DO UPDATE
                        SET request = excluded.request, state = 'running', status = NULL,
                            body = NULL, location = excluded.location, run_id = NULL,
                            bound_at = excluded.bound_at, expires_at = excluded.expires_at
                      WHERE (scheduler_idempotency.expires_at <= {now}
                             AND NOT EXISTS (SELECT 1 FROM scheduler_api_runs r WHERE r.id = scheduler_idempotency.run_id AND r.state = 'running' AND r.alive_until > {now}))
                         OR (scheduler_idempotency.state = 'running'
                             AND scheduler_idempotency.bound_at <= {now}
                             AND scheduler_idempotency.run_id IS NULL
                             AND scheduler_idempotency.request = excluded.request)"
                ))
                .bind(scope)
                .bind(request)
                .bind(ms(bound))
                .bind(ms(ttl))
                .bind(location)
                .execute(pool)
                .await
                .map(|done| done.rows_affected() == 1)
            })?;
            if claimed {
                return Ok(KeyClaim::New);
            }
            let known = on_pool!(self, |pool, now| {
                sqlx::query_as::<_, KeyRecord>(&format!(
                    "SELECT i.request, i.state, i.status, i.body, i.location, i.run_id,
                            CASE WHEN i.bound_at <= {now} THEN 1 ELSE 0 END AS stale,
                            CASE WHEN r.state = 'running' AND r.alive_until > {now} THEN 1 ELSE 0 END AS run_going
                       FROM scheduler_idempotency i
                       LEFT JOIN scheduler_api_runs r ON r.id = i.run_id
                      WHERE i.scope = $1"
                ))
                .bind(scope)
                .fetch_optional(pool)
                .await
            })?;
            // Gone in between (a request that failed freed it): claim again.
            if let Some(known) = known {
                return Ok(KeyClaim::Known(known));
            }
        }
    }

    /// Stores the answer of the request that claimed `scope`.
    pub async fn answer_key(
        &self,
        scope: &str,
        status: u16,
        body: &str,
        location: Option<&str>,
        run_id: Option<&str>,
    ) -> Result<(), Error> {
        on_pool!(self, |pool, _now| {
            sqlx::query(
                "UPDATE scheduler_idempotency
                    SET state = 'answered', status = $2, body = $3, location = $4, run_id = $5
                  WHERE scope = $1",
            )
            .bind(scope)
            .bind(i32::from(status))
            .bind(body)
            .bind(location)
            .bind(run_id)
            .execute(pool)
            .await
            .map(|_| ())
        })
    }

    /// Notes on `scope`, still in progress, the run its request started,
    /// so a retry meanwhile is pointed at it.
    pub async fn note_key_run(
        &self,
        scope: &str,
        run_id: &str,
        location: &str,
    ) -> Result<(), Error> {
        on_pool!(self, |pool, _now| {
            sqlx::query(
                "UPDATE scheduler_idempotency SET run_id = $2, location = $3
                  WHERE scope = $1 AND state = 'running'",
            )
            .bind(scope)
            .bind(run_id)
            .bind(location)
            .execute(pool)
            .await
            .map(|_| ())
        })
    }

    /// Frees `scope` (its request ended in a server-side error), so that a
    /// retry executes.
    pub async fn forget_key(&self, scope: &str) -> Result<(), Error> {
        on_pool!(self, |pool, _now| {
            sqlx::query("DELETE FROM scheduler_idempotency WHERE scope = $1 AND state = 'running'")
                .bind(scope)
                .execute(pool)
                .await
                .map(|_| ())
        })
    }

    /// Records a run this replica (`owner`) starts, alive for `alive_for`
    /// and kept for `ttl`.
    pub async fn create_run(
        &self,
        run: &ApiRun,
        alive_for: Duration,
        ttl: Duration,
    ) -> Result<(), Error> {
        on_pool!(self, |pool, now| {
            sqlx::query(&format!(
                "INSERT INTO scheduler_api_runs
                        (id, job, requested_by, owner, state, body, created_at, alive_until, expires_at)
                 VALUES ($1, $2, $3, $4, $5, $6, {now}, {now} + $7, {now} + $8)"
            ))
            .bind(&run.id)
            .bind(&run.job)
            .bind(&run.requested_by)
            .bind(&run.owner)
            .bind(run.state.as_str())
            .bind(&run.body)
            .bind(ms(alive_for))
            .bind(ms(ttl))
            .execute(pool)
            .await
            .map(|_| ())
        })
    }

    /// Writes what run `id` did so far, keeping it alive for `alive_for`
    /// more. With `ended_ttl`, that is all of it: the run is done, and it
    /// and its Idempotency-Key are kept `ended_ttl` from now (a key's TTL
    /// counts from its run's end). The key is kept first, so that whoever
    /// reads the run `done` finds its key already kept.
    pub async fn update_run(
        &self,
        id: &str,
        body: &str,
        ended_ttl: Option<Duration>,
        alive_for: Duration,
    ) -> Result<(), Error> {
        on_pool!(self, |pool, now| {
            if let Some(ttl) = ended_ttl {
                sqlx::query(&format!(
                    "UPDATE scheduler_idempotency SET expires_at = {now} + $2 WHERE run_id = $1"
                ))
                .bind(id)
                .bind(ms(ttl))
                .execute(pool)
                .await?;
            }
            sqlx::query(&format!(
                "UPDATE scheduler_api_runs
                    SET body = $2, state = $3, alive_until = {now} + $4,
                        expires_at = CASE WHEN $5 >= 0 THEN {now} + $5 ELSE expires_at END
                  WHERE id = $1"
            ))
            .bind(id)
            .bind(body)
            .bind(if ended_ttl.is_some() {
                "done"
            } else {
                "running"
            })
            .bind(ms(alive_for))
            .bind(ended_ttl.map_or(-1, ms))
            .execute(pool)
            .await
            .map(|_| ())
        })
    }

    /// Frees the Idempotency-Key of run `id`, which ran nothing (the
    /// database failed before its first claim), so that its request sent
    /// again executes.
    pub async fn forget_run_key(&self, id: &str) -> Result<(), Error> {
        on_pool!(self, |pool, _now| {
            sqlx::query("DELETE FROM scheduler_idempotency WHERE run_id = $1")
                .bind(id)
                .execute(pool)
                .await
                .map(|_| ())
        })
    }

    /// Run `id`, if it is known.
    pub async fn api_run(&self, id: &str) -> Result<Option<ApiRun>, Error> {
        on_pool!(self, |pool, now| {
            sqlx::query_as::<_, ApiRun>(&format!(
                "SELECT id, job, requested_by, owner, state, body,
                        CASE WHEN alive_until > {now} THEN 1 ELSE 0 END AS alive
                   FROM scheduler_api_runs WHERE id = $1"
            ))
            .bind(id)
            .fetch_optional(pool)
            .await
        })
    }

    /// The `limit` runs asked for last, newest first.
    pub async fn api_runs(&self, limit: usize) -> Result<Vec<ApiRun>, Error> {
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        on_pool!(self, |pool, now| {
            sqlx::query_as::<_, ApiRun>(&format!(
                "SELECT id, job, requested_by, owner, state, body, created_at,
                        CASE WHEN alive_until > {now} THEN 1 ELSE 0 END AS alive
                   FROM scheduler_api_runs ORDER BY created_at DESC, id LIMIT $1"
            ))
            .bind(limit)
            .fetch_all(pool)
            .await
        })
    }

    /// Deletes Idempotency-Keys and API runs past their `key_ttl`; how
    /// many (`dry_run`: counts them, deletes nothing).
    pub async fn prune_api(&self, dry_run: bool) -> Result<u64, Error> {
        let verb = if dry_run { "SELECT count(*)" } else { "DELETE" };
        let expired = [
            "scheduler_idempotency WHERE expires_at <= {now} AND NOT EXISTS (SELECT 1 FROM scheduler_api_runs r WHERE r.id = scheduler_idempotency.run_id AND r.state = 'running' AND r.alive_until > {now})",
            "scheduler_api_runs WHERE expires_at <= {now} AND (state = 'done' OR alive_until <= {now})",
        ];
        on_pool!(self, |pool, now| {
            let mut total = 0;
            for rows in expired {
                let statement = format!("{verb} FROM {}", rows.replace("{now}", now));
                total += if dry_run {
                    let n: i64 = sqlx::query_scalar(&statement).fetch_one(pool).await?;
                    u64::try_from(n).unwrap_or(0)
                } else {
                    sqlx::query(&statement).execute(pool).await?.rows_affected()
                };
            }
            Ok::<u64, sqlx::Error>(total)
        })
    }
}

impl Store {
    /// For each of `keys` that has run, its latest attempt and the
    /// definition fingerprint that attempt ran under, in one statement.
    pub async fn last_definitions(
        &self,
        keys: &[String],
    ) -> Result<HashMap<String, (i32, Option<String>)>, Error> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        // One placeholder per key ($1, $2, …: both backends read them).
        let list: Vec<String> = (1..=keys.len()).map(|i| format!("${i}")).collect();
        let statement = format!(
            "SELECT a.period_key, a.attempt, a.definition FROM scheduler_attempts a
               JOIN scheduler_claims c ON c.period_key = a.period_key AND c.attempt = a.attempt
              WHERE a.period_key IN ({})",
            list.join(", ")
        );
        on_pool!(self, |pool, _now| {
            let mut query = sqlx::query_as::<_, (String, i32, Option<String>)>(&statement);
            for key in keys {
                query = query.bind(key);
            }
            query
                .fetch_all(pool)
                .await
                .map(|rows| rows.into_iter().map(|(k, a, d)| (k, (a, d))).collect())
        })
    }

    /// For each job with failed periods that will not be retried (retries
    /// exhausted, or a permanent failure), how many.
    pub async fn exhausted(&self) -> Result<HashMap<String, i64>, Error> {
        on_pool!(self, |pool, _now| {
            sqlx::query_as::<_, (String, i64)>(
                "SELECT job, count(*) FROM scheduler_claims
                  WHERE state = 'failed' AND retry_at IS NULL GROUP BY job",
            )
            .fetch_all(pool)
            .await
            .map(|rows| rows.into_iter().collect())
        })
    }
}
