//! Every key a script touches arrives in its KEYS, and no script is called without keys: what
//! proxies (a cluster proxy, a serverless cache) need to route a script, and what Redis asks
//! of scripts though it checks it only across cluster slots.
//!
//! A workload that calls every operation of all three primitives (with and without group
//! commit, queued and not, timed out, cancelled, idle clean-up) runs while `MONITOR` records
//! what the server executes, the commands scripts run among it (`[0 lua]`); each of those is
//! asked for its keys (`COMMAND GETKEYS`) and held to the KEYS of the call that ran it.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead as _, BufReader, Write as _};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use redsem::{LeaseOptions, PermitOptions, RedsemOptions};

use crate::support::*;

/// The operations the library calls, one script function each; the workload must reach them
/// all, or the test proves less than it says.
const OPERATIONS: [&str; 20] = [
    "latch_count_down",
    "latch_delete",
    "latch_state",
    "latch_try_set",
    "lease_acquire",
    "lease_batch",
    "lease_poll",
    "lease_refresh",
    "lease_release",
    "lease_set_capacity",
    "lease_status",
    "lease_tidy",
    "permit_acquire",
    "permit_add",
    "permit_available",
    "permit_batch",
    "permit_delete",
    "permit_drain",
    "permit_poll",
    "permit_try_set",
];

/// `MONITOR` on a connection of its own, its lines collected by a thread until dropped.
struct Monitor {
    lines: Arc<Mutex<Vec<String>>>,
    stream: std::net::TcpStream,
}

impl Monitor {
    fn start(port: u16) -> Monitor {
        let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect");
        stream
            .write_all(b"*1\r\n$7\r\nMONITOR\r\n")
            .expect("send MONITOR");
        let mut reader = BufReader::new(stream.try_clone().expect("clone"));
        let mut ok = String::new();
        reader.read_line(&mut ok).expect("MONITOR's reply");
        assert_eq!(ok.trim_end(), "+OK", "MONITOR refused");
        let lines = Arc::new(Mutex::new(Vec::new()));
        let sink = lines.clone();
        std::thread::spawn(move || {
            let mut line = String::new();
            while reader.read_line(&mut line).is_ok_and(|n| n > 0) {
                sink.lock().expect("lines").push(line.trim_end().to_owned());
                line.clear();
            }
        });
        Monitor { lines, stream }
    }

    fn stop(self) -> Vec<String> {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        std::mem::take(&mut *self.lines.lock().expect("lines"))
    }
}

/// One line of `MONITOR`: whether a script ran it, and its words (unquoted).
fn parse_line(line: &str) -> Option<(bool, Vec<Vec<u8>>)> {
    let line = line.strip_prefix('+')?;
    let open = line.find('[')?;
    let close = open + line[open..].find(']')?;
    let from_script = line[open..close].ends_with(" lua");
    let mut words = Vec::new();
    let mut rest = &line.as_bytes()[close + 1..];
    loop {
        while let [b' ', tail @ ..] = rest {
            rest = tail;
        }
        let [b'"', tail @ ..] = rest else { break };
        rest = tail;
        let mut word = Vec::new();
        loop {
            match rest {
                [b'"', tail @ ..] => {
                    rest = tail;
                    break;
                }
                [b'\\', b'x', hi, lo, tail @ ..] => {
                    let hex = [*hi, *lo];
                    let text = std::str::from_utf8(&hex).ok()?;
                    word.push(u8::from_str_radix(text, 16).ok()?);
                    rest = tail;
                }
                [b'\\', c, tail @ ..] => {
                    word.push(match c {
                        b'n' => b'\n',
                        b'r' => b'\r',
                        b't' => b'\t',
                        b'a' => 7,
                        b'b' => 8,
                        other => *other,
                    });
                    rest = tail;
                }
                [c, tail @ ..] => {
                    word.push(*c);
                    rest = tail;
                }
                [] => return None,
            }
        }
        words.push(word);
    }
    Some((from_script, words))
}

/// Call every operation of the three primitives, on the paths that differ: free and busy,
/// queued and handed over, timed out, cancelled, group commit, idle.
async fn workload(ctx: &TestContext) {
    let short = LeaseOptions::default()
        .lease(Duration::from_millis(600))
        .waiter_lease(Duration::from_millis(300));
    for batched in [false, true] {
        let redsem = connect_with(
            &ctx.server.url(),
            RedsemOptions::default().prefix("t").group_commit(batched),
        )
        .await
        .expect("connect");
        let sem = redsem
            .lease_semaphore_with("keys", 2, short.clone())
            .expect("semaphore");
        // Free, then busy; a waiter handed a unit; a waiter that checks in and times out.
        let a = sem.try_acquire().await.expect("free");
        let b = sem.try_acquire().await.expect("free");
        assert!(sem.try_acquire().await.is_err(), "busy");
        let waiter = {
            let sem = sem.clone();
            tokio::spawn(async move { sem.acquire().await })
        };
        let late = sem.acquire_timeout(Duration::from_millis(700)).await;
        assert!(late.is_err(), "timed out while both units were held");
        a.refresh().await.expect("refresh");
        a.release().await.expect("release");
        let handed = within(LIMIT, "the waiter", waiter)
            .await
            .expect("task")
            .expect("handed the unit");
        // Cancelled while queued.
        let _ = tokio::time::timeout(Duration::from_millis(50), sem.acquire()).await;
        let many = sem
            .acquire_many_timeout(2, Duration::from_millis(100))
            .await;
        assert!(many.is_err(), "two units are not free");
        sem.status().await.expect("status");
        sem.set_capacity(3).await.expect("set_capacity");
        let id = handed.id().clone();
        handed.forget();
        sem.release_id(&id).await.expect("release_id");
        b.release().await.expect("release");
        // Calls at once: with group commit they share a call (a batch).
        let burst = (0..8).map(|_| {
            let sem = sem.clone();
            async move {
                if let Ok(permit) = sem.try_acquire().await {
                    permit.release().await.expect("release");
                }
            }
        });
        futures_util::future::join_all(burst).await;
        // The mutex is a lease semaphore of 1.
        let mutex = redsem.mutex("keys-mutex").expect("mutex");
        mutex
            .lock()
            .await
            .expect("lock")
            .unlock()
            .await
            .expect("unlock");

        let options = PermitOptions::default().waiter_lease(Duration::from_millis(300));
        let permits = redsem
            .permit_semaphore_with("keys", options)
            .expect("permits");
        permits.try_set_permits(1).await.expect("try_set");
        permits.try_acquire(1).await.expect("one free");
        assert!(permits.try_acquire(1).await.is_err(), "none free");
        let waiter = {
            let permits = permits.clone();
            tokio::spawn(async move { permits.acquire(1).await })
        };
        // Long enough for the waiter to check in (a poll) before it is served.
        tokio::time::sleep(Duration::from_millis(400)).await;
        permits.release(1).await.expect("release");
        within(LIMIT, "the permit waiter", waiter)
            .await
            .expect("task")
            .expect("served");
        let burst = (0..8).map(|_| {
            let permits = permits.clone();
            async move {
                permits.release(1).await.expect("release");
                let _ = permits.try_acquire(1).await;
            }
        });
        futures_util::future::join_all(burst).await;
        let _ = tokio::time::timeout(Duration::from_millis(50), permits.acquire(1)).await;
        let _ = permits.acquire_timeout(1, Duration::from_millis(100)).await;
        permits.add_permits(2).await.expect("add");
        permits.available_permits().await.expect("available");
        permits.drain_permits().await.expect("drain");
        permits.delete().await.expect("delete");

        let latch = redsem.count_down_latch("keys").expect("latch");
        latch.try_set_count(2).await.expect("try_set");
        latch.count_down().await.expect("count_down");
        latch.state().await.expect("state");
        latch.count_down().await.expect("count_down");
        latch.wait().await.expect("open");
        latch.try_set_count(1).await.expect("set again");
        latch.delete().await.expect("delete");
        within(LIMIT, "flush", redsem.flush()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_a_script_touches_arrives_in_its_keys_and_every_call_has_keys() {
    if skip_without(
        Needs::Functions,
        "every_key_a_script_touches_arrives_in_its_keys_and_every_call_has_keys",
        "reads the keys of each FCALL by the function name it calls",
    ) {
        return;
    }
    let ctx = TestContext::start().await;
    let monitor = Monitor::start(ctx.server.port());
    within(LIMIT * 3, "the workload", workload(&ctx)).await;
    // MONITOR lines trail the calls a little.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let lines = monitor.stop();
    let mut raw = ctx.raw().await;
    // The call being run, by the line that started it: its function and KEYS.
    let mut call: Option<(String, BTreeSet<Vec<u8>>)> = None;
    let mut seen: BTreeMap<String, usize> = BTreeMap::new();
    let mut wrong: Vec<String> = Vec::new();
    let mut script_commands = 0;
    let mut publishes = 0;
    for line in &lines {
        let Some((from_script, words)) = parse_line(line) else {
            continue;
        };
        let Some(command) = words
            .first()
            .map(|w| String::from_utf8_lossy(w).to_uppercase())
        else {
            continue;
        };
        if !from_script {
            call = None;
            let (name_at, keys_at) = match command.as_str() {
                "FCALL" | "FCALL_RO" | "EVALSHA" | "EVALSHA_RO" | "EVAL" | "EVAL_RO" => (1, 2),
                _ => continue,
            };
            let function = String::from_utf8_lossy(&words[name_at]).into_owned();
            let numkeys: usize = String::from_utf8_lossy(&words[keys_at])
                .parse()
                .expect("numkeys");
            if numkeys == 0 {
                wrong.push(format!("{command} {function} with no keys"));
            }
            let keys = words[keys_at + 1..keys_at + 1 + numkeys]
                .iter()
                .cloned()
                .collect();
            if let Some(op) = OPERATIONS.iter().find(|op| function.ends_with(*op)) {
                *seen.entry((*op).to_owned()).or_default() += 1;
            }
            call = Some((format!("{command} {function}"), keys));
            continue;
        }
        let Some((name, keys)) = &call else {
            wrong.push(format!("a script's {command} without a call before it"));
            continue;
        };
        script_commands += 1;
        if command == "PUBLISH" {
            publishes += 1;
        }
        let mut getkeys = redis::cmd("COMMAND");
        getkeys.arg("GETKEYS");
        for word in &words {
            getkeys.arg(word.as_slice());
        }
        // Commands without keys (TIME, PUBLISH) answer an error.
        let Ok(touched) = getkeys.query_async::<Vec<Vec<u8>>>(&mut raw).await else {
            continue;
        };
        for key in touched {
            if !keys.contains(&key) {
                wrong.push(format!(
                    "{name}: {command} touched {:?}, not among its KEYS",
                    String::from_utf8_lossy(&key)
                ));
            }
        }
    }
    let missing: Vec<&str> = OPERATIONS
        .iter()
        .copied()
        .filter(|op| !seen.contains_key(*op))
        .collect();
    assert!(
        missing.is_empty(),
        "the workload never called {missing:?} (saw {seen:?})"
    );
    wrong.sort();
    wrong.dedup();
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    println!(
        "{} calls of {} operations, {script_commands} commands inside them ({publishes} PUBLISH), every key in KEYS",
        seen.values().sum::<usize>(),
        seen.len()
    );
}
