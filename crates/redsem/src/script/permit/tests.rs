//! Every permit script called directly, with raw KEYS and ARGV, on a throwaway server.

use std::time::Duration;

use redis::AsyncCommands;
use redis::aio::MultiplexedConnection;
use redsem_test::{RedisCluster, RedisServer, within};

use super::*;
use crate::error::Error;
use crate::keys::LatchKeys;
use crate::script::latch::{
    CountDown, RawLatchState, latch_count_down, latch_delete, latch_state, latch_try_set,
};
use crate::script::test_support::{
    CHANNEL, LIMIT, assert_wrong_type, connect, connect_cluster, connect_without_channels,
    evict_by_filling, next_message, number, pttl, server_millis, session, subscribe,
};

const LONG: Duration = Duration::from_secs(30);

fn caller(name: &str) -> Caller<'static> {
    Caller::new(session(), number(name))
}

// The scripts' wrappers as these tests call them: each call numbered after its request id
// (a check-in after "poll <id>"), so the same call made again is its resend.

async fn permit_acquire(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    id: &str,
    permits: u32,
    wait: bool,
    waiter_lease: Duration,
    channel: &str,
) -> Result<PermitAcquire> {
    super::permit_acquire(
        conn,
        keys,
        id,
        permits,
        wait,
        waiter_lease,
        channel,
        caller(id),
    )
    .await
}

async fn permit_poll(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    id: &str,
    waiter_lease: Duration,
) -> Result<PermitAcquire> {
    let call = caller(&format!("poll {id}"));
    super::permit_poll(conn, keys, id, waiter_lease, call).await
}

async fn permit_add(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    request: &str,
    delta: i64,
) -> Result<Addition> {
    super::permit_add(conn, keys, request, delta, caller(request)).await
}

/// A withdrawal with no call of the request in flight.
async fn permit_withdraw(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    id: &str,
) -> Result<Withdrawal> {
    super::permit_withdraw(conn, keys, id, session(), None).await
}

/// A withdrawal naming the call `name` of the request as unanswered (see [`number`]).
async fn withdraw_naming(conn: &mut impl Scripting, id: &str, name: &str) -> Withdrawal {
    super::permit_withdraw(conn, &pk(), id, session(), Some(number(name)))
        .await
        .expect("withdraw")
}

async fn permit_try_set(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    request: &str,
    permits: u32,
) -> Result<bool> {
    super::permit_try_set(conn, keys, request, permits, caller(request)).await
}

async fn permit_drain(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    request: &str,
) -> Result<(u64, Option<Error>)> {
    super::permit_drain(conn, keys, request, caller(request)).await
}

async fn permit_batch(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    channel: &str,
    ops: &[PermitOp],
) -> Result<(Vec<Value>, Option<Error>)> {
    super::permit_batch(conn, keys, channel, session(), ops).await
}

fn pk() -> PermitKeys {
    PermitKeys::new("t", "p")
}

async fn acquire(
    conn: &mut MultiplexedConnection,
    id: &str,
    permits: u32,
    wait: bool,
    waiter_lease: Duration,
) -> PermitAcquire {
    within(
        LIMIT,
        "permit_acquire",
        permit_acquire(conn, &pk(), id, permits, wait, waiter_lease, CHANNEL),
    )
    .await
    .expect("permit_acquire")
}

async fn poll(conn: &mut MultiplexedConnection, id: &str) -> PermitAcquire {
    permit_poll(conn, &pk(), id, LONG).await.expect("poll")
}

async fn add(conn: &mut MultiplexedConnection, request: &str, delta: i64) -> Addition {
    permit_add(conn, &pk(), request, delta).await.expect("add")
}

async fn available(conn: &mut MultiplexedConnection) -> i64 {
    permit_available(conn, &pk())
        .await
        .expect("available")
        .available
}

#[tokio::test]
async fn acquire_takes_available_permits_and_try_reports_busy() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    assert!(permit_try_set(&mut conn, &pk(), "s", 3).await.expect("set"));
    assert_eq!(
        acquire(&mut conn, "a", 2, false, LONG).await,
        PermitAcquire::Granted
    );
    assert_eq!(
        acquire(&mut conn, "b", 2, false, LONG).await,
        PermitAcquire::Busy {
            available: 1,
            waiters: 0
        }
    );
    assert_eq!(available(&mut conn).await, 1);
    // A repeated acquire with a collected id is granted again, and takes nothing more.
    assert_eq!(
        acquire(&mut conn, "a", 2, false, LONG).await,
        PermitAcquire::Granted
    );
    assert_eq!(available(&mut conn).await, 1);
}

#[tokio::test]
async fn waiters_are_granted_in_arrival_order_and_woken_by_their_id() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let mut pubsub = subscribe(&server, CHANNEL).await;
    assert!(permit_try_set(&mut conn, &pk(), "s", 0).await.expect("set"));
    assert!(matches!(
        acquire(&mut conn, "a", 2, true, LONG).await,
        PermitAcquire::Queued { position: 0, .. }
    ));
    let PermitAcquire::Queued { position, recheck } = acquire(&mut conn, "b", 1, true, LONG).await
    else {
        panic!("b should queue");
    };
    assert_eq!(position, 1);
    assert_eq!(recheck, Duration::from_secs(10));
    // A try request fails while others wait.
    assert_eq!(
        acquire(&mut conn, "c", 1, false, LONG).await,
        PermitAcquire::Busy {
            available: 0,
            waiters: 2
        }
    );

    // One permit: a (2) still does not fit, and b behind it does not overtake it.
    assert_eq!(add(&mut conn, "r1", 1).await, Addition::Applied(1));
    assert!(matches!(
        poll(&mut conn, "b").await,
        PermitAcquire::Queued { position: 1, .. }
    ));
    assert_eq!(add(&mut conn, "r2", 1).await, Addition::Applied(0));
    assert_eq!(next_message(&mut pubsub).await, "a");
    assert_eq!(poll(&mut conn, "a").await, PermitAcquire::Granted);
    assert_eq!(
        poll(&mut conn, "a").await,
        PermitAcquire::Granted,
        "a repeated poll"
    );
    assert!(matches!(
        poll(&mut conn, "b").await,
        PermitAcquire::Queued { position: 0, .. }
    ));
    assert_eq!(add(&mut conn, "r3", 1).await, Addition::Applied(0));
    assert_eq!(next_message(&mut pubsub).await, "b");
    assert_eq!(poll(&mut conn, "b").await, PermitAcquire::Granted);
    assert_eq!(poll(&mut conn, "zz").await, PermitAcquire::Gone);
}

#[tokio::test]
async fn an_add_repeated_with_the_same_request_id_is_applied_once() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    assert_eq!(add(&mut conn, "r1", 2).await, Addition::Applied(2));
    assert_eq!(add(&mut conn, "r1", 2).await, Addition::Repeated(2));
    assert_eq!(available(&mut conn).await, 2);
    assert_eq!(add(&mut conn, "r2", -5).await, Addition::Applied(-3));
    assert_eq!(add(&mut conn, "r2", -5).await, Addition::Repeated(-3));
    assert_eq!(available(&mut conn).await, -3);
}

#[tokio::test]
async fn try_set_sets_only_a_count_never_set_and_a_repeat_answers_set() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let shared = conn.clone();
    let set = move |id: &'static str, n: u32| {
        let mut conn = shared.clone();
        async move { permit_try_set(&mut conn, &pk(), id, n).await.expect("set") }
    };
    assert!(set("s1", 0).await, "a count of 0 is a count");
    assert!(set("s1", 0).await, "the same request answers the same");
    assert!(!set("s2", 5).await, "0 counts as set");
    assert_eq!(available(&mut conn).await, 0);
    assert!(permit_delete(&mut conn, &pk()).await.expect("delete"));
    assert!(!permit_delete(&mut conn, &pk()).await.expect("delete"));
    assert!(set("s3", 5).await, "set again after a delete");
    assert_eq!(available(&mut conn).await, 5);
}

#[tokio::test]
async fn a_withdrawn_request_takes_nothing_whatever_its_state() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    // Waiting: just leaves.
    assert!(matches!(
        acquire(&mut conn, "w", 1, true, LONG).await,
        PermitAcquire::Queued { .. }
    ));
    assert_eq!(
        permit_withdraw(&mut conn, &k, "w").await.expect("withdraw"),
        Withdrawal::Withdrawn
    );
    // Granted while it waited, not collected: gives the permits back.
    assert!(matches!(
        acquire(&mut conn, "g", 2, true, LONG).await,
        PermitAcquire::Queued { position: 0, .. }
    ));
    assert_eq!(add(&mut conn, "r1", 2).await, Addition::Applied(0));
    assert_eq!(
        permit_withdraw(&mut conn, &k, "g").await.expect("withdraw"),
        Withdrawal::Returned(2)
    );
    assert_eq!(available(&mut conn).await, 2);
    // Taken by the call the withdrawal names as unanswered (the caller never heard): given
    // back as well.
    assert_eq!(
        acquire(&mut conn, "c", 2, false, LONG).await,
        PermitAcquire::Granted
    );
    assert_eq!(
        withdraw_naming(&mut conn, "c", "c").await,
        Withdrawal::Returned(2)
    );
    assert_eq!(available(&mut conn).await, 2);
    // Twice, or unknown: nothing.
    assert_eq!(
        withdraw_naming(&mut conn, "c", "c").await,
        Withdrawal::Unknown
    );
    assert_eq!(
        withdraw_naming(&mut conn, "never", "never").await,
        Withdrawal::Unknown
    );
    // A withdrawal that names no call leaves what an answered call took (a permit of a
    // caller that heard of it is the caller's to release).
    assert_eq!(
        acquire(&mut conn, "heard", 1, false, LONG).await,
        PermitAcquire::Granted
    );
    assert_eq!(
        permit_withdraw(&mut conn, &k, "heard")
            .await
            .expect("withdraw"),
        Withdrawal::Unknown
    );
    assert_eq!(available(&mut conn).await, 1);
    assert_eq!(add(&mut conn, "r heard", 1).await, Addition::Applied(2));
    // A late acquire with a withdrawn id (sent before the withdrawal, arriving after).
    assert_eq!(
        acquire(&mut conn, "never", 1, false, LONG).await,
        PermitAcquire::Gone
    );
    assert_eq!(available(&mut conn).await, 2);
}

#[tokio::test]
async fn withdrawing_the_head_lets_the_waiters_behind_it_through() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let mut pubsub = subscribe(&server, CHANNEL).await;
    assert_eq!(add(&mut conn, "r1", 1).await, Addition::Applied(1));
    acquire(&mut conn, "big", 2, true, LONG).await;
    acquire(&mut conn, "small", 1, true, LONG).await;
    permit_withdraw(&mut conn, &pk(), "big")
        .await
        .expect("withdraw");
    assert_eq!(next_message(&mut pubsub).await, "small");
    assert_eq!(poll(&mut conn, "small").await, PermitAcquire::Granted);
    assert_eq!(available(&mut conn).await, 0);
}

#[tokio::test]
async fn a_dead_waiter_is_dropped_within_its_waiter_lease_and_gives_back_a_grant() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let short = Duration::from_millis(100);
    assert!(matches!(
        acquire(&mut conn, "dead", 1, true, short).await,
        PermitAcquire::Queued { .. }
    ));
    assert_eq!(add(&mut conn, "r1", 0).await, Addition::Applied(0));
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(add(&mut conn, "r2", 1).await, Addition::Applied(1));
    assert_eq!(
        acquire(&mut conn, "live", 1, false, LONG).await,
        PermitAcquire::Granted,
        "the dead waiter no longer blocks"
    );

    // Granted while it waited, and never collected: the permit comes back.
    acquire(&mut conn, "dead2", 1, true, short).await;
    assert_eq!(add(&mut conn, "r3", 1).await, Addition::Applied(0));
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(available(&mut conn).await, 1);
    assert_eq!(poll(&mut conn, "dead2").await, PermitAcquire::Gone);
}

#[tokio::test]
async fn the_count_stays_within_two_to_the_53() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let max = (1_i64 << 53) - 1;
    assert_eq!(add(&mut conn, "r1", max).await, Addition::Applied(max));
    assert_eq!(add(&mut conn, "r2", 1).await, Addition::OutOfRange(max));
    assert_eq!(
        add(&mut conn, "r3", -max).await,
        Addition::Applied(0),
        "and back"
    );
}

#[tokio::test]
async fn drain_takes_what_is_available_and_leaves_a_negative_count_alone() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    assert_eq!(
        permit_drain(&mut conn, &pk(), "d1").await.expect("drain").0,
        0
    );
    let exists: bool = conn.exists(&pk().all[0]).await.expect("exists");
    assert!(!exists, "draining a semaphore never set does not set it");
    add(&mut conn, "r1", 5).await;
    assert_eq!(
        permit_drain(&mut conn, &pk(), "d2").await.expect("drain").0,
        5
    );
    assert_eq!(available(&mut conn).await, 0);
    add(&mut conn, "r2", -3).await;
    assert_eq!(
        permit_drain(&mut conn, &pk(), "d3").await.expect("drain").0,
        0
    );
    assert_eq!(available(&mut conn).await, -3);
}

#[tokio::test]
async fn bookkeeping_keys_expire_only_while_idle_and_the_count_never() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    add(&mut conn, "r1", 1).await;
    acquire(&mut conn, "a", 1, false, LONG).await;
    // Idle (nobody waits): the session records (kept 10 min) and the ticket counter expire,
    // an idle while after the session's record does.
    for key in [&k.all[3], &k.all[5]] {
        let ttl: i64 = conn.pttl(key).await.expect("pttl");
        assert!(ttl > 600_000 && ttl <= 600_000 + 120_000, "{key}: {ttl}");
    }
    // Live (someone waits): nothing expires.
    acquire(&mut conn, "b", 1, true, LONG).await;
    for key in &k.all {
        let ttl: i64 = conn.pttl(key).await.expect("pttl");
        assert_eq!(ttl, -1, "{key} while a waiter lives");
    }
    // Idle again.
    permit_withdraw(&mut conn, &k, "b").await.expect("withdraw");
    for key in [&k.all[3], &k.all[4], &k.all[5]] {
        let ttl: i64 = conn.pttl(key).await.expect("pttl");
        assert!(ttl > 600_000 && ttl <= 600_000 + 120_000, "{key}: {ttl}");
    }
    let ttl: i64 = conn.pttl(&k.all[0]).await.expect("pttl");
    assert_eq!(ttl, -1, "the count never expires");
}

#[tokio::test]
async fn every_permit_script_reports_a_foreign_key_and_leaves_it_alone() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    for (i, key) in k.all.iter().enumerate() {
        let _: () = conn.del(&k.all[..]).await.expect("del");
        // A list where we keep a string or a zset; text where we keep a number.
        let _: () = conn.rpush(key, "foreign").await.expect("rpush");
        let mut conn2 = conn.clone();
        let results: Vec<(&str, Result<()>)> = vec![
            (
                "acquire",
                permit_acquire(&mut conn2, &k, "a", 1, true, LONG, CHANNEL)
                    .await
                    .map(drop),
            ),
            (
                "poll",
                permit_poll(&mut conn2, &k, "a", LONG).await.map(drop),
            ),
            (
                "withdraw",
                permit_withdraw(&mut conn2, &k, "a").await.map(drop),
            ),
            ("add", permit_add(&mut conn2, &k, "r", 1).await.map(drop)),
            (
                "try_set",
                permit_try_set(&mut conn2, &k, "r", 1).await.map(drop),
            ),
            (
                "available",
                permit_available(&mut conn2, &k).await.map(drop),
            ),
            ("drain", permit_drain(&mut conn2, &k, "d").await.map(drop)),
            ("delete", permit_delete(&mut conn2, &k).await.map(drop)),
        ];
        assert_wrong_type(results, key, i);
        let value: Vec<String> = conn.lrange(key, 0, -1).await.expect("lrange");
        assert_eq!(value, ["foreign"], "key #{i} was overwritten");
        let others: usize = conn.exists(&k.all[..]).await.expect("exists");
        assert_eq!(others, 1, "nothing else was written");
    }
    let _: () = conn.del(&k.all[..]).await.expect("del");
    let _: () = conn.set(&k.all[0], "three").await.expect("set");
    match permit_add(&mut conn, &k, "r", 1).await {
        Err(Error::WrongType { key, expected, .. }) => {
            assert_eq!(
                (key.as_str(), expected.as_str()),
                (k.all[0].as_str(), "integer")
            );
        }
        other => panic!("a non-numeric count: {other:?}"),
    }
}

#[tokio::test]
async fn counter_scripts_run_on_a_three_master_cluster() {
    let cluster = RedisCluster::start(3);
    let mut conn = connect_cluster(&cluster).await;
    for name in ["a", "b", "c", "d", "e", "f"] {
        let k = PermitKeys::new("t", name);
        assert!(permit_try_set(&mut conn, &k, "s", 1).await.expect("set"));
        let granted = permit_acquire(&mut conn, &k, "x", 1, true, LONG, CHANNEL).await;
        assert_eq!(granted.expect("acquire"), PermitAcquire::Granted);
        let queued = permit_acquire(&mut conn, &k, "y", 1, true, LONG, CHANNEL).await;
        assert!(
            matches!(queued, Ok(PermitAcquire::Queued { .. })),
            "{queued:?}"
        );
        permit_add(&mut conn, &k, "r", 1).await.expect("release");
        let polled = permit_poll(&mut conn, &k, "y", LONG).await.expect("poll");
        assert_eq!(polled, PermitAcquire::Granted);
        permit_withdraw(&mut conn, &k, "y").await.expect("withdraw");
        assert!(permit_delete(&mut conn, &k).await.expect("delete"));

        let k = LatchKeys::new("t", name);
        assert!(
            latch_try_set(&mut conn, &k, 1, caller("latch s"))
                .await
                .expect("set")
        );
        let down = latch_count_down(&mut conn, &k, caller("latch c"))
            .await
            .expect("count_down");
        assert_eq!(down, CountDown::Counted(0));
        let state = latch_state(&mut conn, &k).await.expect("state");
        assert_eq!(state, RawLatchState::Done);
        latch_delete(&mut conn, &k).await.expect("delete");
    }
}

// ----- Faults of issue 9: resent calls, failures after a write, eviction, partial loss.

/// How many waiters one script run grants at most: one release settles at most `MAX_STEPS`
/// queue heads (`permit_prelude.lua`), and here every head is granted.
const MAX_GRANTS: usize = 100;

async fn fields(conn: &mut MultiplexedConnection, names: &[&str]) -> Vec<Option<String>> {
    redis::cmd("HMGET")
        .arg(&pk().all[3])
        .arg(names)
        .query_async(conn)
        .await
        .expect("HMGET records")
}

/// The number of `r:<id>` records in state "granted, not collected".
async fn uncollected(conn: &mut MultiplexedConnection) -> usize {
    let values: Vec<String> = conn.hvals(&pk().all[3]).await.expect("HVALS");
    values.iter().filter(|v| v.starts_with("g|")).count()
}

#[tokio::test]
async fn a_drain_repeated_with_the_same_request_id_answers_the_same_and_takes_once() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    add(&mut conn, "r1", 5).await;
    assert_eq!(
        permit_drain(&mut conn, &pk(), "d1").await.expect("drain").0,
        5
    );
    // Released by someone else before the resent drain arrives.
    add(&mut conn, "r2", 2).await;
    let again = permit_drain(&mut conn, &pk(), "d1")
        .await
        .expect("resent")
        .0;
    let left = available(&mut conn).await;
    println!("resent drain answered {again}, left {left} of the 2 released after it");
    assert_eq!((again, left), (5, 2), "the resend takes nothing more");
    assert_eq!(
        permit_drain(&mut conn, &pk(), "d2").await.expect("drain").0,
        2
    );
}

#[tokio::test]
async fn every_mutating_permit_script_repeated_with_its_id_is_applied_once() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(permit_try_set(&mut conn, &k, "s", 2).await.expect("set"));
    assert!(permit_try_set(&mut conn, &k, "s", 2).await.expect("resent"));
    assert_eq!(add(&mut conn, "r", 1).await, Addition::Applied(3));
    assert_eq!(add(&mut conn, "r", 1).await, Addition::Repeated(3));
    for _ in 0..2 {
        assert_eq!(
            acquire(&mut conn, "t", 3, false, LONG).await,
            PermitAcquire::Granted
        );
    }
    assert_eq!(available(&mut conn).await, 0);
    // A resent wait request answers like a poll: one place in the queue.
    for _ in 0..2 {
        assert!(matches!(
            acquire(&mut conn, "w", 2, true, LONG).await,
            PermitAcquire::Queued { position: 0, .. }
        ));
    }
    let queue: u64 = conn.zcard(&k.all[1]).await.expect("ZCARD");
    assert_eq!(queue, 1);
    assert_eq!(
        fields(&mut conn, &["qlen", "wlen"]).await,
        [Some("1".into()), Some("1".into())]
    );
    assert_eq!(add(&mut conn, "r2", 2).await, Addition::Applied(0));
    for _ in 0..2 {
        assert_eq!(poll(&mut conn, "w").await, PermitAcquire::Granted);
    }
    assert_eq!(available(&mut conn).await, 0);
    // A withdrawal naming the check-in that collected (its answer lost) gives back once.
    assert_eq!(
        withdraw_naming(&mut conn, "w", "poll w").await,
        Withdrawal::Returned(2)
    );
    assert_eq!(
        withdraw_naming(&mut conn, "w", "poll w").await,
        Withdrawal::Unknown
    );
    assert_eq!(available(&mut conn).await, 2);
    assert_eq!(permit_drain(&mut conn, &k, "d").await.expect("drain").0, 2);
    assert_eq!(permit_drain(&mut conn, &k, "d").await.expect("resent").0, 2);
    assert_eq!(available(&mut conn).await, 0);
}

#[tokio::test]
async fn a_release_to_thousands_of_waiters_grants_a_bounded_number_and_the_rest_follow() {
    const WAITERS: usize = 3000;
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let mut pubsub = subscribe(&server, CHANNEL).await;
    let ids: Vec<String> = (0..WAITERS).map(|i| format!("w{i:04}")).collect();
    // One after the other, so the queue is in the order of `ids` (concurrent calls may
    // overtake each other, e.g. when a NOSCRIPT reload resends some of them).
    within(LIMIT, "queue the waiters", async {
        for id in &ids {
            let reply = permit_acquire(&mut conn, &pk(), id, 1, true, LONG, CHANNEL).await;
            assert!(
                matches!(reply, Ok(PermitAcquire::Queued { .. })),
                "{reply:?}"
            );
        }
    })
    .await;
    assert_eq!(
        add(&mut conn, "r", WAITERS as i64).await,
        Addition::Applied((WAITERS - MAX_GRANTS) as i64)
    );
    let granted = uncollected(&mut conn).await;
    println!("waiters granted by one release of {WAITERS}: {granted}");
    assert_eq!(
        granted, MAX_GRANTS,
        "one script run grants a bounded number"
    );
    // Those granted are woken, then the next in line, whose own poll admits the next ones.
    for id in ids.iter().take(MAX_GRANTS + 1) {
        assert_eq!(&next_message(&mut pubsub).await, id);
    }
    for id in &ids {
        assert_eq!(poll(&mut conn, id).await, PermitAcquire::Granted, "{id}");
    }
    assert_eq!(available(&mut conn).await, 0);
    assert_eq!(
        fields(&mut conn, &["qlen", "wlen"]).await,
        [Some("0".into()), Some("0".into())]
    );
}

#[tokio::test]
async fn a_publish_refused_by_acl_leaves_the_state_whole_and_the_call_succeeds() {
    let server = RedisServer::start();
    let mut admin = connect(&server).await;
    let mut conn = connect_without_channels(&server).await;
    let k = pk();
    assert!(matches!(
        permit_acquire(&mut conn, &k, "w", 1, true, LONG, CHANNEL).await,
        Ok(PermitAcquire::Queued { .. })
    ));
    let added = permit_add(&mut conn, &k, "r", 1).await;
    println!("release with a refused PUBLISH: {added:?}");
    assert_eq!(added.expect("the release is applied"), Addition::Applied(0));
    assert_eq!(
        permit_poll(&mut conn, &k, "w", LONG).await.expect("poll"),
        PermitAcquire::Granted,
        "the waiter collects by polling"
    );
    assert_eq!(
        fields(&mut admin, &["qlen", "wlen"]).await,
        [Some("0".into()), Some("0".into())]
    );
    assert_eq!(available(&mut admin).await, 0);
}

#[tokio::test]
async fn live_permit_state_carries_no_ttl_and_survives_volatile_lru_eviction() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "volatile-lru"]);
    let mut conn = connect(&server).await;
    let k = pk();
    // A grant not collected yet, and a waiter behind it.
    acquire(&mut conn, "granted", 1, true, LONG).await;
    acquire(&mut conn, "queued", 1, true, LONG).await;
    assert_eq!(add(&mut conn, "r", 1).await, Addition::Applied(0));
    let mut ttls = Vec::new();
    for key in &k.all {
        ttls.push(pttl(&mut conn, key).await);
    }
    println!("PTTL of the permit keys while waiters live: {ttls:?}");
    // (LRU idle times count in seconds: make ours the idlest.)
    tokio::time::sleep(Duration::from_millis(1100)).await;
    evict_by_filling(&mut conn, 5000).await;
    let exists: usize = conn.exists(&k.all[..]).await.expect("EXISTS");
    println!("permit keys left after 5000 evictions: {exists} of 6");
    assert_eq!(poll(&mut conn, "granted").await, PermitAcquire::Granted);
    assert!(matches!(
        poll(&mut conn, "queued").await,
        PermitAcquire::Queued { position: 0, .. }
    ));
    assert!(ttls.iter().all(|ttl| *ttl == -1), "{ttls:?}");

    // Idle again: the bookkeeping expires (only the count stays). (No memory limit any
    // more, or the keys would be evicted the moment they get their TTL.)
    let () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "0"])
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET");
    permit_withdraw(&mut conn, &k, "queued")
        .await
        .expect("withdraw");
    for key in &k.all[3..] {
        let ttl = pttl(&mut conn, key).await;
        assert!(ttl > 0, "{key}: {ttl}");
    }
    assert_eq!(pttl(&mut conn, &k.all[0]).await, -1);
}

#[tokio::test]
async fn lost_bookkeeping_is_rebuilt_and_a_waiter_without_a_place_is_told_gone() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    acquire(&mut conn, "a", 1, true, LONG).await;
    // The records vanish (partial loss); the queue and the ticket counter remain.
    let () = conn.del(&k.all[3]).await.expect("DEL");
    acquire(&mut conn, "b", 1, true, LONG).await;
    assert_eq!(
        acquire(&mut conn, "c", 1, false, LONG).await,
        PermitAcquire::Busy {
            available: 0,
            waiters: 1
        },
        "a try request does not overtake the queue"
    );
    assert_eq!(add(&mut conn, "r", 1).await, Addition::Applied(0));
    assert_eq!(
        poll(&mut conn, "a").await,
        PermitAcquire::Gone,
        "its record is lost"
    );
    assert_eq!(
        poll(&mut conn, "b").await,
        PermitAcquire::Granted,
        "served after the ghost"
    );

    // The queue vanishes under a waiter: told it lost its place, not a malformed reply.
    acquire(&mut conn, "d", 1, true, LONG).await;
    let () = conn.del(&k.all[1]).await.expect("DEL");
    let polled = permit_poll(&mut conn, &k, "d", LONG).await;
    println!("poll of a waiter whose queue vanished: {polled:?}");
    assert_eq!(polled.expect("poll"), PermitAcquire::Gone);
    // The counters agree with the keys (a's waiters entry stays until its lease ends).
    let waiting: u64 = conn.zcard(&k.all[2]).await.expect("ZCARD");
    assert_eq!(
        fields(&mut conn, &["qlen", "wlen"]).await,
        [Some("0".into()), Some(waiting.to_string())]
    );
}

/// A group commit's call applies its operations in order, each answered as its own call would
/// be; an addition out of range in it takes back only its own bookkeeping, not that of the
/// operations before it (their ids stay on the forgetting schedule).
#[tokio::test]
async fn a_batch_applies_its_operations_in_order_as_one_call_each_would() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let too_many = crate::permits::MAX_PERMITS + 1;
    // The first addition makes the semaphore, and the schedule of its remembered ids.
    let ops = [
        PermitOp::add("m0", 2, number("m0")),
        PermitOp::acquire("a1", 2, false, LONG, number("a1")),
        PermitOp::acquire("a2", 1, false, LONG, number("a2")),
        PermitOp::add("m1", 1, number("m1")),
        PermitOp::acquire("a3", 1, true, LONG, number("a3")),
        PermitOp::withdraw("a1", Some(number("a1"))),
        PermitOp::add("m2", too_many, number("m2")),
    ];
    let (replies, unconfirmed) = within(
        LIMIT,
        "permit_batch",
        permit_batch(&mut conn, &pk(), CHANNEL, &ops),
    )
    .await
    .expect("permit_batch");
    assert!(unconfirmed.is_none());
    let mut replies = replies.into_iter();
    let mut next = || Acked {
        reply: replies.next().expect("a reply per operation"),
        unconfirmed: None,
    };
    let acquired = |acked| permits_granted("permit_acquire", acked).expect("acquire");
    assert_eq!(added(next()).expect("add"), Addition::Applied(2));
    assert_eq!(acquired(next()), PermitAcquire::Granted);
    assert_eq!(
        acquired(next()),
        PermitAcquire::Busy {
            available: 0,
            waiters: 0
        }
    );
    assert_eq!(added(next()).expect("add"), Addition::Applied(1));
    assert_eq!(acquired(next()), PermitAcquire::Granted);
    assert_eq!(
        withdrawn(next()).expect("withdraw"),
        Withdrawal::Returned(2)
    );
    assert_eq!(added(next()).expect("add"), Addition::OutOfRange(2));
    assert_eq!(available(&mut conn).await, 2);
    let prune: Option<String> = conn
        .hget("t:{permits:p}:records", "prune")
        .await
        .expect("HGET");
    assert!(
        prune.is_some(),
        "the remembered ids are forgotten on schedule"
    );
}

#[tokio::test]
async fn the_uncontended_fast_paths_leave_what_is_due_to_the_general_path() {
    // Issue 19: a grant with nobody waiting and an addition with nobody waiting are written
    // straight to the keys (fast_acquire, fast_add) only while nothing is due. Each case
    // below is one the fast path must leave: taken anyway, its effect would be missing.
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(permit_try_set(&mut conn, &k, "s", 4).await.expect("set"));
    assert_eq!(add(&mut conn, "r0", 1).await, Addition::Applied(5));
    assert_eq!(
        acquire(&mut conn, "a", 1, false, LONG).await,
        PermitAcquire::Granted
    );

    // A session record past its expiry: the next grant drops it.
    let past = server_millis(&mut conn).await - 1_000;
    let () = conn.zadd(&k.all[5], "s:old", past).await.expect("zadd");
    let () = conn.hset(&k.all[3], "s:old", "1|1|0|").await.expect("hset");
    let () = conn.hset(&k.all[3], "prune", past).await.expect("hset");
    assert_eq!(
        acquire(&mut conn, "b", 1, false, LONG).await,
        PermitAcquire::Granted
    );
    assert_eq!(fields(&mut conn, &["s:old"]).await, [None], "dropped");
    let score: Option<f64> = conn.zscore(&k.all[5], "s:old").await.expect("zscore");
    assert_eq!(score, None);

    // Idle keys whose deadline comes within the margin: an addition that renews its
    // session's record (renewed last over a minute ago) moves it, and the TTLs.
    let now = server_millis(&mut conn).await;
    let soon = now + 70_000;
    let () = conn.hset(&k.all[3], "keep", soon).await.expect("hset");
    let own = format!("s:{}", session().id());
    let renewed_long_ago = format!("1|{:x}|0|", now + 600_000 - 61_000);
    let () = conn
        .hset(&k.all[3], &own, renewed_long_ago)
        .await
        .expect("hset");
    assert_eq!(add(&mut conn, "r1", 1).await, Addition::Applied(4));
    let keep: i64 = conn.hget(&k.all[3], "keep").await.expect("hget");
    assert!(keep > soon + 30_000, "keep moved: {keep} after {soon}");
    let ttl = pttl(&mut conn, &k.all[3]).await;
    assert!(ttl > 100_000, "the records' TTL moved with keep: {ttl}");

    // A grant made to a waiter that never collected it, its waiter lease ended: the next
    // addition gives it back first.
    assert_eq!(permit_drain(&mut conn, &k, "d").await.expect("drain").0, 4);
    assert!(matches!(
        acquire(&mut conn, "w", 1, true, LONG).await,
        PermitAcquire::Queued { position: 0, .. }
    ));
    assert_eq!(add(&mut conn, "r2", 1).await, Addition::Applied(0));
    assert_eq!(uncollected(&mut conn).await, 1, "w was granted");
    let past = server_millis(&mut conn).await - 1_000;
    let () = conn.zadd(&k.all[2], "w", past).await.expect("zadd");
    let () = conn.hset(&k.all[3], "wnext", past).await.expect("hset");
    assert_eq!(add(&mut conn, "r3", 1).await, Addition::Applied(2));
    assert_eq!(uncollected(&mut conn).await, 0);
}

#[tokio::test]
async fn a_key_replaced_while_in_use_is_reported_by_the_fast_paths_and_left_alone() {
    // The fast paths (fast_acquire, fast_add) touch the count without the general path's
    // load: a foreign value there must be reported the same way, with nothing taken or
    // granted. (The sessions' index is touched only when a record is renewed, by the
    // general path: every_permit_script_reports_a_foreign_key_and_leaves_it_alone.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    for (i, key) in [(0, &k.all[0])] {
        let _: () = conn.del(&k.all[..]).await.expect("del");
        // In use and quiet: the next uncontended acquire and addition take the fast paths.
        assert!(permit_try_set(&mut conn, &k, "s", 3).await.expect("set"));
        assert_eq!(
            acquire(&mut conn, "a", 1, false, LONG).await,
            PermitAcquire::Granted
        );
        assert_eq!(add(&mut conn, "r0", 1).await, Addition::Applied(3));
        let quiet = fields(&mut conn, &["keep", "prune", "wide", "live"]).await;
        assert!(
            quiet[..3].iter().all(Option::is_some) && quiet[3].is_none(),
            "{quiet:?}"
        );
        let _: () = conn.del(key).await.expect("del");
        let _: () = conn.rpush(key, "foreign").await.expect("rpush");
        let results: Vec<(&str, Result<()>)> = vec![
            (
                "acquire",
                permit_acquire(&mut conn, &k, "b", 1, false, LONG, CHANNEL)
                    .await
                    .map(drop),
            ),
            ("add", permit_add(&mut conn, &k, "r1", 1).await.map(drop)),
        ];
        assert_wrong_type(results, key, i);
        let value: Vec<String> = conn.lrange(key, 0, -1).await.expect("lrange");
        assert_eq!(value, ["foreign"], "key #{i} was overwritten");
        assert_eq!(fields(&mut conn, &["r:b"]).await, [None], "b was granted");
        if i != 0 {
            let count: i64 = conn.get(&k.all[0]).await.expect("get");
            assert_eq!(count, 3, "the count changed");
        }
    }
}

#[tokio::test]
async fn every_call_a_permit_script_applies_is_marked_in_its_sessions_record() {
    // Issue 27: no id is remembered per call; the session record marks each call applied
    // (what a resend must find), and its expiry is registered once, 10 min ahead.
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    let before = server_millis(&mut conn).await;
    assert!(permit_try_set(&mut conn, &k, "s", 3).await.expect("set"));
    let after = server_millis(&mut conn).await;
    // The first grant takes the general path, the second the fast path.
    for id in ["a", "b"] {
        assert_eq!(
            acquire(&mut conn, id, 1, false, LONG).await,
            PermitAcquire::Granted
        );
    }
    add(&mut conn, "more", 2).await;
    assert_eq!(permit_drain(&mut conn, &k, "d").await.expect("drain").0, 3);
    add(&mut conn, "two", 1).await;
    within(
        LIMIT,
        "permit_batch",
        permit_batch(
            &mut conn,
            &k,
            CHANNEL,
            &[PermitOp::acquire("c", 1, false, LONG, number("c"))],
        ),
    )
    .await
    .expect("permit_batch");
    let name = format!("s:{}", session().id());
    let record: String = conn.hget(&k.all[3], &name).await.expect("hget");
    for (call, mark) in [
        ("s", "S"),
        ("a", "G1"),
        ("b", "G1"),
        ("more", "A"),
        ("d", "D3"),
        ("c", "G1"),
    ] {
        assert!(
            record.contains(&format!(",{}={mark},", Hex(number(call))))
                || record.ends_with(&format!(",{}={mark}", Hex(number(call)))),
            "{call} marked {mark}: {record}"
        );
    }
    let records: Vec<String> = conn.hkeys(&k.all[3]).await.expect("hkeys");
    assert!(
        !records
            .iter()
            .any(|f| f.starts_with("r:") || f.starts_with("m:")),
        "nothing per request once answered: {records:?}"
    );
    let expiry: f64 = conn.zscore(&k.all[5], &name).await.expect("zscore");
    #[allow(clippy::cast_possible_truncation)]
    let expiry = expiry as i64;
    assert!(
        (before + 600_000..=after + 600_000).contains(&expiry),
        "expires {expiry}, 10 min after {before}..{after}"
    );
}

#[tokio::test]
async fn a_waiter_withdrawn_behind_a_head_that_does_not_fit_leaves_the_queue() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    assert!(permit_try_set(&mut conn, &pk(), "s", 0).await.expect("set"));
    let _ = acquire(&mut conn, "big", 5, true, LONG).await;
    let _ = acquire(&mut conn, "small", 1, true, LONG).await;
    assert_eq!(
        permit_withdraw(&mut conn, &pk(), "small")
            .await
            .expect("withdraw"),
        Withdrawal::Withdrawn
    );
    let queue: Vec<String> = conn.zrange(&pk().all[1], 0, -1).await.expect("zrange");
    assert_eq!(queue, vec!["big".to_owned()]);
    let qlen: String = conn.hget(&pk().all[3], "qlen").await.expect("hget");
    assert_eq!(qlen, "1");
}

#[tokio::test]
async fn a_batch_withdraws_and_checks_in_requests_made_by_earlier_calls() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    assert!(permit_try_set(&mut conn, &pk(), "s", 2).await.expect("set"));
    assert_eq!(
        acquire(&mut conn, "held", 2, false, LONG).await,
        PermitAcquire::Granted
    );
    let _ = acquire(&mut conn, "w1", 1, true, LONG).await;
    let _ = acquire(&mut conn, "w2", 1, true, LONG).await;
    let ops = [
        PermitOp::poll("w2", LONG, number("poll w2")),
        PermitOp::withdraw("held", Some(number("held"))),
        PermitOp::poll("w1", LONG, number("poll w1")),
        PermitOp::poll("w2", LONG, number("poll w2")),
    ];
    let (replies, _) = within(
        LIMIT,
        "permit_batch",
        permit_batch(&mut conn, &pk(), CHANNEL, &ops),
    )
    .await
    .expect("permit_batch");
    let mut replies = replies.into_iter();
    let mut next = || Acked {
        reply: replies.next().expect("a reply per operation"),
        unconfirmed: None,
    };
    let polled = |acked| permits_granted("permit_poll", acked).expect("poll");
    assert!(
        matches!(polled(next()), PermitAcquire::Queued { position: 1, .. }),
        "w2 waits behind w1"
    );
    assert_eq!(
        withdrawn(next()).expect("withdraw"),
        Withdrawal::Returned(2)
    );
    assert_eq!(polled(next()), PermitAcquire::Granted, "w1 collects");
    assert_eq!(polled(next()), PermitAcquire::Granted, "w2 collects");
    assert_eq!(available(&mut conn).await, 0);
}

#[tokio::test]
async fn an_addition_while_others_wait_adds_to_the_count_and_available_says_it_is_set() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    assert!(permit_try_set(&mut conn, &pk(), "s", 3).await.expect("set"));
    let _ = acquire(&mut conn, "w", 5, true, LONG).await;
    assert_eq!(add(&mut conn, "one", 1).await, Addition::Applied(4));
    let state = permit_available(&mut conn, &pk()).await.expect("available");
    assert_eq!((state.available, state.waiters, state.set), (4, 1, true));
}

#[tokio::test]
async fn a_dead_waiter_is_dropped_at_its_own_lease_though_a_later_one_has_a_longer_lease() {
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let short = Duration::from_millis(100);
    let _ = acquire(&mut conn, "dead", 1, true, short).await;
    let _ = acquire(&mut conn, "live", 1, true, LONG).await;
    assert_eq!(add(&mut conn, "r1", 0).await, Addition::Applied(0));
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(add(&mut conn, "r2", 1).await, Addition::Applied(0));
    assert_eq!(
        poll(&mut conn, "live").await,
        PermitAcquire::Granted,
        "the permit went to the live waiter, past the dead one"
    );
}

#[tokio::test]
async fn a_layout_1_permit_state_is_refused_while_live_and_taken_over_once_idle() {
    // Issue 27: layout 1 remembered every request id for a minute (records r:<id> "c|k",
    // applied m:<id>). A live state of it (a waiter of an older client) is refused and left
    // alone; an idle one is taken over, its records and remembered ids dropped, the count kept.
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    let () = conn.set(&k.all[0], 2).await.expect("set");
    let () = conn
        .hset_multiple(
            &k.all[3],
            &[
                ("keep", "9999999999999"),
                ("prune", "9999999999999"),
                ("wide", "-"),
                ("live", "1"),
                ("qlen", "1"),
                ("wlen", "1"),
                ("r:old", "w|1|1|c"),
                ("r:done", "c|1"),
            ],
        )
        .await
        .expect("hset");
    let () = conn.zadd(&k.all[1], "old", 1).await.expect("zadd");
    let () = conn.zadd(&k.all[2], "old", 9e15).await.expect("zadd");
    let () = conn.zadd(&k.all[5], "m:add", 9e15).await.expect("zadd");
    match permit_acquire(&mut conn, &k, "new", 1, false, LONG, CHANNEL).await {
        Err(Error::Incompatible { found, ours, .. }) => {
            assert_eq!((found.as_str(), ours.as_str()), ("1", "2"));
        }
        other => panic!("expected Incompatible, got {other:?}"),
    }
    let count: i64 = conn.get(&k.all[0]).await.expect("get");
    assert_eq!(count, 2, "untouched");

    // Drained: the old waiter gone (as layout 1 leaves it).
    let () = conn
        .hset_multiple(&k.all[3], &[("qlen", "0"), ("wlen", "0")])
        .await
        .expect("hset");
    let () = conn
        .hdel(&k.all[3], &["live", "r:old"])
        .await
        .expect("hdel");
    let _: () = conn.del(&[&k.all[1], &k.all[2]]).await.expect("del");
    assert_eq!(
        acquire(&mut conn, "new", 1, false, LONG).await,
        PermitAcquire::Granted
    );
    assert_eq!(available(&mut conn).await, 1, "the count kept");
    let layout: String = conn.hget(&k.all[3], "layout").await.expect("hget");
    assert_eq!(layout, "2");
    assert_eq!(fields(&mut conn, &["r:done"]).await, [None], "dropped");
    let remembered: Option<f64> = conn.zscore(&k.all[5], "m:add").await.expect("zscore");
    assert_eq!(remembered, None, "dropped");
}

#[tokio::test]
async fn a_batch_queues_each_waiter_for_its_own_waiter_lease() {
    // (Kills redsem-mutants' permit_batch.lua:39:+4->+3: an acquire of a batch takes its
    // waiter lease from its own arguments.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    assert!(permit_try_set(&mut conn, &pk(), "s", 0).await.expect("set"));
    let ops = [
        PermitOp::acquire("w1", 1, true, Duration::from_secs(5), number("w1")),
        PermitOp::acquire("w2", 1, true, Duration::from_secs(7), number("w2")),
    ];
    let before = server_millis(&mut conn).await;
    within(
        LIMIT,
        "permit_batch",
        permit_batch(&mut conn, &pk(), CHANNEL, &ops),
    )
    .await
    .expect("permit_batch");
    let after = server_millis(&mut conn).await;
    for (id, lease) in [("w1", 5_000), ("w2", 7_000)] {
        let end: f64 = conn.zscore(&pk().all[2], id).await.expect("zscore");
        #[allow(clippy::cast_possible_truncation)]
        let end = end as i64;
        assert!(
            (before + lease..=after + lease).contains(&end),
            "{id}: ends {end}, {lease} ms after {before}..{after}"
        );
    }
}

#[tokio::test]
async fn an_addition_beyond_the_range_reports_the_count_it_left_alone() {
    // (Kills redsem-mutants' permit_prelude.lua:450:if->false: with nobody waiting the count
    // is read lazily, and a delta too large for the fast path must still read it.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    assert!(permit_try_set(&mut conn, &pk(), "s", 5).await.expect("set"));
    let huge = 1_i64 << 53;
    assert_eq!(add(&mut conn, "huge", huge).await, Addition::OutOfRange(5));
    assert_eq!(available(&mut conn).await, 5);
}

#[tokio::test]
async fn a_drain_of_nothing_resent_after_permits_came_back_takes_nothing() {
    // A drain that found nothing is marked too: its resend, after an addition, answers 0 and
    // leaves the new permits. (Kills permit_drain.lua:21:drop.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    assert!(permit_try_set(&mut conn, &pk(), "s", 0).await.expect("set"));
    assert_eq!(
        permit_drain(&mut conn, &pk(), "d").await.expect("drain").0,
        0
    );
    assert_eq!(add(&mut conn, "r", 3).await, Addition::Applied(3));
    assert_eq!(
        permit_drain(&mut conn, &pk(), "d").await.expect("resent").0,
        0
    );
    assert_eq!(available(&mut conn).await, 3);
}

#[tokio::test]
async fn a_permit_batch_resent_whole_is_applied_once() {
    // A group commit whose reply was lost, sent again: each operation answers as it did and
    // adds nothing more; its check-in renews for its own waiter lease. (Kills
    // permit_batch.lua:23 and :49's argument shifts.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(permit_try_set(&mut conn, &k, "s", 0).await.expect("set"));
    assert!(matches!(
        acquire(&mut conn, "w", 5, true, LONG).await,
        PermitAcquire::Queued { .. }
    ));
    let ops = [
        PermitOp::withdraw("gone", Some(number("gone"))),
        PermitOp::poll("w", Duration::from_secs(9), number("poll w")),
        PermitOp::add("r1", 2, number("r1")),
    ];
    for (attempt, expected) in [
        ("first", Addition::Applied(2)),
        ("resent", Addition::Repeated(2)),
    ] {
        let before = server_millis(&mut conn).await;
        let (replies, _) = within(
            LIMIT,
            "permit_batch",
            permit_batch(&mut conn, &k, CHANNEL, &ops),
        )
        .await
        .expect("permit_batch");
        let after = server_millis(&mut conn).await;
        let mut replies = replies.into_iter();
        let mut next = || Acked {
            reply: replies.next().expect("a reply per operation"),
            unconfirmed: None,
        };
        assert_eq!(withdrawn(next()).expect("withdraw"), Withdrawal::Unknown);
        let polled = permits_granted("permit_poll", next()).expect("poll");
        assert!(
            matches!(polled, PermitAcquire::Queued { .. }),
            "{attempt}: {polled:?}"
        );
        let end: f64 = conn.zscore(&k.all[2], "w").await.expect("zscore");
        #[allow(clippy::cast_possible_truncation)]
        let end = end as i64;
        assert!(
            (before + 9_000..=after + 9_000).contains(&end),
            "{attempt}: w's place ends {end}, 9 s after {before}..{after}"
        );
        assert_eq!(added(next()).expect("add"), expected, "{attempt}");
    }
    assert_eq!(available(&mut conn).await, 2, "added once");
}

#[tokio::test]
async fn a_permit_batch_resent_whole_finds_its_requests_records_and_its_check_ins_marks() {
    // A batch resent whole with a resent wait acquire (its record read up front: queued once)
    // and a check-in that collected (its mark under its own number: GRANTED again). (Kills
    // permit_batch.lua:23's name shifts and :49's +3 -> +2.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(permit_try_set(&mut conn, &k, "s", 0).await.expect("set"));
    for (id, n) in [("w", 1), ("q", 5)] {
        assert!(matches!(
            acquire(&mut conn, id, n, true, LONG).await,
            PermitAcquire::Queued { .. }
        ));
    }
    let ops = [
        PermitOp::acquire("q", 5, true, LONG, number("q")),
        PermitOp::add("r", 1, number("r")),
        PermitOp::poll("w", LONG, number("poll w")),
    ];
    for attempt in ["first", "resent"] {
        let (replies, _) = within(
            LIMIT,
            "permit_batch",
            permit_batch(&mut conn, &k, CHANNEL, &ops),
        )
        .await
        .expect("permit_batch");
        let mut replies = replies.into_iter();
        let mut next = || Acked {
            reply: replies.next().expect("a reply per operation"),
            unconfirmed: None,
        };
        let q = permits_granted("permit_acquire", next()).expect("q");
        assert!(
            matches!(q, PermitAcquire::Queued { .. }),
            "{attempt}: {q:?}"
        );
        let _ = added(next()).expect("add");
        let w = permits_granted("permit_poll", next()).expect("w");
        assert_eq!(w, PermitAcquire::Granted, "{attempt}");
    }
    let queue: Vec<String> = conn.zrange(&k.all[1], 0, -1).await.expect("zrange");
    assert_eq!(queue, vec!["q".to_owned()], "q queued once");
    assert_eq!(fields(&mut conn, &["qlen"]).await, [Some("1".into())]);
    assert_eq!(available(&mut conn).await, 0, "one added, w took it, once");
}

#[tokio::test]
async fn a_batch_withdraws_a_queued_request_and_a_collection_it_made_answers_a_lone_resend() {
    // A withdrawal in a batch finds its request's record (read up front), and a check-in that
    // collected in a batch is marked under its own number, so its resend sent alone (a batch
    // of one goes as permit_poll) answers GRANTED. (Kills permit_batch.lua:23's shifts and
    // :49's +3 -> +2.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(permit_try_set(&mut conn, &k, "s", 0).await.expect("set"));
    for (id, n) in [("w", 1), ("q", 5)] {
        assert!(matches!(
            acquire(&mut conn, id, n, true, LONG).await,
            PermitAcquire::Queued { .. }
        ));
    }
    let ops = [
        PermitOp::add("r", 1, number("r")),
        PermitOp::poll("w", LONG, number("poll w")),
        PermitOp::withdraw("q", None),
    ];
    let (replies, _) = within(
        LIMIT,
        "permit_batch",
        permit_batch(&mut conn, &k, CHANNEL, &ops),
    )
    .await
    .expect("permit_batch");
    let mut replies = replies.into_iter();
    let mut next = || Acked {
        reply: replies.next().expect("a reply per operation"),
        unconfirmed: None,
    };
    let _ = added(next()).expect("add");
    let w = permits_granted("permit_poll", next()).expect("w");
    assert_eq!(w, PermitAcquire::Granted);
    assert_eq!(withdrawn(next()).expect("withdraw"), Withdrawal::Withdrawn);
    let queue: u64 = conn.zcard(&k.all[1]).await.expect("zcard");
    assert_eq!(queue, 0, "q left the queue");
    assert_eq!(
        poll(&mut conn, "w").await,
        PermitAcquire::Granted,
        "the resend alone"
    );
    assert_eq!(available(&mut conn).await, 0);

    // A check-in before a withdrawal, neither record read by anything else first (y, the
    // head, is read by the settle's promote; x and z only up front).
    for id in ["y", "x", "z"] {
        assert!(matches!(
            acquire(&mut conn, id, 5, true, LONG).await,
            PermitAcquire::Queued { .. }
        ));
    }
    let ops = [
        PermitOp::poll("x", LONG, number("poll x")),
        PermitOp::withdraw("z", None),
    ];
    let (replies, _) = within(
        LIMIT,
        "permit_batch",
        permit_batch(&mut conn, &k, CHANNEL, &ops),
    )
    .await
    .expect("permit_batch");
    let mut replies = replies.into_iter();
    let mut next = || Acked {
        reply: replies.next().expect("a reply per operation"),
        unconfirmed: None,
    };
    let x = permits_granted("permit_poll", next()).expect("x");
    assert!(
        matches!(x, PermitAcquire::Queued { position: 1, .. }),
        "{x:?}"
    );
    assert_eq!(withdrawn(next()).expect("withdraw"), Withdrawal::Withdrawn);
}

// The tests that sharpen the net for redsem-mutants (a file of their own: this one is long).
#[path = "tests_net.rs"]
mod tests_net;

// The waiters counted as the waiters zset holds them.
#[path = "tests_waiters.rs"]
mod tests_waiters;
