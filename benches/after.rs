//! Figures for `after` on SQLite and PostgreSQL: 1,000 monthly jobs, each
//! after a daily job of its own whose July has 30 of its 31 days done.
//! How long the claim of the 1,000 months takes to find them all waiting
//! (31,000 upstream periods looked up); what the waiting periods add to
//! `serve`'s scan (a scan without them — paused jobs, claims to take over —
//! against the one statement that reads the woken ones, and the sweep of
//! every waiting one a scan makes once a minute); what the wake-up trigger
//! costs each recorded success; and how long after the 31st days succeed
//! the 1,000 months are found and claimed. Run with
//! `cargo bench --bench after` (about a minute).

use std::sync::Arc;
use std::time::{Duration, Instant};

use chrono::{DateTime, Utc};
use scheduler::config::{Config, Job};
use scheduler::engine::due::Due;
use scheduler::engine::{Ask, Engine, Taken};
use scheduler::store::{ClaimRequest, Finish, Store, Trigger};

mod support;
use support::postgres_database;

/// Downstream jobs, each with an upstream job of its own.
const PAIRS: usize = 1_000;

/// Scans measured of each kind.
const SCANS: usize = 30;

fn jobs_toml() -> String {
    let mut text = String::new();
    for i in 0..PAIRS {
        text.push_str(&format!(
            "[[job]]\nname = \"ingest-{i}\"\nschedule = \"0 1 * * *\"\nperiod = \"day\"\nsql = {{ statement = \"SELECT 1\" }}\n\n\
             [[job]]\nname = \"report-{i}\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ncovers = \"previous\"\n\
             after = [\"ingest-{i}\"]\nsql = {{ statement = \"SELECT 1\" }}\n\n"
        ));
    }
    text
}

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s).unwrap().to_utc()
}

/// Records `days` of `month` (2026) of every `ingest-*` as succeeded,
/// through the store's own claim and finish; how long the recording took.
async fn record_days(
    store: &Store,
    jobs: &[Arc<Job>],
    month: u32,
    days: std::ops::RangeInclusive<u32>,
) -> Duration {
    let mut requests = Vec::new();
    let periods: Vec<(String, scheduler::period::Period, DateTime<Utc>)> = jobs
        .iter()
        .filter(|j| j.name.starts_with("ingest-"))
        .flat_map(|job| {
            days.clone().map(move |day| {
                let fire = at(&format!("2026-{month:02}-{day:02}T01:00:00Z"));
                let period = job.period.period_of(&job.schedule, fire);
                (job.name.to_string(), period, fire)
            })
        })
        .collect();
    for (job, period, fire) in &periods {
        requests.push(ClaimRequest {
            job,
            period,
            shard: None,
            owner: "bench",
            lease: Duration::from_secs(600),
            trigger: Trigger::Manual,
            concurrency: 100,
            force: false,
            manual: true,
            scheduled_at: *fire,
            asked: None,
        });
    }
    let mut recording = Duration::ZERO;
    for chunk in requests.chunks(200) {
        let claims = store.claim_many(chunk).await.unwrap();
        let won: Vec<(&scheduler::store::Lease, Finish)> = claims
            .iter()
            .filter_map(|c| match c {
                scheduler::store::Claim::Won(lease) => Some((
                    lease,
                    Finish {
                        succeeded: true,
                        ..Finish::default()
                    },
                )),
                _ => None,
            })
            .collect();
        let started = Instant::now();
        store.finish_many(&won).await.unwrap();
        recording += started.elapsed();
    }
    recording
}

/// Drops the wake-up trigger, for the cost of recording without it.
async fn drop_trigger(url: &str) {
    use sqlx::Connection;
    if url.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query("DROP TRIGGER scheduler_claims_wake")
            .execute(&mut conn)
            .await
            .unwrap();
    } else {
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query("DROP TRIGGER scheduler_claims_wake ON scheduler_claims")
            .execute(&mut conn)
            .await
            .unwrap();
    }
}

fn median(mut ms: Vec<f64>) -> f64 {
    ms.sort_by(f64::total_cmp);
    ms[ms.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

async fn measure(backend: &str, url: &str) {
    let store = Store::connect(url).await.unwrap();
    store.migrate().await.unwrap();
    let config = Config::parse(std::path::Path::new("jobs.toml"), &jobs_toml(), &|_| None)
        .expect("valid jobs");
    let jobs: Vec<Arc<Job>> = config.jobs;
    let names: Vec<String> = jobs.iter().map(|j| j.name.to_string()).collect();
    record_days(&store, &jobs, 7, 1..=30).await;
    let engine = Engine::new(store.clone(), Duration::from_secs(60), "bench".into()).unwrap();
    let fire = at("2026-08-01T02:00:00Z");
    let asks: Vec<Ask> = jobs
        .iter()
        .filter(|j| j.name.starts_with("report-"))
        .map(|job| {
            let due = Due {
                period: job.period.period_of(&job.schedule, fire),
                fire,
                trigger: Trigger::Schedule,
                shard: None,
            };
            Ask::scheduled(job.clone(), due)
        })
        .collect();
    let started = Instant::now();
    let taken = engine.claim(&asks).await.unwrap();
    let gate = started.elapsed();
    let waiting = taken
        .iter()
        .filter(|t| matches!(t, Taken::Waiting(_)))
        .count();
    assert_eq!(waiting, PAIRS, "every month waits");
    let mut without = Vec::new();
    let mut ready = Vec::new();
    let mut sweep = Vec::new();
    for _ in 0..SCANS {
        let started = Instant::now();
        store.paused_jobs().await.unwrap();
        store.takeable(&names, 500).await.unwrap();
        without.push(ms(started.elapsed()));
        let started = Instant::now();
        let found = store.ready(&names, 500, false).await.unwrap();
        ready.push(ms(started.elapsed()));
        assert!(found.is_empty(), "nothing is ready yet");
        let started = Instant::now();
        let found = store.ready(&names, 500, true).await.unwrap();
        sweep.push(ms(started.elapsed()));
        assert!(found.is_empty(), "nothing is ready yet");
    }
    let (without, ready, sweep) = (median(without), median(ready), median(sweep));
    // Recording successes with the trigger (1,000 periods watched) and
    // without it: August, then September, 30,000 each.
    let with_trigger = record_days(&store, &jobs, 8, 1..=30).await;
    drop_trigger(url).await;
    let without_trigger = record_days(&store, &jobs, 9, 1..=30).await;
    // Put back for the wake-up: a fresh migration would not; the statement
    // is the migration's own.
    restore_trigger(url).await;
    let started = Instant::now();
    record_days(&store, &jobs, 7, 31..=31).await;
    let mut found = Vec::new();
    while found.len() < PAIRS {
        found = store.ready(&names, 5_000, false).await.unwrap();
    }
    let woken = started.elapsed();
    let asks: Vec<Ask> = found
        .into_iter()
        .map(|r| {
            let job = jobs.iter().find(|j| *j.name == *r.job).unwrap().clone();
            Ask::scheduled(
                job,
                Due {
                    period: r.period,
                    fire: r.scheduled_at,
                    trigger: r.trigger,
                    shard: r.shard,
                },
            )
        })
        .collect();
    let taken = engine.claim(&asks).await.unwrap();
    let claimed = started.elapsed();
    let won = taken.iter().filter(|t| matches!(t, Taken::Won(_))).count();
    assert_eq!(won, PAIRS, "every month is claimed once ready");
    println!(
        "{backend}: claim of {PAIRS} months, each after 31 days (31,000 upstream periods looked up): {:.0} ms, all waiting",
        ms(gate)
    );
    println!(
        "{backend}: scan of {} jobs without the waiting periods: {without:.2} ms (median of {SCANS}); the look for woken waiting periods, one statement: {ready:.2} ms (+{:.1} %); the sweep of all 1,000 once a minute: {sweep:.2} ms",
        names.len(),
        100.0 * ready / without
    );
    let per = |d: Duration| d.as_secs_f64() * 1e6 / 30_000.0;
    println!(
        "{backend}: recording 30,000 successes: {:.0} ms with the wake-up trigger ({:.1} µs each), {:.0} ms without ({:.1} µs each)",
        ms(with_trigger),
        per(with_trigger),
        ms(without_trigger),
        per(without_trigger)
    );
    println!(
        "{backend}: the 1,000 last days recorded → all 1,000 months found ready in {:.0} ms, claimed in {:.0} ms",
        ms(woken),
        ms(claimed)
    );
}

/// The trigger as the migration makes it.
async fn restore_trigger(url: &str) {
    use sqlx::Connection;
    if url.starts_with("sqlite:") {
        let mut conn = sqlx::SqliteConnection::connect(url).await.unwrap();
        sqlx::query(
            "CREATE TRIGGER scheduler_claims_wake AFTER UPDATE OF state ON scheduler_claims
             WHEN NEW.state = 'succeeded'
             BEGIN
                 UPDATE scheduler_waiting SET ready = 1 WHERE watch = NEW.period_key AND NOT ready;
             END",
        )
        .execute(&mut conn)
        .await
        .unwrap();
    } else {
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        sqlx::query(
            "CREATE TRIGGER scheduler_claims_wake AFTER UPDATE OF state ON scheduler_claims
             FOR EACH ROW WHEN (NEW.state = 'succeeded') EXECUTE FUNCTION scheduler_waiting_wake()",
        )
        .execute(&mut conn)
        .await
        .unwrap();
    }
}

fn main() {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let dir = tempfile::tempdir().unwrap();
        let sqlite = format!("sqlite://{}", dir.path().join("after.db").display());
        measure("SQLite", &sqlite).await;
        match postgres_database("scheduler_bench_after").await {
            Some(url) => measure("PostgreSQL", &url).await,
            None => println!("PostgreSQL: no server answers; skipped"),
        }
    });
}
