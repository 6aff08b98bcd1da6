//! A trace of every attempt over OTLP/HTTP (issue 43): a test collector
//! decodes what the scheduler sends with the OpenTelemetry protobuf
//! definitions; the work carries the attempt's trace context.

use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;

use crate::support::{Said, TestDb, Workspace, count, eventually, wait};

/// What the test collector was sent: spans with their service's name,
/// and the `traceparent` headers of `http` actions.
#[derive(Default)]
struct Received {
    spans: Vec<(String, Span)>,
    traceparents: Vec<String>,
}

/// An OTLP/HTTP receiver and an `http` action's target, on one port.
struct Collector {
    port: u16,
    received: Arc<Mutex<Received>>,
    _runtime: tokio::runtime::Runtime,
}

impl Collector {
    fn start() -> Collector {
        use axum::routing::post;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let port = listener.local_addr().unwrap().port();
        let received = Arc::new(Mutex::new(Received::default()));
        let (spans, hooks) = (received.clone(), received.clone());
        let app = axum::Router::new()
            .route(
                "/v1/traces",
                post(move |body: axum::body::Bytes| async move {
                    let request = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                    let mut received = spans.lock().unwrap();
                    for resource in request.resource_spans {
                        let service = resource
                            .resource
                            .iter()
                            .flat_map(|r| &r.attributes)
                            .find(|kv| kv.key == "service.name")
                            .and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
                            .unwrap_or_default();
                        for scope in resource.scope_spans {
                            for span in scope.spans {
                                received.spans.push((service.clone(), span));
                            }
                        }
                    }
                    ([("content-type", "application/x-protobuf")], Vec::new())
                }),
            )
            .route(
                "/hook",
                post(move |headers: axum::http::HeaderMap| async move {
                    let traceparent = headers
                        .get("traceparent")
                        .map(|v| v.to_str().unwrap().to_owned())
                        .unwrap_or_default();
                    hooks.lock().unwrap().traceparents.push(traceparent);
                    "ok"
                }),
            );
        runtime.spawn(async move { axum::serve(listener, app).await });
        Collector {
            port,
            received,
            _runtime: runtime,
        }
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The spans of the trace of `job`'s attempt, once its attempt span
    /// and `children` more came: that span first.
    fn trace_of(&self, job: &str, children: usize) -> Vec<(String, Span)> {
        let name = format!("attempt {job}");
        let mut trace = Vec::new();
        eventually(
            &format!("the trace of {job}"),
            Duration::from_secs(60),
            || {
                let received = self.received.lock().unwrap();
                let Some((_, attempt)) = received.spans.iter().find(|(_, s)| s.name == name) else {
                    return false;
                };
                trace = received
                    .spans
                    .iter()
                    .filter(|(_, s)| s.trace_id == attempt.trace_id)
                    .cloned()
                    .collect();
                trace.sort_by_key(|(_, s)| s.name != name);
                trace.len() > children
            },
        );
        trace
    }
}

fn text(value: &Value) -> Option<String> {
    match value {
        Value::StringValue(s) => Some(s.clone()),
        Value::IntValue(n) => Some(n.to_string()),
        _ => None,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The value of attribute `key` of `span`, as text.
fn attribute(span: &Span, key: &str) -> Option<String> {
    span.attributes
        .iter()
        .find(|kv| kv.key == key)
        .and_then(|kv| text(kv.value.as_ref()?.value.as_ref()?))
}

fn jobs(collector: &Collector, postgres: bool) -> String {
    // On PostgreSQL the statement keeps the text it was sent as.
    let statement = match postgres {
        true => "INSERT INTO traced SELECT current_query()",
        false => "INSERT INTO traced VALUES ('ran')",
    };
    format!(
        "[[job]]\nname = \"printer\"\nschedule = \"0 4 * * *\"\nperiod = \"day\"\n\
         shell = 'echo \"tp=$TRACEPARENT\"'\n\n\
         [[job]]\nname = \"web\"\nschedule = \"0 4 * * *\"\nperiod = \"day\"\n\
         http = {{ url = \"{}/hook\", method = \"POST\" }}\n\n\
         [[job]]\nname = \"sq\"\nschedule = \"0 4 * * *\"\nperiod = \"day\"\n\
         sql = {{ statement = \"{statement}\" }}\n",
        collector.endpoint()
    )
}

fn run(ws: &Workspace, db: &TestDb, env: &[(&str, &str)], args: &[&str]) -> std::process::Output {
    let mut command = ws.command(args);
    command.env("DATABASE_URL", &db.url);
    for (k, v) in env {
        command.env(k, v);
    }
    command.output().unwrap()
}

#[test]
fn each_attempt_is_one_trace_with_its_claim_action_and_record_and_the_work_carries_it() {
    let collector = Collector::start();
    for db in crate::support::databases() {
        let postgres = db.url.starts_with("postgres");
        count(&db.url, "CREATE TABLE traced (q TEXT)");
        let ws = Workspace::new(&jobs(&collector, postgres));
        let endpoint = collector.endpoint();
        let env = [
            ("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint.as_str()),
            ("OTEL_SERVICE_NAME", "billing-test"),
        ];
        collector.received.lock().unwrap().spans.clear();
        for job in ["printer", "web", "sq"] {
            let ran = run(&ws, &db, &env, &["run", job, "--period", "2026-12-01"]);
            assert_eq!(ran.code(), 0, "{job}: {}", ran.stderr());
        }
        let mut action_parents = Vec::new();
        for job in ["printer", "web", "sq"] {
            // An `sql` period's outcome commits with its statement: it has
            // no record span of its own.
            let trace = collector.trace_of(job, if job == "sq" { 2 } else { 3 });
            let (service, attempt) = &trace[0];
            assert_eq!(service, "billing-test");
            let key = format!("{job}:2026-12-01");
            assert_eq!(
                attribute(attempt, "scheduler.period_key").as_deref(),
                Some(key.as_str())
            );
            assert_eq!(attribute(attempt, "scheduler.job").as_deref(), Some(job));
            assert_eq!(
                attribute(attempt, "scheduler.attempt").as_deref(),
                Some("1")
            );
            assert!(attribute(attempt, "scheduler.trigger").is_some());
            assert_eq!(
                attribute(attempt, "scheduler.outcome").as_deref(),
                Some("succeeded")
            );
            let mut children: Vec<&str> = trace[1..]
                .iter()
                .inspect(|(_, s)| assert_eq!(s.parent_span_id, attempt.span_id, "{}", s.name))
                .map(|(_, s)| s.name.as_str())
                .collect();
            children.sort_unstable();
            let expected: &[&str] = match job {
                "sq" => &["action", "claim"],
                _ => &["action", "claim", "record"],
            };
            assert_eq!(children, expected, "{job}");
            let action = &trace.iter().find(|(_, s)| s.name == "action").unwrap().1;
            action_parents.push(format!(
                "00-{}-{}-01",
                hex(&action.trace_id),
                hex(&action.span_id)
            ));
            // `history` names the same trace.
            let history = run(&ws, &db, &[], &["history", job, "--json"]);
            assert_eq!(history.code(), 0, "{}", history.stderr());
            let said: serde_json::Value =
                serde_json::from_str(history.stdout().lines().next().unwrap()).unwrap();
            assert_eq!(said["trace_id"], hex(&attempt.trace_id));
        }
        let printer = &trace_exit(&collector);
        assert_eq!(printer.as_deref(), Some("0"), "the exit code on the span");
        let logs = run(
            &ws,
            &db,
            &[],
            &["logs", "printer", "--period", "2026-12-01"],
        );
        assert_eq!(logs.stdout().trim(), format!("tp={}", action_parents[0]));
        assert_eq!(
            collector.received.lock().unwrap().traceparents.last(),
            Some(&action_parents[1]),
            "the http action's header"
        );
        if postgres {
            let sent = pg_text(&db.url, "SELECT q FROM traced");
            assert!(
                sent.ends_with(&format!("/*traceparent='{}'*/", action_parents[2])),
                "{sent}"
            );
        }
    }
}

/// One text from a PostgreSQL database.
fn pg_text(url: &str, sql: &str) -> String {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        use sqlx::Connection;
        let mut conn = sqlx::PgConnection::connect(url).await.unwrap();
        let text: String = sqlx::query_scalar(sql).fetch_one(&mut conn).await.unwrap();
        let _ = conn.close().await;
        text
    })
}

/// The exit code on the printer's attempt span.
fn trace_exit(collector: &Collector) -> Option<String> {
    let received = collector.received.lock().unwrap();
    let (_, span) = received
        .spans
        .iter()
        .find(|(_, s)| s.name == "attempt printer")?;
    attribute(span, "process.exit.code")
}

#[test]
fn with_no_otel_variable_the_work_sees_no_trace_context() {
    let collector = Collector::start();
    let db = TestDb::sqlite();
    count(&db.url, "CREATE TABLE traced (q TEXT)");
    let ws = Workspace::new(&jobs(&collector, false));
    let ran = run(&ws, &db, &[], &["run", "printer", "--period", "2026-12-01"]);
    assert_eq!(ran.code(), 0, "{}", ran.stderr());
    let logs = run(
        &ws,
        &db,
        &[],
        &["logs", "printer", "--period", "2026-12-01"],
    );
    assert_eq!(logs.stdout().trim(), "tp=");
    let web = run(&ws, &db, &[], &["run", "web", "--period", "2026-12-01"]);
    assert_eq!(web.code(), 0, "{}", web.stderr());
    assert_eq!(
        collector.received.lock().unwrap().traceparents,
        [String::new()]
    );
}

#[test]
fn a_collector_that_refuses_or_never_answers_delays_no_run_and_no_shutdown() {
    let db = TestDb::sqlite();
    let collector = Collector::start();
    count(&db.url, "CREATE TABLE traced (q TEXT)");
    let ws = Workspace::new(&format!(
        "{}\n[[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\nshell = \"true\"\n",
        jobs(&collector, false)
    ));
    // Nothing listens on a port just freed; a listener that never reads
    // holds every request until the export's timeout.
    let freed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let refused = format!("http://{}", freed.local_addr().unwrap());
    drop(freed);
    let silent = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_at = format!("http://{}", silent.local_addr().unwrap());
    for endpoint in [&refused, &silent_at] {
        let started = Instant::now();
        let ran = run(
            &ws,
            &db,
            &[("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)],
            &["run", "printer", "--period", "2026-12-01", "--force"],
        );
        assert_eq!(ran.code(), 0, "{}", ran.stderr());
        // A bound that only catches a hang: the export's own timeout is 10 s.
        assert!(started.elapsed() < Duration::from_secs(9), "{endpoint}");
    }
    // A service exporting to nowhere fires and stops as ever, and says so
    // once.
    let log = std::fs::File::create(ws.path().join("serve.log")).unwrap();
    let serve = ws
        .command(&["--database-url", &db.url, "serve"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &refused)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    eventually("ticks", Duration::from_secs(60), || {
        count(
            &db.url,
            "SELECT count(*) FROM scheduler_claims WHERE job = 'tick' AND state = 'succeeded'",
        ) >= 4
    });
    let stopping = Instant::now();
    crate::serve::signal(&serve, nix::sys::signal::Signal::SIGTERM);
    let out = wait(serve, Duration::from_secs(60));
    assert_eq!(out.status.code(), Some(0));
    assert!(
        stopping.elapsed() < Duration::from_secs(9),
        "the shutdown waited"
    );
    let said = std::fs::read_to_string(ws.path().join("serve.log")).unwrap();
    assert_eq!(
        said.matches("traces not exported").count(),
        1,
        "said once a minute at most: {said}"
    );
}

#[test]
fn a_bad_otel_value_is_refused_at_start_naming_the_variable() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[[job]]\nname = \"printer\"\nschedule = \"0 4 * * *\"\nperiod = \"day\"\nshell = \"true\"\n",
    );
    for (var, value) in [
        ("OTEL_TRACES_SAMPLER", "sometimes"),
        ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ("OTEL_EXPORTER_OTLP_ENDPOINT", "collector:4318"),
    ] {
        for args in [
            &["run", "printer", "--period", "2026-12-01"][..],
            &["serve"],
        ] {
            let mut env = vec![(var, value)];
            if var != "OTEL_EXPORTER_OTLP_ENDPOINT" {
                env.push(("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318"));
            }
            let refused = run(&ws, &db, &env, args);
            assert_eq!(refused.code(), 2, "{var}={value} {args:?}");
            assert!(
                refused.stderr().contains(&format!("{var}: ")),
                "{}",
                refused.stderr()
            );
        }
    }
    // Nothing ran.
    let history = run(&ws, &db, &[], &["history", "printer"]);
    assert!(
        !history.stdout().contains("attempt"),
        "{}",
        history.stdout()
    );
}
