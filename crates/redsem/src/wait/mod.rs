//! The waiting engine: one loop for every queue-based primitive (the lease semaphore and the
//! permit semaphore), and the nap that the latch's wait shares with it.
//!
//! A request goes through the same steps whatever it asks for:
//!
//! 1. It gets a fresh request id, and (when it may wait) a mailbox on the client's own
//!    wake-up channel is registered for that id *before* the request is sent, so a grant
//!    published right after cannot be missed.
//! 2. It is enqueued ([`Request::enqueue`]); a [`Withdraw`] guard is armed, so a cancelled
//!    request leaves the queue and gives back what was granted to it meanwhile.
//! 3. While queued, it naps until woken or until the server's recheck interval passes (never
//!    past its deadline), then takes a grant handed over with the wake-up
//!    ([`Request::handed`]) or checks in ([`Request::poll`]). A check-in rides out a dropped
//!    connection for as long as the place is kept ([`check_in`]).
//! 4. A place the server dropped (`Gone`) is given up and the request queued again under a new
//!    id, so nothing addressed to the old place can act on the new one.
//!
//! Each primitive supplies only what enqueue, poll and a grant mean for it.

mod check_in;
mod withdraw;

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

pub(crate) use check_in::{Patience, check_in};
pub(crate) use withdraw::{Queue, Withdraw};

use crate::clock;
use crate::error::{Error, Result};
use crate::retry::unreachable;
use crate::types::PermitId;

/// What the server answered to one check-in (an enqueue or a poll).
#[derive(Debug)]
pub(crate) enum Answer<G> {
    /// The request holds what it asked for.
    Granted(G),
    /// It waits at `position` (0 = next); check in again within `recheck`.
    Queued { position: u64, recheck: Duration },
    /// The server does not know the request (any more): its place was dropped.
    Gone,
    /// Refused for good (no permit free for a try, a capacity conflict, ...): the error to
    /// return. Nothing was granted.
    Refused(Error),
}

/// One request of a primitive, as the engine drives it.
pub(crate) trait Request: Sync {
    /// The primitive's shared state, which withdraws cancelled requests.
    type Queue: Queue;
    /// What a granted request carries (a lease grant's token and slots, nothing for permits).
    type Grant: Send;
    /// The script named in protocol errors.
    const SCRIPT: &'static str;

    fn queue(&self) -> &Arc<Self::Queue>;

    /// How long the server keeps a place without a check-in.
    fn waiter_lease(&self) -> Duration;

    /// Enqueue request `id` (`wait` false: try once, never queue), the call numbered `seq` in
    /// the client's session ([`crate::session`]). Idempotent per id.
    fn enqueue(
        &self,
        id: &str,
        seq: u64,
        wait: bool,
    ) -> impl Future<Output = Result<Answer<Self::Grant>>> + Send;

    /// Check in for the queued request `id`, the call numbered `seq` in the client's session
    /// (the same in every attempt of one check-in). Idempotent per id and number.
    fn poll(&self, id: &str, seq: u64) -> impl Future<Output = Result<Answer<Self::Grant>>> + Send;

    /// A grant carried by the wake-up message's `news`, for a request whose last answered
    /// check-in was first sent at `sent` (on [`clock`]: its first attempt, when it took more
    /// than one); `None` to check in instead.
    fn handed(&self, _news: &str, _sent: Duration) -> Option<Self::Grant> {
        None
    }

    /// After the place was dropped, before queueing again.
    fn requeue(&self) -> impl Future<Output = Result<()>> + Send {
        async { Ok(()) }
    }
}

/// A granted request: what it carries, its id, and when (on [`clock`]) the check-in that the
/// grant answered was sent.
#[derive(Debug)]
pub(crate) struct Won<G> {
    pub(crate) grant: G,
    pub(crate) id: PermitId,
    pub(crate) sent: Duration,
    /// Taken from a wake-up ([`Request::handed`]) rather than from a check-in's answer: the
    /// grant may be unclaimed on the server, kept only until the waiter lease of the check-in
    /// sent at `sent` ends.
    pub(crate) handed: bool,
}

/// Places dropped in a row, each at its first answer, before the engine gives up: the server
/// refuses fresh ids, which only a broken or foreign script does.
const MAX_FRESH_GONE: u32 = 3;

/// Run `request` until it is granted, refused, or `patience` runs out. `queued` is told the
/// position at every answer that keeps the request waiting.
///
/// # Errors
///
/// The refusal the primitive made of an answer; [`Error::Timeout`] when the deadline passed
/// (the request is withdrawn first, or, if Redis cannot be reached then, in the background
/// once it can); [`Error::Unavailable`] when Redis stays unreachable for
/// longer than the waiter lease; [`Error::Protocol`] for answers that make no sense.
///
/// # Cancel safety
///
/// Cancel safe: a dropped request is withdrawn in the background (tracked by
/// [`Redsem::flush`](crate::Redsem::flush)), also a try whose answer was not read yet.
pub(crate) async fn acquire<R: Request>(
    request: &R,
    patience: Patience,
    mut queued: impl FnMut(u64) + Send,
) -> Result<Won<R::Grant>> {
    let queue = request.queue();
    let started = Instant::now();
    let wait = !matches!(patience, Patience::None);
    let deadline = patience.deadline();
    let waiter_lease = request.waiter_lease();
    let notifier = match wait {
        true => Some(queue.redsem().notifier().await),
        false => None,
    };
    let mut fresh_gone = 0;
    loop {
        let id = PermitId::random();
        tracing::Span::current().record("id", id.as_str());
        let mailbox = match &notifier {
            Some(notifier) => Some(notifier.register(id.as_str(), queue.wake_channel()).await),
            None => None,
        };
        // The enqueue's number stays open until it is answered, or, if the request is
        // withdrawn before that, until the withdrawal is: the withdrawal names it, so that what
        // it took is given back (its mark kept, the low mark held at it) and a late copy of it
        // is refused.
        let seq = queue.redsem().session().open();
        let n = seq.n();
        let mut withdraw = Withdraw::new(queue.clone(), id.clone(), seq);
        // A queued request rides out an outage (below); a try does not.
        let window = if wait { waiter_lease } else { Duration::ZERO };
        let first = check_in(clock::now(), window, deadline, || {
            request.enqueue(id.as_str(), n, wait)
        })
        .await;
        if first.is_ok() {
            withdraw.answered();
        }
        let (mut answer, mut sent) = match first {
            Ok(answered) => answered,
            Err(err) => return Err(failed(&mut withdraw, err).await),
        };
        // The enqueue took more than one attempt: the server may have queued this id, granted
        // it by wake-up, let that grant run out and forgotten it before a later attempt queued
        // the id afresh; a wake-up for the forgotten place may then be in the mailbox or still
        // on the pub/sub connection, and nothing tells it from one for the new place. Such a
        // request takes no grant from a wake-up: a poll claims it (found by the model check,
        // docs/MODEL.md "The stale wake-up").
        let enqueue_resent = sent.resent();
        let mut was_queued = false;
        loop {
            match answer {
                Answer::Granted(grant) => {
                    withdraw.disarm();
                    return Ok(Won {
                        grant,
                        id,
                        sent: sent.answered,
                        handed: false,
                    });
                }
                Answer::Refused(err) => {
                    withdraw.disarm();
                    return Err(err);
                }
                Answer::Queued { position, recheck } => {
                    let Some(mailbox) = &mailbox else {
                        return Err(protocol::<R>("a try request was queued"));
                    };
                    was_queued = true;
                    queued(position);
                    if !nap(mailbox.woken(), recheck, deadline).await {
                        // (If the server cannot be reached, the guard sends the withdrawal
                        // again in the background once dropped: the caller learns that it
                        // timed out, and the request leaves the queue when the server is
                        // back, not when its waiter lease ends.)
                        match withdraw.now().await {
                            Err(err) if !unreachable(&err) => return Err(err),
                            _ => return Err(timeout(queue.name(), started)),
                        }
                    }
                    // A grant handed over with a wake-up is judged by the first attempt of
                    // the last check-in: the server's place may date from an attempt whose
                    // reply was lost.
                    if let Some(news) = mailbox.news()
                        && !enqueue_resent
                        && let Some(grant) = request.handed(&news, sent.first)
                    {
                        withdraw.disarm();
                        return Ok(Won {
                            grant,
                            id,
                            sent: sent.first,
                            handed: true,
                        });
                    }
                    // Like the enqueue's, the check-in's number is named by a withdrawal
                    // until it is answered (what it collected is given back then).
                    let seq = queue.redsem().session().open();
                    let n = seq.n();
                    withdraw.pending(seq);
                    let polled = check_in(sent.answered, waiter_lease, deadline, || {
                        request.poll(id.as_str(), n)
                    })
                    .await;
                    if polled.is_ok() {
                        withdraw.answered();
                    }
                    (answer, sent) = match polled {
                        Ok(answered) => answered,
                        Err(err) => return Err(failed(&mut withdraw, err).await),
                    };
                }
                Answer::Gone if !wait => {
                    withdraw.disarm();
                    return Err(protocol::<R>("a new request was refused as withdrawn"));
                }
                Answer::Gone => {
                    // Our place was dropped: we did not check in within the waiter lease, the
                    // primitive shrank or was deleted, or the server lost its state. The old id
                    // is withdrawn in the background (a late resend of it is then refused).
                    tracing::warn!(name = %queue.name(), id = %id, "queued request was dropped; queuing again");
                    fresh_gone = if was_queued { 0 } else { fresh_gone + 1 };
                    if fresh_gone >= MAX_FRESH_GONE {
                        return Err(protocol::<R>("new requests are refused as withdrawn"));
                    }
                    request.requeue().await?;
                    break;
                }
            }
        }
    }
}

/// A check-in of the request `withdraw` guards failed with `err`. A grant the replicas did
/// not acknowledge ([`Error::NotReplicated`]) is given back now, so nothing is held when the
/// error returns; after any other error the guard withdraws the request in the background
/// when it is dropped (the check-in may or may not have reached the server).
async fn failed<Q: Queue>(withdraw: &mut Withdraw<Q>, err: Error) -> Error {
    if err.is_not_replicated()
        && let Err(back) = withdraw.now().await
    {
        tracing::warn!(error = %crate::error::Chain(&back),
            "could not give back a grant the replicas did not acknowledge; sending it again in the background");
    }
    err
}

/// Sleep until `woken` resolves or `recheck` passes, but not past `deadline`. Returns `false`,
/// at once, when the deadline has passed.
pub(crate) async fn nap(
    woken: impl Future<Output = ()>,
    recheck: Duration,
    deadline: Option<Instant>,
) -> bool {
    let mut nap = recheck;
    if let Some(deadline) = deadline {
        let now = Instant::now();
        if now >= deadline {
            return false;
        }
        nap = nap.min(deadline - now);
    }
    tokio::select! {
        () = woken => {}
        () = tokio::time::sleep(nap) => {}
    }
    true
}

/// The error of a wait on `name`, begun at `started`, that ran out of time.
pub(crate) fn timeout(name: &str, started: Instant) -> Error {
    Error::Timeout {
        name: name.to_owned(),
        waited: started.elapsed(),
    }
}

fn protocol<R: Request>(detail: &str) -> Error {
    Error::Protocol {
        script: R::SCRIPT,
        detail: detail.to_owned(),
    }
}
