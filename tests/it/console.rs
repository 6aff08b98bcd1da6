//! The web console in a real headless Chromium (Debian's `chromium` and
//! `chromium-driver`), driven over WebDriver, on a running `serve` with
//! real jobs; and its sessions, headers and shared reads with a plain HTTP
//! client. Without a browser the browser tests say so and skip, but under
//! `CI=true` a missing browser fails them.

use std::process::{Child, Stdio};
use std::time::Duration;

use chrono::{Days, Utc};
use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::api::{CI, Server, with_api};
use crate::browser::Browser;
use crate::support::{TestDb, Workspace, count, eventually};

const BOUND: Duration = Duration::from_secs(60);
const ONCALL: &str = "oncall-secret-0123456789abcdef";
const READER: &str = "reader-secret-0123456789abcdef";

/// `today - days` as a day label.
fn day(days: u64) -> String {
    (Utc::now().date_naive() - Days::new(days)).to_string()
}

/// A daily report whose output is hostile markup, which fails while
/// `fail-<day>` exists and runs long while `hold-<day>` does; and a job
/// that fires every second.
fn jobs() -> String {
    with_api(
        "\n[[job]]\nname = \"report\"\nschedule = \"0 2 * * *\"\nperiod = \"day\"\ncovers = \"previous\"\n\
         missed = \"skip\"\nconcurrency = 4\n\
         shell = \"echo '<script>document.title=\\\"pwned\\\"</script>'; echo '\\\"><img src=x onerror=document.title=\\\"pwned\\\">'; \
         if [ -e hold-$SCHEDULER_PERIOD ]; then sleep 300; fi; test ! -e fail-$SCHEDULER_PERIOD\"\n\
         \n[[job]]\nname = \"rollup\"\nschedule = \"0 3 1 * *\"\nperiod = \"month\"\ncovers = \"previous\"\n\
         after = [\"report\"]\ncommand = [\"true\"]\n\
         \n[[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\nperiod = \"fire\"\ncommand = [\"true\"]\n",
    )
}

/// The fixture: report periods 10 days ago succeeded, 9 failed, 8
/// running (a `run` in the background), 7 never claimed; a replica serving
/// the console. Returns the workspace, the database, the running `run`
/// and the replica.
fn fixture() -> (Workspace, TestDb, Child, Server) {
    let ws = Workspace::new(&jobs());
    let db = TestDb::sqlite();
    let run = |label: &str| {
        ws.command(&[
            "--database-url",
            &db.url,
            "run",
            "report",
            "--period",
            label,
        ])
        .env("CI_TOKEN", CI)
        .env("ONCALL_TOKEN", ONCALL)
        .env("READER_TOKEN", READER)
        .output()
        .expect("run")
    };
    assert!(run(&day(10)).status.success());
    std::fs::write(ws.path().join(format!("fail-{}", day(9))), "").expect("marker");
    assert_eq!(run(&day(9)).status.code(), Some(1));
    std::fs::write(ws.path().join(format!("hold-{}", day(8))), "").expect("marker");
    let running = ws
        .command(&[
            "--database-url",
            &db.url,
            "run",
            "report",
            "--period",
            &day(8),
        ])
        .env("CI_TOKEN", CI)
        .env("ONCALL_TOKEN", ONCALL)
        .env("READER_TOKEN", READER)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("run in the background");
    let sql = format!(
        "SELECT count(*) FROM scheduler_claims WHERE period_key = 'report:{}' AND state = 'running'",
        day(8)
    );
    eventually("the period running", BOUND, || count(&db.url, &sql) == 1);
    let server = Server::start(&ws, &db.url);
    (ws, db, running, server)
}

/// The background colour (or image) each state's cell is painted with.
fn painted(browser: &Browser, label: &str) -> (String, String) {
    let script = format!(
        "const c = document.querySelector('#grid .cell[data-period=\"{label}\"]');\
         const s = getComputedStyle(c); return [c.dataset.state, s.backgroundColor + ' ' + s.backgroundImage];"
    );
    let answer = browser.eval(&script);
    (
        answer[0].as_str().unwrap_or_default().to_owned(),
        answer[1].as_str().unwrap_or_default().to_owned(),
    )
}

#[test]
fn the_console_logs_in_shows_the_grid_in_colour_opens_a_period_and_reruns_a_failed_one() {
    let (ws, db, mut running, server) = fixture();
    let Some(browser) = Browser::start(1280, 900) else {
        return;
    };
    browser.log_in(&server.base(), ONCALL);
    assert!(browser.text("#who").starts_with("on-call"));

    browser.goto(&format!("{}/#/job/report", server.base()));
    browser.wait_for(&format!("#grid .cell[data-period=\"{}\"]", day(7)));
    let (state, paint) = painted(&browser, &day(10));
    assert_eq!(state, "succeeded");
    assert!(paint.starts_with("rgb(46, 157, 87)"), "{paint}");
    let (state, paint) = painted(&browser, &day(9));
    assert_eq!(state, "failed");
    assert!(paint.starts_with("rgb(214, 69, 69)"), "{paint}");
    let (state, paint) = painted(&browser, &day(8));
    assert_eq!(state, "running");
    assert!(paint.starts_with("rgb(47, 122, 229)"), "{paint}");
    // Never claimed, and fired days before `serve` first saw the job:
    // nobody owes it, so it is drawn neutral, not as an alarm.
    let (state, paint) = painted(&browser, &day(7));
    assert_eq!(state, "before first seen");
    assert!(paint.starts_with("rgb(238, 240, 243) none"), "{paint}");
    // The legend names every colour the grid uses, and the late mark.
    let legend = browser.text(".legend");
    for state in [
        "succeeded",
        "adopted",
        "failed",
        "running",
        "due",
        "ready",
        "waiting",
        "missed",
        "stale",
        "before first seen",
        "not due",
        "late",
    ] {
        assert!(legend.contains(state), "{legend}");
    }

    // A period's attempts and output.
    browser.click(&format!("#grid .cell[data-period=\"{}\"]", day(10)));
    let output = browser.text("pre.output");
    assert!(output.contains("<script>"), "{output}");
    assert!(browser.text("#attempts").contains("manual"));

    // The failed period, run again from its page once its cause is gone:
    // a double click runs it once.
    std::fs::remove_file(ws.path().join(format!("fail-{}", day(9)))).expect("cause gone");
    browser.goto(&format!("{}/#/job/report/period/{}", server.base(), day(9)));
    // A change of the address's fragment keeps the page: the period shown
    // before stays until the new one is drawn.
    let this_period = format!("report:{}", day(9));
    browser.until("the period's own page", || {
        browser.text("h1") == this_period
    });
    assert_eq!(browser.text("#period-state"), "failed");
    browser.wait_for("button[data-action=run]");
    browser.eval(
        "const b = document.querySelector('button[data-action=run]'); b.click(); b.click(); return true;",
    );
    browser.wait_for("#run-outcome");
    browser.until("the run's outcome", || {
        browser.text("#run-outcome") == "succeeded"
    });
    browser.goto(&format!("{}/#/job/report/period/{}", server.base(), day(9)));
    browser.until("the period succeeded", || {
        browser.text("h1") == this_period && browser.text("#period-state") == "succeeded"
    });
    let attempts = format!(
        "SELECT count(*) FROM scheduler_attempts WHERE period_key = 'report:{}'",
        day(9)
    );
    assert_eq!(count(&db.url, &attempts), 2, "one failure, one rerun");
    assert_eq!(count(&db.url, "SELECT count(*) FROM scheduler_api_runs"), 1);
    let _ = running.kill();
    let _ = running.wait();
    drop(browser);
    server.stop();
}

#[test]
fn pausing_a_job_in_the_console_stops_its_fires() {
    let (_ws, db, mut running, server) = fixture();
    let Some(browser) = Browser::start(1280, 900) else {
        return;
    };
    let ticks = "SELECT count(*) FROM scheduler_claims WHERE period_key LIKE 'tick:%'";
    let before = count(&db.url, ticks);
    eventually("the loop fires tick", BOUND, || {
        count(&db.url, ticks) > before + 1
    });
    browser.log_in(&server.base(), ONCALL);
    browser.click(".job[data-job=tick] button[data-action=pause]");
    browser.click("#confirm-yes");
    browser.wait_for(".job[data-job=tick] .badge.paused");
    browser.wait_for(".job[data-job=tick] button[data-action=resume]");
    // Once the loop has seen the pause (its gauge says so), no fire after
    // that instant is claimed; one claimed before may still land.
    let paused_gauge = "scheduler_paused{job=\"tick\"} 1";
    let base = server.base();
    let addr = base.trim_start_matches("http://");
    eventually("the loop seeing the pause", BOUND, || {
        crate::support::http_get(addr, "/metrics").contains(paused_gauge)
    });
    let seen = chrono::Utc::now().timestamp_millis();
    let after_pause = format!(
        "SELECT count(*) FROM scheduler_claims WHERE period_key LIKE 'tick:%' AND scheduled_at > {seen}"
    );
    // Three fires of the paused job, by the loop's next-fire gauge, with
    // none claimed.
    crate::support::fired_on(addr, "tick", 3);
    assert_eq!(count(&db.url, &after_pause), 0, "a paused job fired");
    let paused = count(&db.url, ticks);
    browser.click(".job[data-job=tick] button[data-action=resume]");
    eventually("tick fires again", BOUND, || count(&db.url, ticks) > paused);
    let _ = running.kill();
    let _ = running.wait();
    drop(browser);
    server.stop();
}

#[test]
fn a_read_only_token_sees_no_buttons_and_the_api_refuses_them() {
    let (_ws, _db, mut running, server) = fixture();
    let Some(browser) = Browser::start(1280, 900) else {
        return;
    };
    browser.log_in(&server.base(), READER);
    let buttons = "return document.querySelectorAll('main button[data-action]').length";
    assert_eq!(browser.eval(buttons), json!(0));
    browser.goto(&format!("{}/#/job/report", server.base()));
    browser.wait_for("#grid .cell");
    assert_eq!(browser.eval(buttons), json!(0));
    browser.goto(&format!("{}/#/job/report/period/{}", server.base(), day(9)));
    browser.wait_for("#attempts");
    assert_eq!(browser.eval(buttons), json!(0));
    // The page's own session, asking anyway: refused.
    let asked = browser.eval(
        "return Promise.all([\
           fetch('/v1/jobs/tick/pause', {method: 'POST', headers: {'Idempotency-Key': 'k1'}}),\
           fetch('/v1/jobs/report/runs', {method: 'POST', headers: {'Idempotency-Key': 'k2', 'Content-Type': 'application/json'}, body: '{\"period\": \"2026-01-01\"}'}),\
         ]).then(rs => rs.map(r => r.status));",
    );
    assert_eq!(asked, json!([403, 403]));
    let _ = running.kill();
    let _ = running.wait();
    drop(browser);
    server.stop();
}

#[test]
fn hostile_job_output_renders_as_text() {
    let (_ws, _db, mut running, server) = fixture();
    let Some(browser) = Browser::start(1280, 900) else {
        return;
    };
    browser.log_in(&server.base(), ONCALL);
    browser.goto(&format!(
        "{}/#/job/report/period/{}",
        server.base(),
        day(10)
    ));
    let output = browser.text("pre.output");
    assert!(
        output.contains("<script>document.title=\"pwned\"</script>"),
        "{output}"
    );
    assert!(
        output.contains("\"><img src=x onerror=document.title=\"pwned\">"),
        "{output}"
    );
    let found = browser
        .eval("return [document.querySelectorAll('main img, main script').length, document.title]");
    assert_eq!(found, json!([0, "scheduler"]));
    let _ = running.kill();
    let _ = running.wait();
    drop(browser);
    server.stop();
}

#[test]
fn every_view_fits_a_laptop_and_a_phone() {
    let (_ws, _db, mut running, server) = fixture();
    // A run asked for, for the runs view.
    let (status, _, _, _) = crate::api::answer(server.post(
        ONCALL,
        "/v1/jobs/report/runs?wait=30",
        "layout-run",
        &json!({ "from": day(14), "to": day(12) }),
    ));
    assert_eq!(status, StatusCode::OK);
    // SCHEDULER_SCREENSHOTS=docs/console keeps a picture of each view.
    let pictures = std::env::var_os("SCHEDULER_SCREENSHOTS").map(std::path::PathBuf::from);
    for (device, width, height) in [("laptop", 1280, 860), ("phone", 390, 844)] {
        let Some(browser) = Browser::start(width, height) else {
            return;
        };
        browser.log_in(&server.base(), ONCALL);
        let views = [
            ("jobs", "#/".to_owned(), ".job[data-job=tick] .strip .cell"),
            ("grid", "#/job/report".to_owned(), "#grid .cell"),
            (
                "period",
                format!("#/job/report/period/{}", day(9)),
                "#attempts",
            ),
            ("waiting", "#/job/rollup".to_owned(), "#grid .cell"),
            ("runs", "#/runs".to_owned(), "main h1"),
        ];
        for (name, hash, ready) in views {
            browser.goto(&format!("{}/{hash}", server.base()));
            browser.wait_for(ready);
            let fits = browser
                .eval("return document.documentElement.scrollWidth <= window.innerWidth + 1");
            assert_eq!(fits, json!(true), "{name} is wider than a {device}");
            if let Some(dir) = &pictures {
                std::fs::create_dir_all(dir).expect("the screenshots' folder");
                browser.screenshot(&dir.join(format!("{name}-{device}.png")));
            }
        }
    }
    let _ = running.kill();
    let _ = running.wait();
    server.stop();
}

/// A plain HTTP client that keeps no cookies of its own.
fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(BOUND)
        .build()
        .expect("client")
}

#[test]
fn a_session_is_a_cookie_scripts_cannot_read_that_holds_no_token_and_acts_only_from_its_own_page() {
    let ws = Workspace::new(&jobs());
    let db = TestDb::sqlite();
    let server = Server::start(&ws, &db.url);
    let base = server.base();

    // The page: a strict policy, and nothing of the state.
    let page = http().get(format!("{base}/")).send().expect("GET /");
    assert_eq!(page.status(), StatusCode::OK);
    let policy = page.headers()["content-security-policy"]
        .to_str()
        .unwrap()
        .to_owned();
    assert!(policy.contains("default-src 'none'") && policy.contains("script-src 'self'"));
    assert!(!policy.contains("unsafe-inline"), "{policy}");
    assert_eq!(page.headers()["x-frame-options"], "DENY");
    let html = page.text().unwrap();
    assert!(
        !html.contains("report") && !html.contains("<script>"),
        "{html}"
    );
    assert_eq!(
        http()
            .get(format!("{base}/v1/jobs"))
            .send()
            .unwrap()
            .status(),
        StatusCode::UNAUTHORIZED
    );

    // A token not allowed to read opens no session.
    let login = |token: &str| {
        http()
            .post(format!("{base}/console/session"))
            .json(&json!({ "token": token }))
            .send()
            .expect("login")
    };
    // Not from another site's form, even with a good token.
    let forged = http()
        .post(format!("{base}/console/session"))
        .header("Origin", "http://evil.example")
        .header("Content-Type", "text/plain")
        .body(json!({ "token": ONCALL }).to_string())
        .send()
        .expect("login from elsewhere");
    assert_eq!(forged.status(), StatusCode::FORBIDDEN);
    assert!(forged.headers().get("set-cookie").is_none());

    let wrong = login("not-a-token-at-all-0000");
    assert_eq!(wrong.status(), StatusCode::UNAUTHORIZED);
    assert!(wrong.headers().get("set-cookie").is_none());

    let ok = login(ONCALL);
    assert_eq!(ok.status(), StatusCode::OK);
    let cookie = ok.headers()["set-cookie"].to_str().unwrap().to_owned();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    assert!(
        !cookie.contains(ONCALL),
        "the cookie holds the token: {cookie}"
    );
    let pair = cookie.split(';').next().unwrap().to_owned();

    let with_cookie = |request: reqwest::blocking::RequestBuilder| {
        request.header("Cookie", &pair).send().expect("request")
    };
    assert_eq!(
        with_cookie(http().get(format!("{base}/v1/jobs"))).status(),
        StatusCode::OK
    );
    // From the console's own page: allowed.
    let paused = with_cookie(
        http()
            .post(format!("{base}/v1/jobs/report/pause"))
            .header("Idempotency-Key", "p1")
            .header("Origin", &base)
            .header("Sec-Fetch-Site", "same-origin"),
    );
    assert_eq!(paused.status(), StatusCode::OK);
    // Saying neither where it comes from (not a browser): refused.
    let unsaid = with_cookie(
        http()
            .post(format!("{base}/v1/jobs/report/resume"))
            .header("Idempotency-Key", "r0"),
    );
    assert_eq!(unsaid.status(), StatusCode::FORBIDDEN);
    // From another site: refused, whatever it sends.
    for (origin, site) in [
        ("http://evil.example", "cross-site"),
        (base.as_str(), "same-site"),
    ] {
        let refused = with_cookie(
            http()
                .post(format!("{base}/v1/jobs/report/resume"))
                .header("Idempotency-Key", "r1")
                .header("Origin", origin)
                .header("Sec-Fetch-Site", site),
        );
        assert_eq!(refused.status(), StatusCode::FORBIDDEN, "{origin} {site}");
    }

    // A forged or altered cookie is nobody.
    let (name, rest) = pair.split_once('=').unwrap();
    let mut forged = rest.to_owned();
    let last = forged.pop().unwrap();
    forged.push(if last == '0' { '1' } else { '0' });
    for value in [
        forged,
        format!("{}.4102444800.00", hex(b"on-call")),
        String::new(),
    ] {
        let refused = http()
            .get(format!("{base}/v1/jobs"))
            .header("Cookie", format!("{name}={value}"))
            .send()
            .unwrap();
        assert_eq!(refused.status(), StatusCode::UNAUTHORIZED, "{value}");
        let said = refused.text().unwrap_or_default();
        assert!(said.contains("session has ended"), "{said}");
    }

    // Logging out makes the browser forget it.
    let out = with_cookie(http().delete(format!("{base}/console/session")));
    assert!(
        out.headers()["set-cookie"]
            .to_str()
            .unwrap()
            .contains("Max-Age=0")
    );

    // The secret was never written to the log.
    drop(server);
    let log = std::fs::read_to_string(ws.path().join("serve.log")).unwrap_or_default();
    assert!(!log.contains(ONCALL));
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[test]
fn reads_with_max_age_share_one_answer_and_the_grid_pages_through_a_range() {
    let ws = Workspace::new(&jobs());
    let db = TestDb::sqlite();
    let server = Server::start(&ws, &db.url);
    let get = |path: &str| -> Value {
        let response = server.get(READER, path);
        assert_eq!(response.status(), StatusCode::OK, "{path}");
        response.json().expect("JSON")
    };
    let paused = |body: &Value| {
        body["jobs"]
            .as_array()
            .and_then(|jobs| jobs.iter().find(|j| j["job"] == "tick"))
            .map(|j| j["paused"].clone())
    };
    let shared = get("/v1/jobs?max_age=60");
    assert_eq!(paused(&shared), Some(json!(false)));
    let answer = server.post(ONCALL, "/v1/jobs/tick/pause", "pause-1", &json!({}));
    assert_eq!(answer.status(), StatusCode::OK);
    // Within max_age, the shared answer; asked fresh, the database's.
    assert_eq!(get("/v1/jobs?max_age=60"), shared);
    assert_eq!(paused(&get("/v1/jobs")), Some(json!(true)));

    // The last 30 periods, and the one before them.
    let last = get("/v1/jobs/report/periods?last=30");
    assert_eq!(last["periods"].as_array().map(Vec::len), Some(30));
    let first = last["from"].as_str().unwrap().to_owned();
    let previous = last["previous"].as_str().unwrap().to_owned();
    assert!(previous < first);
    // A range in pages: each page ends where the next starts.
    let page = get("/v1/jobs/report/periods?from=2020-01-01&to=2025-12-31&limit=1000");
    assert_eq!(page["periods"].as_array().map(Vec::len), Some(1000));
    assert_eq!(page["next"], json!("2022-09-27"));
    let rest = get("/v1/jobs/report/periods?from=2022-09-27&to=2025-12-31&limit=1000");
    assert_eq!(rest["from"], json!("2022-09-27"));
    for (path, field) in [
        ("/v1/jobs/report/periods?last=0", "last"),
        ("/v1/jobs/report/periods?last=10001", "last"),
        (
            "/v1/jobs/report/periods?from=2026-01-01&to=2026-02-01&limit=x",
            "limit",
        ),
        ("/v1/jobs/report/periods?last=3&from=2026-01-01", "last"),
        ("/v1/jobs/report/periods?last=3&limit=2", "limit"),
        ("/v1/jobs?recent=1000", "recent"),
        ("/v1/jobs?max_age=61", "max_age"),
    ] {
        let (status, _, _, body) = crate::api::answer(server.get(READER, path));
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}");
        assert_eq!(body["field"], json!(field), "{path}: {body}");
    }

    // Runs asked for are listed with their progress.
    let started = server.post(
        ONCALL,
        "/v1/jobs/report/runs?wait=30",
        "run-1",
        &json!({"from": "2026-01-01", "to": "2026-01-03"}),
    );
    assert_eq!(started.status(), StatusCode::OK);
    let runs = get("/v1/runs");
    let run = &runs["runs"][0];
    assert_eq!(run["job"], json!("report"));
    assert_eq!(run["total"], json!(3));
    assert_eq!(run["periods_listed"], json!(3));
    assert_eq!(run["counts"]["succeeded"], json!(3));
    server.stop();
}

/// Issue 43: the period page tails a running attempt's output live from a
/// replica that is not running it.
#[test]
fn the_period_page_tails_a_running_attempt_live() {
    let ws = Workspace::new(&with_api(
        "\n[[job]]\nname = \"slow\"\nschedule = \"0 2 * * *\"\nperiod = \"day\"\nconcurrency = 4\n\
         shell = \"for i in $(seq 1 40); do echo line-$i; sleep 0.25; done\"\n",
    ));
    let db = TestDb::sqlite();
    let run = |job: &str| {
        let mut command = ws.command(&["--database-url", &db.url, "run", job, "--period", &day(3)]);
        command
            .env("CI_TOKEN", CI)
            .env("ONCALL_TOKEN", ONCALL)
            .env("READER_TOKEN", READER)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        command
    };
    let server = Server::start(&ws, &db.url);
    let Some(browser) = Browser::start(1280, 900) else {
        return;
    };
    browser.log_in(&server.base(), ONCALL);
    // The slow one runs in another process; its page follows it.
    let mut slow = run("slow")
        .stderr(std::fs::File::create(ws.path().join("slow.log")).expect("slow.log"))
        .stdout(std::fs::File::create(ws.path().join("slow.out")).expect("slow.out"))
        .spawn()
        .expect("run in the background");
    let running = format!(
        "SELECT count(*) FROM scheduler_claims WHERE period_key = 'slow:{}' AND state = 'running'",
        day(3)
    );
    eventually("slow running", BOUND, || {
        count(&db.url, &running) == 1 || {
            let said = std::fs::read_to_string(ws.path().join("slow.out")).unwrap_or_default();
            let exited = slow.try_wait().expect("try_wait");
            assert!(exited.is_none(), "{exited:?} {said}");
            false
        }
    });
    browser.goto(&format!("{}/#/job/slow/period/{}", server.base(), day(3)));
    browser.until("a line while it runs", || {
        browser.text("pre.output").contains("line-2\n")
    });
    assert!(
        !browser.text("pre.output").contains("line-40"),
        "the attempt had ended: nothing was followed"
    );
    browser.until("its last line and its end", || {
        browser.text("pre.output").contains("line-40\n")
            && browser.text("#period-state").contains("succeeded")
    });
    assert_eq!(slow.wait().expect("run ends").code(), Some(0));
    drop(browser);
    server.stop();
}

/// Issue 43: the period page pages through a long finished attempt's
/// output a page at a time, never reading it whole at once.
#[test]
fn the_period_page_pages_through_a_long_attempt() {
    let ws = Workspace::new(&with_api(
        "\n[[job]]\nname = \"long\"\nschedule = \"0 2 * * *\"\nperiod = \"day\"\n\
         shell = \"seq -f page-%g 1 200000\"\n",
    ));
    let db = TestDb::sqlite();
    let ran = ws
        .command(&[
            "--database-url",
            &db.url,
            "run",
            "long",
            "--period",
            &day(3),
        ])
        .env("CI_TOKEN", CI)
        .env("ONCALL_TOKEN", ONCALL)
        .env("READER_TOKEN", READER)
        .output()
        .expect("run");
    assert!(
        ran.status.success(),
        "{}",
        String::from_utf8_lossy(&ran.stderr)
            .lines()
            .filter(|l| !l.contains(" job: "))
            .collect::<Vec<_>>()
            .join("\n")
    );
    // 2.3 MB of lines: more than one page of 16 chunks of 64 KiB.
    let chunks = count(
        &db.url,
        &format!(
            "SELECT count(*) FROM scheduler_output WHERE period_key = 'long:{}'",
            day(3)
        ),
    );
    assert!(chunks > 16, "{chunks} chunks: too few for two pages");
    let server = Server::start(&ws, &db.url);
    let Some(browser) = Browser::start(1280, 900) else {
        return;
    };
    browser.log_in(&server.base(), ONCALL);
    browser.goto(&format!("{}/#/job/long/period/{}", server.base(), day(3)));
    browser.until("the first page", || {
        browser.text("pre.output").starts_with("page-1\n")
    });
    assert!(
        !browser.text("pre.output").contains("page-200000"),
        "read whole at once"
    );
    let mut clicks = 0;
    let last = "return document.querySelector('pre.output').textContent.slice(-12)";
    browser.until("the last page, a click at a time", || {
        if browser.eval(last) == json!("page-200000\n") {
            return true;
        }
        let more = "const b = document.querySelector('button.more'); return [b.hidden, b.disabled]";
        if browser.eval(more) == json!([false, false]) {
            browser.click("button.more");
            clicks += 1;
        }
        std::thread::sleep(Duration::from_millis(200));
        false
    });
    assert!(clicks >= 1, "{clicks} pages more");
    drop(browser);
    server.stop();
}

/// A period split into shards: its grid cell is split into a strip per
/// shard in each shard's colour, and its page lists the shards with their
/// states and each shard's attempts with their output.
#[test]
fn a_period_split_into_shards_shows_a_split_cell_and_a_shard_table() {
    let ws = Workspace::new(&with_api(
        "\n[[job]]\nname = \"billing\"\nschedule = \"0 2 * * *\"\nperiod = \"day\"\nshards = 3\n\
         shell = \"echo shard-$SCHEDULER_SHARD; test $SCHEDULER_SHARD != 1\"\n",
    ));
    let db = TestDb::sqlite();
    let ran = ws
        .command(&[
            "--database-url",
            &db.url,
            "run",
            "billing",
            "--period",
            &day(2),
        ])
        .env("CI_TOKEN", CI)
        .env("ONCALL_TOKEN", ONCALL)
        .env("READER_TOKEN", READER)
        .output()
        .expect("run");
    assert_eq!(ran.status.code(), Some(1), "shard 1 fails");
    let server = Server::start(&ws, &db.url);
    let Some(browser) = Browser::start(1280, 900) else {
        return;
    };
    browser.log_in(&server.base(), ONCALL);
    browser.goto(&format!("{}/#/job/billing", server.base()));
    let strips = format!(
        "return Array.from(document.querySelectorAll('.grid a[data-period=\"{}\"] span')).map((s) => s.className)",
        day(2)
    );
    browser.until("a cell split in three", || {
        browser.eval(&strips) == json!(["s-succeeded", "s-failed", "s-succeeded"])
    });
    browser.goto(&format!(
        "{}/#/job/billing/period/{}",
        server.base(),
        day(2)
    ));
    browser.until("the shard table", || browser.text("#shards").contains("#1"));
    let states = "return Array.from(document.querySelectorAll('#shards tr[data-shard] [data-state]')).map((s) => s.dataset.state)";
    assert_eq!(
        browser.eval(states),
        json!(["succeeded", "failed", "succeeded"])
    );
    assert_eq!(browser.text("#period-state").trim(), "failed");
    browser.until("each shard's output", || {
        let outputs = "return Array.from(document.querySelectorAll('pre.output')).map((p) => p.textContent).sort()";
        browser.eval(outputs) == json!(["shard-0\n", "shard-1\n", "shard-2\n"])
    });
}
