//! `command` and `shell` actions: a job under its own supervisor (see
//! [`supervisor`](super::supervisor)) so that no process of its tree
//! outlives the scheduler or its claim, its output logged line by line and
//! its tail kept.

use std::future::Future;
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::process::{Child, Command};
use tokio::sync::watch;
use tokio::time::Instant;

use super::execute::ActionResult;
use super::{OUTPUT_TAIL, Run, Stop, supervisor};
use crate::config::Program;
use crate::engine::heartbeat::Heartbeats;
use crate::template::Template;

/// How long a group gets between SIGTERM and SIGKILL.
const TERM_WAIT: Duration = Duration::from_secs(5);

/// How long a supervisor gets to end its tree before it is killed itself.
const SUPERVISOR_WAIT: Duration = Duration::from_secs(5);

/// How a job's supervisor is started and kept informed.
pub(super) struct Spawn<'a> {
    /// How to start the supervisor.
    pub supervisor: &'a supervisor::Launcher,
    /// The claim's fence deadline, moved on by every renewal.
    pub fence_at: watch::Receiver<Instant>,
    /// The heartbeats: the supervisor stops the job by itself half an
    /// interval after the runner's own fence (when the runner cannot:
    /// frozen, or dead), the interval in force when each deadline is sent
    /// (a reload may shorten it).
    pub heartbeats: &'a Heartbeats,
}

/// Starts the job under its supervisor, waits for it, a timeout or `stop`,
/// and reports.
pub(super) async fn run(
    program: &Program,
    workdir: Option<&Template>,
    env: &[(String, Template)],
    run: &Run<'_>,
    spawn: Spawn<'_>,
    stop: impl Future<Output = Stop>,
) -> ActionResult {
    let mut fence_at = spawn.fence_at;
    let heartbeats = spawn.heartbeats;
    let left_ms = move |at: Instant| {
        (at.saturating_duration_since(Instant::now()) + heartbeats.interval() / 2).as_millis()
    };
    let mut command = Command::new(&spawn.supervisor.program);
    command
        .arg0("scheduler-supervise")
        .args(&spawn.supervisor.lead)
        .arg(left_ms(*fence_at.borrow_and_update()).to_string())
        .arg("--");
    match program {
        Program::Command(argv) => {
            command.args(argv.iter().map(|a| a.render(run)));
        }
        Program::Shell(script) => {
            command.arg("/bin/sh").arg("-c").arg(script.render(run));
        }
    }
    if let Some(dir) = workdir {
        command.current_dir(dir.render(run));
    }
    // No `pre_exec`: the supervisor starts on the `posix_spawn` path, as
    // cheap in a large process as in a small one.
    command
        .envs(env.iter().map(|(k, v)| (k, v.render(run))))
        .envs(run.environment())
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0);
    let mut child = match crate::engine::reaper::spawn_job(|| command.spawn(), Child::id) {
        Ok(child) => child,
        Err(e) => {
            return ActionResult::failed(format!("cannot start the job: {e}"));
        }
    };
    let supervisor = child.id().map(|id| Pid::from_raw(id as i32));
    let tail = Arc::new(Mutex::new(Vec::new()));
    let readers = [
        child
            .stdout
            .take()
            .map(|s| forward(s, "stdout", run.key.to_string(), tail.clone())),
        child
            .stderr
            .take()
            .map(|s| forward(s, "stderr", run.key.to_string(), tail.clone())),
    ];
    // Every renewal moves the supervisor's own deadline on; closing this
    // pipe (this process's death included) makes it end the job's tree.
    let mut deadlines = child.stdin.take();
    let feed = async {
        while fence_at.changed().await.is_ok() {
            let line = format!("{}\n", left_ms(*fence_at.borrow_and_update()));
            if let Some(pipe) = deadlines.as_mut()
                && pipe.write_all(line.as_bytes()).await.is_err()
            {
                deadlines = None;
            }
        }
        std::future::pending::<()>().await;
    };

    let timeout = async {
        match run.job.timeout {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    let mut supervisor_signaled = true;
    let mut result = tokio::select! {
        status = child.wait() => match status {
            Ok(status) => {
                supervisor_signaled = status.signal().is_some();
                status_result(status)
            }
            Err(e) => ActionResult::failed(format!("cannot wait for the job: {e}")),
        },
        () = timeout => {
            terminate(&mut child, supervisor).await;
            let limit = run.job.timeout.unwrap_or_default();
            ActionResult::failed(format!("timed out after {}", humantime::format_duration(limit)))
        }
        why = stop => {
            match why {
                Stop::Lost => end_tree(&mut child, supervisor).await,
                Stop::Shutdown => terminate(&mut child, supervisor).await,
            }
            ActionResult::Stopped(why)
        }
        () = feed => unreachable!("feeding deadlines never ends"),
    };
    if let Some(pid) = supervisor {
        crate::engine::reaper::forget_job(pid.as_raw() as u32);
    }
    // A supervisor that died of a signal may have been killed itself, with
    // its job's tree still running, now re-parented to this process.
    if supervisor_signaled {
        crate::engine::reaper::sweep().await;
    }
    // The supervisor has ended the whole tree, so the pipes close.
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
        (Some(0), _) => {
            let mut result = ActionResult::succeeded();
            result.set_exit_code(0);
            result
        }
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

/// Has the supervisor kill the whole tree now; kills the supervisor too
/// if it does not end within [`SUPERVISOR_WAIT`].
async fn end_tree(child: &mut Child, supervisor: Option<Pid>) {
    if let Some(pid) = supervisor {
        let _ = kill(pid, Signal::SIGUSR1);
    }
    if tokio::time::timeout(SUPERVISOR_WAIT, child.wait())
        .await
        .is_err()
    {
        let _ = child.start_kill();
        let _ = child.wait().await;
    }
}

/// SIGTERM to the job's group (through its supervisor), then the whole
/// tree killed if the job is still there after [`TERM_WAIT`].
async fn terminate(child: &mut Child, supervisor: Option<Pid>) {
    if let Some(pid) = supervisor {
        let _ = kill(pid, Signal::SIGTERM);
    }
    if tokio::time::timeout(TERM_WAIT, child.wait()).await.is_err() {
        end_tree(child, supervisor).await;
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
    // Control characters (a job's colours, a carriage return) are escaped:
    // a log line never moves the terminal's cursor or forges another line.
    let shown = crate::error::printable(text.trim_end());
    tracing::info!(target: "job", period_key = %key, stream = name, "{shown}");
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
