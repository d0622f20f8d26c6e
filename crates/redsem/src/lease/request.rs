//! One acquire of a lease semaphore, as the waiting engine ([`crate::wait`]) drives it.

use std::sync::Arc;
use std::time::Duration;

use super::{LeaseSemaphore, SemInner};
use crate::clock;
use crate::error::{Error, Result};
use crate::notify::wake::LeaseGrant;
use crate::retry::retry_once;
use crate::script::{self, Acquire, Request};
use crate::session::Caller;
use crate::wait::{self, Answer};

/// One request for `units` of `sem`, as the waiting engine drives it.
pub(super) struct LeaseRequest<'a> {
    pub(super) sem: &'a LeaseSemaphore,
    pub(super) capacity: u32,
    pub(super) units: u32,
}

impl LeaseRequest<'_> {
    fn answer(&self, reply: Acquire) -> Answer<LeaseGrant> {
        let inner = &self.sem.inner;
        match reply {
            Acquire::Granted { token, slots } => Answer::Granted(LeaseGrant {
                token,
                slots,
                delay: Duration::ZERO,
            }),
            Acquire::Queued { position, recheck } => Answer::Queued { position, recheck },
            Acquire::Gone => Answer::Gone,
            Acquire::Busy { in_use, waiters } => Answer::Refused(Error::NoPermit {
                name: inner.name.clone(),
                capacity: self.capacity,
                in_use,
                waiters,
            }),
            other => Answer::Refused(self.sem.refusal(other, self.capacity)),
        }
    }
}

impl wait::Request for LeaseRequest<'_> {
    type Queue = SemInner;
    type Grant = LeaseGrant;
    const SCRIPT: &'static str = "lease_acquire";

    fn queue(&self) -> &Arc<SemInner> {
        &self.sem.inner
    }

    fn waiter_lease(&self) -> Duration {
        self.sem.inner.options.waiter_lease
    }

    async fn enqueue(&self, id: &str, seq: u64, wait: bool) -> Result<Answer<LeaseGrant>> {
        let inner = &self.sem.inner;
        let options = &inner.options;
        let req = Request {
            id,
            capacity: self.capacity,
            units: self.units,
            lease: options.lease,
            label: options.label.as_deref().unwrap_or(""),
            one_per_label: options.one_per_label,
            wait,
            waiter_lease: options.waiter_lease,
            channel: &inner.wake_channel,
            call: Caller::new(inner.redsem.session(), seq),
            tenant: options.tenant.as_ref(),
        };
        let send = || async {
            match &inner.batcher {
                Some(batcher) => {
                    let (reply, unconfirmed) =
                        batcher.submit(script::BatchOp::acquire(&req)).await?;
                    script::batch_acquire(reply, unconfirmed)
                }
                None => script::lease_acquire(&mut inner.redsem.conn(), &inner.keys, &req).await,
            }
        };
        let reply = if wait {
            // A queued request's check-ins ride out an outage in the engine (`check_in`).
            send().await?
        } else {
            // A try whose reply was lost is sent once more with the same id, which answers
            // as the first attempt did (a grant it made is kept, not given back). The grant's
            // lease is counted from the first attempt, which was sent earlier.
            retry_once("try_acquire", send).await?
        };
        Ok(self.answer(reply))
    }

    async fn poll(&self, id: &str, _seq: u64) -> Result<Answer<LeaseGrant>> {
        let inner = &self.sem.inner;
        let options = &inner.options;
        let reply = script::lease_poll(
            &mut inner.redsem.conn(),
            &inner.keys,
            id,
            options.lease,
            options.waiter_lease,
        )
        .await?;
        Ok(self.answer(reply))
    }

    fn handed(&self, news: &str, sent: Duration) -> Option<LeaseGrant> {
        // A grant woken by message is unclaimed on the server until the waiter lease of the
        // check-in sent at `sent` ends: the permit's first renewal, which the keepalive sends
        // within half of what is left, claims it. So a grant with less than half its waiter
        // lease left, and every grant of a permit that the keepalive does not renew, is
        // claimed by a poll instead; so is every grant when replicas must acknowledge it (the
        // poll's WAIT confirms it).
        let options = &self.sem.inner.options;
        LeaseGrant::parse(news)
            .filter(|_| sent + options.waiter_lease / 2 > clock::now())
            .filter(|_| options.keepalive)
            .filter(|_| self.sem.inner.redsem.shared.replica_acks.is_none())
    }
}
