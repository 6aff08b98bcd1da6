//! As PID 1 in a container, the scheduler inherits every orphaned process
//! and must reap it, or zombies pile up. Only processes that are not its own
//! jobs are reaped here; its jobs are waited for by their runners.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::Duration;

use nix::sys::wait::{Id, WaitPidFlag, WaitStatus, waitid, waitpid};
use nix::unistd::Pid;

/// The pids of this process's own job children.
fn jobs() -> MutexGuard<'static, HashSet<i32>> {
    static JOBS: OnceLock<Mutex<HashSet<i32>>> = OnceLock::new();
    JOBS.get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|e| e.into_inner())
}

/// Spawns a job with `spawn` while the reaper is held off, and records its
/// pid, so the reaper never takes a job's exit status from its runner.
pub fn spawn_job<T>(
    spawn: impl FnOnce() -> std::io::Result<T>,
    pid: impl Fn(&T) -> Option<u32>,
) -> std::io::Result<T> {
    let mut jobs = jobs();
    let child = spawn()?;
    if let Some(pid) = pid(&child) {
        jobs.insert(pid as i32);
    }
    Ok(child)
}

/// Forgets a job whose runner has waited for it.
pub fn forget_job(pid: u32) {
    jobs().remove(&(pid as i32));
}

/// When this process is PID 1, reaps orphans on every SIGCHLD and once a
/// second (a SIGCHLD can arrive while a job's own exit is pending).
pub fn start_if_pid_1() {
    if std::process::id() != 1 {
        return;
    }
    tokio::spawn(async {
        let Ok(mut sigchld) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::child())
        else {
            return;
        };
        loop {
            tokio::select! {
                _ = sigchld.recv() => {}
                () = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            reap_orphans();
        }
    });
}

fn reap_orphans() {
    let jobs = jobs();
    loop {
        // Look without reaping: the first exited child may be one of ours.
        let flags = WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT;
        let pid = match waitid(Id::All, flags) {
            Ok(WaitStatus::StillAlive) | Err(_) => return,
            Ok(status) => status.pid(),
        };
        match pid {
            Some(pid) if !jobs.contains(&pid.as_raw()) => {
                let _ = waitpid(Pid::from_raw(pid.as_raw()), Some(WaitPidFlag::WNOHANG));
            }
            _ => return,
        }
    }
}
