use super::*;
use crate::config::Config;
use crate::engine::{Ask, Engine, Taken};
use crate::state::ClaimState;

fn at(s: &str) -> DateTime<Utc> {
    DateTime::parse_from_rfc3339(s)
        .expect("an instant")
        .to_utc()
}

fn jobs(text: &str) -> Vec<Job> {
    Config::parse(std::path::Path::new("jobs.toml"), text, &|_| None)
        .expect("valid jobs")
        .jobs
        .into_iter()
        .map(Arc::unwrap_or_clone)
        .collect()
}

/// A claim row of `label` in `state` at attempt `attempt`, its lease
/// (for a running one) live until `until`, read at `now`.
fn row(label: &str, state: ClaimState, attempt: i32, now: &str) -> ClaimRow {
    let now = at(now);
    ClaimRow {
        period_key: format!("x:{label}"),
        period: label.into(),
        state,
        attempt,
        failures: i32::from(state == ClaimState::Failed),
        owner: "h".into(),
        lease_until: state.is_live().then(|| now + TimeDelta::seconds(30)),
        started_at: Some(now),
        retry_at: None,
        finished_at: state.is_finished().then_some(now),
        claimable: false,
        now,
    }
}

fn waiting_for_ingest() -> super::super::after::Upstream {
    super::super::after::Upstream {
        waits: vec![super::super::after::Wait {
            watch: None,
            job: "ingest".into(),
            done: 29,
            needed: 30,
            missing: vec!["2026-11-30".into()],
            claimed: vec![None],
        }],
        ..Default::default()
    }
}

/// The one rule (docs/commands.md), as a table: every state, a first sighting
/// inside and outside `catch_up` (and none), each `missed` policy, the
/// deadline's mark, upstream periods noted or not, a DST shift and a
/// calendar's move.
#[test]
fn the_one_rule_decides_every_state_the_same_way() {
    let month = "[[job]]\nname = \"x\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ncovers = \"previous\"\n\
                     deadline = \"6h\"\ncommand = [\"true\"]\n";
    let job = &jobs(month)[0];
    let latest = &jobs(&month.replace("command", "missed = \"latest\"\ncommand"))[0];
    let skip = &jobs(&month.replace("command", "missed = \"skip\"\ncommand"))[0];
    let after = &jobs(&format!(
        "{month}after = [\"ingest\"]\n\n[[job]]\nname = \"ingest\"\nschedule = \"0 1 * * *\"\nperiod = \"day\"\ncommand = [\"true\"]\n"
    ))[0];
    let none = super::super::after::Upstream::default();
    let waits = waiting_for_ingest();
    use PeriodState::*;
    // (job, label, row, first seen, noted, upstream, now) -> (state, late)
    type Case<'a> = (
        &'a Job,
        &'a str,
        Option<ClaimRow>,
        Option<&'a str>,
        bool,
        &'a super::super::after::Upstream,
        &'a str,
        PeriodState,
        bool,
    );
    let dec5 = "2026-12-05T12:00:00Z";
    let cases: Vec<Case> = vec![
        // First seen 5 December: November fired 1 December, outside
        // catch_up (24h) of the sighting: before first seen, never late.
        (
            job,
            "2026-11",
            None,
            Some("2026-12-05T10:00:00Z"),
            false,
            &none,
            dec5,
            BeforeFirstSeen,
            false,
        ),
        (
            job,
            "2026-12",
            None,
            Some("2026-12-05T10:00:00Z"),
            false,
            &none,
            dec5,
            NotDue,
            false,
        ),
        // Never seen: what a first run now would take.
        (
            job,
            "2026-11",
            None,
            None,
            false,
            &none,
            dec5,
            BeforeFirstSeen,
            false,
        ),
        (
            job,
            "2026-11",
            None,
            None,
            false,
            &none,
            "2026-12-01T03:00:00Z",
            Due,
            false,
        ),
        // First seen within catch_up of the 1 December fire: owed.
        (
            job,
            "2026-11",
            None,
            Some("2026-12-01T03:00:00Z"),
            false,
            &none,
            "2026-12-01T05:00:00Z",
            Due,
            false,
        ),
        (
            job,
            "2026-11",
            None,
            Some("2026-12-01T03:00:00Z"),
            false,
            &none,
            "2026-12-01T09:00:00Z",
            Due,
            true,
        ),
        (
            job,
            "2026-11",
            None,
            Some("2026-12-01T03:00:00Z"),
            false,
            &none,
            dec5,
            Missed,
            true,
        ),
        (
            job,
            "2026-10",
            None,
            Some("2026-12-01T03:00:00Z"),
            false,
            &none,
            dec5,
            BeforeFirstSeen,
            false,
        ),
        // Seen long ago: the policies of `missed`.
        (
            job,
            "2026-10",
            None,
            Some("2026-01-01T00:00:00Z"),
            false,
            &none,
            "2026-12-01T03:00:00Z",
            Missed,
            true,
        ),
        (
            latest,
            "2026-11",
            None,
            Some("2026-01-01T00:00:00Z"),
            false,
            &none,
            "2026-12-01T03:00:00Z",
            Due,
            false,
        ),
        (
            skip,
            "2026-11",
            None,
            Some("2026-01-01T00:00:00Z"),
            false,
            &none,
            "2026-12-01T03:00:00Z",
            Due,
            false,
        ),
        // Claims, whoever made them, whenever the job was seen.
        (
            job,
            "2026-11",
            Some(row("2026-11", ClaimState::Succeeded, 1, dec5)),
            None,
            false,
            &none,
            dec5,
            Succeeded,
            false,
        ),
        (
            job,
            "2026-11",
            Some(row("2026-11", ClaimState::Succeeded, 0, dec5)),
            None,
            false,
            &none,
            dec5,
            Adopted,
            false,
        ),
        (
            job,
            "2026-11",
            Some(row("2026-11", ClaimState::Failed, 1, dec5)),
            Some("2026-12-01T03:00:00Z"),
            false,
            &none,
            dec5,
            Failed,
            true,
        ),
        (
            job,
            "2026-11",
            Some(row("2026-11", ClaimState::Running, 2, dec5)),
            Some("2026-12-01T03:00:00Z"),
            false,
            &none,
            dec5,
            Running,
            true,
        ),
        (
            job,
            "2026-11",
            Some(row("2026-11", ClaimState::Released, 2, dec5)),
            None,
            false,
            &none,
            dec5,
            Stopping,
            false,
        ),
        // Upstream periods: noted waiting runs once ready, whenever it
        // fired; not noted and owed waits; not noted and before first
        // seen is nobody's.
        (
            after,
            "2026-11",
            None,
            Some("2026-12-05T10:00:00Z"),
            true,
            &waits,
            dec5,
            Waiting,
            false,
        ),
        (
            after,
            "2026-11",
            None,
            Some("2026-12-05T10:00:00Z"),
            true,
            &none,
            dec5,
            Ready,
            false,
        ),
        (
            after,
            "2026-11",
            None,
            Some("2026-12-01T03:00:00Z"),
            false,
            &waits,
            "2026-12-01T04:00:00Z",
            Waiting,
            false,
        ),
        (
            after,
            "2026-11",
            None,
            Some("2026-12-01T03:00:00Z"),
            false,
            &none,
            "2026-12-01T04:00:00Z",
            Ready,
            false,
        ),
        (
            after,
            "2026-11",
            None,
            Some("2026-12-05T10:00:00Z"),
            false,
            &waits,
            dec5,
            BeforeFirstSeen,
            false,
        ),
    ];
    for (n, (job, label, row, seen, noted, upstream, now, state, late)) in
        cases.into_iter().enumerate()
    {
        let period = job
            .period
            .parse_label(&job.schedule, label)
            .expect("a label");
        let sighting = Sighting {
            owed_from: seen.map(|seen| job.owed_since(at(seen))),
            noted,
            paused: false,
        };
        let got = standing(job, &period, row.as_ref(), sighting, upstream, at(now));
        assert_eq!(
            (got.state, got.late),
            (state, late),
            "case {n}: {label} at {now}"
        );
    }
}

/// The rule across a spring-forward and a calendar's move: a fire
/// shifted out of the gap, or moved to a working day, is owed from
/// where it runs.
#[test]
fn a_shifted_or_moved_fire_is_owed_from_where_it_runs() {
    let none = super::super::after::Upstream::default();
    // The state of `label` of `job`, first seen at `seen`, at `now`.
    let state = |job: &Job, label: &str, seen: &str, now: &str| {
        let period = job
            .period
            .parse_label(&job.schedule, label)
            .expect("a label");
        let sighting = Sighting {
            owed_from: Some(job.owed_since(at(seen))),
            noted: false,
            paused: false,
        };
        standing(job, &period, None, sighting, &none, at(now)).state
    };
    let dst = &jobs(
        "[[job]]\nname = \"x\"\nschedule = \"30 2 * * *\"\ntimezone = \"America/New_York\"\nperiod = \"day\"\ncommand = [\"true\"]\n",
    )[0];
    // 8 March 2026: 02:30 does not exist; the fire runs at 03:00 EDT
    // (07:00Z). Seen half an hour later: owed. Seen the next morning
    // after its own fire: the 8th is history.
    assert_eq!(
        dst.owed_since(at("2026-03-08T07:30:00Z")),
        at("2026-03-08T07:00:00Z")
    );
    let (seen, now) = ("2026-03-08T07:30:00Z", "2026-03-08T08:00:00Z");
    assert_eq!(state(dst, "2026-03-08", seen, now), PeriodState::Due);
    let (seen, now) = ("2026-03-09T07:00:00Z", "2026-03-09T08:00:00Z");
    assert_eq!(
        state(dst, "2026-03-08", seen, now),
        PeriodState::BeforeFirstSeen
    );

    let moved = &jobs(
        "[[calendar]]\nname = \"business\"\n\n[[job]]\nname = \"x\"\nschedule = \"0 9 * * *\"\nperiod = \"day\"\n\
             calendar = \"business\"\non_day_off = \"next\"\ncommand = [\"true\"]\n",
    )[0];
    // Seen on Sunday 3 January 2027: Saturday's fire runs on Monday
    // at 09:00, after the sighting, so it is owed; Friday's is not.
    let sunday = "2027-01-03T12:00:00Z";
    let (sunday_later, monday) = ("2027-01-03T13:00:00Z", "2027-01-04T10:00:00Z");
    assert_eq!(
        state(moved, "2027-01-02", sunday, sunday_later),
        PeriodState::NotDue
    );
    assert_eq!(state(moved, "2027-01-02", sunday, monday), PeriodState::Due);
    assert_eq!(
        state(moved, "2027-01-01", sunday, monday),
        PeriodState::BeforeFirstSeen
    );
}

/// A fire `missed = "latest"` passed over (a newer one was taken) is
/// missed by design: never late, however long past its deadline
/// (adversarial review: the range view told it late).
#[test]
fn a_fire_passed_over_by_missed_latest_is_never_late() {
    let none = super::super::after::Upstream::default();
    let job = &jobs(
        "[[job]]\nname = \"x\"\nschedule = \"*/10 * * * *\"\nperiod = \"fire\"\nmissed = \"latest\"\n\
         deadline = \"5m\"\ncommand = [\"true\"]\n",
    )[0];
    let older = job
        .period
        .parse_label(&job.schedule, "2026-12-06T10:00:00Z")
        .expect("a label");
    let sighting = Sighting {
        owed_from: Some(job.owed_since(at("2026-12-06T09:00:00Z"))),
        noted: false,
        paused: false,
    };
    let got = standing(
        job,
        &older,
        None,
        sighting,
        &none,
        at("2026-12-06T10:25:00Z"),
    );
    assert_eq!((got.state, got.late), (PeriodState::Missed, false));
    // The latest, owed and past its deadline, is late; not while the job
    // is paused (the adversarial review saw the range view say so).
    let latest = job
        .period
        .parse_label(&job.schedule, "2026-12-06T10:10:00Z")
        .expect("a label");
    let now = at("2026-12-06T10:19:00Z");
    assert!(standing(job, &latest, None, sighting, &none, now).late);
    let paused = Sighting {
        paused: true,
        ..sighting
    };
    assert!(!standing(job, &latest, None, paused, &none, now).late);
}

/// The gauge's count, kept from one count to the next, agrees with a
/// count afresh at every step: new fires, a success, a failure, and
/// jobs whose next fire has not come (counted from what was open).
#[tokio::test]
async fn the_gauge_counted_on_from_the_last_count_agrees_with_a_count_afresh() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let url = format!("sqlite://{}", dir.path().join("s.db").display());
    let store = Store::connect(&url).await.expect("a SQLite store");
    store.migrate().await.expect("migrated");
    let engine = Engine::new(
        store.clone(),
        std::time::Duration::from_secs(30),
        "t".into(),
    )
    .expect("an engine");
    let text = "[[job]]\nname = \"ok\"\nschedule = \"* * * * * *\"\nsql = { statement = \"SELECT 1\" }\n\n\
                    [[job]]\nname = \"bad\"\nschedule = \"* * * * * *\"\nsql = { statement = \"SELECT nope\" }\n\n\
                    [[job]]\nname = \"latest\"\nschedule = \"* * * * * *\"\nmissed = \"latest\"\nsql = { statement = \"SELECT 1\" }\n\n\
                    [[job]]\nname = \"slow\"\nschedule = \"*/3 * * * * *\"\nmissed = \"latest\"\nsql = { statement = \"SELECT nope\" }\n\n\
                    [[job]]\nname = \"slow-all\"\nschedule = \"*/2 * * * * *\"\nsql = { statement = \"SELECT nope\" }\n";
    let config =
        Config::parse(std::path::Path::new("jobs.toml"), text, &|_| None).expect("valid jobs");
    let jobs: Vec<Arc<Job>> = config.jobs;
    let names: Vec<String> = jobs.iter().map(|j| j.name.to_string()).collect();
    store.see_jobs(&names).await.expect("jobs seen");
    let catch_up = std::time::Duration::from_secs(3600);
    let mut kept = OverdueCount::default();
    // A count afresh: the one overview `status` shows, the jobs'
    // catch_up set to the count's.
    let afresh_within = |now, catch_up| {
        let store = store.clone();
        let jobs: Vec<Job> = jobs
            .iter()
            .map(|j| Job {
                policy: std::sync::Arc::new(crate::config::Policy {
                    catch_up,
                    ..(*j.policy).clone()
                }),
                ..(**j).clone()
            })
            .collect();
        async move {
            let refs: Vec<&Job> = jobs.iter().collect();
            let all = super::super::overview::of_jobs(&store, &refs, 1, now)
                .await
                .expect("a count");
            all.into_iter()
                .filter(|o| !o.overdue.is_empty())
                .map(|o| (o.job.name.clone(), o.overdue.len()))
                .collect::<HashMap<Arc<str>, usize>>()
        }
    };
    let afresh = |now| afresh_within(now, catch_up);
    let mut seen = Vec::new();
    for step in 0..4 {
        tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
        let now = Utc::now();
        if step == 2 {
            // Run every due period of `ok` and `bad`: the first
            // succeed, the second fail for good.
            for job in &jobs[..2] {
                let since = now - TimeDelta::seconds(10);
                for d in due(job, now, since, true) {
                    let ask = Ask::scheduled(job.clone(), d);
                    let taken = engine
                        .claim(std::slice::from_ref(&ask))
                        .await
                        .expect("a claim");
                    if let Some(Taken::Won(won)) = taken.into_iter().next() {
                        let (_stop, stop_now) = tokio::sync::watch::channel(false);
                        engine.run(ask, won, stop_now).await;
                    }
                }
            }
        }
        let counted = kept
            .count(&store, &jobs, catch_up, now)
            .await
            .expect("a count");
        assert_eq!(counted, afresh(now).await, "step {step}");
        // Counted again with no fire since: nothing new is listed, and
        // the answer is the same.
        let again = kept
            .count(&store, &jobs, catch_up, now)
            .await
            .expect("a count");
        assert_eq!(again, counted, "step {step}, no fire since");
        // The jobs in another order (a reload): each is listed afresh
        // where another stood, and the answer is the same, both ways.
        let reversed: Vec<Arc<Job>> = jobs.iter().rev().cloned().collect();
        for (order, jobs) in [("reversed", &reversed), ("back", &jobs)] {
            let moved = kept
                .count(&store, jobs, catch_up, now)
                .await
                .expect("a count");
            assert_eq!(moved, counted, "step {step}, {order}");
        }
        seen.push(counted);
    }
    // A succeeded period of `ok` rerun by hand with `--force` fails
    // (its statement changed meanwhile): counted again at the full
    // count of the hour.
    let now = Utc::now();
    let failing = Config::parse(
        std::path::Path::new("jobs.toml"),
        "[[job]]\nname = \"ok\"\nschedule = \"* * * * * *\"\nsql = { statement = \"SELECT nope\" }\n",
        &|_| None,
    )
    .expect("a valid job")
    .jobs
    .remove(0);
    // A fire of two seconds ago: after the first sighting, run at step 2.
    let mut fires = due(&jobs[0], now, now - TimeDelta::seconds(3), true);
    let rerun = fires.remove(fires.len() - 3);
    let mut ask = Ask::scheduled(failing, rerun);
    ask.mode.manual = true;
    ask.mode.force = true;
    let taken = engine
        .claim(std::slice::from_ref(&ask))
        .await
        .expect("a claim");
    let Some(Taken::Won(won)) = taken.into_iter().next() else {
        panic!("the forced rerun is not won");
    };
    let (_stop, stop_now) = tokio::sync::watch::channel(false);
    engine.run(ask, won, stop_now).await;
    let later = now + TimeDelta::minutes(61);
    let longer = std::time::Duration::from_secs(2 * 3600);
    let counted = kept
        .count(&store, &jobs, longer, later)
        .await
        .expect("a count");
    assert_eq!(counted, afresh_within(later, longer).await, "an hour on");
    assert!(seen[0].get("ok").copied().unwrap_or(0) >= 1, "{seen:?}");
    assert_eq!(seen[2].get("ok"), None, "{seen:?}");
    assert!(seen[2].get("bad").copied().unwrap_or(0) >= 3, "{seen:?}");
    assert_eq!(seen[3].get("latest"), Some(&1), "{seen:?}");
}

/// The gauge reads its jobs' sightings a chunk at a time: a job past the
/// first chunk is counted as one in it is, and one never seen (not
/// sighted yet) owes nothing.
#[tokio::test]
async fn the_gauge_counts_the_jobs_past_its_first_chunk() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let url = format!("sqlite://{}", dir.path().join("s.db").display());
    let store = Store::connect(&url).await.expect("a SQLite store");
    store.migrate().await.expect("migrated");
    let count = SIGHTED_AT_ONCE + 2;
    let text: String = (0..count)
        .map(|i| format!("[[job]]\nname = \"j-{i}\"\nschedule = \"* * * * * *\"\nsql = {{ statement = \"SELECT 1\" }}\n\n"))
        .collect();
    let jobs = Config::parse(std::path::Path::new("jobs.toml"), &text, &|_| None)
        .expect("valid jobs")
        .jobs;
    // All but the last are seen.
    let names: Vec<String> = jobs[..count - 1]
        .iter()
        .map(|j| j.name.to_string())
        .collect();
    store.see_jobs(&names).await.expect("jobs seen");
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let now = Utc::now();
    let catch_up = std::time::Duration::from_secs(3600);
    let counted = OverdueCount::default()
        .count(&store, &jobs, catch_up, now)
        .await
        .expect("a count");
    assert_eq!(counted.len(), count - 1, "every job seen is overdue");
    for name in ["j-0", &format!("j-{SIGHTED_AT_ONCE}")] {
        assert!(
            counted.get(name).is_some_and(|n| *n >= 1),
            "{name}: {counted:?}"
        );
    }
    assert_eq!(counted.get(&*format!("j-{}", count - 1)), None);
}

/// A change of timing owes the new timing's fires after the newest one
/// claimed, never one before the first sighting; a job of longer periods
/// still owes the periods it owed and has not run, wherever their fires
/// moved.
#[test]
fn a_changed_timing_owes_after_the_newest_claimed_and_keeps_the_periods_not_yet_run() {
    let first_seen = at("2026-01-01T00:00:00Z");
    let job = |text: &str| jobs(&format!("[[job]]\n{text}\ncommand = [\"true\"]\n")).remove(0);
    let milli = TimeDelta::milliseconds(1);
    // Every three seconds, then every five, after the fire of 14:00:09:
    // 14:00:05 never fired; 14:00:10 is owed.
    let five = job("name = \"f\"\nschedule = \"*/5 * * * * *\"");
    let newest = at("2026-07-01T14:00:09Z");
    let owed = five.owed_after_change(first_seen, None, Some(newest));
    assert_eq!(owed, newest + milli);
    // Never before the first sighting.
    let seen = at("2026-07-01T14:00:11Z");
    assert_eq!(five.owed_after_change(seen, None, Some(newest)), seen);
    // Monthly on the 28th, moved to the 1st on 15 July: June ran, so July
    // is still owed, at its new fire.
    let monthly = job("name = \"m\"\nschedule = \"0 6 1 * *\"\nperiod = \"month\"");
    let newest = at("2026-06-28T06:00:00Z");
    let owed = monthly.owed_after_change(first_seen, None, Some(newest));
    assert!(
        owed > newest && owed <= at("2026-07-01T06:00:00Z"),
        "{owed}"
    );
    // First seen at 07:00:03 under an 08:00 fire, nothing run yet: the
    // day is owed, at its new fire, though that is before the sighting.
    let daily = job("name = \"d\"\nschedule = \"0 7 * * *\"\nperiod = \"day\"");
    let seen = at("2026-07-15T07:00:03Z");
    let today = Some(at("2026-07-15T00:00:00Z"));
    let owed = daily.owed_after_change(seen, today, None);
    assert_eq!(owed, at("2026-07-15T07:00:00Z"));
    // First seen at 09:00 under an 08:00 fire, owing from tomorrow's day:
    // today is not owed after the move either.
    let seen = at("2026-07-15T09:00:00Z");
    let tomorrow = Some(at("2026-07-16T00:00:00Z"));
    assert_eq!(daily.owed_after_change(seen, tomorrow, None), seen);
    // A monthly job covering the month before, first seen on 6 December
    // under a fire on the 20th (November owed), moved to the 1st: November
    // is still owed, at its new fire.
    let covering =
        job("name = \"b\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ncovers = \"previous\"");
    let seen = at("2026-12-06T04:00:00Z");
    let november = Some(at("2026-11-01T00:00:00Z"));
    let owed = covering.owed_after_change(seen, november, None);
    assert_eq!(owed, at("2026-12-01T02:00:00Z"));
    // The period recorded with it: November's.
    assert_eq!(covering.owed_period(owed), at("2026-11-01T00:00:00Z"));
}
