//! Group commit: the acquires, releases and withdrawals that one client's tasks have in
//! flight on one lease semaphore go to Redis together, in one `lease_batch` call that reads
//! the time and the state once, applies them in order with the outcomes each would have had
//! alone, and writes back once (see `lua/lease_batch.lua`).
//!
//! No call waits for a batch to fill. An operation that finds no call of its client on the
//! semaphore in flight is sent at once, from its own task, as its own script (a lone task
//! pays nothing for group commit). One that finds a call in flight is queued; the first one
//! queued starts a sender task, which lets the tasks that are ready to run go first (one
//! [`yield_now`](tokio::task::yield_now)), then sends everything queued by then. Batches
//! are not held back behind each other's replies: the next one goes as soon as the last one
//! is on the connection, so a call waits at most one scheduling round longer than alone.
//! One sender at a time, so the batches reach Redis in the order their operations were
//! queued: a withdrawal of a cancelled request always comes after its acquire.
//! Renewals are never batched (the keepalive sends them on its own).

use std::future::Future as _;
use std::sync::{Arc, Mutex};
use std::task::Poll;

use redis::Value;
use tokio::sync::oneshot;

use crate::client::Redsem;
use crate::error::{Error, Result};
use crate::keys::LeaseKeys;
use crate::script::{self, BatchOp};

/// The most operations one call carries: a batch runs as one script, which holds up every
/// other client of the server while it runs.
const MAX_OPS: usize = 64;

/// What one operation gets back: its reply, and why the batch's changes are not confirmed by
/// the replicas asked for (if they are not).
pub(crate) type OpReply = Result<(Value, Option<Error>)>;

/// The group commit of one client on one semaphore.
pub(crate) struct Batcher {
    redsem: Redsem,
    keys: LeaseKeys,
    pending: Mutex<Pending>,
}

#[derive(Default)]
struct Pending {
    ops: Vec<(BatchOp, oneshot::Sender<OpReply>)>,
    /// A sender task is on its way: it takes what is queued.
    sending: bool,
    /// Calls sent and not answered yet.
    in_flight: usize,
}

/// One call in flight, counted in [`Pending::in_flight`] until dropped.
struct InFlight(Arc<Batcher>);

impl Drop for InFlight {
    fn drop(&mut self) {
        let mut pending = self.0.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.in_flight = pending.in_flight.saturating_sub(1);
    }
}

impl Batcher {
    pub(crate) fn new(redsem: Redsem, keys: LeaseKeys) -> Batcher {
        Batcher {
            redsem,
            keys,
            pending: Mutex::default(),
        }
    }

    /// Send `op` at once if no call of this client on this semaphore is in flight (there is
    /// no batch to join), else queue it for the next batch; wait for its reply.
    ///
    /// # Cancel safety
    ///
    /// A queued operation is sent even if the future is dropped (as an operation already
    /// written to the connection would be); one sent at once may or may not have been.
    pub(crate) async fn submit(self: &Arc<Self>, op: BatchOp) -> OpReply {
        let (tx, rx) = oneshot::channel();
        // `Some(op)`: send it at once; `None`: queued (and whether to start a sender).
        let (direct, start) = {
            let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
            if pending.ops.is_empty() && !pending.sending && pending.in_flight == 0 {
                pending.in_flight += 1;
                (Some((op, tx)), false)
            } else {
                pending.ops.push((op, tx));
                (None, !std::mem::replace(&mut pending.sending, true))
            }
        };
        if let Some(op) = direct {
            let in_flight = InFlight(Arc::clone(self));
            Arc::clone(self).call(vec![op], in_flight).await;
        } else if start {
            tokio::spawn(Arc::clone(self).send_all());
        }
        rx.await.unwrap_or_else(|_| {
            Err(Error::Protocol {
                script: "lease_batch",
                detail: "the batch was dropped before it was answered".into(),
            })
        })
    }

    /// The sender task: send what is queued, batch after batch, until nothing is.
    async fn send_all(self: Arc<Self>) {
        loop {
            // Let the tasks that are ready queue their operations first.
            tokio::task::yield_now().await;
            let ops = {
                let mut pending = self.pending.lock().unwrap_or_else(|p| p.into_inner());
                if pending.ops.is_empty() {
                    pending.sending = false;
                    return;
                }
                let n = pending.ops.len().min(MAX_OPS);
                pending.in_flight += 1;
                pending.ops.drain(..n).collect::<Vec<_>>()
            };
            let in_flight = InFlight(Arc::clone(&self));
            let mut call = Box::pin(Arc::clone(&self).call(ops, in_flight));
            // Poll it once, which puts it on the connection; its reply is awaited by a task
            // of its own, so the next batch need not wait for it.
            let first = std::future::poll_fn(|cx| Poll::Ready(call.as_mut().poll(cx))).await;
            if first.is_pending() {
                tokio::spawn(call);
            }
        }
    }

    /// One batch: send it, hand out the grants for our own waiters, answer each operation.
    async fn call(
        self: Arc<Self>,
        ops: Vec<(BatchOp, oneshot::Sender<OpReply>)>,
        in_flight: InFlight,
    ) {
        let (ops, answers): (Vec<BatchOp>, Vec<_>) = ops.into_iter().unzip();
        let shared = &self.redsem.shared;
        // A batch of withdrawals only waits for no acknowledgement.
        let mut conn = if ops.iter().any(|op| op.acked) {
            self.redsem.conn()
        } else {
            self.redsem.conn_unacked()
        };
        let sent = script::lease_batch(&mut conn, &self.keys, &shared.wake_channel, &ops).await;
        let batch = match sent {
            Ok(batch) => batch,
            Err(err) => {
                for answer in answers {
                    let _ = answer.send(Err(err.duplicate()));
                }
                return;
            }
        };
        self.redsem
            .after_release(&self.keys, &batch.handed, batch.idle)
            .await;
        // Answered: the next operation of this client may go at once.
        drop(in_flight);
        for (reply, answer) in batch.replies.into_iter().zip(answers) {
            let unconfirmed = batch.unconfirmed.as_ref().map(Error::duplicate);
            let _ = answer.send(Ok((reply, unconfirmed)));
        }
    }
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("state", &self.keys.all[2])
            .finish_non_exhaustive()
    }
}
