//! Notifications, written once for both backends (times are milliseconds
//! on the database's clock): one row per (notifier, period key, event),
//! created by whichever replica sees the event first and delivered by the
//! one that takes it, as a period is claimed; a delivery whose replica
//! went away is taken over once its lease runs out.

use std::time::Duration;

use chrono::DateTime;
use serde::Serialize;

use super::{DeliveryState, Store, ms};

use crate::error::Error;

/// A notification to create, if it is new.
#[derive(Debug, Clone)]
pub struct NewNotification {
    /// The notifier's name.
    pub notifier: String,
    /// The period key.
    pub period_key: String,
    /// `late`, `failed` or `recovered`.
    pub event: &'static str,
    /// The job.
    pub job: String,
    /// The body every try sends.
    pub payload: String,
}

/// A notification taken for delivery.
#[derive(Debug, Clone)]
pub struct Delivery {
    /// The notifier's name.
    pub notifier: String,
    /// The period key.
    pub period_key: String,
    /// The event.
    pub event: String,
    /// The body.
    pub payload: String,
    /// This try's number, from 1: the fence of its outcome.
    pub tries: i32,
    /// When it was created, in milliseconds since the epoch.
    pub created_at: i64,
}

/// A notification as `history` and the API show it.
#[derive(Debug, Clone, Serialize)]
pub struct Notification {
    /// The notifier's name.
    pub notifier: String,
    /// The period key.
    pub period_key: String,
    /// The event.
    pub event: String,
    /// Pending, sending, delivered or given up.
    pub state: DeliveryState,
    /// Tries so far.
    pub tries: i32,
    /// The receiver's last HTTP status.
    pub status: Option<i32>,
    /// The last failure, masked.
    pub error: Option<String>,
    /// When it was created, in milliseconds since the epoch (shown as
    /// RFC 3339).
    #[serde(serialize_with = "instant")]
    pub created_at: i64,
    /// When it was delivered or given up.
    #[serde(serialize_with = "maybe_instant")]
    pub finished_at: Option<i64>,
}

from_row!(Delivery {
    notifier,
    period_key,
    event,
    payload,
    tries,
    created_at,
});
from_row!(Notification {
    notifier,
    period_key,
    event,
    state: word,
    tries,
    status,
    error,
    created_at,
    finished_at,
});
from_row!(FailedForGood {
    job,
    period_key,
    period,
    attempt,
    failures,
    error,
});

fn instant<S: serde::Serializer>(ms: &i64, serializer: S) -> Result<S::Ok, S::Error> {
    let at = DateTime::from_timestamp_millis(*ms).unwrap_or_default();
    serializer.serialize_str(&crate::period::utc_text(at))
}

fn maybe_instant<S: serde::Serializer>(ms: &Option<i64>, serializer: S) -> Result<S::Ok, S::Error> {
    match ms {
        Some(ms) => instant(ms, serializer),
        None => serializer.serialize_none(),
    }
}

/// How a try ended.
#[derive(Debug, Clone)]
pub enum Tried {
    /// The receiver took it (2xx).
    Delivered(u16),
    /// It refused it for good (4xx): not sent again.
    GivenUp(Option<u16>, String),
    /// Sent again after `Duration` (5xx, a timeout, the network).
    Again(Option<u16>, String, Duration),
}

impl Store {
    /// Creates each notification that does not exist yet, decided by the
    /// primary key: how many were new.
    pub async fn notify_new(&self, new: &[NewNotification]) -> Result<u64, Error> {
        if new.is_empty() {
            return Ok(0);
        }
        let rows: Vec<serde_json::Value> = new
            .iter()
            .map(|n| {
                serde_json::json!({
                    "notifier": n.notifier, "period_key": n.period_key, "event": n.event,
                    "job": n.job, "payload": n.payload,
                })
            })
            .collect();
        let rows = serde_json::Value::Array(rows).to_string();
        let from = match self {
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => {
                "SELECT notifier, period_key, event, job, payload
                   FROM json_to_recordset($1::json)
                     AS x(notifier text, period_key text, event text, job text, payload text)"
            }
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => {
                "SELECT json_extract(value, '$.notifier'), json_extract(value, '$.period_key'),
                        json_extract(value, '$.event'), json_extract(value, '$.job'),
                        json_extract(value, '$.payload')
                   FROM json_each($1)"
            }
        };
        on_pool!(self, |pool, now| {
            sqlx::query(&format!(
                "INSERT INTO scheduler_notifications
                    (notifier, period_key, event, job, payload, state, next_try_at, created_at)
                 SELECT f.*, 'pending', {now}, {now} FROM ({from}) AS f WHERE true
                 ON CONFLICT DO NOTHING"
            ))
            .bind(&rows)
            .execute(pool)
            .await
            .map(|done| done.rows_affected())
        })
    }

    /// Takes up to `limit` notifications of the notifiers `names` due for a
    /// try as `owner`, for `lease`: pending ones whose try is due, and,
    /// with `expired`, ones whose taker's lease ran out (the engine leaves
    /// them to their holders while [`Store::holding`]: the holder may still
    /// be writing how its send went). Each comes with its try number, the
    /// fence of its outcome. A notifier taken out of jobs.toml keeps its
    /// rows pending, for a reload that puts it back.
    pub async fn notify_take(
        &self,
        owner: &str,
        lease: Duration,
        names: &[&str],
        limit: u32,
        expired: bool,
    ) -> Result<Vec<Delivery>, Error> {
        // PostgreSQL skips the rows another replica is taking; both check
        // the state again on the row they update.
        let (lock, named) = match self {
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => (
                "FOR UPDATE SKIP LOCKED",
                "d.notifier IN (SELECT json_array_elements_text($4::json))",
            ),
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => ("", "d.notifier IN (SELECT value FROM json_each($4))"),
        };
        let expired = if expired { "true" } else { "false" };
        let names = serde_json::to_string(names).unwrap_or_else(|_| "[]".into());
        on_pool!(self, |pool, now| {
            sqlx::query_as::<_, Delivery>(&format!(
                "UPDATE scheduler_notifications
                    SET state = 'sending', owner = $1, lease_until = {now} + $2, tries = tries + 1
                  WHERE (notifier, period_key, event) IN (
                          SELECT d.notifier, d.period_key, d.event FROM scheduler_notifications d
                           WHERE ((d.state = 'pending' AND d.next_try_at <= {now})
                                  OR (d.state = 'sending' AND d.lease_until <= {now} AND {expired}))
                             AND {named}
                             -- A `recovered` waits for its period's `late` or
                             -- `failed` to be delivered or given up.
                             AND (d.event <> 'recovered' OR NOT EXISTS (
                                   SELECT 1 FROM scheduler_notifications o
                                    WHERE o.notifier = d.notifier AND o.period_key = d.period_key
                                      AND o.event IN ('late', 'failed')
                                      AND o.state IN ('pending', 'sending')))
                           ORDER BY d.created_at LIMIT $3 {lock})
                    AND ((state = 'pending' AND next_try_at <= {now})
                         OR (state = 'sending' AND lease_until <= {now} AND {expired}))
                 RETURNING notifier, period_key, event, payload, tries, created_at"
            ))
            .bind(owner)
            .bind(ms(lease))
            .bind(i64::from(limit))
            .bind(&names)
            .fetch_all(pool)
            .await
        })
    }

    /// Writes how each try of `tried` ended, in one statement, except
    /// where another replica took the notification over meanwhile (its
    /// try number and owner decide): how many were written.
    pub async fn notify_tried(
        &self,
        tried: &[(&Delivery, Tried)],
        owner: &str,
    ) -> Result<u64, Error> {
        if tried.is_empty() {
            return Ok(0);
        }
        let rows: Vec<serde_json::Value> = tried
            .iter()
            .map(|(delivery, tried)| {
                let (state, status, error, again) = match tried {
                    Tried::Delivered(status) => ("delivered", Some(*status), None, None),
                    Tried::GivenUp(status, error) => ("given_up", *status, Some(error), None),
                    Tried::Again(status, error, after) => {
                        ("pending", *status, Some(error), Some(ms(*after)))
                    }
                };
                serde_json::json!({
                    "notifier": delivery.notifier, "period_key": delivery.period_key,
                    "event": delivery.event, "tries": delivery.tries, "state": state,
                    "status": status, "error": error, "again": again,
                })
            })
            .collect();
        let rows = serde_json::Value::Array(rows).to_string();
        let from = match self {
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => {
                "SELECT * FROM json_to_recordset($1::json)
                     AS x(notifier text, period_key text, event text, tries int, state text,
                          status int, error text, again bigint)"
            }
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => {
                "SELECT json_extract(value, '$.notifier') AS notifier,
                        json_extract(value, '$.period_key') AS period_key,
                        json_extract(value, '$.event') AS event,
                        json_extract(value, '$.tries') AS tries,
                        json_extract(value, '$.state') AS state,
                        json_extract(value, '$.status') AS status,
                        json_extract(value, '$.error') AS error,
                        json_extract(value, '$.again') AS again
                   FROM json_each($1)"
            }
        };
        on_pool!(self, |pool, now| {
            sqlx::query(&format!(
                "UPDATE scheduler_notifications AS n
                    SET state = x.state, status = x.status, error = x.error, owner = NULL,
                        lease_until = NULL, next_try_at = {now} + COALESCE(x.again, 0),
                        finished_at = CASE WHEN x.again IS NULL THEN {now} ELSE NULL END
                   FROM ({from}) AS x
                  WHERE n.notifier = x.notifier AND n.period_key = x.period_key
                    AND n.event = x.event AND n.owner = $2 AND n.tries = x.tries
                    AND n.state = 'sending'"
            ))
            .bind(&rows)
            .bind(owner)
            .execute(pool)
            .await
            .map(|done| done.rows_affected())
        })
    }

    /// The notifications of `job`, newest first.
    pub async fn notifications(&self, job: &str, limit: u32) -> Result<Vec<Notification>, Error> {
        on_pool!(self, |pool, _now| {
            sqlx::query_as::<_, Notification>(
                "SELECT notifier, period_key, event, state, tries, status, error, created_at, finished_at
                   FROM scheduler_notifications WHERE job = $1
                  ORDER BY created_at DESC, period_key DESC LIMIT $2",
            )
            .bind(job)
            .bind(i64::from(limit))
            .fetch_all(pool)
            .await
        })
    }

    /// The (notifier, job, period key) of each `late` or `failed`
    /// notification whose period has succeeded since and that has no
    /// `recovered` yet.
    pub async fn notify_recovered(&self) -> Result<Vec<(String, String, String)>, Error> {
        on_pool!(self, |pool, _now| {
            sqlx::query_as::<_, (String, String, String)>(
                "SELECT DISTINCT n.notifier, n.job, n.period_key
                   FROM scheduler_notifications n
                   JOIN scheduler_claims c ON c.period_key = n.period_key AND c.state = 'succeeded'
                  WHERE n.event IN ('late', 'failed')
                    AND NOT EXISTS (SELECT 1 FROM scheduler_notifications r
                                     WHERE r.notifier = n.notifier AND r.period_key = n.period_key
                                       AND r.event = 'recovered')",
            )
            .fetch_all(pool)
            .await
        })
    }

    /// The (notifier, job, period key) of each `late` or `failed`
    /// notification with no `recovered` yet whose key has no claim row of
    /// its own: a period split into shards (or one never claimed), whose
    /// shards tell whether it has succeeded since.
    pub async fn notify_unrecovered_unclaimed(
        &self,
    ) -> Result<Vec<(String, String, String)>, Error> {
        on_pool!(self, |pool, _now| {
            sqlx::query_as::<_, (String, String, String)>(
                "SELECT DISTINCT n.notifier, n.job, n.period_key
                   FROM scheduler_notifications n
                  WHERE n.event IN ('late', 'failed')
                    AND NOT EXISTS (SELECT 1 FROM scheduler_claims c WHERE c.period_key = n.period_key)
                    AND NOT EXISTS (SELECT 1 FROM scheduler_notifications r
                                     WHERE r.notifier = n.notifier AND r.period_key = n.period_key
                                       AND r.event = 'recovered')",
            )
            .fetch_all(pool)
            .await
        })
    }

    /// The periods failed for good (no retry left) that ended within
    /// `window`, of every job: job, period key, label, attempt and the last
    /// attempt's error.
    pub async fn failed_for_good(&self, window: Duration) -> Result<Vec<FailedForGood>, Error> {
        // The claims' times are each backend's own: a timestamp on
        // PostgreSQL, milliseconds on SQLite.
        let recent = match self {
            #[cfg(feature = "postgres")]
            Store::Postgres(_) => {
                "c.finished_at > clock_timestamp() - make_interval(secs => $1 / 1000.0)"
            }
            #[cfg(feature = "sqlite")]
            Store::Sqlite(_) => "c.finished_at > CAST(unixepoch('subsec') * 1000 AS INTEGER) - $1",
        };
        on_pool!(self, |pool, _now| {
            sqlx::query_as::<_, FailedForGood>(&format!(
                "SELECT c.job, c.period_key, c.period, c.attempt, c.failures, a.error
                   FROM scheduler_claims c
                   LEFT JOIN scheduler_attempts a ON a.period_key = c.period_key AND a.attempt = c.attempt
                  WHERE c.state = 'failed' AND c.retry_at IS NULL AND {recent}"
            ))
            .bind(ms(window))
            .fetch_all(pool)
            .await
        })
    }
}

/// A period failed for good, as a `failed` notification tells it.
#[derive(Debug, Clone)]
pub struct FailedForGood {
    /// The job.
    pub job: String,
    /// The period key.
    pub period_key: String,
    /// The period's label.
    pub period: String,
    /// The attempt that failed last.
    pub attempt: i32,
    /// Failures so far.
    pub failures: i32,
    /// What went wrong, masked when it was recorded.
    pub error: Option<String>,
}
