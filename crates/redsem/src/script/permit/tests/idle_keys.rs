//! TTLs: live keys carry none; idle bookkeeping expires an idle while past its last deadline,
//! the count never; eviction of live state.

use super::support::*;

#[tokio::test]
async fn bookkeeping_keys_expire_only_while_idle_and_the_count_never() {
    let (_server, mut conn, k) = start().await;
    add(&mut conn, "r1", 1).await;
    acquire(&mut conn, "a", 1, false, LONG).await;
    // Idle (nobody waits): the session records (kept 10 min) and the ticket counter expire,
    // an idle while after the session's record does.
    for key in [&k.records, &k.applied] {
        let ttl: i64 = conn.pttl(key).await.expect("pttl");
        assert!(ttl > 600_000 && ttl <= 600_000 + 120_000, "{key}: {ttl}");
    }
    // Live (someone waits): nothing expires.
    acquire(&mut conn, "b", 1, true, LONG).await;
    for key in &k.all {
        let ttl: i64 = conn.pttl(key).await.expect("pttl");
        assert_eq!(ttl, -1, "{key} while a waiter lives");
    }
    // Idle again.
    permit_withdraw(&mut conn, &k, "b").await.expect("withdraw");
    for key in [&k.records, &k.meta, &k.applied] {
        let ttl: i64 = conn.pttl(key).await.expect("pttl");
        assert!(ttl > 600_000 && ttl <= 600_000 + 120_000, "{key}: {ttl}");
    }
    let ttl: i64 = conn.pttl(&k.count).await.expect("pttl");
    assert_eq!(ttl, -1, "the count never expires");
}

#[tokio::test]
async fn live_permit_state_carries_no_ttl_and_survives_volatile_lru_eviction() {
    let server = start_server(&["--maxmemory-policy", "volatile-lru"]);
    let mut conn = connect(&server).await;
    let k = pk();
    // A grant not collected yet, and a waiter behind it.
    acquire(&mut conn, "granted", 1, true, LONG).await;
    acquire(&mut conn, "queued", 1, true, LONG).await;
    assert_eq!(add(&mut conn, "r", 1).await, Addition::Applied(0));
    let mut ttls = Vec::new();
    for key in &k.all {
        ttls.push(pttl(&mut conn, key).await);
    }
    println!("PTTL of the permit keys while waiters live: {ttls:?}");
    // (LRU idle times count in seconds: make ours the idlest.)
    tokio::time::sleep(Duration::from_millis(1100)).await;
    evict_by_filling(&mut conn, 5000).await;
    let exists: usize = conn.exists(&k.all[..]).await.expect("EXISTS");
    println!("permit keys left after 5000 evictions: {exists} of 6");
    assert_eq!(poll(&mut conn, "granted").await, PermitAcquire::Granted);
    assert!(matches!(
        poll(&mut conn, "queued").await,
        PermitAcquire::Queued { position: 0, .. }
    ));
    assert!(ttls.iter().all(|ttl| *ttl == -1), "{ttls:?}");

    // Idle again: the bookkeeping expires (only the count stays). (No memory limit any
    // more, or the keys would be evicted the moment they get their TTL.)
    let () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "0"])
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET");
    permit_withdraw(&mut conn, &k, "queued")
        .await
        .expect("withdraw");
    for key in [&k.records, &k.meta, &k.applied] {
        let ttl = pttl(&mut conn, key).await;
        assert!(ttl > 0, "{key}: {ttl}");
    }
    assert_eq!(pttl(&mut conn, &k.count).await, -1);
}

#[tokio::test]
async fn a_grant_not_yet_collected_keeps_every_key_without_a_ttl() {
    // Nobody queues, but a grant waits to be collected: still live, so no key may expire
    // (nor be picked by a volatile-* eviction).
    let (_server, mut conn, k) = start_with_count(0).await;
    acquire(&mut conn, "w", 1, true, LONG).await;
    assert_eq!(add(&mut conn, "r", 1).await, Addition::Applied(0));
    assert_eq!(uncollected(&mut conn).await, 1, "w was granted");
    assert_eq!(
        fields(&mut conn, &["qlen", "wlen", "live"]).await,
        [Some("0".into()), Some("1".into()), Some("1".into())]
    );
    // (The queue is empty, so absent.)
    assert_eq!(pttl(&mut conn, &k.queue).await, -2, "no queue");
    for key in k.all.iter().filter(|key| **key != k.queue) {
        assert_eq!(
            pttl(&mut conn, key).await,
            -1,
            "{key} while w's grant waits"
        );
    }
    assert_eq!(poll(&mut conn, "w").await, PermitAcquire::Granted);
    let ttl = pttl(&mut conn, &k.records).await;
    assert!(ttl > 0, "idle once collected: {ttl}");
}

#[tokio::test]
async fn a_batch_that_queues_and_withdraws_on_an_idle_semaphore_gives_the_keys_it_made_a_ttl() {
    // The ticket counter is made by the batch's wait request, and nothing is live when the
    // batch ends: the counter expires with the other idle keys, it does not stay forever.
    let (_server, mut conn, k) = start_with_count(0).await;
    let meta_before: bool = conn.exists(&k.meta).await.expect("EXISTS");
    assert!(!meta_before, "no ticket counter yet");
    let ops = [
        PermitOp::acquire("x", 1, true, LONG, number("x")),
        PermitOp::withdraw("x", None),
    ];
    let mut next = batch_in(&mut conn, session(), &ops).await;
    assert!(matches!(
        permits_granted("permit_acquire", next()).expect("acquire"),
        PermitAcquire::Queued { position: 0, .. }
    ));
    assert_eq!(withdrawn(next()).expect("withdraw"), Withdrawal::Withdrawn);
    let meta: bool = conn.exists(&k.meta).await.expect("EXISTS");
    assert!(meta, "the ticket counter was made");
    // (Absolute expiry times: two PTTLs read a moment apart may differ by a millisecond.)
    let expiry = |key: &String| redis::cmd("PEXPIRETIME").arg(key).to_owned();
    let meta: i64 = expiry(&k.meta)
        .query_async(&mut conn)
        .await
        .expect("PEXPIRETIME");
    let records: i64 = expiry(&k.records)
        .query_async(&mut conn)
        .await
        .expect("PEXPIRETIME");
    assert!(
        meta > 0 && meta == records,
        "the ticket counter expires with the records: at {meta}, the records at {records}"
    );
}

#[tokio::test]
async fn a_session_index_made_again_on_an_idle_semaphore_gets_the_idle_ttl() {
    // Idle keys expire together; one of them lost alone (a volatile-* eviction picks keys one
    // by one) and made again by a new session's record must get the same TTL, or it would
    // never expire. (Kills the fresh-keys test of keep() reading `fresh_meta and
    // fresh_applied`.)
    let (_server, mut conn, k) = start_with_count(3).await;
    assert!(
        pttl(&mut conn, &k.applied).await > 0,
        "idle: the index expires"
    );
    let () = conn.del(&k.applied).await.expect("del");
    let fresh = Session::new();
    let seq = fresh.open();
    let added = script::permit_add(&mut conn, &k, "r", 1, Caller::new(&fresh, seq.n()))
        .await
        .expect("add");
    assert_eq!(added, Addition::Applied(4));
    let ttl = pttl(&mut conn, &k.applied).await;
    assert!(ttl > 0, "the index made again expires with the rest: {ttl}");
}

#[tokio::test]
async fn a_batch_keeps_the_idle_bookkeeping_past_the_longest_waiter_lease_it_set() {
    // A batch queues a request with a waiter lease longer than a session record lives, then
    // withdraws it, which makes the client's session record: idle at the end, the keys are
    // kept an idle while past the latest deadline the batch set, the lease's end, not only
    // past the session record's expiry. (The record's expiry,
    // renewed after the lease was set, is not the latest deadline.)
    const LEASE: Duration = Duration::from_secs(20 * 60);
    const KEEP_IDLE_MS: i64 = 60_000;
    let (_server, mut conn, k) = start_with_count(0).await;
    let client = Session::new();
    let seq = client.open();
    let before = server_millis(&mut conn).await;
    let ops = [
        PermitOp::acquire("x", 1, true, LEASE, seq.n()),
        PermitOp::withdraw("x", Some(seq.n())),
    ];
    let mut next = batch_in(&mut conn, &client, &ops).await;
    drop(seq);
    assert!(matches!(
        permits_granted("permit_acquire", next()).expect("acquire"),
        PermitAcquire::Queued { position: 0, .. }
    ));
    assert_eq!(withdrawn(next()).expect("withdraw"), Withdrawal::Withdrawn);
    let lease_end = before + i64::try_from(LEASE.as_millis()).expect("ms");
    for key in [&k.records, &k.applied] {
        let expiry: i64 = redis::cmd("PEXPIRETIME")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("PEXPIRETIME");
        assert!(
            expiry >= lease_end + KEEP_IDLE_MS,
            "{key} expires at {expiry}, before an idle while past the lease's end {lease_end}"
        );
    }
}

#[tokio::test]
async fn bookkeeping_rebuilt_after_the_records_were_lost_expires_once_nothing_waits() {
    // The records vanish under a live semaphore (its keys without TTL); the waiter left in the
    // queue has no record and its lease ends. The next call, which marks nothing (no session
    // expiry, no deadline), rebuilds the counters, drops the waiter and, idle then, gives the
    // records it writes back and the ticket counter the idle TTL: they do not stay forever.
    // (Pins that such a call takes a deadline all the same.)
    const KEEP_IDLE_MS: i64 = 60_000;
    let (_server, mut conn, k) = start_with_count(0).await;
    assert!(matches!(
        acquire(&mut conn, "x", 1, true, Duration::from_millis(100)).await,
        PermitAcquire::Queued { .. }
    ));
    let queued = Instant::now();
    assert_eq!(pttl(&mut conn, &k.meta).await, -1, "live: no TTL");
    let () = conn.del(&k.records).await.expect("DEL");
    sleep_until(queued + Duration::from_millis(300)).await;
    let state = script::permit_available(&mut conn, &k)
        .await
        .expect("available");
    assert_eq!(state.waiters, 0, "x's lease ended");
    for key in [&k.records, &k.meta] {
        let ttl = pttl(&mut conn, key).await;
        assert!(
            ttl > 0 && ttl <= KEEP_IDLE_MS,
            "{key} kept an idle while, no longer: {ttl}"
        );
    }
}

#[tokio::test]
async fn records_without_their_keep_field_are_taken_as_no_bookkeeping_even_by_an_uncontended_grant()
{
    // Records that lack `keep` (the field every write of them sets) hold no bookkeeping a call
    // may rely on: an uncontended grant does not take the fast path on them, but the general
    // one, which sets keep and gives the keys the idle TTL. (quiet() asks for keep
    // whether or not prune and wide are there.)
    const KEEP_IDLE_MS: i64 = 60_000;
    let (_server, mut conn, k) = start().await;
    let client = Session::new();
    let seq = client.open();
    let now = server_millis(&mut conn).await;
    let own = format!("s:{}", client.id());
    let record = format!("{:x}|{:x}|0|", seq.n(), now + 600_000);
    let () = conn.set(&k.count, 5).await.expect("SET");
    let () = conn
        .hset_multiple(
            &k.records,
            &[
                ("prune", (now + 610_000).to_string()),
                ("wide", "-".to_owned()),
                ("layout", "2".to_owned()),
                (own.as_str(), record),
            ],
        )
        .await
        .expect("HSET");
    assert_eq!(
        script::permit_acquire(
            &mut conn,
            &k,
            "a",
            1,
            false,
            LONG,
            CHANNEL,
            Caller::new(&client, seq.n())
        )
        .await
        .expect("acquire"),
        PermitAcquire::Granted
    );
    drop(seq);
    assert_eq!(available(&mut conn).await, 4);
    let keep = fields(&mut conn, &["keep"]).await;
    assert!(keep[0].is_some(), "keep set: {keep:?}");
    let ttl = pttl(&mut conn, &k.records).await;
    assert!(
        ttl > 0 && ttl <= KEEP_IDLE_MS,
        "the records kept an idle while: {ttl}"
    );
}

#[tokio::test]
async fn the_last_waiter_leaving_keeps_the_bookkeeping_an_idle_while_past_every_session_record() {
    // While someone waits, keep follows the waiters' leases (here 20 minutes); once the last
    // one leaves, the bookkeeping is kept an idle while (60 s) past the latest session
    // record's expiry (600 s after its renewal), no longer, and every key gets that TTL.
    // (Not left at the gone waiter's lease, keep and the TTL with it.)
    let (_server, mut conn, k) = start().await;
    let start = server_millis(&mut conn).await;
    set_count(&mut conn, 0).await;
    assert!(matches!(
        acquire(&mut conn, "w", 1, true, Duration::from_secs(1200)).await,
        PermitAcquire::Queued { position: 0, .. }
    ));
    assert_eq!(
        permit_withdraw(&mut conn, &k, "w").await.expect("withdraw"),
        Withdrawal::Withdrawn
    );
    let now = server_millis(&mut conn).await;
    let keep: i64 = fields(&mut conn, &["keep"]).await[0]
        .as_deref()
        .expect("keep")
        .parse()
        .expect("a number");
    assert!(
        (start + 600_000 + 60_000..=now + 600_000 + 60_000).contains(&keep),
        "keep {keep}, from {start} to {now}"
    );
    let ttl = pttl(&mut conn, &k.records).await;
    assert!(
        (600_000 + 60_000 - 10_000..=600_000 + 60_000).contains(&ttl),
        "TTL {ttl}"
    );
}
