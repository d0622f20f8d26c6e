//! The pub/sub task of a `Redsem`: one connection's life (subscribe, route, reconnect with a
//! backoff, follow a moved primary), run until the client closes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::StreamExt;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use super::{Command, Routes, lock, route};
use crate::conn::Source;

/// The first wait before reconnecting the pub/sub connection, and the longest.
const MIN_BACKOFF: Duration = Duration::from_millis(20);
const MAX_BACKOFF: Duration = Duration::from_secs(2);

/// How long to wait before the next reconnection: doubling from [`MIN_BACKOFF`] after each
/// failed attempt up to [`MAX_BACKOFF`], and back to the start once a subscription succeeded,
/// so that a process that lost its connection many times in its life still comes back fast.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Backoff {
    next: Duration,
}

impl Backoff {
    pub(super) fn new() -> Self {
        Backoff { next: MIN_BACKOFF }
    }

    /// The wait before the next attempt; the one after it is twice as long (capped).
    pub(super) fn failed(&mut self) -> Duration {
        let wait = self.next;
        self.next = (self.next * 2).min(MAX_BACKOFF);
        wait
    }

    /// A (re)subscription succeeded: the next failure waits the shortest time again.
    pub(super) fn succeeded(&mut self) {
        self.next = MIN_BACKOFF;
    }
}

pub(super) struct Task {
    /// Where to connect; after a failure the next one is tried (cluster seed nodes).
    pub(super) clients: Vec<redis::Client>,
    pub(super) next_client: usize,
    /// For one primary: where it is now (it moves when Sentinels fail over), asked before
    /// each connection; `clients` serve otherwise.
    pub(super) source: Option<Source>,
    pub(super) own_channel: String,
    pub(super) routes: Arc<Mutex<Routes>>,
    pub(super) subscribed: watch::Sender<u64>,
    pub(super) commands: mpsc::UnboundedReceiver<Command>,
    pub(super) closed: CancellationToken,
    pub(super) backoff: Backoff,
}

impl Task {
    pub(super) async fn run(mut self) {
        loop {
            match self.session().await {
                Ok(()) => return,
                Err(err)
                    if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) =>
                {
                    tracing::error!(error = %err, channel = %self.own_channel,
                        "redsem pub/sub refused by the ACL: allow +@pubsub and the channels under \
                         the prefix (&<prefix>:*); waiters fall back to polling");
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
        // Told when the Sentinels name another primary: subscribe there instead.
        let mut moved = self.source.as_ref().and_then(Source::moved);
        let client = match &self.source {
            Some(source) => source.locate().await?,
            None => match self
                .clients
                .get(self.next_client % self.clients.len().max(1))
            {
                Some(client) => client.clone(),
                None => return Ok(()),
            },
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
                () = crate::conn::primary_moved(&mut moved) => {
                    return Err(redis::RedisError::from(std::io::Error::new(
                        std::io::ErrorKind::ConnectionReset,
                        "the primary moved",
                    )));
                }
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
