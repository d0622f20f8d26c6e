//! Group commit: the operations that one client's tasks have in flight on one semaphore go
//! to Redis together, in one call (`lua/lease/batch.lua`, `lua/permit/batch.lua`) that reads
//! the time and the state once, applies them in order with the outcomes each would have had
//! alone, and writes back once. A [`Group`] says how a primitive sends a batch; the
//! [`Batcher`] decides what goes together.
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
//! A lease's renewals and check-ins are never batched (the keepalive and the waiting engine
//! send them on their own, so a renewal never waits behind a batch); a permit waiter's poll,
//! which collects the permits its wake-up announced, is.

use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::Poll;

use redis::Value;
use tokio::sync::oneshot;

use crate::error::{Error, Result};

/// The most operations one call carries: a batch runs as one script, which holds up every
/// other client of the server while it runs.
const MAX_OPS: usize = 64;

/// What one operation gets back: its reply, and why the batch's changes are not confirmed by
/// the replicas asked for (if they are not).
pub(crate) type OpReply = Result<(Value, Option<Error>)>;

/// How a primitive sends a batch of its operations on one semaphore of one client.
pub(crate) trait Group: Send + Sync + 'static {
    /// One operation, its arguments encoded.
    type Op: Send + 'static;
    /// The batch script's name (in errors).
    const SCRIPT: &'static str;

    /// Send `ops` in one call (one alone as its own script), in order, and do what the
    /// replies ask of the client (hand grants over, tidy); each operation's reply in order.
    fn send(&self, ops: Vec<Self::Op>) -> impl Future<Output = Result<Sent>> + Send;
}

/// What a batch got back.
pub(crate) struct Sent {
    /// Each operation's reply, in the order sent.
    pub(crate) replies: Vec<Value>,
    /// Why the batch's changes are not confirmed by the replicas asked for (if they are not).
    pub(crate) unconfirmed: Option<Error>,
}

/// The group commit of one client on one semaphore.
pub(crate) struct Batcher<G: Group> {
    group: G,
    pending: Mutex<Pending<G::Op>>,
}

struct Pending<Op> {
    ops: Vec<(Op, oneshot::Sender<OpReply>)>,
    /// A sender task is on its way: it takes what is queued.
    sending: bool,
    /// Calls sent and not answered yet.
    in_flight: usize,
}

impl<Op> Default for Pending<Op> {
    fn default() -> Self {
        Pending {
            ops: Vec::new(),
            sending: false,
            in_flight: 0,
        }
    }
}

/// One call in flight, counted in [`Pending::in_flight`] until dropped.
struct InFlight<G: Group>(Arc<Batcher<G>>);

impl<G: Group> Drop for InFlight<G> {
    fn drop(&mut self) {
        let mut pending = self.0.pending.lock().unwrap_or_else(|p| p.into_inner());
        pending.in_flight = pending.in_flight.saturating_sub(1);
    }
}

impl<G: Group> Batcher<G> {
    pub(crate) fn new(group: G) -> Batcher<G> {
        Batcher {
            group,
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
    pub(crate) async fn submit(self: &Arc<Self>, op: G::Op) -> OpReply {
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
                script: G::SCRIPT,
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

    /// One batch: send it, then answer each operation.
    async fn call(
        self: Arc<Self>,
        ops: Vec<(G::Op, oneshot::Sender<OpReply>)>,
        in_flight: InFlight<G>,
    ) {
        let (ops, answers): (Vec<G::Op>, Vec<_>) = ops.into_iter().unzip();
        let sent = match self.group.send(ops).await {
            Ok(sent) => sent,
            Err(err) => {
                for answer in answers {
                    let _ = answer.send(Err(err.duplicate()));
                }
                return;
            }
        };
        // Answered: the next operation of this client may go at once.
        drop(in_flight);
        for (reply, answer) in sent.replies.into_iter().zip(answers) {
            let unconfirmed = sent.unconfirmed.as_ref().map(Error::duplicate);
            let _ = answer.send(Ok((reply, unconfirmed)));
        }
    }
}

impl<G: Group> std::fmt::Debug for Batcher<G> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("script", &G::SCRIPT)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A group that answers every operation with its own number and records each call: the
    /// task it was sent from and the operations it carried. (The batcher's own bookkeeping:
    /// what a batch does on Redis is tested with the scripts and in `tests/it/group_commit.rs`.)
    #[derive(Default)]
    struct Calls {
        sent: Mutex<Vec<(Option<tokio::task::Id>, Vec<u32>)>>,
        /// While set, a call waits for it before it answers (a call in flight).
        hold: Mutex<Option<Arc<tokio::sync::Notify>>>,
    }

    impl Group for Calls {
        type Op = u32;
        const SCRIPT: &'static str = "calls";

        async fn send(&self, ops: Vec<u32>) -> Result<Sent> {
            let replies = ops.iter().map(|&n| Value::Int(i64::from(n))).collect();
            self.sent
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push((tokio::task::try_id(), ops));
            let hold = self.hold.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(hold) = hold {
                hold.notified().await;
            }
            Ok(Sent {
                replies,
                unconfirmed: None,
            })
        }
    }

    fn sent(batcher: &Batcher<Calls>) -> Vec<(Option<tokio::task::Id>, Vec<u32>)> {
        batcher
            .group
            .sent
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    #[tokio::test]
    async fn a_call_after_an_answered_one_goes_at_once_from_its_own_task() {
        let batcher = Arc::new(Batcher::new(Calls::default()));
        let caller = Arc::clone(&batcher);
        let (task, replies) = tokio::spawn(async move {
            let first = caller.submit(1).await.map(|(v, _)| v);
            let second = caller.submit(2).await.map(|(v, _)| v);
            (tokio::task::id(), [first, second])
        })
        .await
        .expect("caller");
        assert!(
            matches!(replies, [Ok(Value::Int(1)), Ok(Value::Int(2))]),
            "{replies:?}"
        );
        // Each went alone, from the caller's task: no sender task, no batch to join.
        assert_eq!(
            sent(&batcher),
            [(Some(task), vec![1]), (Some(task), vec![2])]
        );
        assert_eq!(batcher.pending.lock().expect("pending").in_flight, 0);
    }

    #[tokio::test]
    async fn calls_made_while_one_is_in_flight_go_together_in_order_in_one_batch() {
        let batcher = Arc::new(Batcher::new(Calls::default()));
        let hold = Arc::new(tokio::sync::Notify::new());
        *batcher.group.hold.lock().expect("hold") = Some(Arc::clone(&hold));
        let first = tokio::spawn({
            let batcher = Arc::clone(&batcher);
            async move { batcher.submit(1).await.map(|(v, _)| v) }
        });
        // The first call is on its way and not answered: the next ones queue behind it.
        while sent(&batcher).is_empty() {
            tokio::task::yield_now().await;
        }
        let later: Vec<_> = (2..=4)
            .map(|n| {
                let batcher = Arc::clone(&batcher);
                tokio::spawn(async move { batcher.submit(n).await.map(|(v, _)| v) })
            })
            .collect();
        for (n, call) in (2..=4).zip(later) {
            let reply = tokio::time::timeout(Duration::from_secs(10), call)
                .await
                .expect("answered in time")
                .expect("task");
            assert!(
                matches!(reply, Ok(Value::Int(r)) if r == i64::from(n)),
                "{reply:?}"
            );
        }
        hold.notify_one();
        let reply = tokio::time::timeout(Duration::from_secs(10), first)
            .await
            .expect("answered in time")
            .expect("task");
        assert!(matches!(reply, Ok(Value::Int(1))), "{reply:?}");
        let batches: Vec<Vec<u32>> = sent(&batcher).into_iter().map(|(_, ops)| ops).collect();
        assert_eq!(batches, [vec![1], vec![2, 3, 4]]);
        assert_eq!(batcher.pending.lock().expect("pending").in_flight, 0);
    }
}
