//! A cluster reached through `FaultProxy`s, driven by redis-rs's async cluster client.
//!
//! The last two tests are the evidence for how that client treats a lost reply: it resends the
//! request, so a command or script whose reply was lost runs twice.

use std::collections::BTreeSet;
use std::time::Duration;

use redis::AsyncCommands;
use redis::cluster_async::ClusterConnection;
use redsem_test::{RedisCluster, within};

const LIMIT: Duration = Duration::from_secs(10);

async fn connect(cluster: &RedisCluster) -> ClusterConnection {
    let client = redis::cluster::ClusterClient::new(cluster.urls()).expect("cluster URLs");
    within(
        LIMIT,
        "connect to the cluster",
        client.get_async_connection(),
    )
    .await
    .expect("connect to the cluster through the proxies")
}

/// Every integer that follows the field name `port` in a reply, at any depth (`CLUSTER SHARDS`
/// lists each node as a flat `name, value, ...` array in RESP2, a map in RESP3).
fn port_fields(value: &redis::Value, out: &mut BTreeSet<i64>) {
    let is_port = |v: &redis::Value| matches!(v, redis::Value::BulkString(b) if b == b"port");
    match value {
        redis::Value::Array(items) => {
            for pair in items.windows(2) {
                if let (true, redis::Value::Int(port)) = (is_port(&pair[0]), &pair[1]) {
                    out.insert(*port);
                }
            }
            items.iter().for_each(|item| port_fields(item, out));
        }
        redis::Value::Map(pairs) => pairs.iter().for_each(|(k, v)| {
            if let (true, redis::Value::Int(port)) = (is_port(k), v) {
                out.insert(*port);
            }
            port_fields(v, out);
        }),
        _ => {}
    }
}

/// The ports of the masters in `CLUSTER SLOTS` (`[[start, end, [ip, port, id, ...]], ...]`).
fn slots_ports(reply: &redis::Value) -> BTreeSet<i64> {
    let mut ports = BTreeSet::new();
    let redis::Value::Array(ranges) = reply else {
        panic!("CLUSTER SLOTS: {reply:?}");
    };
    for range in ranges {
        let redis::Value::Array(parts) = range else {
            panic!("CLUSTER SLOTS range: {range:?}");
        };
        let Some(redis::Value::Array(master)) = parts.get(2) else {
            panic!("CLUSTER SLOTS master: {range:?}");
        };
        let Some(redis::Value::Int(port)) = master.get(1) else {
            panic!("CLUSTER SLOTS port: {master:?}");
        };
        ports.insert(*port);
    }
    ports
}

#[test]
fn every_node_announces_its_proxy_in_cluster_slots_and_cluster_shards() {
    let cluster = RedisCluster::start_behind_proxies(3);
    assert_eq!(cluster.proxies().len(), 3);
    let proxy_ports: BTreeSet<i64> = cluster
        .proxies()
        .iter()
        .map(|proxy| i64::from(proxy.port()))
        .collect();
    let node_ports: BTreeSet<i64> = cluster
        .nodes()
        .iter()
        .map(|node| i64::from(node.port()))
        .collect();
    let urls: Vec<String> = cluster.proxies().iter().map(|proxy| proxy.url()).collect();
    assert_eq!(cluster.urls(), urls);
    for (node, proxy) in cluster.nodes().iter().zip(cluster.proxies()) {
        assert_eq!(proxy.target_port(), node.port());
    }

    for node in cluster.nodes() {
        let mut con = node.connection();
        let slots: redis::Value = redis::cmd("CLUSTER")
            .arg("SLOTS")
            .query(&mut con)
            .expect("CLUSTER SLOTS");
        assert_eq!(slots_ports(&slots), proxy_ports, "{slots:?}");
        let shards: redis::Value = redis::cmd("CLUSTER")
            .arg("SHARDS")
            .query(&mut con)
            .expect("CLUSTER SHARDS");
        let mut ports = BTreeSet::new();
        port_fields(&shards, &mut ports);
        assert_eq!(ports, proxy_ports, "CLUSTER SHARDS: {shards:?}");
        assert!(node_ports.is_disjoint(&ports));
    }
}

#[tokio::test]
async fn the_async_cluster_client_goes_through_the_proxies_and_survives_a_cut() {
    let cluster = RedisCluster::start_behind_proxies(3);
    let mut con = connect(&cluster).await;
    // These keys hash to slots on every master of a 3-master cluster.
    let keys = ["foo", "bar", "{k}x", "a", "b", "c"];
    for key in keys {
        let () = within(LIMIT, "SET", con.set(key, key)).await.expect("SET");
    }
    let owners: BTreeSet<u16> = keys
        .iter()
        .map(|key| cluster.proxy_for_key(key).port())
        .collect();
    assert_eq!(owners.len(), 3, "the keys did not reach every master");
    for key in keys {
        // The node behind the key's proxy has the key: proxy_for_key and node_for_key agree.
        let node = cluster.node_for_key(key);
        assert_eq!(cluster.proxy_for_key(key).target_port(), node.port());
        let value: String = redis::cmd("GET")
            .arg(key)
            .query(&mut node.connection())
            .expect("GET on the owning node");
        assert_eq!(value, key);
    }
    for proxy in cluster.proxies() {
        assert!(
            proxy.connections() > 0,
            "no client connection through {proxy:?}"
        );
    }

    for proxy in cluster.proxies() {
        proxy.cut_all();
    }
    for key in keys {
        let value: String = within(LIMIT, "GET after a cut", con.get(key))
            .await
            .expect("GET after every connection was cut");
        assert_eq!(value, key);
    }
}

/// A lost reply to `INCR` (`AsyncCommands::incr` sends `INCRBY`, which the pattern `INCR`
/// matches): the proxy forwards the request, the node increments, the reply is swallowed and the
/// connection closed. redis-rs's cluster client classifies the dropped
/// connection as `RetryMethod::Reconnect` (an I/O error for which `is_connection_dropped()`
/// holds), reconnects to that node and sends the request again (up to 16 retries by default): the
/// call returns the second increment, and the node has run `INCR` twice.
#[tokio::test]
async fn a_lost_reply_makes_the_async_cluster_client_resend_the_command() {
    let cluster = RedisCluster::start_behind_proxies(3);
    let mut con = connect(&cluster).await;
    let proxy = cluster.proxy_for_key("{k}x");
    proxy.drop_reply_after(b"INCR");
    let returned: i64 = within(LIMIT, "INCR with a lost reply", con.incr("{k}x", 1))
        .await
        .expect("the cluster client hides the lost reply");
    assert_eq!(proxy.triggered(), 1);
    assert_eq!(returned, 2, "the call returned the second application");
    let stored: i64 = redis::cmd("GET")
        .arg("{k}x")
        .query(&mut cluster.node_for_key("{k}x").connection())
        .expect("GET on the node");
    assert_eq!(stored, 2, "INCR ran twice on the node");
}

/// The same for a script sent with `EVALSHA` (`redis::Script::invoke_async`, as redsem does):
/// the script is applied twice for one call.
#[tokio::test]
async fn a_lost_reply_makes_the_async_cluster_client_apply_a_script_twice() {
    let cluster = RedisCluster::start_behind_proxies(3);
    let mut con = connect(&cluster).await;
    let script = redis::Script::new("return redis.call('INCR', KEYS[1])");
    // Load it on the node first, so the armed EVALSHA is one that runs (not a NOSCRIPT).
    let first: i64 = within(
        LIMIT,
        "the first EVALSHA",
        script.key("{s}n").invoke_async(&mut con),
    )
    .await
    .expect("EVALSHA");
    assert_eq!(first, 1);

    let proxy = cluster.proxy_for_key("{s}n");
    proxy.drop_reply_after(b"EVALSHA");
    let returned: i64 = within(
        LIMIT,
        "EVALSHA with a lost reply",
        script.key("{s}n").invoke_async(&mut con),
    )
    .await
    .expect("the cluster client hides the lost reply");
    assert_eq!(proxy.triggered(), 1);
    assert_eq!(returned, 3, "the call returned the second application");
    let stored: i64 = redis::cmd("GET")
        .arg("{s}n")
        .query(&mut cluster.node_for_key("{s}n").connection())
        .expect("GET on the node");
    assert_eq!(stored, 3, "one call applied the script twice");
}

/// A slow reply, not a lost one: an attempt that exceeds the client's `response_timeout`
/// (150 ms here, against a 400 ms round trip) ran on the node, and its retry is queued
/// (`RetryMethod::RetryImmediately`, `Retry::MoveToPending`) but not sent: redis-rs 1.8.1 only
/// dispatches queued requests when its connection task is polled again, i.e. when another
/// request arrives. The caller keeps waiting (until `overall_response_timeout`, then it gets a
/// timeout error and the queued retry is dropped). Any other request on the same connection
/// releases the retry, which runs the command a second time and answers the first call.
#[tokio::test]
async fn a_timed_out_attempt_is_resent_when_the_next_request_comes_and_runs_twice() {
    let cluster = RedisCluster::start_behind_proxies(3);
    let client = redis::cluster::ClusterClientBuilder::new(cluster.urls())
        .response_timeout(Duration::from_millis(150))
        .overall_response_timeout(Some(Duration::from_secs(5)))
        .build()
        .expect("cluster client");
    let mut con = within(LIMIT, "connect", client.get_async_connection())
        .await
        .expect("connect");
    let proxy = cluster.proxy_for_key("{t}n");
    let elsewhere = ["foo", "bar", "a", "b", "c", "d"]
        .into_iter()
        .find(|key| cluster.proxy_for_key(key).port() != proxy.port())
        .expect("a key on another node");
    let node = cluster.node_for_key("{t}n");
    let stored = || -> Option<i64> {
        redis::cmd("GET")
            .arg("{t}n")
            .query(&mut node.connection())
            .expect("GET on the node")
    };

    proxy.set_delay(Duration::from_millis(200));
    let mut slow = con.clone();
    let incr = tokio::spawn(async move { slow.incr::<_, _, i64>("{t}n", 1).await });
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert!(
        !incr.is_finished(),
        "the slow INCR returned: {:?}",
        incr.await
    );
    assert_eq!(stored(), Some(1), "the first attempt ran, and only it");

    proxy.set_delay(Duration::ZERO);
    let _: Option<String> = within(LIMIT, "a GET on another node", con.get(elsewhere))
        .await
        .expect("GET on another node");
    let returned = within(LIMIT, "the slow INCR", incr)
        .await
        .expect("the INCR task")
        .expect("the INCR answered by its retry");
    assert_eq!(returned, 2, "the call returned the second application");
    assert_eq!(stored(), Some(2), "one call ran INCRBY twice");
}
