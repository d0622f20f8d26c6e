//! Distributed synchronization primitives on Redis, for services and jobs that run on many
//! machines and must not overrun a shared resource.
//!
//! * [`LeaseSemaphore`]: a fair counting semaphore whose permits are leases, renewed in the
//!   background, each with a [`FencingToken`] and a slot number. Waiters are served strictly
//!   first-in-first-out; a crashed holder's permit comes back within one lease.
//! * [`Mutex`]: a lease semaphore of capacity 1.
//! * [`PermitSemaphore`]: Redisson-style counted permits (no owners, no leases), with the same
//!   FIFO waiting and retry-safe releases.
//! * [`CountDownLatch`]: a count that, at zero, opens every waiter in every process.
//!
//! Everything goes through a [`Redsem`] handle: one multiplexed command connection and one
//! pub/sub connection per process, whatever the number of primitives, permits and waiters.
//!
//! # Guarantees
//!
//! * At no instant of Redis time are more than `capacity` units held.
//! * Fencing tokens strictly increase in grant order over the life of a semaphore; the slots of
//!   live holders are distinct and below the capacity.
//! * Time comes from the Redis server (`TIME` inside scripts), never from client clocks.
//! * A permit reports itself lost ([`LeasePermit::lost`]) no later than its lease could have
//!   ended, even if the process was paused or cut off.
//! * Every operation is one Lua script: one round trip, atomic, no outer lock. (Or, where the
//!   server loaded redsem's module, one command of it, with the same effect: see [`Engine`].)
//!
//! # Examples
//!
//! The library runs on tokio; a program's own `main` needs its `macros` and
//! `rt-multi-thread` features (`cargo add tokio --features macros,rt-multi-thread`).
//!
//! ```no_run
//! # async fn example() -> redsem::Result<()> {
//! let redsem = redsem::Redsem::connect("redis://127.0.0.1:6379").await?;
//! let sem = redsem.lease_semaphore("nightly-export", 2)?;
//! let permit = sem.acquire().await?;
//! println!("running in slot {} with token {}", permit.slot(), permit.token());
//! permit.release().await?;
//! # Ok(())
//! # }
//! ```
//!
//! Keys start with the prefix `redsem` unless [`RedsemOptions::prefix`] says otherwise (one
//! per application sharing a Redis). [`LeaseSemaphore::try_acquire`] reports a busy semaphore
//! as `Err(`[`Error::NoPermit`]`)`, which [`Error::is_not_acquired`] tells from a failure;
//! [`LeasePermit::is_lost`] says, without a round trip, whether a held permit was lost.
//!
//! ```no_run
//! # async fn example() -> redsem::Result<()> {
//! use redsem::{Redsem, RedsemOptions};
//!
//! let options = RedsemOptions::default().prefix("billing");
//! let redsem = Redsem::connect_with("redis://127.0.0.1:6379", options).await?;
//! match redsem.lease_semaphore("nightly-export", 2)?.try_acquire().await {
//!     Ok(permit) => {
//!         assert!(!permit.is_lost());
//!         permit.release().await?;
//!     }
//!     Err(err) if err.is_not_acquired() => println!("busy: try later"),
//!     Err(err) => return Err(err),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! # Observing it
//!
//! Every primitive reports metrics through the [`metrics`](https://docs.rs/metrics) facade
//! (acquire latency, time queued, hold time, grants, timeouts, cancellations, renewals, lost
//! leases, pub/sub reconnects, script reloads; labelled by primitive and name, bounded with
//! [`MetricNames`]) and runs each operation in a `tracing` span. With no recorder and no
//! subscriber installed, both cost nothing measurable. [`describe_metrics`] lists them.
//!
//! # Features
//!
//! | feature | default | what it gives |
//! |---|---|---|
//! | `tls` | on | `rediss://` URLs through rustls (ring; no system OpenSSL), [`RedsemOptions::tls_root_cert`] |
//! | `cluster` | on | `Redsem::connect_cluster`: Redis Cluster through redis-rs's async cluster client |
//! | `sentinel` | on | `Redsem::connect_sentinel` and `redis+sentinel://` URLs: the primary behind Redis Sentinel, followed across failovers |
//! | `blocking` | off | `redsem::blocking`: the same primitives for code without an async runtime |
//! | `serde` | off | `serde::Serialize` for [`StatusReport`] and its parts ([`Status`], [`Holder`], [`Waiter`], [`PermitsStatus`], [`LatchState`]) |
//! | `tower` | off | `redsem::tower`: a tower layer holding a lease permit per request, for fleet-wide concurrency limits (axum, tonic) |
//!
//! `default-features = false` leaves a library for one plain-text server with fewer
//! dependencies.
//!
//! # Cancel safety
//!
//! Dropping an acquire future (or timing it out) withdraws the request; a unit granted to it
//! in the meantime is released. Each async method documents its own case.
//!
//! # When not to use this
//!
//! Redis replication is asynchronous: after a failover, a promoted replica may not know the
//! latest grants. Use the fencing token on the protected resource when that matters.
#![forbid(unsafe_code)]
// docs.rs (`--cfg docsrs`, nightly): mark each item with the feature it needs.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]
#![cfg_attr(
    not(test),
    deny(
        clippy::panic,
        clippy::print_stdout,
        clippy::unwrap_used,
        clippy::expect_used
    )
)]

mod batch;
#[cfg(feature = "blocking")]
#[cfg_attr(docsrs, doc(cfg(feature = "blocking")))]
pub mod blocking;
mod client;
mod clock;
mod conn;
mod engine;
mod error;
mod factory;
mod keepalive;
mod keys;
mod latch;
#[cfg(test)]
mod layers;
mod lease;
mod mutex;
mod notify;
mod observe;
mod permits;
mod report;
mod retry;
mod script;
mod session;
#[cfg(feature = "tower")]
#[cfg_attr(docsrs, doc(cfg(feature = "tower")))]
pub mod tower;
mod types;
mod url;
mod wait;

pub use client::{Redsem, RedsemOptions, ReplicaAcks, ServerChecks, ServerFinding, Verdict};
pub use engine::{Engine, ServingEngine};
pub use error::{Error, Result};
pub use latch::{CountDownLatch, LATCH_DONE_TTL, LatchOptions, LatchState};
pub use lease::{
    Holder, LeaseOptions, LeasePermit, LeaseSemaphore, MAX_LEASE, MAX_UNITS, MIN_LEASE, Status,
    TenantStatus, Waiter,
};
pub use mutex::{Mutex, MutexGuard};
pub use observe::{HIDDEN_NAME, MAX_TENANT_LABELS, MetricNames, OTHER_TENANTS, describe_metrics};
pub use permits::{MAX_PERMITS, PermitOptions, PermitSemaphore};
pub use redis;
pub use report::{PermitsStatus, StatusReport};
#[cfg(feature = "lua-dir")]
#[doc(hidden)]
pub use script::library_source_with;
#[doc(hidden)]
pub use script::{protocol_library, protocol_operations};
pub use types::{FencingToken, MAX_TENANT_LEN, MAX_WEIGHT, PermitId, Tenant};
pub use url::{ConnectTarget, TargetHosts};

/// The version of this crate, as in its `Cargo.toml` (`"0.1.0"`).
///
/// # Examples
///
/// ```
/// assert!(redsem::VERSION.starts_with("0."));
/// ```
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
