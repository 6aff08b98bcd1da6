//! The HTTP API under `/v1/`: bearer tokens from `[api]`, the
//! Idempotency-Key contract on every `POST`, and manual runs through the
//! engine's one manual path ([`crate::engine::manual`]) on this replica,
//! under its heartbeats and its shutdown.

use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use chrono::Utc;
use serde::Deserialize;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tokio::sync::watch;
use tokio::task::JoinSet;

use crate::config::{Config, Job, Token};
use crate::engine::manual::{self, Line, Names, Request, Selection, Sink};
use crate::engine::view::{self, PeriodView};
use crate::engine::{Engine, operate};
use crate::error::{Error, Stop};
use crate::period::{PeriodKey, utc_text};
use crate::state::PeriodOutcome;
use crate::store::{ApiRun, KeyClaim, Released, Store};

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
    /// Tells this replica's serve loop of a pause or resume at once.
    events: tokio::sync::mpsc::UnboundedSender<super::Event>,
}

impl Api {
    /// The API of a replica that runs on `engine`.
    pub(super) fn new(
        config: Arc<Config>,
        engine: Engine,
        shutdown: watch::Receiver<bool>,
        events: tokio::sync::mpsc::UnboundedSender<super::Event>,
    ) -> Arc<Api> {
        Arc::new(Api {
            config: RwLock::new(config),
            engine,
            shutdown,
            runs: tokio::sync::Mutex::new(JoinSet::new()),
            events,
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

    /// Deletes Idempotency-Keys and runs past `key_ttl`, with `[api]` on.
    pub async fn prune(&self) -> Result<u64, Error> {
        if self.config().api.is_none() {
            return Ok(0);
        }
        self.store().prune_api(false).await
    }

    /// Waits for the runs this replica started (at shutdown, they stop
    /// claiming and their running periods get the grace).
    pub async fn finish(&self) {
        let mut runs = self.runs.lock().await;
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
        .route("/v1/runs/{id}", get(run))
        .route("/v1/jobs/{job}/pause", post(pause))
        .route("/v1/jobs/{job}/resume", post(resume))
        .route("/v1/jobs/{job}/periods/{label}/release", post(release))
        .method_not_allowed_fallback(|| async {
            Reply::error(
                StatusCode::METHOD_NOT_ALLOWED,
                "this route takes another method: GET reads, POST triggers and operates",
            )
        })
        .layer(axum::middleware::map_response(json_errors))
        .with_state(api)
}

/// Every error under `/v1/` is JSON: what axum's extractors refuse (a
/// query given twice, a path that is not UTF-8) comes as text, and is
/// wrapped.
async fn json_errors(response: Response) -> Response {
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|t| t.as_bytes().starts_with(b"application/json"));
    if is_json || !(response.status().is_client_error() || response.status().is_server_error()) {
        return response;
    }
    let status = response.status();
    let text = axum::body::to_bytes(response.into_body(), BODY_LIMIT)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_owned())
        .unwrap_or_default();
    let message = if text.is_empty() {
        status.canonical_reason().unwrap_or("error").to_owned()
    } else {
        text
    };
    Reply::error(status, message).into_response()
}

/// The answer for a path under `/v1/` that names no route.
pub fn no_route() -> Response {
    Reply::error(
        StatusCode::NOT_FOUND,
        "no such route under /v1/: see docs/http-api.md for the routes",
    )
    .into_response()
}

/// An answer: a status, a JSON body and headers.
struct Reply {
    status: StatusCode,
    body: Value,
    headers: Vec<(HeaderName, String)>,
}

impl Reply {
    fn ok(status: StatusCode, body: Value) -> Reply {
        Reply {
            status,
            body,
            headers: Vec::new(),
        }
    }

    fn error(status: StatusCode, message: impl Into<String>) -> Reply {
        Reply::ok(status, json!({ "error": message.into() }))
    }

    /// 400 naming the bad field.
    fn bad(field: &str, message: impl Into<String>) -> Reply {
        Reply::ok(
            StatusCode::BAD_REQUEST,
            json!({ "error": message.into(), "field": field }),
        )
    }

    fn with(mut self, name: HeaderName, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }

    fn location(&self) -> Option<&str> {
        self.headers
            .iter()
            .find(|(name, _)| name == header::LOCATION)
            .map(|(_, value)| value.as_str())
    }

    /// The answer for an error of the engine or the store: the database's
    /// is a server-side failure (503), a usage error the client's (400).
    fn of(e: &Error) -> Reply {
        match e {
            Error::Usage(message) => {
                let field = message.split_once(':').map_or("", |(f, _)| f);
                Reply::bad(field, message.clone())
            }
            Error::Config(e) => Reply::error(StatusCode::BAD_REQUEST, e.to_string()),
            Error::Database(message) => {
                tracing::warn!(error = %message, "API request failed on the database");
                Reply::error(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the database did not answer; retry later",
                )
                .with(header::RETRY_AFTER, "5")
            }
            Error::Environment(e) => {
                tracing::warn!(error = %e, "API request failed");
                Reply::error(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
            }
        }
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            format!("{}\n", self.body),
        )
            .into_response();
        for (name, value) in self.headers {
            if let Ok(value) = HeaderValue::from_str(&value) {
                response.headers_mut().append(name, value);
            }
        }
        response
    }
}

/// What a token must be allowed.
#[derive(Clone, Copy)]
enum Need {
    Read,
    Trigger,
    Operate,
}

impl Need {
    fn word(self) -> &'static str {
        match self {
            Need::Read => "read",
            Need::Trigger => "trigger",
            Need::Operate => "operate",
        }
    }
}

/// The configuration and the caller's token, or the answer that refuses
/// the request: 404 without `[api]`, 401 without a known token, 403 for a
/// token without `need`.
fn authorize(api: &Api, headers: &HeaderMap, need: Need) -> Result<(Arc<Config>, Token), Reply> {
    let config = api.config();
    let Some(settings) = &config.api else {
        return Err(Reply::error(
            StatusCode::NOT_FOUND,
            "the API is off: jobs.toml has no [api] section",
        ));
    };
    let given = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, secret)| secret.trim());
    let unauthorized = |message: &str| {
        Reply::error(StatusCode::UNAUTHORIZED, message).with(header::WWW_AUTHENTICATE, "Bearer")
    };
    let Some(given) = given else {
        return Err(unauthorized(
            "missing bearer token: send `Authorization: Bearer <secret>`",
        ));
    };
    // Every secret is compared, each in constant time.
    let mut found = None;
    for token in &settings.tokens {
        if token.secret.matches(given) {
            found = Some(token.clone());
        }
    }
    let Some(token) = found else {
        return Err(unauthorized("unknown bearer token"));
    };
    let allowed = match need {
        Need::Read => token.allow.read,
        Need::Trigger => token.allow.trigger,
        Need::Operate => token.allow.operate,
    };
    if !allowed {
        return Err(Reply::ok(
            StatusCode::FORBIDDEN,
            json!({
                "error": format!("token `{}` may not {}", token.name, need.word()),
                "needs": need.word(),
            }),
        ));
    }
    Ok((config, token))
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

async fn jobs(State(api): State<Arc<Api>>, headers: HeaderMap) -> Reply {
    let (config, _) = match authorize(&api, &headers, Need::Read) {
        Ok(ok) => ok,
        Err(reply) => return reply,
    };
    let result = async {
        let paused = api.store().paused_jobs().await?;
        let now = Utc::now();
        let mut jobs = Vec::with_capacity(config.jobs.len());
        for job in &config.jobs {
            let recent = api.store().recent(&job.name, 1).await?;
            let last = crate::store::ClaimRow::finished_last(&recent);
            let next = job.schedule.next_after(now);
            let next_key = next.map(|fire| {
                PeriodKey::new(&job.name, &job.period.period_of(&job.schedule, fire).label)
                    .to_string()
            });
            jobs.push(json!({
                "job": job.name,
                "schedule": job.schedule.source(),
                "timezone": job.schedule.zone().name(),
                "period": job.period.unit.to_string(),
                "next_fire": next.map(utc_text),
                "next_key": next_key,
                "paused": paused.contains(&job.name),
                "last": last,
            }));
        }
        Ok::<_, Error>(json!({ "jobs": jobs }))
    };
    match result.await {
        Ok(body) => Reply::ok(StatusCode::OK, body),
        Err(e) => Reply::of(&e),
    }
}

#[derive(Deserialize)]
struct Range {
    from: Option<String>,
    to: Option<String>,
}

async fn periods(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    Query(range): Query<Range>,
) -> Reply {
    let (config, _) = match authorize(&api, &headers, Need::Read) {
        Ok(ok) => ok,
        Err(reply) => return reply,
    };
    let job = match find_job(&config, &name) {
        Ok(job) => job,
        Err(reply) => return reply,
    };
    let (Some(from), Some(to)) = (&range.from, &range.to) else {
        let field = if range.from.is_none() { "from" } else { "to" };
        return Reply::bad(
            field,
            format!("`{field}` is missing: ask for ?from=LABEL&to=LABEL"),
        );
    };
    let listed = match manual::periods_between(job, (from, to), RANGE_LIMIT, Names::JSON) {
        Ok(listed) => listed,
        Err(e) => return Reply::of(&e),
    };
    let mut out = Vec::with_capacity(listed.len());
    for chunk in listed.chunks(view::VIEWS_PER_READ) {
        let views = match view::periods(api.store(), job, chunk, Utc::now()).await {
            Ok(views) => views,
            Err(e) => return Reply::of(&e),
        };
        for PeriodView {
            key,
            period,
            state,
            fire,
            row,
        } in views
        {
            let row = row.as_ref();
            out.push(json!({
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
            }));
        }
    }
    Reply::ok(
        StatusCode::OK,
        json!({ "job": job.name, "from": from, "to": to, "periods": out }),
    )
}

async fn period(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path((name, label)): Path<(String, String)>,
) -> Reply {
    let (config, _) = match authorize(&api, &headers, Need::Read) {
        Ok(ok) => ok,
        Err(reply) => return reply,
    };
    let job = match find_job(&config, &name) {
        Ok(job) => job,
        Err(reply) => return reply,
    };
    let period = match manual::periods_between(job, (&label, &label), 1, Names::PATH) {
        Ok(mut periods) => periods.remove(0),
        Err(e) => return Reply::of(&e),
    };
    let result = async {
        let mut views =
            view::periods(api.store(), job, std::slice::from_ref(&period), Utc::now()).await?;
        let view = views
            .pop()
            .ok_or_else(|| Error::Usage(format!("{label}: no such period")))?;
        let attempts = api.store().attempts(view.key.as_str(), 1_000).await?;
        Ok::<_, Error>((view, attempts))
    };
    match result.await {
        Ok((
            PeriodView {
                key,
                state,
                fire,
                row,
                ..
            },
            attempts,
        )) => Reply::ok(
            StatusCode::OK,
            json!({
                "job": job.name,
                "period": period.label,
                "period_key": key,
                "state": state,
                "fire": fire.map(utc_text),
                "claim": row,
                "attempts": attempts,
            }),
        ),
        Err(e) => Reply::of(&e),
    }
}

async fn run(State(api): State<Arc<Api>>, headers: HeaderMap, Path(id): Path<String>) -> Reply {
    if let Err(reply) = authorize(&api, &headers, Need::Read) {
        return reply;
    }
    match api.store().api_run(&id).await {
        Ok(Some(run)) => Reply::ok(StatusCode::OK, run_body(&run)),
        Ok(None) => Reply::error(StatusCode::NOT_FOUND, format!("no run `{id}`")),
        Err(e) => Reply::of(&e),
    }
}

/// A stored run as the API shows it: `abandoned` when its replica stopped
/// keeping it alive (its periods are recovered like any others).
fn run_body(run: &ApiRun) -> Value {
    let state = match (run.state.as_str(), run.alive) {
        ("running", 0) => "abandoned",
        (state, _) => state,
    };
    let mut body: Value = serde_json::from_str(&run.body).unwrap_or_else(|_| json!({}));
    if state == "abandoned" {
        // What its replica last wrote: a period it was running is now the
        // scan's to recover (`GET /v1/jobs/{job}/periods/{label}` says how).
        if let Some(periods) = body["periods"].as_array_mut() {
            for period in periods.iter_mut().filter(|p| p["status"] == "running") {
                period["status"] = json!("abandoned");
            }
        }
        body["outcome"] = json!("abandoned");
        body["error"] = json!(
            "its replica stopped: a period listed as abandoned is recovered by the scan like any expired claim; a period of the request not listed was never claimed: POST those periods again with a new Idempotency-Key"
        );
    }
    body["id"] = json!(run.id);
    body["job"] = json!(run.job);
    body["requested_by"] = json!(run.requested_by);
    body["owner"] = json!(run.owner);
    body["state"] = json!(state);
    body
}

/// A `POST` body: any JSON object; an empty body is `{}`.
fn body_of(bytes: &[u8]) -> Result<Value, Reply> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(json!({}));
    }
    // A key given twice would be read as its last value: which one the
    // client meant is not known, so neither is taken.
    if let Err(e) = serde_json::from_slice::<unique::Unique>(bytes)
        && let Some(key) = e.to_string().strip_prefix(unique::DUPLICATE)
    {
        let key = key.split('`').next().unwrap_or_default().to_owned();
        return Err(Reply::bad(
            &key,
            format!("the body gives `{key}` twice: give each field once"),
        ));
    }
    match serde_json::from_slice::<Value>(bytes) {
        Ok(value @ Value::Object(_)) => Ok(value),
        Ok(_) => Err(Reply::bad("body", "the body must be a JSON object")),
        Err(e) => Err(Reply::bad("body", format!("the body is not JSON: {e}"))),
    }
}

/// The body of a route that takes none: empty, or `{}`.
fn empty_body(bytes: &[u8]) -> Result<Value, Reply> {
    let value = body_of(bytes)?;
    match value.as_object().and_then(|o| o.keys().next()) {
        Some(field) => Err(Reply::bad(
            field,
            format!("this route takes no body fields; `{field}` is not one"),
        )),
        None => Ok(value),
    }
}

/// Reads a body of at most [`BODY_LIMIT`] bytes within [`BODY_TIMEOUT`].
async fn read_body(body: Body) -> Result<Bytes, Reply> {
    match tokio::time::timeout(BODY_TIMEOUT, axum::body::to_bytes(body, BODY_LIMIT)).await {
        Ok(Ok(bytes)) => Ok(bytes),
        Ok(Err(_)) => Err(Reply::error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("the body is over {} KiB", BODY_LIMIT / 1024),
        )),
        Err(_) => Err(Reply::error(
            StatusCode::REQUEST_TIMEOUT,
            format!("the body took over {}s", BODY_TIMEOUT.as_secs()),
        )),
    }
}

fn hex_sha256(parts: &[&[u8]]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        // Each part's length first, so no two splits hash alike.
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part);
    }
    hex::encode(hash.finalize())
}

/// One `POST` under the Idempotency-Key contract: the key is claimed for
/// (token, route template) with the request's hash; a new one executes
/// `execute` and stores its answer (a 5xx frees the key instead), a known
/// one is answered from what is stored.
struct Idempotent<'a> {
    api: &'a Api,
    token: &'a Token,
    /// The route template, e.g. `POST /v1/jobs/{job}/runs`.
    route: &'static str,
    /// The concrete path, without the query string.
    path: String,
    /// How long the request may take to answer.
    bound: Duration,
    /// The id of the run the request starts, if it starts one: made before
    /// the key is claimed, so that a retry answered 409 while it is being
    /// set up already gets its `Location`.
    run_id: Option<String>,
}

impl Idempotent<'_> {
    async fn answer<F, Fut>(self, headers: &HeaderMap, body: &Value, execute: F) -> Reply
    where
        F: FnOnce(Scope) -> Fut,
        Fut: std::future::Future<Output = Reply>,
    {
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .unwrap_or_default();
        if key.is_empty() || key.len() > 255 {
            return Reply::bad(
                "Idempotency-Key",
                "every POST under /v1/ needs an Idempotency-Key header of 1 to 255 characters, one value per operation (a UUID, say); a retry sends the same value",
            );
        }
        let Some(settings) = self.api.config().api.clone() else {
            return Reply::error(StatusCode::NOT_FOUND, "the API is off");
        };
        // serde_json's maps are sorted: the text is canonical.
        let canonical = body.to_string();
        let scope = hex_sha256(&[
            self.token.name.as_bytes(),
            self.route.as_bytes(),
            key.as_bytes(),
        ]);
        let request = hex_sha256(&[b"POST", self.path.as_bytes(), canonical.as_bytes()]);
        let store = self.api.store();
        let bound = self.bound + KEY_SLACK;
        let known = match store
            .claim_key(
                &scope,
                &request,
                bound,
                settings.key_ttl,
                self.run_id
                    .as_ref()
                    .map(|id| format!("/v1/runs/{id}"))
                    .as_deref(),
            )
            .await
        {
            Ok(KeyClaim::New) => None,
            Ok(KeyClaim::Known(known)) => Some(known),
            Err(e) => return Reply::of(&e),
        };
        if let Some(known) = known {
            if known.request != request {
                return Reply::ok(
                    StatusCode::UNPROCESSABLE_ENTITY,
                    json!({
                        "error": "this Idempotency-Key was used for another request (another body or path) on this route; use a new key for a new operation",
                        "field": "Idempotency-Key",
                    }),
                );
            }
            let in_flight = known.run_going == 1 || (known.state == "running" && known.stale == 0);
            if in_flight {
                let mut reply = Reply::error(
                    StatusCode::CONFLICT,
                    "a request with this Idempotency-Key is still being answered or its run is still going; retry later",
                )
                .with(header::RETRY_AFTER, "1");
                if let Some(location) = known.location {
                    reply = reply.with(header::LOCATION, location);
                }
                return reply;
            }
            // The request started a run that has ended since, or whose
            // replica went away: the replay is that run, never a second one
            // — 200 with its outcome (`abandoned` for a replica that went
            // away; its periods are recovered like any others).
            if let Some(id) = &known.run_id {
                match store.api_run(id).await {
                    Ok(Some(run)) => {
                        return Reply::ok(StatusCode::OK, run_body(&run))
                            .with(header::LOCATION, format!("/v1/runs/{id}"))
                            .with(HeaderName::from_static("idempotent-replayed"), "true");
                    }
                    Ok(None) if known.state == "running" => {
                        return Reply::error(
                            StatusCode::GONE,
                            "the run of this Idempotency-Key was pruned",
                        );
                    }
                    Ok(None) => {}
                    Err(e) => return Reply::of(&e),
                }
            }
            let status = known
                .status
                .and_then(|s| u16::try_from(s).ok())
                .and_then(|s| StatusCode::from_u16(s).ok())
                .unwrap_or(StatusCode::OK);
            let body = known
                .body
                .as_deref()
                .and_then(|b| serde_json::from_str(b).ok())
                .unwrap_or_else(|| json!({}));
            let mut reply = Reply::ok(status, body)
                .with(HeaderName::from_static("idempotent-replayed"), "true");
            if let Some(location) = known.location {
                reply = reply.with(header::LOCATION, location);
            }
            return reply;
        }
        let reply = execute(Scope {
            store: store.clone(),
            scope: scope.clone(),
            run_id: self.run_id.clone().unwrap_or_default(),
        })
        .await;
        // A server-side failure, or a run that found no free slot, ran
        // nothing: the key is freed so that a retry executes.
        let stored =
            if reply.status.is_server_error() || reply.status == StatusCode::TOO_MANY_REQUESTS {
                store.forget_key(&scope).await
            } else {
                let location = reply.location().map(str::to_owned);
                let run_id = location
                    .as_deref()
                    .and_then(|l| l.strip_prefix("/v1/runs/"))
                    .map(str::to_owned);
                store
                    .answer_key(
                        &scope,
                        reply.status.as_u16(),
                        &reply.body.to_string(),
                        location.as_deref(),
                        run_id.as_deref(),
                    )
                    .await
            };
        if let Err(e) = stored {
            // The key stays in progress until its bound: a retry meanwhile
            // gets 409, never a second execution.
            tracing::warn!(error = %e, "cannot store the answer of an Idempotency-Key");
        }
        reply
    }
}

/// The Idempotency-Key a request executes under: a run it starts is noted
/// on it at once, so a retry meanwhile gets the run's `Location`.
struct Scope {
    store: Store,
    scope: String,
    /// The id a run it starts takes.
    run_id: String,
}

impl Scope {
    async fn note_run(&self, id: &str) -> Result<(), Error> {
        self.store
            .note_key_run(&self.scope, id, &format!("/v1/runs/{id}"))
            .await
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
) -> Reply {
    let (config, token) = match authorize(&api, &headers, Need::Trigger) {
        Ok(ok) => ok,
        Err(reply) => return reply,
    };
    if *api.shutdown.borrow() {
        // Another replica takes it: nothing is stored under the key.
        return Reply::error(
            StatusCode::SERVICE_UNAVAILABLE,
            "this replica is shutting down; retry (another replica answers)",
        )
        .with(header::RETRY_AFTER, "1");
    }
    let wait = match wait.wait.as_deref().map(str::parse::<u64>) {
        None => 0,
        Some(Ok(secs)) if secs <= MAX_WAIT => secs,
        Some(_) => {
            return Reply::bad(
                "wait",
                format!("?wait= takes whole seconds from 0 to {MAX_WAIT}"),
            );
        }
    };
    let bytes = match read_body(body).await {
        Ok(bytes) => bytes,
        Err(reply) => return reply,
    };
    let value = match body_of(&bytes) {
        Ok(value) => value,
        Err(reply) => return reply,
    };
    let mut id = [0u8; 16];
    if getrandom::fill(&mut id).is_err() {
        return Reply::error(StatusCode::INTERNAL_SERVER_ERROR, "no random numbers");
    }
    let id = hex::encode(id);
    let idempotent = Idempotent {
        api: &api,
        token: &token,
        route: "POST /v1/jobs/{job}/runs",
        path: format!("/v1/jobs/{name}/runs"),
        bound: Duration::from_secs(wait) + BODY_TIMEOUT,
        run_id: Some(id),
    };
    let api = api.clone();
    let caller = token.clone();
    idempotent
        .answer(&headers, &value.clone(), |scope| async move {
            let asked: RunBody = match serde_path_to_error::deserialize(value) {
                Ok(asked) => asked,
                Err(e) => {
                    let message = e.inner().to_string();
                    // The path names the field of a bad value; an unknown
                    // or missing field is named in the message itself.
                    let field = match e.path().to_string() {
                        path if path != "." => path,
                        _ => message.split('`').nth(1).unwrap_or("body").to_owned(),
                    };
                    return Reply::bad(&field, format!("the body: `{field}`: {message}"));
                }
            };
            let job = match find_job(&config, &name) {
                Ok(job) => job.name.clone(),
                Err(reply) => return reply,
            };
            let periods = match (asked.period, asked.from, asked.to) {
                (Some(period), None, None) => Selection::Period(period),
                (None, Some(from), Some(to)) => Selection::Range(from, to),
                (Some(_), _, _) => {
                    return Reply::bad("period", "give `period`, or `from` and `to`, not both");
                }
                (None, None, _) => {
                    return Reply::bad(
                        "period",
                        "`period` is missing: give {\"period\": LABEL} or {\"from\": LABEL, \"to\": LABEL}",
                    );
                }
                (None, Some(_), None) => return Reply::bad("to", "`to` is missing"),
            };
            let request = Request {
                job: Some(job.clone()),
                periods,
                force: asked.force,
                early: asked.early,
                wait: false,
                dry_run: false,
                names: Names::JSON,
                by: caller.name.as_str().into(),
            };
            if let Err(e) = manual::check(&config, &request, Utc::now()) {
                return Reply::of(&e);
            }
            if let Selection::Range(from, to) = &request.periods
                && let Ok(found) = config.job(&job)
                && let Err(e) = manual::periods_between(found, (from, to), RANGE_LIMIT, Names::JSON)
            {
                return Reply::of(&e);
            }
            api.start(config, request, &caller, &scope, Duration::from_secs(wait))
                .await
        })
        .await
}

/// What a run did so far, shared by the run and the writer that stores it.
#[derive(Default)]
struct Progress {
    /// Claimed, not ended yet: key and attempt.
    claimed: Vec<(String, i32)>,
    /// Ended.
    lines: Vec<Line>,
    /// Why the run itself ended early, if it did.
    error: Option<String>,
    /// This replica's shutdown ended it before its last period: periods
    /// were left unclaimed, or a running one was stopped and released.
    interrupted: bool,
    /// It ended on an error of the server's side (the database), not of
    /// the request.
    server_failure: bool,
    done: bool,
}

impl Progress {
    fn body(&self) -> Value {
        let mut periods: Vec<Value> = self.lines.iter().map(|l| json!(l)).collect();
        for (key, attempt) in &self.claimed {
            periods.push(json!({ "key": key, "status": "running", "attempt": attempt }));
        }
        let mut body = json!({ "periods": periods, "outcome": self.outcome() });
        if let Some(error) = &self.error {
            body["error"] = json!(error);
        }
        body
    }

    /// Once done: `interrupted` by this replica's shutdown; `failed` for a
    /// failure, a period that found no concurrency slot, one released or
    /// stopped; `held` when a period is being run elsewhere (how it ends is
    /// not known here: never called a success); else `succeeded` (every
    /// period succeeded, here or before).
    fn outcome(&self) -> Option<&'static str> {
        if !self.done {
            return None;
        }
        if self.interrupted {
            return Some("interrupted");
        }
        let fine = self.error.is_none()
            && self
                .lines
                .iter()
                .all(|l| matches!(l.status, PeriodOutcome::Succeeded | PeriodOutcome::Skipped));
        if self.all_busy() {
            return Some("busy");
        }
        Some(match (fine, self.lines.iter().any(|l| l.held)) {
            (false, _) => "failed",
            (true, true) => "held",
            (true, false) => "succeeded",
        })
    }

    /// The run ended on a server-side failure (the database) before it
    /// claimed anything: nothing ran, so its request may be sent again.
    fn failed_before_any_claim(&self) -> bool {
        self.server_failure && self.lines.is_empty() && self.claimed.is_empty()
    }

    /// Nothing ran here for want of a free concurrency slot: every period
    /// so far found none, or was skipped (done or running elsewhere).
    fn all_busy(&self) -> bool {
        self.claimed.is_empty()
            && self.lines.iter().any(|l| l.status == PeriodOutcome::Busy)
            && self
                .lines
                .iter()
                .all(|l| matches!(l.status, PeriodOutcome::Busy | PeriodOutcome::Skipped))
    }
}

/// The sink of an API run: it fills the shared [`Progress`].
struct Collect(Arc<Mutex<Progress>>, watch::Sender<u64>);

impl Sink for Collect {
    fn claimed(&mut self, key: &str, attempt: i32) {
        if let Ok(mut p) = self.0.lock() {
            p.claimed.push((key.to_owned(), attempt));
        }
        self.1.send_modify(|n| *n += 1);
    }

    fn line(&mut self, line: &Line) -> Result<(), Stop> {
        if let Ok(mut p) = self.0.lock() {
            p.claimed.retain(|(key, _)| *key != line.key);
            p.lines.push(line.clone());
        }
        self.1.send_modify(|n| *n += 1);
        Ok(())
    }

    fn cut_short(&mut self) {
        if let Ok(mut p) = self.0.lock() {
            p.interrupted = true;
        }
    }
}

impl Api {
    /// Starts `request` on this replica: records the run, runs it in a
    /// task of its own, and answers 202 with what it did first (or, with
    /// `wait`, 200 once it ended within that).
    async fn start(
        self: &Arc<Api>,
        config: Arc<Config>,
        request: Request,
        token: &Token,
        scope: &Scope,
        wait: Duration,
    ) -> Reply {
        let id = scope.run_id.clone();
        let Some(ttl) = config.api.as_ref().map(|a| a.key_ttl) else {
            return Reply::error(StatusCode::NOT_FOUND, "the API is off");
        };
        let job = request.job.clone().unwrap_or_default();
        let record = ApiRun {
            id: id.clone(),
            job: job.clone(),
            requested_by: token.name.clone(),
            owner: self.engine.owner().to_owned(),
            state: "running".into(),
            body: json!({ "periods": [] }).to_string(),
            alive: 1,
        };
        let store = self.store().clone();
        if let Err(e) = store.create_run(&record, RUN_TICK * 3, ttl).await {
            return Reply::of(&e);
        }
        if let Err(e) = scope.note_run(&id).await {
            return Reply::of(&e);
        }
        tracing::info!(run = %id, job = %job, by = %token.name, "run asked for over the API");
        let progress = Arc::new(Mutex::new(Progress::default()));
        let (changed, mut seen) = watch::channel(0u64);
        let api = self.clone();
        let shared = progress.clone();
        let run_id = id.clone();
        let mut runs = self.runs.lock().await;
        // Runs that ended are let go of here, not kept until shutdown.
        while runs.try_join_next().is_some() {}
        runs.spawn(async move {
            let mut sink = Collect(shared.clone(), changed);
            let ended = {
                let run =
                    manual::run(&config, &api.engine, &request, api.shutdown.clone(), &mut sink);
                tokio::pin!(run);
                loop {
                    tokio::select! {
                        ended = &mut run => break ended,
                        () = tokio::time::sleep(RUN_TICK) => {
                            let body = lock(&shared).body().to_string();
                            if let Err(e) = store.update_run(&run_id, &body, None, RUN_TICK * 3).await {
                                tracing::warn!(run = %run_id, error = %e, "cannot write a run's progress");
                            }
                        }
                    }
                }
            };
            let body = {
                let mut p = lock(&shared);
                if let Err(e) = ended {
                    p.server_failure = matches!(e, Error::Database(_) | Error::Environment(_));
                    p.error = Some(e.to_string());
                }
                // Shutdown cut it short, or stopped a period past the
                // grace (a `release` by an operator is no interruption); a
                // run that ended within the grace is answered as it ended.
                p.interrupted |= *api.shutdown.borrow()
                    && p.lines
                        .iter()
                        .any(|l| matches!(l.status, PeriodOutcome::Released | PeriodOutcome::Interrupted));
                if p.interrupted {
                    p.error.get_or_insert_with(|| {
                        "this replica shut down: the periods listed as released are recovered like any others, and the periods not listed were not run; POST again with a new Idempotency-Key".into()
                    });
                    tracing::warn!(run = %run_id, "a run asked for over the API was interrupted by shutdown");
                }
                p.done = true;
                let body = p.body().to_string();
                p.done = false;
                body
            };
            // The last word is written before anyone is told the run ended
            // (a replay reads it). A run that failed on the database before
            // it claimed anything, or found no concurrency slot for any
            // period, ran nothing: its key is freed, so the request sent
            // again executes.
            let forget = {
                let p = lock(&shared);
                p.failed_before_any_claim() || p.all_busy()
            };
            write_end(&store, &run_id, &body, ttl, forget, api.shutdown.clone()).await;
            lock(&shared).done = true;
            sink.1.send_modify(|n| *n += 1);
        });
        drop(runs);
        // Without `wait`, the answer comes once something happened (the
        // first claim or line) or after a second.
        let until = tokio::time::Instant::now() + wait.max(Duration::from_secs(1));
        // Shutdown ends the wait at once: the connection is closed soon
        // after, and a caller left without an answer would find its key
        // still going until the key's own wait ran out. It gets the run so
        // far, and where to follow it.
        let mut shutdown = self.shutdown.clone();
        loop {
            let (done, anything) = {
                let p = lock(&progress);
                // A period that found no slot ends the run at once: its
                // answer waits for that end, so it can say so.
                // Nor is a period skipped (done or running elsewhere): the
                // rest may all find no slot, and then nothing ran here.
                let started = !p.claimed.is_empty()
                    || p.lines
                        .iter()
                        .any(|l| !matches!(l.status, PeriodOutcome::Busy | PeriodOutcome::Skipped));
                (p.done, started)
            };
            if done || (wait.is_zero() && anything) {
                break;
            }
            let ended = tokio::select! {
                changed = tokio::time::timeout_at(until, seen.changed()) => changed.is_err(),
                _ = shutdown.wait_for(|down| *down) => true,
            };
            if ended {
                break;
            }
        }
        let (done, busy, mut body) = {
            let p = lock(&progress);
            (p.done, p.all_busy(), p.body())
        };
        if done && lock(&progress).failed_before_any_claim() {
            // Nothing ran and nothing is stored: a retry executes.
            return Reply::ok(StatusCode::SERVICE_UNAVAILABLE, body).with(header::RETRY_AFTER, "5");
        }
        if done && busy {
            // Nothing ran: the answer is not stored, so a retry runs it.
            body["error"] = json!(
                "not run: every concurrency slot of the job is taken by running periods; retry later with the same Idempotency-Key"
            );
            return Reply::ok(StatusCode::TOO_MANY_REQUESTS, body).with(header::RETRY_AFTER, "5");
        }
        body["id"] = json!(id);
        body["job"] = json!(job);
        body["requested_by"] = json!(token.name);
        body["owner"] = json!(self.engine.owner());
        body["state"] = json!(if done { "done" } else { "running" });
        // A run that ended before the answer is answered as ended.
        let status = if done {
            StatusCode::OK
        } else {
            StatusCode::ACCEPTED
        };
        Reply::ok(status, body).with(header::LOCATION, format!("/v1/runs/{id}"))
    }
}

/// Writes run `id`'s end, and with `forget` frees its Idempotency-Key;
/// tried until it lands, a database that is away being waited for with a
/// backoff up to half a minute, so a live replica records the end once the
/// database is back. At shutdown a few more tries are all it gets: the run
/// is then answered `abandoned`, as for a replica that went away.
async fn write_end(
    store: &Store,
    id: &str,
    body: &str,
    ttl: Duration,
    forget: bool,
    shutdown: watch::Receiver<bool>,
) {
    let mut delay = RUN_TICK;
    let mut left_at_shutdown = 5;
    loop {
        let written = match store.update_run(id, body, Some(ttl), RUN_TICK * 3).await {
            Ok(()) if forget => store.forget_run_key(id).await,
            other => other,
        };
        let Err(e) = written else { return };
        tracing::warn!(run = %id, error = %e, "cannot write a run's end yet");
        if *shutdown.borrow() {
            left_at_shutdown -= 1;
            if left_at_shutdown == 0 {
                tracing::error!(run = %id, "giving up writing a run's end at shutdown: it is answered `abandoned`");
                return;
            }
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_secs(30));
    }
}

fn lock(progress: &Mutex<Progress>) -> std::sync::MutexGuard<'_, Progress> {
    match progress.lock() {
        Ok(p) => p,
        Err(poisoned) => poisoned.into_inner(),
    }
}

async fn pause(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Reply {
    set_paused(api, headers, name, body, true).await
}

async fn resume(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path(name): Path<String>,
    body: Body,
) -> Reply {
    set_paused(api, headers, name, body, false).await
}

async fn set_paused(
    api: Arc<Api>,
    headers: HeaderMap,
    name: String,
    body: Body,
    paused: bool,
) -> Reply {
    let (config, token) = match authorize(&api, &headers, Need::Operate) {
        Ok(ok) => ok,
        Err(reply) => return reply,
    };
    let value = match read_body(body).await.and_then(|b| empty_body(&b)) {
        Ok(value) => value,
        Err(reply) => return reply,
    };
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
    let store = api.store().clone();
    let by = token.name.clone();
    let events = api.events.clone();
    idempotent
        .answer(&headers, &value, |_| async move {
            let job = match find_job(&config, &name) {
                Ok(job) => job,
                Err(reply) => return reply,
            };
            match operate::pause(&store, &job.name, paused).await {
                Ok(()) => {
                    let _ = events.send(super::Event::Paused(job.name.clone(), paused));
                    tracing::info!(job = %job.name, by = %by, paused, "paused over the API");
                    Reply::ok(StatusCode::OK, json!({ "job": job.name, "paused": paused }))
                }
                Err(e) => Reply::of(&e),
            }
        })
        .await
}

async fn release(
    State(api): State<Arc<Api>>,
    headers: HeaderMap,
    Path((name, label)): Path<(String, String)>,
    body: Body,
) -> Reply {
    let (config, token) = match authorize(&api, &headers, Need::Operate) {
        Ok(ok) => ok,
        Err(reply) => return reply,
    };
    let value = match read_body(body).await.and_then(|b| empty_body(&b)) {
        Ok(value) => value,
        Err(reply) => return reply,
    };
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
    idempotent
        .answer(&headers, &value, |_| async move {
            let job = match find_job(&config, &name) {
                Ok(job) => job,
                Err(reply) => return reply,
            };
            let period = match manual::periods_between(job, (&label, &label), 1, Names::PATH) {
                Ok(mut periods) => periods.remove(0),
                Err(e) => return Reply::of(&e),
            };
            match operate::release(&store, job, &period).await {
                Ok((key, Some(Released { owner, lease_until }))) => {
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
                Ok((key, None)) => Reply::ok(
                    StatusCode::CONFLICT,
                    json!({
                        "error": format!("{key} has no running claim to release"),
                        "key": key,
                        "released": false,
                    }),
                ),
                Err(e) => Reply::of(&e),
            }
        })
        .await
}

/// A JSON value read only to refuse a key given twice in one object, at
/// any depth (serde_json keeps the last).
mod unique {
    use std::collections::HashSet;

    use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};

    /// How the error about a duplicate key starts; the key follows, then a
    /// backtick.
    pub(super) const DUPLICATE: &str = "duplicate key `";

    pub(super) struct Unique;

    impl<'de> Deserialize<'de> for Unique {
        fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Unique, D::Error> {
            deserializer.deserialize_any(Unique)
        }
    }

    impl<'de> Visitor<'de> for Unique {
        type Value = Unique;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a JSON value")
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Unique, A::Error> {
            let mut seen = HashSet::new();
            while let Some(key) = map.next_key::<String>()? {
                if !seen.insert(key.clone()) {
                    return Err(de::Error::custom(format!("{DUPLICATE}{key}`")));
                }
                map.next_value::<Unique>()?;
            }
            Ok(Unique)
        }

        fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Unique, A::Error> {
            while seq.next_element::<Unique>()?.is_some() {}
            Ok(Unique)
        }

        fn visit_bool<E>(self, _: bool) -> Result<Unique, E> {
            Ok(Unique)
        }

        fn visit_i64<E>(self, _: i64) -> Result<Unique, E> {
            Ok(Unique)
        }

        fn visit_u64<E>(self, _: u64) -> Result<Unique, E> {
            Ok(Unique)
        }

        fn visit_f64<E>(self, _: f64) -> Result<Unique, E> {
            Ok(Unique)
        }

        fn visit_str<E>(self, _: &str) -> Result<Unique, E> {
            Ok(Unique)
        }

        fn visit_unit<E>(self) -> Result<Unique, E> {
            Ok(Unique)
        }
    }
}
