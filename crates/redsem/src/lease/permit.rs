//! `LeasePermit`: a held lease, its keepalive and its loss signal.

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::clock;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::SemInner;
use crate::error::{Error, Result};
use crate::script::{self, Release};
use crate::types::{FencingToken, PermitId};

/// After a failed renewal (Redis unreachable), try again this often, within the lease.
const RETRY_AFTER_ERROR: Duration = Duration::from_millis(50);

/// A permit of a [`LeaseSemaphore`](super::LeaseSemaphore): some units of it, held under a
/// lease that a background task renews every third of the lease.
///
/// The permit knows locally when its lease may have ended: it measures the lease from the
/// moment the last successful grant or renewal was *sent*, so a process that was paused or cut
/// off from Redis finds out (through [`LeasePermit::lost`] and [`LeasePermit::is_held`])
/// no later than the lease could have ended on the server.
///
/// Dropping the permit stops the renewal and releases it in the background; call
/// [`LeasePermit::release`] to know that it was released.
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
pub struct LeasePermit {
    state: Arc<PermitState>,
    /// Stops the keepalive when the permit goes.
    _keepalive: DropGuard,
    /// Released or forgotten: nothing left for `Drop` to do.
    settled: bool,
}

struct PermitState {
    sem: Arc<SemInner>,
    id: PermitId,
    token: FencingToken,
    slots: Vec<u32>,
    /// The lease can have ended on the server no earlier than this ([`clock`] time).
    valid_until: Mutex<Duration>,
    /// Wakes the keepalive when a manual refresh moved `valid_until`.
    moved: Notify,
    lost: CancellationToken,
}

impl PermitState {
    fn valid_until(&self) -> Duration {
        *self.valid_until.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn renewed(&self, sent: Duration) {
        let mut until = self.valid_until.lock().unwrap_or_else(|p| p.into_inner());
        *until = (*until).max(sent + self.sem.options.lease);
    }

    fn lose(&self, why: &str) {
        if !self.lost.is_cancelled() {
            tracing::warn!(semaphore = %self.sem.name, id = %self.id, why, "lease lost");
            self.lost.cancel();
        }
    }

    async fn refresh(&self) -> Result<bool> {
        let sent = clock::now();
        let held = script::lease_refresh(
            &mut self.sem.redsem.conn(),
            &self.sem.keys,
            self.id.as_str(),
            self.sem.options.lease,
        )
        .await?;
        if held {
            self.renewed(sent);
        }
        Ok(held)
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
        let state = Arc::new(PermitState {
            sem,
            id,
            token: FencingToken(token),
            slots,
            valid_until: Mutex::new(valid_until),
            moved: Notify::new(),
            lost: CancellationToken::new(),
        });
        let stop = CancellationToken::new();
        tokio::spawn(keepalive(state.clone(), stop.clone(), renew));
        LeasePermit {
            state,
            _keepalive: stop.drop_guard(),
            settled: false,
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
    /// (then it is marked lost); [`Error::Unavailable`] if Redis cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a renewal that happened is kept, one that did not changes nothing.
    pub async fn refresh(&self) -> Result<()> {
        if self.state.lost.is_cancelled() {
            return Err(self.lost_error());
        }
        if self.state.refresh().await? {
            self.state.moved.notify_one();
            Ok(())
        } else {
            self.state.lose("refresh found it not held");
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
    /// [`Error::NotHeld`] if it was no longer held (its lease had ended);
    /// [`Error::Unavailable`] if Redis cannot be reached (then the lease runs out by itself).
    ///
    /// # Cancel safety
    ///
    /// Not cancel safe: if dropped mid-way the permit may or may not have been released; it
    /// is no longer renewed either way.
    pub async fn release(mut self) -> Result<()> {
        self.settled = true;
        self.state.lost.cancel();
        match self.state.sem.release(self.state.id.as_str()).await? {
            Release::Released => Ok(()),
            Release::Dequeued | Release::NotHeld => Err(self.state.sem.not_held(&self.state.id)),
        }
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
        self.settled = true;
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
        if self.settled {
            return;
        }
        self.state.lost.cancel();
        let state = self.state.clone();
        let redsem = state.sem.redsem.clone();
        redsem.spawn_cleanup(async move {
            if let Err(err) = state.sem.release(state.id.as_str()).await {
                tracing::warn!(semaphore = %state.sem.name, id = %state.id, error = %err,
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

/// Renews every third of the lease (if `renew`), and declares the permit lost when Redis says
/// it is gone or when its lease may have ended without a renewal.
///
/// Deadlines are kept on [`clock`] time; tokio's timers stop while the machine is suspended,
/// so no sleep lasts longer than a quarter of the lease before the clock is read again.
async fn keepalive(state: Arc<PermitState>, stop: CancellationToken, renew: bool) {
    let lease = state.sem.options.lease;
    let period = lease / 3;
    // First renewal after a third of the lease, or sooner if less than two thirds are
    // left (a grant handed over with a wake-up runs on the waiter's lease).
    let now = clock::now();
    let mut next = now + period.min(state.valid_until().saturating_sub(now) / 2);
    loop {
        let now = clock::now();
        let deadline = state.valid_until();
        if now >= deadline {
            state.lose("lease may have ended without a renewal");
            return;
        }
        let renew_in = if renew {
            next.saturating_sub(now)
        } else {
            Duration::MAX
        };
        if renew_in.is_zero() {
            let outcome = tokio::select! {
                biased;
                () = stop.cancelled() => return,
                () = tokio::time::sleep(deadline - now) => continue,
                outcome = state.refresh() => outcome,
            };
            match outcome {
                Ok(true) => next = clock::now().max(next) + period,
                Ok(false) => {
                    state.lose("Redis no longer has it");
                    return;
                }
                Err(err) => {
                    tracing::debug!(semaphore = %state.sem.name, id = %state.id, error = %err, "renewal failed; retrying");
                    next = clock::now() + RETRY_AFTER_ERROR.min(period);
                }
            }
            continue;
        }
        let nap = renew_in.min(deadline - now).min(lease / 4);
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            () = state.lost.cancelled() => return,
            () = state.moved.notified() => {}
            () = tokio::time::sleep(nap) => {}
        }
    }
}
