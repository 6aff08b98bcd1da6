//! The command line, as clap definitions only.

use std::net::SocketAddr;
use std::path::PathBuf;

use chrono::{DateTime, Utc};
use clap::{Args, Parser, Subcommand, ValueEnum};

/// A period-keyed cron scheduler: every period runs once, never twice, never
/// zero times.
#[derive(Debug, Parser)]
#[command(name = "scheduler", version, about)]
pub struct Cli {
    /// The jobs file.
    #[arg(
        long,
        global = true,
        env = "SCHEDULER_CONFIG",
        default_value = "jobs.toml"
    )]
    pub config: PathBuf,
    /// The database (`sqlite://FILE` or `postgres://…`); wins over
    /// `DATABASE_URL` and `[scheduler].database_url`.
    #[arg(long, global = true, env = "DATABASE_URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Log line format.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// More log output (repeat for more).
    #[arg(short, long, global = true, action = clap::ArgAction::Count, conflicts_with = "quiet")]
    pub verbose: u8,
    /// Only warnings and errors in the log.
    #[arg(short, long, global = true)]
    pub quiet: bool,
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// How log lines are written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the long-running scheduler.
    Serve {
        /// Serve /healthz and Prometheus /metrics on this address.
        #[arg(long)]
        listen: Option<SocketAddr>,
    },
    /// Claim and run due periods once, or backfill periods by hand.
    Run(RunArgs),
    /// Validate jobs.toml and list each job with its next fire.
    Check,
    /// The next fire times of a job with their period keys.
    Next {
        /// The job.
        job: String,
        /// How many.
        #[arg(short = 'n', default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        count: u32,
        /// Start after this RFC 3339 instant instead of now.
        #[arg(long)]
        after: Option<DateTime<Utc>>,
    },
    /// Per job: recent periods, running claims, failures and overdue periods.
    Status {
        /// Only this job.
        job: Option<String>,
        /// One JSON object per job.
        #[arg(long)]
        json: bool,
    },
    /// A job's attempts, newest first.
    History {
        /// The job.
        job: String,
        /// How many attempts.
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// End a stuck running claim now so it can be taken again.
    Release {
        /// The job.
        job: String,
        /// The period label.
        #[arg(long)]
        period: String,
    },
    /// Stop scheduling a job, on every replica.
    Pause {
        /// The job.
        job: String,
    },
    /// Restart scheduling of a paused job.
    Resume {
        /// The job.
        job: String,
    },
    /// Apply database migrations.
    Migrate,
    /// Delete finished claims older than each job's `keep`.
    Prune,
}

/// `scheduler run`.
#[derive(Debug, Args)]
pub struct RunArgs {
    /// The job to run.
    #[arg(required_unless_present = "all", conflicts_with = "all")]
    pub job: Option<String>,
    /// Every job in jobs.toml.
    #[arg(long)]
    pub all: bool,
    /// Backfill this one period (a label such as 2026-07).
    #[arg(long, conflicts_with_all = ["from", "all"])]
    pub period: Option<String>,
    /// Backfill from this period label, inclusive.
    #[arg(long, requires = "to", conflicts_with = "all")]
    pub from: Option<String>,
    /// Backfill up to this period label, inclusive.
    #[arg(long, requires = "from")]
    pub to: Option<String>,
    /// Also re-run periods that already succeeded.
    #[arg(long)]
    pub force: bool,
    /// Print what would be claimed and why; claim nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Wait for a period held by a live claim elsewhere and report its outcome.
    #[arg(long)]
    pub wait: bool,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
}
