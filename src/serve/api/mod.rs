//! The HTTP API under `/v1/`: bearer tokens from `[api]` (`auth`), the
//! Idempotency-Key contract on every `POST` (`idempotent`), and manual
//! runs through the engine's one driver ([`crate::engine::manual`]) on this
//! replica, under its heartbeats and its shutdown (`runs`). This file
//! holds the routes and what each answers.

mod auth;
mod idempotent;
mod reply;
mod runs;
mod session;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::routing::{get, post};
use chrono::Utc;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::config::{Config, Job};
use crate::engine::manual::{self, Names, Request, Selection};
use crate::engine::view::{self, PeriodView};
use crate::engine::{Engine, operate};
use crate::error::Error;
use crate::period::{PeriodKey, utc_text};
use crate::store::{Released, Store};
use auth::{Need, authorize};
use idempotent::Idempotent;
pub use reply::no_route;
use reply::{Answer, Reply, body_of, empty_body, json_errors, read_body};
use runs::run_body;

/// The largest request body.
pub const BODY_LIMIT: usize = 64 * 1024;

/// How long a client may take to send its body.
const BODY_TIMEOUT: Duration = Duration::from_secs(10);

/// The longest `?wait=`.
pub const MAX_WAIT: u64 = 300;

/// The longest range one request reads or runs.
const RANGE_LIMIT: usize = 10_000;

/// How often a running run writes what it did so far, and so how far
/// ahead it keeps itself alive (three times this).
const RUN_TICK: Duration = Duration::from_secs(1);

/// The oldest shared answer a read may ask for (`?max_age=`).
const MAX_AGE: u64 = 60;

/// How many shared answers are kept at most.
const SHARED_READS: usize = 256;

/// How long an Idempotency-Key may stay in progress past its request's own
/// bound before another request may take it over (its replica went away).
const KEY_SLACK: Duration = Duration::from_secs(30);

/// What the API serves from: the current configuration (replaced on
/// SIGHUP), the engine that runs its periods, and the runs it started.
pub struct Api {
    config: RwLock<Arc<Config>>,
    engine: Engine,
    shutdown: watch::Receiver<bool>,
    runs: tokio::sync::Mutex<JoinSet<()>>,
    /// Answers of reads asked with `?max_age=`, by route and query, with
    /// when each was read.
    shared: Mutex<HashMap<String, (Instant, Arc<str>)>>,
    /// Held while a shared answer is read, so that viewers who ask at the
    /// same moment cost one read.
    reading: tokio::sync::Mutex<()>,
}

impl Api {
    /// The API of a replica that runs on `engine`.
    pub(super) fn new(
        config: Arc<Config>,
        engine: Engine,
        shutdown: watch::Receiver<bool>,
    ) -> Arc<Api> {
        Arc::new(Api {
            config: RwLock::new(config),
            engine,
            shutdown,
            runs: tokio::sync::Mutex::new(JoinSet::new()),
            shared: Mutex::new(HashMap::new()),
            reading: tokio::sync::Mutex::new(()),
        })
    }

    /// A reload: requests from now on see `config`.
    pub fn set_config(&self, config: Arc<Config>) {
        if let Ok(mut current) = self.config.write() {
            *current = config;
        }
    }

    fn config(&self) -> Arc<Config> {
        match self.config.read() {
            Ok(config) => config.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    fn store(&self) -> &Store {
        self.engine.store()
    }

    /// Deletes Idempotency-Keys and runs past `key_ttl`, with `[api]` on,
    /// and shared answers past the oldest any read may ask for.
    pub async fn prune(&self) -> Result<u64, Error> {
        if let Ok(mut shared) = self.shared.lock() {
            shared.retain(|_, (at, _)| at.elapsed() < Duration::from_secs(MAX_AGE));
            if shared.is_empty() {
                *shared = HashMap::new();
            }
        }
        if self.config().api.is_none() {
            return Ok(0);
        }
        self.store().prune_api(false).await
    }

    /// The answer of a read, shared: with `max_age` (seconds), an answer
    /// read at most that long ago for the same `key` is given again, and
    /// readers who ask at the same moment wait for one read. The
    /// console's auto-refresh asks this way, so any number of viewers
    /// cost the database one read per view per interval. Without
    /// `max_age`, `read` runs.
    async fn shared<F>(&self, key: String, max_age: Option<u64>, read: F) -> Answer
    where
        F: Future<Output = Answer>,
    {
        let Some(max_age) = max_age.filter(|age| *age > 0) else {
            return read.await;
        };
        let max_age = Duration::from_secs(max_age);
        let fresh = || {
            let shared = self.shared.lock().ok()?;
            let (at, body) = shared.get(&key)?;
            (at.elapsed() <= max_age).then(|| Reply::written(body.clone()))
        };
        if let Some(reply) = fresh() {
            return Ok(reply);
        }
        let _reading = self.reading.lock().await;
        if let Some(reply) = fresh() {
            return Ok(reply);
        }
        let reply = read.await?;
        if reply.status != StatusCode::OK || !reply.headers.is_empty() {
            return Ok(reply);
        }
        let text: Arc<str> = format!("{}\n", reply.body).into();
        drop(reply);
        if let Ok(mut shared) = self.shared.lock() {
            if shared.len() >= SHARED_READS {
                shared.retain(|_, (at, _)| at.elapsed() < Duration::from_secs(MAX_AGE));
            }
            if shared.len() >= SHARED_READS {
                shared.clear();
            }
            shared.insert(key, (Instant::now(), text.clone()));
        }
        Ok(Reply::written(text))
    }

    /// Waits for the runs this replica started (at shutdown, they stop
    /// claiming and their running periods get the grace).
    pub async fn finish(&self) {
        let mut runs = self.runs.lock().await;
        // Runs that ended already are not waited for.
        while runs.try_join_next().is_some() {}
        if !runs.is_empty() {
            tracing::info!(
                runs = runs.len(),
                "waiting for the runs asked for over the API; past the grace they are stopped and their claims released"
            );
        }
        while runs.join_next().await.is_some() {}
    }
}

/// The `/v1/` routes.
pub fn routes(api: Arc<Api>) -> Router {
    Router::new()
        .route("/v1/jobs", get(jobs))
        .route("/v1/jobs/{job}/periods", get(periods))
        .route("/v1/jobs/{job}/periods/{label}", get(period))
        .route("/v1/jobs/{job}/runs", post(start_run))
        .route("/v1/runs", get(list_runs))
        .route("/v1/runs/{id}", get(get_run))
        .route("/v1/jobs/{job}/pause", post(pause))
        .route("/v1/jobs/{job}/resume", post(resume))
        .route("/v1/jobs/{job}/periods/{label}/release", post(release))
        .route(
            "/console/session",
            get(session::current)
                .post(session::login)
                .delete(session::logout),
        )
        .method_not_allowed_fallback(|| async {
            Reply::error(
                StatusCode::METHOD_NOT_ALLOWED,
                "this route takes another method: GET reads, POST triggers and operates",
            )
        })
        .layer(axum::middleware::map_response(json_errors))
        .with_state(api)
}

/// The job named `name`, or a 404 naming the nearest one.
fn find_job<'a>(config: &'a Config, name: &str) -> Result<&'a Job, Reply> {
    config.find(name).map_err(|near| {
        let mut body = json!({
            "error": format!("no job named `{name}`"),
            "field": "job",
        });
        if let Some(near) = near {
            body["nearest"] = json!(near);
            body["error"] = json!(format!("no job named `{name}`; did you mean `{near}`?"));
        }
        Reply::ok(StatusCode::NOT_FOUND, body)
    })
}

/// The most recent periods `GET /v1/jobs?recent=` shows per job.
const RECENT_LIMIT: usize = 100;

#[derive(Deserialize)]
struct JobsQuery {
    recent: Option<String>,
    max_age: Option<String>,
}

async fn jobs(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Query(query): Query<JobsQuery>,
) -> Answer {
    let (config, _) = authorize(&api, &headers, Need::Read)?;
    let recent = number("recent", query.recent.as_deref(), RECENT_LIMIT)?.unwrap_or(0);
    let max_age = number("max_age", query.max_age.as_deref(), MAX_AGE as usize)?;
    let key = format!("jobs?recent={recent}");
    let read = list_jobs(&api, &config, recent);
    api.shared(key, max_age.map(|a| a as u64), read).await
}

async fn list_jobs(api: &Api, config: &Config, recent: usize) -> Answer {
    let paused = api.store().paused_jobs().await?;
    let now = Utc::now();
    let all: Vec<&Job> = config.jobs.iter().collect();
    let mut late =
        crate::engine::due::late(api.store(), &all, config.settings.catch_up, now).await?;
    let waiting = api.store().waiting_counts().await?;
    let mut jobs = Vec::with_capacity(config.jobs.len());
    for job in &config.jobs {
        // A paused job skips its fires by design: none is late.
        let late: Vec<String> = late
            .remove(&job.name)
            .filter(|_| !paused.contains(&job.name))
            .unwrap_or_default()
            .into_iter()
            .map(|(key, _)| key)
            .collect();
        let last_rows = api.store().recent(&job.name, 1).await?;
        let last = crate::store::ClaimRow::finished_last(&last_rows);
        let next = job.schedule.next_after(now);
        let next_key = next.map(|fire| {
            PeriodKey::new(&job.name, &job.period.period_of(&job.schedule, fire).label).to_string()
        });
        let entry = json!({
            "job": job.name,
            "schedule": job.schedule.source(),
            "schedule_words": job.schedule.describe(),
            "timezone": job.schedule.zone().name(),
            "period": job.period.unit.to_string(),
            "covers": job.period.covers.to_string(),
            "next_fire": next.map(utc_text),
            "next_key": next_key,
            "paused": paused.contains(&job.name),
            "last": last,
            "deadline": job.deadline.map(crate::config::short),
            "late": late,
            "after": job.after.named.iter().map(|n| config.full_name(&n.name)).collect::<Vec<_>>(),
            "on_upstream_rerun": job.after.any().then(|| job.after.on_rerun.to_string()),
            "waiting": waiting.get(&job.name).copied().unwrap_or(0),
        });
        jobs.push(entry);
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
            .map(|(job, periods)| (job, periods.as_slice()))
            .collect();
        let views = view::of_jobs(api.store(), &asked, now).await?;
        for (entry, views) in jobs.iter_mut().zip(views) {
            entry["recent"] = views
                .iter()
                .map(|v| json!({ "period": v.period.label, "state": v.state }))
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
struct Range {
    from: Option<String>,
    to: Option<String>,
    last: Option<String>,
    limit: Option<String>,
    max_age: Option<String>,
}

async fn periods(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(range): Query<Range>,
) -> Answer {
    let (config, _) = authorize(&api, &headers, Need::Read)?;
    let job = find_job(&config, &name)?;
    let last = number("last", range.last.as_deref(), RANGE_LIMIT)?;
    let limit = number("limit", range.limit.as_deref(), RANGE_LIMIT)?;
    let max_age = number("max_age", range.max_age.as_deref(), MAX_AGE as usize)?;
    let now = Utc::now();
    // The periods, with the label that goes on from them: the next page
    // of a range, or the period before the last ones.
    let (listed, more) = match (last, &range.from, &range.to) {
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
                out.push(period_json(view));
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
    api.shared(key, max_age.map(|a| a as u64), read).await
}

/// One period of `GET /v1/jobs/{job}/periods`.
fn period_json(view: PeriodView) -> serde_json::Value {
    let (waiting_for, stale) = (view.waiting_for(), view.stale_json());
    let PeriodView {
        key,
        period,
        state,
        fire,
        row,
        ..
    } = view;
    let row = row.as_ref();
    json!({
        "period_key": key,
        "period": period.label,
        "state": state,
        "fire": fire.map(utc_text),
        "attempt": row.map(|r| r.attempt),
        "failures": row.map(|r| r.failures),
        "owner": row.map(|r| &r.owner),
        "lease_until": row.and_then(|r| r.lease_until).map(utc_text),
        "retry_at": row.and_then(|r| r.retry_at).map(utc_text),
        "finished_at": row.and_then(|r| r.finished_at).map(utc_text),
        "waiting_for": waiting_for,
        "stale": stale,
    })
}

#[derive(Deserialize)]
struct Fresh {
    max_age: Option<String>,
}

async fn period(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path((name, label)): Path<(String, String)>,
    Query(fresh): Query<Fresh>,
) -> Answer {
    let (config, _) = authorize(&api, &headers, Need::Read)?;
    let job = find_job(&config, &name)?;
    let max_age = number("max_age", fresh.max_age.as_deref(), MAX_AGE as usize)?;
    let period = manual::periods_between(job, (&label, &label), 1, Names::PATH)?.remove(0);
    let key = format!("period/{}/{}", job.name, period.label);
    let read = async {
        let mut views =
            view::periods(api.store(), job, std::slice::from_ref(&period), Utc::now()).await?;
        let view = views
            .pop()
            .ok_or_else(|| Error::Usage(format!("{label}: no such period")))?;
        let (waiting_for, stale) = (view.waiting_for(), view.stale_json());
        let PeriodView {
            key,
            state,
            fire,
            row,
            upstream,
            ..
        } = view;
        let attempts = api.store().attempts(key.as_str(), 1_000).await?;
        let notifications: Vec<_> = api
            .store()
            .notifications(&job.name, 1_000)
            .await?
            .into_iter()
            .filter(|n| n.period_key == key.as_str())
            .collect();
        Ok(Reply::ok(
            StatusCode::OK,
            json!({
                "job": job.name,
                "period": period.label,
                "period_key": key,
                "state": state,
                "fire": fire.map(utc_text),
                "claim": row,
                "waiting_for": waiting_for,
                "upstream": upstream.waits,
                "stale": stale,
                "attempts": attempts,
                "notifications": notifications,
            }),
        ))
    };
    api.shared(key, max_age.map(|a| a as u64), read).await
}

/// The most runs `GET /v1/runs` lists.
const RUNS_LIMIT: usize = 500;

#[derive(Deserialize)]
struct RunsQuery {
    limit: Option<String>,
    max_age: Option<String>,
}

/// `GET /v1/runs`: the runs asked for over the API, newest first, each
/// with its state, outcome and how many of its periods ended how.
async fn list_runs(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Query(query): Query<RunsQuery>,
) -> Answer {
    authorize(&api, &headers, Need::Read)?;
    let limit = number("limit", query.limit.as_deref(), RUNS_LIMIT)?.unwrap_or(50);
    let max_age = number("max_age", query.max_age.as_deref(), MAX_AGE as usize)?;
    let read = async {
        let runs = api.store().api_runs(limit).await?;
        let runs: Vec<_> = runs.iter().map(runs::run_summary).collect();
        Ok(Reply::ok(StatusCode::OK, json!({ "runs": runs })))
    };
    api.shared(
        format!("runs?limit={limit}"),
        max_age.map(|a| a as u64),
        read,
    )
    .await
}

async fn get_run(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(id): Path<String>,
) -> Answer {
    authorize(&api, &headers, Need::Read)?;
    match api.store().api_run(&id).await? {
        Some(run) => Ok(Reply::ok(StatusCode::OK, run_body(&run))),
        None => Err(Reply::error(
            StatusCode::NOT_FOUND,
            format!("no run `{id}`"),
        )),
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RunBody {
    period: Option<String>,
    from: Option<String>,
    to: Option<String>,
    #[serde(default)]
    force: bool,
    #[serde(default)]
    early: bool,
    #[serde(default)]
    with_upstream: bool,
    #[serde(default)]
    only_failed: bool,
}

#[derive(Deserialize)]
struct Wait {
    wait: Option<String>,
}

async fn start_run(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(wait): Query<Wait>,
    body: Body,
) -> Answer {
    let (config, token) = authorize(&api, &headers, Need::Trigger)?;
    if *api.shutdown.borrow() {
        // Another replica takes it: nothing is stored under the key.
        return Err(Reply::error(
            StatusCode::SERVICE_UNAVAILABLE,
            "this replica is shutting down; retry (another replica answers)",
        )
        .with(header::RETRY_AFTER, "1"));
    }
    let wait = match wait.wait.as_deref().map(str::parse::<u64>) {
        None => 0,
        Some(Ok(secs)) if secs <= MAX_WAIT => secs,
        Some(_) => {
            let why = format!("?wait= takes whole seconds from 0 to {MAX_WAIT}");
            return Err(Reply::bad("wait", why));
        }
    };
    let value = body_of(&read_body(body).await?)?;
    let mut id = [0u8; 16];
    if getrandom::fill(&mut id).is_err() {
        return Err(Reply::error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "no random numbers",
        ));
    }
    let idempotent = Idempotent {
        api: &api,
        token: &token,
        route: "POST /v1/jobs/{job}/runs",
        path: format!("/v1/jobs/{name}/runs"),
        bound: Duration::from_secs(wait) + BODY_TIMEOUT,
        run_id: Some(hex::encode(id)),
    };
    let api = api.clone();
    let caller = token.clone();
    let asked = value.clone();
    let answer = idempotent.answer(&headers, &value, |scope| async move {
        let request = run_request(&config, &name, asked, &caller)?;
        Ok(api
            .start(config, request, &caller, &scope, Duration::from_secs(wait))
            .await)
    });
    Ok(answer.await)
}

/// The run a `POST /v1/jobs/{job}/runs` body asks for, checked as the
/// command line checks its flags.
fn run_request(
    config: &Config,
    name: &str,
    body: serde_json::Value,
    caller: &crate::config::Token,
) -> Result<Request, Reply> {
    let asked: RunBody = serde_path_to_error::deserialize(body).map_err(|e| {
        let message = e.inner().to_string();
        // The path names the field of a bad value; an unknown or missing
        // field is named in the message itself.
        let field = match e.path().to_string() {
            path if path != "." => path,
            _ => message.split('`').nth(1).unwrap_or("body").to_owned(),
        };
        Reply::bad(&field, format!("the body: `{field}`: {message}"))
    })?;
    let job = find_job(config, name)?;
    let periods = match (asked.period, asked.from, asked.to) {
        (Some(period), None, None) => Selection::Period(period),
        (None, Some(from), Some(to)) => Selection::Range(from, to),
        (Some(_), _, _) => {
            return Err(Reply::bad(
                "period",
                "give `period`, or `from` and `to`, not both",
            ));
        }
        (None, None, _) => {
            return Err(Reply::bad(
                "period",
                "`period` is missing: give {\"period\": LABEL} or {\"from\": LABEL, \"to\": LABEL}",
            ));
        }
        (None, Some(_), None) => return Err(Reply::bad("to", "`to` is missing")),
    };
    let request = Request {
        job: Some(job.name.clone()),
        periods,
        force: asked.force,
        only_failed: asked.only_failed,
        early: asked.early,
        wait: false,
        dry_run: false,
        with_upstream: asked.with_upstream,
        names: Names::JSON,
        by: caller.name.as_str().into(),
    };
    manual::check(config, &request, Utc::now())?;
    if let Selection::Range(from, to) = &request.periods {
        manual::periods_between(job, (from, to), RANGE_LIMIT, Names::JSON)?;
    }
    Ok(request)
}

async fn pause(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Answer {
    set_paused(api, headers, name, body, true).await
}

async fn resume(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Answer {
    set_paused(api, headers, name, body, false).await
}

async fn set_paused(
    api: Arc<Api>,
    headers: HeaderMap,
    name: String,
    body: Body,
    paused: bool,
) -> Answer {
    let (config, token) = authorize(&api, &headers, Need::Operate)?;
    let value = empty_body(&read_body(body).await?)?;
    let (route, verb) = if paused {
        ("POST /v1/jobs/{job}/pause", "pause")
    } else {
        ("POST /v1/jobs/{job}/resume", "resume")
    };
    let idempotent = Idempotent {
        api: &api,
        token: &token,
        route,
        path: format!("/v1/jobs/{name}/{verb}"),
        bound: BODY_TIMEOUT,
        run_id: None,
    };
    let by = token.name.clone();
    let engine = api.engine.clone();
    let answer = idempotent.answer(&headers, &value, |_| async move {
        let job = find_job(&config, &name)?;
        engine.pause(&job.name, paused).await?;
        tracing::info!(job = %job.name, by = %by, paused, "paused over the API");
        Ok(Reply::ok(
            StatusCode::OK,
            json!({ "job": job.name, "paused": paused }),
        ))
    });
    Ok(answer.await)
}

async fn release(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path((name, label)): Path<(String, String)>,
    body: Body,
) -> Answer {
    let (config, token) = authorize(&api, &headers, Need::Operate)?;
    let value = empty_body(&read_body(body).await?)?;
    let idempotent = Idempotent {
        api: &api,
        token: &token,
        route: "POST /v1/jobs/{job}/periods/{label}/release",
        path: format!("/v1/jobs/{name}/periods/{label}/release"),
        bound: BODY_TIMEOUT,
        run_id: None,
    };
    let store = api.store().clone();
    let by = token.name.clone();
    let answer = idempotent.answer(&headers, &value, |_| async move {
        let job = find_job(&config, &name)?;
        let period = manual::periods_between(job, (&label, &label), 1, Names::PATH)?.remove(0);
        Ok(match operate::release(&store, job, &period).await? {
            (key, Some(Released { owner, lease_until })) => {
                tracing::info!(period_key = %key, by = %by, "released over the API");
                Reply::ok(
                    StatusCode::OK,
                    json!({
                        "key": key,
                        "released": true,
                        "owner": owner,
                        "claimable_by": lease_until.map(utc_text),
                    }),
                )
            }
            // As `scheduler release` exits 2: the period named is not
            // running, which the caller must be told.
            (key, None) => Reply::ok(
                StatusCode::CONFLICT,
                json!({
                    "error": format!("{key} has no running claim to release"),
                    "key": key,
                    "released": false,
                }),
            ),
        })
    });
    Ok(answer.await)
}
