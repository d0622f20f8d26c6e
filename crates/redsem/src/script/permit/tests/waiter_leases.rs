//! Waiter leases: a waiter whose lease ended is dropped at its own end (whatever other leases
//! come before or after it), and a grant it never collected is given back.

use super::support::*;

#[tokio::test]
async fn a_dead_waiter_is_dropped_within_its_waiter_lease_and_gives_back_a_grant() {
    let (_server, mut conn, _) = start().await;
    let short = Duration::from_millis(100);
    assert!(matches!(
        acquire(&mut conn, "dead", 1, true, short).await,
        PermitAcquire::Queued { .. }
    ));
    assert_eq!(add(&mut conn, "r1", 0).await, Addition::Applied(0));
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(add(&mut conn, "r2", 1).await, Addition::Applied(1));
    assert_eq!(
        acquire(&mut conn, "live", 1, false, LONG).await,
        PermitAcquire::Granted,
        "the dead waiter no longer blocks"
    );

    // Granted while it waited, and never collected: the permit comes back.
    acquire(&mut conn, "dead2", 1, true, short).await;
    assert_eq!(add(&mut conn, "r3", 1).await, Addition::Applied(0));
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(available(&mut conn).await, 1);
    assert_eq!(poll(&mut conn, "dead2").await, PermitAcquire::Gone);
}

#[tokio::test]
async fn a_dead_waiter_is_dropped_at_its_own_lease_though_a_later_one_has_a_longer_lease() {
    let (_server, mut conn, _) = start().await;
    let short = Duration::from_millis(100);
    let _ = acquire(&mut conn, "dead", 1, true, short).await;
    let _ = acquire(&mut conn, "live", 1, true, LONG).await;
    assert_eq!(add(&mut conn, "r1", 0).await, Addition::Applied(0));
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(add(&mut conn, "r2", 1).await, Addition::Applied(0));
    assert_eq!(
        poll(&mut conn, "live").await,
        PermitAcquire::Granted,
        "the permit went to the live waiter, past the dead one"
    );
}

#[tokio::test]
async fn a_waiter_is_dropped_at_the_end_of_its_own_lease_whatever_leases_come_before_or_after() {
    // The next lease end (wnext) is the earliest of all: lowered by a shorter lease queued
    // behind a longer one, and, after a sweep that leaves waiters, the earliest left, not put
    // off by a longer lease queued next. On the real code the ends asserted hold however late
    // each call comes.
    let (_server, mut conn, _) = start_with_count(0).await;
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
    // the end of a shorter one.
    let (_server, mut conn, k) = start().await;
    acquire(&mut conn, "ghost", 1, true, LONG).await;
    let () = conn.del(&k.records).await.expect("DEL");
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

/// Queue `id` (one permit, a 30 s waiter lease) in an empty queue.
async fn queue_alone(conn: &mut Conn, id: &str) {
    assert!(
        matches!(
            acquire(conn, id, 1, true, LONG).await,
            PermitAcquire::Queued { position: 0, .. }
        ),
        "{id}"
    );
}

#[tokio::test]
async fn a_waiter_is_dropped_in_the_very_millisecond_its_lease_ends() {
    // A waiter lease ends at its millisecond: a check-in in that millisecond finds the waiter
    // gone. Set by a script in the same MULTI as the check-in, the lease's end (and wnext) is
    // the check-in's own millisecond or one just before it. (A lease
    // taken to end a millisecond later fails nearly every round; the real code passes whatever
    // the times.)
    let (_server, mut conn, k) = start_with_count(0).await;
    for round in 0..20 {
        let id = format!("w{round}");
        queue_alone(&mut conn, &id).await;
        let (_, reply): (String, Vec<String>) = within(
            LIMIT,
            "MULTI",
            plant_now(&k.waiters, &id, &k.records, "wnext")
                .add_command(multi_call(&PERMIT_POLL))
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
    // of its own lease. (Left in the waiters, the dead waiter would be
    // swept again by the next call, which would then count no waiter left.)
    let (_server, mut conn, k) = start_with_count(0).await;
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
async fn an_addition_in_the_millisecond_a_granted_waiter_expires_counts_its_grant_given_back() {
    // A waiter granted but never collected gives its permits back when its lease ends. An
    // addition made in that very millisecond reads the count first (the give-back needs it),
    // so it answers the count with both the permit given back and its own. Set by a script
    // in the same MULTI as the addition, the lease's end (and wnext) is the addition's own
    // millisecond or one just before it. (The count left unread in that
    // millisecond fails it.)
    let (_server, mut conn, k) = start_with_count(0).await;
    for round in 0..20 {
        let id = format!("w{round}");
        queue_alone(&mut conn, &id).await;
        assert_eq!(
            add(&mut conn, &format!("grant {id}"), 1).await,
            Addition::Applied(0),
            "round {round}: {id} granted, not collected"
        );
        let (_, reply): (String, (String, i64)) = within(
            LIMIT,
            "MULTI",
            plant_now(&k.waiters, &id, &k.records, "wnext")
                .add_command(multi_call(&PERMIT_ADD))
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
        let count: i64 = conn.get(&k.count).await.expect("GET");
        assert_eq!(count, 2, "round {round}");
        // Back to none available for the next round.
        assert_eq!(
            add(&mut conn, &format!("take {id}"), -2).await,
            Addition::Applied(0)
        );
    }
}

#[tokio::test]
async fn after_a_waiter_lease_ends_the_next_one_is_looked_at_when_it_ends() {
    // Dropping the waiters whose lease ended sets `wnext` to the next waiter lease's end (not
    // to now: that would run the expiry on every call). (Kills settle() taking every
    // expiry batch for a full one.)
    let (_server, mut conn, k) = start_with_count(0).await;
    for (id, lease) in [("short", Duration::from_millis(20)), ("long", LONG)] {
        assert!(matches!(
            acquire(&mut conn, id, 1, true, lease).await,
            PermitAcquire::Queued { .. }
        ));
    }
    tokio::time::sleep(Duration::from_millis(40)).await;
    assert_eq!(available(&mut conn).await, 0);
    let waiting: Vec<(String, i64)> = conn
        .zrange_withscores(&k.waiters, 0, -1)
        .await
        .expect("zrange");
    assert_eq!(waiting.len(), 1, "the short one dropped: {waiting:?}");
    assert_eq!(
        fields(&mut conn, &["wnext"]).await,
        [Some(waiting[0].1.to_string())]
    );
}

/// The waiters key lost while someone waits: the sweep of ended waiter leases finds no entry
/// there, and sets the count of waiters to 0 instead of keeping one nobody can drop.
#[tokio::test]
async fn a_waiters_key_lost_under_a_waiter_leaves_no_waiter_counted_once_its_lease_ends() {
    let (_server, mut conn, k) = start().await;
    let queued = acquire(&mut conn, "a", 1, true, Duration::from_millis(30)).await;
    assert!(
        matches!(queued, PermitAcquire::Queued { position: 0, .. }),
        "nothing is set: the request waits, not {queued:?}"
    );
    assert_eq!(fields(&mut conn, &["wlen"]).await, [Some("1".into())]);
    let () = conn.del(&k.waiters).await.expect("DEL waiters");
    tokio::time::sleep(Duration::from_millis(60)).await;
    permit_available(&mut conn, &k).await.expect("available");
    assert_eq!(
        fields(&mut conn, &["wlen"]).await,
        [Some("0".into())],
        "the waiter lease ended with no entry left to drop"
    );
}

/// A waiter dropped at the end of its lease leaves the others counted in the records (wlen),
/// as many as the waiters zset holds.
#[tokio::test]
async fn a_waiter_dropped_at_the_end_of_its_lease_leaves_the_others_counted() {
    let (_server, mut conn, k) = start().await;
    let short = Duration::from_millis(100);
    for (id, lease) in [("dead", short), ("alive", LONG)] {
        assert!(matches!(
            acquire(&mut conn, id, 1, true, lease).await,
            PermitAcquire::Queued { .. }
        ));
    }
    tokio::time::sleep(Duration::from_millis(150)).await;
    assert_eq!(available(&mut conn).await, 0);
    let waiting: u64 = conn.zcard(&k.waiters).await.expect("zcard");
    let counted: String = conn.hget(&k.records, "wlen").await.expect("hget");
    assert_eq!((waiting, counted.as_str()), (1, "1"));
}
