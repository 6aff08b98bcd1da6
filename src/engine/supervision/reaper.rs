//! Orphans: `run` and `serve` make themselves a child subreaper, so a
//! process of a job's tree whose supervisor died (killed by someone, by the
//! OOM killer) is re-parented to the scheduler instead of to init, where
//! [`sweep`] can kill it before the period runs again. Orphans are reaped
//! here, as PID 1 in a container inherits every orphan anyway; the
//! scheduler's own children (the supervisors) are waited for by their
//! runners.

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

/// Records a job supervisor that another process (the zygote) started: it
/// is re-parented to this process if that one dies, and is no orphan to
/// sweep then.
pub fn adopt_job(pid: u32) {
    jobs().insert(pid as i32);
}

/// Forgets a job whose runner has waited for it.
pub fn forget_job(pid: u32) {
    jobs().remove(&(pid as i32));
}

/// Makes this process a child subreaper and reaps orphans on every SIGCHLD
/// and once a second (a SIGCHLD can arrive while a job's own exit is
/// pending).
pub fn start() {
    if let Err(e) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::warn!(
            "cannot become a child subreaper ({e}): a job whose supervisor is killed may leave processes behind"
        );
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

/// Kills every child of this process that is not one of its supervisors
/// (what is left of a job tree whose supervisor died) and waits until they
/// are gone. Cheap when there are none: one look at `/proc`.
pub async fn sweep() {
    for _ in 0..200 {
        let strays: Vec<Pid> = {
            let jobs = jobs();
            children_of(std::process::id())
                .into_iter()
                .filter(|pid| !jobs.contains(&pid.as_raw()))
                .collect()
        };
        if strays.is_empty() {
            return;
        }
        tracing::warn!(
            count = strays.len(),
            "killing processes left by a job whose supervisor died"
        );
        for pid in strays {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        reap_orphans();
    }
}

/// The children of process `parent`, read from every `/proc/PID/stat`.
pub fn children_of(parent: u32) -> Vec<Pid> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            std::fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|stat| parent_in_stat(&stat))
                == Some(parent)
        })
        .map(Pid::from_raw)
        .collect()
}

/// The parent pid in a `/proc/PID/stat` line (the fourth field, counted
/// after the command name, which may itself hold spaces and parentheses).
fn parent_in_stat(stat: &str) -> Option<u32> {
    let after_name = &stat[stat.rfind(')')? + 1..];
    after_name.split_whitespace().nth(1)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::parent_in_stat;

    #[test]
    fn the_parent_is_read_after_a_command_name_with_spaces_and_parentheses() {
        assert_eq!(parent_in_stat("42 (a b) c)) S 7 42 42 0"), Some(7));
        assert_eq!(parent_in_stat("42 (sleep) S 1 42 42 0"), Some(1));
    }
}
