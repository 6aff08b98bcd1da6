//! Periods waiting for their upstream periods, written once for both
//! backends (times are milliseconds on the database's clock): a row per
//! waiting period, so that any replica's scan, or a later `run`, claims it
//! once what it missed has succeeded. A row says nothing the claim does
//! not decide: a period is claimed once whatever rows there are.

use std::collections::HashMap;

use chrono::{DateTime, Utc};

use super::{Reclaimable, Store};
use crate::error::Error;
use crate::period::Period;
use crate::state::Trigger;

/// A period found waiting.
#[derive(Debug, Clone)]
pub struct Waiting<'a> {
    /// The job.
    pub job: &'a str,
    /// The period.
    pub period: &'a Period,
    /// The fire it stands for.
    pub fire: DateTime<Utc>,
    /// An upstream period key it still misses, whose success is looked
    /// out for: the newest (upstream periods tend to succeed in order).
    pub watch: String,
    /// What it waits for, in words.
    pub waits: String,
}

fn ms(t: DateTime<Utc>) -> i64 {
    t.timestamp_millis()
}

fn time(ms: i64) -> DateTime<Utc> {
    DateTime::from_timestamp_millis(ms).unwrap_or(DateTime::<Utc>::MAX_UTC)
}

impl Store {
    /// Notes each of `waiting` as waiting (what it misses as of now), in
    /// one statement.
    pub async fn note_waiting(&self, waiting: &[Waiting<'_>]) -> Result<(), Error> {
        if waiting.is_empty() {
            return Ok(());
        }
        let rows: Vec<serde_json::Value> = waiting
            .iter()
            .map(|w| {
                let key = crate::period::PeriodKey::new(w.job, &w.period.label);
                serde_json::json!({
                    "period_key": key.as_str(), "job": w.job, "period": w.period.label,
                    "period_start": ms(w.period.start), "period_end": ms(w.period.end),
                    "scheduled_at": ms(w.fire),
                    "watch": w.watch,
                    "waits": w.waits,
                })
            })
            .collect();
        let rows = serde_json::Value::Array(rows).to_string();
        let from = match self {
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => {
                "SELECT * FROM json_to_recordset($1::json)
                     AS x(period_key text, job text, period text, period_start bigint,
                          period_end bigint, scheduled_at bigint, watch text, waits text)"
            }
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => {
                "SELECT json_extract(value, '$.period_key'), json_extract(value, '$.job'),
                        json_extract(value, '$.period'), json_extract(value, '$.period_start'),
                        json_extract(value, '$.period_end'), json_extract(value, '$.scheduled_at'),
                        json_extract(value, '$.watch'), json_extract(value, '$.waits')
                   FROM json_each($1)"
            }
        };
        on_pool!(self, |pool, now| {
            sqlx::query(&format!(
                "INSERT INTO scheduler_waiting
                    (period_key, job, period, period_start, period_end, scheduled_at, watch,
                     waits, since, checked_at)
                 SELECT f.*, {now}, {now} FROM ({from}) AS f WHERE true
                 ON CONFLICT (period_key) DO UPDATE
                    SET watch = excluded.watch, ready = FALSE, waits = excluded.waits,
                        checked_at = excluded.checked_at"
            ))
            .bind(&rows)
            .execute(pool)
            .await
            .map(|_| ())
        })?;
        self.wake_noted(waiting).await
    }

    /// Wakes the rows of `waiting` just noted whose watched key has
    /// succeeded.
    async fn wake_noted(&self, waiting: &[Waiting<'_>]) -> Result<(), Error> {
        // A watched key that succeeded before its row was noted woke
        // nothing: woken here. On PostgreSQL the watched claim rows are
        // locked whatever their state, and their state read as the lock
        // finds it: a success being written meanwhile (its wake-up ran
        // before the row was there) is waited for and seen.
        // Its state tested before the lock would be the state before it,
        // and the row would sleep until the minute's sweep. One written
        // after this wakes the row itself.
        let keys: Vec<String> = waiting
            .iter()
            .map(|w| crate::period::PeriodKey::new(w.job, &w.period.label).to_string())
            .collect();
        let keys = serde_json::to_string(&keys).unwrap_or_else(|_| "[]".into());
        let listed = keys_in(self);
        let lock = match self {
            #[cfg(feature = "postgres")]
            // `OFFSET 0` keeps the state's test out of the locking scan:
            // the planner would push it down, below the lock.
            Store::Postgres(_) => "OFFSET 0 FOR SHARE OF c",
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => "",
        };
        on_pool!(self, |pool, _now| {
            sqlx::query(&format!(
                "UPDATE scheduler_waiting SET ready = TRUE
                  WHERE period_key IN ({listed}) AND NOT ready
                    AND watch IN (SELECT l.period_key
                                    FROM (SELECT c.period_key, c.state FROM scheduler_claims c
                                           WHERE c.period_key IN (SELECT w.watch
                                                                    FROM scheduler_waiting w
                                                                   WHERE w.period_key IN ({listed}))
                                           {lock}) AS l
                                   WHERE l.state = 'succeeded')"
            ))
            .bind(&keys)
            .execute(pool)
            .await
            .map(|_| ())
        })
    }

    /// Forgets `keys` as waiting (they were claimed), in one statement.
    pub async fn unwait(&self, keys: &[String]) -> Result<(), Error> {
        if keys.is_empty() {
            return Ok(());
        }
        let keys = serde_json::to_string(keys).unwrap_or_else(|_| "[]".into());
        let listed = keys_in(self);
        on_pool!(self, |pool, _now| {
            sqlx::query(&format!(
                "DELETE FROM scheduler_waiting WHERE period_key IN ({listed})"
            ))
            .bind(&keys)
            .execute(pool)
            .await
            .map(|_| ())
        })
    }

    /// The waiting periods of `jobs` that no claim has taken and whose
    /// watched upstream period has succeeded since they were noted, oldest
    /// fire first: to be claimed (the claim looks at every upstream period
    /// again first, and notes what is still missing). One statement that
    /// reads the woken rows only; with `sweep`, every waiting row of the
    /// jobs is looked at (a safety net, once a minute, and `run JOB`).
    pub async fn ready(
        &self,
        jobs: &[String],
        limit: u32,
        sweep: bool,
    ) -> Result<Vec<Reclaimable>, Error> {
        let woken = match sweep {
            true => {
                "(w.ready OR EXISTS (SELECT 1 FROM scheduler_claims u
                                      WHERE u.period_key = w.watch AND u.state = 'succeeded'))"
            }
            false => "w.ready",
        };
        let found = self.noted(woken, jobs, limit).await?;
        Ok(found)
    }

    /// The periods of `jobs` noted as waiting that no claim has taken,
    /// oldest fire first.
    pub async fn waiting_periods(
        &self,
        jobs: &[String],
        limit: u32,
    ) -> Result<Vec<Reclaimable>, Error> {
        self.noted("TRUE", jobs, limit).await
    }

    /// The noted periods of `jobs` that `which` keeps and no claim has
    /// taken. The jobs are kept here, not in the statement: a scan's
    /// thousands of names would cost more to send and match than the few
    /// rows read.
    async fn noted(
        &self,
        which: &str,
        jobs: &[String],
        limit: u32,
    ) -> Result<Vec<Reclaimable>, Error> {
        let claimed = claimed(self);
        let rows: Vec<(String, String, i64, i64, i64)> = on_pool!(self, |pool, _now| {
            sqlx::query_as(&format!(
                "SELECT w.job, w.period, w.period_start, w.period_end, w.scheduled_at
                   FROM scheduler_waiting w
                  WHERE {which}
                    AND NOT EXISTS ({claimed})
                  ORDER BY w.scheduled_at"
            ))
            .fetch_all(pool)
            .await
        })?;
        let wanted: std::collections::HashSet<&str> = match rows.is_empty() {
            true => Default::default(),
            false => jobs.iter().map(String::as_str).collect(),
        };
        Ok(rows
            .into_iter()
            .filter(|(job, ..)| wanted.contains(job.as_str()))
            .take(usize::try_from(limit).unwrap_or(usize::MAX))
            .map(|(job, label, start, end, fire)| Reclaimable {
                job,
                period: Period {
                    label,
                    start: time(start),
                    end: time(end),
                },
                scheduled_at: time(fire),
                shard: None,
                trigger: Trigger::Upstream,
            })
            .collect())
    }

    /// What each of `keys` that waits was last found waiting for, in words.
    pub async fn waits(&self, keys: &[String]) -> Result<HashMap<String, String>, Error> {
        if keys.is_empty() {
            return Ok(HashMap::new());
        }
        let keys = serde_json::to_string(keys).unwrap_or_else(|_| "[]".into());
        let listed = keys_in(self);
        let claimed = claimed(self);
        let rows: Vec<(String, String)> = on_pool!(self, |pool, _now| {
            sqlx::query_as(&format!(
                "SELECT w.period_key, w.waits FROM scheduler_waiting w
                  WHERE w.period_key IN ({listed})
                    AND NOT EXISTS ({claimed})"
            ))
            .bind(&keys)
            .fetch_all(pool)
            .await
        })?;
        Ok(rows.into_iter().collect())
    }
}

/// The claim rows of the period of waiting row `w`: its own, or its
/// shards' (found by job and start, as the claims' index has them).
fn claimed(store: &Store) -> &'static str {
    match store {
        #[cfg(feature = "postgres")]
        Store::Postgres(_) => {
            "SELECT 1 FROM scheduler_claims c
              WHERE c.job = w.job AND c.period = w.period
                AND c.period_start = 'epoch'::timestamptz + w.period_start * interval '1 millisecond'"
        }
        #[cfg(feature = "sqlite")]
        Store::Sqlite(_) => {
            "SELECT 1 FROM scheduler_claims c
              WHERE c.job = w.job AND c.period = w.period AND c.period_start = w.period_start"
        }
    }
}

/// The values of a JSON array of text bound as `$1`, as a subquery.
fn keys_in(store: &Store) -> &'static str {
    match store {
        #[cfg(feature = "postgres")]
        Store::Postgres(_) => "SELECT value FROM json_array_elements_text($1::json)",
        #[cfg(feature = "sqlite")]
        Store::Sqlite(_) => "SELECT value FROM json_each($1)",
    }
}

/// An upstream period that succeeded: what may make the periods that
/// needed it stale.
#[derive(Debug, Clone)]
pub struct Succeeded {
    /// Its job.
    pub job: String,
    /// The period.
    pub period: Period,
    /// When its success was recorded.
    pub finished_at: DateTime<Utc>,
}

impl Store {
    /// The periods of `jobs` whose latest attempt succeeded at `since` or
    /// after, in one statement.
    pub async fn succeeded_since(
        &self,
        jobs: &[String],
        since: DateTime<Utc>,
    ) -> Result<Vec<Succeeded>, Error> {
        if jobs.is_empty() {
            return Ok(Vec::new());
        }
        let names = serde_json::to_string(jobs).unwrap_or_else(|_| "[]".into());
        let listed = keys_in(self);
        let postgres = self.is_postgres();
        let ms_of = |column: &str| match postgres {
            true => format!("(extract(epoch from {column}) * 1000)::bigint"),
            false => column.to_owned(),
        };
        let since_ms = match postgres {
            true => "to_timestamp($2 / 1000.0)",
            false => "$2",
        };
        let sql = format!(
            "SELECT job, period, {}, {}, {} FROM scheduler_claims
              WHERE job IN ({listed}) AND state = 'succeeded' AND finished_at >= {since_ms}",
            ms_of("period_start"),
            ms_of("period_end"),
            ms_of("finished_at"),
        );
        let rows: Vec<(String, String, i64, i64, i64)> = on_pool!(self, |pool, _now| {
            sqlx::query_as(&sql)
                .bind(&names)
                .bind(ms(since))
                .fetch_all(pool)
                .await
        })?;
        Ok(rows
            .into_iter()
            .map(|(job, label, start, end, finished)| Succeeded {
                job,
                period: Period {
                    label,
                    start: time(start),
                    end: time(end),
                },
                finished_at: time(finished),
            })
            .collect())
    }

    /// Lets the succeeded period `key` be claimed again for a new attempt
    /// (it is released, as `scheduler release` leaves a period), if its
    /// latest attempt is still `attempt`: of replicas that find it stale
    /// together, one reopens it. Whether this call did. The row's trigger
    /// becomes `upstream`, so whichever replica's scan takes the period
    /// (the one that reopened it may be beaten to it) runs it as the rerun
    /// it is, not as a recovery ([`Store::reclaimable`]).
    pub async fn reopen(&self, key: &str, attempt: i32) -> Result<bool, Error> {
        // The claims' own times: `timestamptz` on PostgreSQL, milliseconds
        // on SQLite.
        let finished = match self {
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => "now()",
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => super::sqlite::NOW,
        };
        let sql = format!(
            "UPDATE scheduler_claims
                SET state = 'released', lease_until = NULL, finished_at = {finished},
                    trigger = 'upstream'
              WHERE period_key = $1 AND state = 'succeeded' AND attempt = $2
              RETURNING period_key"
        );
        let reopened: Option<String> = on_pool!(self, |pool, _now| {
            sqlx::query_scalar(&sql)
                .bind(key)
                .bind(attempt)
                .fetch_optional(pool)
                .await
        })?;
        Ok(reopened.is_some())
    }
}
