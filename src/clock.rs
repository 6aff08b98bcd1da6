//! What time it is, as the serve loop asks it: the system's wall clock, or
//! in a test a clock that moves only when the test moves it, so a day of
//! fires and a DST change are driven without sleeping.

use std::sync::Mutex;

use chrono::{DateTime, TimeDelta, Utc};

/// The wall clock, as the loop reads it.
pub trait Clock: Send + Sync {
    /// Now, in UTC.
    fn now(&self) -> DateTime<Utc>;
}

/// The system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> DateTime<Utc> {
        Utc::now()
    }
}

/// A clock that stands still until it is set or moved on.
#[derive(Debug)]
pub struct StoppedClock(Mutex<DateTime<Utc>>);

impl StoppedClock {
    /// A clock at `at`.
    pub fn at(at: DateTime<Utc>) -> StoppedClock {
        StoppedClock(Mutex::new(at))
    }

    /// Moves it on by `by`.
    pub fn advance(&self, by: TimeDelta) {
        if let Ok(mut now) = self.0.lock() {
            *now += by;
        }
    }
}

impl Clock for StoppedClock {
    fn now(&self) -> DateTime<Utc> {
        self.0.lock().map_or_else(|e| *e.into_inner(), |now| *now)
    }
}
