//! Calls that give something back, cancelled at every point of their life (before their
//! first poll, after a few polls, after a few hundred microseconds: before the send, in
//! flight, after the reply): what they give back is given back all the same, and nothing is
//! left queued. The server's state is read after each cut.

use std::future::Future;
use std::pin::pin;
use std::task::Poll;
use std::time::Duration;

use redsem::{LatchState, LeaseOptions};
use tokio::time::Instant;

use crate::support::*;

/// Where a call's future is dropped.
#[derive(Debug, Clone, Copy)]
enum Cut {
    /// Never polled.
    Unpolled,
    /// After this many polls (the task yielding between them).
    Polls(u32),
    /// After this long.
    After(Duration),
}

/// Every cut point a call is tried at: 1 unpolled, 6 by polls, 10 by time (40 µs to 5 ms,
/// which spans the send, the server's work and the reply on a local server).
fn cuts() -> Vec<Cut> {
    let mut cuts = vec![Cut::Unpolled];
    cuts.extend((1..=6).map(Cut::Polls));
    cuts.extend(
        [40, 80, 150, 250, 400, 600, 900, 1_400, 2_500, 5_000]
            .map(|us| Cut::After(Duration::from_micros(us))),
    );
    cuts
}

/// Run `fut` until `cut`, then drop it; its output if it finished first.
async fn cut<F: Future>(fut: F, cut: Cut) -> Option<F::Output> {
    match cut {
        Cut::Unpolled => {
            drop(fut);
            None
        }
        Cut::Polls(n) => {
            let mut fut = pin!(fut);
            for _ in 0..n {
                let step = std::future::poll_fn(|cx| Poll::Ready(fut.as_mut().poll(cx))).await;
                if let Poll::Ready(out) = step {
                    return Some(out);
                }
                tokio::task::yield_now().await;
            }
            None
        }
        Cut::After(after) => tokio::time::timeout(after, fut).await.ok(),
    }
}

/// Leases long enough that a unit left held by a cut call would still be held when the test
/// looks (the defect this guards against strands it for a whole lease).
fn long_lease() -> LeaseOptions {
    LeaseOptions::default().lease(Duration::from_secs(30))
}

both_topologies!(a_cancelled_release_still_releases_at_every_cut_point);
async fn a_cancelled_release_still_releases_at_every_cut_point(ctx: &TestContext<Topology>) {
    let sem = ctx
        .redsem
        .lease_semaphore_with("cut-release", 1, long_lease())
        .expect("semaphore");
    let mut finished = 0;
    for point in cuts() {
        let permit = within(LIMIT, "acquire", sem.acquire())
            .await
            .expect("the unit is free again");
        if let Some(released) = cut(permit.release(), point).await {
            released.expect("release");
            finished += 1;
        }
        within(LIMIT, "flush", ctx.redsem.flush()).await;
        let status = within(LIMIT, "status", sem.status()).await.expect("status");
        assert_eq!(
            (status.in_use, status.holders.len()),
            (0, 0),
            "cut at {point:?}: the unit is still held ({status:?})"
        );
    }
    assert!(
        finished < cuts().len(),
        "every release finished before its cut: the test cut none"
    );
}

both_topologies!(a_cancelled_release_id_still_releases_at_every_cut_point);
async fn a_cancelled_release_id_still_releases_at_every_cut_point(ctx: &TestContext<Topology>) {
    let sem = ctx
        .redsem
        .lease_semaphore_with("cut-release-id", 1, long_lease())
        .expect("semaphore");
    for point in cuts() {
        let permit = within(LIMIT, "acquire", sem.acquire())
            .await
            .expect("the unit is free again");
        let id = permit.id().clone();
        permit.forget();
        if let Some(released) = cut(sem.release_id(&id), point).await {
            released.expect("release_id");
        }
        within(LIMIT, "flush", ctx.redsem.flush()).await;
        let status = within(LIMIT, "status", sem.status()).await.expect("status");
        // Unpolled, the call never started: nothing was asked, the unit stays held.
        let expected = usize::from(matches!(point, Cut::Unpolled));
        assert_eq!(
            status.holders.len(),
            expected,
            "cut at {point:?}: {status:?}"
        );
        if expected == 1 {
            within(LIMIT, "release_id", sem.release_id(&id))
                .await
                .expect("release_id");
        }
    }
}

both_topologies!(a_cancelled_mutex_unlock_still_unlocks_at_every_cut_point);
async fn a_cancelled_mutex_unlock_still_unlocks_at_every_cut_point(ctx: &TestContext<Topology>) {
    let mutex = ctx.redsem.mutex("cut-unlock").expect("mutex");
    for point in cuts() {
        let guard = within(LIMIT, "lock", mutex.lock())
            .await
            .expect("the lock is free again");
        let _ = cut(guard.unlock(), point).await;
        within(LIMIT, "flush", ctx.redsem.flush()).await;
        let taken = within(LIMIT, "try_lock", mutex.try_lock())
            .await
            .unwrap_or_else(|e| panic!("cut at {point:?}: the lock is still held: {e}"));
        within(LIMIT, "unlock", taken.unlock())
            .await
            .expect("unlock");
    }
}

both_topologies!(a_cancelled_permit_release_is_applied_once_at_every_cut_point);
async fn a_cancelled_permit_release_is_applied_once_at_every_cut_point(
    ctx: &TestContext<Topology>,
) {
    let sem = ctx
        .redsem
        .permit_semaphore("cut-permits")
        .expect("semaphore");
    within(LIMIT, "set", sem.try_set_permits(0))
        .await
        .expect("set");
    let mut started = 0;
    for point in cuts() {
        if !matches!(point, Cut::Unpolled) {
            started += 1;
        }
        if let Some(released) = cut(sem.release(1), point).await {
            released.expect("release");
        }
        within(LIMIT, "flush", ctx.redsem.flush()).await;
        let available = within(LIMIT, "available", sem.available_permits())
            .await
            .expect("available");
        assert_eq!(
            available, started,
            "cut at {point:?}: every release started is applied, once"
        );
    }
}

both_topologies!(a_cancelled_count_down_is_applied_once_at_every_cut_point);
async fn a_cancelled_count_down_is_applied_once_at_every_cut_point(ctx: &TestContext<Topology>) {
    let latch = ctx.redsem.count_down_latch("cut-latch").expect("latch");
    let start = 1_000;
    within(LIMIT, "set", latch.try_set_count(start))
        .await
        .expect("set");
    let mut started = 0;
    for point in cuts() {
        if !matches!(point, Cut::Unpolled) {
            started += 1;
        }
        if let Some(counted) = cut(latch.count_down(), point).await {
            counted.expect("count_down");
        }
        within(LIMIT, "flush", ctx.redsem.flush()).await;
        let state = within(LIMIT, "state", latch.state()).await.expect("state");
        assert_eq!(
            state,
            LatchState::Counting(start - started),
            "cut at {point:?}: every count-down started is applied, once"
        );
    }
}

both_topologies!(a_cancelled_acquire_leaves_nothing_queued_or_held_at_every_cut_point);
async fn a_cancelled_acquire_leaves_nothing_queued_or_held_at_every_cut_point(
    ctx: &TestContext<Topology>,
) {
    let sem = ctx
        .redsem
        .lease_semaphore_with("cut-acquire", 1, long_lease())
        .expect("semaphore");
    let other = ctx.client().await;
    let holder_sem = other
        .lease_semaphore_with("cut-acquire", 1, long_lease())
        .expect("semaphore");
    for (n, point) in cuts().into_iter().enumerate() {
        // Half the rounds queue behind a holder (the cut withdraws a waiter), half find the
        // unit free (the cut gives back a grant, or withdraws before it).
        let holder = if n % 2 == 0 {
            Some(
                within(LIMIT, "holder", holder_sem.acquire())
                    .await
                    .expect("holder"),
            )
        } else {
            None
        };
        if let Some(permit) = cut(sem.acquire(), point).await {
            permit.expect("acquire").release().await.expect("release");
        }
        within(LIMIT, "flush", ctx.redsem.flush()).await;
        let status = within(LIMIT, "status", sem.status()).await.expect("status");
        assert!(
            status.waiters.is_empty(),
            "cut at {point:?}: a waiter was left queued: {status:?}"
        );
        assert_eq!(
            status.holders.len(),
            usize::from(holder.is_some()),
            "cut at {point:?}: {status:?}"
        );
        if let Some(holder) = holder {
            holder.release().await.expect("release the holder");
        }
    }
}

/// An acquire cancelled on an idle semaphore leaves it idle again; the flush that waits for
/// its withdrawal must not wait out the idle clean-up's delay (1 s) as well.
#[tokio::test]
async fn flushing_after_a_cancelled_acquire_on_an_idle_semaphore_answers_in_milliseconds() {
    let ctx = TestContext::start().await;
    let sem = ctx
        .redsem
        .lease_semaphore("cut-idle", 1)
        .expect("semaphore");
    let mut slowest = Duration::ZERO;
    for point in cuts() {
        if let Some(permit) = cut(sem.acquire(), point).await {
            permit.expect("acquire").release().await.expect("release");
        }
        let began = Instant::now();
        within(LIMIT, "flush", ctx.redsem.flush()).await;
        slowest = slowest.max(began.elapsed());
    }
    // The idle clean-up waits 1 s unless a flush hurries it; a local round trip or two,
    // even on a loaded machine, stays far below.
    assert!(
        slowest < Duration::from_millis(600),
        "a flush after a cancelled acquire took {slowest:?}"
    );
}

/// Other calls of one client keep its connection busy until dropped: the narrow window of
/// a cut (a command handed to the connection but not yet written when its future is dropped
/// is never sent, redis-rs skips a request nobody waits for) grows wide.
struct BusyConnection {
    stop: tokio_util::sync::CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl BusyConnection {
    fn start(sem: &redsem::LeaseSemaphore) -> BusyConnection {
        let stop = tokio_util::sync::CancellationToken::new();
        let tasks = (0..8)
            .map(|_| {
                let (sem, stop) = (sem.clone(), stop.clone());
                tokio::spawn(async move {
                    while !stop.is_cancelled() {
                        let _ = sem.status().await;
                    }
                })
            })
            .collect();
        BusyConnection { stop, tasks }
    }

    async fn stop(self) {
        self.stop.cancel();
        for task in self.tasks {
            within(LIMIT, "load task", task).await.expect("load task");
        }
    }
}

/// Run `calls` at once, each cut after 0 to 390 µs (staggered by 10 µs), and wait for them.
async fn cut_all<F>(calls: Vec<F>)
where
    F: Future + Send + 'static,
    F::Output: Send,
{
    let tasks: Vec<_> = calls
        .into_iter()
        .enumerate()
        .map(|(n, call)| {
            let after = Duration::from_micros(10 * (n as u64 % 40));
            tokio::spawn(cut(call, Cut::After(after)))
        })
        .collect();
    for task in tasks {
        let _ = within(LIMIT, "a cut call", task).await;
    }
}

/// Many releases cut at staggered moments while the connection is busy all still happen.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releases_cut_while_the_connection_is_busy_all_still_happen() {
    let ctx = TestContext::start().await;
    const HELD: u32 = 200;
    let sem = ctx
        .redsem
        .lease_semaphore_with("cut-busy", HELD, long_lease())
        .expect("semaphore");
    let permits = take_all(&sem, HELD as usize).await;
    let busy = BusyConnection::start(&sem);
    cut_all(permits.into_iter().map(|p| p.release()).collect()).await;
    busy.stop().await;
    within(LIMIT, "flush", ctx.redsem.flush()).await;
    let status = within(LIMIT, "status", sem.status()).await.expect("status");
    assert_eq!(
        status.holders.len(),
        0,
        "{} of {HELD} cut releases left their unit held",
        status.holders.len()
    );
}

/// The same for permit releases and latch count-downs: each applied exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_releases_and_count_downs_cut_while_the_connection_is_busy_are_all_applied() {
    let ctx = TestContext::start().await;
    const CALLS: u32 = 200;
    let load = ctx
        .redsem
        .lease_semaphore("cut-load", 1)
        .expect("semaphore");
    let permits = ctx
        .redsem
        .permit_semaphore("cut-busy-permits")
        .expect("semaphore");
    within(LIMIT, "set", permits.try_set_permits(0))
        .await
        .expect("set");
    let latch = ctx
        .redsem
        .count_down_latch("cut-busy-latch")
        .expect("latch");
    within(LIMIT, "set", latch.try_set_count(10_000))
        .await
        .expect("set");
    let busy = BusyConnection::start(&load);
    cut_all(
        (0..CALLS)
            .map(|_| {
                let permits = permits.clone();
                async move { permits.release(1).await }
            })
            .collect(),
    )
    .await;
    cut_all(
        (0..CALLS)
            .map(|_| {
                let latch = latch.clone();
                async move { latch.count_down().await }
            })
            .collect(),
    )
    .await;
    busy.stop().await;
    within(LIMIT, "flush", ctx.redsem.flush()).await;
    let available = within(LIMIT, "available", permits.available_permits())
        .await
        .expect("available");
    let state = within(LIMIT, "state", latch.state()).await.expect("state");
    assert_eq!(
        (available, state),
        (
            i64::from(CALLS),
            LatchState::Counting(10_000 - u64::from(CALLS))
        ),
        "every cut release and count-down is applied, once"
    );
}

/// `Redsem::flush` waits for a release under way in another task, as for one cut: a program
/// that spawns its releases and flushes before exiting gives every unit back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_waits_for_releases_under_way_in_other_tasks() {
    let ctx = TestContext::start().await;
    let proxy = redsem_test::FaultProxy::start(ctx.server.port());
    let redsem = connect_url(&proxy.url()).await;
    const HELD: u32 = 4;
    let sem = redsem
        .lease_semaphore_with("flush-under-way", HELD, long_lease())
        .expect("semaphore");
    let permits = take_all(&sem, HELD as usize).await;
    // Nothing reaches Redis until thawed: each release is sent and waits for its reply.
    proxy.set_frozen(true);
    let (started, mut all_started) = tokio::sync::mpsc::unbounded_channel();
    let releases: Vec<_> = permits
        .into_iter()
        .map(|permit| {
            let started = started.clone();
            tokio::spawn(async move {
                let mut release = pin!(permit.release());
                let first = std::future::poll_fn(|cx| Poll::Ready(release.as_mut().poll(cx))).await;
                let _ = started.send(());
                match first {
                    Poll::Ready(answer) => answer,
                    Poll::Pending => release.await,
                }
            })
        })
        .collect();
    for _ in 0..HELD {
        within(LIMIT, "a release under way", all_started.recv())
            .await
            .expect("started");
    }
    let flushed = tokio::time::timeout(Duration::from_millis(300), redsem.flush()).await;
    assert!(
        flushed.is_err(),
        "flush returned while {HELD} releases were still waiting for Redis"
    );
    proxy.set_frozen(false);
    within(LIMIT, "flush", redsem.flush()).await;
    let observer = ctx
        .redsem
        .lease_semaphore("flush-under-way", HELD)
        .expect("semaphore");
    let status = within(LIMIT, "status", observer.status())
        .await
        .expect("status");
    assert_eq!(status.holders.len(), 0, "units still held after flush");
    for release in releases {
        within(LIMIT, "release task", release)
            .await
            .expect("task")
            .expect("released");
    }
}
