//! Outcomes of runs that end together are written together: while one
//! write is under way, the outcomes that arrive wait for it and then go in
//! one statement and one commit. A lone outcome is written at once, as
//! before; a backfill of many short runs pays a commit per batch rather
//! than per period.

use tokio::sync::{mpsc, oneshot};

use crate::error::Error;
use crate::store::{Finish, Lease, Store};

/// The most outcomes one statement writes.
const MOST: usize = 200;

/// One outcome waiting to be written, and where its answer goes.
struct Pending {
    lease: Lease,
    finish: Finish,
    answer: oneshot::Sender<Result<bool, Error>>,
}

/// The writer of outcomes, one task per engine.
pub(super) struct Outcomes {
    queue: mpsc::UnboundedSender<Pending>,
    store: Store,
}

impl Outcomes {
    /// Starts the writer on `store`; it ends with the engine.
    pub(super) fn start(store: Store) -> Outcomes {
        let (queue, mut pending) = mpsc::unbounded_channel::<Pending>();
        let writer = store.clone();
        tokio::spawn(async move {
            while let Some(first) = pending.recv().await {
                let mut batch = vec![first];
                while batch.len() < MOST {
                    match pending.try_recv() {
                        Ok(next) => batch.push(next),
                        Err(_) => break,
                    }
                }
                let outcomes: Vec<(&Lease, Finish)> =
                    batch.iter().map(|p| (&p.lease, p.finish.clone())).collect();
                let written = writer.finish_many(&outcomes).await;
                for (i, p) in batch.into_iter().enumerate() {
                    let answer = match &written {
                        Ok(recorded) => Ok(recorded.get(i).copied().unwrap_or(false)),
                        Err(e) => Err(Error::Database(e.to_string())),
                    };
                    let _ = p.answer.send(answer);
                }
            }
        });
        Outcomes { queue, store }
    }

    /// Records how an attempt ended, with whatever else ends meanwhile;
    /// `false` if the claim had moved on.
    pub(super) async fn finish(&self, lease: &Lease, finish: &Finish) -> Result<bool, Error> {
        let (answer, answered) = oneshot::channel();
        let pending = Pending {
            lease: lease.clone(),
            finish: finish.clone(),
            answer,
        };
        if self.queue.send(pending).is_err() {
            return self.store.finish(lease, finish).await;
        }
        match answered.await {
            Ok(answer) => answer,
            Err(_) => self.store.finish(lease, finish).await,
        }
    }
}
