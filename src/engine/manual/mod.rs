//! Runs asked for by hand or by a one-shot step, for every front end that
//! asks (`scheduler run`, the HTTP API): the due periods of a job as one
//! `serve` wake-up would take them, one period, or a range, streamed a
//! chunk at a time. Each period ends as a [`Line`] handed to a [`Sink`].
//!
//! A [`Request`] is checked (`request`), planned (`plan`: which periods of
//! which jobs, in which order) and driven (`drive`: claimed and run a batch
//! at a time); `line` makes each period's line.

mod drive;
mod line;
mod plan;
mod request;

use crate::error::Unread;

pub use drive::drive;
pub use line::Line;
pub use request::{Request, Selection, check};
// The periods a front end names by label, which a request names too.
pub use crate::engine::labels::{
    Names, page_between, parse_label, period_of_label, periods_between, periods_up_to,
};

/// Where a manual run's lines go.
pub trait Sink: Send + Sync {
    /// How many periods the run goes through, when that is quick to know;
    /// said once, before the first line.
    fn total(&mut self, total: Option<u64>) {
        let _ = total;
    }

    /// `job` is paused: none of its due periods are run.
    fn paused(&mut self, job: &str) {
        tracing::info!(job, "paused: its due periods are not run");
    }

    /// `run JOB` found nothing of `job` to run now; `words` say why and
    /// when its next fire is.
    fn nothing_due(&mut self, job: &str, words: &str) {
        tracing::info!(target: "scheduler::sighting", job, "{words}");
    }

    /// A period was claimed and starts to run.
    fn claimed(&mut self, key: &str, attempt: i32) {
        let _ = (key, attempt);
    }

    /// One period ended; `Err` ends the run before its next claim (the
    /// reader went away).
    fn line(&mut self, line: &Line) -> Result<(), Unread>;

    /// Shutdown ended the run before its last period: the periods after
    /// the lines said so far were not run.
    fn cut_short(&mut self) {}
}
