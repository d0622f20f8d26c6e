//! A lease semaphore's sorted sets are kept as skip lists by the native paths once they hold
//! a crowd (`skiplist-at`, 16 members unless told), with the same contents as the listpacks
//! Redis would keep: the padding member that converts them is never left behind, a member of
//! that name written by someone else is left alone, and a replica gets the same contents.

mod support;

use redis::{Connection, Value};
use redsem_test::RedisServer;
use support::{LEASE, module};

/// A server with the module loaded, its load arguments `extra`, and more server arguments.
fn server(extra: &[&str], server_args: &[&str]) -> RedisServer {
    let module = module();
    let mut args = vec!["--loadmodule", module.to_str().expect("a UTF-8 path")];
    args.extend_from_slice(extra);
    args.extend_from_slice(server_args);
    RedisServer::start_with(&args)
}

fn encoding(conn: &mut Connection, key: &str) -> String {
    redis::cmd("OBJECT")
        .arg("ENCODING")
        .arg(key)
        .query(conn)
        .unwrap_or_else(|e| panic!("OBJECT ENCODING {key}: {e}"))
}

/// Everything a lease semaphore's keys hold: each sorted set by score, the state hash (its
/// fields sorted) and the slot bitmap.
fn contents(conn: &mut Connection) -> Vec<Value> {
    let mut all = Vec::new();
    for key in [LEASE[0], LEASE[1]] {
        all.push(
            redis::cmd("ZRANGE")
                .arg(key)
                .arg(0)
                .arg(-1)
                .arg("WITHSCORES")
                .query(conn)
                .expect("ZRANGE"),
        );
    }
    all.push(Value::Array(
        state(conn)
            .into_iter()
            .flat_map(|(n, x)| [Value::BulkString(n), Value::BulkString(x)])
            .collect(),
    ));
    all.push(redis::cmd("GET").arg(LEASE[3]).query(conn).expect("GET"));
    all
}

/// The state hash's fields, sorted by name.
fn state(conn: &mut Connection) -> Vec<(Vec<u8>, Vec<u8>)> {
    let mut fields: Vec<(Vec<u8>, Vec<u8>)> = redis::cmd("HGETALL")
        .arg(LEASE[2])
        .query(conn)
        .expect("HGETALL");
    fields.sort();
    fields
}

/// The names of the state hash's fields (tokens and times differ between two servers: the
/// names, and the sets' members, are what two runs share).
fn field_names(conn: &mut Connection) -> Vec<Vec<u8>> {
    state(conn).into_iter().map(|(name, _)| name).collect()
}

/// On a lease of `cap` units: `holders` try acquires, then `waiters` waiting acquires, then
/// the first `released` holders released (each grants the head waiter). The calls are
/// numbered, and their ids too, from `start`.
fn crowd_from(
    conn: &mut Connection,
    start: usize,
    (cap, holders, waiters, released): (usize, usize, usize, usize),
) {
    let mut seq = 2 * start as u64;
    let mut next = || {
        seq += 1;
        format!("{seq:x}")
    };
    let cap = cap.to_string();
    for i in start..start + holders + waiters {
        let mode = if i < holders { "try" } else { "wait" };
        let s = next();
        let reply: Value = redis::cmd("REDSEM.LEASE_ACQUIRE")
            .arg(&LEASE)
            .arg(&[
                &format!("id{i:04}"),
                &cap,
                "1",
                "30000",
                "",
                "0",
                mode,
                "30000",
                "ch",
                &s,
                "sess",
                &s,
            ])
            .query(conn)
            .expect("REDSEM.LEASE_ACQUIRE");
        let want: &[u8] = if i < start + holders {
            b"GRANTED"
        } else {
            b"QUEUED"
        };
        assert!(
            matches!(&reply, Value::Array(v) if v.first() == Some(&Value::BulkString(want.to_vec()))),
            "acquire {i}: {reply:?}"
        );
    }
    for i in start..start + released {
        let s = next();
        let reply: Value = redis::cmd("REDSEM.LEASE_RELEASE")
            .arg(&LEASE)
            .arg(&[&format!("id{i:04}"), "ch", &s, "sess", &s, "r"])
            .query(conn)
            .expect("REDSEM.LEASE_RELEASE");
        assert!(
            matches!(&reply, Value::Array(v) if v.first() == Some(&Value::BulkString(b"RELEASED".to_vec()))),
            "release {i}: {reply:?}"
        );
    }
}

/// [`crowd_from`] the first ids and calls.
fn crowd(conn: &mut Connection, cap: usize, holders: usize, waiters: usize, released: usize) {
    crowd_from(conn, 0, (cap, holders, waiters, released));
}

fn members(conn: &mut Connection, key: &str) -> Vec<Vec<u8>> {
    redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .query(conn)
        .expect("ZRANGE")
}

#[test]
fn a_crowded_lease_is_kept_in_skip_lists_with_the_contents_redis_would_keep() {
    let native = server(&[], &[]);
    let plain = server(&["skiplist-at", "0"], &[]);
    let (mut a, mut b) = (native.connection(), plain.connection());
    // 4 holders and 20 waiters, 6 of the holders' releases granting waiters: leases holds 24
    // members (then 18), the queue 20 (then 14).
    for conn in [&mut a, &mut b] {
        crowd(conn, 4, 4, 20, 0);
    }
    assert_eq!(encoding(&mut a, LEASE[0]), "skiplist");
    assert_eq!(encoding(&mut a, LEASE[1]), "skiplist");
    assert_eq!(encoding(&mut b, LEASE[0]), "listpack");
    assert_eq!(encoding(&mut b, LEASE[1]), "listpack");
    assert_eq!(members(&mut a, LEASE[0]), members(&mut b, LEASE[0]));
    assert_eq!(members(&mut a, LEASE[1]), members(&mut b, LEASE[1]));
    assert_eq!(
        field_names(&mut a),
        field_names(&mut b),
        "the state's fields"
    );
    for key in [LEASE[0], LEASE[1]] {
        let padded = members(&mut a, key)
            .into_iter()
            .filter(|m| m.len() > 64)
            .count();
        assert_eq!(padded, 0, "{key} keeps no padding member");
    }
}

#[test]
fn a_small_lease_keeps_its_listpacks_and_the_threshold_is_the_load_arguments() {
    let default = server(&[], &[]);
    let mut conn = default.connection();
    crowd(&mut conn, 4, 4, 10, 0);
    assert_eq!(encoding(&mut conn, LEASE[0]), "listpack", "14 members");
    assert_eq!(encoding(&mut conn, LEASE[1]), "listpack", "10 members");

    let low = server(&["skiplist-at", "3"], &[]);
    let mut conn = low.connection();
    crowd(&mut conn, 2, 2, 2, 0);
    assert_eq!(encoding(&mut conn, LEASE[0]), "skiplist", "4 members");
    assert_eq!(encoding(&mut conn, LEASE[1]), "listpack", "2 members");
}

#[test]
fn the_padding_outgrows_the_servers_listpack_value_and_spares_a_member_of_its_name() {
    // Members of up to 100 bytes stay in a listpack here: the padding is made longer.
    let long = server(&[], &["--zset-max-listpack-value", "100"]);
    let mut conn = long.connection();
    crowd(&mut conn, 4, 4, 20, 0);
    assert_eq!(encoding(&mut conn, LEASE[0]), "skiplist");
    assert_eq!(encoding(&mut conn, LEASE[1]), "skiplist");

    // A member named as the padding is, in leases with a lease ending far away (the Lua
    // leaves it until then), then a crowd of holders taken by the native fast path.
    let plain = server(&[], &[]);
    let mut conn = plain.connection();
    crowd(&mut conn, 40, 1, 0, 0); // (the semaphore made)
    let mut pad = b"\xffredsem:skiplist:".to_vec();
    pad.resize(65, b'.');
    let far = 4_000_000_000_000_f64;
    let _: i64 = redis::cmd("ZADD")
        .arg(LEASE[0])
        .arg(far)
        .arg(&pad)
        .query(&mut conn)
        .expect("ZADD");
    let (native_before, _) = support::served(&mut conn);
    crowd_from(&mut conn, 1, (40, 20, 0, 0));
    let (native_after, _) = support::served(&mut conn);
    assert!(
        native_after - native_before >= 19,
        "the fast path served the crowd"
    );
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(LEASE[0])
        .arg(&pad)
        .query(&mut conn)
        .expect("ZSCORE");
    assert_eq!(score, Some(far), "the member of the padding's name is kept");
    let holders = members(&mut conn, LEASE[0])
        .into_iter()
        .filter(|m| m.starts_with(b"id"))
        .count();
    assert_eq!(holders, 21);
}

#[test]
fn a_replica_gets_the_contents_of_a_crowded_lease() {
    let primary = server(&[], &[]);
    let replica = RedisServer::start_replica_of(&primary);
    replica.wait_replicated_from(&primary);
    let mut p = primary.connection();
    crowd(&mut p, 4, 4, 20, 6);
    assert_eq!(encoding(&mut p, LEASE[0]), "skiplist");
    replica.wait_replicated_from(&primary);
    let mut r = replica.connection();
    let ours = contents(&mut p);
    assert!(
        matches!(&ours[0], Value::Array(m) if m.len() == 2 * 19),
        "{:?}",
        ours[0]
    );
    assert_eq!(contents(&mut r), ours);
    // The replica applies plain ZADD and ZREM: a listpack, Redis's own choice for 19 members
    // (18 leases and the session's renewal entry).
    assert_eq!(encoding(&mut r, LEASE[0]), "listpack");
}

/// A call the Lua serves (a permit withdrawal has no native path) finds the crowded sets
/// among its keys made skip lists first, so the Lua's inserts are cheap too; a small set is
/// left a listpack.
#[test]
fn a_call_the_lua_serves_finds_its_crowded_sets_made_skip_lists() {
    use support::PERMITS;
    let server = server(&[], &[]);
    let mut conn = server.connection();
    let (_, _, library, _, _): (String, String, String, u64, u64) = redis::cmd("REDSEM.ENGINE")
        .query(&mut conn)
        .expect("REDSEM.ENGINE");
    // The waiters queued by the scripts (FCALL of the module's own library), which leave
    // the sets as Redis keeps them: listpacks. (The first module command loads the library.)
    let _: Value = redis::cmd("REDSEM.PERMIT_TRY_SET")
        .arg(&PERMITS)
        .arg(&["set", "0", "1", "sess", "1"])
        .query(&mut conn)
        .expect("REDSEM.PERMIT_TRY_SET");
    let fcall = |conn: &mut Connection, keys: &[&str], n: usize, from: usize| {
        for i in from..from + n {
            let s = format!("{:x}", 2 + i);
            let reply: Value = redis::cmd("FCALL")
                .arg(format!("{library}_permit_acquire"))
                .arg(6)
                .arg(keys)
                .arg(&[&format!("w{i}"), "1", "wait", "30000", "ch", &s, "sess", &s])
                .query(conn)
                .expect("FCALL permit_acquire");
            assert!(format!("{reply:?}").contains("QUEUED"), "{reply:?}");
        }
    };
    fcall(&mut conn, &PERMITS, 20, 0);
    assert_eq!(encoding(&mut conn, PERMITS[1]), "listpack");
    assert_eq!(encoding(&mut conn, PERMITS[2]), "listpack");
    let reply: Value = redis::cmd("REDSEM.PERMIT_WITHDRAW")
        .arg(&PERMITS)
        .arg(&["w0", "0", "sess", "100"])
        .query(&mut conn)
        .expect("REDSEM.PERMIT_WITHDRAW");
    assert!(format!("{reply:?}").contains("WITHDRAWN"), "{reply:?}");
    assert_eq!(encoding(&mut conn, PERMITS[1]), "skiplist", "the queue");
    assert_eq!(encoding(&mut conn, PERMITS[2]), "skiplist", "the waiters");
    assert_eq!(members(&mut conn, PERMITS[1]).len(), 19);

    // A semaphore of 5 waiters: its sets stay listpacks.
    let small: Vec<String> = PERMITS.iter().map(|k| k.replace("{p}", "{q}")).collect();
    let small: Vec<&str> = small.iter().map(String::as_str).collect();
    let _: Value = redis::cmd("REDSEM.PERMIT_TRY_SET")
        .arg(&small)
        .arg(&["set", "0", "101", "sess", "101"])
        .query(&mut conn)
        .expect("REDSEM.PERMIT_TRY_SET");
    fcall(&mut conn, &small, 5, 0x200);
    let _: Value = redis::cmd("REDSEM.PERMIT_WITHDRAW")
        .arg(&small)
        .arg(&["w512", "0", "sess", "300"])
        .query(&mut conn)
        .expect("REDSEM.PERMIT_WITHDRAW");
    assert_eq!(encoding(&mut conn, small[1]), "listpack");
    assert_eq!(members(&mut conn, small[1]).len(), 4);
}
