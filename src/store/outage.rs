//! What this process saw of its database lately, for the one rule that
//! needs it: an expired lease is taken over only once the database has
//! answered this process for a while — one heartbeat interval (lease/3)
//! after the process started, one whole lease after it saw the database
//! fail.
//!
//! An expired lease usually means a dead runner. After an outage it may
//! also mean a live runner whose job finished while the database could not
//! be reached, still trying to write the outcome: taking the period over
//! then would run it twice. Once the database answers again the runner
//! writes its outcome, or renews its lease (an expired one too, while no
//! one took it), within half a heartbeat interval. So a replica that saw
//! the same outage waits one lease from its own return, and a process that
//! has just started — a one-shot `run` from a platform cron container that
//! fires the moment a restarted database comes back — waits one heartbeat
//! interval from the database's first answer: either way the runner gets in
//! first. A runner cut off *alone* for longer than its lease, or one that
//! died between the end of its job and the write, cannot be told apart from
//! a dead one: its period runs again (docs/design.md, "Crash at any
//! instant").

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The last thing this process saw of its database.
#[derive(Debug, Default)]
pub(crate) struct Outage(Mutex<Seen>);

#[derive(Debug, Default, Clone, Copy)]
enum Seen {
    /// Nothing yet: the process has just started.
    #[default]
    Nothing,
    /// Answering, for long enough.
    Answering,
    /// The last statement failed.
    Away,
    /// Answering since `since`; `outage` when a failure came before.
    Back { since: Instant, outage: bool },
}

impl Outage {
    /// Notes how a statement went.
    pub(crate) fn note<T, E>(&self, result: &Result<T, E>) {
        let Ok(mut seen) = self.0.lock() else {
            return;
        };
        *seen = match (*seen, result.is_ok()) {
            (_, false) => Seen::Away,
            (Seen::Nothing, true) => Seen::Back {
                since: Instant::now(),
                outage: false,
            },
            (Seen::Away, true) => {
                tracing::info!(
                    "the database answers again; an expired claim is left to its runner for one lease, which may still be writing its outcome"
                );
                Seen::Back {
                    since: Instant::now(),
                    outage: true,
                }
            }
            (seen, true) => seen,
        };
    }

    /// How long claims must still leave expired leases alone: the database
    /// has not answered yet, or is away (a whole `lease`, counted once it
    /// answers), or has answered for less than a heartbeat interval since
    /// this process started or for less than a `lease` since an outage.
    /// Zero when they may take them over.
    pub(crate) fn holding(&self, lease: Duration) -> Option<Duration> {
        let Ok(mut seen) = self.0.lock() else {
            return Some(lease);
        };
        let wait = match *seen {
            Seen::Answering => return None,
            Seen::Nothing => lease / 3,
            Seen::Away => lease,
            Seen::Back { since, outage } => {
                let hold = if outage { lease } else { lease / 3 };
                hold.saturating_sub(since.elapsed())
            }
        };
        if wait.is_zero() {
            *seen = Seen::Answering;
            return None;
        }
        Some(wait)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_holds_recoveries_for_one_lease_after_the_return() {
        let lease = Duration::from_millis(300);
        let outage = Outage::default();
        outage.note::<(), ()>(&Ok(()));
        std::thread::sleep(lease / 3);
        assert_eq!(outage.holding(lease), None, "answering since the start");
        outage.note::<(), ()>(&Err(()));
        assert!(outage.holding(lease).is_some(), "away");
        std::thread::sleep(lease * 2);
        assert!(outage.holding(lease).is_some(), "still away, however long");
        outage.note::<(), ()>(&Ok(()));
        outage.note::<(), ()>(&Ok(()));
        assert!(
            outage.holding(lease).is_some(),
            "back for less than a lease"
        );
        std::thread::sleep(lease);
        assert_eq!(outage.holding(lease), None, "back for a lease");
        outage.note::<(), ()>(&Err(()));
        assert!(outage.holding(lease).is_some(), "away again");
    }

    #[test]
    fn a_new_process_holds_recoveries_for_a_heartbeat_interval_of_answers() {
        let lease = Duration::from_millis(600);
        let outage = Outage::default();
        assert_eq!(
            outage.holding(lease),
            Some(lease / 3),
            "nothing answered yet"
        );
        std::thread::sleep(lease);
        assert!(outage.holding(lease).is_some(), "time alone is no answer");
        outage.note::<(), ()>(&Ok(()));
        let left = outage.holding(lease).expect("answered just now");
        assert!(left <= lease / 3, "{left:?}");
        std::thread::sleep(lease / 3);
        assert_eq!(outage.holding(lease), None, "answered for an interval");
    }
}
