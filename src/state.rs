//! The words of a period's life, typed: the state its claim is in and why
//! an attempt started. The store reads and writes them; every front end
//! shows them; words are made from them only where text is printed.

use std::fmt;

use serde::Serialize;

/// Where a period's claim stands in the database.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ClaimState {
    /// An attempt holds it under its lease (expired or not).
    Running,
    /// Its latest attempt succeeded.
    Succeeded,
    /// Its latest attempt failed; a retry may be due.
    Failed,
    /// Ended by `release` or a shutdown: held until its runner confirms the
    /// stop or its lease runs out, then claimable again.
    Released,
}

impl ClaimState {
    /// The word stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            ClaimState::Running => "running",
            ClaimState::Succeeded => "succeeded",
            ClaimState::Failed => "failed",
            ClaimState::Released => "released",
        }
    }

    /// The state a stored word names; `None` for a word no version of the
    /// scheduler writes.
    pub fn parse(word: &str) -> Option<ClaimState> {
        match word {
            "running" => Some(ClaimState::Running),
            "succeeded" => Some(ClaimState::Succeeded),
            "failed" => Some(ClaimState::Failed),
            "released" => Some(ClaimState::Released),
            _ => None,
        }
    }

    /// Whether an attempt may still be running under it: a running claim,
    /// or a released one whose runner has not yet confirmed the stop.
    pub fn is_live(self) -> bool {
        matches!(self, ClaimState::Running | ClaimState::Released)
    }

    /// Whether its latest attempt ended with an outcome.
    pub fn is_finished(self) -> bool {
        matches!(self, ClaimState::Succeeded | ClaimState::Failed)
    }
}

impl fmt::Display for ClaimState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

/// Where one period stands now: the one view of a period (docs/commands.md) that
/// every mode and view reads, made from its claim (if any), its fire, when
/// its job was first seen, `catch_up`, its upstream periods and the
/// database's clock. Past its deadline an unfinished period is also
/// *late*: a mark beside the state, not a state of its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeriodState {
    /// Its fire is still ahead.
    NotDue,
    /// Fired before the job was first seen (and not the latest fire
    /// within `catch_up` of that sighting): nobody runs it on its own.
    /// Drawn neutral, never as an alarm.
    BeforeFirstSeen,
    /// Fired since the job owes its fires, within `catch_up`, never
    /// claimed: the next wake-up, scan or `run JOB` takes it.
    Due,
    /// Fired since the job owes its fires, older than `catch_up`, never
    /// claimed: nobody runs it on its own; an alarm.
    Missed,
    /// Due and never claimed, and an upstream period it needs (its job's
    /// `after`) has not succeeded: claimed once they all have.
    Waiting,
    /// Due and never claimed, and every upstream period it needs has
    /// succeeded: the next scan or `run JOB` takes it.
    Ready,
    /// An attempt runs it under a live lease.
    Running,
    /// Released while running: held until its runner confirms the stop or
    /// its lease runs out.
    Stopping,
    /// Its runner's lease ran out: the next scan or `run` takes it over.
    LeaseExpired,
    /// Released and let go: the next scan or `run` runs it again.
    Released,
    /// Its latest attempt succeeded.
    Succeeded,
    /// Its latest attempt failed.
    Failed,
    /// Its latest attempt succeeded, but an upstream period it needs
    /// succeeded again since that attempt started (a forced rerun): its
    /// result may be built on what was replaced.
    Stale,
    /// Recorded by `scheduler adopt` as done by an earlier system: never
    /// run here, succeeded for `after`.
    Adopted,
}

impl PeriodState {
    /// The word shown (a stopping period reads `released`, as its claim
    /// does).
    pub fn as_str(self) -> &'static str {
        match self {
            PeriodState::NotDue => "not due",
            PeriodState::BeforeFirstSeen => "before first seen",
            PeriodState::Due => "due",
            PeriodState::Missed => "missed",
            PeriodState::Waiting => "waiting",
            PeriodState::Ready => "ready",
            PeriodState::Running => "running",
            PeriodState::Stopping | PeriodState::Released => "released",
            PeriodState::LeaseExpired => "lease expired",
            PeriodState::Succeeded => "succeeded",
            PeriodState::Failed => "failed",
            PeriodState::Stale => "stale",
            PeriodState::Adopted => "adopted",
        }
    }

    /// Whether it is done: succeeded (stale too: it did) or adopted. A
    /// period not done is late once its deadline passed, unless nobody
    /// owes it (before first seen) or its fire is ahead.
    pub fn is_done(self) -> bool {
        matches!(
            self,
            PeriodState::Succeeded | PeriodState::Stale | PeriodState::Adopted
        )
    }

    /// Whether a deadline can make it late: owed and not done.
    pub fn can_be_late(self) -> bool {
        !self.is_done() && !matches!(self, PeriodState::NotDue | PeriodState::BeforeFirstSeen)
    }
}

impl fmt::Display for PeriodState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl Serialize for PeriodState {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// What became of one period a run asked for: the word of its line in
/// `run`, the API's `status` and the library's outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PeriodOutcome {
    /// It ran and succeeded.
    Succeeded,
    /// It ran and failed.
    Failed,
    /// Its claim was taken over while it ran; nothing recorded here.
    Lost,
    /// Stopped by `release` or a shutdown; its claim let go.
    Released,
    /// Its lease could not be renewed in time; nothing recorded.
    Fenced,
    /// It ran, but its outcome could not be written.
    Error,
    /// Not run: done, running elsewhere, or not due for a retry.
    Skipped,
    /// Not run: every concurrency slot of its job was taken.
    Busy,
    /// Not run: a shutdown came while it waited.
    Interrupted,
    /// Not run: an upstream period it needs has not succeeded.
    Waiting,
    /// `--dry-run`: it would be claimed.
    WouldClaim,
}

impl PeriodOutcome {
    /// The word shown.
    pub fn as_str(self) -> &'static str {
        match self {
            PeriodOutcome::Succeeded => "succeeded",
            PeriodOutcome::Failed => "failed",
            PeriodOutcome::Lost => "lost",
            PeriodOutcome::Released => "released",
            PeriodOutcome::Fenced => "fenced",
            PeriodOutcome::Error => "error",
            PeriodOutcome::Skipped => "skipped",
            PeriodOutcome::Busy => "busy",
            PeriodOutcome::Interrupted => "interrupted",
            PeriodOutcome::Waiting => "waiting",
            PeriodOutcome::WouldClaim => "would claim",
        }
    }
}

impl fmt::Display for PeriodOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.pad(self.as_str())
    }
}

impl Serialize for PeriodOutcome {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(self.as_str())
    }
}

/// Why a run started; what the job sees as `SCHEDULER_TRIGGER`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Trigger {
    /// The latest fire.
    Schedule,
    /// An older fire, or one that waited for a concurrency slot.
    CatchUp,
    /// A failed period whose retry came due.
    Retry,
    /// Taking over an expired or released claim.
    Recovery,
    /// `run --period` or `--from/--to`.
    Manual,
    /// It waited for its upstream periods and they are done now, or one
    /// of them succeeded again and its job reruns on that
    /// (`on_upstream_rerun = "rerun"`).
    Upstream,
    /// Recorded by `scheduler adopt`: an earlier system ran it; no job
    /// ever starts under this trigger.
    Adopted,
}

impl Trigger {
    /// The name stored and shown.
    pub fn as_str(self) -> &'static str {
        match self {
            Trigger::Schedule => "schedule",
            Trigger::CatchUp => "catch-up",
            Trigger::Retry => "retry",
            Trigger::Recovery => "recovery",
            Trigger::Manual => "manual",
            Trigger::Upstream => "upstream",
            Trigger::Adopted => "adopted",
        }
    }

    /// The trigger a stored word names; `None` for a word no version
    /// writes (never a guess).
    pub fn parse(word: &str) -> Option<Trigger> {
        Trigger::ALL.into_iter().find(|t| t.as_str() == word)
    }

    /// Every trigger, in the order above.
    pub const ALL: [Trigger; 7] = [
        Trigger::Schedule,
        Trigger::CatchUp,
        Trigger::Retry,
        Trigger::Recovery,
        Trigger::Manual,
        Trigger::Upstream,
        Trigger::Adopted,
    ];
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_trigger_reads_back_from_its_word_and_no_other_word_is_one() {
        for trigger in Trigger::ALL {
            assert_eq!(Trigger::parse(trigger.as_str()), Some(trigger));
        }
        for word in ["", "Schedule", "catch_up", "recovered", "scheduled"] {
            assert_eq!(Trigger::parse(word), None, "{word}");
        }
    }
}
