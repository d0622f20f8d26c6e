//! The sharded pub/sub of a `Redsem` on a Redis Cluster: every channel it listens to is
//! subscribed with `SSUBSCRIBE` on the primary that owns the channel's slot (the slot of the
//! primitive's keys: see [`crate::keys::is_sharded`]), one connection per such node, so a
//! wake-up travels from the node that ran the script to the waiter's client and to no other
//! node.
//!
//! The channels follow their slot. A node that gives a slot away (a resharding, or a
//! failover that demoted it) drops the subscriptions of that slot and says so with a
//! `sunsubscribe` message; a node that fails closes its connection (or stops answering the
//! `PING` sent every [`TICK`]). Either way the channels concerned are placed again: the owner
//! is read from `CLUSTER NODES` (through the command connection), or taken from the `MOVED`
//! answer of a node that does not own the slot, and every waiter re-checks once, since a
//! message may have been lost meanwhile. A channel that cannot be placed is tried again
//! after a backoff; its waiters rely on their timers until then.
//!
//! The connections speak RESP3, where a subscribed connection still answers commands, and
//! `SSUBSCRIBE` is sent as a plain command, one channel at a time (its one confirmation is
//! the command's reply); the messages come through the connection's push sender.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{AsyncPushSender, ConnectionLike, MultiplexedConnection, SendError};
use redis::cluster_async::ClusterConnection;
use redis::{AsyncConnectionConfig, ProtocolVersion, PushInfo, PushKind, RedisResult, Value};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::task::Backoff;
use super::{Command, Routes, WAKE_LINGER, lock, route};
use crate::conn::{Primary, node_client, primaries, slot_of};

/// How often each node connection is checked (`PING`), channels not placed are tried again
/// (when their backoff allows) and idle wake channels are dropped.
const TICK: Duration = Duration::from_secs(1);
/// How long connecting to a node, or one of its answers, may take.
const NODE_TIMEOUT: Duration = Duration::from_secs(2);
/// `MOVED` answers followed for one channel before the topology is read again.
const REDIRECTS: usize = 3;

/// The connection to one node, and the channels subscribed there.
struct Node {
    conn: MultiplexedConnection,
    channels: HashSet<String>,
}

/// Hands a node's pushes to the task, with the node's address.
struct Tagged {
    addr: String,
    tx: mpsc::UnboundedSender<(String, PushInfo)>,
}

impl AsyncPushSender for Tagged {
    fn send(&self, info: PushInfo) -> Result<(), SendError> {
        self.tx
            .send((self.addr.clone(), info))
            .map_err(|_| SendError)
    }
}

pub(super) struct ShardTask {
    /// The credentials, database and TLS of every node connection (the first seed's).
    seeds: Vec<redis::Client>,
    /// The command connection, to read `CLUSTER NODES`.
    cluster: ClusterConnection,
    routes: Arc<Mutex<Routes>>,
    commands: mpsc::UnboundedReceiver<Command>,
    closed: CancellationToken,
    /// Every channel to subscribe, with the flag it sets once it is (cleared while not).
    wanted: HashMap<String, watch::Sender<bool>>,
    /// Where each subscribed channel is: the address of its node.
    placed: HashMap<String, String>,
    nodes: HashMap<String, Node>,
    /// The primaries and their slots, as last read.
    topology: Vec<Primary>,
    pushes_tx: mpsc::UnboundedSender<(String, PushInfo)>,
    pushes: mpsc::UnboundedReceiver<(String, PushInfo)>,
    backoff: Backoff,
    /// When channels not placed are tried again.
    retry_at: Option<Instant>,
}

impl ShardTask {
    pub(super) fn new(
        seeds: Vec<redis::Client>,
        cluster: ClusterConnection,
        routes: Arc<Mutex<Routes>>,
        commands: mpsc::UnboundedReceiver<Command>,
        closed: CancellationToken,
    ) -> ShardTask {
        let (pushes_tx, pushes) = mpsc::unbounded_channel();
        ShardTask {
            seeds,
            cluster,
            routes,
            commands,
            closed,
            wanted: HashMap::new(),
            placed: HashMap::new(),
            nodes: HashMap::new(),
            topology: Vec::new(),
            pushes_tx,
            pushes,
            backoff: Backoff::new(),
            retry_at: None,
        }
    }

    pub(super) async fn run(mut self) {
        let mut tick = tokio::time::interval(TICK);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = self.closed.cancelled() => return,
                Some(cmd) = self.commands.recv() => match cmd {
                    Command::Subscribe(channel, confirm) => {
                        self.wanted.insert(channel.clone(), confirm);
                        if self.placed.contains_key(&channel) {
                            self.confirm(&channel, true);
                        } else {
                            self.place(&channel).await;
                        }
                    }
                    Command::Unsubscribe(channel) => self.unsubscribe(&channel).await,
                },
                Some((addr, push)) = self.pushes.recv() => self.push(&addr, push).await,
                _ = tick.tick() => self.tick().await,
            }
        }
    }

    fn confirm(&self, channel: &str, ok: bool) {
        if let Some(flag) = self.wanted.get(channel) {
            flag.send_replace(ok);
        }
    }

    /// Subscribe `channel` on the node that owns its slot. False if that failed (it is tried
    /// again later).
    async fn place(&mut self, channel: &str) -> bool {
        let slot = slot_of(channel);
        let mut target = self.owner(slot);
        if target.is_none() {
            self.read_topology().await;
            target = self.owner(slot);
        }
        let mut redirects = 0;
        while let Some((host, port)) = target.take() {
            match self.ssubscribe(&host, port, channel).await {
                Ok(addr) => {
                    self.placed.insert(channel.to_owned(), addr);
                    self.confirm(channel, true);
                    return true;
                }
                Err(err) => {
                    if let Some((host, port)) = err.redirect_node()
                        && redirects < REDIRECTS
                    {
                        // The slot moved: subscribe where the node says, and read the
                        // topology again for the other channels.
                        redirects += 1;
                        target = Some((host.to_owned(), port));
                        self.topology.clear();
                        continue;
                    }
                    tracing::debug!(error = %err, channel, node = %format!("{host}:{port}"),
                        "redsem sharded pub/sub: could not subscribe; trying again later");
                    if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) {
                        tracing::error!(error = %err, channel,
                            "redsem pub/sub refused by the ACL: allow +ssubscribe +sunsubscribe \
                             and the channels under the prefix (&<prefix>:*); waiters fall back \
                             to polling");
                    }
                    self.topology.clear();
                }
            }
        }
        if self.retry_at.is_none() {
            self.retry_at = Some(Instant::now() + self.backoff.failed());
        }
        false
    }

    /// The node that owns `slot`, as last read.
    fn owner(&self, slot: u16) -> Option<(String, u16)> {
        self.topology
            .iter()
            .find(|p| p.slots.iter().any(|&(from, to)| from <= slot && slot <= to))
            .map(|p| (p.host.clone(), p.port))
    }

    async fn read_topology(&mut self) {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("NODES");
        let read = cmd.query_async::<String>(&mut self.cluster);
        match tokio::time::timeout(NODE_TIMEOUT, read).await {
            Ok(Ok(nodes)) => self.topology = primaries(&nodes),
            Ok(Err(err)) => {
                tracing::debug!(error = %err, "redsem sharded pub/sub: CLUSTER NODES failed")
            }
            Err(_) => tracing::debug!("redsem sharded pub/sub: CLUSTER NODES timed out"),
        }
    }

    /// `SSUBSCRIBE channel` on `host:port`, connecting first if need be; the node's address.
    async fn ssubscribe(&mut self, host: &str, port: u16, channel: &str) -> RedisResult<String> {
        let addr = format!("{host}:{port}");
        if !self.nodes.contains_key(&addr) {
            let conn = self.connect(host, port, &addr).await?;
            self.nodes.insert(
                addr.clone(),
                Node {
                    conn,
                    channels: HashSet::new(),
                },
            );
        }
        let Some(node) = self.nodes.get_mut(&addr) else {
            return Err(gone());
        };
        let mut cmd = redis::cmd("SSUBSCRIBE");
        cmd.arg(channel);
        let reply = tokio::time::timeout(NODE_TIMEOUT, node.conn.req_packed_command(&cmd))
            .await
            .map_err(|_| timed_out())
            .and_then(|r| r)
            .and_then(|v| v.extract_error());
        match reply {
            Ok(_) => {
                node.channels.insert(channel.to_owned());
                Ok(addr)
            }
            Err(err) => {
                if err.is_io_error() || err.is_connection_dropped() || err.is_timeout() {
                    self.drop_node(&addr);
                }
                Err(err)
            }
        }
    }

    async fn connect(
        &self,
        host: &str,
        port: u16,
        addr: &str,
    ) -> RedisResult<MultiplexedConnection> {
        let seed = self.seeds.first().ok_or_else(gone)?;
        let client = node_client(seed, host, port).map_err(|e| {
            redis::RedisError::from((redis::ErrorKind::InvalidClientConfig, "node", e.to_string()))
        })?;
        let info = client.get_connection_info().clone();
        let settings = info
            .redis_settings()
            .clone()
            .set_protocol(ProtocolVersion::RESP3);
        let client = redis::Client::open(info.set_redis_settings(settings))?;
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(NODE_TIMEOUT))
            .set_response_timeout(Some(NODE_TIMEOUT))
            .set_push_sender(Tagged {
                addr: addr.to_owned(),
                tx: self.pushes_tx.clone(),
            });
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
    }

    async fn unsubscribe(&mut self, channel: &str) {
        self.wanted.remove(channel);
        let Some(addr) = self.placed.remove(channel) else {
            return;
        };
        if let Some(node) = self.nodes.get_mut(&addr) {
            node.channels.remove(channel);
            let mut cmd = redis::cmd("SUNSUBSCRIBE");
            cmd.arg(channel);
            // (Ignored failure: a node that cannot answer has dropped the subscription, or
            // will with its connection.)
            let _ = tokio::time::timeout(NODE_TIMEOUT, node.conn.req_packed_command(&cmd)).await;
        }
    }

    async fn push(&mut self, addr: &str, push: PushInfo) {
        match push.kind {
            PushKind::SMessage | PushKind::Message => {
                if let [Value::BulkString(channel), Value::BulkString(payload), ..] =
                    push.data.as_slice()
                {
                    self.dispatch(channel, payload);
                }
            }
            PushKind::SUnsubscribe => {
                // Not asked for (an unsubscription asked for left `placed` first): the node
                // gave the slot away.
                if let Some(Value::BulkString(channel)) = push.data.first()
                    && let Ok(channel) = std::str::from_utf8(channel)
                    && self.placed.get(channel).is_some_and(|at| at == addr)
                {
                    tracing::info!(
                        channel,
                        node = addr,
                        "redsem sharded pub/sub: the slot moved; subscribing where it went"
                    );
                    let channel = channel.to_owned();
                    self.lost(vec![channel]).await;
                }
            }
            PushKind::Disconnection => self.node_failed(addr).await,
            _ => {}
        }
    }

    fn dispatch(&self, channel: &[u8], payload: &[u8]) {
        let Ok(channel) = std::str::from_utf8(channel) else {
            return;
        };
        let routes = lock(&self.routes);
        if routes.wakes.contains_key(channel) {
            if let Ok(payload) = std::str::from_utf8(payload) {
                route(&routes, payload);
            }
        } else if let Some((_, notify, _)) = routes.channels.get(channel) {
            notify.notify_waiters();
        }
    }

    /// The connection to `addr` failed: place its channels again.
    async fn node_failed(&mut self, addr: &str) {
        let Some(node) = self.nodes.remove(addr) else {
            return;
        };
        tracing::warn!(
            node = addr,
            "redsem sharded pub/sub connection lost; subscribing again"
        );
        for channel in &node.channels {
            self.placed.remove(channel);
        }
        self.lost(node.channels.into_iter().collect()).await;
    }

    fn drop_node(&mut self, addr: &str) {
        if let Some(node) = self.nodes.remove(addr) {
            for channel in node.channels {
                self.placed.remove(&channel);
                self.confirm(&channel, false);
            }
        }
    }

    /// `channels` are no longer subscribed: place them again, and have every waiter re-check
    /// (a message may have been lost meanwhile).
    async fn lost(&mut self, channels: Vec<String>) {
        self.topology.clear();
        for channel in &channels {
            if let Some(addr) = self.placed.remove(channel)
                && let Some(node) = self.nodes.get_mut(&addr)
            {
                node.channels.remove(channel);
            }
            self.confirm(channel, false);
        }
        crate::observe::pubsub_reconnected();
        for channel in &channels {
            if self.wanted.contains_key(channel) {
                self.place(channel).await;
            }
        }
        self.wake_everyone();
    }

    async fn tick(&mut self) {
        // Nodes that stopped answering.
        let mut failed = Vec::new();
        let ping = redis::cmd("PING");
        for (addr, node) in &mut self.nodes {
            let pong = tokio::time::timeout(NODE_TIMEOUT, node.conn.req_packed_command(&ping));
            if !matches!(pong.await, Ok(Ok(_))) {
                failed.push(addr.clone());
            }
        }
        for addr in failed {
            self.node_failed(&addr).await;
        }
        // Channels not placed, once their backoff allows.
        if self.retry_at.is_some_and(|at| at <= Instant::now()) {
            self.retry_at = None;
            let unplaced: Vec<String> = self
                .wanted
                .keys()
                .filter(|c| !self.placed.contains_key(*c))
                .cloned()
                .collect();
            let mut all = true;
            for channel in &unplaced {
                all &= self.place(channel).await;
            }
            if all {
                self.backoff.succeeded();
                if !unplaced.is_empty() {
                    self.wake_everyone();
                }
            }
        }
        // Wake channels without a waiter for WAKE_LINGER.
        let idle: Vec<String> = {
            let mut routes = lock(&self.routes);
            let idle: Vec<String> = routes
                .wakes
                .iter()
                .filter(|(_, w)| w.idle_since.is_some_and(|t| t.elapsed() >= WAKE_LINGER))
                .map(|(c, _)| c.clone())
                .collect();
            for channel in &idle {
                routes.wakes.remove(channel);
            }
            idle
        };
        for channel in idle {
            self.unsubscribe(&channel).await;
        }
        // Nodes left without a channel.
        self.nodes.retain(|_, node| !node.channels.is_empty());
    }

    fn wake_everyone(&self) {
        let routes = lock(&self.routes);
        for mailbox in routes.waiters.values() {
            mailbox.notify.notify_one();
        }
        for (_, notify, _) in routes.channels.values() {
            notify.notify_waiters();
        }
    }
}

fn gone() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::NotConnected,
        "no connection to the node",
    ))
}

fn timed_out() -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        "the node did not answer",
    ))
}
