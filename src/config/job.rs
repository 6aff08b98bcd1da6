//! A validated job: when it fires, what a fire covers, what it does and
//! what becomes of its failures; its definition's fingerprint.

#[cfg(feature = "config-file")]
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use serde::Deserialize;

use super::{after, environment};
use crate::fires::{FireRules, Timing};
use crate::period::PeriodRule;
use crate::schedule::Schedule;
use crate::template::{Secrets, Template};

/// What to do with periods missed while nothing ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Missed {
    /// Run every missed period within the catch-up window.
    #[default]
    All,
    /// Run only the newest missed period.
    Latest,
    /// Run none of them.
    Skip,
}

/// Retry policy for failures a run reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Retry {
    /// Attempts in all, the first included (1 = no retry).
    pub attempts: u32,
    /// Wait after the first failure; doubled after each further one.
    pub backoff: Duration,
    /// The longest wait.
    pub max_backoff: Duration,
}

impl Retry {
    /// The wait before the next attempt after `failures` failures, or `None`
    /// when the budget is spent.
    pub fn backoff_after(&self, failures: u32) -> Option<Duration> {
        if failures >= self.attempts {
            return None;
        }
        let factor = 2u32.saturating_pow(failures.saturating_sub(1));
        Some(self.backoff.saturating_mul(factor).min(self.max_backoff))
    }
}

/// How a `command` or `shell` action starts its process.
#[derive(Debug, Clone)]
pub enum Program {
    /// Executed directly, no shell.
    Command(Vec<Template>),
    /// Run by `/bin/sh -c`.
    Shell(Template),
}

/// A child process.
#[derive(Debug, Clone)]
pub struct ProcessAction {
    /// What to execute.
    pub program: Program,
    /// Working directory.
    pub workdir: Option<Template>,
    /// Extra environment variables.
    pub env: Vec<(String, Template)>,
    /// What it inherits of the scheduler's environment.
    pub inherit: environment::Inherit,
}

/// An HTTP request carrying `Idempotency-Key`.
#[derive(Debug, Clone)]
pub struct HttpAction {
    /// The address.
    pub url: Template,
    /// GET, POST, …
    pub method: String,
    /// Extra headers.
    pub headers: Vec<(String, Template)>,
    /// Request body.
    pub body: Option<Template>,
    /// Request timeout.
    pub timeout: Duration,
}

/// A job's one action. The larger ones are boxed, so that a job of the
/// small ones (`sql`, above all, 10,000 of which are one burst) is 100
/// bytes smaller.
#[derive(Debug, Clone)]
pub enum Action {
    /// A child process.
    Process(Box<ProcessAction>),
    /// An HTTP request carrying `Idempotency-Key`.
    Http(Box<HttpAction>),
    /// An async function of the embedding program (a code job of the
    /// library).
    Code(crate::handler::Handler),
    /// A statement run in the transaction that marks the claim succeeded.
    Sql {
        /// With `$1`, `$2`, … for the params.
        statement: String,
        /// Bound, never spliced.
        params: Vec<Template>,
    },
}

impl Action {
    /// Everything it does, values included: only for the definition
    /// fingerprint.
    fn exact(&self) -> String {
        let t = Template::exact;
        let pairs = |pairs: &[(String, Template)]| -> Vec<(String, String)> {
            pairs.iter().map(|(k, v)| (k.clone(), t(v))).collect()
        };
        match self {
            Action::Process(process) => {
                let program = match &process.program {
                    Program::Command(args) => {
                        format!("command {:?}", args.iter().map(t).collect::<Vec<_>>())
                    }
                    Program::Shell(script) => format!("shell {:?}", t(script)),
                };
                let mut text = format!(
                    "{program} {:?} {:?}",
                    process.workdir.as_ref().map(t),
                    pairs(&process.env)
                );
                // Only where given, so that older definitions keep their
                // fingerprints.
                if let Some(only) = &process.inherit.only {
                    text.push_str(&format!(" inherit {only:?}"));
                }
                text
            }
            Action::Http(http) => format!(
                "http {} {:?} {:?} {:?} {:?}",
                http.method,
                t(&http.url),
                pairs(&http.headers),
                http.body.as_ref().map(t),
                http.timeout
            ),
            Action::Sql { statement, params } => format!(
                "sql {statement:?} {:?}",
                params.iter().map(t).collect::<Vec<_>>()
            ),
            Action::Code(handler) => format!("code {handler:?}"),
        }
    }

    /// The values `${NAME}` put into it.
    fn secrets(&self) -> Secrets {
        match self {
            Action::Process(process) => {
                let program: Vec<&Template> = match &process.program {
                    Program::Command(args) => args.iter().collect(),
                    Program::Shell(script) => vec![script],
                };
                Secrets::of(
                    program
                        .into_iter()
                        .chain(&process.workdir)
                        .chain(process.env.iter().map(|(_, v)| v)),
                )
            }
            Action::Http(http) => Secrets::of(
                std::iter::once(&http.url)
                    .chain(http.headers.iter().map(|(_, v)| v))
                    .chain(&http.body),
            ),
            Action::Sql { params, .. } => Secrets::of(params),
            Action::Code(_) => Secrets::default(),
        }
    }
}

/// A job's [`Job::definition`]: 12 hex digits, held in place (a `String`
/// would cost every job a heap block).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Fingerprint([u8; 12]);

impl Fingerprint {
    /// The first six bytes of the SHA-256 of `text`, as twelve hex digits.
    fn of(text: &str) -> Fingerprint {
        use sha2::Digest;
        let hash = sha2::Sha256::digest(text.as_bytes());
        let mut digits = [0; 12];
        // Six bytes make exactly twelve hex digits.
        let _ = hex::encode_to_slice(&hash[..6], &mut digits);
        Fingerprint(digits)
    }

    /// The digits.
    pub fn as_str(&self) -> &str {
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A validated job.
#[derive(Debug, Clone)]
pub struct Job {
    /// `[a-z0-9][a-z0-9_-]{0,62}` as written, unique; under a namespace,
    /// `NAMESPACE/NAME`. Shared: the service's tables of each job (what it
    /// owes, its overdue periods, its periods waiting for a slot) key on
    /// it, and a clone costs no copy.
    pub name: Arc<str>,
    /// When it fires.
    pub schedule: Schedule,
    /// What a fire covers.
    pub period: PeriodRule,
    /// What it does.
    pub action: Action,
    /// How it runs, retries, is kept and judged: one value shared by the
    /// jobs of a file that set the same.
    pub policy: Arc<Policy>,
    /// The upstream periods each of its periods waits for. Shared: most
    /// jobs wait for nothing, and hold one empty value between them.
    pub after: Arc<after::After>,
    /// A fingerprint of what it does and when (schedule, zone, period
    /// rule, action after `${VAR}` expansion): 12 hex digits of a SHA-256,
    /// recorded on every attempt, so `history` shows where it changed. A
    /// hash, never the values themselves.
    pub definition: Fingerprint,
    /// A fingerprint of when it fires (schedule, zone, daylight-saving
    /// rule, period rule, active dates, calendars, jitter), recorded with
    /// its sighting: a change of it is a new sighting of its fires
    /// ([`Job::owed_after_change`]).
    pub when: Fingerprint,
    /// The values `${NAME}` put into its action, masked in every message
    /// about it.
    pub secrets: Secrets,
}

/// How a job runs, retries, is kept and judged. Most jobs of a large file
/// set the same, so a file's jobs share one value per distinct policy:
/// 100,000 jobs hold a few, not 100,000 copies of 176 bytes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Policy {
    /// How its fires move to working days and are delayed (which fires
    /// exist at all is the schedule's: its active window, a skipping
    /// calendar).
    pub fires: FireRules,
    /// Killed and counted failed past this.
    pub timeout: Option<Duration>,
    /// Periods (shards, for a sharded job) of this job running at once,
    /// across all replicas.
    pub concurrency: u32,
    /// How many shards each of its periods is split into: 1, not split,
    /// or 2 to [`MAX_SHARDS`](crate::period::MAX_SHARDS), each claimed,
    /// run and recorded on its own.
    pub shards: u32,
    /// What happens to periods missed while nothing ran.
    pub missed: Missed,
    /// Retries of reported failures.
    pub retry: Retry,
    /// Finished claims older than this may be pruned.
    pub keep: Option<Duration>,
    /// The most of each attempt's output kept whole: its first half and
    /// its last half, the middle told as left out.
    pub output_max: u64,
    /// Each attempt's whole output is deleted this long after it was
    /// written (its attempt stays, with its tail); `None`: with its claim.
    pub keep_output: Option<Duration>,
    /// A period must have succeeded this long after its fire, or it is
    /// late.
    pub deadline: Option<Duration>,
    /// How far back missed periods are owed: `[scheduler].catch_up`,
    /// copied here so that the one rule of what a job owes
    /// ([`Job::owed_since`]) needs nothing but the job.
    pub catch_up: Duration,
}

/// The distinct policies of the jobs read so far, each held once: a file's
/// (code jobs are few, and each holds its own).
#[cfg(feature = "config-file")]
#[derive(Debug, Default)]
pub(super) struct Policies(HashSet<Arc<Policy>>);

#[cfg(feature = "config-file")]
impl Policies {
    /// The policy held equal to `policy`, held now if there is none.
    pub(super) fn share(&mut self, policy: &Arc<Policy>) -> Arc<Policy> {
        if let Some(held) = self.0.get(policy) {
            return held.clone();
        }
        self.0.insert(policy.clone());
        policy.clone()
    }
}

impl Job {
    /// Whether its periods run in an `sql` group: an `sql` statement, or
    /// a code job's transaction-scoped handler.
    pub fn is_sql(&self) -> bool {
        matches!(
            self.action,
            Action::Sql { .. } | Action::Code(crate::handler::Handler::Transaction(_))
        )
    }

    /// Its fires as they run: the one answer to when a period is due.
    pub fn timing(&self) -> Timing<'_> {
        Timing::new(&self.name, &self.schedule, &self.period, &self.policy.fires)
    }

    /// The instant from which the job's fires are owed, given when a
    /// `serve` or `run JOB` first saw it (docs/commands.md): the latest fire at
    /// that sighting if it lies within `catch_up` of it (a platform cron
    /// container starts minutes after its fire: that fire is why it
    /// started), else the sighting itself. A fire before this instant is
    /// *before first seen*: no mode runs it on its own, no view counts it
    /// as missed, late or waiting. One rule for the timer, the scan, a
    /// reload, a resume, `run JOB`, `--dry-run` and every view.
    pub fn owed_since(&self, first_seen: DateTime<Utc>) -> DateTime<Utc> {
        let window = TimeDelta::from_std(self.policy.catch_up).unwrap_or(TimeDelta::MAX);
        self.timing()
            .latest(first_seen)
            .map(|fire| fire.at)
            .filter(|at| first_seen - *at <= window)
            .map_or(first_seen, |at| at.min(first_seen))
    }

    /// The start of the first period the job owes when it owes its fires
    /// from `owed_from`: that of its first fire at or after it.
    pub fn owed_period(&self, owed_from: DateTime<Utc>) -> DateTime<Utc> {
        let timing = self.timing();
        timing
            .next(owed_from - TimeDelta::nanoseconds(1))
            .map_or(owed_from, |fire| timing.period_of(&fire).start)
    }

    /// From when the job owes its fires once its timing changed, having
    /// owed them from `before` and its periods from the one starting at
    /// `before_period` (`None`: as `before` has it), with `newest` the
    /// newest fire a scheduler claimed for it (docs/commands.md, "One
    /// period, one meaning"): the new timing's fires after the newest one
    /// claimed, never one before `before` — as if the new timing had been
    /// in force since the job last ran. A fire the new schedule would have
    /// made at or before the newest claimed never happened, and a fire both
    /// timings make that was owed and not run stays owed. A job of periods
    /// longer than a fire also keeps owing the periods it owed and has not
    /// run — from the one after the newest claimed, and not before
    /// `before_period` — wherever the change moved their fires: a monthly
    /// job moved from the 20th to the 1st on the 6th still owes the month
    /// its 20th would have run.
    pub fn owed_after_change(
        &self,
        before: DateTime<Utc>,
        before_period: Option<DateTime<Utc>>,
        newest: Option<DateTime<Utc>>,
    ) -> DateTime<Utc> {
        // A millisecond, not a nanosecond: the instant is stored, and
        // SQLite keeps milliseconds.
        let after_newest = newest.map(|n| n + TimeDelta::milliseconds(1));
        let owed = after_newest.map_or(before, |after| after.max(before));
        if self.period.unit == crate::period::Unit::Fire {
            return owed;
        }
        let mut from = before_period.unwrap_or_else(|| self.owed_period(before));
        if let Some(newest) = newest {
            let timing = self.timing();
            let ran = timing.period_of(&crate::fires::Fire {
                nominal: newest,
                at: newest,
            });
            from = from.max(self.period.following(&self.schedule, &ran).start);
        }
        self.fire_of_first_period_from(from)
            .map_or(owed, |carried| carried.min(owed))
    }

    /// The fire of the first period starting at or after `start` that a
    /// fire covers, looked for over a thousand periods.
    fn fire_of_first_period_from(&self, start: DateTime<Utc>) -> Option<DateTime<Utc>> {
        let timing = self.timing();
        let mut period = self.period.period_of(&self.schedule, start);
        for _ in 0..1000 {
            if period.start >= start
                && let Some(fire) = timing.of(&period)
            {
                return Some(fire);
            }
            period = self.period.following(&self.schedule, &period);
        }
        None
    }

    /// Computes [`Job::definition`] from the rest.
    fn fingerprint(&self) -> Fingerprint {
        let text = format!(
            "{}\n{}\n{:?}\n{}{}{}",
            self.schedule.source(),
            self.schedule.zone().name(),
            self.period,
            self.action.exact(),
            self.fire_rules_text(),
            // Only where set: an unsharded job keeps the fingerprint it had.
            if self.policy.shards > 1 {
                format!("\nshards {}", self.policy.shards)
            } else {
                String::new()
            }
        );
        Fingerprint::of(&text)
    }

    /// Computes [`Job::when`] from the rest.
    fn when_fingerprint(&self) -> Fingerprint {
        let text = format!(
            "{}\n{}\n{:?}\n{:?}{}",
            self.schedule.source(),
            self.schedule.zone().name(),
            self.schedule.dst(),
            self.period,
            self.fire_rules_text()
        );
        Fingerprint::of(&text)
    }

    /// Which fires exist and when they run, as fingerprints read them:
    /// only where set, so a job without them keeps the fingerprint it had.
    fn fire_rules_text(&self) -> String {
        let calendar = |c: &crate::calendar::Calendar| {
            let holidays: Vec<String> = c.holidays().map(|d| d.to_string()).collect();
            format!("{} {:?} {}", c.name, c.weekdays(), holidays.join(","))
        };
        let mut text = String::new();
        if let Some(days) = self.schedule.days() {
            let working = days.working.as_deref().map(calendar);
            text += &format!("\n{:?} {:?} {working:?}", days.from, days.until);
        }
        if let Some(shift) = &self.policy.fires.shift {
            text += &format!("\n{} {}", shift.to, calendar(&shift.calendar));
        }
        if let Some(jitter) = self.policy.fires.jitter {
            text += &format!("\njitter {}", jitter.as_secs());
        }
        text
    }

    /// Fills in what is derived from the rest: [`Job::definition`],
    /// [`Job::when`] and [`Job::secrets`].
    pub(crate) fn derive(&mut self) {
        self.definition = self.fingerprint();
        self.when = self.when_fingerprint();
        self.secrets = self.action.secrets();
    }
}
