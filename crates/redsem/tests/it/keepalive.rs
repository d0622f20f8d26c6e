//! The keepalive of a `Redsem`: one driver task renews all of its permits, each on its own
//! schedule, and tells each one when it is lost.

use std::collections::HashMap;
use std::time::Duration;

use redsem::{LeasePermit, LeaseSemaphore, PermitId};
use redsem_test::FaultProxy;
use tokio::time::Instant;

use crate::support::{LIMIT, TestContext, connect_url, short, take_all, within};

/// How late a timer may fire on a busy 2-core machine before a test calls it a failure.
const SCHEDULING_SLACK: Duration = Duration::from_millis(150);

/// Tasks alive on this runtime (tokio's stable runtime metrics).
fn tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// For each live permit of `sem`, when its lease ends on the server, counted from its grant
/// (`held_for + expires_in`, both by the Redis clock).
async fn lease_ends(sem: &LeaseSemaphore) -> HashMap<PermitId, Duration> {
    let status = within(LIMIT, "status", sem.status()).await.expect("status");
    status
        .holders
        .into_iter()
        .map(|h| (h.id, h.held_for + h.expires_in))
        .collect()
}

/// Panics if any of `permits` is lost during `span`.
async fn none_lost_for(permits: &[LeasePermit], span: Duration) {
    let any_lost = futures_util::future::select_all(permits.iter().map(|p| Box::pin(p.lost())));
    tokio::select! {
        ((), i, _) = any_lost => panic!("permit {} was lost while renewed", permits[i].id()),
        () = tokio::time::sleep(span) => {}
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_short_leases_on_one_client_are_all_renewed_by_one_task() {
    const N: usize = 500;
    let ctx = TestContext::start().await;
    let sem = ctx
        .redsem
        .lease_semaphore_with("many", N as u32, short(300))
        .expect("semaphore");
    let before = tasks();
    let permits = take_all(&sem, N).await;
    let during = tasks();
    println!(
        "{N} permits with keepalive: {before} tasks before, {during} while held \
         (one driver; renewals run inside it)"
    );
    assert!(
        during <= before + 2,
        "{N} permits added {} tasks; the keepalive should be one driver per Redsem",
        during - before
    );

    // Several leases long: every permit needs several renewals to survive.
    none_lost_for(&permits, Duration::from_millis(1_000)).await;
    let midway = lease_ends(&sem).await;
    none_lost_for(&permits, Duration::from_millis(1_000)).await;
    let end = lease_ends(&sem).await;

    for permit in &permits {
        assert!(permit.is_held(), "{} not held", permit.id());
        let (Some(midway), Some(end)) = (midway.get(permit.id()), end.get(permit.id())) else {
            panic!("{} missing from the server's holders", permit.id());
        };
        // Each was renewed between the two looks, and well past its first lease.
        assert!(
            end > midway,
            "{}: server lease end {end:?} after {midway:?}",
            permit.id()
        );
        assert!(
            *midway > Duration::from_millis(900),
            "{}: lease end {midway:?} after the grant",
            permit.id()
        );
    }
    for permit in permits {
        within(LIMIT, "release", permit.release())
            .await
            .expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_cut_off_from_redis_loses_its_permits_before_the_server_lease_ends_and_others_keep_theirs()
 {
    let ctx = TestContext::start().await;
    let proxy = FaultProxy::start(ctx.server.port());
    let cut_off = connect_url(&proxy.url()).await;
    let lease = Duration::from_millis(900);
    let options = short(900);
    let sem_far = cut_off
        .lease_semaphore_with("s", 6, options.clone())
        .expect("semaphore");
    let sem_near = ctx
        .redsem
        .lease_semaphore_with("s", 6, options)
        .expect("semaphore");
    let near = take_all(&sem_near, 3).await;
    // Every command of the cut-off client reaches Redis 100 ms after it was sent, so its
    // server leases end at least 100 ms after the permits' local validity.
    proxy.set_delay(Duration::from_millis(100));
    let far = take_all(&sem_far, 3).await;
    none_lost_for(&far, Duration::from_millis(1_000)).await;

    proxy.set_refusing(true);
    let cut = Instant::now();
    // As each one reports its loss, ask the server (through the client that can reach it)
    // whether its lease is still running there.
    let on_loss = far.iter().map(|permit| async {
        within(LIMIT, "lost after the cut", permit.lost()).await;
        let lost_after = cut.elapsed();
        let status = within(LIMIT, "status", sem_near.status())
            .await
            .expect("status");
        let holder = status.holders.into_iter().find(|h| &h.id == permit.id());
        (lost_after, holder)
    });
    let mut lost_after = Duration::ZERO;
    for (permit, (after, holder)) in far
        .iter()
        .zip(futures_util::future::join_all(on_loss).await)
    {
        assert!(!permit.is_held());
        assert!(
            holder.as_ref().is_some_and(|h| !h.expires_in.is_zero()),
            "{}: lost() fired {after:?} after the cut, when the server lease had \
             already ended ({holder:?})",
            permit.id()
        );
        lost_after = lost_after.max(after);
    }
    assert!(
        lost_after <= lease + SCHEDULING_SLACK,
        "lost {lost_after:?} after the cut"
    );

    // The other client's permits never noticed: held and renewed through several leases.
    let midway = lease_ends(&sem_near).await;
    none_lost_for(&near, Duration::from_millis(1_000)).await;
    let end = lease_ends(&sem_near).await;
    for permit in &near {
        assert!(permit.is_held());
        assert!(end.get(permit.id()) > midway.get(permit.id()));
    }
    // The cut-off client's permits ended on the server by themselves.
    for permit in &far {
        assert!(!end.contains_key(permit.id()), "{} still held", permit.id());
    }
    for permit in near {
        permit.release().await.expect("release");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn releasing_and_dropping_some_permits_leaves_the_others_renewals_alone() {
    let ctx = TestContext::start().await;
    let sem = ctx
        .redsem
        .lease_semaphore_with("s", 40, short(300))
        .expect("semaphore");
    let mut permits = take_all(&sem, 40).await;
    let stay: Vec<LeasePermit> = permits.split_off(20);
    let first = lease_ends(&sem).await;
    let settle_half = async {
        // One every 30 ms, so that some releases meet renewals in flight.
        for (i, permit) in permits.into_iter().enumerate() {
            tokio::time::sleep(Duration::from_millis(30)).await;
            if i % 2 == 0 {
                within(LIMIT, "release", permit.release())
                    .await
                    .expect("release");
            } else {
                drop(permit);
            }
        }
    };
    tokio::join!(
        settle_half,
        none_lost_for(&stay, Duration::from_millis(1_000))
    );
    within(LIMIT, "flush", ctx.redsem.flush()).await;
    none_lost_for(&stay, Duration::from_millis(400)).await;
    let end = lease_ends(&sem).await;
    assert_eq!(end.len(), stay.len(), "only the kept permits are held");
    for permit in &stay {
        assert!(permit.is_held());
        assert!(end.get(permit.id()) > first.get(permit.id()));
    }
    for permit in stay {
        permit.release().await.expect("release");
    }
}

#[tokio::test]
async fn a_permit_without_keepalive_lives_as_long_as_it_is_refreshed_by_hand() {
    let ctx = TestContext::start().await;
    let sem = ctx
        .redsem
        .lease_semaphore_with("s", 1, short(300).keepalive(false))
        .expect("semaphore");
    let permit = sem.try_acquire().await.expect("acquire");
    // Three leases, refreshed every 100 ms: the loss timer follows each refresh.
    let refreshing = async {
        for _ in 0..9 {
            tokio::time::sleep(Duration::from_millis(100)).await;
            permit.refresh().await.expect("refresh");
        }
    };
    tokio::select! {
        () = permit.lost() => panic!("lost while refreshed by hand"),
        () = refreshing => {}
    }
    assert!(!permit.is_lost(), "is_lost() while refreshed");
    let last = Instant::now();
    within(LIMIT, "lost once refreshes stop", permit.lost()).await;
    assert!(permit.is_lost(), "is_lost() after lost() resolved");
    let after = last.elapsed();
    assert!(
        after <= Duration::from_millis(300) + SCHEDULING_SLACK,
        "lost {after:?} after the last refresh"
    );
    assert!(
        after >= Duration::from_millis(200),
        "lost too early: {after:?} after the last refresh"
    );
}

/// The end of a permit's local validity, mapped to the server's clock, as late as it can be:
/// the server's `TIME` (µs) was read at `server_us` before the local instant `after`.
fn on_server_clock(server_us: i64, after: std::time::Instant, end: std::time::Instant) -> i64 {
    let since = end.saturating_duration_since(after);
    server_us + i64::try_from(since.as_micros()).unwrap_or(i64::MAX)
}

/// A permit's local validity never outlasts its lease on the server, which Redis counts in
/// whole milliseconds of its clock (a lease started at 12.999 ms ends `lease` after 12 ms).
/// The soak's long run found the gap: a holder whose local validity ended 237 µs after the
/// server had given its unit to the next waiter. Each of 300 grants and as many renewals:
/// the server's `TIME` read just before maps local instants to a lower bound of the server's
/// clock, and the local validity's end, so mapped, must not pass the lease end the server
/// stored (the `leases` zset, ms).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_validity_never_outlasts_the_servers_lease() {
    let ctx = TestContext::start().await;
    let options = redsem::LeaseOptions::default().keepalive(false);
    let sem = ctx
        .redsem
        .lease_semaphore_with("v", 1, options)
        .expect("semaphore");
    let mut raw = ctx.raw().await;
    let server_now = async |raw: &mut redis::aio::MultiplexedConnection| {
        let (secs, micros): (i64, i64) = redis::cmd("TIME").query_async(raw).await.expect("TIME");
        (secs * 1_000_000 + micros, std::time::Instant::now())
    };
    let lease_end = async |raw: &mut redis::aio::MultiplexedConnection, id: String| {
        let ends: Option<f64> = redis::AsyncCommands::zscore(raw, "t:{lease:v}:leases", id)
            .await
            .expect("ZSCORE");
        ends.expect("a lease entry") as i64 * 1000
    };
    let mut worst = i64::MIN;
    for _ in 0..300 {
        let (server_us, after) = server_now(&mut raw).await;
        let permit = within(LIMIT, "try_acquire", sem.try_acquire())
            .await
            .expect("a free unit");
        let granted_end = permit.expires_at().into_std();
        let server_end = lease_end(&mut raw, permit.id().to_string()).await;
        worst = worst.max(on_server_clock(server_us, after, granted_end) - server_end);
        let (server_us, after) = server_now(&mut raw).await;
        within(LIMIT, "refresh", permit.refresh())
            .await
            .expect("renewed");
        let renewed_end = permit.expires_at().into_std();
        let server_end = lease_end(&mut raw, permit.id().to_string()).await;
        worst = worst.max(on_server_clock(server_us, after, renewed_end) - server_end);
        permit.release().await.expect("release");
    }
    println!("latest local validity end past the server's lease end: {worst} µs");
    assert!(
        worst <= 0,
        "a local validity ended {worst} µs after the server's lease"
    );
}
