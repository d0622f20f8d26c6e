//! The blocking lease semaphore, its permit, and the mutex.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use super::Runtime;
use crate::error::Result;
use crate::{FencingToken, PermitId, Status};

/// The blocking [`crate::LeaseSemaphore`].
#[derive(Clone)]
pub struct LeaseSemaphore {
    pub(super) inner: crate::LeaseSemaphore,
    pub(super) runtime: Arc<Runtime>,
}

impl fmt::Debug for LeaseSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::LeaseSemaphore")
            .field(&self.inner)
            .finish()
    }
}

impl LeaseSemaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The capacity this handle requests.
    pub fn capacity(&self) -> u32 {
        self.inner.capacity()
    }

    fn permit(&self, permit: Result<crate::LeasePermit>) -> Result<LeasePermit> {
        Ok(LeasePermit {
            inner: permit?,
            runtime: self.runtime.clone(),
        })
    }

    /// Take one unit if one is free and nobody waits, as
    /// [`crate::LeaseSemaphore::try_acquire`].
    ///
    /// # Errors
    ///
    /// As [`crate::LeaseSemaphore::try_acquire`].
    pub fn try_acquire(&self) -> Result<LeasePermit> {
        self.permit(self.runtime.block_on(self.inner.try_acquire()))
    }

    /// Wait in line for one unit, as [`crate::LeaseSemaphore::acquire`].
    ///
    /// # Errors
    ///
    /// As [`crate::LeaseSemaphore::acquire`].
    pub fn acquire(&self) -> Result<LeasePermit> {
        self.permit(self.runtime.block_on(self.inner.acquire()))
    }

    /// Wait in line for `units` units, as [`crate::LeaseSemaphore::acquire_many`].
    ///
    /// # Errors
    ///
    /// As [`crate::LeaseSemaphore::acquire_many`].
    pub fn acquire_many(&self, units: u32) -> Result<LeasePermit> {
        self.permit(self.runtime.block_on(self.inner.acquire_many(units)))
    }

    /// Wait in line for one unit for at most `wait`, as
    /// [`crate::LeaseSemaphore::acquire_timeout`] (the request is withdrawn when it runs
    /// out).
    ///
    /// # Errors
    ///
    /// As [`crate::LeaseSemaphore::acquire_timeout`].
    pub fn acquire_timeout(&self, wait: Duration) -> Result<LeasePermit> {
        self.permit(self.runtime.block_on(self.inner.acquire_timeout(wait)))
    }

    /// A snapshot of holders and queue, as [`crate::LeaseSemaphore::status`].
    ///
    /// # Errors
    ///
    /// As [`crate::LeaseSemaphore::status`].
    pub fn status(&self) -> Result<Status> {
        self.runtime.block_on(self.inner.status())
    }
}

/// The blocking [`crate::LeasePermit`]: renewed in the background while it lives, released
/// when dropped (the drop waits for the release).
#[must_use = "dropping a LeasePermit releases it"]
#[clippy::has_significant_drop]
pub struct LeasePermit {
    pub(super) inner: crate::LeasePermit,
    pub(super) runtime: Arc<Runtime>,
}

impl fmt::Debug for LeasePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::LeasePermit")
            .field(&self.inner)
            .finish()
    }
}

impl LeasePermit {
    fn permit(&self) -> &crate::LeasePermit {
        &self.inner
    }

    /// The permit id.
    pub fn id(&self) -> &PermitId {
        self.permit().id()
    }

    /// The fencing token of this grant.
    pub fn token(&self) -> FencingToken {
        self.permit().token()
    }

    /// The first slot of this permit.
    pub fn slot(&self) -> u32 {
        self.permit().slot()
    }

    /// All slots of this permit.
    pub fn slots(&self) -> &[u32] {
        self.permit().slots()
    }

    /// True while the permit is known to be held, as [`crate::LeasePermit::is_held`]: check
    /// it between steps of long work.
    pub fn is_held(&self) -> bool {
        self.permit().is_held()
    }

    /// True once the permit is known lost or its lease may have ended, as
    /// [`crate::LeasePermit::is_lost`]: the opposite of [`is_held`](Self::is_held).
    pub fn is_lost(&self) -> bool {
        self.permit().is_lost()
    }

    /// How long the lease is certain to last without another renewal.
    pub fn time_left(&self) -> Duration {
        self.permit().time_left()
    }

    /// Renew the lease now, as [`crate::LeasePermit::refresh`].
    ///
    /// # Errors
    ///
    /// As [`crate::LeasePermit::refresh`].
    pub fn refresh(&self) -> Result<()> {
        self.runtime.block_on(self.permit().refresh())
    }

    /// Release the permit and hand its units to the next in line, as
    /// [`crate::LeasePermit::release`].
    ///
    /// # Errors
    ///
    /// As [`crate::LeasePermit::release`].
    pub fn release(self) -> Result<()> {
        self.runtime.block_on(self.inner.release_shared())
    }

    /// Stop renewing and leave the permit held until its lease runs out, as
    /// [`crate::LeasePermit::forget`].
    pub fn forget(mut self) {
        self.inner.forget_in_place();
    }
}

impl Drop for LeasePermit {
    fn drop(&mut self) {
        if self.inner.is_settled() || tokio::runtime::Handle::try_current().is_ok() {
            // Settled; or dropped inside async code, where blocking would panic: the inner
            // permit's own drop releases it in the background, on that runtime.
            return;
        }
        if let Err(err) = self.runtime.block_on(self.inner.release_shared()) {
            tracing::warn!(id = %self.inner.id(), error = %crate::error::Chain(&err),
                "could not release a dropped permit; its lease will end by itself");
        }
    }
}

/// The blocking [`crate::Mutex`].
#[derive(Clone)]
pub struct Mutex {
    pub(super) inner: crate::Mutex,
    pub(super) runtime: Arc<Runtime>,
}

impl fmt::Debug for Mutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::Mutex").field(&self.inner).finish()
    }
}

/// A held blocking [`Mutex`]: a [`LeasePermit`] (reachable through `Deref`), unlocked when
/// dropped.
#[must_use = "dropping a MutexGuard unlocks the mutex"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct MutexGuard {
    permit: LeasePermit,
}

impl Mutex {
    /// The mutex's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    fn guard(&self, guard: Result<crate::MutexGuard>) -> Result<MutexGuard> {
        Ok(MutexGuard {
            permit: LeasePermit {
                inner: guard?.into_permit(),
                runtime: self.runtime.clone(),
            },
        })
    }

    /// Wait in line for the lock, as [`crate::Mutex::lock`].
    ///
    /// # Errors
    ///
    /// As [`crate::Mutex::lock`].
    pub fn lock(&self) -> Result<MutexGuard> {
        self.guard(self.runtime.block_on(self.inner.lock()))
    }

    /// Take the lock if it is free and nobody waits, as [`crate::Mutex::try_lock`].
    ///
    /// # Errors
    ///
    /// As [`crate::Mutex::try_lock`].
    pub fn try_lock(&self) -> Result<MutexGuard> {
        self.guard(self.runtime.block_on(self.inner.try_lock()))
    }

    /// Wait in line for the lock for at most `wait`, as [`crate::Mutex::lock_timeout`].
    ///
    /// # Errors
    ///
    /// As [`crate::Mutex::lock_timeout`].
    pub fn lock_timeout(&self, wait: Duration) -> Result<MutexGuard> {
        self.guard(self.runtime.block_on(self.inner.lock_timeout(wait)))
    }
}

impl MutexGuard {
    /// Unlock and hand the lock to the next in line.
    ///
    /// # Errors
    ///
    /// As [`crate::LeasePermit::release`].
    pub fn unlock(self) -> Result<()> {
        self.permit.release()
    }
}

impl Deref for MutexGuard {
    type Target = LeasePermit;

    fn deref(&self) -> &LeasePermit {
        &self.permit
    }
}
