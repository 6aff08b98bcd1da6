//! The command line: clap's definitions here, and one module per command
//! family that turns parsed flags into calls of the engine and the store.

pub mod app;
pub mod check;
pub mod inspect;
pub mod logs;
pub mod man;
pub mod plan;
pub mod run;

use std::net::SocketAddr;
use std::path::PathBuf;

use chrono::{DateTime, NaiveDate, NaiveDateTime, Utc};
use chrono_tz::Tz;
use clap::{Args, Parser, Subcommand, ValueEnum};

/// The exit code of a command that failed: 2 for what the user asked for
/// (a flag, a label, a job, the configuration), 3 for the database and the
/// environment.
pub fn exit_code(e: &crate::error::Error) -> u8 {
    use crate::error::Error;
    match e {
        Error::Database(_) | Error::Environment(_) => 3,
        _ => 2,
    }
}

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
        /// Serve the probes (/healthz, /readyz), Prometheus /metrics and the
        /// HTTP API (/v1/, with `[api]` in jobs.toml) on this address, an IP
        /// and a port: 127.0.0.1:9090, or 0.0.0.0:9090 for every interface.
        #[arg(long, value_name = "IP:PORT", value_parser = listen_address)]
        listen: Option<SocketAddr>,
    },
    /// Claim and run due periods once, or backfill periods by hand.
    Run(RunArgs),
    /// Validate jobs.toml and list each job with its next fire.
    Check {
        /// Treat unset `${VAR}`s as errors (exit 2) instead of warnings.
        #[arg(long)]
        strict: bool,
    },
    /// The next fire times of a job with their period keys.
    Next {
        /// The job.
        job: String,
        /// How many.
        #[arg(short = 'n', default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=10_000))]
        count: u32,
        /// Start after this instead of now: an RFC 3339 instant, or a date
        /// (midnight) or date-time without offset in the job's zone.
        #[arg(long, value_parser = parse_after)]
        after: Option<After>,
    },
    /// Per job: recent periods, running claims, failures and overdue periods.
    Status {
        /// Only this job (with every overdue period listed).
        job: Option<String>,
        /// With --to: one line per period of the range.
        #[arg(long, requires_all = ["to", "job"])]
        from: Option<String>,
        /// The end of the range, inclusive.
        #[arg(long, requires = "from")]
        to: Option<String>,
        /// One JSON object per job (or per period of a range).
        #[arg(long)]
        json: bool,
    },
    /// A job's attempts, newest first.
    History {
        /// The job.
        job: String,
        /// Only this period's attempts (a label such as 2026-07).
        #[arg(long)]
        period: Option<String>,
        /// Show each attempt's kept output (the last 4 KiB).
        #[arg(long)]
        output: bool,
        /// How many attempts.
        #[arg(long, default_value_t = 20)]
        limit: u32,
        /// One JSON object per line.
        #[arg(long)]
        json: bool,
    },
    /// An attempt's whole output (its head and tail within the job's
    /// `output_max`), from any replica; `--follow` tails a running one.
    Logs(LogsArgs),
    /// End a stuck running claim now so it can be taken again.
    Release {
        /// The job.
        job: String,
        /// The period label.
        #[arg(long)]
        period: String,
        /// Only this shard (from 0) of a period split into shards; without
        /// it, every running shard of the period.
        #[arg(long, value_name = "K")]
        shard: Option<u32>,
    },
    /// Record periods an earlier system (cron, a CronJob) already ran as
    /// `adopted`: never run here, succeeded for `after`. Refused for a
    /// period that has a claim, or is not due; nothing is written then.
    #[command(group(clap::ArgGroup::new("which").required(true).args(["through", "from"])))]
    Adopt {
        /// The job.
        job: String,
        /// Every period through this label that the scheduler would take
        /// on its own now (what the job owes within catch_up), and this
        /// one; older ones need --from/--to.
        #[arg(long, conflicts_with_all = ["from", "to"])]
        through: Option<String>,
        /// The first period of a range to adopt, inclusive.
        #[arg(long, requires = "to")]
        from: Option<String>,
        /// The last period of the range, inclusive.
        #[arg(long, requires = "from")]
        to: Option<String>,
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
    /// Apply database migrations, saying which.
    Migrate,
    /// Delete finished claims older than each job's `keep`, and
    /// Idempotency-Keys past `[api].key_ttl`.
    Prune {
        /// Count what would be deleted; delete nothing.
        #[arg(long)]
        dry_run: bool,
    },
    /// Print shell completions: `scheduler completions bash > /etc/bash_completion.d/scheduler`.
    Completions {
        /// The shell.
        shell: clap_complete::Shell,
    },
    /// Print the man page (roff): `scheduler man | man -l -`.
    Man,
    /// Ask a running `serve --listen` for its health: exit 0 on 200, 1 on
    /// another status, 3 when nothing answers (a container's HEALTHCHECK;
    /// the image has no curl).
    Health {
        /// The probe to ask.
        #[arg(long, default_value = "http://127.0.0.1:9090/healthz")]
        url: String,
    },
}

/// `scheduler run`: a job, or `--all` (a missing one names both).
#[derive(Debug, Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["job", "all"])))]
pub struct RunArgs {
    /// The job to run.
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
    /// Also re-run periods that already succeeded (with --period or
    /// --from/--to).
    #[arg(long)]
    pub force: bool,
    /// Also run a period that is not yet due (its fire is still ahead),
    /// which turns its scheduled run into a no-op.
    #[arg(long)]
    pub early: bool,
    /// Print what would be claimed and why; claim nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Wait for a period held by a live claim elsewhere, or for a free
    /// concurrency slot, and report the outcome.
    #[arg(long)]
    pub wait: bool,
    /// First run, in dependency order, the periods of the jobs named in
    /// `after` that the asked periods need and that have not succeeded
    /// (with --period or --from/--to).
    #[arg(long)]
    pub with_upstream: bool,
    /// Run only the periods whose latest attempt failed (with --period or
    /// --from/--to); never-claimed and succeeded ones are passed over.
    #[arg(long, conflicts_with = "force")]
    pub only_failed: bool,
    /// Only this shard (from 0) of each period, of a job with `shards`.
    #[arg(long, value_name = "K", conflicts_with = "all")]
    pub shard: Option<u32>,
    /// One JSON object per line.
    #[arg(long)]
    pub json: bool,
}

/// `next --after`: an instant, or a wall-clock time read in the job's zone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum After {
    /// An RFC 3339 instant.
    Instant(DateTime<Utc>),
    /// A date (at midnight) or date-time without an offset.
    Local(NaiveDateTime),
}

impl After {
    /// The instant this names in `zone`.
    pub fn resolve(self, zone: Tz) -> DateTime<Utc> {
        match self {
            After::Instant(t) => t,
            After::Local(wall) => crate::schedule::earliest_instant(zone, wall),
        }
    }
}

fn parse_after(s: &str) -> Result<After, String> {
    if let Ok(t) = s.parse::<DateTime<chrono::FixedOffset>>() {
        return Ok(After::Instant(t.to_utc()));
    }
    for format in [
        "%Y-%m-%dT%H:%M:%S",
        "%Y-%m-%dT%H:%M",
        "%Y-%m-%d %H:%M:%S",
        "%Y-%m-%d %H:%M",
    ] {
        if let Ok(wall) = NaiveDateTime::parse_from_str(s, format) {
            return Ok(After::Local(wall));
        }
    }
    if let Ok(date) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        return Ok(After::Local(date.and_time(chrono::NaiveTime::MIN)));
    }
    Err(format!(
        "expected an RFC 3339 instant (2026-10-25T00:00:00Z, 2026-10-25T02:00:00+02:00), or a date (2026-10-25) or date-time (2026-10-25T02:30) in the job's zone; got `{s}`"
    ))
}

/// `--listen`'s address: an IP and a port, with what to write instead of
/// the forms other servers take (`:9090`, `localhost:9090`).
fn listen_address(text: &str) -> Result<SocketAddr, String> {
    text.parse().map_err(|_| {
        let port = text.rsplit_once(':').map_or("9090", |(_, port)| port);
        format!(
            "`{text}` is not an IP address and a port; expected 127.0.0.1:{port} (this host only) or 0.0.0.0:{port} (every interface)"
        )
    })
}

/// `logs`'s arguments.
#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    /// The job.
    pub job: String,
    /// The period label (a label such as 2026-07).
    #[arg(long)]
    pub period: String,
    /// The attempt (the newest without it).
    #[arg(long)]
    pub attempt: Option<i32>,
    /// Tail it until it ends, then exit as it ended (1 for a failure).
    #[arg(long)]
    pub follow: bool,
    /// Only this stream.
    #[arg(long, value_parser = ["stdout", "stderr"])]
    pub stream: Option<String>,
    /// The shard (from 0), of a job whose periods are split into shards.
    #[arg(long, value_name = "K")]
    pub shard: Option<u32>,
}
