//! Period-keyed cron jobs inside a Rust service: every run of a job covers
//! a *period* (`billing:2026-07`) that is claimed in the database before any
//! work starts, so overlapping fires, restarts, reruns, replicas and
//! double-started containers collapse into one execution per period. Crashed
//! runs are taken over when their lease runs out; a late writer is fenced
//! off by its attempt number.
//!
//! ```no_run
//! use scheduler::{CodeJob, Scheduler, Unit};
//!
//! #[tokio::main]
//! async fn main() -> Result<(), scheduler::Error> {
//!     let scheduler = Scheduler::builder()
//!         .database_url("sqlite://app.db")
//!         .job(CodeJob::new("report", "0 * * * *").period(Unit::Hour).handler(|cx| async move {
//!             println!("the report of {}", cx.label()); // 2026-07-15T14
//!             Ok(())
//!         }))
//!         .build()
//!         .await?;
//!     let handle = scheduler.start(async { let _ = tokio::signal::ctrl_c().await; });
//!     handle.stopped().await
//! }
//! ```
//!
//! What a service uses:
//! - [`Scheduler::builder`] → [`Builder`]: the database (a URL, or the
//!   service's own [`sqlx`] pool), [`CodeJob`]s and settings; `build()`
//!   checks them and migrates the scheduler's own tables (recorded in
//!   `scheduler_migrations`, beside the service's sqlx migrations).
//! - [`Scheduler::start`] serves every schedule until shutdown
//!   ([`Handle`]); [`Scheduler::run_period`], [`Scheduler::run_range`] and
//!   [`Scheduler::run_due`] run periods by hand ([`RunOptions`],
//!   [`PeriodRun`]); [`Scheduler::release`], [`Scheduler::adopt`],
//!   [`Scheduler::pause`] and [`Scheduler::prune`] are the operator's
//!   commands.
//! - [`Scheduler::status`], [`Scheduler::periods`] and
//!   [`Scheduler::history`] read where jobs and periods stand
//!   ([`JobOverview`], [`PeriodView`], [`Attempt`]).
//! - A handler gets a [`Context`] (and, transaction-scoped, a
//!   [`Transaction`]) and answers [`Handled`]: `Ok(())` or a [`Failure`].
//! - [`Error`]: one variant per thing a caller acts on.
//! - [`clock`]: a stopped clock for a service's own tests.
//!
//! The crate is also the `scheduler` command line (the `cli` feature, on
//! by default). The modules not shown here are its parts: public for the
//! binary, the tests and the benchmarks, not part of the library's API.

#[cfg(not(any(feature = "postgres", feature = "sqlite")))]
compile_error!(
    "scheduler needs a database: turn on its `postgres` feature, its `sqlite` one, or both"
);

#[doc(hidden)]
pub mod calendar;
#[cfg(feature = "cli")]
#[doc(hidden)]
pub mod cli;
pub mod clock;
#[doc(hidden)]
pub mod config;
#[doc(hidden)]
pub mod driver;
#[doc(hidden)]
pub mod embed;
#[doc(hidden)]
pub mod engine;
#[doc(hidden)]
pub mod error;
#[doc(hidden)]
pub mod fires;
#[doc(hidden)]
pub mod handler;
#[doc(hidden)]
pub mod period;
#[doc(hidden)]
pub mod schedule;
#[cfg(feature = "server")]
#[doc(hidden)]
pub mod serve;
#[doc(hidden)]
pub mod state;
#[doc(hidden)]
pub mod store;
#[doc(hidden)]
pub mod suggest;
#[doc(hidden)]
pub mod template;
#[doc(hidden)]
pub mod trace;

/// The versions of the crates whose types the API takes and gives, so a
/// service names the same `PgPool`, `Tz` and `DateTime`.
pub use {chrono, chrono_tz, serde_json, sqlx};

pub use config::ConfigError;
pub use config::after::OnRerun;
pub use config::code::CodeJob;
pub use config::{Missed, Retry};
pub use embed::{Builder, Handle, PERIODS_LIMIT, PeriodRun, RunOptions, Scheduler};
pub use engine::operate::{Adopted, Adoption};
pub use engine::overview::JobOverview;
pub use engine::view::{PeriodView, ShardView};
pub use error::Error;
pub use handler::{BoxFuture, Context, Failure, Handled, Transaction};
pub use period::{Covers, MAX_SHARDS, Shard, Unit};
pub use schedule::{DstRule, Gap, Repeat};
pub use state::{ClaimState, PeriodOutcome, Trigger};
pub use store::{Attempt, AttemptOutcome, ClaimRow, PeriodState};
pub use tokio_util::sync::CancellationToken;
