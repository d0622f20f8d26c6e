//! Every factory method of [`Redsem`]: the lease semaphore, the mutex, the permit semaphore
//! and the countdown latch, each with default options and `_with` options. They make no round
//! trip; each primitive checks its own name and options (its `new`).
//!
//! This is the top of the library's layers: it names every primitive, and nothing under it
//! names it (see `docs/DESIGN.md`, Module layers).

use crate::client::Redsem;
#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use crate::latch::{CountDownLatch, LatchOptions};
use crate::lease::{LeaseOptions, LeaseSemaphore};
use crate::mutex::Mutex;
use crate::permits::{PermitOptions, PermitSemaphore};

impl Redsem {
    /// A fair lease semaphore named `name` with `capacity` units and default options.
    ///
    /// Makes no round trip: the capacity is checked against the one stored with the semaphore
    /// when it is first used.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
    /// let exports = redsem.lease_semaphore("exports", 4)?;
    /// let permit = exports.acquire().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name or a capacity of 0.
    pub fn lease_semaphore(&self, name: &str, capacity: u32) -> Result<LeaseSemaphore> {
        self.lease_semaphore_with(name, capacity, LeaseOptions::default())
    }

    /// A fair lease semaphore with `options`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
    /// use std::time::Duration;
    /// use redsem::LeaseOptions;
    /// let options = LeaseOptions::default()
    ///     .lease(Duration::from_secs(10))
    ///     .label("10.0.0.7")
    ///     .one_per_label(true);
    /// let jobs = redsem.lease_semaphore_with("migrate", 3, options)?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name, a capacity of 0, or a lease or waiter lease
    /// too short to renew (under 30 ms).
    pub fn lease_semaphore_with(
        &self,
        name: &str,
        capacity: u32,
        options: LeaseOptions,
    ) -> Result<LeaseSemaphore> {
        LeaseSemaphore::new(self.clone(), name, capacity, options, "lease")
    }

    /// A distributed mutex: a lease semaphore of capacity 1 named `name`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
    /// let lock = redsem.mutex("ledger")?;
    /// let guard = lock.lock().await?;
    /// // ... write with guard.token() as the fencing token ...
    /// guard.unlock().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name.
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        self.mutex_with(name, LeaseOptions::default())
    }

    /// A distributed mutex with `options`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
    /// use std::time::Duration;
    /// let lock = redsem.mutex_with("ledger", redsem::LeaseOptions::default().lease(Duration::from_secs(5)))?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redsem::lease_semaphore_with`].
    pub fn mutex_with(&self, name: &str, options: LeaseOptions) -> Result<Mutex> {
        Ok(Mutex::new(LeaseSemaphore::new(
            self.clone(),
            name,
            1,
            options,
            "mutex",
        )?))
    }

    /// A permit semaphore named `name`, with default options.
    ///
    /// Makes no round trip; a semaphore that was never set has 0 permits available.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
    /// let slots = redsem.permit_semaphore("gpu")?;
    /// slots.try_set_permits(4).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name.
    pub fn permit_semaphore(&self, name: &str) -> Result<PermitSemaphore> {
        self.permit_semaphore_with(name, PermitOptions::default())
    }

    /// A permit semaphore named `name`, with `options`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
    /// use std::time::Duration;
    /// let options = redsem::PermitOptions::default().waiter_lease(Duration::from_secs(3));
    /// let slots = redsem.permit_semaphore_with("gpu", options)?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name, or a waiter lease shorter than
    /// [`MIN_LEASE`](crate::MIN_LEASE) or longer than [`MAX_LEASE`](crate::MAX_LEASE).
    pub fn permit_semaphore_with(
        &self,
        name: &str,
        options: PermitOptions,
    ) -> Result<PermitSemaphore> {
        PermitSemaphore::new(self, name, options)
    }

    /// A countdown latch named `name`, with default options.
    ///
    /// Makes no round trip.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
    /// let latch = redsem.count_down_latch("migration-done")?;
    /// latch.wait().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name.
    pub fn count_down_latch(&self, name: &str) -> Result<CountDownLatch> {
        self.count_down_latch_with(name, LatchOptions::default())
    }

    /// A countdown latch named `name`, with `options`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
    /// use std::time::Duration;
    /// let options = redsem::LatchOptions::default().recheck(Duration::from_millis(200));
    /// let latch = redsem.count_down_latch_with("migration-done", options)?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for an empty name or a re-check interval under 10 ms.
    pub fn count_down_latch_with(
        &self,
        name: &str,
        options: LatchOptions,
    ) -> Result<CountDownLatch> {
        CountDownLatch::new(self, name, options)
    }
}
