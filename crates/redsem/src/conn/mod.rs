//! The command connection: one Redis server or a Redis Cluster. Nothing outside this
//! module knows which.
//!
//! Here: [`Conn`] and [`Single`] (a reconnecting manager that follows a moving primary).
//! Beside it: `sentinel.rs` (where the primary is: [`Source`], [`Sentinels`]), `cluster.rs`
//! (reading `CLUSTER NODES`, hash slots, a client per node) and `probe.rs` (the connect-time
//! check of one node: eviction policy and ACL rights).

mod cluster;
mod probe;
mod sentinel;

use std::sync::{Arc, Mutex};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, Pipeline, RedisFuture, ServerErrorKind, Value};

#[cfg(any(feature = "cluster", feature = "sentinel"))]
pub(crate) use cluster::node_client;
#[cfg(feature = "cluster")]
pub(crate) use cluster::{Primary, has_sharded_pubsub, primaries, slot_of};
pub(crate) use probe::{Findings, Probe, check_node};
#[cfg(feature = "sentinel")]
pub(crate) use sentinel::Sentinels;
pub(crate) use sentinel::{Source, primary_moved};

use crate::error::Result;

/// Every command goes through this: multiplexed, reconnecting, cheap to clone.
#[derive(Clone)]
pub(crate) enum Conn {
    /// One server (or a primary behind a proxy), through a reconnecting manager.
    Single(Single),
    /// A cluster: each script goes to the node owning its keys' slot.
    #[cfg(feature = "cluster")]
    /// (And what it remembers about its primaries; see `script::Scripting`.)
    Cluster(ClusterConnection, Arc<Flags>),
}

/// What a connection remembers about its server (or a cluster's primaries), for every call
/// (see `script::Scripting`).
#[derive(Debug, Default)]
pub(crate) struct Flags {
    /// The server refused functions: scripts go by EVALSHA.
    pub(crate) functions_refused: std::sync::atomic::AtomicBool,
    /// Whether calls go to redsem's module, and why (not).
    pub(crate) engine: crate::engine::EngineState,
}

/// `host:port` of the server `client` connects to.
fn addr_of(client: &redis::Client) -> String {
    client.get_connection_info().addr().to_string()
}

/// A [`ConnectionManager`] that is replaced when a reconnection fails for good, or when the
/// primary moved.
///
/// The manager reconnects by itself after I/O errors, but a reconnection refused with an
/// error of another kind (an `AUTH` refused while a password was being rotated) stays its
/// answer to every later command. Here such a failure starts a fresh manager (lazily: it
/// connects on the next command), so the client recovers as soon as the server accepts it
/// again.
///
/// Behind Sentinels the manager would reconnect to the old primary forever. Every command
/// first checks (one read of a counter) whether the Sentinels named a new primary since its
/// manager was made, and starts a new manager for it if so. They are asked when one of them
/// announces a new primary (`+switch-master`), each second (see [`Sentinels::locate`]) and
/// after an error that says the primary may have moved (I/O, a
/// refused connection, a timeout, `READONLY` from a demoted primary, `NOREPLICAS` from one
/// its replicas left); such a command is sent once more when the primary did move.
#[derive(Clone)]
pub(crate) struct Single {
    inner: Arc<SingleInner>,
}

struct SingleInner {
    source: Source,
    config: ConnectionManagerConfig,
    current: Mutex<Current>,
    /// What the connection remembers about the server (see `script::Scripting`).
    flags: Flags,
}

/// The manager in use.
struct Current {
    /// How many times it was replaced.
    generation: u64,
    manager: ConnectionManager,
    /// The primary's moves (see [`Source::client`]) it was made after.
    moves: u64,
}

impl Single {
    pub(crate) async fn new(source: Source, config: ConnectionManagerConfig) -> Result<Single> {
        let (client, moves) = source.client();
        let manager = ConnectionManager::new_with_config(client, config.clone()).await?;
        Ok(Single {
            inner: Arc::new(SingleInner {
                source,
                config,
                current: Mutex::new(Current {
                    generation: 0,
                    manager,
                    moves,
                }),
                flags: Flags::default(),
            }),
        })
    }

    /// `host:port` of the primary as last located (behind Sentinels, where it is now).
    pub(crate) fn primary(&self) -> String {
        addr_of(&self.inner.source.client().0)
    }

    /// Where the primary is found (for the pub/sub connection).
    pub(crate) fn source(&self) -> &Source {
        &self.inner.source
    }

    /// The manager to use and its generation: a new one if the primary moved.
    fn current(&self) -> (u64, ConnectionManager) {
        let moves = self.inner.source.moves();
        let mut current = self.inner.current.lock().unwrap_or_else(|p| p.into_inner());
        if current.moves != moves {
            let (client, moves) = self.inner.source.client();
            if let Ok(fresh) =
                ConnectionManager::new_lazy_with_config(client.clone(), self.inner.config.clone())
            {
                tracing::info!(primary = %addr_of(&client), "connecting to the new primary");
                *current = Current {
                    generation: current.generation + 1,
                    manager: fresh,
                    moves,
                };
            }
        }
        (current.generation, current.manager.clone())
    }

    /// After a failure of the manager of `generation`: replace it if the server refused to
    /// authenticate a reconnection (it never recovers from that by itself); ask where the
    /// primary is if it may have moved (the next [`current`](Self::current) moves with it).
    async fn after_failure(&self, generation: u64, failure: Failure, what: String) {
        match failure {
            Failure::Other => {}
            Failure::MayHaveMoved => {
                if let Err(err) = self.inner.source.locate().await {
                    tracing::debug!(error = %err, "could not ask the Sentinels where the primary is");
                }
            }
            Failure::Auth => {
                let (client, moves) = self.inner.source.client();
                let Ok(fresh) =
                    ConnectionManager::new_lazy_with_config(client, self.inner.config.clone())
                else {
                    return;
                };
                let mut current = self.inner.current.lock().unwrap_or_else(|p| p.into_inner());
                if current.generation == generation {
                    tracing::warn!(error = %what, "redis refused to authenticate a reconnection; starting over");
                    *current = Current {
                        generation: generation + 1,
                        manager: fresh,
                        moves,
                    };
                }
            }
        }
    }

    /// What a reply or error of the manager says about it.
    fn classify<T>(&self, result: &redis::RedisResult<T>, readonly: fn(&T) -> bool) -> Failure {
        let following = match &self.inner.source {
            Source::Fixed(_) => false,
            #[cfg(feature = "sentinel")]
            Source::Sentinel(_) => true,
        };
        match result {
            Err(err) if err.kind() == ErrorKind::AuthenticationFailed => Failure::Auth,
            Err(err)
                if following
                    && (err.is_io_error()
                        || err.is_connection_dropped()
                        || err.is_connection_refusal()
                        || err.is_timeout()
                        || err.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
                        || err.code() == Some(NO_REPLICAS)) =>
            {
                Failure::MayHaveMoved
            }
            // A demoted primary refuses a script that writes before running it.
            Ok(reply) if following && readonly(reply) => Failure::MayHaveMoved,
            _ => Failure::Other,
        }
    }

    /// Send through the current manager; if that fails because the primary moved and the
    /// manager was replaced meanwhile (by this call or another), send once more through the
    /// new one. Resending is safe: every script applies a resent request once (see the
    /// README's guarantees), a command refused with `READONLY` or `NOREPLICAS` did not run,
    /// and one that reached the old primary otherwise is lost with it.
    async fn send<T, Fut>(
        &self,
        send: impl Fn(ConnectionManager) -> Fut,
        readonly: fn(&T) -> bool,
    ) -> redis::RedisResult<T>
    where
        Fut: Future<Output = redis::RedisResult<T>>,
    {
        let (generation, manager) = self.current();
        let result = send(manager).await;
        let failure = self.classify(&result, readonly);
        if failure == Failure::Other {
            return result;
        }
        self.after_failure(generation, failure, describe(&result))
            .await;
        let (now, manager) = self.current();
        if now == generation || failure != Failure::MayHaveMoved {
            return result;
        }
        let result = send(manager).await;
        let failure = self.classify(&result, readonly);
        if failure != Failure::Other {
            self.after_failure(now, failure, describe(&result)).await;
        }
        result
    }
}

/// How a command failed, for [`Single`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// A reconnection was refused authentication: start a new manager.
    Auth,
    /// The primary may have moved (behind Sentinels): ask where it is.
    MayHaveMoved,
    /// Anything else: the manager copes, or the caller is told.
    Other,
}

/// A failed result, for the log: its error, or the `READONLY` reply it carries.
fn describe<T>(result: &redis::RedisResult<T>) -> String {
    match result {
        Err(err) => err.to_string(),
        Ok(_) => "READONLY or NOREPLICAS: the primary may have moved".to_owned(),
    }
}

/// The refusal of a primary with `min-replicas-to-write` that fewer replicas follow: after a
/// failover, the old primary once its replicas left it.
const NO_REPLICAS: &str = "NOREPLICAS";

/// Whether `reply` is a refusal that says the primary may have moved: `READONLY` (a demoted
/// primary) or `NOREPLICAS` (one its replicas left). Neither ran the command.
fn is_readonly(reply: &Value) -> bool {
    matches!(reply, Value::ServerError(err)
        if err.kind() == Some(ServerErrorKind::ReadOnly) || err.code() == NO_REPLICAS)
}

/// Whether a reply of a pipeline is a `READONLY` refusal.
fn any_readonly(replies: &[Value]) -> bool {
    replies.iter().any(is_readonly)
}

impl ConnectionLike for Single {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(self.send(
            move |mut manager| async move { manager.req_packed_command(cmd).await },
            is_readonly,
        ))
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(
            self.send(
                move |mut manager| async move {
                    manager.req_packed_commands(pipeline, offset, count).await
                },
                |replies: &Vec<Value>| any_readonly(replies),
            ),
        )
    }

    fn get_db(&self) -> i64 {
        self.current().1.get_db()
    }
}

impl Conn {
    /// What the connection remembers about its server.
    fn flags(&self) -> &Flags {
        match self {
            Conn::Single(single) => &single.inner.flags,
            #[cfg(feature = "cluster")]
            Conn::Cluster(_, flags) => flags,
        }
    }

    /// Which engine serves the calls.
    pub(crate) fn engine_state(&self) -> &crate::engine::EngineState {
        &self.flags().engine
    }
}

impl crate::script::Scripting for Conn {
    fn functions_refused(&self) -> Option<&std::sync::atomic::AtomicBool> {
        Some(&self.flags().functions_refused)
    }

    fn engine(&self) -> Option<&crate::engine::EngineState> {
        Some(&self.flags().engine)
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c, _) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c, _) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c, _) => c.get_db(),
        }
    }
}
