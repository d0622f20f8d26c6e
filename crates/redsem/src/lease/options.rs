//! `LeaseOptions`: the lease, the waiter lease, the label, the keepalive.

use std::time::Duration;

use crate::error::{Result, invalid};
use crate::types::{Tenant, check_lease};

/// Options of a [`LeaseSemaphore`](crate::LeaseSemaphore).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// let options = redsem::LeaseOptions::default()
///     .lease(Duration::from_secs(10))
///     .label("worker-7");
/// assert_eq!(options.lease, Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct LeaseOptions {
    /// How long a permit lives without renewal (default 30 s). The keepalive renews it every
    /// third of this.
    pub lease: Duration,
    /// How long a queued request keeps its place without checking in (default 10 s). A waiter
    /// checks in every third of it; a crashed waiter stops blocking the queue after this, also
    /// when it was granted after it crashed (the grant is given back unclaimed when the waiter
    /// lease of its last check-in ends). A permit handed over with a wake-up starts with no
    /// more than what is left of this, until its first renewal claims the whole lease.
    pub waiter_lease: Duration,
    /// A label recorded with each permit (a host name, an IP, a job id); shown by `status`.
    pub label: Option<String>,
    /// At most one live permit or queued request per label (default off): a second request of
    /// the same label gets [`Error::AlreadyHeld`](crate::Error::AlreadyHeld).
    pub one_per_label: bool,
    /// Renew permits in the background (default on). Without it a permit lives one lease
    /// unless [`LeasePermit::refresh`](crate::LeasePermit::refresh) is called.
    pub keepalive: bool,
    /// The tenant its requests are for (default none: the default tenant, weight 1, no cap).
    /// Tenants share the semaphore in fair shares: see [`Tenant`].
    pub tenant: Option<Tenant>,
}

impl Default for LeaseOptions {
    fn default() -> Self {
        LeaseOptions {
            lease: Duration::from_secs(30),
            waiter_lease: Duration::from_secs(10),
            label: None,
            one_per_label: false,
            keepalive: true,
            tenant: None,
        }
    }
}

impl LeaseOptions {
    /// Set the lease duration.
    #[must_use]
    pub fn lease(mut self, lease: Duration) -> Self {
        self.lease = lease;
        self
    }

    /// Set the waiter lease duration.
    #[must_use]
    pub fn waiter_lease(mut self, waiter_lease: Duration) -> Self {
        self.waiter_lease = waiter_lease;
        self
    }

    /// Set the holder label.
    #[must_use]
    pub fn label(mut self, label: impl Into<String>) -> Self {
        self.label = Some(label.into());
        self
    }

    /// Allow at most one live permit per label.
    #[must_use]
    pub fn one_per_label(mut self, on: bool) -> Self {
        self.one_per_label = on;
        self
    }

    /// Turn the background renewal on or off.
    #[must_use]
    pub fn keepalive(mut self, on: bool) -> Self {
        self.keepalive = on;
        self
    }

    /// Make its requests for `tenant` (see [`Tenant`]); [`LeaseSemaphore::for_tenant`]
    /// gives a handle of another tenant on the same semaphore.
    ///
    /// [`LeaseSemaphore::for_tenant`]: crate::LeaseSemaphore::for_tenant
    #[must_use]
    pub fn tenant(mut self, tenant: Tenant) -> Self {
        self.tenant = Some(tenant);
        self
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if let Some(tenant) = &self.tenant {
            tenant.validate()?;
        }
        check_lease("lease", self.lease)?;
        check_lease("waiter lease", self.waiter_lease)?;
        if self.label.as_deref() == Some("") {
            return Err(invalid(
                "the label must not be empty (use None for no label)",
            ));
        }
        Ok(())
    }
}
