//! The web console at `/`: one page, its script and its stylesheet, built
//! into the binary (no CDN, no separate process; it works offline). The
//! page holds no state of its own: everything it shows it reads from the
//! HTTP API (`/v1/`) under the session of a token allowed to `read`, and
//! every button is an API request with its own Idempotency-Key.

use std::sync::OnceLock;

use axum::Router;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

const PAGE: &str = include_str!("console/index.html");
const SCRIPT: &str = include_str!("console/app.js");
const STYLE: &str = include_str!("console/app.css");

/// What every answer of `--listen` carries: the page may load only its own
/// script and style and speak only to its own origin, no page may frame
/// it, and no address leaks to another site.
const SECURITY: [(&str, &str); 4] = [
    (
        "content-security-policy",
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
    ),
    ("x-content-type-options", "nosniff"),
    ("referrer-policy", "no-referrer"),
    ("x-frame-options", "DENY"),
];

/// The console's routes.
pub fn routes<S: Clone + Send + Sync + 'static>() -> Router<S> {
    Router::new()
        .route(
            "/",
            get(|h: HeaderMap| async move { asset(&h, PAGE, "text/html; charset=utf-8") }),
        )
        .route(
            "/console/app.js",
            get(|h: HeaderMap| async move { asset(&h, SCRIPT, "text/javascript; charset=utf-8") }),
        )
        .route(
            "/console/app.css",
            get(|h: HeaderMap| async move { asset(&h, STYLE, "text/css; charset=utf-8") }),
        )
}

/// Adds [`SECURITY`] to an answer.
pub async fn secure(mut response: Response) -> Response {
    for (name, value) in SECURITY {
        response
            .headers_mut()
            .insert(name, HeaderValue::from_static(value));
    }
    response
}

/// A file of the console, checked against the browser's copy: the same
/// binary serves the same bytes, so their ETag is this build's.
fn asset(headers: &HeaderMap, body: &'static str, kind: &'static str) -> Response {
    static TAG: OnceLock<String> = OnceLock::new();
    let tag = TAG.get_or_init(|| {
        use sha2::Digest;
        let mut hash = sha2::Sha256::new();
        for part in [PAGE, SCRIPT, STYLE] {
            hash.update(part.as_bytes());
        }
        format!("\"{}\"", hex::encode(&hash.finalize()[..8]))
    });
    let fresh = headers
        .get(header::IF_NONE_MATCH)
        .is_some_and(|given| given.as_bytes() == tag.as_bytes());
    let cache = [
        (header::CACHE_CONTROL, "no-cache"),
        (header::ETAG, tag.as_str()),
    ];
    if fresh {
        return (StatusCode::NOT_MODIFIED, cache).into_response();
    }
    (cache, [(header::CONTENT_TYPE, kind)], body).into_response()
}
