//! Deadlines and notifications: which periods are late, failed for good or
//! recovered — found from the schedule and the database, not from a run,
//! so a period nobody ever tried is late all the same — and their delivery
//! to each `[[notify]]`, every (notifier, period, event) created once by
//! whichever replica sees it first and delivered by the one that takes it.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, Utc};
use serde_json::json;
use tokio::sync::watch;

use super::Engine;
use crate::config::notify::{Event, Format, Notifier};
use crate::config::{Config, Job};
use crate::error::Error;
use crate::period::{PeriodKey, utc_text};
use crate::store::{ClaimState, Delivery, FailedForGood, NewNotification, Tried};

/// How many late periods of a job one check tells of: the newest. A day
/// with every replica down is a day of late periods; past this many per
/// job, the older ones are told by `status` and the late gauge only.
pub const LATE_PER_JOB: usize = 100;

/// How many notifications one replica takes at a time.
const TAKE: u32 = 20;

/// How long one try may take.
const SEND_TIMEOUT: Duration = Duration::from_secs(10);

/// How long a notification is tried before it is given up.
const TRY_FOR: TimeDelta = TimeDelta::hours(24);

/// How often a replica looks for failed and recovered periods and delivers
/// what is due, when no deadline passed meanwhile.
const ROUND_EVERY: Duration = Duration::from_secs(15);

/// The longest wait between two tries.
const MOST_BACKOFF: Duration = Duration::from_secs(300);

/// How long the outcome of a send is tried to be written, as a run's is.
const WRITE_PATIENCE: Duration = Duration::from_secs(600);

/// How long a run outside `serve` spends delivering notifications.
pub const NOTIFY_AFTER_RUN: Duration = Duration::from_secs(10);

impl Engine {
    /// Creates the notifications of `jobs` that are due now: `late` for
    /// each period past its deadline and not succeeded (the newest
    /// [`LATE_PER_JOB`] of each job), `failed` for each failed for good
    /// within the catch-up window, `recovered` for each told late or failed
    /// that has succeeded since. A paused job is told of nothing. How many
    /// were new.
    /// With `checked` (the instant of this process's check before), only
    /// the deadlines passed since then are looked at for `late`; with
    /// `late` false, none (no deadline has passed since).
    pub async fn check_deadlines(
        &self,
        config: &Config,
        jobs: &[&Job],
        now: DateTime<Utc>,
        checked: Option<DateTime<Utc>>,
        late: bool,
    ) -> Result<u64, Error> {
        if config.notifiers.is_empty() {
            return Ok(0);
        }
        let failed = self
            .store()
            .failed_for_good(config.settings.catch_up)
            .await?;
        let recovered = self.recovered(config).await?;
        if !late && failed.is_empty() && recovered.is_empty() {
            // Most rounds: nothing failed or recovered, no deadline passed.
            return Ok(0);
        }
        let paused = self.store().paused_jobs().await?;
        let jobs: Vec<&Job> = jobs
            .iter()
            .copied()
            .filter(|job| !paused.iter().any(|p| *p == *job.name))
            .collect();
        let mut new = match late {
            true => self.late(config, &jobs, now, checked).await?,
            false => Vec::new(),
        };
        let by_name: HashMap<&str, &Job> = jobs.iter().map(|j| (j.name.as_ref(), *j)).collect();
        new.extend(failed_told(config, &by_name, failed));
        let mut made = self.store().notify_new(&new).await?;
        // Read again once the `late` and `failed` above exist: a period
        // caught up past its deadline (by `run` alone, say) is told `late`
        // and `recovered` in one check.
        let recovered = match made {
            0 => recovered,
            _ => self.recovered(config).await?,
        };
        let new = recovered_told(config, &by_name, recovered);
        made += self.store().notify_new(&new).await?;
        Ok(made)
    }

    /// The (notifier, job, period key) of each period told `late` or
    /// `failed` that has succeeded since and is not told `recovered` yet:
    /// a period split into shards once every shard has.
    async fn recovered(&self, config: &Config) -> Result<Vec<(String, String, String)>, Error> {
        let mut recovered = self.store().notify_recovered().await?;
        let sharded: HashMap<&str, &Job> = config
            .jobs
            .iter()
            .filter(|job| job.policy.shards > 1)
            .map(|job| (job.name.as_ref(), &**job))
            .collect();
        if sharded.is_empty() {
            return Ok(recovered);
        }
        let told = self.store().notify_unrecovered_unclaimed().await?;
        let periods: Vec<(&(String, String, String), crate::period::Period)> = told
            .iter()
            .filter_map(|told| {
                let job = sharded.get(told.1.as_str())?;
                let key = PeriodKey::of_stored(&told.2);
                let period = job.period.parse_label(&job.schedule, key.parts().1).ok()?;
                Some((told, period))
            })
            .collect();
        let asked: Vec<(&str, &crate::period::Period, u32)> = periods
            .iter()
            .map(|((_, job, _), period)| {
                (job.as_str(), period, sharded[job.as_str()].policy.shards)
            })
            .collect();
        let claims = super::shards::read(self.store(), &asked).await?;
        for ((told, _), claims) in periods.iter().zip(claims) {
            if claims
                .row
                .is_some_and(|row| row.state == ClaimState::Succeeded)
            {
                recovered.push((*told).clone());
            }
        }
        Ok(recovered)
    }

    /// The `late` notifications of `jobs`.
    async fn late(
        &self,
        config: &Config,
        jobs: &[&Job],
        now: DateTime<Utc>,
        checked: Option<DateTime<Utc>>,
    ) -> Result<Vec<NewNotification>, Error> {
        let told: Vec<&Job> = jobs
            .iter()
            .copied()
            .filter(|job| {
                config
                    .notifiers
                    .iter()
                    .any(|n| n.wants(Event::Late, &job.name))
            })
            .collect();
        let catch_up = config.settings.catch_up;
        let late = super::due::were_late(self.store(), &told, catch_up, now, checked).await?;
        let mut new = Vec::new();
        for job in told {
            let Some(periods) = late.get(&*job.name) else {
                continue;
            };
            let newest = &periods[periods.len().saturating_sub(LATE_PER_JOB)..];
            // Each told as the one period rule has it now, as `status`
            // and the API show it.
            let labelled: Vec<crate::period::Period> = newest
                .iter()
                .filter_map(|(key, _)| {
                    let (_, label) = key.split_once(':')?;
                    job.period.parse_label(&job.schedule, label).ok()
                })
                .collect();
            let views = super::view::periods(self.store(), job, &labelled, now).await?;
            for ((key, fire), view) in newest.iter().zip(&views) {
                let row = view.row.as_ref();
                // A period that failed with retries left is told with its
                // last failure, as `failed` is.
                let error = match row {
                    Some(row) if row.failures > 0 => self
                        .store()
                        .attempts(key, 1)
                        .await?
                        .into_iter()
                        .next()
                        .and_then(|attempt| attempt.error),
                    _ => None,
                };
                let deadline = job
                    .policy
                    .deadline
                    .and_then(|d| TimeDelta::from_std(d).ok())
                    .map(|d| *fire + d);
                let waiting_for = view.waiting_for();
                let told = Told {
                    job,
                    key,
                    label: &view.period.label,
                    state: view.state.as_str(),
                    waiting_for: waiting_for.as_deref(),
                    attempt: row.map(|r| r.attempt),
                    failures: row.map_or(0, |r| r.failures),
                    error: error.as_deref(),
                    deadline,
                    failed_shards: &[],
                };
                new.extend(told.to(&config.notifiers, Event::Late));
            }
        }
        Ok(new)
    }

    /// After a run asked for outside `serve` (`run`, the library's
    /// `run_*`), checks the deadlines of the jobs it ran (`job`, or every
    /// job) and delivers what is due, for [`NOTIFY_AFTER_RUN`] at most:
    /// a platform cron container alone is enough. What it could not
    /// deliver, the next run or `serve` delivers; a failure is logged,
    /// never the run's outcome.
    pub async fn notify_after_run(&self, config: &Config, job: Option<&str>) {
        if config.notifiers.is_empty() {
            return;
        }
        let jobs: Vec<&Job> = config
            .jobs
            .iter()
            .filter(|j| job.is_none_or(|name| config.full_name(name) == *j.name))
            .map(|j| &**j)
            .collect();
        // Nothing stops a run's delivery but its budget.
        let (_running, stop) = watch::channel(false);
        let work = async {
            self.check_deadlines(config, &jobs, self.now(), None, true)
                .await?;
            self.deliver(config, NOTIFY_AFTER_RUN, &stop).await
        };
        if let Err(e) = work.await {
            tracing::warn!("notifications: {e}; the next run or serve delivers them");
        }
    }

    /// Delivers what is due, a few at a time, for at most `budget`, and
    /// takes no more once `stop` turns true (a batch under way is sent and
    /// its outcome written): each notification taken for a lease, so that
    /// one whose replica went away is taken over. How many were delivered.
    pub async fn deliver(
        &self,
        config: &Config,
        budget: Duration,
        stop: &watch::Receiver<bool>,
    ) -> Result<usize, Error> {
        let until = tokio::time::Instant::now() + budget;
        // The lease covers the longest send and then the outcome's write
        // through an outage shorter than `lease`, as a run's does.
        let lease = SEND_TIMEOUT + config.settings.lease;
        let names: Vec<&str> = config.notifiers.iter().map(|n| n.name.as_str()).collect();
        let mut delivered = 0;
        // The earliest try to be made again within the budget: waited for.
        let mut again: Option<tokio::time::Instant> = None;
        while tokio::time::Instant::now() < until && !*stop.borrow() {
            // An expired delivery is left to its holder as an expired
            // claim is: it may still be writing how its send went.
            let expired = self.store().holding(config.settings.lease).is_none();
            let mut taken = self
                .store()
                .notify_take(self.owner(), lease, &names, TAKE, expired)
                .await?;
            // Oldest first (a period's `late` before its `recovered`), as
            // far as one replica's tries go: no order is promised across
            // tries and replicas.
            taken.sort_by_key(|d| d.created_at);
            if taken.is_empty() {
                match again.take().filter(|at| *at < until) {
                    Some(at) => {
                        let mut stop = stop.clone();
                        tokio::select! {
                            () = tokio::time::sleep_until(at) => continue,
                            _ = stop.wait_for(|stop| *stop) => break,
                        }
                    }
                    None => break,
                }
            }
            // Sent side by side, each within what is left of the budget:
            // a receiver that hangs holds the batch for that long at most.
            let left = until.saturating_duration_since(tokio::time::Instant::now());
            let sends = taken
                .iter()
                .map(|delivery| self.try_to_send(config, delivery, left));
            let tries = futures_util::future::join_all(sends).await;
            let mut outcomes = Vec::with_capacity(taken.len());
            for (delivery, tried) in taken.iter().zip(tries) {
                let tried = give_up_when_old(tried, delivery, self.now());
                if let Tried::Again(_, _, after) = &tried {
                    let at = tokio::time::Instant::now() + *after + Duration::from_millis(100);
                    again = Some(again.map_or(at, |earlier| earlier.min(at)));
                }
                log(delivery, &tried);
                delivered += usize::from(matches!(tried, Tried::Delivered(_)));
                outcomes.push((delivery, tried));
            }
            // One write for the batch: on SQLite each write waits for the
            // one writer, which a catch-up keeps busy.
            self.write_tried(&outcomes, config.settings.lease).await?;
        }
        Ok(delivered)
    }

    /// One try of `delivery`, within `left` of the budget.
    async fn try_to_send(&self, config: &Config, delivery: &Delivery, left: Duration) -> Tried {
        let notifier = config
            .notifiers
            .iter()
            .find(|n| n.name == delivery.notifier);
        match notifier {
            // Not tried for longer than tries last (its notifier
            // was out of jobs.toml, every replica was down): a day
            // late is too late to tell.
            _ if age(delivery, self.now())
                > TRY_FOR + TimeDelta::seconds(MOST_BACKOFF.as_secs() as i64) =>
            {
                Tried::GivenUp(
                    None,
                    "not sent within a day of its event (its notifier was out of jobs.toml, or no replica ran)".into(),
                )
            }
            Some(notifier) => {
                let timeout = SEND_TIMEOUT.min(left).max(Duration::from_millis(100));
                self.send(notifier, delivery, &config.secrets, timeout)
                    .await
            }
            // Taken only for the notifiers of `names`: none is
            // missing. Left pending for a reload that restores it.
            None => Tried::Again(
                None,
                "its notifier is not in jobs.toml".into(),
                MOST_BACKOFF,
            ),
        }
    }

    /// Writes how a batch's tries ended, waiting for a database that is
    /// away and trying again every half heartbeat interval (`lease`/6):
    /// what was sent is not sent again because its outcome could not be
    /// written. The row stays this replica's meanwhile (its lease covers an
    /// outage shorter than `lease`), and the try number fences a write
    /// that comes after a takeover.
    async fn write_tried(
        &self,
        outcomes: &[(&Delivery, Tried)],
        lease: Duration,
    ) -> Result<u64, Error> {
        let most = (lease / 6).max(Duration::from_millis(100));
        let mut delay = Duration::from_millis(100);
        let patience = tokio::time::Instant::now() + WRITE_PATIENCE;
        loop {
            match self.store().notify_tried(outcomes, self.owner()).await {
                Ok(written) => return Ok(written),
                Err(e) if tokio::time::Instant::now() < patience => {
                    tracing::warn!(
                        "cannot record how {} notification(s) went yet: {e}",
                        outcomes.len()
                    );
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(most);
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// One try of `delivery` to `notifier`: given up in a build without
    /// an HTTP client (its configuration refuses notifiers).
    #[cfg(not(feature = "http-actions"))]
    async fn send(
        &self,
        _notifier: &Notifier,
        _delivery: &Delivery,
        _secrets: &crate::template::Secrets,
        _timeout: Duration,
    ) -> Tried {
        Tried::GivenUp(None, crate::config::NO_HTTP.into())
    }

    /// One try of `delivery` to `notifier`.
    #[cfg(feature = "http-actions")]
    async fn send(
        &self,
        notifier: &Notifier,
        delivery: &Delivery,
        secrets: &crate::template::Secrets,
        timeout: Duration,
    ) -> Tried {
        let id = format!(
            "{}:{}:{}",
            delivery.notifier, delivery.period_key, delivery.event
        );
        let mut request = self
            .http
            .post(&notifier.url)
            .timeout(timeout)
            .header("content-type", "application/json")
            .header("idempotency-key", &id)
            .header("x-scheduler-event", &delivery.event)
            .body(delivery.payload.clone());
        if let Some(secret) = &notifier.secret {
            // The host's real time, whatever the engine's clock: the
            // receiver checks it against its own to refuse old replays.
            let at = Utc::now().timestamp().to_string();
            request = request.header("x-scheduler-timestamp", &at).header(
                "x-scheduler-signature",
                signature(secret, &at, &delivery.payload),
            );
        }
        let again = backoff(delivery.tries);
        match request.send().await {
            Ok(answer) => {
                let status = answer.status();
                let code = status.as_u16();
                if status.is_success() {
                    Tried::Delivered(code)
                } else if status.is_server_error() || code == 408 || code == 429 {
                    Tried::Again(Some(code), format!("the receiver answered {status}"), again)
                } else if status.is_redirection() {
                    // Tried again, as the URL may be put right by a reload
                    // within the day: a redirect is not followed (the body
                    // and its signature go to the configured origin only).
                    let to = answer
                        .headers()
                        .get(reqwest::header::LOCATION)
                        .and_then(|to| to.to_str().ok())
                        .map_or_else(|| "no Location".to_owned(), |to| secrets.mask(to));
                    Tried::Again(
                        Some(code),
                        format!(
                            "the receiver answered {status}, a redirect to {to}; redirects are not followed: point the notifier's url at the final address and reload"
                        ),
                        again,
                    )
                } else {
                    Tried::GivenUp(Some(code), format!("the receiver refused it: {status}"))
                }
            }
            Err(e) => Tried::Again(None, secrets.mask(&e.to_string()), again),
        }
    }
}

/// `sha256=` and the hex HMAC-SHA256 of `<timestamp>.<body>` under the
/// notifier's secret, as Stripe signs its webhooks: a receiver checks it,
/// and the timestamp's age, before it trusts the body.
pub fn signature(secret: &str, timestamp: &str, body: &str) -> String {
    use hmac::Mac;
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC takes a key of any length"));
    mac.update(timestamp.as_bytes());
    mac.update(b".");
    mac.update(body.as_bytes());
    format!("sha256={}", hex::encode(mac.finalize().into_bytes()))
}

/// The wait before try `tries + 1`: a second, doubled each try, at most
/// [`MOST_BACKOFF`].
#[cfg_attr(not(feature = "http-actions"), allow(dead_code))]
fn backoff(tries: i32) -> Duration {
    let doubled = 1u64 << u32::try_from(tries.clamp(1, 20) - 1).unwrap_or(0);
    Duration::from_secs(doubled).min(MOST_BACKOFF)
}

/// How old `delivery` is at `now`.
fn age(delivery: &Delivery, now: DateTime<Utc>) -> TimeDelta {
    now - DateTime::from_timestamp_millis(delivery.created_at).unwrap_or_default()
}

/// A try to be made again is given up once the notification is a day old.
fn give_up_when_old(tried: Tried, delivery: &Delivery, now: DateTime<Utc>) -> Tried {
    match tried {
        Tried::Again(status, error, _) if age(delivery, now) > TRY_FOR => Tried::GivenUp(
            status,
            format!("given up after trying for a day; last: {error}"),
        ),
        other => other,
    }
}

fn log(delivery: &Delivery, tried: &Tried) {
    let (notifier, key, event) = (&delivery.notifier, &delivery.period_key, &delivery.event);
    let outcome = match tried {
        Tried::Delivered(_) => "delivered",
        Tried::GivenUp(..) => "given_up",
        Tried::Again(..) => "again",
    };
    metrics::counter!(
        "scheduler_notifications_total",
        "notifier" => notifier.clone(),
        "event" => event.clone(),
        "outcome" => outcome
    )
    .increment(1);
    match tried {
        Tried::Delivered(status) => {
            tracing::info!(
                notifier,
                period_key = key,
                event,
                status,
                "notification delivered"
            );
        }
        Tried::GivenUp(status, error) => {
            tracing::warn!(
                notifier,
                period_key = key,
                event,
                status = status.map_or_else(|| "none".to_owned(), |s| s.to_string()),
                error,
                "notification given up"
            );
        }
        Tried::Again(status, error, after) => tracing::warn!(
            notifier,
            period_key = key,
            event,
            status = status.map_or_else(|| "none".to_owned(), |s| s.to_string()),
            error,
            again_in = %humantime::format_duration(*after),
            "notification not delivered yet"
        ),
    }
}

/// The `failed` notifications of the periods of `failed` (failed for
/// good), for their jobs among `by_name`.
fn failed_told(
    config: &Config,
    by_name: &HashMap<&str, &Job>,
    failed: Vec<FailedForGood>,
) -> Vec<NewNotification> {
    // A period split into shards is told once, naming its failed shards.
    let mut periods: Vec<(PeriodKey, Vec<FailedForGood>)> = Vec::new();
    for failed in failed {
        let key = PeriodKey::of_stored(&failed.period_key).period_key();
        match periods.iter_mut().find(|(k, _)| *k == key) {
            Some((_, shards)) => shards.push(failed),
            None => periods.push((key, vec![failed])),
        }
    }
    let mut new = Vec::new();
    for (key, mut failed) in periods {
        let Some(job) = by_name.get(failed[0].job.as_str()) else {
            continue;
        };
        failed.sort_by_key(|f| PeriodKey::of_stored(&f.period_key).shard());
        let shards: Vec<u32> = failed
            .iter()
            .filter_map(|f| PeriodKey::of_stored(&f.period_key).shard())
            .map(|shard| shard.index)
            .collect();
        let first = &failed[0];
        let told = Told {
            job,
            key: key.as_str(),
            label: &first.period,
            state: "failed",
            attempt: Some(first.attempt),
            failures: first.failures,
            error: first.error.as_deref(),
            deadline: None,
            waiting_for: None,
            failed_shards: &shards,
        };
        new.extend(told.to(&config.notifiers, Event::Failed));
    }
    new
}

/// The `recovered` notifications of `recovered` (notifier, job, period
/// key), for their jobs among `by_name`.
fn recovered_told(
    config: &Config,
    by_name: &HashMap<&str, &Job>,
    recovered: Vec<(String, String, String)>,
) -> Vec<NewNotification> {
    let mut new = Vec::new();
    for (notifier, job, key) in recovered {
        let (Some(job), Some(n)) = (
            by_name.get(job.as_str()),
            config.notifiers.iter().find(|n| n.name == notifier),
        ) else {
            continue;
        };
        let label = key.split_once(':').map_or("", |(_, label)| label);
        let told = Told {
            job,
            key: &key,
            label,
            state: "succeeded",
            attempt: None,
            failures: 0,
            error: None,
            deadline: None,
            waiting_for: None,
            failed_shards: &[],
        };
        new.extend(told.to(std::slice::from_ref(n), Event::Recovered));
    }
    new
}

/// A period as a notification tells of it.
struct Told<'a> {
    job: &'a Job,
    key: &'a str,
    label: &'a str,
    state: &'a str,
    attempt: Option<i32>,
    failures: i32,
    error: Option<&'a str>,
    deadline: Option<DateTime<Utc>>,
    /// For a period that waits for upstream periods: what, in words.
    waiting_for: Option<&'a str>,
    /// For a period split into shards, told `failed`: its shards failed
    /// for good.
    failed_shards: &'a [u32],
}

impl Told<'_> {
    /// ` (shards #1, #3)`: the failed shards of a period split into them.
    fn shard_words(&self) -> String {
        if self.failed_shards.is_empty() {
            return String::new();
        }
        let named: Vec<String> = self.failed_shards.iter().map(|i| format!("#{i}")).collect();
        let noun = if named.len() == 1 { "shard" } else { "shards" };
        format!(" ({noun} {})", named.join(", "))
    }

    /// The notification of `event` for each of `notifiers` that wants it.
    fn to(&self, notifiers: &[Notifier], event: Event) -> Vec<NewNotification> {
        notifiers
            .iter()
            .filter(|n| n.wants(event, &self.job.name))
            .map(|n| NewNotification {
                notifier: n.name.clone(),
                period_key: self.key.to_owned(),
                event: event.as_str(),
                job: self.job.name.to_string(),
                payload: self.payload(n, event),
            })
            .collect()
    }

    /// The body `notifier` is sent, secrets masked.
    fn payload(&self, notifier: &Notifier, event: Event) -> String {
        let error = self.error.map(|e| self.job.secrets.mask(e));
        let deadline = self.deadline.map(utc_text);
        let link = format!("/v1/jobs/{}/periods/{}", self.job.name, self.label);
        match notifier.format {
            Format::Json => json!({
                "id": format!("{}:{}:{}", notifier.name, self.key, event.as_str()),
                "event": event.as_str(),
                "job": self.job.name,
                "period_key": self.key,
                "period": self.label,
                "deadline": deadline,
                "state": self.state,
                "attempt": self.attempt,
                "failures": self.failures,
                "error": error,
                "waiting_for": self.waiting_for,
                "failed_shards": (!self.failed_shards.is_empty()).then_some(self.failed_shards),
                "links": { "period": link },
            })
            .to_string(),
            Format::Slack => {
                let what = match event {
                    Event::Late => format!(
                        "is late: not succeeded by its deadline {} (now {}{})",
                        deadline.unwrap_or_default(),
                        self.state,
                        self.waiting_for
                            .map(|w| format!(", waiting for {w}"))
                            .unwrap_or_default()
                    ),
                    Event::Failed => format!(
                        "failed for good after {} failure(s){}{}",
                        self.failures,
                        self.shard_words(),
                        error.map(|e| format!(": {e}")).unwrap_or_default()
                    ),
                    Event::Recovered => "recovered: it has succeeded".to_owned(),
                };
                json!({ "text": format!("`{}` {what}", self.key) }).to_string()
            }
        }
    }
}

/// When the next deadline after `after` passes, of the jobs a notifier is
/// told `late` of: until then no period can turn late.
fn next_deadline(config: &Config, after: DateTime<Utc>) -> Option<DateTime<Utc>> {
    config
        .jobs
        .iter()
        .filter(|job| {
            config
                .notifiers
                .iter()
                .any(|n| n.wants(Event::Late, &job.name))
        })
        .filter_map(|job| {
            let deadline = TimeDelta::from_std(job.policy.deadline?).ok()?;
            Some(job.timing().next(after - deadline)?.at + deadline)
        })
        .min()
}

/// How long a shutdown waits for a delivery under way: its send, then the
/// write of its outcome.
pub const FINISH_AT_SHUTDOWN: Duration = Duration::from_secs(SEND_TIMEOUT.as_secs() + 5);

/// Checks deadlines and delivers notifications every `scan_interval` of
/// the configuration it is given (a reload sends the new one), beside the
/// serve loop, never in front of it; at shutdown it takes nothing more,
/// finishes the sends under way and writes their outcomes, and ends (the
/// caller waits [`FINISH_AT_SHUTDOWN`] at most).
pub fn follow(
    engine: Engine,
    mut config: watch::Receiver<Arc<Config>>,
    mut shutdown: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        // The last check of late periods that went through: the next looks
        // at the deadlines passed since (a reload looks at the whole
        // window), and none is looked for before the next deadline passes.
        let mut checked: Option<DateTime<Utc>> = None;
        let mut quiet_until: Option<DateTime<Utc>> = None;
        // The last round that looked for failed and recovered periods and
        // delivered: one is made at least every [`ROUND_EVERY`], and at each
        // scan where a deadline passed.
        let mut last_round: Option<tokio::time::Instant> = None;
        loop {
            if config.has_changed().unwrap_or(false) {
                (checked, quiet_until) = (None, None);
            }
            let current = config.borrow_and_update().clone();
            let every = current.settings.scan_interval;
            let now = engine.now();
            // The first check looks; after it, a deadline must have passed
            // (with no deadline at all, none ever does).
            let late = checked.is_none() || quiet_until.is_some_and(|quiet| now >= quiet);
            let due = last_round.is_none_or(|at| at.elapsed() >= ROUND_EVERY);
            if !current.notifiers.is_empty() && (late || due) {
                let work = async {
                    let jobs: Vec<&Job> = current.jobs.iter().map(|j| &**j).collect();
                    engine
                        .check_deadlines(&current, &jobs, now, checked, late)
                        .await?;
                    engine
                        .deliver(&current, every.max(SEND_TIMEOUT), &shutdown)
                        .await
                };
                // Not cut short by a shutdown: a send under way is finished
                // and its outcome written, or it would be sent again.
                match work.await {
                    Ok(_) => {
                        last_round = Some(tokio::time::Instant::now());
                        if late {
                            checked = Some(now);
                            quiet_until = next_deadline(&current, now);
                        }
                    }
                    Err(e) => tracing::warn!("notifications: {e}"),
                }
                if *shutdown.borrow() {
                    return;
                }
            }
            tokio::select! {
                () = tokio::time::sleep(every) => {}
                changed = config.changed() => if changed.is_err() {
                    return;
                },
                _ = shutdown.wait_for(|down| *down) => return,
            }
        }
    })
}
