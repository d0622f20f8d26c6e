//! The status report: holders in token order, waiters in queue order, and the times it
//! reports, to the millisecond.

use super::support::*;

#[tokio::test]
async fn status_lists_holders_by_token_and_waiters_in_queue_order() {
    let (_server, mut conn, k) = start().await;
    let mut labelled = req("a", 2, 2, true);
    labelled.label = "host-a";
    let (token, _) = granted(acquire(&mut conn, labelled).await);
    acquire(&mut conn, req("w1", 2, 1, true)).await;
    acquire(&mut conn, req("w2", 2, 2, true)).await;
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(status.capacity, Some(2));
    assert_eq!(status.in_use, 2);
    assert_eq!(status.holders.len(), 1);
    let h = &status.holders[0];
    assert_eq!(
        (h.id.as_str(), h.label.as_str(), h.token),
        ("a", "host-a", token)
    );
    assert_eq!(h.slots, vec![0, 1]);
    assert!(h.left_ms > 29_000 && h.left_ms <= 30_000, "{}", h.left_ms);
    let order: Vec<(&str, u32)> = status
        .waiters
        .iter()
        .map(|w| (w.id.as_str(), w.units))
        .collect();
    assert_eq!(order, vec![("w1", 1), ("w2", 2)]);
}

#[tokio::test]
async fn status_reports_how_long_a_holder_held_to_the_millisecond() {
    // (Pins the time to the millisecond: reported 5 ms short, it fails.)
    let (_server, conn, _) = start().await;
    within_3_ms(&conn, |n, mut conn, k| async move {
        let id = format!("h{n}");
        let t0 = server_millis(&mut conn).await;
        granted(acquire(&mut conn, req(&id, 1000, 1, false)).await);
        let t1 = server_millis(&mut conn).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t2 = server_millis(&mut conn).await;
        let status = lease_status(&mut conn, &k).await.expect("status");
        let t3 = server_millis(&mut conn).await;
        let held = status
            .holders
            .iter()
            .find(|h| h.id == id)
            .expect("held")
            .held_ms;
        // Granted within [t0, t1], the status read within [t2, t3].
        assert!(
            (t2 - t1..=t3 - t0).contains(&held),
            "held {held} ms outside [{}, {}]",
            t2 - t1,
            t3 - t0
        );
        t1 - t0 < 3 && t3 - t2 < 3
    })
    .await;
}

#[tokio::test]
async fn status_reports_how_long_a_waiter_waited_to_the_millisecond() {
    // (Kills lease_status.lua's waited time read 5 ms late.)
    let (_server, conn, _) = start().await;
    within_3_ms(&conn, |n, mut conn, k| async move {
        let (a, w) = (format!("a{n}"), format!("w{n}"));
        let _: () = conn.del(&k.all[..]).await.expect("del");
        granted(acquire(&mut conn, req(&a, 1, 1, false)).await);
        let t0 = server_millis(&mut conn).await;
        acquire(&mut conn, req(&w, 1, 1, true)).await;
        let t1 = server_millis(&mut conn).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        let t2 = server_millis(&mut conn).await;
        let status = lease_status(&mut conn, &k).await.expect("status");
        let t3 = server_millis(&mut conn).await;
        let waited = status
            .waiters
            .iter()
            .find(|x| x.id == w)
            .expect("waiting")
            .waited_ms;
        assert!(
            (t2 - t1..=t3 - t0).contains(&waited),
            "waited {waited} ms outside [{}, {}]",
            t2 - t1,
            t3 - t0
        );
        t1 - t0 < 3 && t3 - t2 < 3
    })
    .await;
}

#[tokio::test]
async fn status_skips_a_queue_entry_whose_waiter_record_is_gone() {
    // (Kills lease_status.lua reading a missing waiter record as one.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 1, 1, true)).await);
    for id in ["w1", "w2"] {
        acquire(&mut conn, req(id, 1, 1, true)).await;
    }
    let () = conn.hdel(&k.state, "r:w1").await.expect("hdel");
    let status = lease_status(&mut conn, &k).await.expect("status");
    let waiting: Vec<&str> = status.waiters.iter().map(|w| w.id.as_str()).collect();
    assert_eq!(waiting, vec!["w2"]);
}

#[tokio::test]
async fn status_lists_holders_in_token_order_whatever_their_lease_ends() {
    // (Kills lease_status.lua's sort by token dropped: holders would come in the order their
    // leases end.)
    let (_server, mut conn, k) = start().await;
    let (first, _) = granted(acquire(&mut conn, req("long", 2, 1, false)).await);
    let short = Request {
        lease: Duration::from_secs(5),
        ..req("short", 2, 1, false)
    };
    let (second, _) = granted(acquire(&mut conn, short).await);
    assert!(second > first);
    let status = lease_status(&mut conn, &k).await.expect("status");
    let order: Vec<&str> = status.holders.iter().map(|h| h.id.as_str()).collect();
    assert_eq!(order, vec!["long", "short"], "by token, not by lease end");
}
