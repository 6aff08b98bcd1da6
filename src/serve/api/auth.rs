//! Who may call the API: the bearer token of a request and what it is
//! allowed.

use std::sync::Arc;

use axum::http::{HeaderMap, StatusCode, header};
use serde_json::json;

use super::Api;
use super::cookie;
use super::reply::Reply;
use crate::config::{Config, Token};

/// What a token must be allowed.
#[derive(Clone, Copy)]
pub(super) enum Need {
    Read,
    Trigger,
    Operate,
}

impl Need {
    pub(super) fn word(self) -> &'static str {
        match self {
            Need::Read => "read",
            Need::Trigger => "trigger",
            Need::Operate => "operate",
        }
    }
}

/// The configuration and the caller's token (its bearer token, or else the
/// console's session cookie), or the answer that refuses the request: 404
/// without `[api]`, 401 without a known token, 403 for a token without
/// `need` (or a session's action from another site).
pub(super) fn authorize(
    api: &Api,
    headers: &HeaderMap,
    need: Need,
) -> Result<(Arc<Config>, Token), Reply> {
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
    let token = match given {
        Some(given) => {
            // Every secret is compared, each in constant time.
            let mut found = None;
            for token in &settings.tokens {
                if token.secret.matches(given) {
                    found = Some(token.clone());
                }
            }
            found.ok_or_else(|| unauthorized("unknown bearer token"))?
        }
        // The console's session, from its cookie.
        None => {
            if cookie::doubled(headers) {
                return Err(unauthorized(
                    "two session cookies came with the request (a page of another port or site on this host may have set one): log in again, and clear this host's cookies if it goes on",
                ));
            }
            let token = cookie::token_of(settings, headers, api.now());
            // A session is a reader's: a token that lost `read` (a reload)
            // ends its sessions.
            let token = token.filter(|t| t.allow.read).ok_or_else(|| {
                unauthorized(if cookie::has_cookie(headers) {
                    "the console's session has ended: log in again"
                } else {
                    "missing bearer token: send `Authorization: Bearer <secret>`"
                })
            })?;
            if !matches!(need, Need::Read) && !cookie::same_origin(headers, true) {
                return Err(Reply::error(
                    StatusCode::FORBIDDEN,
                    "a session may act only from the console's own page",
                ));
            }
            token
        }
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
