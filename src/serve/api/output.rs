//! `GET /v1/jobs/{job}/periods/{label}/attempts/{n}/output`: an attempt's
//! whole output as the database keeps it, a page of chunks at a time
//! (`?after=SEQ&limit=N`), or followed as server-sent events
//! (`?follow=true`) until the attempt ends.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::sse::{Event, Sse};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::auth::{Need, authorize};
use super::reply::Reply;
use super::{Api, find_job};
use crate::engine::manual::{self, Names};
use crate::state::AttemptOutcome;
use crate::store::{Chunk, Store};

/// The most chunks one page or one event carries.
const PAGE: u32 = 100;

/// How often a followed attempt is looked at for new output.
const FOLLOW_EVERY: Duration = Duration::from_millis(250);

/// How many quiet reads pass between two comments of a follow (15 s).
const KEEP_ALIVE_EVERY: u32 = 60;

/// The longest one request follows an attempt; the client asks again from
/// where it got to (`after`).
const FOLLOW_FOR: Duration = Duration::from_secs(3600);

/// The query of an output read.
#[derive(Deserialize)]
pub(super) struct Page {
    after: Option<String>,
    limit: Option<String>,
    follow: Option<String>,
    shard: Option<String>,
}

pub(super) async fn output(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path((name, label, n)): Path<(String, String, String)>,
    Query(page): Query<Page>,
) -> Result<Response, Reply> {
    let (config, _token) = authorize(&api, &headers, Need::Read)?;
    let job = find_job(&config, &name)?;
    let period = manual::parse_label(job, &label, Names::PATH.period).map_err(|e| Reply::of(&e))?;
    let shard = whole("shard", page.shard.as_deref(), 0)?.map(i32::unsigned_abs);
    let (key, _) = crate::engine::shards::key_of(api.store(), job, &period, (shard, "shard", true))
        .await
        .map_err(|e| Reply::of(&e))?;
    let key = key.to_string();
    let attempt = whole("attempt", Some(&n), 1)?.unwrap_or(1);
    let after = whole("after", page.after.as_deref(), -1)?.unwrap_or(-1);
    let limit =
        whole("limit", page.limit.as_deref(), 1)?.map_or(PAGE, |n| n.unsigned_abs().min(PAGE));
    let follow = match page.follow.as_deref() {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(Reply::bad("follow", "?follow= takes true or false")),
    };
    let store = api.store().clone();
    let outcome = outcome(&store, &key, attempt)
        .await
        .map_err(|e| Reply::of(&e))?
        .ok_or_else(|| {
            Reply::error(
                StatusCode::NOT_FOUND,
                format!("{key} has no attempt {attempt}"),
            )
        })?;
    if follow {
        return Ok(followed(store, key, attempt, after).into_response());
    }
    let chunks = store
        .output(&key, attempt, after, limit)
        .await
        .map_err(|e| Reply::of(&e))?;
    let next = chunks.last().map_or(after, |c| c.seq);
    let done = outcome != AttemptOutcome::Running && (chunks.len() as u32) < limit;
    Ok(Reply::ok(
        StatusCode::OK,
        json!({
            "period_key": key, "attempt": attempt, "outcome": outcome,
            "chunks": chunks, "after": next, "done": done,
        }),
    )
    .into_response())
}

/// `?field=` as a whole number of at least `least`.
fn whole(field: &str, given: Option<&str>, least: i32) -> Result<Option<i32>, Reply> {
    match given.map(str::parse::<i32>) {
        None => Ok(None),
        Some(Ok(n)) if n >= least => Ok(Some(n)),
        Some(_) => Err(Reply::bad(
            field,
            format!("{field} takes a whole number from {least}"),
        )),
    }
}

/// How attempt `attempt` of `key` ended, or that it runs; `None` if there
/// is no such attempt.
async fn outcome(
    store: &Store,
    key: &str,
    attempt: i32,
) -> Result<Option<AttemptOutcome>, crate::error::Error> {
    Ok(store
        .attempts(key, u32::MAX)
        .await?
        .into_iter()
        .find(|a| a.attempt == attempt)
        .map(|a| a.outcome))
}

/// An `error` event for a read that failed, sent after a pause: the
/// next read is the same one, and a database that is down is not asked
/// in a loop.
async fn failed(e: &crate::error::Error) -> Event {
    tokio::time::sleep(FOLLOW_EVERY * 4).await;
    event("error", &json!({ "error": e.to_string() }))
}

/// An event called `name` carrying `data` as JSON.
fn event(name: &str, data: &impl serde::Serialize) -> Event {
    Event::default()
        .event(name)
        .data(serde_json::to_string(data).unwrap_or_default())
}

/// The attempt's chunks after `after` as they are written, an event
/// (`output`: a JSON array of chunks) per read that found some, then an
/// `end` event with how it ended. Each read takes a connection for its
/// statement only; a client that stops reading stops the reads (the
/// stream is pulled as the socket takes it), and a follow ends after
/// [`FOLLOW_FOR`] at most.
fn followed(store: Store, key: String, attempt: i32, after: i32) -> impl IntoResponse {
    let until = tokio::time::Instant::now() + FOLLOW_FOR;
    let state = Some((store, key, after));
    let events = futures_util::stream::unfold(state, move |state| async move {
        let (store, key, mut after) = state?;
        let mut idle = 0;
        loop {
            let event = match store.output(&key, attempt, after, PAGE).await {
                Ok(chunks) if !chunks.is_empty() => {
                    after = chunks.last().map_or(after, |c: &Chunk| c.seq);
                    event("output", &chunks)
                }
                Ok(_) => match outcome(&store, &key, attempt).await {
                    Ok(Some(AttemptOutcome::Running)) if tokio::time::Instant::now() < until => {
                        // A runner that died leaves its attempt running
                        // until a takeover: the follow ends once its lease
                        // ran out (looked at once a second).
                        if idle % 4 == 3
                            && let Ok(Some((owner, at))) = store.lease_ran_out(&key, attempt).await
                        {
                            let end = json!({
                                "outcome": AttemptOutcome::Running, "after": after,
                                "runner_gone": { "owner": owner, "lease_until": crate::period::utc_text(at) },
                            });
                            return Some((Ok::<_, Infallible>(event("end", &end)), None));
                        }
                        tokio::time::sleep(FOLLOW_EVERY).await;
                        idle += 1;
                        // A comment now and then keeps a quiet follow
                        // from being cut as idle by a proxy.
                        if idle % KEEP_ALIVE_EVERY == 0 {
                            let ping = Event::default().comment("still running");
                            return Some((Ok(ping), Some((store, key, after))));
                        }
                        continue;
                    }
                    Ok(outcome) => {
                        let end = json!({ "outcome": outcome, "after": after });
                        return Some((Ok::<_, Infallible>(event("end", &end)), None));
                    }
                    Err(e) => failed(&e).await,
                },
                Err(e) => failed(&e).await,
            };
            return Some((Ok(event), Some((store, key, after))));
        }
    });
    Sse::new(events)
}
