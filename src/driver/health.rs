//! What `/healthz` (liveness) and `/readyz` (readiness) report, kept by the
//! driver's loop whether or not anything listens: each loop its own
//! ([`crate::driver::Service::health`]), handed to the listener that
//! reports it.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What the probes report, shared by the serve loop and the listener.
/// Each loop makes its own ([`Health::new`]): two schedulers in one
/// process are ready, or not, each on its own.
///
/// The loop calls [`Health::loop_alive`] on every wake-up and
/// [`Health::database_ok`] after every database call that succeeded (the
/// regular scan at least). `/healthz` answers 200 while the loop woke
/// recently, whatever the database does; `/readyz` once start-up is over
/// and while the database answered recently (see [`Health::watch`]); each
/// 503 says what is stale. Times are monotonic, so a step of the wall clock
/// changes nothing.
#[derive(Debug)]
pub struct Health {
    /// Monotonic milliseconds (plus one; 0 = never) of the last loop tick.
    loop_tick: AtomicU64,
    /// The same for the last database call that succeeded.
    database: AtomicU64,
    /// How old the last loop tick may be, in milliseconds.
    loop_limit: AtomicU64,
    /// How old the last database answer may be, in milliseconds.
    database_limit: AtomicU64,
    /// Migrations and the start-up catch-up are done.
    ready: AtomicBool,
}

impl Default for Health {
    fn default() -> Health {
        Health::new()
    }
}

impl Health {
    /// A loop's health before it started: neither alive nor ready.
    pub const fn new() -> Health {
        Health {
            loop_tick: AtomicU64::new(0),
            database: AtomicU64::new(0),
            loop_limit: AtomicU64::new(60_000),
            database_limit: AtomicU64::new(60_000),
            ready: AtomicBool::new(false),
        }
    }

    /// Start-up is over: migrations ran and the catch-up was claimed.
    pub fn ready(&self) {
        self.ready.store(true, Ordering::Relaxed);
    }

    /// Whether start-up is over.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Relaxed)
    }

    /// Sets the limits from the settings: the database must have answered
    /// within `lease` (or two scans, if a scan is rarer), and the loop, which
    /// wakes at least every scan (and every 30 s), must have ticked within
    /// the same.
    pub fn watch(&self, lease: Duration, scan_interval: Duration) {
        let limit = lease.max(scan_interval.min(Duration::from_secs(30)) * 2);
        let ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
        self.loop_limit.store(ms, Ordering::Relaxed);
        self.database_limit.store(ms, Ordering::Relaxed);
    }

    /// The serve loop woke up.
    pub fn loop_alive(&self) {
        self.loop_tick.store(monotonic_ms(), Ordering::Relaxed);
    }

    /// A database call succeeded.
    pub fn database_ok(&self) {
        self.database.store(monotonic_ms(), Ordering::Relaxed);
    }

    /// Liveness (`/healthz`): `Ok` while the serve loop wakes, whatever the
    /// database does (restarting a process does not bring a database
    /// back); else `Err` saying how long it has not run.
    pub fn liveness(&self) -> Result<String, String> {
        match self.age(&self.loop_tick) {
            None => Err("unhealthy: the serve loop has not started\n".to_owned()),
            Some(age) if age > self.limit(&self.loop_limit) => Err(format!(
                "unhealthy: the serve loop has not run for {} (limit {})\n",
                show(age),
                show(self.limit(&self.loop_limit))
            )),
            Some(age) => Ok(format!("alive: the serve loop ran {} ago\n", show(age))),
        }
    }

    /// Readiness (`/readyz`): `Ok` once migrations and the start-up
    /// catch-up are done and while the database answered within the limit
    /// (a lease); else `Err` saying which is not so.
    pub fn readiness(&self) -> Result<String, String> {
        if !self.is_ready() {
            return Err("starting: migrations or the start-up catch-up are not done\n".to_owned());
        }
        match self.age(&self.database) {
            None => Err("not ready: the database has not answered yet\n".to_owned()),
            Some(age) if age > self.limit(&self.database_limit) => Err(format!(
                "not ready: the database has not answered for {} (limit {})\n",
                show(age),
                show(self.limit(&self.database_limit))
            )),
            Some(age) => Ok(format!("ready: the database answered {} ago\n", show(age))),
        }
    }

    /// How long ago `at` was stamped, if ever.
    fn age(&self, at: &AtomicU64) -> Option<Duration> {
        match at.load(Ordering::Relaxed) {
            0 => None,
            at => Some(Duration::from_millis(monotonic_ms().saturating_sub(at))),
        }
    }

    fn limit(&self, limit: &AtomicU64) -> Duration {
        Duration::from_millis(limit.load(Ordering::Relaxed))
    }
}

fn show(d: Duration) -> String {
    format!("{:.1}s", d.as_secs_f64())
}

fn monotonic_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let elapsed = START.get_or_init(Instant::now).elapsed();
    u64::try_from(elapsed.as_millis())
        .unwrap_or(u64::MAX - 1)
        .saturating_add(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_loop_reports_a_health_of_its_own() {
        let (one, other) = (Health::new(), Health::new());
        one.loop_alive();
        one.database_ok();
        one.ready();
        assert!(one.liveness().is_ok(), "{:?}", one.liveness());
        assert!(one.readiness().is_ok(), "{:?}", one.readiness());
        // The other loop has not started: nothing the first did is its.
        assert!(other.liveness().is_err());
        assert!(other.readiness().is_err());
    }
}
