//! Lease ends: every end a script stores is its Redis time plus the lease, to the
//! millisecond; holders and waiters whose lease ended are settled, those about to end kept.

use super::support::*;

#[tokio::test]
async fn refresh_extends_and_fails_for_unknown_or_expired() {
    let (_server, mut conn, k) = start().await;
    let mut short = req("a", 1, 1, false);
    short.lease = Duration::from_millis(50);
    acquire(&mut conn, short).await;
    assert!(
        lease_refresh(&mut conn, &k, "a", Duration::from_secs(60))
            .await
            .expect("refresh")
    );
    let score: f64 = conn.zscore(&k.leases, "a").await.expect("zscore");
    let ttl: i64 = conn.pttl(&k.leases).await.expect("pttl");
    assert_eq!(ttl, -1, "live state carries no TTL");
    assert!(score > 0.0);
    assert!(
        !lease_refresh(&mut conn, &k, "nope", Duration::from_secs(1))
            .await
            .expect("refresh")
    );

    let mut short = req("c", 1, 1, false);
    short.lease = Duration::from_millis(30);
    release(&mut conn, &k, "a").await.expect("release");
    acquire(&mut conn, short).await;
    tokio::time::sleep(Duration::from_millis(60)).await;
    assert!(
        !lease_refresh(&mut conn, &k, "c", Duration::from_secs(1))
            .await
            .expect("refresh"),
        "an expired lease cannot be revived"
    );
}

/// Run `call`, and assert that it stored for `id` the score `sign * (Redis time of the call
/// + plus)`, to the millisecond: the time read before and after the call brackets it.
async fn assert_stored_from_now<F: std::future::Future>(
    conn: &mut Conn,
    call: impl FnOnce(Conn) -> F,
    id: &str,
    sign: i64,
    plus: i64,
    what: &str,
) -> F::Output {
    let before = server_millis(conn).await;
    let out = call(conn.clone()).await;
    let after = server_millis(conn).await;
    let stored = sign * lease_score(conn, id).await.expect("an entry");
    assert!(
        (before + plus..=after + plus).contains(&stored),
        "{what}: {stored} is not between {} and {}",
        before + plus,
        after + plus
    );
    out
}

#[tokio::test]
async fn every_lease_end_a_script_stores_is_its_redis_time_plus_the_lease_to_the_ms() {
    let (_server, mut conn, _) = start().await;
    let lease = 30_000;
    let a = assert_stored_from_now(
        &mut conn,
        |mut c| async move { acquire(&mut c, req("a", 1, 1, true)).await },
        "a",
        1,
        lease,
        "a grant",
    )
    .await;
    granted(a);
    let mut w = req("w", 1, 1, true);
    w.waiter_lease = Duration::from_secs(20);
    let q = assert_stored_from_now(
        &mut conn,
        |mut c| async move { acquire(&mut c, w).await },
        "w",
        1,
        20_000,
        "a waiter",
    )
    .await;
    assert!(matches!(q, Acquire::Queued { .. }), "{q:?}");
    assert_stored_from_now(
        &mut conn,
        |mut c| async move {
            lease_poll(
                &mut c,
                &keys(),
                "w",
                Duration::from_secs(30),
                Duration::from_secs(25),
            )
            .await
            .expect("poll")
        },
        "w",
        1,
        25_000,
        "a waiter's poll",
    )
    .await;
    assert_stored_from_now(
        &mut conn,
        |mut c| async move { acquire(&mut c, req("a", 1, 1, true)).await },
        "a",
        1,
        lease,
        "a resent acquire",
    )
    .await;
    assert_stored_from_now(
        &mut conn,
        |mut c| async move {
            lease_refresh(&mut c, &keys(), "a", Duration::from_secs(12))
                .await
                .expect("refresh")
        },
        "a",
        1,
        12_000,
        "a refresh",
    )
    .await;
    // Released with a waiter behind it (the general path), and with nobody queued (the fast
    // path): no entry is left.
    for id in ["a", "w"] {
        release(&mut conn, &keys(), id).await.expect("release");
        assert_eq!(lease_score(&mut conn, id).await, None, "{id}");
    }
}

#[tokio::test]
async fn one_call_drops_every_holder_whose_lease_ended() {
    let (_server, mut conn, k) = start().await;
    for id in ["a", "b", "c"] {
        granted(acquire(&mut conn, req(id, 3, 1, false)).await);
    }
    // a and b ended long ago (the ends a frozen holder leaves).
    let () = conn
        .zadd_multiple(&k.leases, &[(1, "a"), (2, "b")])
        .await
        .expect("zadd");
    let () = conn.hset(&k.state, "next", 1).await.expect("hset");
    let status = lease_status(&mut conn, &k).await.expect("status");
    let holding: Vec<&str> = status.holders.iter().map(|h| h.id.as_str()).collect();
    assert_eq!((status.in_use, holding), (1, vec!["c"]));
}

#[tokio::test]
async fn a_release_handing_over_to_its_own_waiter_gives_it_a_lease_from_now() {
    // A grant to a waiter of the releasing client (the local hand-off) is claimed at once:
    // its lease ends a full lease after the release's Redis time, to the millisecond.
    // (Kills promote()'s `S.now + w.lease` read 5 ms early.)
    let (_server, conn, _) = start().await;
    within_3_ms(&conn, |n, mut conn, k| async move {
        let (a, w) = (format!("a{n}"), format!("w{n}"));
        let _: () = conn.del(&k.all[..]).await.expect("del");
        granted(acquire(&mut conn, req(&a, 1, 1, false)).await);
        assert!(matches!(
            acquire(&mut conn, req(&w, 1, 1, true)).await,
            Acquire::Queued { .. }
        ));
        let t0 = server_millis(&mut conn).await;
        lease_release(&mut conn, &k, &a, CHANNEL, by(&format!("release {a}")))
            .await
            .expect("release");
        let t1 = server_millis(&mut conn).await;
        assert_ends_after(&mut conn, &w, (t0, t1), 30_000, "a lease").await;
        t1 - t0 < 3
    })
    .await;
}

#[tokio::test]
async fn a_grant_on_the_general_path_ends_a_lease_after_its_redis_time() {
    // A labelled request takes the general path (the fast one serves unlabelled single
    // units): its lease, too, ends `lease` ms after the call's Redis time, to the ms.
    // (Kills acquire_op()'s grant reading the time 5 ms early.)
    let (_server, conn, _) = start().await;
    within_3_ms(&conn, |n, mut conn, _| async move {
        let id = format!("l{n}");
        let labelled = Request {
            label: "l",
            ..req(&id, 1_000, 2, false)
        };
        let t0 = server_millis(&mut conn).await;
        granted(acquire(&mut conn, labelled).await);
        let t1 = server_millis(&mut conn).await;
        assert_ends_after(&mut conn, &id, (t0, t1), 30_000, "a lease").await;
        t1 - t0 < 3
    })
    .await;
}

#[tokio::test]
async fn a_waiter_whose_waiter_lease_ended_is_dropped_by_the_next_call() {
    // (Kills settle() dropping the lease entry of an expired waiter but not the waiter: the
    // next release would grant the unit to it.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 1, 1, true)).await);
    let short = Request {
        waiter_lease: Duration::from_millis(50),
        ..req("w", 1, 1, true)
    };
    assert!(matches!(
        acquire(&mut conn, short).await,
        Acquire::Queued { .. }
    ));
    assert!(matches!(
        acquire(&mut conn, req("x", 1, 1, true)).await,
        Acquire::Queued { position: 1, .. }
    ));
    tokio::time::sleep(Duration::from_millis(120)).await;
    // a's release settles first: w is gone, so x is the one granted.
    release(&mut conn, &k, "a").await.expect("release");
    assert!(matches!(
        poll(&mut conn, "x").await,
        Acquire::Granted { .. }
    ));
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert!(status.waiters.is_empty(), "{:?}", status.waiters);
    let (qlen, record): (String, Option<String>) =
        state_fields_raw(&mut conn, &["qlen", "r:w"]).await;
    assert_eq!((qlen.as_str(), record), ("0", None));
}

#[tokio::test]
async fn an_unclaimed_grant_ends_when_the_waiters_place_would_have_even_a_moment_ahead() {
    // A grant published to a waiter of another process lasts until its place in the queue
    // would have ended and no longer. Planted by a script in the same MULTI as the release,
    // the place ends one millisecond after the release's millisecond (then the grant ends
    // there), or in it (then the place is gone, and nobody is granted: the round is not
    // counted); `next` is planted with it, as a check-in moving a place end earlier writes
    // it. (Kills promote()'s bound read 5 ms late, or two moments ahead.)
    let (_server, mut conn, k) = start().await;
    let mut granted_rounds = 0;
    for round in 0..20 {
        let _: () = conn.del(&k.all[..]).await.expect("del");
        let (a, b) = (format!("a{round}"), format!("b{round}"));
        granted(acquire(&mut conn, req(&a, 1, 1, false)).await);
        assert!(matches!(
            acquire(&mut conn, req(&b, 1, 1, true)).await,
            Acquire::Queued { .. }
        ));
        let (planted, _): (String, Value) = within(
            LIMIT,
            "MULTI",
            redis::pipe()
                .atomic()
                .add_command(eval(PLANT_AHEAD, &[&k.leases, &k.state]))
                .arg(&b)
                .arg(1)
                .add_command(multi_release(&a, "t:wake:another"))
                .query_async(&mut conn),
        )
        .await
        .expect("MULTI");
        // (Read raw: a script call may run after the grant's end and settle it.)
        let record: Option<String> = conn.hget(&k.state, format!("r:{b}")).await.expect("hget");
        if record.as_deref().is_some_and(|r| r.starts_with("h|")) {
            granted_rounds += 1;
            let ends: f64 = conn.zscore(&k.leases, &b).await.expect("zscore");
            assert_eq!(
                ends.to_string(),
                planted,
                "{b}'s grant ends where its place did"
            );
        }
    }
    assert!(
        granted_rounds > 0,
        "no round granted within the millisecond"
    );
}

/// Makes ARGV[1]'s lease in KEYS[1] end now, ARGV[2]'s 3 ms from now, and `next` of KEYS[2]
/// now (so the next call settles); answers now.
const PLANT_DUE_AND_SOON: &str = "local t = redis.call('TIME') \
    local now = t[1] * 1000 + math.floor(t[2] / 1000) \
    redis.call('ZADD', KEYS[1], string.format('%d', now), ARGV[1]) \
    redis.call('ZADD', KEYS[1], string.format('%d', now + 3), ARGV[2]) \
    redis.call('HSET', KEYS[2], 'next', string.format('%d', now)) \
    return now";

#[tokio::test]
async fn a_settle_keeps_a_lease_that_ends_a_few_ms_later() {
    // The settle drops the leases that ended at or before now, not those about to: planted
    // in the same MULTI as a request, one lease ends in the request's millisecond and another
    // 3 ms later; where the request ran within 2 ms (the time read on both sides tells), the
    // second holder keeps its unit. (Kills the settle reading the time 5 ms late.)
    let (_server, mut conn, k) = start().await;
    let mut told = 0;
    for round in 0..20 {
        let _: () = conn.del(&k.all[..]).await.expect("del");
        let (a, b, c) = (
            format!("a{round}"),
            format!("b{round}"),
            format!("c{round}"),
        );
        granted(acquire(&mut conn, req(&a, 3, 1, false)).await);
        granted(acquire(&mut conn, req(&b, 3, 1, false)).await);
        let r = req(&c, 3, 1, false);
        let (before, reply, after): (i64, Value, i64) = within(
            LIMIT,
            "MULTI",
            redis::pipe()
                .atomic()
                .add_command(eval(PLANT_DUE_AND_SOON, &[&k.leases, &k.state]))
                .arg(&a)
                .arg(&b)
                .add_command(multi_try_acquire(&r))
                .add_command(eval(NOW, &[]))
                .query_async(&mut conn),
        )
        .await
        .expect("MULTI");
        granted(decode_acquire("lease_acquire", reply).expect("decode"));
        if after - before > 2 {
            continue;
        }
        told += 1;
        let record: Option<String> = conn.hget(&k.state, format!("r:{b}")).await.expect("hget");
        assert!(
            record.is_some_and(|r| r.starts_with("h|")),
            "{b}, 3 ms from its end, was settled by a call within 2 ms"
        );
    }
    assert!(told > 0, "no round ran within 2 ms");
}

/// A grant that a settle makes (a holder's lease ended, the head waiter is promoted) is
/// settled in its turn when its own lease ends, though the waiter's place would have lasted
/// longer: the earliest lease end the state keeps counts the new grant's.
#[tokio::test]
async fn a_grant_made_by_a_settle_ends_with_its_own_lease_not_the_waiters_place() {
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 1, 1, false)).await);
    let waiter = Request {
        lease: Duration::from_millis(200),
        ..req("w", 1, 1, true)
    };
    assert!(matches!(
        acquire(&mut conn, waiter).await,
        Acquire::Queued { position: 0, .. }
    ));
    // a's lease ended long ago (the end a frozen holder leaves): the next call settles it and
    // hands the unit to w, whose place lasts 30 s and whose grant 200 ms.
    let () = conn.zadd(&k.leases, "a", 1).await.expect("zadd");
    let () = conn.hset(&k.state, "next", 1).await.expect("hset");
    let status = lease_status(&mut conn, &k).await.expect("status");
    let holding: Vec<&str> = status.holders.iter().map(|h| h.id.as_str()).collect();
    assert_eq!(holding, vec!["w"], "the settle granted w");
    // w never claims it: once its 200 ms are over, the unit is free again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        matches!(
            acquire(&mut conn, req("c", 1, 1, false)).await,
            Acquire::Granted { .. }
        ),
        "w's unclaimed grant ended with its lease"
    );
}
