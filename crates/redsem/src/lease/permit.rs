//! `LeasePermit`: a held lease and its loss signal. Its renewals and its loss timer are in
//! the `Redsem`'s keepalive (`crate::keepalive`).

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::BoxFuture;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::{SERVER_CLOCK_STEP, SemInner};
use crate::clock;
use crate::error::{Error, Result};
use crate::keepalive::{Keepalive, Renewable};
use crate::observe::Renewal;
use crate::script::{self, Release};
use crate::types::{FencingToken, PermitId};

/// A permit of a [`LeaseSemaphore`](super::LeaseSemaphore): some units of it, held under a
/// lease that the `Redsem`'s keepalive renews every third of the lease.
///
/// The permit knows locally when its lease may have ended: it measures the lease from the
/// moment the last successful grant or renewal was *sent*, so a process that was paused or cut
/// off from Redis finds out (through [`LeasePermit::lost`] and [`LeasePermit::is_held`])
/// no later than the lease could have ended on the server.
///
/// Dropping the permit stops the renewal and releases it in the background; call
/// [`LeasePermit::release`] to know that it was released. A permit shared between tasks (in
/// an `Arc`) is released through a shared reference with [`LeasePermit::release_shared`]:
/// the first call releases it, later ones answer as a released permit does.
///
/// # Examples
///
/// ```no_run
/// # async fn example(sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
/// let permit = sem.acquire().await?;
/// println!("id {} token {} slot {}", permit.id(), permit.token(), permit.slot());
/// permit.release().await?;
/// # Ok(())
/// # }
/// ```
#[must_use = "dropping a LeasePermit releases it"]
#[clippy::has_significant_drop]
pub struct LeasePermit {
    state: Arc<PermitState>,
    /// Released (or its release under way) or forgotten: nothing left for `Drop` or another
    /// release to do. Set once, by whichever call gets there first.
    settled: AtomicBool,
    /// Cancelled when the release that settled the permit has ended, answered or not: a later
    /// [`LeasePermit::release_shared`] waits for it before it answers.
    released: CancellationToken,
}

/// What the permit and the keepalive share.
pub(super) struct PermitState {
    sem: Arc<SemInner>,
    id: PermitId,
    token: FencingToken,
    slots: Vec<u32>,
    /// The permit's key in the keepalive's schedule.
    ticket: u64,
    /// The lease can have ended on the server no earlier than this ([`clock`] time).
    valid_until: Mutex<Duration>,
    /// Cancelled when the permit is lost, released or dropped (also cancels a renewal in
    /// flight).
    lost: CancellationToken,
    /// When it was granted (as this process saw it), for `redsem_hold_seconds`.
    granted: std::time::Instant,
    /// Its hold time was recorded (released, dropped, lost or forgotten).
    ended: AtomicBool,
    /// `redsem.permit`: open while the permit lives; its renewals, release and loss are
    /// recorded inside it.
    span: tracing::Span,
}

impl PermitState {
    pub(super) fn valid_until(&self) -> Duration {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn keepalive(&self) -> &Keepalive {
        &self.sem.redsem.shared.keepalive
    }

    fn renewed(&self, sent: Duration) {
        let mut until = self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
        *until = (*until).max((sent + self.sem.options.lease).saturating_sub(SERVER_CLOCK_STEP));
    }

    pub(super) fn lose(&self, why: &str) {
        if !self.lost.is_cancelled() {
            let _inside = self.span.enter();
            tracing::warn!(semaphore = %self.sem.name, id = %self.id, why, "lease lost");
            // Counted, and the hold recorded, before `lost()` wakes anyone: a task woken by
            // it may read the metrics at once.
            if !self.ended.load(Ordering::Relaxed) {
                self.sem.meter.lost();
            }
            self.end();
            self.lost.cancel();
        }
    }

    /// The permit's hold ended (released, dropped, lost) or is no longer followed
    /// (forgotten): record its hold time once, unless `forgotten`.
    fn end_as(&self, forgotten: bool) {
        if !self.ended.swap(true, Ordering::Relaxed) && !forgotten {
            self.sem.meter.held(self.granted.elapsed());
        }
    }

    fn end(&self) {
        self.end_as(false);
    }

    /// Send one renewal; on success move `valid_until` and return when it was sent.
    pub(super) async fn refresh(&self) -> Result<Option<Duration>> {
        let sent = clock::now();
        let span = tracing::debug_span!(parent: &self.span, "redsem.renew", outcome = tracing::field::Empty);
        let held = script::lease_refresh(
            &mut self.sem.redsem.conn(),
            &self.sem.keys,
            self.id.as_str(),
            self.sem.options.lease,
        )
        .instrument(span.clone())
        .await;
        let (renewal, word) = match &held {
            Ok(true) => (Renewal::Ok, "ok"),
            Ok(false) => (Renewal::NotHeld, "not_held"),
            Err(_) => (Renewal::Failed, "error"),
        };
        span.record("outcome", word);
        self.sem.meter.renewal(renewal);
        let held = held?;
        if held {
            self.renewed(sent);
        }
        Ok(held.then_some(sent))
    }
}

impl Renewable for PermitState {
    fn ticket(&self) -> u64 {
        self.ticket
    }

    fn lease(&self) -> Duration {
        self.sem.options.lease
    }

    fn valid_until(&self) -> Duration {
        PermitState::valid_until(self)
    }

    fn semaphore(&self) -> &str {
        &self.sem.name
    }

    fn id(&self) -> &PermitId {
        &self.id
    }

    fn lose(&self, why: &str) {
        PermitState::lose(self, why);
    }

    fn gone(&self) -> BoxFuture<'_, ()> {
        Box::pin(self.lost.cancelled())
    }

    fn refresh(&self) -> BoxFuture<'_, Result<Option<Duration>>> {
        Box::pin(PermitState::refresh(self))
    }
}

impl LeasePermit {
    pub(crate) fn start(
        sem: Arc<SemInner>,
        id: PermitId,
        token: u64,
        slots: Vec<u32>,
        valid_until: Duration,
    ) -> LeasePermit {
        let renew = sem.options.keepalive;
        let ticket = sem.redsem.shared.keepalive.ticket();
        let span = tracing::info_span!(
            "redsem.permit",
            primitive = sem.meter.primitive(),
            name = %sem.name,
            id = %id,
            token,
            slot = slots.first().copied().unwrap_or_default(),
        );
        let state = Arc::new(PermitState {
            granted: std::time::Instant::now(),
            ended: AtomicBool::new(false),
            span,
            sem,
            id,
            token: FencingToken(token),
            slots,
            ticket,
            valid_until: Mutex::new(valid_until),
            lost: CancellationToken::new(),
        });
        state.keepalive().schedule(state.clone(), renew);
        LeasePermit {
            state,
            settled: AtomicBool::new(false),
            released: CancellationToken::new(),
        }
    }

    /// The permit id: 128 random bits.
    pub fn id(&self) -> &PermitId {
        &self.state.id
    }

    /// The fencing token of this grant.
    pub fn token(&self) -> FencingToken {
        self.state.token
    }

    /// The first (lowest) slot of this permit, in `0..capacity`.
    pub fn slot(&self) -> u32 {
        self.state.slots.first().copied().unwrap_or_default()
    }

    /// All slots of this permit, one per unit.
    pub fn slots(&self) -> &[u32] {
        &self.state.slots
    }

    /// The holder label it was acquired with.
    pub fn label(&self) -> Option<&str> {
        self.state.sem.options.label.as_deref()
    }

    /// The name of its semaphore.
    pub fn semaphore(&self) -> &str {
        &self.state.sem.name
    }

    /// The instant before which the lease cannot have ended on the server. Renewals move it
    /// forward.
    pub fn expires_at(&self) -> Instant {
        Instant::now() + self.time_left()
    }

    /// How long the lease is certain to last without another renewal (zero once it may
    /// have ended).
    pub fn time_left(&self) -> Duration {
        self.state.valid_until().saturating_sub(clock::now())
    }

    /// True while the permit is known to be held: not lost, and the lease cannot have ended
    /// (also counting time the machine spent suspended).
    pub fn is_held(&self) -> bool {
        !self.state.lost.is_cancelled() && clock::now() < self.state.valid_until()
    }

    /// True once the permit is known lost or its lease may have ended unrenewed: the
    /// opposite of [`is_held`](Self::is_held), to check between steps of work without
    /// awaiting [`lost`](Self::lost). Reads local state only (no round trip).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn step(_: u32) {}
    /// # async fn example(sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
    /// let permit = sem.acquire().await?;
    /// for n in 0..10 {
    ///     if permit.is_lost() {
    ///         return Err(redsem::Error::LeaseLost {
    ///             name: permit.semaphore().to_owned(),
    ///             id: permit.id().to_string(),
    ///         });
    ///     }
    ///     step(n).await;
    /// }
    /// permit.release().await
    /// # }
    /// ```
    pub fn is_lost(&self) -> bool {
        !self.is_held()
    }

    /// Resolves as soon as the permit is known lost, or its lease may have ended unrenewed
    /// (Redis unreachable, the process paused). Never resolves while the permit is renewed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn work() {}
    /// # async fn example(sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
    /// let permit = sem.acquire().await?;
    /// tokio::select! {
    ///     () = permit.lost() => eprintln!("lost the permit; stopping the work"),
    ///     () = work() => permit.release().await?,
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn lost(&self) {
        self.state.lost.cancelled().await;
    }

    /// [`LeasePermit::lost`] as a future that owns what it waits for (for the tower layer's
    /// response future, which holds the permit beside it).
    #[cfg(feature = "tower")]
    pub(crate) fn lost_owned(&self) -> tokio_util::sync::WaitForCancellationFutureOwned {
        self.state.lost.clone().cancelled_owned()
    }

    /// Renew the lease now (the keepalive does this by itself every third of the lease).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(permit: redsem::LeasePermit) -> redsem::Result<()> {
    /// permit.refresh().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::LeaseLost`] if the permit was already known lost, or Redis says it is not held
    /// (then it is marked lost); [`Error::NotHeld`] once it was released
    /// ([`LeasePermit::release_shared`]); [`Error::Unavailable`] if Redis cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a renewal that happened is kept, one that did not changes nothing.
    pub async fn refresh(&self) -> Result<()> {
        if self.settled.load(Ordering::Acquire) {
            return Err(self.state.sem.not_held(&self.state.id));
        }
        if self.state.lost.is_cancelled() {
            return Err(self.lost_error());
        }
        if let Some(sent) = self.state.refresh().await? {
            self.state.keepalive().refreshed(self.state.ticket, sent);
            Ok(())
        } else {
            self.state.lose("refresh found it not held");
            self.state.keepalive().unschedule(self.state.ticket);
            Err(self.lost_error())
        }
    }

    /// Release the permit and hand its units to the next in line.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(permit: redsem::LeasePermit) -> redsem::Result<()> {
    /// permit.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if it was no longer held: its lease had ended, someone released it
    /// by id ([`LeaseSemaphore::release_id`](super::LeaseSemaphore::release_id)), or it was
    /// already known lost ([`LeasePermit::lost`] had fired; answered at once);
    /// [`Error::Unavailable`] if Redis cannot be reached (then the lease runs out by itself).
    /// A release whose reply was lost is sent once more and answers what it did.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: once called, the release happens. If this future is dropped
    /// before it answers, the release goes on in the background (as for a dropped permit,
    /// tracked by [`Redsem::flush`](crate::Redsem::flush)); only its answer is lost.
    pub async fn release(self) -> Result<()> {
        self.release_shared().await
    }

    /// [`LeasePermit::release`] through a shared reference, for a permit that several tasks
    /// hold (in an `Arc`): the first call releases it; a later call (or one made while the
    /// first is under way) waits until that release has ended and answers [`Error::NotHeld`],
    /// as a released permit does. Once any call has answered, the release has run its course.
    /// After it, [`LeasePermit::is_held`] is false,
    /// [`LeasePermit::lost`] resolves and [`LeasePermit::refresh`] answers
    /// [`Error::NotHeld`]; dropping the permit does nothing more.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn work(_: &redsem::LeasePermit) {}
    /// # async fn example(sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
    /// let permit = std::sync::Arc::new(sem.acquire().await?);
    /// let worker = tokio::spawn({
    ///     let permit = permit.clone();
    ///     async move { work(&permit).await }
    /// });
    /// // Give the units back when the work is done, whoever still holds a clone.
    /// let _ = worker.await;
    /// permit.release_shared().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`LeasePermit::release`]; [`Error::NotHeld`] once it was released (or forgotten).
    ///
    /// # Cancel safety
    ///
    /// As [`LeasePermit::release`]: once called, the release happens.
    pub async fn release_shared(&self) -> Result<()> {
        if self.settled.swap(true, Ordering::AcqRel) {
            self.released.cancelled().await;
            return Err(self.state.sem.not_held(&self.state.id));
        }
        // No renewal starts after this, so none can answer NOTHELD after the release.
        self.state.keepalive().unschedule(self.state.ticket);
        if self.state.lost.is_cancelled() {
            // Known lost (a renewal found it not held, or its lease may have ended unrenewed):
            // not held, at once. Its units may still be held on the server if only the time
            // ran out: they are released in the background, as for a dropped permit.
            self.release_in_background();
            self.released.cancel();
            return Err(self.state.sem.not_held(&self.state.id));
        }
        self.state.lost.cancel();
        self.state.end();
        let span = tracing::info_span!(parent: &self.state.span, "redsem.release", outcome = tracing::field::Empty);
        // Run to its end even if this future is dropped (a timeout or `select!` around the
        // release): the permit is settled and no longer renewed, so a release left half-way
        // would strand its units until the lease ends.
        let state = self.state.clone();
        let done = self.released.clone().drop_guard();
        let released = self
            .state
            .sem
            .redsem
            .run_to_end(
                async move {
                    let released = state.sem.release(state.id.as_str()).await;
                    drop(done);
                    released
                }
                .instrument(span.clone()),
            )
            .await;
        span.record(
            "outcome",
            match &released {
                Ok(Release::Released) => "released",
                Ok(_) => "not_held",
                Err(_) => "error",
            },
        );
        match released? {
            Release::Released => Ok(()),
            Release::Dequeued | Release::NotHeld => Err(self.state.sem.not_held(&self.state.id)),
        }
    }

    /// Settled already (released, or forgotten): for `blocking::LeasePermit`, whose `Drop`
    /// waits for the release.
    #[cfg_attr(not(feature = "blocking"), allow(dead_code))]
    pub(crate) fn is_settled(&self) -> bool {
        self.settled.load(Ordering::Acquire)
    }

    /// Stop renewing and leave the permit held until its lease runs out.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(permit: redsem::LeasePermit) {
    /// let id = permit.id().clone();
    /// permit.forget(); // someone else may refresh or release it by id
    /// # }
    /// ```
    pub fn forget(mut self) {
        self.forget_in_place();
    }

    pub(crate) fn forget_in_place(&mut self) {
        *self.settled.get_mut() = true;
        self.released.cancel();
        self.state.keepalive().unschedule(self.state.ticket);
        self.state.end_as(true);
    }

    fn lost_error(&self) -> Error {
        Error::LeaseLost {
            name: self.state.sem.name.clone(),
            id: self.state.id.to_string(),
        }
    }
}

impl Drop for LeasePermit {
    fn drop(&mut self) {
        if *self.settled.get_mut() {
            return;
        }
        self.state.keepalive().unschedule(self.state.ticket);
        self.state.lost.cancel();
        self.state.end();
        self.release_in_background();
    }
}

impl LeasePermit {
    /// Release the permit in the background (tracked by [`Redsem::flush`](crate::Redsem::flush)).
    fn release_in_background(&self) {
        let state = self.state.clone();
        let redsem = state.sem.redsem.clone();
        let span = tracing::info_span!(parent: &state.span, "redsem.release", dropped = true);
        redsem.spawn_cleanup(async move {
            if let Err(err) = state.sem.release(state.id.as_str()).instrument(span).await {
                tracing::warn!(semaphore = %state.sem.name, id = %state.id, error = %crate::error::Chain(&err),
                        "could not release a dropped permit; its lease will end by itself");
            }
        });
    }
}

impl fmt::Debug for LeasePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LeasePermit")
            .field("semaphore", &self.state.sem.name)
            .field("id", &self.state.id)
            .field("token", &self.state.token)
            .field("slots", &self.state.slots)
            .field("held", &self.is_held())
            .finish()
    }
}
