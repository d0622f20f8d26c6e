//! Helpers shared by the integration tests.

use std::time::Duration;

use redsem::{Redsem, RedsemOptions};
pub(crate) use redsem_test::{RedisServer, within};

/// Generous bound for any single wait in a test: a hang fails instead of stalling CI.
pub(crate) const LIMIT: Duration = Duration::from_secs(10);

/// A throwaway server plus a connected client with a per-test prefix.
pub(crate) struct TestContext {
    pub(crate) server: RedisServer,
    pub(crate) redsem: Redsem,
    pub(crate) prefix: String,
}

impl TestContext {
    pub(crate) async fn start() -> TestContext {
        let server = RedisServer::start();
        let prefix = "t".to_owned();
        let redsem = Self::connect_to(&server, &prefix).await;
        TestContext {
            server,
            redsem,
            prefix,
        }
    }

    /// Another, independent client (its own connections) to the same server.
    pub(crate) async fn client(&self) -> Redsem {
        Self::connect_to(&self.server, &self.prefix).await
    }

    async fn connect_to(server: &RedisServer, prefix: &str) -> Redsem {
        within(
            LIMIT,
            "connect",
            Redsem::connect_with(&server.url(), RedsemOptions::default().prefix(prefix)),
        )
        .await
        .expect("connect to the test server")
    }

    /// A raw async connection for inspecting keys.
    pub(crate) async fn raw(&self) -> redis::aio::MultiplexedConnection {
        within(
            LIMIT,
            "raw connect",
            self.server.client().get_multiplexed_async_connection(),
        )
        .await
        .expect("raw connection")
    }

    /// Every key on the server, sorted.
    pub(crate) async fn keys(&self) -> Vec<String> {
        let mut conn = self.raw().await;
        let mut keys: Vec<String> = redis::cmd("KEYS")
            .arg("*")
            .query_async(&mut conn)
            .await
            .expect("KEYS");
        keys.sort();
        keys
    }

    /// `calls` of each `INFO commandstats` entry, e.g. `("evalsha", 3)`.
    pub(crate) async fn command_calls(&self, command: &str) -> u64 {
        let mut conn = self.raw().await;
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .expect("INFO commandstats");
        let needle = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|line| line.strip_prefix(&needle))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    }

    /// The number of connected clients of a given type ("normal" or "pubsub").
    pub(crate) async fn clients_of_type(&self, kind: &str) -> usize {
        let mut conn = self.raw().await;
        let list: String = redis::cmd("CLIENT")
            .arg("LIST")
            .arg("TYPE")
            .arg(kind)
            .query_async(&mut conn)
            .await
            .expect("CLIENT LIST");
        list.lines().filter(|l| !l.trim().is_empty()).count()
    }
}

/// Short leases keep the tests fast; waits are bounded by [`LIMIT`].
pub(crate) fn short(lease_ms: u64) -> redsem::LeaseOptions {
    redsem::LeaseOptions::default()
        .lease(Duration::from_millis(lease_ms))
        .waiter_lease(Duration::from_millis(lease_ms))
}

impl TestContext {
    /// Subscribers of `channel` on the server (`PUBSUB NUMSUB`).
    pub(crate) async fn subscribers(&self, channel: &str) -> u64 {
        let mut conn = self.raw().await;
        let reply: (String, u64) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(channel)
            .query_async(&mut conn)
            .await
            .expect("PUBSUB NUMSUB");
        reply.1
    }

    /// `CLIENT KILL TYPE <kind> SKIPME yes`: drops every connection of that type ("normal",
    /// "pubsub") except the one sending the command. Returns how many were killed.
    pub(crate) async fn kill_clients(&self, kind: &str) -> u64 {
        let mut conn = self.raw().await;
        redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg(kind)
            .arg("SKIPME")
            .arg("yes")
            .query_async(&mut conn)
            .await
            .expect("CLIENT KILL")
    }

    /// Zero the `INFO commandstats` counters (`CONFIG RESETSTAT`).
    pub(crate) async fn reset_stats(&self) {
        let mut conn = self.raw().await;
        let () = redis::cmd("CONFIG")
            .arg("RESETSTAT")
            .query_async(&mut conn)
            .await
            .expect("CONFIG RESETSTAT");
    }
}

/// Poll `cond` every few ms until it is true; panics naming `what` after [`LIMIT`].
pub(crate) async fn until<F, Fut>(what: &str, mut cond: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    within(LIMIT, what, async {
        while !cond().await {
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
    })
    .await
}

/// The median of some durations.
pub(crate) fn median(mut samples: Vec<Duration>) -> Duration {
    samples.sort();
    samples[samples.len() / 2]
}
