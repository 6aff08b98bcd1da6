//! `scheduler man`: one page for the whole program. clap_mangen renders the
//! title, synopsis, description and global options; the commands follow in
//! a section of their own, each with its usage and options (clap_mangen
//! would point at a `scheduler-serve(1)` page per command, which nothing
//! installs), then EXIT STATUS and ENVIRONMENT.

use clap::CommandFactory;
use roff::{Roff, bold, italic, roman};

use super::Cli;

/// The exit codes, as every command uses them.
const EXIT_STATUS: [(&str, &str); 5] = [
    (
        "0",
        "Done. A period that another replica has done or is doing counts as done.",
    ),
    (
        "1",
        "A run failed (its failure is recorded, with its retry time).",
    ),
    (
        "2",
        "A usage or configuration error, found before the database is touched; also a period that is not due or not running.",
    ),
    (
        "3",
        "The database or another part of the environment failed; a run that could not renew its lease stopped its job and recorded nothing (fenced).",
    ),
    (
        "141",
        "Standard output was closed (`| head`): a run finished the period it was running and claimed no more.",
    ),
];

/// The variables the scheduler reads.
const ENVIRONMENT: [(&str, &str); 6] = [
    (
        "SCHEDULER_CONFIG",
        "The jobs file, when --config is not given (default ./jobs.toml).",
    ),
    (
        "DATABASE_URL",
        "The database, when --database-url is not given; it wins over [scheduler].database_url. Never passed on to a job that does not name it.",
    ),
    (
        "PGPASSWORD",
        "A PostgreSQL password as PostgreSQL's own tools take it. Never passed on to a job that does not name it, and masked in every job's output.",
    ),
    (
        "SCHEDULER_LOG",
        "What is logged, as a tracing filter (e.g. info, scheduler=debug).",
    ),
    (
        "NO_COLOR",
        "When set and not empty, no colour on a terminal.",
    ),
    (
        "${NAME}",
        "Any variable jobs.toml names: read when the file is loaded, masked in every message, and passed on only to the jobs that name it.",
    ),
];

/// The whole page, as roff.
pub fn page() -> std::io::Result<Vec<u8>> {
    let mut cli = Cli::command().disable_help_subcommand(true);
    cli.build();
    let man = clap_mangen::Man::new(cli.clone());
    let mut out = Vec::new();
    man.render_title(&mut out)?;
    man.render_name_section(&mut out)?;
    man.render_synopsis_section(&mut out)?;
    man.render_description_section(&mut out)?;
    man.render_options_section(&mut out)?;
    let mut roff = Roff::new();
    roff.control("SH", ["COMMANDS"]);
    for command in cli.get_subcommands().filter(|c| !c.is_hide_set()) {
        describe(&mut roff, &mut command.clone());
    }
    roff.control("SH", ["EXIT STATUS"]);
    for (code, meaning) in EXIT_STATUS {
        roff.control("TP", [])
            .text([bold(code)])
            .text([roman(meaning)]);
    }
    roff.control("SH", ["ENVIRONMENT"]);
    for (name, meaning) in ENVIRONMENT {
        roff.control("TP", [])
            .text([bold(name)])
            .text([roman(meaning)]);
    }
    roff.control("SH", ["SEE ALSO"]);
    roff.text([roman(
        "README.md and docs/ of the source, for jobs.toml, the HTTP API and operations.",
    )]);
    roff.to_writer(&mut out)?;
    Ok(out)
}

/// One command: its usage, what it does, and its own options.
fn describe(roff: &mut Roff, command: &mut clap::Command) {
    let usage = command.render_usage().to_string();
    let usage = usage.trim_start_matches("Usage: ");
    roff.control("SS", [command.get_name()]);
    roff.text([bold(usage)]);
    if let Some(about) = command.get_long_about().or_else(|| command.get_about()) {
        roff.control("PP", []).text([roman(about.to_string())]);
    }
    for arg in command
        .get_arguments()
        .filter(|a| !a.is_hide_set() && !a.is_global_set())
    {
        let mut flags: Vec<String> = Vec::new();
        if let Some(short) = arg.get_short() {
            flags.push(format!("-{short}"));
        }
        if let Some(long) = arg.get_long() {
            flags.push(format!("--{long}"));
        }
        let value = arg.get_value_names().map(|names| {
            names
                .iter()
                .map(|n| n.to_string())
                .collect::<Vec<_>>()
                .join(" ")
        });
        let mut head = vec![bold(flags.join(", "))];
        match (flags.is_empty(), value) {
            (true, _) => head = vec![italic(arg.get_id().to_string().to_uppercase())],
            (false, Some(value)) if arg.get_action().takes_values() => {
                head.push(roman(" "));
                head.push(italic(value));
            }
            _ => {}
        }
        roff.control("TP", []).text(head);
        if let Some(help) = arg.get_long_help().or_else(|| arg.get_help()) {
            roff.text([roman(help.to_string())]);
        }
    }
}
