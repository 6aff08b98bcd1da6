//! The Idempotency-Key contract of every `POST`: a key claimed for (token,
//! route) with the request's hash executes once; a retry is answered from
//! what was stored.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderName, StatusCode, header};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::reply::Reply;
use super::run_view::run_body;
use super::{Api, KEY_SLACK};
use crate::config::Token;
use crate::error::Error;
use crate::store::{KeyClaim, KeyRecord, KeyState, Store};

pub(super) fn hex_sha256(parts: &[&[u8]]) -> String {
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
pub(super) struct Idempotent<'a> {
    pub(super) api: &'a Api,
    pub(super) token: &'a Token,
    /// The route template, e.g. `POST /v1/jobs/{job}/runs`.
    pub(super) route: &'static str,
    /// The concrete path, without the query string.
    pub(super) path: String,
    /// How long the request may take to answer.
    pub(super) bound: Duration,
    /// The id of the run the request starts, if it starts one: made before
    /// the key is claimed, so that a retry answered 409 while it is being
    /// set up already gets its `Location`.
    pub(super) run_id: Option<String>,
}

impl Idempotent<'_> {
    /// Answers the request: a new key executes `execute` and stores its
    /// answer; a known one is answered from what is stored.
    pub(super) async fn answer<F, Fut>(self, headers: &HeaderMap, body: &Value, execute: F) -> Reply
    where
        F: FnOnce(Scope) -> Fut,
        Fut: std::future::Future<Output = Result<Reply, Reply>>,
    {
        match self.claim(headers, body).await {
            Ok(Claimed::New(scope)) => {
                let (store, name) = (scope.store.clone(), scope.scope.clone());
                let reply = match execute(scope).await {
                    Ok(reply) | Err(reply) => reply,
                };
                keep(&store, &name, &reply).await;
                reply
            }
            Ok(Claimed::Known(reply)) | Err(reply) => reply,
        }
    }

    /// Claims the request's key: new, with the scope it executes under,
    /// or known, with the answer a retry gets.
    async fn claim(&self, headers: &HeaderMap, body: &Value) -> Result<Claimed, Reply> {
        let key = headers
            .get("idempotency-key")
            .and_then(|v| v.to_str().ok())
            .map(str::trim)
            .unwrap_or_default();
        if key.is_empty() || key.len() > 255 {
            return Err(Reply::bad(
                "Idempotency-Key",
                "every POST under /v1/ needs an Idempotency-Key header of 1 to 255 characters, one value per operation (a UUID, say); a retry sends the same value",
            ));
        }
        let Some(settings) = self.api.config().api.clone() else {
            return Err(Reply::error(StatusCode::NOT_FOUND, "the API is off"));
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
        let location = self.run_id.as_ref().map(|id| format!("/v1/runs/{id}"));
        let claim = store.claim_key(
            &scope,
            &request,
            self.bound + KEY_SLACK,
            settings.key_ttl,
            location.as_deref(),
        );
        match claim.await? {
            KeyClaim::New => Ok(Claimed::New(Scope {
                store: store.clone(),
                scope,
                run_id: self.run_id.clone().unwrap_or_default(),
            })),
            KeyClaim::Known(known) => Ok(Claimed::Known(replay(store, known, &request).await?)),
        }
    }
}

/// A request's key, claimed.
enum Claimed {
    /// Never seen: the request executes under this scope.
    New(Scope),
    /// Seen before: this is the answer.
    Known(Reply),
}

/// The answer to a request whose key is known: 422 for another request
/// under it, 409 while it is still being answered, else what it was
/// answered (its run as it is now, for a request that started one).
async fn replay(store: &Store, known: KeyRecord, request: &str) -> Result<Reply, Error> {
    if known.request != request {
        return Ok(Reply::ok(
            StatusCode::UNPROCESSABLE_ENTITY,
            json!({
                "error": "this Idempotency-Key was used for another request (another body or path) on this route; use a new key for a new operation",
                "field": "Idempotency-Key",
            }),
        ));
    }
    let in_flight = known.run_going == 1 || (known.state == KeyState::Running && known.stale == 0);
    if in_flight {
        let mut reply = Reply::error(
            StatusCode::CONFLICT,
            "a request with this Idempotency-Key is still being answered or its run is still going; retry later",
        )
        .with(header::RETRY_AFTER, "1");
        if let Some(location) = known.location {
            reply = reply.with(header::LOCATION, location);
        }
        return Ok(reply);
    }
    let replayed = HeaderName::from_static("idempotent-replayed");
    // The request started a run that has ended since, or whose replica
    // went away: the replay is that run, never a second one — 200 with its
    // outcome (`abandoned` for a replica that went away; its periods are
    // recovered like any others).
    if let Some(id) = &known.run_id {
        match store.api_run(id).await? {
            Some(run) => {
                return Ok(Reply::ok(StatusCode::OK, run_body(&run))
                    .with(header::LOCATION, format!("/v1/runs/{id}"))
                    .with(replayed, "true"));
            }
            None if known.state == KeyState::Running => {
                return Ok(Reply::error(
                    StatusCode::GONE,
                    "the run of this Idempotency-Key was pruned",
                ));
            }
            None => {}
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
    let mut reply = Reply::ok(status, body).with(replayed, "true");
    if let Some(location) = known.location {
        reply = reply.with(header::LOCATION, location);
    }
    Ok(reply)
}

/// Stores the answer under its key, for a retry. A server-side failure,
/// or a run that found no free slot, ran nothing: the key is freed so that
/// a retry executes.
async fn keep(store: &Store, scope: &str, reply: &Reply) {
    let stored = if reply.status.is_server_error() || reply.status == StatusCode::TOO_MANY_REQUESTS
    {
        store.forget_key(scope).await
    } else {
        let location = reply.location().map(str::to_owned);
        let run_id = location
            .as_deref()
            .and_then(|l| l.strip_prefix("/v1/runs/"))
            .map(str::to_owned);
        store
            .answer_key(
                scope,
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
}

/// The Idempotency-Key a request executes under: a run it starts is noted
/// on it at once, so a retry meanwhile gets the run's `Location`.
pub(super) struct Scope {
    pub(super) store: Store,
    pub(super) scope: String,
    /// The id a run it starts takes.
    pub(super) run_id: String,
}

impl Scope {
    pub(super) async fn note_run(&self, id: &str) -> Result<(), Error> {
        self.store
            .note_key_run(&self.scope, id, &format!("/v1/runs/{id}"))
            .await
    }
}
