//! Tests of `RedisSentinels`: the deployment starts with the sentinels agreeing on the primary,
//! a forced failover and a killed primary both end with every sentinel naming a new one.

use std::time::Duration;

use redis::Commands;
use redsem_test::RedisSentinels;

fn role(port: u16) -> String {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("url");
    let mut con = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .expect("connect");
    let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut con).expect("ROLE");
    redis::from_redis_value(role[0].clone()).expect("ROLE's first element")
}

#[test]
fn a_forced_failover_moves_the_primary_to_a_replica_that_has_the_data() {
    let deployment = RedisSentinels::start();
    let first = deployment.primary().port();
    assert_eq!(first, deployment.nodes()[0].port());
    assert_eq!(deployment.sentinel_urls().len(), 3);
    assert!(
        deployment.url().starts_with("redis+sentinel://127.0.0.1:"),
        "{}",
        deployment.url()
    );
    assert!(deployment.url().ends_with(deployment.master_name()));
    let () = deployment
        .primary()
        .connection()
        .set("before", "1")
        .expect("SET");
    for replica in &deployment.nodes()[1..] {
        replica.wait_replicated_from(deployment.primary());
    }

    let second = deployment.failover();
    assert_ne!(second, first);
    assert_eq!(deployment.primary().port(), second);
    assert_eq!(role(second), "master");
    let value: Option<String> = deployment
        .primary()
        .connection()
        .get("before")
        .expect("GET");
    assert_eq!(value.as_deref(), Some("1"));
}

#[test]
fn a_killed_primary_is_replaced_by_the_sentinels() {
    let mut deployment = RedisSentinels::start();
    let old = deployment.kill_primary();
    let new = deployment.wait_new_primary_within(old, Duration::from_secs(30));
    assert_ne!(new, old);
    assert_eq!(role(new), "master");
    let () = deployment
        .primary()
        .connection()
        .set("after", "1")
        .expect("the new primary takes writes");
}
