//! Heartbeats and self-fencing: one task renews the leases of every run in
//! the process with one statement per interval, tells a run at once when its
//! claim has been taken over, and fences a run whose lease it could not
//! renew in time.
//!
//! The fence is measured on this process's monotonic clock: a claim is safe
//! until `lease − interval` after the last renewal *sent* that succeeded
//! (the database started its lease no earlier than that), so a runner cut
//! off from its database, starved of connections or frozen stops its job a
//! whole heartbeat interval before any other replica may take the period.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::{Notify, watch};
use tokio::time::Instant;

use crate::store::{Lease, Store};

/// Why a watched claim is no longer this runner's to act on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Loss {
    /// A renewal found the claim at another attempt, or released.
    TakenOver,
    /// No renewal succeeded in time: the lease may run out any moment.
    Fenced,
}

/// The leases this process holds, renewed every lease/3.
#[derive(Clone)]
pub struct Heartbeats {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    /// The lease length in milliseconds; changed by a reload.
    lease_ms: AtomicU64,
    /// Wakes the renewal task when the lease changes.
    changed: Notify,
    next_id: AtomicU64,
    watched: Mutex<HashMap<u64, (Lease, Arc<Shared>)>>,
}

/// What the renewal task and a run share about one claim.
struct Shared {
    /// Until when the claim is safe, by the monotonic clock.
    fence_at: watch::Sender<Instant>,
    /// Set when a renewal found the claim gone.
    taken_over: watch::Sender<bool>,
    /// The run is writing its outcome: a claim found settled is its own doing.
    recording: AtomicBool,
}

/// A watched lease; dropping it stops the renewals.
pub struct Watch {
    id: u64,
    shared: Arc<Shared>,
    inner: Arc<Inner>,
}

impl Heartbeats {
    /// Starts the renewal task; it ends when the last handle is dropped.
    pub fn start(store: Store, lease: Duration) -> Heartbeats {
        let inner = Arc::new(Inner {
            store,
            lease_ms: AtomicU64::new(millis(lease)),
            changed: Notify::new(),
            next_id: AtomicU64::new(0),
            watched: Mutex::new(HashMap::new()),
        });
        tokio::spawn(renew_loop(Arc::downgrade(&inner)));
        Heartbeats { inner }
    }

    /// The lease every renewal grants from now on (a reload).
    pub fn set_lease(&self, lease: Duration) {
        self.inner.lease_ms.store(millis(lease), Ordering::SeqCst);
        self.inner.changed.notify_one();
    }

    /// The lease claims are granted now.
    pub fn lease(&self) -> Duration {
        self.inner.lease()
    }

    /// The interval between renewals.
    pub fn interval(&self) -> Duration {
        self.inner.lease() / 3
    }

    /// Renews `lease`, claimed for `granted` by a statement sent at `sent`,
    /// until the returned [`Watch`] is dropped.
    pub fn watch(&self, lease: &Lease, sent: Instant, granted: Duration) -> Watch {
        let fence_at = sent + granted.saturating_sub(self.interval());
        let shared = Arc::new(Shared {
            fence_at: watch::Sender::new(fence_at),
            taken_over: watch::Sender::new(false),
            recording: AtomicBool::new(false),
        });
        let id = self.inner.next_id.fetch_add(1, Ordering::SeqCst);
        if let Ok(mut watched) = self.inner.watched.lock() {
            watched.insert(id, (lease.clone(), shared.clone()));
        }
        Watch {
            id,
            shared,
            inner: self.inner.clone(),
        }
    }

    /// Renews every watched lease once, now. The renewal task calls this
    /// every interval; tests call it to take one step.
    pub async fn renew_now(&self) {
        renew_once(&self.inner).await;
    }
}

impl Inner {
    fn lease(&self) -> Duration {
        Duration::from_millis(self.lease_ms.load(Ordering::SeqCst))
    }
}

impl Watch {
    /// Resolves when the claim is lost: taken over, or fenced because no
    /// renewal got through in time.
    pub async fn lost(&self) -> Loss {
        let mut fence_at = self.shared.fence_at.subscribe();
        let mut taken_over = self.shared.taken_over.subscribe();
        loop {
            if *taken_over.borrow_and_update() {
                return Loss::TakenOver;
            }
            let deadline = *fence_at.borrow_and_update();
            tokio::select! {
                () = tokio::time::sleep_until(deadline) => {
                    if *fence_at.borrow() <= Instant::now() {
                        return Loss::Fenced;
                    }
                }
                _ = fence_at.changed() => {}
                _ = taken_over.changed() => {}
            }
        }
    }

    /// Whether the fence deadline has passed: an outcome seen now may be
    /// from a job that was stopped for it.
    pub fn fenced(&self) -> bool {
        *self.shared.fence_at.borrow() <= Instant::now()
    }

    /// The fence deadline, updated at every renewal.
    pub fn fence_at(&self) -> watch::Receiver<Instant> {
        self.shared.fence_at.subscribe()
    }

    /// Marks the run as writing its outcome: from now on a renewal that
    /// finds the claim settled reports nothing (the run's own write did it).
    pub fn recording(&self) {
        self.shared.recording.store(true, Ordering::SeqCst);
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Ok(mut watched) = self.inner.watched.lock() {
            watched.remove(&self.id);
        }
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// The first pause before a failed renewal is tried again; it doubles up
/// to half the heartbeat interval, so a runner whose database comes back
/// renews within half an interval, before a process that has just started
/// may take its expired lease over (`store::outage`).
const FIRST_RETRY: Duration = Duration::from_millis(100);

async fn renew_loop(inner: Weak<Inner>) {
    let mut retry: Option<Duration> = None;
    loop {
        let Some(strong) = inner.upgrade() else {
            return;
        };
        let every = strong.lease() / 3;
        tokio::select! {
            () = tokio::time::sleep(retry.map_or(every, |r| r.min(every / 2))) => {}
            () = strong.changed.notified() => {}
        }
        retry = if renew_once(&strong).await {
            None
        } else {
            Some(retry.map_or(FIRST_RETRY, |r| r * 2))
        };
    }
}

/// One renewal of every watched lease; `false` when it failed or got no
/// answer in time, to be tried again soon: a lease last renewed just before
/// the database went away has one interval left after the renewal that
/// found it gone, and a short outage must not use it up.
async fn renew_once(inner: &Inner) -> bool {
    let snapshot: Vec<(Lease, Arc<Shared>)> = match inner.watched.lock() {
        Ok(watched) => watched.values().cloned().collect(),
        Err(_) => return true,
    };
    if snapshot.is_empty() {
        return true;
    }
    let lease = inner.lease();
    let every = lease / 3;
    let safe_for = lease.saturating_sub(every);
    let leases: Vec<&Lease> = snapshot.iter().map(|(lease, _)| lease).collect();
    let sent = Instant::now();
    // A renewal that cannot finish within half an interval is as good as
    // failed (sqlx would go on connecting to a database that is away until
    // its acquire timeout); the next try follows soon, and the fence stops
    // runs meanwhile.
    let patience = every / 2;
    match tokio::time::timeout(patience, inner.store.renew(&leases, lease)).await {
        Ok(Ok(renewed)) => {
            tracing::debug!(
                claims = leases.len(),
                renewed = renewed.iter().filter(|ok| **ok).count(),
                "heartbeat"
            );
            for ((lease, shared), ok) in snapshot.iter().zip(renewed) {
                if ok {
                    shared.fence_at.send_replace(sent + safe_for);
                } else if !shared.recording.load(Ordering::SeqCst) {
                    tracing::warn!(
                        period_key = %lease.key,
                        attempt = lease.attempt,
                        "claim was taken over or released; stopping the job"
                    );
                    shared.taken_over.send_replace(true);
                }
            }
            true
        }
        Ok(Err(e)) => {
            tracing::warn!("heartbeat failed, retrying: {e}");
            false
        }
        Err(_) => {
            tracing::warn!(
                "heartbeat got no answer within {}, retrying",
                humantime::format_duration(patience)
            );
            false
        }
    }
}
