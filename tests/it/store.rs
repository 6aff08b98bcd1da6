//! The store conformance suite: the same tests against SQLite and a fresh
//! PostgreSQL database each.

use std::time::Duration;

use chrono::{TimeZone, Utc};
use scheduler::engine::heartbeat::{Heartbeats, Loss};
use scheduler::period::Period;
use scheduler::store::{
    Claim, ClaimRequest, Finish, GroupedEnd, GroupedSql, Lease, SqlLimits, Store, Trigger, Work,
};
use tokio::time::Instant;

use crate::support::{TestDb, job};

fn month(label: &str) -> Period {
    let job = job("schedule = \"0 2 1 * *\"\nperiod = \"month\"");
    job.period.parse_label(&job.schedule, label).unwrap()
}

fn request<'a>(period: &'a Period, owner: &'a str) -> ClaimRequest<'a> {
    ClaimRequest {
        job: "billing",
        period,
        shard: None,
        owner,
        lease: Duration::from_secs(60),
        trigger: Trigger::Schedule,
        concurrency: 1,
        force: false,
        manual: false,
        scheduled_at: Utc::now(),
        asked: None,
    }
}

async fn won(store: &Store, request: &ClaimRequest<'_>) -> Lease {
    match store.claim(request).await.unwrap() {
        Claim::Won(lease) => lease,
        other => panic!("expected to win, got {other:?}"),
    }
}

fn succeeded() -> Finish {
    Finish {
        succeeded: true,
        ..Finish::default()
    }
}

fn limits(timeout: Option<Duration>) -> SqlLimits {
    SqlLimits::new(timeout, Duration::from_secs(20))
}

fn failed(retry_after: Option<Duration>) -> Finish {
    Finish {
        error: Some("boom".into()),
        exit_code: Some(3),
        retry_after,
        ..Finish::default()
    }
}

async fn a_new_key_is_won_once_and_then_held(store: Store) {
    let period = month("2026-07");
    let lease = won(&store, &request(&period, "a")).await;
    assert_eq!(
        (lease.key.as_str(), lease.attempt, lease.trigger),
        ("billing:2026-07", 1, Trigger::Schedule)
    );
    match store.claim(&request(&period, "b")).await.unwrap() {
        Claim::Held { owner, .. } => assert_eq!(owner, "a"),
        other => panic!("expected held, got {other:?}"),
    }
}

async fn a_succeeded_period_is_done_and_force_takes_it_again(store: Store) {
    let period = month("2026-07");
    let lease = won(&store, &request(&period, "a")).await;
    assert!(store.finish(&lease, &succeeded()).await.unwrap());
    assert!(matches!(
        store.claim(&request(&period, "b")).await.unwrap(),
        Claim::Succeeded { .. }
    ));
    let forced = ClaimRequest {
        force: true,
        manual: true,
        trigger: Trigger::Manual,
        ..request(&period, "b")
    };
    let again = won(&store, &forced).await;
    assert_eq!((again.attempt, again.trigger), (2, Trigger::Manual));
}

async fn an_expired_lease_is_recovered_and_the_old_attempt_is_fenced(store: Store) {
    let period = month("2026-07");
    let short = ClaimRequest {
        lease: Duration::from_millis(200),
        ..request(&period, "a")
    };
    let old = won(&store, &short).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    // A lease of 600 ms: this store (a process that has just started)
    // leaves expired leases alone for lease/3 after its first answer,
    // which came 400 ms ago.
    let new = won(
        &store,
        &ClaimRequest {
            lease: Duration::from_millis(600),
            ..request(&period, "b")
        },
    )
    .await;
    assert_eq!(
        (new.attempt, new.trigger, new.failures),
        (2, Trigger::Recovery, 0)
    );
    assert_eq!(
        store.renew(&[&old], Duration::from_secs(60)).await.unwrap(),
        [false]
    );
    assert!(
        !store.finish(&old, &failed(None)).await.unwrap(),
        "a late writer must change nothing"
    );
    assert!(store.finish(&new, &succeeded()).await.unwrap());
    let history = store.history("billing", 10).await.unwrap();
    let outcomes: Vec<(i32, &str)> = history
        .iter()
        .map(|a| (a.attempt, a.outcome.as_str()))
        .collect();
    assert_eq!(outcomes, [(2, "succeeded"), (1, "lost")]);
}

async fn a_failed_period_waits_for_its_retry_unless_run_by_hand(store: Store) {
    let period = month("2026-07");
    let first = won(&store, &request(&period, "a")).await;
    assert!(
        store
            .finish(&first, &failed(Some(Duration::from_secs(3600))))
            .await
            .unwrap()
    );
    match store.claim(&request(&period, "b")).await.unwrap() {
        Claim::Failed {
            retry_at: Some(_),
            failures: 1,
        } => {}
        other => panic!("expected a pending retry, got {other:?}"),
    }
    let manual = ClaimRequest {
        manual: true,
        trigger: Trigger::Manual,
        ..request(&period, "b")
    };
    let second = won(&store, &manual).await;
    assert_eq!(
        (second.attempt, second.failures, second.trigger),
        (2, 1, Trigger::Manual)
    );
}

async fn a_due_retry_is_claimed_with_trigger_retry(store: Store) {
    let period = month("2026-07");
    let first = won(&store, &request(&period, "a")).await;
    assert!(
        store
            .finish(&first, &failed(Some(Duration::from_millis(100))))
            .await
            .unwrap()
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let retry = won(&store, &request(&period, "b")).await;
    assert_eq!((retry.attempt, retry.trigger), (2, Trigger::Retry));
    assert!(store.finish(&retry, &failed(None)).await.unwrap());
    match store.claim(&request(&period, "c")).await.unwrap() {
        Claim::Failed {
            retry_at: None,
            failures: 2,
        } => {}
        other => panic!("expected the budget spent, got {other:?}"),
    }
}

async fn a_released_claim_is_taken_at_once_and_spends_no_retry(store: Store) {
    let period = month("2026-07");
    let first = won(&store, &request(&period, "a")).await;
    assert!(store.release(&first, None).await.unwrap());
    let second = won(&store, &request(&period, "b")).await;
    assert_eq!(
        (second.attempt, second.failures, second.trigger),
        (2, 0, Trigger::Recovery)
    );
    assert_eq!(
        store
            .renew(&[&first, &second], Duration::from_secs(60))
            .await
            .unwrap(),
        [false, true]
    );
}

async fn release_by_key_holds_the_period_until_its_runner_confirms_the_stop(store: Store) {
    let (period, other) = (month("2026-07"), month("2026-08"));
    let first = won(&store, &request(&period, "a")).await;
    let released = store.release_key("billing:2026-07").await.unwrap();
    assert_eq!(released.map(|r| r.owner).as_deref(), Some("a"));
    assert!(
        store
            .release_key("billing:2026-07")
            .await
            .unwrap()
            .is_none()
    );
    // Its runner may be cut off and still running it: held, and it still
    // takes the job's one concurrency slot.
    assert!(matches!(
        store.claim(&request(&period, "b")).await.unwrap(),
        Claim::Held { .. }
    ));
    assert!(matches!(
        store.claim(&request(&other, "b")).await.unwrap(),
        Claim::Busy
    ));
    assert!(store.confirm_stopped(&first, None).await.unwrap());
    let second = won(&store, &request(&period, "b")).await;
    assert_eq!((second.attempt, second.trigger), (2, Trigger::Recovery));
}

async fn concurrency_limits_running_periods_of_a_job(store: Store) {
    let (july, august) = (month("2026-07"), month("2026-08"));
    let first = won(&store, &request(&july, "a")).await;
    assert_eq!(
        store.claim(&request(&august, "b")).await.unwrap(),
        Claim::Busy
    );
    let two = ClaimRequest {
        concurrency: 2,
        ..request(&august, "b")
    };
    let second = won(&store, &two).await;
    assert!(store.finish(&first, &succeeded()).await.unwrap());
    assert!(store.finish(&second, &succeeded()).await.unwrap());
    won(&store, &request(&month("2026-09"), "c")).await;
}

async fn concurrent_claims_of_one_key_have_one_winner(store: Store) {
    let period = month("2026-07");
    let claims = (0..16).map(|i| {
        let store = store.clone();
        let period = period.clone();
        tokio::spawn(async move {
            let owner = format!("owner-{i}");
            store.claim(&request(&period, &owner)).await.unwrap()
        })
    });
    let mut winners = 0;
    for claim in claims {
        if matches!(claim.await.unwrap(), Claim::Won(_)) {
            winners += 1;
        }
    }
    assert_eq!(winners, 1);
}

async fn an_sql_action_commits_with_the_outcome_or_not_at_all(store: Store) {
    let period = month("2026-07");
    let lease = won(&store, &request(&period, "a")).await;
    let bad = GroupedSql {
        failure: failed(Some(Duration::ZERO)),
        ..grouped(&lease, "INSERT INTO no_such_table VALUES ($1)", "x")
    };
    let ends = store
        .run_sql_group(&[bad], &limits(None), &|| {})
        .await
        .unwrap();
    assert!(
        matches!(ends.as_deref(), Some([GroupedEnd::Failed(_)])),
        "a failing statement is reported: {ends:?}"
    );
    let Claim::Won(lease) = store.claim(&request(&period, "a")).await.unwrap() else {
        panic!("the failed period is retried at once");
    };
    assert_eq!(
        store
            .renew(&[&lease], Duration::from_secs(60))
            .await
            .unwrap(),
        [true],
        "and the retry runs"
    );
    let statement = "UPDATE scheduler_jobs SET paused = paused WHERE name = $1";
    let ends = store
        .run_sql_group(
            &[grouped(&lease, statement, "billing")],
            &limits(None),
            &|| {},
        )
        .await
        .unwrap();
    assert!(
        matches!(ends.as_deref(), Some([GroupedEnd::Succeeded(_)])),
        "{ends:?}"
    );
    assert!(matches!(
        store.claim(&request(&period, "b")).await.unwrap(),
        Claim::Succeeded { .. }
    ));
}

async fn rows_reads_many_keys_in_one_call(store: Store) {
    for label in ["2026-05", "2026-06"] {
        let period = month(label);
        let lease = won(&store, &request(&period, "a")).await;
        store.finish(&lease, &succeeded()).await.unwrap();
    }
    let keys: Vec<String> = ["billing:2026-05", "billing:2026-06", "billing:2026-07"]
        .map(String::from)
        .to_vec();
    let mut found: Vec<String> = store.rows(&keys).await.unwrap().into_keys().collect();
    found.sort();
    assert_eq!(found, ["billing:2026-05", "billing:2026-06"]);
}

async fn a_job_is_first_seen_once_and_pause_is_shared(store: Store) {
    let names = ["billing".to_owned(), "report".to_owned()];
    let first = store.see_jobs(&names[..1]).await.unwrap()["billing"].clone();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let both = store.see_jobs(&names).await.unwrap();
    assert_eq!(both["billing"].first_seen, first.first_seen);
    assert!(both["report"].first_seen > first.first_seen);
    assert!(!both["billing"].paused);
    store.set_paused("billing", true).await.unwrap();
    assert!(store.see_jobs(&names).await.unwrap()["billing"].paused);
    assert_eq!(store.paused_jobs().await.unwrap(), ["billing"]);
    // A job paused before any scheduler saw it is first seen when one
    // does, not when it was paused (resumed, it starts at its next fire).
    store.set_paused("fresh", true).await.unwrap();
    tokio::time::sleep(Duration::from_millis(20)).await;
    let before = chrono::Utc::now();
    let fresh = store.see_jobs(&["fresh".to_owned()]).await.unwrap()["fresh"].clone();
    assert!(fresh.paused);
    assert!(
        fresh.first_seen >= before - chrono::TimeDelta::milliseconds(5)
            && fresh.first_seen <= chrono::Utc::now(),
        "{:?}",
        fresh.first_seen
    );
}

/// More jobs than one statement sights (SQLite sights a thousand a
/// statement, in one transaction): each is seen once, all at one instant,
/// and sighted again none is new.
async fn more_jobs_than_a_statement_sights_are_each_seen_once_at_one_instant(store: Store) {
    let names: Vec<String> = (0..2_500).map(|i| format!("job-{i}")).collect();
    let first = store.see_jobs(&names).await.unwrap();
    assert_eq!(first.len(), names.len());
    assert!(first.values().all(|record| record.new));
    let at = first["job-0"].first_seen;
    assert!(first.values().all(|record| record.first_seen == at));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let again = store.see_jobs(&names).await.unwrap();
    assert_eq!(again.len(), names.len());
    assert!(
        again
            .values()
            .all(|record| !record.new && record.first_seen == at)
    );
}

async fn the_instants_jobs_owe_from_are_recorded_at_once_and_move_only_with_their_timing(
    store: Store,
) {
    let names: Vec<String> = (0..500).map(|i| format!("job-{i}")).collect();
    store.see_jobs(&names).await.unwrap();
    let at = |minute: u32| {
        chrono::Utc
            .with_ymd_and_hms(2026, 12, 1, 0, minute, 0)
            .unwrap()
    };
    let owes = |name: &String, minute, timing: &str| scheduler::store::Owes {
        job: name.clone(),
        from: at(minute),
        period: at(minute),
        timing: timing.to_owned(),
    };
    store.note_owed(&[owes(&names[0], 1, "a")]).await.unwrap();
    // One write for them all; the one recorded already under the same
    // timing keeps its instant.
    let owed: Vec<_> = names.iter().map(|name| owes(name, 2, "a")).collect();
    store.note_owed(&owed).await.unwrap();
    store.note_owed(&[]).await.unwrap();
    let seen = store.first_seen(&names).await.unwrap();
    assert_eq!(seen.len(), 500);
    assert_eq!(seen["job-0"].owed_from, Some(at(1)));
    assert_eq!(seen["job-0"].timing.as_deref(), Some("a"));
    assert!(
        names[1..]
            .iter()
            .all(|name| seen[name].owed_from == Some(at(2)))
    );
    let records = store.see_jobs(&names[..2]).await.unwrap();
    assert_eq!(records["job-1"].owed_from, Some(at(2)));
    assert_eq!(records["job-1"].timing.as_deref(), Some("a"));
    // Another timing moves it.
    store.note_owed(&[owes(&names[1], 5, "b")]).await.unwrap();
    let seen = store.first_seen(&names[..2]).await.unwrap();
    assert_eq!(seen["job-1"].owed_from, Some(at(5)));
    assert_eq!(seen["job-1"].timing.as_deref(), Some("b"));
}

async fn reclaimable_lists_expired_released_and_due_retries_only(store: Store) {
    let short = |period| ClaimRequest {
        lease: Duration::from_millis(100),
        ..request(period, "a")
    };
    let (expired, released, retry, held, done) = (
        month("2026-01"),
        month("2026-02"),
        month("2026-03"),
        month("2026-04"),
        month("2026-05"),
    );
    let many = |period| ClaimRequest {
        concurrency: 10,
        ..short(period)
    };
    won(&store, &many(&expired)).await;
    let lease = won(&store, &many(&released)).await;
    store.release(&lease, None).await.unwrap();
    let lease = won(&store, &many(&retry)).await;
    store
        .finish(&lease, &failed(Some(Duration::from_millis(50))))
        .await
        .unwrap();
    won(
        &store,
        &ClaimRequest {
            lease: Duration::from_secs(60),
            ..many(&held)
        },
    )
    .await;
    let lease = won(&store, &many(&done)).await;
    store.finish(&lease, &succeeded()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let found = store.takeable(&["billing".to_owned()], 100).await.unwrap();
    let labels: Vec<&str> = found.iter().map(|r| r.period.label.as_str()).collect();
    assert_eq!(labels, ["2026-01", "2026-02", "2026-03"]);
    assert_eq!(found[0].period, expired);
    let fires = store.last_fires(&["billing".to_owned()]).await.unwrap();
    assert!(fires.contains_key("billing"));
}

async fn prune_deletes_only_old_finished_claims(store: Store) {
    let (done, running) = (month("2026-06"), month("2026-07"));
    let lease = won(&store, &request(&done, "a")).await;
    store.finish(&lease, &succeeded()).await.unwrap();
    won(&store, &request(&running, "a")).await;
    assert_eq!(
        store
            .prune("billing", Duration::from_secs(3600), Duration::ZERO, false)
            .await
            .unwrap(),
        0
    );
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(
        store
            .prune("billing", Duration::from_millis(10), Duration::ZERO, false)
            .await
            .unwrap(),
        1
    );
    assert_eq!(
        store.history("billing", 10).await.unwrap().len(),
        1,
        "the running attempt stays"
    );
}

/// A claim a waiting period may need (its window overlaps or touches the
/// waiting period's) is not pruned, however old: pruned, it would read as
/// a period never run, and be run again. Once the waiting period is
/// claimed, it may be.
async fn prune_keeps_what_a_waiting_period_needs(store: Store) {
    let (june, july) = (month("2026-06"), month("2026-07"));
    let lease = won(&store, &request(&june, "a")).await;
    store.finish(&lease, &succeeded()).await.unwrap();
    let waiting = scheduler::store::Waiting {
        job: "report",
        period: &july,
        fire: july.end,
        watch: "other:2026-07".to_owned(),
        waits: "other: 0/1".to_owned(),
    };
    store.note_waiting(&[waiting]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let pruned = |store: Store| async move {
        store
            .prune("billing", Duration::from_millis(10), Duration::ZERO, false)
            .await
            .unwrap()
    };
    assert_eq!(
        pruned(store.clone()).await,
        0,
        "june touches the waiting july"
    );
    let mut claim = request(&july, "r");
    claim.job = "report";
    won(&store, &claim).await;
    assert_eq!(pruned(store.clone()).await, 1);
}

async fn prune_never_deletes_a_period_fired_inside_the_catch_up_window(store: Store) {
    let period = month("2026-06");
    let lease = won(&store, &request(&period, "a")).await;
    store.finish(&lease, &succeeded()).await.unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    let window = Duration::from_secs(3600);
    assert_eq!(
        store
            .prune("billing", Duration::from_millis(10), window, false)
            .await
            .unwrap(),
        0,
        "its fire is inside the window: a pruned period could be claimed again"
    );
}

async fn a_heartbeat_racing_its_own_recorded_outcome_reports_no_takeover(store: Store) {
    let period = month("2026-07");
    let sent = Instant::now();
    let lease = won(&store, &request(&period, "a")).await;
    let heartbeats = Heartbeats::start(store.clone(), Duration::from_secs(60));
    let watch = heartbeats.watch(&lease, sent, Duration::from_secs(60));
    // The run writes its outcome while a renewal is on its way.
    watch.recording();
    assert!(store.finish(&lease, &succeeded()).await.unwrap());
    heartbeats.renew_now().await;
    assert!(
        tokio::time::timeout(Duration::from_millis(200), watch.lost())
            .await
            .is_err(),
        "its own outcome is not a takeover"
    );
}

async fn a_released_claim_is_found_taken_over_by_the_next_heartbeat(store: Store) {
    let period = month("2026-07");
    let sent = Instant::now();
    let lease = won(&store, &request(&period, "a")).await;
    let heartbeats = Heartbeats::start(store.clone(), Duration::from_secs(60));
    let watch = heartbeats.watch(&lease, sent, Duration::from_secs(60));
    heartbeats.renew_now().await;
    store.release_key(lease.key.as_str()).await.unwrap();
    heartbeats.renew_now().await;
    let loss = tokio::time::timeout(Duration::from_secs(5), watch.lost()).await;
    assert_eq!(loss.ok(), Some(Loss::TakenOver));
}

async fn a_second_watch_of_one_key_leaves_the_first_one_informed(store: Store) {
    let period = month("2026-07");
    let sent = Instant::now();
    let first = won(&store, &request(&period, "a")).await;
    let heartbeats = Heartbeats::start(store.clone(), Duration::from_secs(60));
    let old = heartbeats.watch(&first, sent, Duration::from_secs(60));
    store.release_key(first.key.as_str()).await.unwrap();
    store.confirm_stopped(&first, None).await.unwrap();
    let second = won(&store, &request(&period, "a")).await;
    let new = heartbeats.watch(&second, Instant::now(), Duration::from_secs(60));
    heartbeats.renew_now().await;
    let loss = tokio::time::timeout(Duration::from_secs(5), old.lost()).await;
    assert_eq!(loss.ok(), Some(Loss::TakenOver), "the old attempt is told");
    drop(old);
    heartbeats.renew_now().await;
    assert!(
        tokio::time::timeout(Duration::from_millis(200), new.lost())
            .await
            .is_err(),
        "and the new one keeps its renewals"
    );
}

async fn a_lease_not_renewed_in_time_fences_the_run(store: Store) {
    let period = month("2026-07");
    let lease = won(&store, &request(&period, "a")).await;
    let heartbeats = Heartbeats::start(store.clone(), Duration::from_secs(3));
    // Claimed 2.5 s ago and never renewed: past lease (3 s) minus one
    // heartbeat interval (1 s).
    let sent = Instant::now() - Duration::from_millis(2500);
    let watch = heartbeats.watch(&lease, sent, Duration::from_secs(3));
    assert!(watch.fenced());
    let loss = tokio::time::timeout(Duration::from_secs(5), watch.lost()).await;
    assert_eq!(loss.ok(), Some(Loss::Fenced));
}

async fn an_sql_action_past_its_timeout_is_stopped_and_rolled_back(store: Store) {
    let period = month("2026-07");
    let lease = won(&store, &request(&period, "a")).await;
    let endless = match store {
        Store::Sqlite(_) => {
            "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x + 1 FROM c) SELECT count(*) FROM c"
        }
        Store::Postgres(_) => "SELECT pg_sleep(30)",
    };
    let started = std::time::Instant::now();
    let endless = GroupedSql {
        timeout: Some(Duration::from_millis(500)),
        ..bare(&lease, endless)
    };
    let result = store
        .run_sql_group(&[endless], &limits(None), &|| {})
        .await
        .unwrap();
    assert!(
        matches!(result.as_deref(), Some([GroupedEnd::Failed(_)])),
        "{result:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(20), "not stopped");
    assert!(matches!(
        store.claim(&request(&period, "b")).await.unwrap(),
        Claim::Failed {
            retry_at: Some(_),
            ..
        }
    ));
}

#[tokio::test]
async fn a_sqlite_prune_around_the_cutoff_leaves_no_attempt_without_its_claim() {
    use sqlx::Connection;
    let db = TestDb::sqlite();
    let store = db.store().await;
    let mut conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
    // 40,000 finished claims spread over the two seconds around the cutoff
    // (keep = 60 s); the trigger writes each one's attempt row.
    sqlx::query(
        "WITH RECURSIVE n(i) AS (SELECT 0 UNION ALL SELECT i + 1 FROM n WHERE i < 39999)
         INSERT INTO scheduler_claims (period_key, job, period, period_start, period_end,
             scheduled_at, state, attempt, trigger, owner, started_at, finished_at)
         SELECT 'billing:' || i, 'billing', i, 0, 1, 0, 'succeeded', 1, 'schedule', 'a', 0,
                CAST(unixepoch('subsec') * 1000 AS INTEGER) - 61000 + i / 20
           FROM n",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    store
        .prune("billing", Duration::from_secs(60), Duration::ZERO, false)
        .await
        .unwrap();
    let orphans: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM scheduler_attempts a
          WHERE NOT EXISTS (SELECT 1 FROM scheduler_claims c WHERE c.period_key = a.period_key)",
    )
    .fetch_one(&mut conn)
    .await
    .unwrap();
    assert_eq!(orphans, 0);
}

async fn an_outcome_written_just_after_a_release_is_kept(store: Store) {
    let period = month("2026-07");
    let first = won(&store, &request(&period, "a")).await;
    // `scheduler release` lands as the job exits 0: nobody claimed the
    // period since, so the finished work counts.
    store.release_key(first.key.as_str()).await.unwrap();
    assert!(store.finish(&first, &succeeded()).await.unwrap());
    assert!(matches!(
        store.claim(&request(&period, "b")).await.unwrap(),
        Claim::Succeeded { .. }
    ));
    let history = store.history("billing", 10).await.unwrap();
    assert_eq!(
        history[0].outcome,
        scheduler::store::AttemptOutcome::Succeeded
    );
}

fn months(labels: &[&str]) -> Vec<Period> {
    labels.iter().map(|l| month(l)).collect()
}

fn batch<'a>(periods: &'a [Period], owner: &'a str, concurrency: u32) -> Vec<ClaimRequest<'a>> {
    periods
        .iter()
        .map(|p| ClaimRequest {
            concurrency,
            ..request(p, owner)
        })
        .collect()
}

async fn batches_racing_a_batch_and_one_key_claims_give_each_key_one_winner(db: TestDb) {
    let periods = months(&[
        "2026-01", "2026-02", "2026-03", "2026-04", "2026-05", "2026-06", "2026-07", "2026-08",
    ]);
    // Separate connections: on SQLite each store is a writer of its own.
    let mut racers = Vec::new();
    for i in 0..4 {
        let store = db.store().await;
        let periods = periods.clone();
        racers.push(tokio::spawn(async move {
            let owner = format!("batch-{i}");
            // Every racer lists the keys in another order; the store orders them.
            let mut periods = periods;
            periods.rotate_left((i * 3) % 8);
            let claims = store
                .claim_many(&batch(&periods, &owner, 100))
                .await
                .unwrap();
            won_keys(&claims)
        }));
    }
    for (i, period) in periods.iter().enumerate().step_by(3) {
        let store = db.store().await;
        let period = period.clone();
        racers.push(tokio::spawn(async move {
            let owner = format!("single-{i}");
            let one = ClaimRequest {
                concurrency: 100,
                ..request(&period, &owner)
            };
            won_keys(&[store.claim(&one).await.unwrap()])
        }));
    }
    let mut winners: Vec<String> = Vec::new();
    for racer in racers {
        winners.extend(racer.await.unwrap());
    }
    winners.sort();
    let mut expected: Vec<String> = periods
        .iter()
        .map(|p| format!("billing:{}", p.label))
        .collect();
    expected.sort();
    assert_eq!(winners, expected, "every key won exactly once");
}

async fn a_burst_claim_answers_a_job_another_transaction_is_claiming_contended(db: TestDb) {
    let store = db.store().await;
    let billing = months(&["2026-01", "2026-02"]);
    let other = month("2026-01");
    let mut burst = batch(&billing, "a", 10);
    // A job before the held one and one after it: each lock is tried on
    // its own.
    for job in ["audit", "zeta"] {
        burst.push(ClaimRequest {
            job,
            ..request(&other, "a")
        });
    }
    // Another transaction holds billing's lock, as a claim of its keys on
    // another replica does while it runs.
    let holder = db.url.starts_with("postgres").then(|| {
        let url = db.url.clone();
        let (held, hold) = (
            tokio::sync::oneshot::channel(),
            tokio::sync::oneshot::channel::<()>(),
        );
        let (held_tx, held_rx) = held;
        let (release, released) = hold;
        let task = tokio::spawn(async move {
            use sqlx::Connection;
            let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
            let mut tx = conn.begin().await.unwrap();
            sqlx::query(
                "SELECT pg_advisory_xact_lock(hashtextextended('scheduler_claims:billing', 0))",
            )
            .execute(&mut *tx)
            .await
            .unwrap();
            held_tx.send(()).unwrap();
            let _ = released.await;
            tx.commit().await.unwrap();
        });
        (held_rx, release, task)
    });
    let Some((held, release, task)) = holder else {
        // SQLite: claims take turns through the write lock; nothing is
        // contended.
        let claims = store.claim_many_unqueued(&burst).await.unwrap();
        assert_eq!(won_keys(&claims).len(), 4, "{claims:?}");
        return;
    };
    held.await.unwrap();
    let claims = store.claim_many_unqueued(&burst).await.unwrap();
    assert!(
        matches!(
            claims[..],
            [
                Claim::Contended,
                Claim::Contended,
                Claim::Won(_),
                Claim::Won(_)
            ]
        ),
        "billing's keys are not decided under another's lock, the other jobs' are: {claims:?}"
    );
    // A batch that waits, and a batch of one key, queue for the lock.
    let later = month("2026-03");
    let waiting = {
        let store = db.store().await;
        let later = later.clone();
        tokio::spawn(async move {
            let one = ClaimRequest {
                concurrency: 10,
                ..request(&later, "b")
            };
            store
                .claim_many_unqueued(std::slice::from_ref(&one))
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !waiting.is_finished(),
        "a one-key claim did not wait for the lock"
    );
    release.send(()).unwrap();
    task.await.unwrap();
    assert_eq!(won_keys(&waiting.await.unwrap()), ["billing:2026-03"]);
    // Asked again, the keys are decided: won once, and held after that.
    let again = store.claim_many_unqueued(&burst[..2]).await.unwrap();
    assert_eq!(won_keys(&again), ["billing:2026-01", "billing:2026-02"]);
    let after = store.claim_many_unqueued(&burst[..2]).await.unwrap();
    assert!(
        after.iter().all(|c| matches!(c, Claim::Held { .. })),
        "{after:?}"
    );
}

fn won_keys(claims: &[Claim]) -> Vec<String> {
    claims
        .iter()
        .filter_map(|c| match c {
            Claim::Won(lease) => Some(lease.key.to_string()),
            _ => None,
        })
        .collect()
}

async fn concurrency_holds_inside_one_batch_and_across_batches(store: Store) {
    let first = months(&["2026-01", "2026-02", "2026-03"]);
    let claims = store.claim_many(&batch(&first, "a", 2)).await.unwrap();
    assert_eq!(won_keys(&claims), ["billing:2026-01", "billing:2026-02"]);
    assert_eq!(
        claims[2],
        Claim::Busy,
        "the third would be a third running at once"
    );
    let second = months(&["2026-04", "2026-05"]);
    let claims = store.claim_many(&batch(&second, "b", 2)).await.unwrap();
    assert_eq!(
        claims,
        [Claim::Busy, Claim::Busy],
        "both slots are taken by the first batch"
    );
    let Claim::Won(done) = store
        .claim(&ClaimRequest {
            concurrency: 3,
            ..request(&month("2026-06"), "c")
        })
        .await
        .unwrap()
    else {
        panic!("a third slot is free with concurrency 3");
    };
    assert!(store.finish(&done, &succeeded()).await.unwrap());
    let leases: Vec<Lease> = store
        .claim_many(&batch(&first, "a", 2))
        .await
        .unwrap()
        .into_iter()
        .filter_map(|c| match c {
            Claim::Won(lease) => Some(lease),
            _ => None,
        })
        .collect();
    assert!(leases.is_empty(), "held keys are not won again");
}

async fn a_batch_takes_expired_released_and_due_retry_claims_like_a_one_key_claim(store: Store) {
    let periods = months(&["2026-01", "2026-02", "2026-03", "2026-04", "2026-05"]);
    let short = |p| ClaimRequest {
        lease: Duration::from_millis(200),
        concurrency: 100,
        ..request(p, "old")
    };
    let mut old = Vec::new();
    for period in &periods[..4] {
        old.push(won(&store, &short(period)).await);
    }
    // 01 expires, 02 is released by its runner, 03 fails with a retry due
    // at once, 04 fails with a retry due in an hour, 05 is new.
    assert!(store.release(&old[1], None).await.unwrap());
    assert!(
        store
            .finish(&old[2], &failed(Some(Duration::ZERO)))
            .await
            .unwrap()
    );
    assert!(
        store
            .finish(&old[3], &failed(Some(Duration::from_secs(3600))))
            .await
            .unwrap()
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Past lease/3 since the store's first answer: expired leases are
    // taken over.
    let asks: Vec<ClaimRequest<'_>> = batch(&periods, "new", 100)
        .into_iter()
        .map(|r| ClaimRequest {
            lease: Duration::from_millis(600),
            ..r
        })
        .collect();
    let claims = store.claim_many(&asks).await.unwrap();
    let got: Vec<(i32, Trigger)> = claims
        .iter()
        .filter_map(|c| match c {
            Claim::Won(l) => Some((l.attempt, l.trigger)),
            _ => None,
        })
        .collect();
    assert_eq!(
        got,
        [
            (2, Trigger::Recovery),
            (2, Trigger::Recovery),
            (2, Trigger::Retry),
            (1, Trigger::Schedule)
        ]
    );
    assert!(
        matches!(
            claims[3],
            Claim::Failed {
                retry_at: Some(_),
                failures: 1
            }
        ),
        "a retry not yet due is not taken: {:?}",
        claims[3]
    );
    assert!(
        !store.finish(&old[0], &succeeded()).await.unwrap(),
        "the expired attempt is fenced"
    );
}

/// Copies the job row `billing` under the name `$1`: evidence that a
/// statement committed.
const COPY: &str = "INSERT INTO scheduler_jobs (name, first_seen, paused)
    SELECT $1, first_seen, paused FROM scheduler_jobs WHERE name = 'billing'";

fn grouped<'a>(lease: &'a Lease, statement: &'a str, name: &str) -> GroupedSql<'a> {
    GroupedSql {
        lease,
        work: Work::Statement {
            statement: statement.into(),
            params: vec![scheduler::store::Param::Text(name.to_owned())],
        },
        timeout: None,
        failure: failed(Some(Duration::from_secs(3600))),
        secrets: &NO_SECRETS,
    }
}

static NO_SECRETS: scheduler::template::Secrets = scheduler::template::Secrets::NONE;

/// A group action of `statement` with no params.
fn bare<'a>(lease: &'a Lease, statement: &'a str) -> GroupedSql<'a> {
    GroupedSql {
        work: Work::Statement {
            statement: statement.into(),
            params: Vec::new(),
        },
        ..grouped(lease, statement, "")
    }
}

async fn leases(store: &Store, periods: &[Period], owner: &str) -> Vec<Lease> {
    store
        .claim_many(&batch(periods, owner, 100))
        .await
        .unwrap()
        .into_iter()
        .map(|c| match c {
            Claim::Won(lease) => lease,
            other => panic!("expected to win, got {other:?}"),
        })
        .collect()
}

async fn made(store: &Store, names: &[&str]) -> Vec<String> {
    let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
    let mut found: Vec<String> = store
        .first_seen(&names)
        .await
        .unwrap()
        .into_keys()
        .collect();
    found.sort();
    found
}

async fn a_group_of_sql_actions_commits_each_with_its_outcome_and_a_failing_one_fails_alone(
    store: Store,
) {
    store.see_jobs(&["billing".into()]).await.unwrap();
    let periods = months(&["2026-01", "2026-02", "2026-03"]);
    let leases = leases(&store, &periods, "a").await;
    // Its second row breaks the primary key: the statement fails half-way.
    let half = format!(
        "{COPY} UNION ALL SELECT 'billing', first_seen, paused FROM scheduler_jobs WHERE name = 'billing'"
    );
    let runs = [
        grouped(&leases[0], COPY, "made-01"),
        grouped(&leases[1], &half, "made-02"),
        grouped(&leases[2], COPY, "made-03"),
    ];
    let ends = store
        .run_sql_group(&runs, &limits(None), &|| {})
        .await
        .unwrap()
        .expect("not stopped");
    assert!(
        matches!(
            ends[..],
            [
                GroupedEnd::Succeeded(_),
                GroupedEnd::Failed(_),
                GroupedEnd::Succeeded(_)
            ]
        ),
        "{ends:?}"
    );
    assert_eq!(
        made(&store, &["made-01", "made-02", "made-03"]).await,
        ["made-01", "made-03"],
        "nothing of the failing statement is left"
    );
    let claims: Vec<Claim> = store.claim_many(&batch(&periods, "b", 100)).await.unwrap();
    assert!(
        matches!(claims[0], Claim::Succeeded { .. }),
        "{:?}",
        claims[0]
    );
    assert!(
        matches!(
            claims[1],
            Claim::Failed {
                retry_at: Some(_),
                failures: 1
            }
        ),
        "{:?}",
        claims[1]
    );
    assert!(
        matches!(claims[2], Claim::Succeeded { .. }),
        "{:?}",
        claims[2]
    );
    let history = store.history("billing", 10).await.unwrap();
    let failed = history
        .iter()
        .find(|a| a.period_key == "billing:2026-02")
        .unwrap();
    assert_eq!(failed.outcome, scheduler::store::AttemptOutcome::Failed);
    assert!(
        failed
            .error
            .as_deref()
            .unwrap_or_default()
            .starts_with("SQL failed")
    );
}

async fn a_group_runs_nothing_of_a_period_whose_claim_moved_on(store: Store) {
    store.see_jobs(&["billing".into()]).await.unwrap();
    let (january, february) = (month("2026-01"), month("2026-02"));
    let short = ClaimRequest {
        lease: Duration::from_millis(200),
        ..request(&january, "a")
    };
    let old = won(&store, &short).await;
    let kept = won(
        &store,
        &ClaimRequest {
            concurrency: 2,
            ..request(&february, "a")
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    // Past lease/3 since the store's first answer: taken over.
    let taken = won(
        &store,
        &ClaimRequest {
            concurrency: 2,
            lease: Duration::from_millis(600),
            ..request(&january, "b")
        },
    )
    .await;
    let runs = [
        grouped(&old, COPY, "made-01"),
        grouped(&kept, COPY, "made-02"),
    ];
    let ends = store
        .run_sql_group(&runs, &limits(None), &|| {})
        .await
        .unwrap()
        .expect("not stopped");
    assert!(
        matches!(ends[..], [GroupedEnd::Moved, GroupedEnd::Succeeded(_)]),
        "{ends:?}"
    );
    assert_eq!(made(&store, &["made-01", "made-02"]).await, ["made-02"]);
    assert!(
        store.finish(&taken, &succeeded()).await.unwrap(),
        "the new attempt is untouched"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_postgres_claim_reports_a_period_held_by_a_running_group_without_waiting() {
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let store = db.store().await;
    let other = db.store().await;
    let period = month("2026-01");
    let lease = won(&store, &request(&period, "a")).await;
    let group = tokio::spawn(async move {
        let runs = [bare(&lease, "SELECT pg_sleep(3)")];
        store
            .run_sql_group(&runs, &limits(None), &|| {})
            .await
            .unwrap()
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    let claim = other.claim(&request(&period, "b")).await.unwrap();
    assert!(
        !group.is_finished(),
        "the claim came back while the group still ran"
    );
    assert!(matches!(claim, Claim::Held { .. }), "{claim:?}");
    let ends = group.await.unwrap().expect("not stopped");
    assert!(
        // The time taken has the first statement's round trip taken off.
        matches!(ends[..], [GroupedEnd::Succeeded(took)] if took >= Duration::from_millis(2_900)),
        "{ends:?}"
    );
}

/// A period noted waiting is not ready until the upstream key it watches
/// succeeds (the success wakes it); one whose watched key succeeded before
/// it was noted is ready at once; a claimed one is never listed.
async fn a_waiting_period_is_woken_by_the_success_of_the_key_it_watches(store: Store) {
    let july = month("2026-07");
    let august = month("2026-08");
    let (upstream, early) = (month("2026-06"), month("2026-05"));
    let done_early = won(&store, &request(&early, "u")).await;
    assert!(store.finish(&done_early, &succeeded()).await.unwrap());
    let rows = [
        (july.clone(), "billing:2026-06"),
        (august.clone(), "billing:2026-05"),
    ];
    let waiting: Vec<scheduler::store::Waiting<'_>> = rows
        .iter()
        .map(|(period, watch)| scheduler::store::Waiting {
            job: "report",
            period,
            fire: period.end,
            watch: (*watch).to_owned(),
            waits: "billing: 0/1".to_owned(),
        })
        .collect();
    store.note_waiting(&waiting).await.unwrap();
    let report = ["report".to_owned()];
    let ready = |found: Vec<scheduler::store::Reclaimable>| -> Vec<String> {
        found.into_iter().map(|r| r.period.label).collect()
    };
    // August watches a key that succeeded before it was noted.
    assert_eq!(
        ready(store.ready(&report, 10, false).await.unwrap()),
        ["2026-08"]
    );
    let lease = won(&store, &request(&upstream, "u")).await;
    assert_eq!(
        ready(store.ready(&report, 10, false).await.unwrap()),
        ["2026-08"]
    );
    assert!(store.finish(&lease, &succeeded()).await.unwrap());
    assert_eq!(
        ready(store.ready(&report, 10, false).await.unwrap()),
        ["2026-07", "2026-08"]
    );
    // Claimed, a period is no longer listed, woken or not.
    let mut claim = request(&july, "r");
    claim.job = "report";
    won(&store, &claim).await;
    assert_eq!(
        ready(store.ready(&report, 10, true).await.unwrap()),
        ["2026-08"]
    );
    assert_eq!(
        ready(store.waiting_periods(&report, 10).await.unwrap()),
        ["2026-08"]
    );
    // Other jobs' rows are not this job's.
    assert!(
        store
            .ready(&["other".to_owned()], 10, true)
            .await
            .unwrap()
            .is_empty()
    );
}

/// A succeeded period is reopened for a new attempt once: a second
/// reopening of the same attempt, or of a period not succeeded, does
/// nothing; the reopened period is claimable at once, and a scan that
/// finds it (another replica's, before the reopener claims it) takes it
/// as the upstream rerun it is, where a released run is a recovery.
async fn a_stale_period_is_reopened_once_by_its_attempt(store: Store) {
    let jobs = ["billing".to_owned()];
    let period = month("2026-07");
    let lease = won(&store, &request(&period, "a")).await;
    assert!(
        !store.reopen("billing:2026-07", 1).await.unwrap(),
        "running"
    );
    assert!(store.release(&lease, None).await.unwrap());
    let found = store.takeable(&jobs, 10).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].trigger, Trigger::Recovery, "a released run");
    let lease = won(&store, &request(&period, "a")).await;
    assert!(store.finish(&lease, &succeeded()).await.unwrap());
    assert!(
        !store.reopen("billing:2026-07", 1).await.unwrap(),
        "another attempt"
    );
    assert!(store.reopen("billing:2026-07", 2).await.unwrap());
    assert!(
        !store.reopen("billing:2026-07", 2).await.unwrap(),
        "reopened already"
    );
    let found = store.takeable(&jobs, 10).await.unwrap();
    assert_eq!(found.len(), 1);
    assert_eq!(found[0].trigger, Trigger::Upstream, "a reopened period");
    let again = won(&store, &request(&period, "b")).await;
    assert_eq!(again.attempt, 3);
}

/// A period asked for as `upstream` (one that waited for its upstream
/// periods, or that an upstream rerun reopened) takes a reopened period
/// as that rerun, but a failed one only when its retry is due: meanwhile
/// another replica may have run it and failed for good, and a retry
/// budget spent is not spent again. Before, the ask was made as a manual
/// one, which takes any failed period.
async fn an_upstream_ask_takes_a_failed_period_only_when_its_retry_is_due(store: Store) {
    use scheduler::engine::{Ask, Engine, Taken, due::Due};
    let job = std::sync::Arc::new(job("schedule = \"0 2 1 * *\"\nperiod = \"month\""));
    let engine = Engine::new(store.clone(), Duration::from_secs(60), "w".into()).unwrap();
    let period = month("2026-07");
    let ask = Ask::scheduled(
        job.clone(),
        Due {
            fire: period.end,
            period: period.clone(),
            trigger: Trigger::Upstream,
            shard: None,
        },
    );
    let claim = async || {
        engine
            .claim(std::slice::from_ref(&ask))
            .await
            .unwrap()
            .remove(0)
    };
    // A lease from each won ask: the ask's mark of its period as running
    // here ends with it.
    let won_ask = async || match claim().await {
        Taken::Won(won) => won.lease.clone(),
        _ => panic!("expected to win"),
    };
    let first = won_ask().await;
    assert_eq!(first.trigger, Trigger::Upstream);
    assert!(
        store
            .finish(&first, &failed(Some(Duration::from_secs(3600))))
            .await
            .unwrap()
    );
    assert!(
        matches!(
            claim().await,
            Taken::Not(Claim::Failed {
                retry_at: Some(_),
                ..
            })
        ),
        "a retry not due yet is not taken"
    );
    let by_hand = ClaimRequest {
        job: "t",
        manual: true,
        trigger: Trigger::Manual,
        ..request(&period, "m")
    };
    let second = won(&store, &by_hand).await;
    assert!(store.finish(&second, &failed(None)).await.unwrap());
    assert!(
        matches!(
            claim().await,
            Taken::Not(Claim::Failed { retry_at: None, .. })
        ),
        "a spent retry budget is not spent again"
    );
    let forced = ClaimRequest {
        force: true,
        ..by_hand
    };
    let third = won(&store, &forced).await;
    assert!(store.finish(&third, &succeeded()).await.unwrap());
    assert!(store.reopen("t:2026-07", third.attempt).await.unwrap());
    let reopened = won_ask().await;
    assert_eq!((reopened.attempt, reopened.trigger), (4, Trigger::Upstream));
    let soon = failed(Some(Duration::from_millis(50)));
    assert!(store.finish(&reopened, &soon).await.unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let retried = won_ask().await;
    assert_eq!((retried.attempt, retried.trigger), (5, Trigger::Retry));
}

/// An Idempotency-Key is new once; after that it is known, in progress
/// and then with its answer; a key in progress past its bound is taken
/// over by the same request only; freeing one in progress makes it new
/// again, and an answered one is never freed.
async fn an_idempotency_key_is_new_once_then_known_with_its_answer(store: Store) {
    use scheduler::store::{KeyClaim, KeyState};
    let minute = Duration::from_secs(60);
    let known = |claim: KeyClaim| match claim {
        KeyClaim::Known(record) => record,
        KeyClaim::New => panic!("expected a known key"),
    };
    let claim = store.claim_key("k1", "h1", minute, minute, Some("/v1/runs/r1"));
    assert!(matches!(claim.await.unwrap(), KeyClaim::New));
    let running = known(
        store
            .claim_key("k1", "h1", minute, minute, None)
            .await
            .unwrap(),
    );
    assert_eq!(running.state, KeyState::Running);
    assert_eq!((running.stale, running.run_going), (0, 0));
    assert_eq!(running.location.as_deref(), Some("/v1/runs/r1"));
    store
        .answer_key("k1", 201, "{}", Some("/v1/runs/r1"), None)
        .await
        .unwrap();
    for request in ["h1", "h2"] {
        let answered = known(
            store
                .claim_key("k1", request, minute, minute, None)
                .await
                .unwrap(),
        );
        assert_eq!(answered.state, KeyState::Answered);
        assert_eq!(
            (answered.status, answered.request.as_str()),
            (Some(201), "h1")
        );
    }
    store.forget_key("k1").await.unwrap();
    assert!(matches!(
        store
            .claim_key("k1", "h1", minute, minute, None)
            .await
            .unwrap(),
        KeyClaim::Known(_)
    ));
    // In progress past its bound (0): the same request takes it over,
    // another is told what is known.
    let claim = store.claim_key("k2", "h1", Duration::ZERO, minute, None);
    assert!(matches!(claim.await.unwrap(), KeyClaim::New));
    let other = known(
        store
            .claim_key("k2", "h2", minute, minute, None)
            .await
            .unwrap(),
    );
    assert_eq!((other.state, other.stale), (KeyState::Running, 1));
    let claim = store.claim_key("k2", "h1", minute, minute, None);
    assert!(matches!(claim.await.unwrap(), KeyClaim::New));
    // Freed in progress (its request failed on the server): new again.
    store.forget_key("k2").await.unwrap();
    let claim = store.claim_key("k2", "h2", minute, minute, None);
    assert!(matches!(claim.await.unwrap(), KeyClaim::New));
}

/// A run asked for over the API is running while its replica keeps it
/// alive, abandoned-looking (not alive) once it stops, done once ended;
/// its key points at it and counts as in flight while it goes.
async fn an_api_run_is_alive_while_kept_and_done_once_ended(store: Store) {
    use scheduler::store::{ApiRun, ApiRunState, KeyClaim};
    let minute = Duration::from_secs(60);
    let run = |id: &str| ApiRun {
        id: id.to_owned(),
        job: "billing".to_owned(),
        requested_by: "ci".to_owned(),
        owner: "a".to_owned(),
        state: ApiRunState::Running,
        body: "{\"periods\": []}".to_owned(),
        alive: 1,
        created_at: 0,
    };
    let claim = store.claim_key("k", "h", minute, minute, None);
    assert!(matches!(claim.await.unwrap(), KeyClaim::New));
    store.create_run(&run("r1"), minute, minute).await.unwrap();
    store.note_key_run("k", "r1", "/v1/runs/r1").await.unwrap();
    let going = store.api_run("r1").await.unwrap().expect("r1");
    assert_eq!((going.state, going.alive), (ApiRunState::Running, 1));
    match store
        .claim_key("k", "h", minute, minute, None)
        .await
        .unwrap()
    {
        KeyClaim::Known(record) => {
            assert_eq!(record.run_going, 1);
            assert_eq!(record.run_id.as_deref(), Some("r1"));
        }
        KeyClaim::New => panic!("the key of a running run is known"),
    }
    store
        .update_run("r1", "{\"periods\": [1]}", Some(minute), minute)
        .await
        .unwrap();
    let done = store.api_run("r1").await.unwrap().expect("r1");
    assert_eq!(done.state, ApiRunState::Done);
    assert_eq!(done.body, "{\"periods\": [1]}");
    // A replica that stopped keeping its run alive: not alive.
    store
        .create_run(&run("r2"), Duration::ZERO, minute)
        .await
        .unwrap();
    let left = store.api_run("r2").await.unwrap().expect("r2");
    assert_eq!((left.state, left.alive), (ApiRunState::Running, 0));
    let ids: Vec<String> = store
        .api_runs(10)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.id)
        .collect();
    assert_eq!(ids.len(), 2, "{ids:?}");
    assert!(store.api_run("r3").await.unwrap().is_none());
}

/// A notification is created once; a try takes it under a lease (no
/// other taker meanwhile); only its taker's outcome, fenced by its try
/// number, is written; a try to be made again waits for its backoff; a
/// `recovered` waits until the period's `failed` is settled.
async fn a_notification_is_created_once_and_told_by_its_taker_only(store: Store) {
    use scheduler::store::{DeliveryState, NewNotification, Tried};
    let minute = Duration::from_secs(60);
    let new = |event: &'static str| NewNotification {
        notifier: "pager".to_owned(),
        period_key: "billing:2026-07".to_owned(),
        event,
        job: "billing".to_owned(),
        payload: format!("{{\"event\": \"{event}\"}}"),
    };
    assert_eq!(
        store
            .notify_new(&[new("failed"), new("recovered")])
            .await
            .unwrap(),
        2
    );
    assert_eq!(store.notify_new(&[new("failed")]).await.unwrap(), 0);
    // Only `failed` is taken: `recovered` waits for it.
    let taken = store
        .notify_take("a", minute, &["pager"], 10, true)
        .await
        .unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!((taken[0].event.as_str(), taken[0].tries), ("failed", 1));
    assert!(
        store
            .notify_take("b", minute, &["pager"], 10, true)
            .await
            .unwrap()
            .is_empty()
    );
    // Another notifier's rows are not taken for this one.
    assert!(
        store
            .notify_take("b", minute, &["other"], 10, true)
            .await
            .unwrap()
            .is_empty()
    );
    let again = Tried::Again(Some(503), "busy".to_owned(), minute);
    assert_eq!(
        store
            .notify_tried(&[(&taken[0], again.clone())], "b")
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .notify_tried(&[(&taken[0], again)], "a")
            .await
            .unwrap(),
        1
    );
    // Pending again, its next try a minute away: nothing to take now.
    assert!(
        store
            .notify_take("a", minute, &["pager"], 10, true)
            .await
            .unwrap()
            .is_empty()
    );
    let listed = store.notifications("billing", 10).await.unwrap();
    let failed = listed.iter().find(|n| n.event == "failed").expect("failed");
    assert_eq!(
        (failed.state, failed.tries, failed.status),
        (DeliveryState::Pending, 1, Some(503))
    );
    // `recovered` still waits: its `failed` is pending.
    let recovered = listed
        .iter()
        .find(|n| n.event == "recovered")
        .expect("recovered");
    assert_eq!(
        (recovered.state, recovered.tries),
        (DeliveryState::Pending, 0)
    );
    // Taken over once the taker's lease ran out (lease 0), then delivered
    // by the new taker; the old one's late outcome is not written.
    let august = NewNotification {
        period_key: "billing:2026-08".to_owned(),
        ..new("late")
    };
    store.notify_new(&[august]).await.unwrap();
    let first = store
        .notify_take("a", Duration::ZERO, &["pager"], 10, true)
        .await
        .unwrap();
    assert_eq!(first.len(), 1);
    let second = store
        .notify_take("b", minute, &["pager"], 10, true)
        .await
        .unwrap();
    assert_eq!((second.len(), second[0].tries), (1, 2));
    let late = Tried::Delivered(200);
    assert_eq!(
        store
            .notify_tried(&[(&first[0], late.clone())], "a")
            .await
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .notify_tried(&[(&second[0], late)], "b")
            .await
            .unwrap(),
        1
    );
    let listed = store.notifications("billing", 10).await.unwrap();
    let delivered = listed
        .iter()
        .find(|n| n.period_key == "billing:2026-08")
        .expect("late");
    assert_eq!(delivered.state, DeliveryState::Delivered);
    assert!(delivered.finished_at.is_some());
}

/// Runs each test function against SQLite and PostgreSQL.
macro_rules! conformance {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let db = crate::support::TestDb::sqlite();
                    super::$name(db.store().await).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let Some(db) = crate::support::TestDb::postgres().await else { return };
                    super::$name(db.store().await).await;
                }
            )*
        }
    };
}

/// Runs each test function, given the database rather than one store,
/// against SQLite and PostgreSQL.
macro_rules! conformance_db {
    ($($name:ident),* $(,)?) => {
        mod sqlite_db {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(crate::support::TestDb::sqlite()).await;
                }
            )*
        }
        mod postgres_db {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    let Some(db) = crate::support::TestDb::postgres().await else { return };
                    super::$name(db).await;
                }
            )*
        }
    };
}

conformance_db!(
    batches_racing_a_batch_and_one_key_claims_give_each_key_one_winner,
    a_burst_claim_answers_a_job_another_transaction_is_claiming_contended,
);

conformance!(
    an_idempotency_key_is_new_once_then_known_with_its_answer,
    an_api_run_is_alive_while_kept_and_done_once_ended,
    a_notification_is_created_once_and_told_by_its_taker_only,
    a_group_of_sql_actions_commits_each_with_its_outcome_and_a_failing_one_fails_alone,
    a_group_runs_nothing_of_a_period_whose_claim_moved_on,
    concurrency_holds_inside_one_batch_and_across_batches,
    a_batch_takes_expired_released_and_due_retry_claims_like_a_one_key_claim,
    a_new_key_is_won_once_and_then_held,
    a_succeeded_period_is_done_and_force_takes_it_again,
    an_expired_lease_is_recovered_and_the_old_attempt_is_fenced,
    a_failed_period_waits_for_its_retry_unless_run_by_hand,
    a_due_retry_is_claimed_with_trigger_retry,
    a_released_claim_is_taken_at_once_and_spends_no_retry,
    release_by_key_holds_the_period_until_its_runner_confirms_the_stop,
    concurrency_limits_running_periods_of_a_job,
    concurrent_claims_of_one_key_have_one_winner,
    an_sql_action_commits_with_the_outcome_or_not_at_all,
    rows_reads_many_keys_in_one_call,
    a_job_is_first_seen_once_and_pause_is_shared,
    more_jobs_than_a_statement_sights_are_each_seen_once_at_one_instant,
    the_instants_jobs_owe_from_are_recorded_at_once_and_move_only_with_their_timing,
    prune_deletes_only_old_finished_claims,
    reclaimable_lists_expired_released_and_due_retries_only,
    prune_never_deletes_a_period_fired_inside_the_catch_up_window,
    a_heartbeat_racing_its_own_recorded_outcome_reports_no_takeover,
    a_released_claim_is_found_taken_over_by_the_next_heartbeat,
    a_second_watch_of_one_key_leaves_the_first_one_informed,
    a_lease_not_renewed_in_time_fences_the_run,
    an_sql_action_past_its_timeout_is_stopped_and_rolled_back,
    an_outcome_written_just_after_a_release_is_kept,
    a_waiting_period_is_woken_by_the_success_of_the_key_it_watches,
    a_stale_period_is_reopened_once_by_its_attempt,
    an_upstream_ask_takes_a_failed_period_only_when_its_retry_is_due,
    prune_keeps_what_a_waiting_period_needs,
);

#[tokio::test]
async fn a_database_migrated_by_a_newer_version_is_refused() {
    let db = TestDb::sqlite();
    let store = db.store().await;
    drop(store);
    use sqlx::Connection;
    let mut conn = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
    sqlx::query("INSERT INTO scheduler_migrations (version, description, checksum, applied_at) VALUES (9000, 'future', x'00', 0)")
        .execute(&mut conn)
        .await
        .unwrap();
    let store = Store::connect(&db.url).await.unwrap();
    let err = store.migrate().await.unwrap_err();
    assert!(
        err.to_string()
            .contains("migrated by a newer version of scheduler"),
        "{err}"
    );
    assert_eq!(scheduler::cli::exit_code(&err), 3);
}

/// A success committed while a period waiting for it is being noted wakes
/// the period at once: the note waits for the success's transaction
/// instead of reading the claim as it stood before it (PostgreSQL; SQLite
/// writes one transaction at a time). Before, the period slept until the
/// minute's sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_success_committed_while_its_waiting_period_is_noted_wakes_it() {
    use sqlx::Connection;
    let Some(db) = TestDb::postgres().await else {
        return;
    };
    let store = db.store().await;
    let june = month("2026-06");
    won(&store, &request(&june, "u")).await;
    // billing:2026-06 succeeds in a transaction left open: its wake-up
    // runs before the waiting row is there.
    let mut success = sqlx::PgConnection::connect(&db.url).await.unwrap();
    sqlx::query("BEGIN").execute(&mut success).await.unwrap();
    sqlx::query(
        "UPDATE scheduler_claims SET state = 'succeeded', finished_at = now()
          WHERE period_key = 'billing:2026-06'",
    )
    .execute(&mut success)
    .await
    .unwrap();
    let noting = tokio::spawn(async move {
        let july = month("2026-07");
        let waiting = scheduler::store::Waiting {
            job: "report",
            period: &july,
            fire: july.end,
            watch: "billing:2026-06".to_owned(),
            waits: "billing: 0/1".to_owned(),
        };
        store.note_waiting(&[waiting]).await.unwrap();
        store
    });
    tokio::time::sleep(Duration::from_millis(500)).await;
    sqlx::query("COMMIT").execute(&mut success).await.unwrap();
    let store = noting.await.unwrap();
    let ready: Vec<String> = store
        .ready(&["report".to_owned()], 10, false)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.period.label)
        .collect();
    assert_eq!(ready, ["2026-07"], "woken by the success");
}
