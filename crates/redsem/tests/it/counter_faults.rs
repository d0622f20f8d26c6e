//! Faults of the permit semaphore and the countdown latch, each reproduced on throwaway
//! servers (see `redsem-test`): data loss (restart, flush, failover to a replica that missed
//! writes), resent requests on a cluster, a user without channel rights, eviction, and a
//! stale wake-up.

use std::time::Duration;

use redsem::{
    CountDownLatch, Error, LatchOptions, PermitOptions, PermitSemaphore, Redsem, RedsemOptions,
    ServerChecks,
};
use redsem_test::{FaultProxy, RedisServer};
use tokio::task::JoinHandle;

use crate::support::connect_url as connect;
use crate::support::{
    Frozen, LIMIT, TestContext, cluster_behind_proxies, connect_with, queued, raw_connection,
    retry, until, within,
};

fn quick_latch(redsem: &Redsem, name: &str) -> CountDownLatch {
    let options = LatchOptions::default().recheck(Duration::from_millis(100));
    redsem.count_down_latch_with(name, options).expect("latch")
}

fn quick_permits(redsem: &Redsem, name: &str) -> PermitSemaphore {
    let options = PermitOptions::default().waiter_lease(Duration::from_millis(300));
    redsem
        .permit_semaphore_with(name, options)
        .expect("semaphore")
}

fn spawn_wait(latch: &CountDownLatch) -> JoinHandle<redsem::Result<()>> {
    let latch = latch.clone();
    tokio::spawn(async move { latch.wait().await })
}

fn spawn_acquire(sem: &PermitSemaphore, permits: u32) -> JoinHandle<redsem::Result<()>> {
    let sem = sem.clone();
    tokio::spawn(async move { sem.acquire(permits).await })
}

async fn finished<T>(task: JoinHandle<T>, what: &str) -> T {
    within(LIMIT, what, task).await.expect("task ran")
}

/// A waiter of `latch` that listens on `channel` of `server`.
async fn listening_wait(
    server: &RedisServer,
    latch: &CountDownLatch,
    channel: &str,
) -> JoinHandle<redsem::Result<()>> {
    let waiter = spawn_wait(latch);
    until("the waiter listens", || async {
        subscribers(server, channel).await == 1
    })
    .await;
    waiter
}

/// A request for one permit of `sem` (named `name`), queued on `server`.
async fn queued_acquire(
    server: &RedisServer,
    sem: &PermitSemaphore,
    name: &str,
) -> JoinHandle<redsem::Result<()>> {
    let waiter = spawn_acquire(sem, 1);
    until("the waiter queued", || async {
        queued(server, name).await == 1
    })
    .await;
    waiter
}

/// A raw command on a fresh connection to `server`.
async fn raw<T: redis::FromRedisValue>(server: &RedisServer, cmd: &redis::Cmd) -> T {
    let mut conn = raw_connection(server).await;
    cmd.query_async(&mut conn).await.expect("raw command")
}

async fn subscribers(server: &RedisServer, channel: &str) -> u64 {
    let reply: (String, u64) = raw(server, redis::cmd("PUBSUB").arg("NUMSUB").arg(channel)).await;
    reply.1
}

/// Write filler keys with a TTL (candidates for `volatile-*` eviction) until `at_least` keys
/// were evicted; returns how many were.
async fn evict(server: &RedisServer, at_least: u64) -> u64 {
    let mut conn = raw_connection(server).await;
    let before = server.evicted_keys();
    let filler = "x".repeat(1000);
    within(LIMIT, "filling until keys are evicted", async {
        let mut n = 0_u64;
        while server.evicted_keys() - before < at_least {
            let mut pipe = redis::pipe();
            for _ in 0..500 {
                n += 1;
                pipe.cmd("SET")
                    .arg(format!("filler:{n}"))
                    .arg(&filler)
                    .arg("EX")
                    .arg(3600)
                    .ignore();
            }
            let () = pipe.query_async(&mut conn).await.expect("fillers");
        }
    })
    .await;
    server.evicted_keys() - before
}

fn is_state_lost(result: &redsem::Result<()>) -> bool {
    matches!(result, Err(Error::StateLost { .. }))
}

/// A failover seen from clients that keep their address: `replica` is promoted, then the
/// server at `primary`'s port (which `proxy` fronts, refusing connections meanwhile) becomes
/// a replica of it, syncs, and is promoted: it then holds exactly what `replica` had.
fn fail_over_in_place(primary: &RedisServer, replica: &RedisServer, proxy: &FaultProxy) {
    proxy.set_refusing(true);
    proxy.cut_all();
    // (promote() also lets the old primary resync from it at once.)
    replica.promote();
    let () = redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut replica.connection())
        .expect("CLIENT UNPAUSE");
    let () = redis::cmd("REPLICAOF")
        .arg("127.0.0.1")
        .arg(replica.port())
        .query(&mut primary.connection())
        .expect("REPLICAOF");
    primary.wait_replicated_from(replica);
    primary.promote();
    proxy.set_refusing(false);
}

/// The replica stops applying its primary's writes (they are dropped if it is promoted).
fn hold_back_writes(replica: &RedisServer) {
    let () = redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(60_000)
        .arg("WRITE")
        .query(&mut replica.connection())
        .expect("CLIENT PAUSE");
}

#[tokio::test]
async fn a_latch_waiter_is_told_of_lost_state_after_a_restart_and_after_a_flush() {
    // A past defect: a latch waiter was released as if the latch had opened when its keys vanished.
    let mut ctx = TestContext::start().await;
    let latch = quick_latch(&ctx.redsem, "boot");
    let channel = "t:{latch:boot}:opened";

    assert!(latch.try_set_count(2).await.expect("set"));
    let waiter = listening_wait(&ctx.server, &latch, channel).await;
    ctx.server.restart();
    let after_restart = finished(waiter, "the waiter after a restart").await;
    println!("latch waiter after a restart without persistence: {after_restart:?}");
    assert!(is_state_lost(&after_restart), "{after_restart:?}");

    let set = retry("set again", Error::is_unavailable, || {
        latch.try_set_count(2)
    })
    .await;
    assert!(set, "the count is gone: set again");
    let waiter = listening_wait(&ctx.server, &latch, channel).await;
    ctx.server.flushall();
    let after_flush = finished(waiter, "the waiter after FLUSHALL").await;
    println!("latch waiter after FLUSHALL: {after_flush:?}");
    assert!(is_state_lost(&after_flush), "{after_flush:?}");

    // Opening and deleting still release waiters.
    latch.try_set_count(1).await.expect("set");
    let opened = listening_wait(&ctx.server, &latch, channel).await;
    latch.count_down().await.expect("count down");
    finished(opened, "opened")
        .await
        .expect("released by the opening");
    latch.try_set_count(1).await.expect("set");
    let deleted = listening_wait(&ctx.server, &latch, channel).await;
    assert!(latch.delete().await.expect("delete"));
    finished(deleted, "deleted")
        .await
        .expect("released by the delete");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_latch_waiter_is_told_of_lost_state_after_a_failover_to_a_replica_that_missed_the_set() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary);
    let proxy = FaultProxy::start(primary.port());
    let redsem = connect(&proxy.url()).await;
    let latch = quick_latch(&redsem, "deploy");
    hold_back_writes(&replica);
    assert!(
        latch
            .try_set_count(3)
            .await
            .expect("set on the primary only")
    );
    let waiter = listening_wait(&primary, &latch, "t:{latch:deploy}:opened").await;

    fail_over_in_place(&primary, &replica, &proxy);
    let result = finished(waiter, "the waiter after the failover").await;
    println!("latch waiter after a failover that lost the set: {result:?}");
    assert!(is_state_lost(&result), "{result:?}");
}

#[tokio::test]
async fn a_permit_waiter_is_never_granted_from_nothing_after_a_restart_or_a_flush() {
    let mut ctx = TestContext::start().await;
    let sem = quick_permits(&ctx.redsem, "gpu");
    let other = ctx.client().await;
    let waiting = quick_permits(&other, "gpu");
    for loss in ["restart", "flush"] {
        sem.try_set_permits(0).await.expect("set");
        let waiter = queued_acquire(&ctx.server, &waiting, "gpu").await;
        match loss {
            "restart" => ctx.server.restart(),
            _ => ctx.server.flushall(),
        }
        // The count is gone: 0 available, never set. The waiter queues again and waits.
        let available = retry("available_permits", Error::is_unavailable, || {
            sem.available_permits()
        })
        .await;
        assert_eq!(available, 0, "after a {loss}");
        until("the waiter queued again", || async {
            queued(&ctx.server, "gpu").await == 1
        })
        .await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiter.is_finished(), "granted from nothing after a {loss}");
        assert!(
            sem.try_set_permits(1).await.expect("set again"),
            "after a {loss} the count is not set"
        );
        finished(waiter, "the re-queued waiter")
            .await
            .expect("served once permits are set");
        assert_eq!(sem.available_permits().await.expect("available"), 0);
        sem.delete().await.expect("delete");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_waiter_whose_place_a_failover_lost_queues_again_and_is_served() {
    let primary = RedisServer::start();
    let replica = RedisServer::start_replica_of(&primary);
    let proxy = FaultProxy::start(primary.port());
    let redsem = connect(&proxy.url()).await;
    // A waiter lease longer than the failover takes: the waiter rides it out (a waiter cut
    // off for longer than its waiter lease fails with Unavailable, see wait_faults).
    let sem = redsem
        .permit_semaphore_with(
            "disk",
            PermitOptions::default().waiter_lease(Duration::from_secs(5)),
        )
        .expect("semaphore");
    assert!(sem.try_set_permits(0).await.expect("set"));
    replica.wait_replicated_from(&primary);
    hold_back_writes(&replica);
    let waiter = spawn_acquire(&sem, 1);
    until("the waiter queued on the primary", || async {
        queued(&primary, "disk").await == 1
    })
    .await;

    fail_over_in_place(&primary, &replica, &proxy);
    until("the waiter queued again on the new primary", || async {
        queued(&primary, "disk").await == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!waiter.is_finished(), "granted from nothing");
    assert_eq!(sem.available_permits().await.expect("available"), 0);
    sem.release(1).await.expect("release");
    let result = finished(waiter, "the waiter").await;
    println!("permit waiter across a failover that lost its place: {result:?}");
    result.expect("served by the release on the new primary");
    assert_eq!(sem.available_permits().await.expect("available"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_channel_rights_still_releases_and_counts_down_and_waiters_are_served() {
    // A past defect: PUBLISH refused by the ACL failed the script after it had written.
    let server = RedisServer::start();
    let () = raw(
        &server,
        redis::cmd("ACL").arg(&[
            "SETUSER",
            "nochannels",
            "on",
            ">pw",
            "~*",
            "+@all",
            "resetchannels",
        ]),
    )
    .await;
    let url = format!("redis://nochannels:pw@127.0.0.1:{}/", server.port());
    let options = RedsemOptions::default()
        .prefix("t")
        .server_checks(ServerChecks::Warn);
    let limited = connect_with(&url, options)
        .await
        .expect("connect with a warning");

    let sem = quick_permits(&limited, "acl");
    sem.try_set_permits(0).await.expect("set");
    let waiter = queued_acquire(&server, &sem, "acl").await;
    let released = sem.release(1).await;
    println!("release by a user without channel rights: {released:?}");
    released.expect("applied, and answered");
    finished(waiter, "the waiter (timer re-check)")
        .await
        .expect("served");
    assert_eq!(sem.available_permits().await.expect("available"), 0);

    let latch = quick_latch(&limited, "acl");
    latch.try_set_count(1).await.expect("set");
    let waiter = spawn_wait(&latch);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let counted = latch.count_down().await;
    println!("count_down by a user without channel rights: {counted:?}");
    counted.expect("applied, and answered");
    finished(waiter, "the latch waiter (timer re-check)")
        .await
        .expect("released");
    assert_eq!(
        latch.state().await.expect("state"),
        redsem::LatchState::Done
    );
}

#[tokio::test]
async fn a_drain_a_release_and_a_count_down_resent_on_a_cluster_are_applied_once() {
    // A past defect: the cluster client resends a request after a lost reply; a drain without a
    // request id then took twice and answered what the second took.
    let (cluster, redsem) = cluster_behind_proxies().await;
    let sem = redsem.permit_semaphore("resend").expect("semaphore");
    let latch = redsem.count_down_latch("resend").expect("latch");
    // Load every script on the nodes first, so each lost reply is the one of the real call.
    sem.try_set_permits(0).await.expect("warm");
    sem.drain_permits().await.expect("warm");
    sem.release(1).await.expect("warm");
    sem.try_acquire(1).await.expect("warm");
    latch.try_set_count(3).await.expect("warm");
    latch.count_down().await.expect("warm");
    sem.release(5).await.expect("release");

    let proxy = cluster.proxy_for_key("t:{permits:resend}:count");
    proxy.drop_reply_after(b"{permits:resend}");
    let drained = within(LIMIT, "drain through a lost reply", sem.drain_permits())
        .await
        .expect("drained");
    assert_eq!(
        proxy.triggered(),
        1,
        "the reply was lost and the request resent"
    );
    println!("a drain of 5 resent after a lost reply answered {drained}");
    assert_eq!(drained, 5);

    proxy.drop_reply_after(b"{permits:resend}");
    within(LIMIT, "release through a lost reply", sem.release(2))
        .await
        .expect("released");
    proxy.drop_reply_after(b"{permits:resend}");
    within(
        LIMIT,
        "try_acquire through a lost reply",
        sem.try_acquire(1),
    )
    .await
    .expect("taken once");
    assert_eq!(proxy.triggered(), 3);
    assert_eq!(sem.available_permits().await.expect("available"), 1);

    let proxy = cluster.proxy_for_key("t:{latch:resend}:count");
    proxy.drop_reply_after(b"{latch:resend}");
    within(LIMIT, "count_down through a lost reply", latch.count_down())
        .await
        .expect("counted");
    assert!(proxy.triggered() >= 1);
    assert_eq!(latch.count().await.expect("count"), 1, "counted once");
}

#[tokio::test]
async fn volatile_lru_eviction_never_takes_a_live_permit_queue_or_a_counting_latch() {
    // A past defect: the bookkeeping of waiting requests and the remembered count-downs carried
    // TTLs, so volatile-* eviction could drop them.
    let server = RedisServer::start_with_eviction("volatile-lru", "4mb");
    let redsem = connect(&server.url()).await;
    let other = connect(&server.url()).await;
    let sem = redsem
        .permit_semaphore_with(
            "live",
            PermitOptions::default().waiter_lease(Duration::from_secs(30)),
        )
        .expect("semaphore");
    sem.try_set_permits(0).await.expect("set");
    let waiting = other
        .permit_semaphore_with(
            "live",
            PermitOptions::default().waiter_lease(Duration::from_secs(30)),
        )
        .expect("semaphore");
    let waiter = queued_acquire(&server, &waiting, "live").await;
    let latch = redsem.count_down_latch("live").expect("latch");
    latch.try_set_count(3).await.expect("set");
    latch.count_down().await.expect("count down");
    // (LRU idle times count in seconds: make ours the idlest.)
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let evicted = evict(&server, 3000).await;
    let keys: Vec<String> = raw(&server, redis::cmd("KEYS").arg("t:*")).await;
    println!("after {evicted} evictions, redsem keys left: {keys:?}");
    assert_eq!(queued(&server, "live").await, 1, "the waiter's place");
    for part in ["queue", "waiters", "records"] {
        let key = format!("t:{{permits:live}}:{part}");
        assert!(keys.contains(&key), "{key} evicted");
    }
    for part in ["applied", "sessions"] {
        let key = format!("t:{{latch:live}}:{part}");
        assert!(keys.contains(&key), "{key} evicted");
    }
    sem.release(1).await.expect("release");
    finished(waiter, "the waiter").await.expect("served");
    assert_eq!(
        latch.state().await.expect("state"),
        redsem::LatchState::Counting(2)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_waiter_that_lost_its_place_is_not_served_by_an_old_wake_up() {
    // A past defect, for the permit semaphore: a waiter stalled past its waiter lease while
    // permits were handed to it (and given back when the lease ran out) queues again; the
    // old wake-up in its mailbox must not make it return while another client holds the only
    // permit. (A permit waiter always collects by a poll, and queues again under a new id.)
    let server = RedisServer::start();
    let waiter = Frozen::spawn(server.url(), |redsem| async move {
        let sem = quick_permits(&redsem, "one");
        let got = sem.acquire_timeout(1, LIMIT).await;
        if got.is_ok() {
            let _ = sem.release(1).await;
        }
        got.map_err(|e| e.to_string())
    });
    let redsem = connect(&server.url()).await;
    let sem = quick_permits(&redsem, "one");
    sem.try_set_permits(1).await.expect("set");
    sem.try_acquire(1).await.expect("the holder");
    waiter.start();
    until("the waiter queued", || async {
        queued(&server, "one").await == 1
    })
    .await;
    // Freeze the waiter, hand it the permit, and let its waiter lease run out meanwhile.
    waiter.freeze(Duration::from_millis(1_500));
    tokio::time::sleep(Duration::from_millis(50)).await;
    sem.release(1).await.expect("release to the waiter");
    retry(
        "another request takes the permit given back",
        Error::is_not_acquired,
        || sem.try_acquire(1),
    )
    .await;
    // The waiter wakes up while the only permit is taken: it must not return.
    tokio::time::sleep(Duration::from_millis(1_800)).await;
    if let Some(early) = waiter.returned() {
        panic!("the waiter returned while the only permit was taken: {early:?}");
    }
    assert_eq!(sem.available_permits().await.expect("available"), 0);
    sem.release(1).await.expect("release");
    assert_eq!(waiter.finish().await, Ok(()));
}

/// A permit release in flight when the server restarts meets `LOADING` while the server
/// reads its data back: it is sent again (same id) until the server has loaded, not given up
/// with its permits (a permit semaphore has no lease to bring them back). Found by the soak.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_release_that_meets_loading_after_a_restart_is_applied_once_loaded() {
    let server = RedisServer::start();
    let redsem = connect(&server.url()).await;
    let sem = redsem.permit_semaphore("p").expect("semaphore");
    sem.try_set_permits(1).await.expect("set");
    sem.try_acquire(1).await.expect("take the one permit");
    let restart = restart_into_loading(server).await;
    let released = within(Duration::from_secs(40), "release", sem.release(1)).await;
    let _server = within(Duration::from_secs(40), "restart", restart)
        .await
        .expect("restart");
    released.expect("the release, sent again until the server loaded");
    assert_eq!(sem.available_permits().await.expect("available"), 1);
}

/// A waiting lease acquire that meets `LOADING` (the server restarted and reads its data
/// back) checks in again until the server has loaded, within its waiter lease, instead of
/// failing with `Error::Redis`. Found by the soak's long run (28 acquires failed so).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_acquire_that_meets_loading_after_a_restart_is_queued_once_loaded() {
    let server = RedisServer::start();
    let redsem = connect(&server.url()).await;
    let options = redsem::LeaseOptions::default().waiter_lease(Duration::from_secs(30));
    let sem = redsem
        .lease_semaphore_with("s", 1, options)
        .expect("semaphore");
    drop(sem.status().await.expect("status"));
    let restart = restart_into_loading(server).await;
    let acquired = within(Duration::from_secs(40), "acquire", sem.acquire()).await;
    let _server = within(Duration::from_secs(40), "restart", restart)
        .await
        .expect("restart");
    let permit = acquired.expect("the acquire, checked in again until the server loaded");
    assert_eq!(sem.status().await.expect("status").in_use, 1);
    permit.release().await.expect("release");
}

/// Give `server` a dataset that takes a moment to load (3 million keys, saved), restart it,
/// and return once it answers `LOADING`; the restart's task hands the server back.
async fn restart_into_loading(mut server: RedisServer) -> tokio::task::JoinHandle<RedisServer> {
    let mut conn = server.connection();
    let () = redis::cmd("DEBUG")
        .arg("POPULATE")
        .arg(3_000_000)
        .query(&mut conn)
        .expect("DEBUG POPULATE");
    let () = redis::cmd("SAVE").query(&mut conn).expect("SAVE");
    let port = server.port();
    let restart = tokio::task::spawn_blocking(move || {
        server.restart();
        server
    });
    let loading = || {
        let client = redis::Client::open(format!("redis://127.0.0.1:{port}/")).expect("client");
        let Ok(mut conn) = client.get_connection_with_timeout(Duration::from_millis(200)) else {
            return false;
        };
        let ping: redis::RedisResult<String> = redis::cmd("PING").query(&mut conn);
        matches!(ping, Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading))
    };
    let seen = async {
        while !tokio::task::block_in_place(loading) {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    };
    within(LIMIT, "the restarted server loading its data", seen).await;
    restart
}
