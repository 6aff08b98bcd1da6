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
use subtle::ConstantTimeEq;

use super::Api;
use super::auth::{Need, authorize};
use super::reply::{Answer, Reply, body_of, read_body};
use crate::config::{ApiSettings, Token};
use crate::period::utc_text;

/// The cookie's name.
const COOKIE: &str = "scheduler_session";

/// How long a session lasts from its login.
const LIFETIME: Duration = Duration::from_secs(12 * 3600);

/// The token a session cookie among `headers` stands for, if one is there,
/// signed by a token of `settings` and not expired at `now`.
pub(super) fn token_of(
    settings: &ApiSettings,
    headers: &HeaderMap,
    now: DateTime<Utc>,
) -> Option<Token> {
    let value = cookie(headers)?;
    let mut parts = value.split('.');
    let (name, expires, mac) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let expires: i64 = expires.parse().ok()?;
    if expires <= now.timestamp() {
        return None;
    }
    let name = String::from_utf8(hex::decode(name).ok()?).ok()?;
    let mac = hex::decode(mac).ok()?;
    let token = settings.tokens.iter().find(|t| t.name == name)?;
    let sealed = token.secret.seal(&message(&name, expires))?;
    bool::from(sealed.ct_eq(mac.as_slice())).then(|| token.clone())
}

/// Whether `headers` carry a session cookie, good or not.
pub(super) fn has_cookie(headers: &HeaderMap) -> bool {
    cookie(headers).is_some()
}

/// The session cookie's value among `headers`.
fn cookie(headers: &HeaderMap) -> Option<&str> {
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .find(|(name, _)| *name == COOKIE)
        .map(|(_, value)| value)
}

fn message(name: &str, expires: i64) -> Vec<u8> {
    format!("{name}\0{expires}").into_bytes()
}

/// Whether a request that a session cookie authenticates comes from the
/// console's own page: a browser says where a request comes from
/// (`Sec-Fetch-Site`, `Origin`), and a page of another site is refused.
/// `SameSite=Strict` already keeps the cookie off such requests; this is
/// the second lock. `strict`: a request that says neither (not a browser's)
/// is refused too.
pub(super) fn same_origin(headers: &HeaderMap, strict: bool) -> bool {
    let text = |name| headers.get(name).and_then(|v| v.to_str().ok());
    let site = text(header::HeaderName::from_static("sec-fetch-site"));
    if site.is_some_and(|site| site != "same-origin") {
        return false;
    }
    match (text(header::ORIGIN), text(header::HOST)) {
        (None, _) => !strict || site.is_some(),
        (Some(origin), Some(host)) => origin
            .split_once("://")
            .is_some_and(|(_, authority)| authority.eq_ignore_ascii_case(host)),
        (Some(_), None) => false,
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Login {
    token: String,
}

/// `POST /console/session`: `{"token": SECRET}` of a token allowed to
/// `read` opens a session; the answer sets its cookie.
pub(super) async fn login(State(api): State<Arc<Api>>, headers: HeaderMap, body: Body) -> Answer {
    // Another site's form must not log a browser in as someone else.
    if !same_origin(&headers, false) {
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
    let (_, token) = authorize(&api, &bearer, Need::Read)?;
    let now = Utc::now();
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
    Ok(who(&token, Some(expires)).with(header::SET_COOKIE, set_cookie(&headers, &value, LIFETIME)))
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

/// The `Set-Cookie` of a session: `Secure` when a proxy in front says the
/// browser spoke HTTPS to it.
fn set_cookie(headers: &HeaderMap, value: &str, max_age: Duration) -> String {
    let https = headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|proto| proto.eq_ignore_ascii_case("https"));
    format!(
        "{COOKIE}={value}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict{}",
        max_age.as_secs(),
        if https { "; Secure" } else { "" }
    )
}
