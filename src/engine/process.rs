//! `command` and `shell` actions: a job under its own supervisor (see
//! [`supervisor`](super::supervision::supervisor)) so that no process of its tree
//! outlives the scheduler or its claim, its output logged line by line,
//! kept whole (within `output_max`, see [`output`](super::output)) and its
//! tail kept with the attempt.

use std::ffi::OsString;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWriteExt, BufReader};
use tokio::net::unix::pipe;
use tokio::sync::watch;
use tokio::time::Instant;

use super::action::ActionResult;
use super::output::{self, Pen, Recorder};
use super::supervision::{self, Ended, Spec, StatusPipe};
use super::{OUTPUT_TAIL, Run, Stop};
use crate::config::{ProcessAction, Program};
use crate::engine::heartbeat::Heartbeats;
use crate::state::Stream;
use crate::store::Store;
use crate::template::Secrets;

/// How long a group gets between SIGTERM and SIGKILL.
const TERM_WAIT: Duration = Duration::from_secs(5);

/// How long a supervisor gets to end its tree before it is killed itself.
const SUPERVISOR_WAIT: Duration = Duration::from_secs(5);

/// The least a supervisor gets to end the tree of a job whose claim is
/// lost, however little of the lease is left: it takes a millisecond or
/// two when it runs.
const LOST_WAIT_LEAST: Duration = Duration::from_millis(100);

/// How a job's supervisor is started and kept informed.
pub(super) struct Spawn<'a> {
    /// How to start the supervisor.
    pub supervisor: &'a supervision::Launcher,
    /// The claim's fence deadline, moved on by every renewal.
    pub fence_at: watch::Receiver<Instant>,
    /// The heartbeats: the supervisor stops the job by itself half an
    /// interval after the runner's own fence (when the runner cannot:
    /// frozen, or dead), the interval in force when each deadline is sent
    /// (a reload may shorten it).
    pub heartbeats: &'a Heartbeats,
    /// Where the job's whole output is kept.
    pub store: &'a Store,
}

/// Starts the job under its supervisor, waits for it, a timeout or `stop`,
/// and reports.
pub(super) async fn run_supervised(
    action: &ProcessAction,
    run: &Run<'_>,
    spawn: Spawn<'_>,
    stop: impl Future<Output = Stop>,
) -> ActionResult {
    let mut fence_at = spawn.fence_at;
    let heartbeats = spawn.heartbeats;
    let left_ms = move |at: Instant| {
        (at.saturating_duration_since(Instant::now()) + heartbeats.interval() / 2).as_millis()
    };
    let fence_ms = u64::try_from(left_ms(*fence_at.borrow_and_update())).unwrap_or(u64::MAX);
    let spec = spec_of(action, run, fence_ms);
    let started = match spawn.supervisor.start(&spec).await {
        Ok(started) => started,
        Err(e) => return ActionResult::failed(format!("cannot start the job: {e}")),
    };
    let tail = Arc::new(Mutex::new(Tail::default()));
    let (recorder, readers) = read(started.stdout, started.stderr, run, spawn.store, &tail);
    let mut status = started.status;
    // Every renewal moves the supervisor's own deadline on; closing this
    // pipe (this process's death included) makes it end the job's tree.
    let mut control = Some(started.control);
    let feed = async {
        while fence_at.changed().await.is_ok() {
            let line = left_ms(*fence_at.borrow_and_update()).to_string();
            say(&mut control, &line).await;
        }
        std::future::pending::<()>().await;
    };

    let timeout = async {
        match run.job.policy.timeout {
            Some(limit) => tokio::time::sleep(limit).await,
            None => std::future::pending().await,
        }
    };
    let mut result = tokio::select! {
        ended = status.ended() => ended_result(ended),
        () = timeout => {
            terminate(&mut control, &mut status).await;
            let limit = run.job.policy.timeout.unwrap_or_default();
            ActionResult::failed(format!("timed out after {}", humantime::format_duration(limit)))
        }
        why = stop => {
            match why {
                Stop::Lost => {
                    // The lease ends an interval after the fence: a
                    // supervisor that has not ended the tree by a quarter of
                    // it (it is stopped, say) is killed, and the job's
                    // process with it, well before another runner may start.
                    let lease_left = (*fence_at.borrow() + heartbeats.interval() / 4)
                        .saturating_duration_since(Instant::now());
                    let wait = lease_left.clamp(LOST_WAIT_LEAST, SUPERVISOR_WAIT);
                    end_tree(&mut control, &mut status, wait).await;
                }
                Stop::Shutdown => terminate(&mut control, &mut status).await,
            }
            ActionResult::Stopped(why, None)
        }
        () = feed => unreachable!("feeding deadlines never ends"),
    };
    let output = finish(&mut status, spawn.supervisor, readers, &tail, run).await;
    recorder.finish().await;
    match &mut result {
        ActionResult::Done(finish, _) => finish.output = Some(output),
        ActionResult::Stopped(_, kept) => *kept = Some(output),
    }
    result
}

/// Starts reading the job's two streams: each line logged, its output
/// kept whole by the recorder, and its tail in `tail`.
fn read(
    stdout: pipe::Receiver,
    stderr: pipe::Receiver,
    run: &Run<'_>,
    store: &Store,
    tail: &Arc<Mutex<Tail>>,
) -> (Recorder, [tokio::task::JoinHandle<()>; 2]) {
    let recorder = Recorder::start(output::Attempt {
        store: store.clone(),
        key: run.key.to_string(),
        attempt: run.lease.attempt,
        job: run.job.name.to_string(),
        output_max: run.job.policy.output_max,
    });
    let readers = [
        forward(
            stdout,
            Tag::of(run, Stream::Stdout, &recorder),
            tail.clone(),
        ),
        forward(
            stderr,
            Tag::of(run, Stream::Stderr, &recorder),
            tail.clone(),
        ),
    ];
    (recorder, readers)
}

/// After the job ended or was stopped: sweeps a tree its vanished
/// supervisor may have left, waits for the output to close and gives its
/// tail, secrets masked.
async fn finish(
    status: &mut StatusPipe,
    supervisor: &super::supervision::Launcher,
    readers: [tokio::task::JoinHandle<()>; 2],
    tail: &Mutex<Tail>,
    run: &Run<'_>,
) -> String {
    // A supervisor that ended without saying how may have been killed
    // itself, with its job's tree still running: swept before the period
    // can run again.
    let ended = tokio::time::timeout(SUPERVISOR_WAIT, status.ended()).await;
    if ended.unwrap_or(Ended::Vanished) == Ended::Vanished {
        supervisor.sweep().await;
    }
    // The supervisor has ended the whole tree, so the pipes close.
    for reader in readers {
        let _ = tokio::time::timeout(Duration::from_secs(2), reader).await;
    }
    let tail = tail.lock().map(|t| t.clone()).unwrap_or_default();
    let text = String::from_utf8_lossy(&tail.bytes);
    run.job
        .secrets
        .mask_cut(&String::from_utf8_lossy(&tail.before), &text, false)
}

/// What the supervisor is told to start: the program and its arguments,
/// its whole environment and its directory, rendered for `run`.
fn spec_of(action: &ProcessAction, run: &Run<'_>, fence_ms: u64) -> Spec {
    let (program, args): (OsString, Vec<OsString>) = match &action.program {
        Program::Command(argv) => {
            let mut argv = argv.iter().map(|a| OsString::from(a.render(run)));
            (argv.next().unwrap_or_default(), argv.collect())
        }
        Program::Shell(script) => (
            "/bin/sh".into(),
            vec!["-c".into(), script.render(run).into()],
        ),
    };
    Spec {
        fence_ms,
        program,
        args,
        // The whole environment: what it inherits of the scheduler's (never
        // the scheduler's own secrets, unless it names them), its own, then
        // the scheduler's variables.
        env: action
            .inherit
            .variables()
            .chain(
                action
                    .env
                    .iter()
                    .map(|(k, v)| (k.into(), v.render(run).into())),
            )
            .chain(
                run.environment()
                    .into_iter()
                    .map(|(k, v)| (k.into(), v.into())),
            )
            .collect(),
        workdir: action.workdir.as_ref().map(|dir| dir.render(run).into()),
    }
}

fn ended_result(ended: Ended) -> ActionResult {
    match ended {
        Ended::Exited(0) => {
            let mut result = ActionResult::succeeded();
            result.set_exit_code(0);
            result
        }
        Ended::Exited(code) => {
            let mut result = ActionResult::failed(format!("exited with status {code}"));
            result.set_exit_code(code);
            result
        }
        Ended::Signaled(signal) => {
            let name =
                Signal::try_from(signal).map_or_else(|_| signal.to_string(), |s| s.to_string());
            ActionResult::failed(format!("killed by {name}"))
        }
        Ended::Vanished => {
            ActionResult::failed("the job's supervisor ended without a status (killed?)".into())
        }
    }
}

/// Writes a line to the supervisor's control pipe; a pipe that cannot be
/// written (the supervisor is gone), or not within a second (it is stopped
/// and the pipe is full), is closed.
async fn say(control: &mut Option<pipe::Sender>, line: &str) {
    if let Some(pipe) = control.as_mut() {
        let written = tokio::time::timeout(
            Duration::from_secs(1),
            pipe.write_all(format!("{line}\n").as_bytes()),
        )
        .await;
        if !matches!(written, Ok(Ok(()))) {
            *control = None;
        }
    }
}

/// Has the supervisor kill the whole tree now; closes its control pipe
/// (which does the same) and kills the supervisor itself if it has not
/// ended within `wait` (it was stopped, say): the job's own process dies
/// with it, and what it started is swept by the zygote.
async fn end_tree(control: &mut Option<pipe::Sender>, status: &mut StatusPipe, wait: Duration) {
    say(control, "kill").await;
    if tokio::time::timeout(wait, status.ended()).await.is_err() {
        *control = None;
        status.kill();
        let _ = tokio::time::timeout(SUPERVISOR_WAIT, status.ended()).await;
    }
}

/// SIGTERM to the job's group (through its supervisor), then the whole
/// tree killed if the job is still there after [`TERM_WAIT`].
async fn terminate(control: &mut Option<pipe::Sender>, status: &mut StatusPipe) {
    say(control, "term").await;
    if tokio::time::timeout(TERM_WAIT, status.ended())
        .await
        .is_err()
    {
        end_tree(control, status, SUPERVISOR_WAIT).await;
    }
}

/// Output lines longer than this are logged in pieces of this size.
const LINE_LIMIT: usize = 64 * 1024;

/// Logs each line of `stream` tagged with the period key, split every
/// [`LINE_LIMIT`] bytes, and keeps the last [`OUTPUT_TAIL`] bytes of all
/// output in `tail`; memory stays bounded whatever the job writes.
fn forward(
    stream: impl AsyncRead + Unpin + Send + 'static,
    tag: Tag,
    tail: Arc<Mutex<Tail>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut reader = BufReader::with_capacity(LINE_LIMIT, stream);
        let mut line: Vec<u8> = Vec::with_capacity(LINE_LIMIT);
        // The end of the piece before, when the one being read goes on
        // from it (cut at the limit): a value across the cut is found.
        let mut before: Vec<u8> = Vec::new();
        loop {
            // A buffer of many short lines is read without a wait: each
            // line counts against the task's budget, so the loop gives way
            // to the heartbeats (on `run`'s one thread too) rather than
            // logging thousands of lines in one go.
            tokio::task::consume_budget().await;
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
            keep_tail(&tail, &line[line.len() - used..], tag.secrets.look_back());
            if ended {
                let cut = !line.ends_with(b"\n");
                let carry = emit(&mut line, &tag, &before, cut);
                before = match cut {
                    true => last(&line, tag.secrets.look_back()).to_vec(),
                    false => Vec::new(),
                };
                line.clear();
                line.extend_from_slice(&carry);
            }
        }
        if !line.is_empty() {
            let carry = emit(&mut line, &tag, &before, false);
            if !carry.is_empty() {
                log_line(&carry, &tag, last(&line, tag.secrets.look_back()), false);
            }
        }
    })
}

/// Logs `line`, which goes on from `before` (empty at a line's start).
/// A piece cut at the limit (`cut`) ends where no value of a secret runs
/// across its end, and at a character's start; the rest is returned to
/// start the next piece.
fn emit(line: &mut Vec<u8>, tag: &Tag, before: &[u8], cut: bool) -> Vec<u8> {
    let mut at = match cut {
        true => tag.secrets.safe_end(line),
        false => line.len(),
    };
    // A line that is one long value, or values end to end, cannot be cut
    // outside one: it is cut in the second half at most, and the part of a
    // value at the cut is masked on both sides.
    let inside = at < line.len() / 2;
    if inside {
        at = line.len() - tag.secrets.look_back().min(line.len() / 2);
    }
    if let Err(e) = std::str::from_utf8(&line[..at])
        && e.error_len().is_none()
    {
        at = e.valid_up_to();
    }
    let carry = line.split_off(at);
    log_line(line, tag, before, inside);
    carry
}

/// The last `n` bytes of `bytes`, or all of them.
fn last(bytes: &[u8], n: usize) -> &[u8] {
    &bytes[bytes.len().saturating_sub(n)..]
}

/// What a job's output line is logged with.
struct Tag {
    /// Which stream.
    stream: Stream,
    /// The period key.
    key: String,
    /// Masked in every line: a value the job was given by `${NAME}` (or an
    /// error of its supervisor quoting one) never reaches the log.
    secrets: Secrets,
    /// Where each line is kept, masked.
    pen: Pen,
}

impl Tag {
    fn of(run: &Run<'_>, stream: Stream, recorder: &Recorder) -> Tag {
        Tag {
            stream,
            key: run.key.to_string(),
            secrets: run.job.secrets.clone(),
            pen: recorder.pen(),
        }
    }
}

fn log_line(line: &[u8], tag: &Tag, before: &[u8], cut_after: bool) {
    let text = tag.secrets.mask_cut(
        &String::from_utf8_lossy(before),
        &String::from_utf8_lossy(line),
        cut_after,
    );
    tag.pen.write(tag.stream, &text);
    // Control characters (a job's colours, a carriage return) are escaped:
    // a log line never moves the terminal's cursor or forges another line.
    let shown = crate::error::printable(text.trim_end());
    tracing::info!(target: "job", period_key = %tag.key, stream = tag.stream.as_str(), "{shown}");
}

/// The last [`OUTPUT_TAIL`] bytes of a job's output.
#[derive(Debug, Clone, Default)]
struct Tail {
    bytes: Vec<u8>,
    /// The last dropped bytes before them, as many as a secret is long: a
    /// value cut at the start is found, and a start that only looks like
    /// a value's end is kept.
    before: Vec<u8>,
}

fn keep_tail(tail: &Mutex<Tail>, bytes: &[u8], look_back: usize) {
    if let Ok(mut tail) = tail.lock() {
        tail.bytes.extend_from_slice(bytes);
        if tail.bytes.len() > OUTPUT_TAIL {
            // Cut at a character's start: the rest of a character cut in
            // two goes with the bytes before, so that a value with
            // characters beyond ASCII is still found across the cut.
            let mut cut = tail.bytes.len() - OUTPUT_TAIL;
            while tail.bytes.get(cut).is_some_and(|b| b & 0xC0 == 0x80) {
                cut += 1;
            }
            let dropped: Vec<u8> = tail.bytes.drain(..cut).collect();
            tail.before.extend_from_slice(&dropped);
            let extra = tail.before.len().saturating_sub(look_back + 3);
            tail.before.drain(..extra);
        }
    }
}
