//! The per-job supervisor: a small process between the scheduler and a
//! `command` or `shell` job that makes sure no process of the job's tree
//! outlives the scheduler or its claim.
//!
//! Each is forked by the scheduler process's one zygote (see
//! [`zygote`](super::zygote)), or started as a program of its own (`FENCE_MS
//! -- PROGRAM ARGS…`). The supervisor
//! - makes itself a child subreaper, so every orphaned descendant of the job
//!   is re-parented to it, whatever process group or session it moved to;
//! - starts the job in a process group of its own;
//! - reads fence deadlines from its stdin, a pipe from the scheduler: each
//!   line is the milliseconds the claim stays safe from now. End of file (the
//!   scheduler died, even by SIGKILL: the kernel closes its end), or a
//!   deadline that passes without renewal (the scheduler froze or lost its
//!   database), kills the whole tree;
//! - forwards SIGTERM (or a `term` line) to the job's group; SIGUSR1 (or a
//!   `kill` line) kills the whole tree now;
//! - when the job's leader ends, kills what is left of the tree, reaps it,
//!   and exits with the job's status (the same code, or the same signal).
//!
//! It writes nothing but its own start-up failure to stderr.

use std::ffi::{OsStr, OsString};
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
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

/// Exit code when the job cannot be started at all (as a shell says for a
/// command it cannot run).
pub(super) const CANNOT_START: i32 = 127;

/// The argument after [`ARG`] (or first, for `scheduler-supervise`) that
/// starts the long-lived supervisor of a whole scheduler process (see
/// [`zygote`](super::zygote)) rather than one job's.
pub const ZYGOTE: &str = "--zygote";

/// What one supervisor runs and how long the claim is safe at first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec {
    /// Milliseconds the claim stays safe from the start.
    pub fence_ms: u64,
    /// The job's program.
    pub program: OsString,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// The job's whole environment (nothing else of the supervisor's own
    /// is passed on).
    pub env: Vec<(OsString, OsString)>,
    /// Its working directory, if not the supervisor's own.
    pub workdir: Option<OsString>,
}

impl Spec {
    /// `FENCE_MS -- PROGRAM ARGS…`, the command line of a supervisor started
    /// for one job (its environment and directory are its own).
    pub(super) fn from_args(args: &[OsString]) -> Result<Spec, String> {
        match args {
            [fence, dashdash, program, rest @ ..] if dashdash == "--" => Ok(Spec {
                fence_ms: fence
                    .to_str()
                    .and_then(|f| f.parse::<u64>().ok())
                    .ok_or("supervisor: bad fence")?,
                program: program.clone(),
                args: rest.to_vec(),
                env: std::env::vars_os().collect(),
                workdir: None,
            }),
            _ => Err("supervisor: expected FENCE_MS -- PROGRAM [ARGS…]".into()),
        }
    }

    /// The bytes of one request to the zygote: fields separated by NUL,
    /// which no argument, variable or path can hold.
    pub fn encode(&self) -> Vec<u8> {
        let mut fields: Vec<&[u8]> = Vec::new();
        let fence = self.fence_ms.to_string();
        let counts = [self.env.len().to_string(), self.args.len().to_string()];
        fields.push(fence.as_bytes());
        fields.push(self.workdir.as_ref().map_or(&b""[..], |w| w.as_bytes()));
        fields.push(counts[0].as_bytes());
        for (k, v) in &self.env {
            fields.push(k.as_bytes());
            fields.push(v.as_bytes());
        }
        fields.push(counts[1].as_bytes());
        fields.extend(self.args.iter().map(|a| a.as_bytes()));
        fields.push(self.program.as_bytes());
        fields.join(&0u8)
    }

    /// Reads [`Spec::encode`]'s bytes.
    pub(super) fn decode(bytes: &[u8]) -> Result<Spec, String> {
        let mut fields = bytes.split(|b| *b == 0).map(OsStr::from_bytes);
        let mut next = || fields.next().ok_or("supervisor: a request cut short");
        let number = |f: &OsStr| f.to_str().and_then(|n| n.parse::<usize>().ok());
        let fence_ms = number(next()?).ok_or("supervisor: bad fence")? as u64;
        let workdir = Some(next()?).filter(|w| !w.is_empty()).map(OsStr::to_owned);
        let env_count = number(next()?).ok_or("supervisor: bad count")?;
        let mut env = Vec::with_capacity(env_count.min(1024));
        for _ in 0..env_count {
            env.push((next()?.to_owned(), next()?.to_owned()));
        }
        let arg_count = number(next()?).ok_or("supervisor: bad count")?;
        let mut args = Vec::with_capacity(arg_count.min(1024));
        for _ in 0..arg_count {
            args.push(next()?.to_owned());
        }
        let program = next()?.to_owned();
        Ok(Spec {
            fence_ms,
            program,
            args,
            env,
            workdir,
        })
    }
}

/// A job started by a zygote's child from the request `bytes`, supervised
/// to its end: how it ended, as one line for the scheduler (`exit N`,
/// `signal N`).
pub(super) fn supervise_request(bytes: &[u8]) -> String {
    match Spec::decode(bytes).and_then(|spec| supervise(&spec)) {
        Ok(Some(WaitStatus::Exited(_, code))) => format!("exit {code}"),
        Ok(Some(WaitStatus::Signaled(_, signal, _))) => format!("signal {}", signal as i32),
        Ok(_) => format!("exit {CANNOT_START}"),
        Err(e) => {
            eprintln!("{e}");
            format!("exit {CANNOT_START}")
        }
    }
}

pub(super) fn supervise(spec: &Spec) -> Result<Option<WaitStatus>, String> {
    let signals = watch_signals()?;
    // A scheduler that is gone, or gave this job up before it started
    // (its supervisor was slow to start), has closed the control pipe: the
    // job must not start then.
    let stdin = std::io::stdin();
    let mut control = [PollFd::new(stdin.as_fd(), PollFlags::POLLIN)];
    if poll(&mut control, PollTimeout::ZERO).is_ok()
        && control[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLHUP))
    {
        return Err("supervisor: the scheduler gave the job up before it started".into());
    }
    let job = start(spec)?;
    Ok(follow(job, &signals, spec.fence_ms))
}

/// Blocks the signals the supervisor follows and reads them from a
/// descriptor; makes it the subreaper of the job's tree.
fn watch_signals() -> Result<SignalFd, String> {
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
    Ok(signals)
}

/// Starts the job in a process group of its own.
fn start(spec: &Spec) -> Result<Pid, String> {
    let mut command = Command::new(&spec.program);
    command
        .args(&spec.args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .stdin(Stdio::null())
        .process_group(0);
    if let Some(dir) = &spec.workdir {
        command.current_dir(dir);
    }
    // The job must not inherit the signals blocked here (it would never
    // see the SIGTERM of a timeout or a shutdown). The standard library does
    // not reset the mask, so the child does before exec; this process is
    // small, so the fork that `pre_exec` implies costs little.
    // The job's own process also dies with this supervisor, should both
    // the scheduler and this supervisor be killed at once (`pkill -9 -f
    // scheduler`); the parent is checked after, in case it died first.
    let supervisor = nix::unistd::getpid();
    // SAFETY: sigprocmask, prctl and getppid are async-signal-safe and
    // touch no memory of the parent.
    unsafe {
        command.pre_exec(move || {
            sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)?;
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            if nix::unistd::getppid() != supervisor {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
    let child = command.spawn().map_err(|e| {
        let program = spec.program.to_string_lossy();
        match &spec.workdir {
            Some(dir) if !std::path::Path::new(dir).is_dir() => format!(
                "cannot start `{program}`: its workdir `{}` is not a directory ({e})",
                dir.to_string_lossy()
            ),
            _ => format!("cannot start `{program}`: {e}"),
        }
    })?;
    Ok(Pid::from_raw(child.id() as i32))
}

/// Follows the job to its end: its exit, a stop asked for on the control
/// pipe (`term`, `kill`, the pipe closed) or by signal, or the fence
/// (the claim no longer vouched for in time). Ends the whole tree.
fn follow(job: Pid, signals: &SignalFd, fence_ms: u64) -> Option<WaitStatus> {
    let stdin = std::io::stdin();
    let mut deadline = Instant::now() + Duration::from_millis(fence_ms);
    let mut pending = Vec::new();
    loop {
        let Some(left) = deadline.checked_duration_since(Instant::now()) else {
            return end_tree(job, None);
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
            Err(_) => return end_tree(job, None),
        }
        let stdin_ready = fds[1].any().unwrap_or(true);
        while let Ok(Some(info)) = signals.read_signal() {
            match Signal::try_from(info.ssi_signo as i32) {
                Ok(Signal::SIGCHLD) => {
                    if let Some(status) = reap_ready(job) {
                        return end_tree(job, Some(status));
                    }
                }
                Ok(Signal::SIGTERM) => {
                    let _ = killpg(job, Signal::SIGTERM);
                }
                Ok(Signal::SIGUSR1) => return end_tree(job, None),
                _ => {}
            }
        }
        if stdin_ready {
            let mut buf = [0u8; 256];
            match nix::unistd::read(stdin.as_fd(), &mut buf) {
                Ok(0) => return end_tree(job, None),
                Ok(n) => pending.extend_from_slice(&buf[..n]),
                Err(Errno::EAGAIN | Errno::EINTR) => {}
                Err(_) => return end_tree(job, None),
            }
            // Each line: the milliseconds the claim stays safe from now,
            // `term` (SIGTERM to the job's group) or `kill` (the whole tree).
            while let Some(end) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=end).collect();
                match std::str::from_utf8(&line).map(str::trim) {
                    Ok("term") => {
                        let _ = killpg(job, Signal::SIGTERM);
                    }
                    Ok("kill") => return end_tree(job, None),
                    Ok(ms) => {
                        if let Ok(ms) = ms.parse::<u64>() {
                            deadline = Instant::now() + Duration::from_millis(ms);
                        }
                    }
                    Err(_) => {}
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
pub(super) fn children() -> Vec<Pid> {
    let me = std::process::id();
    match std::fs::read_to_string(format!("/proc/{me}/task/{me}/children")) {
        Ok(list) => list
            .split_whitespace()
            .filter_map(|p| p.parse().ok())
            .map(Pid::from_raw)
            .collect(),
        Err(_) => super::reaper::children_of(me),
    }
}

/// Exits with the job's code, or dies of the job's signal.
pub(super) fn exit_like(status: Option<WaitStatus>) -> ! {
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
