//! The per-job supervisor: a small process between the scheduler and a
//! `command` or `shell` job that makes sure no process of the job's tree
//! outlives the scheduler or its claim.
//!
//! The scheduler starts its own binary in this mode (through the
//! `posix_spawn` path: no `pre_exec`, so spawning costs the same in a large
//! process). The supervisor
//! - makes itself a child subreaper, so every orphaned descendant of the job
//!   is re-parented to it, whatever process group or session it moved to;
//! - starts the job in a process group of its own;
//! - reads fence deadlines from its stdin, a pipe from the scheduler: each
//!   line is the milliseconds the claim stays safe from now. End of file (the
//!   scheduler died, even by SIGKILL: the kernel closes its end), or a
//!   deadline that passes without renewal (the scheduler froze or lost its
//!   database), kills the whole tree;
//! - forwards SIGTERM to the job's group; SIGUSR1 kills the whole tree now;
//! - when the job's leader ends, kills what is left of the tree, reaps it,
//!   and exits with the job's status (the same code, or the same signal).
//!
//! It writes nothing but its own start-up failure to stderr.

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
use nix::sys::signal::{SigSet, SigmaskHow, Signal, kill, killpg, sigprocmask};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::Pid;

/// The first argument that puts the `scheduler` binary in supervisor mode
/// (where the small `scheduler-supervise` binary is not installed beside it).
pub const ARG: &str = "__supervise";

/// The supervisor's own binary, looked for beside the running one.
pub const BINARY: &str = "scheduler-supervise";

/// How this process starts supervisors.
#[derive(Debug, Clone)]
pub struct Launcher {
    /// The program.
    pub program: std::path::PathBuf,
    /// Arguments before the supervisor's own (the mode switch).
    pub lead: Vec<&'static str>,
}

impl Launcher {
    /// The small `scheduler-supervise` binary beside this one if it is
    /// there (it starts in about a millisecond less than the whole
    /// scheduler), else this binary in supervisor mode.
    pub fn find() -> Launcher {
        match Launcher::beside() {
            Some(program) => Launcher {
                program,
                lead: Vec::new(),
            },
            None => Launcher {
                program: "/proc/self/exe".into(),
                lead: vec![ARG],
            },
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

/// Exit code when the job cannot be started at all (as a shell says for a
/// command it cannot run).
const CANNOT_START: i32 = 127;

/// Supervises the job `args` describe (`FENCE_MS -- PROGRAM ARGS…`) and
/// exits as the job did.
pub fn run(args: &[OsString]) -> ! {
    let status = match supervise(args) {
        Ok(status) => status,
        Err(e) => {
            eprintln!("{e}");
            std::process::exit(CANNOT_START);
        }
    };
    exit_like(status)
}

fn supervise(args: &[OsString]) -> Result<Option<WaitStatus>, String> {
    let (fence_ms, argv) = match args {
        [fence, dashdash, program, rest @ ..] if dashdash == "--" => {
            let fence = fence.to_str().and_then(|f| f.parse::<u64>().ok());
            (fence.ok_or("supervisor: bad fence")?, (program, rest))
        }
        _ => return Err("supervisor: expected FENCE_MS -- PROGRAM [ARGS…]".into()),
    };
    let mut watched = SigSet::empty();
    for signal in [
        Signal::SIGCHLD,
        Signal::SIGTERM,
        Signal::SIGUSR1,
        Signal::SIGINT,
        Signal::SIGHUP,
    ] {
        watched.add(signal);
    }
    sigprocmask(SigmaskHow::SIG_BLOCK, Some(&watched), None)
        .map_err(|e| format!("supervisor: cannot block signals: {e}"))?;
    let signals = SignalFd::with_flags(&watched, SfdFlags::SFD_CLOEXEC | SfdFlags::SFD_NONBLOCK)
        .map_err(|e| format!("supervisor: signalfd: {e}"))?;
    nix::sys::prctl::set_child_subreaper(true)
        .map_err(|e| format!("supervisor: cannot become a subreaper: {e}"))?;
    let mut command = Command::new(argv.0);
    command.args(argv.1).stdin(Stdio::null()).process_group(0);
    // The job must not inherit the signals blocked here (it would never
    // see the SIGTERM of a timeout or a shutdown). The standard library does
    // not reset the mask, so the child does before exec; this process is
    // small, so the fork that `pre_exec` implies costs little.
    // SAFETY: sigprocmask is async-signal-safe and touches no memory of the
    // parent.
    unsafe {
        command.pre_exec(|| {
            sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)?;
            Ok(())
        });
    }
    let child = command
        .spawn()
        .map_err(|e| format!("cannot start `{}`: {e}", argv.0.to_string_lossy()))?;
    let job = Pid::from_raw(child.id() as i32);
    let mut deadline = Instant::now() + Duration::from_millis(fence_ms);
    let mut pending = Vec::new();
    let stdin = std::io::stdin();
    loop {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return Ok(end_tree(job, None));
        };
        let millis = i32::try_from(left.as_millis().max(1)).unwrap_or(i32::MAX);
        let mut fds = [
            PollFd::new(signals.as_fd(), PollFlags::POLLIN),
            PollFd::new(stdin.as_fd(), PollFlags::POLLIN),
        ];
        match poll(
            &mut fds,
            PollTimeout::try_from(millis).unwrap_or(PollTimeout::MAX),
        ) {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return Ok(end_tree(job, None)),
        }
        let stdin_ready = fds[1].any().unwrap_or(true);
        while let Ok(Some(info)) = signals.read_signal() {
            match Signal::try_from(info.ssi_signo as i32) {
                Ok(Signal::SIGCHLD) => {
                    if let Some(status) = reap_ready(job) {
                        return Ok(end_tree(job, Some(status)));
                    }
                }
                Ok(Signal::SIGTERM) => {
                    let _ = killpg(job, Signal::SIGTERM);
                }
                Ok(Signal::SIGUSR1) => return Ok(end_tree(job, None)),
                _ => {}
            }
        }
        if stdin_ready {
            let mut buf = [0u8; 256];
            match nix::unistd::read(stdin.as_fd(), &mut buf) {
                Ok(0) => return Ok(end_tree(job, None)),
                Ok(n) => pending.extend_from_slice(&buf[..n]),
                Err(Errno::EAGAIN | Errno::EINTR) => {}
                Err(_) => return Ok(end_tree(job, None)),
            }
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                let ms = std::str::from_utf8(&line)
                    .ok()
                    .and_then(|l| l.trim().parse::<u64>().ok());
                if let Some(ms) = ms {
                    deadline = Instant::now() + Duration::from_millis(ms);
                }
            }
        }
    }
}

/// Reaps every child that has exited; the job's status if it was one.
fn reap_ready(job: Pid) -> Option<WaitStatus> {
    let mut job_status = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) | Err(_) => return job_status,
            Ok(status) if status.pid() == Some(job) => job_status = Some(status),
            Ok(_) => {}
        }
    }
}

/// Kills every process left in the job's tree and reaps them all; returns
/// the job's status (`job_status`, or the one reaped here).
fn end_tree(job: Pid, mut job_status: Option<WaitStatus>) -> Option<WaitStatus> {
    let _ = killpg(job, Signal::SIGKILL);
    loop {
        let status = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) => {
                // Every descendant whose parent died is ours now: kill each
                // child; their children become ours in turn and go next.
                let _ = killpg(job, Signal::SIGKILL);
                for child in children() {
                    let _ = kill(child, Signal::SIGKILL);
                }
                waitpid(None, None)
            }
            other => other,
        };
        match status {
            Ok(status) if status.pid() == Some(job) => job_status = Some(status),
            Ok(_) | Err(Errno::EINTR) => {}
            Err(_) => return job_status,
        }
    }
}

/// This process's children: from its one thread's `children` file where
/// the kernel has it, else from every process's parent in `/proc`.
fn children() -> Vec<Pid> {
    let me = std::process::id();
    match std::fs::read_to_string(format!("/proc/{me}/task/{me}/children")) {
        Ok(list) => list
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .map(Pid::from_raw)
            .collect(),
        Err(_) => crate::engine::reaper::children_of(me),
    }
}

/// Exits with the job's code, or dies of the job's signal.
fn exit_like(status: Option<WaitStatus>) -> ! {
    match status {
        Some(WaitStatus::Exited(_, code)) => std::process::exit(code),
        Some(WaitStatus::Signaled(_, signal, _)) => {
            // No core file of the supervisor for a job's SIGSEGV.
            let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_CORE, 0, 0);
            // SAFETY: restoring the default disposition installs no handler.
            let _ =
                unsafe { nix::sys::signal::signal(signal, nix::sys::signal::SigHandler::SigDfl) };
            let mut only = SigSet::empty();
            only.add(signal);
            let _ = sigprocmask(SigmaskHow::SIG_UNBLOCK, Some(&only), None);
            let _ = nix::sys::signal::raise(signal);
            std::process::exit(128 + signal as i32)
        }
        _ => std::process::exit(CANNOT_START),
    }
}
