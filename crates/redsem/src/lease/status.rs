//! What `LeaseSemaphore::status` reports.

use std::time::Duration;

use crate::script::RawStatus;
use crate::types::{FencingToken, PermitId};

/// A snapshot of a lease semaphore.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Status {
    /// The capacity in force, if one is stored (none for a semaphore never used or long idle).
    pub capacity: Option<u32>,
    /// Units held by live permits.
    pub in_use: u64,
    /// Live permits, in grant order.
    pub holders: Vec<Holder>,
    /// Queued requests, in queue order.
    pub waiters: Vec<Waiter>,
}

/// A live permit as [`Status`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Holder {
    /// The permit id.
    pub id: PermitId,
    /// Its holder label.
    pub label: Option<String>,
    /// Its fencing token.
    pub token: FencingToken,
    /// Its slots, one per unit.
    pub slots: Vec<u32>,
    /// Time left on its lease, by the Redis clock.
    pub expires_in: Duration,
    /// Time since it was granted.
    pub held_for: Duration,
}

/// A queued request as [`Status`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Waiter {
    /// The request id (the permit id it will have).
    pub id: PermitId,
    /// Its holder label.
    pub label: Option<String>,
    /// Units requested.
    pub units: u32,
    /// Time since it was queued.
    pub waiting_for: Duration,
}

fn ms(n: i64) -> Duration {
    Duration::from_millis(u64::try_from(n).unwrap_or(0))
}

fn label(l: String) -> Option<String> {
    (!l.is_empty()).then_some(l)
}

impl Status {
    pub(crate) fn from_raw(raw: RawStatus) -> Status {
        Status {
            capacity: raw.capacity,
            in_use: raw.in_use,
            holders: raw
                .holders
                .into_iter()
                .map(|h| Holder {
                    id: PermitId::new(h.id),
                    label: label(h.label),
                    token: FencingToken(h.token),
                    slots: h.slots,
                    expires_in: ms(h.left_ms),
                    held_for: ms(h.held_ms),
                })
                .collect(),
            waiters: raw
                .waiters
                .into_iter()
                .map(|w| Waiter {
                    id: PermitId::new(w.id),
                    label: label(w.label),
                    units: w.units,
                    waiting_for: ms(w.waited_ms),
                })
                .collect(),
        }
    }
}
