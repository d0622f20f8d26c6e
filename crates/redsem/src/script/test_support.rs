//! What the script tests share: a time limit for every wait, a wake channel, connections
//! to a throwaway server (one without channel rights), its pub/sub messages, and eviction.

use std::time::Duration;

use futures_util::StreamExt;
use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redsem_test::{RedisCluster, RedisServer, within};

use crate::error::{Error, Result};
use crate::session::Session;

/// How long any one wait of a script test may take before it fails.
pub(super) const LIMIT: Duration = Duration::from_secs(10);

/// The wake channel the tests' requests name.
pub(super) const CHANNEL: &str = "t:wake:test";

/// The session every call of the script tests is made in (its low mark stays 1: it never opens a
/// number itself, the calls name theirs).
pub(super) fn session() -> &'static Session {
    static SESSION: std::sync::LazyLock<std::sync::Arc<Session>> =
        std::sync::LazyLock::new(Session::new);
    &SESSION
}

/// A number of the test session that is the same for the same `name` (so that a call made
/// again under it is a resend).
pub(super) fn number(name: &str) -> u64 {
    name.bytes().fold(1_469_598_103u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(1_099_511)
    }) % 1_000_000_000
        + 1
}

/// Redis time in microseconds, read off the server.
pub(super) async fn server_micros(conn: &mut MultiplexedConnection) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    s * 1_000_000 + us
}

/// Redis time in milliseconds, as the scripts count it.
pub(super) async fn server_millis(conn: &mut MultiplexedConnection) -> i64 {
    i64::try_from(server_micros(conn).await / 1000).expect("a time in ms fits i64")
}

/// A connection to `server`.
pub(super) async fn connect(server: &RedisServer) -> MultiplexedConnection {
    within(
        LIMIT,
        "connect",
        server.client().get_multiplexed_async_connection(),
    )
    .await
    .expect("connect")
}

/// A connection to `cluster`.
pub(super) async fn connect_cluster(
    cluster: &RedisCluster,
) -> redis::cluster_async::ClusterConnection {
    let client = redis::cluster::ClusterClient::new(cluster.urls()).expect("cluster client");
    within(LIMIT, "cluster connect", client.get_async_connection())
        .await
        .expect("connect")
}

/// A connection as a user who may run every command on every key but publish to no channel
/// (`resetchannels`): every `PUBLISH` of a script is refused with `NOPERM`.
pub(super) async fn connect_without_channels(server: &RedisServer) -> MultiplexedConnection {
    let mut admin = connect(server).await;
    let () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "nochannels",
            "on",
            ">pw",
            "~*",
            "+@all",
            "resetchannels",
        ])
        .query_async(&mut admin)
        .await
        .expect("ACL SETUSER");
    let url = format!("redis://nochannels:pw@127.0.0.1:{}/", server.port());
    let client = redis::Client::open(url).expect("url");
    within(LIMIT, "connect", client.get_multiplexed_async_connection())
        .await
        .expect("connect as the user without channels")
}

/// A pub/sub connection to `server`, subscribed to `channel`.
pub(super) async fn subscribe(server: &RedisServer, channel: &str) -> redis::aio::PubSub {
    let mut pubsub = within(LIMIT, "pubsub", server.client().get_async_pubsub())
        .await
        .expect("pubsub");
    within(LIMIT, "subscribe", pubsub.subscribe(channel))
        .await
        .expect("subscribe");
    pubsub
}

/// The next message's payload.
pub(super) async fn next_message(pubsub: &mut redis::aio::PubSub) -> String {
    let msg = within(LIMIT, "a message", pubsub.on_message().next())
        .await
        .expect("a message");
    msg.get_payload().expect("payload")
}

/// `SCRIPT LOAD` of `script`: a pipeline or a `MULTI` runs a script by `EVALSHA` alone, and
/// does not send it again on `NOSCRIPT`.
pub(super) async fn load_script(conn: &mut MultiplexedConnection, script: &redis::Script) {
    let _: String = script
        .prepare_invoke()
        .load_async(conn)
        .await
        .expect("SCRIPT LOAD");
}

/// The key's `PTTL`.
pub(super) async fn pttl(conn: &mut MultiplexedConnection, key: &str) -> i64 {
    conn.pttl(key).await.expect("PTTL")
}

/// `INFO` field `name` of section `section`, as a number.
async fn info_number(conn: &mut MultiplexedConnection, section: &str, name: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .and_then(|v| v.trim().parse().ok())
        .expect("an INFO field")
}

/// Limit the server's memory to what it uses plus a megabyte, then write filler keys with
/// a TTL (candidates for `volatile-*` eviction) until `evictions` keys were evicted.
pub(super) async fn evict_by_filling(conn: &mut MultiplexedConnection, evictions: u64) {
    let used = info_number(conn, "memory", "used_memory").await;
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(used + 1_000_000)
        .query_async(conn)
        .await
        .expect("CONFIG SET maxmemory");
    let filler = "x".repeat(1000);
    within(LIMIT, "filling until keys are evicted", async {
        let mut n = 0_u64;
        while info_number(conn, "stats", "evicted_keys").await < evictions {
            let mut pipe = redis::pipe();
            for _ in 0..200 {
                n += 1;
                pipe.cmd("SET")
                    .arg(format!("filler:{n}"))
                    .arg(&filler)
                    .arg("EX")
                    .arg(3600)
                    .ignore();
            }
            let () = pipe.query_async(conn).await.expect("fillers");
        }
    })
    .await;
}

/// Clear the keys `all` and put a list at `key`, one of them: a value of a type that no
/// primitive keeps at any of its keys.
pub(super) async fn only_a_foreign_list_at(
    conn: &mut MultiplexedConnection,
    all: &[String],
    key: &str,
) {
    let _: () = conn.del(all).await.expect("del");
    let _: () = conn.rpush(key, "foreign").await.expect("rpush");
}

/// Assert that each `(script, result)` is the [`Error::WrongType`] that names `key`, the
/// primitive's key `#i`, where the test put a foreign value.
#[track_caller]
pub(super) fn assert_wrong_type(results: Vec<(&str, Result<()>)>, key: &str, i: usize) {
    for (script, result) in results {
        match result {
            Err(Error::WrongType { key: got, .. }) => assert_eq!(got, key, "{script}"),
            other => panic!("{script} on foreign key #{i}: {other:?}"),
        }
    }
}

/// A script that writes the Redis time (ms) as the score of member `ARGV[1]` in the zset
/// `KEYS[1]` and as the field `ARGV[2]` of the hash `KEYS[2]` (a lease end and the hint that
/// says when the first one falls due).
const PLANT_NOW: &str = "local t = redis.call('TIME') \
    local now = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000)) \
    redis.call('ZADD', KEYS[1], now, ARGV[1]) \
    redis.call('HSET', KEYS[2], ARGV[2], now) \
    return now";

/// A MULTI that first makes `member`'s end in `zset` and the field `field` of `hash` the Redis
/// time: the call added after it then runs in that millisecond or one just after, which is
/// how a test reaches a boundary of "now" (`<=` against `<`, a time read 5 ms off). The
/// first reply is the time planted.
pub(super) fn plant_now(zset: &str, member: &str, hash: &str, field: &str) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("EVAL")
        .arg(PLANT_NOW)
        .arg(2)
        .arg(zset)
        .arg(hash)
        .arg(member)
        .arg(field);
    pipe
}
