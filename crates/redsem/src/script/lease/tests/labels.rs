//! Labels: one holder per label, and the counts kept per label.

use super::support::*;

#[tokio::test]
async fn one_per_label_refuses_a_second_request_of_the_label() {
    let (_server, mut conn, _) = start().await;
    let mut first = req("a", 3, 1, false);
    first.label = "10.0.0.1";
    first.one_per_label = true;
    assert!(matches!(
        acquire(&mut conn, first).await,
        Acquire::Granted { .. }
    ));
    let mut second = first;
    second.id = "b";
    assert_eq!(
        acquire(&mut conn, second).await,
        Acquire::Label("10.0.0.1".into())
    );
    let mut other = first;
    other.id = "c";
    other.label = "10.0.0.2";
    assert!(matches!(
        acquire(&mut conn, other).await,
        Acquire::Granted { .. }
    ));
}

#[tokio::test]
async fn a_waiter_without_a_label_is_counted_under_no_label() {
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 1, 1, true)).await);
    acquire(&mut conn, req("w", 1, 1, true)).await;
    let names: Vec<String> = conn.hkeys(&k.state).await.expect("hkeys");
    assert!(!names.iter().any(|n| n.starts_with("label:")), "{names:?}");
}

#[tokio::test]
async fn a_label_leaves_no_field_once_nobody_holds_or_awaits_it() {
    // (Kills label_add() keeping a count of 0: a field per label ever used.)
    let (_server, mut conn, k) = start().await;
    let labelled = Request {
        label: "host-a",
        ..req("a", 2, 1, false)
    };
    granted(acquire(&mut conn, labelled).await);
    release(&mut conn, &k, "a").await.expect("release");
    let left: bool = conn
        .hexists(&k.state, "label:host-a")
        .await
        .expect("hexists");
    assert!(!left);
}
