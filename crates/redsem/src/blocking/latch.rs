//! The blocking count-down latch.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use super::Runtime;
use crate::LatchState;
use crate::error::Result;

/// The blocking [`crate::CountDownLatch`].
#[derive(Clone)]
pub struct CountDownLatch {
    pub(super) inner: crate::CountDownLatch,
    pub(super) runtime: Arc<Runtime>,
}

impl fmt::Debug for CountDownLatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::CountDownLatch")
            .field(&self.inner)
            .finish()
    }
}

impl CountDownLatch {
    /// The latch's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// As [`crate::CountDownLatch::try_set_count`].
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::try_set_count`].
    pub fn try_set_count(&self, count: u64) -> Result<bool> {
        self.runtime.block_on(self.inner.try_set_count(count))
    }

    /// As [`crate::CountDownLatch::count_down`].
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::count_down`].
    pub fn count_down(&self) -> Result<Option<u64>> {
        self.runtime.block_on(self.inner.count_down())
    }

    /// As [`crate::CountDownLatch::count`].
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::count`].
    pub fn count(&self) -> Result<u64> {
        self.runtime.block_on(self.inner.count())
    }

    /// As [`crate::CountDownLatch::state`].
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::state`].
    pub fn state(&self) -> Result<LatchState> {
        self.runtime.block_on(self.inner.state())
    }

    /// Block until the latch is not counting, as [`crate::CountDownLatch::wait`].
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::wait`].
    pub fn wait(&self) -> Result<()> {
        self.runtime.block_on(self.inner.wait())
    }

    /// As [`crate::CountDownLatch::wait_timeout`].
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::wait_timeout`].
    pub fn wait_timeout(&self, wait: Duration) -> Result<()> {
        self.runtime.block_on(self.inner.wait_timeout(wait))
    }
}
