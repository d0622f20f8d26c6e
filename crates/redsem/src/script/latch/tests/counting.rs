//! Counting down: once per request, the latch opened and its waiters woken at zero, set
//! again after it opened.

use super::support::*;

#[tokio::test]
async fn a_latch_counts_down_once_per_request_and_publishes_at_zero() {
    let (server, mut conn, k) = start().await;
    let mut pubsub = subscribe(&server, &k.channel).await;
    assert_eq!(
        latch_state(&mut conn, &k).await.expect("state"),
        RawLatchState::Never
    );
    assert!(
        latch_try_set(&mut conn, &k, 3, caller("s1"))
            .await
            .expect("set")
    );
    assert!(
        latch_try_set(&mut conn, &k, 3, caller("s1"))
            .await
            .expect("repeat")
    );
    assert!(
        !latch_try_set(&mut conn, &k, 9, caller("s2"))
            .await
            .expect("set")
    );
    let (shared, shared_keys) = (conn.clone(), k.clone());
    let down = move |id: &'static str| {
        let mut conn = shared.clone();
        let k = shared_keys.clone();
        async move {
            latch_count_down(&mut conn, &k, caller(id))
                .await
                .expect("count_down")
        }
    };
    assert_eq!(down("c1").await, CountDown::Counted(2));
    assert_eq!(
        down("c1").await,
        CountDown::Repeated(2),
        "retried: applied once"
    );
    assert_eq!(down("c2").await, CountDown::Counted(1));
    assert_eq!(down("c3").await, CountDown::Counted(0));
    assert_eq!(next_message(&mut pubsub).await, "opened");
    assert_eq!(down("c3").await, CountDown::Repeated(0));
    assert_eq!(down("c4").await, CountDown::Absent);
    assert_eq!(
        latch_state(&mut conn, &k).await.expect("state"),
        RawLatchState::Done
    );
    let exists: bool = conn.exists(&k.count).await.expect("exists");
    assert!(!exists, "the count key is gone at zero");
    let ttl: i64 = conn.pttl(&k.done).await.expect("pttl");
    assert!(ttl > 3_590_000 && ttl <= 3_600_000, "done marker ttl {ttl}");

    // An opened latch can be set again; deleting a counting one wakes its waiters.
    assert!(
        latch_try_set(&mut conn, &k, 2, caller("s3"))
            .await
            .expect("set")
    );
    assert_eq!(
        latch_state(&mut conn, &k).await.expect("state"),
        RawLatchState::Counting(2)
    );
    assert!(latch_delete(&mut conn, &k).await.expect("delete"));
    assert_eq!(next_message(&mut pubsub).await, "opened");
    assert_eq!(
        latch_state(&mut conn, &k).await.expect("state"),
        RawLatchState::Deleted,
        "deleted while counting"
    );
    assert!(!latch_delete(&mut conn, &k).await.expect("delete"));
    assert_eq!(
        latch_state(&mut conn, &k).await.expect("state"),
        RawLatchState::Never
    );
    let left: usize = conn.exists(&k.all[..]).await.expect("exists");
    assert_eq!(left, 0);
}

#[tokio::test]
async fn every_mutating_latch_script_repeated_with_its_id_is_applied_once() {
    let (_server, mut conn, l) = start_with_count(2).await;
    assert!(
        latch_try_set(&mut conn, &l, 2, caller("s"))
            .await
            .expect("resent")
    );
    assert_eq!(
        latch_count_down(&mut conn, &l, caller("c"))
            .await
            .expect("down"),
        CountDown::Counted(1)
    );
    assert_eq!(
        latch_count_down(&mut conn, &l, caller("c"))
            .await
            .expect("resent"),
        CountDown::Repeated(1)
    );
}

#[tokio::test]
async fn a_count_down_whose_publish_is_refused_by_acl_is_applied_and_opens_the_latch() {
    let server = start_server(&[]);
    let mut admin = connect(&server).await;
    let mut conn = connect_without_channels(&server).await;
    let l = lk();
    let mut pubsub = subscribe(&server, &l.channel).await;
    set_count(&mut conn, 1).await;
    let down = latch_count_down(&mut conn, &l, caller("c")).await;
    println!("count_down with a refused PUBLISH: {down:?}");
    assert_eq!(
        down.expect("the count-down is applied"),
        CountDown::Counted(0)
    );
    // The opening's PUBLISH was refused: nobody heard it.
    assert_nothing_published(&server, &mut pubsub, &l.channel).await;
    assert_eq!(
        latch_state(&mut admin, &l).await.expect("state"),
        RawLatchState::Done
    );
    assert!(
        latch_try_set(&mut conn, &l, 1, caller("s2"))
            .await
            .expect("set")
    );
    assert!(latch_delete(&mut conn, &l).await.expect("delete"));
}

#[tokio::test]
async fn a_latch_set_again_after_it_opened_clears_its_done_marker() {
    // (Kills try_set leaving the done marker of the previous opening.)
    let (_server, mut conn, k) = start().await;
    assert!(
        latch_try_set(&mut conn, &k, 1, caller("s1"))
            .await
            .expect("set")
    );
    latch_count_down(&mut conn, &k, caller("c1"))
        .await
        .expect("down");
    let done: Option<String> = conn.get(&k.done).await.expect("get");
    assert_eq!(done.as_deref(), Some("1"));
    assert!(
        latch_try_set(&mut conn, &k, 2, caller("s2"))
            .await
            .expect("set")
    );
    let done: Option<String> = conn.get(&k.done).await.expect("get");
    assert_eq!(done, None, "counting again: no done marker");
}
