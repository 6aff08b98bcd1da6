//! What the API answers: a status, a JSON body and headers ([`Reply`]),
//! every error as JSON, and the request bodies it reads.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::{HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::{BODY_LIMIT, BODY_TIMEOUT};
use crate::error::Error;

/// What a route answers: `Err` is an answer too, one that refuses the
/// request, so a refusal found on the way returns with `?`.
pub(super) type Answer = Result<Reply, Reply>;

/// Every error under `/v1/` is JSON: what axum's extractors refuse (a
/// query given twice, a path that is not UTF-8) comes as text, and is
/// wrapped.
pub(super) async fn json_errors(response: Response) -> Response {
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
    .with(header::CACHE_CONTROL, "no-store")
    .into_response()
}

/// An answer: a status, a JSON body and headers.
pub(super) struct Reply {
    pub(super) status: StatusCode,
    pub(super) body: Value,
    pub(super) headers: Vec<(HeaderName, String)>,
    /// The body already written out, sent instead of `body`: a shared
    /// answer, kept as its text (a tenth of the memory of its value).
    pub(super) text: Option<Arc<str>>,
}

impl Reply {
    pub(super) fn ok(status: StatusCode, body: Value) -> Reply {
        Reply {
            status,
            body,
            headers: Vec::new(),
            text: None,
        }
    }

    /// A 200 whose body is `text`, written out before.
    pub(super) fn written(text: Arc<str>) -> Reply {
        Reply {
            text: Some(text),
            ..Reply::ok(StatusCode::OK, Value::Null)
        }
    }

    pub(super) fn error(status: StatusCode, message: impl Into<String>) -> Reply {
        Reply::ok(status, json!({ "error": message.into() }))
    }

    /// 400 naming the bad field.
    pub(super) fn bad(field: &str, message: impl Into<String>) -> Reply {
        Reply::ok(
            StatusCode::BAD_REQUEST,
            json!({ "error": message.into(), "field": field }),
        )
    }

    pub(super) fn with(mut self, name: HeaderName, value: impl Into<String>) -> Reply {
        self.headers.push((name, value.into()));
        self
    }

    pub(super) fn location(&self) -> Option<&str> {
        self.headers
            .iter()
            .find(|(name, _)| name == header::LOCATION)
            .map(|(_, value)| value.as_str())
    }

    /// The answer for an error of the engine or the store: the database's
    /// is a server-side failure (503), a usage error the client's (400).
    pub(super) fn of(e: &Error) -> Reply {
        match e {
            Error::Usage(message) => {
                let field = message.split_once(':').map_or("", |(f, _)| f);
                Reply::bad(field, message.clone())
            }
            Error::NoSuchPeriod { field, .. } | Error::NotDue { field, .. } => {
                Reply::bad(field, e.to_string())
            }
            Error::Config(e) => Reply::error(StatusCode::BAD_REQUEST, e.to_string()),
            Error::UnknownJob { message, .. } => Reply::error(StatusCode::NOT_FOUND, message),
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

impl From<Error> for Reply {
    fn from(e: Error) -> Reply {
        Reply::of(&e)
    }
}

impl IntoResponse for Reply {
    fn into_response(self) -> Response {
        let mut response = (
            self.status,
            [(header::CONTENT_TYPE, "application/json")],
            match self.text {
                Some(text) => text.to_string(),
                None => format!("{}\n", self.body),
            },
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

/// A `POST` body: any JSON object; an empty body is `{}`.
pub(super) fn body_of(bytes: &[u8]) -> Result<Value, Reply> {
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
pub(super) fn empty_body(bytes: &[u8]) -> Result<Value, Reply> {
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
pub(super) async fn read_body(body: Body) -> Result<Bytes, Reply> {
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
