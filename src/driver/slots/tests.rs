use super::*;
use crate::config::Config;
use crate::engine::due::due;
use crate::store::Store;
use chrono::SubsecRound;

/// A service of one every-second `command` job `j` on a migrated
/// SQLite store, with one `max_running` slot, its clock stopped at
/// `now`; and the schedule's due of `j` firing at `fire`.
async fn one_slot(
    dir: &tempfile::TempDir,
    now: DateTime<Utc>,
) -> (Service, impl Fn(DateTime<Utc>) -> Due) {
    let url = format!("sqlite://{}", dir.path().join("s.db").display());
    let store = Store::connect(&url).await.expect("a SQLite store");
    store.migrate().await.expect("migrated");
    let engine = Engine::new(store, Duration::from_secs(30), "t".into()).expect("an engine");
    let text = "[scheduler]\nmax_running = 1\n\n[[job]]\nname = \"j\"\n\
                schedule = \"* * * * * *\"\ncommand = [\"true\"]\n";
    let path = std::path::Path::new("jobs.toml");
    let config = Config::parse(path, text, &|_| None).expect("a valid job");
    let job = config.jobs[0].clone();
    let clock = Arc::new(crate::clock::StoppedClock::at(now));
    let (_down, shutdown) = watch::channel(false);
    let service = Service::on(path.into(), config, engine, shutdown).with_clock(clock);
    let at = move |fire: DateTime<Utc>| Due {
        period: job.timing().period_of(&crate::fires::Fire {
            nominal: fire,
            at: fire,
        }),
        fire,
        trigger: Trigger::Schedule,
        shard: None,
    };
    (service, at)
}

/// What of job `j` waits for a slot, by period label.
fn waiting(service: &Service) -> Vec<String> {
    let queue = service
        .waiting
        .get("j")
        .into_iter()
        .flat_map(|q| q.values());
    queue.map(|due| due.period.label.clone()).collect()
}

/// A fire queued for a `max_running` slot before an older period of
/// its job came back without a concurrency slot is not asked for ahead
/// of it: it waits behind it (two replicas under load ran each job's
/// newer periods while an older one waited, until the load passed).
#[tokio::test]
async fn a_fire_queued_before_an_older_period_found_no_slot_waits_behind_it() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let now = Utc::now().trunc_subsecs(0);
    let (mut service, at) = one_slot(&dir, now).await;
    let (older, newer) = (
        at(now - TimeDelta::seconds(2)),
        at(now - TimeDelta::seconds(1)),
    );
    let job = service.jobs[0].clone();
    service.backlog.push_fires(vec![(job, newer.clone())]);
    service.wait("j".into(), older.clone());
    service.flush();
    assert_eq!(service.running, 0, "the newer fire was asked for");
    assert_eq!(waiting(&service), [older.period.label, newer.period.label]);
}

/// The oldest waiting period of a job, released when a slot of the job
/// frees, goes ahead of the job's newer fires already queued for a
/// `max_running` slot, and takes the slot.
#[tokio::test]
async fn a_period_released_from_waiting_goes_ahead_of_the_fires_queued_before() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let now = Utc::now().trunc_subsecs(0);
    let (mut service, at) = one_slot(&dir, now).await;
    let (older, newer) = (
        at(now - TimeDelta::seconds(2)),
        at(now - TimeDelta::seconds(1)),
    );
    let job = service.jobs[0].clone();
    service.backlog.push_fires(vec![(job, newer.clone())]);
    service.wait("j".into(), older.clone());
    service.release_waiting("j", 1);
    service.flush();
    assert_eq!(service.running, 1, "the released period was not asked for");
    assert_eq!(service.asking.get("j"), Some(&vec![older.fire]));
    assert_eq!(waiting(&service), [newer.period.label]);
}

/// A period of a job is not asked for while an older one of it is
/// being asked for here (the job may run one at a time): the two
/// claims, in different statements, raced, and the newer could win.
/// The older's claim is answered before its run can end.
#[tokio::test]
async fn a_newer_period_waits_while_an_older_one_of_its_job_is_being_asked_for() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let now = Utc::now().trunc_subsecs(0);
    let (mut service, at) = one_slot(&dir, now).await;
    service.settings.max_running = 2;
    let (older, newer) = (
        at(now - TimeDelta::seconds(2)),
        at(now - TimeDelta::seconds(1)),
    );
    let job = service.jobs[0].clone();
    service.backlog.push_fires(vec![(job.clone(), older)]);
    service.flush();
    assert_eq!(service.running, 1, "the older period was not asked for");
    service.backlog.push_fires(vec![(job, newer.clone())]);
    service.flush();
    assert_eq!(
        service.running, 1,
        "the newer period was asked for beside it"
    );
    assert_eq!(waiting(&service), [newer.period.label]);
    // The older one's claim is answered, then its run ends.
    let mut answered = false;
    loop {
        match service.events.1.recv().await.expect("an event") {
            Event::Asked(_) => answered = true,
            Event::Done(..) => break,
            _ => {}
        }
    }
    assert!(answered, "its run ended before its claim was answered");
}

/// A catch-up of more periods than the job may run at once asks for
/// the oldest first, also after a scan releases the next from waiting:
/// dispatched among the fires, the oldest went behind the newer one
/// the scan released, and a restart before it came up left it unrun
/// by `serve` (adversarial review).
#[tokio::test]
async fn a_catch_up_of_more_periods_than_the_job_runs_at_once_asks_for_the_oldest_first() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let now = Utc::now().trunc_subsecs(0);
    let (mut service, _) = one_slot(&dir, now).await;
    let job = service.jobs[0].clone();
    let oldest = now - TimeDelta::seconds(3);
    service.catch_up_job(job, oldest, now, Vec::new());
    // A scan releases the job's oldest waiting period.
    service.release_waiting("j", 1);
    service.take_pending();
    let mut fires = Vec::new();
    while let Some((_, due)) = service.backlog.pop_front() {
        fires.push(due.fire);
    }
    assert_eq!(fires.first(), Some(&oldest), "{fires:?}");
    assert!(fires.is_sorted(), "not in fire order: {fires:?}");
}

/// A claim a scan finds to take over goes ahead of the fires and of
/// the job's newer periods released from waiting, once however many
/// scans find it: among the fires, a steady load of released periods
/// kept it from every slot, and a replica killed under load left its
/// periods unrun (adversarial review).
#[tokio::test]
async fn a_claim_to_take_over_goes_ahead_of_the_fires_and_of_newer_released_periods_once() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let now = Utc::now().trunc_subsecs(0);
    let (mut service, at) = one_slot(&dir, now).await;
    let job = service.jobs[0].clone();
    service.backlog.push_fires(vec![(job.clone(), at(now))]);
    service.wait("j".into(), at(now - TimeDelta::seconds(1)));
    service.release_waiting("j", 1);
    let recovery = Due {
        trigger: Trigger::Recovery,
        ..at(now - TimeDelta::seconds(5))
    };
    for _scan in 0..2 {
        service.bring_back(job.clone(), recovery.clone(), now);
    }
    let mut queued = Vec::new();
    while let Some((_, due)) = service.backlog.pop_front() {
        queued.push(((now - due.fire).num_seconds(), due.trigger));
    }
    assert_eq!(
        queued,
        [
            (5, Trigger::Recovery),
            (1, Trigger::Schedule),
            (0, Trigger::Schedule)
        ]
    );
}

#[tokio::test]
async fn a_recovery_that_finds_no_free_slot_waits_as_a_recovery() {
    comes_back_for_a_slot_as_itself(Trigger::Recovery).await;
}

/// A period that waited for its upstream periods and then found its job's
/// slot taken waits for the slot as such, never dropped as older than the
/// catch-up window (as a catch-up it was, logged and counted as dropped,
/// and asked for again by the next scan: review).
#[tokio::test]
async fn a_period_that_waited_for_its_upstream_and_finds_no_free_slot_waits_as_such() {
    comes_back_for_a_slot_as_itself(Trigger::Upstream).await;
}

/// An older period of an every-minute job with one slot, asked for with
/// `trigger` while the latest holds the slot, comes back to wait for it
/// with its trigger.
async fn comes_back_for_a_slot_as_itself(trigger: Trigger) {
    let dir = tempfile::tempdir().expect("a temp dir");
    let url = format!("sqlite://{}", dir.path().join("s.db").display());
    let store = Store::connect(&url).await.expect("a SQLite store");
    store.migrate().await.expect("migrated");
    let engine = Engine::new(store, Duration::from_secs(30), "test".to_owned()).expect("an engine");
    let text = "[[job]]\nname = \"j\"\nschedule = \"* * * * *\"\ncommand = [\"true\"]\n";
    let mut config =
        Config::parse(std::path::Path::new("jobs.toml"), text, &|_| None).expect("a valid job");
    let job = config.jobs.remove(0);
    let now = Utc::now();
    let dues = due(&job, now, now - TimeDelta::minutes(3), true);
    // The latest period runs, and its claim holds the job's one slot ...
    let latest = dues.last().expect("a latest fire").clone();
    let won = engine
        .claim(&[Ask::scheduled(job.clone(), latest)])
        .await
        .expect("a claim");
    assert!(matches!(won[0], Taken::Won(_)));
    // ... when an older period comes back.
    let older = Due {
        trigger,
        ..dues[0].clone()
    };
    let (events, mut received) = mpsc::unbounded_channel();
    let (_stop, stop_now) = watch::channel(false);
    let batch = Batch {
        engine,
        units: vec![vec![Ask::scheduled(job, older)]],
        slots: vec![FreeOnDrop(events.clone())],
        asked: AnsweredOnDrop::new(events.clone()),
        stop_now,
        events,
    };
    batch.go().await;
    loop {
        match received.recv().await.expect("an event") {
            Event::Again(name, due) => {
                assert_eq!(&*name, "j");
                assert_eq!(due.trigger, trigger);
                break;
            }
            Event::Free | Event::Asked(_) => {}
            _ => panic!("neither waiting nor a freed slot"),
        }
    }
}

/// A burst's fires, all needed by the same instant, are asked for in the
/// order they came from a place of each replica's own: every replica
/// asked for the same keys in turn, all the burst through, and waited
/// on the others' claims.
#[tokio::test]
async fn replicas_ask_for_a_bursts_fires_each_from_a_place_of_its_own() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let url = format!("sqlite://{}", dir.path().join("s.db").display());
    let store = Store::connect(&url).await.expect("a SQLite store");
    store.migrate().await.expect("migrated");
    let mut text = String::from("[scheduler]\nmax_running = 1\n");
    for i in 0..10 {
        text.push_str(&format!(
            "\n[[job]]\nname = \"j{i}\"\nschedule = \"* * * * *\"\ncommand = [\"true\"]\n"
        ));
    }
    let path = std::path::Path::new("jobs.toml");
    let fire = Utc::now().trunc_subsecs(0);
    let mut firsts = Vec::new();
    for owner in ["host-a:1:5e1f", "host-b:1:77c0"] {
        let engine =
            Engine::new(store.clone(), Duration::from_secs(30), owner.into()).expect("an engine");
        let config = Config::parse(path, &text, &|_| None).expect("valid jobs");
        let clock = Arc::new(crate::clock::StoppedClock::at(fire));
        let (_down, shutdown) = watch::channel(false);
        let mut service = Service::on(path.into(), config, engine, shutdown).with_clock(clock);
        for job in service.jobs.clone() {
            let due = Due {
                period: job.timing().period_of(&crate::fires::Fire {
                    nominal: fire,
                    at: fire,
                }),
                fire,
                trigger: Trigger::Schedule,
                shard: None,
            };
            service.dispatch(job, due, fire);
        }
        service.take_pending();
        let mut order = Vec::new();
        while let Some((job, _)) = service.backlog.pop_front() {
            order.push(job.name.to_string());
        }
        // The order they came in (jobs.toml's), from this replica's place.
        let place = crate::engine::start_at(owner, 10);
        let expected: Vec<String> = (0..10).map(|i| format!("j{}", (place + i) % 10)).collect();
        assert_eq!(order, expected, "{owner}");
        firsts.push(order[0].clone());
    }
    assert_ne!(firsts[0], firsts[1], "both replicas start at the same fire");
}

/// A claim a scan finds again while it waits here for its job's slot (it
/// came back as a recovery that found the slot taken, behind an older
/// period of the job) is not queued a second time: asked for from both
/// places, it took a claim of its own each time (adversarial review).
#[tokio::test]
async fn a_claim_found_again_while_it_waits_for_its_jobs_slot_is_queued_once() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let now = Utc::now().trunc_subsecs(0);
    let (mut service, at) = one_slot(&dir, now).await;
    let job = service.jobs[0].clone();
    let recovery = Due {
        trigger: Trigger::Recovery,
        ..at(now - TimeDelta::seconds(5))
    };
    service.wait("j".into(), at(now - TimeDelta::seconds(6)));
    service.wait("j".into(), recovery.clone());
    // The next scan releases the oldest, and finds the claim again.
    service.release_waiting("j", 1);
    service.bring_back(job, recovery.clone(), now);
    let mut queued = Vec::new();
    while let Some((_, due)) = service.backlog.pop_front() {
        queued.push(due.period.label);
    }
    queued.extend(waiting(&service));
    let times = queued.iter().filter(|l| **l == recovery.period.label);
    assert_eq!(times.count(), 1, "{queued:?}");
}
