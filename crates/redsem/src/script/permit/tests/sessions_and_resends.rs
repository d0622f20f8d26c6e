//! Sessions: every call marked in its session's record, resends applied once, late copies of
//! calls given up never applied, session records pruned, and what the fast paths leave to the
//! general path.

use super::support::*;

#[tokio::test]
async fn every_mutating_permit_script_repeated_with_its_id_is_applied_once() {
    let (_server, mut conn, k) = start_with_count(2).await;
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
    let queue: u64 = conn.zcard(&k.queue).await.expect("ZCARD");
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
async fn the_uncontended_fast_paths_leave_what_is_due_to_the_general_path() {
    // A grant with nobody waiting and an addition with nobody waiting are written
    // straight to the keys (fast_acquire, fast_add) only while nothing is due. Each case
    // below is one the fast path must leave: taken anyway, its effect would be missing.
    let (_server, mut conn, k) = start_with_count(4).await;
    assert_eq!(add(&mut conn, "r0", 1).await, Addition::Applied(5));
    assert_eq!(
        acquire(&mut conn, "a", 1, false, LONG).await,
        PermitAcquire::Granted
    );

    // A session record past its expiry: the next grant drops it.
    let past = server_millis(&mut conn).await - 1_000;
    let () = conn.zadd(&k.applied, "s:old", past).await.expect("zadd");
    let () = conn
        .hset(&k.records, "s:old", "1|1|0|")
        .await
        .expect("hset");
    let () = conn.hset(&k.records, "prune", past).await.expect("hset");
    assert_eq!(
        acquire(&mut conn, "b", 1, false, LONG).await,
        PermitAcquire::Granted
    );
    assert_eq!(fields(&mut conn, &["s:old"]).await, [None], "dropped");
    let score: Option<f64> = conn.zscore(&k.applied, "s:old").await.expect("zscore");
    assert_eq!(score, None);

    // Idle keys whose deadline comes within the margin: an addition that renews its
    // session's record (renewed last over a minute ago) moves it, and the TTLs.
    let now = server_millis(&mut conn).await;
    let soon = now + 70_000;
    let () = conn.hset(&k.records, "keep", soon).await.expect("hset");
    let own = format!("s:{}", session().id());
    let renewed_long_ago = format!("1|{:x}|0|", now + 600_000 - 61_000);
    let () = conn
        .hset(&k.records, &own, renewed_long_ago)
        .await
        .expect("hset");
    assert_eq!(add(&mut conn, "r1", 1).await, Addition::Applied(4));
    let keep: i64 = conn.hget(&k.records, "keep").await.expect("hget");
    assert!(keep > soon + 30_000, "keep moved: {keep} after {soon}");
    let ttl = pttl(&mut conn, &k.records).await;
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
    let () = conn.zadd(&k.waiters, "w", past).await.expect("zadd");
    let () = conn.hset(&k.records, "wnext", past).await.expect("hset");
    assert_eq!(add(&mut conn, "r3", 1).await, Addition::Applied(2));
    assert_eq!(uncollected(&mut conn).await, 0);
}

#[tokio::test]
async fn every_call_a_permit_script_applies_is_marked_in_its_sessions_record() {
    // No id is remembered per call; the session record marks each call applied
    // (what a resend must find), and its expiry is registered once, 10 min ahead.
    let (_server, mut conn, k) = start().await;
    let before = server_millis(&mut conn).await;
    set_count(&mut conn, 3).await;
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
    let record: String = conn.hget(&k.records, &name).await.expect("hget");
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
    let records: Vec<String> = conn.hkeys(&k.records).await.expect("hkeys");
    assert!(
        !records
            .iter()
            .any(|f| f.starts_with("r:") || f.starts_with("m:")),
        "nothing per request once answered: {records:?}"
    );
    let expiry: f64 = conn.zscore(&k.applied, &name).await.expect("zscore");
    #[allow(clippy::cast_possible_truncation)]
    let expiry = expiry as i64;
    assert!(
        (before + 600_000..=after + 600_000).contains(&expiry),
        "expires {expiry}, 10 min after {before}..{after}"
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
    // it. (A prune test a millisecond late, or one reading the time 5 ms early, fails nearly
    // every round; the real code passes whatever the times.)
    const PRUNE_NOW: &str = "local t = redis.call('TIME') \
        local now = t[1] * 1000 + math.floor(t[2] / 1000) \
        redis.call('HSET', KEYS[1], 'prune', string.format('%d', now)) \
        return now";
    let (_server, mut conn, k) = start_with_count(100).await;
    let client = Session::new();
    for round in 0..20 {
        let id = format!("a{round}");
        let seq = client.open();
        let () = conn
            .hset(&k.records, "s:old", "1|1|0|")
            .await
            .expect("HSET");
        let () = conn.zadd(&k.applied, "s:old", 1).await.expect("ZADD");
        let (_, granted): (i64, Vec<String>) = within(
            LIMIT,
            "MULTI",
            redis::pipe()
                .atomic()
                .cmd("EVAL")
                .arg(PRUNE_NOW)
                .arg(1)
                .arg(&k.records)
                .add_command(multi_call(&PERMIT_ACQUIRE))
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
        let indexed: Option<f64> = conn.zscore(&k.applied, "s:old").await.expect("ZSCORE");
        assert_eq!(indexed, None, "round {round}: its index entry");
    }
    assert_eq!(available(&mut conn).await, 80, "one permit per grant");
}

#[tokio::test]
async fn a_withdrawal_raises_its_sessions_low_mark_so_a_late_copy_of_a_call_given_up_is_not_applied()
 {
    // A client gives up on an addition whose first copy is still on its way; its next call,
    // a withdrawal naming an unanswered call, carries a low mark past the addition's number.
    // The late copy that arrives then is stale: never applied. (Pins that
    // the withdrawal's low mark is read, not taken for 0.)
    let (_server, mut conn, k) = start().await;
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
    // addition's number, and the late copy is then stale. (Pins that the check-in's
    // low mark is read, not taken for 0; the mutant that takes it for 0 is also listed in
    // equivalent.txt.)
    let (_server, mut conn, k) = start_with_count(0).await;
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
async fn an_uncontended_grant_and_release_of_a_client_whose_calls_are_answered_apply_once() {
    // A client whose earlier calls are all answered (its low mark is the call's own number)
    // takes and gives back permits by the fast paths while nobody waits: each applied once,
    // and a resend answers as the call did. (Not taken back and answered out of range.)
    let (_server, mut conn, k) = start().await;
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
    let take = async |conn: &mut Conn| {
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
    let give = async |conn: &mut Conn| {
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
async fn pruning_a_due_session_record_leaves_the_index_entries_not_due() {
    // The prune drops exactly the entries it found due: a record not due keeps its index
    // entry, so it is pruned in its turn. (Kills permit_prelude's settle() removing one rank
    // too few, which with one entry due removes every rank.)
    let (_server, mut conn, k) = start_with_count(4).await;
    let now = server_millis(&mut conn).await;
    let () = conn
        .zadd(&k.applied, "s:old", now - 1_000)
        .await
        .expect("zadd");
    let () = conn
        .hset(&k.records, "s:old", "1|1|0|")
        .await
        .expect("hset");
    let () = conn
        .zadd(&k.applied, "s:later", now + 300_000)
        .await
        .expect("zadd");
    let later = format!("1|{:x}|0|", now + 300_000);
    let () = conn
        .hset(&k.records, "s:later", &later)
        .await
        .expect("hset");
    let () = conn
        .hset(&k.records, "prune", now - 1_000)
        .await
        .expect("hset");
    assert_eq!(
        acquire(&mut conn, "a", 1, false, LONG).await,
        PermitAcquire::Granted
    );
    let gone: Option<f64> = conn.zscore(&k.applied, "s:old").await.expect("zscore");
    let kept: Option<f64> = conn.zscore(&k.applied, "s:later").await.expect("zscore");
    assert_eq!(gone, None, "the due entry goes");
    assert_eq!(kept, Some((now + 300_000) as f64), "the other stays");
    assert_eq!(fields(&mut conn, &["s:later"]).await, [Some(later)]);
    // The next prune falls due with the earliest record left (s:later, or the caller's).
    let [prune] =
        <[Option<String>; 1]>::try_from(fields(&mut conn, &["prune"]).await).expect("one field");
    assert!(prune.is_some(), "the next prune is scheduled");
}

#[tokio::test]
async fn a_call_at_the_low_mark_keeps_its_mark_through_the_calls_after_it() {
    // The low mark is the lowest number still open: a call numbered at it may have been
    // applied with its reply lost, so a later call (same low mark) keeps its mark, and its
    // resend is answered as applied. (Kills session_put() dropping the marks at the low mark
    // along with those below it.)
    let (_server, mut conn, k) = start_with_count(0).await;
    let own = Session::new();
    let first = own.open();
    let add = |conn: &mut Conn, request: &'static str, seq: u64| {
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
async fn a_new_session_record_leaves_an_earlier_prune_time_where_it_is() {
    // `prune` says when the records are next looked at: a new record (due ten minutes on)
    // sets it only where none is set, never pushing back an earlier one. (Kills mark()
    // setting it for every new or renewed record.)
    let (_server, mut conn, k) = start_with_count(4).await;
    let soon = server_millis(&mut conn).await + 1_000;
    let () = conn.hset(&k.records, "prune", soon).await.expect("hset");
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
async fn a_late_copy_of_an_acquire_below_its_sessions_low_mark_takes_nothing() {
    // A client gives up on an acquire whose first copy is still on its way; its next call
    // carries a low mark past the acquire's number. The late copy that arrives then is stale:
    // answered GONE, and no permit is taken (a permit acquire leaves no record to find it by,
    // so only the low mark stands between the copy and a second grant).
    let (_server, mut conn, k) = start_with_count(2).await;
    let client = Session::new();
    let given_up = client.open();
    let given_up_n = given_up.n();
    drop(given_up);
    let next = client.open();
    assert_eq!(
        script::permit_add(&mut conn, &k, "r1", 0, Caller::new(&client, next.n()))
            .await
            .expect("add"),
        Addition::Applied(2)
    );
    drop(next);
    for wait in [false, true] {
        let late = script::permit_acquire(
            &mut conn,
            &k,
            "late",
            1,
            wait,
            LONG,
            CHANNEL,
            Caller::new(&client, given_up_n),
        )
        .await
        .expect("the late copy");
        assert_eq!(
            late,
            PermitAcquire::Gone,
            "wait {wait}: the late copy is not applied"
        );
    }
    assert_eq!(available(&mut conn).await, 2);
}
