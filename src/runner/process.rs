//! `command` and `shell` actions: a child in its own process group that dies
//! with the scheduler, its output logged line by line and its tail kept.

use std::future::Future;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, BufReader};
use tokio::process::{Child, Command};

use super::{ActionResult, OUTPUT_TAIL, Run, Stop};
use crate::config::Program;
use crate::template::Template;

/// How long a group gets between SIGTERM and SIGKILL.
const TERM_WAIT: Duration = Duration::from_secs(5);

/// Starts the child, waits for it, a timeout or `stop`, and reports.
pub(super) async fn run(
    program: &Program,
    workdir: Option<&Template>,
    env: &[(String, Template)],
    run: &Run<'_>,
    stop: impl Future<Output = Stop>,
) -> ActionResult {
    let mut command = match program {
        Program::Command(argv) => {
            let mut argv = argv.iter().map(|a| a.render(run));
            let mut command = Command::new(argv.next().unwrap_or_default());
            command.args(argv);
            command
        }
        Program::Shell(script) => {
            let mut command = Command::new("/bin/sh");
            command.arg("-c").arg(script.render(run));
            command
        }
    };
    if let Some(dir) = workdir {
        command.current_dir(dir.render(run));
    }
    command
        .envs(env.iter().map(|(k, v)| (k, v.render(run))))
        .envs(run.environment())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let parent = std::process::id();
    // SAFETY: the closure runs in the forked child before exec and makes
    // only async-signal-safe system calls (prctl, getppid).
    unsafe {
        command.pre_exec(move || {
            // A job never outlives its scheduler, even one killed by SIGKILL.
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            if nix::unistd::getppid().as_raw() as u32 != parent {
                // The scheduler died between fork and prctl.
                return Err(std::io::Error::other("the scheduler exited"));
            }
            Ok(())
        });
    }
    let mut child = match crate::reaper::spawn_job(|| command.spawn(), Child::id) {
        Ok(child) => child,
        Err(e) => {
            return ActionResult::failed(format!("cannot start the job: {e}"));
        }
    };
    let group = child.id().map(|id| Pid::from_raw(id as i32));
    let tail = Arc::new(Mutex::new(Vec::new()));
    let readers = [
        child
            .stdout
            .take()
            .map(|s| forward(s, "stdout", run.key.to_owned(), tail.clone())),
        child
            .stderr
            .take()
            .map(|s| forward(s, "stderr", run.key.to_owned(), tail.clone())),
    ];

    let timeout = async {
        match run.job.timeout {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    let mut result = tokio::select! {
        status = child.wait() => match status {
            Ok(status) => status_result(status),
            Err(e) => ActionResult::failed(format!("cannot wait for the job: {e}")),
        },
        () = timeout => {
            terminate(&mut child, group).await;
            let limit = run.job.timeout.unwrap_or_default();
            ActionResult::failed(format!("timed out after {}", humantime::format_duration(limit)))
        }
        why = stop => {
            match why {
                Stop::Lost => kill(group),
                Stop::Shutdown => terminate(&mut child, group).await,
            }
            let _ = child.wait().await;
            ActionResult::Stopped(why)
        }
    };
    // The group ends with its leader: stragglers would hold the pipes open.
    kill(group);
    if let Some(pid) = group {
        crate::reaper::forget_job(pid.as_raw() as u32);
    }
    for reader in readers.into_iter().flatten() {
        let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
    }
    if let ActionResult::Done(finish, _) = &mut result {
        let tail = tail.lock().map(|t| t.clone()).unwrap_or_default();
        finish.output = Some(String::from_utf8_lossy(&tail).into_owned());
    }
    result
}

fn status_result(status: std::process::ExitStatus) -> ActionResult {
    match (status.code(), status.signal()) {
        (Some(0), _) => ActionResult::succeeded(),
        (Some(code), _) => {
            let mut result = ActionResult::failed(format!("exited with status {code}"));
            result.set_exit_code(code);
            result
        }
        (None, Some(signal)) => {
            let name =
                Signal::try_from(signal).map_or_else(|_| signal.to_string(), |s| s.to_string());
            ActionResult::failed(format!("killed by {name}"))
        }
        (None, None) => ActionResult::failed("ended without a status".into()),
    }
}

fn kill(group: Option<Pid>) {
    if let Some(group) = group {
        let _ = killpg(group, Signal::SIGKILL);
    }
}

/// SIGTERM to the group, then SIGKILL if the leader is still there after
/// [`TERM_WAIT`].
async fn terminate(child: &mut Child, group: Option<Pid>) {
    if let Some(group) = group {
        let _ = killpg(group, Signal::SIGTERM);
    }
    if tokio::time::timeout(TERM_WAIT, child.wait()).await.is_err() {
        kill(group);
        let _ = child.wait().await;
    }
}

/// Output lines longer than this are logged in pieces of this size.
const LINE_LIMIT: usize = 64 * 1024;

/// Logs each line of `stream` tagged with the period key, split every
/// [`LINE_LIMIT`] bytes, and keeps the last [`OUTPUT_TAIL`] bytes of all
/// output in `tail`; memory stays bounded whatever the job writes.
fn forward(
    stream: impl AsyncRead + Unpin + Send + 'static,
    name: &'static str,
    key: String,
    tail: Arc<Mutex<Vec<u8>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut reader = BufReader::with_capacity(LINE_LIMIT, stream);
        let mut line: Vec<u8> = Vec::with_capacity(LINE_LIMIT);
        loop {
            let (used, ended) = match reader.fill_buf().await {
                Ok([]) | Err(_) => break,
                Ok(buffer) => {
                    let room = LINE_LIMIT - line.len();
                    match buffer.iter().take(room).position(|b| *b == b'\n') {
                        Some(i) => {
                            line.extend_from_slice(&buffer[..=i]);
                            (i + 1, true)
                        }
                        None => {
                            let n = buffer.len().min(room);
                            line.extend_from_slice(&buffer[..n]);
                            (n, line.len() >= LINE_LIMIT)
                        }
                    }
                }
            };
            reader.consume(used);
            keep_tail(&tail, &line[line.len() - used..]);
            if ended {
                let carry = emit(&mut line, name, &key);
                line.clear();
                line.extend_from_slice(&carry);
            }
        }
        if !line.is_empty() {
            let carry = emit(&mut line, name, &key);
            if !carry.is_empty() {
                log_line(&carry, name, &key);
            }
        }
    })
}

/// Logs `line`, except for an unfinished UTF-8 character at its end (a
/// piece cut at the limit), which is returned to start the next piece.
fn emit(line: &mut Vec<u8>, name: &'static str, key: &str) -> Vec<u8> {
    let carry = match std::str::from_utf8(line) {
        Err(e) if e.error_len().is_none() => line.split_off(e.valid_up_to()),
        _ => Vec::new(),
    };
    log_line(line, name, key);
    carry
}

fn log_line(line: &[u8], name: &'static str, key: &str) {
    let text = String::from_utf8_lossy(line);
    tracing::info!(target: "job", period_key = %key, stream = name, "{}", text.trim_end());
}

fn keep_tail(tail: &Mutex<Vec<u8>>, bytes: &[u8]) {
    if let Ok(mut tail) = tail.lock() {
        tail.extend_from_slice(bytes);
        if tail.len() > OUTPUT_TAIL {
            let cut = tail.len() - OUTPUT_TAIL;
            tail.drain(..cut);
        }
    }
}
