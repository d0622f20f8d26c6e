//! What a release leaves to happen later, driven through faults: the grant it hands to a
//! waiter of its own process when its reply is lost, and the idle TTL it leaves to
//! `lease_tidy`.

use std::time::Duration;

use redis::AsyncCommands;
use redsem::LeaseOptions;
use redsem_test::FaultProxy;

use crate::support::{LIMIT, TestContext, connect_url, cycle, until, within};
use crate::support::{Needs, skip_without};

#[tokio::test]
async fn a_grant_handed_back_in_a_lost_release_reply_still_reaches_its_waiter() {
    // A release hands the grant for a waiter of its own process back in its reply instead of
    // publishing it. If that reply is lost, the waiter's own poll must collect the grant.
    let ctx = TestContext::start().await;
    let proxy = FaultProxy::start(ctx.server.port());
    let redsem = connect_url(&proxy.url()).await;
    let options = LeaseOptions::default().waiter_lease(Duration::from_millis(600));
    let sem = redsem
        .lease_semaphore_with("s", 1, options)
        .expect("semaphore");
    let holder = sem.try_acquire().await.expect("holder");
    let holder_token = holder.token();
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await }
    });
    let observer = ctx.redsem.lease_semaphore("s", 1).expect("semaphore");
    until("the waiter queued", || async {
        observer.status().await.expect("status").waiters.len() == 1
    })
    .await;
    // The first command naming the holder's id is its release (alone, or in a batch).
    proxy.drop_reply_after(holder.id().as_str().as_bytes());
    let released = within(LIMIT, "release", holder.release()).await;
    assert_eq!(
        proxy.triggered(),
        1,
        "the release's reply was lost ({released:?})"
    );
    let permit = within(LIMIT, "the waiter's grant", waiter)
        .await
        .expect("task")
        .expect("granted by its poll");
    assert!(permit.token() > holder_token);
    let status = observer.status().await.expect("status");
    assert_eq!(status.holders.len(), 1);
    assert_eq!(&status.holders[0].id, permit.id());
    permit.release().await.expect("release");
}

/// The TTL of a lease semaphore's state key, ms (-1: none).
async fn state_ttl(ctx: &TestContext) -> i64 {
    let mut conn = ctx.raw().await;
    conn.pttl("t:{lease:idle}:state").await.expect("PTTL")
}

#[tokio::test]
async fn flush_gives_an_idle_semaphore_its_ttl_at_once() {
    let ctx = TestContext::start().await;
    let sem = ctx.redsem.lease_semaphore("idle", 1).expect("semaphore");
    cycle(&sem).await.expect("acquire and release");
    within(LIMIT, "flush", ctx.redsem.flush()).await;
    let ttl = state_ttl(&ctx).await;
    assert!(ttl > 3_500_000, "idle keys expire within the hour: {ttl}");
    let mut conn = ctx.raw().await;
    let bitmap: bool = conn.exists("t:{lease:idle}:slots").await.expect("EXISTS");
    assert!(!bitmap, "no bitmap while nothing is held");
}

#[tokio::test]
async fn an_idle_semaphore_gets_its_ttl_without_flush_too() {
    let ctx = TestContext::start().await;
    let other = ctx.client().await;
    let sem = other.lease_semaphore("idle", 1).expect("semaphore");
    cycle(&sem).await.expect("acquire and release");
    // The client goes away (without flush); its pending tidy still runs, a second later.
    drop(sem);
    drop(other);
    until("the idle TTL", || async { state_ttl(&ctx).await > 0 }).await;
}

/// A release whose reply is lost (the script ran, the connection dropped) is resent once
/// with the same id and answers what it did: released, not `Unavailable`.
#[tokio::test]
async fn a_release_whose_reply_is_lost_is_resent_and_answers_released() {
    let ctx = TestContext::start().await;
    let proxy = FaultProxy::start(ctx.server.port());
    let redsem = connect_url(&proxy.url()).await;
    let sem = redsem.lease_semaphore("s", 1).expect("semaphore");
    let permit = sem.try_acquire().await.expect("a free unit");
    proxy.drop_reply_after(permit.id().as_str().as_bytes());
    let released = within(LIMIT, "release", permit.release()).await;
    assert_eq!(proxy.triggered(), 1, "the release's reply was lost");
    released.expect("the resent release answers released");
    let observer = ctx.redsem.lease_semaphore("s", 1).expect("semaphore");
    assert!(observer.status().await.expect("status").holders.is_empty());
}

/// A try_acquire whose reply is lost is resent once with the same id, and the resend
/// answers as the first attempt did: the grant is kept (same permit on the server), not
/// given back with `Unavailable`.
#[tokio::test]
async fn a_try_acquire_whose_reply_is_lost_is_resent_and_keeps_its_grant() {
    let ctx = TestContext::start().await;
    let proxy = FaultProxy::start(ctx.server.port());
    let redsem = connect_url(&proxy.url()).await;
    let sem = redsem.lease_semaphore("s", 1).expect("semaphore");
    // The library loaded first, so the reply lost is the try's, not a FUNCTION LOAD's.
    sem.status().await.expect("status");
    proxy.drop_reply_after(b"{lease:s}");
    let permit = within(LIMIT, "try_acquire", sem.try_acquire())
        .await
        .expect("the resent try answers granted");
    assert_eq!(proxy.triggered(), 1, "the try's reply was lost");
    let observer = ctx.redsem.lease_semaphore("s", 1).expect("semaphore");
    let status = observer.status().await.expect("status");
    assert_eq!(status.holders.len(), 1, "{status:?}");
    assert_eq!(&status.holders[0].id, permit.id());
    assert_eq!(status.holders[0].token, permit.token());
    permit.release().await.expect("release");
    assert!(observer.status().await.expect("status").holders.is_empty());
}

/// A permit that another handle released by id answers `NotHeld` to its holder's own
/// `release()`, whether the holder already knew it lost (its renewal found it not held) or
/// not yet (released by id a moment before): the tombstone remembers which release made it.
#[tokio::test]
async fn a_permit_released_by_id_elsewhere_answers_not_held() {
    let ctx = TestContext::start().await;
    let other = ctx
        .client()
        .await
        .lease_semaphore("s", 2)
        .expect("semaphore");
    // Not yet known lost: the renewal is 10 s away.
    let slow = LeaseOptions::default().lease(Duration::from_secs(30));
    let sem = ctx
        .redsem
        .lease_semaphore_with("s", 2, slow)
        .expect("semaphore");
    let permit = sem.try_acquire().await.expect("a free unit");
    other.release_id(permit.id()).await.expect("release by id");
    assert!(permit.is_held(), "not known lost yet");
    let err = within(LIMIT, "release", permit.release())
        .await
        .expect_err("released by someone else");
    assert!(matches!(err, redsem::Error::NotHeld { .. }), "{err:?}");
    // Known lost: the keepalive's renewal found it not held.
    let quick = LeaseOptions::default().lease(Duration::from_millis(600));
    let sem = ctx
        .redsem
        .lease_semaphore_with("s", 2, quick)
        .expect("semaphore");
    let permit = sem.try_acquire().await.expect("a free unit");
    other.release_id(permit.id()).await.expect("release by id");
    within(LIMIT, "lost", permit.lost()).await;
    let err = within(LIMIT, "release", permit.release())
        .await
        .expect_err("released by someone else");
    assert!(matches!(err, redsem::Error::NotHeld { .. }), "{err:?}");
}

/// A group commit whose reply is lost (the script ran, the connection dropped): each try in
/// it is resent once with its own id and answers as the batch did, so no grant is given
/// away twice or left behind.
///
/// Whether concurrent tries go as a batch depends on scheduling (a call that finds nothing in
/// flight goes alone, and so does a batch of one), so the tries run in rounds until a batch's
/// reply was lost; every round checks the holders against the grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tries_in_a_batch_whose_reply_is_lost_are_resent_and_keep_their_grants() {
    if skip_without(
        Needs::Functions,
        "tries_in_a_batch_whose_reply_is_lost_are_resent_and_keep_their_grants",
        "finds its call on the wire by the function's name (FCALL)",
    ) {
        return;
    }
    const ROUNDS: usize = 20;
    let ctx = TestContext::start().await;
    let proxy = FaultProxy::start(ctx.server.port());
    let redsem = connect_url(&proxy.url()).await;
    let sem = redsem
        .lease_semaphore_with("s", 4, LeaseOptions::default().keepalive(false))
        .expect("semaphore");
    // The library loaded first, so the reply lost is a batch's.
    sem.status().await.expect("status");
    let observer = ctx.redsem.lease_semaphore("s", 4).expect("semaphore");
    // (Latency keeps the first try in flight while the others queue behind it.)
    proxy.set_delay(Duration::from_millis(20));
    proxy.drop_reply_after(b"_lease_batch");
    for round in 1..=ROUNDS {
        let tries: Vec<_> = (0..12)
            .map(|_| {
                let sem = sem.clone();
                tokio::spawn(async move { sem.try_acquire().await })
            })
            .collect();
        let mut granted = Vec::new();
        for t in tries {
            match within(LIMIT, "try", t).await.expect("task") {
                Ok(permit) => granted.push(permit),
                Err(e) => assert!(e.is_not_acquired(), "{e:?}"),
            }
        }
        let status = observer.status().await.expect("status");
        assert_eq!(granted.len(), 4);
        let mut held: Vec<String> = status.holders.iter().map(|h| h.id.to_string()).collect();
        let mut ours: Vec<String> = granted.iter().map(|p| p.id().to_string()).collect();
        held.sort();
        ours.sort();
        assert_eq!(
            held, ours,
            "the server's holders are the permits the tries returned"
        );
        for permit in granted {
            permit.release().await.expect("release");
        }
        if proxy.triggered() == 1 {
            break;
        }
        assert!(round < ROUNDS, "no batch of tries in {ROUNDS} rounds");
    }
}

/// The permit semaphore's group commit, its reply lost twice (the script ran, the connection
/// dropped): the tries in a batch are each resent once with their own id and take exactly the
/// 4 permits they report; the releases in a batch are each applied once.
///
/// Whether concurrent calls go as a batch depends on scheduling (a call that finds nothing
/// in flight goes alone), so each phase runs in rounds until a batch's reply was lost; every
/// round checks the count, so a round whose calls all went alone still tests nothing wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permit_tries_and_releases_in_a_batch_whose_reply_is_lost_are_applied_once() {
    if skip_without(
        Needs::Functions,
        "permit_tries_and_releases_in_a_batch_whose_reply_is_lost_are_applied_once",
        "finds its call on the wire by the function's name (FCALL)",
    ) {
        return;
    }
    const ROUNDS: usize = 20;
    let ctx = TestContext::start().await;
    let proxy = FaultProxy::start(ctx.server.port());
    let redsem = connect_url(&proxy.url()).await;
    let pool = redsem.permit_semaphore("p").expect("handle");
    // Set first (the library loaded), so the reply lost is a batch's.
    assert!(pool.try_set_permits(4).await.expect("set"));
    let observer = ctx.redsem.permit_semaphore("p").expect("handle");
    let concurrently = async |release: bool| {
        let calls: Vec<_> = (0..if release { 4 } else { 12 })
            .map(|_| {
                let pool = pool.clone();
                tokio::spawn(async move {
                    if release {
                        pool.release(1).await
                    } else {
                        pool.try_acquire(1).await
                    }
                })
            })
            .collect();
        let mut done = 0;
        for call in calls {
            match within(LIMIT, "call", call).await.expect("task") {
                Ok(()) => done += 1,
                Err(e) => assert!(e.is_not_acquired(), "{e:?}"),
            }
        }
        done
    };
    // (Latency keeps the first call in flight while the others queue behind it.)
    proxy.set_delay(Duration::from_millis(20));
    proxy.drop_reply_after(b"_permit_batch");
    for round in 1..=ROUNDS {
        assert_eq!(concurrently(false).await, 4, "4 tries report a permit");
        let left = observer.available_permits().await.expect("available");
        assert_eq!(left, 0, "the server took exactly the 4 reported");
        if proxy.triggered() == 1 {
            break;
        }
        assert!(round < ROUNDS, "no batch of tries in {ROUNDS} rounds");
        observer.release(4).await.expect("the 4 back");
    }
    proxy.drop_reply_after(b"_permit_batch");
    let mut released: i64 = 0;
    for round in 1..=ROUNDS {
        assert_eq!(concurrently(true).await, 4);
        released += 4;
        let back = observer.available_permits().await.expect("available");
        assert_eq!(back, released, "each release applied once");
        if proxy.triggered() == 2 {
            break;
        }
        assert!(round < ROUNDS, "no batch of releases in {ROUNDS} rounds");
    }
}

/// A client through `proxy` that sends its calls one by one (no group commit), the permit
/// semaphore "w" on it (with `options`), and "w" on the test's own client, which set one
/// permit and holds it.
async fn one_permit_taken(
    ctx: &TestContext,
    proxy: &FaultProxy,
    options: redsem::PermitOptions,
) -> (
    redsem::Redsem,
    redsem::PermitSemaphore,
    redsem::PermitSemaphore,
) {
    let one_by_one = redsem::RedsemOptions::default()
        .prefix("t")
        .group_commit(false);
    let waiting = crate::support::connect_with(&proxy.url(), one_by_one)
        .await
        .expect("connect");
    let pool = waiting.permit_semaphore_with("w", options).expect("handle");
    let owner = ctx.redsem.permit_semaphore("w").expect("handle");
    assert!(owner.try_set_permits(1).await.expect("set"));
    owner.acquire(1).await.expect("the only permit");
    (waiting, pool, owner)
}

/// A waiting permit acquire whose grant was collected by a check-in whose reply was lost, and
/// which is then dropped while the server is unreachable: its withdrawal, sent in the
/// background, must still give the permit back once the server can be reached (a permit has
/// no lease that would end it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_permit_acquire_gives_back_a_collected_grant_after_an_outage() {
    if skip_without(
        Needs::Functions,
        "a_dropped_permit_acquire_gives_back_a_collected_grant_after_an_outage",
        "finds its call on the wire by the function's name (FCALL)",
    ) {
        return;
    }
    let ctx = TestContext::start().await;
    let proxy = std::sync::Arc::new(FaultProxy::start(ctx.server.port()));
    let (waiting, pool, owner) =
        one_permit_taken(&ctx, &proxy, redsem::PermitOptions::default()).await;
    let waiter = tokio::spawn(async move { pool.acquire(1).await });
    until("the waiter is queued", || async {
        crate::support::queued(&ctx.server, "w").await == 1
    })
    .await;
    // The waiter's check-in collects the grant; its reply is lost. Then nothing reaches the
    // server, and the acquire is dropped: its withdrawal cannot be sent for now.
    proxy.drop_reply_after(b"_permit_poll");
    // (Refused the moment the reply is lost, before the check-in is sent again: a latency
    // on the proxy keeps the client's reconnection slower than the thread that watches.)
    proxy.set_delay(Duration::from_millis(100));
    let watch = {
        let proxy = proxy.clone();
        std::thread::spawn(move || {
            let deadline = std::time::Instant::now() + LIMIT;
            while proxy.triggered() == 0 && std::time::Instant::now() < deadline {
                std::hint::spin_loop();
            }
            proxy.set_refusing(true);
        })
    };
    owner.release(1).await.expect("release");
    within(LIMIT, "the check-in's reply lost", async {
        while !watch.is_finished() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    assert_eq!(proxy.triggered(), 1, "the check-in's reply was lost");
    waiter.abort();
    let aborted = within(LIMIT, "the aborted task", waiter).await;
    assert!(
        matches!(&aborted, Err(e) if e.is_cancelled()),
        "the acquire must not have returned: {aborted:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        owner.available_permits().await.expect("available"),
        0,
        "collected by the lost check-in, not given back yet"
    );
    proxy.set_delay(Duration::ZERO);
    proxy.set_refusing(false);
    within(LIMIT, "flush", waiting.flush()).await;
    until("the permit comes back", || async {
        owner.available_permits().await.expect("available") == 1
    })
    .await;
}

/// An acquire that times out just as the server goes out of reach: the caller learns that it
/// timed out, and its withdrawal, which could not be sent, is sent again in the background,
/// so the request leaves the queue once the server is back — not a waiter lease (a minute
/// here) later, in front of everyone queued behind it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timed_out_acquire_leaves_the_queue_once_the_server_is_back() {
    if skip_without(
        Needs::Functions,
        "a_timed_out_acquire_leaves_the_queue_once_the_server_is_back",
        "finds its call on the wire by the function's name (FCALL)",
    ) {
        return;
    }
    let ctx = TestContext::start().await;
    let proxy = FaultProxy::start(ctx.server.port());
    let long_wait = redsem::PermitOptions::default().waiter_lease(Duration::from_secs(60));
    let (waiting, pool, _owner) = one_permit_taken(&ctx, &proxy, long_wait).await;
    // The server goes out of reach just before the withdrawal sent at the deadline.
    proxy.refuse_before(b"_permit_withdraw");
    let timed_out = within(
        LIMIT,
        "the acquire",
        pool.acquire_timeout(1, Duration::from_millis(500)),
    )
    .await;
    assert!(
        matches!(&timed_out, Err(e) if e.is_timeout()),
        "the acquire timed out: {timed_out:?}"
    );
    assert_eq!(proxy.triggered(), 1, "the withdrawal met the outage");
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        crate::support::queued(&ctx.server, "w").await,
        1,
        "no withdrawal reached the server"
    );
    proxy.set_refusing(false);
    until("the request leaves the queue", || async {
        crate::support::queued(&ctx.server, "w").await == 0
    })
    .await;
    within(LIMIT, "flush", waiting.flush()).await;
}
