//! The `scheduler` binary: parse the command line, start logging, run the
//! command, map the result to an exit code.

use std::process::ExitCode;

use clap::Parser;
use nix::sys::signal::{SigHandler, Signal};
use scheduler::cli::{Cli, Command, LogFormat};
use scheduler::engine::supervision;
use tracing_subscriber::EnvFilter;

fn main() -> ExitCode {
    // A job's supervisor is this binary started by the scheduler.
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if args.get(1).is_some_and(|a| a == supervision::ARG) {
        supervision::child_main(&args[2..]);
    }
    // A SIGHUP tells `serve` to read jobs.toml again. Until `serve` listens
    // for it, one that comes must not end the process by the default
    // action; the other commands keep that action (a command line that
    // merely holds the word `serve` ignores it until it is parsed).
    let serving = args.iter().any(|a| a == "serve");
    if serving {
        hangup(SigHandler::SigIgn);
    }
    let cli = Cli::parse();
    if serving && !matches!(cli.command, Command::Serve { .. }) {
        hangup(SigHandler::SigDfl);
    }
    // Before the log's writer thread starts: a thread that allocates
    // before the limit is set gets an arena of its own, which the runtime's
    // threads then share with the main one.
    if matches!(cli.command, Command::Serve { .. }) {
        tune_malloc();
    }
    let logging = init_logging(&cli);
    // `serve` runs many jobs at once on every core; the other commands do
    // one thing at a time, and a single thread spares them the hand-offs
    // between threads (a backfill of /bin/true runs ~15 % faster).
    let runtime = match cli.command {
        Command::Serve { .. } => tokio::runtime::Runtime::new(),
        _ => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
    };
    let runtime = match runtime {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::from(3);
        }
    };
    let result = runtime.block_on(scheduler::cli::app::execute(cli));
    // Every job has ended and every claim is settled by now; what is left
    // (a task stuck in a blocking call) must not keep the process from
    // exiting: dropping the runtime would wait for it for ever.
    runtime.shutdown_timeout(EXIT_WAIT);
    // The log's last lines go out before the error, within a second;
    // unless its reader has stopped reading (lines were dropped), when
    // waiting for it would only delay the exit (and tracing-appender
    // would print its complaint on stdout, where results go).
    let (guard, dropped) = logging;
    match dropped.dropped_lines() {
        0 => drop(guard),
        _ => std::mem::forget(guard),
    }
    match result {
        Ok(outcome) => ExitCode::from(outcome.exit_code()),
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(scheduler::cli::exit_code(&e))
        }
    }
}

/// Log lines a reader of the log may fall behind by before new ones are
/// dropped: the log is written on a thread of its own, so a slow reader
/// (a pipe, a log shipper) never holds up a job, a heartbeat or a fire.
const LOG_BACKLOG: usize = 1024;

/// How long the process waits at exit for tasks still in the runtime.
const EXIT_WAIT: std::time::Duration = std::time::Duration::from_secs(2);

/// `serve`'s heap, set before its threads start: one malloc arena, and
/// blocks of 128 KiB or more (a burst's backlog of 10,000 fires, a claim's
/// bind buffer) mapped apart and handed back when freed. glibc's defaults (an
/// arena per thread, a threshold that rises after each such block is freed)
/// left a 10,000-job burst's periods spread over the worker threads' arenas:
/// 34–36 MiB resident at its peak, 31–32 MiB so. A `MALLOC_…_` variable the
/// operator set wins.
fn tune_malloc() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    for (variable, parameter, value) in [
        ("MALLOC_ARENA_MAX", libc::M_ARENA_MAX, 1),
        ("MALLOC_MMAP_THRESHOLD_", libc::M_MMAP_THRESHOLD, 128 * 1024),
        ("MALLOC_TRIM_THRESHOLD_", libc::M_TRIM_THRESHOLD, 128 * 1024),
    ] {
        if std::env::var_os(variable).is_none() {
            // SAFETY: mallopt changes how later allocations are served;
            // nothing allocated moves.
            unsafe {
                libc::mallopt(parameter, value);
            }
        }
    }
}

/// Sets what a SIGHUP does. `serve` installs its own handler before it
/// starts anything, so no job inherits an ignored SIGHUP (one stays ignored
/// across `exec`).
fn hangup(action: SigHandler) {
    // SAFETY: ignoring a signal or restoring its default installs no
    // handler.
    let _ = unsafe { nix::sys::signal::signal(Signal::SIGHUP, action) };
}

fn init_logging(
    cli: &Cli,
) -> (
    tracing_appender::non_blocking::WorkerGuard,
    tracing_appender::non_blocking::ErrorCounter,
) {
    let level = match (cli.quiet, cli.verbose) {
        (true, _) => "warn",
        (false, 0) => "info",
        (false, 1) => "debug",
        (false, _) => "trace",
    };
    // A person running `run` at a terminal reads each period's outcome
    // on its result line: the engine's claim and outcome lines, which a
    // cron container's log keeps, would say it twice (warnings still show).
    let at_terminal = matches!(cli.command, scheduler::cli::Command::Run(_))
        && cli.verbose == 0
        && std::io::IsTerminal::is_terminal(&std::io::stdout());
    let engine = if at_terminal {
        ",scheduler::engine=warn"
    } else {
        ""
    };
    // `-v` and `-vv` raise the scheduler's own lines (and its jobs'
    // output); other crates stay at `info`: their debug and trace lines
    // quote hosts, headers and parameters the scheduler masks in its own.
    // sqlx's own warnings quote connection parameters (a key's passphrase
    // among them) and whole statements: the scheduler says what failed
    // itself. `SCHEDULER_LOG` sets any filter, unmasked, on purpose.
    let others = if cli.quiet { "warn" } else { "info" };
    let filter = EnvFilter::try_from_env("SCHEDULER_LOG").unwrap_or_else(|_| {
        EnvFilter::new(format!(
            "{others},scheduler={level},job={level},sqlx=error{engine}"
        ))
    });
    // Colour only for a person at a terminal: log files, pipes and
    // container logs get plain text.
    let colour = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
    // A log that cannot be written (its reader went away) is dropped: the
    // default reports that with `eprintln!`, which panics on a closed
    // stderr and would take down the task that was logging — a run's. Log
    // lines are drawn around `run`'s progress bar, on the log's thread.
    let (writer, guard) = tracing_appender::non_blocking::NonBlockingBuilder::default()
        .lossy(true)
        .buffered_lines_limit(LOG_BACKLOG)
        .thread_name("log")
        .finish(scheduler::cli::run::Stderr);
    let dropped = writer.error_counter();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(colour)
        .log_internal_errors(false)
        .with_writer(writer);
    match cli.log_format {
        LogFormat::Text => builder.init(),
        LogFormat::Json => builder.json().init(),
    }
    (guard, dropped)
}
