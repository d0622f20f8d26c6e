//! Wake-ups on a Redis Cluster go by sharded pub/sub, in the slot of their primitive: the
//! script `SPUBLISH`es on the node that owns the slot, the waiter's client `SSUBSCRIBE`d there,
//! and no other node carries the message (a classic `PUBLISH` is forwarded by the cluster bus
//! to every node). Each test starts a cluster of its own, so the counters it reads see no other
//! test's traffic.
//!
//! How "no traffic at the other nodes" is measured: `CLUSTER INFO` counts the pub/sub messages
//! a node received over the cluster bus (`cluster_stats_messages_publish_received` for classic
//! messages, `cluster_stats_messages_publishshard_received` for sharded ones, which go only to
//! the owner's replicas, none here). Across each hand-off those stay where they were on the
//! two nodes that do not own the slot, while the owner's `INFO commandstats` counts the
//! `SPUBLISH` and `PUBSUB SHARDCHANNELS` lists the waiter's channel there and nowhere else. A
//! classic `PUBLISH` at the end shows that the counters do see one when it happens.

use std::time::{Duration, Instant};

use redis::Commands;
use redsem::{LatchOptions, LeaseOptions, PermitOptions, Redsem, RedsemOptions};
use redsem_test::{RedisCluster, RedisServer};

use crate::support::*;

const PREFIX: &str = "cw";
/// Longer than any timer of the waiters here: a wake-up that arrives within
/// [`BY_MESSAGE`] came by pub/sub.
const TIMERS: Duration = Duration::from_secs(30);
const BY_MESSAGE: Duration = Duration::from_secs(1);

async fn clients(cluster: &RedisCluster) -> (Redsem, Redsem) {
    let urls = cluster.urls();
    let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
    let connect = || Redsem::connect_cluster_with(&seeds, RedsemOptions::default().prefix(PREFIX));
    let a = within(LIMIT, "connect a", connect()).await.expect("a");
    let b = within(LIMIT, "connect b", connect()).await.expect("b");
    (a, b)
}

/// A synchronous command on one node, off the async workers.
fn ask<T: redis::FromRedisValue>(node: &RedisServer, cmd: &redis::Cmd) -> T {
    tokio::task::block_in_place(|| {
        let mut conn = node.connection();
        cmd.query(&mut conn).expect("a node answers")
    })
}

/// Pub/sub messages `node` received over the cluster bus, classic and sharded.
fn bus_publish_received(node: &RedisServer) -> u64 {
    let info: String = ask(node, redis::cmd("CLUSTER").arg("INFO"));
    info.lines()
        .filter_map(|line| line.trim().split_once(':'))
        .filter(|(name, _)| {
            name.starts_with("cluster_stats_messages_publish") && name.ends_with("_received")
        })
        .filter_map(|(_, n)| n.parse::<u64>().ok())
        .sum()
}

/// Calls of `command` on `node` (`INFO commandstats`; scripts' calls included).
fn calls(node: &RedisServer, command: &str) -> u64 {
    let stats = tokio::task::block_in_place(|| node.info("commandstats"));
    stats
        .lines()
        .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// The shard channels under the prefix that `node` has subscribers for.
fn shard_channels(node: &RedisServer) -> Vec<String> {
    ask(
        node,
        redis::cmd("PUBSUB")
            .arg("SHARDCHANNELS")
            .arg(format!("{PREFIX}:*")),
    )
}

/// What the nodes counted before a hand-off.
struct Counters {
    bus: Vec<u64>,
    spublish: Vec<u64>,
    publish: Vec<u64>,
}

impl Counters {
    fn read(cluster: &RedisCluster) -> Counters {
        let nodes = cluster.nodes();
        Counters {
            bus: nodes.iter().map(bus_publish_received).collect(),
            spublish: nodes.iter().map(|n| calls(n, "spublish")).collect(),
            publish: nodes.iter().map(|n| calls(n, "publish")).collect(),
        }
    }

    /// Since `self`: the wake-up was `SPUBLISH`ed at the owner of `key` and nowhere else,
    /// nothing was `PUBLISH`ed, no other node received a pub/sub message, and none has a
    /// subscriber of a channel of the primitive (hash tag `tag`).
    fn assert_only_the_owner(&self, cluster: &RedisCluster, key: &str, tag: &str, what: &str) {
        let owner = cluster.node_for_key(key).port();
        let now = Counters::read(cluster);
        for (i, node) in cluster.nodes().iter().enumerate() {
            let port = node.port();
            assert_eq!(
                now.publish[i], self.publish[i],
                "{what}: node {port} ran a classic PUBLISH"
            );
            if port == owner {
                assert!(
                    now.spublish[i] > self.spublish[i],
                    "{what}: the owner {port} ran no SPUBLISH"
                );
            } else {
                assert_eq!(
                    now.bus[i], self.bus[i],
                    "{what}: node {port}, which does not own the slot, received pub/sub \
                     messages over the cluster bus"
                );
                assert_eq!(
                    now.spublish[i], self.spublish[i],
                    "{what}: node {port} ran an SPUBLISH"
                );
                let channels = shard_channels(node);
                assert!(
                    !channels.iter().any(|c| c.ends_with(tag)),
                    "{what}: node {port} has subscribers of the primitive's channels: {channels:?}"
                );
            }
        }
    }
}

/// A waiter's wake channel on the primitive `name` is subscribed at `node`.
fn assert_subscribed_at(node: &RedisServer, name: &str) {
    let channels = shard_channels(node);
    assert!(
        channels.iter().any(
            |c| c.starts_with(&format!("{PREFIX}:wake:")) && c.ends_with(&format!(":{name}}}"))
        ),
        "{name}: the waiter's channel is not subscribed at its owner {}: {channels:?}",
        node.port()
    );
}

fn lease_key(name: &str) -> String {
    format!("{PREFIX}:{{lease:{name}}}:state")
}

/// `a` holds the one unit of `name`, `b` waits; `a` releases and `b` must be granted by the
/// message. Returns the counters read just before the release.
async fn lease_hand_off(cluster: &RedisCluster, a: &Redsem, b: &Redsem, name: &str) -> Counters {
    let quiet = LeaseOptions::default().lease(TIMERS).waiter_lease(TIMERS);
    let sem_a = a
        .lease_semaphore_with(name, 1, quiet.clone())
        .expect("semaphore");
    let sem_b = b.lease_semaphore_with(name, 1, quiet).expect("semaphore");
    let held = within(LIMIT, "try_acquire", sem_a.try_acquire())
        .await
        .expect("free");
    let waiter = tokio::spawn(async move { sem_b.acquire().await });
    until("b queued", || async {
        sem_a.status().await.expect("status").waiters.len() == 1
    })
    .await;
    assert_subscribed_at(cluster.node_for_key(&lease_key(name)), name);
    let before = Counters::read(cluster);
    let released = Instant::now();
    held.release().await.expect("release");
    let next = within(LIMIT, "the hand-off", waiter)
        .await
        .expect("task")
        .expect("granted");
    assert!(
        released.elapsed() < BY_MESSAGE,
        "{name}: woken by the message, not the timer: {:?}",
        released.elapsed()
    );
    next.release().await.expect("release");
    before
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wake_ups_reach_their_waiter_through_the_owner_of_the_slot_only() {
    if skip_without(
        Needs::ShardedPubsub,
        "wake_ups_reach_their_waiter_through_the_owner_of_the_slot_only",
        "counts SPUBLISH calls and reads PUBSUB SHARDCHANNELS",
    ) {
        return;
    }
    let cluster = tokio::task::block_in_place(|| RedisCluster::start(3));
    let (a, b) = clients(&cluster).await;

    // The lease semaphore, on names spread over the three nodes.
    for name in ["jobs-0", "jobs-1", "jobs-2", "jobs-3"] {
        let before = lease_hand_off(&cluster, &a, &b, name).await;
        let tag = format!("{{lease:{name}}}");
        before.assert_only_the_owner(&cluster, &lease_key(name), &tag, &format!("lease {name}"));
    }

    // The permit semaphore.
    let quiet = PermitOptions::default().waiter_lease(TIMERS);
    let pa = a
        .permit_semaphore_with("pool", quiet.clone())
        .expect("permits");
    let pb = b.permit_semaphore_with("pool", quiet).expect("permits");
    within(LIMIT, "set", pa.try_set_permits(1))
        .await
        .expect("set");
    within(LIMIT, "take", pa.try_acquire(1))
        .await
        .expect("take the one permit");
    let waiter = tokio::spawn({
        let pb = pb.clone();
        async move { pb.acquire(1).await }
    });
    let queue = format!("{PREFIX}:{{permits:pool}}:queue");
    let owner = cluster.node_for_key(&queue);
    until("b queued for a permit", || async {
        let queued: u64 =
            tokio::task::block_in_place(|| owner.connection().zcard(&queue).expect("ZCARD"));
        queued == 1
    })
    .await;
    assert_subscribed_at(owner, "pool");
    let before = Counters::read(&cluster);
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
    before.assert_only_the_owner(&cluster, &queue, "{permits:pool}", "permits");

    // The latch: its waiters hear "opened" on the latch's own channel.
    let quiet = LatchOptions::default().recheck(TIMERS);
    let la = a
        .count_down_latch_with("boot", quiet.clone())
        .expect("latch");
    let lb = b.count_down_latch_with("boot", quiet).expect("latch");
    within(LIMIT, "set", la.try_set_count(1))
        .await
        .expect("set");
    let latch_key = format!("{PREFIX}:{{latch:boot}}:count");
    let owner = cluster.node_for_key(&latch_key);
    let waiter = tokio::spawn(async move { lb.wait().await });
    until("b listens to the latch", || async {
        shard_channels(owner)
            .iter()
            .any(|c| c.starts_with(&format!("{PREFIX}:opened:")))
    })
    .await;
    let before = Counters::read(&cluster);
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
    before.assert_only_the_owner(&cluster, &latch_key, "{latch:boot}", "latch");

    // The counters do see classic pub/sub: one PUBLISH at a node reaches both others.
    let before = Counters::read(&cluster);
    let _: u64 = ask(
        &cluster.nodes()[0],
        redis::cmd("PUBLISH").arg("control").arg("x"),
    );
    within(LIMIT, "a classic message crosses the bus", async {
        loop {
            let now: Vec<u64> = cluster.nodes().iter().map(bus_publish_received).collect();
            if now[1] > before.bus[1] && now[2] > before.bus[2] {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

/// The slot of a semaphore moved to another node (a resharding step: `MIGRATE` of its keys,
/// `CLUSTER SETSLOT ... NODE`): the old owner drops the waiter's subscription and says so,
/// the client subscribes at the new owner, and hand-offs come by message there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_wake_ups_follow_their_slot_to_another_node() {
    if skip_without(
        Needs::ShardedPubsub,
        "sharded_wake_ups_follow_their_slot_to_another_node",
        "counts SPUBLISH calls and reads PUBSUB SHARDCHANNELS",
    ) {
        return;
    }
    let cluster = tokio::task::block_in_place(|| RedisCluster::start(3));
    let (a, b) = clients(&cluster).await;
    let name = "moving";
    let key = lease_key(name);
    // Subscribed (and kept: the channel lingers after its waiter).
    lease_hand_off(&cluster, &a, &b, name).await;
    let from = cluster.node_for_key(&key);
    assert!(!shard_channels(from).is_empty(), "subscribed at the owner");
    let to = cluster
        .nodes()
        .iter()
        .find(|n| n.port() != from.port())
        .expect("another node");

    tokio::task::block_in_place(|| move_slot(&cluster, &key, from, to));

    until("b subscribed at the new owner", || async {
        !shard_channels(to).is_empty() && shard_channels(from).is_empty()
    })
    .await;
    assert_subscribed_at(to, name);
    let before = lease_hand_off(&cluster, &a, &b, name).await;
    assert_eq!(cluster.node_for_key(&key).port(), to.port(), "moved");
    before.assert_only_the_owner(&cluster, &key, "{lease:moving}", "after the move");
}

/// Move the slot of `key`, with its keys, from `from` to `to`.
fn move_slot(cluster: &RedisCluster, key: &str, from: &RedisServer, to: &RedisServer) {
    let mut src = from.connection();
    let mut dst = to.connection();
    let slot: u16 = redis::cmd("CLUSTER")
        .arg("KEYSLOT")
        .arg(key)
        .query(&mut src)
        .expect("KEYSLOT");
    let id = |conn: &mut redis::Connection| -> String {
        redis::cmd("CLUSTER").arg("MYID").query(conn).expect("MYID")
    };
    let (src_id, dst_id) = (id(&mut src), id(&mut dst));
    let setslot = |conn: &mut redis::Connection, how: &str, node: &str| {
        let _: () = redis::cmd("CLUSTER")
            .arg("SETSLOT")
            .arg(slot)
            .arg(how)
            .arg(node)
            .query(conn)
            .expect("SETSLOT");
    };
    setslot(&mut dst, "IMPORTING", &src_id);
    setslot(&mut src, "MIGRATING", &dst_id);
    loop {
        let keys: Vec<String> = redis::cmd("CLUSTER")
            .arg("GETKEYSINSLOT")
            .arg(slot)
            .arg(100)
            .query(&mut src)
            .expect("GETKEYSINSLOT");
        if keys.is_empty() {
            break;
        }
        let _: () = redis::cmd("MIGRATE")
            .arg("127.0.0.1")
            .arg(to.port())
            .arg("")
            .arg(0)
            .arg(5000)
            .arg("KEYS")
            .arg(&keys)
            .query(&mut src)
            .expect("MIGRATE");
    }
    setslot(&mut dst, "NODE", &dst_id);
    setslot(&mut src, "NODE", &dst_id);
    for node in cluster.nodes() {
        if node.port() != from.port() && node.port() != to.port() {
            setslot(&mut node.connection(), "NODE", &dst_id);
        }
    }
}

/// A user given exactly the documented rules (`acl_rules()` and, on a cluster, `+cluster|slots
/// +cluster|nodes`) on every node is woken by the sharded message: the rules allow `SPUBLISH`
/// and `SSUBSCRIBE` (`+@pubsub`), not only their classic twins.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_with_the_documented_rules_is_woken_by_the_sharded_message() {
    if skip_without(
        Needs::ShardedPubsub,
        "a_user_with_the_documented_rules_is_woken_by_the_sharded_message",
        "counts SPUBLISH calls and reads PUBSUB SHARDCHANNELS",
    ) {
        return;
    }
    let cluster = tokio::task::block_in_place(|| RedisCluster::start(3));
    let options = RedsemOptions::default().prefix(PREFIX);
    let rules = format!("{} +cluster|slots +cluster|nodes", options.acl_rules());
    for node in cluster.nodes() {
        let mut cmd = redis::cmd("ACL");
        cmd.arg("SETUSER").arg("app").arg("on").arg(">app-password");
        for rule in rules.split_whitespace() {
            cmd.arg(rule);
        }
        let _: () = ask(node, &cmd);
    }
    let urls: Vec<String> = cluster
        .urls()
        .iter()
        .map(|url| url.replacen("redis://", "redis://app:app-password@", 1))
        .collect();
    let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
    let connect = || Redsem::connect_cluster_with(&seeds, options.clone());
    let a = within(LIMIT, "connect a", connect()).await.expect("a");
    let b = within(LIMIT, "connect b", connect()).await.expect("b");
    lease_hand_off(&cluster, &a, &b, "acl").await;
}
