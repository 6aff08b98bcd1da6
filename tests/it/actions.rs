//! The `http` and `sql` actions, run as a user runs them.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::{Arc, Mutex};

use crate::support::{Said, TestDb, Workspace};

/// A local HTTP server that answers each request with the next status of
/// `statuses` and keeps the request heads.
fn http_server(statuses: Vec<u16>) -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for (status, stream) in statuses.into_iter().zip(listener.incoming()) {
            let mut stream = stream.unwrap();
            let mut reader = BufReader::new(stream.try_clone().unwrap());
            let mut head = String::new();
            let mut length = 0;
            loop {
                let mut line = String::new();
                reader.read_line(&mut line).unwrap();
                if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                    length = v.trim().parse().unwrap();
                }
                if line == "\r\n" {
                    break;
                }
                head.push_str(&line);
            }
            let mut body = vec![0; length];
            std::io::Read::read_exact(&mut reader, &mut body).unwrap();
            head.push_str(&String::from_utf8_lossy(&body));
            log.lock().unwrap().push(head);
            let reply = format!(
                "HTTP/1.1 {status} X\r\ncontent-length: 5\r\nconnection: close\r\n\r\nreply"
            );
            stream.write_all(reply.as_bytes()).unwrap();
        }
    });
    (port, seen)
}

fn http_job(port: u16) -> Workspace {
    Workspace::new(&format!(
        "[[job]]\nname = \"hook\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\nretry = {{ attempts = 3, backoff = \"1h\" }}\n\
         http = {{ url = \"http://127.0.0.1:{port}/bill/{{period}}\", headers = {{ X-Token = \"${{HOOK_TOKEN}}\" }}, body = '{{\"month\": \"{{period}}\"}}' }}\n"
    ))
}

#[test]
fn http_sends_the_period_key_as_idempotency_key_on_every_attempt_and_retries_5xx() {
    let (port, seen) = http_server(vec![503, 200]);
    let ws = http_job(port);
    let db = TestDb::sqlite();
    let run = |ws: &Workspace| {
        ws.command(&[
            "--database-url",
            &db.url,
            "run",
            "hook",
            "--period",
            "2026-07",
        ])
        .env("HOOK_TOKEN", "t0ken")
        .output()
        .unwrap()
    };
    let first = run(&ws);
    assert_eq!(first.code(), 1, "{}", first.stderr());
    assert!(
        first.stdout().contains("HTTP 503") && first.stdout().contains("retry in 1h"),
        "{}",
        first.stdout()
    );
    let second = run(&ws);
    assert_eq!(second.code(), 0, "{}", second.stderr());
    let heads = seen.lock().unwrap().clone();
    assert_eq!(heads.len(), 2);
    for head in &heads {
        assert!(head.starts_with("POST /bill/2026-07 HTTP/1.1"), "{head}");
        assert!(
            head.to_ascii_lowercase()
                .contains("idempotency-key: hook:2026-07"),
            "{head}"
        );
        assert!(
            head.to_ascii_lowercase().contains("x-token: t0ken"),
            "{head}"
        );
        assert!(head.ends_with("{\"month\": \"2026-07\"}"), "{head}");
    }
    assert!(
        !first.stderr().contains("t0ken") && !second.stderr().contains("t0ken"),
        "a secret reached the log"
    );
}

#[test]
fn http_4xx_is_a_permanent_failure() {
    let (port, _) = http_server(vec![404]);
    let ws = http_job(port);
    let db = TestDb::sqlite();
    let out = ws
        .command(&[
            "--database-url",
            &db.url,
            "run",
            "hook",
            "--period",
            "2026-07",
        ])
        .env("HOOK_TOKEN", "x")
        .output()
        .unwrap();
    assert_eq!(out.code(), 1);
    assert!(
        out.stdout().contains("HTTP 404 Not Found (not retried)")
            && out.stdout().contains("no retries left"),
        "{}",
        out.stdout()
    );
}

fn sql_job() -> Workspace {
    Workspace::new(
        "[[job]]\nname = \"rollup\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\n\
         sql = { statement = \"INSERT INTO rollups (period, starts) VALUES ($1, $2)\", params = [\"{period}\", \"{period_start}\"] }\n",
    )
}

/// Runs `sql` on the test database; returns the first column of its row,
/// or 0 for a statement without rows.
fn execute(db: &TestDb, sql: &str) -> i64 {
    use sqlx::Connection;
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        if db.url.starts_with("sqlite") {
            let mut c = sqlx::SqliteConnection::connect(&db.url).await.unwrap();
            sqlx::query_scalar(sql)
                .fetch_optional(&mut c)
                .await
                .unwrap()
                .unwrap_or(0)
        } else {
            let mut c = sqlx::PgConnection::connect(&db.url).await.unwrap();
            sqlx::query_scalar(sql)
                .fetch_optional(&mut c)
                .await
                .unwrap()
                .unwrap_or(0)
        }
    })
}

fn run_july(ws: &Workspace, db: &TestDb) -> std::process::Output {
    ws.run(&[
        "--database-url",
        &db.url,
        "run",
        "rollup",
        "--period",
        "2026-07",
    ])
}

#[test]
fn sql_commits_with_the_claim_exactly_once_on_both_backends() {
    for db in crate::support::databases() {
        let ws = sql_job();
        let migrate = ws.run(&["--database-url", &db.url, "migrate"]);
        assert_eq!(migrate.code(), 0, "{}", migrate.stderr());
        // Without the table the statement fails: nothing commits, the run fails.
        let failed = run_july(&ws, &db);
        assert_eq!(failed.code(), 1, "{}", failed.stdout());
        assert!(
            failed.stdout().contains("SQL failed"),
            "{}",
            failed.stdout()
        );
        execute(
            &db,
            "CREATE TABLE rollups (period TEXT PRIMARY KEY, starts TEXT NOT NULL)",
        );
        let ok = run_july(&ws, &db);
        assert_eq!(ok.code(), 0, "{}", ok.stdout());
        let again = run_july(&ws, &db);
        assert!(
            again.stdout().contains("already succeeded"),
            "{}",
            again.stdout()
        );
        assert_eq!(
            execute(&db, "SELECT count(*) FROM rollups"),
            1,
            "{}",
            db.url
        );
    }
}

#[test]
fn postgres_over_tls_with_sslmode_require_works() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let ws = sql_job();
    let url = format!("{}?sslmode=require", db.url);
    let out = ws.run(&["--database-url", &url, "migrate"]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
}

#[test]
fn a_jobs_timeout_bounds_its_http_request() {
    // A server that takes connections and never answers.
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        // Held, unanswered, until the client gives up on it.
        for stream in listener.incoming().take(1).flatten() {
            let _ = std::io::Read::read_to_end(&mut &stream, &mut Vec::new());
        }
    });
    let ws = Workspace::new(&format!(
        "[[job]]\nname = \"hook\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ntimeout = \"1s\"\n\
         http = {{ url = \"http://127.0.0.1:{port}/\", method = \"GET\" }}\n"
    ));
    let db = TestDb::sqlite();
    let started = std::time::Instant::now();
    let out = ws.run(&[
        "--database-url",
        &db.url,
        "run",
        "hook",
        "--period",
        "2026-07",
    ]);
    assert_eq!(out.code(), 1, "{}{}", out.stdout(), out.stderr());
    assert!(out.stdout().contains("timed out"), "{}", out.stdout());
    assert!(
        started.elapsed() < std::time::Duration::from_secs(20),
        "the request's own 30 s timeout ran instead: {:?}",
        started.elapsed()
    );
}

/// The docs' `CALL rollup($1, $2)` with `{period_start}` and
/// `{period_end}` runs as written against a procedure that takes
/// `timestamptz` (issue 26, item 13: the instants were bound as text).
#[test]
fn sql_instants_are_bound_as_timestamps_on_postgres() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    execute(
        &db,
        "CREATE TABLE rollups (starts timestamptz, ends timestamptz, label text)",
    );
    execute(
        &db,
        "CREATE PROCEDURE rollup(s timestamptz, e timestamptz, l text) LANGUAGE sql AS $$ INSERT INTO rollups VALUES (s, e, l) $$",
    );
    let ws = Workspace::new(
        "[[job]]\nname = \"rollup\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\n\
         sql = { statement = \"CALL rollup($1, $2, $3)\", params = [\"{period_start}\", \"{period_end}\", \"{period}\"] }\n",
    );
    let out = run_july(&ws, &db);
    assert_eq!(out.code(), 0, "{}", out.stdout());
    assert_eq!(
        execute(
            &db,
            "SELECT count(*) FROM rollups WHERE starts = '2026-07-01T00:00:00Z' AND ends = '2026-08-01T00:00:00Z' AND label = '2026-07'"
        ),
        1
    );
}

#[test]
fn a_variable_in_an_sql_statement_is_refused_pointing_to_params() {
    let ws = Workspace::new(
        "[[job]]\nname = \"rollup\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\n\
         sql = { statement = \"DELETE FROM t WHERE owner = '${OWNER}'\" }\n",
    );
    let out = ws.command(&["check"]).env("OWNER", "me").output().unwrap();
    assert_eq!(out.code(), 2, "{}", out.stderr());
    for part in [
        "jobs.toml:5:",
        "`${OWNER}` in an SQL statement is not expanded",
        "params = [\"${OWNER}\"]",
    ] {
        assert!(out.stderr().contains(part), "{part}: {}", out.stderr());
    }
}

/// A JSON body goes out as `application/json`, any other as plain text,
/// unless the job names a `Content-Type` itself (issue 26, item 15: no
/// type was sent).
#[test]
fn an_http_body_is_sent_with_its_content_type() {
    let (port, seen) = http_server(vec![200, 200, 200, 200]);
    let job = |name: &str, extra: &str| {
        format!(
            "[[job]]\nname = \"{name}\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\n\
             http = {{ url = \"http://127.0.0.1:{port}/{name}\"{extra} }}\n\n"
        )
    };
    let ws = Workspace::new(
        &(job("json", ", body = '{\"month\": \"{period}\"}'")
            + &job("text", ", body = \"month {period}\"")
            + &job(
                "own",
                ", body = '{\"a\": 1}', headers = { Content-Type = \"application/vnd.x+json\" }",
            )
            + &job("empty", "")),
    );
    let db = TestDb::sqlite();
    for name in ["json", "text", "own", "empty"] {
        let out = ws.run(&[
            "--database-url",
            &db.url,
            "run",
            name,
            "--period",
            "2026-07",
        ]);
        assert_eq!(out.code(), 0, "{}", out.stderr());
    }
    let heads: Vec<String> = seen
        .lock()
        .unwrap()
        .iter()
        .map(|h| h.to_ascii_lowercase())
        .collect();
    let types: Vec<usize> = [
        "application/json",
        "text/plain; charset=utf-8",
        "application/vnd.x+json",
    ]
    .iter()
    .enumerate()
    .map(|(i, t)| {
        assert!(
            heads[i].contains(&format!("content-type: {t}")),
            "{}",
            heads[i]
        );
        heads[i].matches("content-type:").count()
    })
    .collect();
    assert_eq!(types, [1, 1, 1]);
    // A POST without a body says so (found by the new-user review).
    assert!(heads[3].contains("content-length: 0"), "{}", heads[3]);
}
