//! The HTTP API against the real server, with a real HTTP client: tokens,
//! the Idempotency-Key contract, runs on the answering replica, and what a
//! slow or idle client can and cannot do.

use std::net::TcpStream;
use std::process::{Child, Stdio};
use std::time::Duration;

use reqwest::StatusCode;
use reqwest::blocking::{Client, Response};
use serde_json::{Value, json};

use crate::serve::stop;
use crate::support::{
    Said, TestDb, Workspace, count, databases, eventually, lines, listened, listening_at, serve_log,
};

const BOUND: Duration = Duration::from_secs(60);

pub(crate) const CI: &str = "ci-secret-0123456789abcdef";
const ONCALL: &str = "oncall-secret-0123456789abcdef";
pub(crate) const READER: &str = "reader-secret-0123456789abcdef";

/// A jobs.toml with the three tokens and `jobs`.
pub(crate) fn with_api(jobs: &str) -> String {
    format!(
        "[scheduler]\nlease = \"2s\"\nscan_interval = \"1s\"\nshutdown_grace = \"2s\"\n\n\
         [api]\ntokens = [\n\
           {{ name = \"ci\", secret = \"${{CI_TOKEN}}\", allow = [\"read\", \"trigger\"] }},\n\
           {{ name = \"on-call\", secret = \"${{ONCALL_TOKEN}}\", allow = [\"read\", \"trigger\", \"operate\"] }},\n\
           {{ name = \"reader\", secret = \"${{READER_TOKEN}}\", allow = [\"read\"] }},\n\
         ]\n{jobs}"
    )
}

/// A monthly job that appends its period key to runs.txt, after `nap`.
fn monthly(name: &str, nap: &str) -> String {
    format!(
        "\n[[job]]\nname = \"{name}\"\nschedule = \"0 0 1 * *\"\nperiod = \"month\"\n\
         shell = \"sleep {nap}; echo $SCHEDULER_PERIOD_KEY >> runs.txt\"\n"
    )
}

/// A replica serving the API.
pub(crate) struct Server {
    child: Option<Child>,
    base: String,
}

impl Server {
    pub(crate) fn start(ws: &Workspace, url: &str) -> Server {
        let log = ws.path().join("serve.log");
        let before = listened(&log).len();
        let child = ws
            .command(&["--database-url", url, "serve", "--listen", "127.0.0.1:0"])
            .env("CI_TOKEN", CI)
            .env("ONCALL_TOKEN", ONCALL)
            .env("READER_TOKEN", READER)
            .stdout(Stdio::null())
            .stderr(serve_log(ws))
            .spawn()
            .expect("start serve");
        let addr = listening_at(&log, before, BOUND);
        let server = Server {
            child: Some(child),
            base: format!("http://{addr}"),
        };
        eventually("/readyz", BOUND, || {
            client()
                .get(format!("{}/readyz", server.base))
                .send()
                .is_ok_and(|r| r.status() == StatusCode::OK)
        });
        server
    }

    fn url(&self, path: &str) -> String {
        format!("{}{path}", self.base)
    }

    /// `http://IP:PORT`.
    pub(crate) fn base(&self) -> String {
        self.base.clone()
    }

    pub(crate) fn get(&self, token: &str, path: &str) -> Response {
        client()
            .get(self.url(path))
            .bearer_auth(token)
            .send()
            .expect("GET")
    }

    pub(crate) fn post(&self, token: &str, path: &str, key: &str, body: &Value) -> Response {
        client()
            .post(self.url(path))
            .bearer_auth(token)
            .header("Idempotency-Key", key)
            .json(body)
            .send()
            .expect("POST")
    }

    pub(crate) fn stop(mut self) -> i32 {
        stop(self.child.take().expect("running"))
    }

    fn kill(mut self) {
        let mut child = self.child.take().expect("running");
        let _ = child.kill();
        let _ = child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(120))
        .build()
        .expect("client")
}

/// Status, the `Idempotent-Replayed` header, `Location` and the JSON body.
pub(crate) fn answer(response: Response) -> (StatusCode, bool, Option<String>, Value) {
    let status = response.status();
    let replayed = response
        .headers()
        .get("idempotent-replayed")
        .is_some_and(|v| v == "true");
    let location = response
        .headers()
        .get("location")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = response.json().unwrap_or(Value::Null);
    (status, replayed, location, body)
}

fn runs(ws: &Workspace) -> Vec<String> {
    lines(ws.path().join("runs.txt"))
}

#[test]
fn missing_wrong_and_insufficient_tokens_get_401_401_403_and_no_api_section_is_404() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&with_api(&monthly("billing", "0")));
    let server = Server::start(&ws, &db.url);
    let none = client().get(server.url("/v1/jobs")).send().unwrap();
    assert_eq!(none.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(
        server.get("not-a-token-at-all-xxxxx", "/v1/jobs").status(),
        StatusCode::UNAUTHORIZED
    );
    let (status, _, _, body) = answer(server.post(
        READER,
        "/v1/jobs/billing/runs",
        "k1",
        &json!({"period": "2026-07"}),
    ));
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["needs"], "trigger", "{body}");
    let (status, _, _, body) = answer(server.post(CI, "/v1/jobs/billing/pause", "k2", &json!({})));
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    let (status, _, _, body) = answer(server.get(READER, "/v1/jobs"));
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["jobs"][0]["job"], "billing", "{body}");
    assert_eq!(server.stop(), 0);

    let plain = Workspace::new(&monthly("billing", "0"));
    let server = Server::start(&plain, &db.url);
    let (status, _, _, body) = answer(server.get(CI, "/v1/jobs"));
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["error"].as_str().unwrap().contains("[api]"), "{body}");
    assert_eq!(
        client()
            .get(server.url("/healthz"))
            .send()
            .unwrap()
            .status(),
        StatusCode::OK
    );
    assert_eq!(server.stop(), 0);
}

#[test]
fn the_same_key_and_body_run_once_and_the_stored_answer_is_replayed() {
    for db in databases() {
        let ws = Workspace::new(&with_api(&monthly("billing", "0")));
        let server = Server::start(&ws, &db.url);
        let body = json!({"period": "2026-07"});
        let (status, replayed, location, first) =
            answer(server.post(CI, "/v1/jobs/billing/runs?wait=30", "july-1", &body));
        assert_eq!(status, StatusCode::OK, "{first}");
        assert!(!replayed);
        assert_eq!(first["periods"][0]["status"], "succeeded", "{first}");
        let location = location.expect("Location");
        for _ in 0..3 {
            let (again, replayed, again_location, again_body) =
                answer(server.post(CI, "/v1/jobs/billing/runs?wait=30", "july-1", &body));
            assert_eq!(again, status);
            assert!(replayed, "not marked as replayed");
            assert_eq!(again_location.as_deref(), Some(location.as_str()));
            assert_eq!(again_body, first);
        }
        assert_eq!(runs(&ws), ["billing:2026-07"], "{}", db.url);
        let (status, _, _, run) = answer(server.get(READER, &location));
        assert_eq!(status, StatusCode::OK);
        assert_eq!(run["state"], "done", "{run}");
        assert_eq!(run["requested_by"], "ci", "{run}");
        assert_eq!(server.stop(), 0);
    }
}

#[test]
fn the_same_key_sent_from_several_threads_at_once_runs_once() {
    for db in databases() {
        let ws = Workspace::new(&with_api(&monthly("billing", "1")));
        let server = Server::start(&ws, &db.url);
        let answers: Vec<(StatusCode, bool)> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| {
                    s.spawn(|| {
                        let (status, replayed, _, _) = answer(server.post(
                            CI,
                            "/v1/jobs/billing/runs?wait=30",
                            "same",
                            &json!({"period": "2026-07"}),
                        ));
                        (status, replayed)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let executed = answers
            .iter()
            .filter(|(s, replayed)| s.is_success() && !replayed)
            .count();
        assert_eq!(executed, 1, "{answers:?}");
        assert!(
            answers
                .iter()
                .all(|(s, replayed)| *s == StatusCode::CONFLICT
                    || s.is_success() && (*replayed || *s == StatusCode::OK)),
            "{answers:?}"
        );
        assert_eq!(runs(&ws), ["billing:2026-07"], "{}", db.url);
        assert_eq!(server.stop(), 0);
    }
}

#[test]
fn the_same_key_sent_to_two_replicas_on_postgres_runs_once() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let ws = Workspace::new(&with_api(&monthly("billing", "1")));
    let a = Server::start(&ws, &db.url);
    let b = Server::start(&ws, &db.url);
    let body = json!({"period": "2026-07", "force": true});
    let answers: Vec<(StatusCode, bool)> = std::thread::scope(|s| {
        let handles: Vec<_> = [&a, &b, &a, &b]
            .into_iter()
            .map(|server| {
                let body = body.clone();
                s.spawn(move || {
                    let (status, replayed, _, _) =
                        answer(server.post(CI, "/v1/jobs/billing/runs?wait=30", "twice", &body));
                    (status, replayed)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let executed = answers
        .iter()
        .filter(|(s, replayed)| s.is_success() && !replayed)
        .count();
    assert_eq!(executed, 1, "{answers:?}");
    eventually("the run", BOUND, || !runs(&ws).is_empty());
    // Every request settled and no run under way: a second one would have
    // written its line by now.
    eventually("nothing running", BOUND, || {
        count(
            &db.url,
            "SELECT count(*) FROM scheduler_claims WHERE state = 'running'",
        ) == 0
            && count(
                &db.url,
                "SELECT count(*) FROM scheduler_idempotency WHERE state = 'running'",
            ) == 0
    });
    assert_eq!(runs(&ws), ["billing:2026-07"]);
    assert_eq!(a.stop(), 0);
    assert_eq!(b.stop(), 0);
}

#[test]
fn in_flight_is_409_another_body_is_422_and_another_token_has_its_own_scope() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&with_api(&monthly("billing", "3")));
    let server = Server::start(&ws, &db.url);
    let body = json!({"period": "2026-07"});
    let (status, _, location, first) =
        answer(server.post(CI, "/v1/jobs/billing/runs", "slow", &body));
    assert_eq!(status, StatusCode::ACCEPTED, "{first}");
    let location = location.expect("Location");
    let response = server.post(CI, "/v1/jobs/billing/runs", "slow", &body);
    assert_eq!(response.status(), StatusCode::CONFLICT);
    assert!(response.headers().get("retry-after").is_some());
    assert_eq!(
        response
            .headers()
            .get("location")
            .and_then(|v| v.to_str().ok()),
        Some(location.as_str())
    );
    let (status, _, _, error) = answer(server.post(
        CI,
        "/v1/jobs/billing/runs",
        "slow",
        &json!({"period": "2026-06"}),
    ));
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{error}");
    // The same key value from another token is that token's own key: it
    // executes (and finds the period running).
    let (status, replayed, other, _) =
        answer(server.post(ONCALL, "/v1/jobs/billing/runs", "slow", &body));
    assert!(status.is_success() && !replayed, "{status}");
    assert_ne!(other.as_deref(), Some(location.as_str()));
    eventually("the run ends", BOUND, || {
        answer(server.get(READER, &location)).3["state"] == "done"
    });
    // Replayed once the run ended: its outcome, not the first "running".
    let (status, replayed, _, replay) =
        answer(server.post(CI, "/v1/jobs/billing/runs", "slow", &body));
    assert_eq!(status, StatusCode::OK);
    assert!(replayed);
    assert_eq!(replay["id"], first["id"]);
    assert_eq!(replay["state"], "done", "{replay}");
    assert_eq!(replay["outcome"], "succeeded", "{replay}");
    assert_eq!(runs(&ws), ["billing:2026-07"]);
    assert_eq!(server.stop(), 0);
}

#[test]
fn a_forced_rerun_retried_three_times_with_one_key_makes_one_new_attempt() {
    for db in databases() {
        let ws = Workspace::new(&with_api(&monthly("billing", "0")));
        let server = Server::start(&ws, &db.url);
        let (status, _, _, _) = answer(server.post(
            CI,
            "/v1/jobs/billing/runs?wait=30",
            "first",
            &json!({"period": "2026-07"}),
        ));
        assert_eq!(status, StatusCode::OK);
        for _ in 0..3 {
            let (status, _, _, body) = answer(server.post(
                CI,
                "/v1/jobs/billing/runs?wait=30",
                "rerun-july",
                &json!({"period": "2026-07", "force": true}),
            ));
            assert_eq!(status, StatusCode::OK, "{body}");
            // Asked for as `history` says it (issue 39: the answer said
            // only `manual`).
            assert_eq!(body["periods"][0]["asked"], "manual force", "{body}");
        }
        assert_eq!(runs(&ws).len(), 2, "{:?}", runs(&ws));
        let (_, _, _, period) = answer(server.get(READER, "/v1/jobs/billing/periods/2026-07"));
        assert_eq!(period["attempts"][0]["asked"], "manual force", "{period}");
        assert_eq!(
            period["attempts"].as_array().map(Vec::len),
            Some(2),
            "{period}"
        );
        assert_eq!(server.stop(), 0);
    }
}

#[test]
fn a_failed_run_is_replayed_and_a_database_failure_frees_the_key() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let (proxy, url) = crate::support::proxied(&db);
    let ws = Workspace::new(&with_api(
        "\n[[job]]\nname = \"broken\"\nschedule = \"0 0 1 * *\"\nperiod = \"month\"\n\
         shell = \"echo $SCHEDULER_PERIOD_KEY >> runs.txt; exit 3\"\n",
    ));
    let server = Server::start(&ws, &url);
    let body = json!({"period": "2026-07"});
    let (status, _, _, first) =
        answer(server.post(CI, "/v1/jobs/broken/runs?wait=30", "fails", &body));
    assert_eq!(status, StatusCode::OK);
    assert_eq!(first["periods"][0]["status"], "failed", "{first}");
    let (_, replayed, _, again) =
        answer(server.post(CI, "/v1/jobs/broken/runs?wait=30", "fails", &body));
    assert!(replayed);
    assert_eq!(again, first);
    assert_eq!(runs(&ws).len(), 1, "a failed run ran again");

    proxy.cut();
    let june = json!({"period": "2026-06"});
    let (status, _, _, error) =
        answer(server.post(CI, "/v1/jobs/broken/runs?wait=30", "outage", &june));
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{error}");
    proxy.restore();
    let mut executed = None;
    eventually("a retry after the outage executes", BOUND, || {
        let (status, replayed, _, body) =
            answer(server.post(CI, "/v1/jobs/broken/runs?wait=30", "outage", &june));
        executed = Some((status, replayed, body));
        status.is_success()
    });
    let (status, replayed, body) = executed.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(!replayed, "the failed request's answer was stored");
    assert_eq!(runs(&ws).len(), 2);
    assert_eq!(server.stop(), 0);
}

#[test]
fn an_in_progress_key_left_by_a_killed_replica_is_taken_over_after_its_bound() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&with_api(&monthly("billing", "30")));
    let server = Server::start(&ws, &db.url);
    let body = json!({"period": "2026-07"});
    let base = server.base.clone();
    let waiting = std::thread::spawn(move || {
        client()
            .post(format!("{base}/v1/jobs/billing/runs?wait=1"))
            .bearer_auth(CI)
            .header("Idempotency-Key", "crash")
            .json(&json!({"period": "2026-07"}))
            .send()
    });
    // Killed once the request has started its run (its key is taken
    // first, then its run recorded and its period claimed): a kill
    // between the two leaves a request that started nothing, which the
    // next replica carries out afresh.
    eventually("the request's run under way", BOUND, || {
        count(
            &db.url,
            "SELECT count(*) FROM scheduler_claims WHERE period_key = 'billing:2026-07' AND state = 'running'",
        ) == 1
    });
    server.kill();
    let _ = waiting.join();
    let in_progress = count(
        &db.url,
        "SELECT count(*) FROM scheduler_idempotency WHERE state = 'running'",
    );
    assert_eq!(in_progress, 1, "the request was answered before the kill");
    let server = Server::start(&ws, &db.url);
    let (status, _, _, _) = answer(server.post(CI, "/v1/jobs/billing/runs", "crash", &body));
    assert_eq!(status, StatusCode::CONFLICT, "taken over before its bound");
    let mut last = None;
    eventually("the key is taken over", BOUND, || {
        let (status, replayed, _, body) =
            answer(server.post(CI, "/v1/jobs/billing/runs", "crash", &body));
        last = Some((status, replayed, body));
        status != StatusCode::CONFLICT
    });
    // The request had started its run: the answer is that run, abandoned
    // by its replica (its period is recovered like any other), not a
    // second one.
    let (status, replayed, body) = last.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(replayed);
    assert_eq!(body["state"], "abandoned", "{body}");
    assert_eq!(body["outcome"], "abandoned", "{body}");
    // It says what becomes of the periods not listed.
    assert!(
        body["error"]
            .as_str()
            .is_some_and(|e| e.contains("may have been claimed just before the replica stopped")),
        "{body}"
    );
    assert_ne!(body["periods"][0]["status"], "running", "{body}");
    assert_eq!(
        count(&db.url, "SELECT count(*) FROM scheduler_api_runs"),
        1,
        "a second run started"
    );
    server.kill();
}

#[test]
fn bad_requests_are_json_errors_naming_the_field() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&with_api(&monthly("billing", "0")));
    let server = Server::start(&ws, &db.url);
    let no_key = client()
        .post(server.url("/v1/jobs/billing/runs"))
        .bearer_auth(CI)
        .json(&json!({"period": "2026-07"}))
        .send()
        .unwrap();
    let (status, _, _, body) = answer(no_key);
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["field"], "Idempotency-Key", "{body}");
    let (status, _, _, body) = answer(server.post(
        CI,
        "/v1/jobs/biling/runs",
        "k",
        &json!({"period": "2026-07"}),
    ));
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert_eq!(body["nearest"], "billing", "{body}");
    for (bad, field) in [
        (json!({"period": "July"}), "period"),
        (json!({"perod": "2026-07"}), "perod"),
        (json!({"from": "2026-07"}), "to"),
        (json!({"period": "2999-01"}), "period"),
        (json!({"from": "2026-07", "to": "2026-01"}), "to"),
    ] {
        let (status, _, _, body) =
            answer(server.post(CI, "/v1/jobs/billing/runs", &format!("{bad}"), &bad));
        assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert_eq!(body["field"], field, "{bad}: {body}");
    }
    let (status, _, _, body) = answer(server.get(READER, "/v1/nope"));
    assert_eq!(status, StatusCode::NOT_FOUND);
    assert!(body["error"].is_string(), "{body}");
    let (status, _, _, body) = answer(
        client()
            .delete(server.url("/v1/runs/x"))
            .bearer_auth(READER)
            .send()
            .unwrap(),
    );
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert!(body["error"].is_string(), "{body}");
    let (status, _, _, body) =
        answer(server.post(ONCALL, "/v1/jobs/billing/pause", "p", &json!({"x": 1})));
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["field"], "x", "{body}");
    let huge = "x".repeat(70 * 1024);
    let (status, _, _, body) = answer(server.post(
        CI,
        "/v1/jobs/billing/runs",
        "huge",
        &json!({ "period": huge }),
    ));
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE, "{body}");
    let (status, _, _, body) = answer(server.get(READER, "/v1/jobs/billing/periods?from=2026-01"));
    assert_eq!(status, StatusCode::BAD_REQUEST);
    assert_eq!(body["field"], "to", "{body}");
    assert!(runs(&ws).is_empty());
    assert_eq!(server.stop(), 0);
}

#[test]
fn reading_periods_and_operating_jobs_over_the_api() {
    for db in databases() {
        let ws = Workspace::new(&with_api(&monthly("billing", "0")));
        let server = Server::start(&ws, &db.url);
        let (status, _, location, body) = answer(server.post(
            ONCALL,
            "/v1/jobs/billing/runs?wait=30",
            "backfill",
            &json!({"from": "2026-01", "to": "2026-03"}),
        ));
        assert_eq!(status, StatusCode::OK, "{body}");
        assert_eq!(body["periods"].as_array().map(Vec::len), Some(3), "{body}");
        assert!(location.is_some());
        let (status, _, _, range) =
            answer(server.get(READER, "/v1/jobs/billing/periods?from=2025-12&to=2026-04"));
        assert_eq!(status, StatusCode::OK);
        let states: Vec<&str> = range["periods"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["state"].as_str().unwrap())
            .collect();
        // The months around the backfill fired before `serve` first saw
        // the job (a monthly job's latest fire is older than catch_up):
        // nobody owes them.
        assert_eq!(
            states,
            [
                "before first seen",
                "succeeded",
                "succeeded",
                "succeeded",
                "before first seen"
            ]
        );
        let (_, _, _, later) =
            answer(server.get(READER, "/v1/jobs/billing/periods?from=2099-01&to=2099-01"));
        assert_eq!(later["periods"][0]["state"], "not due", "{later}");
        assert!(later["periods"][0]["fire"].is_string(), "{later}");
        let (status, _, _, bad) = answer(server.get(READER, "/v1/jobs/billing/periods/2026-7"));
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(bad["field"], "label", "{bad}");
        let (status, _, _, paused) =
            answer(server.post(ONCALL, "/v1/jobs/billing/pause", "pause-1", &json!({})));
        assert_eq!(status, StatusCode::OK, "{paused}");
        let (_, _, _, jobs) = answer(server.get(READER, "/v1/jobs"));
        assert_eq!(jobs["jobs"][0]["paused"], true, "{jobs}");
        let (status, _, _, _) =
            answer(server.post(ONCALL, "/v1/jobs/billing/resume", "resume-1", &json!({})));
        assert_eq!(status, StatusCode::OK);
        let (_, _, _, jobs) = answer(server.get(READER, "/v1/jobs"));
        assert_eq!(jobs["jobs"][0]["paused"], false, "{jobs}");
        let (status, _, _, released) = answer(server.post(
            ONCALL,
            "/v1/jobs/billing/periods/2026-02/release",
            "release-1",
            &json!({}),
        ));
        // Nothing runs there: 409, as `scheduler release` exits 2 (issue
        // 26, found by the new-user review: it answered 200).
        assert_eq!(status, StatusCode::CONFLICT, "{released}");
        assert_eq!(released["released"], false, "{released}");
        assert!(released["error"].is_string(), "{released}");
        assert_eq!(server.stop(), 0);
    }
}

#[test]
fn no_secret_reaches_a_response_a_log_line_or_a_row() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&with_api(&monthly("billing", "0")));
    let server = Server::start(&ws, &db.url);
    let key = "idempotency-key-value-42";
    let mut seen = String::new();
    for token in [CI, ONCALL, READER, "wrong-secret-0123456789"] {
        for path in [
            "/v1/jobs",
            "/v1/jobs/billing/periods/2026-07",
            "/v1/nowhere",
        ] {
            seen.push_str(&server.get(token, path).text().unwrap());
        }
        seen.push_str(
            &server
                .post(
                    token,
                    "/v1/jobs/billing/runs?wait=30",
                    key,
                    &json!({"period": "2026-07"}),
                )
                .text()
                .unwrap(),
        );
    }
    assert_eq!(server.stop(), 0);
    let log = std::fs::read_to_string(ws.path().join("serve.log")).unwrap();
    let db_file = db.url.trim_start_matches("sqlite://");
    let mut rows = Vec::new();
    for file in [db_file.to_owned(), format!("{db_file}-wal")] {
        rows.extend(std::fs::read(&file).unwrap_or_default());
    }
    let rows = String::from_utf8_lossy(&rows);
    for secret in [CI, ONCALL, READER, key] {
        assert!(!seen.contains(secret), "{secret} in a response");
        assert!(!log.contains(secret), "{secret} in the log");
        assert!(!rows.contains(secret), "{secret} in the database");
    }
}

#[test]
fn fifty_idle_connections_leave_healthz_answering_and_a_job_firing() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&with_api(
        "\n[[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\nshell = \"echo $SCHEDULER_PERIOD_KEY >> runs.txt\"\n",
    ));
    let server = Server::start(&ws, &db.url);
    let addr = server.base.trim_start_matches("http://").to_owned();
    let idle: Vec<TcpStream> = (0..50)
        .filter_map(|_| TcpStream::connect(&addr).ok())
        .collect();
    assert_eq!(idle.len(), 50);
    let before = runs(&ws).len();
    eventually("fires while idle connections are held", BOUND, || {
        runs(&ws).len() >= before + 3
    });
    let health = client().get(server.url("/healthz")).send().unwrap();
    assert_eq!(health.status(), StatusCode::OK);
    let (status, _, _, _) = answer(server.get(READER, "/v1/jobs"));
    assert_eq!(status, StatusCode::OK);
    drop(idle);
    assert_eq!(server.stop(), 0);
}

#[test]
fn api_mistakes_in_jobs_toml_are_configuration_errors() {
    for (api, says) in [
        (
            "[api]\ntokens = [{ name = \"ci\", secret = \"short\", allow = [\"read\"] }]\n",
            "at least 16",
        ),
        (
            "[api]\ntokens = [{ name = \"ci\", secret = \"0123456789abcdef0\", allow = [\"trigegr\"] }]\n",
            "did you mean `trigger`?",
        ),
        (
            "[api]\ntokens = [\n{ name = \"ci\", secret = \"0123456789abcdef0\", allow = [\"read\"] },\n{ name = \"ci\", secret = \"0123456789abcdef1\", allow = [\"read\"] },\n]\n",
            "used twice",
        ),
        (
            "[api]\ntokens = [{ name = \"ci\", secret = \"${NO_SUCH_TOKEN_VAR}\", allow = [\"read\"] }]\n",
            "NO_SUCH_TOKEN_VAR",
        ),
        ("[api]\nkey_ttl = \"1s\"\n", "key_ttl"),
        (
            "[api]\ntokens = [{ name = \"ci\", secret = \"                    \", allow = [\"read\"] }]\n",
            "blanks",
        ),
        ("[api]\ntokenz = []\n", "tokenz"),
    ] {
        let ws = Workspace::new(&format!("{api}{}", monthly("billing", "0")));
        let out = ws.run(&["check", "--strict"]);
        assert_eq!(out.code(), 2, "{api}: {}", out.stderr());
        assert!(out.stderr().contains(says), "{api}: {}", out.stderr());
        assert!(
            out.stderr().contains("jobs.toml:"),
            "{api}: no place in {}",
            out.stderr()
        );
    }
}

/// The hash the server keys an Idempotency-Key or a request by.
fn hash(parts: &[&str]) -> String {
    use sha2::Digest;
    let mut hash = sha2::Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_be_bytes());
        hash.update(part.as_bytes());
    }
    hex::encode(hash.finalize())
}

#[test]
fn a_key_left_in_progress_before_its_run_started_is_taken_over_only_after_its_bound() {
    for db in databases() {
        let ws = Workspace::new(&with_api(&monthly("billing", "0")));
        let server = Server::start(&ws, &db.url);
        let body = json!({"period": "2026-07"});
        let request = hash(&["POST", "/v1/jobs/billing/runs", &body.to_string()]);
        let now_ms = chrono::Utc::now().timestamp_millis();
        // What a replica killed between claiming the key and starting its
        // run leaves: one record still bound, one past its bound.
        for (key, bound_at) in [("fresh", now_ms + 600_000), ("stale", now_ms - 1_000)] {
            let scope = hash(&["ci", "POST /v1/jobs/{job}/runs", key]);
            count(
                &db.url,
                &format!(
                    "INSERT INTO scheduler_idempotency (scope, request, state, bound_at, expires_at)
                     VALUES ('{scope}', '{request}', 'running', {bound_at}, {})",
                    now_ms + 86_400_000
                ),
            );
        }
        let (status, _, _, _) =
            answer(server.post(CI, "/v1/jobs/billing/runs?wait=30", "fresh", &body));
        assert_eq!(status, StatusCode::CONFLICT, "{}", db.url);
        let (status, replayed, _, answered) =
            answer(server.post(CI, "/v1/jobs/billing/runs?wait=30", "stale", &body));
        assert_eq!(status, StatusCode::OK, "{answered}");
        assert!(!replayed);
        assert_eq!(runs(&ws), ["billing:2026-07"]);
        assert_eq!(server.stop(), 0);
    }
}

#[test]
fn sigterm_releases_a_run_asked_for_over_the_api_and_another_replica_takes_it() {
    for db in databases() {
        let ws = Workspace::new(&with_api(&monthly("billing", "60")));
        let first = Server::start(&ws, &db.url);
        let (status, _, location, body) = answer(first.post(
            CI,
            "/v1/jobs/billing/runs",
            "long",
            &json!({"period": "2026-07"}),
        ));
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        assert_eq!(body["periods"][0]["status"], "running", "{body}");
        let started = std::time::Instant::now();
        assert_eq!(first.stop(), 0);
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "the run was not stopped after the grace"
        );
        let state = count(
            &db.url,
            "SELECT count(*) FROM scheduler_claims WHERE period_key = 'billing:2026-07' AND state = 'released'",
        );
        assert_eq!(state, 1, "{}: the claim was not released", db.url);
        let second = Server::start(&ws, &db.url);
        let (_, _, _, run) = answer(second.get(READER, &location.expect("Location")));
        assert_eq!(run["state"], "done", "{run}");
        assert_eq!(run["outcome"], "interrupted", "{run}");
        assert_eq!(run["periods"][0]["status"], "released", "{run}");
        let (status, replayed, _, _) = answer(second.post(
            CI,
            "/v1/jobs/billing/runs",
            "long-again",
            &json!({"period": "2026-07"}),
        ));
        assert!(status.is_success() && !replayed);
        let (_, _, _, period) = answer(second.get(READER, "/v1/jobs/billing/periods/2026-07"));
        assert_eq!(period["state"], "running", "{period}");
        assert_eq!(
            period["attempts"].as_array().map(Vec::len),
            Some(2),
            "{period}"
        );
        second.kill();
    }
}

/// A run that ended within the shutdown grace was answered `interrupted`,
/// with "POST again with a new Idempotency-Key": doing so ran a forced
/// period a second time.
#[test]
fn a_run_that_ends_within_the_shutdown_grace_is_answered_as_it_ended() {
    for db in databases() {
        let ws = Workspace::new(&with_api(&monthly("billing", "1")));
        let first = Server::start(&ws, &db.url);
        let (status, _, location, body) = answer(first.post(
            CI,
            "/v1/jobs/billing/runs",
            "graceful",
            &json!({"period": "2026-07", "force": true}),
        ));
        assert_eq!(status, StatusCode::ACCEPTED, "{body}");
        assert_eq!(body["periods"][0]["status"], "running", "{body}");
        assert_eq!(first.stop(), 0);
        assert_eq!(runs(&ws), ["billing:2026-07"], "{}", db.url);
        let second = Server::start(&ws, &db.url);
        let (_, _, _, run) = answer(second.get(READER, &location.expect("Location")));
        assert_eq!(run["state"], "done", "{run}");
        assert_eq!(run["outcome"], "succeeded", "{run}");
        assert_eq!(run["periods"][0]["status"], "succeeded", "{run}");
        assert!(run.get("error").is_none(), "{run}");
        second.kill();
    }
}

/// A caller waiting (`?wait=`) when its replica shut down got no answer,
/// and its key answered 409 "still going" until the key's own wait ran out.
#[test]
fn a_caller_waiting_at_shutdown_is_answered_with_the_run_so_far_and_its_key_replays_it() {
    for db in databases() {
        let ws = Workspace::new(&with_api(&monthly("billing", "30")));
        let mut first = Server::start(&ws, &db.url);
        let body = json!({"period": "2026-07"});
        let pid = first.child.as_ref().expect("running").id();
        let (status, _, location, run) = std::thread::scope(|s| {
            let waiting = s.spawn(|| {
                answer(first.post(CI, "/v1/jobs/billing/runs?wait=60", "at-shutdown", &body))
            });
            eventually("the caller waiting on its run", BOUND, || {
                count(
                    &db.url,
                    "SELECT count(*) FROM scheduler_claims WHERE period_key = 'billing:2026-07' AND state = 'running'",
                ) == 1
            });
            nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            )
            .expect("SIGTERM");
            waiting.join().expect("an answer")
        });
        assert_eq!(status, StatusCode::ACCEPTED, "{run}");
        assert_eq!(run["state"], "running", "{run}");
        let location = location.expect("Location");
        let exited = first.child.take().expect("running").wait().expect("exit");
        assert!(exited.success(), "{exited:?}");
        // The shutdown's log says every job ended only once the API's runs
        // have (issue 26, item 15: "all jobs ended" came first).
        let log = std::fs::read_to_string(ws.path().join("serve.log")).unwrap();
        let api_wait = log.find("waiting for the runs asked for over the API");
        let ended = log.find("all jobs ended");
        assert!(
            matches!((api_wait, ended), (Some(a), Some(e)) if a < e),
            "{log}"
        );
        let second = Server::start(&ws, &db.url);
        let (status, replayed, again, _) =
            answer(second.post(CI, "/v1/jobs/billing/runs?wait=60", "at-shutdown", &body));
        // The run, as it stands now: not a 409 "still going".
        assert!(status.is_success(), "{status}");
        assert!(replayed, "not replayed");
        assert_eq!(again.as_deref(), Some(location.as_str()));
        second.kill();
    }
}

#[test]
fn metrics_have_help_and_type_and_keys_past_their_ttl_are_pruned() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&with_api(&format!(
        "{}\n[[job]]\nname = \"broken\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\nshell = \"exit 3\"\nretry = {{ attempts = 1 }}\n",
        monthly("billing", "0")
    )));
    let server = Server::start(&ws, &db.url);
    let (status, _, _, _) = answer(server.post(
        CI,
        "/v1/jobs/billing/runs?wait=30",
        "kept",
        &json!({"period": "2026-07"}),
    ));
    assert_eq!(status, StatusCode::OK);
    let (status, _, _, failed) = answer(server.post(
        CI,
        "/v1/jobs/broken/runs?wait=30",
        "fails",
        &json!({"period": "2026-07"}),
    ));
    assert_eq!(failed["outcome"], "failed", "{failed}");
    assert_eq!(status, StatusCode::OK);
    let metrics = client()
        .get(server.url("/metrics"))
        .send()
        .unwrap()
        .text()
        .unwrap();
    for line in [
        "# HELP scheduler_claims_total",
        "# TYPE scheduler_claims_total counter",
        "# HELP scheduler_runs_total",
        "# HELP scheduler_run_duration_seconds",
        "# HELP scheduler_database_errors_total",
        "scheduler_database_errors_total 0",
        "# HELP scheduler_next_fire_timestamp_seconds",
        "scheduler_next_fire_timestamp_seconds{job=\"billing\"}",
    ] {
        assert!(metrics.contains(line), "no `{line}` in {metrics}");
    }
    // The counters say what ran: one manual claim won, one success.
    for line in [
        "scheduler_runs_total{job=\"billing\",outcome=\"succeeded\"} 1",
        "scheduler_overdue_periods{job=\"billing\"} 0",
        "scheduler_retries_exhausted_periods{job=\"billing\"} 0",
        "scheduler_runs_total{job=\"broken\",outcome=\"failed\"} 1",
        "scheduler_claims_total{job=\"billing\",result=\"won\"} 1",
    ] {
        assert!(metrics.contains(line), "no `{line}` in {metrics}");
    }
    assert_eq!(server.stop(), 0);
    count(&db.url, "UPDATE scheduler_idempotency SET expires_at = 0");
    count(&db.url, "UPDATE scheduler_api_runs SET expires_at = 0");
    let out = ws
        .command(&["--database-url", &db.url, "prune"])
        .env("CI_TOKEN", CI)
        .env("ONCALL_TOKEN", ONCALL)
        .env("READER_TOKEN", READER)
        .output()
        .unwrap();
    assert_eq!(out.code(), 0, "{}", out.stderr());
    assert!(out.stdout().contains("api: pruned 4"), "{}", out.stdout());
    assert_eq!(
        count(&db.url, "SELECT count(*) FROM scheduler_idempotency"),
        0
    );
}

/// Asks with `key` until the job's slot frees and the run is no longer
/// answered 429: then it runs and succeeds, under the same key, nothing of
/// the busy answers stored.
fn ran_once_a_slot_frees(server: &Server, key: &str, body: &Value) {
    let mut last = None;
    eventually("the slot frees and the same key runs", BOUND, || {
        let (status, replayed, _, body) =
            answer(server.post(CI, "/v1/jobs/billing/runs?wait=30", key, body));
        last = Some((status, replayed, body));
        status != StatusCode::TOO_MANY_REQUESTS
    });
    let (status, replayed, body) = last.unwrap();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert!(!replayed, "the busy answer was stored");
    // A range may still find its first period held by the run before it,
    // if that run ended only after the range read the period's row: the
    // period is that run's (held), the others this one's.
    let held_first = body["periods"][0]["held"] == true
        && body["periods"]
            .as_array()
            .is_some_and(|p| p[1..].iter().all(|p| p["status"] == "succeeded"));
    assert!(
        body["outcome"] == "succeeded" || (body["outcome"] == "held" && held_first),
        "{body}"
    );
}

/// A range that ran nothing here (its first period held by another run,
/// the rest without a free slot) was answered 200 `failed` and stored: the
/// same key replayed the failure and its periods were never run.
#[test]
fn a_range_that_runs_nothing_for_want_of_a_slot_is_429_and_its_key_stays_free() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&with_api(&monthly("billing", "3")));
    let server = Server::start(&ws, &db.url);
    let (status, _, _, body) = answer(server.post(
        CI,
        "/v1/jobs/billing/runs",
        "first",
        &json!({"period": "2026-06"}),
    ));
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let range = json!({"from": "2026-06", "to": "2026-08"});
    let (status, _, _, body) =
        answer(server.post(CI, "/v1/jobs/billing/runs?wait=30", "range", &range));
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    // Without `wait` too: the first period's "skipped" is no start.
    let (status, _, _, body) =
        answer(server.post(CI, "/v1/jobs/billing/runs", "range-now", &range));
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
    ran_once_a_slot_frees(&server, "range", &range);
    assert_eq!(
        runs(&ws),
        ["billing:2026-06", "billing:2026-07", "billing:2026-08"]
    );
    assert_eq!(server.stop(), 0);
}

#[test]
fn a_run_that_finds_every_slot_taken_is_429_and_its_key_stays_free() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&with_api(&monthly("billing", "3")));
    let server = Server::start(&ws, &db.url);
    let (status, _, _, body) = answer(server.post(
        CI,
        "/v1/jobs/billing/runs",
        "first",
        &json!({"period": "2026-06"}),
    ));
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let busy = server.post(
        CI,
        "/v1/jobs/billing/runs",
        "later",
        &json!({"period": "2026-07"}),
    );
    assert_eq!(busy.status(), StatusCode::TOO_MANY_REQUESTS);
    assert!(busy.headers().get("retry-after").is_some());
    ran_once_a_slot_frees(&server, "later", &json!({"period": "2026-07"}));
    assert_eq!(runs(&ws), ["billing:2026-06", "billing:2026-07"]);
    assert_eq!(server.stop(), 0);
}

/// Issue 26, item 4: a key whose TTL ran out while its run still went on
/// was claimed anew, and its replay said `succeeded` for a run that failed.
/// Its TTL is made to run out here by hand: the key still answers 409, and
/// once the run has ended it is kept a whole `key_ttl` from that end.
#[test]
fn a_key_never_expires_while_its_run_goes_on_and_is_kept_key_ttl_after_its_end() {
    for db in databases() {
        let ws = Workspace::new(&with_api(&monthly("billing", "4")));
        let server = Server::start(&ws, &db.url);
        let body = json!({"period": "2026-07"});
        let (status, _, location, _) =
            answer(server.post(CI, "/v1/jobs/billing/runs", "long-key", &body));
        assert_eq!(status, StatusCode::ACCEPTED);
        count(&db.url, "UPDATE scheduler_idempotency SET expires_at = 0");
        let (status, _, again, body_again) =
            answer(server.post(CI, "/v1/jobs/billing/runs", "long-key", &body));
        assert_eq!(status, StatusCode::CONFLICT, "{}: {body_again}", db.url);
        assert_eq!(again, location);
        let location = location.expect("Location");
        eventually("the run's end", BOUND, || {
            answer(server.get(READER, &location)).3["state"] == "done"
        });
        let day_from_now = chrono::Utc::now().timestamp_millis() + 23 * 3600 * 1000;
        assert_eq!(
            count(
                &db.url,
                &format!(
                    "SELECT count(*) FROM scheduler_idempotency WHERE expires_at > {day_from_now}"
                )
            ),
            1,
            "{}",
            db.url
        );
        assert_eq!(runs(&ws), ["billing:2026-07"]);
    }
}

/// Issue 26, item 4: a period skipped because it runs elsewhere was
/// reported `succeeded`. How it ends is not known to this request: `held`.
#[test]
fn a_period_running_elsewhere_is_answered_held_never_succeeded() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&with_api(&monthly("billing", "30")));
    let server = Server::start(&ws, &db.url);
    let mut elsewhere = ws
        .command(&[
            "--database-url",
            &db.url,
            "run",
            "billing",
            "--period",
            "2026-07",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually("the run elsewhere", BOUND, || {
        count(
            &db.url,
            "SELECT count(*) FROM scheduler_claims WHERE state = 'running'",
        ) == 1
    });
    let (status, _, _, body) = answer(server.post(
        CI,
        "/v1/jobs/billing/runs?wait=10",
        "held-key",
        &json!({"period": "2026-07"}),
    ));
    let _ = elsewhere.kill();
    let _ = elsewhere.wait();
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["outcome"], "held", "{body}");
    assert_eq!(body["periods"][0]["held"], true, "{body}");
}

/// Issue 26, item 5: a database failure during a run was answered 200
/// `failed` and stored, so the retry replayed it. Holding the job's claim
/// lock past the lock timeout makes the claim fail on the database: 503,
/// nothing stored, and the same key executes once the lock is gone.
#[test]
fn a_run_the_database_failed_before_any_claim_is_a_503_and_its_key_runs_again() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let ws = Workspace::new(&with_api(&monthly("billing", "0")));
    let server = Server::start(&ws, &db.url);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut holder = runtime.block_on(async {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query("SELECT pg_advisory_lock(hashtextextended('scheduler_claims:billing', 0))")
            .execute(&mut c)
            .await
            .unwrap();
        c
    });
    let body = json!({"period": "2026-07"});
    let (status, _, _, failed) =
        answer(server.post(CI, "/v1/jobs/billing/runs?wait=30", "db-key", &body));
    runtime.block_on(async {
        sqlx::query("SELECT pg_advisory_unlock_all()")
            .execute(&mut holder)
            .await
            .unwrap();
    });
    assert!(status.is_server_error(), "{status}: {failed}");
    assert!(
        failed["error"]
            .as_str()
            .is_some_and(|e| e.contains("database")),
        "{failed}"
    );
    let (status, replayed, _, ran) =
        answer(server.post(CI, "/v1/jobs/billing/runs?wait=30", "db-key", &body));
    assert_eq!(status, StatusCode::OK, "{ran}");
    assert!(!replayed, "{ran}");
    assert_eq!(ran["outcome"], "succeeded", "{ran}");
    assert_eq!(runs(&ws), ["billing:2026-07"]);
}

/// Issue 26, item 6: a run's end was tried ten times a second apart, so an
/// outage of ~10 s left it `abandoned` for good though its replica lived.
#[test]
fn a_live_replica_records_its_runs_end_once_the_database_is_back() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let (proxy, url) = crate::support::proxied(&db);
    // The job outlives the cut's start: its runner, cut off, fences it, and
    // the run ends while the database is still away.
    let ws = Workspace::new(&with_api(&monthly("billing", "10")));
    let server = Server::start(&ws, &url);
    let (status, _, location, _) = answer(server.post(
        CI,
        "/v1/jobs/billing/runs",
        "outage-key",
        &json!({"period": "2026-07"}),
    ));
    assert_eq!(status, StatusCode::ACCEPTED);
    proxy.cut();
    // Scenario time: an outage longer than ten tries a second apart.
    std::thread::sleep(Duration::from_secs(20));
    proxy.restore();
    let location = location.expect("Location");
    let mut last = Value::Null;
    eventually("the run's end recorded", BOUND, || {
        last = answer(server.get(READER, &location)).3;
        last["state"] == "done"
    });
    assert_ne!(last["outcome"], "abandoned", "{last}");
}

/// Issue 26, item 7: a 400's `field` named the value; some 400s were plain
/// text; a key given twice in a body was taken as its last value.
#[test]
fn every_bad_request_is_json_naming_the_field() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&with_api(&monthly("billing", "0")));
    let server = Server::start(&ws, &db.url);
    let (status, _, _, body) = answer(server.post(
        CI,
        "/v1/jobs/billing/runs",
        "typed",
        &json!({"period": 202611}),
    ));
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["field"], "period", "{body}");
    let twice = client()
        .post(server.url("/v1/jobs/billing/runs"))
        .bearer_auth(CI)
        .header("Idempotency-Key", "twice")
        .header("content-type", "application/json")
        .body(r#"{"period": "2026-07", "period": "2026-08"}"#)
        .send()
        .unwrap();
    let (status, _, _, body) = answer(twice);
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    assert_eq!(body["field"], "period", "{body}");
    assert!(
        body["error"].as_str().is_some_and(|e| e.contains("twice")),
        "{body}"
    );
    for path in [
        "/v1/jobs/billing/runs?wait=1&wait=2",
        "/v1/jobs/%ff%fe/runs",
    ] {
        let response = client()
            .post(server.url(path))
            .bearer_auth(CI)
            .header("Idempotency-Key", "odd")
            .json(&json!({"period": "2026-07"}))
            .send()
            .unwrap();
        let status = response.status();
        let text = response.text().unwrap();
        assert!(status.is_client_error(), "{path}: {status} {text}");
        let parsed: Value = serde_json::from_str(&text)
            .unwrap_or_else(|e| panic!("{path}: not JSON ({e}): {text}"));
        assert!(parsed["error"].is_string(), "{path}: {text}");
    }
    assert!(runs(&ws).is_empty());
}

/// Issue 26, item 7: a retry answered 409 while the first request was still
/// setting its run up had no `Location`. The run's record is held up here
/// by a lock on its table.
#[test]
fn a_409_while_the_run_is_set_up_already_carries_its_location() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let ws = Workspace::new(&with_api(&monthly("billing", "0")));
    let server = Server::start(&ws, &db.url);
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let mut locker = runtime.block_on(async {
        use sqlx::Connection;
        let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
        sqlx::query("BEGIN").execute(&mut c).await.unwrap();
        sqlx::query("LOCK TABLE scheduler_api_runs IN EXCLUSIVE MODE")
            .execute(&mut c)
            .await
            .unwrap();
        c
    });
    let body = json!({"period": "2026-07"});
    let (first, retry) = std::thread::scope(|s| {
        let first = s.spawn(|| answer(server.post(CI, "/v1/jobs/billing/runs", "early", &body)));
        eventually("the first request held up by the lock", BOUND, || {
            count(
                &db.url,
                "SELECT count(*) FROM pg_stat_activity \
                 WHERE datname = current_database() AND wait_event_type = 'Lock'",
            ) > 0
        });
        let retry = answer(server.post(CI, "/v1/jobs/billing/runs", "early", &body));
        runtime.block_on(async {
            sqlx::query("COMMIT").execute(&mut locker).await.unwrap();
        });
        (first.join().unwrap(), retry)
    });
    assert_eq!(retry.0, StatusCode::CONFLICT, "{}", retry.3);
    assert!(retry.2.is_some(), "no Location: {}", retry.3);
    assert_eq!(first.0, StatusCode::ACCEPTED, "{}", first.3);
    assert_eq!(retry.2, first.2);
}

/// A long range that finds its job's one slot taken answers 202 before it
/// has gone through its periods; once it has, having run none, it frees
/// its key as a 429 does (found by the new-user review: it was stored and
/// replayed as `failed`).
#[test]
fn a_long_range_that_found_no_slot_frees_its_key_and_says_busy() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&with_api(
        "\n[[job]]\nname = \"slow\"\nschedule = \"0 0 * * *\"\nperiod = \"day\"\nshell = \"sleep 60\"\n",
    ));
    let server = Server::start(&ws, &db.url);
    let mut holder = ws
        .command(&[
            "--database-url",
            &db.url,
            "run",
            "slow",
            "--period",
            "2026-11-08",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually("the slot taken", BOUND, || {
        count(
            &db.url,
            "SELECT count(*) FROM scheduler_claims WHERE state = 'running'",
        ) == 1
    });
    let body = json!({"from": "2001-01-01", "to": "2026-11-01"});
    let (status, _, location, first) =
        answer(server.post(CI, "/v1/jobs/slow/runs", "long-range", &body));
    assert!(
        status == StatusCode::ACCEPTED || status == StatusCode::TOO_MANY_REQUESTS,
        "{status}: {}",
        first["outcome"]
    );
    if let Some(location) = location {
        let mut last = Value::Null;
        eventually("the range's end", BOUND, || {
            last = answer(server.get(READER, &location)).3;
            last["state"] == "done"
        });
        assert_eq!(last["outcome"], "busy", "{}", last["error"]);
    }
    let (status, replayed, _, again) =
        answer(server.post(CI, "/v1/jobs/slow/runs", "long-range", &body));
    let _ = holder.kill();
    let _ = holder.wait();
    assert!(
        !replayed,
        "{status}: the key was kept: {}",
        again["outcome"]
    );
}
