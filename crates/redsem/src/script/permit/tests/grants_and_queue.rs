//! Grants and the queue: permits taken while available, waiters granted in arrival order and
//! woken by their id, withdrawals, bounded grants per run, and the scripts on a cluster.

use super::support::*;

#[tokio::test]
async fn acquire_takes_available_permits_and_try_reports_busy() {
    let (_server, mut conn, _) = start_with_count(3).await;
    assert_eq!(
        acquire(&mut conn, "a", 2, false, LONG).await,
        PermitAcquire::Granted
    );
    assert_eq!(
        acquire(&mut conn, "b", 2, false, LONG).await,
        PermitAcquire::Busy {
            available: 1,
            waiters: 0
        }
    );
    assert_eq!(available(&mut conn).await, 1);
    // A repeated acquire with a collected id is granted again, and takes nothing more.
    assert_eq!(
        acquire(&mut conn, "a", 2, false, LONG).await,
        PermitAcquire::Granted
    );
    assert_eq!(available(&mut conn).await, 1);
}

#[tokio::test]
async fn waiters_are_granted_in_arrival_order_and_woken_by_their_id() {
    let (server, mut conn, _) = start().await;
    let mut pubsub = subscribe(&server, CHANNEL).await;
    set_count(&mut conn, 0).await;
    assert!(matches!(
        acquire(&mut conn, "a", 2, true, LONG).await,
        PermitAcquire::Queued { position: 0, .. }
    ));
    let PermitAcquire::Queued { position, recheck } = acquire(&mut conn, "b", 1, true, LONG).await
    else {
        panic!("b should queue");
    };
    assert_eq!(position, 1);
    assert_eq!(recheck, Duration::from_secs(10));
    // A try request fails while others wait.
    assert_eq!(
        acquire(&mut conn, "c", 1, false, LONG).await,
        PermitAcquire::Busy {
            available: 0,
            waiters: 2
        }
    );

    // One permit: a (2) still does not fit, and b behind it does not overtake it.
    assert_eq!(add(&mut conn, "r1", 1).await, Addition::Applied(1));
    assert!(matches!(
        poll(&mut conn, "b").await,
        PermitAcquire::Queued { position: 1, .. }
    ));
    assert_eq!(add(&mut conn, "r2", 1).await, Addition::Applied(0));
    assert_eq!(next_message(&mut pubsub).await, "a");
    assert_eq!(poll(&mut conn, "a").await, PermitAcquire::Granted);
    assert_eq!(
        poll(&mut conn, "a").await,
        PermitAcquire::Granted,
        "a repeated poll"
    );
    assert!(matches!(
        poll(&mut conn, "b").await,
        PermitAcquire::Queued { position: 0, .. }
    ));
    assert_eq!(add(&mut conn, "r3", 1).await, Addition::Applied(0));
    assert_eq!(next_message(&mut pubsub).await, "b");
    assert_eq!(poll(&mut conn, "b").await, PermitAcquire::Granted);
    assert_eq!(poll(&mut conn, "zz").await, PermitAcquire::Gone);
}

#[tokio::test]
async fn a_withdrawn_request_takes_nothing_whatever_its_state() {
    let (_server, mut conn, k) = start().await;
    // Waiting: just leaves.
    assert!(matches!(
        acquire(&mut conn, "w", 1, true, LONG).await,
        PermitAcquire::Queued { .. }
    ));
    assert_eq!(
        permit_withdraw(&mut conn, &k, "w").await.expect("withdraw"),
        Withdrawal::Withdrawn
    );
    // Granted while it waited, not collected: gives the permits back.
    assert!(matches!(
        acquire(&mut conn, "g", 2, true, LONG).await,
        PermitAcquire::Queued { position: 0, .. }
    ));
    assert_eq!(add(&mut conn, "r1", 2).await, Addition::Applied(0));
    assert_eq!(
        permit_withdraw(&mut conn, &k, "g").await.expect("withdraw"),
        Withdrawal::Returned(2)
    );
    assert_eq!(available(&mut conn).await, 2);
    // Taken by the call the withdrawal names as unanswered (the caller never heard): given
    // back as well.
    assert_eq!(
        acquire(&mut conn, "c", 2, false, LONG).await,
        PermitAcquire::Granted
    );
    assert_eq!(
        withdraw_naming(&mut conn, "c", "c").await,
        Withdrawal::Returned(2)
    );
    assert_eq!(available(&mut conn).await, 2);
    // Twice, or unknown: nothing.
    assert_eq!(
        withdraw_naming(&mut conn, "c", "c").await,
        Withdrawal::Unknown
    );
    assert_eq!(
        withdraw_naming(&mut conn, "never", "never").await,
        Withdrawal::Unknown
    );
    // A withdrawal that names no call leaves what an answered call took (a permit of a
    // caller that heard of it is the caller's to release).
    assert_eq!(
        acquire(&mut conn, "heard", 1, false, LONG).await,
        PermitAcquire::Granted
    );
    assert_eq!(
        permit_withdraw(&mut conn, &k, "heard")
            .await
            .expect("withdraw"),
        Withdrawal::Unknown
    );
    assert_eq!(available(&mut conn).await, 1);
    assert_eq!(add(&mut conn, "r heard", 1).await, Addition::Applied(2));
    // A late acquire with a withdrawn id (sent before the withdrawal, arriving after).
    assert_eq!(
        acquire(&mut conn, "never", 1, false, LONG).await,
        PermitAcquire::Gone
    );
    assert_eq!(available(&mut conn).await, 2);
}

#[tokio::test]
async fn withdrawing_the_head_lets_the_waiters_behind_it_through() {
    let (server, mut conn, _) = start().await;
    let mut pubsub = subscribe(&server, CHANNEL).await;
    assert_eq!(add(&mut conn, "r1", 1).await, Addition::Applied(1));
    acquire(&mut conn, "big", 2, true, LONG).await;
    acquire(&mut conn, "small", 1, true, LONG).await;
    permit_withdraw(&mut conn, &pk(), "big")
        .await
        .expect("withdraw");
    assert_eq!(next_message(&mut pubsub).await, "small");
    assert_eq!(poll(&mut conn, "small").await, PermitAcquire::Granted);
    assert_eq!(available(&mut conn).await, 0);
}

#[tokio::test]
async fn counter_scripts_run_on_a_three_master_cluster() {
    let cluster = start_cluster(3);
    let mut conn = connect_cluster(&cluster).await;
    for name in ["a", "b", "c", "d", "e", "f"] {
        let k = PermitKeys::new("t", name);
        assert!(permit_try_set(&mut conn, &k, "s", 1).await.expect("set"));
        let granted = permit_acquire(&mut conn, &k, "x", 1, true, LONG, CHANNEL).await;
        assert_eq!(granted.expect("acquire"), PermitAcquire::Granted);
        let queued = permit_acquire(&mut conn, &k, "y", 1, true, LONG, CHANNEL).await;
        assert!(
            matches!(queued, Ok(PermitAcquire::Queued { .. })),
            "{queued:?}"
        );
        permit_add(&mut conn, &k, "r", 1).await.expect("release");
        let polled = permit_poll(&mut conn, &k, "y", LONG).await.expect("poll");
        assert_eq!(polled, PermitAcquire::Granted);
        permit_withdraw(&mut conn, &k, "y").await.expect("withdraw");
        assert!(permit_delete(&mut conn, &k).await.expect("delete"));

        let k = LatchKeys::new("t", name);
        assert!(
            latch_try_set(&mut conn, &k, 1, caller("latch s"))
                .await
                .expect("set")
        );
        let down = latch_count_down(&mut conn, &k, caller("latch c"))
            .await
            .expect("count_down");
        assert_eq!(down, CountDown::Counted(0));
        let state = latch_state(&mut conn, &k).await.expect("state");
        assert_eq!(state, RawLatchState::Done);
        latch_delete(&mut conn, &k).await.expect("delete");
    }
}

/// How many waiters one script run grants at most: one release settles at most `MAX_STEPS`
/// queue heads (`permit_prelude.lua`), and here every head is granted.
const MAX_GRANTS: usize = 100;

#[tokio::test]
async fn a_release_to_thousands_of_waiters_grants_a_bounded_number_and_the_rest_follow() {
    const WAITERS: usize = 3000;
    let (server, mut conn, _) = start().await;
    let mut pubsub = subscribe(&server, CHANNEL).await;
    let ids: Vec<String> = (0..WAITERS).map(|i| format!("w{i:04}")).collect();
    // One after the other, so the queue is in the order of `ids` (concurrent calls may
    // overtake each other, e.g. when a NOSCRIPT reload resends some of them).
    within(LIMIT, "queue the waiters", async {
        for id in &ids {
            let reply = permit_acquire(&mut conn, &pk(), id, 1, true, LONG, CHANNEL).await;
            assert!(
                matches!(reply, Ok(PermitAcquire::Queued { .. })),
                "{reply:?}"
            );
        }
    })
    .await;
    assert_eq!(
        add(&mut conn, "r", WAITERS as i64).await,
        Addition::Applied((WAITERS - MAX_GRANTS) as i64)
    );
    let granted = uncollected(&mut conn).await;
    println!("waiters granted by one release of {WAITERS}: {granted}");
    assert_eq!(
        granted, MAX_GRANTS,
        "one script run grants a bounded number"
    );
    // Those granted are woken, then the next in line, whose own poll admits the next ones.
    for id in ids.iter().take(MAX_GRANTS + 1) {
        assert_eq!(&next_message(&mut pubsub).await, id);
    }
    for id in &ids {
        assert_eq!(poll(&mut conn, id).await, PermitAcquire::Granted, "{id}");
    }
    assert_eq!(available(&mut conn).await, 0);
    assert_eq!(
        fields(&mut conn, &["qlen", "wlen"]).await,
        [Some("0".into()), Some("0".into())]
    );
}

#[tokio::test]
async fn a_publish_refused_by_acl_leaves_the_state_whole_and_the_call_succeeds() {
    let server = start_server(&[]);
    let mut admin = connect(&server).await;
    let mut conn = connect_without_channels(&server).await;
    let k = pk();
    assert!(matches!(
        permit_acquire(&mut conn, &k, "w", 1, true, LONG, CHANNEL).await,
        Ok(PermitAcquire::Queued { .. })
    ));
    let mut pubsub = subscribe(&server, CHANNEL).await;
    let added = permit_add(&mut conn, &k, "r", 1).await;
    println!("release with a refused PUBLISH: {added:?}");
    assert_eq!(added.expect("the release is applied"), Addition::Applied(0));
    // The wake-up was refused: nobody heard it.
    assert_nothing_published(&server, &mut pubsub, CHANNEL).await;
    assert_eq!(
        permit_poll(&mut conn, &k, "w", LONG).await.expect("poll"),
        PermitAcquire::Granted,
        "the waiter collects by polling"
    );
    assert_eq!(
        fields(&mut admin, &["qlen", "wlen"]).await,
        [Some("0".into()), Some("0".into())]
    );
    assert_eq!(available(&mut admin).await, 0);
}

#[tokio::test]
async fn a_waiter_withdrawn_behind_a_head_that_does_not_fit_leaves_the_queue() {
    let (_server, mut conn, _) = start_with_count(0).await;
    let _ = acquire(&mut conn, "big", 5, true, LONG).await;
    let _ = acquire(&mut conn, "small", 1, true, LONG).await;
    assert_eq!(
        permit_withdraw(&mut conn, &pk(), "small")
            .await
            .expect("withdraw"),
        Withdrawal::Withdrawn
    );
    let queue: Vec<String> = conn.zrange(&pk().queue, 0, -1).await.expect("zrange");
    assert_eq!(queue, vec!["big".to_owned()]);
    let qlen: String = conn.hget(&pk().records, "qlen").await.expect("hget");
    assert_eq!(qlen, "1");
}

#[tokio::test]
async fn a_waiter_told_its_place_is_lost_leaves_no_record_and_a_withdrawal_finds_nothing() {
    // (The record of a waiter whose queue vanished goes with its place.)
    let (_server, mut conn, k) = start().await;
    acquire(&mut conn, "d", 1, true, LONG).await;
    let () = conn.del(&k.queue).await.expect("DEL");
    assert_eq!(poll(&mut conn, "d").await, PermitAcquire::Gone);
    assert_eq!(fields(&mut conn, &["r:d"]).await, [None], "d's record");
    assert_eq!(
        permit_withdraw(&mut conn, &k, "d").await.expect("withdraw"),
        Withdrawal::Unknown,
        "nothing left to withdraw"
    );
    assert_eq!(
        fields(&mut conn, &["qlen", "wlen", "live"]).await,
        [Some("0".into()), Some("0".into()), None]
    );
}

#[tokio::test]
async fn a_withdrawn_waiter_leaves_no_record_and_a_second_withdrawal_finds_nothing() {
    // (A waiting record left behind would be found by a second withdrawal, answered
    // withdrawn again.)
    let (_server, mut conn, k) = start_with_count(0).await;
    assert!(matches!(
        acquire(&mut conn, "w", 1, true, LONG).await,
        PermitAcquire::Queued { position: 0, .. }
    ));
    assert_eq!(
        permit_withdraw(&mut conn, &k, "w").await.expect("withdraw"),
        Withdrawal::Withdrawn
    );
    assert_eq!(fields(&mut conn, &["r:w"]).await, vec![None], "no record");
    assert_eq!(
        permit_withdraw(&mut conn, &k, "w")
            .await
            .expect("withdraw again"),
        Withdrawal::Unknown
    );
}

#[tokio::test]
async fn a_collected_grant_leaves_no_record() {
    // A waiter's check-in collects its grant: the record goes (the call's mark answers a
    // resend). (Kills check_in() keeping the record of a grant collected.)
    let (_server, mut conn, _) = start_with_count(0).await;
    assert!(matches!(
        acquire(&mut conn, "w", 1, true, LONG).await,
        PermitAcquire::Queued { .. }
    ));
    assert_eq!(add(&mut conn, "r", 1).await, Addition::Applied(0));
    assert_eq!(poll(&mut conn, "w").await, PermitAcquire::Granted);
    assert_eq!(fields(&mut conn, &["r:w"]).await, [None]);
}
