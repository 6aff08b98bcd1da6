//! The scheduler's secrets stay its own: a job never inherits them unless it
//! names them, and no message, log line or kept output shows one, in any
//! form it may be quoted in.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;

use crate::support::{Said, TestDb, Workspace};

const DB_PASSWORD: &str = "DbPassw0rdSecret99";
const API_TOKEN: &str = "ApiTokenSecret-cccccccccccc";
const HTTP_SECRET: &str = "HttpSecretValue-77";

/// A file with an `[api]` token and an `http` job that take secrets from
/// the environment, and the shell jobs `body` declares.
fn with_secrets(body: &str) -> Workspace {
    Workspace::new(&format!(
        "[api]\ntokens = [{{ name = \"ci\", secret = \"${{CI_TOKEN}}\", allow = [\"read\"] }}]\n\n\
         [[job]]\nname = \"hook\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\n\
         http = {{ url = \"http://127.0.0.1:9/\", headers = {{ X-Secret = \"${{HTTP_SECRET}}\" }} }}\n\n{body}"
    ))
}

/// A `[[job]]` called `name`, run by hand, with `rest` (its action).
fn job(name: &str, rest: &str) -> String {
    format!(
        "[[job]]\nname = \"{name}\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ncovers = \"previous\"\n{rest}\n\n"
    )
}

/// `args` with the secrets in the environment, on `url`.
fn run(ws: &Workspace, url: &str, args: &[&str]) -> std::process::Output {
    ws.command(args)
        .env("DATABASE_URL", url)
        .env("CI_TOKEN", API_TOKEN)
        .env("HTTP_SECRET", HTTP_SECRET)
        .env("PUBLIC_SETTING", "plain-value")
        .output()
        .unwrap()
}

/// The database URL with a password in it: PostgreSQL (which takes any
/// password here) where there is one, else a SQLite file.
fn database_with_password() -> (TestDb, String) {
    match TestDb::postgres_blocking() {
        Some(db) => {
            let url = db.url.replacen(
                "postgres://postgres@",
                &format!("postgres://postgres:{DB_PASSWORD}@"),
                1,
            );
            (db, url)
        }
        None => {
            let db = TestDb::sqlite();
            let url = format!("{}?password={DB_PASSWORD}", db.url);
            (db, url)
        }
    }
}

#[test]
fn a_job_never_inherits_the_schedulers_secrets_and_no_output_shows_one() {
    let (_db, url) = database_with_password();
    // `sh` names none of the secrets; `builder` prints another job's
    // secret without naming it (it builds the value itself).
    let ws = with_secrets(
        &(job(
            "sh",
            "shell = \"env > env.txt; env | grep -i -e database -e token -e secret; true\"",
        ) + &job("builder", "shell = \"echo got=HttpSecret''Value-77\"")),
    );
    for name in ["sh", "builder"] {
        let out = run(&ws, &url, &["run", name, "--period", "2026-10"]);
        assert_eq!(out.code(), 0, "{}", out.stderr());
        let history = run(&ws, &url, &["history", name, "--output"]);
        let said = out.stdout() + &out.stderr() + &history.stdout() + &history.stderr();
        for secret in [DB_PASSWORD, API_TOKEN, HTTP_SECRET] {
            assert!(!said.contains(secret), "{secret} shown by {name}:\n{said}");
        }
    }
    let env = std::fs::read_to_string(ws.path().join("env.txt")).unwrap();
    for hidden in ["DATABASE_URL=", "CI_TOKEN=", "HTTP_SECRET=", DB_PASSWORD] {
        assert!(!env.contains(hidden), "the job got {hidden}:\n{env}");
    }
    for kept in [
        "PATH=",
        "PUBLIC_SETTING=plain-value",
        "SCHEDULER_PERIOD=2026-10",
    ] {
        assert!(env.contains(kept), "the job lost {kept}:\n{env}");
    }
}

#[test]
fn a_job_that_names_a_secret_gets_it_and_its_output_still_masks_it() {
    let (_db, url) = database_with_password();
    let ws = with_secrets(
        &(job(
            "shell",
            "shell = \"echo ${HTTP_SECRET} > shell.txt; echo $HTTP_SECRET\"",
        ) + &job(
            "command",
            "command = [\"sh\", \"-c\", \"echo $DB > command.txt; echo $DB\"]\nenv = { DB = \"${DATABASE_URL}\" }",
        )),
    );
    for name in ["shell", "command"] {
        let out = run(&ws, &url, &["run", name, "--period", "2026-10"]);
        assert_eq!(out.code(), 0, "{}", out.stderr());
        let history = run(&ws, &url, &["history", name, "--output"]);
        let said = out.stdout() + &out.stderr() + &history.stdout();
        assert!(
            !said.contains(HTTP_SECRET) && !said.contains(DB_PASSWORD),
            "{said}"
        );
    }
    let shell = std::fs::read_to_string(ws.path().join("shell.txt")).unwrap();
    assert_eq!(shell.trim(), HTTP_SECRET);
    let command = std::fs::read_to_string(ws.path().join("command.txt")).unwrap();
    assert_eq!(command.trim(), url);
}

#[test]
fn a_job_with_an_inherit_list_gets_only_those_variables() {
    let ws = Workspace::new(&job(
        "clean",
        "shell = \"env > env.txt\"\ninherit = [\"PATH\"]\nenv = { OWN = \"mine\" }",
    ));
    let db = TestDb::sqlite();
    let out = run(&ws, &db.url, &["run", "clean", "--period", "2026-10"]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
    let env = std::fs::read_to_string(ws.path().join("env.txt")).unwrap();
    let mut names: Vec<&str> = env
        .lines()
        .filter_map(|l| l.split('=').next())
        .filter(|n| !n.starts_with("SCHEDULER_") && *n != "PWD" && *n != "SHLVL" && *n != "_")
        .collect();
    names.sort_unstable();
    assert_eq!(names, ["OWN", "PATH"], "{env}");
}

/// A secret of several lines (a PEM key) that its job prints: each of its
/// lines is masked in the log, which carries the output a line at a time,
/// as in the kept output.
#[test]
fn a_secret_of_several_lines_is_masked_line_by_line_in_the_log() {
    let db = TestDb::sqlite();
    let key =
        "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----";
    let ws = with_secrets(&job(
        "pem",
        "command = [\"sh\", \"-c\", \"printf 'key=%s\\\\n' \\\"$1\\\"; exit 1\", \"x\", \"${PEM_KEY}\"]",
    ));
    let out = ws
        .command(&["run", "pem", "--period", "2026-10"])
        .env("DATABASE_URL", &db.url)
        .env("CI_TOKEN", API_TOKEN)
        .env("HTTP_SECRET", HTTP_SECRET)
        .env("PEM_KEY", key)
        .output()
        .unwrap();
    assert_eq!(out.code(), 1, "{}", out.stderr());
    let said = out.stdout() + &out.stderr();
    assert!(
        said.contains("key=***"),
        "the job's output is not in the log: {said}"
    );
    for line in key.lines() {
        assert!(!said.contains(line), "{line} is in the log: {said}");
    }
}

/// At `-vv` the HTTP client's own trace lines (which quote the host it
/// connects to) stay out of the log: only the scheduler's lines, masked,
/// are raised.
#[test]
fn the_most_verbose_log_quotes_no_secret_of_an_http_action() {
    let db = TestDb::sqlite();
    let ws = with_secrets(&job(
        "secret-host",
        "http = { url = \"http://${SECRET_HOST}.invalid/x\" }",
    ));
    let out = ws
        .command(&["-vv", "run", "secret-host", "--period", "2026-10"])
        .env("DATABASE_URL", &db.url)
        .env("SECRET_HOST", "hostsecretlower987")
        .output()
        .unwrap();
    assert_eq!(out.code(), 1, "{}", out.stderr());
    let said = (out.stdout() + &out.stderr()).to_ascii_lowercase();
    assert!(said.contains(" debug "), "not verbose: {said}");
    assert!(!said.contains("hostsecretlower987"), "{said}");
}

#[test]
fn an_inherit_list_on_an_http_job_or_with_a_bad_name_is_refused() {
    for (rest, expected) in [
        (
            "http = { url = \"http://127.0.0.1:9/\" }\ninherit = [\"PATH\"]",
            "`inherit` applies only to `command` and `shell` actions",
        ),
        (
            "command = [\"true\"]\ninherit = [\"A=B\"]",
            "`A=B` is not an environment variable name",
        ),
    ] {
        let ws = Workspace::new(&job("j", rest));
        let out = ws.run(&["check"]);
        assert_eq!(out.code(), 2, "{rest}: {}", out.stderr());
        assert!(out.stderr().contains(expected), "{}", out.stderr());
        assert!(out.stderr().contains("jobs.toml:"), "{}", out.stderr());
    }
}

#[test]
fn a_database_url_never_prints_its_password_whatever_its_form() {
    let ws = Workspace::new(&job("hdr", "command = [\"true\"]"));
    for url in [
        format!("postgres:/postgres:{DB_PASSWORD}@127.0.0.1/x"),
        format!("postgres:postgres:{DB_PASSWORD}@127.0.0.1/x"),
        format!("postgres:{DB_PASSWORD}@127.0.0.1/x"),
        format!("postgres//postgres:{DB_PASSWORD}@127.0.0.1/x"),
    ] {
        let out = ws.run(&["--database-url", &url, "history", "hdr"]);
        assert_eq!(out.code(), 2, "{url}: {}", out.stderr());
        assert!(out.stderr().contains("--database-url"), "{}", out.stderr());
        assert!(!out.stderr().contains(DB_PASSWORD), "{}", out.stderr());
    }
    // Built from a variable in jobs.toml, read by `check` and `status`.
    let ws = Workspace::new(&format!(
        "[scheduler]\ndatabase_url = \"postgres:/postgres:${{PGPW}}@127.0.0.1/x\"\n\n{}",
        job("hdr", "command = [\"true\"]")
    ));
    for args in [&["check"][..], &["status"]] {
        let out = ws.command(args).env("PGPW", DB_PASSWORD).output().unwrap();
        assert_eq!(out.code(), 2, "{args:?}: {}", out.stderr());
        assert!(out.stderr().contains("database_url"), "{}", out.stderr());
        assert!(!out.stderr().contains(DB_PASSWORD), "{}", out.stderr());
    }
}

/// A local HTTP server that answers one request with `body`.
fn answering(body: String) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let (stream, _) = listener.accept().unwrap();
        let mut reader = BufReader::new(stream.try_clone().unwrap());
        let mut length = 0;
        loop {
            let mut line = String::new();
            reader.read_line(&mut line).unwrap();
            if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                length = v.trim().parse().unwrap();
            }
            if line == "\r\n" || line.is_empty() {
                break;
            }
        }
        let mut request = vec![0; length];
        let _ = reader.read_exact(&mut request);
        let head = format!(
            "HTTP/1.1 200 OK\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        let mut stream = stream;
        let _ = stream.write_all(head.as_bytes());
        let _ = stream.write_all(body.as_bytes());
    });
    port
}

#[test]
fn a_secret_echoed_json_escaped_or_cut_at_the_body_limit_is_masked() {
    let quoted = "Quote\"Secret-88abc";
    let cut = "HdrSecretValue-4242";
    // The service echoes the first JSON-escaped; the second's start ends
    // the 4 KiB that are kept.
    let echoed = format!("{{\"token\":\"{}\"}}", quoted.replace('"', "\\\""));
    let padded = format!("{}{}", "x".repeat(4096 - 10), cut);
    let http = |name: &str, port: u16, var: &str| {
        job(
            name,
            &format!(
                "http = {{ url = \"http://127.0.0.1:{port}/\", headers = {{ X-Secret = \"${{{var}}}\" }} }}"
            ),
        )
    };
    let ws = Workspace::new(
        &(http("json", answering(echoed), "QUOTED") + &http("cut", answering(padded), "CUT")),
    );
    let db = TestDb::sqlite();
    for name in ["json", "cut"] {
        let out = ws
            .command(&[
                "--database-url",
                &db.url,
                "run",
                name,
                "--period",
                "2026-10",
            ])
            .env("QUOTED", quoted)
            .env("CUT", cut)
            .output()
            .unwrap();
        assert_eq!(out.code(), 0, "{}", out.stderr());
    }
    let history = ws.run(&["--database-url", &db.url, "history", "json", "--output"]);
    assert!(
        history.stdout().contains("\"token\":\"***\""),
        "{}",
        history.stdout()
    );
    assert!(
        !history.stdout().contains("Secret-88abc"),
        "{}",
        history.stdout()
    );
    let history = ws.run(&["--database-url", &db.url, "history", "cut", "--output"]);
    assert!(history.stdout().contains("xxx***"), "{}", history.stdout());
    assert!(
        !history.stdout().contains(&cut[..10]),
        "{}",
        history.stdout()
    );
}

/// `run` serves no API and runs only the jobs it names: an unset variable
/// behind an `[api]` token or another job does not keep a platform cron
/// container from running its job (issue 26, item 15); `serve` still
/// refuses the file, naming it.
#[test]
fn run_starts_without_the_api_tokens_variables_and_serve_names_the_missing_one() {
    let ws = with_secrets(&job("plain", "command = [\"true\"]"));
    let db = TestDb::sqlite();
    let args = [
        "--database-url",
        db.url.as_str(),
        "run",
        "plain",
        "--period",
        "2026-10",
    ];
    let out = ws
        .command(&args)
        .env("HTTP_SECRET", HTTP_SECRET)
        .output()
        .unwrap();
    assert_eq!(out.code(), 0, "{}", out.stderr());
    // Nor another job's (found by the new-user review): only the job it
    // runs needs its own.
    let other = [
        "--database-url",
        db.url.as_str(),
        "run",
        "plain",
        "--period",
        "2026-11",
    ];
    let out = ws.command(&other).output().unwrap();
    assert_eq!(out.code(), 0, "{}", out.stderr());
    let own = [
        "--database-url",
        db.url.as_str(),
        "run",
        "hook",
        "--period",
        "2026-11",
    ];
    let out = ws.command(&own).output().unwrap();
    assert_eq!(out.code(), 2, "{}", out.stderr());
    assert!(
        out.stderr().contains("`HTTP_SECRET` is not set"),
        "{}",
        out.stderr()
    );
    let all = ws
        .command(&["--database-url", &db.url, "run", "--all"])
        .env("CI_TOKEN", API_TOKEN)
        .output()
        .unwrap();
    assert_eq!(all.code(), 2, "{}", all.stderr());
    let serve = ws
        .command(&["--database-url", &db.url, "serve"])
        .env("HTTP_SECRET", HTTP_SECRET)
        .output()
        .unwrap();
    assert_eq!(serve.code(), 2, "{}", serve.stderr());
    assert!(
        serve.stderr().contains("`CI_TOKEN` is not set"),
        "{}",
        serve.stderr()
    );
}

/// A token ending in `aaaa…` and lines of 300,000 `A`s: no 64 KiB piece
/// of them in the log, and not the kept output, is masked (a piece's
/// start is no cut-off value), while the token itself, printed across a
/// piece's end, is masked whole.
#[test]
fn a_long_line_that_only_looks_like_a_values_end_is_logged_and_kept_unmasked() {
    let token = "tok_aaaaaaaaaaaaaaaa";
    let a = "head -c 300000 /dev/zero | tr '\\\\0' A";
    let ws = Workspace::new(&job(
        "long",
        &format!(
            "shell = \"{a}; echo; head -c 65530 /dev/zero | tr '\\\\0' z; printf %s \\\"$T\\\"; echo; {a}; exit 3\"\nenv = {{ T = \"${{T}}\" }}"
        ),
    ));
    let db = TestDb::sqlite();
    let out = ws
        .command(&[
            "--database-url",
            &db.url,
            "run",
            "long",
            "--period",
            "2026-07",
        ])
        .env("T", token)
        .output()
        .unwrap();
    assert_eq!(out.code(), 1, "{}", out.stderr());
    let log = out.stderr();
    let pieces: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("AAAAAAAAAAAAAAAA"))
        .collect();
    assert!(pieces.len() >= 8, "{} pieces", pieces.len());
    assert!(
        pieces.iter().all(|piece| !piece.contains("***")),
        "a piece of A's was masked"
    );
    assert!(!log.contains(token), "the token reached the log");
    assert!(log.contains("zzz***"), "the token across a piece's end");
    let history = ws
        .command(&[
            "--database-url",
            &db.url,
            "history",
            "long",
            "--json",
            "--output",
        ])
        .env("T", token)
        .output()
        .unwrap();
    let newest = history
        .stdout()
        .lines()
        .next()
        .unwrap_or_default()
        .to_owned();
    let said: serde_json::Value = serde_json::from_str(&newest).unwrap();
    let output = said["output"].as_str().unwrap_or_default();
    assert!(
        output.starts_with("AAAA") && !output.contains("***"),
        "{output}"
    );
}
