//! Fair shares between tenants through the public API: a handle per tenant
//! (`LeaseSemaphore::for_tenant`), the status per tenant, a conflicting weight.

use redsem::{Error, Tenant, TenantStatus};

use crate::support::*;

/// The status's tenants as (name, held, waiters, weight, cap).
async fn tenants(sem: &redsem::LeaseSemaphore) -> Vec<(String, u64, u64, u32, Option<u32>)> {
    let status = within(LIMIT, "status", sem.status()).await.expect("status");
    status
        .tenants
        .iter()
        .map(|t: &TenantStatus| (t.name.clone(), t.held, t.waiters, t.weight, t.cap))
        .collect()
}

both_topologies!(a_tenant_behind_a_flood_is_served_at_the_next_release);
async fn a_tenant_behind_a_flood_is_served_at_the_next_release(ctx: &TestContext<Topology>) {
    let sem = ctx.redsem.lease_semaphore("shared", 2).expect("semaphore");
    let flood = sem.for_tenant(Tenant::new("flood")).expect("flood");
    let quiet = sem
        .for_tenant(Tenant::new("quiet").weight(2))
        .expect("quiet");
    let first = within(LIMIT, "acquire", flood.acquire())
        .await
        .expect("first");
    let _second = within(LIMIT, "acquire", flood.acquire())
        .await
        .expect("second");
    let mut queued = Vec::new();
    for _ in 0..3 {
        let flood = flood.clone();
        queued.push(tokio::spawn(async move { flood.acquire().await }));
    }
    until("the flood queues", || async {
        tenants(&sem).await.first().map(|t| t.2) == Some(3)
    })
    .await;
    let behind = tokio::spawn({
        let quiet = quiet.clone();
        async move { quiet.acquire().await }
    });
    until("the quiet tenant queues", || async {
        tenants(&sem).await.len() == 2
    })
    .await;
    assert_eq!(
        tenants(&sem).await,
        [
            ("flood".to_owned(), 2, 3, 1, None),
            ("quiet".to_owned(), 0, 1, 2, None)
        ]
    );
    within(LIMIT, "release", first.release())
        .await
        .expect("release");
    let permit = within(LIMIT, "the quiet tenant's grant", behind)
        .await
        .expect("join")
        .expect("quiet acquires");
    assert_eq!(
        tenants(&sem).await,
        [
            ("flood".to_owned(), 1, 3, 1, None),
            ("quiet".to_owned(), 1, 0, 2, None)
        ]
    );
    let status = within(LIMIT, "status", sem.status()).await.expect("status");
    assert!(
        status
            .holders
            .iter()
            .any(|h| h.tenant.as_deref() == Some("quiet") && h.token == permit.token())
    );
    for task in queued {
        task.abort();
    }
}

both_topologies!(a_tenant_named_with_another_weight_while_live_is_a_conflict);
async fn a_tenant_named_with_another_weight_while_live_is_a_conflict(ctx: &TestContext<Topology>) {
    let sem = ctx.redsem.lease_semaphore("weights", 4).expect("semaphore");
    let held = within(
        LIMIT,
        "acquire",
        sem.for_tenant(Tenant::new("acme").weight(2).cap(3))
            .expect("tenant")
            .try_acquire(),
    )
    .await
    .expect("held");
    let other = sem
        .for_tenant(Tenant::new("acme").weight(5))
        .expect("tenant");
    match within(LIMIT, "conflict", other.try_acquire()).await {
        Err(Error::TenantConflict {
            tenant,
            requested_weight: 5,
            requested_cap: None,
            weight: 2,
            cap: Some(3),
            ..
        }) => assert_eq!(tenant, "acme"),
        other => panic!("expected a tenant conflict, got {other:?}"),
    }
    within(LIMIT, "release", held.release())
        .await
        .expect("release");
    // Nobody holds or waits for it now: the new setting is adopted.
    let _adopted = within(LIMIT, "acquire", other.try_acquire())
        .await
        .expect("adopted");
    assert!(matches!(
        sem.for_tenant(Tenant::new("")),
        Err(Error::InvalidArgument(_))
    ));
}
