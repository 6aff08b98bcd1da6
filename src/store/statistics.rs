//! The planner's statistics of the scheduler's tables, refreshed by the
//! scheduler itself once its own writes have changed a large share of
//! them (a backfill's claims, a prune's deletes), as autovacuum would.
//!
//! With autovacuum off or behind (a bulk load on a managed database), a
//! fresh table keeps the statistics it had when it was small, and the claim
//! function's cached plans with them: a backfill into a new table slowed
//! from 2,700 to 386 periods/s by 257,000 rows, until an `ANALYZE` (then
//! 3,900/s). PostgreSQL only: SQLite keeps no statistics unless asked, and
//! its planner's rules of thumb pick the scheduler's indexes without them.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// The fewest rows written that call for a refresh.
const AT_LEAST: u64 = 10_000;

/// The share of the claims table, as of the last refresh, that calls for
/// the next (autovacuum's default is a tenth): the plans that matter here
/// change with the table's order of magnitude.
const SHARE: f64 = 0.2;

/// Rows written since the last refresh, and how many call for the next.
#[derive(Debug, Default)]
pub(crate) struct Statistics {
    written: AtomicU64,
    /// Rows written that call for the next refresh; 0: [`AT_LEAST`].
    due_at: AtomicU64,
    refreshing: AtomicBool,
}

impl Statistics {
    /// Counts `rows` written; whether a refresh is due, and this caller is
    /// the one to make it (one at a time per process).
    pub(crate) fn wrote(&self, rows: u64) -> bool {
        if rows == 0 {
            return false;
        }
        let written = self.written.fetch_add(rows, Ordering::Relaxed) + rows;
        let due = self.due_at.load(Ordering::Relaxed).max(AT_LEAST);
        written >= due && !self.refreshing.swap(true, Ordering::AcqRel)
    }

    /// A refresh ended: the count starts again, and the next refresh is due
    /// after a share of the `rows` the claims table holds now (unknown
    /// after a failed refresh: the last share stands).
    pub(crate) fn refreshed(&self, rows: Option<u64>) {
        self.written.store(0, Ordering::Relaxed);
        if let Some(rows) = rows {
            let share = (rows as f64 * SHARE) as u64;
            self.due_at.store(share.max(AT_LEAST), Ordering::Relaxed);
        }
        self.refreshing.store(false, Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refresh_is_due_after_a_share_of_the_table_and_made_once_at_a_time() {
        let stats = Statistics::default();
        assert!(!stats.wrote(AT_LEAST - 1));
        assert!(stats.wrote(1), "due at the threshold");
        assert!(!stats.wrote(AT_LEAST), "one refresh at a time");
        stats.refreshed(Some(1_000_000));
        assert!(!stats.wrote(AT_LEAST), "a fifth of a million rows");
        assert!(!stats.wrote(189_999));
        assert!(stats.wrote(1));
        stats.refreshed(None);
        assert!(!stats.wrote(199_999), "a failed refresh keeps the share");
        assert!(stats.wrote(1));
    }
}
