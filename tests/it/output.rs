//! Every attempt's whole output (issue 43): kept in the database within
//! `output_max`, its head and its tail, secrets masked, read and followed
//! by `scheduler logs` from any process.

use std::time::Duration;

use crate::support::{Said, TestDb, Workspace, count, eventually, wait};

/// A daily job called `name` doing `shell`, with `rest` added.
fn job(name: &str, shell: &str, rest: &str) -> String {
    format!(
        "[[job]]\nname = \"{name}\"\nschedule = \"0 4 * * *\"\nperiod = \"day\"\n\
         shell = '''{shell}'''\n{rest}\n\n"
    )
}

fn run(ws: &Workspace, db: &TestDb, args: &[&str]) -> std::process::Output {
    ws.command(args)
        .env("DATABASE_URL", &db.url)
        .output()
        .unwrap()
}

/// `db` with the scheduler's tables, for a test that reads them while a
/// run is under way.
fn migrated(ws: &Workspace, db: &TestDb) {
    let done = run(ws, db, &["migrate"]);
    assert_eq!(done.code(), 0, "{}", done.stderr());
}

#[test]
fn a_loud_job_keeps_its_head_and_tail_within_output_max_and_says_what_it_left_out() {
    for db in crate::support::databases() {
        // 2 MB of lines, then 1 MB with no newline at all.
        let ws = Workspace::new(&job(
            "loud",
            "seq 1 300000; head -c 1000000 /dev/zero | tr '\\0' x; echo; echo done >&2",
            "output_max = \"64KiB\"",
        ));
        let ran = run(&ws, &db, &["run", "loud", "--period", "2026-12-01"]);
        assert_eq!(ran.code(), 0, "{}", ran.stderr());
        let logs = run(&ws, &db, &["logs", "loud", "--period", "2026-12-01"]);
        assert_eq!(logs.code(), 0, "{}", logs.stderr());
        let out = logs.stdout();
        assert!(out.starts_with("1\n2\n3\n"), "the head: {}", &out[..40]);
        assert!(out.ends_with("xxxx\n"), "the tail");
        assert!(out.len() <= 64 * 1024, "{} bytes kept", out.len());
        let printed = (1..=300_000)
            .map(|n: u32| n.to_string().len() + 1)
            .sum::<usize>()
            + 1_000_001;
        let err = logs.stderr();
        let told = format!(
            "[… {} byte(s) past output_max left out …]",
            printed - out.len()
        );
        assert!(err.contains(&told), "{err}");
        assert!(err.trim_end().ends_with("done"), "{err}");
    }
}

#[test]
fn a_secret_printed_across_a_chunk_boundary_is_masked_in_the_kept_output() {
    for db in crate::support::databases() {
        // A 64 KiB piece ends inside the secret: it is cut there.
        let ws = Workspace::new(&job(
            "leaky",
            "head -c 65530 /dev/zero | tr '\\0' a; printf '%s\\n' \"$TOKEN\"; echo after",
            "env = { TOKEN = \"${LEAKY_TOKEN}\" }",
        ));
        let secret = "s3cr3t-Value-0123456789";
        let ran = ws
            .command(&["run", "leaky", "--period", "2026-12-01"])
            .env("DATABASE_URL", &db.url)
            .env("LEAKY_TOKEN", secret)
            .output()
            .unwrap();
        assert_eq!(ran.code(), 0, "{}", ran.stderr());
        let logs = ws
            .command(&["logs", "leaky", "--period", "2026-12-01"])
            .env("DATABASE_URL", &db.url)
            .env("LEAKY_TOKEN", secret)
            .output()
            .unwrap();
        let out = logs.stdout();
        assert!(out.ends_with("after\n"), "{}", &out[out.len() - 60..]);
        for part in [secret, &secret[..12], &secret[11..]] {
            assert!(!out.contains(part), "`{part}` is kept");
        }
        let stored = count(
            &db.url,
            "SELECT count(*) FROM scheduler_output WHERE text LIKE '%s3cr3t%' OR text LIKE '%0123456789%'",
        );
        assert_eq!(stored, 0, "a piece of the secret is in the database");
    }
}

#[test]
fn logs_of_a_period_or_attempt_that_does_not_exist_exits_2_naming_it() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&job("quiet", "echo hi", ""));
    migrated(&ws, &db);
    let none = run(&ws, &db, &["logs", "quiet", "--period", "2026-12-01"]);
    assert_eq!(none.code(), 2, "{}", none.stderr());
    assert!(
        none.stderr().contains("quiet:2026-12-01 has no attempt"),
        "{}",
        none.stderr()
    );
    assert_eq!(
        run(&ws, &db, &["run", "quiet", "--period", "2026-12-01"]).code(),
        0
    );
    let third = run(
        &ws,
        &db,
        &["logs", "quiet", "--period", "2026-12-01", "--attempt", "3"],
    );
    assert_eq!(third.code(), 2);
    assert!(
        third.stderr().contains("quiet:2026-12-01 has no attempt 3"),
        "{}",
        third.stderr()
    );
    let label = run(&ws, &db, &["logs", "quiet", "--period", "2026-13-01"]);
    assert_eq!(label.code(), 2, "{}", label.stderr());
    let first = run(
        &ws,
        &db,
        &["logs", "quiet", "--period", "2026-12-01", "--attempt", "1"],
    );
    assert_eq!((first.code(), first.stdout()), (0, "hi\n".to_string()));
}

#[test]
fn logs_follow_in_another_process_streams_a_running_attempt_and_exits_as_it_ended() {
    for db in crate::support::databases() {
        let ws = Workspace::new(&job(
            "slow",
            "for i in 1 2 3; do echo tick $i; sleep 1; done; test -e stop-failing",
            "",
        ));
        migrated(&ws, &db);
        let runner = ws
            .command(&["run", "slow", "--period", "2026-12-01"])
            .env("DATABASE_URL", &db.url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        eventually("the attempt to start", Duration::from_secs(30), || {
            count(&db.url, "SELECT count(*) FROM scheduler_attempts") > 0
        });
        let mut follower = ws
            .command(&["logs", "slow", "--period", "2026-12-01", "--follow"])
            .env("DATABASE_URL", &db.url)
            .stdout(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The first line arrives while the job still runs.
        let mut stdout = std::io::BufReader::new(follower.stdout.take().unwrap());
        let mut first = String::new();
        std::io::BufRead::read_line(&mut stdout, &mut first).unwrap();
        assert_eq!(first, "tick 1\n");
        assert_eq!(
            count(
                &db.url,
                "SELECT count(*) FROM scheduler_attempts WHERE outcome = 'running'"
            ),
            1,
            "the first line came before the attempt ended"
        );
        let mut rest = String::new();
        std::io::Read::read_to_string(&mut stdout, &mut rest).unwrap();
        let followed = wait(follower, Duration::from_secs(60));
        assert_eq!(rest, "tick 2\ntick 3\n");
        assert_eq!(followed.code(), 1, "the attempt failed: exit 1 as `run`");
        assert_eq!(wait(runner, Duration::from_secs(60)).code(), 1);
    }
}

#[test]
fn a_runner_killed_mid_output_leaves_what_it_wrote_readable() {
    for db in crate::support::databases() {
        let ws = Workspace::new(&job("dying", "echo before; sleep 60", ""));
        migrated(&ws, &db);
        let mut runner = ws
            .command(&["run", "dying", "--period", "2026-12-01"])
            .env("DATABASE_URL", &db.url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        eventually(
            "the first line to be written",
            Duration::from_secs(30),
            || count(&db.url, "SELECT count(*) FROM scheduler_output") > 0,
        );
        runner.kill().unwrap();
        let _ = runner.wait();
        let logs = run(&ws, &db, &["logs", "dying", "--period", "2026-12-01"]);
        assert_eq!(
            (logs.code(), logs.stdout()),
            (0, "before\n".to_string()),
            "{}",
            logs.stderr()
        );
    }
}

#[test]
fn keep_output_deletes_output_and_never_a_claim_and_prune_of_a_claim_takes_its_output() {
    for db in crate::support::databases() {
        let ws = Workspace::new(&job("kept", "echo hi", "keep_output = \"1s\""));
        assert_eq!(
            run(&ws, &db, &["run", "kept", "--period", "2026-12-01"]).code(),
            0
        );
        let output = "SELECT count(*) FROM scheduler_output";
        assert_eq!(count(&db.url, output), 1);
        std::thread::sleep(Duration::from_millis(1100));
        let pruned = run(&ws, &db, &["prune"]);
        assert_eq!(pruned.code(), 0, "{}", pruned.stderr());
        assert!(
            pruned
                .stdout()
                .contains("kept: pruned 1 chunk(s) of output"),
            "{}",
            pruned.stdout()
        );
        assert_eq!(count(&db.url, output), 0);
        assert_eq!(count(&db.url, "SELECT count(*) FROM scheduler_claims"), 1);
        assert_eq!(count(&db.url, "SELECT count(*) FROM scheduler_attempts"), 1);
    }
}

#[test]
fn output_max_and_keep_output_refuse_what_cannot_be_kept_with_their_place() {
    for (rest, said) in [
        (
            "output_max = \"4KiB\"",
            "`output_max` must be from 8 KiB to 1 GiB",
        ),
        ("output_max = \"lots\"", "`lots` is not a size"),
        (
            "keep = \"2d\"\nkeep_output = \"3d\"",
            "`keep_output` (3d) is longer than `keep` (2d)",
        ),
    ] {
        let ws = Workspace::new(&job("picky", "echo", rest));
        let checked = ws.run(&["check"]);
        assert_eq!(checked.code(), 2, "{rest}: {}", checked.stderr());
        assert!(
            checked.stderr().contains(said),
            "{rest}: {}",
            checked.stderr()
        );
        assert!(
            checked.stderr().contains("jobs.toml:"),
            "{}",
            checked.stderr()
        );
    }
}

/// The API reads the same output a page at a time, and follows a running
/// attempt as server-sent events from a replica that is not running it,
/// each line within a read or two of its writing, ending with the
/// attempt's outcome.
#[test]
fn the_api_pages_through_an_attempts_output_and_follows_a_running_one() {
    use std::io::BufRead;

    use crate::api::{READER, Server, with_api};

    for db in crate::support::databases() {
        let ws = Workspace::new(&with_api(&job(
            "slow",
            "for i in 1 2 3; do echo tick $i; sleep 1; done; exit 4",
            "",
        )));
        migrated(&ws, &db);
        let runner = ws
            .command(&["run", "slow", "--period", "2026-12-01"])
            .env("DATABASE_URL", &db.url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        eventually("the attempt to start", Duration::from_secs(30), || {
            count(&db.url, "SELECT count(*) FROM scheduler_output") > 0
        });
        let server = Server::start(&ws, &db.url);
        let path = "/v1/jobs/slow/periods/2026-12-01/attempts/1/output";
        let followed = reqwest::blocking::Client::new()
            .get(format!("{}{path}?follow=true", server.base()))
            .bearer_auth(READER)
            .send()
            .unwrap();
        assert_eq!(followed.status(), 200);
        let mut texts = String::new();
        let mut end = None;
        let mut event = String::new();
        let mut running_at_first = None;
        for line in std::io::BufReader::new(followed).lines() {
            let line = line.unwrap();
            if let Some(name) = line.strip_prefix("event: ") {
                event = name.to_owned();
            } else if let Some(data) = line.strip_prefix("data: ") {
                let data: serde_json::Value = serde_json::from_str(data).unwrap();
                if event == "output" {
                    running_at_first.get_or_insert_with(|| {
                        count(
                            &db.url,
                            "SELECT count(*) FROM scheduler_attempts WHERE outcome = 'running'",
                        )
                    });
                    for chunk in data.as_array().unwrap() {
                        texts.push_str(chunk["text"].as_str().unwrap());
                    }
                } else if event == "end" {
                    end = Some(data);
                    break;
                }
            }
        }
        assert_eq!(
            running_at_first,
            Some(1),
            "the first event came while it ran"
        );
        assert_eq!(texts, "tick 1\ntick 2\ntick 3\n");
        assert_eq!(end.expect("an end event")["outcome"], "failed");
        assert_eq!(wait(runner, Duration::from_secs(60)).code(), 1);
        let all: serde_json::Value = server.get(READER, path).json().unwrap();
        assert_eq!(all["done"], true, "{all}");
        let chunks = all["chunks"].as_array().unwrap();
        // A page of one after the first chunk: the second, and more to
        // come if there is a third (how the lines fell into chunks
        // depends on when they were written).
        if chunks.len() > 1 {
            let after = &chunks[0]["seq"];
            let page = server.get(READER, &format!("{path}?after={after}&limit=1"));
            assert_eq!(page.status(), 200);
            let page: serde_json::Value = page.json().unwrap();
            assert_eq!(page["chunks"].as_array().map(Vec::len), Some(1));
            assert_eq!(page["chunks"][0], chunks[1]);
            assert_eq!(page["done"], chunks.len() == 2, "{page}");
        }
        let none = server.get(READER, "/v1/jobs/slow/periods/2026-12-01/attempts/3/output");
        assert_eq!(none.status(), 404);
        assert_eq!(server.stop(), 0);
    }
}

/// A reader of the scheduler's log that stops reading (a stalled pipe, a
/// stuck log shipper) holds up no job, heartbeat or outcome: the log is
/// written on a thread of its own and what it falls behind by is dropped.
/// Before, the job's lines were written to stderr on the runtime's
/// threads, a full pipe stopped the heartbeats, and the job was fenced.
#[test]
fn a_log_reader_that_stops_reading_holds_up_no_run() {
    let db = TestDb::sqlite();
    let ws = Workspace::new(&format!(
        "[scheduler]\nlease = \"2s\"\n\n{}",
        job("loud", "seq -f line-%g 1 300000", "")
    ));
    let mut running = ws
        .command(&[
            "--database-url",
            &db.url,
            "run",
            "loud",
            "--period",
            "2026-12-01",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The pipe is never read: once its 64 KiB are full, every write waits.
    let _unread = running.stderr.take();
    let ran = wait(running, Duration::from_secs(120));
    assert_eq!(ran.status.code(), Some(0), "the run did not succeed");
    assert_eq!(
        count(
            &db.url,
            "SELECT count(*) FROM scheduler_attempts WHERE outcome = 'succeeded' AND attempt = 1"
        ),
        1
    );
}

/// New-user review: a follow of an attempt whose runner was killed went on
/// until a takeover, then exited 0. It ends once the runner's lease has
/// run out, with what was written, saying why, exit 1.
#[test]
fn a_follow_of_an_attempt_whose_runner_died_ends_when_its_lease_runs_out() {
    for db in crate::support::databases() {
        let ws = Workspace::new(&format!(
            "[scheduler]\nlease = \"2s\"\n\n{}",
            job(
                "slow",
                "for i in $(seq 1 300); do echo tick $i; sleep 0.2; done",
                ""
            )
        ));
        migrated(&ws, &db);
        let mut runner = ws
            .command(&["run", "slow", "--period", "2026-12-01"])
            .env("DATABASE_URL", &db.url)
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        eventually("its first lines written", Duration::from_secs(30), || {
            count(&db.url, "SELECT count(*) FROM scheduler_output") > 0
        });
        let follower = ws
            .command(&["logs", "slow", "--period", "2026-12-01", "--follow"])
            .env("DATABASE_URL", &db.url)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        // The runner and its job's whole tree go at once (its supervisor
        // ends the job when the runner dies).
        runner.kill().unwrap();
        runner.wait().unwrap();
        let followed = wait(follower, Duration::from_secs(60));
        assert_eq!(followed.code(), 1, "{}", followed.stderr());
        assert!(followed.stdout().starts_with("tick 1\n"));
        assert!(
            followed.stderr().contains("let its lease run out"),
            "{}",
            followed.stderr()
        );
    }
}

/// The API's follow of an attempt whose runner died ends once the
/// runner's lease has run out, its `end` event naming the runner gone.
#[test]
fn the_apis_follow_of_an_attempt_whose_runner_died_ends_naming_it() {
    use std::io::BufRead;

    use crate::api::{READER, Server, with_api};

    let db = TestDb::sqlite();
    let ws = Workspace::new(&with_api(&job(
        "slow",
        "for i in $(seq 1 300); do echo tick $i; sleep 0.2; done",
        "",
    )));
    migrated(&ws, &db);
    let mut runner = ws
        .command(&["run", "slow", "--period", "2026-12-01"])
        .env("DATABASE_URL", &db.url)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    eventually("its first lines written", Duration::from_secs(30), || {
        count(&db.url, "SELECT count(*) FROM scheduler_output") > 0
    });
    let server = Server::start(&ws, &db.url);
    runner.kill().unwrap();
    runner.wait().unwrap();
    let path = "/v1/jobs/slow/periods/2026-12-01/attempts/1/output?follow=true";
    let followed = reqwest::blocking::Client::new()
        .get(format!("{}{path}", server.base()))
        .bearer_auth(READER)
        .send()
        .unwrap();
    let mut event = String::new();
    let mut end = None;
    for line in std::io::BufReader::new(followed).lines() {
        let line = line.unwrap();
        if let Some(name) = line.strip_prefix("event: ") {
            event = name.to_owned();
        } else if let Some(data) = line.strip_prefix("data: ")
            && event == "end"
        {
            end = Some(serde_json::from_str::<serde_json::Value>(data).unwrap());
            break;
        }
    }
    let end = end.expect("an end event");
    assert_eq!(end["outcome"], "running", "{end}");
    assert!(end["runner_gone"]["owner"].is_string(), "{end}");
}

/// A NUL byte in a job's output lost the whole piece on PostgreSQL
/// (`text` refuses it): it is kept as U+FFFD on both databases.
#[test]
fn output_with_nul_bytes_is_kept_on_both_databases() {
    for db in crate::support::databases() {
        let ws = Workspace::new(&job("nul", "printf 'a\\000b\\n'; echo done", ""));
        let ran = run(&ws, &db, &["run", "nul", "--period", "2026-12-01"]);
        assert_eq!(ran.code(), 0, "{}", ran.stderr());
        assert!(
            !ran.stderr().contains("could not be written"),
            "{}",
            ran.stderr()
        );
        let logs = run(&ws, &db, &["logs", "nul", "--period", "2026-12-01"]);
        assert_eq!(logs.stdout(), "a\u{FFFD}b\ndone\n", "{}", db.url);
    }
}
