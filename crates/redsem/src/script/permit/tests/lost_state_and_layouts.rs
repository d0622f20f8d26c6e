//! Lost bookkeeping rebuilt, and states of another layout: refused while live, an idle
//! layout-1 state taken over.

use super::support::*;

#[tokio::test]
async fn lost_bookkeeping_is_rebuilt_and_a_waiter_without_a_place_is_told_gone() {
    let (_server, mut conn, k) = start().await;
    acquire(&mut conn, "a", 1, true, LONG).await;
    // The records vanish (partial loss); the queue and the ticket counter remain.
    let () = conn.del(&k.records).await.expect("DEL");
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
    let () = conn.del(&k.queue).await.expect("DEL");
    let polled = permit_poll(&mut conn, &k, "d", LONG).await;
    println!("poll of a waiter whose queue vanished: {polled:?}");
    assert_eq!(polled.expect("poll"), PermitAcquire::Gone);
    // The counters agree with the keys (a's waiters entry stays until its lease ends).
    let waiting: u64 = conn.zcard(&k.waiters).await.expect("ZCARD");
    assert_eq!(
        fields(&mut conn, &["qlen", "wlen"]).await,
        [Some("0".into()), Some(waiting.to_string())]
    );
}

/// A state of layout 1 (no `layout` field) with a count of 2, bookkeeping that lasts, and
/// `records` besides.
async fn layout_1_state(conn: &mut Conn, records: &[(&str, &str)]) {
    let k = pk();
    let () = conn.set(&k.count, 2).await.expect("set");
    let mut fields = vec![
        ("keep", "9999999999999"),
        ("prune", "9999999999999"),
        ("wide", "-"),
    ];
    fields.extend_from_slice(records);
    let () = conn.hset_multiple(&k.records, &fields).await.expect("hset");
}

#[tokio::test]
async fn a_layout_1_permit_state_is_refused_while_live_and_taken_over_once_idle() {
    // Layout 1 remembered every request id for a minute (records r:<id> "c|k",
    // applied m:<id>). A live state of it (a waiter of an older client) is refused and left
    // alone; an idle one is taken over, its records and remembered ids dropped, the count kept.
    let (_server, mut conn, k) = start().await;
    layout_1_state(
        &mut conn,
        &[
            ("live", "1"),
            ("qlen", "1"),
            ("wlen", "1"),
            ("r:old", "w|1|1|c"),
            ("r:done", "c|1"),
        ],
    )
    .await;
    let () = conn.zadd(&k.queue, "old", 1).await.expect("zadd");
    let () = conn.zadd(&k.waiters, "old", 9e15).await.expect("zadd");
    let () = conn.zadd(&k.applied, "m:add", 9e15).await.expect("zadd");
    match permit_acquire(&mut conn, &k, "new", 1, false, LONG, CHANNEL).await {
        Err(Error::Incompatible { found, ours, .. }) => {
            assert_eq!((found.as_str(), ours.as_str()), ("1", "2"));
        }
        other => panic!("expected Incompatible, got {other:?}"),
    }
    let count: i64 = conn.get(&k.count).await.expect("get");
    assert_eq!(count, 2, "untouched");

    // Drained: the old waiter gone (as layout 1 leaves it).
    let () = conn
        .hset_multiple(&k.records, &[("qlen", "0"), ("wlen", "0")])
        .await
        .expect("hset");
    let () = conn
        .hdel(&k.records, &["live", "r:old"])
        .await
        .expect("hdel");
    let _: () = conn.del(&[&k.queue, &k.waiters]).await.expect("del");
    assert_eq!(
        acquire(&mut conn, "new", 1, false, LONG).await,
        PermitAcquire::Granted
    );
    assert_eq!(available(&mut conn).await, 1, "the count kept");
    let layout: String = conn.hget(&k.records, "layout").await.expect("hget");
    assert_eq!(layout, "2");
    assert_eq!(fields(&mut conn, &["r:done"]).await, [None], "dropped");
    let remembered: Option<f64> = conn.zscore(&k.applied, "m:add").await.expect("zscore");
    assert_eq!(remembered, None, "dropped");
}

#[tokio::test]
async fn a_state_of_a_newer_layout_is_refused_untouched_even_when_nothing_waits() {
    // A quiet state (nothing waits, nothing due, the caller's session record fresh) written
    // by a newer layout: the uncontended fast paths refuse it as the general path does,
    // before any write.
    let (_server, mut conn, k) = start().await;
    let now = server_millis(&mut conn).await;
    let own = format!("s:{}", session().id());
    let record = format!("1|{}|0|", now + 600_000);
    let () = conn.set(&k.count, 5).await.expect("SET");
    let () = conn
        .hset_multiple(
            &k.records,
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
            permit_acquire(&mut conn, &k, "a", 1, false, LONG, CHANNEL)
                .await
                .map(drop),
        ),
        ("add", permit_add(&mut conn, &k, "r", 1).await.map(drop)),
    ];
    for (script, result) in results {
        match result {
            Err(Error::Incompatible { found, ours, .. }) => {
                assert_eq!((found.as_str(), ours.as_str()), ("3", "2"), "{script}");
            }
            other => panic!("{script} on layout 3: {other:?}"),
        }
    }
    let count: i64 = conn.get(&k.count).await.expect("GET");
    assert_eq!(count, 5, "the count untouched");
    assert_eq!(
        fields(&mut conn, &[own.as_str()]).await,
        [Some(record)],
        "the session record untouched"
    );
}

#[tokio::test]
async fn a_layout_1_takeover_forgets_the_records_it_read_and_keeps_the_callers_session() {
    // An idle layout-1 state taken over: its records are dropped, also those the call read
    // already (a batch reads its requests' records first; here a layout-1 record under the
    // very id the new request uses: the request is new, not a check-in), and the caller's
    // own session record is made as on layout 2.
    // (Kills permit_prelude's takeover clearing no record, or clearing the call's other
    // fields with them.)
    let (_server, mut conn, k) = start().await;
    layout_1_state(&mut conn, &[("r:new", "c|1")]).await;
    // (A batch of two, not sent alone: it reads its requests' records with the others,
    // before the takeover.)
    let ops = [
        PermitOp::acquire("new", 1, false, LONG, number("new")),
        PermitOp::add("more", 1, number("more")),
    ];
    let (mut replies, _) = within(
        LIMIT,
        "permit_batch",
        script::permit_batch(&mut conn, &k, CHANNEL, session(), &ops),
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
async fn lost_bookkeeping_is_rebuilt_from_a_queue_alone_and_from_waiters_alone() {
    // With the records lost, either key of the queue left behind is counted back into the
    // counters, the other's absence notwithstanding, so that what is left of the queue is
    // cleared in turn: an entry without its record goes, a waiter lease is dropped when it
    // ends. (Kills load() rebuilding only when both remain.)
    let (_server, mut conn, k) = start().await;
    acquire(&mut conn, "a", 1, true, LONG).await;
    // The records and the waiter leases vanish; the queue remains.
    let _: () = conn.del(&[&k.records, &k.waiters]).await.expect("DEL");
    assert_eq!(add(&mut conn, "r", 1).await, Addition::Applied(1));
    let queued: u64 = conn.zcard(&k.queue).await.expect("ZCARD");
    assert_eq!(queued, 0, "the entry without a record is cleared");
    // The records and the queue vanish; a waiter lease remains.
    let _: () = conn.del(&k.all[..]).await.expect("DEL");
    acquire(&mut conn, "b", 1, true, LONG).await;
    let _: () = conn.del(&[&k.records, &k.queue]).await.expect("DEL");
    assert_eq!(available(&mut conn).await, 0);
    assert_eq!(
        fields(&mut conn, &["wlen"]).await,
        [Some("1".into())],
        "counted back from the waiter leases"
    );
}
