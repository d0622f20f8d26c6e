//! Small value types shared by the primitives, and by the layers under them (the replica
//! acknowledgements the scripts wait for).

use std::fmt;
use std::time::Duration;

use crate::error::{Result, invalid};

/// The shortest lease (and waiter lease) accepted: renewing every third of it must be possible.
pub const MIN_LEASE: Duration = Duration::from_millis(30);
/// The longest lease (and waiter lease) accepted.
pub const MAX_LEASE: Duration = Duration::from_secs(365 * 24 * 3600);

/// The most units one request may take at once
/// ([`LeaseSemaphore::acquire_many`](crate::LeaseSemaphore::acquire_many)): a grant costs Redis
/// a few commands per unit, so this bounds the time one script can take (`MAX_UNITS` in
/// `lua/lease/layout.lua`).
pub const MAX_UNITS: u32 = 4096;

/// Check that `d`, the `what` of some options, is within [`MIN_LEASE`]..=[`MAX_LEASE`].
pub(crate) fn check_lease(what: &str, d: Duration) -> Result<()> {
    if d < MIN_LEASE {
        return Err(invalid(format!(
            "{what} {d:?} is too short to renew; the minimum is {MIN_LEASE:?}"
        )));
    }
    if d > MAX_LEASE {
        return Err(invalid(format!(
            "{what} {d:?} is longer than the maximum {MAX_LEASE:?}"
        )));
    }
    Ok(())
}

/// A fencing token: a number that strictly increases with every grant of one semaphore,
/// over its whole life (also after it went idle and its other keys expired).
///
/// Pass it to the resource you protect and have the resource reject any token lower than
/// the highest it has seen: a holder that lost its lease (a long pause, a partition) then
/// cannot overwrite the work of the holder that came after it.
///
/// Tokens are exact up to 2<sup>53</sup> (Redis scripts count in doubles).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct FencingToken(pub u64);

impl FencingToken {
    /// The token as a number.
    pub fn get(self) -> u64 {
        self.0
    }
}

impl fmt::Display for FencingToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

/// The id of a permit or of a queued request: 128 random bits as 32 lowercase hex digits.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PermitId(String);

impl PermitId {
    /// A fresh random id.
    pub(crate) fn random() -> Self {
        PermitId(format!("{:032x}", rand::random::<u128>()))
    }

    /// Wrap an id that came from elsewhere (a CLI argument, a status listing).
    pub fn new(id: impl Into<String>) -> Self {
        PermitId(id.into())
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PermitId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// How many replicas must acknowledge each change, and how long to wait for them: see
/// [`RedsemOptions::replica_acks`](crate::RedsemOptions::replica_acks).
///
/// # Examples
///
/// ```
/// use std::time::Duration;
/// use redsem::RedsemOptions;
/// let options = RedsemOptions::default().replica_acks(1, Duration::from_millis(100));
/// let acks = options.replica_acks.expect("set");
/// assert_eq!((acks.replicas, acks.timeout), (1, Duration::from_millis(100)));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReplicaAcks {
    /// Replicas that must hold a change before it counts (at least 1).
    pub replicas: usize,
    /// How long the primary waits for them (`WAIT`'s timeout; at least 1 ms).
    pub timeout: Duration,
}

/// The largest weight a [`Tenant`] may have.
pub const MAX_WEIGHT: u32 = 1_000_000;
/// The longest tenant name, in bytes.
pub const MAX_TENANT_LEN: usize = 256;

/// Who a lease request is for, when tenants share one semaphore in fair shares.
///
/// When units are free and several tenants wait, the next grant goes to the waiting tenant
/// with the lowest units held / weight (ties: the one whose first request came first); first
/// in, first out within a tenant; the tenant whose turn it is is never overtaken; a tenant at
/// its cap is skipped. A request that names no tenant is the default tenant's (weight 1, no
/// cap). A tenant's weight and cap are those its first request names while it neither holds
/// nor waits; a request naming others meanwhile fails with
/// [`Error::TenantConflict`](crate::Error::TenantConflict).
///
/// # Examples
///
/// ```
/// let tenant = redsem::Tenant::new("acme").weight(3).cap(4);
/// assert_eq!((tenant.name(), tenant.weight_of(), tenant.cap_of()), ("acme", 3, Some(4)));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Tenant {
    name: String,
    weight: u32,
    cap: Option<u32>,
}

impl Tenant {
    /// A tenant of weight 1 and no cap.
    pub fn new(name: impl Into<String>) -> Self {
        Tenant {
            name: name.into(),
            weight: 1,
            cap: None,
        }
    }

    /// Set its weight (1 to [`MAX_WEIGHT`]): its share is proportional to it.
    #[must_use]
    pub fn weight(mut self, weight: u32) -> Self {
        self.weight = weight;
        self
    }

    /// Set its cap: the most units it may hold at once (at least 1).
    #[must_use]
    pub fn cap(mut self, cap: u32) -> Self {
        self.cap = Some(cap);
        self
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Its weight.
    pub fn weight_of(&self) -> u32 {
        self.weight
    }

    /// Its cap, if it has one.
    pub fn cap_of(&self) -> Option<u32> {
        self.cap
    }

    /// Checked before a request is sent: a name of 1 to [`MAX_TENANT_LEN`] bytes without NUL,
    /// a weight of 1 to [`MAX_WEIGHT`], a cap of at least 1.
    pub(crate) fn validate(&self) -> Result<()> {
        if self.name.is_empty() || self.name.len() > MAX_TENANT_LEN || self.name.contains('\0') {
            return Err(invalid(format!(
                "a tenant name is 1 to {MAX_TENANT_LEN} bytes without NUL, got {:?}",
                self.name
            )));
        }
        if self.weight == 0 || self.weight > MAX_WEIGHT {
            return Err(invalid(format!(
                "the weight of tenant {:?} must be 1..={MAX_WEIGHT}, got {}",
                self.name, self.weight
            )));
        }
        if self.cap == Some(0) {
            return Err(invalid(format!(
                "the cap of tenant {:?} must be at least 1",
                self.name
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn random_ids_are_32_hex_digits_and_differ() {
        let a = PermitId::random();
        let b = PermitId::random();
        assert_eq!(a.as_str().len(), 32);
        assert!(a.as_str().chars().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }
}
