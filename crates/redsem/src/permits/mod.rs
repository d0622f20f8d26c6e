//! `PermitSemaphore`: Redisson-style counted permits, with strictly FIFO waiting.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tracing::Instrument as _;

use crate::batch::Batcher;
use crate::client::Redsem;
#[cfg(doc)]
use crate::error::Error;
use crate::error::{Result, invalid};
use crate::keys::PermitKeys;
use crate::observe::{Attempt, Meter, op_span};
use crate::retry::retry_once;
use crate::script::{self, Addition};
use crate::session::Caller;
use crate::types::PermitId;
use crate::wait::{self, Patience};

mod batch;
mod options;
mod request;
mod withdraw;

pub use options::PermitOptions;
use request::PermitRequest;

/// The largest magnitude a permit count may reach: Redis scripts count in doubles.
pub const MAX_PERMITS: i64 = (1 << 53) - 1;

/// A counting semaphore of plain permits shared through Redis, like Redisson's `RSemaphore`:
/// a number of available permits that anyone may take from ([`acquire`](Self::acquire)) and
/// add to ([`release`](Self::release), [`add_permits`](Self::add_permits)).
///
/// Permits have no owners and no leases, by design: a process that dies holding permits does
/// not give them back. Use a [`LeaseSemaphore`](crate::LeaseSemaphore) when that matters.
///
/// * The count may be set once ([`try_set_permits`](Self::try_set_permits)) and may go below
///   zero ([`add_permits`](Self::add_permits) with a negative number).
/// * Waiters are served strictly first-in-first-out; a request for `n` permits at the head of
///   the line is woken when `n` are available, and is never overtaken by smaller requests
///   behind it. A [`try_acquire`](Self::try_acquire) fails while anyone waits.
/// * A release wakes exactly the waiters it satisfies, through the client's one shared pub/sub
///   connection; a waiter also re-checks every third of its waiter lease, so a lost message
///   costs latency, never liveness.
/// * Every mutating call is retry-safe: releases, additions, drains, `try_set_permits` and
///   acquires carry a request id, are retried once after a dropped connection (or resent by
///   the cluster client), and are applied once; a repeated drain answers what the first took.
/// * While anyone waits, none of the semaphore's keys has a TTL (no `volatile-*` eviction
///   policy can pick them); only idle bookkeeping expires. The count never expires.
///
/// # Lost state
///
/// After a restart without persistence, a `FLUSHALL`, or a failover to a replica that missed
/// writes, the semaphore is what the server kept:
///
/// * **The count**: gone after a restart or flush: [`available_permits`](Self::available_permits)
///   reports 0, and the semaphore counts as never set ([`try_set_permits`](Self::try_set_permits)
///   succeeds again). Permits have no owners, so nobody knows how many were out: permits taken
///   before the loss and released after it are added to the new count (it can exceed what was
///   first set). After a failover the count is the replica's: acquires and releases it missed
///   are forgotten (a permit taken on the old primary can be taken again).
/// * **A waiter** whose place vanished learns it at its next check-in (within a third of its
///   waiter lease, or at once when the pub/sub connection drops), queues again under a new
///   request id, and waits for permits to be set, added or released: it is never granted
///   from nothing. A waiter rides out the outage itself (checks in again after each failed
///   attempt); bound it with [`acquire_timeout`](Self::acquire_timeout).
///
/// Cloning is cheap.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> redsem::Result<()> {
/// let redsem = redsem::Redsem::connect("redis://127.0.0.1:6379").await?;
/// let downloads = redsem.permit_semaphore("downloads")?;
/// downloads.try_set_permits(3).await?;
/// downloads.acquire(1).await?;
/// // ... download ...
/// downloads.release(1).await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct PermitSemaphore {
    inner: Arc<PermitInner>,
}

#[derive(Debug)]
struct PermitInner {
    redsem: Redsem,
    name: String,
    keys: PermitKeys,
    /// Where this client's waiters on it are woken ([`Redsem::wake_channel_for`]).
    wake_channel: String,
    options: PermitOptions,
    meter: Meter,
    /// [`PermitOptions::permits`] was applied (reset when the queue vanished).
    ensured: AtomicBool,
    /// The client's group commit on this semaphore (`None`: one call per operation, see
    /// [`RedsemOptions::group_commit`](crate::RedsemOptions::group_commit)).
    batcher: Option<Arc<Batcher<batch::PermitGroup>>>,
}

impl PermitSemaphore {
    /// A handle on the permit semaphore `name` of `redsem` (see
    /// [`Redsem::permit_semaphore_with`]); no round trip.
    pub(crate) fn new(redsem: &Redsem, name: &str, options: PermitOptions) -> Result<Self> {
        if name.is_empty() {
            return Err(invalid("the semaphore name must not be empty"));
        }
        options.validate()?;
        let keys = PermitKeys::new(redsem.prefix(), name);
        let wake_channel = redsem.wake_channel_for("permits", name);
        let batcher = redsem.group_commit().then(|| {
            let group = batch::PermitGroup {
                redsem: redsem.clone(),
                keys: keys.clone(),
                wake_channel: wake_channel.clone(),
            };
            redsem.shared_for(&keys.all[3], || Batcher::new(group))
        });
        Ok(PermitSemaphore {
            inner: Arc::new(PermitInner {
                redsem: redsem.clone(),
                name: name.to_owned(),
                keys,
                wake_channel,
                options,
                meter: Meter::new("permits", name, &redsem.shared.metric_names),
                ensured: AtomicBool::new(false),
                batcher,
            }),
        })
    }
}

impl PermitSemaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The options of this handle.
    pub fn options(&self) -> &PermitOptions {
        &self.inner.options
    }

    /// Set the number of available permits to `permits`, only if it was never set (or the
    /// semaphore was deleted). A count that went down to 0 counts as set.
    ///
    /// Returns true if this call set it. Requests already waiting are served at once.
    /// Retry-safe: after a dropped connection the call is repeated once with the same request
    /// id, and answers true if the first attempt set it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::PermitSemaphore) -> redsem::Result<()> {
    /// if sem.try_set_permits(5).await? {
    ///     println!("initialised with 5 permits");
    /// }
    /// assert!(!sem.try_set_permits(7).await?);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] when one of its keys holds a foreign value (left untouched);
    /// [`Error::Unavailable`] when Redis cannot be reached (also on the retry).
    ///
    /// # Cancel safety
    ///
    /// If dropped after sending, the count may or may not have been set.
    pub async fn try_set_permits(&self, permits: u32) -> Result<bool> {
        let inner = &self.inner;
        let request = PermitId::random();
        let span = op_span!(inner.meter, "redsem.permits.try_set");
        span.record("units", permits);
        let seq = inner.redsem.session().open();
        retry_once("try_set_permits", || async {
            script::permit_try_set(
                &mut inner.redsem.conn(),
                &inner.keys,
                request.as_str(),
                permits,
                Caller::new(inner.redsem.session(), seq.n()),
            )
            .await
        })
        .instrument(span)
        .await
    }

    /// Make sure the count was set: set it to `permits` if it never was (or the semaphore
    /// was deleted, or the server lost it), else leave it as it is. Returns true if this
    /// call set it.
    ///
    /// Call it at start-up in every process that uses the pool, so a fresh pool does not
    /// wait forever on 0 permits whichever process comes first; or let
    /// [`PermitOptions::permits`] call it before the first acquire. It is
    /// [`try_set_permits`](Self::try_set_permits) under the name of what it is for:
    /// stating the size the pool is expected to have, without overriding one already in
    /// force.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
    /// let gpus = redsem.permit_semaphore("gpu")?;
    /// gpus.ensure_permits(4).await?;
    /// gpus.acquire(1).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`try_set_permits`](Self::try_set_permits).
    ///
    /// # Cancel safety
    ///
    /// As [`try_set_permits`](Self::try_set_permits).
    pub async fn ensure_permits(&self, permits: u32) -> Result<bool> {
        let set = self.try_set_permits(permits).await?;
        self.inner.ensured.store(true, Ordering::Relaxed);
        Ok(set)
    }

    /// Apply [`PermitOptions::permits`] if this handle has not yet.
    async fn ensure_expected(&self) -> Result<()> {
        if let Some(permits) = self.inner.options.permits
            && !self.inner.ensured.load(Ordering::Relaxed)
        {
            self.ensure_permits(permits).await?;
        }
        Ok(())
    }

    /// Add `delta` permits (a negative `delta` takes them away; the count may go below zero,
    /// and then acquires wait until enough are added or released).
    ///
    /// Sets the count if it was never set (from 0). Waiters that now fit are served.
    /// Retry-safe: after a dropped connection the call is repeated once with the same request
    /// id, and applied once.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::PermitSemaphore) -> redsem::Result<()> {
    /// sem.add_permits(-5).await?;
    /// assert_eq!(sem.available_permits().await?, -5);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] when the count would leave ±[`MAX_PERMITS`] (nothing is
    /// changed); [`Error::WrongType`], [`Error::Unavailable`] as for
    /// [`try_set_permits`](Self::try_set_permits).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: once called, the addition happens (in the background if this
    /// future is dropped before it answers); only its answer is lost.
    pub async fn add_permits(&self, delta: i64) -> Result<()> {
        if !(-MAX_PERMITS..=MAX_PERMITS).contains(&delta) {
            return Err(invalid(format!(
                "cannot add {delta} permits to {:?}: the limit is ±{MAX_PERMITS}",
                self.inner.name
            )));
        }
        self.add(delta, "add_permits").await
    }

    /// Give back `permits` permits, served to the waiters at the head of the line that now
    /// fit. Anyone may release, also permits it never acquired (they are plain counts).
    ///
    /// Retry-safe: after a dropped connection the call is repeated once with the same request
    /// id, and applied once. Releasing 0 permits does nothing.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::PermitSemaphore) -> redsem::Result<()> {
    /// sem.acquire(2).await?;
    /// sem.release(2).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`add_permits`](Self::add_permits).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: once called, the release happens (in the background if this
    /// future is dropped before it answers); only its answer is lost.
    pub async fn release(&self, permits: u32) -> Result<()> {
        if permits == 0 {
            return Ok(());
        }
        self.add(i64::from(permits), "release").await
    }

    /// Take `permits` permits if that many are available and nobody waits; one round trip,
    /// never queued.
    ///
    /// Taking 0 permits succeeds without a round trip.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::PermitSemaphore) -> redsem::Result<()> {
    /// match sem.try_acquire(2).await {
    ///     Ok(()) => sem.release(2).await?,
    ///     Err(e) if e.is_not_acquired() => println!("busy: {e}"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NotEnoughPermits`] when fewer are available or others wait;
    /// [`Error::WrongType`], [`Error::Unavailable`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: if the future is dropped (or fails to hear the answer) after the request was
    /// sent, permits it took are given back in the background.
    pub async fn try_acquire(&self, permits: u32) -> Result<()> {
        self.take(permits, Patience::None).await
    }

    /// Wait in line for `permits` permits, as long as it takes.
    ///
    /// Waits also on a semaphore that was never set, until permits are set or added. Taking
    /// 0 permits succeeds without a round trip.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::PermitSemaphore) -> redsem::Result<()> {
    /// sem.acquire(4).await?;
    /// // ... use the four units ...
    /// sem.release(4).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`]; [`Error::Unavailable`] when Redis cannot be reached while queuing
    /// (a check-in that cannot reach Redis is repeated after the re-check interval instead).
    /// If the queue vanishes (restart, flush, failover: see [Lost state](Self#lost-state)),
    /// the request queues again and goes on waiting; it is never granted from nothing.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future (or a surrounding timeout) withdraws the request, and
    /// permits handed to it in the meantime are given back: a cancelled acquire takes nothing.
    /// The withdrawal is sent in the background; if it cannot be, the waiter lease cleans up.
    pub async fn acquire(&self, permits: u32) -> Result<()> {
        self.take(permits, Patience::Forever).await
    }

    /// Wait in line for `permits` permits for at most `wait`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::PermitSemaphore) -> redsem::Result<()> {
    /// use std::time::Duration;
    /// match sem.acquire_timeout(1, Duration::from_secs(5)).await {
    ///     Ok(()) => sem.release(1).await?,
    ///     Err(e) if e.is_timeout() => eprintln!("gave up"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when `wait` runs out (the request is withdrawn first, and permits
    /// handed to it meanwhile are given back; if Redis cannot be reached then, the withdrawal
    /// is sent in the background once it can); otherwise as [`acquire`](Self::acquire).
    ///
    /// # Cancel safety
    ///
    /// As [`acquire`](Self::acquire).
    pub async fn acquire_timeout(&self, permits: u32, wait: Duration) -> Result<()> {
        let patience = Patience::waiting(Some(wait));
        self.take(permits, patience).await
    }

    /// The permits available now: negative after [`add_permits`](Self::add_permits) took more
    /// than there were, 0 for a semaphore that was never set — and for one whose count the
    /// server lost (restart without persistence, `FLUSHALL`): see
    /// [Lost state](Self#lost-state).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::PermitSemaphore) -> redsem::Result<()> {
    /// println!("{} permits available", sem.available_permits().await?);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`]; [`Error::Unavailable`] when Redis cannot be reached (the read is
    /// tried once more after a dropped connection).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn available_permits(&self) -> Result<i64> {
        let inner = &self.inner;
        let availability = retry_once("available_permits", || async {
            script::permit_available(&mut inner.redsem.conn(), &inner.keys).await
        })
        .await?;
        Ok(availability.available)
    }

    /// Take every available permit; returns how many were taken. A count at or below zero is
    /// left as it is and 0 is returned (unlike Java's `drainPermits`, a negative count is not
    /// reset).
    ///
    /// Retry-safe: the call carries a request id; after a dropped connection it is repeated
    /// once with the same id, and the repeat answers the amount the first attempt took
    /// (permits released in between stay available).
    ///
    /// With [`replica_acks`](crate::RedsemOptions::replica_acks), a drain fewer replicas
    /// acknowledged gives back what it took before it fails with [`Error::NotReplicated`], as
    /// an acquire does: nothing is held.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::PermitSemaphore) -> redsem::Result<()> {
    /// let taken = sem.drain_permits().await?;
    /// sem.release(u32::try_from(taken).unwrap_or(u32::MAX)).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`], [`Error::Unavailable`], [`Error::NotReplicated`] (the permits
    /// taken were given back).
    ///
    /// # Cancel safety
    ///
    /// If dropped after sending, the permits may or may not have been taken.
    pub async fn drain_permits(&self) -> Result<u64> {
        let inner = &self.inner;
        let request = PermitId::random();
        let seq = inner.redsem.session().open();
        let (taken, unconfirmed) = retry_once("drain_permits", || async {
            let (taken, unconfirmed) = script::permit_drain(
                &mut inner.redsem.conn(),
                &inner.keys,
                request.as_str(),
                Caller::new(inner.redsem.session(), seq.n()),
            )
            .await?;
            match unconfirmed {
                // A `WAIT` that did not answer is sent again with the drain (same id).
                Some(err) if !err.is_not_replicated() => Err(err),
                unconfirmed => Ok((taken, unconfirmed)),
            }
        })
        .await?;
        let Some(err) = unconfirmed else {
            return Ok(taken);
        };
        if taken > 0 {
            // A count is at most MAX_PERMITS; what a drain took fits an addition.
            let back = i64::try_from(taken).unwrap_or(MAX_PERMITS);
            if let Err(back) = self.add(back, "drain_give_back").await
                && !back.is_not_replicated()
            {
                tracing::warn!(error = %crate::error::Chain(&back), permits = taken,
                    "could not give back a drain the replicas did not acknowledge");
            }
        }
        Err(err)
    }

    /// Remove the semaphore: its count and its queue. Returns true if its count was set.
    ///
    /// Afterwards it is as if never set: [`try_set_permits`](Self::try_set_permits) succeeds
    /// again. Requests waiting on it notice at their next check-in and queue again (under new
    /// request ids).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::PermitSemaphore) -> redsem::Result<()> {
    /// sem.delete().await?;
    /// assert!(sem.try_set_permits(2).await?);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`] (nothing is deleted), [`Error::Unavailable`].
    ///
    /// # Cancel safety
    ///
    /// If dropped after sending, the semaphore may or may not have been deleted.
    pub async fn delete(&self) -> Result<bool> {
        let inner = &self.inner;
        script::permit_delete(&mut inner.redsem.conn(), &inner.keys).await
    }

    /// Add `delta` permits, run to its end even if the caller stops waiting
    /// ([`Redsem::run_to_end`]): a release or an addition, once called, happens.
    async fn add(&self, delta: i64, what: &'static str) -> Result<()> {
        let inner = self.inner.clone();
        self.inner
            .redsem
            .run_to_end(async move {
                inner.add(delta, what).await?;
                if what == "release" {
                    inner
                        .meter
                        .released(u32::try_from(delta).unwrap_or(u32::MAX));
                }
                Ok(())
            })
            .await
    }

    /// The request, measured ([`crate::observe`]) and run in its span.
    async fn take(&self, permits: u32, patience: Patience) -> Result<()> {
        if permits == 0 {
            return Ok(());
        }
        let inner = &self.inner;
        let attempt = Attempt::start(
            &inner.meter,
            op_span!(inner.meter, "redsem.permits.acquire"),
            Some(u64::from(permits)),
        );
        let span = attempt.span().clone();
        let result = async {
            self.ensure_expected().await?;
            self.take_unmeasured(permits, patience, &attempt).await
        }
        .instrument(span)
        .await;
        attempt.finish(&result);
        result
    }

    async fn take_unmeasured(
        &self,
        permits: u32,
        patience: Patience,
        attempt: &Attempt<'_>,
    ) -> Result<()> {
        let request = PermitRequest { sem: self, permits };
        wait::acquire(&request, patience, |_| attempt.queued()).await?;
        Ok(())
    }
}

impl PermitInner {
    async fn add(&self, delta: i64, what: &'static str) -> Result<()> {
        let inner = self;
        let request = PermitId::random();
        let span = match what {
            "release" => op_span!(inner.meter, "redsem.permits.release"),
            _ => op_span!(inner.meter, "redsem.permits.add"),
        };
        span.record("units", delta);
        let seq = inner.redsem.session().open();
        let added = retry_once(what, || async {
            match &inner.batcher {
                Some(batcher) => {
                    let op = script::PermitOp::add(request.as_str(), delta, seq.n());
                    let (reply, unconfirmed) = batcher.submit(op).await?;
                    script::added(script::Acked { reply, unconfirmed })
                }
                None => {
                    let mut conn = inner.redsem.conn();
                    let call = Caller::new(inner.redsem.session(), seq.n());
                    script::permit_add(&mut conn, &inner.keys, request.as_str(), delta, call).await
                }
            }
        })
        .instrument(span)
        .await?;
        match added {
            Addition::Applied(_) | Addition::Repeated(_) => Ok(()),
            Addition::OutOfRange(available) => Err(invalid(format!(
                "cannot add {delta} permits to {:?}: {available} available, and the count must stay within ±{MAX_PERMITS}",
                inner.name
            ))),
        }
    }
}
