//! The permit scripts' behaviours that `redsem-mutants` found no test pinning down (each test
//! names the mutants it kills): lease ends, lost state, keep-alive, the fast paths' limits,
//! session low marks. Helpers from `tests.rs`.

use std::time::{Duration, Instant};

use redis::AsyncCommands;
use redis::Value;
use redsem_test::{RedisServer, within};

use super::{
    CHANNEL, LIMIT, LONG, acquire, add, assert_wrong_type, available, connect, fields, number, pk,
    poll, pttl, server_millis, session, uncollected,
};
use crate::error::{Error, Result};
use crate::script::acks::Acked;
use crate::script::library::{PERMIT_ACQUIRE, PERMIT_ADD, PERMIT_BATCH, PERMIT_POLL};
use crate::script::permit::{
    self as script, Addition, PermitAcquire, PermitOp, Withdrawal, permit_batch, permits_granted,
    withdrawn,
};
use crate::script::test_support::plant_now;
use crate::session::{Caller, Hex, Session};

const MAX: i64 = (1 << 53) - 1;

/// Sleep until `at` (no more than `LIMIT`).
async fn sleep_until(at: Instant) {
    let left = at.saturating_duration_since(Instant::now());
    assert!(left <= LIMIT, "a wait of {left:?}");
    tokio::time::sleep(left).await;
}

#[tokio::test]
async fn a_batch_with_an_unknown_operation_is_refused_whole_and_applies_nothing() {
    // (Kills permit_batch.lua:25:if->true: an unknown kind read as a check-in.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 1)
            .await
            .expect("set")
    );
    let call = PERMIT_BATCH
        .key(&k.all[..])
        .arg(CHANNEL)
        .arg(session().id())
        .arg(session().low())
        .arg("m")
        .arg("r")
        .arg(1)
        .arg(number("r"))
        .arg("z")
        .arg("x");
    let reply: redis::RedisResult<Value> =
        within(LIMIT, "permit_batch", call.invoke_async(&mut conn)).await;
    let err = reply.expect_err("an unknown operation is refused");
    assert!(
        err.to_string().contains("unknown operation z"),
        "refused for another reason: {err}"
    );
    assert_eq!(
        available(&mut conn).await,
        1,
        "the addition before it is not applied"
    );
}

#[tokio::test]
async fn a_waiter_is_dropped_at_the_end_of_its_own_lease_whatever_leases_come_before_or_after() {
    // The next lease end (wnext) is the earliest of all: lowered by a shorter lease queued
    // behind a longer one (kills permit_prelude.lua:161:or->and#2), and, after a sweep that
    // leaves waiters, the earliest left, not put off by a longer lease queued next (kills
    // :320:or->and). On the real code the ends asserted hold however late each call comes.
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    assert!(
        super::permit_try_set(&mut conn, &pk(), "s", 0)
            .await
            .expect("set")
    );
    for (id, lease) in [
        ("long", LONG),
        ("first", Duration::from_millis(200)),
        ("short", Duration::from_secs(3)),
    ] {
        assert!(
            matches!(
                acquire(&mut conn, id, 1, true, lease).await,
                PermitAcquire::Queued { .. }
            ),
            "{id} queues"
        );
    }
    let short_queued = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        poll(&mut conn, "first").await,
        PermitAcquire::Gone,
        "first's lease ended, though the one queued before it ends later"
    );
    assert!(matches!(
        acquire(&mut conn, "late", 1, true, LONG).await,
        PermitAcquire::Queued { .. }
    ));
    sleep_until(short_queued + Duration::from_millis(3_300)).await;
    assert_eq!(
        poll(&mut conn, "short").await,
        PermitAcquire::Gone,
        "short's lease ended, though a longer one queued after the sweep"
    );
    assert!(matches!(
        poll(&mut conn, "long").await,
        PermitAcquire::Queued { position: 0, .. }
    ));
    assert!(matches!(
        poll(&mut conn, "late").await,
        PermitAcquire::Queued { position: 1, .. }
    ));
}

#[tokio::test]
async fn a_waiter_queued_after_the_records_were_lost_is_dropped_at_the_end_of_its_lease() {
    // The records vanish (partial loss) under a waiter: the call that rebuilds the counters
    // stores the next lease end it found, so a longer lease queued later does not put off
    // the end of a shorter one. (Kills permit_prelude.lua:320:drop.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    acquire(&mut conn, "ghost", 1, true, LONG).await;
    let () = conn.del(&k.all[3]).await.expect("DEL");
    assert!(matches!(
        acquire(&mut conn, "short", 1, true, Duration::from_secs(2)).await,
        PermitAcquire::Queued { .. }
    ));
    let short_queued = Instant::now();
    assert!(matches!(
        acquire(&mut conn, "late", 1, true, LONG).await,
        PermitAcquire::Queued { .. }
    ));
    sleep_until(short_queued + Duration::from_millis(2_300)).await;
    assert_eq!(
        poll(&mut conn, "short").await,
        PermitAcquire::Gone,
        "short's lease ended"
    );
    assert!(
        matches!(
            poll(&mut conn, "late").await,
            PermitAcquire::Queued { position: 0, .. }
        ),
        "late is next, past the ghost and short"
    );
}

#[tokio::test]
async fn a_waiter_told_its_place_is_lost_leaves_no_record_and_a_withdrawal_finds_nothing() {
    // (Kills permit_prelude.lua:186:drop: the record of a waiter whose queue vanished kept.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    acquire(&mut conn, "d", 1, true, LONG).await;
    let () = conn.del(&k.all[1]).await.expect("DEL");
    assert_eq!(poll(&mut conn, "d").await, PermitAcquire::Gone);
    assert_eq!(fields(&mut conn, &["r:d"]).await, [None], "d's record");
    assert_eq!(
        super::permit_withdraw(&mut conn, &k, "d")
            .await
            .expect("withdraw"),
        Withdrawal::Unknown,
        "nothing left to withdraw"
    );
    assert_eq!(
        fields(&mut conn, &["qlen", "wlen", "live"]).await,
        [Some("0".into()), Some("0".into()), None]
    );
}

#[tokio::test]
async fn a_foreign_count_is_reported_before_anything_is_written_even_with_the_records_lost() {
    // The records vanished (the sessions' index stayed) and the count holds a foreign value:
    // every script reports it and writes nothing, the addition (which reads the count only
    // when it needs it) included. (Kills permit_prelude.lua:244:eq->ne: the addition dropped
    // the sessions' index first.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 3)
            .await
            .expect("set")
    );
    let name = format!("s:{}", session().id());
    let before: Vec<(String, f64)> = conn
        .zrange_withscores(&k.all[5], 0, -1)
        .await
        .expect("zrange");
    assert_eq!(before.len(), 1, "{name} in the sessions' index: {before:?}");
    let () = conn.del(&[&k.all[3], &k.all[0]]).await.expect("DEL");
    let () = conn.rpush(&k.all[0], "foreign").await.expect("RPUSH");
    let mut c = conn.clone();
    let results: Vec<(&str, Result<()>)> = vec![
        ("add", super::permit_add(&mut c, &k, "r", 1).await.map(drop)),
        (
            "acquire",
            super::permit_acquire(&mut c, &k, "a", 1, true, LONG, CHANNEL)
                .await
                .map(drop),
        ),
        (
            "poll",
            super::permit_poll(&mut c, &k, "a", LONG).await.map(drop),
        ),
        (
            "withdraw",
            super::permit_withdraw(&mut c, &k, "a").await.map(drop),
        ),
        (
            "try_set",
            super::permit_try_set(&mut c, &k, "t", 1).await.map(drop),
        ),
        (
            "drain",
            super::permit_drain(&mut c, &k, "d").await.map(drop),
        ),
        (
            "available",
            super::permit_available(&mut c, &k).await.map(drop),
        ),
    ];
    assert_wrong_type(results, &k.all[0], 0);
    let after: Vec<(String, f64)> = conn
        .zrange_withscores(&k.all[5], 0, -1)
        .await
        .expect("zrange");
    assert_eq!(after, before, "the sessions' index is left alone");
    let others: usize = conn.exists(&k.all[1..]).await.expect("EXISTS");
    assert_eq!(others, 1, "nothing else was written");
}

#[tokio::test]
async fn a_grant_not_yet_collected_keeps_every_key_without_a_ttl() {
    // Nobody queues, but a grant waits to be collected: still live, so no key may expire
    // (nor be picked by a volatile-* eviction). (Kills permit_prelude.lua:345:or->and.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    acquire(&mut conn, "w", 1, true, LONG).await;
    assert_eq!(add(&mut conn, "r", 1).await, Addition::Applied(0));
    assert_eq!(uncollected(&mut conn).await, 1, "w was granted");
    assert_eq!(
        fields(&mut conn, &["qlen", "wlen", "live"]).await,
        [Some("0".into()), Some("1".into()), Some("1".into())]
    );
    // (The queue is empty, so absent.)
    assert_eq!(pttl(&mut conn, &k.all[1]).await, -2, "no queue");
    for key in k.all.iter().filter(|key| **key != k.all[1]) {
        assert_eq!(
            pttl(&mut conn, key).await,
            -1,
            "{key} while w's grant waits"
        );
    }
    assert_eq!(poll(&mut conn, "w").await, PermitAcquire::Granted);
    let ttl = pttl(&mut conn, &k.all[3]).await;
    assert!(ttl > 0, "idle once collected: {ttl}");
}

#[tokio::test]
async fn an_addition_beyond_the_range_while_a_grant_is_uncollected_changes_nothing() {
    // Nobody queues, a grant is uncollected: the addition adds first and looks after (the
    // count not read up front); past the range it is taken back and answered as such, not
    // marked. (Kills permit_prelude.lua:444:if->true.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    assert!(
        super::permit_try_set(&mut conn, &pk(), "s", 0)
            .await
            .expect("set")
    );
    acquire(&mut conn, "w", 1, true, LONG).await;
    assert_eq!(
        add(&mut conn, "max", MAX).await,
        Addition::Applied(MAX - 1),
        "w granted one"
    );
    assert_eq!(
        add(&mut conn, "over", 2).await,
        Addition::OutOfRange(MAX - 1)
    );
    assert_eq!(available(&mut conn).await, MAX - 1);
    assert_eq!(
        add(&mut conn, "over", 1).await,
        Addition::Applied(MAX),
        "the call was not marked: sent again, it is applied"
    );
    assert_eq!(poll(&mut conn, "w").await, PermitAcquire::Granted);
}

#[tokio::test]
async fn a_batch_that_queues_and_withdraws_on_an_idle_semaphore_gives_the_keys_it_made_a_ttl() {
    // The ticket counter is made by the batch's wait request, and nothing is live when the
    // batch ends: the counter expires with the other idle keys, it does not stay forever.
    // (Kills permit_prelude.lua:370:+1->+0.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    let meta_before: bool = conn.exists(&k.all[4]).await.expect("EXISTS");
    assert!(!meta_before, "no ticket counter yet");
    let ops = [
        PermitOp::acquire("x", 1, true, LONG, number("x")),
        PermitOp::withdraw("x", None),
    ];
    let (replies, _) = within(
        LIMIT,
        "permit_batch",
        permit_batch(&mut conn, &k, CHANNEL, session(), &ops),
    )
    .await
    .expect("permit_batch");
    let mut replies = replies.into_iter();
    let mut next = || Acked {
        reply: replies.next().expect("a reply per operation"),
        unconfirmed: None,
    };
    assert!(matches!(
        permits_granted("permit_acquire", next()).expect("acquire"),
        PermitAcquire::Queued { position: 0, .. }
    ));
    assert_eq!(withdrawn(next()).expect("withdraw"), Withdrawal::Withdrawn);
    let meta: bool = conn.exists(&k.all[4]).await.expect("EXISTS");
    assert!(meta, "the ticket counter was made");
    // (Absolute expiry times: two PTTLs read a moment apart may differ by a millisecond.)
    let expiry = |key: &String| redis::cmd("PEXPIRETIME").arg(key).to_owned();
    let meta: i64 = expiry(&k.all[4])
        .query_async(&mut conn)
        .await
        .expect("PEXPIRETIME");
    let records: i64 = expiry(&k.all[3])
        .query_async(&mut conn)
        .await
        .expect("PEXPIRETIME");
    assert!(
        meta > 0 && meta == records,
        "the ticket counter expires with the records: at {meta}, the records at {records}"
    );
}

#[tokio::test]
async fn a_state_of_a_newer_layout_is_refused_untouched_even_when_nothing_waits() {
    // A quiet state (nothing waits, nothing due, the caller's session record fresh) written
    // by a newer layout: the uncontended fast paths refuse it as the general path does,
    // before any write. (Kills permit_prelude.lua:528:or->and#2.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    let now = server_millis(&mut conn).await;
    let own = format!("s:{}", session().id());
    let record = format!("1|{}|0|", now + 600_000);
    let () = conn.set(&k.all[0], 5).await.expect("SET");
    let () = conn
        .hset_multiple(
            &k.all[3],
            &[
                ("keep", (now + 660_000).to_string()),
                ("prune", (now + 610_000).to_string()),
                ("wide", "-".to_owned()),
                ("layout", "3".to_owned()),
                (own.as_str(), record.clone()),
            ],
        )
        .await
        .expect("HSET");
    let results = [
        (
            "acquire",
            super::permit_acquire(&mut conn, &k, "a", 1, false, LONG, CHANNEL)
                .await
                .map(drop),
        ),
        (
            "add",
            super::permit_add(&mut conn, &k, "r", 1).await.map(drop),
        ),
    ];
    for (script, result) in results {
        match result {
            Err(Error::Incompatible { found, ours, .. }) => {
                assert_eq!((found.as_str(), ours.as_str()), ("3", "2"), "{script}");
            }
            other => panic!("{script} on layout 3: {other:?}"),
        }
    }
    let count: i64 = conn.get(&k.all[0]).await.expect("GET");
    assert_eq!(count, 5, "the count untouched");
    assert_eq!(
        fields(&mut conn, &[own.as_str()]).await,
        [Some(record)],
        "the session record untouched"
    );
}

#[tokio::test]
async fn a_session_record_past_its_expiry_is_dropped_by_a_call_in_the_millisecond_pruning_falls_due()
 {
    // Pruning is due from the very millisecond named by `prune` on: a grant then is not the
    // uncontended fast path (which drops nothing) but the general path, which drops the
    // expired record. Set by a script in the same MULTI as the grant, `prune` is the grant's
    // own millisecond or one just before it. The grants come from a client whose earlier
    // calls are all answered (its low mark is the grant's own number), so that the fast path
    // would take them if pruning were not due: a caller with other marks kept never takes
    // it. (Kills permit_prelude.lua:533:lt->le and :533:now-5, each in nearly every round;
    // the real code passes whatever the times.)
    const PRUNE_NOW: &str = "local t = redis.call('TIME') \
        local now = t[1] * 1000 + math.floor(t[2] / 1000) \
        redis.call('HSET', KEYS[1], 'prune', string.format('%d', now)) \
        return now";
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 100)
            .await
            .expect("set")
    );
    let client = Session::new();
    for round in 0..20 {
        let id = format!("a{round}");
        let seq = client.open();
        let () = conn.hset(&k.all[3], "s:old", "1|1|0|").await.expect("HSET");
        let () = conn.zadd(&k.all[5], "s:old", 1).await.expect("ZADD");
        let (_, granted): (i64, Vec<String>) = within(
            LIMIT,
            "MULTI",
            redis::pipe()
                .atomic()
                .cmd("EVAL")
                .arg(PRUNE_NOW)
                .arg(1)
                .arg(&k.all[3])
                .cmd("FCALL")
                .arg(PERMIT_ACQUIRE.function())
                .arg(k.all.len())
                .arg(&k.all[..])
                .arg(&id)
                .arg(1)
                .arg("try")
                .arg(LONG.as_millis().to_string())
                .arg(CHANNEL)
                .arg(Hex(seq.n()))
                .arg(client.id())
                .arg(Hex(client.low()))
                .query_async(&mut conn),
        )
        .await
        .expect("MULTI");
        drop(seq);
        assert_eq!(granted, ["GRANTED"], "round {round}");
        assert_eq!(
            fields(&mut conn, &["s:old"]).await,
            [None],
            "round {round}: the expired session record"
        );
        let indexed: Option<f64> = conn.zscore(&k.all[5], "s:old").await.expect("ZSCORE");
        assert_eq!(indexed, None, "round {round}: its index entry");
    }
    assert_eq!(available(&mut conn).await, 80, "one permit per grant");
}

#[tokio::test]
async fn an_acquire_on_a_semaphore_never_set_answers_busy_when_nothing_waits() {
    // The bookkeeping is in place and quiet (a drain made it) but the count was never set:
    // the uncontended fast path leaves it to the general path. (Kills
    // permit_prelude.lua:557:and->or.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert_eq!(
        super::permit_drain(&mut conn, &k, "d")
            .await
            .expect("drain")
            .0,
        0
    );
    let quiet = fields(&mut conn, &["keep", "prune", "wide", "live"]).await;
    assert!(
        quiet[..3].iter().all(Option::is_some) && quiet[3].is_none(),
        "{quiet:?}"
    );
    assert_eq!(
        acquire(&mut conn, "t", 1, false, LONG).await,
        PermitAcquire::Busy {
            available: 0,
            waiters: 0
        }
    );
    let state = script::permit_available(&mut conn, &k)
        .await
        .expect("available");
    assert!(!state.set, "still never set");
}

#[tokio::test]
async fn a_withdrawal_raises_its_sessions_low_mark_so_a_late_copy_of_a_call_given_up_is_not_applied()
 {
    // A client gives up on an addition whose first copy is still on its way; its next call,
    // a withdrawal naming an unanswered call, carries a low mark past the addition's number.
    // The late copy that arrives then is stale: never applied. (Kills
    // permit_withdraw.lua:12:or->and#2: the withdrawal's low mark read as 0.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    let client = Session::new();
    let first = client.open();
    assert_eq!(
        script::permit_add(&mut conn, &k, "r1", 1, Caller::new(&client, first.n()))
            .await
            .expect("add"),
        Addition::Applied(1)
    );
    drop(first);
    let given_up = client.open();
    let given_up_n = given_up.n();
    drop(given_up);
    let pending = client.open();
    assert_eq!(
        script::permit_withdraw(&mut conn, &k, "x", &client, Some(pending.n()))
            .await
            .expect("withdraw"),
        Withdrawal::Unknown
    );
    drop(pending);
    let late = script::permit_add(&mut conn, &k, "r2", 1, Caller::new(&client, given_up_n))
        .await
        .expect("the late copy");
    assert_eq!(late, Addition::Repeated(1), "the late copy is not applied");
    assert_eq!(available(&mut conn).await, 1);
}

#[tokio::test]
async fn a_check_in_that_collects_raises_its_sessions_low_mark_so_a_late_copy_of_a_call_given_up_is_not_applied()
 {
    // As for the withdrawal: the client gives up on an addition whose first copy is still on
    // its way; its next call, a check-in that collects a grant, carries a low mark past the
    // addition's number, and the late copy is then stale. (Kills permit_poll.lua:12:or->and#2,
    // listed as equivalent in equivalent.txt: the check-in's low mark read as 0.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    let client = Session::new();
    let first = client.open();
    assert_eq!(
        script::permit_add(&mut conn, &k, "r0", 0, Caller::new(&client, first.n()))
            .await
            .expect("add"),
        Addition::Applied(0)
    );
    drop(first);
    let enqueue = client.open();
    let queued = script::permit_acquire(
        &mut conn,
        &k,
        "w",
        1,
        true,
        LONG,
        CHANNEL,
        Caller::new(&client, enqueue.n()),
    )
    .await
    .expect("acquire");
    assert!(matches!(queued, PermitAcquire::Queued { .. }), "{queued:?}");
    drop(enqueue);
    assert_eq!(
        add(&mut conn, "r1", 1).await,
        Addition::Applied(0),
        "w granted"
    );
    let given_up = client.open();
    let given_up_n = given_up.n();
    drop(given_up);
    let check_in = client.open();
    assert_eq!(
        script::permit_poll(&mut conn, &k, "w", LONG, Caller::new(&client, check_in.n()))
            .await
            .expect("poll"),
        PermitAcquire::Granted
    );
    drop(check_in);
    let late = script::permit_add(&mut conn, &k, "r2", 1, Caller::new(&client, given_up_n))
        .await
        .expect("the late copy");
    assert_eq!(late, Addition::Repeated(0), "the late copy is not applied");
    assert_eq!(available(&mut conn).await, 0);
}

#[tokio::test]
async fn a_count_set_again_by_a_new_session_meeting_a_foreign_index_reports_it_and_sets_nothing() {
    // A try_set marks its call before it writes the count: a new session's record registers
    // its expiry in the index (applied) first, so a foreign value there stops the call before
    // the count is written. (Kills permit_try_set.lua's mark and SET swapped.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 3)
            .await
            .expect("set")
    );
    let keep: Option<String> = conn.hget(&k.all[3], "keep").await.expect("hget");
    assert!(
        keep.is_some(),
        "bookkeeping kept: the index is not checked at load"
    );
    let () = conn.del(&k.all[0]).await.expect("del");
    let () = conn.del(&k.all[5]).await.expect("del");
    let () = conn.rpush(&k.all[5], "foreign").await.expect("rpush");
    let fresh = Session::new();
    let seq = fresh.open();
    let result = script::permit_try_set(&mut conn, &k, "t", 5, Caller::new(&fresh, seq.n()))
        .await
        .map(drop);
    assert_wrong_type(vec![("try_set", result)], &k.all[5], 5);
    let count: Option<i64> = conn.get(&k.all[0]).await.expect("get");
    assert_eq!(count, None, "nothing written");
}

#[tokio::test]
async fn a_session_index_made_again_on_an_idle_semaphore_gets_the_idle_ttl() {
    // Idle keys expire together; one of them lost alone (a volatile-* eviction picks keys one
    // by one) and made again by a new session's record must get the same TTL, or it would
    // never expire. (Kills the fresh-keys test of keep() reading `fresh_meta and
    // fresh_applied`.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 3)
            .await
            .expect("set")
    );
    assert!(
        pttl(&mut conn, &k.all[5]).await > 0,
        "idle: the index expires"
    );
    let () = conn.del(&k.all[5]).await.expect("del");
    let fresh = Session::new();
    let seq = fresh.open();
    let added = script::permit_add(&mut conn, &k, "r", 1, Caller::new(&fresh, seq.n()))
        .await
        .expect("add");
    assert_eq!(added, Addition::Applied(4));
    let ttl = pttl(&mut conn, &k.all[5]).await;
    assert!(ttl > 0, "the index made again expires with the rest: {ttl}");
}

#[tokio::test]
async fn a_foreign_value_at_the_queue_or_the_waiters_key_is_left_to_the_calls_that_use_it() {
    // With the bookkeeping in place a key is checked at its first access, not by every call
    // (load() checks them all only when there is no bookkeeping): while nobody waits, the
    // count's own calls (available, an addition, a grant) touch neither the queue nor the
    // waiters, and answer as usual. (Kills permit_prelude.lua:125:gt->ge: promote() reading
    // an empty queue, and :293:if->true: the dead-waiter sweep made with no waiter.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 3)
            .await
            .expect("set")
    );
    for (what, key) in [("queue", &k.all[1]), ("waiters", &k.all[2])] {
        let () = conn.set(key, "foreign").await.expect("SET");
        assert_eq!(available(&mut conn).await, 3, "available, foreign {what}");
        assert_eq!(
            add(&mut conn, &format!("r-{what}"), 1).await,
            Addition::Applied(4),
            "an addition, foreign {what}"
        );
        assert_eq!(
            acquire(&mut conn, &format!("a-{what}"), 1, false, LONG).await,
            PermitAcquire::Granted,
            "a grant, foreign {what}"
        );
        let () = conn.del(key).await.expect("DEL");
    }
    assert_eq!(available(&mut conn).await, 3);
}

/// Replace the waiters key by a foreign value for `during`, then put it back as it was.
async fn with_foreign_waiters<T>(
    conn: &mut redis::aio::MultiplexedConnection,
    during: impl AsyncFnOnce(&mut redis::aio::MultiplexedConnection) -> T,
) -> T {
    let k = pk();
    let hidden = format!("{}:hidden", k.all[2]);
    let () = conn.rename(&k.all[2], &hidden).await.expect("RENAME");
    let () = conn.set(&k.all[2], "foreign").await.expect("SET");
    let result = during(conn).await;
    let () = conn.del(&k.all[2]).await.expect("DEL");
    let () = conn.rename(&hidden, &k.all[2]).await.expect("RENAME");
    result
}

#[tokio::test]
async fn a_check_in_stopped_by_a_foreign_waiters_key_leaves_the_request_as_it_was() {
    // A check-in reports the foreign value at the waiters key and changes nothing of the
    // request: a grant not collected is still there to collect, and a waiter whose place in
    // the queue was lost is still there to withdraw. (Kills permit_prelude.lua:178:swap and
    // :185:swap: the request's record dropped before the waiters key was found foreign.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    assert!(matches!(
        acquire(&mut conn, "g", 1, true, LONG).await,
        PermitAcquire::Queued { .. }
    ));
    assert_eq!(
        add(&mut conn, "r", 1).await,
        Addition::Applied(0),
        "g granted"
    );
    let collect = with_foreign_waiters(&mut conn, async |c| {
        super::permit_poll(c, &k, "g", LONG).await.map(drop)
    })
    .await;
    assert_wrong_type(vec![("collect", collect)], &k.all[2], 2);
    assert_eq!(
        poll(&mut conn, "g").await,
        PermitAcquire::Granted,
        "the grant is still there to collect"
    );
    assert_eq!(available(&mut conn).await, 0);

    assert!(matches!(
        acquire(&mut conn, "d", 1, true, LONG).await,
        PermitAcquire::Queued { position: 0, .. }
    ));
    let () = conn.del(&k.all[1]).await.expect("DEL");
    let renew = with_foreign_waiters(&mut conn, async |c| {
        super::permit_poll(c, &k, "d", LONG).await.map(drop)
    })
    .await;
    assert_wrong_type(vec![("renew", renew)], &k.all[2], 2);
    assert_eq!(
        super::permit_withdraw(&mut conn, &k, "d")
            .await
            .expect("withdraw"),
        Withdrawal::Withdrawn,
        "d is still there to withdraw"
    );
}

#[tokio::test]
async fn an_addition_to_a_count_redis_cannot_add_to_reports_it_as_foreign_and_changes_nothing() {
    // A count of "007" holds digits, but INCRBY refuses it. The addition adds without reading
    // the count first (INCRBY answers it) unless someone's waiter lease is due: idle, or with
    // a grant uncollected, Redis's refusal is reported as a foreign count and nothing changes.
    // The callers are new sessions (a record to make: the general path, not fast_add).
    // (Kills permit_prelude.lua:244:gt->ge and :244:or->and#4, which read the count first
    // there: the addition then fails in its save with Redis's own error; and :244:and->or
    // and :244:gt->ge#2 likewise.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    let add_as_new_session = async |conn: &mut redis::aio::MultiplexedConnection| {
        let client = Session::new();
        let seq = client.open();
        script::permit_add(conn, &k, "r", 1, Caller::new(&client, seq.n()))
            .await
            .map(drop)
    };
    let () = conn.set(&k.all[0], "007").await.expect("SET");
    let idle = add_as_new_session(&mut conn).await;
    assert_wrong_type(vec![("add, idle", idle)], &k.all[0], 0);
    let count: String = conn.get(&k.all[0]).await.expect("GET");
    assert_eq!(count, "007", "idle: the count untouched");

    let () = conn.set(&k.all[0], 0).await.expect("SET");
    assert!(matches!(
        acquire(&mut conn, "w", 1, true, LONG).await,
        PermitAcquire::Queued { .. }
    ));
    assert_eq!(
        add(&mut conn, "g", 1).await,
        Addition::Applied(0),
        "w granted"
    );
    let () = conn.set(&k.all[0], "007").await.expect("SET");
    let granted = add_as_new_session(&mut conn).await;
    assert_wrong_type(vec![("add, w's grant uncollected", granted)], &k.all[0], 0);
    let count: String = conn.get(&k.all[0]).await.expect("GET");
    assert_eq!(count, "007", "w's grant uncollected: the count untouched");
    assert_eq!(uncollected(&mut conn).await, 1, "w's grant still there");
}

#[tokio::test]
async fn a_grant_on_a_count_redis_cannot_add_to_reports_it_as_foreign() {
    // Every script reports a foreign value at one of its keys as WRONGTYPE. A count of "007"
    // (or "-0") is one INCRBY refuses: read_integer() takes it for foreign, so a grant reports
    // it, by the general path (the test session keeps other marks) and by the fast path (a
    // client whose earlier calls are answered), instead of taking 7 and failing at its INCRBY
    // with Redis's "value is not an integer" (found by the mutation runs, fixed).
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 3)
            .await
            .expect("set")
    );
    let client = Session::new();
    let first = client.open();
    assert_eq!(
        script::permit_add(&mut conn, &k, "r", 0, Caller::new(&client, first.n()))
            .await
            .expect("add"),
        Addition::Applied(3)
    );
    drop(first);
    let () = conn.set(&k.all[0], "007").await.expect("SET");
    let general = super::permit_acquire(&mut conn, &k, "a", 1, false, LONG, CHANNEL)
        .await
        .map(drop);
    let seq = client.open();
    let fast = script::permit_acquire(
        &mut conn,
        &k,
        "b",
        1,
        false,
        LONG,
        CHANNEL,
        Caller::new(&client, seq.n()),
    )
    .await
    .map(drop);
    assert_wrong_type(vec![("general", general), ("fast", fast)], &k.all[0], 0);
}

#[tokio::test]
async fn a_batch_ending_in_a_lone_unknown_operation_is_refused_whole_and_writes_nothing() {
    // An unknown kind is refused wherever it stands, even as the very last argument (with
    // none of its own after it): before anything is applied or written, the new session's
    // index entry included. (Kills permit_batch.lua:15:le->lt: the last argument left
    // unchecked, then read as a check-in.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 1)
            .await
            .expect("set")
    );
    let client = Session::new();
    let seq = client.open();
    let call = PERMIT_BATCH
        .key(&k.all[..])
        .arg(CHANNEL)
        .arg(client.id())
        .arg(Hex(client.low()))
        .arg("m")
        .arg("r")
        .arg(1)
        .arg(Hex(seq.n()))
        .arg("z");
    let reply: redis::RedisResult<Value> =
        within(LIMIT, "permit_batch", call.invoke_async(&mut conn)).await;
    let err = reply.expect_err("an unknown operation is refused");
    assert!(
        err.to_string().contains("unknown operation z"),
        "refused for another reason: {err}"
    );
    assert_eq!(
        available(&mut conn).await,
        1,
        "the addition before it is not applied"
    );
    let name = format!("s:{}", client.id());
    assert_eq!(
        fields(&mut conn, &[name.as_str()]).await,
        [None],
        "no session record"
    );
    let indexed: Option<f64> = conn.zscore(&k.all[5], &name).await.expect("ZSCORE");
    assert_eq!(indexed, None, "no entry in the sessions' index");
}

#[tokio::test]
async fn a_batch_keeps_the_idle_bookkeeping_past_the_longest_waiter_lease_it_set() {
    // A batch queues a request with a waiter lease longer than a session record lives, then
    // withdraws it, which makes the client's session record: idle at the end, the keys are
    // kept an idle while past the latest deadline the batch set, the lease's end, not only
    // past the session record's expiry. (Kills permit_prelude.lua:92:if->true: the record's
    // expiry, renewed after the lease was set, taken as the latest deadline.)
    const LEASE: Duration = Duration::from_secs(20 * 60);
    const KEEP_IDLE_MS: i64 = 60_000;
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    let client = Session::new();
    let seq = client.open();
    let before = server_millis(&mut conn).await;
    let ops = [
        PermitOp::acquire("x", 1, true, LEASE, seq.n()),
        PermitOp::withdraw("x", Some(seq.n())),
    ];
    let (replies, _) = within(
        LIMIT,
        "permit_batch",
        permit_batch(&mut conn, &k, CHANNEL, &client, &ops),
    )
    .await
    .expect("permit_batch");
    drop(seq);
    let mut replies = replies.into_iter();
    let mut next = || Acked {
        reply: replies.next().expect("a reply per operation"),
        unconfirmed: None,
    };
    assert!(matches!(
        permits_granted("permit_acquire", next()).expect("acquire"),
        PermitAcquire::Queued { position: 0, .. }
    ));
    assert_eq!(withdrawn(next()).expect("withdraw"), Withdrawal::Withdrawn);
    let lease_end = before + i64::try_from(LEASE.as_millis()).expect("ms");
    for key in [&k.all[3], &k.all[5]] {
        let expiry: i64 = redis::cmd("PEXPIRETIME")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("PEXPIRETIME");
        assert!(
            expiry >= lease_end + KEEP_IDLE_MS,
            "{key} expires at {expiry}, before an idle while past the lease's end {lease_end}"
        );
    }
}

#[tokio::test]
async fn bookkeeping_rebuilt_after_the_records_were_lost_expires_once_nothing_waits() {
    // The records vanish under a live semaphore (its keys without TTL); the waiter left in the
    // queue has no record and its lease ends. The next call, which marks nothing (no session
    // expiry, no deadline), rebuilds the counters, drops the waiter and, idle then, gives the
    // records it writes back and the ticket counter the idle TTL: they do not stay forever.
    // (Kills permit_prelude.lua:342:if->false and :342:eq->ne#2: no deadline taken then.)
    const KEEP_IDLE_MS: i64 = 60_000;
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    assert!(matches!(
        acquire(&mut conn, "x", 1, true, Duration::from_millis(100)).await,
        PermitAcquire::Queued { .. }
    ));
    let queued = Instant::now();
    assert_eq!(pttl(&mut conn, &k.all[4]).await, -1, "live: no TTL");
    let () = conn.del(&k.all[3]).await.expect("DEL");
    sleep_until(queued + Duration::from_millis(300)).await;
    let state = script::permit_available(&mut conn, &k)
        .await
        .expect("available");
    assert_eq!(state.waiters, 0, "x's lease ended");
    for key in [&k.all[3], &k.all[4]] {
        let ttl = pttl(&mut conn, key).await;
        assert!(
            ttl > 0 && ttl <= KEEP_IDLE_MS,
            "{key} kept an idle while, no longer: {ttl}"
        );
    }
}

#[tokio::test]
async fn records_without_their_keep_field_are_taken_as_no_bookkeeping_even_by_an_uncontended_grant()
{
    // Records that lack `keep` (the field every write of them sets) hold no bookkeeping a call
    // may rely on: an uncontended grant does not take the fast path on them, but the general
    // one, which sets keep and gives the keys the idle TTL. (Kills permit_prelude.lua:528:and->or:
    // quiet() asking for keep only when prune or wide is missing too.)
    const KEEP_IDLE_MS: i64 = 60_000;
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    let client = Session::new();
    let seq = client.open();
    let now = server_millis(&mut conn).await;
    let own = format!("s:{}", client.id());
    let record = format!("{:x}|{:x}|0|", seq.n(), now + 600_000);
    let () = conn.set(&k.all[0], 5).await.expect("SET");
    let () = conn
        .hset_multiple(
            &k.all[3],
            &[
                ("prune", (now + 610_000).to_string()),
                ("wide", "-".to_owned()),
                ("layout", "2".to_owned()),
                (own.as_str(), record),
            ],
        )
        .await
        .expect("HSET");
    assert_eq!(
        script::permit_acquire(
            &mut conn,
            &k,
            "a",
            1,
            false,
            LONG,
            CHANNEL,
            Caller::new(&client, seq.n())
        )
        .await
        .expect("acquire"),
        PermitAcquire::Granted
    );
    drop(seq);
    assert_eq!(available(&mut conn).await, 4);
    let keep = fields(&mut conn, &["keep"]).await;
    assert!(keep[0].is_some(), "keep set: {keep:?}");
    let ttl = pttl(&mut conn, &k.all[3]).await;
    assert!(
        ttl > 0 && ttl <= KEEP_IDLE_MS,
        "the records kept an idle while: {ttl}"
    );
}

#[tokio::test]
async fn a_waiter_is_dropped_in_the_very_millisecond_its_lease_ends() {
    // A waiter lease ends at its millisecond: a check-in in that millisecond finds the waiter
    // gone. Set by a script in the same MULTI as the check-in, the lease's end (and wnext) is
    // the check-in's own millisecond or one just before it. (Kills
    // permit_prelude.lua:293:ge->gt in nearly every round; the real code passes whatever the
    // times.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    for round in 0..20 {
        let id = format!("w{round}");
        assert!(
            matches!(
                acquire(&mut conn, &id, 1, true, LONG).await,
                PermitAcquire::Queued { position: 0, .. }
            ),
            "round {round}"
        );
        let (_, reply): (String, Vec<String>) = within(
            LIMIT,
            "MULTI",
            plant_now(&k.all[2], &id, &k.all[3], "wnext")
                .cmd("FCALL")
                .arg(PERMIT_POLL.function())
                .arg(k.all.len())
                .arg(&k.all[..])
                .arg(&id)
                .arg(LONG.as_millis().to_string())
                .arg(Hex(number(&format!("poll {id}"))))
                .arg(session().id())
                .arg(Hex(session().low()))
                .query_async(&mut conn),
        )
        .await
        .expect("MULTI");
        assert_eq!(reply, ["GONE"], "round {round}");
        assert_eq!(
            fields(&mut conn, &[format!("r:{id}").as_str()]).await,
            [None],
            "round {round}: the record"
        );
    }
}

#[tokio::test]
async fn a_waiter_is_dropped_at_the_end_of_its_lease_after_an_earlier_waiter_was() {
    // A waiter whose lease ended is taken out of the waiters, not only out of the queue and
    // the records: later calls then still know who waits, and drop the next one at the end
    // of its own lease. (Kills permit_prelude.lua:296:drop: the dead waiter left in the
    // waiters, swept again by the next call, which then counts no waiter left.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    assert!(matches!(
        acquire(&mut conn, "a", 1, true, Duration::from_millis(200)).await,
        PermitAcquire::Queued { .. }
    ));
    assert!(matches!(
        acquire(&mut conn, "b", 1, true, Duration::from_secs(3)).await,
        PermitAcquire::Queued { .. }
    ));
    let queued = Instant::now();
    sleep_until(queued + Duration::from_millis(300)).await;
    for call in 0..2 {
        let state = script::permit_available(&mut conn, &k)
            .await
            .expect("available");
        assert_eq!(state.waiters, 1, "call {call}: a's lease ended, b waits");
    }
    sleep_until(queued + Duration::from_millis(3_300)).await;
    let state = script::permit_available(&mut conn, &k)
        .await
        .expect("available");
    assert_eq!(state.waiters, 0, "b's lease ended");
    assert_eq!(poll(&mut conn, "b").await, PermitAcquire::Gone);
}

#[tokio::test]
async fn an_uncontended_grant_and_release_of_a_client_whose_calls_are_answered_apply_once() {
    // A client whose earlier calls are all answered (its low mark is the call's own number)
    // takes and gives back permits by the fast paths while nobody waits: each applied once,
    // and a resend answers as the call did. (Kills permit_prelude.lua:586:if->false: every
    // fast addition taken back and answered out of range.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    let client = Session::new();
    let seq = client.open();
    assert!(
        script::permit_try_set(&mut conn, &k, "s", 3, Caller::new(&client, seq.n()))
            .await
            .expect("set")
    );
    drop(seq);
    let seq = client.open();
    let n = seq.n();
    let take = async |conn: &mut redis::aio::MultiplexedConnection| {
        script::permit_acquire(
            conn,
            &k,
            "a",
            2,
            false,
            LONG,
            CHANNEL,
            Caller::new(&client, n),
        )
        .await
        .expect("acquire")
    };
    assert_eq!(take(&mut conn).await, PermitAcquire::Granted);
    assert_eq!(take(&mut conn).await, PermitAcquire::Granted, "resent");
    drop(seq);
    assert_eq!(available(&mut conn).await, 1, "taken once");
    let seq = client.open();
    let n = seq.n();
    let give = async |conn: &mut redis::aio::MultiplexedConnection| {
        script::permit_add(conn, &k, "r", 2, Caller::new(&client, n))
            .await
            .expect("add")
    };
    assert_eq!(give(&mut conn).await, Addition::Applied(3));
    assert_eq!(give(&mut conn).await, Addition::Repeated(3), "resent");
    drop(seq);
    assert_eq!(available(&mut conn).await, 3, "given back once");
}

#[tokio::test]
async fn an_addition_in_the_millisecond_a_granted_waiter_expires_counts_its_grant_given_back() {
    // A waiter granted but never collected gives its permits back when its lease ends. An
    // addition made in that very millisecond reads the count first (the give-back needs it),
    // so it answers the count with both the permit given back and its own. Set by a script
    // in the same MULTI as the addition, the lease's end (and wnext) is the addition's own
    // millisecond or one just before it. (Kills permit_prelude.lua:244:ge->gt, which leaves
    // the count unread in that millisecond.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    for round in 0..20 {
        let id = format!("w{round}");
        assert!(
            matches!(
                acquire(&mut conn, &id, 1, true, LONG).await,
                PermitAcquire::Queued { position: 0, .. }
            ),
            "round {round}"
        );
        assert_eq!(
            add(&mut conn, &format!("grant {id}"), 1).await,
            Addition::Applied(0),
            "round {round}: {id} granted, not collected"
        );
        let (_, reply): (String, (String, i64)) = within(
            LIMIT,
            "MULTI",
            plant_now(&k.all[2], &id, &k.all[3], "wnext")
                .cmd("FCALL")
                .arg(PERMIT_ADD.function())
                .arg(k.all.len())
                .arg(&k.all[..])
                .arg("r")
                .arg(1)
                .arg(Hex(number(&format!("add {id}"))))
                .arg(session().id())
                .arg(Hex(session().low()))
                .query_async(&mut conn),
        )
        .await
        .expect("MULTI");
        assert_eq!(
            reply,
            ("ADDED".to_owned(), 2),
            "round {round}: the grant given back and the addition"
        );
        let count: i64 = conn.get(&k.all[0]).await.expect("GET");
        assert_eq!(count, 2, "round {round}");
        // Back to none available for the next round.
        assert_eq!(
            add(&mut conn, &format!("take {id}"), -2).await,
            Addition::Applied(0)
        );
    }
}

#[tokio::test]
async fn the_last_waiter_leaving_keeps_the_bookkeeping_an_idle_while_past_every_session_record() {
    // While someone waits, keep follows the waiters' leases (here 20 minutes); once the last
    // one leaves, the bookkeeping is kept an idle while (60 s) past the latest session
    // record's expiry (600 s after its renewal), no longer, and every key gets that TTL.
    // (Kills permit_prelude.lua:359:drop, which leaves keep, and the TTL, at the gone
    // waiter's lease.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    let start = server_millis(&mut conn).await;
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    assert!(matches!(
        acquire(&mut conn, "w", 1, true, Duration::from_secs(1200)).await,
        PermitAcquire::Queued { position: 0, .. }
    ));
    assert_eq!(
        super::permit_withdraw(&mut conn, &k, "w")
            .await
            .expect("withdraw"),
        Withdrawal::Withdrawn
    );
    let now = server_millis(&mut conn).await;
    let keep: i64 = fields(&mut conn, &["keep"]).await[0]
        .as_deref()
        .expect("keep")
        .parse()
        .expect("a number");
    assert!(
        (start + 600_000 + 60_000..=now + 600_000 + 60_000).contains(&keep),
        "keep {keep}, from {start} to {now}"
    );
    let ttl = pttl(&mut conn, &k.all[3]).await;
    assert!(
        (600_000 + 60_000 - 10_000..=600_000 + 60_000).contains(&ttl),
        "TTL {ttl}"
    );
}

#[tokio::test]
async fn a_batch_withdrawal_naming_a_call_its_low_mark_passed_gives_nothing_back() {
    // A batch whose low mark has passed a call (its answer arrived: the permits it took are
    // the client's) and that withdraws naming that call gives nothing back, even while the
    // call's mark is still among the session's marks read by the batch's first operation (a
    // later mark kept them). (Kills permit_prelude.lua:484:if->true, which gives them back.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    let batch = |low: &str, ops: &[&str]| {
        let mut cmd = redis::cmd("FCALL");
        cmd.arg(PERMIT_BATCH.function())
            .arg(k.all.len())
            .arg(&k.all[..])
            .arg(CHANNEL)
            .arg("c")
            .arg(low)
            .arg(ops);
        cmd
    };
    // (Set by a call of another session, which loads the library.)
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 3)
            .await
            .expect("set")
    );
    // Call 2 takes 2 permits; call 4 is made while 2 is unanswered (its mark kept).
    let granted: Vec<Vec<Vec<String>>> = batch("2", &["a", "a", "2", "try", "30000", "2"])
        .query_async(&mut conn)
        .await
        .expect("acquire");
    assert_eq!(granted, vec![vec![vec!["GRANTED".to_owned()]]]);
    let added: Vec<Vec<Vec<String>>> = batch("2", &["m", "x", "0", "4"])
        .query_async(&mut conn)
        .await
        .expect("add");
    assert_eq!(added, vec![vec![vec!["ADDED".to_owned(), "1".to_owned()]]]);
    // Call 2 answered (low mark 4): a batch adds (call 5), then withdraws naming call 2.
    let replies: Vec<Vec<Vec<String>>> = batch("4", &["m", "y", "0", "5", "w", "a", "2"])
        .query_async(&mut conn)
        .await
        .expect("batch");
    assert_eq!(
        replies,
        vec![vec![
            vec!["ADDED".to_owned(), "1".to_owned()],
            vec!["UNKNOWN".to_owned()]
        ]]
    );
    let count: i64 = conn.get(&k.all[0]).await.expect("GET");
    assert_eq!(count, 1, "the permits stay taken");
}

#[tokio::test]
async fn a_withdrawn_waiter_leaves_no_record_and_a_second_withdrawal_finds_nothing() {
    // (Kills permit_prelude.lua:495:drop, which leaves the waiting record behind: a second
    // withdrawal then finds it and answers withdrawn again.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    assert!(matches!(
        acquire(&mut conn, "w", 1, true, LONG).await,
        PermitAcquire::Queued { position: 0, .. }
    ));
    assert_eq!(
        super::permit_withdraw(&mut conn, &k, "w")
            .await
            .expect("withdraw"),
        Withdrawal::Withdrawn
    );
    assert_eq!(fields(&mut conn, &["r:w"]).await, vec![None], "no record");
    assert_eq!(
        super::permit_withdraw(&mut conn, &k, "w")
            .await
            .expect("withdraw again"),
        Withdrawal::Unknown
    );
}

#[tokio::test]
async fn an_uncontended_addition_beyond_the_range_changes_nothing_and_is_not_marked() {
    // The fast addition takes back an addition that leaves +-(2^53 - 1) and answers the
    // count as it was. (Kills permit_prelude.lua:586:if->true, which keeps it.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    let client = Session::new();
    let seq = client.open();
    assert!(
        script::permit_try_set(&mut conn, &k, "s", 0, Caller::new(&client, seq.n()))
            .await
            .expect("set")
    );
    drop(seq);
    let seq = client.open();
    assert_eq!(
        script::permit_add(&mut conn, &k, "r", MAX, Caller::new(&client, seq.n()))
            .await
            .expect("add"),
        Addition::Applied(MAX)
    );
    drop(seq);
    let seq = client.open();
    assert_eq!(
        script::permit_add(&mut conn, &k, "r", 1, Caller::new(&client, seq.n()))
            .await
            .expect("add"),
        Addition::OutOfRange(MAX)
    );
    drop(seq);
    assert_eq!(available(&mut conn).await, MAX);
    let count: i64 = conn.get(&k.all[0]).await.expect("GET");
    assert_eq!(count, MAX);
}

#[tokio::test]
async fn setting_a_count_already_set_answers_the_count_there() {
    // (Kills permit_try_set.lua:17:or->and, which answers 0.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 5)
            .await
            .expect("set")
    );
    let reply: (String, i64) = redis::cmd("FCALL")
        .arg(crate::script::library::PERMIT_TRY_SET.function())
        .arg(k.all.len())
        .arg(&k.all[..])
        .arg("s2")
        .arg(7)
        .arg(Hex(number("s2")))
        .arg(session().id())
        .arg(Hex(session().low()))
        .query_async(&mut conn)
        .await
        .expect("FCALL");
    assert_eq!(reply, ("EXISTS".to_owned(), 5));
}

#[tokio::test]
async fn an_addition_to_a_count_beyond_the_range_reports_it_as_foreign_and_changes_nothing() {
    // A count of 2^53 + 1 is foreign: the calls that read it report it (WRONGTYPE). An
    // addition with nobody waiting adds by INCRBY without reading the count: it reports it the
    // same, takes its INCRBY back and never brings the count into the range, on the general
    // path (the test session) and on the fast one (a client whose calls are answered), for a
    // small delta and for one that leaves the range. (Found by the mutation runs, fixed.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    // (The client's first call makes its session record, so its next ones take the fast path.)
    let client = Session::new();
    let first = client.open();
    let made = script::permit_add(&mut conn, &k, "r", 1, Caller::new(&client, first.n()))
        .await
        .expect("add");
    assert_eq!(made, Addition::Applied(1));
    drop(first);
    let beyond = "9007199254740993";
    let () = conn.set(&k.all[0], beyond).await.expect("SET");
    let read = script::permit_available(&mut conn, &k).await.map(drop);
    assert_wrong_type(vec![("available", read)], &k.all[0], 0);
    let added = super::permit_add(&mut conn, &k, "r", -2).await.map(drop);
    assert_wrong_type(vec![("add", added)], &k.all[0], 0);
    for delta in [-2, MAX, -MAX] {
        let seq = client.open();
        let fast = script::permit_add(&mut conn, &k, "r", delta, Caller::new(&client, seq.n()))
            .await
            .map(drop);
        assert_wrong_type(vec![("add, fast", fast)], &k.all[0], 0);
    }
    let count: String = conn.get(&k.all[0]).await.expect("GET");
    assert_eq!(count, beyond, "the count untouched");
}

#[tokio::test]
async fn a_layout_1_takeover_forgets_the_records_it_read_and_keeps_the_callers_session() {
    // An idle layout-1 state taken over: its records are dropped, also those the call read
    // already (a batch reads its requests' records first; here a layout-1 record under the
    // very id the new request uses: the request is new, not a check-in), and the caller's
    // own session record is made as on layout 2.
    // (Kills permit_prelude's takeover clearing no record, or clearing the call's other
    // fields with them.)
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
                ("r:new", "c|1"),
            ],
        )
        .await
        .expect("hset");
    // (A batch of two, not sent alone: it reads its requests' records with the others,
    // before the takeover.)
    let ops = [
        PermitOp::acquire("new", 1, false, LONG, number("new")),
        PermitOp::add("more", 1, number("more")),
    ];
    let (mut replies, _) = within(
        LIMIT,
        "permit_batch",
        permit_batch(&mut conn, &k, CHANNEL, session(), &ops),
    )
    .await
    .expect("permit_batch");
    let reply = Acked {
        reply: replies.remove(0),
        unconfirmed: None,
    };
    assert_eq!(
        permits_granted("permit_acquire", reply).expect("acquire"),
        PermitAcquire::Granted
    );
    assert_eq!(available(&mut conn).await, 2, "the new request took one");
    let own = format!("s:{}", session().id());
    let [record, old] = <[Option<String>; 2]>::try_from(fields(&mut conn, &[&own, "r:new"]).await)
        .expect("two fields");
    assert!(record.is_some(), "the caller's session record is made");
    assert_eq!(old, None, "the layout-1 record is dropped");
}

#[tokio::test]
async fn calls_that_change_nothing_on_a_semaphore_never_set_create_no_key() {
    // With no bookkeeping and nothing queued, a call finds nothing to settle and writes
    // nothing: not even counters of zero. (Kills permit_prelude's load() rebuilding counters
    // where nothing is queued.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert_eq!(available(&mut conn).await, 0);
    assert_eq!(
        acquire(&mut conn, "busy", 1, false, LONG).await,
        PermitAcquire::Busy {
            available: 0,
            waiters: 0
        }
    );
    assert_eq!(poll(&mut conn, "nobody").await, PermitAcquire::Gone);
    let withdrawal = script::permit_withdraw(&mut conn, &k, "nobody", session(), None)
        .await
        .expect("withdraw");
    assert_eq!(withdrawal, Withdrawal::Unknown);
    let left: usize = conn.exists(&k.all[..]).await.expect("exists");
    assert_eq!(left, 0, "no key written");
}

#[tokio::test]
async fn pruning_a_due_session_record_leaves_the_index_entries_not_due() {
    // The prune drops exactly the entries it found due: a record not due keeps its index
    // entry, so it is pruned in its turn. (Kills permit_prelude's settle() removing one rank
    // too few, which with one entry due removes every rank.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 4)
            .await
            .expect("set")
    );
    let now = server_millis(&mut conn).await;
    let () = conn
        .zadd(&k.all[5], "s:old", now - 1_000)
        .await
        .expect("zadd");
    let () = conn.hset(&k.all[3], "s:old", "1|1|0|").await.expect("hset");
    let () = conn
        .zadd(&k.all[5], "s:later", now + 300_000)
        .await
        .expect("zadd");
    let later = format!("1|{:x}|0|", now + 300_000);
    let () = conn.hset(&k.all[3], "s:later", &later).await.expect("hset");
    let () = conn
        .hset(&k.all[3], "prune", now - 1_000)
        .await
        .expect("hset");
    assert_eq!(
        acquire(&mut conn, "a", 1, false, LONG).await,
        PermitAcquire::Granted
    );
    let gone: Option<f64> = conn.zscore(&k.all[5], "s:old").await.expect("zscore");
    let kept: Option<f64> = conn.zscore(&k.all[5], "s:later").await.expect("zscore");
    assert_eq!(gone, None, "the due entry goes");
    assert_eq!(kept, Some((now + 300_000) as f64), "the other stays");
    assert_eq!(fields(&mut conn, &["s:later"]).await, [Some(later)]);
    // The next prune falls due with the earliest record left (s:later, or the caller's).
    let [prune] =
        <[Option<String>; 1]>::try_from(fields(&mut conn, &["prune"]).await).expect("one field");
    assert!(prune.is_some(), "the next prune is scheduled");
}

#[tokio::test]
async fn lost_bookkeeping_is_rebuilt_from_a_queue_alone_and_from_waiters_alone() {
    // With the records lost, either key of the queue left behind is counted back into the
    // counters, the other's absence notwithstanding, so that what is left of the queue is
    // cleared in turn: an entry without its record goes, a waiter lease is dropped when it
    // ends. (Kills load() rebuilding only when both remain.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    acquire(&mut conn, "a", 1, true, LONG).await;
    // The records and the waiter leases vanish; the queue remains.
    let _: () = conn.del(&[&k.all[3], &k.all[2]]).await.expect("DEL");
    assert_eq!(add(&mut conn, "r", 1).await, Addition::Applied(1));
    let queued: u64 = conn.zcard(&k.all[1]).await.expect("ZCARD");
    assert_eq!(queued, 0, "the entry without a record is cleared");
    // The records and the queue vanish; a waiter lease remains.
    let _: () = conn.del(&k.all[..]).await.expect("DEL");
    acquire(&mut conn, "b", 1, true, LONG).await;
    let _: () = conn.del(&[&k.all[3], &k.all[1]]).await.expect("DEL");
    assert_eq!(available(&mut conn).await, 0);
    assert_eq!(
        fields(&mut conn, &["wlen"]).await,
        [Some("1".into())],
        "counted back from the waiter leases"
    );
}

#[tokio::test]
async fn a_batch_stopped_halfway_by_a_foreign_key_keeps_the_marks_of_what_it_applied() {
    // A batch applies its operations in order; one that meets a foreign value stops it,
    // and what the operations before it changed stays, with their marks in the session
    // record (written at the error, as at a normal end), so a resend of any of them is
    // answered as applied, never applied twice. Two additions: the second keeps its mark in
    // the batch's table of marks (several in one call), the first its own record text.
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    // The ticket counter (meta) holds a foreign value: queueing a waiter fails there.
    let () = conn.set(&k.all[4], "foreign").await.expect("set");
    let ops = [
        PermitOp::add("one", 1, number("half one")),
        PermitOp::add("two", 2, number("half two")),
        PermitOp::acquire("y", 5, true, LONG, number("half y")),
    ];
    match within(
        LIMIT,
        "permit_batch",
        permit_batch(&mut conn, &k, CHANNEL, session(), &ops),
    )
    .await
    {
        Err(Error::WrongType { key, .. }) => assert_eq!(key, k.all[4]),
        other => panic!("expected WrongType, got {other:?}"),
    }
    assert_eq!(available(&mut conn).await, 3, "both additions applied");
    for (request, delta) in [("one", 1), ("two", 2)] {
        let resent = script::permit_add(
            &mut conn,
            &k,
            request,
            delta,
            Caller::new(session(), number(&format!("half {request}"))),
        )
        .await
        .expect("add");
        assert_eq!(resent, Addition::Repeated(3), "{request}");
    }
    assert_eq!(available(&mut conn).await, 3, "neither applied twice");
}

#[tokio::test]
async fn a_call_at_the_low_mark_keeps_its_mark_through_the_calls_after_it() {
    // The low mark is the lowest number still open: a call numbered at it may have been
    // applied with its reply lost, so a later call (same low mark) keeps its mark, and its
    // resend is answered as applied. (Kills session_put() dropping the marks at the low mark
    // along with those below it.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    let own = Session::new();
    let first = own.open();
    let add = |conn: &mut redis::aio::MultiplexedConnection, request: &'static str, seq: u64| {
        let (mut conn, k, own) = (conn.clone(), k.clone(), &own);
        async move {
            script::permit_add(&mut conn, &k, request, 1, Caller::new(own, seq))
                .await
                .expect("add")
        }
    };
    assert_eq!(
        add(&mut conn, "first", first.n()).await,
        Addition::Applied(1)
    );
    // (Its reply lost: the call stays open, the low mark stays at its number.)
    let second = own.open();
    assert_eq!(own.low(), first.n());
    assert_eq!(
        add(&mut conn, "second", second.n()).await,
        Addition::Applied(2)
    );
    drop(second);
    assert_eq!(
        add(&mut conn, "first", first.n()).await,
        Addition::Repeated(2),
        "the resend finds its mark"
    );
    assert_eq!(available(&mut conn).await, 2);
}

#[tokio::test]
async fn an_addition_beyond_the_range_is_refused_even_where_the_sum_would_fit() {
    // The client never adds more than ±(2^53 − 1) at once; a raw call that does is refused,
    // on the fast path and the general one alike: such a number is not exact as a double, so
    // the script could not tell the count it would leave (-1 + 2^53 + 1 is 2^53, out of range,
    // but reads as 2^53 - 1). (Kills fast_add() taking such an addition.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    let own = Session::new();
    let add = |conn: &mut redis::aio::MultiplexedConnection, request: &'static str, delta: i64| {
        let (mut conn, k, own) = (conn.clone(), k.clone(), &own);
        async move {
            let seq = own.open();
            script::permit_add(&mut conn, &k, request, delta, Caller::new(own, seq.n()))
                .await
                .expect("add")
        }
    };
    // (The first call makes the session's record; the next ones take the fast path.)
    assert_eq!(add(&mut conn, "down", -1).await, Addition::Applied(-1));
    assert_eq!(
        add(&mut conn, "big", MAX + 2).await,
        Addition::OutOfRange(-1)
    );
    assert_eq!(add(&mut conn, "down", -4).await, Addition::Applied(-5));
    assert_eq!(
        add(&mut conn, "big", MAX + 4).await,
        Addition::OutOfRange(-5)
    );
    // A batch adds on the general path.
    let ops = [
        PermitOp::add("big", MAX + 4, number("batch big")),
        PermitOp::add("one", 1, number("batch one")),
    ];
    let (replies, _) = within(
        LIMIT,
        "permit_batch",
        permit_batch(&mut conn, &k, CHANNEL, session(), &ops),
    )
    .await
    .expect("permit_batch");
    let outcomes: Vec<Addition> = replies
        .into_iter()
        .map(|reply| {
            script::added(Acked {
                reply,
                unconfirmed: None,
            })
            .expect("add")
        })
        .collect();
    assert_eq!(outcomes, [Addition::OutOfRange(-5), Addition::Applied(-4)]);
    assert_eq!(available(&mut conn).await, -4);
}

#[tokio::test]
async fn a_new_session_record_leaves_an_earlier_prune_time_where_it_is() {
    // `prune` says when the records are next looked at: a new record (due ten minutes on)
    // sets it only where none is set, never pushing back an earlier one. (Kills mark()
    // setting it for every new or renewed record.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 4)
            .await
            .expect("set")
    );
    let soon = server_millis(&mut conn).await + 1_000;
    let () = conn.hset(&k.all[3], "prune", soon).await.expect("hset");
    let own = Session::new();
    let seq = own.open();
    let added = script::permit_add(&mut conn, &k, "r", 1, Caller::new(&own, seq.n()))
        .await
        .expect("add");
    assert_eq!(added, Addition::Applied(5));
    assert_eq!(
        fields(&mut conn, &["prune"]).await,
        [Some(soon.to_string())]
    );
}

#[tokio::test]
async fn a_collected_grant_leaves_no_record() {
    // A waiter's check-in collects its grant: the record goes (the call's mark answers a
    // resend). (Kills check_in() keeping the record of a grant collected.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    assert!(matches!(
        acquire(&mut conn, "w", 1, true, LONG).await,
        PermitAcquire::Queued { .. }
    ));
    assert_eq!(add(&mut conn, "r", 1).await, Addition::Applied(0));
    assert_eq!(poll(&mut conn, "w").await, PermitAcquire::Granted);
    assert_eq!(fields(&mut conn, &["r:w"]).await, [None]);
}

#[tokio::test]
async fn after_a_waiter_lease_ends_the_next_one_is_looked_at_when_it_ends() {
    // Dropping the waiters whose lease ended sets `wnext` to the next waiter lease's end (not
    // to now: that would run the expiry on every call). (Kills settle() taking every
    // expiry batch for a full one.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    for (id, lease) in [("short", Duration::from_millis(20)), ("long", LONG)] {
        assert!(matches!(
            acquire(&mut conn, id, 1, true, lease).await,
            PermitAcquire::Queued { .. }
        ));
    }
    tokio::time::sleep(Duration::from_millis(40)).await;
    assert_eq!(available(&mut conn).await, 0);
    let waiting: Vec<(String, i64)> = conn
        .zrange_withscores(&k.all[2], 0, -1)
        .await
        .expect("zrange");
    assert_eq!(waiting.len(), 1, "the short one dropped: {waiting:?}");
    assert_eq!(
        fields(&mut conn, &["wnext"]).await,
        [Some(waiting[0].1.to_string())]
    );
}

#[tokio::test]
async fn an_addition_meeting_a_foreign_session_index_is_marked_only_with_its_count() {
    // A new session's first addition registers its record in the index (applied); a foreign
    // value there fails the call after the addition was staged: what is written back on the
    // error holds the count and the mark together, so the resend is answered as applied and
    // adds nothing, and the mark never stands for an addition not made. (Kills the mark
    // staged before the count.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    let () = conn.del(&k.all[5]).await.expect("del");
    let () = conn.set(&k.all[5], "foreign").await.expect("set");
    let own = Session::new();
    let (one, two) = (own.open(), own.open());
    // (Two operations: a batch, which reads the count before it adds.)
    let ops = [
        PermitOp::add("one", 1, one.n()),
        PermitOp::add("two", 2, two.n()),
    ];
    match within(
        LIMIT,
        "permit_batch",
        permit_batch(&mut conn, &k, CHANNEL, &own, &ops),
    )
    .await
    {
        Err(Error::WrongType { key, .. }) => assert_eq!(key, k.all[5]),
        other => panic!("expected WrongType, got {other:?}"),
    }
    let count: i64 = conn.get(&k.all[0]).await.expect("get");
    let resent = script::permit_add(&mut conn, &k, "one", 1, Caller::new(&own, one.n()))
        .await
        .expect("resend");
    assert_eq!(
        (count, resent),
        (1, Addition::Repeated(1)),
        "applied and marked together"
    );
}

#[tokio::test]
async fn a_failure_in_a_key_of_the_right_type_is_passed_on_as_redis_gave_it() {
    // A command that fails on one of our keys holding the type it should is not a foreign
    // value: Redis's own error is passed on (here HINCRBY of a ticket counter that is not a
    // number), not WRONGTYPE naming a key that is a hash. (Kills caught() calling every
    // failure on a key WRONGTYPE.)
    let server = RedisServer::start();
    let mut conn = connect(&server).await;
    let k = pk();
    assert!(
        super::permit_try_set(&mut conn, &k, "s", 0)
            .await
            .expect("set")
    );
    let () = conn.hset(&k.all[4], "seq", "x").await.expect("hset");
    let queued = super::permit_acquire(&mut conn, &k, "w", 1, true, LONG, CHANNEL).await;
    match queued {
        Err(Error::WrongType { .. }) | Ok(_) => panic!("expected Redis's own error: {queued:?}"),
        Err(other) => assert!(format!("{other:?}").contains("not an integer"), "{other:?}"),
    }
}
