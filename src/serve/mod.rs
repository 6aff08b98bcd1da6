//! `scheduler serve`'s HTTP side, served beside the driver's loop
//! ([`crate::driver`]): the probes `/healthz` and `/readyz` and Prometheus
//! `/metrics` ([`server`]), the HTTP API under `/v1/` ([`api`]) and the web
//! console, a client of that API built into the binary.

use tokio::sync::watch;

use crate::driver::Service;
use crate::error::Error;

pub mod api;
mod console;
mod metrics;
pub mod server;

/// Serves `listener` beside `service`'s loop (`serve --listen`): the probes
/// report that loop's health, the HTTP API runs periods on its engine and
/// follows its reloads, the loop waits for the API's runs at shutdown, and
/// it publishes the database-wide gauges the listener exports.
pub fn listen(
    service: Service,
    listener: tokio::net::TcpListener,
    shutdown: watch::Receiver<bool>,
) -> Result<Service, Error> {
    let config = service.config();
    let view = api::view(&config);
    let api = api::Api::new(view, service.engine().clone(), shutdown.clone());
    let names = config.jobs.iter().map(|job| job.name.clone());
    server::start(listener, api.clone(), service.health(), shutdown, names)?;
    Ok(service.with_gauges().beside(api))
}
