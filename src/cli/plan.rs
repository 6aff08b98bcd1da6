//! A command line made into one checked plan before any database is
//! opened: every job name looked up, every label parsed once, and every
//! flag that does not fit refused here, in the words of the flags.

use std::net::SocketAddr;

use chrono::{DateTime, Utc};

use crate::cli::inspect::{RANGE_LIMIT, Shown};
use crate::cli::{After, Command, RunArgs, run};
use crate::config::{Config, ConfigError};
use crate::engine::manual::{self, Names, Request};
use crate::engine::operate::{self, AdoptNames, Adoption};
use crate::error::Error;
use crate::period::{Period, PeriodKey};

/// What a command line asks for, checked against the configuration.
#[derive(Debug)]
pub enum Plan {
    /// `check [--strict]`.
    Check {
        /// Refuse a `${VAR}` left unset.
        strict: bool,
    },
    /// `next JOB`.
    Next {
        /// The job.
        job: String,
        /// How many fires.
        count: u32,
        /// After when, if not now.
        after: Option<After>,
    },
    /// `run`: the engine's request, checked.
    Run {
        /// The request.
        request: Box<Request>,
        /// One JSON object per line.
        json: bool,
    },
    /// `serve`.
    Serve {
        /// Where the probes, metrics and API listen.
        listen: Option<SocketAddr>,
    },
    /// `migrate`.
    Migrate,
    /// `status [JOB]`.
    Status {
        /// Only this job.
        job: Option<String>,
        /// One JSON object per job.
        json: bool,
    },
    /// `status JOB --from A --to B`.
    Range {
        /// The job.
        job: String,
        /// The periods of the range.
        periods: Vec<Period>,
        /// One JSON object per period.
        json: bool,
    },
    /// `history JOB [--period LABEL]`.
    History {
        /// The job, as given (it may be gone from jobs.toml).
        job: String,
        /// The period, if one was named, and its key.
        period: Option<(PeriodKey, Period)>,
        /// How many, and how.
        shown: Shown,
    },
    /// `logs JOB --period LABEL [--shard K] [--attempt N] [--follow] [--stream S]`.
    Logs {
        /// The job.
        job: String,
        /// The period.
        period: Period,
        /// Its shard, if given.
        shard: Option<u32>,
        /// What else was asked (its key is worked out once the database
        /// says how the period was split).
        asked: super::logs::Asked,
    },
    /// `release JOB --period LABEL`.
    Release {
        /// The job.
        job: String,
        /// The period.
        period: Period,
        /// One shard of it.
        shard: Option<u32>,
    },
    /// `adopt JOB --through L` or `--from A --to B`.
    Adopt {
        /// The job.
        job: String,
        /// The labels, checked against the job's periods by the adoption.
        which: Adopting,
    },
    /// `pause JOB` (`paused`) or `resume JOB`.
    Pause {
        /// The job.
        job: String,
        /// Paused, or resumed.
        paused: bool,
    },
    /// `prune [--dry-run]`.
    Prune {
        /// Only say what would go.
        dry_run: bool,
    },
}

/// The periods an `adopt` names.
#[derive(Debug)]
pub enum Adopting {
    /// Every owed period up to this label.
    Through(String),
    /// From one label to another, both included.
    Range(String, String),
}

impl Adopting {
    /// What `adopt` needs to be given.
    const ASKED: &str = "adopt: give --through LABEL, or --from and --to";

    /// The adoption it names.
    pub fn borrowed(&self) -> Adoption<'_> {
        match self {
            Adopting::Through(through) => Adoption::Through(through),
            Adopting::Range(from, to) => Adoption::Range(from, to),
        }
    }
}

impl Plan {
    /// The plan of `command`, or why it cannot run. A `run` makes the
    /// jobs it runs complete (their `${VAR}`s, refused when unset).
    pub fn of(
        command: Command,
        config: &mut Config,
        unset: &[ConfigError],
        now: DateTime<Utc>,
    ) -> Result<Plan, Error> {
        Ok(match command {
            Command::Check { strict } => Plan::Check { strict },
            Command::Next { job, count, after } => Plan::Next {
                job: known(job, config)?,
                count,
                after,
            },
            Command::Run(args) => Plan::run(&args, config, unset, now)?,
            Command::Serve { listen } => Plan::Serve { listen },
            Command::Migrate => Plan::Migrate,
            Command::Status {
                job,
                from,
                to,
                json,
            } => Plan::status(job, from.zip(to), json, config)?,
            Command::History {
                job,
                period,
                limit,
                output,
                json,
            } => {
                let shown = Shown {
                    limit,
                    output,
                    json,
                };
                Plan::history(job, period.as_deref(), shown, config)?
            }
            Command::Logs(asked) => Plan::logs(asked, config)?,
            Command::Release { job, period, shard } => {
                let period = manual::parse_label(config.job(&job)?, &period, Names::FLAGS.period)?;
                Plan::Release { job, period, shard }
            }
            Command::Adopt {
                job,
                through,
                from,
                to,
            } => {
                let which = match (through, from, to) {
                    (Some(through), _, _) => Adopting::Through(through),
                    (None, Some(from), Some(to)) => Adopting::Range(from, to),
                    _ => return Err(Error::Usage(Adopting::ASKED.into())),
                };
                operate::check_adoption(
                    config.job(&job)?,
                    which.borrowed(),
                    now,
                    AdoptNames::FLAGS,
                )?;
                Plan::Adopt { job, which }
            }
            Command::Pause { job } => Plan::Pause {
                job: known(job, config)?,
                paused: true,
            },
            Command::Resume { job } => Plan::Pause {
                job: known(job, config)?,
                paused: false,
            },
            Command::Prune { dry_run } => Plan::Prune { dry_run },
            // Answered before a jobs file is read.
            Command::Completions { .. } | Command::Man | Command::Health { .. } => {
                return Err(Error::Usage("this command reads no jobs file".into()));
            }
        })
    }

    /// `run`: its request, checked; the jobs it runs made complete (only
    /// they need every `${VAR}` of theirs).
    fn run(
        args: &RunArgs,
        config: &mut Config,
        unset: &[ConfigError],
        now: DateTime<Utc>,
    ) -> Result<Plan, Error> {
        match &args.job {
            Some(name) => config.complete(&config.job(name)?.name, unset)?,
            None => {
                for job in &config.jobs {
                    config.complete(&job.name, unset)?;
                }
            }
        }
        let request = run::request(args);
        manual::check(config, &request, now)?;
        Ok(Plan::Run {
            request: Box::new(request),
            json: args.json,
        })
    }

    /// `status [JOB]`, or `status JOB --from A --to B`.
    fn status(
        job: Option<String>,
        range: Option<(String, String)>,
        json: bool,
        config: &Config,
    ) -> Result<Plan, Error> {
        let Some(job) = job else {
            return Ok(Plan::Status { job, json });
        };
        let defined = config.job(&job)?;
        Ok(match range {
            Some((from, to)) => {
                let periods =
                    manual::periods_between(defined, (&from, &to), RANGE_LIMIT, Names::FLAGS)?;
                Plan::Range { job, periods, json }
            }
            None => Plan::Status {
                job: Some(job),
                json,
            },
        })
    }

    /// `logs JOB --period LABEL …`.
    fn logs(asked: super::LogsArgs, config: &Config) -> Result<Plan, Error> {
        let defined = config.job(&asked.job)?;
        let period = manual::parse_label(defined, &asked.period, Names::FLAGS.period)?;
        Ok(Plan::Logs {
            job: defined.name.to_string(),
            asked: super::logs::Asked {
                key: PeriodKey::new(&defined.name, &period.label).to_string(),
                attempt: asked.attempt,
                follow: asked.follow,
                stream: asked
                    .stream
                    .as_deref()
                    .and_then(crate::state::Stream::parse),
            },
            period,
            shard: asked.shard,
        })
    }

    /// `history JOB [--period LABEL]`.
    fn history(
        job: String,
        label: Option<&str>,
        shown: Shown,
        config: &Config,
    ) -> Result<Plan, Error> {
        let defined = config.job(&job)?;
        let period = match label {
            Some(label) => {
                let period = manual::parse_label(defined, label, Names::FLAGS.period)?;
                Some((PeriodKey::new(&defined.name, &period.label), period))
            }
            None => None,
        };
        Ok(Plan::History { job, period, shown })
    }

    /// Whether it runs jobs' actions (`run`, `serve`).
    pub fn runs_actions(&self) -> bool {
        matches!(self, Plan::Run { .. } | Plan::Serve { .. })
    }

    /// Whether it may create the database: what runs actions, `migrate`,
    /// and `adopt`, the step before a job's first run when it moves from
    /// another scheduler, which may be the first thing to touch it.
    pub fn creates(&self) -> bool {
        self.runs_actions() || matches!(self, Plan::Migrate | Plan::Adopt { .. })
    }
}

/// `job`, if the configuration has it.
fn known(job: String, config: &Config) -> Result<String, Error> {
    config.job(&job)?;
    Ok(job)
}
