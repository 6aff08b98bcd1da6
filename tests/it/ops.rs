//! What an operator and a platform team touch: completions and the man
//! page, `migrate`'s report, `prune --dry-run`, `history --period
//! --output`, `run --json` fields, `health`, and the deployment files.

use std::process::Stdio;
use std::time::Duration;

use clap::Parser;
use scheduler::cli::Cli;

use crate::serve::stop;
use crate::support::{Said, TestDb, Workspace, eventually, http_get, listening_at, serve_log};

const BOUND: Duration = Duration::from_secs(60);

fn monthly(body: &str) -> String {
    format!(
        "[scheduler]\ncatch_up = \"1s\"\n\n[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\nkeep = \"1s\"\n{body}\n"
    )
}

#[test]
fn completions_and_the_man_page_come_from_the_real_command_line() {
    let ws = Workspace::new("");
    std::fs::remove_file(ws.path().join("jobs.toml")).unwrap();
    for shell in ["bash", "zsh", "fish"] {
        let out = ws.run(&["completions", shell]);
        assert_eq!(out.code(), 0, "{shell}: {}", out.stderr());
        for word in ["scheduler", "serve", "period", "dry-run"] {
            assert!(out.stdout().contains(word), "{shell}: no {word}");
        }
    }
    let bad = ws.run(&["completions", "tcsh"]);
    assert_eq!(bad.code(), 2);
    assert!(bad.stderr().contains("bash"), "{}", bad.stderr());
    let man = ws.run(&["man"]);
    assert_eq!(man.code(), 0);
    assert!(
        man.stdout().starts_with(".ie") || man.stdout().contains(".TH"),
        "{}",
        man.stdout()
    );
    assert!(man.stdout().contains("serve"));
    // One page: no pointers to per-command pages that nothing installs
    // (issue 26, item 15), and the exit codes and variables in it.
    for part in [
        ".SH COMMANDS",
        ".SH \"EXIT STATUS\"",
        ".SH ENVIRONMENT",
        "DATABASE_URL",
        "\\-\\-listen",
    ] {
        assert!(
            man.stdout().contains(part),
            "no {part} in:\n{}",
            man.stdout()
        );
    }
    assert!(
        !man.stdout().contains("scheduler\\-serve(1)"),
        "{}",
        man.stdout()
    );
    assert!(
        !man.stdout().contains("scheduler-serve(1)"),
        "{}",
        man.stdout()
    );
}

#[test]
fn migrate_says_what_it_applied_or_that_it_is_up_to_date() {
    for db in crate::support::databases() {
        let ws = Workspace::new(&monthly("command = [\"true\"]"));
        let first = ws.run(&["--database-url", &db.url, "migrate"]);
        assert_eq!(first.code(), 0, "{}", first.stderr());
        assert!(
            first.stdout().contains("applied 0001 claims"),
            "{}",
            first.stdout()
        );
        let again = ws.run(&["--database-url", &db.url, "migrate"]);
        assert_eq!(again.stdout().trim(), "up to date: no migration to apply");
    }
}

#[test]
fn prune_dry_run_counts_and_deletes_nothing_and_prune_says_when_there_is_nothing() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&monthly("command = [\"true\"]"));
    let run = ws.run(&[
        "--database-url",
        &db.url,
        "run",
        "billing",
        "--from",
        "2026-01",
        "--to",
        "2026-03",
    ]);
    assert_eq!(run.code(), 0, "{}", run.stderr());
    eventually("the claims older than `keep`", BOUND, || {
        crate::support::count(
            &db.url,
            &format!(
                "SELECT count(*) FROM scheduler_claims WHERE {}",
                crate::support::past_sql(&db.url, "finished_at", 1000)
            ),
        ) == 3
    });
    let dry = ws.run(&["--database-url", &db.url, "prune", "--dry-run"]);
    assert_eq!(dry.code(), 0, "{}", dry.stderr());
    assert!(
        dry.stdout()
            .contains("billing: would prune 3 finished claim(s)"),
        "{}",
        dry.stdout()
    );
    let real = ws.run(&["--database-url", &db.url, "prune"]);
    assert!(
        real.stdout().contains("billing: pruned 3"),
        "{}",
        real.stdout()
    );
    let none =
        Workspace::new("[[job]]\nname = \"a\"\nschedule = \"* * * * *\"\ncommand = [\"true\"]\n");
    let said = none.run(&["--database-url", &db.url, "prune"]);
    assert_eq!(said.code(), 0);
    assert!(
        said.stdout().contains("nothing to prune"),
        "{}",
        said.stdout()
    );
}

#[test]
fn history_selects_a_period_and_shows_its_output_and_run_json_has_fields() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&monthly(
        "shell = \"echo out of $SCHEDULER_PERIOD; [ $SCHEDULER_PERIOD != 2026-02 ] || exit 7\"",
    ));
    let run = ws.run(&[
        "--database-url",
        &db.url,
        "run",
        "billing",
        "--from",
        "2026-01",
        "--to",
        "2026-02",
        "--json",
    ]);
    assert_eq!(run.code(), 1, "{}", run.stderr());
    let lines: Vec<serde_json::Value> = run
        .stdout()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["status"], "succeeded");
    assert_eq!(lines[0]["exit_code"], 0, "{}", lines[0]);
    assert_eq!(lines[1]["status"], "failed");
    assert_eq!(lines[1]["exit_code"], 7, "{}", lines[1]);
    assert_eq!(lines[1]["trigger"], "manual");
    assert!(lines[1]["error"].is_string(), "{}", lines[1]);
    assert!(lines[1]["duration_ms"].is_u64(), "{}", lines[1]);
    let history = ws.run(&[
        "--database-url",
        &db.url,
        "history",
        "billing",
        "--period",
        "2026-02",
        "--output",
    ]);
    assert_eq!(history.code(), 0, "{}", history.stderr());
    assert!(
        history.stdout().contains("billing:2026-02"),
        "{}",
        history.stdout()
    );
    assert!(
        !history.stdout().contains("billing:2026-01"),
        "{}",
        history.stdout()
    );
    assert!(
        history.stdout().contains("| out of 2026-02"),
        "{}",
        history.stdout()
    );
    let bad = ws.run(&[
        "--database-url",
        &db.url,
        "history",
        "billing",
        "--period",
        "July",
    ]);
    assert_eq!(bad.code(), 2);
    assert!(bad.stderr().contains("--period"), "{}", bad.stderr());
}

#[test]
fn health_asks_a_running_server_and_says_when_none_answers() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&monthly("command = [\"true\"]"));
    // Port 1: privileged, never the kernel's pick for a test's listener.
    let nobody = ws.run(&["health", "--url", "http://127.0.0.1:1/healthz"]);
    assert_eq!(nobody.code(), 3, "{}", nobody.stderr());
    assert!(nobody.stderr().contains("no answer"), "{}", nobody.stderr());
    let server = ws
        .command(&[
            "--database-url",
            &db.url,
            "serve",
            "--listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::null())
        .stderr(serve_log(&ws))
        .spawn()
        .unwrap();
    let addr = listening_at(&ws.path().join("serve.log"), 0, BOUND);
    let url = format!("http://{addr}/healthz");
    eventually("/healthz", BOUND, || {
        http_get(&addr, "/healthz").starts_with("HTTP/1.1 200")
    });
    let healthy = ws.run(&["health", "--url", &url]);
    assert_eq!(healthy.code(), 0, "{}", healthy.stderr());
    assert!(
        healthy.stdout().starts_with("200 alive"),
        "{}",
        healthy.stdout()
    );
    let missing = ws.run(&["health", "--url", &format!("http://{addr}/nope")]);
    assert_eq!(missing.code(), 1);
    assert_eq!(stop(server), 0);
}

/// Every `command`/`args` pair of a manifest, as one argument list.
fn manifest_commands(text: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut command: Option<Vec<String>> = None;
    for line in text.lines().map(str::trim) {
        if let Some(list) = line.strip_prefix("command: ") {
            command = serde_json::from_str(list).ok();
        } else if let Some(list) = line.strip_prefix("args: ") {
            let args: Vec<String> = serde_json::from_str(list).expect("args as a JSON list");
            let mut full = command.take().expect("command before args");
            full.extend(args);
            found.push(full);
        }
    }
    found
}

#[test]
fn every_scheduler_command_line_of_the_deployment_files_parses_and_its_probes_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut lines: Vec<Vec<String>> = Vec::new();
    for file in [
        "deploy/kubernetes/deployment.yaml",
        "deploy/kubernetes/cronjob.yaml",
    ] {
        let text = std::fs::read_to_string(root.join(file)).unwrap();
        let found = manifest_commands(&text);
        assert!(!found.is_empty(), "{file}: no command");
        lines.extend(found);
    }
    let unit = std::fs::read_to_string(root.join("deploy/systemd/scheduler.service")).unwrap();
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    lines.push(exec.split_whitespace().map(str::to_owned).collect());
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    for instruction in ["HEALTHCHECK", "ENTRYPOINT"] {
        let json = dockerfile
            .lines()
            .skip_while(|l| !l.starts_with(instruction))
            .find_map(|l| {
                l.trim()
                    .strip_prefix("CMD ")
                    .or(l.strip_prefix("ENTRYPOINT "))
            })
            .expect(instruction);
        let mut args: Vec<String> = serde_json::from_str(json).unwrap();
        if instruction == "ENTRYPOINT" {
            let cmd = dockerfile
                .lines()
                .find_map(|l| l.strip_prefix("CMD "))
                .expect("CMD");
            args.extend(serde_json::from_str::<Vec<String>>(cmd).unwrap());
        }
        lines.push(args);
    }
    assert!(lines.len() >= 5, "{lines:?}");
    for line in &lines {
        assert!(line[0].ends_with("scheduler"), "{line:?}");
        if let Err(e) = Cli::try_parse_from(line) {
            panic!("{line:?} does not parse: {e}");
        }
    }
    let deployment =
        std::fs::read_to_string(root.join("deploy/kubernetes/deployment.yaml")).unwrap();
    let probes: Vec<&str> = deployment
        .lines()
        .filter_map(|l| l.trim().strip_prefix("path: "))
        .collect();
    assert_eq!(probes, ["/healthz", "/readyz"]);
    let db = TestDb::sqlite();
    let ws = Workspace::new(&monthly("command = [\"true\"]"));
    let server = ws
        .command(&[
            "--database-url",
            &db.url,
            "serve",
            "--listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::null())
        .stderr(serve_log(&ws))
        .spawn()
        .unwrap();
    let addr = listening_at(&ws.path().join("serve.log"), 0, BOUND);
    for probe in probes {
        eventually(probe, BOUND, || {
            http_get(&addr, probe).starts_with("HTTP/1.1 200")
        });
    }
    assert_eq!(stop(server), 0);
}

/// The `Dockerfile` builds the dependencies first, in a layer of their own,
/// from stand-in files for every target `Cargo.toml` names: cargo refuses a
/// manifest whose bench or binary has no file, so a target missing there
/// breaks the image build.
#[test]
fn the_dockerfile_stands_in_a_file_for_every_target_of_the_manifest() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let manifest: toml::Table =
        toml::from_str(&std::fs::read_to_string(root.join("Cargo.toml")).unwrap()).unwrap();
    let dockerfile = std::fs::read_to_string(root.join("Dockerfile")).unwrap();
    let benches = dockerfile
        .lines()
        .find_map(|l| l.trim().strip_prefix("&& for b in "))
        .and_then(|l| l.split_once(';'))
        .map(|(names, _)| names.split_whitespace().collect::<Vec<_>>())
        .expect("the Dockerfile's loop over the bench names");
    let targets = |kind: &str| manifest[kind].as_array().unwrap().clone();
    for bench in targets("bench") {
        let name = bench["name"].as_str().unwrap();
        assert!(
            benches.contains(&name),
            "bench {name} has no stand-in in the Dockerfile: {benches:?}"
        );
    }
    for bin in targets("bin") {
        let path = bin["path"].as_str().unwrap();
        assert!(
            dockerfile.contains(&format!("echo 'fn main() {{}}' > {path}")),
            "binary {path} has no stand-in in the Dockerfile"
        );
    }
}
/// `status` read only the five newest periods of a job: a failed period of
/// a backfill, older than those, showed FAILED `-`, and the period that
/// finished last was not LAST.
#[test]
fn status_shows_a_failed_period_older_than_the_newest_ones_and_the_period_that_finished_last() {
    for db in crate::support::databases() {
        let ws = Workspace::new(
            "[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\n\
             shell = \"test $SCHEDULER_PERIOD != 2025-01\"\nretry = { attempts = 3 }\n",
        );
        let run = |args: &[&str]| {
            let mut all = vec!["--database-url", db.url.as_str()];
            all.extend_from_slice(args);
            ws.run(&all)
        };
        let range = run(&["run", "billing", "--from", "2025-01", "--to", "2025-08"]);
        assert_eq!(range.code(), 1, "{}", range.stderr());
        let again = run(&["run", "billing", "--period", "2025-02", "--force"]);
        assert_eq!(again.code(), 0, "{}", again.stderr());
        let status = run(&["status", "billing", "--json"]);
        assert_eq!(status.code(), 0, "{}", status.stderr());
        let job: serde_json::Value = serde_json::from_str(status.stdout().trim()).unwrap();
        assert_eq!(job["failed"][0]["period_key"], "billing:2025-01", "{job}");
        assert_eq!(job["last"]["period_key"], "billing:2025-02", "{job}");
    }
}

#[test]
fn status_marks_paused_expired_exhausted_and_overdue_and_prints_a_range_grid() {
    for db in crate::support::databases() {
        let ws = Workspace::new(
            "[scheduler]\nlease = \"1s\"\n\n\
             [[job]]\nname = \"paused\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ncommand = [\"true\"]\n\n\
             [[job]]\nname = \"stuck\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\nshell = \"sleep 30\"\n\n\
             [[job]]\nname = \"freed\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\nshell = \"sleep 30\"\n\n\
             [[job]]\nname = \"broken\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\nshell = \"exit 4\"\nretry = { attempts = 1 }\n\n\
             [[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\n\n\
             [[job]]\nname = \"archive\"\nschedule = \"0 0 1 1 *\"\nperiod = \"year\"\ncommand = [\"true\"]\n",
        );
        let url = db.url.as_str();
        let ok = |args: &[&str]| {
            let mut all = vec!["--database-url", url];
            all.extend_from_slice(args);
            let out = ws.run(&all);
            assert!(out.code() <= 1, "{args:?}: {}", out.stderr());
        };
        ok(&["migrate"]);
        ok(&["pause", "paused"]);
        // Seen now (`run JOB` records a sighting, `pause` does not): tick's
        // fires from here on are overdue; archive's latest fire (1 January)
        // is older than catch_up, so nothing of it is owed.
        for job in ["tick", "archive"] {
            ok(&["run", job]);
        }
        ok(&["run", "broken", "--period", "2026-07"]);
        let mut stuck = ws
            .command(&["--database-url", url, "run", "stuck", "--period", "2026-07"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        eventually("stuck runs", BOUND, || {
            crate::support::count(
                url,
                "SELECT count(*) FROM scheduler_claims WHERE period_key = 'stuck:2026-07'",
            ) == 1
        });
        stuck.kill().unwrap();
        stuck.wait().unwrap();
        // Released by hand: its runner stops the job, lets the claim go
        // and ends.
        let freed = ws
            .command(&["--database-url", url, "run", "freed", "--period", "2026-07"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        eventually("freed runs", BOUND, || {
            crate::support::count(
                url,
                "SELECT count(*) FROM scheduler_claims WHERE period_key = 'freed:2026-07'",
            ) == 1
        });
        ok(&["release", "freed", "--period", "2026-07"]);
        crate::support::wait(freed, BOUND);
        // The stuck run's lease has run out, and a fire of tick has come
        // since it was seen.
        let tick_fired = format!(
            "SELECT count(*) FROM scheduler_claims WHERE job = 'tick' AND {}",
            crate::support::past_sql(url, "scheduled_at", 1000)
        );
        eventually("stuck's lease over, and tick's next fire", BOUND, || {
            crate::support::lease_over(url, "stuck:2026-07")
                && crate::support::count(url, &tick_fired) == 1
        });
        let text = ws.run(&["--database-url", url, "status"]);
        assert_eq!(text.code(), 0, "{}", text.stderr());
        let out = text.stdout();
        assert!(!out.contains('\u{1b}'), "escape codes in a pipe: {out}");
        assert!(
            out.lines()
                .all(|l| !l.starts_with(' ') && !l.ends_with(' ')),
            "padding around piped rows: {out:?}"
        );
        let line = |job: &str| {
            out.lines()
                .find(|l| l.trim_start().starts_with(&format!("{job} ")))
                .unwrap_or_else(|| panic!("no row for {job} in\n{out}"))
                .to_owned()
        };
        assert!(out.lines().next().unwrap().contains("OVERDUE"), "{out}");
        assert!(line("paused").contains("paused"), "{out}");
        assert!(
            line("stuck").contains("stuck:2026-07 lease expired"),
            "{out}"
        );
        assert!(
            line("freed").contains("freed:2026-07 released (")
                && !line("freed").contains("expired"),
            "{out}"
        );
        assert!(
            line("broken").contains("broken:2026-07: failed, no retry configured"),
            "{out}"
        );
        assert!(
            line("tick").contains(": tick:"),
            "tick shows nothing overdue: {out}"
        );
        assert!(
            line("archive").trim_end().ends_with(" -"),
            "archive overdue: {out}"
        );

        let json = ws.run(&["--database-url", url, "status", "--json"]);
        let jobs: Vec<serde_json::Value> = json
            .stdout()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let of = |name: &str| jobs.iter().find(|j| j["job"] == name).unwrap().clone();
        assert_eq!(of("paused")["paused"], true);
        assert!(of("paused")["next_fire"].is_null(), "{}", of("paused"));
        assert_eq!(
            of("stuck")["running"][0]["lease_expired"],
            true,
            "{}",
            of("stuck")
        );
        assert_eq!(
            of("broken")["failed"][0]["retries_exhausted"],
            true,
            "{}",
            of("broken")
        );
        assert!(!of("tick")["overdue"].as_array().unwrap().is_empty());
        assert_eq!(of("archive")["overdue"], serde_json::json!([]));
        assert!(!json.stdout().contains("Some("), "{}", json.stdout());

        ok(&["run", "paused", "--period", "2026-01"]);
        let grid = ws.run(&[
            "--database-url",
            url,
            "status",
            "paused",
            "--from",
            "2026-01",
            "--to",
            "2099-12",
        ]);
        assert_eq!(grid.code(), 0, "{}", grid.stderr());
        let printed = grid.stdout();
        let states: Vec<&str> = printed
            .lines()
            .map(|l| l.split("  ").nth(1).unwrap_or(""))
            .collect();
        assert_eq!(states.len(), 74 * 12, "{}", grid.stdout());
        assert_eq!(states[0], "succeeded", "{}", grid.stdout());
        // `pause` and a run by hand do not see a job: nobody owes its
        // months, and none of them is an alarm.
        assert_eq!(states[1], "before first seen", "{}", grid.stdout());
        assert_eq!(states.last(), Some(&"not due"), "{}", grid.stdout());
    }
}

#[test]
fn two_namespaces_on_one_database_run_the_same_job_and_period_independently() {
    for db in crate::support::databases() {
        let url = db.url.as_str();
        let space = |namespace: &str| {
            Workspace::new(&format!(
                "[scheduler]\nnamespace = \"{namespace}\"\n\n[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\nshell = \"echo {namespace} $SCHEDULER_PERIOD_KEY >> runs.txt\"\n"
            ))
        };
        let (staging, prod) = (space("staging"), space("prod"));
        for ws in [&staging, &prod] {
            let out = ws.run(&[
                "--database-url",
                url,
                "run",
                "billing",
                "--period",
                "2026-07",
            ]);
            assert_eq!(out.code(), 0, "{}", out.stderr());
            assert!(out.stdout().contains("succeeded"), "{}", out.stdout());
        }
        for (ws, namespace) in [(&staging, "staging"), (&prod, "prod")] {
            let ran = std::fs::read_to_string(ws.path().join("runs.txt")).unwrap();
            assert_eq!(ran, format!("{namespace} {namespace}/billing:2026-07\n"));
            let again = ws.run(&[
                "--database-url",
                url,
                "run",
                "billing",
                "--period",
                "2026-07",
            ]);
            assert!(
                again.stdout().contains("already succeeded"),
                "{}",
                again.stdout()
            );
            let history = ws.run(&["--database-url", url, "history", "billing"]);
            assert_eq!(history.stdout().lines().count(), 1, "{}", history.stdout());
            let status = ws.run(&["--database-url", url, "status", "--json"]);
            let value: serde_json::Value = serde_json::from_str(status.stdout().trim()).unwrap();
            assert_eq!(value["job"], format!("{namespace}/billing"));
        }
        assert_eq!(
            crate::support::count(url, "SELECT count(*) FROM scheduler_claims"),
            2
        );
        let bad = Workspace::new("[scheduler]\nnamespace = \"Prod/1\"\n");
        let out = bad.run(&["check"]);
        assert_eq!(out.code(), 2);
        assert!(
            out.stderr().contains("not a valid namespace"),
            "{}",
            out.stderr()
        );
    }
}

#[test]
fn a_changed_definition_between_two_attempts_shows_in_history() {
    for db in crate::support::databases() {
        let url = db.url.as_str();
        let ws = Workspace::new(&monthly("shell = \"echo one\""));
        let run = |ws: &Workspace| {
            let out = ws.run(&[
                "--database-url",
                url,
                "run",
                "billing",
                "--period",
                "2026-07",
                "--force",
            ]);
            assert_eq!(out.code(), 0, "{}", out.stderr());
        };
        run(&ws);
        run(&ws);
        std::fs::write(ws.path().join("jobs.toml"), monthly("shell = \"echo two\"")).unwrap();
        let rerun = ws.run(&[
            "--database-url",
            url,
            "run",
            "billing",
            "--period",
            "2026-07",
            "--force",
        ]);
        assert!(
            rerun
                .stdout()
                .contains("the job's definition changed since attempt 2"),
            "{}",
            rerun.stdout()
        );
        let json = ws.run(&["--database-url", url, "history", "billing", "--json"]);
        let attempts: Vec<serde_json::Value> = json
            .stdout()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let definitions: Vec<&str> = attempts
            .iter()
            .map(|a| a["definition"].as_str().expect("a definition"))
            .collect();
        assert_eq!(definitions.len(), 3, "{}", json.stdout());
        assert_ne!(definitions[0], definitions[1], "the change is not visible");
        assert_eq!(definitions[1], definitions[2]);
        let text = ws
            .run(&["--database-url", url, "history", "billing"])
            .stdout();
        let lines: Vec<&str> = text.lines().collect();
        assert!(lines[0].contains("definition changed"), "{text}");
        assert!(!lines[1].contains("definition changed"), "{text}");
    }
}

#[test]
fn logs_to_a_pipe_have_no_escapes_no_debug_text_and_v_shows_debug_lines() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&monthly(
        "shell = \"printf 'red \\\\033[31mtext\\\\033[0m\\\\n'\"",
    ));
    for format in ["text", "json"] {
        let out = ws.run(&[
            "--database-url",
            &db.url,
            "--log-format",
            format,
            "-v",
            "run",
            "billing",
            "--period",
            "2026-07",
            "--force",
        ]);
        assert_eq!(out.code(), 0, "{}", out.stderr());
        let log = out.stderr();
        assert!(
            !log.contains('\u{1b}'),
            "{format}: an escape code reached the log: {log:?}"
        );
        assert!(
            log.contains("\\x1b[31mtext"),
            "{format}: the job's output is not shown escaped: {log}"
        );
        assert!(
            !log.contains("Some("),
            "{format}: Debug text in the log: {log}"
        );
        assert!(
            log.contains("DEBUG") || log.contains("\"level\":\"DEBUG\""),
            "{format}: -v shows no debug line: {log}"
        );
    }
    let quiet = ws.run(&[
        "--database-url",
        &db.url,
        "run",
        "billing",
        "--period",
        "2026-07",
        "--force",
    ]);
    assert!(!quiet.stderr().contains("DEBUG"), "{}", quiet.stderr());
}

#[test]
fn a_manual_attempt_says_how_and_by_whom_it_was_asked_for() {
    for db in crate::support::databases() {
        let ws = Workspace::new(&monthly("command = [\"true\"]"));
        let run = |extra: &[&str]| {
            let mut args = vec![
                "--database-url",
                &db.url,
                "run",
                "billing",
                "--period",
                "2026-01",
            ];
            args.extend_from_slice(extra);
            let said = ws.run(&args);
            assert_eq!(said.code(), 0, "{}", said.stderr());
        };
        run(&[]);
        run(&["--force"]);
        let history = ws.run(&["--database-url", &db.url, "history", "billing"]);
        assert_eq!(history.code(), 0, "{}", history.stderr());
        let stdout = history.stdout();
        let lines: Vec<&str> = stdout.lines().collect();
        let attempt = |n: u32| {
            lines
                .iter()
                .find(|l| l.contains(&format!("attempt {n} ")))
                .unwrap_or_else(|| panic!("no attempt {n}: {lines:?}"))
                .to_string()
        };
        assert!(attempt(1).contains("  manual by cli:"), "{}", attempt(1));
        assert!(
            attempt(2).contains("  manual force by cli:"),
            "{}",
            attempt(2)
        );
    }
}

/// Releasing a period that is not running tells the script so (issue 26,
/// item 15: it exited 0 as if it had released something).
#[test]
fn release_of_a_period_that_is_not_running_exits_2_naming_it() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(
        "[[job]]\nname = \"billing\"\nschedule = \"0 2 1 * *\"\nperiod = \"month\"\ncovers = \"previous\"\ncommand = [\"true\"]\n",
    );
    let url = db.url.as_str();
    for period in ["2026-07", "2026-08"] {
        if period == "2026-08" {
            let ran = ws.run(&["--database-url", url, "run", "billing", "--period", period]);
            assert_eq!(ran.code(), 0, "{}", ran.stderr());
        } else {
            let migrated = ws.run(&["--database-url", url, "migrate"]);
            assert_eq!(migrated.code(), 0, "{}", migrated.stderr());
        }
        let out = ws.run(&[
            "--database-url",
            url,
            "release",
            "billing",
            "--period",
            period,
        ]);
        assert_eq!(out.code(), 2, "{period}: {}", out.stderr());
        assert!(
            out.stderr()
                .contains(&format!("billing:{period} has no running claim to release")),
            "{}",
            out.stderr()
        );
    }
}

/// A period of a job with a `deadline` that has not succeeded past it is
/// late, though nothing ever claimed it: `status` names it, its view says
/// `late`, and `next` says when each period would be. Without a deadline
/// nothing is late.
#[test]
fn a_period_past_its_deadline_that_never_ran_is_late_in_status_and_its_view() {
    let ws = Workspace::new(
        "[[job]]\nname = \"tick\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\ndeadline = \"1s\"\n\n\
         [[job]]\nname = \"free\"\nschedule = \"* * * * * *\"\ncommand = [\"true\"]\n",
    );
    let db = TestDb::sqlite();
    let url = db.url.as_str();
    // Seen (and its latest period run) now; nothing runs after.
    assert_eq!(ws.run(&["--database-url", url, "run", "--all"]).code(), 0);
    // Scenario time: the seconds whose periods go late while nothing runs.
    std::thread::sleep(Duration::from_millis(3500));
    let out = ws.run(&["--database-url", url, "status", "--json"]);
    assert_eq!(out.code(), 0, "{}", out.stderr());
    let mut late_key = None;
    for line in out.stdout().lines() {
        let job: serde_json::Value = serde_json::from_str(line).unwrap();
        let late = job["late"].as_array().unwrap();
        match job["job"].as_str().unwrap() {
            "tick" => {
                assert_eq!(job["deadline"], "1s", "{job}");
                assert!(late.len() >= 2, "{job}");
                late_key = late[0].as_str().map(str::to_owned);
            }
            _ => {
                assert!(job["deadline"].is_null() && late.is_empty(), "{job}");
            }
        }
    }
    let key = late_key.expect("a late period");
    let label = key.split_once(':').unwrap().1;
    let view = ws.run(&[
        "--database-url",
        url,
        "status",
        "tick",
        "--from",
        label,
        "--to",
        label,
    ]);
    // Its state, due, with the mark late beside it (docs/commands.md).
    let line = view.stdout();
    assert!(
        line.starts_with(&format!("{key}  due "))
            && line.contains("never run")
            && line.trim_end().ends_with("  late"),
        "{line}"
    );
    let table = ws.run(&["--database-url", url, "status", "tick"]);
    assert!(table.stdout().contains("late ("), "{}", table.stdout());
    let next = ws.run(&["next", "tick", "-n", "1"]);
    assert!(next.stdout().contains("late after"), "{}", next.stdout());
    let next = ws.run(&["next", "free", "-n", "1"]);
    assert!(!next.stdout().contains("late after"), "{}", next.stdout());
}
