//! Waiting: the queue, check-ins, withdrawals, the wake-up a grant travels with (or the
//! grant handed back to the releasing process), and when a waiter is told to look again.

use super::support::*;

#[tokio::test]
async fn wait_mode_queues_and_a_release_hands_over_and_publishes_the_grant() {
    let (server, mut conn, _) = start().await;
    let mut pubsub = subscribe(&server, CHANNEL).await;

    let (a, _) = granted(acquire(&mut conn, req("a", 1, 1, true)).await);
    let Acquire::Queued { position, recheck } = acquire(&mut conn, req("b", 1, 1, true)).await
    else {
        panic!("b should queue");
    };
    assert_eq!(position, 0);
    assert!(recheck <= Duration::from_secs(10), "{recheck:?}");
    // A try request fails while b waits, even though it is newer.
    assert!(matches!(
        acquire(&mut conn, req("c", 1, 1, false)).await,
        Acquire::Busy { waiters: 1, .. }
    ));

    release(&mut conn, &keys(), "a").await.expect("release");
    // The grant travels with the wake-up: id, token, slots, ms since the last check-in.
    let payload = next_message(&mut pubsub).await;
    let parts: Vec<&str> = payload.split('|').collect();
    assert_eq!(
        (parts.len(), parts[0], parts[2]),
        (4, "b", "0"),
        "{payload}"
    );
    let token: u64 = parts[1].parse().expect("token");
    assert!(token > a, "{payload}");
    let delay: u64 = parts[3].parse().expect("delay");
    assert!(delay < 10_000, "{payload}");

    // A poll (the fallback when the message is lost) finds the same grant.
    let polled = poll(&mut conn, "b").await;
    assert_eq!(
        polled,
        Acquire::Granted {
            token,
            slots: vec![0]
        }
    );
}

#[tokio::test]
async fn poll_renews_the_waiter_and_an_unknown_id_is_gone() {
    let (_server, mut conn, k) = start().await;
    acquire(&mut conn, req("a", 1, 1, true)).await;
    acquire(&mut conn, req("b", 1, 1, true)).await;
    let before: f64 = conn.zscore(&k.leases, "b").await.expect("zscore");
    tokio::time::sleep(Duration::from_millis(5)).await;
    let polled = lease_poll(
        &mut conn,
        &k,
        "b",
        Duration::from_secs(30),
        Duration::from_secs(60),
    )
    .await
    .expect("poll");
    assert!(matches!(polled, Acquire::Queued { position: 0, .. }));
    let after: f64 = conn.zscore(&k.leases, "b").await.expect("zscore");
    assert!(after >= before + 30_000.0, "{before} -> {after}");
    let gone = lease_poll(
        &mut conn,
        &k,
        "zz",
        Duration::from_secs(1),
        Duration::from_secs(1),
    )
    .await
    .expect("poll");
    assert_eq!(gone, Acquire::Gone);
}

#[tokio::test]
async fn release_withdraws_waiters_and_reports_not_held() {
    let (_server, mut conn, k) = start().await;
    acquire(&mut conn, req("a", 1, 1, true)).await;
    acquire(&mut conn, req("b", 1, 1, true)).await;
    assert_eq!(
        release(&mut conn, &k, "b").await.expect("release"),
        Release::Dequeued
    );
    // The same release again (a resend) answers as the first did, for a minute.
    assert_eq!(
        release(&mut conn, &k, "b").await.expect("release"),
        Release::Dequeued
    );
    assert_eq!(
        release(&mut conn, &k, "nobody").await.expect("release"),
        Release::NotHeld
    );
    assert_eq!(
        release(&mut conn, &k, "a").await.expect("release"),
        Release::Released
    );
    assert_eq!(
        release(&mut conn, &k, "a").await.expect("release"),
        Release::Released
    );
    // A release of an id released or withdrawn by another call (a holder's release after a
    // release by id, by the same client or another) did not release it: not held.
    let elsewhere = Session::new();
    for id in ["a", "b"] {
        let other = lease_release(&mut conn, &k, id, "t:wake:another", by("another call"))
            .await
            .expect("release");
        assert_eq!(other.outcome, Release::NotHeld, "{id}");
        let foreign = ReleaseBy::Holder(Caller::new(&elsewhere, number(&format!("release {id}"))));
        let other = lease_release(&mut conn, &k, id, "t:wake:another", foreign)
            .await
            .expect("release");
        assert_eq!(
            other.outcome,
            Release::NotHeld,
            "{id}, the same number in another session"
        );
    }
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(status.in_use, 0);
    assert!(status.holders.is_empty() && status.waiters.is_empty());
}

#[tokio::test]
async fn a_refused_publish_costs_the_waiter_a_poll_not_the_state() {
    // An ACL user without channel rights gets NOPERM from PUBLISH in the middle of a release;
    // once, that was after the slot bits and the grant were written but before the state.
    let server = start_server(&[]);
    let mut conn = connect_without_channels(&server).await;
    let k = keys();
    granted(acquire(&mut conn, req("a", 1, 1, true)).await);
    assert!(matches!(
        acquire(&mut conn, req("b", 1, 1, true)).await,
        Acquire::Queued { .. }
    ));
    let mut pubsub = subscribe(&server, CHANNEL).await;
    assert_eq!(
        release(&mut conn, &k, "a").await.expect("release"),
        Release::Released
    );
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!((status.in_use, status.holders.len()), (1, 1));
    assert_eq!(status.holders[0].id, "b");
    // The wake-up was refused (nobody heard it); b's poll collects the grant.
    assert_nothing_published(&server, &mut pubsub, CHANNEL).await;
    assert!(matches!(
        poll(&mut conn, "b").await,
        Acquire::Granted { .. }
    ));
}

#[tokio::test]
async fn a_release_hands_grants_for_its_own_waiters_back_instead_of_publishing() {
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 1, 1, true)).await);
    assert!(matches!(
        acquire(&mut conn, req("b", 1, 1, true)).await,
        Acquire::Queued { .. }
    ));
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .expect("RESETSTAT");
    // The release comes from b's own client (its channel is CHANNEL).
    let released = lease_release(&mut conn, &k, "a", CHANNEL, by("1"))
        .await
        .expect("release");
    assert_eq!(released.outcome, Release::Released);
    assert!(!released.idle);
    assert_eq!(released.handed.len(), 1);
    let parts: Vec<&str> = released.handed[0].split('|').collect();
    assert_eq!((parts[0], parts[2]), ("b", "0"), "{:?}", released.handed);
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .expect("INFO");
    assert!(!info.contains("cmdstat_publish"), "no PUBLISH: {info}");
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(status.holders[0].id, "b");
}

/// A grant woken by message is unclaimed: it lasts until the waiter lease of the waiter's
/// last check-in ends (not a whole lease), and is dropped like an expired holder after that,
/// freeing its unit and slot for the next waiter; the waiter's check-in claims it (its full
/// lease from then). A grant handed back to the releasing process is claimed at once.
#[tokio::test]
async fn a_grant_woken_by_message_is_unclaimed_until_the_waiter_checks_in() {
    let (_server, mut conn, k) = start().await;
    let waiting = |id| Request {
        waiter_lease: Duration::from_millis(400),
        ..req(id, 1, 1, true)
    };
    granted(acquire(&mut conn, req("a", 1, 1, false)).await);
    for id in ["dead", "live", "local"] {
        assert!(matches!(
            acquire(&mut conn, waiting(id)).await,
            Acquire::Queued { .. }
        ));
    }
    let left = |status: &RawStatus, id: &str| {
        let holder = status.holders.iter().find(|h| h.id == id);
        holder.map(|h| h.left_ms)
    };
    // Released from another process: "dead" is granted by message, unclaimed.
    release(&mut conn, &k, "a").await.expect("release");
    let status = lease_status(&mut conn, &k).await.expect("status");
    let dead_left = left(&status, "dead").expect("dead is granted");
    assert!(dead_left <= 400, "only its waiter lease: {status:?}");
    // "live" checks in meanwhile; "dead" never does: its grant is dropped, "live" granted.
    let mut next = None;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let polled = lease_poll(
            &mut conn,
            &k,
            "live",
            Duration::from_secs(30),
            Duration::from_millis(400),
        )
        .await
        .expect("poll");
        if let Acquire::Granted { token, slots } = polled {
            next = Some((token, slots));
            break;
        }
        lease_poll(
            &mut conn,
            &k,
            "local",
            Duration::from_secs(30),
            Duration::from_millis(400),
        )
        .await
        .expect("poll");
    }
    let (_, slots) = next.expect("live granted once the dead grant's waiter lease ended");
    assert_eq!(slots, vec![0], "the dead grant's slot came back");
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(left(&status, "dead"), None, "{status:?}");
    // Its check-in claimed it: a whole lease.
    assert!(left(&status, "live").expect("live") > 20_000, "{status:?}");
    assert_eq!(status.in_use, 1);
    // Released by the process of "local" (its channel): handed back and claimed at once.
    let released = lease_release(&mut conn, &k, "live", CHANNEL, by("1"))
        .await
        .expect("release");
    assert_eq!(released.handed.len(), 1, "{released:?}");
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert!(
        left(&status, "local").expect("local") > 20_000,
        "{status:?}"
    );
}

#[tokio::test]
async fn a_waiter_behind_the_head_rechecks_at_a_third_of_its_lease() {
    let (_server, mut conn, _) = start().await;
    let short = Request {
        lease: Duration::from_secs(3),
        ..req("a", 1, 1, true)
    };
    granted(acquire(&mut conn, short).await);
    let Acquire::Queued { recheck: head, .. } = acquire(&mut conn, req("w1", 1, 1, true)).await
    else {
        panic!("w1 should queue");
    };
    let Acquire::Queued {
        recheck: behind, ..
    } = acquire(&mut conn, req("w2", 1, 1, true)).await
    else {
        panic!("w2 should queue");
    };
    assert!(
        head <= Duration::from_millis(3001),
        "the head looks a ms after the lease ends: {head:?}"
    );
    assert_eq!(behind, Duration::from_secs(10), "a third of its 30 s");
}

#[tokio::test]
async fn the_head_waiter_is_told_to_look_again_when_the_first_lease_ends() {
    // The recheck of the head waiter is the time to the first lease end + 1 ms, from the
    // call's Redis time. (Kills recheck_ms() reading the time 5 ms late.)
    let (_server, conn, _) = start().await;
    within_3_ms(&conn, |n, mut conn, k| async move {
        let (a, w) = (format!("a{n}"), format!("w{n}"));
        let _: () = conn.del(&k.all[..]).await.expect("del");
        let short = Request {
            lease: Duration::from_millis(2_000),
            ..req(&a, 1, 1, false)
        };
        granted(acquire(&mut conn, short).await);
        let ends = lease_score(&mut conn, &a).await.expect("a's lease end");
        let t0 = server_millis(&mut conn).await;
        let reply = acquire(&mut conn, req(&w, 1, 1, true)).await;
        let t1 = server_millis(&mut conn).await;
        let Acquire::Queued {
            position: 0,
            recheck,
        } = reply
        else {
            panic!("w should head the queue: {reply:?}");
        };
        let recheck = i64::try_from(recheck.as_millis()).expect("ms");
        assert!(
            (ends - t1 + 1..=ends - t0 + 1).contains(&recheck),
            "recheck {recheck} ms, not the time to {ends} from [{t0}, {t1}] + 1"
        );
        t1 - t0 < 3
    })
    .await;
}

#[tokio::test]
async fn a_resent_enqueue_is_answered_with_its_place_in_the_queue() {
    // (Kills the resent waiter's answer giving place 0 whatever its place.)
    let (_server, mut conn, _) = start().await;
    granted(acquire(&mut conn, req("a", 1, 1, false)).await);
    for _ in 0..2 {
        for (id, place) in [("w0", 0), ("w1", 1)] {
            match acquire(&mut conn, req(id, 1, 1, true)).await {
                Acquire::Queued { position, .. } => assert_eq!(position, place, "{id}"),
                other => panic!("{id}: expected Queued, got {other:?}"),
            }
        }
    }
}

#[tokio::test]
async fn a_grant_tells_its_waiter_how_long_it_waited_since_its_check_in() {
    // A grant's message carries the ms since the waiter's last check-in (the end of its place
    // less its waiter lease). Planted in the same MULTI as the release: a check-in 10 ms
    // before the plant's millisecond; with the time read after the release, the delay is
    // 10 ms plus at most the time between the two. (Kills the delay read 5 ms early or late.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 1, 1, false)).await);
    assert!(matches!(
        acquire(&mut conn, req("w", 1, 1, true)).await,
        Acquire::Queued { .. }
    ));
    let (planted, reply, after): (i64, Vec<Value>, i64) = within(
        LIMIT,
        "MULTI",
        redis::pipe()
            .atomic()
            .add_command(eval(PLANT_AHEAD, &[&k.leases, &k.state]))
            .arg("w")
            .arg(30_000 - 10)
            .add_command(multi_release("a", CHANNEL))
            .add_command(eval(NOW, &[]))
            .query_async(&mut conn),
    )
    .await
    .expect("MULTI");
    // (The plant's millisecond: the planted end less 29,990 ms.)
    let before = planted - (30_000 - 10);
    let handed = reply
        .iter()
        .find_map(|v| match v {
            Value::BulkString(b) if b.contains(&b'|') => {
                Some(String::from_utf8_lossy(b).into_owned())
            }
            _ => None,
        })
        .expect("the grant handed back");
    let delay: i64 = handed
        .rsplit('|')
        .next()
        .expect("delay")
        .parse()
        .expect("ms");
    assert!(
        (10..=10 + (after - before)).contains(&delay),
        "{handed}: waited {delay} ms, 10 ms before a release within [{before}, {after}]"
    );
}
