//! Where the primary is: [`Source`], a fixed address or the primary that [`Sentinels`]
//! name, followed across failovers by the configuration epoch.

#[cfg(feature = "sentinel")]
use std::sync::{Arc, Mutex};

#[cfg(feature = "sentinel")]
use redis::{ConnectionAddr, ErrorKind};

#[cfg(feature = "sentinel")]
use super::{addr_of, node_client};
#[cfg(feature = "sentinel")]
use crate::error::Result;

/// Where the primary is: a fixed address, or wherever the Sentinels say it is now.
#[derive(Clone)]
pub(crate) enum Source {
    /// One server at one address.
    Fixed(Box<redis::Client>),
    /// The primary that Sentinels watch; it moves on a failover.
    #[cfg(feature = "sentinel")]
    Sentinel(Arc<Sentinels>),
}

impl Source {
    /// The primary as last known, without a round trip, and how many times it moved before.
    pub(crate) fn client(&self) -> (redis::Client, u64) {
        match self {
            Source::Fixed(client) => ((**client).clone(), 0),
            #[cfg(feature = "sentinel")]
            Source::Sentinel(sentinels) => sentinels.current(),
        }
    }

    /// How many times the primary moved: a cheap read, made before every command.
    pub(super) fn moves(&self) -> u64 {
        match self {
            Source::Fixed(_) => 0,
            #[cfg(feature = "sentinel")]
            Source::Sentinel(sentinels) => *sentinels.moves.borrow(),
        }
    }

    /// Where the primary is now: a fixed source answers at once; the Sentinels are asked (see
    /// [`Sentinels::locate`]).
    pub(crate) async fn locate(&self) -> redis::RedisResult<redis::Client> {
        match self {
            Source::Fixed(client) => Ok((**client).clone()),
            #[cfg(feature = "sentinel")]
            Source::Sentinel(sentinels) => sentinels.locate(false).await,
        }
    }

    /// Told each time the primary moves; `None` for a fixed source (it never moves).
    pub(crate) fn moved(&self) -> Option<tokio::sync::watch::Receiver<u64>> {
        match self {
            Source::Fixed(_) => None,
            #[cfg(feature = "sentinel")]
            Source::Sentinel(sentinels) => Some(sentinels.moves.subscribe()),
        }
    }
}

/// Resolves when `moved` says the primary moved; never for `None`.
pub(crate) async fn primary_moved(moved: &mut Option<tokio::sync::watch::Receiver<u64>>) {
    let Some(rx) = moved else {
        return std::future::pending().await;
    };
    if rx.changed().await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// The shortest time between two questions to the Sentinels after errors: the errors of
/// every command in flight at a failover ask once, not once each.
#[cfg(feature = "sentinel")]
const MIN_LOCATE_INTERVAL: std::time::Duration = std::time::Duration::from_millis(250);

/// How often the Sentinels are asked which primary they name, when nothing fails. A forced
/// failover (`SENTINEL FAILOVER`) leaves the old primary a primary, taking writes, until the
/// Sentinels turn it into a replica about 10 s later: without this, a client would go on
/// writing there, and lose it all. (Redisson's sentinel scan interval is 1 s too.)
#[cfg(feature = "sentinel")]
const WATCH_EVERY: std::time::Duration = std::time::Duration::from_secs(1);

/// The Sentinels watching one primary, and the primary they named last.
///
/// Which primary is current is decided by the Sentinels' configuration epoch
/// (`SENTINEL MASTER`'s `config-epoch`), which every failover raises: during a failover the
/// Sentinels that have not heard of it yet still name the old primary, which still answers as
/// a primary, and following whichever answers first would move back and forth.
#[cfg(feature = "sentinel")]
pub(crate) struct Sentinels {
    /// A client for each Sentinel, with a kept connection.
    sentinels: Vec<(
        redis::Client,
        Mutex<Option<redis::aio::MultiplexedConnection>>,
    )>,
    /// The name they watch the primary under.
    master_name: String,
    /// The primary as last found, and the configuration epoch it was named in.
    primary: Mutex<(redis::Client, u64)>,
    /// How many times the primary moved since connecting.
    moves: tokio::sync::watch::Sender<u64>,
    /// When the Sentinels were last asked; the lock keeps it to one question in flight.
    asked: tokio::sync::Mutex<Option<std::time::Instant>>,
    /// The longest one question may take.
    timeout: std::time::Duration,
}

#[cfg(feature = "sentinel")]
impl Sentinels {
    /// Find the primary with `asker` (the `redis` crate's client of the Sentinels at
    /// `sentinels`, which checks that it answers `ROLE` as a primary), correct it by the
    /// Sentinels' configuration epoch (see [`Sentinels::locate`]), keep it, and start
    /// watching: every [`WATCH_EVERY`], for as long as the returned value lives.
    ///
    /// # Errors
    ///
    /// When no Sentinel names a primary that answers as one, within `timeout`.
    pub(crate) async fn start(
        mut asker: redis::sentinel::SentinelClient,
        sentinels: Vec<redis::ConnectionInfo>,
        master_name: &str,
        timeout: std::time::Duration,
    ) -> Result<Arc<Sentinels>> {
        let primary = match tokio::time::timeout(timeout, asker.async_get_client()).await {
            Ok(found) => found?,
            Err(_) => {
                return Err(redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!("the Sentinels did not name a primary within {timeout:?}"),
                ))
                .into());
            }
        };
        let sentinels = sentinels
            .into_iter()
            .map(|info| Ok((redis::Client::open(info)?, Mutex::new(None))))
            .collect::<Result<Vec<_>>>()?;
        let sentinels = Arc::new(Sentinels {
            sentinels,
            master_name: master_name.to_owned(),
            primary: Mutex::new((primary, 0)),
            moves: tokio::sync::watch::Sender::new(0),
            asked: tokio::sync::Mutex::new(None),
            timeout,
        });
        // The redis crate's client reads `SENTINEL MASTERS`, where the leader of a failover
        // still lists the old primary (which still answers `ROLE` as one) until the failover
        // ends: decide by the configuration epoch at once, as every later check does.
        if let Err(err) = sentinels.locate(true).await {
            tracing::debug!(error = %err, "could not ask the Sentinels for the configuration epoch; keeping the primary found");
        }
        let watched = Arc::downgrade(&sentinels);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(WATCH_EVERY).await;
                let Some(sentinels) = watched.upgrade() else {
                    return;
                };
                if let Err(err) = sentinels.locate(true).await {
                    tracing::debug!(error = %err, "could not ask the Sentinels which primary they name");
                }
            }
        });
        for (client, _) in &sentinels.sentinels {
            tokio::spawn(listen(client.clone(), Arc::downgrade(&sentinels)));
        }
        Ok(sentinels)
    }

    fn current(&self) -> (redis::Client, u64) {
        let primary = self.primary.lock().unwrap_or_else(|p| p.into_inner());
        (primary.0.clone(), *self.moves.borrow())
    }

    /// Ask every Sentinel which primary it names, in what configuration epoch, and keep the
    /// answer of the latest epoch when it is newer than the one kept. One question at a
    /// time; unless `now`, none within [`MIN_LOCATE_INTERVAL`] of the last (the last answer
    /// stands).
    async fn locate(&self, now: bool) -> redis::RedisResult<redis::Client> {
        let mut asked = self.asked.lock().await;
        if !now && asked.is_some_and(|last| last.elapsed() < MIN_LOCATE_INTERVAL) {
            return Ok(self.current().0);
        }
        let answers = futures_util::future::join_all(
            self.sentinels
                .iter()
                .map(|(client, kept)| self.named_by(client, kept)),
        )
        .await;
        *asked = Some(std::time::Instant::now());
        let mut named = Vec::new();
        let mut failure = None;
        for answer in answers {
            match answer {
                Ok(Some(answer)) => named.push(answer),
                // Failing over: it still shows the old address, in the new epoch.
                Ok(None) => {}
                Err(err) => failure = Some(err),
            }
        }
        let Some(epoch) = named.iter().map(|(epoch, ..)| *epoch).max() else {
            return Err(failure.unwrap_or_else(|| {
                redis::RedisError::from(std::io::Error::new(
                    std::io::ErrorKind::WouldBlock,
                    "every Sentinel is in the middle of a failover",
                ))
            }));
        };
        let mut primary = self.primary.lock().unwrap_or_else(|p| p.into_inner());
        let latest: Vec<(&str, u16)> = named
            .iter()
            .filter(|(e, ..)| *e == epoch)
            .map(|(_, host, port)| (host.as_str(), *port))
            .collect();
        if epoch < primary.1 || latest.contains(&host_port(&primary.0)) {
            primary.1 = primary.1.max(epoch);
            return Ok(primary.0.clone());
        }
        let (host, port) = latest[0];
        let found = node_client(&primary.0, host, port)
            .map_err(|e| redis::RedisError::from(std::io::Error::other(e.to_string())))?;
        tracing::warn!(from = %addr_of(&primary.0), to = %addr_of(&found), epoch, "the Sentinels name a new primary");
        *primary = (found, epoch);
        self.moves.send_modify(|moves| *moves += 1);
        Ok(primary.0.clone())
    }

    /// `SENTINEL MASTER <name>` on one Sentinel: (config epoch, host, port), or `None` while
    /// it fails the primary over.
    async fn named_by(
        &self,
        client: &redis::Client,
        kept: &Mutex<Option<redis::aio::MultiplexedConnection>>,
    ) -> redis::RedisResult<Option<(u64, String, u16)>> {
        let asked = async {
            let kept_conn = kept.lock().unwrap_or_else(|p| p.into_inner()).clone();
            let mut conn = match kept_conn {
                Some(conn) => conn,
                None => {
                    let config = redis::AsyncConnectionConfig::new()
                        .set_connection_timeout(Some(self.timeout))
                        .set_response_timeout(Some(self.timeout));
                    let conn = client
                        .get_multiplexed_async_connection_with_config(&config)
                        .await?;
                    *kept.lock().unwrap_or_else(|p| p.into_inner()) = Some(conn.clone());
                    conn
                }
            };
            let fields: std::collections::HashMap<String, String> = redis::cmd("SENTINEL")
                .arg("MASTER")
                .arg(&self.master_name)
                .query_async(&mut conn)
                .await?;
            let field = |name: &str| fields.get(name).map(String::as_str);
            if field("flags").is_some_and(|flags| flags.contains("failover_in_progress")) {
                return Ok(None);
            }
            match (
                field("config-epoch").and_then(|e| e.parse().ok()),
                field("ip"),
                field("port").and_then(|p| p.parse().ok()),
            ) {
                (Some(epoch), Some(host), Some(port)) => Ok(Some((epoch, host.to_owned(), port))),
                _ => Err(redis::RedisError::from((
                    ErrorKind::Parse,
                    "SENTINEL MASTER answered without config-epoch, ip and port",
                ))),
            }
        };
        let answer = match tokio::time::timeout(self.timeout, asked).await {
            Ok(answer) => answer,
            Err(_) => Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "a Sentinel did not answer in time",
            ))),
        };
        if answer
            .as_ref()
            .is_err_and(|e| !matches!(e.kind(), ErrorKind::Server(_)))
        {
            *kept.lock().unwrap_or_else(|p| p.into_inner()) = None;
        }
        answer
    }
}

/// The channel on which a Sentinel announces that it names a new primary, at the end of a
/// failover: `<master name> <old ip> <old port> <new ip> <new port>`.
#[cfg(feature = "sentinel")]
const SWITCH_MASTER: &str = "+switch-master";

/// Listen to one Sentinel's `+switch-master` events, for as long as `sentinels` lives, and ask
/// every Sentinel at once (decided by the configuration epoch, as every look is) when it
/// announces one for our primary. So every client moves when the first Sentinel (the failover's
/// leader) announces the switch, not at its own next look. Reconnects after
/// [`WATCH_EVERY`] when the connection fails; the looks go on meanwhile.
#[cfg(feature = "sentinel")]
async fn listen(client: redis::Client, sentinels: std::sync::Weak<Sentinels>) {
    use futures_util::StreamExt;
    loop {
        let Some(timeout) = sentinels.upgrade().map(|s| s.timeout) else {
            return;
        };
        let subscribed = tokio::time::timeout(timeout, async {
            let mut pubsub = client.get_async_pubsub().await?;
            pubsub.subscribe(SWITCH_MASTER).await?;
            Ok::<_, redis::RedisError>(pubsub)
        })
        .await;
        let mut pubsub = match subscribed {
            Ok(Ok(pubsub)) => pubsub,
            Ok(Err(err)) => {
                tracing::debug!(sentinel = %addr_of(&client), error = %err, "cannot listen to the Sentinel's +switch-master");
                tokio::time::sleep(WATCH_EVERY).await;
                continue;
            }
            Err(_) => {
                tokio::time::sleep(WATCH_EVERY).await;
                continue;
            }
        };
        let mut messages = pubsub.on_message();
        loop {
            let message = tokio::select! {
                message = messages.next() => message,
                // Stop listening soon after the client goes.
                () = tokio::time::sleep(WATCH_EVERY) => {
                    if sentinels.strong_count() == 0 {
                        return;
                    }
                    continue;
                }
            };
            let Some(message) = message else {
                break;
            };
            let Some(sentinels) = sentinels.upgrade() else {
                return;
            };
            let payload: String = message.get_payload().unwrap_or_default();
            if payload.split(' ').next() != Some(sentinels.master_name.as_str()) {
                continue;
            }
            tracing::info!(sentinel = %addr_of(&client), switch = %payload, "a Sentinel announces a new primary");
            if let Err(err) = sentinels.locate(true).await {
                tracing::debug!(error = %err, "could not ask the Sentinels which primary they name");
            }
        }
        tokio::time::sleep(crate::retry::RETRY_EVERY).await;
    }
}

/// Host and port of the server `client` connects to (a Unix socket has none).
#[cfg(feature = "sentinel")]
fn host_port(client: &redis::Client) -> (&str, u16) {
    match client.get_connection_info().addr() {
        ConnectionAddr::Tcp(host, port) | ConnectionAddr::TcpTls { host, port, .. } => {
            (host.as_str(), *port)
        }
        _ => ("", 0),
    }
}
