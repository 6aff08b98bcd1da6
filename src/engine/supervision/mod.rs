//! Job processes: everything between the scheduler and a `command` or
//! `shell` job's process tree, so that no part of a tree outlives the
//! scheduler or its claim.
//! - [`launcher`]: the scheduler's side — starts each job's supervisor
//!   through the process's one zygote and talks to it;
//! - [`zygote`]: the child side, one per scheduler process, forking a
//!   supervisor per job;
//! - [`supervisor`]: the child side, one per job: subreaper, fence, the
//!   whole tree killed at the end;
//! - [`reaper`]: reaps orphans when the scheduler is PID 1.
//!
//! [`child_main`] is the one entry point of the child side, for the
//! `scheduler-supervise` binary and the scheduler's own `__supervise` mode.

use std::ffi::OsString;

pub mod launcher;
pub mod reaper;
pub mod supervisor;
pub mod zygote;

pub use launcher::{Ended, Launcher, Started, StatusPipe};
pub use supervisor::{ARG, BINARY, Spec, ZYGOTE};

/// Supervises the job `args` describe (`FENCE_MS -- PROGRAM ARGS…`) and
/// exits as the job did; with [`ZYGOTE`] first, serves a whole scheduler
/// process instead.
pub fn child_main(args: &[OsString]) -> ! {
    if args.first().is_some_and(|a| a == ZYGOTE) {
        zygote::serve()
    }
    let status =
        match supervisor::Spec::from_args(args).and_then(|spec| supervisor::supervise(&spec)) {
            Ok(status) => status,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(supervisor::CANNOT_START);
            }
        };
    supervisor::exit_like(status)
}
