//! Every latch script called directly, with raw KEYS and ARGV, on a throwaway server. (The
//! cluster test of the latch scripts is `counter_scripts_run_on_a_three_master_cluster`, with
//! the permit scripts' tests.)

use std::time::Duration;

use redis::AsyncCommands;
use redsem_test::RedisServer;

use super::*;
use crate::script::test_support::{
    assert_wrong_type, connect, connect_without_channels, evict_by_filling, next_message, pttl,
    server_millis, subscribe,
};

fn lk() -> LatchKeys {
    LatchKeys::new("t", "l")
}

#[tokio::test]
async fn a_latch_counts_down_once_per_request_and_publishes_at_zero() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = lk();
    let mut pubsub = subscribe(&server, &k.channel).await;
    assert_eq!(
        latch_state(&mut conn, &k).await.expect("state"),
        RawLatchState::Never
    );
    assert!(latch_try_set(&mut conn, &k, "s1", 3).await.expect("set"));
    assert!(latch_try_set(&mut conn, &k, "s1", 3).await.expect("repeat"));
    assert!(!latch_try_set(&mut conn, &k, "s2", 9).await.expect("set"));
    let (shared, shared_keys) = (conn.clone(), k.clone());
    let down = move |id: &'static str| {
        let mut conn = shared.clone();
        let k = shared_keys.clone();
        async move {
            latch_count_down(&mut conn, &k, id)
                .await
                .expect("count_down")
        }
    };
    assert_eq!(down("c1").await, CountDown::Counted(2));
    assert_eq!(
        down("c1").await,
        CountDown::Repeated(2),
        "retried: applied once"
    );
    assert_eq!(down("c2").await, CountDown::Counted(1));
    assert_eq!(down("c3").await, CountDown::Counted(0));
    assert_eq!(next_message(&mut pubsub).await, "opened");
    assert_eq!(down("c3").await, CountDown::Repeated(0));
    assert_eq!(down("c4").await, CountDown::Absent);
    assert_eq!(
        latch_state(&mut conn, &k).await.expect("state"),
        RawLatchState::Done
    );
    let exists: bool = conn.exists(&k.all[0]).await.expect("exists");
    assert!(!exists, "the count key is gone at zero");
    let ttl: i64 = conn.pttl(&k.all[1]).await.expect("pttl");
    assert!(ttl > 3_590_000 && ttl <= 3_600_000, "done marker ttl {ttl}");

    // An opened latch can be set again; deleting a counting one wakes its waiters.
    assert!(latch_try_set(&mut conn, &k, "s3", 2).await.expect("set"));
    assert_eq!(
        latch_state(&mut conn, &k).await.expect("state"),
        RawLatchState::Counting(2)
    );
    assert!(latch_delete(&mut conn, &k).await.expect("delete"));
    assert_eq!(next_message(&mut pubsub).await, "opened");
    assert!(!latch_delete(&mut conn, &k).await.expect("delete"));
    assert_eq!(
        latch_state(&mut conn, &k).await.expect("state"),
        RawLatchState::Never
    );
    let left: usize = conn.exists(&k.all[..]).await.expect("exists");
    assert_eq!(left, 0);
}

#[tokio::test]
async fn every_latch_script_reports_a_foreign_key_and_leaves_it_alone() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = lk();
    for (i, key) in k.all.iter().enumerate() {
        let _: () = conn.del(&k.all[..]).await.expect("del");
        let _: () = conn.rpush(key, "foreign").await.expect("rpush");
        let mut conn2 = conn.clone();
        let results: Vec<(&str, Result<()>)> = vec![
            (
                "try_set",
                latch_try_set(&mut conn2, &k, "r", 1).await.map(drop),
            ),
            (
                "count_down",
                latch_count_down(&mut conn2, &k, "r").await.map(drop),
            ),
            ("state", latch_state(&mut conn2, &k).await.map(drop)),
            ("delete", latch_delete(&mut conn2, &k).await.map(drop)),
        ];
        assert_wrong_type(results, key, i);
        let value: Vec<String> = conn.lrange(key, 0, -1).await.expect("lrange");
        assert_eq!(value, ["foreign"], "key #{i} was overwritten");
    }
}

// ----- Faults of issue 9: resent calls, failures after a write, eviction.

#[tokio::test]
async fn every_mutating_latch_script_repeated_with_its_id_is_applied_once() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let l = lk();
    assert!(latch_try_set(&mut conn, &l, "s", 2).await.expect("set"));
    assert!(latch_try_set(&mut conn, &l, "s", 2).await.expect("resent"));
    assert_eq!(
        latch_count_down(&mut conn, &l, "c").await.expect("down"),
        CountDown::Counted(1)
    );
    assert_eq!(
        latch_count_down(&mut conn, &l, "c").await.expect("resent"),
        CountDown::Repeated(1)
    );
}

#[tokio::test]
async fn a_count_down_whose_publish_is_refused_by_acl_is_applied_and_opens_the_latch() {
    let server = RedisServer::start();
    let mut admin = connect(&server).await;
    let mut conn = connect_without_channels(&server).await;
    let l = lk();
    assert!(latch_try_set(&mut conn, &l, "s", 1).await.expect("set"));
    let down = latch_count_down(&mut conn, &l, "c").await;
    println!("count_down with a refused PUBLISH: {down:?}");
    assert_eq!(
        down.expect("the count-down is applied"),
        CountDown::Counted(0)
    );
    assert_eq!(
        latch_state(&mut admin, &l).await.expect("state"),
        RawLatchState::Done
    );
    assert!(latch_try_set(&mut conn, &l, "s2", 1).await.expect("set"));
    assert!(latch_delete(&mut conn, &l).await.expect("delete"));
}

#[tokio::test]
async fn a_counting_latch_keeps_its_applied_ids_through_volatile_lru_eviction() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "volatile-lru"]);
    let mut conn = connect(&server).await;
    let l = lk();
    assert!(latch_try_set(&mut conn, &l, "s", 3).await.expect("set"));
    assert_eq!(
        latch_count_down(&mut conn, &l, "c1").await.expect("down"),
        CountDown::Counted(2)
    );
    let ttl = pttl(&mut conn, &l.all[2]).await;
    println!("PTTL of a counting latch's applied ids: {ttl}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    evict_by_filling(&mut conn, 5000).await;
    let resent = latch_count_down(&mut conn, &l, "c1").await.expect("resent");
    println!("a count-down resent after the evictions: {resent:?}");
    assert_eq!(resent, CountDown::Repeated(2));
    assert_eq!(ttl, -1);
    // Opened: the ids are idle state and expire. (No memory limit any more, or the key
    // would be evicted the moment it gets its TTL.)
    let () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "0"])
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET");
    latch_count_down(&mut conn, &l, "c2").await.expect("down");
    latch_count_down(&mut conn, &l, "c3").await.expect("down");
    assert!(pttl(&mut conn, &l.all[2]).await > 0);
}

#[tokio::test]
async fn the_last_count_down_meeting_a_foreign_done_key_reports_it_and_opens_nothing() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = lk();
    assert!(latch_try_set(&mut conn, &k, "s", 1).await.expect("set"));
    let _: () = conn.rpush(&k.all[1], "foreign").await.expect("rpush");
    let result = latch_count_down(&mut conn, &k, "r").await.map(drop);
    assert_wrong_type(vec![("count_down", result)], &k.all[1], 1);
    let value: Vec<String> = conn.lrange(&k.all[1], 0, -1).await.expect("lrange");
    assert_eq!(value, ["foreign"], "left alone");
    let count: i64 = conn.get(&k.all[0]).await.expect("get");
    assert_eq!(count, 1, "still counting");
}

#[tokio::test]
async fn an_opened_latch_remembers_its_ids_for_a_minute_from_its_redis_time() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = lk();
    assert!(latch_try_set(&mut conn, &k, "s", 1).await.expect("set"));
    let before = server_millis(&mut conn).await;
    latch_count_down(&mut conn, &k, "r")
        .await
        .expect("count down");
    let after = server_millis(&mut conn).await;
    let at: i64 = redis::cmd("PEXPIRETIME")
        .arg(&k.all[2])
        .query_async(&mut conn)
        .await
        .expect("PEXPIRETIME");
    assert!(
        (before + 60_000..=after + 60_000).contains(&at),
        "{at} is not a minute after {before}..{after}"
    );
}
