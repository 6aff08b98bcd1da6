//! The OTLP exporter's HTTP client: the scheduler's own reqwest client
//! (one TLS stack, not a second reqwest of the exporter's), its requests
//! carried on the Tokio runtime whatever thread the exporter sends from.

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

/// The most of a collector's answer that is read.
const ANSWER_LIMIT: usize = 64 * 1024;

#[derive(Debug)]
pub(super) struct Client {
    http: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

impl Client {
    /// A client whose every request ends within `timeout`, on the current
    /// runtime.
    pub(super) fn new(timeout: std::time::Duration) -> Client {
        // No redirect is followed: the headers (an API key) would go along.
        let http = reqwest::Client::builder()
            .user_agent(concat!("scheduler/", env!("CARGO_PKG_VERSION")))
            .redirect(reqwest::redirect::Policy::none())
            .timeout(timeout)
            .build()
            .unwrap_or_default();
        Client {
            http,
            runtime: tokio::runtime::Handle::current(),
        }
    }
}

#[async_trait::async_trait]
impl HttpClient for Client {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let http = self.http.clone();
        let sent = self.runtime.spawn(async move {
            let mut response = http.execute(request).await?;
            let status = response.status();
            // An OTLP answer is a few bytes; a collector's longer one is
            // cut, never read whole into memory.
            let mut body = Vec::new();
            while let Some(piece) = response.chunk().await? {
                let room = ANSWER_LIMIT.saturating_sub(body.len());
                body.extend_from_slice(&piece[..piece.len().min(room)]);
                if body.len() >= ANSWER_LIMIT {
                    break;
                }
            }
            Ok::<_, reqwest::Error>((status, Bytes::from(body)))
        });
        let (status, body) = sent.await??;
        Ok(Response::builder().status(status).body(body)?)
    }
}
