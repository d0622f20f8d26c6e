//! The work budget of one script run: thousands of waiters admitted in bounded slices, and
//! what a spent budget leaves done by the next call.

use super::support::*;

/// [`start`], with a connection that waits for a reply as long as any wait of a test may
/// take (not the default 500 ms): a pipeline of 4,200 scripts and the status of 4,200
/// holders take longer on a loaded machine.
async fn start_patient() -> (RedisServer, Conn, Keys) {
    let server = start_server(&[]);
    let config = redis::AsyncConnectionConfig::new().set_response_timeout(Some(LIMIT));
    let conn = connect_with(&server, &config).await;
    (server, conn, keys())
}

#[tokio::test]
async fn a_release_admitting_thousands_of_waiters_leaves_a_consistent_state() {
    // One release admitting ~4,000 waiters once wrote every field in one HSET, hit unpack()'s
    // limit after the slot bits and tokens were written, and left `used` at 4,200 with no
    // holder. Now grants are bounded per script and the fields written in slices.
    let (_server, mut conn, k) = start_patient().await;
    let n: u32 = 4_200;
    granted(acquire(&mut conn, req("big", n, MAX_UNITS_FOR_TESTS, true)).await);
    granted(acquire(&mut conn, req("rest", n, n - MAX_UNITS_FOR_TESTS, true)).await);
    let ids: Vec<String> = (0..n).map(|i| format!("w{i}")).collect();
    queue_many(&mut conn, &ids, n).await;
    for holder in ["big", "rest"] {
        assert_eq!(
            release(&mut conn, &k, holder).await.expect("release"),
            Release::Released
        );
    }
    let status = lease_status(&mut conn, &k)
        .await
        .expect("status after 4,200 grants");
    assert_eq!(status.in_use, u64::from(n));
    assert_eq!(status.holders.len(), n as usize);
    assert!(status.waiters.is_empty());
    let mut tokens: Vec<u64> = status.holders.iter().map(|h| h.token).collect();
    tokens.dedup();
    assert_eq!(tokens.len(), n as usize, "distinct tokens, in grant order");
    let mut slots: Vec<u32> = status
        .holders
        .iter()
        .flat_map(|h| h.slots.clone())
        .collect();
    slots.sort_unstable();
    slots.dedup();
    assert_eq!(slots.len(), n as usize, "distinct slots");
    assert!(matches!(
        acquire(&mut conn, req("late", n, 1, false)).await,
        Acquire::Busy { in_use, .. } if in_use == u64::from(n)
    ));
}

/// Queue a waiter of one unit for each of `ids` (capacity `cap`), in one pipeline of
/// raw calls (`EVALSHA`, the script loaded first, or the module's command), each numbered
/// after its id in the test session.
async fn queue_many(conn: &mut Conn, ids: &[String], cap: u32) {
    let k = keys();
    load_for_multi(conn, &LEASE_ACQUIRE).await;
    let mut pipe = redis::pipe();
    for id in ids {
        let r = req(id, cap, 1, true);
        raw(&LEASE_ACQUIRE)
            .key(&k.all[..])
            .arg(acquire_args(&r, "wait"))
            .add_to(&mut pipe)
            .ignore();
    }
    let () = within(LIMIT, "queue the waiters", pipe.query_async(conn))
        .await
        .expect("queue");
}

#[tokio::test]
async fn work_a_spent_budget_left_is_done_by_the_next_call() {
    // One script grants at most 4,096 units to others. Two releases in one batch free 4,098
    // units for 4,098 waiters of one: the first hands out the whole budget, the second none.
    // The next call on the semaphore, whatever it is, grants the two left, though no lease
    // has ended. (Kills settle() skipping promote_left() while no lease has ended.)
    let (_server, mut conn, k) = start_patient().await;
    let cap = MAX_UNITS_FOR_TESTS + 2;
    granted(acquire(&mut conn, req("big", cap, MAX_UNITS_FOR_TESTS, true)).await);
    granted(acquire(&mut conn, req("two", cap, 2, true)).await);
    let ids: Vec<String> = (0..cap).map(|i| format!("w{i}")).collect();
    queue_many(&mut conn, &ids, cap).await;
    let ops = [
        BatchOp::release("big", by("release big")),
        BatchOp::release("two", by("release two")),
    ];
    let reply = within(
        LIMIT,
        "batch",
        lease_batch(&mut conn, &k, "t:wake:another", session(), &ops),
    )
    .await
    .expect("batch");
    assert_eq!(reply.replies.len(), 2);
    let polled = poll(&mut conn, &ids[ids.len() - 1]).await;
    assert!(
        matches!(polled, Acquire::Granted { .. }),
        "the last waiter is granted by the next call: {polled:?}"
    );
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert!(status.waiters.is_empty());
    assert_eq!(status.in_use, u64::from(cap));
}

#[tokio::test]
async fn a_settle_drops_ended_holders_while_its_budget_covers_their_units() {
    // One call drops ended holders while the work budget (4,096 units) covers each one's
    // units, then leaves the rest for the next call: after 4,095, one more unit fits the
    // budget exactly and goes, two more do not and stay. (Kills the budget test taking an
    // exact fit for too much, or never stopping.)
    for (second, dropped) in [(1, true), (2, false)] {
        let (_server, mut conn, k) = start().await;
        let cap = MAX_UNITS_FOR_TESTS - 1 + second;
        granted(acquire(&mut conn, req("a", cap, MAX_UNITS_FOR_TESTS - 1, false)).await);
        granted(acquire(&mut conn, req("b", cap, second, false)).await);
        // Both leases ended (a first), and `next` says so.
        let now = server_millis(&mut conn).await;
        let () = conn
            .zadd_multiple(&k.leases, &[(now - 10, "a"), (now - 5, "b")])
            .await
            .expect("zadd");
        let () = conn.hset(&k.state, "next", now - 10).await.expect("hset");
        lease_status(&mut conn, &k).await.expect("status");
        let a: Option<String> = conn.hget(&k.state, "r:a").await.expect("hget");
        let b: Option<String> = conn.hget(&k.state, "r:b").await.expect("hget");
        assert_eq!(a, None, "a dropped");
        assert_eq!(b.is_none(), dropped, "b ({second} units) after a: {b:?}");
    }
}
