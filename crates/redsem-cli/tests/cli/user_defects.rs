//! Defects found by using the binary as a user would, each kept fixed by a test.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use redsem::redis;
use redsem_test::{RedisServer, eventually};

use crate::support::{LIMIT, World, bare, finish};

/// The waiter lease of every `acquire` and `run` (the library's default; the CLI has no flag
/// for it).
const WAITER_LEASE: Duration = Duration::from_secs(10);

/// A one-node cluster (`--cluster-enabled yes`, every slot added, never met another node)
/// answers CLUSTER SLOTS and CLUSTER NODES with an empty address for itself, meaning "the
/// address you asked": `--url redis+cluster://` to it works (it failed with exit 69, "failed
/// to lookup address information"), and `doctor` checks it.
#[test]
fn status_through_a_one_node_cluster_that_reports_an_empty_address() {
    let server = RedisServer::start_with(&["--cluster-enabled", "yes"]);
    let mut admin = server.connection();
    let _: () = redis::cmd("CLUSTER")
        .arg("ADDSLOTSRANGE")
        .arg(0)
        .arg(16383)
        .query(&mut admin)
        .expect("CLUSTER ADDSLOTSRANGE");
    eventually(LIMIT, "the one-node cluster is ok", || {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut admin)
            .expect("CLUSTER INFO");
        info.contains("cluster_state:ok")
    });
    let url = format!("redis+cluster://127.0.0.1:{}", server.port());
    let out = finish(bare(&["--url", &url, "status", "x"])).success();
    assert!(out.stdout.contains('x'), "{out:?}");
    let id = finish(bare(&["--url", &url, "acquire", "x", "--limit", "1"]))
        .success()
        .stdout
        .trim()
        .to_owned();
    finish(bare(&["--url", &url, "release", "x", &id])).success();
    // doctor finds the one primary at the address it asked (it found none: "16384 of 16384
    // slots have no primary", exit 78).
    let doctor = finish(bare(&["--url", &url, "doctor"]));
    assert!(
        doctor
            .stdout
            .contains("1 primaries, 16384 of 16384 slots assigned"),
        "{doctor:?}"
    );
    assert_ne!(doctor.code(), 78, "{doctor:?}");
}

/// A queued `acquire --wait` killed with SIGKILL, then granted when the holder releases,
/// costs no more than its waiter lease: the next `acquire --no-wait` succeeds within it, not
/// after the dead waiter's whole `--lease` (30 s by default; before, it failed for all of it).
#[test]
fn a_killed_queued_acquire_costs_no_more_than_its_waiter_lease() {
    let world = World::new();
    let holder = world.acquire("x", 1, &[]);
    let waiter = world.start(&["acquire", "x", "--limit", "1", "--wait", "60s"]);
    world.wait_for_waiters("x", 1);
    waiter.signal(Signal::SIGKILL);
    let killed = Instant::now();
    let out = waiter.wait();
    assert!(out.status.code().is_none(), "killed: {out:?}");
    world.run(&["release", "x", &holder]).success();
    // The dead waiter's place ends at most a waiter lease after its last check-in, which came
    // before the kill; then the next request finds the unit free.
    let limit = WAITER_LEASE + LIMIT / 2;
    let mut last = None;
    let next = loop {
        let out = finish(world.redsem(&["acquire", "x", "--limit", "1", "--no-wait"]));
        if out.code() == 0 {
            break out.stdout.trim().to_owned();
        }
        assert!(
            killed.elapsed() < limit,
            "no unit {limit:?} after the kill; last: {out:?}"
        );
        last = Some(out);
        std::thread::sleep(Duration::from_millis(200));
    };
    assert!(
        last.is_some_and(|out| out.code() == 75),
        "refused as busy meanwhile"
    );
    world.run(&["release", "x", &next]).success();
}
