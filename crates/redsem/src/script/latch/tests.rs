//! Every latch script called directly, with raw KEYS and ARGV, on a throwaway server. (The
//! cluster test of the latch scripts is `counter_scripts_run_on_a_three_master_cluster`, with
//! the permit scripts' tests.)

use std::sync::Arc;
use std::time::Duration;

use redis::AsyncCommands;
use redis::Value;
use redis::aio::MultiplexedConnection;
use redsem_test::{RedisServer, within};

use super::*;
use crate::script::library::LATCH_COUNT_DOWN;
use crate::script::test_support::{
    LIMIT, assert_wrong_type, connect, connect_without_channels, evict_by_filling, next_message,
    number, pttl, server_millis, session, subscribe,
};
use crate::session::{Hex, Session};

fn lk() -> LatchKeys {
    LatchKeys::new("t", "l")
}

/// Set the latch to `count` by a call of session `s` (which is answered).
async fn set_in(conn: &mut MultiplexedConnection, k: &LatchKeys, s: &Arc<Session>, count: u64) {
    let seq = s.open();
    assert!(
        latch_try_set(conn, k, count, Caller::new(s, seq.n()))
            .await
            .expect("set")
    );
}

/// The call `name` of the test session (the same name: the same call, resent).
fn caller(name: &str) -> Caller<'static> {
    Caller::new(session(), number(name))
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
    assert!(
        latch_try_set(&mut conn, &k, 3, caller("s1"))
            .await
            .expect("set")
    );
    assert!(
        latch_try_set(&mut conn, &k, 3, caller("s1"))
            .await
            .expect("repeat")
    );
    assert!(
        !latch_try_set(&mut conn, &k, 9, caller("s2"))
            .await
            .expect("set")
    );
    let (shared, shared_keys) = (conn.clone(), k.clone());
    let down = move |id: &'static str| {
        let mut conn = shared.clone();
        let k = shared_keys.clone();
        async move {
            latch_count_down(&mut conn, &k, caller(id))
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
    assert!(
        latch_try_set(&mut conn, &k, 2, caller("s3"))
            .await
            .expect("set")
    );
    assert_eq!(
        latch_state(&mut conn, &k).await.expect("state"),
        RawLatchState::Counting(2)
    );
    assert!(latch_delete(&mut conn, &k).await.expect("delete"));
    assert_eq!(next_message(&mut pubsub).await, "opened");
    assert_eq!(
        latch_state(&mut conn, &k).await.expect("state"),
        RawLatchState::Deleted,
        "deleted while counting"
    );
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
                latch_try_set(&mut conn2, &k, 1, caller("r"))
                    .await
                    .map(drop),
            ),
            (
                "count_down",
                latch_count_down(&mut conn2, &k, caller("r"))
                    .await
                    .map(drop),
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
    assert!(
        latch_try_set(&mut conn, &l, 2, caller("s"))
            .await
            .expect("set")
    );
    assert!(
        latch_try_set(&mut conn, &l, 2, caller("s"))
            .await
            .expect("resent")
    );
    assert_eq!(
        latch_count_down(&mut conn, &l, caller("c"))
            .await
            .expect("down"),
        CountDown::Counted(1)
    );
    assert_eq!(
        latch_count_down(&mut conn, &l, caller("c"))
            .await
            .expect("resent"),
        CountDown::Repeated(1)
    );
}

#[tokio::test]
async fn a_count_down_whose_publish_is_refused_by_acl_is_applied_and_opens_the_latch() {
    let server = RedisServer::start();
    let mut admin = connect(&server).await;
    let mut conn = connect_without_channels(&server).await;
    let l = lk();
    assert!(
        latch_try_set(&mut conn, &l, 1, caller("s"))
            .await
            .expect("set")
    );
    let down = latch_count_down(&mut conn, &l, caller("c")).await;
    println!("count_down with a refused PUBLISH: {down:?}");
    assert_eq!(
        down.expect("the count-down is applied"),
        CountDown::Counted(0)
    );
    assert_eq!(
        latch_state(&mut admin, &l).await.expect("state"),
        RawLatchState::Done
    );
    assert!(
        latch_try_set(&mut conn, &l, 1, caller("s2"))
            .await
            .expect("set")
    );
    assert!(latch_delete(&mut conn, &l).await.expect("delete"));
}

#[tokio::test]
async fn a_counting_latch_keeps_its_session_records_through_volatile_lru_eviction() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "volatile-lru"]);
    let mut conn = connect(&server).await;
    let l = lk();
    assert!(
        latch_try_set(&mut conn, &l, 3, caller("s"))
            .await
            .expect("set")
    );
    assert_eq!(
        latch_count_down(&mut conn, &l, caller("c1"))
            .await
            .expect("down"),
        CountDown::Counted(2)
    );
    let ttls = [
        pttl(&mut conn, &l.all[2]).await,
        pttl(&mut conn, &l.all[3]).await,
    ];
    println!("PTTL of a counting latch's session index and records: {ttls:?}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    evict_by_filling(&mut conn, 5000).await;
    let resent = latch_count_down(&mut conn, &l, caller("c1"))
        .await
        .expect("resent");
    println!("a count-down resent after the evictions: {resent:?}");
    assert_eq!(resent, CountDown::Repeated(2));
    assert_eq!(ttls, [-1, -1]);
    // Opened: the records are idle state and expire. (No memory limit any more, or the keys
    // would be evicted the moment they get their TTL.)
    let () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "0"])
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET");
    latch_count_down(&mut conn, &l, caller("c2"))
        .await
        .expect("down");
    latch_count_down(&mut conn, &l, caller("c3"))
        .await
        .expect("down");
    assert!(pttl(&mut conn, &l.all[2]).await > 0);
    assert!(pttl(&mut conn, &l.all[3]).await > 0);
    // Set again: they stop expiring.
    assert!(
        latch_try_set(&mut conn, &l, 1, caller("s2"))
            .await
            .expect("set")
    );
    assert_eq!(pttl(&mut conn, &l.all[2]).await, -1);
    assert_eq!(pttl(&mut conn, &l.all[3]).await, -1);
}

#[tokio::test]
async fn the_last_count_down_meeting_a_foreign_done_key_reports_it_and_opens_nothing() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = lk();
    assert!(
        latch_try_set(&mut conn, &k, 1, caller("s"))
            .await
            .expect("set")
    );
    let _: () = conn.rpush(&k.all[1], "foreign").await.expect("rpush");
    let result = latch_count_down(&mut conn, &k, caller("r")).await.map(drop);
    assert_wrong_type(vec![("count_down", result)], &k.all[1], 1);
    let value: Vec<String> = conn.lrange(&k.all[1], 0, -1).await.expect("lrange");
    assert_eq!(value, ["foreign"], "left alone");
    let count: i64 = conn.get(&k.all[0]).await.expect("get");
    assert_eq!(count, 1, "still counting");
}

#[tokio::test]
async fn an_opened_latch_keeps_its_session_records_ten_minutes_from_its_redis_time() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = lk();
    assert!(
        latch_try_set(&mut conn, &k, 1, caller("s"))
            .await
            .expect("set")
    );
    let before = server_millis(&mut conn).await;
    latch_count_down(&mut conn, &k, caller("r"))
        .await
        .expect("count down");
    let after = server_millis(&mut conn).await;
    for key in &k.all[2..] {
        let at: i64 = redis::cmd("PEXPIRETIME")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("PEXPIRETIME");
        assert!(
            (before + 600_000..=after + 600_000).contains(&at),
            "{key}: {at} is not ten minutes after {before}..{after}"
        );
    }
    // A resend of the count-down that opened it, within that time, finds its mark.
    assert_eq!(
        latch_count_down(&mut conn, &k, caller("r"))
            .await
            .expect("resent"),
        CountDown::Repeated(0)
    );
    assert_eq!(
        latch_count_down(&mut conn, &k, caller("r2"))
            .await
            .expect("new"),
        CountDown::Absent
    );
}

#[tokio::test]
async fn a_late_copy_of_a_count_down_answered_is_never_applied() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = lk();
    let s = Session::new();
    set_in(&mut conn, &k, &s, 5).await;
    let first = s.open();
    let n = first.n();
    assert_eq!(
        latch_count_down(&mut conn, &k, Caller::new(&s, n))
            .await
            .expect("down"),
        CountDown::Counted(4)
    );
    drop(first);
    // The next call carries a low mark above the first's number: its mark goes.
    let second = s.open();
    assert_eq!(
        latch_count_down(&mut conn, &k, Caller::new(&s, second.n()))
            .await
            .expect("down"),
        CountDown::Counted(3)
    );
    let record: String = conn
        .hget(&k.all[3], format!("s:{}", s.id()))
        .await
        .expect("hget");
    assert!(
        !record.contains(&format!(",{}=", Hex(n))),
        "the first call's mark went: {record}"
    );
    // A late copy of the first (below the low mark) changes nothing, nor of a try_set.
    assert_eq!(
        latch_count_down(&mut conn, &k, Caller::new(&s, n))
            .await
            .expect("late copy"),
        CountDown::Repeated(3)
    );
    let count: i64 = conn.get(&k.all[0]).await.expect("get");
    assert_eq!(count, 3);
    assert!(
        latch_try_set(&mut conn, &k, 9, Caller::new(&s, n))
            .await
            .expect("late copy")
    );
    let _: () = conn.del(&k.all[0]).await.expect("del");
    assert!(
        latch_try_set(&mut conn, &k, 9, Caller::new(&s, n))
            .await
            .expect("late copy")
    );
    let count: Option<i64> = conn.get(&k.all[0]).await.expect("get");
    assert_eq!(count, None, "a late copy of a try_set sets nothing");
}

#[tokio::test]
async fn a_latch_keeps_one_small_record_per_session_however_many_calls_it_made() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = lk();
    let s = Session::new();
    set_in(&mut conn, &k, &s, 1000).await;
    for left in (500..1000).rev() {
        let seq = s.open();
        assert_eq!(
            latch_count_down(&mut conn, &k, Caller::new(&s, seq.n()))
                .await
                .expect("down"),
            CountDown::Counted(left)
        );
    }
    let records: Vec<(String, String)> = conn.hgetall(&k.all[3]).await.expect("hgetall");
    let index: Vec<(String, f64)> = conn
        .zrange_withscores(&k.all[2], 0, -1)
        .await
        .expect("zrange");
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(index.len(), 1, "{index:?}");
    assert_eq!(records[0].0, format!("s:{}", s.id()));
    assert_eq!(index[0].0, records[0].0);
    assert!(
        records[0].1.len() < 64,
        "one mark at most: {}",
        records[0].1
    );
}

#[tokio::test]
async fn the_records_of_sessions_gone_quiet_are_pruned_and_live_ones_kept() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = lk();
    assert!(
        latch_try_set(&mut conn, &k, 1_000_000, caller("s"))
            .await
            .expect("set")
    );
    // A session record past its expiry, and an id left by a client of layout 1.
    let () = redis::pipe()
        .hset(&k.all[3], "s:gone", "1|1000|1|,1=C")
        .zadd(&k.all[2], "s:gone", 1000)
        .zadd(&k.all[2], "layout-1-id", 2000)
        .query_async(&mut conn)
        .await
        .expect("seed");
    // About one call in 16 prunes (by the time's low bits): count down until one has.
    let mut calls = 0;
    within(LIMIT, "a prune", async {
        loop {
            calls += 1;
            latch_count_down(&mut conn, &k, caller(&format!("c{calls}")))
                .await
                .expect("down");
            let left: Vec<String> = conn.zrange(&k.all[2], 0, -1).await.expect("zrange");
            if !left.iter().any(|m| m == "s:gone" || m == "layout-1-id") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    println!("pruned after {calls} count-downs");
    let gone: Option<String> = conn.hget(&k.all[3], "s:gone").await.expect("hget");
    assert_eq!(gone, None, "the record went with its index entry");
    let live: Option<String> = conn
        .hget(&k.all[3], format!("s:{}", session().id()))
        .await
        .expect("hget");
    assert!(live.is_some(), "the live session's record is kept");
}

#[tokio::test]
async fn a_thousand_records_due_at_once_are_all_pruned() {
    // One prune drops up to 1,000 records, written back in one HDEL slice. (Kills the
    // write-back's slices leaving one name out of each.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = lk();
    assert!(
        latch_try_set(&mut conn, &k, 1_000_000, caller("s"))
            .await
            .expect("set")
    );
    let mut pipe = redis::pipe();
    for i in 0..1_000 {
        let name = format!("s:old{i}");
        pipe.hset(&k.all[3], &name, "1|1|0|")
            .ignore()
            .zadd(&k.all[2], &name, 1 + i)
            .ignore();
    }
    let () = within(LIMIT, "bury", pipe.query_async(&mut conn))
        .await
        .expect("bury");
    let mut calls = 0;
    within(LIMIT, "a prune", async {
        loop {
            calls += 1;
            latch_count_down(&mut conn, &k, caller(&format!("c{calls}")))
                .await
                .expect("down");
            let left: usize = conn.zcard(&k.all[2]).await.expect("zcard");
            if left == 1 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    let records: usize = conn.hlen(&k.all[3]).await.expect("hlen");
    assert_eq!(records, 1, "only the live session's record is left");
}

#[tokio::test]
async fn a_record_is_pruned_only_once_its_expiry_has_passed() {
    // A record whose expiry is a few ms ahead (planted in the same MULTI as the call) is
    // kept by a prune in that call. (Kills the prune taking records due within 5 ms.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let edge = edge_at_the_first_prune(&mut conn, 3).await;
    assert!(edge.is_some(), "a record not yet expired was pruned");
}

/// Count down a latch (each call in one MULTI with a script that plants two session
/// records: `s:old`, long expired, and `s:edge`, expiring `offset` ms from the call's own
/// time) until a call prunes (`s:old` gone): `s:edge`'s index entry then, if kept.
async fn edge_at_the_first_prune(conn: &mut MultiplexedConnection, offset: i64) -> Option<f64> {
    let k = lk();
    assert!(
        latch_try_set(conn, &k, 1_000_000, caller("s"))
            .await
            .expect("set")
    );
    let _: String = LATCH_COUNT_DOWN
        .script()
        .prepare_invoke()
        .load_async(conn)
        .await
        .expect("SCRIPT LOAD");
    let plant = redis::Script::new(
        r"local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), 's:edge', 1, 's:old')
        redis.call('HSET', KEYS[2], 's:edge', '1|1|0|', 's:old', '1|1|0|')
        return now",
    );
    let _: String = plant
        .prepare_invoke()
        .load_async(conn)
        .await
        .expect("SCRIPT LOAD");
    for round in 0..2_000 {
        let seq = number(&format!("round {round}"));
        let (_, _): (i64, Value) = within(
            LIMIT,
            "plant and count down",
            redis::pipe()
                .atomic()
                .invoke_script(plant.key(&k.all[2]).key(&k.all[3]).arg(offset))
                .invoke_script(
                    LATCH_COUNT_DOWN
                        .script()
                        .key(&k.all[..])
                        .arg(Hex(seq))
                        .arg(session().id())
                        .arg(Hex(session().low()))
                        .arg(&k.channel),
                )
                .query_async(conn),
        )
        .await
        .expect("exec");
        let old: Option<f64> = conn.zscore(&k.all[2], "s:old").await.expect("zscore");
        if old.is_none() {
            return conn.zscore(&k.all[2], "s:edge").await.expect("zscore");
        }
    }
    panic!("no call pruned in 2,000 rounds");
}

#[tokio::test]
async fn a_count_redis_cannot_count_down_is_reported_as_foreign_and_left_alone() {
    // "007" reads as 7 to Lua but DECR refuses it: the latch takes it for a foreign value.
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = lk();
    let () = conn.set(&k.all[0], "007").await.expect("set");
    let result = latch_count_down(&mut conn, &k, caller("c")).await.map(drop);
    assert_wrong_type(vec![("count_down", result)], &k.all[0], 0);
    let count: String = conn.get(&k.all[0]).await.expect("get");
    assert_eq!(count, "007", "left alone");
}

#[tokio::test]
async fn a_count_down_that_does_not_open_the_latch_leaves_a_foreign_done_key_to_the_one_that_does()
{
    // The done key is read (type-checked) only by a count-down that may write it: the last.
    // Earlier ones count down past a foreign value there. (Kills the done key read by every
    // count-down.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = lk();
    assert!(
        latch_try_set(&mut conn, &k, 3, caller("s"))
            .await
            .expect("set")
    );
    let () = conn.rpush(&k.all[1], "foreign").await.expect("rpush");
    assert_eq!(
        latch_count_down(&mut conn, &k, caller("c1"))
            .await
            .expect("down"),
        CountDown::Counted(2)
    );
}

#[tokio::test]
async fn a_latch_set_again_after_it_opened_clears_its_done_marker() {
    // (Kills try_set leaving the done marker of the previous opening.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = lk();
    assert!(
        latch_try_set(&mut conn, &k, 1, caller("s1"))
            .await
            .expect("set")
    );
    latch_count_down(&mut conn, &k, caller("c1"))
        .await
        .expect("down");
    let done: Option<String> = conn.get(&k.all[1]).await.expect("get");
    assert_eq!(done.as_deref(), Some("1"));
    assert!(
        latch_try_set(&mut conn, &k, 2, caller("s2"))
            .await
            .expect("set")
    );
    let done: Option<String> = conn.get(&k.all[1]).await.expect("get");
    assert_eq!(done, None, "counting again: no done marker");
}

#[tokio::test]
async fn a_call_prunes_only_in_a_millisecond_divisible_by_16() {
    // About one call in 16 prunes, chosen by the time's low bits: a call in any other
    // millisecond leaves a record past its expiry alone. Each round plants the record and
    // reads the time on both sides of the count-down in one MULTI; a round whose two times
    // agree tells the call's millisecond. (Kills the prune test inverted: 15 calls in 16.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = lk();
    assert!(
        latch_try_set(&mut conn, &k, 1_000_000, caller("s"))
            .await
            .expect("set")
    );
    let _: String = LATCH_COUNT_DOWN
        .script()
        .prepare_invoke()
        .load_async(&mut conn)
        .await
        .expect("SCRIPT LOAD");
    let plant = redis::Script::new(
        r"local t = redis.call('TIME')
        redis.call('ZADD', KEYS[1], 1, 's:old')
        redis.call('HSET', KEYS[2], 's:old', '1|1|0|')
        return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)",
    );
    let clock = redis::Script::new(
        r"local t = redis.call('TIME')
        return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)",
    );
    let _: String = clock
        .prepare_invoke()
        .load_async(&mut conn)
        .await
        .expect("SCRIPT LOAD");
    let _: String = plant
        .prepare_invoke()
        .load_async(&mut conn)
        .await
        .expect("SCRIPT LOAD");
    let mut told = 0;
    for round in 0..200 {
        let seq = number(&format!("round {round}"));
        let (before, _, after): (i64, Value, i64) = within(
            LIMIT,
            "plant, count down, read the time",
            redis::pipe()
                .atomic()
                .invoke_script(plant.key(&k.all[2]).key(&k.all[3]))
                .invoke_script(
                    LATCH_COUNT_DOWN
                        .script()
                        .key(&k.all[..])
                        .arg(Hex(seq))
                        .arg(session().id())
                        .arg(Hex(session().low()))
                        .arg(&k.channel),
                )
                .invoke_script(&clock.prepare_invoke())
                .query_async(&mut conn),
        )
        .await
        .expect("exec");
        if before != after || before % 16 == 0 {
            continue;
        }
        told += 1;
        let old: Option<f64> = conn.zscore(&k.all[2], "s:old").await.expect("zscore");
        assert!(old.is_some(), "a call at {before} pruned");
        if told == 10 {
            return;
        }
    }
    assert!(told > 0, "no round told its call's millisecond");
}

#[tokio::test]
async fn a_record_whose_expiry_is_the_calls_millisecond_is_pruned_by_it() {
    // A record is due from its expiry on: planted in the same MULTI as the call, its expiry is
    // the call's millisecond or a few before, and a call that prunes drops it with the long
    // expired one. (Kills the prune skipping records due within the last 5 ms.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let edge = edge_at_the_first_prune(&mut conn, 0).await;
    assert_eq!(
        edge, None,
        "a record due at the call's millisecond was kept"
    );
}
