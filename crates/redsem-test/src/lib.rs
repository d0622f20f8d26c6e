//! Throwaway Redis servers and clusters for redsem's tests.
//!
//! Every test starts its own [`RedisServer`] (or [`RedisCluster`]) on a free port in a fresh
//! temporary directory, and the server dies with it: [`Drop`] kills and reaps the process and
//! removes the directory. Readiness is detected by polling, never by fixed sleeps, and every
//! panic message carries the tail of the server log.
//!
//! # Fault kit
//!
//! * [`FaultProxy`]: a TCP proxy in front of a server that cuts connections
//!   ([`cut_all`](FaultProxy::cut_all)), loses the reply of a request after running it
//!   ([`drop_reply_after`](FaultProxy::drop_reply_after)), adds latency
//!   ([`set_delay`](FaultProxy::set_delay)) or makes the server look unreachable
//!   ([`set_refusing`](FaultProxy::set_refusing)). Plain std threads: usable from sync tests and
//!   from any tokio runtime flavour.
//! * Failover: [`RedisServer::start_replica_of`], [`RedisServer::wait_replicated_from`],
//!   [`RedisServer::promote`] (whose documentation shows how to make the promoted replica miss
//!   the last writes), [`RedisServer::flushall`].
//! * Eviction: [`RedisServer::start_with_eviction`] and [`RedisServer::fill_until_evicting`]
//!   (with [`RedisServer::evicted_keys`]).
//! * A cluster reached through proxies: [`RedisCluster::start_behind_proxies`], whose nodes
//!   announce their proxies' ports, with [`RedisCluster::proxies`],
//!   [`RedisCluster::proxy_for_key`] and [`RedisCluster::node_for_key`]. redis-rs's cluster
//!   client resends a request whose reply was lost with its connection, so a script can run twice
//!   for one call (`tests/cluster_proxies.rs` shows it).
//! * Managed services: [`profiles`], one ACL user per kind of service (ElastiCache, MemoryDB,
//!   Memorystore, Azure, Upstash, OCI Cache), refused what that service refuses.
//! * Sentinel: [`RedisSentinels`], a primary with two replicas and three sentinels, with a
//!   forced failover ([`RedisSentinels::failover`]) or a killed primary
//!   ([`RedisSentinels::kill_primary`]).
//!
//! The binaries come from `$REDSEM_REDIS_SERVER` and `$REDSEM_REDIS_CLI`, or `redis-server`
//! and `redis-cli` on the `PATH` (`apt-get install -y redis-server` installs both).
//!
//! ```no_run
//! use std::time::Duration;
//! use redsem_test::{RedisServer, within};
//!
//! # async fn example() {
//! let server = RedisServer::start();
//! let client = server.client();
//! let mut con = within(Duration::from_secs(5), "connect", client.get_multiplexed_async_connection())
//!     .await
//!     .expect("connect to the test server");
//! let pong: String = redis::cmd("PING").query_async(&mut con).await.expect("PING");
//! assert_eq!(pong, "PONG");
//! # }
//! ```
#![warn(missing_docs, missing_debug_implementations, unreachable_pub)]

mod capability;
mod cluster;
mod port;
pub mod profiles;
mod proxy;
mod sentinel;
mod server;
mod tls;

use std::future::IntoFuture;
use std::time::{Duration, Instant};

pub use capability::{Capabilities, has_command, has_tls};
pub use cluster::RedisCluster;
pub use proxy::FaultProxy;
pub use sentinel::RedisSentinels;
pub use server::RedisServer;
pub use tls::{TlsRedisCluster, TlsRedisServer};

/// How long the polling loops sleep between two checks.
const POLL_INTERVAL: Duration = Duration::from_millis(5);

/// Await `fut` for at most `limit`; panic with `what` and the limit if it takes longer.
///
/// Wrap every wait in a test with it, so a hang fails the test instead of stalling CI.
///
/// # Panics
///
/// If `fut` has not completed after `limit`.
pub async fn within<F: IntoFuture>(limit: Duration, what: &str, fut: F) -> F::Output {
    match tokio::time::timeout(limit, fut).await {
        Ok(output) => output,
        Err(_) => panic!("timed out: {what} did not complete within {limit:?}"),
    }
}

/// Poll `cond` every few ms until it returns true, panicking with `what` after `limit` (sync, for use outside async code).
///
/// # Panics
///
/// If `cond` has not returned `true` after `limit`.
#[track_caller]
pub fn eventually(limit: Duration, what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out: {what} did not happen within {limit:?}"
        );
        std::thread::sleep(POLL_INTERVAL);
    }
}
