//! Once at the edges: what happens in the first second after a database
//! comes back, and notifications told once through cuts and deploys.

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::api::{CI, READER, Server, with_api};
use crate::serve::stop;
use crate::support::{Proxy, Said, TestDb, Workspace, count, eventually, lines, proxied, wait};

/// Generous bound for a process to exit: hang detection only.
const BOUND: Duration = Duration::from_secs(90);

/// A job that ends half a second after `cut` appears, noting each start.
const ENDS_IN_THE_CUT: &str = "[scheduler]\nlease = \"6s\"\n\n\
     [[job]]\nname = \"w\"\nschedule = \"0 0 * * *\"\nperiod = \"day\"\n\
     shell = \"echo $SCHEDULER_PERIOD_KEY >> runs.txt; while [ ! -e cut ]; do sleep 0.01; done; sleep 0.5\"\n";

/// One round: a one-shot `run` whose job ends 0.5 s into a 12 s cut, and a
/// second one-shot `run` of the same period started the instant the
/// database passes again. How many times the job started, and what the
/// second run said.
fn a_run_at_the_return(db: &TestDb, period: &str) -> (usize, String) {
    let (proxy, url) = proxied(db);
    let ws = Workspace::new(ENDS_IN_THE_CUT);
    let runner = ws
        .command(&["--database-url", &url, "run", "w", "--period", period])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start the runner");
    eventually("the job to start", BOUND, || {
        !lines(ws.path().join("runs.txt")).is_empty()
    });
    proxy.cut();
    std::fs::write(ws.path().join("cut"), "").unwrap();
    // Scenario time: the cut, twice the lease.
    std::thread::sleep(Duration::from_secs(12));
    proxy.restore();
    let second = ws
        .command(&["--database-url", &url, "run", "w", "--period", period])
        .output()
        .expect("run at the return");
    let first = wait(runner, BOUND);
    assert_eq!(first.code(), 0, "{}", first.stderr());
    (
        lines(ws.path().join("runs.txt")).len(),
        format!("{}{}", second.stdout(), second.stderr()),
    )
}

/// Item 4: a platform cron tick that lands the instant a database comes
/// back, with a run elsewhere whose job ended during the outage, never
/// runs the period again: a process that has just started leaves an
/// expired lease to its runner for a heartbeat interval. Ten rounds side
/// by side, each with its own database and proxy.
#[test]
fn a_run_started_as_the_database_returns_never_runs_a_period_that_ended_in_the_outage() {
    let Some(_) = TestDb::postgres_blocking() else {
        return;
    };
    let period = (chrono::Utc::now().date_naive() - chrono::Days::new(1)).to_string();
    let rounds: Vec<_> = (0..10)
        .map(|_| {
            let period = period.clone();
            std::thread::spawn(move || {
                let db = TestDb::postgres_blocking().expect("the server answered before");
                let (starts, said) = a_run_at_the_return(&db, &period);
                let attempts = count(
                    &db.url,
                    "SELECT count(*) FROM scheduler_attempts WHERE job = 'w'",
                );
                (starts, attempts, said)
            })
        })
        .collect();
    for round in rounds {
        let (starts, attempts, said) = round.join().expect("round");
        assert_eq!((starts, attempts), (1, 1), "run again: {said}");
        assert!(said.contains("skipped"), "{said}");
    }
}

/// One request a receiver got: which replica sent it (the `r` of its URL)
/// and its Idempotency-Key.
#[derive(Debug, Clone)]
struct Request {
    replica: String,
    key: String,
}

/// What the receiver does about each request beside answering it: cut the
/// sender's database connections (`Cut`) or tell the test who sent it
/// (`Tell`), once.
#[derive(Clone, Copy, PartialEq)]
enum Phase {
    Cut,
    Tell,
}

/// A receiver that answers every request 200 after 3 s, and in the `Cut`
/// phase cuts the sender's proxy 1 s after a request for 10 s.
struct SlowReceiver {
    port: u16,
    got: Arc<Mutex<Vec<Request>>>,
    phase: Arc<Mutex<Phase>>,
    told: Arc<Mutex<Option<String>>>,
    /// The replicas cut now (cut again by a request only once restored).
    cutting: Arc<Mutex<HashSet<String>>>,
}

impl SlowReceiver {
    fn start(proxies: HashMap<String, Arc<Proxy>>) -> SlowReceiver {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let got = Arc::new(Mutex::new(Vec::new()));
        let phase = Arc::new(Mutex::new(Phase::Cut));
        let told = Arc::new(Mutex::new(None));
        let cutting: Arc<Mutex<HashSet<String>>> = Arc::default();
        let receiver = SlowReceiver {
            port,
            got: got.clone(),
            phase: phase.clone(),
            told: told.clone(),
            cutting: cutting.clone(),
        };
        std::thread::spawn(move || {
            for stream in listener.incoming().map_while(Result::ok) {
                let (got, phase, told) = (got.clone(), phase.clone(), told.clone());
                let (proxies, cutting) = (proxies.clone(), cutting.clone());
                std::thread::spawn(move || {
                    let Some(request) = read_request(&stream) else {
                        return;
                    };
                    got.lock().unwrap().push(request.clone());
                    let replica = request.replica;
                    match *phase.lock().unwrap() {
                        Phase::Cut if cutting.lock().unwrap().insert(replica.clone()) => {
                            let proxy = proxies[&replica].clone();
                            std::thread::spawn(move || {
                                // Scenario time: 1 s into the request, a
                                // cut of 10 s.
                                std::thread::sleep(Duration::from_secs(1));
                                proxy.cut();
                                std::thread::sleep(Duration::from_secs(10));
                                proxy.restore();
                                cutting.lock().unwrap().remove(&replica);
                            });
                        }
                        Phase::Tell => {
                            told.lock().unwrap().get_or_insert(replica);
                        }
                        Phase::Cut => {}
                    }
                    // Scenario time: a receiver that answers in 3 s.
                    std::thread::sleep(Duration::from_secs(3));
                    let _ = (&stream).write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n");
                });
            }
        });
        receiver
    }

    fn got(&self) -> Vec<Request> {
        self.got.lock().unwrap().clone()
    }

    /// Whether no sender is cut now.
    fn uncut(&self) -> bool {
        self.cutting.lock().unwrap().is_empty()
    }
}

/// Whether every notification in `url`'s database is delivered, `at_least`
/// of them: none is left to send, or to send again.
fn all_delivered(url: &str, at_least: i64) -> bool {
    count(
        url,
        "SELECT count(*) FROM scheduler_notifications WHERE state <> 'delivered'",
    ) == 0
        && count(
            url,
            "SELECT count(*) FROM scheduler_notifications WHERE state = 'delivered'",
        ) >= at_least
}

/// The sender and the Idempotency-Key of one request on `stream`.
fn read_request(stream: &std::net::TcpStream) -> Option<Request> {
    let mut reader = BufReader::new(stream);
    let mut line = String::new();
    reader.read_line(&mut line).ok()?;
    let replica = line
        .split("r=")
        .nth(1)?
        .split([' ', '&'])
        .next()?
        .to_owned();
    let mut key = String::new();
    let mut length = 0;
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap_or(0) == 0 || line.trim().is_empty() {
            break;
        }
        let Some((name, value)) = line.trim().split_once(':') else {
            continue;
        };
        match name.trim().to_lowercase().as_str() {
            "idempotency-key" => key = value.trim().to_owned(),
            "content-length" => length = value.trim().parse().unwrap_or(0),
            _ => {}
        }
    }
    let mut body = vec![0; length];
    reader.read_exact(&mut body).ok()?;
    Some(Request { replica, key })
}

/// Items 1 and 2: three replicas, each through its own proxy, deliver 100
/// notifications (25 periods failed, then recovered, each to a `json` and
/// a `slack` notifier) to a receiver that answers in 3 s. In the first
/// half every sender's connections are cut 1 s into its request, for
/// 10 s; in the second, a sender gets SIGTERM during a request. Every
/// (notifier, period, event) is received exactly once.
#[test]
fn notifications_are_received_once_through_cuts_and_a_sigterm_of_the_sender() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let names = ["a", "b", "c"];
    let proxied: Vec<(Arc<Proxy>, String)> = names
        .iter()
        .map(|_| {
            let (proxy, url) = proxied(&db);
            (Arc::new(proxy), url)
        })
        .collect();
    let proxies: HashMap<String, Arc<Proxy>> = names
        .iter()
        .zip(&proxied)
        .map(|(name, (proxy, _))| (name.to_string(), proxy.clone()))
        .collect();
    let hook = SlowReceiver::start(proxies);
    let job = "[[job]]\nname = \"bad\"\nschedule = \"0 3 * * *\"\nperiod = \"day\"\n\
               active_until = \"2026-11-30\"\nshell = \"test -e ok\"\n";
    let ws = Workspace::new(&format!(
        "[scheduler]\nlease = \"12s\"\nscan_interval = \"500ms\"\nshutdown_grace = \"1s\"\n\n{job}\n\
         [[notify]]\nname = \"oncall\"\nurl = \"http://127.0.0.1:{port}/hook?r=${{REPLICA}}\"\n\n\
         [[notify]]\nname = \"chat\"\nformat = \"slack\"\nurl = \"http://127.0.0.1:{port}/chat?r=${{REPLICA}}\"\n",
        port = hook.port
    ));
    // The periods are run without the notifiers, so only the replicas tell.
    std::fs::write(ws.path().join("quiet.toml"), job).unwrap();
    let backfill = || {
        ws.run(&[
            "--config",
            "quiet.toml",
            "--database-url",
            &db.url,
            "run",
            "bad",
            "--from",
            "2026-11-01",
            "--to",
            "2026-11-25",
            "--force",
        ])
    };
    assert_eq!(backfill().code(), 1, "every period fails");
    let start = |name: &str, url: &str| {
        let log = std::fs::File::create(ws.path().join(format!("serve-{name}.log"))).unwrap();
        ws.command(&["--database-url", url, "serve"])
            .env("REPLICA", name)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start serve")
    };
    let mut replicas: HashMap<String, std::process::Child> = names
        .iter()
        .zip(&proxied)
        .map(|(name, (_, url))| (name.to_string(), start(name, url)))
        .collect();
    eventually("50 failed notifications", Duration::from_secs(120), || {
        unique(&hook.got()) >= 50
    });
    // Past any cut still under way, and any second send it would cause:
    // every sender restored, and every notification recorded delivered.
    eventually("the cuts over and the 50 recorded", BOUND, || {
        hook.uncut() && all_delivered(&db.url, 50)
    });
    *hook.phase.lock().unwrap() = Phase::Tell;
    std::fs::write(ws.path().join("ok"), "").unwrap();
    assert_eq!(backfill().code(), 0, "every period succeeds");
    let mut sender = None;
    eventually(
        "a recovered notification under way",
        Duration::from_secs(60),
        || {
            sender = hook.told.lock().unwrap().clone();
            sender.is_some()
        },
    );
    let sender = sender.unwrap();
    assert_eq!(stop(replicas.remove(&sender).unwrap()), 0);
    eventually("100 notifications", Duration::from_secs(120), || {
        unique(&hook.got()) >= 100
    });
    // Every one recorded delivered: none is sent again.
    eventually("the 100 recorded", BOUND, || all_delivered(&db.url, 100));
    for (_, replica) in replicas {
        assert_eq!(stop(replica), 0);
    }
    let got = hook.got();
    let mut seen: HashMap<&str, usize> = HashMap::new();
    for request in &got {
        *seen.entry(request.key.as_str()).or_default() += 1;
    }
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "told more than once: {twice:?}");
    assert_eq!(seen.len(), 100, "{seen:?}");
    let delivered = count(
        &db.url,
        "SELECT count(*) FROM scheduler_notifications WHERE state = 'delivered' AND tries = 1",
    );
    assert_eq!(delivered, 100);
}

/// How many different notifications `got` holds.
fn unique(got: &[Request]) -> usize {
    got.iter().map(|r| &r.key).collect::<HashSet<_>>().len()
}

/// Item 2: a rolling deploy. SIGTERM reaches `serve` while a delivery is
/// out to a receiver that answers in 3 s; the replica that follows sends
/// nothing again, because the one stopping finished the send and wrote how
/// it went before it exited.
#[test]
fn sigterm_during_a_delivery_finishes_it_and_the_next_replica_sends_nothing_again() {
    let hook = SlowReceiver::start(HashMap::new());
    *hook.phase.lock().unwrap() = Phase::Tell;
    let job = "[[job]]\nname = \"bad\"\nschedule = \"0 0 1 1 *\"\nperiod = \"year\"\ncommand = [\"false\"]\n";
    let ws = Workspace::new(&format!(
        "[scheduler]\nlease = \"2s\"\nscan_interval = \"500ms\"\nshutdown_grace = \"1s\"\n\n{job}\n\
         [[notify]]\nname = \"oncall\"\nurl = \"http://127.0.0.1:{}/hook?r=${{REPLICA}}\"\n",
        hook.port
    ));
    std::fs::write(ws.path().join("quiet.toml"), job).unwrap();
    let db = TestDb::sqlite();
    let out = ws.run(&[
        "--config",
        "quiet.toml",
        "--database-url",
        &db.url,
        "run",
        "bad",
        "--period",
        "2025",
    ]);
    assert_eq!(out.code(), 1, "{}", out.stderr());
    let log = |name: &str| ws.path().join(format!("serve-{name}.log"));
    let serve = |name: &str| {
        ws.command(&["--database-url", &db.url, "serve"])
            .env("REPLICA", name)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log(name)).unwrap())
            .spawn()
            .expect("start serve")
    };
    let first = serve("a");
    eventually("a delivery under way", BOUND, || {
        hook.told.lock().unwrap().is_some()
    });
    assert_eq!(stop(first), 0);
    let next = serve("b");
    // The next serving (its first round of deliveries starts then), and
    // the delivery recorded: by the one stopping, or else by the next,
    // past the lease of one left `sending`, once it has sent it again.
    eventually("the next serving, the delivery recorded", BOUND, || {
        std::fs::read_to_string(log("b")).is_ok_and(|l| l.contains("serving"))
            && all_delivered(&db.url, 1)
    });
    assert_eq!(stop(next), 0);
    let got = hook.got();
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        count(
            &db.url,
            "SELECT count(*) FROM scheduler_notifications WHERE state = 'delivered'"
        ),
        1
    );
}

/// A job with a period a minute, for reads of many periods.
const MINUTELY: &str = "\n[[job]]\nname = \"m\"\nschedule = \"* * * * *\"\nperiod = \"minute\"\ncommand = [\"true\"]\n";

/// Item 5: the console's login slows down after five failures in a row
/// (429 with Retry-After, for a good token too while it lasts), and each
/// failure is a WARN naming where it came from, never what was typed.
#[test]
fn failed_console_logins_are_slowed_down_and_logged_without_what_was_typed() {
    let ws = Workspace::new(&with_api(MINUTELY));
    let db = TestDb::sqlite();
    let server = Server::start(&ws, &db.url);
    let login = |token: &str| {
        reqwest::blocking::Client::new()
            .post(format!("{}/console/session", server.base()))
            .json(&serde_json::json!({ "token": token }))
            .send()
            .expect("login")
    };
    let guesses: Vec<u16> = (0..8)
        .map(|i| {
            login(&format!("guess-{i}-typed-by-an-attacker"))
                .status()
                .as_u16()
        })
        .collect();
    assert_eq!(guesses, [401, 401, 401, 401, 401, 429, 429, 429]);
    let held = login(READER);
    assert_eq!(held.status().as_u16(), 429);
    let retry_after: u64 = held.headers()["retry-after"]
        .to_str()
        .unwrap()
        .parse()
        .unwrap();
    // Asked again (a refusal is no failure) until let through, within the
    // wait the server asked for and a second.
    let mut last = 0;
    crate::support::within(Duration::from_secs(retry_after + 1), || {
        last = login(READER).status().as_u16();
        last == 200
    });
    assert_eq!(last, 200, "let through once the wait is over");
    drop(server);
    let log = std::fs::read_to_string(ws.path().join("serve.log")).unwrap_or_default();
    let failed = log
        .lines()
        .filter(|l| l.contains("console login failed"))
        .count();
    assert_eq!(failed, 5, "{log}");
    assert!(log.contains("from=\"127.0.0.1:"), "{log}");
    assert!(
        log.contains("console login refused: too many failed logins"),
        "{log}"
    );
    assert!(!log.contains("typed-by-an-attacker"), "{log}");
}

/// Item 6: every answer of the API, a job's data or an error, says
/// `Cache-Control: no-store`.
#[test]
fn api_answers_are_never_stored_by_a_browser_or_a_proxy() {
    let ws = Workspace::new(&with_api(MINUTELY));
    let db = TestDb::sqlite();
    let server = Server::start(&ws, &db.url);
    for path in [
        "/v1/jobs",
        "/v1/jobs/m/periods?last=3",
        "/v1/jobs/nope/periods",
        "/v1/runs",
    ] {
        let answer = server.get(READER, path);
        assert_eq!(
            answer
                .headers()
                .get("cache-control")
                .map(|v| v.to_str().unwrap()),
            Some("no-store"),
            "{path}: {}",
            answer.status()
        );
    }
}

/// Item 7: one token's 40 reads of 10,000 periods each, sent at once, do
/// not hold another token's read behind them: it is answered while most of
/// the 40 are still waiting.
#[test]
fn one_tokens_burst_of_reads_does_not_starve_another_token() {
    let ws = Workspace::new(&with_api(MINUTELY));
    let db = TestDb::sqlite();
    let server = Arc::new(Server::start(&ws, &db.url));
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let burst: Vec<_> = (0..40)
        .map(|_| {
            let (server, done) = (server.clone(), done.clone());
            std::thread::spawn(move || {
                let answer = server.get(
                    CI,
                    "/v1/jobs/m/periods?from=2026-10-01T00:00&to=2026-10-07T22:39",
                );
                assert_eq!(answer.status().as_u16(), 200);
                done.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            })
        })
        .collect();
    eventually("the burst under way", BOUND, || {
        done.load(std::sync::atomic::Ordering::SeqCst) >= 1
    });
    let answer = server.get(READER, "/v1/jobs");
    assert_eq!(answer.status().as_u16(), 200);
    let before = done.load(std::sync::atomic::Ordering::SeqCst);
    assert!(
        before <= 20,
        "the other token waited for {before} of the 40"
    );
    for read in burst {
        read.join().unwrap();
    }
}

/// Item 9: a request with two session cookies (one set by a page of
/// another port of the same host) is refused, and over HTTPS the cookie is
/// a `__Host-` one that no such page can set.
#[test]
fn two_session_cookies_are_refused_and_https_sessions_are_host_cookies() {
    let ws = Workspace::new(&with_api(MINUTELY));
    let db = TestDb::sqlite();
    let server = Server::start(&ws, &db.url);
    let client = reqwest::blocking::Client::new();
    let login = |proto: &str| {
        client
            .post(format!("{}/console/session", server.base()))
            .header("X-Forwarded-Proto", proto)
            .json(&serde_json::json!({ "token": READER }))
            .send()
            .expect("login")
    };
    let cookie = |answer: &reqwest::blocking::Response| {
        let set = answer.headers()["set-cookie"].to_str().unwrap().to_owned();
        set.split(';').next().unwrap().to_owned()
    };
    let plain = cookie(&login("http"));
    let secure = login("https");
    let secure_set = secure.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        secure_set.starts_with("__Host-scheduler_session=") && secure_set.contains("Secure"),
        "{secure_set}"
    );
    let read = |cookies: &str| {
        client
            .get(format!("{}/v1/jobs", server.base()))
            .header("Cookie", cookies)
            .send()
            .expect("read")
    };
    assert_eq!(read(&plain).status().as_u16(), 200);
    let planted = "scheduler_session=6f6e2d63616c6c.4102444800.00";
    for both in [format!("{planted}; {plain}"), format!("{plain}; {planted}")] {
        let refused = read(&both);
        assert_eq!(refused.status().as_u16(), 401, "{both}");
        assert!(refused.text().unwrap().contains("two session cookies"));
    }
    // Over HTTPS only the `__Host-` cookie is read: a plain one planted
    // beside it is ignored, and alone it is nobody.
    let host = cookie(&secure);
    let read_https = |cookies: &str| {
        client
            .get(format!("{}/v1/jobs", server.base()))
            .header("X-Forwarded-Proto", "https")
            .header("Cookie", cookies)
            .send()
            .expect("read")
            .status()
            .as_u16()
    };
    assert_eq!(read_https(&format!("{planted}; {host}")), 200);
    assert_eq!(read_https(&plain), 401);
}
