//! The native engine answers every call as the scripts do: the differential runner
//! (crates/redsem-verify, docs/DIFFERENTIAL.md) sends the same seeded calls of every operation
//! to the Lua library and to this module in one server and compares every reply, every
//! message published and every key after each call. And a native path changed is seen.

mod support;

use redsem_test::RedisServer;
use redsem_verify::diff::{self, Config, EngineKind, Report};
use support::module;

fn config(seed: u64, steps: u64) -> Config {
    Config {
        seed,
        steps,
        engines: [EngineKind::Scripts, EngineKind::Native],
        patches: Vec::new(),
        module: Some(module()),
    }
}

fn run(server: &RedisServer, config: &Config) -> Report {
    diff::run(server, config)
        .unwrap_or_else(|e| panic!("seed {}: the run failed: {e}", config.seed))
}

fn server(config: &Config) -> RedisServer {
    let args = config.server_args().expect("the module's arguments");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    RedisServer::start_with(&args)
}

#[test]
fn the_native_engine_answers_every_call_as_the_scripts() {
    let server = server(&config(1, 0));
    let mut calls = 0;
    // Seeds 1 to 4; fewer with REDSEM_MODULE_DIFF_SEEDS (the mutation run: each mutant pays
    // for a whole test run).
    let seeds = std::env::var("REDSEM_MODULE_DIFF_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(4);
    for seed in 1..=seeds {
        let report = run(&server, &config(seed, 2_500));
        if let Some(divergence) = &report.divergence {
            panic!("seed {seed}: {divergence}");
        }
        assert_eq!(report.steps, 2_500);
        assert!(
            report.lost > 0 && report.resends > 0 && report.faults > 0,
            "seed {seed}: {report:?}"
        );
        calls += report.steps;
    }
    // The native paths were taken: the module answered a good share of the calls without
    // running the Lua (the uncontended cycles and the general paths of both semaphores: about a fifth).
    let (_, _, _, native, lua): (String, String, String, u64, u64) = redis::cmd("REDSEM.ENGINE")
        .query(&mut server.connection())
        .expect("REDSEM.ENGINE");
    eprintln!("{calls} calls: {native} native, {lua} by the Lua");
    assert_eq!(native + lua, calls, "every call reaches the module once");
    assert!(
        native > calls / 8,
        "only {native} of {calls} calls took a native path"
    );
}

/// A waiter too large for a shrunk capacity, left at the head of the queue when the grant of
/// the waiter before it filled every unit, waits there until a unit is freed (the Lua's
/// promote_left() does not read the head while every unit is held): a call meanwhile, served
/// by the general native path, finds it still queued, as the scripts do.
#[test]
fn a_waiter_left_at_the_head_by_a_shrink_waits_while_every_unit_is_held() {
    use redis::Value;
    use redsem_verify::diff::dump;
    use redsem_verify::diff::engine::{Engine, plant_clock};

    let server = server(&config(1, 0));
    let mut conn = server.connection();
    plant_clock(&mut conn, 1_800_000_000_000_000).expect("the clock");
    let mut served = Vec::new();
    let mut replies = Vec::new();
    for kind in [EngineKind::Scripts, EngineKind::Native] {
        let engine = Engine::load(&mut conn, kind, "shrink", &[]).expect("the engine");
        let keys: Vec<String> = ["leases", "queue", "state", "slots", "tenants", "tqueue"]
            .iter()
            .map(|k| format!("{{{}}}:{k}", kind.name()))
            .collect();
        let call = |conn: &mut redis::Connection, op: &str, args: &[&str]| {
            let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
            engine.call(conn, op, &keys, &args)
        };
        // (Each call's number is its low mark too: every earlier call is answered.)
        let acquire = |conn: &mut redis::Connection, id: &str, k: &str, mode: &str, s: u64| {
            let (cap, s) = (if s < 0x10 { "3" } else { "1" }, format!("{s:x}"));
            call(
                conn,
                "lease_acquire",
                &[
                    id, cap, k, "30000", "", "0", mode, "5000", "ch", &s, "sess", &s, "", "", "",
                ],
            )
        };
        let mut got: Vec<Value> = Vec::new();
        for (i, id) in ["h1", "h2", "h3"].into_iter().enumerate() {
            got.push(acquire(&mut conn, id, "1", "try", 1 + i as u64));
        }
        got.push(acquire(&mut conn, "w1", "1", "wait", 4));
        got.push(acquire(&mut conn, "w2", "2", "wait", 5));
        got.push(call(&mut conn, "lease_set_capacity", &["1"]));
        // The holders go; the last release grants w1, which fills the one unit: w2 (two units,
        // more than the capacity) is now the head.
        for (i, id) in ["h1", "h2", "h3"].into_iter().enumerate() {
            let s = format!("{:x}", 0x10 + i);
            got.push(call(
                &mut conn,
                "lease_release",
                &[id, "ch", &s, "sess", &s, "r"],
            ));
        }
        // A try while every unit is held: BUSY, one held, one queued.
        let before = support::served(&mut conn).0;
        got.push(acquire(&mut conn, "x", "1", "try", 0x20));
        served.push(support::served(&mut conn).0 - before);
        let contents: Vec<_> = keys
            .iter()
            .map(|k| dump::key(&mut conn, k).expect("a key's contents"))
            .collect();
        replies.push((got, contents));
    }
    assert_eq!(
        served,
        [0, 1],
        "the last call served by the general native path"
    );
    let last = replies[1].0.last().cloned();
    assert_eq!(
        last,
        Some(Value::Array(vec![
            Value::BulkString(b"BUSY".to_vec()),
            Value::Int(1),
            Value::Int(1)
        ]))
    );
    assert_eq!(replies[0], replies[1]);
}

/// The same with the module keeping every lease set of two members or more as a skip list
/// (`skiplist-at 2`): the scripts' copies stay listpacks, and every reply and key is the same.
#[test]
fn the_native_engine_answers_as_the_scripts_with_its_sets_in_skip_lists() {
    let mut args = config(1, 0).server_args().expect("the module's arguments");
    args.extend(["skiplist-at".to_owned(), "2".to_owned()]);
    let server = RedisServer::start_with(&args.iter().map(String::as_str).collect::<Vec<_>>());
    let mut conn = server.connection();
    let mut skiplists = 0;
    for seed in [5, 6] {
        let report = run(&server, &config(seed, 2_500));
        if let Some(divergence) = &report.divergence {
            panic!("seed {seed}: {divergence}");
        }
        assert_eq!(report.steps, 2_500);
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).expect("KEYS");
        for key in keys {
            let kind: String = redis::cmd("TYPE").arg(&key).query(&mut conn).expect("TYPE");
            if kind == "zset" {
                let encoding: String = redis::cmd("OBJECT")
                    .arg("ENCODING")
                    .arg(&key)
                    .query(&mut conn)
                    .expect("OBJECT ENCODING");
                skiplists += usize::from(encoding == "skiplist");
            }
        }
    }
    assert!(
        skiplists > 0,
        "no set was left a skip list at the runs' ends"
    );
}

/// A live permit semaphore, natively: waiters queued, a release that serves the head, a
/// grant collected by a poll and its resend, a group commit of a release, a collection and
/// a new waiter, then a release that serves two. Every reply and key is the scripts', and
/// the module served these calls by its own paths, not the Lua's.
#[test]
fn a_contended_permit_semaphore_is_served_natively_as_the_scripts_serve_it() {
    use redsem_verify::diff::dump;
    use redsem_verify::diff::engine::{Engine, plant_clock};

    let server = server(&config(1, 0));
    let mut conn = server.connection();
    plant_clock(&mut conn, 1_800_000_000_000_000).expect("the clock");
    let mut outcomes = Vec::new();
    let mut served = Vec::new();
    for kind in [EngineKind::Scripts, EngineKind::Native] {
        let engine = Engine::load(&mut conn, kind, "permits", &[]).expect("the engine");
        let keys: Vec<String> = ["count", "queue", "waiters", "records", "meta", "applied"]
            .iter()
            .map(|k| format!("{{p{}}}:{k}", kind.name()))
            .collect();
        let mut seq = 0u64;
        let mut call = |conn: &mut redis::Connection, op: &str, args: &[&str]| {
            // ("again:": the last call sent once more, under its number: a resend.)
            let op = match op.strip_prefix("again:") {
                Some(op) => op,
                None => {
                    seq += 1;
                    op
                }
            };
            let s = format!("{seq:x}");
            let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
            match op {
                // (The batch's operations carry their own numbers: "#" stands for one.)
                "permit_batch" => {
                    let mut n = seq;
                    for a in all.iter_mut().filter(|a| *a == "#") {
                        *a = format!("{n:x}");
                        n += 1;
                    }
                    seq = n - 1;
                    all.splice(1..1, ["sess".to_owned(), s.clone()]);
                }
                _ => all.extend([s.clone(), "sess".to_owned(), s.clone()]),
            }
            let reply = engine.call(conn, op, &keys, &all);
            // (The keys after each call: a session's marks live only until the next call.)
            let contents: Vec<_> = keys
                .iter()
                .map(|k| dump::key(conn, k).expect("a key's contents"))
                .collect();
            (reply, contents)
        };
        let before = support::served(&mut conn).0;
        let mut got = vec![
            call(&mut conn, "permit_try_set", &["set", "2"]),
            call(
                &mut conn,
                "permit_acquire",
                &["a1", "2", "try", "30000", "ch"],
            ),
        ];
        for w in ["w1", "w2", "w3", "w4"] {
            got.push(call(
                &mut conn,
                "permit_acquire",
                &[w, "1", "wait", "30000", "ch"],
            ));
        }
        got.push(call(&mut conn, "permit_add", &["r1", "1"])); // serves w1
        got.push(call(&mut conn, "permit_poll", &["w1", "30000"])); // w1 collects
        got.push(call(&mut conn, "again:permit_poll", &["w1", "30000"])); // its resend
        got.push(call(
            &mut conn,
            "permit_acquire",
            &["w6", "1", "wait", "30000", "ch"],
        ));
        got.push(call(&mut conn, "permit_add", &["r2", "1"])); // serves w2
        got.push(call(
            &mut conn,
            "permit_batch",
            &[
                "ch", "m", "r3", "1", "#", "p", "w2", "30000", "#", "a", "w5", "2", "wait",
                "30000", "#",
            ],
        ));
        got.push(call(&mut conn, "permit_add", &["r4", "4"])); // serves w4, w6, then w5
        served.push(support::served(&mut conn).0 - before);
        outcomes.push(got);
    }
    assert_eq!(outcomes[0], outcomes[1]);
    // The scripts' engine is not the module's; of the module's 13 calls, the set and the
    // first wait (not live yet) run by the Lua, every other one natively (a native path that
    // declined would still answer alike, by the Lua: only this count sees it).
    assert_eq!(served[0], 0);
    assert_eq!(served[1], 11, "calls of 13 served natively");
    let replies = format!("{:?}", outcomes[1]);
    assert!(
        replies.contains("ADDED") && replies.contains("QUEUED"),
        "{replies}"
    );
}

/// A group commit cut short (its head, or an operation, missing its last arguments: no
/// client sends one) is not read past its end by the native paths: the Lua answers it, and
/// the server lives.
#[test]
fn a_batch_cut_short_is_answered_by_the_lua_and_the_server_lives() {
    let server = server(&config(1, 0));
    let mut conn = server.connection();
    let permits = [
        "{c}:count",
        "{c}:queue",
        "{c}:waiters",
        "{c}:records",
        "{c}:meta",
        "{c}:applied",
    ];
    let leases = [
        "{d}:leases",
        "{d}:queue",
        "{d}:state",
        "{d}:slots",
        "{d}:tenants",
        "{d}:tqueue",
    ];
    let cut: [(&str, &[&str], &[&str]); 9] = [
        ("REDSEM.PERMIT_BATCH", &permits, &["ch"]),
        (
            "REDSEM.PERMIT_BATCH",
            &permits,
            &["ch", "sess", "1", "m", "r1", "1"],
        ),
        ("REDSEM.PERMIT_BATCH", &permits, &["ch", "sess"]),
        ("REDSEM.LEASE_BATCH", &leases, &["ch"]),
        ("REDSEM.LEASE_BATCH", &leases, &["ch", "sess"]),
        (
            "REDSEM.PERMIT_BATCH",
            &permits,
            &["ch", "sess", "1", "a", "w1", "1", "wait", "30000"],
        ),
        (
            "REDSEM.PERMIT_BATCH",
            &permits,
            &["ch", "sess", "1", "p", "w1", "30000"],
        ),
        (
            "REDSEM.LEASE_BATCH",
            &leases,
            &["ch", "sess", "1", "a", "w1", "4", "1", "30000", ""],
        ),
        (
            "REDSEM.LEASE_BATCH",
            &leases,
            &["ch", "sess", "1", "r", "w1"],
        ),
    ];
    for (command, keys, args) in cut {
        let reply: redis::RedisResult<redis::Value> =
            redis::cmd(command).arg(keys).arg(args).query(&mut conn);
        let pong: String = redis::cmd("PING").query(&mut conn).unwrap_or_else(|e| {
            panic!("{command} {args:?} (answered {reply:?}): the server is gone: {e}")
        });
        assert_eq!(pong, "PONG");
    }
}

/// A release that could serve more waiters than one call may grant (permit/layout.lua:
/// MAX_STEPS, 100) grants that many and wakes the next, by either engine alike: the native
/// path counts its grants and leaves such a crowd to the Lua.
#[test]
fn a_release_to_a_crowd_grants_at_most_a_hundred_by_either_engine() {
    use redsem_verify::diff::dump;
    use redsem_verify::diff::engine::{Engine, plant_clock};

    let server = server(&config(1, 0));
    let mut conn = server.connection();
    plant_clock(&mut conn, 1_800_000_000_000_000).expect("the clock");
    let mut outcomes = Vec::new();
    for kind in [EngineKind::Scripts, EngineKind::Native] {
        let engine = Engine::load(&mut conn, kind, "crowd", &[]).expect("the engine");
        let keys: Vec<String> = ["count", "queue", "waiters", "records", "meta", "applied"]
            .iter()
            .map(|k| format!("{{r{}}}:{k}", kind.name()))
            .collect();
        let mut seq = 0u64;
        let mut call = |conn: &mut redis::Connection, op: &str, args: &[&str]| {
            seq += 1;
            let s = format!("{seq:x}");
            let mut all: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
            all.extend([s.clone(), "sess".to_owned(), s]);
            engine.call(conn, op, &keys, &all)
        };
        call(&mut conn, "permit_try_set", &["set", "0"]);
        for i in 0..120 {
            let id = format!("w{i:03}");
            call(
                &mut conn,
                "permit_acquire",
                &[&id, "1", "wait", "30000", "ch"],
            );
        }
        let before = support::served(&mut conn).0;
        let added = call(&mut conn, "permit_add", &["r", "120"]);
        let served = support::served(&mut conn).0 - before;
        let contents: Vec<_> = keys
            .iter()
            .map(|k| dump::key(&mut conn, k).expect("a key's contents"))
            .collect();
        let granted = contents[3].contents.matches("g|1").count();
        outcomes.push((added, contents, granted, served));
    }
    assert_eq!(outcomes[0].0, outcomes[1].0, "the replies");
    assert_eq!(outcomes[0].1, outcomes[1].1, "the keys");
    assert_eq!(
        (outcomes[0].2, outcomes[1].2),
        (100, 100),
        "grants by one release"
    );
    assert_eq!(
        outcomes[1].3, 0,
        "the native path left the crowd to the Lua"
    );
}
