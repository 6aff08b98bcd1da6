//! An axum service that embeds the scheduler beside its routes, on its own
//! PostgreSQL database:
//! - `billing`, monthly: bills the month before in the transaction that
//!   records the period done, so an invoice exists exactly when its period
//!   is recorded succeeded;
//! - `sync`, hourly: posts the hour to another service with the period key
//!   as its `Idempotency-Key`, so a retried or taken-over hour is one
//!   request as far as that service is concerned.
//!
//! `POST /billing/{month}/rerun` reruns one month by hand (`force`), and
//! answers with what ran: the month's `PeriodRun`, or a typed error mapped
//! to its status (404 unknown job, 400 no such month, 409 not due yet, 422
//! not begun).
//!
//! ```sh
//! DATABASE_URL=postgres://postgres@127.0.0.1/test SYNC_URL=https://example.com/hours \
//!     cargo run --example axum_service
//! curl -X POST localhost:3000/billing/2026-07/rerun
//! ```

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use axum::{Json, Router};
use scheduler::{
    CodeJob, Context, Covers, Failure, Handled, PeriodOutcome, Retry, RunOptions, Scheduler,
    Transaction, Unit,
};

/// Bills the period's month: its invoice commits with the period's success.
async fn bill(cx: Context, mut tx: Transaction<'_>) -> Handled {
    sqlx::query(
        "INSERT INTO invoices (month, total)
         SELECT $1, coalesce(sum(amount), 0) FROM usage
          WHERE at >= $2 AND at < $3",
    )
    .bind(cx.label().to_owned())
    .bind(cx.start())
    .bind(cx.end())
    .execute(tx.postgres()?)
    .await?;
    Ok(())
}

/// Sends the period's hour to another service, once as far as it can tell.
async fn sync(cx: Context, client: reqwest::Client, url: Arc<str>) -> Handled {
    let sent = client
        .post(&*url)
        .header("Idempotency-Key", cx.period_key())
        .json(&serde_json::json!({ "from": cx.start(), "to": cx.end() }))
        .send();
    // Stop waiting as soon as the claim is lost or shutdown's grace ends.
    let answer = tokio::select! {
        answer = sent => answer?,
        () = cx.token().cancelled() => return Err(Failure::retry("stopped")),
    };
    match answer.status() {
        status if status.is_success() => Ok(()),
        status if status.is_client_error() => Err(Failure::permanent(format!("{url}: {status}"))),
        status => Err(Failure::retry(format!("{url}: {status}"))),
    }
}

/// Reruns one month and answers with what actually ran: 200 when it
/// succeeded, 502 when it failed (the body says why), or the error's own
/// status. The call waits for the month if it is running elsewhere, and
/// for the job's one slot. A month is short; a long backfill (`run_range`
/// over years) is `tokio::spawn`ed instead: a client that hangs up drops
/// this future, and the run with it.
async fn rerun(
    State(scheduler): State<Scheduler>,
    Path(month): Path<String>,
) -> (StatusCode, Json<serde_json::Value>) {
    let options = RunOptions::default().force().by("http");
    match scheduler.run_period("billing", &month, options).await {
        Ok(runs) => {
            let succeeded = runs.iter().all(|r| r.outcome == PeriodOutcome::Succeeded);
            let status = if succeeded {
                StatusCode::OK
            } else {
                StatusCode::BAD_GATEWAY
            };
            (status, Json(serde_json::json!({ "runs": runs })))
        }
        Err(e) => {
            let status = match &e {
                scheduler::Error::UnknownJob { .. } => StatusCode::NOT_FOUND,
                scheduler::Error::NoSuchPeriod { .. } | scheduler::Error::Usage(_) => {
                    StatusCode::BAD_REQUEST
                }
                // Its fire is ahead: `early` would run it. Not started:
                // nothing would.
                scheduler::Error::NotDue {
                    early_runs_it: true,
                    ..
                } => StatusCode::CONFLICT,
                scheduler::Error::NotDue { .. } => StatusCode::UNPROCESSABLE_ENTITY,
                scheduler::Error::Database(_) => StatusCode::SERVICE_UNAVAILABLE,
                _ => StatusCode::INTERNAL_SERVER_ERROR,
            };
            (status, Json(serde_json::json!({ "error": e.to_string() })))
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info,sqlx=warn"))
        .init();
    let url = std::env::var("DATABASE_URL")?;
    let sync_url: Arc<str> = std::env::var("SYNC_URL")
        .unwrap_or_else(|_| "http://127.0.0.1:9/hours".into())
        .into();
    let pool = sqlx::PgPool::connect(&url).await?;
    for table in [
        "CREATE TABLE IF NOT EXISTS usage (at timestamptz NOT NULL, amount bigint NOT NULL)",
        "CREATE TABLE IF NOT EXISTS invoices (month text PRIMARY KEY, total bigint NOT NULL)",
    ] {
        sqlx::query(table).execute(&pool).await?;
    }
    let client = reqwest::Client::new();
    let scheduler = Scheduler::builder()
        .postgres_pool(pool)
        .job(
            CodeJob::new("billing", "0 3 1 * *")
                .timezone(scheduler::chrono_tz::Europe::Berlin)
                .period(Unit::Month)
                .covers(Covers::Previous)
                .transaction(|cx, tx| Box::pin(bill(cx, tx))),
        )
        .job(
            CodeJob::new("sync", "5 * * * *")
                .period(Unit::Hour)
                .covers(Covers::Previous)
                .retry(Retry::attempts(5))
                .timeout(std::time::Duration::from_secs(30))
                .handler(move |cx| sync(cx, client.clone(), sync_url.clone())),
        )
        .build()
        .await?;
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let handle = scheduler.start({
        let mut stopped = stopped.clone();
        async move {
            let _ = stopped.wait_for(|s| *s).await;
        }
    });
    let app = Router::new()
        .route("/", get(|| async { "ok" }))
        .route("/billing/{month}/rerun", post(rerun))
        .with_state(scheduler);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:3000").await?;
    axum::serve(listener, app)
        .with_graceful_shutdown(async move {
            let _ = tokio::signal::ctrl_c().await;
            let _ = stop.send(true);
        })
        .await?;
    handle.stopped().await?;
    Ok(())
}
