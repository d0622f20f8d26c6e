//! The count: additions, try_set and drain (each applied once), the ±(2^53 − 1) range, and a
//! semaphore never set.

use super::support::*;

#[tokio::test]
async fn an_add_repeated_with_the_same_request_id_is_applied_once() {
    let (_server, mut conn, _) = start().await;
    assert_eq!(add(&mut conn, "r1", 2).await, Addition::Applied(2));
    assert_eq!(add(&mut conn, "r1", 2).await, Addition::Repeated(2));
    assert_eq!(available(&mut conn).await, 2);
    assert_eq!(add(&mut conn, "r2", -5).await, Addition::Applied(-3));
    assert_eq!(add(&mut conn, "r2", -5).await, Addition::Repeated(-3));
    assert_eq!(available(&mut conn).await, -3);
}

#[tokio::test]
async fn try_set_sets_only_a_count_never_set_and_a_repeat_answers_set() {
    let (_server, mut conn, _) = start().await;
    let shared = conn.clone();
    let set = move |id: &'static str, n: u32| {
        let mut conn = shared.clone();
        async move { permit_try_set(&mut conn, &pk(), id, n).await.expect("set") }
    };
    assert!(set("s1", 0).await, "a count of 0 is a count");
    assert!(set("s1", 0).await, "the same request answers the same");
    assert!(!set("s2", 5).await, "0 counts as set");
    assert_eq!(available(&mut conn).await, 0);
    assert!(permit_delete(&mut conn, &pk()).await.expect("delete"));
    assert!(!permit_delete(&mut conn, &pk()).await.expect("delete"));
    assert!(set("s3", 5).await, "set again after a delete");
    assert_eq!(available(&mut conn).await, 5);
}

#[tokio::test]
async fn the_count_stays_within_two_to_the_53() {
    let (_server, mut conn, _) = start().await;
    let max = (1_i64 << 53) - 1;
    assert_eq!(add(&mut conn, "r1", max).await, Addition::Applied(max));
    assert_eq!(add(&mut conn, "r2", 1).await, Addition::OutOfRange(max));
    assert_eq!(
        add(&mut conn, "r3", -max).await,
        Addition::Applied(0),
        "and back"
    );
}

#[tokio::test]
async fn drain_takes_what_is_available_and_leaves_a_negative_count_alone() {
    let (_server, mut conn, _) = start().await;
    assert_eq!(
        permit_drain(&mut conn, &pk(), "d1").await.expect("drain").0,
        0
    );
    let exists: bool = conn.exists(&pk().count).await.expect("exists");
    assert!(!exists, "draining a semaphore never set does not set it");
    add(&mut conn, "r1", 5).await;
    assert_eq!(
        permit_drain(&mut conn, &pk(), "d2").await.expect("drain").0,
        5
    );
    assert_eq!(available(&mut conn).await, 0);
    add(&mut conn, "r2", -3).await;
    assert_eq!(
        permit_drain(&mut conn, &pk(), "d3").await.expect("drain").0,
        0
    );
    assert_eq!(available(&mut conn).await, -3);
}

#[tokio::test]
async fn a_drain_repeated_with_the_same_request_id_answers_the_same_and_takes_once() {
    let (_server, mut conn, _) = start().await;
    add(&mut conn, "r1", 5).await;
    assert_eq!(
        permit_drain(&mut conn, &pk(), "d1").await.expect("drain").0,
        5
    );
    // Released by someone else before the resent drain arrives.
    add(&mut conn, "r2", 2).await;
    let again = permit_drain(&mut conn, &pk(), "d1")
        .await
        .expect("resent")
        .0;
    let left = available(&mut conn).await;
    println!("resent drain answered {again}, left {left} of the 2 released after it");
    assert_eq!((again, left), (5, 2), "the resend takes nothing more");
    assert_eq!(
        permit_drain(&mut conn, &pk(), "d2").await.expect("drain").0,
        2
    );
}

#[tokio::test]
async fn an_addition_while_others_wait_adds_to_the_count_and_available_says_it_is_set() {
    let (_server, mut conn, _) = start_with_count(3).await;
    let _ = acquire(&mut conn, "w", 5, true, LONG).await;
    assert_eq!(add(&mut conn, "one", 1).await, Addition::Applied(4));
    let state = permit_available(&mut conn, &pk()).await.expect("available");
    assert_eq!((state.available, state.waiters, state.set), (4, 1, true));
}

#[tokio::test]
async fn an_addition_beyond_the_range_reports_the_count_it_left_alone() {
    // With nobody waiting the count is read lazily: a delta too large for the fast path must
    // still read it.
    let (_server, mut conn, _) = start_with_count(5).await;
    let huge = 1_i64 << 53;
    assert_eq!(add(&mut conn, "huge", huge).await, Addition::OutOfRange(5));
    assert_eq!(available(&mut conn).await, 5);
}

#[tokio::test]
async fn a_drain_of_nothing_resent_after_permits_came_back_takes_nothing() {
    // A drain that found nothing is marked too: its resend, after an addition, answers 0 and
    // leaves the new permits.
    let (_server, mut conn, _) = start_with_count(0).await;
    assert_eq!(
        permit_drain(&mut conn, &pk(), "d").await.expect("drain").0,
        0
    );
    assert_eq!(add(&mut conn, "r", 3).await, Addition::Applied(3));
    assert_eq!(
        permit_drain(&mut conn, &pk(), "d").await.expect("resent").0,
        0
    );
    assert_eq!(available(&mut conn).await, 3);
}

#[tokio::test]
async fn an_addition_beyond_the_range_while_a_grant_is_uncollected_changes_nothing() {
    // Nobody queues, a grant is uncollected: the addition adds first and looks after (the
    // count not read up front); past the range it is taken back and answered as such, not
    // marked.
    let (_server, mut conn, _) = start_with_count(0).await;
    acquire(&mut conn, "w", 1, true, LONG).await;
    assert_eq!(
        add(&mut conn, "max", MAX).await,
        Addition::Applied(MAX - 1),
        "w granted one"
    );
    assert_eq!(
        add(&mut conn, "over", 2).await,
        Addition::OutOfRange(MAX - 1)
    );
    assert_eq!(available(&mut conn).await, MAX - 1);
    assert_eq!(
        add(&mut conn, "over", 1).await,
        Addition::Applied(MAX),
        "the call was not marked: sent again, it is applied"
    );
    assert_eq!(poll(&mut conn, "w").await, PermitAcquire::Granted);
}

#[tokio::test]
async fn an_acquire_on_a_semaphore_never_set_answers_busy_when_nothing_waits() {
    // The bookkeeping is in place and quiet (a drain made it) but the count was never set:
    // the uncontended fast path leaves it to the general path.
    let (_server, mut conn, k) = start().await;
    assert_eq!(permit_drain(&mut conn, &k, "d").await.expect("drain").0, 0);
    let quiet = fields(&mut conn, &["keep", "prune", "wide", "live"]).await;
    assert!(
        quiet[..3].iter().all(Option::is_some) && quiet[3].is_none(),
        "{quiet:?}"
    );
    assert_eq!(
        acquire(&mut conn, "t", 1, false, LONG).await,
        PermitAcquire::Busy {
            available: 0,
            waiters: 0
        }
    );
    let state = script::permit_available(&mut conn, &k)
        .await
        .expect("available");
    assert!(!state.set, "still never set");
}

#[tokio::test]
async fn an_uncontended_addition_beyond_the_range_changes_nothing_and_is_not_marked() {
    // The fast addition takes back an addition that leaves +-(2^53 - 1) and answers the
    // count as it was, keeping none of it.
    let (_server, mut conn, k) = start().await;
    let client = Session::new();
    let seq = client.open();
    assert!(
        script::permit_try_set(&mut conn, &k, "s", 0, Caller::new(&client, seq.n()))
            .await
            .expect("set")
    );
    drop(seq);
    let seq = client.open();
    assert_eq!(
        script::permit_add(&mut conn, &k, "r", MAX, Caller::new(&client, seq.n()))
            .await
            .expect("add"),
        Addition::Applied(MAX)
    );
    drop(seq);
    let seq = client.open();
    assert_eq!(
        script::permit_add(&mut conn, &k, "r", 1, Caller::new(&client, seq.n()))
            .await
            .expect("add"),
        Addition::OutOfRange(MAX)
    );
    drop(seq);
    assert_eq!(available(&mut conn).await, MAX);
    let count: i64 = conn.get(&k.count).await.expect("GET");
    assert_eq!(count, MAX);
}

#[tokio::test]
async fn setting_a_count_already_set_answers_the_count_there() {
    // (The count there, not 0.)
    let (_server, mut conn, k) = start_with_count(5).await;
    let reply: (String, i64) = op_command(&PERMIT_TRY_SET, &k.all)
        .arg("s2")
        .arg(7)
        .arg(Hex(number("s2")))
        .arg(session().id())
        .arg(Hex(session().low()))
        .query_async(&mut conn)
        .await
        .expect("permit_try_set");
    assert_eq!(reply, ("EXISTS".to_owned(), 5));
}

#[tokio::test]
async fn calls_that_change_nothing_on_a_semaphore_never_set_create_no_key() {
    // With no bookkeeping and nothing queued, a call finds nothing to settle and writes
    // nothing: not even counters of zero. (Kills permit_prelude's load() rebuilding counters
    // where nothing is queued.)
    let (_server, mut conn, k) = start().await;
    assert_eq!(available(&mut conn).await, 0);
    assert_eq!(
        acquire(&mut conn, "busy", 1, false, LONG).await,
        PermitAcquire::Busy {
            available: 0,
            waiters: 0
        }
    );
    assert_eq!(poll(&mut conn, "nobody").await, PermitAcquire::Gone);
    let withdrawal = script::permit_withdraw(&mut conn, &k, "nobody", session(), None)
        .await
        .expect("withdraw");
    assert_eq!(withdrawal, Withdrawal::Unknown);
    let left: usize = conn.exists(&k.all[..]).await.expect("exists");
    assert_eq!(left, 0, "no key written");
}

#[tokio::test]
async fn an_addition_beyond_the_range_is_refused_even_where_the_sum_would_fit() {
    // The client never adds more than ±(2^53 − 1) at once; a raw call that does is refused,
    // on the fast path and the general one alike: such a number is not exact as a double, so
    // the script could not tell the count it would leave (-1 + 2^53 + 1 is 2^53, out of range,
    // but reads as 2^53 - 1). (Kills fast_add() taking such an addition.)
    let (_server, mut conn, k) = start_with_count(0).await;
    let own = Session::new();
    let add = |conn: &mut Conn, request: &'static str, delta: i64| {
        let (mut conn, k, own) = (conn.clone(), k.clone(), &own);
        async move {
            let seq = own.open();
            script::permit_add(&mut conn, &k, request, delta, Caller::new(own, seq.n()))
                .await
                .expect("add")
        }
    };
    // (The first call makes the session's record; the next ones take the fast path.)
    assert_eq!(add(&mut conn, "down", -1).await, Addition::Applied(-1));
    assert_eq!(
        add(&mut conn, "big", MAX + 2).await,
        Addition::OutOfRange(-1)
    );
    assert_eq!(add(&mut conn, "down", -4).await, Addition::Applied(-5));
    assert_eq!(
        add(&mut conn, "big", MAX + 4).await,
        Addition::OutOfRange(-5)
    );
    // A batch adds on the general path.
    let ops = [
        PermitOp::add("big", MAX + 4, number("batch big")),
        PermitOp::add("one", 1, number("batch one")),
    ];
    let (replies, _) = within(
        LIMIT,
        "permit_batch",
        script::permit_batch(&mut conn, &k, CHANNEL, session(), &ops),
    )
    .await
    .expect("permit_batch");
    let outcomes: Vec<Addition> = replies
        .into_iter()
        .map(|reply| {
            script::added(Acked {
                reply,
                unconfirmed: None,
            })
            .expect("add")
        })
        .collect();
    assert_eq!(outcomes, [Addition::OutOfRange(-5), Addition::Applied(-4)]);
    assert_eq!(available(&mut conn).await, -4);
}
