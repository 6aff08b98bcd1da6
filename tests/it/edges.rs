//! The edges a user touches (issue 8), through the real binary: database
//! paths, hand runs, secrets, bad values, pipes, bounded memory, redirects
//! and the listener.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use chrono::{Datelike, Utc};

use crate::support::{
    Said, TestDb, Workspace, databases, eventually, http_get, lines, listening_at, polled, proxied,
    serve_log, wait, within,
};

const BOUND: Duration = Duration::from_secs(60);

/// A monthly job that covers the previous month, as billing does.
fn billing(body: &str) -> Workspace {
    Workspace::new(&format!(
        "[scheduler]\nlease = \"2s\"\n\n[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ncovers = \"previous\"\n{body}\n"
    ))
}

/// The binary with `args`, run in `dir` (not the workspace).
fn run_in(ws: &Workspace, dir: &Path, args: &[&str]) -> std::process::Output {
    ws.command(args).current_dir(dir).output().unwrap()
}

fn assert_says(text: &str, parts: &[&str]) {
    for part in parts {
        assert!(text.contains(part), "expected {part:?} in:\n{text}");
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

/// The peak resident memory (VmHWM) of a running process, in bytes.
fn peak_rss(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Waits for `child` to end, sampling its peak memory; returns the exit
/// code and the largest peak seen.
fn wait_sampling(mut child: Child) -> (i32, u64) {
    let mut peak = 0;
    let mut code = None;
    let ended = polled(Duration::from_millis(10), BOUND * 3, || {
        if let Some(rss) = peak_rss(child.id()) {
            peak = peak.max(rss);
        }
        code = child.try_wait().unwrap().map(|s| s.code().unwrap_or(-1));
        code.is_some()
    });
    assert!(ended, "still running");
    (code.unwrap_or(-1), peak)
}

const MEMORY_BOUND: u64 = 100 * 1024 * 1024;

// 1. A relative database path

#[test]
fn a_relative_database_path_is_taken_from_jobs_toml_and_readers_never_create_one() {
    let ws = billing("command = [\"true\"]");
    let other = ws.path().join("other");
    std::fs::create_dir(&other).unwrap();
    assert_eq!(ws.run(&["run", "billing", "--period", "2026-10"]).code(), 0);
    let db = ws.path().join("scheduler.db");
    assert_eq!(mode(&db), 0o600, "the database holds output tails");

    let history = run_in(
        &ws,
        &other,
        &["--config", "../jobs.toml", "history", "billing"],
    );
    assert_eq!(history.code(), 0, "{}", history.stderr());
    assert_says(&history.stdout(), &["billing:2026-10", "succeeded"]);
    let dry = run_in(
        &ws,
        &other,
        &[
            "--config",
            "../jobs.toml",
            "run",
            "billing",
            "--period",
            "2026-10",
            "--dry-run",
        ],
    );
    assert_says(
        &dry.stdout(),
        &["billing:2026-10  skipped: already succeeded"],
    );
    assert!(!other.join("scheduler.db").exists(), "a second database");

    // --database-url is relative to the working directory.
    let made = run_in(
        &ws,
        &other,
        &[
            "--config",
            "../jobs.toml",
            "--database-url",
            "sqlite://here.db",
            "migrate",
        ],
    );
    assert_eq!(made.code(), 0, "{}", made.stderr());
    assert_eq!(mode(&other.join("here.db")), 0o600);

    // [scheduler].database_url is relative to jobs.toml.
    let named = Workspace::new("[scheduler]\ndatabase_url = \"sqlite://named.db\"\n");
    let elsewhere = tempfile::tempdir().unwrap();
    let config = named.path().join("jobs.toml");
    let config = config.to_str().unwrap();
    assert_eq!(
        run_in(&named, elsewhere.path(), &["--config", config, "migrate"]).code(),
        0
    );
    assert!(named.path().join("named.db").exists());

    // Only serve, run and migrate create one; the others name the path.
    let fresh = billing("command = [\"true\"]");
    for args in [
        &["status"][..],
        &["history", "billing"],
        &["pause", "billing"],
        &["release", "billing", "--period", "2026-10"],
        &["prune"],
    ] {
        let out = fresh.run(args);
        assert_eq!(out.code(), 3, "{args:?}: {}", out.stderr());
        let path = fresh.path().join("scheduler.db");
        assert_says(&out.stderr(), &["no database at", path.to_str().unwrap()]);
        assert!(!path.exists(), "{args:?} created a database");
    }
}

// 2. SQLite URLs that name no file

#[test]
fn sqlite_urls_without_a_file_are_configuration_errors() {
    let ws = billing("shell = \"echo ran >> runs.txt\"");
    for url in [
        "sqlite://",
        "sqlite:",
        "sqlite::memory:",
        "sqlite://:memory:",
        "sqlite://x.db?mode=memory",
    ] {
        let out = ws.run(&[
            "--database-url",
            url,
            "run",
            "billing",
            "--period",
            "2026-07",
        ]);
        assert_eq!(out.code(), 2, "{url}: {}", out.stderr());
        assert_says(&out.stderr(), &["--database-url"]);
        let from_env = ws
            .command(&["run", "billing", "--period", "2026-07"])
            .env("DATABASE_URL", url)
            .output()
            .unwrap();
        assert_eq!(from_env.code(), 2, "{url}: {}", from_env.stderr());
        assert_says(&from_env.stderr(), &["DATABASE_URL"]);
    }
    let file = Workspace::new(
        "[scheduler]\ndatabase_url = \"sqlite://${DB_FILE}\"\n\n[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\nshell = \"echo ran >> runs.txt\"\n",
    );
    let out = file
        .command(&["run", "billing", "--period", "2026-07"])
        .env("DB_FILE", "")
        .output()
        .unwrap();
    assert_eq!(out.code(), 2, "{}", out.stderr());
    assert_says(&out.stderr(), &["jobs.toml:2:16", "names no file"]);
    assert!(
        lines(ws.path().join("runs.txt")).is_empty(),
        "a run happened"
    );
    assert!(
        lines(file.path().join("runs.txt")).is_empty(),
        "a run happened"
    );
}

// 3. A hand run of a period that is not yet due

#[test]
fn a_period_not_yet_due_is_refused_unless_early_and_force_needs_periods() {
    let ws = billing("shell = \"echo $SCHEDULER_PERIOD >> runs.txt\"");
    let now = Utc::now();
    let this_month = now.format("%Y-%m").to_string();
    let (year, month) = if now.month() == 12 {
        (now.year() + 1, 1)
    } else {
        (now.year(), now.month() + 1)
    };
    let fire = format!("{year}-{month:02}-01T02:00:00Z");
    let refused = ws.run(&["run", "billing", "--period", &this_month]);
    assert_eq!(refused.code(), 2, "{}", refused.stderr());
    assert_says(
        &refused.stderr(),
        &[
            &format!("--period: billing:{this_month} is not due yet"),
            &format!("its fire is at {fire}"),
            "--early",
        ],
    );
    let range = ws.run(&["run", "billing", "--from", "2026-01", "--to", &this_month]);
    assert_eq!(range.code(), 2, "{}", range.stderr());
    assert_says(&range.stderr(), &["--to:", "not due yet"]);
    let force = ws.run(&["run", "billing", "--force"]);
    assert_eq!(force.code(), 2, "{}", force.stderr());
    assert_says(&force.stderr(), &["--force: needs --period"]);
    assert!(
        !ws.path().join("scheduler.db").exists(),
        "refused after opening the database"
    );

    let early = ws.run(&["run", "billing", "--period", &this_month, "--early"]);
    assert_eq!(early.code(), 0, "{}", early.stderr());
    assert_says(&early.stdout(), &["succeeded"]);
    assert_eq!(lines(ws.path().join("runs.txt")), [this_month]);
}

// 4. A manual run with no free concurrency slot

#[test]
fn a_manual_run_without_a_free_slot_exits_1_and_wait_waits_for_one() {
    for db in databases() {
        let ws = billing(
            "concurrency = 1\nshell = \"echo $SCHEDULER_PERIOD >> runs.txt; while [ ! -e go ]; do sleep 0.05; done\"",
        );
        let url = db.url.as_str();
        let start = |args: &[&str]| {
            let mut all = vec!["--database-url", url, "run", "billing"];
            all.extend_from_slice(args);
            ws.command(&all)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        };
        let first = start(&["--period", "2026-07"]);
        let runs = ws.path().join("runs.txt");
        eventually("the first run to start", BOUND, || lines(&runs).len() == 1);

        let busy = wait(start(&["--period", "2026-08"]), BOUND);
        assert_eq!(busy.code(), 1, "{url}: {}{}", busy.stdout(), busy.stderr());
        assert_says(
            &busy.stdout(),
            &[
                "billing:2026-08  busy: not run",
                "concurrency slot",
                "--wait",
            ],
        );
        assert_eq!(lines(&runs), ["2026-07"], "{url}");

        let said = ws.path().join("waiting.log");
        let waiting = ws
            .command(&[
                "--database-url",
                url,
                "run",
                "billing",
                "--period",
                "2026-08",
                "--wait",
            ])
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&said).unwrap())
            .spawn()
            .unwrap();
        eventually("the run to wait for a slot", BOUND, || {
            std::fs::read_to_string(&said)
                .is_ok_and(|l| l.contains("waiting for a free concurrency slot"))
        });
        std::fs::write(ws.path().join("go"), "").unwrap();
        let first = wait(first, BOUND);
        assert_eq!(first.code(), 0, "{url}: {}", first.stderr());
        let waited = wait(waiting, BOUND);
        assert_eq!(waited.code(), 0, "{url}: {}", waited.stderr());
        assert_says(&waited.stdout(), &["billing:2026-08  succeeded"]);
        assert_eq!(lines(&runs), ["2026-07", "2026-08"], "{url}");
    }
}

// 5. Passwords in URLs that do not parse

#[test]
fn passwords_never_show_even_in_urls_that_do_not_parse() {
    let ws = billing("command = [\"true\"]");
    let secret = "Hunter2Secret";
    let unparsable = [
        format!("postgres://app:{secret}@127.0.0.1:notaport/x"),
        format!("postgres://u:{secret}@127.0.0.1:99999/db"),
        format!("postgres://u:{secret}@[::1/db"),
        format!("postgres//u:{secret}@h/db"),
    ];
    for url in &unparsable {
        let out = ws.run(&["--database-url", url, "status"]);
        assert_eq!(out.code(), 2, "{}", out.stderr());
        assert_says(&out.stderr(), &["--database-url", "***"]);
        let said = out.stdout() + &out.stderr();
        assert!(!said.contains(secret), "{said}");
    }
    let query = format!("postgres://u@127.0.0.1:1/db?password={secret}");
    let out = ws.run(&["--database-url", &query, "status"]);
    assert_eq!(out.code(), 3, "{}", out.stderr());
    let said = out.stdout() + &out.stderr();
    assert!(!said.contains(secret), "{said}");
    assert_says(&said, &["password=***"]);

    let file = Workspace::new(&format!(
        "[scheduler]\ndatabase_url = \"postgres://app:{secret}@127.0.0.1:notaport/x\"\n"
    ));
    let out = file.run(&["status"]);
    assert_eq!(out.code(), 2, "{}", out.stderr());
    assert_says(&out.stderr(), &["jobs.toml:2:16"]);
    assert!(!(out.stdout() + &out.stderr()).contains(secret));
}

// 6. Read-only commands without the secrets

#[test]
fn commands_that_run_no_action_need_no_variables_and_check_warns_unless_strict() {
    let ws = Workspace::new(
        "[[job]]\nname = \"hook\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\nhttp = { url = \"https://example.invalid/${HOOK_PATH}\", headers = { x-api-key = \"${API_TOKEN}\" } }\n",
    );
    let check = ws.run(&["check"]);
    assert_eq!(check.code(), 0, "{}", check.stderr());
    assert_says(&check.stdout(), &["1 job OK"]);
    assert_says(
        &check.stderr(),
        &[
            "warning: jobs.toml:5:41: environment variable `HOOK_PATH` is not set",
            "`API_TOKEN` is not set",
        ],
    );
    let strict = ws.run(&["check", "--strict"]);
    assert_eq!(strict.code(), 2, "{}", strict.stderr());
    assert_says(
        &strict.stderr(),
        &["jobs.toml:5:41", "`HOOK_PATH`", "`API_TOKEN`"],
    );
    for args in [
        &["migrate"][..],
        &["status"],
        &["history", "hook"],
        &["next", "hook"],
        &["pause", "hook"],
        &["resume", "hook"],
    ] {
        let out = ws.run(args);
        assert_eq!(out.code(), 0, "{args:?}: {}", out.stderr());
    }
    let run = ws.run(&["run", "hook", "--period", "2026-07"]);
    assert_eq!(run.code(), 2, "{}", run.stderr());
    assert_says(&run.stderr(), &["jobs.toml:5:41", "`HOOK_PATH` is not set"]);
}

/// A job left incomplete by an unset variable is held back under its
/// namespace too: it was listed by its name in the file, and looked for by
/// its name in the database (`NAMESPACE/NAME`), so it ran with the variable
/// empty.
#[test]
fn a_namespaced_job_with_an_unset_variable_does_not_run() {
    let ws = Workspace::new(
        "[scheduler]\nnamespace = \"prod\"\n\n[[job]]\nname = \"hook\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\nshell = \"echo ran > ran.txt; echo ${HOOK_PATH}\"\n",
    );
    let run = ws.run(&["run", "hook", "--period", "2026-07"]);
    assert_eq!(run.code(), 2, "{}{}", run.stdout(), run.stderr());
    assert_says(&run.stderr(), &["jobs.toml:8:", "`HOOK_PATH` is not set"]);
    assert!(!ws.path().join("ran.txt").exists(), "the job ran");
}

// 7. Variables in shell scripts

#[test]
fn a_variable_in_a_shell_script_is_expanded_by_the_shell_never_parsed_as_syntax() {
    let ws =
        billing("shell = \"echo ${TOKEN} > out.txt; printf '%s' \\\"${TOKEN}\\\" > quoted.txt\"");
    let value = "abc $(id -un) ; echo INJECTED";
    let out = ws
        .command(&["run", "billing", "--period", "2026-07"])
        .env("TOKEN", value)
        .output()
        .unwrap();
    assert_eq!(out.code(), 0, "{}{}", out.stdout(), out.stderr());
    assert_eq!(lines(ws.path().join("out.txt")), [value]);
    assert_eq!(
        std::fs::read_to_string(ws.path().join("quoted.txt")).unwrap(),
        value
    );
    let unset = ws.run(&["run", "billing", "--period", "2026-06"]);
    assert_eq!(unset.code(), 2, "{}", unset.stderr());
    assert_says(&unset.stderr(), &["jobs.toml:9:15", "`TOKEN` is not set"]);
}

// 8. Values that cannot work are refused at load

#[test]
fn values_that_cannot_work_are_refused_at_load_with_their_place() {
    let job = |body: &str| {
        format!("[[job]]\nname = \"a\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\n{body}\n")
    };
    let cases: Vec<(String, &[&str])> = vec![
        (
            job("http = { url = \"https://x.invalid/\", headers = { \"X Api\" = \"v\" } }"),
            &["jobs.toml:5:", "`X Api` is not a valid header name"],
        ),
        (
            job("http = { url = \"https://x.invalid/\", headers = { x-a = \"a\\nb\" } }"),
            &["jobs.toml:5:", "header `x-a`", "cannot carry"],
        ),
        (
            job("http = { url = \"https://x.invalid/\", method = \"PO ST\" }"),
            &["jobs.toml:5:", "not an HTTP method"],
        ),
        (
            job("command = [\"echo\", \"a\\u0000b\"]"),
            &["jobs.toml:5:", "NUL byte"],
        ),
        (
            job("shell = \"echo a\\u0000b\""),
            &["jobs.toml:5:", "NUL byte"],
        ),
        (
            job("command = [\"true\"]\nenv = { K = \"a\\u0000\" }"),
            &["jobs.toml:6:", "NUL byte"],
        ),
        (
            job("command = [\"true\"]\nworkdir = \"/tmp\\u0000\""),
            &["jobs.toml:6:", "NUL byte"],
        ),
        (
            job("command = [\"\"]"),
            &["jobs.toml:5:12", "the program name is empty"],
        ),
        (
            job("sql = { statement = \"  \" }"),
            &["jobs.toml:5:21", "the SQL statement is empty"],
        ),
        (
            "[scheduler]\ncatch_up = \"100000000y\"\n".to_owned(),
            &["jobs.toml:2:12", "too long"],
        ),
        (
            job("http = { url = \"${HOOK_URL}\" }"),
            &["jobs.toml:5:16", "http:// or https://"],
        ),
    ];
    for (toml, parts) in &cases {
        let ws = Workspace::new(toml);
        let out = ws
            .command(&["check"])
            .env("HOOK_URL", "ftp://x.invalid/")
            .output()
            .unwrap();
        assert_eq!(out.code(), 2, "{toml}\n{}", out.stderr());
        assert_says(&out.stderr(), parts);
        assert!(!ws.path().join("scheduler.db").exists());
    }
    // The scheme is checked after expansion: a URL from a variable works.
    let ws = Workspace::new(&job("http = { url = \"${HOOK_URL}\" }"));
    let out = ws
        .command(&["check", "--strict"])
        .env("HOOK_URL", "https://x.invalid/hook")
        .output()
        .unwrap();
    assert_eq!(out.code(), 0, "{}", out.stderr());
}

// 9. Closed stdout, the end of time, and a range of any length

/// Starts the binary with its stdout closed before it writes anything.
fn with_stdout_closed(ws: &Workspace, args: &[&str]) -> std::process::Output {
    // The read end is closed before the child starts: its first write
    // fails, however quickly it writes.
    let (reader, writer) = std::io::pipe().unwrap();
    drop(reader);
    let child = ws
        .command(args)
        .stdout(writer)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait(child, BOUND)
}

#[test]
fn a_closed_stdout_ends_quietly_with_141_and_a_run_records_its_period_first() {
    for db in databases() {
        let ws = billing("shell = \"echo $SCHEDULER_PERIOD >> runs.txt\"");
        let url = db.url.as_str();
        let cut = with_stdout_closed(
            &ws,
            &[
                "--database-url",
                url,
                "run",
                "billing",
                "--from",
                "2026-01",
                "--to",
                "2026-06",
            ],
        );
        assert_eq!(cut.code(), 141, "{url}: {}", cut.stderr());
        assert!(!cut.stderr().contains("panicked"), "{}", cut.stderr());
        assert_eq!(
            lines(ws.path().join("runs.txt")),
            ["2026-01"],
            "{url}: claims no more"
        );
        let after = ws.run(&[
            "--database-url",
            url,
            "run",
            "billing",
            "--from",
            "2026-01",
            "--to",
            "2026-02",
            "--dry-run",
        ]);
        assert_says(
            &after.stdout(),
            &[
                "billing:2026-01  skipped: already succeeded",
                "billing:2026-02  would claim",
            ],
        );
        for args in [
            &["history", "billing"][..],
            &["status"],
            &["check"],
            &["next", "billing"],
        ] {
            let mut all = vec!["--database-url", url];
            all.extend_from_slice(args);
            let out = with_stdout_closed(&ws, &all);
            assert_eq!(out.code(), 141, "{args:?}: {}", out.stderr());
            assert_eq!(out.stderr(), "", "{args:?} is not quiet");
        }
    }
    let ws = billing("command = [\"true\"]");
    let end = ws.run(&["next", "billing", "--after", "+262142-12-31T23:59:59Z"]);
    assert_eq!(end.code(), 0, "{}", end.stderr());
}

#[test]
fn a_range_of_any_length_runs_in_bounded_memory() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[[job]]\nname = \"tick\"\nschedule = \"* * * * *\"\nperiod = \"minute\"\ncommand = [\"true\"]\n",
    );
    let mut child = ws
        .command(&[
            "--database-url",
            &db.url,
            "run",
            "tick",
            "--from",
            "1900-01-01T00:00",
            "--to",
            "2026-11-30T23:59",
            "--dry-run",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut line = String::new();
    let mut peak = 0;
    for n in 0..150_000 {
        line.clear();
        assert!(out.read_line(&mut line).unwrap() > 0, "output ended early");
        if n == 0 {
            assert!(
                line.starts_with("tick:1900-01-01T00:00  would claim"),
                "{line}"
            );
        }
        if n % 1000 == 0 {
            peak = peak.max(peak_rss(pid).unwrap_or(0));
        }
    }
    assert!(
        line.starts_with("tick:1900-04-15T03:59"),
        "in order: {line}"
    );
    drop(out);
    let end = wait(child, BOUND);
    assert_eq!(end.code(), 141, "{}", end.stderr());
    assert!(peak < MEMORY_BOUND, "peak RSS {peak} bytes");
}

// 10. Output without newlines and huge HTTP bodies

#[test]
fn output_without_newlines_is_logged_in_64_kib_pieces_in_bounded_memory() {
    // A long lease: 100 MB of log lines through a loaded machine's pipe
    // can stall a one-thread `run` past a short lease's fence.
    let ws = Workspace::new(
        "[scheduler]\nlease = \"60s\"\n\n[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ncovers = \"previous\"\nshell = \"head -c 100000000 /dev/zero | tr '\\\\0' x\"\n",
    );
    let mut child = ws
        .command(&["run", "billing", "--period", "2026-07"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let (mut longest, mut pieces) = (0, 0);
        let mut stderr = BufReader::new(stderr);
        let mut line = Vec::new();
        while stderr.read_until(b'\n', &mut line).unwrap_or(0) > 0 {
            if line.len() > 60_000 {
                pieces += 1;
            }
            longest = longest.max(line.len());
            line.clear();
        }
        (longest, pieces)
    });
    let (code, peak) = wait_sampling(child);
    let (longest, pieces) = reader.join().unwrap();
    assert_eq!(code, 0);
    assert!(peak < MEMORY_BOUND, "peak RSS {peak} bytes");
    assert!(longest < 64 * 1024 + 1024, "a log line of {longest} bytes");
    assert!(pieces >= 100_000_000 / (64 * 1024), "{pieces} pieces");
}

/// An HTTP server answering every request with `head` and then `body_len`
/// zero bytes; counts requests.
fn http_server(head: String, body_len: usize) -> (u16, Arc<AtomicUsize>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let count = Arc::new(AtomicUsize::new(0));
    let seen = count.clone();
    std::thread::spawn(move || {
        for stream in listener.incoming() {
            let Ok(mut stream) = stream else { continue };
            seen.fetch_add(1, Ordering::SeqCst);
            let head = head.clone();
            std::thread::spawn(move || {
                let mut request = [0u8; 4096];
                let _ = stream.read(&mut request);
                if stream.write_all(head.as_bytes()).is_err() {
                    return;
                }
                let chunk = vec![0u8; 64 * 1024];
                let mut sent = 0;
                while sent < body_len {
                    let n = chunk.len().min(body_len - sent);
                    if stream.write_all(&chunk[..n]).is_err() {
                        return;
                    }
                    sent += n;
                }
            });
        }
    });
    (port, count)
}

#[test]
fn a_huge_http_response_is_read_only_up_to_4_kib() {
    let size = 300_000_000;
    let (port, _) = http_server(
        format!("HTTP/1.1 200 OK\r\ncontent-length: {size}\r\n\r\n"),
        size,
    );
    let ws = billing(&format!(
        "http = {{ url = \"http://127.0.0.1:{port}/big\" }}"
    ));
    let child = ws
        .command(&["run", "billing", "--period", "2026-07"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (code, peak) = wait_sampling(child);
    assert_eq!(code, 0);
    assert!(peak < MEMORY_BOUND, "peak RSS {peak} bytes");
}

// 11. Redirects and TLS causes

#[test]
fn a_redirect_is_a_permanent_failure_naming_location_and_nothing_goes_to_the_other_origin() {
    let (second, reached) = http_server("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".into(), 0);
    for status in ["307 Temporary Redirect", "302 Found"] {
        let location = format!("http://localhost:{second}/hook");
        let (first, _) = http_server(
            format!("HTTP/1.1 {status}\r\nlocation: {location}\r\ncontent-length: 0\r\n\r\n"),
            0,
        );
        let ws = billing(&format!(
            "retry = {{ attempts = 3 }}\nhttp = {{ url = \"http://127.0.0.1:{first}/hook\", headers = {{ x-api-key = \"S3CRETTOKEN\" }}, body = \"{{period}}\" }}"
        ));
        let out = ws.run(&["run", "billing", "--period", "2026-07"]);
        assert_eq!(out.code(), 1, "{}", out.stderr());
        assert_says(
            &out.stdout(),
            &[
                &status[..3],
                &format!("Location: {location}"),
                "no retries left",
            ],
        );
    }
    assert_eq!(
        reached.load(Ordering::SeqCst),
        0,
        "a request reached the other origin"
    );
}

#[test]
fn a_tls_failure_says_why() {
    // A plain HTTP server asked for TLS.
    let (port, _) = http_server("HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".into(), 0);
    let ws = billing(&format!("http = {{ url = \"https://127.0.0.1:{port}/\" }}"));
    let out = ws.run(&["run", "billing", "--period", "2026-07"]);
    assert_eq!(out.code(), 1, "{}", out.stderr());
    let said = out.stdout();
    let detail = said.split("error sending request").nth(1).unwrap_or("");
    assert!(
        detail.to_ascii_lowercase().contains("corrupt message")
            || detail.to_ascii_lowercase().contains("tls"),
        "no cause in: {said}"
    );
}

// 12. The listener

#[test]
fn many_idle_connections_neither_stop_fires_nor_healthz() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[scheduler]\nlease = \"2s\"\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\n\n[[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\nshell = \"echo $SCHEDULER_PERIOD >> runs.txt\"\n",
    );
    let binary = env!("CARGO_BIN_EXE_scheduler");
    let serve = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 256 && exec {binary} --database-url {} serve --listen 127.0.0.1:0",
            db.url
        ))
        .current_dir(ws.path())
        .env_remove("DATABASE_URL")
        .stdout(Stdio::null())
        .stderr(serve_log(&ws))
        .spawn()
        .unwrap();
    let addr = listening_at(&ws.path().join("serve.log"), 0, BOUND);
    eventually("/healthz", BOUND, || {
        http_get(&addr, "/healthz").starts_with("HTTP/1.1 200")
    });
    let idle: Vec<TcpStream> = (0..300)
        .filter_map(|_| TcpStream::connect(&addr).ok())
        .collect();
    assert!(idle.len() > 256, "only {} connections", idle.len());
    let runs = ws.path().join("runs.txt");
    let before = lines(&runs).len();
    eventually("fires while connections are held", BOUND, || {
        lines(&runs).len() >= before + 3
    });
    eventually("/healthz while connections are held", BOUND, || {
        http_get(&addr, "/healthz").starts_with("HTTP/1.1 200")
    });
    let metrics = http_get(&addr, "/metrics");
    assert_says(&metrics, &["HTTP/1.1 200", "scheduler_runs_total"]);
    drop(idle);
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(serve.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(wait(serve, BOUND).code(), 0);
    let history = ws.run(&[
        "--database-url",
        &db.url,
        "history",
        "tick",
        "--limit",
        "1000",
    ]);
    assert!(!history.stdout().contains("failed"), "{}", history.stdout());
}

/// Probes answer whatever the API's clients do: 200 clients that open
/// connections and never finish a request head, opening a new one as soon
/// as one is closed, keep no `/healthz` out (issue 26, item 12: 11 of 12
/// probes failed under 400 of them).
#[test]
fn slow_clients_that_never_send_a_head_keep_no_probe_out() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[scheduler]\nlease = \"2s\"\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\n\n[[job]]\nname = \"tick\"\nschedule = \"0 0 1 1 *\"\ncommand = [\"true\"]\n",
    );
    let binary = env!("CARGO_BIN_EXE_scheduler");
    // 256 descriptors: 64 connections, 16 spare.
    let serve = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "ulimit -n 256 && exec {binary} --database-url {} serve --listen 127.0.0.1:0",
            db.url
        ))
        .current_dir(ws.path())
        .env_remove("DATABASE_URL")
        .stdout(Stdio::null())
        .stderr(serve_log(&ws))
        .spawn()
        .unwrap();
    let addr = listening_at(&ws.path().join("serve.log"), 0, BOUND);
    eventually("/healthz", BOUND, || {
        http_get(&addr, "/healthz").starts_with("HTTP/1.1 200")
    });
    let stop = AtomicBool::new(false);
    let holding = AtomicUsize::new(0);
    let answers: Vec<String> = std::thread::scope(|s| {
        for _ in 0..4 {
            s.spawn(|| {
                // 50 slow clients each, every one reopened once closed.
                let mut held: Vec<TcpStream> = Vec::new();
                let mut counted = 0;
                while !stop.load(Ordering::Relaxed) {
                    held.retain(|c| {
                        let mut byte = [0u8; 1];
                        let _ = c.set_nonblocking(true);
                        !matches!(std::io::Read::read(&mut &*c, &mut byte), Ok(0))
                    });
                    while held.len() < 50 {
                        match TcpStream::connect(&addr) {
                            Ok(mut c) => {
                                let _ =
                                    std::io::Write::write_all(&mut c, b"GET /v1/jobs HTTP/1.1\r\n");
                                held.push(c);
                            }
                            Err(_) => break,
                        }
                    }
                    if counted < held.len() {
                        holding.fetch_add(held.len() - counted, Ordering::SeqCst);
                        counted = held.len();
                    }
                    // Scenario time: the clients' pace at reopening.
                    std::thread::sleep(Duration::from_millis(50));
                }
            });
        }
        // The 200 slow clients opened.
        eventually("the slow clients", BOUND, || {
            holding.load(Ordering::SeqCst) >= 200
        });
        let answers = (0..12)
            .map(|_| {
                let answer = http_get(&addr, "/healthz");
                // Scenario time: a probe's pace, while the clients churn.
                std::thread::sleep(Duration::from_millis(300));
                answer
            })
            .collect();
        stop.store(true, Ordering::Relaxed);
        answers
    });
    let failed: Vec<&String> = answers
        .iter()
        .filter(|a| !a.starts_with("HTTP/1.1 200"))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of 12 probes failed: {failed:?}",
        failed.len()
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(serve.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(wait(serve, BOUND).code(), 0);
}

/// Kubernetes' convention: liveness says the process and its loop live,
/// readiness that it can serve (issue 26, item 11: `/healthz` turned 503
/// in an outage, so a Deployment would restart every replica).
#[test]
fn while_the_database_is_away_healthz_stays_200_and_readyz_answers_503_naming_it() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let (proxy, url) = proxied(&db);
    let ws = Workspace::new(
        "[scheduler]\nlease = \"2s\"\nscan_interval = \"1s\"\nshutdown_grace = \"1s\"\n\n[[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\n",
    );
    let serve = ws
        .command(&["--database-url", &url, "serve", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::null())
        .stderr(serve_log(&ws))
        .spawn()
        .unwrap();
    let addr = listening_at(&ws.path().join("serve.log"), 0, BOUND);
    eventually("/healthz 200", BOUND, || {
        http_get(&addr, "/healthz").starts_with("HTTP/1.1 200")
    });
    eventually("/readyz 200", BOUND, || {
        http_get(&addr, "/readyz").starts_with("HTTP/1.1 200")
    });
    proxy.cut();
    let mut last = String::new();
    let mut alive = Vec::new();
    within(BOUND, || {
        alive.push(http_get(&addr, "/healthz"));
        last = http_get(&addr, "/readyz");
        last.starts_with("HTTP/1.1 503")
    });
    assert_says(&last, &["HTTP/1.1 503", "database"]);
    alive.push(http_get(&addr, "/healthz"));
    for answer in &alive {
        assert_says(answer, &["HTTP/1.1 200", "serve loop"]);
    }
    proxy.restore();
    eventually("/readyz 200 again", BOUND, || {
        http_get(&addr, "/readyz").starts_with("HTTP/1.1 200")
    });
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(serve.id() as i32),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    assert_eq!(wait(serve, BOUND).code(), 0);
}

#[test]
fn a_taken_listen_address_exits_2_before_any_database_is_created() {
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let ws = billing("command = [\"true\"]");
    let out = ws.run(&["serve", "--listen", &addr]);
    assert_eq!(out.code(), 2, "{}", out.stderr());
    assert_says(&out.stderr(), &["--listen", &addr]);
    assert!(
        !ws.path().join("scheduler.db").exists(),
        "a database was created"
    );
}

// 13. The real cause of a failed connection

#[test]
fn a_refused_connection_or_an_unopenable_file_says_why() {
    let ws = billing("command = [\"true\"]");
    let out = ws.run(&["--database-url", "postgres://u:pw@127.0.0.1:1/db", "status"]);
    assert_eq!(out.code(), 3, "{}", out.stderr());
    assert_says(&out.stderr(), &["refused"]);
    assert!(!out.stderr().contains("pool timed out"), "{}", out.stderr());

    std::fs::write(ws.path().join("plain"), "").unwrap();
    for (url, cause) in [
        ("sqlite://plain/s.db", "Not a directory"),
        ("sqlite://missing/s.db", "No such file or directory"),
    ] {
        let out = ws.run(&[
            "--database-url",
            url,
            "run",
            "billing",
            "--period",
            "2026-07",
        ]);
        assert_eq!(out.code(), 3, "{}", out.stderr());
        let path = ws.path().join(&url["sqlite://".len()..]);
        assert_says(&out.stderr(), &[path.to_str().unwrap(), cause]);
        assert!(!out.stderr().contains("code: 14"), "{}", out.stderr());
    }
}

// 14. Errors that say what to do

#[test]
fn errors_say_what_to_do_and_every_mistake_in_a_file_is_reported() {
    let ws = Workspace::new(
        "[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\ntimezone = \"Europe/Berlin\"\nperiod = \"month\"\ncovers = \"previous\"\ncommand = [\"true\"]\n",
    );
    let date = ws.run(&["next", "billing", "-n", "1", "--after", "2026-10-25"]);
    assert_eq!(date.code(), 0, "{}", date.stderr());
    assert_eq!(
        date.stdout(),
        "2026-11-01 02:00:00 CET  2026-11-01T01:00:00Z  billing:2026-10\n"
    );
    let local = ws.run(&["next", "billing", "-n", "1", "--after", "2026-11-01T02:30"]);
    assert_says(&local.stdout(), &["2026-12-01 02:00:00 CET"]);
    let bad = ws.run(&["next", "billing", "--after", "next tuesday"]);
    assert_eq!(bad.code(), 2);
    assert_says(&bad.stderr(), &["--after", "a date (2026-10-25)"]);

    let file = "[scheduler]\nlease = \"soon\"\n\n\
        [[job]]\nname = \"hours\"\nschedule = \"0 25 * * *\"\ncommand = [\"true\"]\n\n\
        [[job]]\nname = \"bill\"\nschedule = \"0 2 1 * *\"\ncommand = \"bill --month {period}\"\n\n\
        [[job]]\nname = \"fine\"\nschedule = \"0 2 1 * *\"\ncommand = [\"true\"]\n\n\
        [[job]]\nname = \"typo\"\nschedule = \"@daily\"\nperiod = \"dya\"\ncommand = [\"true\"]\n";
    let ws = Workspace::new(file);
    let out = ws.run(&["check"]);
    assert_eq!(out.code(), 2, "{}", out.stderr());
    let said = out.stderr();
    let places = [
        "jobs.toml:2:9",
        "jobs.toml:6:12: `0 25 * * *` is not a cron pattern (hour 25 is out of range 0–23)",
        "jobs.toml:12:11: `command` is a string, but it must be an array",
        "jobs.toml:22:10: unknown variant `dya`",
    ];
    assert_says(&said, &places);
    assert_says(&said, &["shell = \"bill --month {period}\""]);
    let at: Vec<usize> = places.iter().map(|p| said.find(p).unwrap()).collect();
    assert!(
        at.windows(2).all(|w| w[0] < w[1]),
        "not in file order:\n{said}"
    );
    assert!(!ws.path().join("scheduler.db").exists());
}

#[test]
fn an_unset_variable_in_database_url_is_a_warning_for_check_and_an_error_for_status() {
    let ws = Workspace::new(
        "[scheduler]\ndatabase_url = \"postgres://app:${SCHEDULER_TEST_UNSET_DB_PASS}@127.0.0.1/x\"\n\n[[job]]\nname = \"a\"\nschedule = \"@daily\"\ncommand = [\"true\"]\n",
    );
    let check = ws.run(&["check"]);
    assert_eq!(check.code(), 0, "{}", check.stderr());
    assert!(
        check.stderr().contains("warning: ")
            && check.stderr().contains("SCHEDULER_TEST_UNSET_DB_PASS"),
        "{}",
        check.stderr()
    );
    let status = ws.run(&["status"]);
    assert_eq!(status.code(), 2, "{}", status.stderr());
    assert!(
        status.stderr().contains("jobs.toml:2:")
            && status.stderr().contains("SCHEDULER_TEST_UNSET_DB_PASS"),
        "{}",
        status.stderr()
    );
    assert!(!ws.path().join("scheduler.db").exists());
}

#[test]
fn a_bad_sslmode_is_a_configuration_error_found_before_connecting() {
    let ws = billing("command = [\"true\"]");
    let url = "postgres://app:S3CRETPW@127.0.0.1:1/x?sslmode=requir";
    let out = ws.run(&["--database-url", url, "status"]);
    assert_eq!(out.code(), 2, "{}", out.stderr());
    assert_says(&out.stderr(), &["--database-url", "requir", "require"]);
    assert!(!out.stderr().contains("S3CRETPW"), "{}", out.stderr());
}

#[test]
fn a_secret_in_a_connection_parameter_never_reaches_the_log() {
    let ws = billing("command = [\"true\"]");
    let url = "postgres://postgres@127.0.0.1:1/x?sslpassword=KEYSECRET1&sslmode=disable";
    let out = ws.run(&["--database-url", url, "status"]);
    // libpq's `sslpassword` is one the driver does not read: refused, by
    // name only.
    assert_eq!(out.code(), 2, "{}", out.stderr());
    assert_says(&out.stderr(), &["--database-url", "`sslpassword`"]);
    assert!(!out.stderr().contains("KEYSECRET1"), "{}", out.stderr());
    assert!(!out.stdout().contains("KEYSECRET1"), "{}", out.stdout());
}

#[test]
fn early_without_periods_is_a_usage_error() {
    let ws = billing("command = [\"true\"]");
    let out = ws.run(&["run", "billing", "--early"]);
    assert_eq!(out.code(), 2, "{}", out.stderr());
    assert_says(&out.stderr(), &["--early", "--period"]);
    assert!(!ws.path().join("scheduler.db").exists());
}

#[test]
fn a_reading_command_against_a_database_nothing_has_run_against_creates_no_tables() {
    let Some(db) = crate::support::TestDb::postgres_blocking() else {
        return;
    };
    let ws = billing("command = [\"true\"]");
    for args in [&["status"][..], &["history", "billing"][..]] {
        let mut all = vec!["--database-url", db.url.as_str()];
        all.extend_from_slice(args);
        let out = ws.run(&all);
        assert_eq!(out.code(), 3, "{args:?}: {}", out.stderr());
        assert_says(
            &out.stderr(),
            &["no scheduler tables", "`scheduler migrate` creates them"],
        );
    }
    assert_eq!(
        crate::support::count(
            &db.url,
            "SELECT count(*) FROM pg_tables WHERE tablename LIKE 'scheduler%'"
        ),
        0,
        "tables were created"
    );
    let migrated = ws.run(&["--database-url", &db.url, "migrate"]);
    assert_eq!(migrated.code(), 0, "{}", migrated.stderr());
    let out = ws.run(&["--database-url", &db.url, "status"]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
}

#[test]
fn a_secret_bound_as_an_sql_param_never_reaches_the_log_or_the_history() {
    let Some(db) = crate::support::TestDb::postgres_blocking() else {
        return;
    };
    // PostgreSQL quotes a value it cannot read back in its error.
    let ws =
        billing("sql = { statement = \"SELECT $1::int\", params = [\"{period}-${APP_SECRET}\"] }");
    let with_secret = |args: &[&str]| {
        let mut all = vec!["--database-url", db.url.as_str()];
        all.extend_from_slice(args);
        ws.command(&all)
            .env("APP_SECRET", "hunter2SECRET")
            .output()
            .unwrap()
    };
    let out = with_secret(&["run", "billing", "--period", "2026-10"]);
    assert_eq!(out.code(), 1, "{}", out.stderr());
    let said = out.stdout() + &out.stderr();
    assert!(!said.contains("hunter2SECRET"), "{said}");
    assert_says(&said, &["invalid input syntax", "\"2026-10-***\""]);
    let history = with_secret(&["history", "billing", "--json", "--output"]);
    assert_eq!(history.code(), 0, "{}", history.stderr());
    assert!(
        !history.stdout().contains("hunter2SECRET"),
        "{}",
        history.stdout()
    );
    assert_says(&history.stdout(), &["2026-10-***"]);
}

#[test]
fn an_sql_statement_of_nothing_but_comments_and_semicolons_is_refused_at_load() {
    // The last is a comment to the end to SQLite, which reads `--` up to `\n` only.
    for statement in [
        ";",
        "-- nothing",
        " /* a */ ; -- b",
        "-- x\r INSERT INTO t VALUES (1)",
    ] {
        let ws = billing(&format!("sql = {{ statement = {statement:?} }}"));
        let out = ws.run(&["check"]);
        assert_eq!(out.code(), 2, "{statement:?}: {}", out.stderr());
        assert_says(&out.stderr(), &["jobs.toml:", "the SQL statement is empty"]);
        let out = ws.run(&["run", "billing", "--period", "2026-10"]);
        assert_eq!(out.code(), 2, "{statement:?}: {}", out.stderr());
        assert!(!ws.path().join("scheduler.db").exists());
    }
}

#[test]
fn a_sqlite_url_with_an_unknown_parameter_is_a_configuration_error_that_creates_nothing() {
    let ws = billing("command = [\"true\"]");
    for (url, says) in [
        ("sqlite://s.db?bogus=1", "bogus"),
        ("sqlite://s.db?mode=ro", "read-only"),
        ("sqlite://s.db?immutable=1", "read-only"),
    ] {
        let out = ws.run(&[
            "--database-url",
            url,
            "run",
            "billing",
            "--period",
            "2026-10",
        ]);
        assert_eq!(out.code(), 2, "{url}: {}", out.stderr());
        assert_says(&out.stderr(), &["--database-url", says]);
        assert!(!ws.path().join("s.db").exists(), "{url}");
    }
}

/// A misspelt PostgreSQL parameter was ignored by the driver: `sslmod=require`
/// connected without TLS, and the whole URL (the value of a misspelt
/// `password` too) was printed in the next error.
#[test]
fn a_postgres_url_with_a_parameter_the_driver_does_not_know_is_refused_without_its_value() {
    let ws = billing("command = [\"true\"]");
    for (url, says) in [
        (
            "postgres://postgres@127.0.0.1:5432/test?sslmod=require",
            "did you mean `sslmode`",
        ),
        (
            "postgres://postgres@127.0.0.1:5432/test?passwrod=hunter2xyz",
            "`passwrod`",
        ),
    ] {
        let out = ws.run(&["--database-url", url, "status"]);
        assert_eq!(out.code(), 2, "{url}: {}", out.stderr());
        assert_says(&out.stderr(), &["--database-url", says]);
        assert!(!out.stderr().contains("hunter2xyz"), "{}", out.stderr());
    }
    // The driver's own parameters pass.
    let out = ws.run(&[
        "--database-url",
        "postgres://postgres@127.0.0.1:1/test?sslmode=disable&application_name=x&options[statement_timeout]=5s",
        "status",
    ]);
    assert_ne!(out.code(), 2, "{}", out.stderr());
}

#[test]
fn a_secret_in_a_command_never_reaches_the_log_or_the_kept_output() {
    let ws = Workspace::new(
        "[[job]]\nname = \"echoes\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ncommand = [\"echo\", \"token=${APP_TOKEN}\"]\n\
         \n[[job]]\nname = \"missing\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ncommand = [\"/nonexistent/${APP_TOKEN}\"]\n",
    );
    let with_secret = |args: &[&str]| with_secret(&ws, args);
    for (job, code) in [("echoes", 0), ("missing", 1)] {
        let out = with_secret(&["run", job, "--period", "2026-10"]);
        assert_eq!(out.code(), code, "{job}: {}", out.stderr());
        let said = out.stdout() + &out.stderr();
        assert!(!said.contains("s3cr3tTokenXYZ"), "{said}");
        let history = with_secret(&["history", job, "--output"]);
        assert!(
            !history.stdout().contains("s3cr3tTokenXYZ"),
            "{}",
            history.stdout()
        );
        assert_says(&(said + &history.stdout()), &["***"]);
    }
}

/// PostgreSQL's `text` holds no NUL byte: a job that prints one is recorded
/// (as `\x00`, as SQLite's is shown), not left running to be taken over and
/// run again at every lease.
#[test]
fn a_nul_byte_in_a_jobs_output_is_recorded_and_the_period_runs_once() {
    let Some(db) = TestDb::postgres_blocking() else {
        return;
    };
    let ws = billing("shell = \"printf 'a\\\\000b\\\\n'; echo ran >> runs.txt\"");
    let out = ws.run(&[
        "--database-url",
        &db.url,
        "run",
        "billing",
        "--period",
        "2026-10",
    ]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
    let history = ws.run(&["--database-url", &db.url, "history", "billing", "--output"]);
    assert_says(&history.stdout(), &["succeeded", "a\\x00b"]);
    let again = ws.run(&[
        "--database-url",
        &db.url,
        "run",
        "billing",
        "--period",
        "2026-10",
    ]);
    assert_eq!(again.code(), 0, "{}", again.stderr());
    assert_eq!(lines(ws.path().join("runs.txt")), ["ran"]);
}

/// The binary with `args` and `APP_TOKEN` set to a secret.
fn with_secret(ws: &Workspace, args: &[&str]) -> std::process::Output {
    ws.command(args)
        .env("APP_TOKEN", "s3cr3tTokenXYZ")
        .output()
        .unwrap()
}

/// `/bin/sh` expands a `shell` job's `${NAME}` itself, from the environment
/// the job inherits: the value is still the scheduler's to mask.
#[test]
fn a_secret_a_shell_job_expands_never_reaches_the_log_or_the_kept_output() {
    let ws = billing("shell = \"echo token=${APP_TOKEN}\"");
    let with_secret = |args: &[&str]| with_secret(&ws, args);
    let out = with_secret(&["run", "billing", "--period", "2026-10"]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
    let said = out.stdout() + &out.stderr();
    let history = with_secret(&["history", "billing", "--output"]);
    let said = said + &history.stdout();
    assert!(!said.contains("s3cr3tTokenXYZ"), "{said}");
    assert_says(&said, &["token=***"]);
}

#[test]
fn a_workdir_that_is_not_there_is_named_when_the_job_cannot_start() {
    let ws = billing("command = [\"true\"]\nworkdir = \"/nonexistent/dir\"");
    let out = ws.run(&["run", "billing", "--period", "2026-10"]);
    assert_eq!(out.code(), 1, "{}", out.stderr());
    assert_says(
        &(out.stdout() + &out.stderr()),
        &[
            "workdir `/nonexistent/dir` is not a directory",
            "status 127",
        ],
    );
}

#[test]
fn a_secret_postgresql_folds_to_lower_case_is_masked_too() {
    let Some(db) = crate::support::TestDb::postgres_blocking() else {
        return;
    };
    let ws = billing(
        "sql = { statement = \"SELECT $1::text::regclass\", params = [\"${APP_SECRET}\"] }",
    );
    let out = ws
        .command(&[
            "--database-url",
            &db.url,
            "run",
            "billing",
            "--period",
            "2026-10",
        ])
        .env("APP_SECRET", "Hunter2Secret")
        .output()
        .unwrap();
    assert_eq!(out.code(), 1, "{}", out.stderr());
    let said = (out.stdout() + &out.stderr()).to_ascii_lowercase();
    assert!(!said.contains("hunter2secret"), "{said}");
    assert_says(&said, &["relation \"***\" does not exist"]);
}

#[test]
fn an_http_url_that_does_not_parse_after_expansion_is_refused_at_load_without_its_value() {
    for url in ["http://127.0.0.1:${PORT}/", "http://[${PORT}]/{period}"] {
        let ws = billing(&format!("http = {{ url = \"{url}\" }}"));
        let out = ws
            .command(&["check", "--strict"])
            .env("PORT", "Hunter2Secret")
            .output()
            .unwrap();
        assert_eq!(out.code(), 2, "{url}: {}", out.stderr());
        assert_says(&out.stderr(), &["jobs.toml:", "`url` is not a valid URL"]);
        assert!(!out.stderr().contains("Hunter2Secret"), "{}", out.stderr());
    }
}

#[test]
fn a_secret_cut_by_the_line_limit_or_the_kept_tail_shows_in_neither_piece() {
    // A line of 65,528 bytes and the value (cut at the 64 KiB limit), then
    // the value and 4,090 bytes (the kept 4 KiB start inside it).
    let ws = billing(
        "command = [\"sh\", \"-c\", \"head -c 65528 /dev/zero | tr '\\\\0' x; printf '%s\\\\n%s' \\\"$1\\\" \\\"$1\\\"; head -c 4090 /dev/zero | tr '\\\\0' y\", \"sh\", \"${MYSEC}\"]",
    );
    let with_secret = |args: &[&str]| {
        ws.command(args)
            .env("MYSEC", "hunter2secretvalue")
            .output()
            .unwrap()
    };
    let out = with_secret(&["run", "billing", "--period", "2026-10"]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
    let history = with_secret(&["history", "billing", "--output"]);
    for said in [out.stderr(), history.stdout()] {
        for piece in ["hunter2s", "ecretvalue", "tvalue"] {
            assert!(
                !said.contains(piece),
                "{piece} in {}",
                &said[said.len().saturating_sub(300)..]
            );
        }
    }
}

/// A `password=` parameter of a SQLite URL is masked in its errors too,
/// and a PostgreSQL parameter with a bad number is not told about sslmode.
#[test]
fn a_sqlite_url_never_shows_a_password_parameter_and_a_bad_number_is_named() {
    let ws =
        Workspace::new("[[job]]\nname = \"j\"\nschedule = \"* * * * *\"\ncommand = [\"true\"]\n");
    let out = ws.run(&[
        "--database-url",
        "sqlite:///tmp/x.db?password=S3cretDbPassw0rdXYZ&mode=ro",
        "status",
    ]);
    assert_eq!(out.code(), 2, "{}", out.stderr());
    assert!(out.stderr().contains("read-only"), "{}", out.stderr());
    assert!(
        !out.stderr().contains("S3cretDbPassw0rdXYZ"),
        "{}",
        out.stderr()
    );
    let out = ws.run(&[
        "--database-url",
        "postgres://127.0.0.1/db?port=notanumber",
        "status",
    ]);
    assert_eq!(out.code(), 2, "{}", out.stderr());
    assert!(
        out.stderr().contains("take whole numbers") && !out.stderr().contains("sslmode is one of"),
        "{}",
        out.stderr()
    );
}
