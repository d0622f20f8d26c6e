//! The native paths' writes reach replicas and the AOF as plain commands: a replica without
//! the module, attached before or after native calls, and a server restarted from its AOF hold
//! exactly what the primary holds.

mod support;

use redis::Connection;
use redsem_test::RedisServer;
use redsem_verify::diff::dump;
use support::{LEASE, PERMITS, module, served};

/// `cycles` lease cycles (try_acquire + release) and permit cycles (acquire + add) by one
/// client session whose numbers continue from `*seq`; every reply as expected.
fn cycles(conn: &mut Connection, seq: &mut u64, cycles: u64) {
    for i in 0..cycles {
        let id = format!("id{seq}-{i}");
        *seq += 1;
        let s = format!("{seq:x}");
        let granted: Vec<redis::Value> = redis::cmd("REDSEM.LEASE_ACQUIRE")
            .arg(&LEASE)
            .arg(&[
                &id, "2", "1", "30000", "", "0", "try", "5000", "ch", &s, "sess", &s,
            ])
            .query(conn)
            .expect("lease_acquire");
        assert_eq!(
            granted.first(),
            Some(&redis::Value::BulkString(b"GRANTED".to_vec())),
            "{granted:?}"
        );
        *seq += 1;
        let s = format!("{seq:x}");
        let released: Vec<redis::Value> = redis::cmd("REDSEM.LEASE_RELEASE")
            .arg(&LEASE)
            .arg(&[&id, "ch", &s, "sess", &s, "r"])
            .query(conn)
            .expect("lease_release");
        assert_eq!(
            released.first(),
            Some(&redis::Value::BulkString(b"RELEASED".to_vec())),
            "{released:?}"
        );
        *seq += 1;
        let s = format!("{seq:x}");
        let taken: Vec<String> = redis::cmd("REDSEM.PERMIT_ACQUIRE")
            .arg(&PERMITS)
            .arg(&[&id, "1", "try", "5000", "ch", &s, "psess", &s])
            .query(conn)
            .expect("permit_acquire");
        assert_eq!(taken, ["GRANTED"]);
        *seq += 1;
        let s = format!("{seq:x}");
        let added: Vec<redis::Value> = redis::cmd("REDSEM.PERMIT_ADD")
            .arg(&PERMITS)
            .arg(&[&id, "1", &s, "psess", &s])
            .query(conn)
            .expect("permit_add");
        assert_eq!(
            added.first(),
            Some(&redis::Value::BulkString(b"ADDED".to_vec())),
            "{added:?}"
        );
    }
}

/// A contended lease of one unit on the keys tagged `tag`, by one session: a holder, then
/// `rounds` times a waiter queued (on the caller's channel or another: handed back or
/// published) and the holder's release granting it, and as many group commits of a release
/// and an acquire; left live, with a holder and two waiters. The general native paths
/// (lease/general.rs) serve all but the first grant.
fn contended(conn: &mut Connection, seq: &mut u64, tag: &str, rounds: u64) {
    let keys = ["leases", "queue", "state", "slots", "tenants", "tqueue"]
        .map(|k| format!("{{{tag}}}:{k}"));
    let next = |seq: &mut u64| {
        *seq += 1;
        format!("{seq:x}")
    };
    let is = |reply: &[redis::Value], word: &str| {
        assert_eq!(
            reply.first(),
            Some(&redis::Value::BulkString(word.as_bytes().to_vec())),
            "{reply:?}"
        );
    };
    let acquire = |conn: &mut Connection, id: &str, mode: &str, channel: &str, s: &str| {
        let reply: Vec<redis::Value> = redis::cmd("REDSEM.LEASE_ACQUIRE")
            .arg(&keys)
            .arg(&[
                id, "1", "1", "30000", "", "0", mode, "5000", channel, s, "sess", s,
            ])
            .query(conn)
            .expect("lease_acquire");
        reply
    };
    let s = next(seq);
    let mut holder = format!("h{seq}");
    is(&acquire(conn, &holder, "try", "ch", &s), "GRANTED");
    for round in 0..rounds {
        let waiter = format!("w{seq}-{round}");
        let channel = if round % 2 == 0 { "ch" } else { "other" };
        let s = next(seq);
        is(&acquire(conn, &waiter, "wait", channel, &s), "QUEUED");
        let s = next(seq);
        let released: Vec<redis::Value> = redis::cmd("REDSEM.LEASE_RELEASE")
            .arg(&keys)
            .arg(&[holder.as_str(), "ch", &s, "sess", &s, "r"])
            .query(conn)
            .expect("lease_release");
        is(&released, "RELEASED");
        holder = waiter;
        // A group commit: the holder's release and a new waiter's acquire, which it grants.
        let (low, r, a) = (next(seq), next(seq), next(seq));
        let waiter = format!("b{seq}-{round}");
        let batch: Vec<redis::Value> = redis::cmd("REDSEM.LEASE_BATCH")
            .arg(&keys)
            .arg(&["ch", "sess", low.as_str(), "r", &holder, &r])
            .arg(&[
                "a",
                waiter.as_str(),
                "1",
                "1",
                "30000",
                "",
                "0",
                "wait",
                "5000",
                &a,
                "",
                "",
                "",
            ])
            .query(conn)
            .expect("lease_batch");
        assert!(
            matches!(batch.first(), Some(redis::Value::Array(_))),
            "{batch:?}"
        );
        holder = waiter;
    }
    for channel in ["ch", "other"] {
        let s = next(seq);
        is(
            &acquire(conn, &format!("q{seq}"), "wait", channel, &s),
            "QUEUED",
        );
    }
}

/// `n` holders of one unit with a label on the keys tagged `tag` (capacity 16), then each
/// released: the general native paths serve them all (the fast paths take no label), and the
/// slot bitmap grows past its first byte, then has every bit cleared.
fn labelled(conn: &mut Connection, seq: &mut u64, tag: &str, n: u64) {
    let keys = ["leases", "queue", "state", "slots", "tenants", "tqueue"]
        .map(|k| format!("{{{tag}}}:{k}"));
    let word = |reply: &[redis::Value]| match reply.first() {
        Some(redis::Value::BulkString(w)) => String::from_utf8_lossy(w).into_owned(),
        other => format!("{other:?}"),
    };
    let ids: Vec<String> = (0..n).map(|i| format!("l{seq}-{i}")).collect();
    for id in &ids {
        *seq += 1;
        let s = format!("{seq:x}");
        let reply: Vec<redis::Value> = redis::cmd("REDSEM.LEASE_ACQUIRE")
            .arg(&keys)
            .arg(&[
                id.as_str(),
                "16",
                "1",
                "30000",
                "lbl",
                "0",
                "try",
                "5000",
                "ch",
                &s,
                "sess",
                &s,
                "",
                "",
                "",
            ])
            .query(conn)
            .expect("lease_acquire");
        assert_eq!(word(&reply), "GRANTED", "{reply:?}");
    }
    let slots: Vec<u8> = redis::cmd("GET")
        .arg(&keys[3])
        .query(conn)
        .expect("GET slots");
    let want = (0..n).fold(vec![0u8; n.div_ceil(8) as usize], |mut b, i| {
        b[(i / 8) as usize] |= 0x80 >> (i % 8);
        b
    });
    assert_eq!(slots, want, "the slot bitmap after {n} grants");
    for id in &ids {
        *seq += 1;
        let s = format!("{seq:x}");
        let reply: Vec<redis::Value> = redis::cmd("REDSEM.LEASE_RELEASE")
            .arg(&keys)
            .arg(&[id.as_str(), "ch", &s, "sess", &s, "r"])
            .query(conn)
            .expect("lease_release");
        assert_eq!(word(&reply), "RELEASED", "{reply:?}");
    }
}

/// Set up the permit semaphore with 3 permits (by the Lua: a first call).
fn set_permits(conn: &mut Connection, seq: &mut u64) {
    *seq += 1;
    let s = format!("{seq:x}");
    let set: Vec<String> = redis::cmd("REDSEM.PERMIT_TRY_SET")
        .arg(&PERMITS)
        .arg(&["set", "3", &s, "psess", &s])
        .query(conn)
        .expect("try_set");
    assert_eq!(set, ["SET"]);
}

/// Every key of the server, as read (type, members, expiry), sorted by name.
fn contents(conn: &mut Connection) -> Vec<(String, dump::KeyDump)> {
    let mut keys: Vec<String> = redis::cmd("KEYS").arg("*").query(conn).expect("KEYS");
    keys.sort();
    keys.into_iter()
        .map(|k| (k.clone(), dump::key(conn, &k).expect("a key's contents")))
        .collect()
}

#[test]
fn a_replica_without_the_module_holds_what_the_native_paths_wrote() {
    let path = module().display().to_string();
    let primary = RedisServer::start_with(&["--loadmodule", &path]);
    let mut conn = primary.connection();
    let mut seq = 0;
    set_permits(&mut conn, &mut seq);
    // Before any replica: no backlog, nothing listens (the writes are not replicated).
    cycles(&mut conn, &mut seq, 20);
    contended(&mut conn, &mut seq, "c1", 10);
    labelled(&mut conn, &mut seq, "g1", 10);
    let (native_before, _) = served(&mut conn);
    assert!(
        native_before >= 119,
        "only {native_before} native calls of 133"
    );
    // A replica attached now loads a snapshot of those, then follows the stream.
    let replica = RedisServer::start_replica_of(&primary);
    replica.wait_replicated_from(&primary);
    // A subscriber on the replica hears the wake-ups the native paths publish: those on the
    // channel "other" (every second round of `contended`), as the Lua's PUBLISH reaches it.
    let mut listener = replica.connection();
    let mut pubsub = listener.as_pubsub();
    pubsub.subscribe("other").expect("SUBSCRIBE");
    cycles(&mut conn, &mut seq, 20);
    contended(&mut conn, &mut seq, "c2", 10);
    labelled(&mut conn, &mut seq, "g2", 10);
    pubsub
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("a read timeout");
    let heard: Vec<String> = (0..5)
        .map(|_| {
            let message = pubsub.get_message().expect("a wake-up on the replica");
            message.get_payload().expect("its text")
        })
        .collect();
    assert!(heard.iter().all(|m| m.starts_with('w')), "{heard:?}");
    let (native_after, _) = served(&mut conn);
    assert!(
        native_after - native_before >= 124,
        "only {} native calls of 133",
        native_after - native_before
    );
    replica.wait_replicated_from(&primary);
    let ours = contents(&mut conn);
    assert!(ours.len() >= 5, "{ours:?}");
    assert_eq!(contents(&mut replica.connection()), ours);
    // The replica has not the module (Valkey 9 lists its built-in `lua`): what it holds
    // came as plain commands.
    let modules: Vec<Vec<redis::Value>> = redis::cmd("MODULE")
        .arg("LIST")
        .query(&mut replica.connection())
        .expect("MODULE LIST");
    let names: Vec<String> = modules
        .iter()
        .filter_map(|m| match m.get(1) {
            Some(redis::Value::BulkString(name)) => {
                Some(String::from_utf8_lossy(name).into_owned())
            }
            _ => None,
        })
        .collect();
    assert!(!names.iter().any(|n| n == "redsem"), "{names:?}");
}

#[test]
fn a_server_restarted_from_its_aof_holds_what_the_native_paths_wrote() {
    let path = module().display().to_string();
    let mut server = RedisServer::start_with(&[
        "--loadmodule",
        &path,
        "--appendonly",
        "yes",
        "--appendfsync",
        "always",
    ]);
    let mut conn = server.connection();
    let mut seq = 0;
    set_permits(&mut conn, &mut seq);
    cycles(&mut conn, &mut seq, 20);
    contended(&mut conn, &mut seq, "c1", 10);
    labelled(&mut conn, &mut seq, "g1", 10);
    let (native, _) = served(&mut conn);
    assert!(native >= 119, "only {native} native calls of 133");
    let before = contents(&mut conn);
    drop(conn);
    server.restart();
    assert_eq!(contents(&mut server.connection()), before);
}

#[test]
fn a_native_call_that_changes_nothing_announces_no_write() {
    let path = module().display().to_string();
    let server = RedisServer::start_with(&["--loadmodule", &path]);
    let mut conn = server.connection();
    let mut seq = 0;
    let keys =
        ["leases", "queue", "state", "slots", "tenants", "tqueue"].map(|k| format!("{{n}}:{k}"));
    // A holder, so that the semaphore is live.
    let reply: Vec<redis::Value> = redis::cmd("REDSEM.LEASE_ACQUIRE")
        .arg(&keys)
        .arg(&[
            "h", "2", "1", "30000", "", "0", "try", "5000", "ch", "1", "sess", "1",
        ])
        .query(&mut conn)
        .expect("lease_acquire");
    assert_eq!(
        reply.first(),
        Some(&redis::Value::BulkString(b"GRANTED".to_vec()))
    );
    seq += 1;
    let _: () = redis::cmd("CONFIG")
        .arg(&["SET", "notify-keyspace-events", "KEA"])
        .query(&mut conn)
        .expect("CONFIG SET");
    let mut listener = server.connection();
    let mut pubsub = listener.as_pubsub();
    pubsub
        .subscribe(format!("__keyspace@0__:{}", keys[2]))
        .expect("SUBSCRIBE");
    pubsub
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("a read timeout");
    // The withdrawal of a request nobody made (no number to mark): NOTHELD, nothing written,
    // by the general native path.
    let (native, _) = served(&mut conn);
    let reply: Vec<redis::Value> = redis::cmd("REDSEM.LEASE_RELEASE")
        .arg(&keys)
        .arg(&["nobody", "ch", "0", "sess", &format!("{:x}", seq + 1), "w"])
        .query(&mut conn)
        .expect("lease_release");
    assert_eq!(
        reply.first(),
        Some(&redis::Value::BulkString(b"NOTHELD".to_vec()))
    );
    assert_eq!(served(&mut conn).0, native + 1, "served natively");
    // The first event on the state after it is the marker's.
    let _: () = redis::cmd("EXPIRE")
        .arg(&keys[2])
        .arg(100_000)
        .query(&mut conn)
        .expect("EXPIRE");
    let event: String = pubsub
        .get_message()
        .expect("an event")
        .get_payload()
        .expect("its text");
    assert_eq!(event, "expire");
}

/// A live permit semaphore by the native contended paths, one session numbered from `*seq`:
/// the 3 permits taken, four waiters queued, a release that serves the head, its
/// collection, a group commit of a release and a new waiter, then a release that serves the
/// rest and leaves a permit over.
fn permits_contended(conn: &mut Connection, seq: &mut u64) {
    let mut call = |conn: &mut Connection, op: &str, args: &[&str]| -> String {
        *seq += 1;
        let s = format!("{seq:x}");
        let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
        if op == "REDSEM.PERMIT_BATCH" {
            // ("#": the number of one of its operations, the first the batch's own.)
            let mut n = *seq;
            for a in all.iter_mut().filter(|a| *a == "#") {
                *a = format!("{n:x}");
                n += 1;
            }
            *seq = n - 1;
            all.splice(1..1, ["psess".to_owned(), s.clone()]);
        } else {
            all.extend([s.clone(), "psess".to_owned(), s.clone()]);
        }
        let reply: redis::Value = redis::cmd(op)
            .arg(&PERMITS)
            .arg(&all)
            .query(conn)
            .unwrap_or_else(|e| panic!("{op}: {e}"));
        format!("{reply:?}")
    };
    assert!(
        call(
            conn,
            "REDSEM.PERMIT_ACQUIRE",
            &["h", "3", "try", "30000", "ch"]
        )
        .contains("GRANTED")
    );
    for w in ["w1", "w2", "w3", "w4"] {
        let reply = call(
            conn,
            "REDSEM.PERMIT_ACQUIRE",
            &[w, "1", "wait", "30000", "ch"],
        );
        assert!(reply.contains("QUEUED"), "{reply}");
    }
    assert!(call(conn, "REDSEM.PERMIT_ADD", &["r1", "1"]).contains("ADDED"));
    assert!(call(conn, "REDSEM.PERMIT_POLL", &["w1", "30000"]).contains("GRANTED"));
    let reply = call(
        conn,
        "REDSEM.PERMIT_BATCH",
        &[
            "ch", "m", "r2", "1", "#", "a", "w5", "2", "wait", "30000", "#",
        ],
    );
    assert!(
        reply.contains("ADDED") && reply.contains("QUEUED"),
        "{reply}"
    );
    // 5 permits for w3, w4 and w5 (4 of them): one is left, the grants uncollected.
    let reply = call(conn, "REDSEM.PERMIT_ADD", &["r3", "5"]);
    assert!(
        reply.contains("ADDED") && reply.contains("int(1)"),
        "{reply}"
    );
}

#[test]
fn a_replica_holds_what_the_permits_contended_native_paths_wrote() {
    let path = module().display().to_string();
    let primary = RedisServer::start_with(&["--loadmodule", &path]);
    let replica = RedisServer::start_replica_of(&primary);
    replica.wait_replicated_from(&primary);
    let mut conn = primary.connection();
    let mut seq = 0;
    set_permits(&mut conn, &mut seq);
    let (before, _) = served(&mut conn);
    permits_contended(&mut conn, &mut seq);
    let (after, _) = served(&mut conn);
    // Of its 9 calls, the first wait runs by the Lua (the semaphore not live yet).
    assert_eq!(after - before, 8, "calls of 9 served natively");
    replica.wait_replicated_from(&primary);
    let ours = contents(&mut conn);
    assert!(
        ours.iter().any(|(k, _)| k.ends_with(":waiters")),
        "{ours:?}"
    );
    assert_eq!(contents(&mut replica.connection()), ours);
}
