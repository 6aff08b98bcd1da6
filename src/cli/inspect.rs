//! The operator's commands on the database: `status`, `history`, `release`,
//! `pause`/`resume` and `prune`.

use chrono::{DateTime, Utc};
use serde_json::json;

use crate::config::{Config, Job};
use crate::engine::operate;
use crate::engine::overview::{self, JobOverview};
use crate::engine::view::{self, PeriodView};
use crate::error::{Error, Outcome, Unread, say};
use crate::period::{Period, utc_text};
use crate::store::{Claim, ClaimRow, ClaimState, PeriodState, Released, Store};

/// How many recent periods `status` shows per job.
const RECENT: u32 = 5;

fn time(t: Option<DateTime<Utc>>) -> String {
    t.map_or_else(|| "-".to_owned(), utc_text)
}

/// `scheduler status [JOB] [--json]`: a table on a terminal (plain
/// aligned columns when piped), one JSON object per job with `--json`;
/// both from the one overview ([`overview::of_jobs`]) the API shows.
pub async fn status(
    config: &Config,
    store: &Store,
    only: Option<&str>,
    as_json: bool,
    now: DateTime<Utc>,
) -> Result<Outcome, Unread> {
    let jobs: Vec<&Job> = config
        .jobs
        .iter()
        .filter(|j| only.is_none_or(|name| config.full_name(name) == *j.name))
        .map(|j| &**j)
        .collect();
    let all = overview::of_jobs(store, &jobs, RECENT, now).await?;
    if as_json {
        for job in &all {
            let mut json = overview::json(job, config, now);
            json["recent"] = serde_json::to_value(&job.recent).unwrap_or_default();
            say(format_args!("{json}"))?;
        }
        return Ok(Outcome::Done);
    }
    table(&all, now)?;
    if let [job] = &all[..] {
        details(job)?;
    }
    Ok(Outcome::Done)
}

/// The status table of `all`, one row a job.
fn table(all: &[JobOverview], now: DateTime<Utc>) -> Result<(), Unread> {
    let look = Look::of_stdout();
    let mut table = look.table();
    table.set_header([
        "JOB", "SCHEDULE", "NEXT", "LAST", "RUNNING", "FAILED", "OVERDUE", "LATE", "WAITING",
    ]);
    for job in all {
        table.add_row(cells(job, &look, now));
    }
    if look.terminal {
        say(format_args!("{table}"))?;
    } else {
        // Plain columns: no padding before the first, none after the last.
        for column in table.column_iter_mut() {
            column.set_padding((0, 2));
        }
        for line in table.lines() {
            say(format_args!("{}", line.trim_end()))?;
        }
    }
    Ok(())
}

/// What `status JOB` says of one job below its row: how a first run would
/// start it, its overdue, late, ready, waiting and stale periods, and its
/// recent ones.
fn details(job: &JobOverview) -> Result<(), Unread> {
    if let Some(first_run) = &job.first_run {
        match &first_run[..] {
            [] => say(format_args!(
                "not seen yet: a first `serve` or `run {}` now runs nothing before its next fire (its latest fire is older than catch_up); `run --period` runs an older period by hand",
                job.job.name
            ))?,
            keys => say(format_args!(
                "not seen yet: a first `serve` or `run {}` now takes {} (the latest fire within catch_up); if an earlier system ran it, `scheduler adopt {} --through LABEL` first",
                job.job.name,
                keys.join(", "),
                job.job.name
            ))?,
        }
    }
    for (what, keys) in [
        ("overdue", &job.overdue),
        ("late", &job.late),
        ("ready", &job.ready),
    ] {
        if !keys.is_empty() {
            say(format_args!("{what} ({}):", keys.len()))?;
            for key in keys {
                say(format_args!("  {key}"))?;
            }
        }
    }
    if !job.waiting.is_empty() {
        say(format_args!("waiting ({}):", job.waiting.len()))?;
        for (key, waits) in &job.waiting {
            say(format_args!("  {key}  waiting for {waits}"))?;
        }
    }
    if !job.stale.is_empty() {
        say(format_args!("stale ({}):", job.stale.len()))?;
        for (key, upstream, at) in &job.stale {
            say(format_args!(
                "  {key}  {upstream} succeeded again at {}, after it ran",
                utc_text(*at)
            ))?;
        }
    }
    if !job.recent.is_empty() {
        say(format_args!("recent periods:"))?;
        for row in &job.recent {
            say(format_args!(
                "  {}  attempt {}  {}",
                row.period_key,
                row.attempt,
                describe(row)
            ))?;
        }
    }
    Ok(())
}

/// How output looks: a table with borders and colour for a person at a
/// terminal, plain aligned columns for a pipe or a file.
struct Look {
    terminal: bool,
    colour: bool,
}

impl Look {
    fn of_stdout() -> Look {
        let terminal = std::io::IsTerminal::is_terminal(&std::io::stdout());
        Look {
            terminal,
            colour: terminal && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()),
        }
    }

    fn table(&self) -> comfy_table::Table {
        let mut table = comfy_table::Table::new();
        if self.terminal {
            table.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
            // Wrapped to the terminal only when its width is known.
            if table.width().is_some() {
                table.set_content_arrangement(comfy_table::ContentArrangement::Dynamic);
            }
        } else {
            table
                .load_preset(comfy_table::presets::NOTHING)
                .force_no_tty();
        }
        table
    }

    fn cell(&self, text: String, colour: Option<comfy_table::Color>) -> comfy_table::Cell {
        let cell = comfy_table::Cell::new(text);
        match colour {
            Some(colour) if self.colour => cell.fg(colour),
            _ => cell,
        }
    }
}

/// A failed period's line: its retries left and when the next is, or why
/// there is none.
fn failed_line(job: &JobOverview<'_>, row: &ClaimRow) -> String {
    let left = job.retries_left(row);
    match row.retry_at {
        Some(at) => format!(
            "{}: {left} retr{} left, next at {}",
            row.period_key,
            if left == 1 { "y" } else { "ies" },
            utc_text(at)
        ),
        None if job.job.policy.retry.attempts <= 1 => {
            format!("{}: failed, no retry configured", row.period_key)
        }
        None => format!("{}: retries exhausted", row.period_key),
    }
}

/// How many of `keys` there are, and the newest three.
fn newest(keys: &[String]) -> String {
    let n = keys.len();
    if n == 0 {
        return "-".to_owned();
    }
    let newest: Vec<&str> = keys.iter().rev().take(3).map(String::as_str).collect();
    format!(
        "{n}: {}{}",
        newest.join(", "),
        if n > 3 { ", …" } else { "" }
    )
}

/// One job's row of the `status` table.
fn cells(job: &JobOverview<'_>, look: &Look, now: DateTime<Utc>) -> Vec<comfy_table::Cell> {
    use comfy_table::Color;
    let schedule = format!("{} {}", job.job.schedule.source(), job.job.schedule.zone());
    let next = match &job.next {
        _ if job.paused => look.cell("paused".into(), Some(Color::Yellow)),
        Some((fire, key)) => look.cell(format!("{} {key}", utc_text(*fire)), None),
        None => look.cell("-".into(), None),
    };
    let last = match job.last() {
        Some(row) => look.cell(
            format!(
                "{} {} at {}",
                row.state,
                row.period_key,
                time(row.finished_at)
            ),
            (row.state == ClaimState::Failed).then_some(Color::Red),
        ),
        None => look.cell("-".into(), None),
    };
    let running: Vec<String> = job.running().map(|row| running_line(row, now)).collect();
    let failed: Vec<String> = job.failed().map(|row| failed_line(job, row)).collect();
    let waiting: Vec<String> = job.waiting.iter().map(|(key, _)| key.clone()).collect();
    // A piped row stays one line, for grep and awk.
    let separator = if look.terminal { "\n" } else { "; " };
    let or_dash = |lines: Vec<String>| {
        if lines.is_empty() {
            "-".to_owned()
        } else {
            lines.join(separator)
        }
    };
    let failed_colour = (!failed.is_empty()).then_some(Color::Red);
    // Owed and unclaimed, whether or not an upstream run made it ready.
    let mut overdue = job.overdue.clone();
    overdue.extend(job.ready.iter().cloned());
    vec![
        look.cell(job.job.name.to_string(), None),
        look.cell(schedule, None),
        next,
        last,
        look.cell(or_dash(running), None),
        look.cell(or_dash(failed), failed_colour),
        look.cell(
            newest(&overdue),
            (!overdue.is_empty()).then_some(Color::Yellow),
        ),
        look.cell(
            newest(&job.late),
            (!job.late.is_empty()).then_some(Color::Red),
        ),
        look.cell(newest(&waiting), None),
    ]
}

/// The longest range `status JOB --from --to` prints.
pub const RANGE_LIMIT: usize = 100_000;

/// `scheduler status JOB --from L --to L`: one line per period of the
/// range, in the words of the one rule (docs/commands.md), `late` beside any
/// owed period past its deadline.
pub async fn range(
    job: &Job,
    store: &Store,
    periods: &[Period],
    as_json: bool,
    now: DateTime<Utc>,
) -> Result<Outcome, Unread> {
    for chunk in periods.chunks(view::VIEWS_PER_READ) {
        for view in view::periods(store, job, chunk, now).await? {
            if as_json {
                say(format_args!("{}", view.json()))?;
                continue;
            }
            let detail = match (&view.row, view.waiting_for()) {
                (None, _) if view.state == PeriodState::NotDue => {
                    format!("fires at {}", time(view.fire))
                }
                (None, _) if view.state == PeriodState::BeforeFirstSeen => format!(
                    "fired at {}, before the job owes its fires (its first sighting, or the last change of when it fires): runs only by hand (or `adopt` it)",
                    time(view.fire)
                ),
                (None, _) if view.state == PeriodState::Missed => format!(
                    "fired at {}, {}, never run: runs only by hand",
                    time(view.fire),
                    match view
                        .fire
                        .zip(chrono::TimeDelta::from_std(job.policy.catch_up).ok())
                    {
                        Some((fire, window)) if fire >= now - window => {
                            "passed over by `missed` (a newer fire was taken)"
                        }
                        _ => "older than catch_up",
                    }
                ),
                (None, Some(waits)) => format!("waiting for {waits}"),
                (None, None) => format!(
                    "fired at {}, never run: the next run takes it",
                    time(view.fire)
                ),
                (Some(row), _) if view.state == PeriodState::Adopted => {
                    format!("adopted ({}) at {}", row.owner, time(row.finished_at))
                }
                (Some(row), _) => format!(
                    "attempt {}  {}{}",
                    row.attempt,
                    describe(row),
                    stale_words(&view)
                ),
            };
            let late = if view.late { "  late" } else { "" };
            let shards = view
                .shard_words()
                .map(|words| format!("; {words}"))
                .unwrap_or_default();
            say(format_args!(
                "{}  {:<17}  {detail}{shards}{late}",
                view.key, view.state
            ))?;
        }
    }
    Ok(Outcome::Done)
}

/// For a stale period, what made it so: `; stale: ingest:2026-07-15
/// succeeded again at …`.
fn stale_words(view: &PeriodView) -> String {
    view.stale_by()
        .map(|(key, at)| format!("; stale: {key} succeeded again at {}", utc_text(at)))
        .unwrap_or_default()
}

/// One claim row in words an operator acts on.
fn describe(row: &ClaimRow) -> String {
    match (row.standing(), row.as_claim()) {
        (PeriodState::Stopping, Claim::Held { owner, until }) => format!(
            "released by `scheduler release`; held until its runner {owner} confirms the job stopped, or {} at the latest",
            utc_text(until)
        ),
        (_, Claim::Held { owner, until }) => {
            format!("running on {owner} until {}", utc_text(until))
        }
        (PeriodState::LeaseExpired, _) => format!(
            "lease expired at {} (its runner {} stopped or died); the next run or serve recovers it",
            time(row.lease_until),
            row.owner
        ),
        (PeriodState::Released, _) => format!(
            "released at {} (by `scheduler release`, or by its runner {} stopping at shutdown) and let go; the next run or serve runs it again",
            time(row.finished_at),
            row.owner
        ),
        (PeriodState::Failed, _) => match row.retry_at {
            Some(at) => format!("failed {} time(s); retry at {}", row.failures, utc_text(at)),
            None => format!(
                "failed {} time(s), retries exhausted; `run --period` runs it again",
                row.failures
            ),
        },
        (state, _) => format!("{state} at {}", time(row.finished_at)),
    }
}

/// How `history` shows attempts.
#[derive(Debug)]
pub struct Shown {
    /// How many, newest first.
    pub limit: u32,
    /// With the kept output.
    pub output: bool,
    /// One JSON object per line.
    pub json: bool,
}

/// `scheduler history JOB [--period LABEL] [--limit N] [--output] [--json]`.
/// A job still in jobs.toml (`defined`) first says which of its periods
/// wait for upstream periods, and what for.
pub async fn history(
    store: &Store,
    job: &str,
    defined: Option<&Job>,
    period: Option<(&str, &Period)>,
    shown: Shown,
) -> Result<Outcome, Unread> {
    let key = period.map(|(key, _)| key);
    if let Some(defined) = defined
        && !not_plain(store, defined, key, &shown).await?
    {
        return Ok(Outcome::Done);
    }
    let attempts = match period {
        Some(period) => period_attempts(store, defined, period, shown.limit).await?,
        None => store.history(job, shown.limit).await?,
    };
    // Newest first: an attempt ran under another definition than the one
    // before it (the next in the list) when their fingerprints differ.
    let older: Vec<Option<String>> = attempts
        .iter()
        .skip(1)
        .map(|a| a.definition.clone())
        .chain(std::iter::once(None))
        .collect();
    for (attempt, before) in attempts.into_iter().zip(older) {
        say_attempt(attempt, before, &shown)?;
    }
    notifications(store, job, key, shown).await
}

/// The newest `limit` attempts of the period (`key`, `period`): with those
/// of each of its shards that was claimed, for a job still in jobs.toml.
async fn period_attempts(
    store: &Store,
    defined: Option<&Job>,
    (key, period): (&str, &Period),
    limit: u32,
) -> Result<Vec<crate::store::Attempt>, Error> {
    let mut attempts = store.attempts(key, limit).await?;
    let claims = match defined {
        Some(job) => crate::engine::shards::claims(store, &[(job, period)]).await?,
        None => Vec::new(),
    };
    for (_, row) in claims.iter().flat_map(|c| &c.shard_rows) {
        attempts.extend(store.attempts(&row.period_key, limit).await?);
    }
    attempts.sort_by_key(|a| std::cmp::Reverse(a.started_at));
    attempts.truncate(usize::try_from(limit).unwrap_or(usize::MAX));
    Ok(attempts)
}

/// What `history` says first of a job still in jobs.toml (`defined`): its
/// periods that wait for upstream periods, and what for, the ready and the
/// stale ones (of one period, with `key`). `false`: the overview has no
/// such job, and nothing more is said.
async fn not_plain(
    store: &Store,
    defined: &Job,
    key: Option<&str>,
    shown: &Shown,
) -> Result<bool, Unread> {
    // What the one overview says of its periods that are not plain
    // claims: waiting (and what for), ready, stale.
    let overview = overview::of_jobs(store, &[defined], RECENT, Utc::now()).await?;
    let Some(o) = overview.first() else {
        return Ok(false);
    };
    let mine = |k: &str| key.is_none_or(|key| k == key);
    let waiting = o.waiting.iter().filter(|(k, _)| mine(k));
    for (i, (k, waits)) in waiting.enumerate() {
        if shown.json {
            say(format_args!(
                "{}",
                json!({ "waiting": { "period_key": k, "waiting_for": waits } })
            ))?;
            continue;
        }
        if i == 0 {
            say(format_args!("waiting:"))?;
        }
        say(format_args!("  {k}  waiting for {waits}"))?;
    }
    for (i, k) in o.ready.iter().filter(|k| mine(k)).enumerate() {
        if shown.json {
            say(format_args!("{}", json!({ "ready": { "period_key": k } })))?;
            continue;
        }
        if i == 0 {
            say(format_args!(
                "ready (its upstream periods are done; the next scan or run takes it):"
            ))?;
        }
        say(format_args!("  {k}"))?;
    }
    for (i, (k, upstream, at)) in o.stale.iter().filter(|(k, _, _)| mine(k)).enumerate() {
        if shown.json {
            say(format_args!(
                "{}",
                json!({ "stale": { "period_key": k, "upstream": upstream, "succeeded_at": utc_text(*at) } })
            ))?;
            continue;
        }
        if i == 0 {
            say(format_args!("stale:"))?;
        }
        say(format_args!(
            "  {k}  {upstream} succeeded again at {}, after it ran",
            utc_text(*at)
        ))?;
    }
    Ok(true)
}

/// One attempt as `history` shows it; `before`, the definition of the
/// attempt before it.
fn say_attempt(
    mut attempt: crate::store::Attempt,
    before: Option<String>,
    shown: &Shown,
) -> Result<(), Unread> {
    let changed = match (&attempt.definition, &before) {
        (Some(now), Some(before)) if now != before => {
            Some(format!("  definition changed ({before} → {now})"))
        }
        _ => None,
    };
    if shown.json {
        if !shown.output {
            attempt.output = None;
        }
        say(format_args!("{}", json!(attempt)))?;
        return Ok(());
    }
    let code = match (attempt.exit_code, attempt.http_status) {
        (Some(code), _) => format!("  exit {code}"),
        (_, Some(status)) => format!("  HTTP {status}"),
        _ => String::new(),
    };
    let error = attempt.error.map(|e| format!("  {e}")).unwrap_or_default();
    // A manual attempt says how it was asked for, and by whom.
    let trigger = match (&attempt.asked, &attempt.requested_by) {
        (Some(asked), Some(by)) => format!("{asked} by {by}"),
        (Some(asked), None) => asked.clone(),
        _ => attempt.trigger.as_str().to_owned(),
    };
    say(format_args!(
        "{}  attempt {}  {}  {}  started {}  ended {}  on {}  trace {}{code}{error}{}",
        attempt.period_key,
        attempt.attempt,
        attempt.outcome,
        trigger,
        utc_text(attempt.started_at),
        time(attempt.finished_at),
        attempt.owner,
        attempt.trace_id,
        changed.unwrap_or_default()
    ))?;
    if shown.output {
        match attempt.output.as_deref().filter(|o| !o.is_empty()) {
            Some(output) => {
                for line in output.lines() {
                    say(format_args!("    | {}", crate::error::printable(line)))?;
                }
            }
            None => say(format_args!("    (no output kept)"))?,
        }
    }
    Ok(())
}

/// The notifications of `job` (of one period, with `key`), newest first,
/// after its attempts.
async fn notifications(
    store: &Store,
    job: &str,
    key: Option<&str>,
    shown: Shown,
) -> Result<Outcome, Unread> {
    let told: Vec<_> = store
        .notifications(job, shown.limit)
        .await?
        .into_iter()
        .filter(|n| key.is_none_or(|key| n.period_key == key))
        .collect();
    if !told.is_empty() && !shown.json {
        say(format_args!("notifications:"))?;
    }
    for n in told {
        if shown.json {
            say(format_args!("{}", json!({ "notification": n })))?;
            continue;
        }
        let answer = n.status.map(|s| format!("  HTTP {s}")).unwrap_or_default();
        let error = n.error.map(|e| format!("  {e}")).unwrap_or_default();
        say(format_args!(
            "  {}  {}  to {}  {}  {} tr{}{answer}{error}",
            n.period_key,
            n.event,
            n.notifier,
            n.state,
            n.tries,
            if n.tries == 1 { "y" } else { "ies" }
        ))?;
    }
    Ok(Outcome::Done)
}

/// `scheduler release JOB --period LABEL`.
pub async fn release(
    job: &Job,
    store: &Store,
    period: &Period,
    shard: Option<u32>,
) -> Result<Outcome, Unread> {
    let label = &period.label;
    match operate::release(store, job, period, (shard, "--shard")).await? {
        (key, Some(Released { owner, lease_until })) => say(format_args!(
            "{key}: released (was running on {owner}); its runner stops the job at its next heartbeat and the period can be claimed then, or at {} at the latest if that runner cannot be reached",
            lease_until.map_or_else(|| "once".to_owned(), utc_text)
        ))?,
        // Nothing to end: the period named is not running (a wrong label,
        // or it ended meanwhile), which a script must be told.
        (key, None) => {
            return Err(Unread::Failed(Error::Usage(format!(
                "release: {key} has no running claim to release (`scheduler status {} --from {label} --to {label}` shows how it stands)",
                job.name
            ))));
        }
    }
    Ok(Outcome::Done)
}

/// `scheduler adopt JOB --through L` / `--from A --to B`: one line per
/// period recorded; a period with a claim refuses them all (exit 2), each
/// named with where it stands.
pub async fn adopt(
    job: &Job,
    store: &Store,
    which: operate::Adoption<'_>,
    now: DateTime<Utc>,
) -> Result<Outcome, Unread> {
    let by = format!("cli:{}", crate::cli::run::user());
    match operate::adopt(store, job, which, &by, now, operate::AdoptNames::FLAGS).await? {
        operate::Adopted::Recorded(keys) => {
            for key in &keys {
                say(format_args!("{key}  adopted"))?;
            }
            Ok(Outcome::Done)
        }
        operate::Adopted::Claimed(rows) => {
            let said: Vec<String> = rows
                .iter()
                .map(|row| {
                    format!(
                        "{} is {} (attempt {})",
                        row.period_key,
                        row.standing(),
                        row.attempt
                    )
                })
                .collect();
            Err(Unread::Failed(Error::Usage(format!(
                "adopt: nothing adopted: {}; a period that has a claim here ran here (or was adopted already) and is never adopted",
                said.join(", ")
            ))))
        }
    }
}

/// `scheduler pause JOB` / `scheduler resume JOB`.
pub async fn pause(store: &Store, job: &str, paused: bool) -> Result<Outcome, Unread> {
    operate::pause(store, job, paused).await?;
    say(format_args!(
        "{job}: {}",
        if paused { "paused" } else { "resumed" }
    ))?;
    Ok(Outcome::Done)
}

/// `scheduler prune [--dry-run]`: a line for every job with a `keep`,
/// nothing pruned included.
pub async fn prune(config: &Config, store: &Store, dry_run: bool) -> Result<Outcome, Unread> {
    let verb = if dry_run { "would prune" } else { "pruned" };
    let pruned = operate::prune(config, store, dry_run).await?;
    for (job, keep, n) in &pruned.jobs {
        say(format_args!(
            "{job}: {verb} {n} finished claim(s) older than {} (keep; periods that fired inside the catch-up window are kept)",
            crate::config::short(*keep)
        ))?;
    }
    for (job, keep, n) in &pruned.output {
        say(format_args!(
            "{job}: {verb} {n} chunk(s) of output older than {} (keep_output; the attempts and their tails stay)",
            crate::config::short(*keep)
        ))?;
    }
    if let Some((key_ttl, n)) = pruned.api {
        say(format_args!(
            "api: {verb} {n} Idempotency-Key(s) and run(s) older than {} (key_ttl)",
            crate::config::short(key_ttl)
        ))?;
    }
    match (pruned.jobs.is_empty(), pruned.api.is_none()) {
        (true, true) => say(format_args!(
            "nothing to prune: no job has `keep` and there is no [api]; claims are kept for ever"
        ))?,
        (true, false) => say(format_args!(
            "jobs: nothing to prune: no job has `keep`; claims are kept for ever"
        ))?,
        _ => {}
    }
    Ok(Outcome::Done)
}

/// A running (or released, or expired) period's line.
fn running_line(row: &ClaimRow, now: DateTime<Utc>) -> String {
    match (row.standing(), row.as_claim()) {
        (PeriodState::Stopping, Claim::Held { owner, until }) => format!(
            "{} released, stopping on {owner}, {}s left",
            row.period_key,
            (until - now).num_seconds().max(0)
        ),
        (_, Claim::Held { owner, until }) => format!(
            "{} on {owner}, {}s left",
            row.period_key,
            (until - now).num_seconds().max(0)
        ),
        (PeriodState::Released, _) => format!("{} released ({})", row.period_key, row.owner),
        _ => format!("{} lease expired ({})", row.period_key, row.owner),
    }
}
