//! The HTTP API under `/v1/`: bearer tokens from `[api]` (`auth`) or the
//! console's session cookie (`session`), the reads and the answers they
//! share (`read`), the Idempotency-Key contract on every `POST`
//! (`idempotent`), and manual runs through the engine's one driver
//! ([`crate::engine::manual`]) on this replica, under its heartbeats and
//! its shutdown (`runs`). This file holds the routes and the writes.

mod auth;
mod cookie;
mod idempotent;
mod output;
mod read;
mod reply;
mod run_view;
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
use crate::engine::{Engine, operate};
use crate::error::Error;
use crate::period::utc_text;
use crate::store::{Released, Store};
use auth::{Need, authorize};
use idempotent::Idempotent;
pub use reply::no_route;
use reply::{Answer, Reply, body_of, empty_body, json_errors, read_body};
use run_view::run_body;

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
    /// Reads answered at once: each may hold thousands of periods in
    /// memory and a connection, so readers queue rather than crowd out the
    /// scheduler's own statements.
    readers: tokio::sync::Semaphore,
    /// One read at a time of each token, in front of `readers`.
    turns: Mutex<HashMap<String, Arc<tokio::sync::Semaphore>>>,
    /// The console's failed logins, which slow the next ones down.
    logins: Mutex<session::Failures>,
}

impl Api {
    /// The turns of the token `who`'s reads: one at a time (tokens are
    /// those of `[api]`, so the map stays small).
    fn turns_of(&self, who: &str) -> Arc<tokio::sync::Semaphore> {
        let Ok(mut turns) = self.turns.lock() else {
            return Arc::new(tokio::sync::Semaphore::new(1));
        };
        turns
            .entry(who.to_owned())
            .or_insert_with(|| Arc::new(tokio::sync::Semaphore::new(1)))
            .clone()
    }

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
            readers: tokio::sync::Semaphore::new(read::READERS),
            turns: Mutex::default(),
            logins: Mutex::default(),
        })
    }

    /// A reload: requests from now on see `config`.
    pub fn set_config(&self, config: Arc<Config>) {
        if let Ok(mut current) = self.config.write() {
            *current = config;
        }
        // A shared answer may name a job the new configuration dropped.
        if let Ok(mut shared) = self.shared.lock() {
            shared.clear();
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

    /// Now, by the engine's clock.
    fn now(&self) -> chrono::DateTime<Utc> {
        self.engine.now()
    }

    /// Deletes Idempotency-Keys and runs past `key_ttl`, with `[api]` on,
    /// and shared answers past the oldest any read may ask for.
    pub async fn prune(&self) -> Result<u64, Error> {
        if let Ok(mut shared) = self.shared.lock() {
            shared.retain(|_, (at, _)| at.elapsed() < Duration::from_secs(read::MAX_AGE));
            if shared.is_empty() {
                *shared = HashMap::new();
            }
        }
        if self.config().api.is_none() {
            return Ok(0);
        }
        self.store().prune_api(false).await
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

/// The API follows the loop it serves beside: its reloads, its shutdown.
impl crate::driver::Companion for Api {
    fn reconfigure(&self, config: &Config) {
        self.set_config(view(config));
    }

    fn finish_runs(&self) -> crate::handler::BoxFuture<'_, ()> {
        Box::pin(self.finish())
    }
}

/// The configuration the HTTP API answers from: all of it with `[api]`;
/// without, no jobs (`/v1/` answers 404 and needs none of them).
pub fn view(config: &Config) -> Arc<Config> {
    if config.api.is_some() {
        return Arc::new(config.clone());
    }
    Arc::new(Config {
        path: config.path.clone(),
        settings: config.settings.clone(),
        api: None,
        jobs: Vec::new(),
        secrets: config.secrets.clone(),
        incomplete: Vec::new(),
        notifiers: Vec::new(),
        incomplete_notifiers: Vec::new(),
    })
}

/// The `/v1/` routes.
pub fn routes(api: Arc<Api>) -> Router {
    Router::new()
        .route("/v1/jobs", get(read::jobs))
        .route("/v1/jobs/{job}/periods", get(read::periods))
        .route("/v1/jobs/{job}/periods/{label}", get(read::period))
        .route("/v1/jobs/{job}/runs", post(start_run))
        .route("/v1/runs", get(read::runs))
        .route("/v1/runs/{id}", get(get_run))
        .route("/v1/jobs/{job}/pause", post(pause))
        .route("/v1/jobs/{job}/resume", post(resume))
        .route("/v1/jobs/{job}/periods/{label}/release", post(release))
        .route(
            "/v1/jobs/{job}/periods/{label}/attempts/{attempt}/output",
            get(output::output),
        )
        .route("/v1/jobs/{job}/adopt", post(adopt))
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
        .layer(axum::middleware::map_response(no_store))
        .with_state(api)
}

/// Every answer of the API is the caller's own (a job's output, its
/// errors): no browser or proxy keeps a copy.
async fn no_store(mut response: axum::response::Response) -> axum::response::Response {
    response
        .headers_mut()
        .entry(axum::http::header::CACHE_CONTROL)
        .or_insert(axum::http::HeaderValue::from_static("no-store"));
    response
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
    shard: Option<u32>,
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
        let request = run_request(&config, &name, asked, &caller, api.now())?;
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
    now: chrono::DateTime<Utc>,
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
        job: Some(job.name.to_string()),
        periods,
        force: asked.force,
        only_failed: asked.only_failed,
        early: asked.early,
        wait: false,
        dry_run: false,
        with_upstream: asked.with_upstream,
        shard: asked.shard,
        names: Names::JSON,
        by: caller.name.as_str().into(),
    };
    manual::check(config, &request, now)?;
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

/// The body of `POST /v1/jobs/{job}/adopt`: `{"through": L}` or
/// `{"from": A, "to": B}`, as `scheduler adopt` takes them.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AdoptBody {
    through: Option<String>,
    from: Option<String>,
    to: Option<String>,
}

async fn adopt(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Answer {
    let (config, token) = authorize(&api, &headers, Need::Operate)?;
    let value = body_of(&read_body(body).await?)?;
    let asked: AdoptBody = serde_json::from_value(value.clone())
        .map_err(|e| Reply::bad("body", format!("the body: {e}")))?;
    let idempotent = Idempotent {
        api: &api,
        token: &token,
        route: "POST /v1/jobs/{job}/adopt",
        path: format!("/v1/jobs/{name}/adopt"),
        bound: BODY_TIMEOUT,
        run_id: None,
    };
    let store = api.store().clone();
    let now = api.now();
    let by = token.name.clone();
    let answer = idempotent.answer(&headers, &value, |_| async move {
        let job = find_job(&config, &name)?;
        let which = match (&asked.through, &asked.from, &asked.to) {
            (Some(through), None, None) => operate::Adoption::Through(through),
            (None, Some(from), Some(to)) => operate::Adoption::Range(from, to),
            _ => {
                return Err(Reply::bad(
                    "through",
                    "give `through`, or `from` and `to` (labels of the job's periods)",
                ));
            }
        };
        let names = operate::AdoptNames::JSON;
        Ok(match operate::adopt(&store, job, which, &by, now, names).await? {
            operate::Adopted::Recorded(keys) => {
                tracing::info!(job = %job.name, by = %by, periods = keys.len(), "adopted over the API");
                Reply::ok(StatusCode::OK, json!({ "job": job.name, "adopted": keys }))
            }
            // As `scheduler adopt` exits 2: nothing was written.
            operate::Adopted::Claimed(rows) => Reply::ok(
                StatusCode::CONFLICT,
                json!({
                    "error": "nothing adopted: a period that has a claim here ran here (or was adopted already) and is never adopted",
                    "claimed": rows
                        .iter()
                        .map(|r| json!({ "period_key": r.period_key, "state": r.standing(), "attempt": r.attempt }))
                        .collect::<Vec<_>>(),
                }),
            ),
        })
    });
    Ok(answer.await)
}

/// `?shard=K` of a route that may name one shard of a period.
#[derive(Deserialize)]
struct OneShard {
    shard: Option<String>,
}

impl OneShard {
    /// The shard named, if one is: a whole number from 0.
    fn shard(&self) -> Result<Option<u32>, Reply> {
        self.shard
            .as_deref()
            .map(|k| {
                k.parse::<u32>()
                    .map_err(|_| Reply::bad("shard", "?shard= takes a whole number from 0"))
            })
            .transpose()
    }
}

async fn release(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path((name, label)): Path<(String, String)>,
    Query(one): Query<OneShard>,
    body: Body,
) -> Answer {
    let (config, token) = authorize(&api, &headers, Need::Operate)?;
    let value = empty_body(&read_body(body).await?)?;
    let shard = one.shard()?;
    let asked = shard.map(|k| format!("?shard={k}")).unwrap_or_default();
    let idempotent = Idempotent {
        api: &api,
        token: &token,
        route: "POST /v1/jobs/{job}/periods/{label}/release",
        path: format!("/v1/jobs/{name}/periods/{label}/release{asked}"),
        bound: BODY_TIMEOUT,
        run_id: None,
    };
    let store = api.store().clone();
    let by = token.name.clone();
    let answer = idempotent.answer(&headers, &value, |_| async move {
        let job = find_job(&config, &name)?;
        let period = manual::periods_between(job, (&label, &label), 1, Names::PATH)?.remove(0);
        Ok(
            match operate::release(&store, job, &period, (shard, "shard")).await? {
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
            },
        )
    });
    Ok(answer.await)
}
