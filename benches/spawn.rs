//! Figures for starting a job process: the old way (`pre_exec` for a
//! parent-death signal, which forces fork + exec), a supervisor started as a
//! program of its own for each job (the small `scheduler-supervise` binary on
//! the `posix_spawn` path, which then starts the job; and the whole
//! scheduler binary in supervisor mode), the way jobs start now (each
//! job's supervisor forked by the process's one zygote, which then starts
//! the job), and a bare `posix_spawn` for reference, each from a small
//! parent and from one holding 1 GiB. Run with `cargo bench --bench spawn`.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Instant;

const SPAWNS: usize = 300;

/// Spawns per second of `make`, each waited for.
fn rate(mut make: impl FnMut() -> Command) -> f64 {
    let started = Instant::now();
    for _ in 0..SPAWNS {
        // A supervisor ends its job when its stdin closes: keep it open, as
        // the scheduler does, until the job has ended.
        let mut child = make()
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .expect("spawn");
        let stdin = child.stdin.take();
        assert!(child.wait().expect("wait").success());
        drop(stdin);
    }
    SPAWNS as f64 / started.elapsed().as_secs_f64()
}

fn bare() -> Command {
    let mut command = Command::new("/bin/true");
    command.process_group(0);
    command
}

fn with_pre_exec() -> Command {
    let mut command = Command::new("/bin/true");
    command.process_group(0);
    // SAFETY: prctl is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            nix::sys::prctl::set_pdeathsig(nix::sys::signal::Signal::SIGKILL)?;
            Ok(())
        });
    }
    command
}

fn supervised() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_scheduler-supervise"));
    command.args(["60000", "--", "/bin/true"]).process_group(0);
    command
}

fn supervised_by_scheduler() -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_scheduler"));
    command
        .args([
            scheduler::engine::supervision::ARG,
            "60000",
            "--",
            "/bin/true",
        ])
        .process_group(0);
    command
}

/// Jobs per second started through a zygote, each waited for.
fn zygote_rate(launcher: &scheduler::engine::supervision::Launcher) -> f64 {
    use scheduler::engine::supervision::Ended;
    use scheduler::engine::supervision::Spec;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    runtime.block_on(async {
        let spec = Spec {
            fence_ms: 60_000,
            program: "/bin/true".into(),
            args: Vec::new(),
            env: Vec::new(),
            workdir: None,
        };
        // The zygote's own start is paid once, not per job.
        launcher
            .start(&spec)
            .await
            .expect("start")
            .status
            .ended()
            .await;
        let started = Instant::now();
        for _ in 0..SPAWNS {
            let mut job = launcher.start(&spec).await.expect("start");
            assert_eq!(job.status.ended().await, Ended::Exited(0));
        }
        SPAWNS as f64 / started.elapsed().as_secs_f64()
    })
}

fn report(parent: &str) {
    let zygote = scheduler::engine::supervision::Launcher::new(
        env!("CARGO_BIN_EXE_scheduler-supervise").into(),
        Vec::new(),
    );
    let figures = [
        ("bare posix_spawn", rate(bare)),
        (
            "before: pre_exec + PR_SET_PDEATHSIG (fork)",
            rate(with_pre_exec),
        ),
        (
            "now: zygote forks the supervisor + job",
            zygote_rate(&zygote),
        ),
        ("a scheduler-supervise per job + job", rate(supervised)),
        (
            "a scheduler __supervise per job + job",
            rate(supervised_by_scheduler),
        ),
    ];
    println!("{parent}, {SPAWNS} spawns of /bin/true, each waited for:");
    for (what, rate) in figures {
        println!("  {what:<44} {rate:>5.0}/s ({:.2} ms)", 1000.0 / rate);
    }
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        return;
    }
    report("small parent");
    // Touch every page so the memory is really mapped: fork copies the
    // page tables of what is resident.
    let big: Vec<u8> = vec![1; 1 << 30];
    let touched: u64 = big.iter().step_by(4096).map(|b| u64::from(*b)).sum();
    report(&format!("1 GiB parent ({touched} pages)"));
    drop(big);
}
