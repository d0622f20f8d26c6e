//! The uncontended fast paths (a grant with nobody queued and its release): they take only
//! what they can do alone and leave what is due to the general path, with the same effects.

use super::support::*;

/// Every command the server ran, but the test's own (the operations' `EVALSHA`, `FCALL` or,
/// with the module under test, `REDSEM.<OPERATION>`).
async fn commands_run(conn: &mut Conn) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(conn)
        .await
        .expect("INFO");
    info.lines()
        .filter(|l| l.starts_with("cmdstat_"))
        .filter(|l| !l.starts_with("cmdstat_evalsha:") && !l.starts_with("cmdstat_fcall:"))
        .filter(|l| !l.starts_with("cmdstat_redsem."))
        .filter(|l| !l.starts_with("cmdstat_config"))
        .filter(|l| !l.starts_with("cmdstat_info:"))
        .filter_map(|l| {
            l.split("calls=")
                .nth(1)?
                .split(',')
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

#[tokio::test]
async fn an_uncontended_cycle_runs_at_most_eleven_commands_inside_the_scripts() {
    // A try_acquire and its release took 18 commands once, then 10 with tombstones; now the
    // release removes its record (HDEL) and its lease entry (ZREM) and marks the session in
    // the counters' HSET, where a tombstone overwrote the record and the entry: one more.
    let (_server, mut conn, k) = start().await;
    // Warm up: scripts loaded, the state exists.
    granted(acquire(&mut conn, req("warm", 5, 1, false)).await);
    release(&mut conn, &k, "warm").await.expect("release");
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query_async(&mut conn)
        .await
        .expect("RESETSTAT");
    let cycles = 20;
    for i in 0..cycles {
        let id = format!("c{i}");
        granted(acquire(&mut conn, req(&id, 5, 1, false)).await);
        assert_eq!(
            release(&mut conn, &k, &id).await.expect("release"),
            Release::Released
        );
    }
    let per_cycle = commands_run(&mut conn).await as f64 / f64::from(cycles);
    println!("commands inside the scripts per uncontended cycle: {per_cycle}");
    assert!(per_cycle <= 11.0, "{per_cycle} commands per cycle");
}

#[tokio::test]
async fn the_uncontended_fast_paths_leave_what_is_due_to_the_general_path() {
    // A grant with nobody queued and the release of such a grant are written
    // straight to the keys (fast_acquire, fast_release) only while nothing is due. Each case
    // below is one the fast path must leave: taken anyway, its effect would be missing.
    let (_server, mut conn, k) = start().await;

    // The keys of an idle semaphore carry a TTL: the next grant takes it off.
    granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    assert!(
        lease_release(&mut conn, &k, "a", "t:wake:another", by("1"))
            .await
            .expect("release")
            .idle
    );
    lease_tidy(&mut conn, &k).await.expect("tidy");
    let ttl: i64 = conn.pttl(&k.state).await.expect("pttl");
    assert!(ttl > 0, "idle keys expire: {ttl}");
    granted(acquire(&mut conn, req("b", 2, 1, false)).await);
    for key in [&k.leases, &k.state] {
        let ttl: i64 = conn.pttl(key).await.expect("pttl");
        assert_eq!(ttl, -1, "{key} is live again and must not expire");
    }

    // A holder whose lease ended: the next grant drops it before counting the room.
    let past = server_millis(&mut conn).await - 1_000;
    let () = conn.zadd(&k.leases, "b", past).await.expect("zadd");
    let () = conn.hset(&k.state, "next", past).await.expect("hset");
    granted(acquire(&mut conn, req("c", 2, 1, false)).await);
    // (Read raw: any script, lease_status too, would settle it now.)
    let (used, b): (String, Option<String>) = state_fields_raw(&mut conn, &["used", "r:b"]).await;
    assert_eq!((used.as_str(), b), ("1", None), "b's lease had ended");

    // A session record past its expiry: a release prunes it.
    let old = server_millis(&mut conn).await - 700_000;
    let () = conn.zadd(&k.leases, "s:old", -old).await.expect("zadd");
    let () = conn.hset(&k.state, "s:old", "1|1|").await.expect("hset");
    let () = conn.hincr(&k.state, "nt", 1).await.expect("hincr");
    let () = conn.hset(&k.state, "tnext", old).await.expect("hset");
    assert_eq!(
        release(&mut conn, &k, "c").await.expect("release"),
        Release::Released
    );
    let record: Option<String> = conn.hget(&k.state, "s:old").await.expect("hget");
    assert_eq!(record, None, "the expired session record was pruned");
    let released: Option<String> = conn.hget(&k.state, "r:c").await.expect("hget");
    assert_eq!(released, None, "c leaves no record");
    let own: String = conn
        .hget(&k.state, format!("s:{}", session().id()))
        .await
        .expect("hget");
    assert!(
        own.contains(&format!(",{}=R", Hex(number("release c")))),
        "c's release is marked: {own}"
    );
}

#[tokio::test]
async fn counters_that_disagree_keep_a_request_off_the_fast_path() {
    // Units in use 0 while a holder is counted: the fast path declines (the general path
    // repairs first), so the new grant never takes a held slot. (Kills quiet() admitting
    // counters that disagree.)
    let (_server, mut conn, k) = start().await;
    let (_, held) = granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    assert_eq!(held, vec![0]);
    let () = conn.hset(&k.state, "used", "0").await.expect("hset");
    let (_, slots) = granted(acquire(&mut conn, req("b", 2, 1, false)).await);
    assert_eq!(slots, vec![1], "slot 0 is a's");
}

#[tokio::test]
async fn a_fast_grant_with_a_shorter_lease_counts_its_unit() {
    // A grant whose lease ends before every other (it writes the new first end too) counts
    // its unit and its holder like any other. (Kills that write counting no unit.)
    let (_server, mut conn, _) = start().await;
    granted(acquire(&mut conn, req("a", 3, 1, false)).await);
    let short = Request {
        lease: Duration::from_secs(5),
        ..req("b", 3, 1, false)
    };
    granted(acquire(&mut conn, short).await);
    let (used, nh): (String, String) = state_fields_raw(&mut conn, &["used", "nh"]).await;
    assert_eq!((used.as_str(), nh.as_str()), ("2", "2"));
}

#[tokio::test]
async fn a_release_of_a_holder_of_several_units_takes_the_general_path() {
    // The fast release serves single units only; any other holder's release, by a session
    // whose record needs no renewal, goes to the general path. (Kills the fast release going
    // on without a slot.)
    let (_server, mut conn, k) = start().await;
    let own = session_past_a_release(&mut conn, 3).await;
    granted(acquire(&mut conn, req("big", 3, 2, false)).await);
    assert_eq!(
        release_in(&mut conn, "big", &own).await.expect("release"),
        Release::Released
    );
    let status = lease_status(&mut conn, &k).await.expect("status");
    assert_eq!(status.in_use, 0);
}

#[tokio::test]
async fn a_fast_grant_ends_a_lease_after_its_redis_time() {
    // The second grant on a semaphore takes the fast path (the first makes the state): its
    // lease too ends `lease` ms after the call's Redis time. (Kills fast_acquire()'s lease
    // end read 5 ms early.)
    let (_server, conn, _) = start().await;
    {
        let mut conn = conn.clone();
        granted(acquire(&mut conn, req("first", 1_000, 1, false)).await);
    }
    within_3_ms(&conn, |n, mut conn, _| async move {
        let id = format!("f{n}");
        let t0 = server_millis(&mut conn).await;
        granted(acquire(&mut conn, req(&id, 1_000, 1, false)).await);
        let t1 = server_millis(&mut conn).await;
        assert_ends_after(&mut conn, &id, (t0, t1), 30_000, "a lease").await;
        t1 - t0 < 3
    })
    .await;
}

#[tokio::test]
async fn a_lease_that_ends_in_the_very_millisecond_of_a_request_is_settled_first() {
    // A holder whose lease ends in the request's own millisecond is gone for that request:
    // neither the fast path (which would not settle it) nor the settle may keep it, so the
    // new grant takes its slot. Set by a script in the same MULTI as the request, the lease's
    // end (and `next`) is the request's millisecond or one just before it. (Kills quiet()
    // taking a lease that ends now for a live one, and settle() reading the time 5 ms early.)
    let (_server, mut conn, k) = start().await;
    for round in 0..20 {
        let _: () = conn.del(&k.all[..]).await.expect("del");
        let (a, b) = (format!("a{round}"), format!("b{round}"));
        let (_, held) = granted(acquire(&mut conn, req(&a, 2, 1, false)).await);
        assert_eq!(held, vec![0]);
        let r = req(&b, 2, 1, false);
        let (_, reply): (String, Value) = within(
            LIMIT,
            "MULTI",
            plant_now(&k.leases, &a, &k.state, "next")
                .add_command(multi_try_acquire(&r))
                .query_async(&mut conn),
        )
        .await
        .expect("MULTI");
        let (_, slots) = granted(decode_acquire("lease_acquire", reply).expect("decode"));
        assert_eq!(
            slots,
            vec![0],
            "round {round}: {a}'s lease had ended, its slot is free"
        );
    }
}

#[tokio::test]
async fn a_fast_grant_with_a_longer_lease_leaves_the_first_lease_end_where_it_was() {
    // `next` says when the first lease ends; a grant whose lease ends later must not move it,
    // or an ended lease would be settled only at the later end. (Kills fast_acquire()
    // writing `next` for every grant.)
    let (_server, mut conn, k) = start().await;
    let short = Request {
        lease: Duration::from_millis(100),
        ..req("short", 3, 1, false)
    };
    granted(acquire(&mut conn, short).await);
    granted(acquire(&mut conn, req("long", 3, 1, false)).await);
    tokio::time::sleep(Duration::from_millis(200)).await;
    let status = lease_status(&mut conn, &k).await.expect("status");
    let ids: Vec<&str> = status.holders.iter().map(|h| h.id.as_str()).collect();
    assert_eq!(ids, vec!["long"], "short's lease ended: settled");
    assert_eq!(status.in_use, 1);
}

#[tokio::test]
async fn a_fast_release_counts_its_holder_out() {
    // (Kills fast_release() leaving the holder count as it was.)
    let (_server, mut conn, _) = start().await;
    let own = session_past_a_release(&mut conn, 2).await;
    granted(acquire(&mut conn, req("a", 2, 1, false)).await);
    granted(acquire(&mut conn, req("b", 2, 1, false)).await);
    release_in(&mut conn, "a", &own).await.expect("release");
    let (used, nh): (String, String) = state_fields_raw(&mut conn, &["used", "nh"]).await;
    assert_eq!((used.as_str(), nh.as_str()), ("1", "1"));
}

/// Buries the session record KEYS[2]'s field ARGV[1] (and its entry in KEYS[1]) 3 s past its
/// expiry, and makes the first prune due (`tnext`) in this very millisecond.
const PLANT_PRUNE_DUE: &str = "local t = redis.call('TIME') \
    local now = t[1] * 1000 + math.floor(t[2] / 1000) \
    redis.call('ZADD', KEYS[1], string.format('%d', 3000 - now), ARGV[1]) \
    redis.call('HSET', KEYS[2], ARGV[1], string.format('1|%x|0|', now - 3000)) \
    redis.call('HINCRBY', KEYS[2], 'nt', 1) \
    redis.call('HSET', KEYS[2], 'tnext', string.format('%d', now - 2000)) \
    return string.format('%d', now)";

#[tokio::test]
async fn a_grant_in_the_millisecond_a_prune_falls_due_prunes() {
    // The prune falls due PRUNE_LAG_MS after `tnext`: a grant in that very millisecond leaves
    // the fast path (which does not prune) for the general one. Planted by a script in the
    // same MULTI, the due time is the grant's millisecond or one before it: pruned either
    // way. (Kills quiet() taking "due now" for "not due".)
    let (_server, mut conn, k) = start().await;
    granted(acquire(&mut conn, req("a", 64, 1, false)).await);
    for round in 0..20 {
        let (id, dead) = (format!("c{round}"), format!("s:dead{round}"));
        let r = req(&id, 64, 1, false);
        let (_, reply): (String, Value) = within(
            LIMIT,
            "MULTI",
            redis::pipe()
                .atomic()
                .add_command(eval(PLANT_PRUNE_DUE, &[&k.leases, &k.state]))
                .arg(&dead)
                .add_command(multi_try_acquire(&r))
                .query_async(&mut conn),
        )
        .await
        .expect("MULTI");
        granted(decode_acquire("lease_acquire", reply).expect("decode"));
        assert_eq!(lease_score(&mut conn, &dead).await, None, "round {round}");
    }
}

#[tokio::test]
async fn a_fast_release_frees_its_slot_for_the_next_grant() {
    // The fast release clears its slot's bit: with another unit held (so the grant searches
    // the bitmap), the next grant takes the slot freed. (Kills the fast release leaving the
    // bit set.)
    let (_server, mut conn, _) = start().await;
    let own = session_past_a_release(&mut conn, 3).await;
    let (_, a) = granted(acquire(&mut conn, req("a", 3, 1, false)).await);
    let (_, b) = granted(acquire(&mut conn, req("b", 3, 1, false)).await);
    assert_eq!((a, b), (vec![0], vec![1]));
    release_in(&mut conn, "a", &own).await.expect("release");
    let (_, c) = granted(acquire(&mut conn, req("c", 3, 1, false)).await);
    assert_eq!(c, vec![0], "a's slot, freed");
}
