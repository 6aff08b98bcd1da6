//! One supervisor process per scheduler process, which forks a job's own
//! supervisor for each job: a fork of a small single-threaded process costs
//! a fraction of starting a program, and a job start was two program starts
//! (its supervisor, then the job).
//!
//! The scheduler starts the zygote once (the `scheduler-supervise` binary,
//! `--zygote`) with one end of a `SOCK_SEQPACKET` socket as its stdin, and
//! sends it one message per job: the job's [`Spec`] and four pipe ends
//! (`SCM_RIGHTS`): the control pipe (fence deadlines, `term`, `kill`: the
//! job's supervisor's stdin), the job's stdout and stderr, and a status pipe
//! on which the job's supervisor says `pid N` when it starts and `exit N` or
//! `signal N` when the job has ended and its whole tree is gone. The zygote
//! forks; the child is the job's supervisor exactly as a supervisor started
//! on its own is (subreaper, fence, tree killed at the end).
//!
//! What keeps a job from outliving the scheduler does not depend on the
//! zygote: the scheduler holds the write end of each control pipe, so its
//! death, even by SIGKILL, ends every job's tree. The zygote is a subreaper
//! too: a job supervisor killed by someone leaves its tree to the zygote,
//! which kills every child of its own that is not a job supervisor (and
//! [`Launcher::sweep`] waits for that). The zygote ends when the scheduler's
//! end of the socket closes. A zygote that died is started again for the
//! next job; its job supervisors carry on (re-parented to the scheduler,
//! itself a subreaper).

use std::collections::HashSet;
use std::io::IoSlice;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{
    AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags, SockFlag, SockType, recvmsg,
    sendmsg, socketpair,
};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid};
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::unix::pipe;

use super::supervisor::{Launcher, Spec, ZYGOTE};

/// The largest request the zygote reads: a job's arguments and added
/// variables together. A socket's send buffer bounds it first (about 200
/// KiB by default): a job with more is refused with a message saying so.
const REQUEST_LIMIT: usize = 1 << 20;

/// How long a sweep by the zygote may take before the zygote is killed.
const SWEEP_WAIT: Duration = Duration::from_secs(3);

/// How long a job's supervisor may take to say it started before the
/// zygote is taken for stuck (stopped, say), killed and started again.
const START_WAIT: Duration = Duration::from_secs(5);

/// A request that starts a job.
const START: u8 = b'J';
/// A request that kills the zygote's stray children and closes the pipe it
/// carries when they are gone.
const SWEEP: u8 = b'S';

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
    /// What its supervisor says: see [`Status`].
    pub status: Status,
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
pub struct Status {
    reader: BufReader<pipe::Receiver>,
    line: Vec<u8>,
    pid: Option<Pid>,
    ended: Option<Ended>,
}

impl Status {
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
            status: Status {
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

/// The zygote: forks a job supervisor for each request on its stdin until
/// the scheduler's end closes.
pub(super) fn serve() -> ! {
    let mut chld = SigSet::empty();
    chld.add(Signal::SIGCHLD);
    let signals = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&chld), None)
        .and_then(|()| SignalFd::with_flags(&chld, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK));
    let signals = match signals {
        Ok(signals) => signals,
        Err(e) => {
            eprintln!("scheduler-supervise: cannot watch its children: {e}");
            std::process::exit(1);
        }
    };
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        eprintln!("scheduler-supervise: cannot become a subreaper: {e}");
        std::process::exit(1);
    }
    let control = std::io::stdin();
    let mut supervisors: HashSet<Pid> = HashSet::new();
    let mut buffer = vec![0u8; REQUEST_LIMIT];
    loop {
        let mut fds = [
            PollFd::new(control.as_fd(), PollFlags::POLLIN),
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
        ];
        match poll(&mut fds, PollTimeout::from(1_000u16)) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => std::process::exit(1),
        }
        let request_ready = fds[0].any().unwrap_or(true);
        while let Ok(Some(_)) = signals.read_signal() {}
        reap(&mut supervisors);
        kill_strays(&supervisors);
        if !request_ready {
            continue;
        }
        let mut space = nix::cmsg_space!([RawFd; 4]);
        let mut iov = [std::io::IoSliceMut::new(&mut buffer)];
        let (bytes, fds, truncated) = match recvmsg::<()>(
            control.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            // The scheduler's end closed: it ended, or died.
            Ok(message) if message.bytes == 0 => std::process::exit(0),
            Ok(message) => {
                let mut fds: Vec<OwnedFd> = Vec::new();
                for cmsg in message.cmsgs().into_iter().flatten() {
                    if let ControlMessageOwned::ScmRights(raw) = cmsg {
                        // SAFETY: the kernel just gave these descriptors to
                        // this process; nothing else owns them.
                        fds.extend(
                            raw.into_iter()
                                .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) }),
                        );
                    }
                }
                let truncated = message.flags.contains(MsgFlags::MSG_TRUNC);
                (message.bytes, fds, truncated)
            }
            Err(Errno::EINTR | Errno::EAGAIN) => continue,
            Err(_) => std::process::exit(1),
        };
        match buffer[..bytes] {
            [START, ..] if !truncated => start(&buffer[1..bytes], fds, &mut supervisors),
            [SWEEP, ..] => {
                sweep(&mut supervisors);
                drop(fds);
            }
            _ => drop(fds),
        }
    }
}

/// Forks the supervisor of one job.
fn start(request: &[u8], fds: Vec<OwnedFd>, supervisors: &mut HashSet<Pid>) {
    let Ok([control, stdout, stderr, status]) = <[OwnedFd; 4]>::try_from(fds) else {
        return;
    };
    // SAFETY: this process has one thread, so the child's memory holds no
    // lock another thread took; it goes on as an ordinary program would.
    match unsafe { nix::unistd::fork() } {
        Ok(ForkResult::Child) => {
            // Its stdin is the control pipe (the socket is closed by this),
            // its stdout and stderr the job's.
            for (fd, to) in [(&control, 0), (&stdout, 1), (&stderr, 2)] {
                // SAFETY: dup2 onto the standard descriptors, which this
                // process owns; `std` reads them through their numbers.
                if unsafe { libc::dup2(fd.as_raw_fd(), to) } < 0 {
                    std::process::exit(1);
                }
            }
            drop((control, stdout, stderr));
            say(&status, &format!("pid {}", std::process::id()));
            let ended = super::supervisor::supervise_request(request);
            say(&status, &ended);
            std::process::exit(0);
        }
        Ok(ForkResult::Parent { child }) => {
            supervisors.insert(child);
        }
        Err(e) => {
            say(&stderr, &format!("scheduler-supervise: cannot fork: {e}"));
        }
    }
}

/// Writes `line` and a newline to `fd`, as far as it goes.
fn say(fd: &OwnedFd, line: &str) {
    let _ = nix::unistd::write(fd, format!("{line}\n").as_bytes());
}

/// Reaps every child that ended, supervisors and strays alike.
fn reap(supervisors: &mut HashSet<Pid>) {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(status) => {
                if let Some(pid) = status.pid() {
                    supervisors.remove(&pid);
                }
            }
        }
    }
}

/// Kills every child that is not a job supervisor: what is left of the
/// tree of one that was killed.
fn kill_strays(supervisors: &HashSet<Pid>) -> bool {
    let strays: Vec<Pid> = super::supervisor::children()
        .into_iter()
        .filter(|pid| !supervisors.contains(pid))
        .collect();
    for pid in &strays {
        let _ = kill(*pid, Signal::SIGKILL);
    }
    !strays.is_empty()
}

/// Kills stray children until there are none (their own children come to
/// this process as each dies), for at most a few seconds.
fn sweep(supervisors: &mut HashSet<Pid>) {
    for _ in 0..500 {
        reap(supervisors);
        if !kill_strays(supervisors) {
            return;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_survives_its_encoding() {
        let spec = Spec {
            fence_ms: 40_000,
            program: "/bin/sh".into(),
            args: vec!["-c".into(), "".into(), "echo {x} é".into()],
            env: vec![("A".into(), "".into()), ("B".into(), "x=y".into())],
            workdir: Some("/tmp/a b".into()),
        };
        assert_eq!(Spec::decode(&spec.encode()), Ok(spec));
        let bare = Spec {
            fence_ms: 1,
            program: "true".into(),
            args: Vec::new(),
            env: Vec::new(),
            workdir: None,
        };
        assert_eq!(Spec::decode(&bare.encode()), Ok(bare));
    }
}
