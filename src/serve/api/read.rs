//! The API's reads: jobs, periods, one period and the runs asked for, and
//! the answers they share among readers who accept one a few seconds old
//! (`?max_age=`, what the console's auto-refresh asks for).

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use serde::Deserialize;
use serde_json::json;

use super::auth::{Need, authorize};
use super::reply::{Answer, Reply};
use super::run_view::run_summary;
use super::{Api, RANGE_LIMIT, find_job};
use crate::config::{Config, Job};
use crate::engine::manual::{self, Names};
use crate::engine::overview;
use crate::engine::view;
use crate::error::Error;

/// The oldest shared answer a read may ask for (`?max_age=`).
pub(super) const MAX_AGE: u64 = 60;

/// How many shared answers are kept at most.
const SHARED_READS: usize = 256;

/// How many bytes of shared answers are kept at most.
const SHARED_BYTES: usize = 16 << 20;

/// How many reads a replica answers at once.
pub(super) const READERS: usize = 2;

impl Api {
    /// The answer of a read for the token `who`, at most [`READERS`] at
    /// once on this replica and one of each token's at a time: a client
    /// that sends many reads at once queues them behind its own, not in
    /// front of other tokens' (the console's among them).
    /// With `max_age` (seconds) it is shared: an answer read at most that
    /// long ago for the same `key` is given again (readers queued behind
    /// one read get its answer), and kept as text, [`SHARED_BYTES`] in all
    /// at most. The console's auto-refresh asks this way, so any number of
    /// viewers cost the database one read per view per interval.
    async fn shared<F>(&self, who: &str, key: String, max_age: Option<u64>, read: F) -> Answer
    where
        F: Future<Output = Answer>,
    {
        let max_age = max_age.filter(|age| *age > 0).map(Duration::from_secs);
        let fresh = || {
            let max_age = max_age?;
            let shared = self.shared.lock().ok()?;
            let (at, body) = shared.get(&key)?;
            (at.elapsed() <= max_age).then(|| Reply::written(body.clone()))
        };
        if let Some(reply) = fresh() {
            return Ok(reply);
        }
        let own = self.turns_of(who);
        let _own_turn = own.acquire().await;
        if let Some(reply) = fresh() {
            return Ok(reply);
        }
        let _turn = self.readers.acquire().await;
        if let Some(reply) = fresh() {
            return Ok(reply);
        }
        let reply = read.await?;
        if max_age.is_none() || reply.status != StatusCode::OK || !reply.headers.is_empty() {
            return Ok(reply);
        }
        let text: Arc<str> = format!("{}\n", reply.body).into();
        drop(reply);
        if let Ok(mut shared) = self.shared.lock() {
            shared.retain(|_, (at, _)| at.elapsed() < Duration::from_secs(MAX_AGE));
            // The oldest go first while there are too many, or too much.
            let mut bytes: usize = shared.values().map(|(_, t)| t.len()).sum();
            while !shared.is_empty()
                && (shared.len() >= SHARED_READS || bytes + text.len() > SHARED_BYTES)
            {
                let oldest = shared
                    .iter()
                    .min_by_key(|(_, (at, _))| *at)
                    .map(|(k, _)| k.clone());
                if let Some((_, (_, gone))) = oldest.and_then(|k| shared.remove_entry(&k)) {
                    bytes -= gone.len();
                }
            }
            if text.len() <= SHARED_BYTES {
                shared.insert(key, (Instant::now(), text.clone()));
            }
        }
        Ok(Reply::written(text))
    }
}

/// The most recent periods `GET /v1/jobs?recent=` shows per job.
const RECENT_LIMIT: usize = 100;

#[derive(Deserialize)]
pub(super) struct JobsQuery {
    recent: Option<String>,
    max_age: Option<String>,
}

pub(super) async fn jobs(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Query(query): Query<JobsQuery>,
) -> Answer {
    let (config, token) = authorize(&api, &headers, Need::Read)?;
    let recent = number("recent", query.recent.as_deref(), RECENT_LIMIT)?.unwrap_or(0);
    let max_age = number("max_age", query.max_age.as_deref(), MAX_AGE as usize)?;
    let key = format!("jobs?recent={recent}");
    let read = list_jobs(&api, &config, recent);
    api.shared(&token.name, key, max_age.map(|a| a as u64), read)
        .await
}

async fn list_jobs(api: &Api, config: &Config, recent: usize) -> Answer {
    let now = api.now();
    let all: Vec<&Job> = config.jobs.iter().map(|j| &**j).collect();
    // The one overview `status` shows, with the API's few fields more.
    let overviews = overview::of_jobs(api.store(), &all, 1, now).await?;
    let mut jobs = Vec::with_capacity(config.jobs.len());
    for o in &overviews {
        jobs.push(overview::json(o, config, now));
    }
    if recent > 0 {
        // Every job's recent periods, read together.
        let mut listed = Vec::with_capacity(config.jobs.len());
        for job in &config.jobs {
            listed.push(manual::periods_up_to(job, None, recent, Names::JSON, now)?.0);
        }
        let asked: Vec<(&Job, &[crate::period::Period])> = config
            .jobs
            .iter()
            .zip(&listed)
            .map(|(job, periods)| (&**job, periods.as_slice()))
            .collect();
        let views = view::of_jobs(api.store(), &asked, now).await?;
        for (entry, views) in jobs.iter_mut().zip(views) {
            entry["recent"] = views
                .iter()
                .map(|v| json!({ "period": v.period.label, "state": v.state, "late": v.late }))
                .collect();
        }
    }
    Ok(Reply::ok(StatusCode::OK, json!({ "jobs": jobs })))
}

/// A whole number from 1 to `most` given as `?field=`, if given.
fn number(field: &str, given: Option<&str>, most: usize) -> Result<Option<usize>, Reply> {
    match given.map(str::parse::<usize>) {
        None => Ok(None),
        Some(Ok(n)) if (1..=most).contains(&n) => Ok(Some(n)),
        Some(_) => Err(Reply::bad(
            field,
            format!("?{field}= takes a whole number from 1 to {most}"),
        )),
    }
}

#[derive(Deserialize)]
pub(super) struct Range {
    from: Option<String>,
    to: Option<String>,
    last: Option<String>,
    limit: Option<String>,
    max_age: Option<String>,
}

pub(super) async fn periods(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(range): Query<Range>,
) -> Answer {
    let (config, token) = authorize(&api, &headers, Need::Read)?;
    let job = find_job(&config, &name)?;
    let last = number("last", range.last.as_deref(), RANGE_LIMIT)?;
    let limit = number("limit", range.limit.as_deref(), RANGE_LIMIT)?;
    let max_age = number("max_age", range.max_age.as_deref(), MAX_AGE as usize)?;
    let now = api.now();
    // The periods, with the label that goes on from them: the next page
    // of a range, or the period before the last ones.
    let (listed, more) = match (last, &range.from, &range.to) {
        (Some(_), _, _) if limit.is_some() => {
            return Err(Reply::bad(
                "limit",
                "`limit` pages a range (`from` and `to`); `last` is one page already",
            ));
        }
        (Some(_), Some(_), _) => {
            return Err(Reply::bad(
                "last",
                "give `last` (with `to` or without), or `from` and `to`, not both",
            ));
        }
        (Some(count), None, to) => {
            let (periods, before) =
                manual::periods_up_to(job, to.as_deref(), count, Names::JSON, now)?;
            (periods, json!({ "previous": before }))
        }
        (None, Some(from), Some(to)) => match limit {
            Some(limit) => {
                let (periods, next) = manual::page_between(job, (from, to), limit, Names::JSON)?;
                (periods, json!({ "next": next }))
            }
            None => (
                manual::periods_between(job, (from, to), RANGE_LIMIT, Names::JSON)?,
                json!({ "next": null }),
            ),
        },
        (None, from, _) => {
            let field = if from.is_none() { "from" } else { "to" };
            return Err(Reply::bad(
                field,
                format!("`{field}` is missing: ask for ?from=LABEL&to=LABEL, or ?last=N"),
            ));
        }
    };
    let key = format!(
        "periods/{}/{}/{}",
        job.name,
        listed.first().map_or("", |p| &p.label),
        listed.last().map_or("", |p| &p.label),
    );
    let read = async {
        let mut out = Vec::with_capacity(listed.len());
        for chunk in listed.chunks(view::VIEWS_PER_READ) {
            for view in view::periods(api.store(), job, chunk, now).await? {
                out.push(view.json());
            }
        }
        let mut body = json!({
            "job": job.name,
            "from": listed.first().map(|p| &p.label),
            "to": listed.last().map(|p| &p.label),
            "periods": out,
        });
        if let (Some(body), serde_json::Value::Object(more)) = (body.as_object_mut(), &more) {
            body.extend(more.clone());
        }
        Ok(Reply::ok(StatusCode::OK, body))
    };
    api.shared(&token.name, key, max_age.map(|a| a as u64), read)
        .await
}

#[derive(Deserialize)]
pub(super) struct Fresh {
    max_age: Option<String>,
}

pub(super) async fn period(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path((name, label)): Path<(String, String)>,
    Query(fresh): Query<Fresh>,
) -> Answer {
    let (config, token) = authorize(&api, &headers, Need::Read)?;
    let job = find_job(&config, &name)?;
    let max_age = number("max_age", fresh.max_age.as_deref(), MAX_AGE as usize)?;
    // A label no fire covers (a day off, a date outside the job's active
    // dates) names no period of the job.
    let Some(period) = manual::periods_between(job, (&label, &label), 1, Names::PATH)?
        .into_iter()
        .next()
    else {
        return Err(Reply::ok(
            StatusCode::NOT_FOUND,
            json!({
                "error": format!(
                    "no fire of job `{}` covers {label}: it is not a period of the job (its schedule, calendar or active dates leave it out)",
                    job.name
                ),
                "field": "period",
            }),
        ));
    };
    let key = format!("period/{}/{}", job.name, period.label);
    let read = async {
        let mut views =
            view::periods(api.store(), job, std::slice::from_ref(&period), api.now()).await?;
        let view = views
            .pop()
            .ok_or_else(|| Error::Usage(format!("{label}: no such period")))?;
        let mut attempts = api.store().attempts(view.key.as_str(), 1_000).await?;
        // A period split into shards: every shard's attempts, by shard.
        for shard in view.shards.iter().filter_map(|s| s.row.as_ref()) {
            attempts.extend(api.store().attempts(&shard.period_key, 1_000).await?);
        }
        let notifications: Vec<_> = api
            .store()
            .notifications(&job.name, 1_000)
            .await?
            .into_iter()
            .filter(|n| n.period_key == view.key.as_str())
            .collect();
        // The period as every view has it, with what only this route adds.
        let mut answer = view.json();
        answer["job"] = json!(job.name);
        answer["timezone"] = json!(job.schedule.zone().name());
        answer["claim"] = json!(view.row);
        answer["upstream"] = json!(view.upstream.waits);
        answer["attempts"] = json!(attempts);
        answer["notifications"] = json!(notifications);
        Ok(Reply::ok(StatusCode::OK, answer))
    };
    api.shared(&token.name, key, max_age.map(|a| a as u64), read)
        .await
}

/// The most runs `GET /v1/runs` lists.
const RUNS_LIMIT: usize = 500;

#[derive(Deserialize)]
pub(super) struct RunsQuery {
    limit: Option<String>,
    max_age: Option<String>,
}

/// `GET /v1/runs`: the runs asked for over the API, newest first, each
/// with its state, outcome and how many of its periods ended how.
pub(super) async fn runs(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Query(query): Query<RunsQuery>,
) -> Answer {
    let (_, token) = authorize(&api, &headers, Need::Read)?;
    let limit = number("limit", query.limit.as_deref(), RUNS_LIMIT)?.unwrap_or(50);
    let max_age = number("max_age", query.max_age.as_deref(), MAX_AGE as usize)?;
    let read = async {
        let runs = api.store().api_runs(limit).await?;
        let runs: Vec<_> = runs.iter().map(run_summary).collect();
        Ok(Reply::ok(StatusCode::OK, json!({ "runs": runs })))
    };
    api.shared(
        &token.name,
        format!("runs?limit={limit}"),
        max_age.map(|a| a as u64),
        read,
    )
    .await
}
