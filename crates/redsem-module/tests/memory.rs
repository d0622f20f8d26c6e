//! The module keeps nothing per call: the server's memory does not grow with the calls it
//! serves, natively or by the Lua (every string, key handle, read value and call reply it
//! makes is freed before the command returns).

mod support;

use redis::Connection;
use redsem_test::RedisServer;
use support::{LATCH, LEASE, PERMITS, module, served};

/// The server's `used_memory`, in bytes.
fn used_memory(conn: &mut Connection) -> i64 {
    let info: String = redis::cmd("INFO")
        .arg("memory")
        .query(conn)
        .expect("INFO memory");
    info.lines()
        .find_map(|l| l.strip_prefix("used_memory:"))
        .and_then(|v| v.trim().parse().ok())
        .expect("used_memory in INFO memory")
}

/// A lease of one unit, contended.
const CONTENDED: [&str; 6] = [
    "{m}:leases",
    "{m}:queue",
    "{m}:state",
    "{m}:slots",
    "{m}:tenants",
    "{m}:tqueue",
];

/// `n` cycles of the session numbered from `*seq`, pipelined: a lease acquire and release
/// (native), a permit acquire and add (native), and a latch's state (by the Lua), each with ids
/// of the same length so the state's size stays the same.
///
/// And on a lease of one unit held by `*holder`: a waiter queued and the holder's release,
/// which grants it (the general native paths), so the waiter holds next.
fn cycles(conn: &mut Connection, seq: &mut u64, holder: &mut String, n: u64) {
    let mut pipe = redis::pipe();
    for i in 0..n {
        let waiter = format!("w{:012}", *seq);
        *seq += 1;
        let s = format!("{seq:x}");
        pipe.cmd("REDSEM.LEASE_ACQUIRE").arg(&CONTENDED).arg(&[
            &waiter, "1", "1", "30000", "", "0", "wait", "5000", "ch", &s, "sess", &s,
        ]);
        *seq += 1;
        let s = format!("{seq:x}");
        pipe.cmd("REDSEM.LEASE_RELEASE").arg(&CONTENDED).arg(&[
            holder.as_str(),
            "ch",
            &s,
            "sess",
            &s,
            "r",
        ]);
        *holder = waiter;
        let id = format!("id{:08}", i % 100_000_000);
        let mut next = || {
            *seq += 1;
            format!("{seq:x}")
        };
        let s = next();
        pipe.cmd("REDSEM.LEASE_ACQUIRE").arg(&LEASE).arg(&[
            &id, "2", "1", "30000", "", "0", "try", "5000", "ch", &s, "sess", &s,
        ]);
        let s = next();
        pipe.cmd("REDSEM.LEASE_RELEASE")
            .arg(&LEASE)
            .arg(&[&id, "ch", &s, "sess", &s, "r"]);
        let s = next();
        pipe.cmd("REDSEM.PERMIT_ACQUIRE")
            .arg(&PERMITS)
            .arg(&[&id, "1", "try", "5000", "ch", &s, "psess", &s]);
        let s = next();
        pipe.cmd("REDSEM.PERMIT_ADD")
            .arg(&PERMITS)
            .arg(&[&id, "1", &s, "psess", &s]);
        pipe.cmd("REDSEM.LATCH_STATE").arg(&LATCH);
    }
    let replies: Vec<redis::Value> = pipe.query(conn).expect("the cycles");
    assert_eq!(replies.len() as u64, 7 * n);
}

#[test]
fn the_servers_memory_does_not_grow_with_the_calls_the_module_serves() {
    let path = module().display().to_string();
    let server = RedisServer::start_with(&["--loadmodule", &path]);
    let mut conn = server.connection();
    let mut seq = 0;
    seq += 1;
    let s = format!("{seq:x}");
    let set: Vec<String> = redis::cmd("REDSEM.PERMIT_TRY_SET")
        .arg(&PERMITS)
        .arg(&["set", "3", &s, "psess", &s])
        .query(&mut conn)
        .expect("try_set");
    assert_eq!(set, ["SET"]);
    let mut holder = "w-first-holder".to_owned();
    seq += 1;
    let s = format!("{seq:x}");
    let granted: Vec<redis::Value> = redis::cmd("REDSEM.LEASE_ACQUIRE")
        .arg(&CONTENDED)
        .arg(&[
            &holder, "1", "1", "30000", "", "0", "try", "5000", "ch", &s, "sess", &s,
        ])
        .query(&mut conn)
        .expect("the first holder");
    assert_eq!(
        granted.first(),
        Some(&redis::Value::BulkString(b"GRANTED".to_vec()))
    );
    // Warm up: the state, the session records, the Lua library and its memos.
    cycles(&mut conn, &mut seq, &mut holder, 500);
    let before = used_memory(&mut conn);
    let (native_before, lua_before) = served(&mut conn);
    for _ in 0..20 {
        cycles(&mut conn, &mut seq, &mut holder, 500);
    }
    let after = used_memory(&mut conn);
    let (native, lua) = served(&mut conn);
    assert!(
        native - native_before >= 58_000,
        "{} native calls of 60,000",
        native - native_before
    );
    assert!(
        lua - lua_before >= 10_000,
        "{} calls by the Lua of 10,000",
        lua - lua_before
    );
    // A leak of even one small string per call would be 70,000 of them (over three
    // megabytes), and one per contended release 10,000 (about half a megabyte).
    assert!(
        after - before < 256 * 1024,
        "used_memory grew by {} bytes over 70,000 calls ({before} -> {after})",
        after - before
    );
}
