//! `scheduler logs JOB --period LABEL [--attempt N] [--follow] [--stream S]`:
//! an attempt's whole output as the database keeps it, read from any
//! replica, and followed while it runs.

use std::io::Write;
use std::time::Duration;

use crate::error::{Error, Outcome, Unread};
use crate::state::{AttemptOutcome, Stream};
use crate::store::{Attempt, Chunk, Store};

/// How many chunks one read takes.
const PAGE: u32 = 64;

/// How often a followed attempt is looked at for new output.
const FOLLOW_EVERY: Duration = Duration::from_millis(200);

/// What `logs` was asked for.
#[derive(Debug, Clone)]
pub struct Asked {
    /// `<job>:<label>`.
    pub key: String,
    /// The attempt; the newest without it.
    pub attempt: Option<i32>,
    /// Tail it until it ends.
    pub follow: bool,
    /// Only this stream.
    pub stream: Option<Stream>,
}

/// Prints the attempt's output, stdout's chunks to standard output and
/// stderr's to standard error, and what was left out between them on
/// standard error; exits as the attempt ended (1 for a failure).
pub async fn logs(store: &Store, asked: &Asked) -> Result<Outcome, Unread> {
    let mut attempt = the_attempt(store, asked).await?;
    let mut after = -1;
    let mut end = 0;
    let mut at_line_start = true;
    loop {
        let chunks = store
            .output(&asked.key, attempt.attempt, after, PAGE)
            .await?;
        let full = chunks.len() as u32 == PAGE;
        for chunk in &chunks {
            show(chunk, end, asked.stream, at_line_start)?;
            at_line_start = chunk.text.ends_with('\n');
            end = chunk.end();
            after = chunk.seq;
        }
        if full {
            continue;
        }
        if !asked.follow || attempt.outcome != AttemptOutcome::Running {
            break;
        }
        if let Some(gone) = runner_gone(store, asked, &attempt).await? {
            // What it wrote before it went is shown; then it ends here.
            if store
                .output(&asked.key, attempt.attempt, after, 1)
                .await?
                .is_empty()
            {
                eprintln!("{gone}");
                return Ok(Outcome::RunFailed);
            }
            continue;
        }
        tokio::time::sleep(FOLLOW_EVERY).await;
        // Read once more after it ended: what it printed last.
        attempt = the_attempt(
            store,
            &Asked {
                attempt: Some(attempt.attempt),
                ..asked.clone()
            },
        )
        .await?;
    }
    Ok(match attempt.outcome {
        AttemptOutcome::Failed | AttemptOutcome::Lost => Outcome::RunFailed,
        _ => Outcome::Done,
    })
}

/// The attempt asked for, or the period's newest; a usage error naming
/// what does not exist.
async fn the_attempt(store: &Store, asked: &Asked) -> Result<Attempt, Error> {
    let attempts = store.attempts(&asked.key, u32::MAX).await?;
    let found = match asked.attempt {
        Some(n) => attempts.into_iter().find(|a| a.attempt == n),
        None => attempts.into_iter().next(),
    };
    found.ok_or_else(|| {
        Error::Usage(match asked.attempt {
            Some(n) => format!("{} has no attempt {n}", asked.key),
            None => format!("{} has no attempt: it never ran", asked.key),
        })
    })
}

/// What `logs` says of `attempt` if its runner has let its lease run out
/// (it died, or is cut off); `None` while its lease holds.
async fn runner_gone(
    store: &Store,
    asked: &Asked,
    attempt: &Attempt,
) -> Result<Option<String>, Error> {
    let gone = store.lease_ran_out(&asked.key, attempt.attempt).await?;
    Ok(gone.map(|(owner, until)| {
        format!(
            "{}: attempt {} stopped when its runner {owner} let its lease run out at {} (it died or lost the database); the period runs again once a run or a scan takes it over",
            asked.key,
            attempt.attempt,
            crate::period::utc_text(until)
        )
    }))
}

/// Writes one chunk where its stream goes, after a line saying what was
/// left out before it (from `end`, where the one before ended), on a line
/// of its own.
fn show(chunk: &Chunk, end: i64, only: Option<Stream>, at_line_start: bool) -> Result<(), Unread> {
    let gap = chunk.at_byte - end;
    if gap > 0 {
        let past_max = gap - chunk.lost;
        let mut told = Vec::new();
        if past_max > 0 {
            told.push(format!("{past_max} byte(s) past output_max"));
        }
        if chunk.lost > 0 {
            told.push(format!(
                "{} byte(s) lost: the database fell behind the job",
                chunk.lost
            ));
        }
        let start = if at_line_start { "" } else { "\n" };
        eprintln!("{start}[… {} left out …]", told.join("; "));
    }
    if only.is_some_and(|s| s != chunk.stream) {
        return Ok(());
    }
    match chunk.stream {
        Stream::Stdout => {
            let mut out = std::io::stdout().lock();
            out.write_all(chunk.text.as_bytes())
                .and_then(|()| out.flush())?
        }
        Stream::Stderr => {
            let mut err = std::io::stderr().lock();
            let _ = err.write_all(chunk.text.as_bytes());
        }
    }
    Ok(())
}
