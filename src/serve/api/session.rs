//! The console's sessions. A token is typed once into the console's login
//! and traded for a cookie that scripts cannot read (`HttpOnly`,
//! `SameSite=Strict`), so the token itself is never kept by the browser,
//! put in a URL or written to a log. The cookie holds the token's name, an
//! expiry and an HMAC of both under the token's secret: any replica with
//! the same `[api]` checks it without a table, and a secret changed or a
//! token removed ends its sessions.

use std::time::Duration;

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use chrono::{DateTime, Utc};
use serde::Deserialize;
use serde_json::json;
use std::sync::Arc;

use super::Api;
use super::auth::{Need, authorize};
use super::cookie::{message, same_origin, set_cookie};
use super::reply::{Answer, Reply, body_of, read_body};
use crate::config::Token;
use crate::period::utc_text;

/// Failed logins let through before the next ones are slowed down.
const FREE_FAILURES: u32 = 5;

/// The longest wait a failed login imposes on the next.
const MOST_WAIT: Duration = Duration::from_secs(60);

/// How long without a failed login before the count starts again.
const FORGET_AFTER: Duration = Duration::from_secs(15 * 60);

/// The console's failed logins on this replica: from the
/// [`FREE_FAILURES`]th on, each one doubles the wait before the next login
/// is looked at (1 s, 2 s, … [`MOST_WAIT`]). About 310 guesses a second
/// become a few a minute. A good login does not clear the count (a holder
/// of one token could then guess another's at full speed between two of
/// its own logins): [`FORGET_AFTER`] without a failure does.
#[derive(Debug, Default)]
pub(super) struct Failures {
    in_a_row: u32,
    last: Option<std::time::Instant>,
    until: Option<std::time::Instant>,
}

impl Failures {
    /// How long a login must still wait, if it must.
    fn wait(&self) -> Option<Duration> {
        let until = self.until?;
        let left = until.saturating_duration_since(std::time::Instant::now());
        (!left.is_zero()).then_some(left)
    }

    fn failed(&mut self) {
        let now = std::time::Instant::now();
        if self.last.is_some_and(|last| now - last > FORGET_AFTER) {
            self.in_a_row = 0;
        }
        self.last = Some(now);
        self.in_a_row = self.in_a_row.saturating_add(1);
        if let Some(past) = self.in_a_row.checked_sub(FREE_FAILURES) {
            let wait = Duration::from_secs(1u64 << past.min(6)).min(MOST_WAIT);
            self.until = Some(std::time::Instant::now() + wait);
        }
    }
}

/// How long a session lasts from its login.
const LIFETIME: Duration = Duration::from_secs(12 * 3600);

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Login {
    token: String,
}

/// `POST /console/session`: `{"token": SECRET}` of a token allowed to
/// `read` opens a session; the answer sets its cookie. Failed logins slow
/// the next ones down ([`Failures`]), and each is logged with where it
/// came from, never with what was typed.
pub(super) async fn login(
    State(api): State<Arc<Api>>,
    peer: Option<axum::Extension<crate::serve::server::Peer>>,
    headers: HeaderMap,
    body: Body,
) -> Answer {
    let from = from(peer.map(|p| p.0), &headers);
    let wait = api.logins.lock().ok().and_then(|f| f.wait());
    if let Some(wait) = wait {
        tracing::warn!(
            from,
            "console login refused: too many failed logins on this replica; the next is looked at in {}s",
            wait.as_secs() + 1
        );
        return Err(Reply::error(
            StatusCode::TOO_MANY_REQUESTS,
            "too many failed logins: try again later",
        )
        .with(header::RETRY_AFTER, (wait.as_secs() + 1).to_string()));
    }
    let answer = open(&api, &headers, body).await;
    match &answer {
        Err(refused) if refused.status == StatusCode::UNAUTHORIZED => {
            let in_a_row = api.logins.lock().map_or(0, |mut failures| {
                failures.failed();
                failures.in_a_row
            });
            tracing::warn!(from, in_a_row, "console login failed: unknown token");
        }
        _ => {}
    }
    answer
}

/// Where a login came from, for the log: the peer's address, and what a
/// proxy in front says of the browser's (`X-Forwarded-For`, its first
/// 100 characters, made printable).
fn from(peer: Option<crate::serve::server::Peer>, headers: &HeaderMap) -> String {
    let peer = peer.map_or_else(|| "unknown".to_owned(), |p| p.0.to_string());
    match headers.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(forwarded) => {
            let forwarded: String = forwarded.chars().take(100).collect();
            format!("{peer} for {}", crate::error::printable(&forwarded))
        }
        None => peer,
    }
}

/// A login looked at: the session opened, or why not.
async fn open(api: &Api, headers: &HeaderMap, body: Body) -> Answer {
    // Another site's form must not log a browser in as someone else.
    if !same_origin(headers, false) {
        return Err(Reply::error(
            StatusCode::FORBIDDEN,
            "a session is opened only from the console's own page",
        ));
    }
    let value = body_of(&read_body(body).await?)?;
    let login: Login = serde_json::from_value(value).map_err(|_| {
        Reply::bad(
            "token",
            "the body is {\"token\": SECRET}: the secret of an [api] token",
        )
    })?;
    let mut bearer = headers.clone();
    let given = format!("Bearer {}", login.token.trim());
    let Ok(given) = header::HeaderValue::from_str(&given) else {
        return Err(Reply::bad("token", "a token is printable text"));
    };
    bearer.insert(header::AUTHORIZATION, given);
    let (_, token) = authorize(api, &bearer, Need::Read)?;
    let now = api.now();
    let expires = now + chrono::TimeDelta::from_std(LIFETIME).unwrap_or_default();
    let mac = token
        .secret
        .seal(&message(&token.name, expires.timestamp()))
        .ok_or_else(|| Reply::error(StatusCode::UNAUTHORIZED, "unknown bearer token"))?;
    let value = format!(
        "{}.{}.{}",
        hex::encode(&token.name),
        expires.timestamp(),
        hex::encode(mac)
    );
    tracing::info!(token = %token.name, "console login");
    Ok(who(&token, Some(expires)).with(header::SET_COOKIE, set_cookie(headers, &value, LIFETIME)))
}

/// `GET /console/session`: who the session is, or 401.
pub(super) async fn current(State(api): State<Arc<Api>>, headers: HeaderMap) -> Answer {
    let (_, token) = authorize(&api, &headers, Need::Read)?;
    Ok(who(&token, None))
}

/// `DELETE /console/session`: the browser forgets the cookie.
pub(super) async fn logout(headers: HeaderMap) -> Answer {
    Ok(Reply::ok(StatusCode::OK, json!({ "logged_out": true }))
        .with(header::SET_COOKIE, set_cookie(&headers, "", Duration::ZERO)))
}

fn who(token: &Token, expires: Option<DateTime<Utc>>) -> Reply {
    let allow: Vec<&str> = [
        (token.allow.read, "read"),
        (token.allow.trigger, "trigger"),
        (token.allow.operate, "operate"),
    ]
    .into_iter()
    .filter_map(|(allowed, word)| allowed.then_some(word))
    .collect();
    Reply::ok(
        StatusCode::OK,
        json!({
            "name": token.name,
            "allow": allow,
            "expires_at": expires.map(utc_text),
        }),
    )
    .with(header::CACHE_CONTROL, "no-store")
}
