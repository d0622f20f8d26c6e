//! The blocking permit semaphore.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::Runtime;
use crate::error::Result;

/// The blocking [`crate::PermitSemaphore`].
#[derive(Clone)]
pub struct PermitSemaphore {
    pub(super) inner: crate::PermitSemaphore,
    pub(super) runtime: Arc<Runtime>,
}

impl fmt::Debug for PermitSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::PermitSemaphore")
            .field(&self.inner)
            .finish()
    }
}

impl PermitSemaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// As [`crate::PermitSemaphore::try_set_permits`].
    ///
    /// # Errors
    ///
    /// As [`crate::PermitSemaphore::try_set_permits`].
    pub fn try_set_permits(&self, permits: u32) -> Result<bool> {
        self.runtime.block_on(self.inner.try_set_permits(permits))
    }

    /// As [`crate::PermitSemaphore::ensure_permits`].
    ///
    /// # Errors
    ///
    /// As [`crate::PermitSemaphore::ensure_permits`].
    pub fn ensure_permits(&self, permits: u32) -> Result<bool> {
        self.runtime.block_on(self.inner.ensure_permits(permits))
    }

    /// As [`crate::PermitSemaphore::add_permits`].
    ///
    /// # Errors
    ///
    /// As [`crate::PermitSemaphore::add_permits`].
    pub fn add_permits(&self, delta: i64) -> Result<()> {
        self.runtime.block_on(self.inner.add_permits(delta))
    }

    /// As [`crate::PermitSemaphore::try_acquire`].
    ///
    /// # Errors
    ///
    /// As [`crate::PermitSemaphore::try_acquire`].
    pub fn try_acquire(&self, permits: u32) -> Result<()> {
        self.runtime.block_on(self.inner.try_acquire(permits))
    }

    /// As [`crate::PermitSemaphore::acquire`].
    ///
    /// # Errors
    ///
    /// As [`crate::PermitSemaphore::acquire`].
    pub fn acquire(&self, permits: u32) -> Result<()> {
        self.runtime.block_on(self.inner.acquire(permits))
    }

    /// As [`crate::PermitSemaphore::acquire_timeout`].
    ///
    /// # Errors
    ///
    /// As [`crate::PermitSemaphore::acquire_timeout`].
    pub fn acquire_timeout(&self, permits: u32, wait: Duration) -> Result<()> {
        self.runtime
            .block_on(self.inner.acquire_timeout(permits, wait))
    }

    /// As [`crate::PermitSemaphore::release`].
    ///
    /// # Errors
    ///
    /// As [`crate::PermitSemaphore::release`].
    pub fn release(&self, permits: u32) -> Result<()> {
        self.runtime.block_on(self.inner.release(permits))
    }

    /// As [`crate::PermitSemaphore::available_permits`].
    ///
    /// # Errors
    ///
    /// As [`crate::PermitSemaphore::available_permits`].
    pub fn available_permits(&self) -> Result<i64> {
        self.runtime.block_on(self.inner.available_permits())
    }

    /// As [`crate::PermitSemaphore::drain_permits`].
    ///
    /// # Errors
    ///
    /// As [`crate::PermitSemaphore::drain_permits`].
    pub fn drain_permits(&self) -> Result<u64> {
        self.runtime.block_on(self.inner.drain_permits())
    }
}
