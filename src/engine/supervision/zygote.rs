//! One supervisor process per scheduler process, which forks a job's own
//! supervisor for each job: a fork of a small single-threaded process costs
//! a fraction of starting a program, and a job start was two program starts
//! (its supervisor, then the job).
//!
//! The scheduler starts the zygote once (the `scheduler-supervise` binary,
//! `--zygote`) with one end of a `SOCK_SEQPACKET` socket as its stdin, and
//! sends it one message per job: the job's [`Spec`](super::supervisor::Spec) and four pipe ends
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
//! [`Launcher::sweep`](super::launcher::Launcher::sweep) waits for that). The zygote ends when the scheduler's
//! end of the socket closes. A zygote that died is started again for the
//! next job; its job supervisors carry on (re-parented to the scheduler,
//! itself a subreaper).

use std::collections::HashSet;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::time::Duration;

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{ControlMessageOwned, MsgFlags, recvmsg};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid};

/// The largest request the zygote reads: a job's arguments and added
/// variables together. A socket's send buffer bounds it first (about 200
/// KiB by default): a job with more is refused with a message saying so.
const REQUEST_LIMIT: usize = 1 << 20;

/// A request that starts a job.
pub(super) const START: u8 = b'J';
/// A request that kills the zygote's stray children and closes the pipe it
/// carries when they are gone.
pub(super) const SWEEP: u8 = b'S';

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
