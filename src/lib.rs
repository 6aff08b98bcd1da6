//! A period-keyed cron scheduler.
//!
//! Every run of a job covers a *period* (`billing:2026-07`) that is claimed in
//! the database before any work starts, so overlapping fires, restarts,
//! reruns, replicas and double-started containers collapse into one execution
//! per period.
//!
//! The map of the crate:
//! - [`config`]: `jobs.toml` → validated [`config::Job`]s, errors with file:line:column.
//! - [`schedule`]: cron + zone + DST rule → fire instants (pure).
//! - [`period`]: fire instant → period label, start and end; labels given by hand (pure).
//! - [`template`]: `${VAR}` and `{placeholder}` strings; [`suggest`]: "did you mean …?".
//! - [`cli`]: the command line; [`app`] runs a parsed command.
//! - [`check`]: `check` and `next`.
//! - [`store`]: claims, leases and attempts on SQLite or PostgreSQL (all SQL lives here).
//! - [`due`]: which periods are due at an instant (shared by `run` and `serve`).
//! - [`runner`]: claims a period and runs its action with heartbeats and self-fencing
//!   ([`heartbeat`]), each job under its own supervisor ([`runner::supervisor`]), and records it.
//! - [`oneshot`]: `run`; [`inspect`]: `status`, `history`, `release`, `pause`, `prune`.
//! - [`scheduler`]: `serve`, the timer loop and the scan; [`server`]: `/healthz` and `/metrics`.
//! - [`reaper`]: reaps orphans when running as PID 1.
//! - [`error`]: error kinds and exit codes.

pub mod app;
pub mod check;
pub mod cli;
pub mod config;
pub mod due;
pub mod error;
pub mod heartbeat;
pub mod inspect;
pub mod oneshot;
pub mod period;
pub mod reaper;
pub mod runner;
pub mod schedule;
pub mod scheduler;
pub mod server;
pub mod store;
pub mod suggest;
pub mod template;
