//! Resent and late calls: each call applied once, its session's record keeping the marks of
//! calls in flight, late copies of answered calls refused, the record renewed on time.

use super::support::*;

#[tokio::test]
async fn a_resent_acquire_or_release_is_applied_once() {
    // The cluster client resends a request whose reply was lost.
    let (_server, mut conn, k) = start().await;
    let mut labelled = req("a", 2, 1, false);
    labelled.label = "host";
    let first = granted(acquire(&mut conn, labelled).await);
    assert_eq!(granted(acquire(&mut conn, labelled).await), first);
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!((status.in_use, status.holders.len()), (1, 1));
    let label: Option<String> = conn.hget(&k.state, "label:host").await.expect("hget");
    assert_eq!(label.as_deref(), Some("1"), "counted once");

    let queued = acquire(&mut conn, req("b", 2, 2, true)).await;
    assert!(
        matches!(queued, Acquire::Queued { position: 0, .. }),
        "{queued:?}"
    );
    assert!(matches!(
        acquire(&mut conn, req("b", 2, 2, true)).await,
        Acquire::Queued { position: 0, .. }
    ));
    for _ in 0..2 {
        assert_eq!(
            release(&mut conn, &k, "a").await.expect("release"),
            Release::Released
        );
    }
    // b got both units once.
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!((status.in_use, status.holders.len()), (2, 1));
    for id in ["b"] {
        release(&mut conn, &k, id).await.expect("release");
    }

    // A late copy of an acquire that its client had the answer to (its number below the
    // session's low mark, which the client's release after it carried) grants nothing.
    let own = Session::new();
    let enqueue = own.open();
    let c = Request {
        call: Caller::new(&own, enqueue.n()),
        ..req("c", 2, 1, false)
    };
    granted(acquire(&mut conn, c).await);
    drop(enqueue);
    let seq = own.open();
    let by = ReleaseBy::Holder(Caller::new(&own, seq.n()));
    let released = lease_release(&mut conn, &k, "c", "t:wake:another", by)
        .await
        .expect("release");
    assert_eq!(released.outcome, Release::Released);
    assert_eq!(acquire(&mut conn, c).await, Acquire::Gone);
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(status.in_use, 0, "{status:?}");
}

#[tokio::test]
async fn a_session_record_keeps_the_marks_of_calls_in_flight_only() {
    // The marks below the low mark go with the next write of the record, so it holds
    // what the client has in flight, however many releases it made.
    let (_server, mut conn, k) = start().await;
    let own = Session::new();
    let pinned = own.open(); // a call still in flight: the low mark stays at it
    let mut last = None;
    for i in 0..50 {
        let id = format!("p{i}");
        granted(acquire(&mut conn, req(&id, 2, 1, false)).await);
        let seq = own.open();
        let by = ReleaseBy::Holder(Caller::new(&own, seq.n()));
        let released = lease_release(&mut conn, &k, &id, "t:wake:another", by)
            .await
            .expect("release");
        assert_eq!(released.outcome, Release::Released);
        last = Some(seq.n());
    }
    let field = format!("s:{}", own.id());
    let record: String = conn.hget(&k.state, &field).await.expect("hget");
    assert_eq!(
        record.matches('=').count(),
        50,
        "the low mark is held at {}: every mark kept: {record}",
        pinned.n()
    );
    drop(pinned);
    granted(acquire(&mut conn, req("q", 2, 1, false)).await);
    let seq = own.open();
    let by = ReleaseBy::Holder(Caller::new(&own, seq.n()));
    lease_release(&mut conn, &k, "q", "t:wake:another", by)
        .await
        .expect("release");
    let record: String = conn.hget(&k.state, &field).await.expect("hget");
    assert_eq!(
        record.matches('=').count(),
        1,
        "only the release in flight is marked: {record}"
    );
    assert!(
        record.starts_with(&format!("{}|", Hex(seq.n()))),
        "the low mark is the release in flight: {record}"
    );
    // A late copy of a release below the low mark changes nothing and is not held.
    let stale = ReleaseBy::Holder(Caller::new(&own, last.expect("released")));
    granted(acquire(&mut conn, req("r", 2, 1, false)).await);
    let late = lease_release(&mut conn, &k, "r", "t:wake:another", stale)
        .await
        .expect("release");
    assert_eq!(late.outcome, Release::NotHeld, "stale: not applied");
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(status.holders.len(), 1, "r still holds: {status:?}");
}

#[tokio::test]
async fn a_late_copy_of_an_enqueue_withdrawn_unanswered_is_refused() {
    // A cancelled acquire whose enqueue went unanswered is withdrawn naming that
    // enqueue; a copy of it that arrives afterwards (a resend, a delayed packet) is refused,
    // and does not queue a waiter nobody waits for.
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 1, 1, false)).await);
    let own = Session::new();
    let enqueue = own.open();
    let w = Request {
        call: Caller::new(&own, enqueue.n()),
        ..req("w", 1, 1, true)
    };
    // The enqueue arrived (its reply did not): w is queued. Then withdrawn naming it.
    assert!(matches!(
        acquire(&mut conn, w).await,
        Acquire::Queued { .. }
    ));
    let withdrawal = ReleaseBy::Withdrawal {
        session: &own,
        pending: Some(enqueue.n()),
    };
    let withdrawn = lease_release(&mut conn, &k, "w", CHANNEL, withdrawal)
        .await
        .expect("withdraw");
    assert_eq!(withdrawn.outcome, Release::Dequeued);
    assert_eq!(acquire(&mut conn, w).await, Acquire::Gone, "the late copy");
    // The same when the enqueue never arrived before its withdrawal.
    let enqueue = own.open();
    let x = Request {
        call: Caller::new(&own, enqueue.n()),
        ..req("x", 1, 1, true)
    };
    let withdrawal = ReleaseBy::Withdrawal {
        session: &own,
        pending: Some(enqueue.n()),
    };
    let withdrawn = lease_release(&mut conn, &k, "x", CHANNEL, withdrawal)
        .await
        .expect("withdraw");
    assert_eq!(withdrawn.outcome, Release::NotHeld);
    assert_eq!(acquire(&mut conn, x).await, Acquire::Gone, "the late copy");
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert!(status.waiters.is_empty(), "{status:?}");
}

#[tokio::test]
async fn a_call_arriving_late_with_a_lower_low_mark_does_not_lower_its_sessions() {
    // A client sends release A (number 10) while its call 3 is unanswered (low mark 3); A is
    // delayed. Meanwhile 3 and acquire 5 are answered, and release B (11) goes out with the
    // low mark 10 and arrives first. When A arrives, the record must keep 10: a late copy of
    // acquire 5 (answered) is then refused, never granted a second time.
    // (Kills common.lua's `if S.sl > low` skipped in session_put().)
    let (_server, mut conn, _) = start().await;
    let sid = "late-session";
    granted(raw_acquire(&mut conn, "x", 4, 1, sid, 1).await);
    granted(raw_acquire(&mut conn, "y", 4, 5, sid, 3).await);
    assert_eq!(raw_release(&mut conn, "y", 11, sid, 10).await, "RELEASED");
    assert_eq!(raw_release(&mut conn, "x", 10, sid, 3).await, "RELEASED");
    let record: String = conn
        .hget(&keys().state, format!("s:{sid}"))
        .await
        .expect("hget");
    assert!(
        record.starts_with(&format!("{}|", Hex(10))),
        "the low mark stays 10: {record}"
    );
    assert_eq!(
        raw_acquire(&mut conn, "y", 4, 5, sid, 3).await,
        Acquire::Gone,
        "a late copy of acquire 5, answered, is not applied"
    );
    let status = lease_status(&mut conn, &keys()).await.expect("status");
    assert!(status.holders.is_empty(), "{:?}", status.holders);
}

#[tokio::test]
async fn a_session_record_is_renewed_in_the_very_millisecond_its_renewal_falls_due() {
    // A record is renewed once it was renewed SESSION_RENEW_MS ago or more: a record whose
    // expiry is planted (in the same MULTI as the release) to fall due in the release's own
    // millisecond is renewed. (Kills the renewal test `<=` read as `<`.)
    let (_server, mut conn, k) = start().await;
    load_for_multi(&mut conn, &LEASE_RELEASE).await;
    let plant = redis::Script::new(
        r"local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        redis.call('HSET', KEYS[1], ARGV[1], string.format('%x|%x|0|', tonumber(ARGV[2], 16), now + 540000))
        return now",
    );
    load_script(&mut conn, &plant).await;
    let (sid, field) = ("edge", "s:edge");
    for round in 1..=200u64 {
        let id = format!("a{round}");
        let seq = 2 * round;
        granted(raw_acquire(&mut conn, &id, 4, seq - 1, sid, seq - 1).await);
        let mut pipe = redis::pipe();
        pipe.atomic()
            .invoke_script(plant.key(&k.state).arg(field).arg(Hex(seq).to_string()));
        raw_release_call(&id, seq, sid, seq).add_to(&mut pipe);
        let (planted, _): (i64, Value) =
            within(LIMIT, "plant and release", pipe.query_async(&mut conn))
                .await
                .expect("exec");
        let record: String = conn.hget(&k.state, field).await.expect("hget");
        let expiry = record
            .split('|')
            .nth(1)
            .and_then(|e| i64::from_str_radix(e, 16).ok())
            .expect("an expiry");
        assert_ne!(
            expiry,
            planted + 540_000,
            "a record due for renewal was not renewed: {record}"
        );
        if expiry - 600_000 == planted {
            return; // renewed in the millisecond it fell due
        }
    }
    panic!("no release ran in the millisecond of its plant in 200 rounds");
}
