//! `serve --listen`: `/healthz`, Prometheus `/metrics`, the API and the
//! console, routed by axum and served by hyper, with a cap on open
//! connections, a deadline on each, accept errors that back off instead of
//! spinning, and an end at shutdown. A slow or idle client costs one capped
//! slot for a few seconds, never a fire.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use hyper::service::Service as _;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};

use super::api::Api;
use super::metrics::{Metrics, Recorder};
use crate::driver::health::Health;
use crate::error::Error;

/// How long a client has to send its request head.
const HEADER_TIMEOUT: Duration = Duration::from_secs(5);

/// The longest a connection stays open, request and answer included: a
/// `?wait=` of the API at most, and some.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(super::api::MAX_WAIT + 30);

/// How often `serve` deletes Idempotency-Keys and API runs past `key_ttl`.
const PRUNE_EVERY: Duration = Duration::from_secs(60);

/// How often the recorder moves recorded durations into their histograms.
/// The samples wait in a buffer until then (or until a scrape): without it,
/// a replica nobody scrapes grows by every fire's samples, for good.
const METRICS_UPKEEP: Duration = Duration::from_secs(5);

/// The buckets of `scheduler_fire_lateness_seconds`, in seconds: a fire is
/// normally a few milliseconds late, a burst of thousands of jobs about a
/// second.
const LATENESS_BUCKETS: [f64; 10] = [0.002, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 10.0, 60.0];

/// The buckets of `scheduler_run_duration_seconds`, in seconds: from a
/// no-op statement to a day.
const DURATION_BUCKETS: [f64; 11] = [
    0.01, 0.1, 1.0, 10.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 21_600.0, 86_400.0,
];

/// How long a connection over the cap has to send its request head.
const SPARE_HEADER_TIMEOUT: Duration = Duration::from_secs(1);

/// The longest wait after a failed accept (out of file descriptors, say).
const MAX_ACCEPT_BACKOFF: Duration = Duration::from_secs(1);

/// Binds `addr`; done before the database is opened, so a taken port is a
/// usage error that leaves nothing behind.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, Error> {
    TcpListener::bind(addr)
        .await
        .map_err(|e| Error::Usage(format!("--listen: cannot listen on {addr}: {e}")))
}

/// Installs the Prometheus recorder and serves `listener` until `shutdown`:
/// the probes (reporting `health`, the loop's own), the metrics and the API;
/// the series of the jobs named `jobs` hold those names, not copies.
pub fn start(
    listener: TcpListener,
    api: Arc<Api>,
    health: Arc<Health>,
    shutdown: watch::Receiver<bool>,
    jobs: impl Iterator<Item = Arc<str>>,
) -> Result<(), Error> {
    let metrics = install_recorder()?;
    metrics.number_jobs(jobs);
    describe_metrics();
    if let Ok(addr) = listener.local_addr() {
        tracing::info!(%addr, "serving the console at /, /healthz, /readyz, /metrics and /v1/");
    }
    tokio::spawn(upkeep(metrics.clone(), shutdown.clone()));
    tokio::spawn(prune_keys(api.clone(), shutdown.clone()));
    tokio::spawn(serve(listener, router(metrics, api, health), shutdown));
    Ok(())
}

/// Installs the recorder, with durations as Prometheus histograms of fixed
/// buckets: about a hundred bytes per job and histogram (in blocks of 128
/// jobs, allocated once one of them has run), summed across replicas by
/// `histogram_quantile`. The exporter's default summaries keep sketches of
/// up to 256 KB per job and 20 s window, and cannot be added up across
/// replicas.
fn install_recorder() -> Result<Metrics, Error> {
    let recorder = Recorder::new(
        PrometheusBuilder::new().build_recorder(),
        &[
            ("scheduler_fire_lateness_seconds", &LATENESS_BUCKETS),
            ("scheduler_run_duration_seconds", &DURATION_BUCKETS),
        ],
    );
    let metrics = recorder.metrics();
    metrics::set_global_recorder(recorder).map_err(|e| {
        Error::Environment(anyhow::anyhow!("cannot install the metrics recorder: {e}"))
    })?;
    Ok(metrics)
}

/// The `# HELP` line of every metric.
fn describe_metrics() {
    metrics::describe_counter!(
        "scheduler_claims_total",
        "Claims asked for, by job and result (won, recovered, held, done, waiting, failed, contended)."
    );
    metrics::describe_counter!(
        "scheduler_runs_total",
        "Runs that ended, by job and outcome."
    );
    metrics::describe_counter!(
        "scheduler_claims_taken_over_total",
        "Claims this process took over from another runner (its lease ran out, or it was released): recoveries."
    );
    metrics::describe_histogram!(
        "scheduler_fire_lateness_seconds",
        metrics::Unit::Seconds,
        "Time from a scheduled fire to the claim that won it, by job."
    );
    metrics::describe_counter!("scheduler_wakeups_total", "Wake-ups of the serve loop.");
    metrics::describe_counter!(
        "scheduler_notifications_total",
        "Tries of notifications, by notifier, event and outcome (delivered, again, given_up)."
    );
    metrics::describe_gauge!(
        "scheduler_late_periods",
        "Periods past the job's deadline and not succeeded, within the catch-up window."
    );
    metrics::describe_counter!(
        "scheduler_periods_dropped_total",
        "Fires of the job dropped unrun: they waited (no free concurrency or max_running slot) until they were older than catch_up."
    );
    metrics::describe_histogram!(
        "scheduler_run_duration_seconds",
        metrics::Unit::Seconds,
        "How long runs took, by job."
    );
    metrics::describe_gauge!(
        "scheduler_last_success_timestamp_seconds",
        metrics::Unit::Seconds,
        "When a run of the job last succeeded in this process (Unix time)."
    );
    metrics::describe_gauge!(
        "scheduler_next_fire_timestamp_seconds",
        metrics::Unit::Seconds,
        "The job's next fire (Unix time)."
    );
    metrics::describe_gauge!(
        "scheduler_running",
        "Periods of the job running in this process."
    );
    metrics::describe_gauge!(
        "scheduler_paused",
        "1 while the job is paused, as of the last scan."
    );
    metrics::describe_counter!(
        "scheduler_database_errors_total",
        "Statements of the scheduler's own that failed on the database."
    );
    metrics::describe_gauge!(
        "scheduler_overdue_periods",
        "Periods the job owes within catch_up (since its first sighting) with no success and nothing running, counted each minute."
    );
    metrics::describe_gauge!(
        "scheduler_waiting_periods",
        "Periods of the job noted waiting for upstream periods (after) not all succeeded, counted each minute."
    );
    metrics::describe_gauge!(
        "scheduler_ready_periods",
        "Periods of the job whose upstream periods (after) have all succeeded, not claimed yet, counted each minute."
    );
    metrics::describe_gauge!(
        "scheduler_retries_exhausted_periods",
        "Failed periods of the job that will not be retried, counted each minute."
    );
    // Counters an alert watches exist from the start, at zero.
    metrics::counter!("scheduler_database_errors_total").increment(0);
    metrics::counter!("scheduler_claims_taken_over_total").increment(0);
}

/// Moves the samples of the exporter's histograms (any not a job's) into
/// them every [`METRICS_UPKEEP`], scraped or not, so that their memory
/// stays bounded.
async fn upkeep(metrics: Metrics, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(METRICS_UPKEEP) => metrics.run_upkeep(),
            _ = shutdown.wait_for(|down| *down) => return,
        }
    }
}

/// Deletes expired Idempotency-Keys and API runs now and then.
async fn prune_keys(api: Arc<Api>, mut shutdown: watch::Receiver<bool>) {
    loop {
        tokio::select! {
            () = tokio::time::sleep(PRUNE_EVERY) => {}
            _ = shutdown.wait_for(|down| *down) => return,
        }
        if let Err(e) = api.prune().await {
            tracing::warn!("cannot prune expired Idempotency-Keys: {e}");
        }
        give_back_freed_memory();
    }
}

/// Returns the heap's free pages to the kernel. A large answer (a range of
/// 10,000 periods, the console's shared reads, dropped a minute later)
/// leaves free holes inside the heap that glibc keeps, trimming only its
/// top: a replica no one looks at would hold 50 MiB for good.
fn give_back_freed_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim touches only memory malloc holds as free.
    unsafe {
        libc::malloc_trim(0);
    }
}

fn router(metrics: Metrics, api: Arc<Api>, health: Arc<Health>) -> Router {
    let probes = Router::new()
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(health);
    Router::new()
        .merge(probes)
        .route(
            "/metrics",
            get(move || {
                let body = axum::body::Body::from_stream(metrics.render_parts());
                async move { ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body) }
            }),
        )
        .merge(super::api::routes(api))
        .merge(super::console::routes())
        .fallback(|uri: axum::http::Uri| async move {
            if uri.path().starts_with("/v1") {
                super::api::no_route()
            } else {
                (StatusCode::NOT_FOUND, "not found\n").into_response()
            }
        })
        .layer(axum::middleware::map_response(super::console::secure))
}

/// Readiness: start-up is over and the database answers.
async fn readyz(State(health): State<Arc<Health>>) -> impl IntoResponse {
    probe(health.readiness())
}

/// Liveness: the process and its loop are alive, whatever the database does.
async fn healthz(State(health): State<Arc<Health>>) -> impl IntoResponse {
    probe(health.liveness())
}

fn probe(report: Result<String, String>) -> (StatusCode, String) {
    match report {
        Ok(body) => (StatusCode::OK, body),
        Err(body) => (StatusCode::SERVICE_UNAVAILABLE, body),
    }
}

/// How many connections are served at once: a quarter of the file
/// descriptors this process may open (at most 256), so that clients can
/// never take the descriptors that jobs, pipes and the database need.
fn connection_cap() -> usize {
    let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
        .map_or(1024, |(soft, _)| soft);
    usize::try_from(soft / 4).unwrap_or(256).clamp(4, 256)
}

async fn serve(listener: TcpListener, app: Router, mut shutdown: watch::Receiver<bool>) {
    let cap = connection_cap();
    let slots = Arc::new(Semaphore::new(cap));
    let spare = Arc::new(Semaphore::new((cap / 4).max(2)));
    let waiting = Arc::new(Waiting::default());
    let mut backoff = Duration::from_millis(10);
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait_for(|down| *down) => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => {
                backoff = Duration::from_millis(10);
                stream
            }
            Err(e) => {
                // Out of file descriptors (EMFILE) or buffers: accepting
                // again at once would spin; wait for something to close.
                tracing::warn!("--listen: cannot accept a connection: {e}");
                tokio::select! {
                    () = tokio::time::sleep(backoff) => {}
                    _ = shutdown.wait_for(|down| *down) => return,
                }
                backoff = (backoff * 2).min(MAX_ACCEPT_BACKOFF);
                continue;
            }
        };
        let taken = slot(&slots, &spare, &waiting).await;
        let Some((permit, head_timeout)) = taken else {
            drop(stream);
            continue;
        };
        let headed = Arc::new(AtomicBool::new(false));
        let id = waiting.next_id();
        let connection = Connection {
            app: app.clone(),
            headed: headed.clone(),
            head_timeout,
            shutdown: shutdown.clone(),
        };
        let registry = waiting.clone();
        let task = tokio::spawn(async move {
            connection.serve(stream).await;
            registry.forget(id);
            drop(permit);
        });
        waiting.add(id, task.abort_handle(), headed);
    }
}

/// A slot for a new connection, and how long it has to send its head.
/// Over the cap, a connection gets one of a few spare slots with a second
/// to send its head; past those, the oldest connection that has not sent
/// its head yet gives its slot up, so clients that hold slots without
/// asking anything never keep a probe out.
async fn slot(
    slots: &Arc<Semaphore>,
    spare: &Arc<Semaphore>,
    waiting: &Waiting,
) -> Option<(tokio::sync::OwnedSemaphorePermit, Duration)> {
    match slots.clone().try_acquire_owned() {
        Ok(permit) => Some((permit, HEADER_TIMEOUT)),
        Err(_) => match spare.clone().try_acquire_owned() {
            Ok(permit) => Some((permit, SPARE_HEADER_TIMEOUT)),
            Err(_) if waiting.evict_oldest() => {
                let freed = tokio::time::timeout(EVICTION_WAIT, async {
                    tokio::select! {
                        Ok(permit) = slots.clone().acquire_owned() => Some(permit),
                        Ok(permit) = spare.clone().acquire_owned() => Some(permit),
                        else => None,
                    }
                });
                freed
                    .await
                    .ok()
                    .flatten()
                    .map(|p| (p, SPARE_HEADER_TIMEOUT))
            }
            Err(_) => None,
        },
    }
}

/// The address a request came from (a proxy's, behind one).
#[derive(Debug, Clone, Copy)]
pub struct Peer(pub std::net::SocketAddr);

/// One accepted connection, served by hyper.
struct Connection {
    app: Router,
    /// Set once its request head has come.
    headed: Arc<AtomicBool>,
    head_timeout: Duration,
    shutdown: watch::Receiver<bool>,
}

impl Connection {
    /// Serves its one request, within [`CONNECTION_TIMEOUT`]; at shutdown
    /// an answer under way is finished and nothing new is read.
    async fn serve(self, stream: tokio::net::TcpStream) {
        let inner = TowerToHyperService::new(self.app);
        let flag = self.headed;
        // hyper calls the service once a request head has come.
        // Where the request came from, for the console's failed logins.
        let peer = stream.peer_addr().ok().map(Peer);
        let service = hyper::service::service_fn(move |mut request: hyper::Request<_>| {
            flag.store(true, Ordering::Relaxed);
            if let Some(peer) = peer {
                request.extensions_mut().insert(peer);
            }
            inner.call(request)
        });
        let mut shutdown = self.shutdown;
        let connection = hyper::server::conn::http1::Builder::new()
            .timer(TokioTimer::new())
            .header_read_timeout(self.head_timeout)
            // Request heads over 16 KiB are refused (431).
            .max_buf_size(16 * 1024)
            .keep_alive(false)
            .serve_connection(TokioIo::new(stream), service);
        let mut connection = std::pin::pin!(connection);
        let stopping = tokio::select! {
            _ = connection.as_mut() => false,
            () = tokio::time::sleep(CONNECTION_TIMEOUT) => false,
            down = shutdown.wait_for(|down| *down) => down.is_ok(),
        };
        if stopping {
            connection.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(HEADER_TIMEOUT, connection).await;
        }
    }
}

/// How long a new connection waits for the slot of the one evicted for it.
const EVICTION_WAIT: Duration = Duration::from_millis(200);

/// The open connections, oldest first, with whether each has sent its
/// request head: the ones that have not may be evicted for a new one.
#[derive(Default)]
struct Waiting {
    next: AtomicU64,
    open: std::sync::Mutex<std::collections::VecDeque<Open>>,
}

struct Open {
    id: u64,
    abort: tokio::task::AbortHandle,
    headed: Arc<AtomicBool>,
}

impl Waiting {
    fn next_id(&self) -> u64 {
        self.next.fetch_add(1, Ordering::Relaxed)
    }

    fn add(&self, id: u64, abort: tokio::task::AbortHandle, headed: Arc<AtomicBool>) {
        if let Ok(mut open) = self.open.lock() {
            open.push_back(Open { id, abort, headed });
        }
    }

    fn forget(&self, id: u64) {
        if let Ok(mut open) = self.open.lock() {
            open.retain(|o| o.id != id);
        }
    }

    /// Closes the oldest connection still waiting for its request head;
    /// whether there was one.
    fn evict_oldest(&self) -> bool {
        let Ok(mut open) = self.open.lock() else {
            return false;
        };
        match open.iter().position(|o| !o.headed.load(Ordering::Relaxed)) {
            Some(at) => {
                if let Some(oldest) = open.remove(at) {
                    oldest.abort.abort();
                }
                true
            }
            None => false,
        }
    }
}
