//! The differential runner: the Lua library with and without its fast paths answers every
//! call the same, and a change to either is seen.

use redsem_test::RedisServer;
use redsem_verify::diff::{self, Config, EngineKind, Patch, Report};

fn run(
    server: &RedisServer,
    seed: u64,
    steps: u64,
    engines: [EngineKind; 2],
    patches: Vec<Patch>,
) -> Report {
    let config = Config {
        seed,
        steps,
        engines,
        patches,
        module: None,
    };
    diff::run(server, &config).unwrap_or_else(|e| panic!("seed {seed}: the run failed: {e}"))
}

#[test]
fn the_fast_paths_answer_as_the_general_path() {
    let server = RedisServer::start();
    let mut reached = std::collections::BTreeMap::<String, u64>::new();
    for seed in 1..=4 {
        let report = run(
            &server,
            seed,
            2_500,
            [EngineKind::Scripts, EngineKind::ScriptsGeneral],
            vec![],
        );
        if let Some(divergence) = &report.divergence {
            panic!("seed {seed}: {divergence}");
        }
        assert_eq!(report.steps, 2_500);
        assert!(
            report.lost > 0 && report.resends > 0 && report.faults > 0,
            "{report:?}"
        );
        for (outcome, n) in report.outcomes {
            *reached.entry(outcome).or_default() += n;
        }
    }
    // What the calls must have reached, so that the comparison means something: every
    // operation, and the outcomes where the fast paths and the general path part ways.
    for outcome in [
        "lease_acquire GRANTED",
        "lease_acquire QUEUED",
        "lease_acquire BUSY",
        "lease_acquire CONFLICT",
        "lease_acquire TOOBIG",
        "lease_acquire LABEL",
        "lease_acquire GONE",
        "lease_acquire WRONGTYPE",
        "lease_release RELEASED",
        "lease_release DEQUEUED",
        "lease_release NOTHELD",
        "lease_release WRONGTYPE",
        "lease_poll GRANTED",
        "lease_poll QUEUED",
        "lease_poll GONE",
        "lease_refresh OK",
        "lease_status STATUS",
        "lease_tidy OK",
        "lease_set_capacity OK",
        "permit_acquire GRANTED",
        "permit_acquire QUEUED",
        "permit_acquire BUSY",
        "permit_add ADDED",
        "permit_add REPEATED",
        "permit_add RANGE",
        "permit_try_set SET",
        "permit_try_set EXISTS",
        "permit_drain DRAINED",
        "permit_poll GRANTED",
        "permit_poll GONE",
        "permit_withdraw WITHDRAWN",
        "permit_withdraw UNKNOWN",
        "permit_available AVAILABLE",
        "permit_delete DELETED",
        "latch_try_set SET",
        "latch_try_set EXISTS",
        "latch_count_down COUNTED",
        "latch_count_down REPEATED",
        "latch_count_down ABSENT",
        "latch_state COUNTING",
        "latch_state DONE",
        "latch_delete DELETED",
    ] {
        assert!(
            reached.contains_key(outcome),
            "no call reached {outcome}; reached: {:?}",
            reached.keys().collect::<Vec<_>>()
        );
    }
    for batched in [
        "lease_batch GRANTED (batched)",
        "lease_batch QUEUED (batched)",
        "lease_batch RELEASED (batched)",
        "lease_batch DEQUEUED (batched)",
        "permit_batch GRANTED (batched)",
        "permit_batch ADDED (batched)",
        "permit_batch QUEUED (batched)",
    ] {
        assert!(reached.contains_key(batched), "no call reached {batched}");
    }
}

/// The first divergence of `patch` (applied to the second engine) over seeds 1..=8.
fn first_divergence(
    engines: [EngineKind; 2],
    find: &str,
    replace: &str,
) -> Option<diff::Divergence> {
    let server = RedisServer::start();
    (1..=8).find_map(|seed| {
        let patch = Patch {
            find: find.to_owned(),
            replace: replace.to_owned(),
        };
        run(&server, seed, 3_000, engines, vec![patch]).divergence
    })
}

#[test]
fn a_fast_path_that_answers_otherwise_is_seen() {
    // The uncontended release no longer says that it left the semaphore idle.
    let divergence = first_divergence(
        [EngineKind::ScriptsGeneral, EngineKind::Scripts],
        "return { 'RELEASED', used == 0 and 1 or 0 }",
        "return { 'RELEASED', 0 }",
    )
    .expect("the changed fast release is seen");
    assert_eq!(divergence.what, "reply", "{divergence}");
}

#[test]
fn a_failed_call_that_sets_the_idle_ttl_is_seen() {
    // A call stopped by a foreign value gives an idle semaphore its TTL on the general path
    // (the fast path, stopped the same way, changes nothing): how the two differed before.
    let divergence = first_divergence(
        [EngineKind::Scripts, EngineKind::ScriptsGeneral],
        "needs_idle_ttl() and not S.defer_idle and not S.failed then",
        "needs_idle_ttl() and not S.defer_idle then",
    )
    .expect("the idle TTL set by a failed call is seen");
    assert!(divergence.what.contains("lease"), "{divergence}");
}

#[test]
fn a_failed_grant_that_keeps_its_slot_is_seen() {
    // A grant stopped by a foreign value at leases leaves its slot bit set on the general
    // path: how the two differed before (the fast path clears it).
    let divergence = first_divergence(
        [EngineKind::Scripts, EngineKind::ScriptsGeneral],
        "  if not ok then\n    set_slots(slots, 0)\n    error(failure)\n  end\n  put('tok', token)",
        "  put('tok', token)\n  if not ok then\n    error(failure)\n  end",
    )
    .expect("the slot kept by a failed grant is seen");
    assert!(divergence.what.contains("lease"), "{divergence}");
}
