//! The OTLP exporter's HTTP client: the scheduler's own reqwest client
//! (one TLS stack, not a second reqwest of the exporter's), its requests
//! carried on the Tokio runtime whatever thread the exporter sends from.

use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};

#[derive(Debug)]
pub(super) struct Client {
    http: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

impl Client {
    /// A client whose every request ends within `timeout`, on the current
    /// runtime.
    pub(super) fn new(timeout: std::time::Duration) -> Client {
        let http = reqwest::Client::builder()
            .user_agent(concat!("scheduler/", env!("CARGO_PKG_VERSION")))
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
            let response = http.execute(request).await?;
            let status = response.status();
            let body = response.bytes().await?;
            Ok::<_, reqwest::Error>((status, body))
        });
        let (status, body) = sent.await??;
        Ok(Response::builder().status(status).body(body)?)
    }
}
