//! The same primitives on a 3-master Redis Cluster: every script lands on the node that owns
//! its semaphore's hash tag, and wake-ups cross nodes through cluster-wide pub/sub.

use std::time::{Duration, Instant};

use redsem::{Error, Redsem, RedsemOptions};

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lease_semaphores_work_on_every_node_of_a_cluster() {
    let ctx = TestContext::on_cluster(
        "it::cluster::lease_semaphores_work_on_every_node_of_a_cluster",
        false,
    )
    .await;
    let a = &ctx.redsem;
    let b = ctx.client().await;
    // Names spread over the three nodes.
    let names: Vec<String> = (0..6).map(|i| format!("jobs-{i}")).collect();
    hand_off_on_every_node(a, &b, &names).await;
    let mut listed = within(LIMIT, "names", a.lease_semaphore_names())
        .await
        .expect("names on every primary");
    listed.sort();
    assert_eq!(listed, names);
}

/// A cluster whose nodes serve TLS with a private CA: the root certificate given to the client
/// is trusted for every node it finds through the seeds (scripts, the pub/sub wake-ups and the
/// connect-time checks of every primary), and without it the connection is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_is_used_with_a_given_root_certificate() {
    if skip_without(
        Needs::Tls,
        "a_tls_cluster_is_used_with_a_given_root_certificate",
        "starts a TLS cluster",
    ) {
        return;
    }
    let tls = redsem_test::TlsRedisCluster::start(3);
    let options = RedsemOptions::default()
        .prefix("tls")
        .tls_root_cert(tls.ca_cert());
    let a = within(
        LIMIT,
        "connect to the TLS cluster",
        connect_with(&tls.tls_url(), options.clone()),
    )
    .await
    .expect("connect over TLS with the root certificate");
    let b = within(
        LIMIT,
        "connect a second client",
        connect_with(&tls.tls_url(), options),
    )
    .await
    .expect("a second client");
    // Names spread over the three nodes; on each, a waiter of the other client is woken.
    let names: Vec<String> = (0..6).map(|i| format!("jobs-{i}")).collect();
    hand_off_on_every_node(&a, &b, &names).await;

    // Without trusting the certificate, the connection is refused (not a usage error).
    let err = within(
        LIMIT,
        "connect without the root certificate",
        connect_with(&tls.tls_url(), RedsemOptions::default()),
    )
    .await
    .expect_err("an untrusted self-signed certificate");
    assert!(!err.is_invalid_argument(), "{err:?}");
}

/// Every node of a TLS cluster restarted without persistence (its state and the function
/// library gone, its slots kept in nodes.conf): the client reconnects to each node over TLS
/// with the root certificate it was given, loads the library again, and grants again with
/// larger tokens.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_is_used_again_after_its_nodes_restart() {
    if skip_without(
        Needs::Tls,
        "a_tls_cluster_is_used_again_after_its_nodes_restart",
        "starts a TLS cluster",
    ) {
        return;
    }
    let mut tls = redsem_test::TlsRedisCluster::start(3);
    let options = RedsemOptions::default()
        .prefix("tls")
        .tls_root_cert(tls.ca_cert());
    let redsem = within(LIMIT, "connect", connect_with(&tls.tls_url(), options))
        .await
        .expect("connect over TLS with the root certificate");
    let names: Vec<String> = (0..6).map(|i| format!("jobs-{i}")).collect();
    let mut before = Vec::new();
    for name in &names {
        let sem = redsem.lease_semaphore(name, 1).expect("semaphore");
        let permit = within(LIMIT, "try_acquire", sem.try_acquire())
            .await
            .expect("a free unit");
        before.push(permit.token());
        permit.release().await.expect("release");
    }

    for node in tls.cluster.nodes_mut() {
        node.restart();
    }

    for (name, token) in names.iter().zip(before) {
        let sem = redsem.lease_semaphore(name, 1).expect("semaphore");
        // Refused or CLUSTERDOWN while the nodes find each other again.
        let permit = retry(
            "a grant on the restarted node",
            |e| e.is_unavailable() || matches!(e, redsem::Error::Redis(_)),
            || sem.try_acquire(),
        )
        .await;
        assert!(permit.token() > token, "{name}: tokens keep increasing");
        permit.release().await.expect("release");
    }
}

/// On each of `names` (spread over the nodes): `a` holds its one unit, `b` is refused, then
/// waits, and is woken by `a`'s release (the message, not the timer) with a larger token.
async fn hand_off_on_every_node(a: &Redsem, b: &Redsem, names: &[String]) {
    for name in names {
        let sem_a = a
            .lease_semaphore_with(name, 1, short(2_000))
            .expect("semaphore");
        let sem_b = b
            .lease_semaphore_with(name, 1, short(2_000))
            .expect("semaphore");
        let held = within(LIMIT, "try_acquire", sem_a.try_acquire())
            .await
            .expect("free");
        let first_token = held.token();
        assert!(
            sem_b
                .try_acquire()
                .await
                .expect_err("held")
                .is_not_acquired()
        );
        let waiter = tokio::spawn(async move { sem_b.acquire().await });
        within(LIMIT, "queued", async {
            while sem_a.status().await.expect("status").waiters.len() != 1 {
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        })
        .await;
        let released = tokio::time::Instant::now();
        held.release().await.expect("release");
        let next = within(LIMIT, "hand-off across clients", waiter)
            .await
            .expect("task")
            .expect("granted");
        assert!(
            released.elapsed() < Duration::from_millis(500),
            "{name}: woken by the message, not the timer: {:?}",
            released.elapsed()
        );
        assert!(next.token() > first_token, "{name}: tokens keep increasing");
        next.release().await.expect("release");
    }
}

/// How a node of a cluster fails over in [`across_a_node_failover`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    /// `CLUSTER FAILOVER` on its replica: the master stops taking writes until the replica has
    /// them all, then they swap roles.
    Manual,
    /// The master is killed (`SIGKILL`); its replica is elected after the node timeout (2 s),
    /// and the killed node is started again afterwards (it rejoins as a replica).
    Kill,
}

/// What a lease semaphore does across a failover of the node serving it, inside a cluster
/// with one replica per master: a holder across it, the first grant after it, tokens, and the
/// limit. Returns whether the holder kept its permit.
///
/// The holder's lease outlasts the failover (1.5 s for a manual one, 30 s when the master is
/// killed: the replica is elected after the 2 s node timeout, and with replica acks nothing is
/// renewed until the restarted node has synced from the new master, 5 s after it asks, by
/// `repl-diskless-sync-delay`; with 15 s the test once failed on a loaded CI machine). The holder then asks the new master with a refresh. With replica acks the killed node is started again as soon as its
/// replica took over: until it follows the new master as its replica, nothing acknowledges a
/// change there.
async fn across_a_node_failover(label: &str, options: RedsemOptions, fault: Fault) -> bool {
    let mut cluster = redsem_test::RedisCluster::start_with_replicas(3);
    let urls = cluster.urls();
    let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
    let acks = options.replica_acks.is_some();
    let redsem = within(
        LIMIT,
        "connect to the cluster",
        Redsem::connect_cluster_with(&seeds, options.prefix("t")),
    )
    .await
    .expect("connect to the cluster with replicas");
    let key = "t:{lease:fo}:state";
    let lease = match fault {
        Fault::Manual => 1_500,
        Fault::Kill => 30_000,
    };
    let sem = redsem
        .lease_semaphore_with("fo", 2, short(lease))
        .expect("semaphore");
    let mut highest = 0;
    for _ in 0..5 {
        let permit = within(LIMIT, "try_acquire", sem.try_acquire())
            .await
            .expect("a free unit");
        highest = highest.max(permit.token().get());
        permit.release().await.expect("release");
    }
    let held = within(LIMIT, "try_acquire", sem.try_acquire())
        .await
        .expect("the holder across the failover");
    highest = highest.max(held.token().get());

    let faulted = Instant::now();
    let (old, new) = match fault {
        Fault::Manual => {
            let old = cluster.node_for_key(key).port();
            (old, cluster.failover_for_key(key))
        }
        Fault::Kill => {
            let old = cluster.kill_owner_of(key);
            (
                old,
                cluster.wait_key_moved(key, old, Duration::from_secs(30)),
            )
        }
    };
    let moved_after = faulted.elapsed();
    let restarted = (fault == Fault::Kill && acks).then(|| {
        if let Some(node) = cluster.nodes_mut().iter_mut().find(|n| n.port() == old) {
            node.restart();
        }
        faulted.elapsed()
    });

    // The first grant after the failover (refusals meanwhile: a node down, CLUSTERDOWN, MOVED
    // being followed, a grant not acknowledged by a replica).
    let mut refusals = std::collections::BTreeMap::<String, usize>::new();
    let after = within(
        Duration::from_secs(40),
        "a grant after the failover",
        async {
            loop {
                match sem.try_acquire().await {
                    Ok(permit) => break permit,
                    Err(err) => {
                        let kind = format!("{err:?}")
                            .split(['(', ' ', '{'])
                            .next()
                            .unwrap_or_default()
                            .to_owned();
                        *refusals.entry(kind).or_default() += 1;
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        },
    )
    .await;
    let first_grant = faulted.elapsed();
    assert!(
        after.token().get() > highest,
        "[{label}] tokens keep increasing: {} after {highest}",
        after.token()
    );
    // The holder: asked the new master now (its own renewal may be a third of a lease away).
    // Held there, or told it lost its permit, with `lost()` fired.
    let kept = match within(LIMIT, "refresh", held.refresh()).await {
        Ok(()) => true,
        Err(err) if err.is_not_held() => false,
        Err(err) => panic!("[{label}] the holder's refresh on the new master: {err:?}"),
    };
    let lost = tokio::time::timeout(Duration::from_millis(100), held.lost())
        .await
        .is_ok();
    assert_eq!(
        lost, !kept,
        "[{label}] lost() fired exactly if the permit was lost"
    );
    assert_eq!(
        held.is_held(),
        kept,
        "[{label}] is_held() after the refresh"
    );
    // The limit across the failover: with the holder kept, both units are taken.
    let third = sem.try_acquire().await;
    if kept {
        assert!(
            third.as_ref().is_err_and(Error::is_not_acquired),
            "[{label}] a third unit of two: {third:?}"
        );
    }
    eprintln!(
        "cluster node failover [{label}, {fault:?}]: master {old} -> {new} agreed {moved_after:?} \
         after the fault; first grant {first_grant:?} after the fault (refused meanwhile: \
         {refusals:?}; killed node started again at {restarted:?}); token {} after {highest}; \
         holder across it: kept {kept}, lost() {lost}; third unit of two: {:?}",
        after.token(),
        third.as_ref().map(|p| p.token()).map_err(|e| e.to_string()),
    );
    drop(third);
    after.release().await.expect("release on the new master");
    if kept {
        held.release().await.expect("the kept holder releases");
    }
    kept
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_inside_a_cluster_keeps_every_grant() {
    let kept = across_a_node_failover("no acks", RedsemOptions::default(), Fault::Manual).await;
    assert!(
        kept,
        "CLUSTER FAILOVER loses no write: the holder keeps its permit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manual_failover_inside_a_cluster_with_replica_acks_keeps_every_grant() {
    let acks = RedsemOptions::default().replica_acks(1, Duration::from_secs(1));
    let kept = across_a_node_failover("acks 1, 1 s", acks, Fault::Manual).await;
    assert!(
        kept,
        "CLUSTER FAILOVER loses no write: the holder keeps its permit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_inside_a_cluster_is_replaced_by_its_replica() {
    // Without acks the holder's grant may not have reached the replica: it keeps its permit or
    // is told (`lost()`); either way the asserts above hold.
    across_a_node_failover("no acks", RedsemOptions::default(), Fault::Kill).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_master_inside_a_cluster_with_replica_acks_loses_no_grant() {
    let acks = RedsemOptions::default().replica_acks(1, Duration::from_secs(1));
    let kept = across_a_node_failover("acks 1, 1 s", acks, Fault::Kill).await;
    assert!(
        kept,
        "a grant acknowledged by the replica survives the master's death"
    );
}
