//! The scheduler's side of job processes: how this process starts each
//! job's supervisor through its one zygote (started with the first job,
//! again if it died), talks to it (fence deadlines, `term`, `kill`), hears
//! how the job ended, and sweeps what a killed supervisor left.

use std::io::IoSlice;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::errno::Errno;
use nix::sys::signal::{Signal, kill};
use nix::sys::socket::{
    AddressFamily, ControlMessage, MsgFlags, SockFlag, SockType, sendmsg, socketpair,
};
use nix::unistd::Pid;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::unix::pipe;

use super::supervisor::{ARG, BINARY, Spec, ZYGOTE};
use super::zygote::{START, SWEEP};

/// How long a sweep by the zygote may take before the zygote is killed.
const SWEEP_WAIT: Duration = Duration::from_secs(3);

/// How long a job's supervisor may take to say it started before the
/// zygote is taken for stuck (stopped, say), killed and started again.
const START_WAIT: Duration = Duration::from_secs(5);

/// How this process starts supervisors: the program of its zygote (see
/// [`zygote`](super::zygote)), and the zygote once started.
#[derive(Debug, Clone)]
pub struct Launcher {
    /// The program.
    pub program: std::path::PathBuf,
    /// Arguments before the supervisor's own (the mode switch).
    pub lead: Vec<&'static str>,
    /// The zygote, started with the first job.
    zygote: Connection,
}

impl Launcher {
    /// Supervisors started as `program` (with `lead` before their own
    /// arguments).
    pub fn new(program: std::path::PathBuf, lead: Vec<&'static str>) -> Launcher {
        Launcher {
            program,
            lead,
            zygote: Default::default(),
        }
    }

    /// The small `scheduler-supervise` binary beside this one if it is
    /// there (it starts in about a millisecond less than the whole
    /// scheduler), else this binary in supervisor mode.
    pub fn find() -> Launcher {
        match Launcher::beside() {
            Some(program) => Launcher::new(program, Vec::new()),
            None => Launcher::new("/proc/self/exe".into(), vec![ARG]),
        }
    }

    /// The `scheduler-supervise` binary beside this program.
    fn beside() -> Option<std::path::PathBuf> {
        std::env::current_exe()
            .ok()
            .and_then(|exe| Some(exe.parent()?.join(BINARY)))
            .filter(|path| path.is_file())
    }

    /// The `scheduler-supervise` binary beside this program, else on
    /// `PATH`.
    pub fn installed() -> Option<std::path::PathBuf> {
        let beside = Launcher::beside();
        let on_path: Vec<std::path::PathBuf> = std::env::var_os("PATH")
            .map(|path| {
                std::env::split_paths(&path)
                    .map(|dir| dir.join(BINARY))
                    .collect()
            })
            .unwrap_or_default();
        beside
            .into_iter()
            .chain(on_path)
            .find(|path| path.is_file())
    }
}

/// The scheduler's connection to its zygote.
#[derive(Debug, Default, Clone)]
pub(super) struct Connection(Arc<Mutex<Option<Zygote>>>);

#[derive(Debug)]
struct Zygote {
    socket: OwnedFd,
    child: std::process::Child,
}

impl Drop for Zygote {
    fn drop(&mut self) {
        // A zygote left behind (one that stopped reading, say) ends with its
        // socket; this makes sure, and reaps it.
        let _ = self.child.kill();
        let _ = self.child.wait();
        super::reaper::forget_job(self.child.id());
    }
}

/// A job started under its own supervisor: the scheduler's ends of its
/// pipes.
pub struct Started {
    /// Fence deadlines (milliseconds), `term`, `kill`; closing it ends the
    /// job's whole tree.
    pub control: pipe::Sender,
    /// The job's stdout.
    pub stdout: pipe::Receiver,
    /// The job's stderr.
    pub stderr: pipe::Receiver,
    /// What its supervisor says: see [`StatusPipe`].
    pub status: StatusPipe,
}

/// How a job's supervisor ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ended {
    /// The job exited with this code; its tree is gone.
    Exited(i32),
    /// The job died of this signal; its tree is gone.
    Signaled(i32),
    /// The supervisor ended without saying how (it was killed, or never
    /// started): what is left of the job's tree must be swept.
    Vanished,
}

/// The status pipe of a job's supervisor.
pub struct StatusPipe {
    reader: BufReader<pipe::Receiver>,
    line: Vec<u8>,
    pid: Option<Pid>,
    ended: Option<Ended>,
}

impl StatusPipe {
    /// Waits for the supervisor to end. Cancel-safe: a line half read is
    /// kept for the next call.
    pub async fn ended(&mut self) -> Ended {
        loop {
            if let Some(ended) = self.ended {
                return ended;
            }
            self.read_line().await;
        }
    }

    /// Waits for the supervisor to say it started: whether it did (it may
    /// have ended already). Cancel-safe.
    async fn started(&mut self) -> bool {
        while self.pid.is_none() && self.ended.is_none() {
            self.read_line().await;
        }
        self.pid.is_some()
    }

    /// Reads one line of the status pipe, or its end.
    async fn read_line(&mut self) {
        {
            match self.reader.read_until(b'\n', &mut self.line).await {
                Ok(0) | Err(_) => self.ended = Some(Ended::Vanished),
                Ok(_) if self.line.ends_with(b"\n") => {
                    let line = String::from_utf8_lossy(&self.line).trim().to_owned();
                    self.line.clear();
                    let mut words = line.split_whitespace();
                    let (word, number) = (words.next(), words.next().and_then(|n| n.parse().ok()));
                    match (word, number) {
                        (Some("pid"), Some(pid)) => {
                            // Should the zygote die, this supervisor becomes
                            // this process's child: not an orphan to sweep.
                            super::reaper::adopt_job(pid as u32);
                            self.pid = Some(Pid::from_raw(pid));
                        }
                        (Some("exit"), Some(code)) => self.ended = Some(Ended::Exited(code)),
                        (Some("signal"), Some(n)) => self.ended = Some(Ended::Signaled(n)),
                        _ => tracing::warn!("job supervisor: {line}"),
                    }
                    if let (Some(_), Some(pid)) = (self.ended, self.pid) {
                        super::reaper::forget_job(pid.as_raw() as u32);
                    }
                }
                // End of file in the middle of a line.
                Ok(_) => self.ended = Some(Ended::Vanished),
            }
            if let (Some(Ended::Vanished), Some(pid)) = (self.ended, self.pid) {
                super::reaper::forget_job(pid.as_raw() as u32);
            }
        }
    }

    /// Kills the supervisor itself, while it has not ended (its pid is
    /// still its own then: its status pipe is open).
    pub fn kill(&self) {
        if let (None, Some(pid)) = (self.ended, self.pid) {
            let _ = kill(pid, Signal::SIGKILL);
        }
    }
}

impl Launcher {
    /// Starts `spec` under a supervisor of its own, forked by this
    /// process's zygote (started now if there is none, or again if it
    /// died). A supervisor that does not say it started within
    /// five seconds (the zygote is stopped, say) is given up: its control
    /// pipe is closed, so that it never starts the job later, and the
    /// zygote is killed (a new one serves the next job).
    pub async fn start(&self, spec: &Spec) -> std::io::Result<Started> {
        let mut started = self.send_start(spec)?;
        match tokio::time::timeout(START_WAIT, started.status.started()).await {
            Ok(true) => Ok(started),
            Ok(false) => Err(std::io::Error::other(
                "its supervisor ended before it started",
            )),
            Err(_) => {
                drop(started);
                self.forget_zygote();
                Err(std::io::Error::other(format!(
                    "its supervisor did not start within {}s; the zygote was killed",
                    START_WAIT.as_secs()
                )))
            }
        }
    }

    fn send_start(&self, spec: &Spec) -> std::io::Result<Started> {
        let (control, control_theirs) = pipe::pipe()?;
        let (stdout_theirs, stdout) = pipe::pipe()?;
        let (stderr_theirs, stderr) = pipe::pipe()?;
        let (status_theirs, status) = pipe::pipe()?;
        let theirs = [
            control_theirs.into_blocking_fd()?,
            stdout_theirs.into_blocking_fd()?,
            stderr_theirs.into_blocking_fd()?,
            status_theirs.into_blocking_fd()?,
        ];
        let mut request = vec![START];
        request.extend(spec.encode());
        self.send(&request, &theirs, true)?;
        Ok(Started {
            control,
            stdout,
            stderr,
            status: StatusPipe {
                reader: BufReader::new(status),
                line: Vec::new(),
                pid: None,
                ended: None,
            },
        })
    }

    /// Has the zygote kill its stray children (the trees of job
    /// supervisors that were killed) and waits until they are gone; then
    /// sweeps this process's own (those of a zygote that died). A zygote
    /// that does not finish in time (stopped, say) is killed: its strays
    /// come to this process, whose sweep kills them.
    pub async fn sweep(&self) {
        if let Ok((done_theirs, mut done)) = pipe::pipe()
            && let Ok(done_theirs) = done_theirs.into_blocking_fd()
            && self.send(&[SWEEP], &[done_theirs], false).is_ok()
        {
            let mut end = [0u8; 1];
            let swept = tokio::time::timeout(
                SWEEP_WAIT,
                tokio::io::AsyncReadExt::read(&mut done, &mut end),
            )
            .await;
            if swept.is_err() {
                tracing::warn!(
                    "the job supervisors' zygote did not sweep in time; killing it (a new one starts with the next job)"
                );
                self.forget_zygote();
            }
        }
        super::reaper::sweep().await;
    }

    /// Kills the zygote, if any; the next job starts a new one. Its job
    /// supervisors carry on, re-parented to this process.
    fn forget_zygote(&self) {
        let zygote = self
            .zygote
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(zygote);
    }

    /// Sends one request with `fds`; starts the zygote first if `start`
    /// and there is none, or none alive.
    fn send(&self, request: &[u8], fds: &[OwnedFd], start: bool) -> std::io::Result<()> {
        let mut zygote = self.zygote.0.lock().unwrap_or_else(|e| e.into_inner());
        let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
        for attempt in 0..2 {
            if zygote.is_none() {
                if !start {
                    return Ok(());
                }
                *zygote = Some(self.start_zygote()?);
            }
            let Some(alive) = zygote.as_ref() else {
                continue;
            };
            let sent = sendmsg::<()>(
                alive.socket.as_raw_fd(),
                &[IoSlice::new(request)],
                &[ControlMessage::ScmRights(&raw)],
                // Never blocking a scheduler thread: a zygote whose queue is
                // full has stopped taking requests.
                MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT,
                None,
            );
            match sent {
                Ok(_) => return Ok(()),
                // The zygote died, or is stuck: once more with a new one.
                Err(Errno::EPIPE | Errno::ECONNRESET | Errno::ENOTCONN | Errno::EAGAIN)
                    if attempt == 0 =>
                {
                    *zygote = None;
                }
                Err(Errno::EMSGSIZE) => {
                    return Err(std::io::Error::other(format!(
                        "its arguments and variables ({} bytes) are more than the supervisor takes in one request",
                        request.len()
                    )));
                }
                Err(e) => return Err(e.into()),
            }
        }
        Err(std::io::Error::other(
            "the job supervisor cannot be reached",
        ))
    }

    fn start_zygote(&self) -> std::io::Result<Zygote> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )?;
        let mut command = std::process::Command::new(&self.program);
        command
            .arg0("scheduler-supervise")
            .args(&self.lead)
            .arg(ZYGOTE)
            // It needs no variables, and so holds none of the scheduler's
            // secrets: each job's environment comes with its request.
            .env_clear()
            .stdin(Stdio::from(theirs))
            .stdout(Stdio::null())
            // Its own group: a terminal's Ctrl-C reaches the scheduler,
            // which stops its jobs in order, not the supervisors.
            .process_group(0);
        // No `pre_exec`: it starts on the `posix_spawn` path, as cheap in a
        // large process as in a small one.
        let child = super::reaper::spawn_job(|| command.spawn(), |c| Some(c.id()))?;
        Ok(Zygote {
            socket: ours,
            child,
        })
    }
}
