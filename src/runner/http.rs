//! `http` actions: one request carrying `Idempotency-Key: <period key>`.

use std::future::Future;
use std::time::Duration;

use reqwest::{Method, StatusCode};

use super::{ActionResult, OUTPUT_TAIL, Run, Stop};
use crate::store::tail;
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
pub(super) async fn run(
    client: &reqwest::Client,
    request: Request<'_>,
    run: &Run<'_>,
    stop: impl Future<Output = Stop>,
) -> ActionResult {
    let method = Method::from_bytes(request.method.as_bytes()).unwrap_or(Method::POST);
    let mut builder = client
        .request(method, request.url.render(run))
        .timeout(request.timeout)
        .header("Idempotency-Key", run.key);
    for (name, value) in request.headers {
        builder = builder.header(name, value.render(run));
    }
    if let Some(body) = request.body {
        builder = builder.body(body.render(run));
    }
    let response = tokio::select! {
        response = builder.send() => response,
        why = stop => return ActionResult::Stopped(why),
    };
    match response {
        Ok(response) => {
            let status = response.status();
            let text = response.text().await.unwrap_or_default();
            let mut result = if status.is_success() {
                ActionResult::succeeded()
            } else if retryable(status) {
                ActionResult::failed(format!("HTTP {status}"))
            } else {
                ActionResult::permanent(format!("HTTP {status} (not retried)"))
            };
            if let ActionResult::Done(finish, _) = &mut result {
                finish.http_status = Some(i32::from(status.as_u16()));
                finish.output = Some(tail(&text, OUTPUT_TAIL).to_owned());
            }
            result
        }
        // Connection errors and timeouts are retryable; the URL may carry a
        // secret, so it is left out of the message.
        Err(e) => ActionResult::failed(format!("HTTP request failed: {}", e.without_url())),
    }
}

/// 408, 409, 425, 429 and 5xx may succeed later; other 4xx never will.
fn retryable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 409 | 425 | 429) || status.is_server_error()
}
