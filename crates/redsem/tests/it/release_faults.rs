//! What a release leaves to happen later, driven through faults: the grant it hands to a
//! waiter of its own process when its reply is lost, and the idle TTL it leaves to
//! `lease_tidy`.

use std::time::Duration;

use redis::AsyncCommands;
use redsem::LeaseOptions;
use redsem_test::FaultProxy;

use crate::support::{LIMIT, TestContext, connect_url, cycle, until, within};

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
    proxy.drop_reply_after(b"_lease_release");
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
