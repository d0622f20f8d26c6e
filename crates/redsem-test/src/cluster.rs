//! A throwaway Redis Cluster made of [`RedisServer`] nodes.

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::server::{binary, spawn_failed};
use crate::{POLL_INTERVAL, RedisServer};

/// How long the nodes may take to agree that the cluster is up after `cluster create`.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How many times `redis-cli --cluster create` is tried.
const CREATE_ATTEMPTS: usize = 3;

/// A Redis Cluster of masters without replicas, each a [`RedisServer`] in cluster mode.
///
/// Dropping it stops every node and removes their directories.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
}

impl RedisCluster {
    /// Start `masters` nodes, join them with `redis-cli --cluster create`, and wait until every
    /// node knows all the others and reports all 16384 slots served.
    ///
    /// # Panics
    ///
    /// If `masters < 3` (Redis Cluster needs three), a binary is missing, or the cluster does not
    /// come up within 20 s.
    pub fn start(masters: usize) -> RedisCluster {
        assert!(
            masters >= 3,
            "a Redis Cluster needs at least 3 masters, got {masters}"
        );
        let nodes = (0..masters)
            .map(|_| RedisServer::start_cluster_node())
            .collect();
        let cluster = RedisCluster { nodes };
        cluster.create();
        cluster.wait_ready();
        cluster
    }

    /// The nodes, in the order they were started.
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The nodes, mutably, to [`stop`](RedisServer::stop) or [`restart`](RedisServer::restart) one.
    pub fn nodes_mut(&mut self) -> &mut [RedisServer] {
        &mut self.nodes
    }

    /// The URL of every node.
    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(RedisServer::url).collect()
    }

    /// A cluster client seeded with every node (does not connect yet).
    pub fn client(&self) -> redis::cluster::ClusterClient {
        redis::cluster::ClusterClient::new(self.urls()).expect("the URLs of test nodes are valid")
    }

    /// Run `redis-cli --cluster create` until it succeeds.
    fn create(&self) {
        let cli = binary("REDSEM_REDIS_CLI", "redis-cli");
        let addresses: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("127.0.0.1:{}", node.port()))
            .collect();
        let mut failures = Vec::new();
        for attempt in 1..=CREATE_ATTEMPTS {
            let output = Command::new(&cli)
                .args(["--cluster", "create"])
                .args(&addresses)
                .args(["--cluster-replicas", "0", "--cluster-yes"])
                .stdin(Stdio::null())
                .output()
                .unwrap_or_else(|e| spawn_failed(&cli, "REDSEM_REDIS_CLI", &e));
            if output.status.success() {
                return;
            }
            failures.push(format!(
                "attempt {attempt}: {}\nstdout:\n{}\nstderr:\n{}",
                output.status,
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ));
            self.reset();
        }
        self.fail(&format!(
            "redis-cli --cluster create failed {CREATE_ATTEMPTS} times:\n{}",
            failures.join("\n")
        ))
    }

    /// Empty every node again so that `cluster create` can be retried.
    fn reset(&self) {
        for node in &self.nodes {
            // Best effort: if a node stays configured, the next attempt reports it.
            let _: redis::RedisResult<()> = node.query(&redis::cmd("FLUSHALL"));
            let _: redis::RedisResult<()> =
                node.query(redis::cmd("CLUSTER").arg("RESET").arg("HARD"));
        }
    }

    /// Poll `CLUSTER INFO` on every node until all are ready.
    fn wait_ready(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        let wanted = [
            "cluster_state:ok".to_owned(),
            "cluster_slots_ok:16384".to_owned(),
            format!("cluster_known_nodes:{}", self.nodes.len()),
        ];
        loop {
            let pending: Vec<String> = self
                .nodes
                .iter()
                .filter_map(|node| not_ready(node, &wanted))
                .collect();
            if pending.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                self.fail(&format!(
                    "the cluster was not ready within {READY_TIMEOUT:?}:\n{}",
                    pending.join("\n")
                ));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Panic with `message` and the log tail of every node.
    fn fail(&self, message: &str) -> ! {
        let logs: Vec<String> = self
            .nodes
            .iter()
            .map(|node| format!("node {}:\n{}", node.port(), node.log_tail()))
            .collect();
        panic!("{message}\n{}", logs.join("\n"))
    }
}

/// Why `node` is not ready yet, or `None` if its `CLUSTER INFO` has every `wanted` line.
fn not_ready(node: &RedisServer, wanted: &[String]) -> Option<String> {
    let info: String = match node.query(redis::cmd("CLUSTER").arg("INFO")) {
        Ok(info) => info,
        Err(e) => return Some(format!("node {}: CLUSTER INFO failed: {e}", node.port())),
    };
    let missing: Vec<&String> = wanted
        .iter()
        .filter(|line| !info.lines().any(|have| have.trim() == line.as_str()))
        .collect();
    (!missing.is_empty()).then(|| format!("node {}: no {missing:?} in CLUSTER INFO", node.port()))
}
