//! Fair shares between tenants (lua/lease/tenants.lua), each ordering rule planted exactly:
//! the lowest held / weight is granted first, ties go to the earliest head, first in first
//! out within a tenant, the turn is never overtaken, a tenant at its cap is skipped, a tenant
//! alone uses every unit; weights and caps conflict visibly; nothing is left behind.

use super::support::*;
use crate::types::Tenant;

/// A request of `units` by `id` for `tenant` on a semaphore of capacity `cap`.
fn of<'a>(id: &'a str, tenant: &'a Tenant, cap: u32, units: u32, wait: bool) -> Request<'a> {
    Request {
        tenant: Some(tenant),
        ..req(id, cap, units, wait)
    }
}

/// Whether `id` holds (its check-in collects a grant), panicking if it neither holds nor
/// waits.
async fn holds(conn: &mut Conn, id: &str) -> bool {
    match poll(conn, id).await {
        Acquire::Granted { .. } => true,
        Acquire::Queued { .. } => false,
        other => panic!("{id}: {other:?}"),
    }
}

/// Queue `id` (it must queue).
#[track_caller]
fn queued(reply: Acquire) -> u64 {
    match reply {
        Acquire::Queued { position, .. } => position,
        other => panic!("expected to queue, got {other:?}"),
    }
}

#[tokio::test]
async fn the_tenant_holding_least_is_granted_before_an_earlier_waiter_of_one_holding_more() {
    let (_server, mut conn, k) = start().await;
    let (a, b) = (Tenant::new("a"), Tenant::new("b"));
    granted(acquire(&mut conn, of("a0", &a, 2, 1, true)).await);
    granted(acquire(&mut conn, of("a1", &a, 2, 1, true)).await);
    queued(acquire(&mut conn, of("a2", &a, 2, 1, true)).await);
    queued(acquire(&mut conn, of("b0", &b, 2, 1, true)).await);
    // a holds 1 after this, b 0: b's turn, though a2 came first.
    release(&mut conn, &k, "a0").await.expect("release");
    assert!(holds(&mut conn, "b0").await);
    assert!(!holds(&mut conn, "a2").await);
    release(&mut conn, &k, "a1").await.expect("release");
    assert!(holds(&mut conn, "a2").await);
}

#[tokio::test]
async fn weights_divide_the_units_held() {
    let (_server, mut conn, k) = start().await;
    let (heavy, light) = (Tenant::new("heavy").weight(3), Tenant::new("light"));
    // heavy holds 2 (2/3), light 1 (1/1); a default holder keeps the last unit.
    for id in ["h0", "h1"] {
        granted(acquire(&mut conn, of(id, &heavy, 4, 1, true)).await);
    }
    granted(acquire(&mut conn, of("l0", &light, 4, 1, true)).await);
    granted(acquire(&mut conn, req("d0", 4, 1, true)).await);
    queued(acquire(&mut conn, of("l1", &light, 4, 1, true)).await);
    queued(acquire(&mut conn, of("h2", &heavy, 4, 1, true)).await);
    release(&mut conn, &k, "d0").await.expect("release");
    assert!(holds(&mut conn, "h2").await, "2/3 < 1/1: heavy's turn");
    assert!(!holds(&mut conn, "l1").await);
    // heavy 2/3 after this, light 1/1, but only light waits: it is served (work-conserving).
    release(&mut conn, &k, "h0").await.expect("release");
    assert!(holds(&mut conn, "l1").await);
    // heavy 2/3 against light 1/1 again: h3 before l2, which came first.
    queued(acquire(&mut conn, of("l2", &light, 4, 1, true)).await);
    queued(acquire(&mut conn, of("h3", &heavy, 4, 1, true)).await);
    release(&mut conn, &k, "l0").await.expect("release");
    assert!(holds(&mut conn, "h3").await);
    assert!(!holds(&mut conn, "l2").await);
}

#[tokio::test]
async fn a_tie_goes_to_the_earliest_head() {
    let (_server, mut conn, k) = start().await;
    let (a, b) = (Tenant::new("a"), Tenant::new("b"));
    granted(acquire(&mut conn, req("d0", 1, 1, true)).await);
    queued(acquire(&mut conn, of("b0", &b, 1, 1, true)).await);
    queued(acquire(&mut conn, of("a0", &a, 1, 1, true)).await);
    release(&mut conn, &k, "d0").await.expect("release");
    assert!(
        holds(&mut conn, "b0").await,
        "both hold 0: the earlier head"
    );
    assert!(!holds(&mut conn, "a0").await);
}

#[tokio::test]
async fn first_in_first_out_within_a_tenant() {
    let (_server, mut conn, k) = start().await;
    let a = Tenant::new("a");
    granted(acquire(&mut conn, of("a0", &a, 1, 1, true)).await);
    for (n, id) in ["a1", "a2", "a3"].into_iter().enumerate() {
        assert_eq!(
            queued(acquire(&mut conn, of(id, &a, 1, 1, true)).await),
            n as u64
        );
    }
    for (gone, next) in [("a0", "a1"), ("a1", "a2"), ("a2", "a3")] {
        release(&mut conn, &k, gone).await.expect("release");
        assert!(holds(&mut conn, next).await, "{next} after {gone}");
    }
}

#[tokio::test]
async fn the_turn_is_never_overtaken_by_a_smaller_request_or_a_newcomer() {
    let (_server, mut conn, k) = start().await;
    let (a, b, c) = (Tenant::new("a"), Tenant::new("b"), Tenant::new("c"));
    granted(acquire(&mut conn, req("d0", 3, 2, true)).await);
    granted(acquire(&mut conn, of("b0", &b, 3, 1, true)).await);
    queued(acquire(&mut conn, of("a0", &a, 3, 2, true)).await);
    queued(acquire(&mut conn, of("b1", &b, 3, 1, true)).await);
    // One unit free; a (0 held, the earlier head) and b (0 held) tie: a's turn, its head
    // needs 2: nobody is granted, not b1, not a newcomer.
    release(&mut conn, &k, "b0").await.expect("release");
    assert!(!holds(&mut conn, "b1").await, "b1 overtook the turn");
    assert!(matches!(
        acquire(&mut conn, of("c0", &c, 3, 1, false)).await,
        Acquire::Busy { .. }
    ));
    release(&mut conn, &k, "d0").await.expect("release");
    assert!(holds(&mut conn, "a0").await);
    assert!(holds(&mut conn, "b1").await);
}

#[tokio::test]
async fn a_tenant_at_its_cap_is_skipped_and_served_again_when_it_gives_back() {
    let (_server, mut conn, k) = start().await;
    let (a, b) = (Tenant::new("a").cap(1), Tenant::new("b"));
    granted(acquire(&mut conn, of("a0", &a, 4, 1, true)).await);
    // Three units are free, but a is at its cap: a try is refused, a wait queues.
    assert!(matches!(
        acquire(&mut conn, of("a1", &a, 4, 1, false)).await,
        Acquire::Busy { .. }
    ));
    queued(acquire(&mut conn, of("a1", &a, 4, 1, true)).await);
    // b is granted at once, though a1 waits before it.
    granted(acquire(&mut conn, of("b0", &b, 4, 1, true)).await);
    granted(acquire(&mut conn, of("b1", &b, 4, 1, false)).await);
    release(&mut conn, &k, "a0").await.expect("release");
    assert!(holds(&mut conn, "a1").await);
    // More than its cap at once: refused as too big.
    assert_eq!(
        acquire(&mut conn, of("a2", &a, 4, 2, true)).await,
        Acquire::TooBig { capacity: 1 }
    );
}

#[tokio::test]
async fn a_capped_tenant_holding_least_is_skipped_for_the_next_one() {
    let (_server, mut conn, k) = start().await;
    let (a, b) = (Tenant::new("a").weight(10).cap(1), Tenant::new("b"));
    granted(acquire(&mut conn, of("a0", &a, 3, 1, true)).await);
    granted(acquire(&mut conn, of("b0", &b, 3, 1, true)).await);
    granted(acquire(&mut conn, req("d0", 3, 1, true)).await);
    queued(acquire(&mut conn, of("a1", &a, 3, 1, true)).await);
    queued(acquire(&mut conn, of("b1", &b, 3, 1, true)).await);
    // a holds 1/10, b 1/1, but a is at its cap: b1 is granted, a1 waits.
    release(&mut conn, &k, "d0").await.expect("release");
    assert!(holds(&mut conn, "b1").await);
    assert!(!holds(&mut conn, "a1").await, "a went past its cap");
}

#[tokio::test]
async fn a_tenant_alone_uses_every_unit() {
    let (_server, mut conn, k) = start().await;
    let (a, b) = (Tenant::new("a"), Tenant::new("b").cap(2));
    for id in ["a0", "a1", "a2"] {
        granted(acquire(&mut conn, of(id, &a, 3, 1, false)).await);
    }
    for id in ["a0", "a1", "a2"] {
        release(&mut conn, &k, id).await.expect("release");
    }
    for id in ["b0", "b1"] {
        granted(acquire(&mut conn, of(id, &b, 3, 1, false)).await);
    }
    // Up to its cap: the third unit stays free.
    queued(acquire(&mut conn, of("b2", &b, 3, 1, true)).await);
}

#[tokio::test]
async fn requests_naming_no_tenant_are_the_default_tenant_of_weight_1() {
    let (_server, mut conn, k) = start().await;
    let a = Tenant::new("a");
    granted(acquire(&mut conn, req("d0", 2, 1, true)).await);
    granted(acquire(&mut conn, req("d1", 2, 1, true)).await);
    queued(acquire(&mut conn, req("d2", 2, 1, true)).await);
    queued(acquire(&mut conn, of("a0", &a, 2, 1, true)).await);
    release(&mut conn, &k, "d0").await.expect("release");
    assert!(
        holds(&mut conn, "a0").await,
        "the default tenant holds 1, a 0"
    );
    let status = lease_status(&mut conn, &k).await.expect("status");
    let rows: Vec<(String, u64, u64, u32, Option<u32>)> = status
        .tenants
        .iter()
        .map(|t| (t.name.clone(), t.held, t.waiters, t.weight, t.cap))
        .collect();
    assert_eq!(
        rows,
        [
            (String::new(), 1, 1, 1, None),
            ("a".to_owned(), 1, 0, 1, None)
        ]
    );
    assert_eq!(status.waiters[0].tenant, "");
    assert_eq!(status.holders.last().map(|h| h.tenant.as_str()), Some("a"));
}

#[tokio::test]
async fn another_weight_or_cap_while_the_tenant_is_live_is_a_conflict() {
    let (_server, mut conn, k) = start().await;
    let (a, a3, a_capped) = (
        Tenant::new("a").weight(2),
        Tenant::new("a").weight(3),
        Tenant::new("a").weight(2).cap(1),
    );
    granted(acquire(&mut conn, of("a0", &a, 2, 1, true)).await);
    assert_eq!(
        acquire(&mut conn, of("x", &a3, 2, 1, true)).await,
        Acquire::Tenant {
            tenant: "a".into(),
            weight: 2,
            cap: None
        }
    );
    assert!(matches!(
        acquire(&mut conn, of("y", &a_capped, 2, 1, true)).await,
        Acquire::Tenant { weight: 2, .. }
    ));
    // Idle again: the next request's setting is adopted.
    release(&mut conn, &k, "a0").await.expect("release");
    granted(acquire(&mut conn, of("z", &a3, 2, 1, true)).await);
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(status.tenants.last().map(|t| t.weight), Some(3));
}

#[tokio::test]
async fn tenants_leave_nothing_behind_and_the_layout_goes_back_to_2() {
    let (_server, mut conn, k) = start().await;
    let (a, b) = (Tenant::new("a").cap(1), Tenant::new("b").weight(5));
    granted(acquire(&mut conn, req("d0", 2, 1, true)).await);
    assert_eq!(state_layout(&mut conn).await, "2");
    granted(acquire(&mut conn, of("a0", &a, 2, 1, true)).await);
    assert_eq!(state_layout(&mut conn).await, "3");
    queued(acquire(&mut conn, of("a1", &a, 2, 1, true)).await);
    queued(acquire(&mut conn, of("b0", &b, 2, 1, true)).await);
    // A withdrawal, a release that hands over, releases: nothing of the tenants stays.
    let withdrawn = lease_release(
        &mut conn,
        &k,
        "a1",
        "t:wake:another",
        ReleaseBy::Withdrawal {
            session: session(),
            pending: None,
        },
    )
    .await
    .expect("withdraw");
    assert_eq!(withdrawn.outcome, Release::Dequeued);
    release(&mut conn, &k, "a0").await.expect("release");
    assert!(holds(&mut conn, "b0").await);
    for id in ["d0", "b0"] {
        release(&mut conn, &k, id).await.expect("release");
    }
    assert_eq!(state_layout(&mut conn).await, "2");
    let tenant_fields: Vec<String> = state_fields(&mut conn)
        .await
        .into_iter()
        .map(|(name, _)| name)
        .filter(|name| name.starts_with("t:") || name == "tn")
        .collect();
    assert!(tenant_fields.is_empty(), "{tenant_fields:?}");
    let exists: u32 = conn
        .exists(&[&k.tenants, &k.tqueue, &k.queue])
        .await
        .expect("exists");
    assert_eq!(exists, 0);
}

#[tokio::test]
async fn an_expired_tenant_waiter_goes_and_the_next_turn_is_served() {
    let (_server, mut conn, k) = start().await;
    let (a, b) = (Tenant::new("a"), Tenant::new("b"));
    granted(acquire(&mut conn, req("d0", 1, 1, true)).await);
    let short = Request {
        waiter_lease: Duration::from_millis(50),
        ..of("a0", &a, 1, 1, true)
    };
    queued(acquire(&mut conn, short).await);
    queued(acquire(&mut conn, of("b0", &b, 1, 1, true)).await);
    tokio::time::sleep(Duration::from_millis(120)).await;
    release(&mut conn, &k, "d0").await.expect("release");
    assert!(holds(&mut conn, "b0").await);
    assert_eq!(poll(&mut conn, "a0").await, Acquire::Gone);
    let members: Vec<String> = conn.zrange(&k.tqueue, 0, -1).await.expect("zrange");
    assert!(members.is_empty(), "{members:?}");
}

#[tokio::test]
async fn a_resent_tenant_request_is_answered_as_the_first_and_a_batch_carries_tenants() {
    let (_server, mut conn, k) = start().await;
    let a = Tenant::new("a").weight(2);
    granted(acquire(&mut conn, req("d0", 1, 1, true)).await);
    queued(acquire(&mut conn, of("a0", &a, 1, 1, true)).await);
    assert_eq!(
        queued(acquire(&mut conn, of("a0", &a, 1, 1, true)).await),
        0
    );
    let ops = [
        BatchOp::acquire(&of("a1", &a, 1, 1, true)),
        BatchOp::release("d0", by("release d0")),
    ];
    let reply = within(
        LIMIT,
        "lease_batch",
        lease_batch(&mut conn, &k, "t:wake:another", session(), &ops),
    )
    .await
    .expect("lease_batch");
    let first = batch_acquire(reply.replies[0].clone(), None).expect("decode");
    assert_eq!(queued(first), 1);
    assert!(holds(&mut conn, "a0").await);
    assert!(!holds(&mut conn, "a1").await);
}

/// The state's layout field.
async fn state_layout(conn: &mut Conn) -> String {
    conn.hget(&keys().state, "layout").await.expect("hget")
}
