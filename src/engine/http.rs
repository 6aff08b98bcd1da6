//! `http` actions: one request carrying `Idempotency-Key: <period key>`.

use std::future::Future;
use std::time::Duration;

use reqwest::{Method, StatusCode};

use super::action::ActionResult;
use super::{OUTPUT_TAIL, Run, Stop};
use crate::template::Template;

/// What an `http` action sends.
pub(super) struct Request<'a> {
    pub url: &'a Template,
    pub method: &'a str,
    pub headers: &'a [(String, Template)],
    pub body: Option<&'a Template>,
    pub timeout: Duration,
}

/// Sends the request, unless `stop` comes first, and classifies the answer.
pub(super) async fn send(
    client: &reqwest::Client,
    request: Request<'_>,
    run: &Run<'_>,
    stop: impl Future<Output = Stop>,
) -> ActionResult {
    let method = Method::from_bytes(request.method.as_bytes()).unwrap_or(Method::POST);
    let mut builder = client
        .request(method, request.url.render_in_url(run))
        .timeout(request.timeout)
        .header("Idempotency-Key", run.key.as_str());
    // With traces on, the action's trace context goes along (W3C Trace
    // Context), in place of any `traceparent` the job sets itself.
    if let Some(traceparent) = &run.traceparent {
        builder = builder.header("traceparent", traceparent);
    }
    let ours = |name: &str| run.traceparent.is_some() && name.eq_ignore_ascii_case("traceparent");
    for (name, value) in request.headers.iter().filter(|(name, _)| !ours(name)) {
        builder = builder.header(name, value.render(run));
    }
    if let Some(body) = request.body {
        let body = body.render(run);
        let typed = request
            .headers
            .iter()
            .any(|(name, _)| name.eq_ignore_ascii_case("content-type"));
        if !typed {
            builder = builder.header(reqwest::header::CONTENT_TYPE, content_type(&body));
        }
        builder = builder.body(body);
    } else if matches!(request.method, "POST" | "PUT" | "PATCH") {
        // `Content-Length: 0`, which some servers insist on (411 without).
        builder = builder.header(reqwest::header::CONTENT_LENGTH, "0");
    }
    let response = tokio::select! {
        response = builder.send() => response,
        why = stop => return ActionResult::Stopped(why, None),
    };
    match response {
        Ok(mut response) => {
            let status = response.status();
            let location = response
                .headers()
                .get(reqwest::header::LOCATION)
                .map(|l| String::from_utf8_lossy(l.as_bytes()).into_owned());
            let body = read_body(&mut response).await;
            let text = String::from_utf8_lossy(&body);
            let mut result = if status.is_success() {
                ActionResult::succeeded()
            } else if status.is_redirection() {
                // Following it would send the headers and body to another
                // origin (and turn a POST into a GET): never retried.
                let to =
                    location.map_or_else(|| "no Location".to_owned(), |l| format!("Location: {l}"));
                ActionResult::permanent(format!(
                    "HTTP {status}, a redirect ({to}); redirects are not followed: point `url` at the final address (not retried)"
                ))
            } else if retryable(status) {
                ActionResult::failed(format!("HTTP {status}"))
            } else {
                ActionResult::permanent(format!("HTTP {status} (not retried)"))
            };
            if let ActionResult::Done(finish, _) = &mut result {
                finish.http_status = Some(i32::from(status.as_u16()));
                // A body read to the limit may cut a value that the
                // service echoed: its start is masked too.
                let cut = body.len() >= OUTPUT_TAIL;
                finish.output = Some(run.job.secrets.mask_cut("", &text, cut));
            }
            result
        }
        // Connection errors and timeouts are retryable; the URL may carry a
        // secret, so it is left out of the message.
        Err(e) => ActionResult::failed(format!("HTTP request failed: {}", causes(e.without_url()))),
    }
}

/// The type of a body whose job names none: JSON where it is a JSON object
/// or array, else plain text.
fn content_type(body: &str) -> &'static str {
    let json = body.trim_start().starts_with(['{', '['])
        && serde_json::from_str::<serde::de::IgnoredAny>(body).is_ok();
    if json {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    }
}

/// The first [`OUTPUT_TAIL`] bytes of the body; the rest is never read, so
/// a huge answer costs no memory.
async fn read_body(response: &mut reqwest::Response) -> Vec<u8> {
    let mut body = Vec::new();
    while body.len() < OUTPUT_TAIL {
        match response.chunk().await {
            Ok(Some(chunk)) => {
                let room = OUTPUT_TAIL - body.len();
                body.extend_from_slice(&chunk[..chunk.len().min(room)]);
            }
            Ok(None) | Err(_) => break,
        }
    }
    body
}

/// An error and its causes, outermost first (`error sending request: …:
/// invalid peer certificate: …`), each said once.
fn causes(e: reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(cause) = source {
        let said = cause.to_string();
        if !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        source = cause.source();
    }
    text
}

/// 408, 409, 425, 429 and 5xx may succeed later; other 4xx never will.
fn retryable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 409 | 425 | 429) || status.is_server_error()
}
