//! Group commits (`permit_batch`): operations in order as one call each would, resent whole,
//! unknown operations refused whole, a batch stopped halfway by a foreign key.

use super::support::*;
use crate::script::library::Call;

/// A group commit's call applies its operations in order, each answered as its own call would
/// be; an addition out of range in it takes back only its own bookkeeping, not that of the
/// operations before it (their ids stay on the forgetting schedule).
#[tokio::test]
async fn a_batch_applies_its_operations_in_order_as_one_call_each_would() {
    let (_server, mut conn, _) = start().await;
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
    let mut next = one_by_one(replies);
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
async fn a_batch_withdraws_and_checks_in_requests_made_by_earlier_calls() {
    let (_server, mut conn, _) = start_with_count(2).await;
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
    let mut next = batch_in(&mut conn, session(), &ops).await;
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
async fn a_batch_queues_each_waiter_for_its_own_waiter_lease() {
    // (Pins that an acquire in a batch takes its waiter lease from its own arguments, not
    // from its neighbour's.)
    let (_server, mut conn, _) = start_with_count(0).await;
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
        let end: f64 = conn.zscore(&pk().waiters, id).await.expect("zscore");
        #[allow(clippy::cast_possible_truncation)]
        let end = end as i64;
        assert!(
            (before + lease..=after + lease).contains(&end),
            "{id}: ends {end}, {lease} ms after {before}..{after}"
        );
    }
}

#[tokio::test]
async fn a_permit_batch_resent_whole_is_applied_once() {
    // A group commit whose reply was lost, sent again: each operation answers as it did and
    // adds nothing more; its check-in renews for its own waiter lease. (Pins
    // where each operation's arguments stand in the batch's ARGV.)
    let (_server, mut conn, k) = start_with_count(0).await;
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
        let mut next = batch_in(&mut conn, session(), &ops).await;
        let after = server_millis(&mut conn).await;
        assert_eq!(withdrawn(next()).expect("withdraw"), Withdrawal::Unknown);
        let polled = permits_granted("permit_poll", next()).expect("poll");
        assert!(
            matches!(polled, PermitAcquire::Queued { .. }),
            "{attempt}: {polled:?}"
        );
        let end: f64 = conn.zscore(&k.waiters, "w").await.expect("zscore");
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

/// A semaphore of no permits with `w` (one permit) and `q` (five) queued, in that order.
async fn start_with_w_and_q_queued() -> (RedisServer, Conn, Keys) {
    let (server, mut conn, k) = start_with_count(0).await;
    for (id, n) in [("w", 1), ("q", 5)] {
        assert!(matches!(
            acquire(&mut conn, id, n, true, LONG).await,
            PermitAcquire::Queued { .. }
        ));
    }
    (server, conn, k)
}

#[tokio::test]
async fn a_permit_batch_resent_whole_finds_its_requests_records_and_its_check_ins_marks() {
    // A batch resent whole with a resent wait acquire (its record read up front: queued once)
    // and a check-in that collected (its mark under its own number: GRANTED again). (Pins
    // where each operation's request id and number stand in the batch's ARGV.)
    let (_server, mut conn, k) = start_with_w_and_q_queued().await;
    let ops = [
        PermitOp::acquire("q", 5, true, LONG, number("q")),
        PermitOp::add("r", 1, number("r")),
        PermitOp::poll("w", LONG, number("poll w")),
    ];
    for attempt in ["first", "resent"] {
        let mut next = batch_in(&mut conn, session(), &ops).await;
        let q = permits_granted("permit_acquire", next()).expect("q");
        assert!(
            matches!(q, PermitAcquire::Queued { .. }),
            "{attempt}: {q:?}"
        );
        let _ = added(next()).expect("add");
        let w = permits_granted("permit_poll", next()).expect("w");
        assert_eq!(w, PermitAcquire::Granted, "{attempt}");
    }
    let queue: Vec<String> = conn.zrange(&k.queue, 0, -1).await.expect("zrange");
    assert_eq!(queue, vec!["q".to_owned()], "q queued once");
    assert_eq!(fields(&mut conn, &["qlen"]).await, [Some("1".into())]);
    assert_eq!(available(&mut conn).await, 0, "one added, w took it, once");
}

#[tokio::test]
async fn a_batch_withdraws_a_queued_request_and_a_collection_it_made_answers_a_lone_resend() {
    // A withdrawal in a batch finds its request's record (read up front), and a check-in that
    // collected in a batch is marked under its own number, so its resend sent alone (a batch
    // of one goes as permit_poll) answers GRANTED. (Pins where each
    // operation's request id and number stand in the batch's ARGV.)
    let (_server, mut conn, k) = start_with_w_and_q_queued().await;
    let ops = [
        PermitOp::add("r", 1, number("r")),
        PermitOp::poll("w", LONG, number("poll w")),
        PermitOp::withdraw("q", None),
    ];
    let mut next = batch_in(&mut conn, session(), &ops).await;
    let _ = added(next()).expect("add");
    let w = permits_granted("permit_poll", next()).expect("w");
    assert_eq!(w, PermitAcquire::Granted);
    assert_eq!(withdrawn(next()).expect("withdraw"), Withdrawal::Withdrawn);
    let queue: u64 = conn.zcard(&k.queue).await.expect("zcard");
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
    let mut next = batch_in(&mut conn, session(), &ops).await;
    let x = permits_granted("permit_poll", next()).expect("x");
    assert!(
        matches!(x, PermitAcquire::Queued { position: 1, .. }),
        "{x:?}"
    );
    assert_eq!(withdrawn(next()).expect("withdraw"), Withdrawal::Withdrawn);
}

/// Send the raw batch `call`, an addition of 1 then an unknown operation `z`, and assert that
/// it is refused for `z` with the addition not applied (the count is 1 still).
async fn assert_refused_whole(conn: &mut Conn, call: Call) {
    let reply: redis::RedisResult<Value> =
        within(LIMIT, "permit_batch", call.invoke_async(conn)).await;
    let err = reply.expect_err("an unknown operation is refused");
    assert!(
        err.to_string().contains("unknown operation z"),
        "refused for another reason: {err}"
    );
    assert_eq!(
        available(conn).await,
        1,
        "the addition before it is not applied"
    );
}

#[tokio::test]
async fn a_batch_with_an_unknown_operation_is_refused_whole_and_applies_nothing() {
    // (An unknown kind is not read as a check-in.)
    let (_server, mut conn, k) = start_with_count(1).await;
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
    assert_refused_whole(&mut conn, call).await;
}

#[tokio::test]
async fn a_batch_ending_in_a_lone_unknown_operation_is_refused_whole_and_writes_nothing() {
    // An unknown kind is refused wherever it stands, even as the very last argument (with
    // none of its own after it): before anything is applied or written, the new session's
    // index entry included. (The last argument is checked too,
    // not read as a check-in.)
    let (_server, mut conn, k) = start_with_count(1).await;
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
    assert_refused_whole(&mut conn, call).await;
    let name = format!("s:{}", client.id());
    assert_eq!(
        fields(&mut conn, &[name.as_str()]).await,
        [None],
        "no session record"
    );
    let indexed: Option<f64> = conn.zscore(&k.applied, &name).await.expect("ZSCORE");
    assert_eq!(indexed, None, "no entry in the sessions' index");
}

#[tokio::test]
async fn a_batch_withdrawal_naming_a_call_its_low_mark_passed_gives_nothing_back() {
    // A batch whose low mark has passed a call (its answer arrived: the permits it took are
    // the client's) and that withdraws naming that call gives nothing back, even while the
    // call's mark is still among the session's marks read by the batch's first operation (a
    // later mark kept them).
    let (_server, mut conn, k) = start().await;
    let batch = |low: &str, ops: &[&str]| {
        let mut cmd = op_command(&PERMIT_BATCH, &k.all);
        cmd.arg(CHANNEL).arg("c").arg(low).arg(ops);
        cmd
    };
    // (Set by a call of another session, which loads the library.)
    set_count(&mut conn, 3).await;
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
    let count: i64 = conn.get(&k.count).await.expect("GET");
    assert_eq!(count, 1, "the permits stay taken");
}

#[tokio::test]
async fn a_batch_stopped_halfway_by_a_foreign_key_keeps_the_marks_of_what_it_applied() {
    // A batch applies its operations in order; one that meets a foreign value stops it,
    // and what the operations before it changed stays, with their marks in the session
    // record (written at the error, as at a normal end), so a resend of any of them is
    // answered as applied, never applied twice. Two additions: the second keeps its mark in
    // the batch's table of marks (several in one call), the first its own record text.
    let (_server, mut conn, k) = start_with_count(0).await;
    // The ticket counter (meta) holds a foreign value: queueing a waiter fails there.
    let () = conn.set(&k.meta, "foreign").await.expect("set");
    let ops = [
        PermitOp::add("one", 1, number("half one")),
        PermitOp::add("two", 2, number("half two")),
        PermitOp::acquire("y", 5, true, LONG, number("half y")),
    ];
    match within(
        LIMIT,
        "permit_batch",
        script::permit_batch(&mut conn, &k, CHANNEL, session(), &ops),
    )
    .await
    {
        Err(Error::WrongType { key, .. }) => assert_eq!(key, k.meta),
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
