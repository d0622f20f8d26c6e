//! Pruning the session records: about one call in 16 prunes, each record once its expiry has
//! passed, a thousand at once.

use super::support::*;

/// Count down the test latch, a call `c<n>` at a time, until `pruned` says after a call that
/// it pruned: about one call in 16 prunes (by the time's low bits). How many calls it took.
async fn count_down_until(conn: &mut Conn, mut pruned: impl AsyncFnMut(&mut Conn) -> bool) -> u32 {
    let k = lk();
    let mut calls = 0;
    within(LIMIT, "a prune", async {
        loop {
            calls += 1;
            latch_count_down(conn, &k, caller(&format!("c{calls}")))
                .await
                .expect("down");
            if pruned(conn).await {
                break;
            }
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    })
    .await;
    calls
}

#[tokio::test]
async fn the_records_of_sessions_gone_quiet_are_pruned_and_live_ones_kept() {
    let (_server, mut conn, k) = start_with_count(1_000_000).await;
    // A session record past its expiry, and an id left by a client of layout 1.
    let () = redis::pipe()
        .hset(&k.sessions, "s:gone", "1|1000|1|,1=C")
        .zadd(&k.applied, "s:gone", 1000)
        .zadd(&k.applied, "layout-1-id", 2000)
        .query_async(&mut conn)
        .await
        .expect("seed");
    let calls = count_down_until(&mut conn, async |conn| {
        let left: Vec<String> = conn.zrange(&k.applied, 0, -1).await.expect("zrange");
        !left.iter().any(|m| m == "s:gone" || m == "layout-1-id")
    })
    .await;
    println!("pruned after {calls} count-downs");
    let gone: Option<String> = conn.hget(&k.sessions, "s:gone").await.expect("hget");
    assert_eq!(gone, None, "the record went with its index entry");
    let live: Option<String> = conn
        .hget(&k.sessions, format!("s:{}", session().id()))
        .await
        .expect("hget");
    assert!(live.is_some(), "the live session's record is kept");
}

#[tokio::test]
async fn a_thousand_records_due_at_once_are_all_pruned() {
    // One prune drops up to 1,000 records, written back in one HDEL slice. (Kills the
    // write-back's slices leaving one name out of each.)
    let (_server, mut conn, k) = start_with_count(1_000_000).await;
    let mut pipe = redis::pipe();
    for i in 0..1_000 {
        let name = format!("s:old{i}");
        pipe.hset(&k.sessions, &name, "1|1|0|")
            .ignore()
            .zadd(&k.applied, &name, 1 + i)
            .ignore();
    }
    let () = within(LIMIT, "bury", pipe.query_async(&mut conn))
        .await
        .expect("bury");
    count_down_until(&mut conn, async |conn| {
        let left: usize = conn.zcard(&k.applied).await.expect("zcard");
        left == 1
    })
    .await;
    let records: usize = conn.hlen(&k.sessions).await.expect("hlen");
    assert_eq!(records, 1, "only the live session's record is left");
}

#[tokio::test]
async fn a_record_is_pruned_only_once_its_expiry_has_passed() {
    // A record whose expiry is a few ms ahead (planted in the same MULTI as the call) is
    // kept by a prune in that call. (Kills the prune taking records due within 5 ms.)
    let (_server, mut conn, _) = start().await;
    let edge = edge_at_the_first_prune(&mut conn, 3).await;
    assert!(edge.is_some(), "a record not yet expired was pruned");
}

/// A raw `latch_count_down` of the test latch numbered `seq` in the test session, to add to a
/// `MULTI` (the script loaded first: [`load_for_multi`]).
fn count_down_call(seq: u64, pipe: &mut redis::Pipeline) -> &mut redis::Pipeline {
    let k = lk();
    raw(&LATCH_COUNT_DOWN)
        .key(&k.all[..])
        .arg(Hex(seq))
        .arg(session().id())
        .arg(Hex(session().low()))
        .arg(&k.channel)
        .add_to(pipe)
}

/// Count down a latch (each call in one MULTI with a script that plants two session
/// records: `s:old`, long expired, and `s:edge`, expiring `offset` ms from the call's own
/// time) until a call prunes (`s:old` gone): `s:edge`'s index entry then, if kept.
async fn edge_at_the_first_prune(conn: &mut Conn, offset: i64) -> Option<f64> {
    let k = lk();
    set_count(conn, 1_000_000).await;
    load_for_multi(conn, &LATCH_COUNT_DOWN).await;
    let plant = redis::Script::new(
        r"local t = redis.call('TIME')
        local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
        redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), 's:edge', 1, 's:old')
        redis.call('HSET', KEYS[2], 's:edge', '1|1|0|', 's:old', '1|1|0|')
        return now",
    );
    load_script(conn, &plant).await;
    for round in 0..2_000 {
        let seq = number(&format!("round {round}"));
        let mut pipe = redis::pipe();
        pipe.atomic()
            .invoke_script(plant.key(&k.applied).key(&k.sessions).arg(offset));
        count_down_call(seq, &mut pipe);
        let (_, _): (i64, Value) = within(LIMIT, "plant and count down", pipe.query_async(conn))
            .await
            .expect("exec");
        let old: Option<f64> = conn.zscore(&k.applied, "s:old").await.expect("zscore");
        if old.is_none() {
            return conn.zscore(&k.applied, "s:edge").await.expect("zscore");
        }
    }
    panic!("no call pruned in 2,000 rounds");
}

#[tokio::test]
async fn a_call_prunes_only_in_a_millisecond_divisible_by_16() {
    // About one call in 16 prunes, chosen by the time's low bits: a call in any other
    // millisecond leaves a record past its expiry alone. Each round plants the record and
    // reads the time on both sides of the count-down in one MULTI; a round whose two times
    // agree tells the call's millisecond. (Kills the prune test inverted: 15 calls in 16.)
    let (_server, mut conn, k) = start_with_count(1_000_000).await;
    load_for_multi(&mut conn, &LATCH_COUNT_DOWN).await;
    let plant = redis::Script::new(
        r"local t = redis.call('TIME')
        redis.call('ZADD', KEYS[1], 1, 's:old')
        redis.call('HSET', KEYS[2], 's:old', '1|1|0|')
        return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)",
    );
    let clock = redis::Script::new(
        r"local t = redis.call('TIME')
        return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)",
    );
    load_script(&mut conn, &clock).await;
    load_script(&mut conn, &plant).await;
    let mut told = 0;
    for round in 0..200 {
        let seq = number(&format!("round {round}"));
        let mut pipe = redis::pipe();
        pipe.atomic()
            .invoke_script(plant.key(&k.applied).key(&k.sessions));
        count_down_call(seq, &mut pipe).invoke_script(&clock.prepare_invoke());
        let (before, _, after): (i64, Value, i64) = within(
            LIMIT,
            "plant, count down, read the time",
            pipe.query_async(&mut conn),
        )
        .await
        .expect("exec");
        if before != after || before % 16 == 0 {
            continue;
        }
        told += 1;
        let old: Option<f64> = conn.zscore(&k.applied, "s:old").await.expect("zscore");
        assert!(old.is_some(), "a call at {before} pruned");
        if told == 10 {
            return;
        }
    }
    assert!(told > 0, "no round told its call's millisecond");
}

#[tokio::test]
async fn a_record_whose_expiry_is_the_calls_millisecond_is_pruned_by_it() {
    // A record is due from its expiry on: planted in the same MULTI as the call, its expiry is
    // the call's millisecond or a few before, and a call that prunes drops it with the long
    // expired one. (Kills the prune skipping records due within the last 5 ms.)
    let (_server, mut conn, _) = start().await;
    let edge = edge_at_the_first_prune(&mut conn, 0).await;
    assert_eq!(
        edge, None,
        "a record due at the call's millisecond was kept"
    );
}
