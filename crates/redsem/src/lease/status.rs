//! What `LeaseSemaphore::status` reports. With the `serde` feature the types implement
//! `Serialize`: ids and tokens as they print, durations as whole milliseconds (`*_ms`).

use std::time::Duration;

use crate::script::RawStatus;
use crate::types::{FencingToken, PermitId};

/// A snapshot of a lease semaphore.
///
/// With the `serde` feature it serializes as
/// `{"capacity":2,"in_use":1,"holders":[{"id":"9f2c…","label":"web-1","token":17,"slots":[0],
/// "expires_in_ms":24100,"held_for_ms":5900}],"waiters":[{"id":"51ab…","label":null,"units":1,
/// "waiting_for_ms":2300}]}`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Status {
    /// The capacity in force, if one is stored (none for a semaphore never used or long idle).
    pub capacity: Option<u32>,
    /// Units held by live permits.
    pub in_use: u64,
    /// Live permits, in grant order.
    pub holders: Vec<Holder>,
    /// Queued requests, in arrival order.
    pub waiters: Vec<Waiter>,
    /// Each tenant that holds or waits, by name, while a named tenant does (empty otherwise:
    /// the plain FIFO); the default tenant, if it holds or waits, as `""`. (Left out of the
    /// `serde` form when empty.)
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Vec::is_empty"))]
    pub tenants: Vec<TenantStatus>,
}

/// A tenant as [`Status`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct TenantStatus {
    /// The tenant's name (`""`: the default tenant).
    pub name: String,
    /// Units its permits hold.
    pub held: u64,
    /// Its queued requests.
    pub waiters: u64,
    /// Its weight in force.
    pub weight: u32,
    /// Its cap in force, if any.
    pub cap: Option<u32>,
}

/// A live permit as [`Status`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Holder {
    /// The permit id.
    #[cfg_attr(feature = "serde", serde(serialize_with = "ser::id"))]
    pub id: PermitId,
    /// Its holder label.
    pub label: Option<String>,
    /// Its fencing token.
    #[cfg_attr(feature = "serde", serde(serialize_with = "ser::token"))]
    pub token: FencingToken,
    /// Its slots, one per unit.
    pub slots: Vec<u32>,
    /// Time left on its lease, by the Redis clock.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "expires_in_ms", serialize_with = "ser::millis")
    )]
    pub expires_in: Duration,
    /// Time since it was granted.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "held_for_ms", serialize_with = "ser::millis")
    )]
    pub held_for: Duration,
    /// Its tenant (none: the default tenant; then left out of the `serde` form).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub tenant: Option<String>,
}

/// A queued request as [`Status`] lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize))]
#[non_exhaustive]
pub struct Waiter {
    /// The request id (the permit id it will have).
    #[cfg_attr(feature = "serde", serde(serialize_with = "ser::id"))]
    pub id: PermitId,
    /// Its holder label.
    pub label: Option<String>,
    /// Units requested.
    pub units: u32,
    /// Time since it was queued.
    #[cfg_attr(
        feature = "serde",
        serde(rename = "waiting_for_ms", serialize_with = "ser::millis")
    )]
    pub waiting_for: Duration,
    /// Its tenant (none: the default tenant; then left out of the `serde` form).
    #[cfg_attr(feature = "serde", serde(skip_serializing_if = "Option::is_none"))]
    pub tenant: Option<String>,
}

impl Status {
    /// How long the longest-waiting request has been queued (zero with no queue).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
    /// let status = sem.status().await?;
    /// println!("oldest wait {:?}", status.oldest_wait());
    /// # Ok(())
    /// # }
    /// ```
    pub fn oldest_wait(&self) -> Duration {
        self.waiters
            .iter()
            .map(|w| w.waiting_for)
            .max()
            .unwrap_or_default()
    }

    /// When the first holder's lease ends unless renewed (none without holders).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
    /// if let Some(next) = sem.status().await?.next_lease_end() {
    ///     println!("a lease ends in {next:?} unless renewed");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    pub fn next_lease_end(&self) -> Option<Duration> {
        self.holders.iter().map(|h| h.expires_in).min()
    }
}

/// How the `serde` feature writes ids, tokens and durations.
#[cfg(feature = "serde")]
mod ser {
    use std::time::Duration;

    use serde::Serializer;

    use crate::types::{FencingToken, PermitId};

    pub(super) fn id<S: Serializer>(id: &PermitId, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(id.as_str())
    }

    pub(super) fn token<S: Serializer>(token: &FencingToken, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(token.get())
    }

    pub(super) fn millis<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
    }
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
                    tenant: label(h.tenant),
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
                    tenant: label(w.tenant),
                })
                .collect(),
            tenants: raw
                .tenants
                .into_iter()
                .map(|t| TenantStatus {
                    name: t.name,
                    held: t.held,
                    waiters: t.waiters,
                    weight: t.weight,
                    cap: t.cap,
                })
                .collect(),
        }
    }
}
