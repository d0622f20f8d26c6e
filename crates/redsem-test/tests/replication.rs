//! Tests of the replication helpers of `RedisServer`, for failover tests.

use redis::Commands;
use redsem_test::RedisServer;

fn get(server: &RedisServer, key: &str) -> Option<String> {
    server.connection().get(key).expect("GET")
}

fn role(server: &RedisServer) -> String {
    let info = server.info("replication");
    info.lines()
        .find_map(|line| line.trim().strip_prefix("role:").map(str::to_owned))
        .unwrap_or_else(|| panic!("no role in INFO replication:\n{info}"))
}

#[test]
fn a_replica_starts_synced_and_catches_up_with_every_write() {
    let primary = RedisServer::start();
    let () = primary.connection().set("before", "1").expect("SET");
    let replica = RedisServer::start_replica_of(&primary);
    assert_eq!(role(&replica), "slave");
    // The initial sync is complete when start_replica_of returns.
    assert_eq!(get(&replica, "before").as_deref(), Some("1"));

    let mut con = primary.connection();
    let mut pipe = redis::pipe();
    for n in 0..2000 {
        pipe.set(format!("k{n}"), "x".repeat(100)).ignore();
    }
    let () = pipe.query(&mut con).expect("2000 SETs");
    let () = con.set("last", "yes").expect("SET last");
    replica.wait_replicated_from(&primary);
    // No polling here: wait_replicated_from must not return before the last write arrived.
    assert_eq!(get(&replica, "last").as_deref(), Some("yes"));
    let size: usize = redis::cmd("DBSIZE")
        .query(&mut replica.connection())
        .expect("DBSIZE");
    assert_eq!(size, 2002);

    let refused: redis::RedisResult<()> = replica.connection().set("w", "1");
    let err = refused.expect_err("a replica accepted a write");
    assert!(err.to_string().contains("read only replica"), "{err}");
}

/// `CLIENT PAUSE <ms> WRITE` on a replica holds back the replication stream: the replica reads
/// it but applies nothing until the pause ends.
fn pause_writes(replica: &RedisServer, ms: u64) {
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(ms)
        .arg("WRITE")
        .query(&mut replica.connection())
        .expect("CLIENT PAUSE on the replica");
}

#[test]
fn wait_replicated_from_waits_for_a_replica_that_lags() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary);
    pause_writes(&replica, 500);
    let () = primary.connection().set("k", "v").expect("SET");
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(
        get(&replica, "k"),
        None,
        "the paused replica applied the write"
    );
    replica.wait_replicated_from(&primary);
    assert_eq!(get(&replica, "k").as_deref(), Some("v"));
}

#[test]
fn a_replica_promoted_while_paused_drops_the_writes_it_held_back() {
    let mut primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary);
    let () = primary.connection().set("k", "1").expect("SET k 1");
    replica.wait_replicated_from(&primary);

    pause_writes(&replica, 60_000);
    let () = primary.connection().set("k", "2").expect("SET k 2");
    replica.promote();
    primary.stop();
    let () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut replica.connection())
        .expect("CLIENT UNPAUSE");
    assert_eq!(get(&replica, "k").as_deref(), Some("1"));
    let () = replica
        .connection()
        .set("k", "3")
        .expect("SET on the new primary");
    assert_eq!(get(&replica, "k").as_deref(), Some("3"));
}

#[test]
fn a_promoted_replica_takes_writes_and_misses_what_the_old_primary_took_after() {
    let mut primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary);
    let () = primary.connection().set("k", "1").expect("SET k 1");
    replica.wait_replicated_from(&primary);

    replica.promote();
    assert_eq!(role(&replica), "master");
    // The "last write": acknowledged by the old primary after the failover began.
    let () = primary
        .connection()
        .set("k", "2")
        .expect("SET k 2 on the old primary");
    let () = primary.connection().set("late", "x").expect("SET late");
    primary.stop();

    assert_eq!(get(&replica, "k").as_deref(), Some("1"));
    assert_eq!(get(&replica, "late"), None);
    let () = replica
        .connection()
        .set("after", "ok")
        .expect("the promoted replica takes writes");
    assert_eq!(get(&replica, "after").as_deref(), Some("ok"));
}

#[test]
fn flushall_empties_every_database() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let () = con.set("a", 1).expect("SET");
    let () = redis::cmd("SELECT")
        .arg(3)
        .query(&mut con)
        .expect("SELECT 3");
    let () = con.set("b", 1).expect("SET in db 3");
    server.flushall();
    let size: usize = redis::cmd("DBSIZE").query(&mut con).expect("DBSIZE");
    assert_eq!(size, 0);
    assert_eq!(get(&server, "a"), None);
}

#[test]
#[should_panic(expected = "is not a replica of")]
fn waiting_on_a_server_that_is_not_a_replica_says_so() {
    let primary = RedisServer::start();
    let other = RedisServer::start();
    other.wait_replicated_from(&primary);
}
