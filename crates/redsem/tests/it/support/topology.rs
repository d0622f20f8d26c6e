//! One test body, two topologies: [`both_topologies!`] runs an `async fn(&TestContext<Topology>)`
//! on a server of its own and on the test binary's shared 3-master cluster.

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{Cmd, Pipeline, RedisFuture, Value};
use redsem::{Redsem, RedsemOptions};
#[cfg(feature = "cluster")]
use redsem_test::RedisCluster;

use super::{Nodes, RedisServer, TestContext, connect_with, raw_connection, within};

/// Expands `both_topologies!(name)`, next to an `async fn name(ctx: &TestContext<Topology>)`,
/// into the tests `name::single` (a [`RedisServer`] of its own) and `name::cluster` (the shared
/// cluster; feature `cluster`). Both get the prefix `<module>.<name>`, so tests sharing the
/// cluster never see each other's keys.
///
/// Options after the name: `multi_thread` (a runtime of two workers), `node_wide` (the test
/// reads or changes node-wide state, `INFO commandstats` or `CLIENT KILL`, so it has the shared
/// cluster to itself while it runs).
macro_rules! both_topologies {
    ($name:ident) => {
        $crate::support::both_topologies!(@tests $name, false, tokio::test);
    };
    ($name:ident, multi_thread) => {
        $crate::support::both_topologies!(
            @tests $name, false, tokio::test(flavor = "multi_thread", worker_threads = 2)
        );
    };
    ($name:ident, node_wide) => {
        $crate::support::both_topologies!(@tests $name, true, tokio::test);
    };
    ($name:ident, multi_thread, node_wide) => {
        $crate::support::both_topologies!(
            @tests $name, true, tokio::test(flavor = "multi_thread", worker_threads = 2)
        );
    };
    (@tests $name:ident, $node_wide:expr, $test:meta) => {
        mod $name {
            #[$test]
            async fn single() {
                let ctx = $crate::support::TestContext::on_single(module_path!()).await;
                super::$name(&ctx).await;
            }

            #[cfg(feature = "cluster")]
            #[$test]
            async fn cluster() {
                let ctx =
                    $crate::support::TestContext::on_cluster(module_path!(), $node_wide).await;
                super::$name(&ctx).await;
            }
        }
    };
}
pub(crate) use both_topologies;

/// Where a [`both_topologies!`] test runs.
pub(crate) enum Topology {
    /// A server of the test's own.
    Single(RedisServer),
    /// The shared cluster, held for as long as the test runs.
    #[cfg(feature = "cluster")]
    Cluster {
        cluster: &'static RedisCluster,
        _hold: Hold,
    },
}

impl Nodes for Topology {
    fn nodes(&self) -> &[RedisServer] {
        match self {
            Topology::Single(server) => std::slice::from_ref(server),
            #[cfg(feature = "cluster")]
            Topology::Cluster { cluster, .. } => cluster.nodes(),
        }
    }
}

impl Topology {
    /// A client of the server or the cluster, made with `options` (bounded by
    /// [`super::LIMIT`]).
    async fn connect(&self, options: RedsemOptions) -> redsem::Result<Redsem> {
        match self {
            Topology::Single(server) => connect_with(&server.url(), options).await,
            #[cfg(feature = "cluster")]
            Topology::Cluster { cluster, .. } => {
                super::connect_cluster_with(&cluster.urls(), options).await
            }
        }
    }
}

/// A test's hold on the shared cluster: shared with other tests, or the whole cluster.
#[cfg(feature = "cluster")]
#[allow(dead_code)] // held for its Drop only
pub(crate) enum Hold {
    Shared(tokio::sync::RwLockReadGuard<'static, ()>),
    Whole(tokio::sync::RwLockWriteGuard<'static, ()>),
}

/// Readers are the tests that only touch their own keys; a `node_wide` test writes.
#[cfg(feature = "cluster")]
static CLUSTER_USE: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());

/// How long a test may wait for its turn on the shared cluster (behind a `node_wide` test, or
/// for one while others run).
#[cfg(feature = "cluster")]
const TURN_LIMIT: std::time::Duration = std::time::Duration::from_secs(120);

/// The test binary's one 3-master cluster, started by the first test that asks for it.
///
/// A cluster takes about 2 s to start (`redis-cli --cluster create` waits for the nodes to
/// join); one per test would add that to every cluster test. It is started on a thread that
/// lives as long as the process, because a node gets `SIGKILL` when the thread that started it
/// exits (`PR_SET_PDEATHSIG`), and a test's thread ends with the test. The nodes die with the
/// process; nothing runs `Drop` on a static, so [`remove_when_gone`] removes their directories.
#[cfg(feature = "cluster")]
fn shared_cluster() -> &'static RedisCluster {
    static CLUSTER: std::sync::OnceLock<&'static RedisCluster> = std::sync::OnceLock::new();
    CLUSTER.get_or_init(|| {
        let (started, cluster) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("shared-cluster".to_owned())
            .spawn(move || {
                let cluster: &'static RedisCluster = Box::leak(Box::new(RedisCluster::start(3)));
                remove_when_gone(cluster.nodes().iter().map(RedisServer::dir));
                if started.send(cluster).is_ok() {
                    loop {
                        std::thread::park();
                    }
                }
            })
            .expect("spawn the shared cluster's thread");
        cluster
            .recv()
            .expect("the shared cluster did not start (its thread panicked, see above)")
    })
}

/// Start a detached shell that waits for this process to end, then removes `dirs`. Best effort:
/// if it cannot start, the directories stay behind.
#[cfg(feature = "cluster")]
fn remove_when_gone<'a>(dirs: impl Iterator<Item = &'a std::path::Path>) {
    let _ = std::process::Command::new("sh")
        .arg("-c")
        .arg(r#"while kill -0 "$1" 2>/dev/null; do sleep 0.2; done; shift; rm -rf -- "$@""#)
        .arg("remove-when-gone")
        .arg(std::process::id().to_string())
        .args(dirs)
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn();
}

impl TestContext<Topology> {
    /// A server of the test's own, and a client with the prefix made of `module` (the
    /// test's module path).
    pub(crate) async fn on_single(module: &str) -> TestContext<Topology> {
        let server = Topology::Single(RedisServer::start());
        Self::connected(module, server).await
    }

    /// The shared cluster (all of it if `node_wide`), and a client with the prefix made of
    /// `module` (the test's module path).
    #[cfg(feature = "cluster")]
    pub(crate) async fn on_cluster(module: &str, node_wide: bool) -> TestContext<Topology> {
        let hold = if node_wide {
            Hold::Whole(within(TURN_LIMIT, "the whole shared cluster", CLUSTER_USE.write()).await)
        } else {
            Hold::Shared(within(TURN_LIMIT, "the shared cluster", CLUSTER_USE.read()).await)
        };
        let cluster = Topology::Cluster {
            cluster: shared_cluster(),
            _hold: hold,
        };
        Self::connected(module, cluster).await
    }

    async fn connected(module: &str, server: Topology) -> TestContext<Topology> {
        let prefix = module
            .strip_prefix("it::")
            .unwrap_or(module)
            .replace("::", ".");
        let redsem = server
            .connect(RedsemOptions::default().prefix(&prefix))
            .await
            .expect("connect to the test's servers");
        TestContext {
            redsem,
            prefix,
            server,
        }
    }

    /// Another, independent client (its own connections) with the test's prefix.
    pub(crate) async fn client(&self) -> Redsem {
        self.connect_with(RedsemOptions::default().prefix(&self.prefix))
            .await
            .expect("connect to the test's servers")
    }

    /// A client made with `options` (bounded by [`super::LIMIT`]).
    pub(crate) async fn connect_with(&self, options: RedsemOptions) -> redsem::Result<Redsem> {
        self.server.connect(options).await
    }

    /// A raw async connection for reading and writing keys (on the cluster, routed by key).
    pub(crate) async fn raw(&self) -> Raw {
        match &self.server {
            Topology::Single(server) => Raw::Single(raw_connection(server).await),
            #[cfg(feature = "cluster")]
            Topology::Cluster { cluster, .. } => Raw::Cluster(
                within(
                    super::LIMIT,
                    "raw cluster connect",
                    cluster.client().get_async_connection(),
                )
                .await
                .expect("raw cluster connection"),
            ),
        }
    }
}

/// A raw connection to a single server or to a cluster.
pub(crate) enum Raw {
    Single(MultiplexedConnection),
    #[cfg(feature = "cluster")]
    Cluster(redis::cluster_async::ClusterConnection),
}

impl ConnectionLike for Raw {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Raw::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Raw::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Raw::Single(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Raw::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Raw::Single(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Raw::Cluster(c) => c.get_db(),
        }
    }
}
