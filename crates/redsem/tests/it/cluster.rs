//! The same primitives on a 3-master Redis Cluster: every script lands on the node that owns
//! its semaphore's hash tag, and wake-ups cross nodes through cluster-wide pub/sub.

use std::time::Duration;

use redsem::{Redsem, RedsemOptions};

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
