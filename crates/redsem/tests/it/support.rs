//! Helpers shared by the integration tests.

use std::collections::BTreeMap;
use std::time::Duration;

use redsem::{Error, LeasePermit, LeaseSemaphore, Redsem, RedsemOptions};
pub(crate) use redsem_test::{RedisServer, within};

mod topology;
pub(crate) use topology::{Topology, both_topologies};

/// Generous bound for any single wait in a test: a hang fails instead of stalling CI.
pub(crate) const LIMIT: Duration = Duration::from_secs(10);

/// A throwaway server plus a connected client with a per-test prefix.
///
/// `S` is where the test runs: a [`RedisServer`] of its own, or, for a test written once for both
/// topologies ([`both_topologies!`]), a [`Topology`].
pub(crate) struct TestContext<S = RedisServer> {
    pub(crate) redsem: Redsem,
    pub(crate) prefix: String,
    /// Dropped last: the client goes before its servers (or its hold on the shared cluster).
    pub(crate) server: S,
}

impl TestContext {
    pub(crate) async fn start() -> TestContext {
        let server = RedisServer::start();
        let prefix = "t".to_owned();
        let redsem = Self::connect_to(&server, &prefix).await;
        TestContext {
            redsem,
            prefix,
            server,
        }
    }

    /// Another, independent client (its own connections) to the same server.
    pub(crate) async fn client(&self) -> Redsem {
        Self::connect_to(&self.server, &self.prefix).await
    }

    async fn connect_to(server: &RedisServer, prefix: &str) -> Redsem {
        connect_with(&server.url(), RedsemOptions::default().prefix(prefix))
            .await
            .expect("connect to the test server")
    }

    /// A raw async connection for inspecting keys.
    pub(crate) async fn raw(&self) -> redis::aio::MultiplexedConnection {
        raw_connection(&self.server).await
    }
}

/// The servers under a test: its one server, or every node of a cluster.
pub(crate) trait Nodes {
    fn nodes(&self) -> &[RedisServer];
}

impl Nodes for RedisServer {
    fn nodes(&self) -> &[RedisServer] {
        std::slice::from_ref(self)
    }
}

/// Node-wide questions, asked of every node (the answers summed), each through a connection of
/// its own.
impl<S: Nodes> TestContext<S> {
    /// The replies of every node to `cmd`, each asked through a connection of its own.
    async fn ask_each_node<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> Vec<T> {
        let mut replies = Vec::new();
        for node in self.server.nodes() {
            let reply = cmd
                .query_async(&mut raw_connection(node).await)
                .await
                .unwrap_or_else(|e| panic!("{cmd:?} on the node at port {}: {e}", node.port()));
            replies.push(reply);
        }
        replies
    }

    /// Every key under the test's prefix, sorted.
    pub(crate) async fn keys(&self) -> Vec<String> {
        let mine = format!("{}:", self.prefix);
        let replies: Vec<Vec<String>> = self.ask_each_node(redis::cmd("KEYS").arg("*")).await;
        let mut keys: Vec<String> = replies
            .into_iter()
            .flatten()
            .filter(|key| key.starts_with(&mine))
            .collect();
        keys.sort();
        keys
    }

    /// Script calls the servers ran: `FCALL` (the function library), `EVALSHA` and `EVAL`.
    pub(crate) async fn script_calls(&self) -> u64 {
        let stats = self.command_stats().await;
        ["fcall", "evalsha", "eval"]
            .iter()
            .filter_map(|command| stats.get(*command))
            .sum()
    }

    /// `calls` of an `INFO commandstats` entry (e.g. `evalsha`, `function|load`).
    pub(crate) async fn command_calls(&self, command: &str) -> u64 {
        let stats = self.command_stats().await;
        stats.get(command).copied().unwrap_or(0)
    }

    /// `calls` of every `INFO commandstats` entry, by command (`get`, `function|load`).
    pub(crate) async fn command_stats(&self) -> BTreeMap<String, u64> {
        let replies: Vec<String> = self
            .ask_each_node(redis::cmd("INFO").arg("commandstats"))
            .await;
        let mut stats = BTreeMap::new();
        for line in replies.iter().flat_map(|info| info.lines()) {
            let entry = line
                .strip_prefix("cmdstat_")
                .and_then(|rest| rest.split_once(":calls="))
                .and_then(|(name, rest)| {
                    Some((name, rest.split(',').next()?.parse::<u64>().ok()?))
                });
            if let Some((name, calls)) = entry {
                *stats.entry(name.to_owned()).or_insert(0) += calls;
            }
        }
        stats
    }

    /// The number of connected clients of a type ("normal" or "pubsub"); "normal" counts the
    /// inspecting connection (one per node).
    pub(crate) async fn clients_of_type(&self, kind: &str) -> usize {
        let lists: Vec<String> = self
            .ask_each_node(redis::cmd("CLIENT").arg("LIST").arg("TYPE").arg(kind))
            .await;
        lists
            .iter()
            .flat_map(|list| list.lines())
            .filter(|line| !line.trim().is_empty())
            .count()
    }

    /// Subscribers of `channel` (`PUBSUB NUMSUB`, or `SHARDNUMSUB` for a sharded one).
    pub(crate) async fn subscribers(&self, channel: &str) -> u64 {
        if channel.ends_with('}') {
            // A sharded channel (a cluster's): counted by the node that owns its slot, which
            // alone answers.
            let mut n = 0;
            for node in self.server.nodes() {
                let reply: redis::RedisResult<(String, u64)> = redis::cmd("PUBSUB")
                    .arg("SHARDNUMSUB")
                    .arg(channel)
                    .query_async(&mut raw_connection(node).await)
                    .await;
                n += reply.map_or(0, |(_, count)| count);
            }
            return n;
        }
        let replies: Vec<(String, u64)> = self
            .ask_each_node(redis::cmd("PUBSUB").arg("NUMSUB").arg(channel))
            .await;
        replies.iter().map(|(_, n)| n).sum()
    }

    /// `CLIENT KILL TYPE <kind> SKIPME yes`: drops every connection of that type ("normal",
    /// "pubsub") except the one sending the command. Returns how many were killed.
    pub(crate) async fn kill_clients(&self, kind: &str) -> u64 {
        let mut kill = redis::cmd("CLIENT");
        kill.arg("KILL")
            .arg("TYPE")
            .arg(kind)
            .arg("SKIPME")
            .arg("yes");
        let killed: Vec<u64> = self.ask_each_node(&kill).await;
        killed.iter().sum()
    }

    /// Zero the `INFO commandstats` counters (`CONFIG RESETSTAT`).
    pub(crate) async fn reset_stats(&self) {
        let _: Vec<()> = self
            .ask_each_node(redis::cmd("CONFIG").arg("RESETSTAT"))
            .await;
    }
}

/// Short leases keep the tests fast; waits are bounded by [`LIMIT`].
pub(crate) fn short(lease_ms: u64) -> redsem::LeaseOptions {
    redsem::LeaseOptions::default()
        .lease(Duration::from_millis(lease_ms))
        .waiter_lease(Duration::from_millis(lease_ms))
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

/// A client with the prefix the tests use, connected to `url` (a server, a proxy).
pub(crate) async fn connect_url(url: &str) -> Redsem {
    connect_with(url, RedsemOptions::default().prefix("t"))
        .await
        .expect("connect")
}

/// `Redsem::connect_with`, bounded by [`LIMIT`].
pub(crate) async fn connect_with(url: &str, options: RedsemOptions) -> redsem::Result<Redsem> {
    within(LIMIT, "connect", Redsem::connect_with(url, options)).await
}

/// `Redsem::connect_cluster_with` seeded with `urls`, bounded by [`LIMIT`].
pub(crate) async fn connect_cluster_with(
    urls: &[String],
    options: RedsemOptions,
) -> redsem::Result<Redsem> {
    let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
    within(
        LIMIT,
        "cluster connect",
        Redsem::connect_cluster_with(&seeds, options),
    )
    .await
}

/// A 3-master cluster whose nodes are reached through fault proxies, and a client (prefix `t`)
/// seeded with every proxy.
pub(crate) async fn cluster_behind_proxies() -> (redsem_test::RedisCluster, Redsem) {
    let cluster = redsem_test::RedisCluster::start_behind_proxies(3);
    let redsem = connect_cluster_with(&cluster.urls(), RedsemOptions::default().prefix("t"))
        .await
        .expect("connect");
    (cluster, redsem)
}

/// A raw async connection to `server`, bounded by [`LIMIT`].
pub(crate) async fn raw_connection(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    within(
        LIMIT,
        "raw connect",
        server.client().get_multiplexed_async_connection(),
    )
    .await
    .expect("raw connection")
}

/// Requests queued on the permit semaphore `name` (prefix `t`): `ZCARD` of its queue.
pub(crate) async fn queued(server: &RedisServer, name: &str) -> u64 {
    redis::cmd("ZCARD")
        .arg(format!("t:{{permits:{name}}}:queue"))
        .query_async(&mut raw_connection(server).await)
        .await
        .expect("ZCARD")
}

/// One grant of `sem` and its release: `try_acquire`, then `release`.
pub(crate) async fn cycle(sem: &LeaseSemaphore) -> redsem::Result<()> {
    sem.try_acquire().await?.release().await
}

/// `ACL SETUSER nofunc` with password `pw`: every key, channel and command but FCALL and
/// FUNCTION, so a client logged in as it runs its scripts by EVALSHA.
pub(crate) fn no_functions_user() -> redis::Cmd {
    let mut cmd = redis::cmd("ACL");
    cmd.arg(&[
        "SETUSER",
        "nofunc",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "-fcall",
        "-function",
    ]);
    cmd
}

/// Call `attempt` every 20 ms while it fails with an error `passing` accepts (`unavailable`
/// while a server comes back, `not acquired` while a unit is taken); panics on any other
/// error, and naming `what` after [`LIMIT`].
pub(crate) async fn retry<T, F, Fut>(what: &str, passing: fn(&Error) -> bool, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = redsem::Result<T>>,
{
    within(LIMIT, what, async {
        loop {
            match attempt().await {
                Ok(done) => break done,
                Err(e) if passing(&e) => tokio::time::sleep(Duration::from_millis(20)).await,
                Err(e) => panic!("{e:?}"),
            }
        }
    })
    .await
}

/// A client living on a runtime of its own thread, which the test can freeze (the thread
/// blocks: none of the client's tasks run), as a stalled process would be.
pub(crate) struct Frozen<T> {
    go: std::sync::mpsc::Sender<()>,
    freeze: std::sync::mpsc::Sender<Duration>,
    result: std::sync::mpsc::Receiver<T>,
    thread: std::thread::JoinHandle<()>,
    /// Set once the stall (`spawn_stalling`) has begun.
    stalled: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// Blocks the thread it runs on for `pause` at the first event whose message contains `at`:
/// a stall at an exact step of the library (the events it logs), as a paused process's.
struct StallAt {
    at: &'static str,
    pause: Duration,
    done: std::sync::atomic::AtomicBool,
    /// Set as the stall begins (the test's `Frozen::stalled`).
    begun: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for StallAt {
    fn on_event(&self, event: &tracing::Event<'_>, _: tracing_subscriber::layer::Context<'_, S>) {
        struct Message(String);
        impl tracing::field::Visit for Message {
            fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn std::fmt::Debug) {
                if field.name() == "message" {
                    self.0 = format!("{value:?}");
                }
            }
        }
        let mut message = Message(String::new());
        event.record(&mut message);
        if message.0.contains(self.at) && !self.done.swap(true, std::sync::atomic::Ordering::SeqCst)
        {
            self.begun.store(true, std::sync::atomic::Ordering::SeqCst);
            std::thread::sleep(self.pause);
        }
    }
}

impl<T: Send + 'static> Frozen<T> {
    /// Prepare a client of `url` that runs `body` once [`Frozen::start`] is called.
    pub(crate) fn spawn<F, Fut>(url: String, body: F) -> Frozen<T>
    where
        F: FnOnce(redsem::Redsem) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T>,
    {
        Self::spawn_stalling(url, None, body)
    }

    /// As [`spawn`](Self::spawn), and the client's thread also blocks for `pause` at the first
    /// event the library logs whose message contains `at` (`stall`).
    pub(crate) fn spawn_stalling<F, Fut>(
        url: String,
        stall: Option<(&'static str, Duration)>,
        body: F,
    ) -> Frozen<T>
    where
        F: FnOnce(redsem::Redsem) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T>,
    {
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let (freeze, freeze_rx) = std::sync::mpsc::channel::<Duration>();
        let (result_tx, result) = std::sync::mpsc::channel();
        let stalled = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let begun = std::sync::Arc::clone(&stalled);
        let thread = std::thread::spawn(move || {
            use tracing_subscriber::layer::SubscriberExt;
            let _stalls = stall.map(|(at, pause)| {
                tracing::subscriber::set_default(tracing_subscriber::registry().with(StallAt {
                    at,
                    pause,
                    done: std::sync::atomic::AtomicBool::new(false),
                    begun,
                }))
            });
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("runtime");
            if go_rx.recv().is_err() {
                return;
            }
            rt.block_on(async move {
                let redsem = connect_url(&url).await;
                let freezer = tokio::spawn(async move {
                    let pause = tokio::task::spawn_blocking(move || freeze_rx.recv()).await;
                    if let Ok(Ok(pause)) = pause {
                        // Blocks this runtime's only thread.
                        std::thread::sleep(pause);
                    }
                });
                let _ = result_tx.send(body(redsem).await);
                freezer.abort();
            });
        });
        Frozen {
            go,
            freeze,
            result,
            thread,
            stalled,
        }
    }

    /// Whether the stall given to [`spawn_stalling`](Self::spawn_stalling) has begun.
    pub(crate) fn stalled(&self) -> bool {
        self.stalled.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Connect and run the body.
    pub(crate) fn start(&self) {
        self.go.send(()).expect("start the frozen client");
    }

    /// Block the client's thread for `pause`, from now.
    pub(crate) fn freeze(&self, pause: Duration) {
        self.freeze.send(pause).expect("freeze");
    }

    /// What the body returned, if it has.
    pub(crate) fn returned(&self) -> Option<T> {
        self.result.try_recv().ok()
    }

    /// Wait (bounded) for what the body returns, then for the thread.
    pub(crate) async fn finish(self) -> T {
        let got = within(LIMIT, "the frozen client's result", async {
            loop {
                match self.result.try_recv() {
                    Ok(r) => break r,
                    Err(_) => tokio::time::sleep(Duration::from_millis(10)).await,
                }
            }
        })
        .await;
        // A client never frozen still waits for its freeze: hang up, so its runtime can end.
        drop(self.freeze);
        self.thread.join().expect("frozen client thread");
        got
    }
}

/// A Redis 7 feature that a test uses itself, beyond what redsem needs.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Needs {
    /// The function library (`FUNCTION`, `FCALL`, `-fcall` in ACL rules).
    Functions,
    /// Sharded pub/sub (`SPUBLISH`, `SSUBSCRIBE`, `PUBSUB SHARDCHANNELS`).
    ShardedPubsub,
    /// TLS in the server's build.
    Tls,
    /// `redis.acl_check_cmd` in scripts (Redis 7.0): how the connect check reads channel
    /// rights.
    AclCheckCmd,
}

/// Whether `test` must be skipped because the server binary lacks what it `needs`, told by
/// capability ([`redsem_test::Capabilities`]), never by version; `why` says what the test
/// does with it. Says so on stderr (`--nocapture` shows it): `skipped <test>: ...`.
pub(crate) fn skip_without(needs: Needs, test: &str, why: &str) -> bool {
    let has = redsem_test::Capabilities::of_the_server();
    let (present, what) = match needs {
        Needs::Functions => (has.functions, "no function library (FUNCTION, FCALL)"),
        Needs::ShardedPubsub => (has.sharded_pubsub, "no sharded pub/sub (SPUBLISH)"),
        Needs::Tls => (has.tls, "no TLS in its build"),
        Needs::AclCheckCmd => (has.acl_check_cmd, "no redis.acl_check_cmd in scripts"),
    };
    if !present {
        eprintln!("skipped {test}: the server has {what}; the test {why}");
    }
    !present
}

/// Take `n` units of `sem` one by one.
pub(crate) async fn take_all(sem: &LeaseSemaphore, n: usize) -> Vec<LeasePermit> {
    let mut permits = Vec::with_capacity(n);
    for _ in 0..n {
        permits.push(
            within(LIMIT, "try_acquire", sem.try_acquire())
                .await
                .expect("a free unit"),
        );
    }
    permits
}
