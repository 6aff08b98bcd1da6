//! A period-keyed cron scheduler.
//!
//! Every run of a job covers a *period* (`billing:2026-07`) that is claimed in
//! the database before any work starts, so overlapping fires, restarts,
//! reruns, replicas and double-started containers collapse into one execution
//! per period.
//!
//! The map of the crate:
//! - [`config`]: `jobs.toml` → validated [`config::Job`]s, errors with file:line:column;
//!   [`config::DatabaseUrl`], where the database is, its password never shown.
//! - [`schedule`]: cron + zone + DST rule → fire instants (pure);
//!   [`calendar`]: working days and active dates, which fires exist.
//! - [`fires`]: a job's fires as they run: moved off days off, jittered (pure).
//! - [`clock`]: the wall clock as the driver's loop reads it, stopped in tests.
//! - [`period`]: fire instant → period label, start and end; labels given by hand;
//!   [`period::PeriodKey`], the one way a key is made (pure).
//! - [`handler`]: the vocabulary of code jobs (async Rust functions): what a
//!   handler is given ([`handler::Context`], [`handler::Transaction`]) and
//!   answers ([`handler::Failure`]).
//! - [`state`]: the typed words of a period's life ([`state::ClaimState`],
//!   [`state::Trigger`]); text is made from them only where it is printed.
//! - [`template`]: `${VAR}` and `{placeholder}` strings; [`suggest`]: "did you mean …?".
//! - [`store`]: claims (one key or a batch), leases and attempts on SQLite or
//!   PostgreSQL; all SQL lives here, the claimable rule once per backend.
//! - [`engine`]: the one claim → run → record path every front end drives:
//!   which periods are due ([`engine::due`]), claims in batches, each action run
//!   with heartbeats and self-fencing ([`engine::heartbeat`]) under its own
//!   supervisor (forked by the process's one zygote: [`engine::supervision`]),
//!   `sql` actions committed in groups, outcomes reported as values; the
//!   one view of a period ([`engine::view`]) and the operator's actions
//!   ([`engine::operate`]) every front end shows and uses.
//! - [`driver`]: the scheduling loop every long-running front end drives
//!   ([`driver::Service`]): the timer, the `max_running` slots, the scan
//!   beside the timer, catch-up, reload and the gauges; each loop's
//!   [`driver::health::Health`], which the probes report.
//! - [`serve`]: the HTTP side of `scheduler serve`, beside the driver's loop
//!   ([`serve::listen`]); [`serve::server`]: `/healthz`, `/readyz` and
//!   `/metrics`; [`serve::api`]: the HTTP API under `/v1/`.
//! - [`cli`]: the command line; [`cli::app`] runs a parsed command, [`cli::run`]
//!   is `scheduler run`, [`cli::check`] `check` and `next`, [`cli::inspect`]
//!   `status`, `history`, `release`, `pause`, `prune`.
//! - [`error`]: error kinds and exit codes.

pub mod calendar;
#[cfg(feature = "cli")]
pub mod cli;
pub mod clock;
pub mod config;
pub mod driver;
pub mod embed;
pub mod engine;
pub mod error;
pub mod fires;
pub mod handler;
pub mod period;
pub mod schedule;
#[cfg(feature = "server")]
pub mod serve;
pub mod state;
pub mod store;
pub mod suggest;
pub mod template;

/// The versions of the crates whose types the API takes and gives, so a
/// service names the same `PgPool`, `Tz` and `DateTime`.
pub use {chrono, chrono_tz, sqlx};

pub use config::ConfigError;
pub use config::after::OnRerun;
pub use config::code::CodeJob;
pub use config::{Missed, Retry};
pub use embed::{Builder, Handle, PeriodRun, RunOptions, Scheduler};
pub use engine::operate::{Adopted, Adoption};
pub use engine::overview::JobOverview;
pub use engine::view::PeriodView;
pub use error::Error;
pub use handler::{BoxFuture, Context, Failure, Handled, Transaction};
pub use period::{Covers, Unit};
pub use schedule::{DstRule, Gap, Repeat};
pub use state::{ClaimState, PeriodOutcome, Trigger};
pub use store::{Attempt, AttemptOutcome, ClaimRow, PeriodState};
pub use tokio_util::sync::CancellationToken;
