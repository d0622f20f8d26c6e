//! The permit semaphore: counts, FIFO waiting, wake-ups, cancellation, retries, round trips.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use redsem::{Error, MAX_PERMITS, PermitOptions, PermitSemaphore, Redsem};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::support::*;

/// Requests queued on semaphore `name` (read from its queue key).
async fn queued(ctx: &TestContext<Topology>, name: &str) -> u64 {
    let mut conn = ctx.raw().await;
    redis::cmd("ZCARD")
        .arg(format!("{}:{{permits:{name}}}:queue", ctx.prefix))
        .query_async(&mut conn)
        .await
        .expect("ZCARD")
}

async fn until_queued(ctx: &TestContext<Topology>, name: &str, n: u64) {
    until("requests to queue", || async {
        queued(ctx, name).await == n
    })
    .await;
}

async fn available(sem: &PermitSemaphore) -> i64 {
    within(LIMIT, "available_permits", sem.available_permits())
        .await
        .expect("available_permits")
}

/// `acquire(permits)` on `client` in a task; the task answers when it returned.
fn spawn_acquire(client: &Redsem, name: &str, permits: u32) -> JoinHandle<redsem::Result<()>> {
    let sem = client.permit_semaphore(name).expect("semaphore");
    tokio::spawn(async move { sem.acquire(permits).await })
}

async fn joined(task: JoinHandle<redsem::Result<()>>, what: &str) {
    within(LIMIT, what, task)
        .await
        .expect("task ran")
        .expect("acquired");
}

both_topologies!(a_blocking_acquire_is_woken_by_a_release_from_another_client);
async fn a_blocking_acquire_is_woken_by_a_release_from_another_client(ctx: &TestContext<Topology>) {
    let sem = ctx.redsem.permit_semaphore("wake").expect("semaphore");
    assert!(sem.try_set_permits(1).await.expect("set"));
    sem.acquire(1).await.expect("take the only permit");

    let other = ctx.client().await;
    let waiter = spawn_acquire(&other, "wake", 1);
    until_queued(ctx, "wake", 1).await;
    assert!(!waiter.is_finished());

    let released = Instant::now();
    sem.release(1).await.expect("release");
    joined(waiter, "the woken acquire").await;
    println!(
        "permit hand-off to another client: {:?}",
        released.elapsed()
    );
    assert_eq!(available(&sem).await, 0);
    assert_eq!(queued(ctx, "wake").await, 0);
}

both_topologies!(acquire_of_four_returns_as_soon_as_four_are_free_and_not_before);
async fn acquire_of_four_returns_as_soon_as_four_are_free_and_not_before(
    ctx: &TestContext<Topology>,
) {
    let sem = ctx.redsem.permit_semaphore("four").expect("semaphore");
    sem.try_set_permits(5).await.expect("set");
    sem.try_acquire(3).await.expect("take three");
    assert_eq!(available(&sem).await, 2);

    let other = ctx.client().await;
    let waiter = spawn_acquire(&other, "four", 4);
    until_queued(ctx, "four", 1).await;

    sem.release(1).await.expect("first release");
    assert_eq!(available(&sem).await, 3, "the waiter took nothing yet");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "returned with only 3 free");

    let released = Instant::now();
    sem.release(1).await.expect("second release");
    joined(waiter, "acquire(4)").await;
    println!(
        "acquire(4) returned {:?} after the 4th permit was freed",
        released.elapsed()
    );
    assert_eq!(available(&sem).await, 0);
}

both_topologies!(add_permits_can_take_the_count_below_zero);
async fn add_permits_can_take_the_count_below_zero(ctx: &TestContext<Topology>) {
    let sem = ctx.redsem.permit_semaphore("neg").expect("semaphore");
    sem.add_permits(-5).await.expect("add -5");
    assert_eq!(available(&sem).await, -5);
    match sem.try_acquire(1).await {
        Err(Error::NotEnoughPermits {
            requested: 1,
            available: -5,
            waiters: 0,
            ..
        }) => {}
        other => panic!("expected NotEnoughPermits, got {other:?}"),
    }
    sem.release(6).await.expect("release 6");
    assert_eq!(available(&sem).await, 1);
    sem.try_acquire(1).await.expect("one is available again");
    assert!(
        !sem.try_set_permits(3).await.expect("try_set"),
        "add_permits set it"
    );
}

both_topologies!(drain_takes_every_available_permit);
async fn drain_takes_every_available_permit(ctx: &TestContext<Topology>) {
    let sem = ctx.redsem.permit_semaphore("drain").expect("semaphore");
    assert_eq!(sem.drain_permits().await.expect("drain"), 0);
    sem.try_set_permits(7).await.expect("set");
    sem.acquire(2).await.expect("take two");
    assert_eq!(sem.drain_permits().await.expect("drain"), 5);
    assert_eq!(available(&sem).await, 0);
    assert_eq!(sem.drain_permits().await.expect("drain again"), 0);
    sem.add_permits(-2).await.expect("go negative");
    assert_eq!(sem.drain_permits().await.expect("drain negative"), 0);
    assert_eq!(available(&sem).await, -2, "a negative count is left alone");
}

both_topologies!(try_set_permits_succeeds_only_while_never_set);
async fn try_set_permits_succeeds_only_while_never_set(ctx: &TestContext<Topology>) {
    let sem = ctx.redsem.permit_semaphore("once").expect("semaphore");
    assert!(sem.try_set_permits(2).await.expect("first"));
    assert!(!sem.try_set_permits(9).await.expect("second"));
    sem.acquire(2).await.expect("take both");
    assert!(
        !sem.try_set_permits(9).await.expect("at zero"),
        "a count of 0 is still set"
    );
    assert_eq!(available(&sem).await, 0);
    assert!(sem.delete().await.expect("delete"));
    assert!(sem.try_set_permits(4).await.expect("after delete"));
    assert_eq!(available(&sem).await, 4);
}

both_topologies!(an_acquire_on_a_semaphore_never_set_waits_until_it_is_set);
async fn an_acquire_on_a_semaphore_never_set_waits_until_it_is_set(ctx: &TestContext<Topology>) {
    let other = ctx.client().await;
    let waiter = spawn_acquire(&other, "later", 2);
    until_queued(ctx, "later", 1).await;
    let sem = ctx.redsem.permit_semaphore("later").expect("semaphore");
    let set = Instant::now();
    assert!(sem.try_set_permits(3).await.expect("set"));
    joined(waiter, "acquire after try_set").await;
    println!("acquire woken {:?} after try_set_permits", set.elapsed());
    assert_eq!(available(&sem).await, 1);
}

both_topologies!(
    sixteen_clients_keep_a_non_atomic_counter_exact,
    multi_thread
);
async fn sixteen_clients_keep_a_non_atomic_counter_exact(ctx: &TestContext<Topology>) {
    const CLIENTS: usize = 16;
    const ROUNDS: u64 = 100;
    ctx.redsem
        .permit_semaphore("counter")
        .expect("semaphore")
        .try_set_permits(1)
        .await
        .expect("set");
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..CLIENTS {
        let sem = ctx
            .client()
            .await
            .permit_semaphore("counter")
            .expect("semaphore");
        let (counter, inside) = (counter.clone(), inside.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..ROUNDS {
                sem.acquire(1).await.expect("acquire");
                assert_eq!(inside.fetch_add(1, Ordering::SeqCst), 0, "two inside");
                // Read, yield, write: any overlap loses an increment.
                let seen = counter.load(Ordering::SeqCst);
                tokio::task::yield_now().await;
                counter.store(seen + 1, Ordering::SeqCst);
                inside.fetch_sub(1, Ordering::SeqCst);
                sem.release(1).await.expect("release");
            }
        }));
    }
    for task in tasks {
        within(Duration::from_secs(60), "16 x 100 rounds", task)
            .await
            .expect("no panic");
    }
    let elapsed = started.elapsed();
    assert_eq!(counter.load(Ordering::SeqCst), CLIENTS as u64 * ROUNDS);
    println!(
        "{CLIENTS} clients x {ROUNDS} acquire/hold/release: {elapsed:?} ({:?} per round)",
        elapsed / (CLIENTS as u32 * ROUNDS as u32)
    );
    let sem = ctx.redsem.permit_semaphore("counter").expect("semaphore");
    assert_eq!(available(&sem).await, 1);
    assert_eq!(queued(ctx, "counter").await, 0);
}

both_topologies!(permit_waiters_are_served_first_in_first_out);
async fn permit_waiters_are_served_first_in_first_out(ctx: &TestContext<Topology>) {
    let clients = [ctx.redsem.clone(), ctx.client().await, ctx.client().await];
    let sem = ctx.redsem.permit_semaphore("fifo").expect("semaphore");
    sem.try_set_permits(0).await.expect("set");
    let (done_tx, mut done) = mpsc::unbounded_channel();
    for i in 0..6u64 {
        let mine = clients[i as usize % 3]
            .permit_semaphore("fifo")
            .expect("semaphore");
        let done_tx = done_tx.clone();
        tokio::spawn(async move {
            mine.acquire(1).await.expect("acquire");
            let _ = done_tx.send(i);
        });
        until_queued(ctx, "fifo", i + 1).await;
    }
    for expected in 0..6 {
        sem.release(1).await.expect("release");
        let served = within(LIMIT, "the next waiter", done.recv())
            .await
            .expect("a waiter returned");
        assert_eq!(served, expected, "served out of order");
    }

    // A large request at the head is not overtaken by a small one behind it.
    let big = spawn_acquire(&clients[1], "fifo", 2);
    until_queued(ctx, "fifo", 1).await;
    let small = spawn_acquire(&clients[2], "fifo", 1);
    until_queued(ctx, "fifo", 2).await;
    sem.release(1).await.expect("release one");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!big.is_finished() && !small.is_finished());
    match sem.try_acquire(1).await {
        Err(Error::NotEnoughPermits {
            available: 1,
            waiters: 2,
            ..
        }) => {}
        other => panic!("try_acquire must fail while others wait: {other:?}"),
    }
    sem.release(1).await.expect("release two");
    joined(big, "the big request").await;
    assert!(!small.is_finished());
    sem.release(1).await.expect("release three");
    joined(small, "the small request").await;
}

both_topologies!(a_cancelled_waiter_takes_nothing);
async fn a_cancelled_waiter_takes_nothing(ctx: &TestContext<Topology>) {
    let sem = ctx.redsem.permit_semaphore("cancel").expect("semaphore");
    sem.try_set_permits(0).await.expect("set");

    // Timed out: withdrawn before returning.
    let started = Instant::now();
    match sem.acquire_timeout(1, Duration::from_millis(200)).await {
        // The error names the semaphore it waited on.
        Err(redsem::Error::Timeout { name, .. }) => assert_eq!(name, "cancel"),
        other => panic!("expected a timeout, got {other:?}"),
    }
    assert!(started.elapsed() >= Duration::from_millis(200));
    assert_eq!(queued(ctx, "cancel").await, 0);

    // Dropped around the moment of the grant: either it returned (and holds the permit), or it
    // was cancelled and the permit comes back.
    let other = ctx.client().await;
    let mut cancelled = 0;
    let mut returned = 0;
    for round in 0..20u64 {
        let waiter = spawn_acquire(&other, "cancel", 1);
        until_queued(ctx, "cancel", 1).await;
        sem.release(1).await.expect("release");
        if round % 2 == 1 {
            tokio::time::sleep(Duration::from_micros(300 * round)).await;
        }
        waiter.abort();
        let expected = match within(LIMIT, "the aborted task", waiter).await {
            Ok(result) => {
                result.expect("acquired");
                returned += 1;
                0
            }
            Err(e) if e.is_cancelled() => {
                cancelled += 1;
                1
            }
            Err(e) => panic!("task failed: {e}"),
        };
        until("the permit to settle", || async {
            available(&sem).await == expected && queued(ctx, "cancel").await == 0
        })
        .await;
        if expected == 1 {
            sem.try_acquire(1).await.expect("back to zero");
        }
        assert_eq!(available(&sem).await, 0);
    }
    println!("20 aborted acquires: {cancelled} cancelled, {returned} had returned");
}

both_topologies!(a_lost_wake_up_costs_one_recheck_only);
async fn a_lost_wake_up_costs_one_recheck_only(ctx: &TestContext<Topology>) {
    let other = ctx.client().await;
    // Waiter lease 300 ms: the waiter re-checks every 100 ms.
    let options = PermitOptions::default().waiter_lease(Duration::from_millis(300));
    let sem = other
        .permit_semaphore_with("lost", options)
        .expect("semaphore");
    sem.try_set_permits(0).await.expect("set");
    let waiter = tokio::spawn(async move { sem.acquire(1).await });
    until_queued(ctx, "lost", 1).await;
    // Add a permit behind redsem's back: nobody is handed it, nobody is told.
    let mut conn = ctx.raw().await;
    let () = redis::cmd("INCRBY")
        .arg(format!("{}:{{permits:lost}}:count", ctx.prefix))
        .arg(1)
        .query_async(&mut conn)
        .await
        .expect("INCRBY");
    let added = Instant::now();
    within(Duration::from_secs(2), "the re-check", waiter)
        .await
        .expect("task")
        .expect("acquired");
    println!("acquire without a wake-up message: {:?}", added.elapsed());
}

both_topologies!(
    a_waiter_is_served_after_the_pubsub_connection_is_killed,
    multi_thread,
    node_wide
);
async fn a_waiter_is_served_after_the_pubsub_connection_is_killed(ctx: &TestContext<Topology>) {
    let sem = ctx.redsem.permit_semaphore("killed").expect("semaphore");
    sem.try_set_permits(0).await.expect("set");
    let other = ctx.client().await;
    let waiter = spawn_acquire(&other, "killed", 1);
    until_queued(ctx, "killed", 1).await;
    assert!(ctx.kill_clients("pubsub").await >= 1);
    let released = Instant::now();
    sem.release(1).await.expect("release");
    joined(waiter, "the acquire after the kill").await;
    println!(
        "acquire after the pub/sub connection was killed: {:?}",
        released.elapsed()
    );
    assert_eq!(available(&sem).await, 0);
}

both_topologies!(
    a_release_after_a_dropped_connection_is_retried_and_applied_once,
    node_wide
);
async fn a_release_after_a_dropped_connection_is_retried_and_applied_once(
    ctx: &TestContext<Topology>,
) {
    let sem = ctx.redsem.permit_semaphore("retry").expect("semaphore");
    sem.try_set_permits(0).await.expect("set");
    for round in 1..=5 {
        // The first attempt after the kill fails (broken pipe); the retry goes through.
        ctx.kill_clients("normal").await;
        within(LIMIT, "release", sem.release(1))
            .await
            .expect("release is retried after the kill");
        assert_eq!(available(&sem).await, round);
    }
    ctx.kill_clients("normal").await;
    within(LIMIT, "add", sem.add_permits(-5))
        .await
        .expect("add_permits is retried after the kill");
    assert_eq!(available(&sem).await, 0);
}

both_topologies!(
    acquire_release_and_try_acquire_cost_one_round_trip_each,
    node_wide
);
async fn acquire_release_and_try_acquire_cost_one_round_trip_each(ctx: &TestContext<Topology>) {
    const N: u32 = 100;
    let sem = ctx.redsem.permit_semaphore("trips").expect("semaphore");
    sem.try_set_permits(N).await.expect("set");
    // Load the scripts and start the pub/sub side first.
    sem.acquire(1).await.expect("warm acquire");
    sem.release(1).await.expect("warm release");
    assert!(sem.try_acquire(N + 1).await.is_err());

    let script_calls = async |what: &str| {
        let calls = ctx.script_calls().await;
        println!("round trips per {what}: {}", calls as f64 / f64::from(N));
        ctx.reset_stats().await;
        calls
    };
    ctx.reset_stats().await;
    for _ in 0..N {
        sem.acquire(1).await.expect("acquire");
    }
    assert_eq!(script_calls("acquire").await, u64::from(N));
    for _ in 0..N {
        sem.release(1).await.expect("release");
    }
    assert_eq!(script_calls("release").await, u64::from(N));
    for _ in 0..N {
        assert!(sem.try_acquire(N + 1).await.is_err());
    }
    assert_eq!(script_calls("failed try_acquire").await, u64::from(N));
}

both_topologies!(bad_input_is_refused_and_foreign_values_are_left_alone);
async fn bad_input_is_refused_and_foreign_values_are_left_alone(ctx: &TestContext<Topology>) {
    assert!(
        ctx.redsem
            .permit_semaphore("")
            .expect_err("empty name")
            .is_invalid_argument()
    );
    let short = PermitOptions::default().waiter_lease(Duration::from_millis(1));
    assert!(
        ctx.redsem
            .permit_semaphore_with("x", short)
            .expect_err("too short")
            .is_invalid_argument()
    );
    let sem = ctx.redsem.permit_semaphore("bad").expect("semaphore");
    assert!(
        sem.add_permits(MAX_PERMITS + 1)
            .await
            .expect_err("too many")
            .is_invalid_argument()
    );
    sem.add_permits(MAX_PERMITS).await.expect("the most");
    assert!(
        sem.release(1)
            .await
            .expect_err("past the limit")
            .is_invalid_argument()
    );
    assert_eq!(available(&sem).await, MAX_PERMITS);
    sem.try_acquire(0)
        .await
        .expect("zero permits: nothing to do");

    let mut conn = ctx.raw().await;
    let key = format!("{}:{{permits:foreign}}:count", ctx.prefix);
    let () = redis::cmd("SET")
        .arg(&key)
        .arg("lots")
        .query_async(&mut conn)
        .await
        .expect("SET");
    let foreign = ctx.redsem.permit_semaphore("foreign").expect("semaphore");
    match foreign.release(1).await {
        Err(Error::WrongType { key: got, .. }) => assert_eq!(got, key),
        other => panic!("expected WrongType, got {other:?}"),
    }
    let value: String = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut conn)
        .await
        .expect("GET");
    assert_eq!(value, "lots");
}

both_topologies!(delete_removes_every_key_and_waiters_queue_again);
async fn delete_removes_every_key_and_waiters_queue_again(ctx: &TestContext<Topology>) {
    let sem = ctx.redsem.permit_semaphore("gone").expect("semaphore");
    sem.try_set_permits(1).await.expect("set");
    sem.acquire(1).await.expect("take");
    sem.release(1).await.expect("release");
    assert!(!ctx.keys().await.is_empty());
    assert!(sem.delete().await.expect("delete"));
    let left: Vec<String> = ctx
        .keys()
        .await
        .into_iter()
        .filter(|k| k.contains("{permits:gone}"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
    assert!(!sem.delete().await.expect("delete again"));

    // A waiter on a deleted semaphore queues again and is served once it is set.
    let options = PermitOptions::default().waiter_lease(Duration::from_millis(300));
    let waiting = ctx
        .client()
        .await
        .permit_semaphore_with("gone", options)
        .expect("semaphore");
    let waiter = tokio::spawn(async move { waiting.acquire(1).await });
    until_queued(ctx, "gone", 1).await;
    sem.delete().await.expect("delete under the waiter");
    until_queued(ctx, "gone", 1).await;
    sem.try_set_permits(1).await.expect("set again");
    joined(waiter, "the re-queued waiter").await;
}
