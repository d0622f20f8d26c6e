//! Tests of the eviction helpers of `RedisServer`.

use redis::Commands;
use redsem_test::RedisServer;

fn config(server: &RedisServer, name: &str) -> String {
    let (_, value): (String, String) = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query(&mut server.connection())
        .expect("CONFIG GET");
    value
}

#[test]
fn a_volatile_policy_evicts_keys_with_a_ttl_and_keeps_the_others() {
    let server = RedisServer::start_with_eviction("volatile-lru", "2mb");
    assert_eq!(config(&server, "maxmemory-policy"), "volatile-lru");
    assert_eq!(config(&server, "maxmemory"), (2 * 1024 * 1024).to_string());
    let mut con = server.connection();
    let () = con.set("keep", "no ttl").expect("SET keep");
    assert_eq!(server.evicted_keys(), 0);

    let evicted = server.fill_until_evicting(true);
    assert!(evicted > 0, "evicted_keys {evicted}");
    // Redis 7 may go on evicting from its timer after the write that crossed the limit, so
    // the count can only have grown since the helper read it.
    let after = server.evicted_keys();
    assert!(
        after >= evicted,
        "evicted_keys went from {evicted} to {after}"
    );
    let kept: Option<String> = con.get("keep").expect("GET keep");
    assert_eq!(kept.as_deref(), Some("no ttl"));
}

#[test]
fn an_allkeys_policy_evicts_keys_without_a_ttl() {
    let server = RedisServer::start_with_eviction("allkeys-lru", "2mb");
    // Every filler key is written without a TTL: whatever is evicted had none.
    let evicted = server.fill_until_evicting(false);
    assert!(evicted > 0, "evicted_keys {evicted}");
    let mut con = server.connection();
    let some: String = redis::cmd("RANDOMKEY").query(&mut con).expect("RANDOMKEY");
    let ttl: i64 = con.ttl(&some).expect("TTL");
    assert_eq!(ttl, -1, "{some} has a TTL");
}

#[test]
#[should_panic(expected = "the eviction policy has no key it may evict")]
fn filling_without_ttl_under_a_volatile_policy_reports_the_refused_write() {
    let server = RedisServer::start_with_eviction("volatile-lru", "2mb");
    server.fill_until_evicting(false);
}
