//! A foreign value at one of the keys: reported (WRONGTYPE naming the key), left alone, and
//! what the call had done before it taken back or kept consistent.

use super::support::*;

#[tokio::test]
async fn every_script_reports_a_foreign_key_and_leaves_it_alone() {
    let (_server, mut conn, k) = start().await;
    // (A string at the slot bitmap is taken for the leftover of a lost state: healed, see
    // a_slot_bitmap_left_without_its_state_is_healed_not_reported.)
    for (i, key) in k.all.iter().enumerate().filter(|(_, key)| **key != k.slots) {
        let _: () = conn.del(&k.all[..]).await.expect("del");
        let _: () = conn.set(key, "foreign").await.expect("set");
        let expect_wrong = |r: Result<()>, script: &str| match r {
            Err(Error::WrongType { key: got, .. }) => assert_eq!(&got, key, "{script}"),
            other => panic!("{script} on foreign key #{i}: {other:?}"),
        };
        expect_wrong(
            lease_acquire(&mut conn, &k, &req("a", 1, 1, true))
                .await
                .map(drop),
            "acquire",
        );
        expect_wrong(
            lease_poll(
                &mut conn,
                &k,
                "a",
                Duration::from_secs(1),
                Duration::from_secs(1),
            )
            .await
            .map(drop),
            "poll",
        );
        expect_wrong(
            lease_refresh(&mut conn, &k, "a", Duration::from_secs(1))
                .await
                .map(drop),
            "refresh",
        );
        expect_wrong(release(&mut conn, &k, "a").await.map(drop), "release");
        expect_wrong(lease_status(&mut conn, &k).await.map(drop), "status");
        expect_wrong(
            lease_set_capacity(&mut conn, &k, 2).await.map(drop),
            "set_capacity",
        );
        let value: String = conn.get(key).await.expect("get");
        assert_eq!(value, "foreign", "key #{i} was overwritten");
        let others: usize = conn.exists(&k.all[..]).await.expect("exists");
        assert_eq!(others, 1, "nothing else was written");
    }
}

#[tokio::test]
async fn a_key_replaced_while_in_use_is_reported_at_first_touch_and_left_alone() {
    let (_server, mut conn, k) = start().await;
    acquire(&mut conn, req("a", 3, 1, false)).await;
    for (ours, foreign) in [(&k.leases, "leases"), (&k.slots, "slots")] {
        let saved: Vec<u8> = redis::cmd("DUMP")
            .arg(ours)
            .query_async(&mut conn)
            .await
            .expect("dump");
        let _: () = conn.del(ours).await.expect("del");
        let _: () = conn.hset(ours, "x", "y").await.expect("hset");
        match lease_acquire(&mut conn, &k, &req("b", 3, 1, false)).await {
            Err(Error::WrongType { key, actual, .. }) => {
                assert_eq!(key, *ours, "{foreign}");
                assert_eq!(actual, "hash");
            }
            other => panic!("{foreign}: {other:?}"),
        }
        let value: String = conn.hget(ours, "x").await.expect("hget");
        assert_eq!(value, "y", "{foreign} left alone");
        // Put ours back: the semaphore carries on where it was.
        let _: () = conn.del(ours).await.expect("del");
        let _: () = redis::cmd("RESTORE")
            .arg(ours)
            .arg(0)
            .arg(saved)
            .query_async(&mut conn)
            .await
            .expect("restore");
        let status = lease_status(&mut conn, &k).await.expect("status");
        assert_eq!((status.in_use, status.holders.len()), (1, 1), "{foreign}");
    }
}

#[tokio::test]
async fn a_corrupt_token_is_reported_and_nothing_is_written() {
    // A negative token was once overwritten (and a unit and a slot stayed taken).
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    let () = conn.hset(&k.state, "tok", "-5").await.expect("hset");
    expect_wrong_type(
        lease_acquire(&mut conn, &k, &req("b", 2, 1, false)).await,
        &k.state,
    );
    let tok: String = conn.hget(&k.state, "tok").await.expect("hget");
    assert_eq!(tok, "-5", "left as it was");
    let used: String = conn.hget(&k.state, "used").await.expect("hget");
    assert_eq!(used, "1");
    let bits: u32 = redis::cmd("BITCOUNT")
        .arg(&k.slots)
        .query_async(&mut conn)
        .await
        .expect("bitcount");
    assert_eq!(bits, 1, "no slot taken");
}

#[tokio::test]
async fn a_foreign_value_at_the_bitmap_is_left_alone_by_the_last_release() {
    // The last release of a semaphore must not delete what stands at its bitmap's key.
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 1, 1, false)).await);
    let _: () = conn.del(&k.slots).await.expect("del");
    let _: () = conn.hset(&k.slots, "x", "y").await.expect("hset");
    match release(&mut conn, &k, "a").await {
        Err(Error::WrongType { key, actual, .. }) => {
            assert_eq!((key.as_str(), actual.as_str()), (k.slots.as_str(), "hash"));
        }
        other => panic!("expected WrongType, got {other:?}"),
    }
    let value: String = conn.hget(&k.slots, "x").await.expect("hget");
    assert_eq!(value, "y", "left alone");
}

#[tokio::test]
async fn a_release_meeting_a_foreign_lease_key_takes_nothing_from_its_holder() {
    // The uncontended release (fast_release) clears the holder's slot bit before it writes
    // its entry from leases. If leases holds a foreign value there, the bit goes back: the
    // slot must not be handed to someone else while the holder's record still names it.
    let (_server, mut conn, k) = start().await;
    let (_, held) = granted(acquire(&mut conn, req("a", 3, 1, false)).await);
    let saved: Vec<u8> = redis::cmd("DUMP")
        .arg(&k.leases)
        .query_async(&mut conn)
        .await
        .expect("dump");
    let _: () = conn.del(&k.leases).await.expect("del");
    let _: () = conn.hset(&k.leases, "x", "y").await.expect("hset");
    match release(&mut conn, &k, "a").await {
        Err(Error::WrongType { key, actual, .. }) => {
            assert_eq!((key.as_str(), actual.as_str()), (k.leases.as_str(), "hash"));
        }
        other => panic!("expected WrongType, got {other:?}"),
    }
    let bit: u8 = redis::cmd("GETBIT")
        .arg(&k.slots)
        .arg(held[0])
        .query_async(&mut conn)
        .await
        .expect("getbit");
    assert_eq!(bit, 1, "the holder's slot is still taken");
    let _: () = conn.del(&k.leases).await.expect("del");
    let _: () = redis::cmd("RESTORE")
        .arg(&k.leases)
        .arg(0)
        .arg(saved)
        .query_async(&mut conn)
        .await
        .expect("restore");
    let (_, other) = granted(acquire(&mut conn, req("b", 3, 1, false)).await);
    assert_ne!(other, held, "a slot of its own");
}

#[tokio::test]
async fn what_was_settled_before_a_foreign_key_stopped_the_call_is_saved() {
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 2, 1, true)).await);
    granted(acquire(&mut conn, req("c", 2, 1, true)).await);
    // a's lease ended long ago; the queue key holds a foreign value.
    let () = conn.zadd(&k.leases, "a", 1).await.expect("zadd");
    let () = conn.hset(&k.state, "next", 1).await.expect("hset");
    let _: () = conn.rpush(&k.queue, "foreign").await.expect("rpush");
    expect_wrong_type(
        lease_acquire(&mut conn, &k, &req("b", 2, 2, true)).await,
        &k.queue,
    );
    let (used, nh): (String, String) = redis::pipe()
        .hget(&k.state, "used")
        .hget(&k.state, "nh")
        .query_async(&mut conn)
        .await
        .expect("hget");
    assert_eq!(
        (used.as_str(), nh.as_str()),
        ("1", "1"),
        "a's drop is saved"
    );
}

#[tokio::test]
async fn a_fast_release_meeting_a_foreign_leases_key_gives_the_slot_back() {
    // The fast release clears the slot's bit before it touches leases: a foreign value there
    // stops it, and the bit is set again before the error goes out. (Kills the error raised
    // before the bit is restored.)
    let (_server, mut conn, k) = start().await;
    // (A first release makes the session's record: the next needs no renewal and takes the
    // fast path.)
    let own = session_past_a_release(&mut conn, 2).await;
    granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    let saved = replace_with_foreign(&mut conn, &k.leases).await;
    expect_wrong_type(release_in(&mut conn, "a", &own).await, &k.leases);
    let bit: u8 = conn.getbit(&k.slots, 0).await.expect("getbit");
    assert_eq!(bit, 1, "a's slot is still taken");
    let () = conn.del(&k.leases).await.expect("del");
    let () = redis::cmd("RESTORE")
        .arg(&k.leases)
        .arg(0)
        .arg(saved)
        .query_async(&mut conn)
        .await
        .expect("restore");
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(status.in_use, 1);
}

#[tokio::test]
async fn a_status_with_no_state_reports_a_foreign_slot_bitmap() {
    // With no state, the leftovers of a lost one are cleared, but a foreign value at the
    // bitmap's key is reported, never deleted. (Kills that check dropped.)
    let (_server, mut conn, k) = start().await;
    let () = conn.hset(&k.slots, "x", "y").await.expect("hset");
    expect_wrong_type(lease_status(&mut conn, &k).await, &k.slots);
    let value: String = conn.hget(&k.slots, "x").await.expect("hget");
    assert_eq!(value, "y");
}

/// A foreign value put at `key` in place of ours; ours, dumped, to put back.
async fn replace_with_foreign(conn: &mut Conn, key: &str) -> Vec<u8> {
    let saved: Vec<u8> = redis::cmd("DUMP")
        .arg(key)
        .query_async(conn)
        .await
        .expect("dump");
    let () = conn.del(key).await.expect("del");
    let () = conn.hset(key, "x", "y").await.expect("hset");
    saved
}

/// An idle semaphore of `capacity` that a session's first release left (the next grant
/// takes the fast path), with a foreign value at its slot bitmap.
async fn idle_with_a_foreign_bitmap(conn: &mut Conn, capacity: u32) -> std::sync::Arc<Session> {
    let own = session_past_a_release(conn, capacity).await;
    replace_with_foreign(conn, &keys().slots).await;
    own
}

#[tokio::test]
async fn a_fast_grant_meeting_a_foreign_leases_key_leaves_the_slot_free() {
    // The fast grant sets the slot's bit before it touches leases: a foreign value there
    // stops it, and the bit is cleared again before the error goes out. (Was: the bit stayed
    // set until a repair.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    let before: Vec<u8> = conn.get(&k.slots).await.expect("get");
    replace_with_foreign(&mut conn, &k.leases).await;
    expect_wrong_type(
        acquire_result(&mut conn, req("b", 2, 1, false)).await,
        &k.leases,
    );
    let after: Vec<u8> = conn.get(&k.slots).await.expect("get");
    assert_eq!(after, before, "b's slot bit is not left set");
    let used: String = conn.hget(&k.state, "used").await.expect("hget");
    assert_eq!(used, "1");
}

#[tokio::test]
async fn a_fast_grant_meeting_a_foreign_slot_bitmap_adds_no_lease() {
    // On an idle semaphore the fast grant takes slot 0 without reading the bitmap: a foreign
    // value there stops it before leases is written. (Kills the two writes swapped.)
    let (_server, mut conn, k) = start().await;
    let _own = idle_with_a_foreign_bitmap(&mut conn, 2).await;
    expect_wrong_type(
        acquire_result(&mut conn, req("b", 2, 1, false)).await,
        &k.slots,
    );
    let score: Option<f64> = conn.zscore(&k.leases, "b").await.expect("zscore");
    assert_eq!(score, None, "no lease entry for b");
}

#[tokio::test]
async fn a_withdrawal_meeting_a_foreign_queue_keeps_the_waiters_record() {
    // A waiter's withdrawal removes its queue entry before its record: a foreign value at the
    // queue stops it with both in place (the fields written back on such an error are only
    // those changed before it). (Kills the two removals swapped.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 1, 1, false)).await);
    acquire(&mut conn, req("b", 1, 1, true)).await;
    replace_with_foreign(&mut conn, &k.queue).await;
    expect_wrong_type(release(&mut conn, &k, "b").await, &k.queue);
    let kept: bool = conn.hexists(&k.state, "r:b").await.expect("hexists");
    assert!(kept, "b's record is kept");
}

#[tokio::test]
async fn a_grant_of_several_units_on_an_idle_semaphore_reports_a_foreign_bitmap() {
    // With no unit in use a grant takes slots 0.. without searching the bitmap; its first
    // write meets the foreign value and names the key. (Kills a search made anyway, whose
    // raw error names no key.)
    let (_server, mut conn, k) = start().await;
    let _own = idle_with_a_foreign_bitmap(&mut conn, 4).await;
    expect_wrong_type(
        acquire_result(&mut conn, req("big", 4, 2, false)).await,
        &k.slots,
    );
}

#[tokio::test]
async fn a_release_of_an_id_nobody_holds_is_answered_without_touching_leases() {
    // An id with no record is not held: the answer needs no lease entry, so a foreign value
    // at leases is met only by calls that change it. (Kills release_op() removing the entry
    // of every id, held or not.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    replace_with_foreign(&mut conn, &k.leases).await;
    assert_eq!(
        release(&mut conn, &k, "nobody").await.expect("release"),
        Release::NotHeld
    );
}
