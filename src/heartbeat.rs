//! Heartbeats: one task renews the leases of every run in the process with
//! one statement per interval, and tells a run at once when its claim has
//! been taken over.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::oneshot;

use crate::store::{Lease, Store};

/// The leases this process holds, renewed every lease/3.
#[derive(Clone)]
pub struct Heartbeats {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    lease: Duration,
    watched: Mutex<HashMap<String, (Lease, oneshot::Sender<()>)>>,
}

/// A watched lease; dropping it stops the renewals.
pub struct Watch {
    key: String,
    lost: Option<oneshot::Receiver<()>>,
    inner: Arc<Inner>,
}

impl Heartbeats {
    /// Starts the renewal task; it ends when the last handle is dropped.
    pub fn start(store: Store, lease: Duration) -> Heartbeats {
        let inner = Arc::new(Inner {
            store,
            lease,
            watched: Mutex::new(HashMap::new()),
        });
        tokio::spawn(renew_loop(Arc::downgrade(&inner), lease / 3));
        Heartbeats { inner }
    }

    /// Renews `lease` until the returned [`Watch`] is dropped.
    pub fn watch(&self, lease: &Lease) -> Watch {
        let (tx, rx) = oneshot::channel();
        if let Ok(mut watched) = self.inner.watched.lock() {
            watched.insert(lease.key.clone(), (lease.clone(), tx));
        }
        Watch {
            key: lease.key.clone(),
            lost: Some(rx),
            inner: self.inner.clone(),
        }
    }
}

impl Watch {
    /// Resolves when a renewal finds the claim gone (taken over or released).
    pub async fn lost(&mut self) {
        if let Some(rx) = self.lost.as_mut() {
            if rx.await.is_ok() {
                self.lost = None;
            } else {
                // The renewal task is gone; nothing will ever report.
                std::future::pending::<()>().await;
            }
        }
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        if let Ok(mut watched) = self.inner.watched.lock() {
            watched.remove(&self.key);
        }
    }
}

async fn renew_loop(inner: Weak<Inner>, every: Duration) {
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let Some(inner) = inner.upgrade() else { return };
        let leases: Vec<Lease> = match inner.watched.lock() {
            Ok(watched) => watched.values().map(|(lease, _)| lease.clone()).collect(),
            Err(_) => return,
        };
        if leases.is_empty() {
            continue;
        }
        let refs: Vec<&Lease> = leases.iter().collect();
        match inner.store.renew(&refs, inner.lease).await {
            Ok(renewed) => {
                let Ok(mut watched) = inner.watched.lock() else {
                    return;
                };
                for (lease, ok) in leases.iter().zip(renewed) {
                    if !ok && let Some((_, lost)) = watched.remove(&lease.key) {
                        tracing::warn!(period_key = %lease.key, attempt = lease.attempt, "claim was taken over; stopping the job");
                        let _ = lost.send(());
                    }
                }
            }
            // The next tick tries again; a claim that expires meanwhile is
            // found taken over by the first renewal that gets through.
            Err(e) => tracing::warn!("heartbeat failed, retrying: {e}"),
        }
    }
}
