//! Live keys carry no TTL; idle ones expire, and the idle deadline moves only when it comes
//! within its margin; calls on a semaphore that does not exist write nothing.

use super::support::*;

#[tokio::test]
async fn live_keys_carry_no_ttl_and_idle_ones_expire_and_tokens_survive_their_loss() {
    let (_server, mut conn, k) = start().await;
    let (first, _) = granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    acquire(&mut conn, req("w", 1, 1, true)).await; // a conflict: nothing queued
    for key in &k.all {
        let ttl: i64 = conn.pttl(key).await.expect("pttl");
        assert!(
            ttl == -1 || ttl == -2,
            "{key} is live and must not expire: {ttl}"
        );
    }
    let released = lease_release(&mut conn, &k, "a", "t:wake:another", by("1"))
        .await
        .expect("release");
    assert!(released.idle, "the release left it idle");
    let ttl: i64 = conn.pttl(&k.state).await.expect("pttl");
    assert_eq!(ttl, -1, "the release leaves the TTL to lease_tidy");
    // Taken again before the tidy: the tidy leaves live keys alone.
    granted(acquire(&mut conn, req("again", 2, 1, false)).await);
    lease_tidy(&mut conn, &k).await.expect("tidy");
    let ttl: i64 = conn.pttl(&k.state).await.expect("pttl");
    assert_eq!(ttl, -1, "live again: no TTL");
    assert!(
        lease_release(&mut conn, &k, "again", "t:wake:another", by("2"))
            .await
            .expect("release")
            .idle
    );
    lease_tidy(&mut conn, &k).await.expect("tidy");
    // Idle: the state and the session record expire within the hour, the bitmap is gone.
    for key in [&k.leases, &k.state] {
        let ttl: i64 = conn.pttl(key).await.expect("pttl");
        assert!(ttl > 3_500_000 && ttl <= 3_600_000, "{key}: {ttl}");
    }
    let slots: bool = conn.exists(&k.slots).await.expect("exists");
    assert!(!slots, "no bitmap while nothing is held");

    // Everything lost (expired, evicted, flushed): the next token is still larger.
    let _: () = conn.del(&k.all[..]).await.expect("del");
    let (next, _) = granted(acquire(&mut conn, req("b", 1, 1, false)).await);
    assert!(next > first, "{first} -> {next}");
}

#[tokio::test]
async fn calls_on_a_semaphore_that_does_not_exist_create_no_key() {
    // (Kills lease_prelude.lua's `if not S.cap then return` skipped in keep(): an idle TTL
    // and its deadline written into a state that has no capacity.)
    let (_server, mut conn, k) = start().await;
    assert_eq!(
        release(&mut conn, &k, "nobody").await.expect("release"),
        Release::NotHeld
    );
    let polled = poll(&mut conn, "nobody").await;
    assert_eq!(polled, Acquire::Gone);
    lease_tidy(&mut conn, &k).await.expect("tidy");
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(status.capacity, None);
    // A withdrawal naming an unanswered enqueue marks nothing where there is no semaphore.
    let own = Session::new();
    let withdrawal = ReleaseBy::Withdrawal {
        session: &own,
        pending: Some(7),
    };
    let withdrawn = lease_release(&mut conn, &k, "nobody", CHANNEL, withdrawal)
        .await
        .expect("withdraw");
    assert_eq!(withdrawn.outcome, Release::NotHeld);
    let left: usize = conn.exists(&k.all[..]).await.expect("exists");
    assert_eq!(left, 0, "no key written");
}

#[tokio::test]
async fn calls_on_an_idle_semaphore_leave_its_idle_deadline_where_it_is() {
    // The idle TTL moves only when it comes within a margin of where it should be: calls on
    // an idle semaphore neither take it off nor push it out. (Kills the live-state test in
    // keep() taking an idle state for a live one, and the counter check in load() repairing
    // an idle state on every call.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 1, 1, false)).await);
    assert_eq!(
        release(&mut conn, &k, "a").await.expect("release"),
        Release::Released
    );
    lease_tidy(&mut conn, &k).await.expect("tidy");
    let deadline = |conn: &mut Conn| {
        let mut conn = conn.clone();
        async move {
            let at: i64 = redis::cmd("PEXPIRETIME")
                .arg(&keys().state)
                .query_async(&mut conn)
                .await
                .expect("PEXPIRETIME");
            at
        }
    };
    let first = deadline(&mut conn).await;
    assert!(first > 0, "the idle state has its TTL: {first}");
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert_eq!(
        release(&mut conn, &k, "nobody").await.expect("release"),
        Release::NotHeld
    );
    assert_eq!(
        deadline(&mut conn).await,
        first,
        "after a release of nothing"
    );
    lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(deadline(&mut conn).await, first, "after a status");
    lease_tidy(&mut conn, &k).await.expect("tidy");
    assert_eq!(deadline(&mut conn).await, first, "after a tidy");
}

#[tokio::test]
async fn the_idle_deadline_moves_only_once_it_comes_within_its_margin() {
    // An idle state's TTL is moved when it would end within a minute (KEEP_MARGIN_MS), not
    // before. (Kills needs_idle_ttl() reading the time 5 ms late.)
    let (_server, conn, k) = start().await;
    {
        let mut conn = conn.clone();
        granted(acquire(&mut conn, req("a", 1, 1, false)).await);
        release(&mut conn, &k, "a").await.expect("release");
        lease_tidy(&mut conn, &k).await.expect("tidy");
    }
    within_3_ms(&conn, |_, mut conn, k| async move {
        let t0 = server_millis(&mut conn).await;
        let at = t0 + 60_000 + 3;
        let () = redis::pipe()
            .hset(&k.state, "idle", at)
            .ignore()
            .cmd("PEXPIREAT")
            .arg(&k.state)
            .arg(at)
            .ignore()
            .query_async(&mut conn)
            .await
            .expect("set the deadline");
        lease_status(&mut conn, &k).await.expect("status");
        let t1 = server_millis(&mut conn).await;
        let now: i64 = redis::cmd("PEXPIRETIME")
            .arg(&k.state)
            .query_async(&mut conn)
            .await
            .expect("PEXPIRETIME");
        if t1 - t0 >= 3 {
            return false; // the status may have run within the margin: try again
        }
        assert_eq!(now, at, "a deadline more than a minute ahead is left alone");
        true
    })
    .await;
}

/// Sets an idle state's deadline (`idle` and the TTL of KEYS[1]) to the Redis time plus
/// ARGV[1] ms; answers the deadline.
const PLANT_IDLE: &str = "local t = redis.call('TIME') \
    local at = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000) + tonumber(ARGV[1])) \
    redis.call('HSET', KEYS[1], 'idle', at) \
    redis.call('PEXPIREAT', KEYS[1], at) \
    return at";

#[tokio::test]
async fn an_idle_deadline_exactly_a_margin_ahead_is_left_alone() {
    // The TTL moves once the deadline is *less* than a minute (KEEP_MARGIN_MS) ahead. Set by
    // a script in the same MULTI as a status, the deadline is a minute ahead of the status's
    // millisecond, or less if a millisecond passed between them (then it moves, rightly): of
    // 20 tries, most run in one millisecond and leave it alone. (Kills needs_idle_ttl()
    // moving it at exactly a minute, which would move it every time.)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 1, 1, false)).await);
    release(&mut conn, &k, "a").await.expect("release");
    lease_tidy(&mut conn, &k).await.expect("tidy");
    let mut left_alone = 0;
    for _ in 0..20 {
        let (planted, _): (String, Value) = within(
            LIMIT,
            "MULTI",
            redis::pipe()
                .atomic()
                .add_command(eval(PLANT_IDLE, &[&k.state]))
                .arg(60_000)
                .add_command(multi_call(&LEASE_STATUS))
                .query_async(&mut conn),
        )
        .await
        .expect("MULTI");
        let idle: String = conn.hget(&k.state, "idle").await.expect("hget");
        if idle == planted {
            left_alone += 1;
        }
    }
    assert!(left_alone > 0, "moved in all 20 tries");
}
