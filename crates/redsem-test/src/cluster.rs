//! A throwaway Redis Cluster made of [`RedisServer`] nodes.

use std::process::{Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::port::CLUSTER_BUS_OFFSET;
use crate::server::{binary, spawn_failed};
use crate::{FaultProxy, POLL_INTERVAL, RedisServer};

/// How long the nodes may take to agree that the cluster is up after `cluster create`.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How many times `redis-cli --cluster create` is tried.
const CREATE_ATTEMPTS: usize = 3;

/// A Redis Cluster of masters, each a [`RedisServer`] in cluster mode; without replicas
/// unless started with [`start_with_replicas`](Self::start_with_replicas).
///
/// Started with [`start_behind_proxies`](Self::start_behind_proxies), every node is reached
/// through its own [`FaultProxy`], so a test can cut, delay or lose the replies of one node.
///
/// Dropping it stops every node (and proxy) and removes their directories.
#[derive(Debug)]
pub struct RedisCluster {
    nodes: Vec<RedisServer>,
    /// Empty, or `proxies[i]` in front of `nodes[i]`.
    proxies: Vec<FaultProxy>,
    /// Replicas per master (`redis-cli --cluster create --cluster-replicas`).
    replicas: usize,
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
        RedisCluster::join(nodes)
    }

    /// Like [`start`](Self::start), with one master per entry of `node_args`, each started with
    /// its entry appended to its `redis-server` arguments: e.g. a module loaded on some nodes
    /// only (`--loadmodule <path>`).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_each_with(node_args: &[&[&str]]) -> RedisCluster {
        assert!(
            node_args.len() >= 3,
            "a Redis Cluster needs at least 3 masters, got {}",
            node_args.len()
        );
        let nodes = node_args
            .iter()
            .map(|args| RedisServer::start_cluster_node_with(args))
            .collect();
        RedisCluster::join(nodes)
    }

    /// Join started cluster nodes (at least 3) into a cluster and wait until it is ready.
    pub(crate) fn join(nodes: Vec<RedisServer>) -> RedisCluster {
        let cluster = RedisCluster {
            nodes,
            proxies: Vec::new(),
            replicas: 0,
        };
        cluster.create();
        cluster.wait_ready();
        cluster
    }

    /// Like [`start`](Self::start), with one replica per master (`2 * masters` nodes, joined by
    /// `redis-cli --cluster create --cluster-replicas 1`; the nodes' `cluster-node-timeout` is
    /// 2 s, so a dead master's replica is elected in a few seconds). Returns once every replica
    /// is in sync with its master.
    ///
    /// Which node became a replica of which is read from the cluster:
    /// [`replica_for_key`](Self::replica_for_key), [`failover_for_key`](Self::failover_for_key).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start); also if a replica is not in sync within 20 s.
    pub fn start_with_replicas(masters: usize) -> RedisCluster {
        assert!(
            masters >= 3,
            "a Redis Cluster needs at least 3 masters, got {masters}"
        );
        let nodes = (0..masters * 2)
            .map(|_| RedisServer::start_cluster_node())
            .collect();
        let cluster = RedisCluster {
            nodes,
            proxies: Vec::new(),
            replicas: 1,
        };
        cluster.create();
        cluster.wait_ready();
        cluster.wait_replicas_in_sync();
        cluster
    }

    /// The replica of the master serving the slot of `key` now.
    ///
    /// # Panics
    ///
    /// If the cluster has no replicas, or as [`node_for_key`](Self::node_for_key).
    pub fn replica_for_key(&self, key: &str) -> &RedisServer {
        &self.nodes[self.replica_index(key)]
    }

    /// Wait until the replica of the master serving `key` has every write its master took
    /// (`WAIT 1` on the master).
    ///
    /// # Panics
    ///
    /// If it does not within 10 s.
    pub fn wait_key_replicated(&self, key: &str) {
        let owner = self.node_for_key(key);
        let acked: i64 = owner
            .query(redis::cmd("WAIT").arg(1).arg(10_000))
            .unwrap_or_else(|e| self.fail(&format!("WAIT on node {}: {e}", owner.port())));
        if acked < 1 {
            self.fail(&format!(
                "the replica of node {} did not acknowledge its writes within 10 s",
                owner.port()
            ));
        }
    }

    /// `CLUSTER FAILOVER` on the replica of the master serving `key` (a manual failover: the
    /// master stops taking writes until the replica has them all, then they swap roles), and
    /// wait until every node says the replica serves the slot. Returns its port.
    ///
    /// # Panics
    ///
    /// If the replica refuses, or the nodes do not agree within 20 s.
    pub fn failover_for_key(&self, key: &str) -> u16 {
        let old = self.node_for_key(key).port();
        let replica = self.replica_for_key(key);
        let () = replica
            .query(redis::cmd("CLUSTER").arg("FAILOVER"))
            .unwrap_or_else(|e| self.fail(&format!("CLUSTER FAILOVER on {}: {e}", replica.port())));
        let new = self.wait_key_moved(key, old, READY_TIMEOUT);
        assert_eq!(
            new,
            replica.port(),
            "the replica took over the slot of {key:?}"
        );
        new
    }

    /// Kill (`SIGKILL`) the master serving `key`; returns its port. Its replica is elected after
    /// the node timeout (2 s): wait for it with [`wait_key_moved`](Self::wait_key_moved).
    ///
    /// # Panics
    ///
    /// As [`node_for_key`](Self::node_for_key).
    pub fn kill_owner_of(&mut self, key: &str) -> u16 {
        let index = self.owner_of(key);
        let port = self.nodes[index].port();
        self.nodes[index].stop();
        port
    }

    /// Wait until every running node says that a master other than the one on `old` serves
    /// the slot of `key`, and that master answers `ROLE` as one; returns its port.
    ///
    /// # Panics
    ///
    /// If that does not happen within `limit`.
    pub fn wait_key_moved(&self, key: &str, old: u16, limit: Duration) -> u16 {
        let deadline = Instant::now() + limit;
        loop {
            let mut named = Vec::new();
            let mut slot = None;
            for node in &self.nodes {
                let asked: redis::RedisResult<(u16, String)> = node
                    .query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
                    .and_then(|slot| {
                        let nodes: String = node.query(redis::cmd("CLUSTER").arg("NODES"))?;
                        Ok((slot, nodes))
                    });
                // A stopped node does not answer: the others decide.
                if let Ok((s, listing)) = asked {
                    slot = Some(s);
                    named.push(master_of_slot(&listing, s));
                }
            }
            let agreed = named
                .first()
                .copied()
                .flatten()
                .filter(|first| *first != old && named.iter().all(|n| *n == Some(*first)));
            if let Some(port) = agreed
                && let Some(node) = self.nodes.iter().find(|n| n.port() == port)
            {
                let role: redis::RedisResult<Vec<redis::Value>> = node.query(&redis::cmd("ROLE"));
                let first = role.ok().and_then(|r| {
                    r.first()
                        .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok())
                });
                if first.as_deref() == Some("master") {
                    return port;
                }
            }
            if Instant::now() >= deadline {
                self.fail(&format!(
                    "the nodes did not agree on a new master of slot {slot:?} of {key:?} (old \
                     {old}) within {limit:?}: they name {named:?}"
                ));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// The index in `nodes` of the replica of the master serving `key`.
    fn replica_index(&self, key: &str) -> usize {
        assert!(
            self.replicas > 0,
            "replica_for_key needs a cluster started with RedisCluster::start_with_replicas"
        );
        let owner = self.nodes[self.owner_of(key)].port();
        self.nodes
            .iter()
            .position(|node| {
                let Ok(info) = node.query::<String>(redis::cmd("INFO").arg("replication")) else {
                    return false;
                };
                info.lines().any(|l| l.trim() == "role:slave")
                    && info
                        .lines()
                        .any(|l| l.trim() == format!("master_port:{owner}"))
            })
            .unwrap_or_else(|| self.fail(&format!("no replica of node {owner} (serving {key:?})")))
    }

    /// Poll until every replica's link to its master is up and synced.
    fn wait_replicas_in_sync(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let pending: Vec<String> = self
                .nodes
                .iter()
                .filter_map(|node| {
                    let info: String = match node.query(redis::cmd("INFO").arg("replication")) {
                        Ok(info) => info,
                        Err(e) => return Some(format!("node {}: {e}", node.port())),
                    };
                    let has = |line: &str| info.lines().any(|l| l.trim() == line);
                    let replica = has("role:slave");
                    (replica && !(has("master_link_status:up") && has("master_sync_in_progress:0")))
                        .then(|| format!("node {}: replica not in sync", node.port()))
                })
                .collect();
            let replicas = self
                .nodes
                .iter()
                .filter(|node| {
                    node.query::<String>(redis::cmd("INFO").arg("replication"))
                        .is_ok_and(|info| info.lines().any(|l| l.trim() == "role:slave"))
                })
                .count();
            if pending.is_empty() && replicas == self.nodes.len() / (self.replicas + 1) {
                return;
            }
            if Instant::now() >= deadline {
                self.fail(&format!(
                    "the replicas were not in sync within {READY_TIMEOUT:?} ({replicas} \
                     replicas):\n{}",
                    pending.join("\n")
                ));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Like [`start`](Self::start), with a [`FaultProxy`] in front of every node, and every node
    /// announcing its proxy: `cluster-announce-ip 127.0.0.1`, `cluster-announce-port <proxy
    /// port>`, `cluster-announce-bus-port <node port + 10000>` (kept across
    /// [`restart`](RedisServer::restart)).
    ///
    /// So `CLUSTER SLOTS`, `CLUSTER SHARDS`, `CLUSTER NODES` and `MOVED` redirections name the
    /// proxies, and a cluster client seeded with [`urls`](Self::urls) (the proxies' URLs) sends
    /// every command through them. The cluster bus between the nodes does not go through the
    /// proxies: a fault injected there is seen by clients only, never by the other nodes.
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start); also if the nodes do not announce their proxies within 20 s.
    pub fn start_behind_proxies(masters: usize) -> RedisCluster {
        assert!(
            masters >= 3,
            "a Redis Cluster needs at least 3 masters, got {masters}"
        );
        let mut nodes: Vec<RedisServer> = (0..masters)
            .map(|_| RedisServer::start_cluster_node())
            .collect();
        let proxies: Vec<FaultProxy> = nodes
            .iter()
            .map(|node| FaultProxy::start(node.port()))
            .collect();
        for (node, proxy) in nodes.iter_mut().zip(&proxies) {
            let bus_port = node.port() + CLUSTER_BUS_OFFSET;
            node.set_config_persistently("cluster-announce-ip", "127.0.0.1");
            node.set_config_persistently("cluster-announce-port", &proxy.port().to_string());
            node.set_config_persistently("cluster-announce-bus-port", &bus_port.to_string());
        }
        let cluster = RedisCluster {
            nodes,
            proxies,
            replicas: 0,
        };
        cluster.create();
        cluster.wait_ready();
        cluster.wait_announced();
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

    /// The proxies in front of the nodes, `proxies()[i]` in front of `nodes()[i]`; empty unless
    /// the cluster was started with [`start_behind_proxies`](Self::start_behind_proxies).
    pub fn proxies(&self) -> &[FaultProxy] {
        &self.proxies
    }

    /// The URL of every node, in the order of [`nodes`](Self::nodes); for a cluster behind
    /// proxies, the URL of every proxy instead.
    pub fn urls(&self) -> Vec<String> {
        if self.proxies.is_empty() {
            self.nodes.iter().map(RedisServer::url).collect()
        } else {
            self.proxies.iter().map(FaultProxy::url).collect()
        }
    }

    /// The node serving the slot of `key` now (asked with `CLUSTER KEYSLOT` and `CLUSTER NODES`
    /// of the first node that answers).
    ///
    /// # Panics
    ///
    /// If no node answers, or none serves the slot.
    pub fn node_for_key(&self, key: &str) -> &RedisServer {
        &self.nodes[self.owner_of(key)]
    }

    /// The proxy in front of the node serving the slot of `key` now: arm a fault there to hit the
    /// commands on `key` (and on every key of its hash tag).
    ///
    /// # Panics
    ///
    /// If the cluster was not started with [`start_behind_proxies`](Self::start_behind_proxies),
    /// or as [`node_for_key`](Self::node_for_key).
    pub fn proxy_for_key(&self, key: &str) -> &FaultProxy {
        assert!(
            !self.proxies.is_empty(),
            "proxy_for_key needs a cluster started with RedisCluster::start_behind_proxies"
        );
        &self.proxies[self.owner_of(key)]
    }

    /// A cluster client seeded with every node, or every proxy (does not connect yet).
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
                .args([
                    "--cluster-replicas",
                    &self.replicas.to_string(),
                    "--cluster-yes",
                ])
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

    /// The index in `nodes` of the master serving the slot of `key`.
    fn owner_of(&self, key: &str) -> usize {
        let mut errors = Vec::new();
        for node in &self.nodes {
            let asked: redis::RedisResult<(u16, String)> = node
                .query(redis::cmd("CLUSTER").arg("KEYSLOT").arg(key))
                .and_then(|slot| {
                    let nodes: String = node.query(redis::cmd("CLUSTER").arg("NODES"))?;
                    Ok((slot, nodes))
                });
            let (slot, listing) = match asked {
                Ok(answer) => answer,
                Err(e) => {
                    errors.push(format!("node {}: {e}", node.port()));
                    continue;
                }
            };
            let Some(port) = master_of_slot(&listing, slot) else {
                self.fail(&format!(
                    "no master serves slot {slot} of {key:?}; CLUSTER NODES of node {}:\n{listing}",
                    node.port()
                ));
            };
            let index = self
                .nodes
                .iter()
                .position(|node| node.port() == port)
                .or_else(|| self.proxies.iter().position(|proxy| proxy.port() == port));
            return index.unwrap_or_else(|| {
                self.fail(&format!(
                    "slot {slot} of {key:?} is served on port {port}, which is neither a node nor \
                     a proxy of this cluster"
                ))
            });
        }
        self.fail(&format!(
            "no node answered CLUSTER KEYSLOT / CLUSTER NODES:\n{}",
            errors.join("\n")
        ))
    }

    /// Poll until every node lists every master at its proxy's port in `CLUSTER NODES`.
    fn wait_announced(&self) {
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut wanted: Vec<u16> = self.proxies.iter().map(FaultProxy::port).collect();
        wanted.sort_unstable();
        loop {
            let pending: Vec<String> = self
                .nodes
                .iter()
                .filter_map(|node| {
                    let listing: String = match node.query(redis::cmd("CLUSTER").arg("NODES")) {
                        Ok(listing) => listing,
                        Err(e) => return Some(format!("node {}: {e}", node.port())),
                    };
                    let mut ports = master_ports(&listing);
                    ports.sort_unstable();
                    (ports != wanted)
                        .then(|| format!("node {} lists masters at {ports:?}", node.port()))
                })
                .collect();
            if pending.is_empty() {
                return;
            }
            if Instant::now() >= deadline {
                self.fail(&format!(
                    "the nodes did not announce the proxy ports {wanted:?} within \
                     {READY_TIMEOUT:?}:\n{}",
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

/// One line of `CLUSTER NODES` of a master: its client port and the slot ranges it serves.
struct MasterLine {
    port: u16,
    ranges: Vec<(u16, u16)>,
}

/// The masters in a `CLUSTER NODES` listing
/// (`<id> <ip:port@cport[,hostname]> <flags> <master> <ping> <pong> <epoch> <state> <slots>...`).
fn masters(listing: &str) -> Vec<MasterLine> {
    listing
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            if !flags.split(',').any(|flag| flag == "master") {
                return None;
            }
            let address = fields.get(1)?.split(['@', ',']).next()?;
            let port = address.rsplit_once(':')?.1.parse().ok()?;
            // Ranges `a-b` or single slots `a`; `[slot->-id]` entries are migrations: skipped.
            let ranges = fields
                .iter()
                .skip(8)
                .filter_map(|range| match range.split_once('-') {
                    Some((first, last)) => Some((first.parse().ok()?, last.parse().ok()?)),
                    None => range.parse().ok().map(|slot| (slot, slot)),
                })
                .collect();
            Some(MasterLine { port, ranges })
        })
        .collect()
}

/// The client port of every master in a `CLUSTER NODES` listing.
fn master_ports(listing: &str) -> Vec<u16> {
    masters(listing).iter().map(|master| master.port).collect()
}

/// The client port of the master serving `slot` in a `CLUSTER NODES` listing.
fn master_of_slot(listing: &str, slot: u16) -> Option<u16> {
    masters(listing)
        .into_iter()
        .find(|master| {
            master
                .ranges
                .iter()
                .any(|&(first, last)| (first..=last).contains(&slot))
        })
        .map(|master| master.port)
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

#[cfg(test)]
mod tests {
    use super::*;

    const LISTING: &str = "\
07c3 127.0.0.1:30004@40004,host myself,master - 0 0 1 connected 0-5459 5460 [5461->-e7d1]
e7d1 127.0.0.1:30005@40005 master - 0 1 2 connected 5461-10922
292f 127.0.0.1:30006@40006 slave e7d1 0 1 2 connected
a1b2 127.0.0.1:30007@40007 master,fail - 0 1 3 connected 10923-16383
";

    #[test]
    fn cluster_nodes_listings_give_the_master_of_each_slot() {
        assert_eq!(master_ports(LISTING), [30004, 30005, 30007]);
        assert_eq!(master_of_slot(LISTING, 0), Some(30004));
        assert_eq!(master_of_slot(LISTING, 5460), Some(30004));
        assert_eq!(master_of_slot(LISTING, 5461), Some(30005));
        assert_eq!(master_of_slot(LISTING, 16383), Some(30007));
        assert_eq!(master_of_slot("", 1), None);
    }
}
