//! `PermitOptions`: the waiter lease and the count to start with.

use std::time::Duration;

use crate::error::Result;

/// Options of a [`PermitSemaphore`](crate::PermitSemaphore).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// let options = redsem::PermitOptions::default().waiter_lease(Duration::from_secs(3));
/// assert_eq!(options.waiter_lease, Duration::from_secs(3));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct PermitOptions {
    /// How long a queued request keeps its place without checking in (default 10 s). A waiter
    /// checks in every third of it, and also re-checks then if a wake-up message was lost; a
    /// crashed waiter stops blocking the queue after this, and permits handed to it that it
    /// never collected come back.
    pub waiter_lease: Duration,
    /// The count the semaphore is expected to start with (default none). With it, a handle
    /// sets the count to this before its first acquire if it was never set ([`ensure_permits`]),
    /// and again after its queue vanished (the server lost its state), so a fresh or
    /// restarted pool does not wait forever on 0 permits. A count already set is left alone.
    ///
    /// [`ensure_permits`]: crate::PermitSemaphore::ensure_permits
    pub permits: Option<u32>,
}

impl Default for PermitOptions {
    fn default() -> Self {
        PermitOptions {
            waiter_lease: Duration::from_secs(10),
            permits: None,
        }
    }
}

impl PermitOptions {
    /// Set the waiter lease.
    #[must_use]
    pub fn waiter_lease(mut self, waiter_lease: Duration) -> Self {
        self.waiter_lease = waiter_lease;
        self
    }

    /// Set the count the semaphore is expected to start with (see [`PermitOptions::permits`]).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
    /// let options = redsem::PermitOptions::default().permits(4);
    /// let gpus = redsem.permit_semaphore_with("gpu", options)?;
    /// gpus.acquire(1).await?; // sets 4 first if nobody ever did
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn permits(mut self, permits: u32) -> Self {
        self.permits = Some(permits);
        self
    }

    pub(super) fn validate(&self) -> Result<()> {
        crate::types::check_lease("waiter lease", self.waiter_lease)
    }
}
