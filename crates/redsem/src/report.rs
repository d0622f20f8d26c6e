//! [`StatusReport`]: everything stored under one name, as `redsem status NAME --json`,
//! `redsem serve`'s `/status.json` and the Python binding's `status()` show it.

use crate::client::Redsem;
use crate::error::Result;
use crate::latch::LatchState;
use crate::lease::Status;

/// Everything stored under one name: the lease semaphore's [`Status`], the counted permits
/// free and the latch's state (each primitive keeps its own keys, so one name can have all
/// three). Read with [`Redsem::status_report`].
///
/// It is the one report of the project's tools: `redsem status NAME --json` and each entry of
/// `redsem serve`'s `/status.json` (which add `"server"`, the URL read) and the Python
/// binding's `status()` are this type as its `serde` feature writes it:
/// `{"name":"exports","capacity":2,"in_use":1,"holders":[…],"waiters":[…],
/// "permits":{"available":0},"latch":{"state":"never-set","count":0}}` (the [`Status`]'s
/// fields inline, as [`Status`] writes them; the latch as [`LatchState`] writes it).
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct StatusReport {
    /// The name read.
    pub name: String,
    /// The lease semaphore of that name.
    #[cfg_attr(feature = "serde", serde(flatten))]
    pub lease: Status,
    /// The counted permits ([`PermitSemaphore`](crate::PermitSemaphore)) of that name.
    pub permits: PermitsStatus,
    /// The countdown latch of that name.
    pub latch: LatchState,
}

/// The counted permits of a [`StatusReport`]. With the `serde` feature:
/// `{"available":3}`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct PermitsStatus {
    /// Permits free, as [`PermitSemaphore::available_permits`](crate::PermitSemaphore::available_permits)
    /// reads it: may be negative, and 0 both when never set and when all are taken.
    pub available: i64,
}

impl Redsem {
    /// Read everything stored under `name`: the lease semaphore's status, the counted permits
    /// free and the latch's state (three reads, at once). Nothing is created or changed.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
    /// let report = redsem.status_report("exports").await?;
    /// println!(
    ///     "{} of {:?} in use, {} permits free, latch {:?}",
    ///     report.lease.in_use, report.lease.capacity, report.permits.available, report.latch
    /// );
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a name the primitives
    /// refuse;
    /// [`Error::Unavailable`](crate::Error::Unavailable) if Redis cannot be reached; the
    /// errors of [`LeaseSemaphore::status`](crate::LeaseSemaphore::status),
    /// [`PermitSemaphore::available_permits`](crate::PermitSemaphore::available_permits) and
    /// [`CountDownLatch::state`](crate::CountDownLatch::state).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn status_report(&self, name: &str) -> Result<StatusReport> {
        // The capacity only matters when acquiring: status reads the one stored.
        let sem = self.lease_semaphore(name, 1)?;
        let permits = self.permit_semaphore(name)?;
        let latch = self.count_down_latch(name)?;
        let (lease, available, latch) =
            tokio::join!(sem.status(), permits.available_permits(), latch.state());
        Ok(StatusReport {
            name: name.to_owned(),
            lease: lease?,
            permits: PermitsStatus {
                available: available?,
            },
            latch: latch?,
        })
    }
}
