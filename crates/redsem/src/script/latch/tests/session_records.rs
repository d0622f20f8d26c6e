//! Session records: one small record per session, kept through eviction while counting and
//! ten minutes after the latch opened; late copies of answered calls never applied.

use super::support::*;

/// Set the latch to `count` by a call of session `s` (which is answered).
async fn set_in(conn: &mut Conn, k: &LatchKeys, s: &Arc<Session>, count: u64) {
    let seq = s.open();
    assert!(
        latch_try_set(conn, k, count, Caller::new(s, seq.n()))
            .await
            .expect("set")
    );
}

#[tokio::test]
async fn a_counting_latch_keeps_its_session_records_through_volatile_lru_eviction() {
    let server = start_server(&["--maxmemory-policy", "volatile-lru"]);
    let mut conn = connect(&server).await;
    let l = lk();
    set_count(&mut conn, 3).await;
    assert_eq!(
        latch_count_down(&mut conn, &l, caller("c1"))
            .await
            .expect("down"),
        CountDown::Counted(2)
    );
    let ttls = [
        pttl(&mut conn, &l.applied).await,
        pttl(&mut conn, &l.sessions).await,
    ];
    println!("PTTL of a counting latch's session index and records: {ttls:?}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    evict_by_filling(&mut conn, 5000).await;
    let resent = latch_count_down(&mut conn, &l, caller("c1"))
        .await
        .expect("resent");
    println!("a count-down resent after the evictions: {resent:?}");
    assert_eq!(resent, CountDown::Repeated(2));
    assert_eq!(ttls, [-1, -1]);
    // Opened: the records are idle state and expire. (No memory limit any more, or the keys
    // would be evicted the moment they get their TTL.)
    let () = redis::cmd("CONFIG")
        .arg(&["SET", "maxmemory", "0"])
        .query_async(&mut conn)
        .await
        .expect("CONFIG SET");
    latch_count_down(&mut conn, &l, caller("c2"))
        .await
        .expect("down");
    latch_count_down(&mut conn, &l, caller("c3"))
        .await
        .expect("down");
    assert!(pttl(&mut conn, &l.applied).await > 0);
    assert!(pttl(&mut conn, &l.sessions).await > 0);
    // Set again: they stop expiring.
    assert!(
        latch_try_set(&mut conn, &l, 1, caller("s2"))
            .await
            .expect("set")
    );
    assert_eq!(pttl(&mut conn, &l.applied).await, -1);
    assert_eq!(pttl(&mut conn, &l.sessions).await, -1);
}

#[tokio::test]
async fn an_opened_latch_keeps_its_session_records_ten_minutes_from_its_redis_time() {
    let (_server, mut conn, k) = start_with_count(1).await;
    let before = server_millis(&mut conn).await;
    latch_count_down(&mut conn, &k, caller("r"))
        .await
        .expect("count down");
    let after = server_millis(&mut conn).await;
    for key in [&k.applied, &k.sessions] {
        let at: i64 = redis::cmd("PEXPIRETIME")
            .arg(key)
            .query_async(&mut conn)
            .await
            .expect("PEXPIRETIME");
        assert!(
            (before + 600_000..=after + 600_000).contains(&at),
            "{key}: {at} is not ten minutes after {before}..{after}"
        );
    }
    // A resend of the count-down that opened it, within that time, finds its mark.
    assert_eq!(
        latch_count_down(&mut conn, &k, caller("r"))
            .await
            .expect("resent"),
        CountDown::Repeated(0)
    );
    assert_eq!(
        latch_count_down(&mut conn, &k, caller("r2"))
            .await
            .expect("new"),
        CountDown::Absent
    );
}

#[tokio::test]
async fn a_late_copy_of_a_count_down_answered_is_never_applied() {
    let (_server, mut conn, k) = start().await;
    let s = Session::new();
    set_in(&mut conn, &k, &s, 5).await;
    let first = s.open();
    let n = first.n();
    assert_eq!(
        latch_count_down(&mut conn, &k, Caller::new(&s, n))
            .await
            .expect("down"),
        CountDown::Counted(4)
    );
    drop(first);
    // The next call carries a low mark above the first's number: its mark goes.
    let second = s.open();
    assert_eq!(
        latch_count_down(&mut conn, &k, Caller::new(&s, second.n()))
            .await
            .expect("down"),
        CountDown::Counted(3)
    );
    let record: String = conn
        .hget(&k.sessions, format!("s:{}", s.id()))
        .await
        .expect("hget");
    assert!(
        !record.contains(&format!(",{}=", Hex(n))),
        "the first call's mark went: {record}"
    );
    // A late copy of the first (below the low mark) changes nothing, nor of a try_set.
    assert_eq!(
        latch_count_down(&mut conn, &k, Caller::new(&s, n))
            .await
            .expect("late copy"),
        CountDown::Repeated(3)
    );
    let count: i64 = conn.get(&k.count).await.expect("get");
    assert_eq!(count, 3);
    assert!(
        latch_try_set(&mut conn, &k, 9, Caller::new(&s, n))
            .await
            .expect("late copy")
    );
    let _: () = conn.del(&k.count).await.expect("del");
    assert!(
        latch_try_set(&mut conn, &k, 9, Caller::new(&s, n))
            .await
            .expect("late copy")
    );
    let count: Option<i64> = conn.get(&k.count).await.expect("get");
    assert_eq!(count, None, "a late copy of a try_set sets nothing");
}

#[tokio::test]
async fn a_latch_keeps_one_small_record_per_session_however_many_calls_it_made() {
    let (_server, mut conn, k) = start().await;
    let s = Session::new();
    set_in(&mut conn, &k, &s, 1000).await;
    for left in (500..1000).rev() {
        let seq = s.open();
        assert_eq!(
            latch_count_down(&mut conn, &k, Caller::new(&s, seq.n()))
                .await
                .expect("down"),
            CountDown::Counted(left)
        );
    }
    let records: Vec<(String, String)> = conn.hgetall(&k.sessions).await.expect("hgetall");
    let index: Vec<(String, f64)> = conn
        .zrange_withscores(&k.applied, 0, -1)
        .await
        .expect("zrange");
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(index.len(), 1, "{index:?}");
    assert_eq!(records[0].0, format!("s:{}", s.id()));
    assert_eq!(index[0].0, records[0].0);
    assert!(
        records[0].1.len() < 64,
        "one mark at most: {}",
        records[0].1
    );
}
