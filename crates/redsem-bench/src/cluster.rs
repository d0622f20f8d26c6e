//! `--cluster-handoff`: S3 (capacity 1, one waiter: release → the waiter's grant) on a
//! throwaway Redis Cluster of three primaries started here (whatever `--url` says), with the
//! holder and the waiter on two redsem clients of their own, so every grant travels as a
//! wake-up message from the node that owns the semaphore's slot to the waiter's client.
//!
//! Besides the latency it counts the pub/sub messages the cluster bus carried between the
//! nodes during the trials (`cluster_stats_messages_publish*_received` of `CLUSTER INFO`,
//! summed over the nodes that do not own the slot): a classic `PUBLISH` reaches every node,
//! a sharded `SPUBLISH` only the owner's replicas (none here).

use redsem::{LeaseOptions, Redsem, RedsemOptions};
use redsem_test::RedisCluster;
use serde::Serialize;

use crate::BenchResult;
use crate::core;
use crate::sem;
use crate::stats::Latency;

/// S3 on a three-primary cluster.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ClusterHandoff {
    pub(crate) primaries: usize,
    pub(crate) trials: usize,
    /// From calling release on the holder to the waiter's acquire returning.
    pub(crate) handoff: Latency,
    /// Pub/sub messages (classic and sharded) the nodes that do not own the semaphore's
    /// slot received over the cluster bus during the trials.
    pub(crate) pubsub_messages_at_other_nodes: u64,
    /// The same at the node that owns it (from its replicas: none here).
    pub(crate) pubsub_messages_at_owner: u64,
}

const PRIMARIES: usize = 3;

/// Start a three-primary cluster, then run `trials` hand-offs there.
pub(crate) async fn run(trials: usize, group_commit: bool) -> BenchResult<ClusterHandoff> {
    // On this worker thread, which lives as long as the runtime: the harness kills a server
    // when the thread that started it ends.
    let cluster = tokio::task::block_in_place(|| RedisCluster::start(PRIMARIES));
    let outcome = measure(&cluster, trials, group_commit).await;
    tokio::task::block_in_place(|| drop(cluster));
    outcome
}

async fn measure(
    cluster: &RedisCluster,
    trials: usize,
    group_commit: bool,
) -> BenchResult<ClusterHandoff> {
    let urls = cluster.urls();
    let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
    let prefix = "bench-cluster";
    let options = RedsemOptions::default()
        .prefix(prefix)
        .group_commit(group_commit);
    let holder = Redsem::connect_cluster_with(&seeds, options.clone()).await?;
    let waiter = Redsem::connect_cluster_with(&seeds, options).await?;
    let name = "s3";
    let a = sem::Redsem(holder.lease_semaphore_with(name, 1, LeaseOptions::default())?);
    let b = sem::Redsem(waiter.lease_semaphore_with(name, 1, LeaseOptions::default())?);
    // Warm up: connections, scripts, subscriptions.
    core::handoff(&a, &b, 10).await?;
    let owner = cluster
        .node_for_key(&format!("{prefix}:{{lease:{name}}}:state"))
        .port();
    let before = bus_messages(cluster);
    let run = core::handoff(&a, &b, trials).await?;
    let after = bus_messages(cluster);
    let (mut at_owner, mut at_others) = (0, 0);
    for ((port, was), (_, now)) in before.iter().zip(&after) {
        if *port == owner {
            at_owner += now - was;
        } else {
            at_others += now - was;
        }
    }
    holder.flush().await;
    waiter.flush().await;
    Ok(ClusterHandoff {
        primaries: PRIMARIES,
        trials,
        handoff: run.handoff,
        pubsub_messages_at_other_nodes: at_others,
        pubsub_messages_at_owner: at_owner,
    })
}

/// Per node (by port): the pub/sub messages it received over the cluster bus, classic and
/// sharded (`cluster_stats_messages_publish_received` and
/// `cluster_stats_messages_publishshard_received` of `CLUSTER INFO`).
fn bus_messages(cluster: &RedisCluster) -> Vec<(u16, u64)> {
    tokio::task::block_in_place(|| {
        cluster
            .nodes()
            .iter()
            .map(|node| {
                let mut conn = node.connection();
                let info: String = redis::cmd("CLUSTER")
                    .arg("INFO")
                    .query(&mut conn)
                    .unwrap_or_default();
                (node.port(), publish_received(&info))
            })
            .collect()
    })
}

/// The sum of the `cluster_stats_messages_publish*_received` counters in a `CLUSTER INFO`
/// reply.
pub(crate) fn publish_received(cluster_info: &str) -> u64 {
    cluster_info
        .lines()
        .filter_map(|line| line.trim().split_once(':'))
        .filter(|(name, _)| {
            name.starts_with("cluster_stats_messages_publish") && name.ends_with("_received")
        })
        .filter_map(|(_, n)| n.parse::<u64>().ok())
        .sum()
}

impl ClusterHandoff {
    /// The lines `redsem-bench` prints.
    pub(crate) fn summary(&self) -> String {
        format!(
            "S3 hand-off on a Redis Cluster of {} primaries (holder and waiter on two clients):\n  \
             p50 {:.1} µs, mean {:.1} µs, p99 {:.1} µs, max {:.1} µs ({} trials)\n  \
             pub/sub messages over the cluster bus: {} at the other nodes, {} at the owner",
            self.primaries,
            self.handoff.p50_us,
            self.handoff.mean_us,
            self.handoff.p99_us,
            self.handoff.max_us,
            self.trials,
            self.pubsub_messages_at_other_nodes,
            self.pubsub_messages_at_owner,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bus_pubsub_counters_are_summed() {
        let info = "cluster_state:ok\r\ncluster_stats_messages_ping_received:40\r\n\
                    cluster_stats_messages_publish_received:7\r\n\
                    cluster_stats_messages_publishshard_received:2\r\n\
                    cluster_stats_messages_publish_sent:9\r\n";
        assert_eq!(publish_received(info), 9);
        assert_eq!(publish_received("cluster_state:ok\r\n"), 0);
    }
}
