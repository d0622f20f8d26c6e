//! Session records: one per session, pruned once expired (in the millisecond they fall due,
//! beyond one batch of prunes too), and when the next prune is due.

use super::support::*;

#[tokio::test]
async fn releases_leave_one_session_record_which_goes_once_it_expired() {
    // A release leaves no tombstone; its client's session record keeps the mark of
    // each release at or above the low mark, and is dropped once it expired.
    let (_server, mut conn, k) = start().await;
    let sessions = [Session::new(), Session::new()];
    let mut numbers = Vec::new();
    for (i, id) in ["a", "b", "c", "d"].into_iter().enumerate() {
        granted(acquire(&mut conn, req(id, 5, 1, false)).await);
        let seq = sessions[i % 2].open();
        let by = ReleaseBy::Holder(Caller::new(&sessions[i % 2], seq.n()));
        let released = lease_release(&mut conn, &k, id, "t:wake:another", by)
            .await
            .expect("release");
        assert_eq!(released.outcome, Release::Released, "{id}");
        numbers.push(seq);
    }
    let entries: Vec<(String, f64)> = conn
        .zrangebyscore_withscores(&k.leases, "-inf", "(0")
        .await
        .expect("zrange");
    let mut names: Vec<String> = entries.iter().map(|(n, _)| n.clone()).collect();
    names.sort();
    let mut want: Vec<String> = sessions.iter().map(|s| format!("s:{}", s.id())).collect();
    want.sort();
    assert_eq!(names, want, "one entry per session, negative: {entries:?}");
    for id in ["a", "b", "c", "d"] {
        let record: Option<String> = conn.hget(&k.state, format!("r:{id}")).await.expect("hget");
        assert_eq!(record, None, "{id} leaves no record");
    }
    let nt: String = conn.hget(&k.state, "nt").await.expect("hget");
    assert_eq!(nt, "2", "session records counted");

    // Their expiry passed (and the batching lag): any script drops them.
    let old = -((server_micros(&mut conn).await / 1000) as f64) + 10_000.0;
    for (name, _) in &entries {
        let () = conn.zadd(&k.leases, name, old).await.expect("zadd");
    }
    let () = conn
        .hset(&k.state, "tnext", -old as i64)
        .await
        .expect("hset");
    lease_status(&mut conn, &k)
        .await
        .expect("status (any script prunes)");
    let left: usize = conn.zcard(&k.leases).await.expect("zcard");
    assert_eq!(left, 0);
    for name in &names {
        let record: Option<String> = conn.hget(&k.state, name).await.expect("hget");
        assert_eq!(record, None, "{name}");
    }
    let nt: String = conn.hget(&k.state, "nt").await.expect("hget");
    assert_eq!(nt, "0");
}

/// Write a session record `name` (s:...) that expires at `expiry` (ms), counted in `nt`.
async fn bury_at(conn: &mut Conn, name: &str, expiry: i64) {
    let k = keys();
    let () = conn.zadd(&k.leases, name, -expiry).await.expect("zadd");
    let () = conn
        .hset(&k.state, name, format!("1|{expiry:x}|0|"))
        .await
        .expect("hset");
    let () = conn.hincr(&k.state, "nt", 1).await.expect("hincr");
}

#[tokio::test]
async fn session_records_go_at_their_expiry_and_the_next_one_is_looked_at_then() {
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    // Up to 200 tries for a call that runs within 5 ms of the time read before it (under a
    // load average of 10, 20 tries in a row took longer: the test failed on unmutated code).
    for _ in 0..200 {
        let now = server_millis(&mut conn).await;
        bury_at(&mut conn, "s:old", now - 3000).await;
        bury_at(&mut conn, "s:soon", now + 5).await;
        bury_at(&mut conn, "s:later", now + 100_000).await;
        let () = conn
            .hset(&k.state, "tnext", now - 3000)
            .await
            .expect("hset");
        lease_status(&mut conn, &k).await.expect("status");
        let after = server_millis(&mut conn).await;
        let tnext: i64 = conn.hget(&k.state, "tnext").await.expect("hget");
        let soon = lease_score(&mut conn, "s:soon").await;
        assert_eq!(
            lease_score(&mut conn, "s:old").await,
            None,
            "past its expiry"
        );
        assert_eq!(
            lease_score(&mut conn, "s:later").await,
            Some(-(now + 100_000))
        );
        if after < now + 5 {
            assert_eq!(soon, Some(-(now + 5)), "kept to its expiry");
            assert_eq!(tnext, now + 5, "the next record's expiry");
            return;
        }
        // Too slow to tell: start over.
        let () = conn
            .zrem(&k.leases, &["s:soon", "s:later"])
            .await
            .expect("zrem");
        let () = conn
            .hdel(&k.state, &["s:soon", "s:later"])
            .await
            .expect("hdel");
        let () = conn.hset(&k.state, "nt", 0).await.expect("hset");
    }
    panic!("no status call ran within 5 ms in 200 tries");
}

#[tokio::test]
async fn expired_session_records_beyond_one_prune_batch_all_go() {
    // Records are pruned 4,000 at a time; when a batch is full, more are due and the next
    // call prunes again. (Kills prune() recording no further due time after a full batch.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    let now = server_millis(&mut conn).await;
    let n = 4_100;
    let mut pipe = redis::pipe();
    for i in 0..n {
        let name = format!("s:gone{i}");
        let expiry = now - 10_000 - i64::from(i);
        pipe.zadd(&k.leases, &name, -expiry)
            .ignore()
            .hset(&k.state, &name, format!("1|{expiry:x}|0|"))
            .ignore();
    }
    pipe.hincr(&k.state, "nt", n)
        .ignore()
        .hset(&k.state, "tnext", now - 10_000 - i64::from(n))
        .ignore();
    let () = within(LIMIT, "bury", pipe.query_async(&mut conn))
        .await
        .expect("bury");
    for _ in 0..2 {
        lease_status(&mut conn, &k).await.expect("status");
    }
    let sessions: Vec<String> = conn
        .zrangebyscore(&k.leases, "-inf", "(0")
        .await
        .expect("zrangebyscore");
    assert!(sessions.is_empty(), "{} records left", sessions.len());
    let nt: String = conn.hget(&k.state, "nt").await.expect("hget");
    assert_eq!(nt, "0");
}

#[tokio::test]
async fn session_records_are_pruned_in_the_millisecond_they_fall_due() {
    // The first record's prune falls due PRUNE_LAG_MS after its expiry (tnext): a call in
    // that very millisecond prunes. (Kills prune() reading the time 5 ms early.)
    let (_server, conn, _) = start().await;
    {
        let mut conn = conn.clone();
        granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    }
    within_3_ms(&conn, |n, mut conn, k| async move {
        let name = format!("s:due{n}");
        bury_at(&mut conn, &name, 1_000).await;
        let t0 = server_millis(&mut conn).await;
        let () = conn
            .hset(&k.state, "tnext", t0 - 2_000)
            .await
            .expect("hset");
        lease_status(&mut conn, &k).await.expect("status");
        let t1 = server_millis(&mut conn).await;
        if t1 - t0 >= 4 {
            return false;
        }
        assert_eq!(
            lease_score(&mut conn, &name).await,
            None,
            "due at {t0}, the call ran within [{t0}, {t1}]"
        );
        true
    })
    .await;
}

#[tokio::test]
async fn the_first_session_record_sets_when_records_are_next_looked_at() {
    // tnext, 0 while there are no session records, becomes the first one's expiry, so that
    // records are pruned once expired. (Kills mark() leaving tnext at 0.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    let tnext: Option<String> = conn.hget(&k.state, "tnext").await.expect("hget");
    assert!(
        matches!(tnext.as_deref(), None | Some("0")),
        "no session record yet: {tnext:?}"
    );
    let before = server_millis(&mut conn).await;
    release(&mut conn, &k, "a").await.expect("release");
    let tnext: i64 = conn.hget(&k.state, "tnext").await.expect("hget");
    assert!(
        tnext >= before + 600_000,
        "tnext {tnext} is the record's expiry, 10 min after {before}"
    );
}
