//! The pub/sub side of a `Redsem`: one connection, shared by every waiter of the process.
//!
//! A script that grants a queued request publishes the request id on the channel of the client
//! that queued it; the task here routes the message to that one waiter. Broadcast channels
//! (a latch reaching zero) wake every local listener of the channel. If the connection drops,
//! the task reconnects, subscribes again and wakes every waiter once so each re-checks: a lost
//! message costs latency, never liveness (waiters also re-check on a timer).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{Notify, mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::client::Shared;

/// How long a new waiter waits for the first subscription before relying on its timer alone.
const FIRST_SUBSCRIBE_WAIT: Duration = Duration::from_secs(2);
/// The first wait before reconnecting the pub/sub connection, and the longest.
const MIN_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How long to wait before the next reconnection: doubling from [`MIN_BACKOFF`] after each
/// failed attempt up to [`MAX_BACKOFF`], and back to the start once a subscription succeeded,
/// so that a process that lost its connection many times in its life still comes back fast.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Backoff {
    next: Duration,
}

impl Backoff {
    fn new() -> Self {
        Backoff { next: MIN_BACKOFF }
    }

    /// The wait before the next attempt; the one after it is twice as long (capped).
    fn failed(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(MAX_BACKOFF);
        wait
    }

    /// A (re)subscription succeeded: the next failure waits the shortest time again.
    fn succeeded(&mut self) {
        self.next = MIN_BACKOFF;
    }
}

#[derive(Default)]
struct Routes {
    /// Queued requests of this client, by request id.
    waiters: HashMap<String, Arc<Mailbox>>,
    /// Broadcast channels with local listeners: (listener count, their notifier, true once
    /// the server confirmed the subscription).
    channels: HashMap<String, (usize, Arc<Notify>, watch::Receiver<bool>)>,
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
    pub(crate) fn start(shared: &Shared) -> Notifier {
        let routes = Arc::new(Mutex::new(Routes::default()));
        let (subscribed_tx, subscribed) = watch::channel(0);
        let (commands, commands_rx) = mpsc::unbounded_channel();
        let task = Task {
            clients: shared.pubsub_clients.clone(),
            next_client: 0,
            own_channel: shared.wake_channel.clone(),
            routes: routes.clone(),
            subscribed: subscribed_tx,
            commands: commands_rx,
            closed: shared.closed.clone(),
            backoff: Backoff::new(),
        };
        tokio::spawn(task.run());
        Notifier {
            routes,
            subscribed,
            commands,
        }
    }

    /// Route wake-ups for request `id` to the returned registration. Returns once the
    /// subscription is in place (or after a bounded wait if pub/sub is unreachable), so a
    /// grant published right after this cannot be missed.
    pub(crate) async fn register(&self, id: &str) -> Registration {
        let mailbox = Arc::new(Mailbox::default());
        lock(&self.routes)
            .waiters
            .insert(id.to_owned(), mailbox.clone());
        self.wait_subscribed().await;
        Registration {
            routes: self.routes.clone(),
            id: id.to_owned(),
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
        lock(&self.routes).waiters.remove(&self.id);
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

struct Task {
    /// Where to connect; after a failure the next one is tried (cluster seed nodes).
    clients: Vec<redis::Client>,
    next_client: usize,
    own_channel: String,
    routes: Arc<Mutex<Routes>>,
    subscribed: watch::Sender<u64>,
    commands: mpsc::UnboundedReceiver<Command>,
    closed: CancellationToken,
    backoff: Backoff,
}

impl Task {
    async fn run(mut self) {
        loop {
            match self.session().await {
                Ok(()) => return,
                Err(err)
                    if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) =>
                {
                    tracing::error!(error = %err, channel = %self.own_channel,
                        "redsem pub/sub refused by the ACL: allow +subscribe +unsubscribe and the \
                         channels under the prefix (&<prefix>:*); waiters fall back to polling");
                    self.next_client += 1;
                    self.wake_everyone();
                }
                Err(err) => {
                    tracing::warn!(error = %err, "redsem pub/sub connection lost; reconnecting");
                    // Try the next node (cluster seeds); a single server is tried again.
                    self.next_client += 1;
                    self.wake_everyone();
                }
            }
            let wait = self.backoff.failed();
            tokio::select! {
                () = self.closed.cancelled() => return,
                () = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// One connection's life. `Ok` when the client closed, `Err` when the connection failed.
    async fn session(&mut self) -> redis::RedisResult<()> {
        let Some(client) = self
            .clients
            .get(self.next_client % self.clients.len().max(1))
        else {
            return Ok(());
        };
        let pubsub = client.get_async_pubsub().await?;
        let (mut sink, mut stream) = pubsub.split();
        let channels: Vec<String> = lock(&self.routes).channels.keys().cloned().collect();
        sink.subscribe(&self.own_channel).await?;
        for channel in channels {
            sink.subscribe(channel).await?;
        }
        let reconnected = *self.subscribed.borrow() > 0;
        self.subscribed.send_modify(|n| *n += 1);
        self.backoff.succeeded();
        if reconnected {
            crate::observe::pubsub_reconnected();
            // Messages may have been lost while we were away.
            self.wake_everyone();
        }
        loop {
            tokio::select! {
                () = self.closed.cancelled() => return Ok(()),
                msg = stream.next() => {
                    let Some(msg) = msg else {
                        return Err(redis::RedisError::from(std::io::Error::new(
                            std::io::ErrorKind::ConnectionAborted,
                            "pub/sub stream ended",
                        )));
                    };
                    self.dispatch(msg.get_channel_name(), msg.get_payload_bytes());
                }
                Some(cmd) = self.commands.recv() => match cmd {
                    Command::Subscribe(channel, confirm) => {
                        sink.subscribe(channel).await?;
                        confirm.send_replace(true);
                    }
                    Command::Unsubscribe(channel) => sink.unsubscribe(channel).await?,
                },
            }
        }
    }

    fn dispatch(&self, channel: &str, payload: &[u8]) {
        let routes = lock(&self.routes);
        if channel == self.own_channel {
            if let Ok(payload) = std::str::from_utf8(payload) {
                route(&routes, payload);
            }
        } else if let Some((_, notify, _)) = routes.channels.get(channel) {
            notify.notify_waiters();
        }
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

/// Route a wake-up on the client's own channel, `<id>` or `<id>|<news>`, to that waiter.
fn route(routes: &Routes, payload: &str) {
    let (id, news) = match payload.split_once('|') {
        Some((id, news)) => (id, Some(news)),
        None => (payload, None),
    };
    if let Some(mailbox) = routes.waiters.get(id) {
        if let Some(news) = news {
            *mailbox.news.lock().unwrap_or_else(|p| p.into_inner()) = Some(news.to_owned());
        }
        mailbox.notify.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backoff_doubles_up_to_its_cap() {
        let mut backoff = Backoff::new();
        let waits: Vec<Duration> = (0..10).map(|_| backoff.failed()).collect();
        assert_eq!(waits[0], MIN_BACKOFF);
        assert_eq!(waits[1], MIN_BACKOFF * 2);
        assert_eq!(waits[2], MIN_BACKOFF * 4);
        assert!(waits.windows(2).all(|w| w[0] <= w[1]), "{waits:?}");
        assert_eq!(waits[9], MAX_BACKOFF);
    }

    #[test]
    fn the_backoff_starts_over_after_a_subscription() {
        let mut backoff = Backoff::new();
        for _ in 0..10 {
            backoff.failed();
        }
        assert_eq!(backoff.failed(), MAX_BACKOFF);
        backoff.succeeded();
        assert_eq!(backoff.failed(), MIN_BACKOFF);
        // Ten lives of one failure each, as with ten dropped connections.
        for _ in 0..10 {
            backoff.succeeded();
            assert_eq!(backoff.failed(), MIN_BACKOFF);
        }
    }
}
