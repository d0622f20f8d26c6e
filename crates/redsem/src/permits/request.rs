//! One acquire of a permit semaphore, as the waiting engine ([`crate::wait`]) drives it.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{PermitInner, PermitSemaphore};
use crate::error::{Error, Result};
use crate::retry::retry_once;
use crate::script::{self, PermitAcquire};
use crate::session::Caller;
use crate::wait::{self, Answer};

/// One request for `permits` of `sem`, as the waiting engine drives it.
pub(super) struct PermitRequest<'a> {
    pub(super) sem: &'a PermitSemaphore,
    pub(super) permits: u32,
}

impl PermitRequest<'_> {
    fn answer(&self, reply: PermitAcquire) -> Answer<()> {
        match reply {
            PermitAcquire::Granted => Answer::Granted(()),
            PermitAcquire::Queued { position, recheck } => Answer::Queued { position, recheck },
            PermitAcquire::Gone => Answer::Gone,
            PermitAcquire::Busy { available, waiters } => {
                Answer::Refused(Error::NotEnoughPermits {
                    name: self.sem.inner.name.clone(),
                    requested: self.permits,
                    available,
                    waiters,
                })
            }
        }
    }
}

impl wait::Request for PermitRequest<'_> {
    type Queue = PermitInner;
    type Grant = ();
    const SCRIPT: &'static str = "permit_acquire";

    fn queue(&self) -> &Arc<PermitInner> {
        &self.sem.inner
    }

    fn waiter_lease(&self) -> Duration {
        self.sem.inner.options.waiter_lease
    }

    async fn enqueue(&self, id: &str, seq: u64, wait: bool) -> Result<Answer<()>> {
        let inner = &self.sem.inner;
        let lease = inner.options.waiter_lease;
        let reply = retry_once("acquire", || async {
            match &inner.batcher {
                Some(batcher) => {
                    let op = script::PermitOp::acquire(id, self.permits, wait, lease, seq);
                    let (reply, unconfirmed) = batcher.submit(op).await?;
                    script::permits_granted("permit_acquire", script::Acked { reply, unconfirmed })
                }
                None => {
                    let channel = &inner.wake_channel;
                    let mut conn = inner.redsem.conn();
                    let (keys, permits) = (&inner.keys, self.permits);
                    let call = Caller::new(inner.redsem.session(), seq);
                    script::permit_acquire(&mut conn, keys, id, permits, wait, lease, channel, call)
                        .await
                }
            }
        })
        .await?;
        Ok(self.answer(reply))
    }

    async fn poll(&self, id: &str, seq: u64) -> Result<Answer<()>> {
        let inner = &self.sem.inner;
        let lease = inner.options.waiter_lease;
        let reply = retry_once("acquire", || async {
            match &inner.batcher {
                Some(batcher) => {
                    let (reply, unconfirmed) = batcher
                        .submit(script::PermitOp::poll(id, lease, seq))
                        .await?;
                    script::permits_granted("permit_poll", script::Acked { reply, unconfirmed })
                }
                None => {
                    let mut conn = inner.redsem.conn();
                    let call = Caller::new(inner.redsem.session(), seq);
                    script::permit_poll(&mut conn, &inner.keys, id, lease, call).await
                }
            }
        })
        .await?;
        Ok(self.answer(reply))
    }

    async fn requeue(&self) -> Result<()> {
        // The count may be gone with the queue: state the expected one again.
        self.sem.inner.ensured.store(false, Ordering::Relaxed);
        self.sem.ensure_expected().await
    }
}
