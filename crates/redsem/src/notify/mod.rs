//! The pub/sub side of a `Redsem`: one connection, shared by every waiter of the process.
//!
//! A script that grants a queued request publishes the request id on the channel of the client
//! that queued it; the task here routes the message to that one waiter. Broadcast channels
//! (a latch reaching zero) wake every local listener of the channel. If the connection drops,
//! the task reconnects, subscribes again and wakes every waiter once so each re-checks: a lost
//! message costs latency, never liveness (waiters also re-check on a timer).
//!
//! On a Redis Cluster the wake-ups go by sharded pub/sub instead: each primitive's channels
//! lie in its slot (see [`crate::keys::is_sharded`]), the scripts `SPUBLISH` them, and the
//! task subscribes to each with `SSUBSCRIBE` on the node that owns that slot, following the
//! slot when it moves (`shard.rs`). A client's wake channel on one primitive is subscribed
//! while a waiter of it is registered, and for a while after ([`WAKE_LINGER`]). A cluster
//! whose primaries lack sharded pub/sub (Redis 6.2; told at connect by
//! `conn::has_sharded_pubsub`) keeps the classic channels and one classic connection, to any
//! seed node: the cluster bus carries every `PUBLISH` to every node.
//!
//! Here: the [`Notifier`] handle, waiters' [`Registration`]s and broadcast [`Listener`]s,
//! and the routing table they share. Beside it: `task.rs` (the classic connection's life),
//! `shard.rs` (the sharded connections, one per node) and `wake.rs` (the wake-up message
//! format).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::conn::Source;

#[cfg(feature = "cluster")]
mod shard;
mod task;
pub(crate) mod wake;

use task::{Backoff, Task};

/// How long a new waiter waits for the first subscription before relying on its timer alone.
const FIRST_SUBSCRIBE_WAIT: Duration = Duration::from_secs(2);

/// How long a sharded wake channel stays subscribed after its last waiter left: the next
/// waiter on the same primitive then needs no `SSUBSCRIBE` round trip before it queues.
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
const WAKE_LINGER: Duration = Duration::from_secs(30);

/// Where the pub/sub connection(s) go.
pub(crate) enum Place {
    /// One connection, classic pub/sub. To one primary: `source` says where it is now
    /// (behind Sentinels it moves); `clients` holds its client as first located. Or, on a
    /// cluster without sharded pub/sub (no `source`), to any node: `clients` holds the seeds,
    /// tried one after another (the cluster bus carries every `PUBLISH` to every node).
    Single {
        clients: Vec<redis::Client>,
        source: Option<Source>,
    },
    /// A Redis Cluster: sharded pub/sub, one connection per node that owns a slot of a
    /// subscribed channel, found through `cluster` (`CLUSTER NODES`) and reached with the
    /// credentials and TLS of `seeds[0]`.
    #[cfg(feature = "cluster")]
    Cluster {
        seeds: Vec<redis::Client>,
        cluster: redis::cluster_async::ClusterConnection,
    },
}

#[derive(Default)]
struct Routes {
    /// Queued requests of this client, by request id.
    waiters: HashMap<String, Arc<Mailbox>>,
    /// Broadcast channels with local listeners: (listener count, their notifier, true once
    /// the server confirmed the subscription).
    channels: HashMap<String, (usize, Arc<Notify>, watch::Receiver<bool>)>,
    /// Sharded wake channels of this client (one per primitive it waits on, on a cluster).
    wakes: HashMap<String, WakeChannel>,
}

/// A sharded wake channel: its registrations, and whether the server confirmed it.
struct WakeChannel {
    users: usize,
    /// When the last registration left (`None` while one is in place).
    idle_since: Option<std::time::Instant>,
    confirmed: watch::Receiver<bool>,
}

/// Handle to the pub/sub task.
pub(crate) struct Notifier {
    routes: Arc<Mutex<Routes>>,
    /// Counts successful (re)subscriptions; 0 until the first one.
    subscribed: watch::Receiver<u64>,
    commands: mpsc::UnboundedSender<Command>,
}

enum Command {
    /// Subscribe, then set the flag: listeners wait for it, so a message published after
    /// `listen` returns is delivered.
    Subscribe(String, watch::Sender<bool>),
    Unsubscribe(String),
}

fn lock(routes: &Mutex<Routes>) -> MutexGuard<'_, Routes> {
    // A panic while holding this lock cannot leave the maps inconsistent (single inserts/removes).
    routes
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl Notifier {
    /// Start the pub/sub task: for one primary, it connects wherever the source of `place`
    /// says the primary is now and subscribes to `own_channel` (where this client's queued
    /// requests are told they were granted); on a cluster, it subscribes to each sharded
    /// channel asked for on the node that owns its slot. It stops when `closed` is
    /// cancelled.
    pub(crate) fn start(place: Place, own_channel: String, closed: CancellationToken) -> Notifier {
        let routes = Arc::new(Mutex::new(Routes::default()));
        let (subscribed_tx, subscribed) = watch::channel(0);
        let (commands, commands_rx) = mpsc::unbounded_channel();
        match place {
            Place::Single { clients, source } => {
                let task = Task {
                    clients,
                    next_client: 0,
                    source,
                    own_channel,
                    routes: routes.clone(),
                    subscribed: subscribed_tx,
                    commands: commands_rx,
                    closed,
                    backoff: Backoff::new(),
                };
                tokio::spawn(task.run());
            }
            #[cfg(feature = "cluster")]
            Place::Cluster { seeds, cluster } => {
                // No classic subscription: the first one "succeeds" at once.
                subscribed_tx.send_replace(1);
                let task =
                    shard::ShardTask::new(seeds, cluster, routes.clone(), commands_rx, closed);
                tokio::spawn(task.run());
            }
        }
        Notifier {
            routes,
            subscribed,
            commands,
        }
    }

    /// Route wake-ups for request `id`, published on `channel` (the client's wake channel on
    /// the primitive), to the returned registration. Returns once the subscription is in
    /// place (or after a bounded wait if pub/sub is unreachable), so a grant published right
    /// after this cannot be missed.
    pub(crate) async fn register(&self, id: &str, channel: &str) -> Registration {
        let mailbox = Arc::new(Mailbox::default());
        let sharded = crate::keys::is_sharded(channel);
        let (confirmed, first) = {
            let mut routes = lock(&self.routes);
            routes.waiters.insert(id.to_owned(), mailbox.clone());
            if sharded {
                let mut confirm = None;
                let entry = routes.wakes.entry(channel.to_owned()).or_insert_with(|| {
                    let (tx, rx) = watch::channel(false);
                    confirm = Some(tx);
                    WakeChannel {
                        users: 0,
                        idle_since: None,
                        confirmed: rx,
                    }
                });
                entry.users += 1;
                entry.idle_since = None;
                (Some(entry.confirmed.clone()), confirm)
            } else {
                (None, None)
            }
        };
        if let Some(confirm) = first {
            // Ignored error: the task is gone only when the client is closed.
            let _ = self
                .commands
                .send(Command::Subscribe(channel.to_owned(), confirm));
        }
        match confirmed {
            Some(mut confirmed) => {
                let _ =
                    tokio::time::timeout(FIRST_SUBSCRIBE_WAIT, confirmed.wait_for(|ok| *ok)).await;
            }
            None => self.wait_subscribed().await,
        }
        Registration {
            routes: self.routes.clone(),
            id: id.to_owned(),
            channel: sharded.then(|| channel.to_owned()),
            mailbox,
        }
    }

    /// Listen to broadcast `channel`; the subscription lasts while any listener lives.
    pub(crate) async fn listen(&self, channel: &str) -> Listener {
        let (notify, mut confirmed, first) = {
            let mut routes = lock(&self.routes);
            let mut confirm = None;
            let entry = routes
                .channels
                .entry(channel.to_owned())
                .or_insert_with(|| {
                    let (tx, rx) = watch::channel(false);
                    confirm = Some(tx);
                    (0, Arc::new(Notify::new()), rx)
                });
            entry.0 += 1;
            (entry.1.clone(), entry.2.clone(), confirm)
        };
        if let Some(confirm) = first {
            // Ignored error: the task is gone only when the client is closed.
            let _ = self
                .commands
                .send(Command::Subscribe(channel.to_owned(), confirm));
        }
        // Bounded like the first subscription: if pub/sub is unreachable, the listener relies
        // on its own re-check timer (an error here means the attempt was dropped with its
        // connection; the reconnect subscribes again and wakes every listener).
        let _ = tokio::time::timeout(FIRST_SUBSCRIBE_WAIT, confirmed.wait_for(|ok| *ok)).await;
        Listener {
            routes: self.routes.clone(),
            commands: self.commands.clone(),
            channel: channel.to_owned(),
            notify,
        }
    }

    /// Hand a wake-up for one of this client's waiters over as if it had come by pub/sub
    /// (`<id>|<news>`): a release made by this process that granted it.
    pub(crate) fn deliver(&self, payload: &str) {
        route(&lock(&self.routes), payload);
    }

    async fn wait_subscribed(&self) {
        let mut rx = self.subscribed.clone();
        let _ = tokio::time::timeout(FIRST_SUBSCRIBE_WAIT, rx.wait_for(|n| *n > 0)).await;
    }
}

/// Where wake-ups for one queued request land: a notifier, and what the last message said
/// after the request id (a lease grant's token and slots).
#[derive(Default)]
struct Mailbox {
    notify: Notify,
    news: Mutex<Option<String>>,
}

/// A queued request's mailbox; dropping it stops the routing.
pub(crate) struct Registration {
    routes: Arc<Mutex<Routes>>,
    id: String,
    /// Its sharded wake channel, if it has one.
    channel: Option<String>,
    mailbox: Arc<Mailbox>,
}

impl Registration {
    /// Resolves at the next wake-up (one sent before this call is kept and returns at once).
    pub(crate) async fn woken(&self) {
        self.mailbox.notify.notified().await;
    }

    /// What the last wake-up message carried after `<id>|`, if anything; taken once.
    pub(crate) fn news(&self) -> Option<String> {
        self.mailbox
            .news
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        let mut routes = lock(&self.routes);
        routes.waiters.remove(&self.id);
        if let Some(channel) = &self.channel
            && let Some(wake) = routes.wakes.get_mut(channel)
        {
            wake.users = wake.users.saturating_sub(1);
            if wake.users == 0 {
                // Unsubscribed by the task once idle for WAKE_LINGER.
                wake.idle_since = Some(std::time::Instant::now());
            }
        }
    }
}

/// A local listener of a broadcast channel.
pub(crate) struct Listener {
    routes: Arc<Mutex<Routes>>,
    commands: mpsc::UnboundedSender<Command>,
    channel: String,
    notify: Arc<Notify>,
}

impl Listener {
    /// The notifier to wait on; create `notified()` before re-checking state so a message
    /// arriving in between is not missed.
    pub(crate) fn notify(&self) -> &Notify {
        &self.notify
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let mut routes = lock(&self.routes);
        if let Some(entry) = routes.channels.get_mut(&self.channel) {
            entry.0 -= 1;
            if entry.0 == 0 {
                routes.channels.remove(&self.channel);
                let _ = self
                    .commands
                    .send(Command::Unsubscribe(self.channel.clone()));
            }
        }
    }
}

/// Route a wake-up on the client's own channel, `<id>` or `<id>|<news>`, to that waiter.
fn route(routes: &Routes, payload: &str) {
    let (id, news) = wake::split(payload);
    if let Some(mailbox) = routes.waiters.get(id) {
        if let Some(news) = news {
            *mailbox.news.lock().unwrap_or_else(|p| p.into_inner()) = Some(news.to_owned());
        }
        mailbox.notify.notify_one();
    }
}
