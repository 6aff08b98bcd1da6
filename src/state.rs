//! The words of a period's life, typed: the state its claim is in, why
//! an attempt started, how it ended, and the states of the API's runs and
//! keys and of notifications. The store reads and writes them; every front
//! end shows them; words are made from them only where text is printed,
//! and a stored word no version writes is an error, never a guess.

use std::fmt;

use serde::Serialize;

/// `Display` (padded, so `{:<10}` lines up) and `Serialize` as the type's
/// word (`as_str`).
macro_rules! shown_as_word {
    ($name:ident) => {
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.pad(self.as_str())
            }
        }

        impl Serialize for $name {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                serializer.serialize_str(self.as_str())
            }
        }
    };
}

/// An enum whose every variant is one stored or shown word: `as_str`,
/// `parse` (`None` for a word no version writes), `ALL`, and
/// [`shown_as_word!`].
macro_rules! words {
    (
        $(#[$meta:meta])*
        pub enum $name:ident {
            $($(#[$variant_meta:meta])* $variant:ident = $word:literal,)+
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name {
            $($(#[$variant_meta])* $variant,)+
        }

        impl $name {
            /// Every value, in the order declared.
            pub const ALL: &'static [$name] = &[$($name::$variant,)+];

            /// The word stored and shown.
            pub fn as_str(self) -> &'static str {
                match self {
                    $($name::$variant => $word,)+
                }
            }

            /// The value a word names; `None` for a word no version of the
            /// scheduler writes.
            pub fn parse(word: &str) -> Option<$name> {
                match word {
                    $($word => Some($name::$variant),)+
                    _ => None,
                }
            }
        }

        shown_as_word!($name);

        /// A stored word read back (`#[sqlx(try_from = "String")]`).
        impl TryFrom<String> for $name {
            type Error = String;

            fn try_from(word: String) -> Result<$name, String> {
                $name::parse(&word)
                    .ok_or_else(|| format!("`{word}` is not a {}", stringify!($name)))
            }
        }
    };
}

words! {
    /// Where a period's claim stands in the database.
    pub enum ClaimState {
        /// An attempt holds it under its lease (expired or not).
        Running = "running",
        /// Its latest attempt succeeded.
        Succeeded = "succeeded",
        /// Its latest attempt failed; a retry may be due.
        Failed = "failed",
        /// Ended by `release` or a shutdown: held until its runner confirms
        /// the stop or its lease runs out, then claimable again.
        Released = "released",
    }
}

impl ClaimState {
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

shown_as_word!(PeriodState);

words! {
    /// What became of one period a run asked for: the word of its line in
    /// `run`, the API's `status` and the library's outcome.
    #[non_exhaustive]
    pub enum PeriodOutcome {
        /// It ran and succeeded.
        Succeeded = "succeeded",
        /// It ran and failed.
        Failed = "failed",
        /// Its claim was taken over while it ran; nothing recorded here.
        Lost = "lost",
        /// Stopped by `release` or a shutdown; its claim let go.
        Released = "released",
        /// Its lease could not be renewed in time; nothing recorded.
        Fenced = "fenced",
        /// It ran, but its outcome could not be written.
        Error = "error",
        /// Not run: done already (succeeded or adopted), passed over (not
        /// failed, asked for only failed ones), or a failed period whose
        /// retry is not due.
        Skipped = "skipped",
        /// Not run here: a live claim holds it, elsewhere or in this
        /// process; how that run ends is not known here.
        Held = "held",
        /// Not run: every concurrency slot of its job was taken.
        Busy = "busy",
        /// Not run: a shutdown came while it waited.
        Interrupted = "interrupted",
        /// Not run: an upstream period it needs has not succeeded.
        Waiting = "waiting",
        /// `--dry-run`: it would be claimed.
        WouldClaim = "would claim",
    }
}

impl PeriodOutcome {
    /// The word `scheduler run` prints and the HTTP API lists: `skipped`
    /// for a held period too, as they always said (the API's line adds
    /// `"held": true`).
    pub fn printed(self) -> &'static str {
        match self {
            PeriodOutcome::Held => PeriodOutcome::Skipped.as_str(),
            other => other.as_str(),
        }
    }
}

words! {
    /// Which of a job's streams a piece of its output came on.
    pub enum Stream {
        /// Its standard output.
        Stdout = "stdout",
        /// Its standard error.
        Stderr = "stderr",
    }
}

words! {
    /// Why a run started; what the job sees as `SCHEDULER_TRIGGER`.
    pub enum Trigger {
        /// The latest fire.
        Schedule = "schedule",
        /// An older fire, or one that waited for a concurrency slot.
        CatchUp = "catch-up",
        /// A failed period whose retry came due.
        Retry = "retry",
        /// Taking over an expired or released claim.
        Recovery = "recovery",
        /// `run --period` or `--from/--to`.
        Manual = "manual",
        /// It waited for its upstream periods and they are done now, or one
        /// of them succeeded again and its job reruns on that
        /// (`on_upstream_rerun = "rerun"`).
        Upstream = "upstream",
        /// Recorded by `scheduler adopt`: an earlier system ran it; no job
        /// ever starts under this trigger.
        Adopted = "adopted",
    }
}

words! {
    /// How one attempt ended, as its history row says.
    pub enum AttemptOutcome {
        /// It still runs (or its runner went away and nobody took it over
        /// yet).
        Running = "running",
        /// Its job succeeded.
        Succeeded = "succeeded",
        /// Its job failed.
        Failed = "failed",
        /// Stopped by `release` or a shutdown.
        Released = "released",
        /// Taken over by another attempt after its lease ran out.
        Lost = "lost",
    }
}

words! {
    /// Where a stored Idempotency-Key stands.
    pub enum KeyState {
        /// Its first request is being answered.
        Running = "running",
        /// Its answer is stored, replayed to every retry.
        Answered = "answered",
    }
}

words! {
    /// Where a run asked for over the API stands, as stored.
    pub enum ApiRunState {
        /// Its replica runs it (if that replica still keeps it alive).
        Running = "running",
        /// Every period it asked for ended.
        Done = "done",
    }
}

words! {
    /// Where one notification stands.
    pub enum DeliveryState {
        /// Waiting to be sent (or tried again).
        Pending = "pending",
        /// A replica is sending it under a delivery lease.
        Sending = "sending",
        /// Its receiver took it.
        Delivered = "delivered",
        /// Given up: refused for good, or out of tries or time.
        GivenUp = "given_up",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_trigger_reads_back_from_its_word_and_no_other_word_is_one() {
        for &trigger in Trigger::ALL {
            assert_eq!(Trigger::parse(trigger.as_str()), Some(trigger));
        }
        for word in ["", "Schedule", "catch_up", "recovered", "scheduled"] {
            assert_eq!(Trigger::parse(word), None, "{word}");
        }
    }

    /// Every word type: each value reads back from its word, its words
    /// are distinct, and a stored word no version writes is refused with
    /// its name.
    #[test]
    fn every_stored_word_reads_back_and_an_unknown_one_is_refused() {
        fn check<T: Copy + PartialEq + fmt::Debug + TryFrom<String, Error = String>>(
            all: &[T],
            word: fn(T) -> &'static str,
        ) {
            let words: std::collections::HashSet<&str> = all.iter().map(|&t| word(t)).collect();
            assert_eq!(words.len(), all.len());
            for &value in all {
                assert_eq!(T::try_from(word(value).to_owned()), Ok(value));
            }
            let refused = T::try_from("bogus".to_owned()).unwrap_err();
            assert!(refused.contains("`bogus` is not a"), "{refused}");
        }
        check(ClaimState::ALL, ClaimState::as_str);
        check(PeriodOutcome::ALL, PeriodOutcome::as_str);
        check(Trigger::ALL, Trigger::as_str);
        check(AttemptOutcome::ALL, AttemptOutcome::as_str);
        check(KeyState::ALL, KeyState::as_str);
        check(ApiRunState::ALL, ApiRunState::as_str);
        check(DeliveryState::ALL, DeliveryState::as_str);
    }
}
