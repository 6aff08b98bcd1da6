//! The console's session cookie as requests carry it: its name, the token
//! a good one stands for, whether its request comes from the console's
//! own page, and the `Set-Cookie` that sets it. What a session is, and
//! how one is opened, is [`super::session`]'s.

use std::time::Duration;

use axum::http::{HeaderMap, header};
use chrono::{DateTime, Utc};
use subtle::ConstantTimeEq;

use crate::config::{ApiSettings, Token};

/// The cookie's name over plain HTTP.
const COOKIE: &str = "scheduler_session";

/// Its name over HTTPS: a browser takes a `__Host-` cookie only from a
/// secure page of this very host, for every path, so no page of another
/// port or subdomain can set one of its own in its place.
const HOST_COOKIE: &str = "__Host-scheduler_session";

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
    cookies(headers).next().is_some()
}

/// Whether `headers` carry more than one session cookie: one was set by a
/// page that is not the console's (another port of the same host), to log
/// the operator out or into its own session. Such a request is refused.
/// Over HTTPS only `__Host-` cookies count, which no such page can set.
pub(super) fn doubled(headers: &HeaderMap) -> bool {
    cookies(headers).nth(1).is_some()
}

/// Whether a proxy in front says the browser spoke HTTPS to it.
fn https(headers: &HeaderMap) -> bool {
    headers
        .get("x-forwarded-proto")
        .and_then(|v| v.to_str().ok())
        .is_some_and(|proto| proto.eq_ignore_ascii_case("https"))
}

/// The session cookie's value among `headers`: the one there is.
fn cookie(headers: &HeaderMap) -> Option<&str> {
    let mut found = cookies(headers);
    let value = found.next()?;
    found.next().is_none().then_some(value)
}

/// The values of every session cookie among `headers`: of the name of
/// the scheme the browser spoke (`__Host-` over HTTPS).
fn cookies(headers: &HeaderMap) -> impl Iterator<Item = &str> {
    let wanted = if https(headers) { HOST_COOKIE } else { COOKIE };
    headers
        .get_all(header::COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(';'))
        .filter_map(|pair| pair.trim().split_once('='))
        .filter(move |(name, _)| *name == wanted)
        .map(|(_, value)| value)
}

/// What a cookie's HMAC signs: the token's name and the expiry.
pub(super) fn message(name: &str, expires: i64) -> Vec<u8> {
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

/// The `Set-Cookie` of a session: `Secure` when a proxy in front says the
/// browser spoke HTTPS to it.
pub(super) fn set_cookie(headers: &HeaderMap, value: &str, max_age: Duration) -> String {
    match https(headers) {
        true => format!(
            "{HOST_COOKIE}={value}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict; Secure",
            max_age.as_secs()
        ),
        false => format!(
            "{COOKIE}={value}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict",
            max_age.as_secs()
        ),
    }
}
