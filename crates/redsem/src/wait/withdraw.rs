//! `Withdraw`: the guard that makes an acquire cancel safe, for every queue-based primitive.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use crate::client::Redsem;
use crate::error::Result;
use crate::retry::until_reached;
use crate::session::Seq;
use crate::types::PermitId;

/// How long a withdrawal sent in the background is sent again while the server cannot be
/// reached (or answers `LOADING`). A withdrawal may be sent again safely (one already applied
/// answers as a no-op), and one never applied can cost a permit semaphore its permits for
/// good: a grant that a check-in collected, whose reply was lost, has no lease that would
/// end it.
const WITHDRAW_PATIENCE: Duration = Duration::from_secs(30);

/// A primitive whose queued requests can be withdrawn: the request leaves the queue, and
/// whatever was granted to it meanwhile is given back.
pub(crate) trait Queue: Send + Sync + 'static {
    fn redsem(&self) -> &Redsem;
    fn name(&self) -> &str;
    /// The channel on which this client's waiters on the primitive are woken.
    fn wake_channel(&self) -> &str;
    /// Withdraw request `id`, giving back what was granted to it; `pending` is the number of
    /// its call in the client's session that went unanswered (its enqueue or a check-in), if
    /// one did: a late copy of it must be refused, and what it took given back. Sends no replica acknowledgement (`RedsemOptions::replica_acks`): a
    /// withdrawal a failover loses leaves what it undoes to its own lease.
    fn withdraw(&self, id: &str, pending: Option<u64>) -> impl Future<Output = Result<()>> + Send;
}

/// Withdraws request `id` unless disarmed: awaited with [`Withdraw::now`], or in the
/// background (tracked by [`Redsem::flush`]) when dropped, e.g. with a cancelled future.
pub(crate) struct Withdraw<Q: Queue> {
    queue: Option<Arc<Q>>,
    id: PermitId,
    /// The number of the request's call (its enqueue, a check-in) until that is answered:
    /// kept open (the session's low mark stays at it) until the withdrawal is answered too,
    /// so the mark of what that call took is there for the withdrawal to find.
    pending: Option<Seq>,
}

impl<Q: Queue> Withdraw<Q> {
    /// Armed for request `id`, whose enqueue is numbered `enqueue` and not answered yet.
    pub(crate) fn new(queue: Arc<Q>, id: PermitId, enqueue: Seq) -> Self {
        Withdraw {
            queue: Some(queue),
            id,
            pending: Some(enqueue),
        }
    }

    /// A call of the request (a check-in) is on its way, numbered `seq`: a withdrawal names
    /// it until it is answered.
    pub(crate) fn pending(&mut self, seq: Seq) {
        self.pending = Some(seq);
    }

    /// The call named last was answered: a withdrawal need not name it.
    pub(crate) fn answered(&mut self) {
        self.pending = None;
    }

    /// The request was granted and collected: nothing to withdraw.
    pub(crate) fn disarm(&mut self) {
        self.queue = None;
    }

    /// Withdraw the request now. If that fails the guard stays armed: dropped, it sends the
    /// withdrawal again in the background (for as long as [`WITHDRAW_PATIENCE`] while the
    /// server cannot be reached).
    pub(crate) async fn now(&mut self) -> Result<()> {
        let Some(queue) = &self.queue else {
            return Ok(());
        };
        let pending = self.pending.as_ref().map(Seq::n);
        queue.withdraw(self.id.as_str(), pending).await?;
        self.queue = None;
        Ok(())
    }
}

impl<Q: Queue> Drop for Withdraw<Q> {
    fn drop(&mut self) {
        let Some(queue) = self.queue.take() else {
            return;
        };
        // (The call's number stays open until the task ends.)
        let (id, seq) = (self.id.clone(), self.pending.take());
        let pending = seq.as_ref().map(Seq::n);
        let redsem = queue.redsem().clone();
        redsem.spawn_cleanup(async move {
            let withdrawn =
                until_reached(WITHDRAW_PATIENCE, || queue.withdraw(id.as_str(), pending)).await;
            if let Err(err) = withdrawn {
                tracing::warn!(name = %queue.name(), id = %id, error = %crate::error::Chain(&err),
                    "could not withdraw a cancelled request; its waiter lease will (a permit collected for it stays taken)");
            }
            drop(seq);
        });
    }
}
