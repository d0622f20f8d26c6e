//! A capacity changed under holders and waiters: grown (the waiters that fit admitted at
//! once), shrunk (nobody revoked, waiters that can never fit dropped and told), conflicting.

use super::support::*;

#[tokio::test]
async fn set_capacity_grows_admitting_waiters_and_shrinks_without_revoking() {
    let (_server, mut conn, k) = start().await;
    acquire(&mut conn, req("a", 2, 1, true)).await;
    acquire(&mut conn, req("b", 2, 1, true)).await;
    acquire(&mut conn, req("c", 2, 1, true)).await;
    assert_eq!(
        lease_set_capacity(&mut conn, &k, 3).await.expect("grow"),
        Some(2)
    );
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(status.holders.len(), 3, "the waiter was admitted");
    let mut slots: Vec<u32> = status
        .holders
        .iter()
        .flat_map(|h| h.slots.clone())
        .collect();
    slots.sort();
    assert_eq!(slots, vec![0, 1, 2]);

    assert_eq!(
        lease_set_capacity(&mut conn, &k, 1).await.expect("shrink"),
        Some(3)
    );
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(status.holders.len(), 3, "live permits are kept");
    let last = status
        .holders
        .iter()
        .map(|h| h.token)
        .max()
        .expect("holders");
    assert!(matches!(
        acquire(&mut conn, req("d", 1, 1, false)).await,
        Acquire::Busy { in_use: 3, .. }
    ));
    // Once everyone has left, the lowest slot is handed out again.
    for h in &status.holders {
        release(&mut conn, &k, &h.id).await.expect("release");
    }
    let (e, slots) = granted(acquire(&mut conn, req("e", 1, 1, false)).await);
    assert_eq!(slots, vec![0]);
    assert!(e > last);
}

#[tokio::test]
async fn a_different_capacity_conflicts_only_while_in_use() {
    let (_server, mut conn, k) = start().await;
    acquire(&mut conn, req("a", 2, 1, false)).await;
    assert_eq!(
        acquire(&mut conn, req("b", 3, 1, false)).await,
        Acquire::Conflict { current: 2 }
    );
    release(&mut conn, &k, "a").await.expect("release");
    assert!(matches!(
        acquire(&mut conn, req("b", 3, 1, false)).await,
        Acquire::Granted { .. }
    ));
    assert_eq!(
        acquire(&mut conn, req("c", 3, 4, false)).await,
        Acquire::TooBig { capacity: 3 }
    );
}

#[tokio::test]
async fn a_grown_capacity_admits_the_waiters_that_now_fit_at_once() {
    // (Pins the order in the change: the capacity is stored before the queue is served; served
    // first, under the old capacity, it admits nobody.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 1, 1, false)).await);
    assert!(matches!(
        acquire(&mut conn, req("w", 1, 1, true)).await,
        Acquire::Queued { .. }
    ));
    assert_eq!(
        lease_set_capacity(&mut conn, &k, 2).await.expect("set"),
        Some(1)
    );
    // (Read raw: any script, lease_status too, would promote w itself.)
    let (used, qlen): (String, String) = state_fields_raw(&mut conn, &["used", "qlen"]).await;
    assert_eq!(
        (used.as_str(), qlen.as_str()),
        ("2", "0"),
        "w granted by the change itself"
    );
}

#[tokio::test]
async fn a_waiter_larger_than_a_shrunk_capacity_is_dropped_and_those_behind_it_served() {
    // (Kills promote()'s `w.k > S.cap` check skipped: the large waiter would stay at the head
    // forever, and nobody behind it would ever be granted.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 3, 1, true)).await);
    assert!(matches!(
        acquire(&mut conn, req("big", 3, 3, true)).await,
        Acquire::Queued { position: 0, .. }
    ));
    assert!(matches!(
        acquire(&mut conn, req("small", 3, 1, true)).await,
        Acquire::Queued { position: 1, .. }
    ));
    assert_eq!(
        lease_set_capacity(&mut conn, &k, 2).await.expect("shrink"),
        Some(3)
    );
    let poll = |id: &'static str| {
        let mut conn = conn.clone();
        async move { poll(&mut conn, id).await }
    };
    assert_eq!(poll("big").await, Acquire::Gone, "can never fit: dropped");
    assert!(
        matches!(poll("small").await, Acquire::Granted { .. }),
        "served: a holds 1 of 2"
    );
    let big_lease: Option<f64> = conn.zscore(&k.leases, "big").await.expect("ZSCORE");
    assert_eq!(
        big_lease, None,
        "the dropped waiter's lease entry goes with it"
    );
}

#[tokio::test]
async fn a_waiter_too_big_for_a_shrunk_capacity_behind_one_that_fills_it_goes_once_a_unit_is_free()
{
    // A grant that fills the capacity stops the walk of the queue: what is behind waits,
    // even a waiter that can never fit, until a unit is free. (Kills promote() walking on
    // after the capacity is full again.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 3, 3, true)).await);
    for (id, units) in [("w", 2), ("big", 3)] {
        assert!(matches!(
            acquire(&mut conn, req(id, 3, units, true)).await,
            Acquire::Queued { .. }
        ));
    }
    assert_eq!(
        lease_set_capacity(&mut conn, &k, 2).await.expect("shrink"),
        Some(3)
    );
    release(&mut conn, &k, "a").await.expect("release");
    assert!(matches!(
        poll(&mut conn, "w").await,
        Acquire::Granted { .. }
    ));
    assert!(
        matches!(
            poll(&mut conn, "big").await,
            Acquire::Queued { position: 0, .. }
        ),
        "full again: big waits for a free unit"
    );
    release(&mut conn, &k, "w").await.expect("release");
    assert_eq!(poll(&mut conn, "big").await, Acquire::Gone, "then it goes");
}

#[tokio::test]
async fn a_waiter_dropped_for_a_shrunk_capacity_is_woken_to_learn_it() {
    // A waiter asking for more than the capacity now is dropped and told at once by a
    // message with its id alone, not left to find out at its next check-in. (Kills the
    // dropped waiter's wake-up left out.)
    let (server, mut conn, k) = start().await;
    let mut pubsub = subscribe(&server, CHANNEL).await;
    granted(acquire(&mut conn, req("a", 3, 1, true)).await);
    assert!(matches!(
        acquire(&mut conn, req("big", 3, 3, true)).await,
        Acquire::Queued { position: 0, .. }
    ));
    assert_eq!(
        lease_set_capacity(&mut conn, &k, 2).await.expect("shrink"),
        Some(3)
    );
    assert_eq!(next_message(&mut pubsub).await, "big");
}
