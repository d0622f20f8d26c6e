//! Lost or inconsistent state (eviction, partial loss, counters that disagree): the leftovers
//! cleared, entries restored, counters and the slot bitmap rebuilt from the records.

use super::support::*;

#[tokio::test]
async fn a_slot_bitmap_left_without_its_state_is_healed_not_reported() {
    // What eviction of the state hash alone leaves behind: the bitmap of a lost state.
    let (_server, mut conn, k) = start().await;
    acquire(&mut conn, req("a", 1, 1, false)).await;
    let _: () = conn.del(&k.state).await.expect("del state");
    let (_, slots) = granted(acquire(&mut conn, req("b", 1, 1, false)).await);
    assert_eq!(slots, vec![0]);
    assert!(
        !lease_refresh(&mut conn, &k, "a", Duration::from_secs(1))
            .await
            .expect("refresh"),
        "the holder of the lost state learns it at its next renewal"
    );
}

#[tokio::test]
async fn counters_that_disagree_with_the_records_are_rebuilt() {
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 3, 1, false)).await);
    // What a script that failed after writing used to leave: counters nobody holds.
    let () = conn
        .hset_multiple(&k.state, &[("used", "3"), ("nh", "3")])
        .await
        .expect("hset");
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!((status.in_use, status.holders.len()), (1, 1), "rebuilt");
    let (_, slots) = granted(acquire(&mut conn, req("b", 3, 2, false)).await);
    assert_eq!(slots, vec![1, 2]);
}

#[tokio::test]
async fn the_leftovers_of_a_lost_state_are_cleared_before_a_new_one_is_made() {
    // Eviction of the state hash alone: the leases, queue and bitmap of a state that is gone.
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 1, 1, true)).await);
    acquire(&mut conn, req("w", 1, 1, true)).await;
    let _: () = conn.del(&k.state).await.expect("del state");
    granted(acquire(&mut conn, req("b", 2, 2, false)).await);
    let leases: Vec<String> = conn.zrange(&k.leases, 0, -1).await.expect("zrange");
    let queue: Vec<String> = conn.zrange(&k.queue, 0, -1).await.expect("zrange");
    assert_eq!((leases, queue), (vec!["b".to_owned()], vec![]));
}

#[tokio::test]
async fn a_repair_rebuilds_exactly_the_counters_labels_and_entries_the_scripts_kept() {
    let (_server, mut conn, k) = start().await;
    let labelled = |id, label, units, wait| Request {
        label,
        ..req(id, 4, units, wait)
    };
    granted(acquire(&mut conn, labelled("a", "x", 1, false)).await);
    granted(acquire(&mut conn, req("b", 4, 1, false)).await);
    granted(acquire(&mut conn, req("c", 4, 1, false)).await);
    release(&mut conn, &k, "c").await.expect("release");
    granted(acquire(&mut conn, labelled("d", "y", 1, false)).await);
    let q = acquire(&mut conn, labelled("w", "x", 2, true)).await;
    assert!(matches!(q, Acquire::Queued { .. }), "{q:?}");
    let fields = state_fields(&mut conn).await;
    let leases: Vec<(String, f64)> = conn
        .zrange_withscores(&k.leases, 0, -1)
        .await
        .expect("zrange");
    let queue: Vec<String> = conn.zrange(&k.queue, 0, -1).await.expect("zrange");

    // Counters that disagree (no unit in use by 5 holders, 7 session records for 1), a holder's
    // lease entry lost, and entries without a record in both zsets.
    let () = conn
        .hset_multiple(&k.state, &[("used", "0"), ("nh", "5"), ("nt", "7")])
        .await
        .expect("hset");
    let () = conn.zrem(&k.leases, "b").await.expect("zrem");
    let () = conn.zadd(&k.leases, "ghost", 1e15).await.expect("zadd");
    let () = conn.zadd(&k.queue, "ghost", 1).await.expect("zadd");
    let before = server_millis(&mut conn).await;
    lease_status(&mut conn, &k).await.expect("status");
    let after = server_millis(&mut conn).await;

    assert_eq!(state_fields(&mut conn).await, fields, "the state hash");
    let b = lease_score(&mut conn, "b")
        .await
        .expect("b's lease entry is back");
    assert!(
        (before + 30_000..=after + 30_000).contains(&b),
        "b's lease is a full lease from the repair: {b} {before} {after}"
    );
    let mut repaired: Vec<(String, f64)> = conn
        .zrange_withscores(&k.leases, 0, -1)
        .await
        .expect("zrange");
    repaired.retain(|(id, _)| id != "b");
    let mut kept = leases.clone();
    kept.retain(|(id, _)| id != "b");
    assert_eq!(repaired, kept, "the other lease entries, and no ghost");
    let requeued: Vec<String> = conn.zrange(&k.queue, 0, -1).await.expect("zrange");
    assert_eq!(requeued, queue, "the queue, and no ghost");
}

#[tokio::test]
async fn a_queue_entry_that_is_no_longer_a_waiter_is_dropped_when_it_reaches_the_head() {
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("gone", 1, 1, false)).await);
    release(&mut conn, &k, "gone").await.expect("release");
    granted(acquire(&mut conn, req("a", 1, 1, true)).await);
    acquire(&mut conn, req("w", 1, 1, true)).await;
    // The released id back in the queue ahead of w (its ticket lower), counted as waiting.
    let () = conn.zadd(&k.queue, "gone", 0).await.expect("zadd");
    let () = conn.hset(&k.state, "qlen", "2").await.expect("hset");
    let released = lease_release(&mut conn, &k, "a", CHANNEL, by("1"))
        .await
        .expect("release");
    assert_eq!(
        released.handed.len(),
        1,
        "w is granted past the stale entry: {released:?}"
    );
    assert!(released.handed[0].starts_with("w|"), "{released:?}");
    let queue: Vec<String> = conn.zrange(&k.queue, 0, -1).await.expect("zrange");
    assert!(queue.is_empty(), "the stale entry is gone: {queue:?}");
}

#[tokio::test]
async fn an_acquire_that_repairs_the_counters_serves_the_queue_first() {
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 1, 1, true)).await);
    acquire(&mut conn, req("w", 1, 1, true)).await;
    // a's record lost (its unit free by the records), the counters still say it holds.
    let () = conn.hdel(&k.state, "r:a").await.expect("hdel");
    let () = conn.zrem(&k.leases, "a").await.expect("zrem");
    let b = acquire(&mut conn, req("b", 1, 1, true)).await;
    assert!(
        matches!(b, Acquire::Queued { position: 0, .. }),
        "b waits behind w's grant: {b:?}"
    );
    let status = lease_status(&mut conn, &k).await.expect("status");
    let holding: Vec<&str> = status.holders.iter().map(|h| h.id.as_str()).collect();
    assert_eq!(holding, vec!["w"]);
}

#[tokio::test]
async fn a_poll_of_a_waiter_without_its_place_is_gone_and_its_record_dropped() {
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 1, 1, true)).await);
    acquire(&mut conn, req("w", 1, 1, true)).await;
    let () = conn.zrem(&k.queue, "w").await.expect("zrem");
    let polled = poll(&mut conn, "w").await;
    assert_eq!(polled, Acquire::Gone);
    let (record, qlen): (Option<String>, String) = redis::pipe()
        .hget(&k.state, "r:w")
        .hget(&k.state, "qlen")
        .query_async(&mut conn)
        .await
        .expect("hget");
    assert_eq!((record, qlen.as_str()), (None, "0"));
}

#[tokio::test]
async fn a_waiter_whose_lease_entry_vanished_is_granted_until_a_waiter_lease_from_now() {
    // A waiter record without its entry in leases (a state repaired or half lost): a grant
    // by wake-up counts its place from now, never longer. (Pins the end at a waiter lease
    // from the release's Redis time to the millisecond: 5 ms later fails.)
    let (_server, conn, _) = start().await;
    within_3_ms(&conn, |n, mut conn, k| async move {
        let (a, w) = (format!("a{n}"), format!("w{n}"));
        let _: () = conn.del(&k.all[..]).await.expect("del");
        granted(acquire(&mut conn, req(&a, 1, 1, false)).await);
        let waiting = Request {
            waiter_lease: Duration::from_secs(3),
            ..req(&w, 1, 1, true)
        };
        assert!(matches!(
            acquire(&mut conn, waiting).await,
            Acquire::Queued { .. }
        ));
        let () = conn.zrem(&k.leases, &w).await.expect("zrem");
        let t0 = server_millis(&mut conn).await;
        lease_release(
            &mut conn,
            &k,
            &a,
            "t:wake:another",
            by(&format!("release {a}")),
        )
        .await
        .expect("release");
        let t1 = server_millis(&mut conn).await;
        assert_ends_after(&mut conn, &w, (t0, t1), 3_000, "a waiter lease").await;
        t1 - t0 < 3
    })
    .await;
}

#[tokio::test]
async fn a_queue_that_qlen_says_is_not_empty_but_is_gets_repaired_by_the_next_release() {
    // (Pins that promote() repairs when the queue has no head while qlen counts one, instead
    // of reading a record of no id.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 1, 1, false)).await);
    let () = conn.hset(&k.state, "qlen", "1").await.expect("hset");
    assert_eq!(
        release(&mut conn, &k, "a").await.expect("release"),
        Release::Released
    );
    let qlen: String = conn.hget(&k.state, "qlen").await.expect("hget");
    assert_eq!(qlen, "0", "repaired");
}

#[tokio::test]
async fn a_repair_clears_the_bits_of_slots_nobody_holds() {
    // (Pins that repair() rebuilds the bitmap from the records alone, so a bit no holder
    // names is free again.)
    let (_server, mut conn, k) = start().await;
    let (_, slots) = granted(acquire(&mut conn, req("a", 3, 1, false)).await);
    assert_eq!(slots, vec![0]);
    let _: () = conn.setbit(&k.slots, 1, true).await.expect("setbit");
    lease_status(&mut conn, &k)
        .await
        .expect("status (its check repairs)");
    let (_, slots) = granted(acquire(&mut conn, req("b", 3, 1, false)).await);
    assert_eq!(slots, vec![1], "slot 1 is nobody's");
}

#[tokio::test]
async fn a_poll_that_finds_its_lease_entry_gone_restores_everyones() {
    // The leases zset lost (a foreign DEL): the first holder to check in restores its own
    // entry, and the count check that follows rebuilds every other holder's too.
    // (Kills lease_poll.lua's check() dropped.)
    let (_server, mut conn, k) = start().await;
    for id in ["a", "b", "c"] {
        granted(acquire(&mut conn, req(id, 3, 1, false)).await);
    }
    let () = conn.del(&k.leases).await.expect("del");
    let polled = poll(&mut conn, "a").await;
    assert!(matches!(polled, Acquire::Granted { .. }), "{polled:?}");
    for id in ["a", "b", "c"] {
        assert!(
            lease_score(&mut conn, id).await.is_some(),
            "{id} has its lease entry again"
        );
    }
}

#[tokio::test]
async fn a_head_entry_without_its_record_waits_for_a_free_unit_to_be_cleared() {
    // While every unit is held no waiter fits, so the settle does not walk the queue: an
    // entry whose waiter record is gone stays until a unit is freed. (Kills promote_left()
    // promoting while full.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 1, 1, true)).await);
    for id in ["w1", "w2"] {
        assert!(matches!(
            acquire(&mut conn, req(id, 1, 1, true)).await,
            Acquire::Queued { .. }
        ));
    }
    let () = conn.hdel(&k.state, "r:w1").await.expect("hdel");
    let polled = poll(&mut conn, "w2").await;
    assert!(
        matches!(polled, Acquire::Queued { position: 1, .. }),
        "still behind the entry while full: {polled:?}"
    );
    assert_eq!(
        release(&mut conn, &k, "a").await.expect("release"),
        Release::Released
    );
    // The release cleared the entry and granted w2, and counted both out of the queue.
    // (Kills promote() clearing an entry without counting it out: a later repair would.)
    let qlen: String = conn.hget(&k.state, "qlen").await.expect("hget");
    assert_eq!(qlen, "0");
    let polled = poll(&mut conn, "w2").await;
    assert!(
        matches!(polled, Acquire::Granted { .. }),
        "the entry cleared, w2 served: {polled:?}"
    );
}

#[tokio::test]
async fn a_refresh_that_finds_its_lease_entry_gone_restores_everyones() {
    // (Kills lease_refresh.lua's check() dropped: see the same for a poll above.)
    let (_server, mut conn, k) = start().await;
    for id in ["a", "b", "c"] {
        granted(acquire(&mut conn, req(id, 3, 1, false)).await);
    }
    let () = conn.del(&k.leases).await.expect("del");
    assert!(
        lease_refresh(&mut conn, &k, "a", Duration::from_secs(30))
            .await
            .expect("refresh")
    );
    for id in ["a", "b", "c"] {
        assert!(
            lease_score(&mut conn, id).await.is_some(),
            "{id} has its lease entry again"
        );
    }
}

#[tokio::test]
async fn a_head_waiter_queued_right_after_a_repair_is_told_a_third_of_its_waiter_lease() {
    // A repair leaves "when the first lease ends" unknown (next 0) until the new waiter's own
    // entry sets it: the head waiter queued in the same call is told to look again after a
    // third of its waiter lease, not at once.
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 1, 1, true)).await);
    // Counters that disagree with the records (one holder counted twice): the check of a
    // request that finds no room repairs them.
    let () = conn.hset(&k.state, "nh", "2").await.expect("hset");
    let reply = acquire(&mut conn, req("w", 1, 1, true)).await;
    let Acquire::Queued {
        position: 0,
        recheck,
    } = reply
    else {
        panic!("w should head the queue: {reply:?}");
    };
    assert_eq!(recheck, Duration::from_secs(10), "a third of 30 s");
    let nh: String = conn.hget(&k.state, "nh").await.expect("hget");
    assert_eq!(nh, "1", "repaired");
}

#[tokio::test]
async fn a_repair_gives_a_session_record_without_its_index_entry_one() {
    // (Kills repair() dropping the index entry it makes for a session record that lost its
    // own: the record would never be pruned.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    release(&mut conn, &k, "a").await.expect("release");
    let own = format!("s:{}", session().id());
    assert!(lease_score(&mut conn, &own).await.is_some());
    let () = conn.zrem(&k.leases, &own).await.expect("zrem");
    let () = conn.hset(&k.state, "nh", "3").await.expect("hset");
    granted(acquire(&mut conn, req("b", 2, 1, false)).await);
    let before = server_millis(&mut conn).await;
    let expiry = lease_score(&mut conn, &own)
        .await
        .expect("the index entry is back");
    assert!(
        -expiry >= before,
        "it expires in the future: {} vs {before}",
        -expiry
    );
}

#[tokio::test]
async fn a_request_finding_no_room_by_the_counters_checks_them_against_the_records() {
    // Counters saying full while the slot bitmap and records hold less: the request that
    // finds no room checks them, repairs, and is granted. (Kills the check skipped when
    // nobody waits.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    let () = conn.hset(&k.state, "used", "2").await.expect("hset");
    let (_, slots) = granted(acquire(&mut conn, req("b", 2, 1, false)).await);
    assert_eq!(slots, vec![1]);
}

#[tokio::test]
async fn leftover_entries_of_a_lost_state_without_a_bitmap_are_cleared_too() {
    // (Kills the leftovers cleared only when a bitmap is left as well.)
    let (_server, mut conn, k) = start().await;
    let () = conn.zadd(&k.leases, "ghost", 1).await.expect("zadd");
    let () = conn.zadd(&k.queue, "ghost", 1).await.expect("zadd");
    granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    assert_eq!(lease_score(&mut conn, "ghost").await, None);
    let queued: usize = conn.zcard(&k.queue).await.expect("zcard");
    assert_eq!(queued, 0);
}

#[tokio::test]
async fn a_repair_reports_a_foreign_bitmap_and_rebuilds_a_bitmap_of_ours() {
    // (Kills repair()'s type check of the bitmap inverted either way: a foreign value
    // deleted, or our own bitmap refused.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    // Counters that disagree (units 0, one holder): the next call repairs.
    let () = conn.hset(&k.state, "used", "0").await.expect("hset");
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(status.in_use, 1, "repaired from the records");
    let () = conn.hset(&k.state, "used", "0").await.expect("hset");
    let () = conn.del(&k.slots).await.expect("del");
    let () = conn.hset(&k.slots, "x", "y").await.expect("hset");
    expect_wrong_type(lease_status(&mut conn, &k).await, &k.slots);
    let value: String = conn.hget(&k.slots, "x").await.expect("hget");
    assert_eq!(value, "y", "left alone");
}

#[tokio::test]
async fn a_repair_takes_the_ttl_an_older_version_left_off_the_live_keys() {
    // (Kills repair()'s persist() dropped: a live key with a TTL could expire or be evicted.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    let () = conn.pexpire(&k.leases, 600_000).await.expect("pexpire");
    let () = conn.hset(&k.state, "used", "0").await.expect("hset");
    lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(pttl(&mut conn, &k.leases).await, -1);
}
