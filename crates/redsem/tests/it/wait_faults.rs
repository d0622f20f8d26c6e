//! Waiting through faults: the lease of a grant handed to a queued waiter, and a
//! waiter whose connection drops.

use std::time::Duration;

use redsem::{LeaseOptions, LeasePermit, LeaseSemaphore};
use redsem_test::FaultProxy;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::support::connect_url as connect;
use crate::support::{LIMIT, TestContext, cycle, queued, raw_connection, until, within};

/// How far the local lease clock may lag the server's: a round trip and scheduling.
const SLACK: Duration = Duration::from_millis(250);

/// A holder releases to a queued waiter; returns the server's lease left on the grant and the
/// waiter's own `time_left()`, read at about the same moment.
async fn hand_over(lease: Duration, waiter_lease: Duration) -> (Duration, Duration) {
    let ctx = TestContext::start().await;
    let options = LeaseOptions::default()
        .lease(lease)
        .waiter_lease(waiter_lease);
    let sem = ctx
        .redsem
        .lease_semaphore_with("s", 1, options.clone())
        .expect("semaphore");
    let other = ctx.client().await;
    let sem_b = other
        .lease_semaphore_with("s", 1, options)
        .expect("semaphore");
    let holder = sem.try_acquire().await.expect("holder");
    let waiter = tokio::spawn(async move { sem_b.acquire().await });
    until("queued", || async {
        sem.status().await.expect("status").waiters.len() == 1
    })
    .await;
    // Let the waiter's last check-in age a little, as it would in real use.
    tokio::time::sleep(waiter_lease / 6).await;
    holder.release().await.expect("release");
    let granted = within(LIMIT, "hand-over", waiter)
        .await
        .expect("task")
        .expect("granted");
    let read = Instant::now();
    let local = granted.time_left();
    let status = sem.status().await.expect("status");
    let server = status.holders[0].expires_in;
    // The local deadline must not pass the server's: compared at the moment `local` was read
    // (and the server counts whole ms).
    let at_read = server + read.elapsed() + Duration::from_millis(1);
    assert!(
        local <= at_read,
        "local {local:?} past the server's {at_read:?}"
    );
    // Its first renewal claims a grant the server kept only for the waiter lease (woken by
    // message): the whole lease from then.
    until("claimed", || async {
        sem.status().await.expect("status").holders[0].expires_in + SLACK >= lease
    })
    .await;
    // And the holder keeps it: no false loss over two leases.
    tokio::select! {
        () = granted.lost() => panic!("a false loss: local {local:?}, server {server:?}"),
        () = tokio::time::sleep(lease * 2) => {}
    }
    granted.release().await.expect("release");
    (server, local)
}

/// A queued grant's lease on the server is the `lease` asked for, or, until the waiter claims
/// it, what is left of its waiter lease if that ends sooner (a dead waiter costs
/// no more); the local one follows it.
async fn a_queued_grant_gets_the_lease_it_asked_for(lease: Duration, waiter_lease: Duration) {
    let (server, local) = hand_over(lease, waiter_lease).await;
    let unclaimed = lease.min(waiter_lease);
    // (The waiter's last check-in is up to a third of its waiter lease old: its recheck.)
    assert!(
        server <= unclaimed && server + SLACK + waiter_lease / 3 >= unclaimed,
        "server {server:?}"
    );
    assert!(local + SLACK >= server, "local {local:?} server {server:?}");
}

#[tokio::test]
async fn a_queued_grant_gets_the_lease_it_asked_for_with_a_short_lease() {
    // Before: lease 600 ms, waiter lease 3 s gave a server lease of ~2.5 s and a local one
    // of 85 ms (a false loss at 87 ms).
    a_queued_grant_gets_the_lease_it_asked_for(Duration::from_millis(600), Duration::from_secs(3))
        .await;
}

#[tokio::test]
async fn a_queued_grant_gets_the_lease_it_asked_for_with_a_long_lease() {
    // Before: lease 2.4 s, waiter lease 600 ms gave a server lease of 487 ms.
    a_queued_grant_gets_the_lease_it_asked_for(
        Duration::from_millis(2_400),
        Duration::from_millis(600),
    )
    .await;
}

/// A lease semaphore of one unit held by `ctx`'s client, and a waiter for it (`b`) connected
/// through `proxy`, queued.
async fn lease_waiter(
    ctx: &TestContext,
    proxy: &FaultProxy,
    options: &LeaseOptions,
) -> (
    LeaseSemaphore,
    LeasePermit,
    JoinHandle<redsem::Result<LeasePermit>>,
) {
    let sem = ctx
        .redsem
        .lease_semaphore_with("s", 1, options.clone())
        .expect("semaphore");
    let behind = connect(&proxy.url()).await;
    let sem_b = behind
        .lease_semaphore_with("s", 1, options.clone())
        .expect("semaphore");
    let holder = sem.try_acquire().await.expect("holder");
    let b = tokio::spawn(async move { sem_b.acquire().await });
    until("b queued", || async {
        sem.status().await.expect("status").waiters.len() == 1
    })
    .await;
    (sem, holder, b)
}

/// `proxy` refuses and drops its connections for `span`.
async fn cut_off_for(proxy: &FaultProxy, span: Duration) {
    proxy.set_refusing(true);
    tokio::time::sleep(span).await;
    proxy.set_refusing(false);
}

/// `proxy` refuses for good: the waiter behind it fails as unavailable, within [`LIMIT`].
/// Returns how long after the cut it failed.
async fn a_waiter_cut_off_for_good_fails_as_unavailable<T: std::fmt::Debug>(
    proxy: &FaultProxy,
    waiter: JoinHandle<redsem::Result<T>>,
) -> Duration {
    proxy.set_refusing(true);
    let cut = Instant::now();
    let err = within(LIMIT, "the waiter gives up", waiter)
        .await
        .expect("task")
        .expect_err("unreachable for longer than the waiter lease");
    assert!(err.is_unavailable(), "{err:?}");
    cut.elapsed()
}

#[tokio::test]
async fn a_waiter_rides_out_a_dropped_connection_and_keeps_its_place() {
    // Before: acquire() failed with "broken pipe" 0.0 ms after the connection dropped.
    let ctx = TestContext::start().await;
    let proxy = FaultProxy::start(ctx.server.port());
    let options = LeaseOptions::default().waiter_lease(Duration::from_secs(3));
    let (sem, holder, b) = lease_waiter(&ctx, &proxy, &options).await;
    let third = ctx.client().await;
    let sem_c = third
        .lease_semaphore_with("s", 1, options)
        .expect("semaphore");
    let c = tokio::spawn(async move { sem_c.acquire().await });
    until("c queued behind b", || async {
        sem.status().await.expect("status").waiters.len() == 2
    })
    .await;

    // Cut b off for a second: its connections drop and new ones are refused.
    cut_off_for(&proxy, Duration::from_secs(1)).await;
    holder.release().await.expect("release");
    let b_permit = within(LIMIT, "b, first in line", b)
        .await
        .expect("task")
        .expect("b survived the cut");
    assert!(!c.is_finished(), "c must not overtake b");
    let b_token = b_permit.token();
    b_permit.release().await.expect("release");
    let c_permit = within(LIMIT, "c", c).await.expect("task").expect("c");
    assert!(c_permit.token() > b_token);
}

#[tokio::test]
async fn a_waiter_cut_off_longer_than_its_waiter_lease_fails_as_unavailable() {
    let ctx = TestContext::start().await;
    let proxy = FaultProxy::start(ctx.server.port());
    let options = LeaseOptions::default().waiter_lease(Duration::from_millis(600));
    let (_sem, _holder, b) = lease_waiter(&ctx, &proxy, &options).await;
    let gave_up = a_waiter_cut_off_for_good_fails_as_unavailable(&proxy, b).await;
    assert!(gave_up < Duration::from_secs(5), "{gave_up:?}");
}

#[tokio::test]
async fn a_client_whose_reconnection_was_refused_authentication_recovers() {
    // Before: after one reconnection refused with a wrong password, every later call failed
    // with AuthenticationFailed, also once the password was back.
    let server = redsem_test::RedisServer::start();
    // (Connected before the password is set, this connection stays authenticated.)
    let mut admin = raw_connection(&server).await;
    let () = redis::cmd("CONFIG")
        .arg(&["SET", "requirepass", "old"])
        .query_async(&mut admin)
        .await
        .expect("CONFIG SET requirepass");
    let url = format!("redis://:old@127.0.0.1:{}/", server.port());
    let redsem = connect(&url).await;
    let sem = redsem.lease_semaphore("s", 1).expect("semaphore");
    cycle(&sem).await.expect("works");
    let rotate = admin.clone();
    let config_set = |password: &'static str| {
        let mut admin = rotate.clone();
        async move {
            let () = redis::cmd("CONFIG")
                .arg(&["SET", "requirepass", password])
                .query_async(&mut admin)
                .await
                .expect("CONFIG SET requirepass");
        }
    };
    // The password rotates; redsem's connection drops and its reconnection is refused.
    config_set("new").await;
    let killed: u64 = redis::cmd("CLIENT")
        .arg(&["KILL", "TYPE", "normal", "SKIPME", "yes"])
        .query_async(&mut admin)
        .await
        .expect("CLIENT KILL");
    assert!(killed >= 1);
    let mut refused = 0;
    for _ in 0..20 {
        if sem.status().await.is_err() {
            refused += 1;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(refused > 0, "the wrong password must be noticed");
    // The password comes back: the same client recovers.
    config_set("old").await;
    let back = Instant::now();
    within(LIMIT, "recovery", async {
        while sem.status().await.is_err() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await;
    println!(
        "recovered {:?} after the password was restored",
        back.elapsed()
    );
    cycle(&sem).await.expect("works again");
}

/// A permit semaphore with one permit taken, and a waiter for it connected through `proxy`.
async fn permit_waiter(
    ctx: &TestContext,
    proxy: &FaultProxy,
    waiter_lease: Duration,
) -> (redsem::PermitSemaphore, JoinHandle<redsem::Result<()>>) {
    let options = redsem::PermitOptions::default().waiter_lease(waiter_lease);
    let pool = ctx
        .redsem
        .permit_semaphore_with("p", options.clone())
        .expect("permits");
    assert!(pool.try_set_permits(1).await.expect("set"));
    pool.try_acquire(1).await.expect("take the only permit");
    let behind = connect(&proxy.url()).await;
    let waiting = behind.permit_semaphore_with("p", options).expect("permits");
    let task = tokio::spawn(async move { waiting.acquire(1).await });
    until("the waiter queued", || async {
        queued(&ctx.server, "p").await == 1
    })
    .await;
    (pool, task)
}

#[tokio::test]
async fn a_permit_waiter_rides_out_a_dropped_connection() {
    let ctx = TestContext::start().await;
    let proxy = FaultProxy::start(ctx.server.port());
    let (pool, waiter) = permit_waiter(&ctx, &proxy, Duration::from_secs(3)).await;
    cut_off_for(&proxy, Duration::from_secs(1)).await;
    assert!(!waiter.is_finished(), "still waiting");
    pool.release(1).await.expect("release");
    within(LIMIT, "the waiter", waiter)
        .await
        .expect("task")
        .expect("granted after the cut");
}

#[tokio::test]
async fn a_permit_waiter_cut_off_longer_than_its_waiter_lease_fails_as_unavailable() {
    let ctx = TestContext::start().await;
    let proxy = FaultProxy::start(ctx.server.port());
    let (_pool, waiter) = permit_waiter(&ctx, &proxy, Duration::from_millis(600)).await;
    a_waiter_cut_off_for_good_fails_as_unavailable(&proxy, waiter).await;
}

/// Both semaphores behave alike when a `try_acquire` is dropped after the server granted it
/// but before the answer arrived: what it was granted is given back at once, not
/// held for a lease (the lease semaphore kept the unit until its lease ran out).
#[tokio::test]
async fn a_try_dropped_before_its_answer_gives_back_what_it_was_granted() {
    let ctx = TestContext::start().await;
    let proxy = FaultProxy::start(ctx.server.port());
    let behind = connect(&proxy.url()).await;
    let lease = behind
        .lease_semaphore_with(
            "t",
            1,
            LeaseOptions::default().lease(Duration::from_secs(60)),
        )
        .expect("semaphore");
    let permits = behind.permit_semaphore("tp").expect("semaphore");
    ctx.redsem
        .permit_semaphore("tp")
        .expect("semaphore")
        .try_set_permits(1)
        .await
        .expect("set");
    // Requests reach the server after 300 ms and their answers come back 300 ms later: the
    // tries are dropped in between, granted but unanswered.
    proxy.set_delay(Duration::from_millis(300));
    let dropped = tokio::time::timeout(Duration::from_millis(450), lease.try_acquire()).await;
    assert!(dropped.is_err(), "answered within 450 ms: {dropped:?}");
    let dropped = tokio::time::timeout(Duration::from_millis(450), permits.try_acquire(1)).await;
    assert!(dropped.is_err(), "answered within 450 ms: {dropped:?}");
    proxy.set_delay(Duration::ZERO);
    within(LIMIT, "background withdrawals", behind.flush()).await;
    let direct = ctx
        .redsem
        .lease_semaphore_with("t", 1, LeaseOptions::default())
        .expect("semaphore");
    let status = direct.status().await.expect("status");
    assert_eq!(
        status.in_use, 0,
        "the dropped try's unit is still held: {status:?}"
    );
    let available = ctx
        .redsem
        .permit_semaphore("tp")
        .expect("semaphore")
        .available_permits()
        .await
        .expect("available");
    assert_eq!(available, 1, "the dropped try's permit was not given back");
}

/// A waiter that dies at the head of the queue and is then granted costs no more than its
/// waiter lease: its grant stays unclaimed and is given back when the waiter lease of its
/// last check-in ends, and the live waiter behind it is granted then, not a whole lease later.
#[tokio::test]
async fn a_dead_waiter_granted_at_the_head_costs_no_more_than_its_waiter_lease() {
    // Before: the live waiter was granted only after the dead one's 30 s lease.
    let ctx = TestContext::start().await;
    let proxy = FaultProxy::start(ctx.server.port());
    let waiter_lease = Duration::from_millis(1_500);
    let options = LeaseOptions::default()
        .lease(Duration::from_secs(30))
        .waiter_lease(waiter_lease);
    let (sem, holder, dead) = lease_waiter(&ctx, &proxy, &options).await;
    let third = ctx.client().await;
    let sem_c = third
        .lease_semaphore_with("s", 1, options)
        .expect("semaphore");
    let live = tokio::spawn(async move { sem_c.acquire().await });
    until("the live waiter queued behind the dead one", || async {
        sem.status().await.expect("status").waiters.len() == 2
    })
    .await;
    // The waiter at the head is cut off for good: it never checks in or claims again.
    proxy.set_refusing(true);
    let holder_token = holder.token();
    holder.release().await.expect("release");
    let released = Instant::now();
    let permit = within(LIMIT, "the live waiter", live)
        .await
        .expect("task")
        .expect("granted");
    let waited = released.elapsed();
    // Its waiter lease, then the live waiter's next check-in (every third of it), and slack.
    assert!(
        waited < waiter_lease * 3,
        "granted {waited:?} after the release"
    );
    assert!(permit.token() > holder_token);
    let status = sem.status().await.expect("status");
    assert_eq!(status.holders.len(), 1, "{status:?}");
    assert_eq!(&status.holders[0].id, permit.id());
    assert!(status.waiters.is_empty(), "{status:?}");
    // The live waiter claimed its grant: a whole lease, kept.
    assert!(
        status.holders[0].expires_in > Duration::from_secs(20),
        "{status:?}"
    );
    assert!(permit.is_held());
    permit.release().await.expect("release");
    dead.abort();
}

/// A live waiter woken by message keeps its grant past its waiter lease with no false loss:
/// the keepalive's first renewal claims it (a whole lease from then).
#[tokio::test]
async fn a_live_waiter_woken_by_message_holds_past_its_waiter_lease() {
    let ctx = TestContext::start().await;
    let waiter_lease = Duration::from_millis(1_500);
    let options = LeaseOptions::default()
        .lease(Duration::from_secs(30))
        .waiter_lease(waiter_lease);
    let sem = ctx
        .redsem
        .lease_semaphore_with("s", 1, options.clone())
        .expect("semaphore");
    let other = ctx.client().await;
    let sem_b = other
        .lease_semaphore_with("s", 1, options)
        .expect("semaphore");
    let holder = sem.try_acquire().await.expect("holder");
    let waiter = tokio::spawn(async move { sem_b.acquire().await });
    until("queued", || async {
        sem.status().await.expect("status").waiters.len() == 1
    })
    .await;
    holder.release().await.expect("release");
    let permit = within(LIMIT, "the waiter", waiter)
        .await
        .expect("task")
        .expect("granted");
    tokio::select! {
        () = permit.lost() => panic!("a false loss"),
        () = tokio::time::sleep(waiter_lease * 2) => {}
    }
    assert!(permit.is_held());
    assert!(permit.time_left() > Duration::from_secs(20), "{permit:?}");
    let status = sem.status().await.expect("status");
    assert_eq!(&status.holders[0].id, permit.id());
    assert!(
        status.holders[0].expires_in > Duration::from_secs(20),
        "claimed: a whole lease, {status:?}"
    );
    permit.release().await.expect("the grant was kept");
}

/// A waiter woken by message that cannot claim its grant (cut off right after the wake-up)
/// learns it lost the permit no later than the server gives the unclaimed grant back: the
/// local validity of an unclaimed grant never outlives its waiter lease.
#[tokio::test]
async fn a_woken_waiter_that_cannot_claim_its_grant_loses_it_before_the_server_gives_it_back() {
    let ctx = TestContext::start().await;
    let proxy = FaultProxy::start(ctx.server.port());
    let waiter_lease = Duration::from_millis(1_500);
    let options = LeaseOptions::default()
        .lease(Duration::from_secs(30))
        .waiter_lease(waiter_lease);
    let (sem, holder, b) = lease_waiter(&ctx, &proxy, &options).await;
    holder.release().await.expect("release");
    let permit = within(LIMIT, "b", b).await.expect("task").expect("granted");
    // Cut off before its first renewal (due within half of its waiter lease) can claim it.
    proxy.set_refusing(true);
    let status = sem.status().await.expect("status");
    let read = Instant::now();
    assert_eq!(&status.holders[0].id, permit.id());
    let left = status.holders[0].expires_in;
    assert!(left <= waiter_lease, "unclaimed: {status:?}");
    // (The server counts whole ms.)
    let server_end = read + left + Duration::from_millis(1);
    let local_end = permit.expires_at();
    assert!(
        local_end <= server_end,
        "the local validity ends {:?} after the server's",
        local_end - server_end
    );
    within(LIMIT, "the loss", permit.lost()).await;
    // (Its timer may fire a little late on a busy machine.)
    let lost_at = Instant::now();
    assert!(
        lost_at <= server_end + Duration::from_millis(100),
        "lost {:?} after the server gave the grant back",
        lost_at - server_end
    );
    // And the unit came back to others.
    until("the unit is free again", || async {
        match sem.try_acquire().await {
            Ok(next) => next.release().await.is_ok(),
            Err(_) => false,
        }
    })
    .await;
}
