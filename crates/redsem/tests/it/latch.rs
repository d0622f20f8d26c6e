//! The countdown latch: waking every waiter, timeouts, lost messages, state, retries.

use std::time::Duration;

use redsem::{CountDownLatch, Error, LatchOptions, LatchState, Redsem};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::support::*;

/// The latch's channel: classic on one server, sharded in its slot on a cluster that has
/// sharded pub/sub (classic on one without it: Redis 6.2).
fn channel(ctx: &TestContext<Topology>, name: &str) -> String {
    let classic = format!("{}:{{latch:{name}}}:opened", ctx.prefix);
    match ctx.server {
        Topology::Single(_) => classic,
        #[cfg(feature = "cluster")]
        Topology::Cluster { .. } if !redsem_test::Capabilities::of_the_server().sharded_pubsub => {
            classic
        }
        #[cfg(feature = "cluster")]
        Topology::Cluster { .. } => format!("{}:opened:{{latch:{name}}}", ctx.prefix),
    }
}

async fn until_subscribed(ctx: &TestContext<Topology>, name: &str, n: u64) {
    let channel = channel(ctx, name);
    until("waiters to subscribe", || async {
        ctx.subscribers(&channel).await == n
    })
    .await;
}

/// `wait()` on `client` in a task, which answers with the instant it returned.
fn spawn_wait(client: &Redsem, name: &str) -> JoinHandle<Instant> {
    let latch = client.count_down_latch(name).expect("latch");
    tokio::spawn(async move {
        latch.wait().await.expect("wait");
        Instant::now()
    })
}

async fn state(latch: &CountDownLatch) -> LatchState {
    within(LIMIT, "state", latch.state()).await.expect("state")
}

both_topologies!(
    four_waiters_in_separate_clients_all_wake_after_the_third_count_down,
    multi_thread
);
async fn four_waiters_in_separate_clients_all_wake_after_the_third_count_down(
    ctx: &TestContext<Topology>,
) {
    let latch = ctx.redsem.count_down_latch("three").expect("latch");
    assert!(latch.try_set_count(3).await.expect("set"));
    let mut waiters = Vec::new();
    for _ in 0..4 {
        waiters.push(spawn_wait(&ctx.client().await, "three"));
    }
    until_subscribed(ctx, "three", 4).await;

    latch.count_down().await.expect("first");
    latch.count_down().await.expect("second");
    assert_eq!(latch.count().await.expect("count"), 1);
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(waiters.iter().all(|w| !w.is_finished()), "woke early");

    let before = Instant::now();
    latch.count_down().await.expect("third");
    let mut slowest = Duration::ZERO;
    for waiter in waiters {
        let woke = within(LIMIT, "a waiter", waiter).await.expect("task");
        slowest = slowest.max(woke.saturating_duration_since(before));
    }
    println!(
        "4 waiters in 4 clients: the last woke {slowest:?} after the third count_down was sent"
    );
    assert!(slowest < Duration::from_secs(2), "{slowest:?}");
    assert_eq!(state(&latch).await, LatchState::Done);
}

both_topologies!(wait_timeout_on_a_latch_that_never_reaches_zero_times_out);
async fn wait_timeout_on_a_latch_that_never_reaches_zero_times_out(ctx: &TestContext<Topology>) {
    let latch = ctx.redsem.count_down_latch("stuck").expect("latch");
    latch.try_set_count(2).await.expect("set");
    latch.count_down().await.expect("count down");
    let started = Instant::now();
    match within(
        LIMIT,
        "wait_timeout",
        latch.wait_timeout(Duration::from_millis(300)),
    )
    .await
    {
        Err(Error::Timeout { waited, .. }) => assert!(waited >= Duration::from_millis(300)),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(2));
    assert_eq!(state(&latch).await, LatchState::Counting(1));
}

both_topologies!(
    a_wait_ends_after_the_pubsub_connection_is_killed,
    multi_thread,
    node_wide
);
async fn a_wait_ends_after_the_pubsub_connection_is_killed(ctx: &TestContext<Topology>) {
    let latch = ctx.redsem.count_down_latch("killed").expect("latch");
    latch.try_set_count(1).await.expect("set");
    let waiter = spawn_wait(&ctx.client().await, "killed");
    until_subscribed(ctx, "killed", 1).await;
    assert!(ctx.kill_clients("pubsub").await >= 1);
    let before = Instant::now();
    latch.count_down().await.expect("count down");
    let woke = within(LIMIT, "the waiter", waiter).await.expect("task");
    println!(
        "latch wait after the pub/sub connection was killed: {:?}",
        woke.saturating_duration_since(before)
    );
}

both_topologies!(a_lost_message_costs_one_recheck_interval);
async fn a_lost_message_costs_one_recheck_interval(ctx: &TestContext<Topology>) {
    let options = LatchOptions::default().recheck(Duration::from_millis(200));
    let latch = ctx
        .client()
        .await
        .count_down_latch_with("lost", options)
        .expect("latch");
    latch.try_set_count(1).await.expect("set");
    let waiter = tokio::spawn(async move { latch.wait().await });
    until_subscribed(ctx, "lost", 1).await;
    // It opens as latch_count_down opens it, but no message is published.
    let mut conn = ctx.raw().await;
    let () = redis::pipe()
        .atomic()
        .del(format!("{}:{{latch:lost}}:count", ctx.prefix))
        .set(format!("{}:{{latch:lost}}:done", ctx.prefix), "1")
        .ignore()
        .query_async(&mut conn)
        .await
        .expect("MULTI DEL SET");
    let deleted = Instant::now();
    within(Duration::from_secs(2), "the re-check", waiter)
        .await
        .expect("task")
        .expect("wait");
    println!("latch wait without a message: {:?}", deleted.elapsed());
}

both_topologies!(state_tells_never_set_from_done);
async fn state_tells_never_set_from_done(ctx: &TestContext<Topology>) {
    let latch = ctx.redsem.count_down_latch("states").expect("latch");
    assert_eq!(state(&latch).await, LatchState::NeverSet);
    assert_eq!(latch.count().await.expect("count"), 0);
    within(LIMIT, "wait on a latch never set", latch.wait())
        .await
        .expect("returns at once");
    latch
        .count_down()
        .await
        .expect("count down a latch never set");
    assert_eq!(
        state(&latch).await,
        LatchState::NeverSet,
        "and nothing changed"
    );

    assert!(latch.try_set_count(2).await.expect("set"));
    assert!(!latch.try_set_count(5).await.expect("set again"));
    assert_eq!(state(&latch).await, LatchState::Counting(2));
    latch.count_down().await.expect("1");
    assert_eq!(latch.count().await.expect("count"), 1);
    latch.count_down().await.expect("2");
    assert_eq!(state(&latch).await, LatchState::Done);
    assert!(state(&latch).await.is_open());
    assert_eq!(latch.count().await.expect("count"), 0);
    let left: Vec<String> = ctx
        .keys()
        .await
        .into_iter()
        .filter(|k| k.ends_with(":count"))
        .collect();
    assert!(left.is_empty(), "the latch is gone at zero: {left:?}");

    assert!(
        latch
            .try_set_count(1)
            .await
            .expect("an opened latch can be set again")
    );
    assert!(latch.delete().await.expect("delete"));
    assert_eq!(state(&latch).await, LatchState::NeverSet);
    assert!(
        latch
            .try_set_count(0)
            .await
            .expect_err("a count of 0")
            .is_invalid_argument()
    );
}

both_topologies!(delete_wakes_the_waiters);
async fn delete_wakes_the_waiters(ctx: &TestContext<Topology>) {
    let latch = ctx.redsem.count_down_latch("deleted").expect("latch");
    latch.try_set_count(5).await.expect("set");
    let waiter = spawn_wait(&ctx.client().await, "deleted");
    until_subscribed(ctx, "deleted", 1).await;
    assert!(latch.delete().await.expect("delete"));
    within(LIMIT, "the waiter", waiter).await.expect("task");
    assert_eq!(state(&latch).await, LatchState::NeverSet);
}

both_topologies!(
    a_count_down_after_a_dropped_connection_is_retried_and_applied_once,
    node_wide
);
async fn a_count_down_after_a_dropped_connection_is_retried_and_applied_once(
    ctx: &TestContext<Topology>,
) {
    let latch = ctx.redsem.count_down_latch("retry").expect("latch");
    latch.try_set_count(4).await.expect("set");
    for left in (1..4).rev() {
        ctx.kill_clients("normal").await;
        within(LIMIT, "count_down", latch.count_down())
            .await
            .expect("count_down is retried after the kill");
        assert_eq!(latch.count().await.expect("count"), left);
    }
}

both_topologies!(a_count_down_costs_one_round_trip, node_wide);
async fn a_count_down_costs_one_round_trip(ctx: &TestContext<Topology>) {
    const N: u64 = 100;
    let latch = ctx.redsem.count_down_latch("trips").expect("latch");
    latch.try_set_count(N + 1).await.expect("set");
    latch.count_down().await.expect("warm up");
    ctx.reset_stats().await;
    for _ in 0..N - 1 {
        latch.count_down().await.expect("count down");
    }
    let calls = ctx.script_calls().await;
    println!(
        "round trips per count_down: {}",
        calls as f64 / (N - 1) as f64
    );
    assert_eq!(calls, N - 1);
    assert_eq!(latch.count().await.expect("count"), 1);
}

both_topologies!(
    wake_up_after_the_last_count_down_median_of_fifty,
    multi_thread
);
async fn wake_up_after_the_last_count_down_median_of_fifty(ctx: &TestContext<Topology>) {
    let latch = ctx.redsem.count_down_latch("median").expect("latch");
    let other = ctx.client().await;
    let (tx, mut woke) = mpsc::unbounded_channel();
    let mut samples = Vec::new();
    for _ in 0..50 {
        until_subscribed(ctx, "median", 0).await;
        latch.try_set_count(1).await.expect("set");
        let waiting = other.count_down_latch("median").expect("latch");
        let tx = tx.clone();
        tokio::spawn(async move {
            waiting.wait().await.expect("wait");
            let _ = tx.send(Instant::now());
        });
        until_subscribed(ctx, "median", 1).await;
        let before = Instant::now();
        latch.count_down().await.expect("count down");
        let at = within(LIMIT, "the waiter", woke.recv())
            .await
            .expect("woke");
        samples.push(at.saturating_duration_since(before));
    }
    let slowest = samples.iter().max().copied().unwrap_or_default();
    println!(
        "latch wake-up after the last count_down (from sending it), 50 runs: median {:?}, max {slowest:?}",
        median(samples)
    );
}

both_topologies!(a_count_down_answers_the_count_it_left_and_none_when_not_counting);
async fn a_count_down_answers_the_count_it_left_and_none_when_not_counting(
    ctx: &TestContext<Topology>,
) {
    let latch = ctx.redsem.count_down_latch("left").expect("latch");
    assert_eq!(
        within(LIMIT, "count_down", latch.count_down())
            .await
            .expect("count_down"),
        None,
        "never set: nothing counted"
    );
    assert!(
        within(LIMIT, "set", latch.try_set_count(2))
            .await
            .expect("set")
    );
    assert_eq!(
        within(LIMIT, "count_down", latch.count_down())
            .await
            .expect("count_down"),
        Some(1)
    );
    assert_eq!(
        within(LIMIT, "count_down", latch.count_down())
            .await
            .expect("count_down"),
        Some(0),
        "the last one opened it"
    );
    assert_eq!(
        within(LIMIT, "count_down", latch.count_down())
            .await
            .expect("count_down"),
        None,
        "opened: nothing counted"
    );
}
