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
