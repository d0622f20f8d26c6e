//! Group commits (`lease_batch`): operations in order, the queue served through the batch's
//! window of heads, resends answered as they were, unknown operations refused whole.

use super::support::*;

#[tokio::test]
async fn a_batch_serves_the_queue_in_order_through_its_window_of_heads() {
    // A batch reads the head of the queue once for all its releases (peek()'s
    // window) and takes the heads from its front. A head that does not fit stays the head;
    // a waiter withdrawn from inside the window is not met again.
    let (_server, mut conn, k) = start().await;
    for id in ["h1", "h2", "h3"] {
        granted(acquire(&mut conn, req(id, 3, 1, false)).await);
    }
    for (id, units) in [("w1", 1), ("w2", 2), ("w3", 1), ("w4", 1)] {
        let queued = acquire(&mut conn, req(id, 3, units, true)).await;
        assert!(matches!(queued, Acquire::Queued { .. }), "{id}: {queued:?}");
    }
    let ids = |handed: &[String]| -> Vec<String> {
        handed
            .iter()
            .map(|g| g.split('|').next().unwrap_or_default().to_owned())
            .collect()
    };

    // h1 frees a unit: w1. w2 (2 units) does not fit until h2 and h3 are gone: w3, behind
    // it, must wait although one unit would do.
    let w5 = req("w5", 3, 1, true);
    let ops = [
        BatchOp::release("h1", by("a1")),
        BatchOp::release("h2", by("a2")),
        BatchOp::release("h3", by("a3")),
        BatchOp::acquire(&w5),
    ];
    let batch = lease_batch(&mut conn, &k, CHANNEL, session(), &ops)
        .await
        .expect("batch");
    assert_eq!(ids(&batch.handed), ["w1", "w2"], "in queue order");
    let queued = batch_acquire(batch.replies[3].clone(), None).expect("w5");
    assert!(
        matches!(queued, Acquire::Queued { position: 2, .. }),
        "{queued:?}"
    );

    // w1 leaves: w3. w4 (now the next head) is withdrawn, then w2's two units go to w5.
    let withdrawal = ReleaseBy::Withdrawal {
        session: session(),
        pending: None,
    };
    let ops = [
        BatchOp::release("w1", by("b1")),
        BatchOp::release("w4", withdrawal),
        BatchOp::release("w2", by("b2")),
    ];
    let batch = lease_batch(&mut conn, &k, CHANNEL, session(), &ops)
        .await
        .expect("batch");
    assert_eq!(ids(&batch.handed), ["w3", "w5"], "in queue order");
    let outcomes: Vec<Release> = release_outcomes(&batch);
    assert_eq!(
        outcomes,
        [Release::Released, Release::Dequeued, Release::Released]
    );
    let (qlen, used): (String, String) = state_fields_raw(&mut conn, &["qlen", "used"]).await;
    let queue: usize = conn.zcard(&k.queue).await.expect("zcard");
    assert_eq!((qlen.as_str(), queue, used.as_str()), ("0", 0, "2"));
}

#[tokio::test]
async fn a_batch_resent_after_a_lost_reply_answers_its_releases_as_they_were() {
    // A group commit resent whole (its reply lost): each release in it answers from its
    // session's mark, and nothing is applied twice. (Pins that a batch reads its session's
    // record: one that does not loses the marks.)
    let (_server, mut conn, k) = start().await;
    for id in ["h1", "h2"] {
        granted(acquire(&mut conn, req(id, 2, 1, false)).await);
    }
    let ops = [
        BatchOp::release("h1", by("b h1")),
        BatchOp::release("h2", by("b h2")),
    ];
    for attempt in ["first", "resent"] {
        let batch = lease_batch(&mut conn, &k, CHANNEL, session(), &ops)
            .await
            .expect("batch");
        let outcomes: Vec<Release> = release_outcomes(&batch);
        assert_eq!(
            outcomes,
            [Release::Released, Release::Released],
            "{attempt}"
        );
    }
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(status.in_use, 0);
}

#[tokio::test]
async fn a_batch_with_an_acquire_before_its_release_reads_each_operation_whole() {
    // An acquire (ten arguments) followed by a release in one group commit, resent whole: each
    // answers as it did. (Pins where each operation's arguments end in the batch's ARGV: an
    // acquire read one argument too long takes the release's first for its own.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("h", 3, 1, false)).await);
    let x = req("x", 3, 1, false);
    let ops = [BatchOp::acquire(&x), BatchOp::release("h", by("b h"))];
    let mut first = None;
    for attempt in ["first", "resent"] {
        let batch = lease_batch(&mut conn, &k, CHANNEL, session(), &ops)
            .await
            .expect("batch");
        let got = granted(batch_acquire(batch.replies[0].clone(), None).expect("acquire"));
        assert_eq!(
            *first.get_or_insert(got.clone()),
            got,
            "{attempt}: the same grant"
        );
        let released = batch_release(batch.replies[1].clone(), None).expect("release");
        assert_eq!(released, Release::Released, "{attempt}");
    }
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(status.in_use, 1, "x alone holds: {status:?}");
}

#[tokio::test]
async fn a_lease_batch_with_an_unknown_operation_is_refused_whole_and_applies_nothing() {
    // (Kills lease_batch.lua taking any operation that is not an acquire for a release.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    let reply: redis::RedisResult<Value> = raw(&LEASE_BATCH)
        .key(&k.all[..])
        .arg(CHANNEL)
        .arg(session().id())
        .arg(Hex(session().low()))
        .arg("r")
        .arg("a")
        .arg(Hex(number("batch release a")))
        .arg("z")
        .arg("a")
        .arg(Hex(number("batch z")))
        .invoke_async(&mut conn)
        .await;
    assert!(
        reply.is_err(),
        "an unknown operation is an error: {reply:?}"
    );
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(status.holders.len(), 1, "a is still held: nothing applied");
}

#[tokio::test]
async fn a_lease_batch_marks_its_releases_in_its_own_sessions_record() {
    // (Kills lease_batch.lua naming every batch's session record "s:", shared by all.)
    let (_server, mut conn, k) = start().await;
    for id in ["a", "b"] {
        granted(acquire(&mut conn, req(id, 2, 1, false)).await);
    }
    let ops = [
        BatchOp::release("a", by("batch release a")),
        BatchOp::release("b", by("batch release b")),
    ];
    within(
        LIMIT,
        "batch",
        lease_batch(&mut conn, &k, "t:wake:another", session(), &ops),
    )
    .await
    .expect("batch");
    let own: String = conn
        .hget(&k.state, format!("s:{}", session().id()))
        .await
        .expect("the session's record");
    for name in ["batch release a", "batch release b"] {
        assert!(
            own.contains(&format!(",{}=R", Hex(number(name)))),
            "{name} is marked: {own}"
        );
    }
    let shared: bool = conn.hexists(&k.state, "s:").await.expect("hexists");
    assert!(!shared);
}

#[tokio::test]
async fn a_late_copy_of_an_acquire_in_a_batch_is_not_applied() {
    // An acquire numbered below its session's low mark is a late copy of one its client has
    // the answer to: in a batch as alone, answered GONE and not applied. (Kills the batch
    // reading the acquire's number from the wrong argument.)
    let (_server, mut conn, k) = start().await;
    granted(raw_acquire(&mut conn, "x", 2, 0x10, "late", 0x10).await);
    assert_eq!(
        raw_release(&mut conn, "x", 0x11, "late", 0x11).await,
        "RELEASED"
    );
    let acquire = ["a", "y", "2", "1", "30000", "", "0", "try", "30000", "5"];
    let replies = raw_batch(&mut conn, "late", 0x12, &acquire[..]).await;
    let first = decode_acquire("lease_batch", replies[0].clone()).expect("decode");
    assert_eq!(first, Acquire::Gone);
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(status.in_use, 0, "nothing granted");
}
