//! Deadlines and notifications, with a real receiver: one `late` per
//! missed period across replicas, `failed` then `recovered`, retries with
//! the same Idempotency-Key, a refusal given up, and the signature.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::serve::stop;
use crate::support::{Said, TestDb, Workspace, count, databases, eventually, within};

/// A SQLite condition on a row's `scheduled_at`: the deadline of 1 s after
/// it has passed, by the database's clock.
const PAST_DEADLINE: &str = "scheduled_at + 1000 < CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// One request the receiver got.
#[derive(Debug, Clone)]
struct Got {
    headers: HashMap<String, String>,
    body: String,
}

impl Got {
    fn key(&self) -> &str {
        self.headers
            .get("idempotency-key")
            .map_or("", String::as_str)
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_default()
    }
}

/// A receiver on a port of its own: it answers each request with the next
/// status of its script (200 once the script is spent).
#[derive(Clone)]
struct Receiver {
    port: u16,
    got: Arc<Mutex<Vec<Got>>>,
}

impl Receiver {
    fn start(script: &[u16]) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let got = Arc::new(Mutex::new(Vec::new()));
        let script = Arc::new(Mutex::new(
            script.iter().copied().collect::<VecDeque<u16>>(),
        ));
        let seen = got.clone();
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let (seen, script) = (seen.clone(), script.clone());
                std::thread::spawn(move || answer(stream, &seen, &script));
            }
        });
        Receiver { port, got }
    }

    fn url(&self) -> String {
        format!("http://127.0.0.1:{}/hook", self.port)
    }

    fn got(&self) -> Vec<Got> {
        self.got.lock().unwrap().clone()
    }

    fn events(&self, event: &str) -> Vec<Got> {
        self.got()
            .into_iter()
            .filter(|g| g.headers.get("x-scheduler-event").map(String::as_str) == Some(event))
            .collect()
    }
}

/// Reads one request from `stream`, notes it in `seen`, and answers with
/// the next status of `script` (200 once it is spent; 0: no answer at all,
/// a receiver that hangs until the sender gives up).
fn answer(stream: std::net::TcpStream, seen: &Mutex<Vec<Got>>, script: &Mutex<VecDeque<u16>>) {
    let mut reader = BufReader::new(stream);
    let mut headers = HashMap::new();
    let mut line = String::new();
    reader.read_line(&mut line).ok();
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
            break;
        }
        if let Some((name, value)) = line.trim().split_once(':') {
            headers.insert(name.trim().to_lowercase(), value.trim().to_owned());
        }
    }
    let length = headers
        .get("content-length")
        .and_then(|l| l.parse().ok())
        .unwrap_or(0);
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok();
    let body = String::from_utf8_lossy(&body).into_owned();
    seen.lock().unwrap().push(Got { headers, body });
    let status = script.lock().unwrap().pop_front().unwrap_or(200);
    if status == 0 {
        let _ = reader.read_to_end(&mut Vec::new());
        return;
    }
    let answer = format!("HTTP/1.1 {status} X\r\ncontent-length: 0\r\n\r\n");
    let _ = reader.get_mut().write_all(answer.as_bytes());
}

fn serve(ws: &Workspace, db: &TestDb) -> Child {
    ws.command(&["--database-url", &db.url, "serve"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap()
}

/// Every replica stopped across the deadlines of a few periods, then three
/// started together: each missed period is told `late` exactly once, with
/// its own Idempotency-Key, though the replicas caught it up at once.
#[test]
fn late_is_told_once_per_missed_period_by_three_replicas_started_together() {
    for db in databases() {
        let hook = Receiver::start(&[]);
        let ws = Workspace::new(&format!(
            "[scheduler]\nscan_interval = \"500ms\"\n\n\
             [[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\ndeadline = \"1s\"\n\n\
             [[notify]]\nname = \"oncall\"\nurl = \"{}\"\nevents = [\"late\"]\n",
            hook.url()
        ));
        // Seen, and its latest period run; then nothing runs for 4 s.
        let first = ws.run(&["--database-url", &db.url, "run", "tick"]);
        assert_eq!(first.code(), 0, "{}", first.stderr());
        // Scenario time: the downtime whose periods go late.
        std::thread::sleep(Duration::from_secs(4));
        let replicas: Vec<Child> = (0..3).map(|_| serve(&ws, &db)).collect();
        eventually("three late periods told", Duration::from_secs(30), || {
            hook.events("late").len() >= 3
        });
        // A second told twice would come while the replicas run on: two
        // more of their periods.
        let ticked = || {
            count(
                &db.url,
                "SELECT count(*) FROM scheduler_attempts WHERE job = 'tick' AND outcome = 'succeeded'",
            )
        };
        let now = ticked();
        eventually("two more runs", Duration::from_secs(60), || {
            ticked() >= now + 2
        });
        for replica in replicas {
            stop(replica);
        }
        let late = hook.events("late");
        let mut keys: Vec<&str> = late.iter().map(Got::key).collect();
        keys.sort_unstable();
        let before = keys.len();
        keys.dedup();
        assert_eq!(keys.len(), before, "a late period was told twice: {keys:?}");
        for got in &late {
            let body = got.json();
            assert_eq!(body["event"], "late", "{body}");
            assert_eq!(got.key(), body["id"], "{body}");
            assert!(body["deadline"].is_string(), "{body}");
        }
        // The first three were delivered seconds before the stop: recorded.
        let delivered = count(
            &db.url,
            "SELECT count(*) FROM scheduler_notifications WHERE state = 'delivered'",
        );
        assert!(delivered >= 3, "{delivered} deliveries recorded");
    }
}

/// A period that fails for good is told `failed` once; run again by hand
/// and succeeding, it is told `recovered` once. `run` alone delivers
/// them, as a platform cron container would.
#[test]
fn failed_for_good_then_recovered_are_told_once_each_by_run_alone() {
    let hook = Receiver::start(&[]);
    let ws = Workspace::new(&format!(
        "[[job]]\nname = \"flaky\"\nschedule = \"0 0 1 1 *\"\nperiod = \"year\"\nshell = \"test -f ok\"\n\n\
         [[notify]]\nname = \"oncall\"\nurl = \"{}\"\n",
        hook.url()
    ));
    let db = TestDb::sqlite();
    let url = db.url.as_str();
    let failed = ws.run(&["--database-url", url, "run", "flaky", "--period", "2025"]);
    assert_eq!(failed.code(), 1, "{}", failed.stderr());
    let again = ws.run(&["--database-url", url, "run", "flaky", "--period", "2025"]);
    assert_eq!(again.code(), 1, "{}", again.stderr());
    std::fs::write(ws.dir.path().join("ok"), "").unwrap();
    let fixed = ws.run(&["--database-url", url, "run", "flaky", "--period", "2025"]);
    assert_eq!(fixed.code(), 0, "{}", fixed.stderr());
    let failed = hook.events("failed");
    let recovered = hook.events("recovered");
    assert_eq!(failed.len(), 1, "{:?}", hook.got());
    assert_eq!(recovered.len(), 1, "{:?}", hook.got());
    assert_eq!(failed[0].json()["period_key"], "flaky:2025");
    assert_eq!(failed[0].key(), "oncall:flaky:2025:failed");
    assert_eq!(recovered[0].key(), "oncall:flaky:2025:recovered");
    let history = ws.run(&["--database-url", url, "history", "flaky"]);
    assert!(
        history
            .stdout()
            .contains("flaky:2025  failed  to oncall  delivered"),
        "{}",
        history.stdout()
    );
}

/// A period split into shards whose shard 2 fails twice, then succeeds:
/// the period is told `failed` once, naming the shard, and `recovered`
/// once, under the period's key, never the shard's.
#[test]
fn a_shard_failed_twice_then_fixed_tells_its_period_failed_and_recovered_once_each() {
    let hook = Receiver::start(&[]);
    let ws = Workspace::new(&format!(
        "[[job]]\nname = \"billing\"\nschedule = \"0 0 1 1 *\"\nperiod = \"year\"\nshards = 4\n\
         shell = \"test $SCHEDULER_SHARD != 2 || test -f ok\"\n\n\
         [[notify]]\nname = \"oncall\"\nurl = \"{}\"\n",
        hook.url()
    ));
    for db in crate::support::databases() {
        let url = db.url.as_str();
        for _ in 0..2 {
            let failed = ws.run(&["--database-url", url, "run", "billing", "--period", "2025"]);
            assert_eq!(failed.code(), 1, "{}", failed.stderr());
        }
        std::fs::write(ws.dir.path().join("ok"), "").unwrap();
        let fixed = ws.run(&["--database-url", url, "run", "billing", "--period", "2025"]);
        assert_eq!(fixed.code(), 0, "{}", fixed.stderr());
        let failed = hook.events("failed");
        let recovered = hook.events("recovered");
        assert_eq!(failed.len(), 1, "{url}: {:?}", hook.got());
        assert_eq!(recovered.len(), 1, "{url}: {:?}", hook.got());
        assert_eq!(failed[0].json()["period_key"], "billing:2025");
        assert_eq!(failed[0].json()["failed_shards"], serde_json::json!([2]));
        assert_eq!(recovered[0].key(), "oncall:billing:2025:recovered");
        hook.got.lock().unwrap().clear();
        std::fs::remove_file(ws.dir.path().join("ok")).unwrap();
    }
}

/// A period that failed with retries left and is past its deadline is told
/// `late` with its state and its last failure, masked like `failed`'s.
#[test]
fn late_tells_the_last_failure_of_a_period_with_retries_left() {
    let hook = Receiver::start(&[]);
    let ws = Workspace::new(&format!(
        "[[job]]\nname = \"flaky\"\nschedule = \"* * * * * *\"\nshell = \"echo disk full >&2; exit 3\"\n\
         deadline = \"1s\"\nretry = {{ attempts = 3, backoff = \"1h\" }}\n\n\
         [[notify]]\nname = \"oncall\"\nurl = \"{}\"\nevents = [\"late\"]\n",
        hook.url()
    ));
    let db = TestDb::sqlite();
    let first = ws.run(&["--database-url", &db.url, "run", "flaky"]);
    assert_eq!(first.code(), 1, "{}", first.stderr());
    eventually(
        "the failed period's deadline",
        Duration::from_secs(60),
        || {
            count(
                &db.url,
                &format!(
                    "SELECT count(*) FROM scheduler_claims WHERE job = 'flaky' AND {PAST_DEADLINE}"
                ),
            ) == 1
        },
    );
    let second = ws.run(&["--database-url", &db.url, "run", "flaky"]);
    assert_eq!(second.code(), 1, "{}", second.stderr());
    let late = hook.events("late");
    let told = late
        .iter()
        .map(Got::json)
        .find(|body| body["failures"] == 1)
        .unwrap_or_else(|| panic!("no late failed period: {:?}", hook.got()));
    assert_eq!(told["state"], "failed", "{told}");
    let error = told["error"].as_str().unwrap_or_default();
    assert!(error.contains("exit") && error.contains('3'), "{told}");
}

/// `run` alone catching up periods past their deadline tells each `late`
/// and, as it has succeeded, `recovered`, before it exits: a platform cron
/// container hears both from the same run.
#[test]
fn run_alone_tells_late_and_recovered_of_a_period_it_caught_up_late() {
    let hook = Receiver::start(&[]);
    let ws = Workspace::new(&format!(
        "[[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\ndeadline = \"1s\"\n\n\
         [[notify]]\nname = \"oncall\"\nurl = \"{}\"\n",
        hook.url()
    ));
    let db = TestDb::sqlite();
    assert_eq!(
        ws.run(&["--database-url", &db.url, "run", "tick"]).code(),
        0
    );
    // Scenario time: the downtime whose periods go late.
    std::thread::sleep(Duration::from_secs(3));
    let caught_up = ws.run(&["--database-url", &db.url, "run", "tick"]);
    assert_eq!(caught_up.code(), 0, "{}", caught_up.stderr());
    let keys = |event: &str| -> Vec<String> {
        let mut keys: Vec<String> = hook
            .events(event)
            .iter()
            .map(|got| {
                got.json()["period_key"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned()
            })
            .collect();
        keys.sort();
        keys
    };
    let late = keys("late");
    assert!(!late.is_empty(), "{:?}", hook.got());
    assert_eq!(keys("recovered"), late, "{:?}", hook.got());
}

/// A receiver that answers 500 twice gets the same Idempotency-Key on the
/// third try, which it takes: delivered once. One that answers 400 is not
/// asked again: given up, and `history` says so.
#[test]
fn a_failing_receiver_is_tried_again_with_the_same_key_and_a_refusing_one_is_given_up() {
    let flaky = Receiver::start(&[500, 500, 200]);
    let refusing = Receiver::start(&[400]);
    let ws = Workspace::new(&format!(
        "[[job]]\nname = \"bad\"\nschedule = \"0 0 1 1 *\"\nperiod = \"year\"\ncommand = [\"false\"]\n\n\
         [[notify]]\nname = \"flaky\"\nurl = \"{}\"\n\n\
         [[notify]]\nname = \"refusing\"\nurl = \"{}\"\n",
        flaky.url(),
        refusing.url()
    ));
    let db = TestDb::sqlite();
    let out = ws.run(&["--database-url", &db.url, "run", "bad", "--period", "2025"]);
    assert_eq!(out.code(), 1, "{}", out.stderr());
    let tries = flaky.got();
    assert_eq!(tries.len(), 3, "{tries:?}");
    assert!(
        tries.iter().all(|t| t.key() == "flaky:bad:2025:failed"),
        "{tries:?}"
    );
    assert!(tries.iter().all(|t| t.body == tries[0].body), "{tries:?}");
    assert_eq!(refusing.got().len(), 1);
    let history = ws.run(&["--database-url", &db.url, "history", "bad"]);
    let said = history.stdout();
    assert!(
        said.contains("to flaky  delivered  3 tries  HTTP 200"),
        "{said}"
    );
    assert!(
        said.contains("to refusing  given_up  1 try  HTTP 400"),
        "{said}"
    );
}

/// A signed notification verifies with the documented algorithm
/// (HMAC-SHA256 of `<timestamp>.<body>`), and no secret (the signing key,
/// a token in the URL, the job's own) is in a payload, a log line or a
/// row.
#[test]
fn a_signed_notification_verifies_and_no_secret_reaches_a_payload_a_log_or_a_row() {
    use hmac::Mac;
    let hook = Receiver::start(&[]);
    let ws = Workspace::new(&format!(
        "[[job]]\nname = \"bad\"\nschedule = \"0 0 1 1 *\"\nperiod = \"year\"\nshell = \"echo $TOKEN >&2; exit 3\"\nenv = {{ TOKEN = \"${{JOB_TOKEN}}\" }}\n\n\
         [[notify]]\nname = \"signed\"\nurl = \"{}?token=${{HOOK_TOKEN}}\"\nsecret = \"${{HOOK_SECRET}}\"\n",
        hook.url()
    ));
    let db = TestDb::sqlite();
    let out = ws
        .command(&[
            "--database-url",
            &db.url,
            "--log-format",
            "json",
            "run",
            "bad",
            "--period",
            "2025",
        ])
        .env("HOOK_SECRET", "s1gn1ng-s3cret-0123456789")
        .env("HOOK_TOKEN", "URLT0KEN-abcdef")
        .env("JOB_TOKEN", "J0BT0KEN-abcdef")
        .output()
        .unwrap();
    assert_eq!(out.code(), 1, "{}", out.stderr());
    let got = hook.got();
    assert_eq!(got.len(), 1, "{got:?}");
    let at = &got[0].headers["x-scheduler-timestamp"];
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(b"s1gn1ng-s3cret-0123456789").unwrap();
    mac.update(format!("{at}.{}", got[0].body).as_bytes());
    let expected = format!("sha256={}", hex::encode(mac.finalize().into_bytes()));
    assert_eq!(got[0].headers["x-scheduler-signature"], expected);
    let rows = crate::support::sqlite_rows(
        &db.url,
        "SELECT notifier || period_key || event || payload || coalesce(error, '') FROM scheduler_notifications",
    );
    for secret in [
        "s1gn1ng-s3cret-0123456789",
        "URLT0KEN-abcdef",
        "J0BT0KEN-abcdef",
    ] {
        assert!(!got[0].body.contains(secret), "{}", got[0].body);
        assert!(!out.stderr().contains(secret), "{}", out.stderr());
        assert!(!out.stdout().contains(secret), "{}", out.stdout());
        assert!(rows.iter().all(|r| !r.contains(secret)), "{rows:?}");
    }
}

/// The process delivering a notification is killed (`kill -9`) while the
/// receiver has not answered: another replica delivers it once the lease
/// runs out, with the same Idempotency-Key. Never lost.
#[test]
fn a_delivery_whose_replica_is_killed_is_delivered_by_another_with_the_same_key() {
    let hook = Receiver::start(&[0, 200]);
    let ws = Workspace::new(&format!(
        "[scheduler]\nlease = \"2s\"\nscan_interval = \"500ms\"\n\n\
         [[job]]\nname = \"bad\"\nschedule = \"0 0 1 1 *\"\nperiod = \"year\"\ncommand = [\"false\"]\n\n\
         [[notify]]\nname = \"oncall\"\nurl = \"{}\"\n",
        hook.url()
    ));
    let db = TestDb::sqlite();
    let mut first = ws
        .command(&["--database-url", &db.url, "run", "bad", "--period", "2025"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually(
        "the first try reached the receiver",
        Duration::from_secs(20),
        || !hook.got().is_empty(),
    );
    first.kill().unwrap();
    first.wait().unwrap();
    let other = serve(&ws, &db);
    eventually(
        "delivered by another replica",
        Duration::from_secs(30),
        || hook.got().len() >= 2,
    );
    // Recorded delivered: nobody tries it again.
    eventually("the delivery recorded", Duration::from_secs(30), || {
        count(
            &db.url,
            "SELECT count(*) FROM scheduler_notifications WHERE state = 'delivered'",
        ) == 1
    });
    stop(other);
    let got = hook.got();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(got[0].key(), got[1].key());
    assert_eq!(got[0].body, got[1].body);
    let history = ws.run(&["--database-url", &db.url, "history", "bad"]);
    assert!(
        history.stdout().contains("to oncall  delivered  2 tries"),
        "{}",
        history.stdout()
    );
}

/// A receiver that never answers holds none of the fires and none of the
/// heartbeats (a lease of 3 s is renewed each second; one renewal held two
/// seconds stops the run and leaves its period to a second attempt), and a
/// SIGTERM waits for a delivery under way no longer than its send timeout
/// (10 s) and the write of its outcome.
#[test]
fn a_receiver_that_hangs_delays_no_fire_no_heartbeat_and_no_shutdown() {
    let hook = Receiver::start(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
    let ws = Workspace::new(&format!(
        "[scheduler]\nscan_interval = \"500ms\"\nlease = \"3s\"\n\n\
         [[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\nshell = \"echo $SCHEDULER_PERIOD_KEY >> ticks\"\ndeadline = \"1s\"\n\n\
         [[job]]\nname = \"long\"\nschedule = \"*/2 * * * * *\"\nshell = \"sleep 4\"\n\n\
         [[notify]]\nname = \"stuck\"\nurl = \"{}\"\nevents = [\"late\"]\n",
        hook.url()
    ));
    let db = TestDb::sqlite();
    assert_eq!(
        ws.run(&["--database-url", &db.url, "run", "tick"]).code(),
        0
    );
    // Scenario time: the downtime whose periods go late, to be told to a
    // receiver that never answers.
    std::thread::sleep(Duration::from_secs(3));
    let replica = serve(&ws, &db);
    eventually("a delivery under way", Duration::from_secs(20), || {
        !hook.got().is_empty()
    });
    let ticks = || {
        std::fs::read_to_string(ws.dir.path().join("ticks"))
            .unwrap_or_default()
            .lines()
            .count()
    };
    let before = ticks();
    within(Duration::from_secs(8), || ticks() >= before + 6);
    assert!(
        ticks() >= before + 6,
        "fires stalled: {} then {}",
        before,
        ticks()
    );
    let long = |outcome: &str| {
        count(
            &db.url,
            &format!("SELECT count(*) FROM scheduler_attempts WHERE job = 'long' AND {outcome}"),
        )
    };
    // Two long runs have had their heartbeats renewed through to the end.
    within(Duration::from_secs(60), || {
        long("outcome = 'succeeded'") >= 2
    });
    let stopping = std::time::Instant::now();
    assert_eq!(stop(replica), 0);
    assert!(
        stopping.elapsed() < Duration::from_secs(30),
        "shutdown waited for the receiver past its send timeout: {:?}",
        stopping.elapsed()
    );
    assert!(long("outcome = 'succeeded'") >= 2, "no long run finished");
    assert_eq!(
        long("(attempt > 1 OR outcome = 'lost')"),
        0,
        "a heartbeat was held past the lease"
    );
}

/// `run` of a job a notifier is told of refuses to start while that
/// notifier's `${VAR}` is unset (it would sign with an empty key, or send
/// nowhere), as `serve` does; a deadline not shorter than `catch_up` could
/// never be told and is refused at load.
#[test]
fn an_incomplete_notifier_stops_run_and_a_deadline_past_catch_up_is_refused() {
    let hook = Receiver::start(&[]);
    let ws = Workspace::new(&format!(
        "[[job]]\nname = \"bad\"\nschedule = \"0 0 1 1 *\"\nperiod = \"year\"\ncommand = [\"false\"]\n\n\
         [[notify]]\nname = \"signed\"\nurl = \"{}\"\nsecret = \"${{HOOK_SECRET}}\"\n",
        hook.url()
    ));
    let db = TestDb::sqlite();
    let out = ws.run(&["--database-url", &db.url, "run", "bad", "--period", "2025"]);
    assert_eq!(out.code(), 2, "{}", out.stderr());
    assert!(
        out.stderr().contains("`HOOK_SECRET` is not set"),
        "{}",
        out.stderr()
    );
    assert!(hook.got().is_empty());
    let ws = Workspace::new(
        "[scheduler]\ncatch_up = \"1h\"\n\n[[job]]\nname = \"weekly\"\nschedule = \"0 0 * * 1\"\ncommand = [\"true\"]\ndeadline = \"2h\"\n",
    );
    let out = ws.run(&["check"]);
    assert_eq!(out.code(), 2, "{}", out.stderr());
    assert!(
        out.stderr()
            .contains("`deadline` (2h) must be shorter than `catch_up` (1h)")
            && out.stderr().contains("jobs.toml:8:"),
        "{}",
        out.stderr()
    );
    // A URL that is no URL at all (no host, a port out of range) is
    // refused at load, not tried for a day.
    for url in ["http://", "http://127.0.0.1:99999/"] {
        std::fs::write(
            ws.dir.path().join("jobs.toml"),
            format!(
                "[[job]]\nname = \"j\"\nschedule = \"@daily\"\ncommand = [\"true\"]\n\n\
                 [[notify]]\nname = \"a\"\nurl = \"{url}\"\n"
            ),
        )
        .unwrap();
        let out = ws.run(&["check"]);
        assert_eq!(out.code(), 2, "{url}: {}", out.stderr());
        assert!(
            out.stderr()
                .contains("notifier `a`: `url` is not a valid URL"),
            "{url}: {}",
            out.stderr()
        );
    }
}

/// `run` delivers for its budget and no longer, however many
/// notifications a receiver that hangs holds.
#[test]
fn run_delivers_within_its_budget_whatever_a_hanging_receiver_holds() {
    let hook = Receiver::start(&[0; 10]);
    let ws = Workspace::new(&format!(
        "[[job]]\nname = \"bad\"\nschedule = \"0 0 1 1 *\"\nperiod = \"year\"\ncommand = [\"false\"]\n\n\
         [[notify]]\nname = \"stuck\"\nurl = \"{}\"\n",
        hook.url()
    ));
    let db = TestDb::sqlite();
    let started = std::time::Instant::now();
    let out = ws.run(&[
        "--database-url",
        &db.url,
        "run",
        "bad",
        "--from",
        "2020",
        "--to",
        "2024",
    ]);
    assert_eq!(out.code(), 1, "{}", out.stderr());
    assert_eq!(hook.got().len(), 5, "{:?}", hook.got());
    assert!(
        started.elapsed() < Duration::from_secs(25),
        "run waited {:?} for a receiver that hangs",
        started.elapsed()
    );
}

/// A `recovered` is not sent while its period's `failed` waits for a try
/// again: the receiver sees `failed` delivered first.
#[test]
fn recovered_waits_for_its_periods_failed_to_be_delivered() {
    let hook = Receiver::start(&[500, 500, 500, 500, 500]);
    let ws = Workspace::new(&format!(
        "[[job]]\nname = \"flaky\"\nschedule = \"0 0 1 1 *\"\nperiod = \"year\"\nshell = \"test -f ok\"\n\n\
         [[notify]]\nname = \"oncall\"\nurl = \"{}\"\n",
        hook.url()
    ));
    let db = TestDb::sqlite();
    let url = db.url.as_str();
    assert_eq!(
        ws.run(&["--database-url", url, "run", "flaky", "--period", "2025"])
            .code(),
        1
    );
    std::fs::write(ws.dir.path().join("ok"), "").unwrap();
    assert_eq!(
        ws.run(&["--database-url", url, "run", "flaky", "--period", "2025"])
            .code(),
        0
    );
    let events = |got: &[Got]| -> Vec<String> {
        got.iter()
            .map(|g| g.headers["x-scheduler-event"].clone())
            .collect()
    };
    assert!(
        !events(&hook.got()).contains(&"recovered".to_owned()),
        "recovered sent before failed was delivered: {:?}",
        events(&hook.got())
    );
    eventually(
        "failed, then recovered, delivered",
        Duration::from_secs(60),
        || {
            ws.run(&["--database-url", url, "run", "flaky"]);
            events(&hook.got()).contains(&"recovered".to_owned())
        },
    );
    let told = events(&hook.got());
    assert_eq!(
        told.last().map(String::as_str),
        Some("recovered"),
        "{told:?}"
    );
    assert!(
        told[..told.len() - 1].iter().all(|e| e == "failed"),
        "{told:?}"
    );
}

/// A period that waits for an upstream period past its deadline is late,
/// and its `late` says what it waits for.
#[test]
fn a_period_waiting_past_its_deadline_is_told_late_with_what_it_waits_for() {
    let hook = Receiver::start(&[]);
    let ws = Workspace::new(&format!(
        "[[job]]\nname = \"ingest\"\nschedule = \"* * * * * *\"\ncommand = [\"false\"]\n\n\
         [[job]]\nname = \"rollup\"\nschedule = \"* * * * * *\"\nafter = [\"ingest\"]\n\
         command = [\"true\"]\ndeadline = \"1s\"\n\n\
         [[notify]]\nname = \"oncall\"\nurl = \"{}\"\nevents = [\"late\"]\n",
        hook.url()
    ));
    let db = TestDb::sqlite();
    let first = ws.run(&["--database-url", &db.url, "run", "rollup"]);
    assert_eq!(first.code(), 0, "{}{}", first.stdout(), first.stderr());
    assert!(
        first.stdout().contains("waiting for ingest: 0/1, missing "),
        "{}",
        first.stdout()
    );
    eventually(
        "the waiting period's deadline",
        Duration::from_secs(60),
        || {
            count(
                &db.url,
                &format!(
                    "SELECT count(*) FROM scheduler_waiting WHERE job = 'rollup' AND {PAST_DEADLINE}"
                ),
            ) == 1
        },
    );
    let second = ws.run(&["--database-url", &db.url, "run", "rollup"]);
    assert_eq!(second.code(), 0, "{}", second.stderr());
    let told = hook
        .events("late")
        .iter()
        .map(Got::json)
        .find(|body| body["state"] == "waiting")
        .unwrap_or_else(|| panic!("no late waiting period: {:?}", hook.got()));
    let waits = told["waiting_for"].as_str().unwrap_or_default();
    assert!(waits.starts_with("ingest: 0/1, missing "), "{told}");
    assert_eq!(
        count(
            &db.url,
            "SELECT count(*) FROM scheduler_claims WHERE job = 'rollup'"
        ),
        0
    );
}

/// Item 3 of "once at the edges": a redirect is tried again (the URL may
/// be put right by a reload within the day), naming where it points, and
/// delivered once the receiver takes it.
#[test]
fn a_redirect_is_tried_again_and_delivered_once_the_receiver_takes_it() {
    let hook = Receiver::start(&[301, 200]);
    let ws = Workspace::new(&format!(
        "[[job]]\nname = \"bad\"\nschedule = \"0 0 1 1 *\"\nperiod = \"year\"\ncommand = [\"false\"]\n\n\
         [[notify]]\nname = \"moved\"\nurl = \"{}\"\n",
        hook.url()
    ));
    let db = TestDb::sqlite();
    let out = ws.run(&["--database-url", &db.url, "run", "bad", "--period", "2025"]);
    assert_eq!(out.code(), 1, "{}", out.stderr());
    assert!(
        out.stderr()
            .contains("a redirect to no Location; redirects are not followed"),
        "{}",
        out.stderr()
    );
    assert_eq!(hook.got().len(), 2, "{:?}", hook.got());
    let history = ws.run(&["--database-url", &db.url, "history", "bad"]);
    assert!(
        history
            .stdout()
            .contains("to moved  delivered  2 tries  HTTP 200"),
        "{}",
        history.stdout()
    );
}

/// Item 3 of "once at the edges": a notifier taken out of jobs.toml keeps
/// its notifications pending (a run under the new file gives none up),
/// and putting it back sends them.
#[test]
fn a_notifier_taken_out_and_put_back_still_sends_what_it_owed() {
    let hanging = Receiver::start(&[0]);
    let good = Receiver::start(&[]);
    let other = Receiver::start(&[]);
    let job = "[[job]]\nname = \"bad\"\nschedule = \"0 0 1 1 *\"\nperiod = \"year\"\ncommand = [\"false\"]\n";
    let notifier =
        |name: &str, url: String| format!("\n[[notify]]\nname = \"{name}\"\nurl = \"{url}\"\n");
    let ws = Workspace::new(&format!("{job}{}", notifier("oncall", hanging.url())));
    let db = TestDb::sqlite();
    let run = |period: &str| ws.run(&["--database-url", &db.url, "run", "bad", "--period", period]);
    // The one try times out with the run's budget: the row stays pending.
    assert_eq!(run("2025").code(), 1);
    assert_eq!(hanging.got().len(), 1);
    // Its next try due: a run now takes it up, or would give it up.
    eventually("the pending try due", Duration::from_secs(60), || {
        count(
            &db.url,
            "SELECT count(*) FROM scheduler_notifications WHERE notifier = 'oncall' \
             AND ((state = 'pending' AND next_try_at <= CAST(unixepoch('subsec') * 1000 AS INTEGER)) \
             OR (state = 'sending' AND lease_until < CAST(unixepoch('subsec') * 1000 AS INTEGER)))",
        ) == 1
    });
    std::fs::write(
        ws.path().join("jobs.toml"),
        format!("{job}{}", notifier("other", other.url())),
    )
    .unwrap();
    assert_eq!(run("2024").code(), 1);
    assert!(
        other
            .got()
            .iter()
            .any(|g| g.key() == "other:bad:2024:failed"),
        "{:?}",
        other.got()
    );
    std::fs::write(
        ws.path().join("jobs.toml"),
        format!(
            "{job}{}{}",
            notifier("other", other.url()),
            notifier("oncall", good.url())
        ),
    )
    .unwrap();
    assert_eq!(run("2023").code(), 1);
    let keys: Vec<String> = good.got().iter().map(|g| g.key().to_owned()).collect();
    assert!(
        keys.contains(&"oncall:bad:2025:failed".to_owned()),
        "{keys:?}"
    );
    let history = ws.run(&["--database-url", &db.url, "history", "bad"]);
    assert!(
        !history.stdout().contains("given_up"),
        "{}",
        history.stdout()
    );
}
