//! A foreign value at one of the keys, or a count Redis cannot add to: reported and left
//! alone, with nothing written.

use super::support::*;

#[tokio::test]
async fn every_permit_script_reports_a_foreign_key_and_leaves_it_alone() {
    let (_server, mut conn, k) = start().await;
    for (i, key) in k.all.iter().enumerate() {
        // A list where we keep a string or a zset; text where we keep a number.
        only_a_foreign_list_at(&mut conn, &k.all, key).await;
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
    let _: () = conn.set(&k.count, "three").await.expect("set");
    match permit_add(&mut conn, &k, "r", 1).await {
        Err(Error::WrongType { key, expected, .. }) => {
            assert_eq!(
                (key.as_str(), expected.as_str()),
                (k.count.as_str(), "integer")
            );
        }
        other => panic!("a non-numeric count: {other:?}"),
    }
}

#[tokio::test]
async fn a_key_replaced_while_in_use_is_reported_by_the_fast_paths_and_left_alone() {
    // The fast paths (fast_acquire, fast_add) touch the count without the general path's
    // load: a foreign value there must be reported the same way, with nothing taken or
    // granted. (The sessions' index is touched only when a record is renewed, by the
    // general path: every_permit_script_reports_a_foreign_key_and_leaves_it_alone.)
    let (_server, mut conn, k) = start().await;
    for (i, key) in [(0, &k.count)] {
        let _: () = conn.del(&k.all[..]).await.expect("del");
        // In use and quiet: the next uncontended acquire and addition take the fast paths.
        set_count(&mut conn, 3).await;
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
            let count: i64 = conn.get(&k.count).await.expect("get");
            assert_eq!(count, 3, "the count changed");
        }
    }
}

#[tokio::test]
async fn a_foreign_count_is_reported_before_anything_is_written_even_with_the_records_lost() {
    // The records vanished (the sessions' index stayed) and the count holds a foreign value:
    // every script reports it and writes nothing, the addition (which reads the count only
    // when it needs it) included. (Pins that the addition does not drop
    // the sessions' index before it finds the count foreign.)
    let (_server, mut conn, k) = start_with_count(3).await;
    let name = format!("s:{}", session().id());
    let before: Vec<(String, f64)> = conn
        .zrange_withscores(&k.applied, 0, -1)
        .await
        .expect("zrange");
    assert_eq!(before.len(), 1, "{name} in the sessions' index: {before:?}");
    let () = conn.del(&[&k.records, &k.count]).await.expect("DEL");
    let () = conn.rpush(&k.count, "foreign").await.expect("RPUSH");
    let mut c = conn.clone();
    let results: Vec<(&str, Result<()>)> = vec![
        ("add", permit_add(&mut c, &k, "r", 1).await.map(drop)),
        (
            "acquire",
            permit_acquire(&mut c, &k, "a", 1, true, LONG, CHANNEL)
                .await
                .map(drop),
        ),
        ("poll", permit_poll(&mut c, &k, "a", LONG).await.map(drop)),
        ("withdraw", permit_withdraw(&mut c, &k, "a").await.map(drop)),
        (
            "try_set",
            permit_try_set(&mut c, &k, "t", 1).await.map(drop),
        ),
        ("drain", permit_drain(&mut c, &k, "d").await.map(drop)),
        ("available", permit_available(&mut c, &k).await.map(drop)),
    ];
    assert_wrong_type(results, &k.count, 0);
    let after: Vec<(String, f64)> = conn
        .zrange_withscores(&k.applied, 0, -1)
        .await
        .expect("zrange");
    assert_eq!(after, before, "the sessions' index is left alone");
    let others: usize = conn
        .exists(&[&k.queue, &k.waiters, &k.records, &k.meta, &k.applied])
        .await
        .expect("EXISTS");
    assert_eq!(others, 1, "nothing else was written");
}

#[tokio::test]
async fn a_count_set_again_by_a_new_session_meeting_a_foreign_index_reports_it_and_sets_nothing() {
    // A try_set marks its call before it writes the count: a new session's record registers
    // its expiry in the index (applied) first, so a foreign value there stops the call before
    // the count is written. (Kills permit_try_set.lua's mark and SET swapped.)
    let (_server, mut conn, k) = start_with_count(3).await;
    let keep: Option<String> = conn.hget(&k.records, "keep").await.expect("hget");
    assert!(
        keep.is_some(),
        "bookkeeping kept: the index is not checked at load"
    );
    let () = conn.del(&k.count).await.expect("del");
    let () = conn.del(&k.applied).await.expect("del");
    let () = conn.rpush(&k.applied, "foreign").await.expect("rpush");
    let fresh = Session::new();
    let seq = fresh.open();
    let result = script::permit_try_set(&mut conn, &k, "t", 5, Caller::new(&fresh, seq.n()))
        .await
        .map(drop);
    assert_wrong_type(vec![("try_set", result)], &k.applied, 5);
    let count: Option<i64> = conn.get(&k.count).await.expect("get");
    assert_eq!(count, None, "nothing written");
}

#[tokio::test]
async fn a_foreign_value_at_the_queue_or_the_waiters_key_is_left_to_the_calls_that_use_it() {
    // With the bookkeeping in place a key is checked at its first access, not by every call
    // (load() checks them all only when there is no bookkeeping): while nobody waits, the
    // count's own calls (available, an addition, a grant) touch neither the queue nor the
    // waiters, and answer as usual. (Pins that promote() does not read
    // an empty queue, and that the dead-waiter sweep is not made with no waiter.)
    let (_server, mut conn, k) = start_with_count(3).await;
    for (what, key) in [("queue", &k.queue), ("waiters", &k.waiters)] {
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
async fn with_foreign_waiters<T>(conn: &mut Conn, during: impl AsyncFnOnce(&mut Conn) -> T) -> T {
    let k = pk();
    let hidden = format!("{}:hidden", k.waiters);
    let () = conn.rename(&k.waiters, &hidden).await.expect("RENAME");
    let () = conn.set(&k.waiters, "foreign").await.expect("SET");
    let result = during(conn).await;
    let () = conn.del(&k.waiters).await.expect("DEL");
    let () = conn.rename(&hidden, &k.waiters).await.expect("RENAME");
    result
}

#[tokio::test]
async fn a_check_in_stopped_by_a_foreign_waiters_key_leaves_the_request_as_it_was() {
    // A check-in reports the foreign value at the waiters key and changes nothing of the
    // request: a grant not collected is still there to collect, and a waiter whose place in
    // the queue was lost is still there to withdraw. (Pins the order: the waiters
    // key is found foreign before the request's record is dropped.)
    let (_server, mut conn, k) = start_with_count(0).await;
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
        permit_poll(c, &k, "g", LONG).await.map(drop)
    })
    .await;
    assert_wrong_type(vec![("collect", collect)], &k.waiters, 2);
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
    let () = conn.del(&k.queue).await.expect("DEL");
    let renew = with_foreign_waiters(&mut conn, async |c| {
        permit_poll(c, &k, "d", LONG).await.map(drop)
    })
    .await;
    assert_wrong_type(vec![("renew", renew)], &k.waiters, 2);
    assert_eq!(
        permit_withdraw(&mut conn, &k, "d").await.expect("withdraw"),
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
    // (Pins when the addition reads the count first: read there, the addition fails in its
    // save with Redis's own error instead.)
    let (_server, mut conn, k) = start_with_count(0).await;
    let add_as_new_session = async |conn: &mut Conn| {
        let client = Session::new();
        let seq = client.open();
        script::permit_add(conn, &k, "r", 1, Caller::new(&client, seq.n()))
            .await
            .map(drop)
    };
    let () = conn.set(&k.count, "007").await.expect("SET");
    let idle = add_as_new_session(&mut conn).await;
    assert_wrong_type(vec![("add, idle", idle)], &k.count, 0);
    let count: String = conn.get(&k.count).await.expect("GET");
    assert_eq!(count, "007", "idle: the count untouched");

    let () = conn.set(&k.count, 0).await.expect("SET");
    assert!(matches!(
        acquire(&mut conn, "w", 1, true, LONG).await,
        PermitAcquire::Queued { .. }
    ));
    assert_eq!(
        add(&mut conn, "g", 1).await,
        Addition::Applied(0),
        "w granted"
    );
    let () = conn.set(&k.count, "007").await.expect("SET");
    let granted = add_as_new_session(&mut conn).await;
    assert_wrong_type(vec![("add, w's grant uncollected", granted)], &k.count, 0);
    let count: String = conn.get(&k.count).await.expect("GET");
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
    let (_server, mut conn, k) = start_with_count(3).await;
    let client = Session::new();
    let first = client.open();
    assert_eq!(
        script::permit_add(&mut conn, &k, "r", 0, Caller::new(&client, first.n()))
            .await
            .expect("add"),
        Addition::Applied(3)
    );
    drop(first);
    let () = conn.set(&k.count, "007").await.expect("SET");
    let general = permit_acquire(&mut conn, &k, "a", 1, false, LONG, CHANNEL)
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
    assert_wrong_type(vec![("general", general), ("fast", fast)], &k.count, 0);
}

#[tokio::test]
async fn an_addition_to_a_count_beyond_the_range_reports_it_as_foreign_and_changes_nothing() {
    // A count of 2^53 + 1 is foreign: the calls that read it report it (WRONGTYPE). An
    // addition with nobody waiting adds by INCRBY without reading the count: it reports it the
    // same, takes its INCRBY back and never brings the count into the range, on the general
    // path (the test session) and on the fast one (a client whose calls are answered), for a
    // small delta and for one that leaves the range. (Found by the mutation runs, fixed.)
    let (_server, mut conn, k) = start_with_count(0).await;
    // (The client's first call makes its session record, so its next ones take the fast path.)
    let client = Session::new();
    let first = client.open();
    let made = script::permit_add(&mut conn, &k, "r", 1, Caller::new(&client, first.n()))
        .await
        .expect("add");
    assert_eq!(made, Addition::Applied(1));
    drop(first);
    let beyond = "9007199254740993";
    let () = conn.set(&k.count, beyond).await.expect("SET");
    let read = script::permit_available(&mut conn, &k).await.map(drop);
    assert_wrong_type(vec![("available", read)], &k.count, 0);
    let added = permit_add(&mut conn, &k, "r", -2).await.map(drop);
    assert_wrong_type(vec![("add", added)], &k.count, 0);
    for delta in [-2, MAX, -MAX] {
        let seq = client.open();
        let fast = script::permit_add(&mut conn, &k, "r", delta, Caller::new(&client, seq.n()))
            .await
            .map(drop);
        assert_wrong_type(vec![("add, fast", fast)], &k.count, 0);
    }
    let count: String = conn.get(&k.count).await.expect("GET");
    assert_eq!(count, beyond, "the count untouched");
}

#[tokio::test]
async fn an_addition_meeting_a_foreign_session_index_is_marked_only_with_its_count() {
    // A new session's first addition registers its record in the index (applied); a foreign
    // value there fails the call after the addition was staged: what is written back on the
    // error holds the count and the mark together, so the resend is answered as applied and
    // adds nothing, and the mark never stands for an addition not made. (Kills the mark
    // staged before the count.)
    let (_server, mut conn, k) = start_with_count(0).await;
    let () = conn.del(&k.applied).await.expect("del");
    let () = conn.set(&k.applied, "foreign").await.expect("set");
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
        script::permit_batch(&mut conn, &k, CHANNEL, &own, &ops),
    )
    .await
    {
        Err(Error::WrongType { key, .. }) => assert_eq!(key, k.applied),
        other => panic!("expected WrongType, got {other:?}"),
    }
    let count: i64 = conn.get(&k.count).await.expect("get");
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
    let (_server, mut conn, k) = start_with_count(0).await;
    let () = conn.hset(&k.meta, "seq", "x").await.expect("hset");
    let queued = permit_acquire(&mut conn, &k, "w", 1, true, LONG, CHANNEL).await;
    match queued {
        Err(Error::WrongType { .. }) | Ok(_) => panic!("expected Redis's own error: {queued:?}"),
        Err(other) => assert!(format!("{other:?}").contains("not an integer"), "{other:?}"),
    }
}
