//! Helpers shared by the integration tests.

use std::time::Duration;

use redsem::{Error, LeaseSemaphore, Redsem, RedsemOptions};
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
        connect_with(&server.url(), RedsemOptions::default().prefix(prefix))
            .await
            .expect("connect to the test server")
    }

    /// A raw async connection for inspecting keys.
    pub(crate) async fn raw(&self) -> redis::aio::MultiplexedConnection {
        raw_connection(&self.server).await
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

    /// Script calls the server ran: `FCALL` (the function library), `EVALSHA` and `EVAL`.
    pub(crate) async fn script_calls(&self) -> u64 {
        self.command_calls("fcall").await
            + self.command_calls("evalsha").await
            + self.command_calls("eval").await
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
}

impl<T: Send + 'static> Frozen<T> {
    /// Prepare a client of `url` that runs `body` once [`Frozen::start`] is called.
    pub(crate) fn spawn<F, Fut>(url: String, body: F) -> Frozen<T>
    where
        F: FnOnce(redsem::Redsem) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = T>,
    {
        let (go, go_rx) = std::sync::mpsc::channel::<()>();
        let (freeze, freeze_rx) = std::sync::mpsc::channel::<Duration>();
        let (result_tx, result) = std::sync::mpsc::channel();
        let thread = std::thread::spawn(move || {
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
        }
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
        self.thread.join().expect("frozen client thread");
        got
    }
}
