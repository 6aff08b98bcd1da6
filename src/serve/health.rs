//! What `/healthz` reports, kept by the serve loop whether or not anything
//! listens.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// What `/healthz` reports, shared by the serve loop and the listener.
///
/// The loop calls [`Health::loop_alive`] on every wake-up and
/// [`Health::database_ok`] after every database call that succeeded (the
/// regular scan at least); `/healthz` answers 200 while both happened
/// recently (see [`Health::watch`]) and 503, saying which is stale, when not.
/// Times are monotonic, so a step of the wall clock changes nothing.
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

/// The process's health, updated by `serve` and read by `/healthz`.
pub static HEALTH: Health = Health::new();

impl Health {
    const fn new() -> Health {
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

    /// `Ok` with a summary while healthy, else `Err` saying what is stale.
    pub fn report(&self) -> Result<String, String> {
        let now = monotonic_ms();
        let age = |at: &AtomicU64| match at.load(Ordering::Relaxed) {
            0 => None,
            at => Some(Duration::from_millis(now.saturating_sub(at))),
        };
        let limit = |l: &AtomicU64| Duration::from_millis(l.load(Ordering::Relaxed));
        let show = |d: Duration| format!("{:.1}s", d.as_secs_f64());
        let (tick, db) = (age(&self.loop_tick), age(&self.database));
        let (loop_limit, db_limit) = (limit(&self.loop_limit), limit(&self.database_limit));
        let mut problems = Vec::new();
        match tick {
            None => problems.push("the serve loop has not started".to_owned()),
            Some(a) if a > loop_limit => problems.push(format!(
                "the serve loop has not run for {} (limit {})",
                show(a),
                show(loop_limit)
            )),
            _ => {}
        }
        match db {
            None => problems.push("the database has not answered yet".to_owned()),
            Some(a) if a > db_limit => problems.push(format!(
                "the database has not answered for {} (limit {})",
                show(a),
                show(db_limit)
            )),
            _ => {}
        }
        match (tick, db, problems.is_empty()) {
            (Some(tick), Some(db), true) => Ok(format!(
                "ok: the serve loop ran {} ago, the database answered {} ago\n",
                show(tick),
                show(db)
            )),
            _ => Err(format!("unhealthy: {}\n", problems.join("; "))),
        }
    }
}

fn monotonic_ms() -> u64 {
    static START: OnceLock<Instant> = OnceLock::new();
    let elapsed = START.get_or_init(Instant::now).elapsed();
    u64::try_from(elapsed.as_millis())
        .unwrap_or(u64::MAX - 1)
        .saturating_add(1)
}
