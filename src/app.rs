//! Runs a parsed command line: loads the configuration, opens the database
//! where the command needs it, and dispatches.

use chrono::Utc;

use crate::check;
use crate::cli::{Cli, Command};
use crate::config::Config;
use crate::error::{Error, Outcome};

/// Runs `cli`'s command to completion.
pub async fn run(cli: Cli) -> Result<Outcome, Error> {
    let config = Config::load(&cli.config)?;
    let mut out = std::io::stdout().lock();
    let io = |e: std::io::Error| Error::Environment(e.into());
    match cli.command {
        Command::Check => check::check(&config, Utc::now(), &mut out).map_err(io)?,
        Command::Next { job, count, after } => {
            let job = config.job(&job)?;
            check::next(job, after.unwrap_or_else(Utc::now), count, &mut out).map_err(io)?;
        }
        _ => return Err(Error::Usage("this command is not built yet".into())),
    }
    Ok(Outcome::Done)
}
