//! `Mutex`: a lease semaphore of capacity 1, under tokio's names.

use std::ops::Deref;
use std::time::Duration;

use crate::error::Result;
use crate::lease::{LeasePermit, LeaseSemaphore};

/// A distributed mutex: a [`LeaseSemaphore`] of capacity 1. It guards no data of its own (like
/// `tokio::sync::Mutex<()>`); the guard carries a fencing token to pass to what it protects.
///
/// # Examples
///
/// ```no_run
/// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
/// let lock = redsem.mutex("invoice-42")?;
/// let guard = lock.lock().await?;
/// println!("fencing token {}", guard.token());
/// guard.unlock().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct Mutex {
    sem: LeaseSemaphore,
}

/// A held [`Mutex`]: a [`LeasePermit`] (its methods are reachable through `Deref`).
#[must_use = "dropping a MutexGuard unlocks the mutex"]
#[clippy::has_significant_drop]
#[derive(Debug)]
pub struct MutexGuard {
    permit: LeasePermit,
}

impl Mutex {
    pub(crate) fn new(sem: LeaseSemaphore) -> Mutex {
        Mutex { sem }
    }

    /// The mutex's name.
    pub fn name(&self) -> &str {
        self.sem.name()
    }

    /// Wait in line for the lock.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(lock: redsem::Mutex) -> redsem::Result<()> {
    /// let guard = lock.lock().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`LeaseSemaphore::acquire`].
    ///
    /// # Cancel safety
    ///
    /// As [`LeaseSemaphore::acquire`]: dropping the future withdraws the request.
    pub async fn lock(&self) -> Result<MutexGuard> {
        self.sem.acquire().await.map(|permit| MutexGuard { permit })
    }

    /// Take the lock if it is free and nobody waits.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(lock: redsem::Mutex) -> redsem::Result<()> {
    /// if let Ok(guard) = lock.try_lock().await {
    ///     guard.unlock().await?;
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`LeaseSemaphore::try_acquire`].
    ///
    /// # Cancel safety
    ///
    /// As [`LeaseSemaphore::try_acquire`].
    pub async fn try_lock(&self) -> Result<MutexGuard> {
        self.sem
            .try_acquire()
            .await
            .map(|permit| MutexGuard { permit })
    }

    /// Wait in line for the lock for at most `wait`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(lock: redsem::Mutex) -> redsem::Result<()> {
    /// let guard = lock.lock_timeout(std::time::Duration::from_secs(2)).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`LeaseSemaphore::acquire_timeout`].
    ///
    /// # Cancel safety
    ///
    /// As [`LeaseSemaphore::acquire`].
    pub async fn lock_timeout(&self, wait: Duration) -> Result<MutexGuard> {
        self.sem
            .acquire_timeout(wait)
            .await
            .map(|permit| MutexGuard { permit })
    }

    /// The underlying semaphore (for `status()` and by-id operations).
    pub fn semaphore(&self) -> &LeaseSemaphore {
        &self.sem
    }
}

impl MutexGuard {
    /// Unlock and hand the lock to the next in line.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(guard: redsem::MutexGuard) -> redsem::Result<()> {
    /// guard.unlock().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`LeasePermit::release`].
    ///
    /// # Cancel safety
    ///
    /// As [`LeasePermit::release`].
    pub async fn unlock(self) -> Result<()> {
        self.permit.release().await
    }

    /// The permit behind the guard.
    pub fn into_permit(self) -> LeasePermit {
        self.permit
    }
}

impl Deref for MutexGuard {
    type Target = LeasePermit;

    fn deref(&self) -> &LeasePermit {
        &self.permit
    }
}
