//! What this process saw of its database lately, for the one rule that
//! needs it: after the database was away, an expired lease is not taken
//! over until the database has answered this process for one whole lease.
//!
//! An expired lease usually means a dead runner. After an outage it may
//! also mean a live runner whose job finished while the database could not
//! be reached, still trying to write the outcome: taking the period over
//! then would run it twice. The runner renews its lease (an expired one
//! too, while no one took it) within one heartbeat interval of reaching
//! the database again, so a replica that saw the same outage waits one
//! lease from its own return before it recovers anything. A runner cut off
//! alone for longer than that, or one that died between the end of its job
//! and the write, cannot be told apart from a dead one: its period runs
//! again (docs/design.md, "Crash at any instant").

use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// The last thing this process saw of its database.
#[derive(Debug, Default)]
pub(crate) struct Outage(Mutex<Seen>);

#[derive(Debug, Default, Clone, Copy)]
enum Seen {
    /// Answering, and no failure seen lately.
    #[default]
    Answering,
    /// The last statement failed.
    Away,
    /// Answering again since this instant.
    Back(Instant),
}

impl Outage {
    /// Notes how a statement went.
    pub(crate) fn note<T, E>(&self, result: &Result<T, E>) {
        let Ok(mut seen) = self.0.lock() else {
            return;
        };
        *seen = match (*seen, result.is_ok()) {
            (_, false) => Seen::Away,
            (Seen::Away, true) => {
                tracing::info!(
                    "the database answers again; an expired claim is left to its runner for one lease, which may still be writing its outcome"
                );
                Seen::Back(Instant::now())
            }
            (seen, true) => seen,
        };
    }

    /// Whether claims must leave expired leases alone now: the database is
    /// away, or has answered again for less than `lease`.
    pub(crate) fn holding(&self, lease: Duration) -> bool {
        let Ok(mut seen) = self.0.lock() else {
            return true;
        };
        match *seen {
            Seen::Answering => false,
            Seen::Away => true,
            Seen::Back(at) if at.elapsed() < lease => true,
            Seen::Back(_) => {
                *seen = Seen::Answering;
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_outage_holds_recoveries_for_one_lease_after_the_return() {
        let lease = Duration::from_millis(300);
        let outage = Outage::default();
        assert!(!outage.holding(lease), "nothing failed yet");
        outage.note::<(), ()>(&Err(()));
        assert!(outage.holding(lease), "away");
        std::thread::sleep(lease * 2);
        assert!(outage.holding(lease), "still away, however long");
        outage.note::<(), ()>(&Ok(()));
        outage.note::<(), ()>(&Ok(()));
        assert!(outage.holding(lease), "back for less than a lease");
        std::thread::sleep(lease);
        assert!(!outage.holding(lease), "back for a lease");
        outage.note::<(), ()>(&Err(()));
        assert!(outage.holding(lease), "away again");
    }
}
