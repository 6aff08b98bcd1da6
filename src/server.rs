//! `serve --listen`: `/healthz` and Prometheus `/metrics`, over a minimal
//! HTTP/1.1 responder (two fixed paths need no web framework).

use std::net::SocketAddr;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;

use crate::error::Error;

/// Installs the Prometheus recorder and serves `addr` until the process ends.
pub async fn start(addr: SocketAddr) -> Result<(), Error> {
    let handle = PrometheusBuilder::new().install_recorder().map_err(|e| {
        Error::Environment(anyhow::anyhow!("cannot install the metrics recorder: {e}"))
    })?;
    let listener = TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Usage(format!("--listen: cannot listen on {addr}: {e}")))?;
    tracing::info!(%addr, "serving /healthz and /metrics");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let handle = handle.clone();
            tokio::spawn(respond(stream, handle));
        }
    });
    Ok(())
}

async fn respond(mut stream: tokio::net::TcpStream, handle: PrometheusHandle) {
    let mut request = [0u8; 1024];
    let Ok(read) = stream.read(&mut request).await else {
        return;
    };
    let head = String::from_utf8_lossy(&request[..read]);
    let path = head.split_whitespace().nth(1).unwrap_or("/");
    let (status, body) = match path {
        "/healthz" => ("200 OK", "ok\n".to_owned()),
        "/metrics" => ("200 OK", handle.render()),
        _ => ("404 Not Found", "not found\n".to_owned()),
    };
    let response = format!(
        "HTTP/1.1 {status}\r\ncontent-type: text/plain; version=0.0.4\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = stream.write_all(response.as_bytes()).await;
}
