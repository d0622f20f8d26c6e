//! Waiting on the lease semaphore: FIFO order, targeted wake-ups, dead waiters, cancellation.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures_util::FutureExt;
use redsem::{LeasePermit, LeaseSemaphore};
use tokio::time::Instant;

use crate::support::*;

/// Wait until the semaphore has `n` queued requests.
async fn until_waiters(sem: &LeaseSemaphore, n: usize) {
    within(LIMIT, "waiters to queue", async {
        loop {
            if sem.status().await.expect("status").waiters.len() == n {
                return;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    })
    .await
}

/// Wait until the semaphore has no queued request and `units` units held.
async fn until_settled(sem: &LeaseSemaphore, units: u64) {
    within(LIMIT, "redis to be clean", async {
        loop {
            let s = sem.status().await.expect("status");
            if s.waiters.is_empty() && s.in_use == units {
                return;
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

both_topologies!(twenty_waiters_are_served_in_arrival_order, multi_thread);
async fn twenty_waiters_are_served_in_arrival_order(ctx: &TestContext<Topology>) {
    let clients = [ctx.redsem.clone(), ctx.client().await];
    let sem = ctx.redsem.lease_semaphore("fifo", 1).expect("semaphore");
    let holder = sem.try_acquire().await.expect("hold");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..20 {
        let mine = clients[i % 2]
            .lease_semaphore("fifo", 1)
            .expect("semaphore");
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let permit = mine.acquire().await.expect("acquire");
            order.lock().expect("order").push(i);
            permit.release().await.expect("release");
        }));
        until_waiters(&sem, i + 1).await;
    }
    holder.release().await.expect("release");
    for task in tasks {
        within(LIMIT, "waiter", task).await.expect("waiter task");
    }
    let order = order.lock().expect("order").clone();
    let inversions = order
        .iter()
        .enumerate()
        .flat_map(|(i, a)| order[i + 1..].iter().filter(move |b| *b < a))
        .count();
    assert_eq!(inversions, 0, "grant order {order:?}");
    assert_eq!(order, (0..20).collect::<Vec<_>>());
}

both_topologies!(try_acquire_fails_while_others_wait_and_a_large_head_is_not_starved);
async fn try_acquire_fails_while_others_wait_and_a_large_head_is_not_starved(
    ctx: &TestContext<Topology>,
) {
    let sem = ctx.redsem.lease_semaphore("s", 2).expect("semaphore");
    let one = sem.try_acquire().await.expect("one");
    let big = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire_many(2).await })
    };
    until_waiters(&sem, 1).await;
    // A unit is free, but the two-unit request came first.
    assert!(
        sem.try_acquire()
            .await
            .expect_err("queued ahead")
            .is_not_acquired()
    );
    let small = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire().await })
    };
    until_waiters(&sem, 2).await;
    one.release().await.expect("release");
    let big = within(LIMIT, "big request", big)
        .await
        .expect("task")
        .expect("granted");
    assert_eq!(big.slots().len(), 2);
    assert!(!small.is_finished(), "the small request waits behind");
    big.release().await.expect("release");
    within(LIMIT, "small request", small)
        .await
        .expect("task")
        .expect("granted")
        .release()
        .await
        .expect("release");
}

both_topologies!(a_release_wakes_only_the_next_waiter_not_a_herd, node_wide);
async fn a_release_wakes_only_the_next_waiter_not_a_herd(ctx: &TestContext<Topology>) {
    let sem = ctx.redsem.lease_semaphore("herd", 1).expect("semaphore");
    // One full hand-off first, so the scripts are loaded and NOSCRIPT retries don't count.
    let holder = sem.try_acquire().await.expect("hold");
    let warm = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await }
    });
    until_waiters(&sem, 1).await;
    holder.release().await.expect("release");
    let holder = within(LIMIT, "warm-up", warm)
        .await
        .expect("task")
        .expect("granted");
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let mut tasks = Vec::new();
    for i in 0..50 {
        let sem = sem.clone();
        let tx = tx.clone();
        tasks.push(tokio::spawn(async move {
            let permit = sem.acquire().await.expect("acquire");
            tx.send((i, permit)).expect("send");
        }));
    }
    until_waiters(&sem, 50).await;
    ctx.reset_stats().await;
    holder.release().await.expect("release");
    let (_, next) = within(LIMIT, "next grant", rx.recv())
        .await
        .expect("a grant");
    let calls = ctx.script_calls().await;
    println!("script calls for one release with 50 waiters: {calls}");
    assert!(
        calls <= 2,
        "{calls} script calls: release + the woken waiter's poll"
    );
    drop(next);
    for task in tasks {
        task.abort();
    }
}

both_topologies!(
    hand_off_is_much_faster_than_the_fallback_timer,
    multi_thread
);
async fn hand_off_is_much_faster_than_the_fallback_timer(ctx: &TestContext<Topology>) {
    let sem = ctx.redsem.lease_semaphore("handoff", 1).expect("semaphore");
    let other = ctx
        .client()
        .await
        .lease_semaphore("handoff", 1)
        .expect("semaphore");
    let mut permit: LeasePermit = sem.try_acquire().await.expect("hold");
    let mut latencies = Vec::new();
    for _ in 0..200 {
        let waiter = {
            let other = other.clone();
            tokio::spawn(async move {
                let p = other.acquire().await.expect("acquire");
                (Instant::now(), p)
            })
        };
        until_waiters(&sem, 1).await;
        let released = Instant::now();
        permit.release().await.expect("release");
        let (granted, next) = within(LIMIT, "hand-off", waiter).await.expect("task");
        latencies.push(granted - released);
        permit = next;
    }
    permit.release().await.expect("release");
    latencies.sort();
    let (p50, p99) = (percentile(&latencies, 0.5), percentile(&latencies, 0.99));
    let timer = redsem::LeaseOptions::default().waiter_lease / 3;
    println!(
        "release -> next grant over 200 trials: p50 {p50:?}, p99 {p99:?}; fallback timer {timer:?}"
    );
    assert!(
        p50 < timer / 10,
        "p50 {p50:?} is not well under the timer {timer:?}"
    );
}

both_topologies!(a_dead_waiter_stops_blocking_the_queue_within_its_waiter_lease);
async fn a_dead_waiter_stops_blocking_the_queue_within_its_waiter_lease(
    ctx: &TestContext<Topology>,
) {
    let sem = ctx
        .redsem
        .lease_semaphore_with("dead", 1, short(400))
        .expect("semaphore");
    let holder = sem.try_acquire().await.expect("hold");

    // A waiter in another client that is queued and then vanishes without cleanup.
    let ghost_client = ctx.client().await;
    let ghost_sem = ghost_client
        .lease_semaphore_with("dead", 1, short(400))
        .expect("semaphore");
    let mut ghost: Pin<Box<dyn Future<Output = _> + Send>> = Box::pin(ghost_sem.acquire());
    let _ = tokio::time::timeout(Duration::from_millis(300), &mut ghost).await;
    until_waiters(&sem, 1).await;
    std::mem::forget(ghost); // no drop, no withdrawal, no more check-ins: a crashed process

    let live = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire().await })
    };
    until_waiters(&sem, 2).await;
    let vanished = Instant::now();
    holder.release().await.expect("release");
    let permit = within(LIMIT, "the live waiter", live)
        .await
        .expect("task")
        .expect("granted");
    let took = vanished.elapsed();
    println!("live waiter admitted {took:?} after the ghost stopped checking in");
    assert!(
        took <= Duration::from_millis(400 + 300),
        "took {took:?}, waiter lease 400ms"
    );
    permit.release().await.expect("release");
}

both_topologies!(dropped_acquire_futures_leave_no_waiter_and_no_permit);
async fn dropped_acquire_futures_leave_no_waiter_and_no_permit(ctx: &TestContext<Topology>) {
    let sem = ctx.redsem.lease_semaphore("cancel", 1).expect("semaphore");
    let holder = sem.try_acquire().await.expect("hold");

    // Dropped before the first poll, after one poll, and after many polls (queued).
    drop(sem.acquire());
    let mut once = Box::pin(sem.acquire());
    assert!((&mut once).now_or_never().is_none());
    drop(once);
    for _ in 0..3 {
        let mut queued = Box::pin(sem.acquire());
        let _ = tokio::time::timeout(Duration::from_millis(100), &mut queued).await;
        until_waiters(&sem, 1).await;
        drop(queued);
        until_settled(&sem, 1).await;
    }

    // Dropped after the grant was handed over but before it was collected.
    let mut raced = Box::pin(sem.acquire());
    let _ = tokio::time::timeout(Duration::from_millis(100), &mut raced).await;
    until_waiters(&sem, 1).await;
    holder.release().await.expect("release");
    drop(raced);
    until_settled(&sem, 0).await;

    // A timeout withdraws before returning.
    let holder = sem.try_acquire().await.expect("hold again");
    let err = sem
        .acquire_timeout(Duration::from_millis(150))
        .await
        .expect_err("times out");
    assert!(err.is_timeout(), "{err:?}");
    let status = sem.status().await.expect("status");
    assert!(status.waiters.is_empty(), "{status:?}");
    holder.release().await.expect("release");
    until_settled(&sem, 0).await;
}

both_topologies!(
    waiters_are_admitted_in_order_after_the_pubsub_connection_is_killed,
    multi_thread,
    node_wide
);
async fn waiters_are_admitted_in_order_after_the_pubsub_connection_is_killed(
    ctx: &TestContext<Topology>,
) {
    let sem = ctx.redsem.lease_semaphore("kill", 1).expect("semaphore");
    let holder = sem.try_acquire().await.expect("hold");
    let order = Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for i in 0..10 {
        let mine = sem.clone();
        let order = order.clone();
        tasks.push(tokio::spawn(async move {
            let permit = mine.acquire().await.expect("acquire");
            order.lock().expect("order").push(i);
            permit.release().await.expect("release");
        }));
        until_waiters(&sem, i + 1).await;
    }
    let killed = ctx.kill_clients("pubsub").await;
    assert_eq!(killed, 1);
    holder.release().await.expect("release");
    for task in tasks {
        within(LIMIT, "waiter after the kill", task)
            .await
            .expect("task");
    }
    assert_eq!(*order.lock().expect("order"), (0..10).collect::<Vec<_>>());
    // The notifier subscribes again. (The waiters did not need it: a release hands grants
    // to waiters of its own process over in its reply, so they may be done before that.)
    until("the notifier resubscribed", || async {
        ctx.clients_of_type("pubsub").await == 1
    })
    .await;
}

both_topologies!(
    mixed_acquire_many_under_load_never_exceeds_capacity,
    multi_thread
);
async fn mixed_acquire_many_under_load_never_exceeds_capacity(ctx: &TestContext<Topology>) {
    let clients = [ctx.redsem.clone(), ctx.client().await];
    const CAPACITY: u32 = 5;
    let in_use = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let mut tasks = Vec::new();
    for t in 0..16u32 {
        let sem = clients[t as usize % 2]
            .lease_semaphore("many", CAPACITY)
            .expect("semaphore");
        let units = [1, 2, 3, 5][t as usize % 4];
        let (in_use, peak) = (in_use.clone(), peak.clone());
        tasks.push(tokio::spawn(async move {
            for _ in 0..5 {
                let permit = sem.acquire_many(units).await.expect("acquire");
                assert_eq!(permit.slots().len(), units as usize);
                let now = in_use.fetch_add(units, Ordering::SeqCst) + units;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::task::yield_now().await;
                in_use.fetch_sub(units, Ordering::SeqCst);
                permit.release().await.expect("release");
            }
        }));
    }
    for task in tasks {
        within(LIMIT * 3, "mixed task", task).await.expect("task");
    }
    let peak = peak.load(Ordering::SeqCst);
    assert!(peak <= CAPACITY, "peak {peak}");
}

both_topologies!(mutex_lock_try_lock_and_lock_timeout);
async fn mutex_lock_try_lock_and_lock_timeout(ctx: &TestContext<Topology>) {
    let lock = ctx.redsem.mutex("m").expect("mutex");
    let guard = lock.try_lock().await.expect("free");
    assert!(lock.try_lock().await.expect_err("held").is_not_acquired());
    assert!(
        lock.lock_timeout(Duration::from_millis(100))
            .await
            .expect_err("held")
            .is_timeout()
    );
    let first = guard.token();
    let waiter = {
        let lock = lock.clone();
        tokio::spawn(async move { lock.lock().await })
    };
    until_waiters(lock.semaphore(), 1).await;
    guard.unlock().await.expect("unlock");
    let next = within(LIMIT, "lock", waiter)
        .await
        .expect("task")
        .expect("locked");
    assert!(next.token() > first);
    assert!(next.is_held());
    next.unlock().await.expect("unlock");
}

fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches(" kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_waiters_share_two_connections() {
    let ctx = TestContext::start().await;
    let options = redsem::LeaseOptions::default().waiter_lease(Duration::from_secs(60));
    let sem = ctx
        .redsem
        .lease_semaphore_with("crowd", 1, options)
        .expect("semaphore");
    let holder = sem.try_acquire().await.expect("hold");
    let before = rss_kib();
    let mut tasks = Vec::new();
    for _ in 0..10_000 {
        let sem = sem.clone();
        tasks.push(tokio::spawn(async move { sem.acquire().await }));
    }
    within(Duration::from_secs(60), "10,000 waiters to queue", async {
        loop {
            if sem.status().await.expect("status").waiters.len() == 10_000 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await;
    let after = rss_kib();
    let normal = ctx.clients_of_type("normal").await - 1; // minus the inspector
    let pubsub = ctx.clients_of_type("pubsub").await;
    println!(
        "10,000 waiters: {normal} command + {pubsub} pub/sub connections; RSS {before} KiB -> {after} KiB ({:.0} bytes per waiter)",
        (after.saturating_sub(before) as f64 * 1024.0) / 10_000.0
    );
    assert_eq!((normal, pubsub), (1, 1));
    for task in &tasks {
        task.abort();
    }
    drop(holder);
    until_settled(&sem, 0).await;
}

both_topologies!(a_handed_over_permit_is_renewed_and_kept);
async fn a_handed_over_permit_is_renewed_and_kept(ctx: &TestContext<Topology>) {
    let sem = ctx
        .redsem
        .lease_semaphore_with("handed", 1, short(300))
        .expect("semaphore");
    let holder = sem.try_acquire().await.expect("hold");
    let waiter = {
        let sem = sem.clone();
        tokio::spawn(async move { sem.acquire().await })
    };
    until_waiters(&sem, 1).await;
    tokio::time::sleep(Duration::from_millis(250)).await;
    holder.release().await.expect("release");
    let permit = within(LIMIT, "hand-off", waiter)
        .await
        .expect("task")
        .expect("granted");
    tokio::select! {
        () = permit.lost() => panic!("a handed-over permit was lost while renewed"),
        () = tokio::time::sleep(Duration::from_millis(1_000)) => {}
    }
    assert!(permit.is_held());
    let status = sem.status().await.expect("status");
    assert_eq!(status.holders.len(), 1);
    assert!(status.holders[0].expires_in > Duration::from_millis(100));
    permit.release().await.expect("release");
}
