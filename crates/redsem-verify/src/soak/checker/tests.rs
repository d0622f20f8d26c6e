//! The checker's rules, each on a planted history.

use super::super::history::{Audit, Final};
use super::*;

fn meta() -> Record {
    Record::Meta(Meta {
        seed: 1,
        deployment: "single".into(),
        capacity: [("m".to_owned(), 2)].into(),
        permits: [("p".to_owned(), 2)].into(),
        latch_count: 2,
        lease_ms: 1000,
        waiter_lease_ms: 1000,
        ..Meta::default()
    })
}

/// A grant of `slots` on "m": invoked at `inv`, answered at `ret`, released at `end`.
fn grant(inv: u64, ret: u64, token: u64, slots: &[u32], end: u64) -> LeaseOp {
    LeaseOp {
        name: "m".into(),
        op: "acquire".into(),
        units: slots.len() as u32,
        inv_us: inv,
        ret_us: ret,
        outcome: "ok".into(),
        token: Some(token),
        slots: slots.to_vec(),
        end: Some("release".into()),
        end_us: Some(end),
        valid_until_us: Some(end + 1_000_000),
        ..LeaseOp::default()
    }
}

fn rules(records: Vec<Record>) -> Vec<&'static str> {
    check(&records).iter().map(|v| v.rule).collect()
}

fn lease(ops: Vec<LeaseOp>) -> Vec<Record> {
    let mut records = vec![meta()];
    records.extend(ops.into_iter().map(Record::Lease));
    records
}

#[test]
fn capacity() {
    // Two of capacity 2, then a third after one ended: fine.
    let ok = lease(vec![
        grant(0, 10, 1, &[0], 100),
        grant(0, 20, 2, &[1], 50),
        grant(40, 50, 3, &[1], 90),
    ]);
    assert_eq!(rules(ok), Vec::<&str>::new());
    // The third while both still believe they hold: over capacity (and a slot shared).
    let bad = lease(vec![
        grant(0, 10, 1, &[0], 100),
        grant(0, 20, 2, &[1], 100),
        grant(25, 30, 3, &[1], 90),
    ]);
    assert!(rules(bad).contains(&"capacity"));
    // lost() ends the believed interval: no longer over capacity.
    let mut lost = grant(0, 20, 2, &[1], 100);
    lost.lost_us = Some(25);
    let ok = lease(vec![
        grant(0, 10, 1, &[0], 100),
        lost,
        grant(26, 30, 3, &[1], 90),
    ]);
    assert_eq!(rules(ok), Vec::<&str>::new());
}

#[test]
fn tokens() {
    let ok = lease(vec![grant(0, 10, 5, &[0], 11), grant(20, 30, 6, &[0], 31)]);
    assert_eq!(rules(ok), Vec::<&str>::new());
    // Concurrent grants may carry tokens in either order.
    let ok = lease(vec![grant(0, 10, 6, &[0], 11), grant(5, 30, 5, &[1], 31)]);
    assert_eq!(rules(ok), Vec::<&str>::new());
    let bad = lease(vec![grant(0, 10, 6, &[0], 11), grant(20, 30, 5, &[0], 31)]);
    assert_eq!(rules(bad), vec!["token"]);
    let bad = lease(vec![grant(0, 10, 6, &[0], 11), grant(20, 30, 6, &[0], 31)]);
    assert!(rules(bad).contains(&"token"));
}

#[test]
fn slots() {
    let ok = lease(vec![grant(0, 10, 1, &[0], 100), grant(0, 20, 2, &[1], 100)]);
    assert_eq!(rules(ok), Vec::<&str>::new());
    let bad = lease(vec![grant(0, 10, 1, &[0], 100), grant(0, 20, 2, &[0], 100)]);
    assert_eq!(rules(bad), vec!["slots"]);
    // A slot beyond the capacity, or fewer slots than units.
    assert_eq!(
        rules(lease(vec![grant(0, 10, 1, &[2], 100)])),
        vec!["slots"]
    );
    let mut short = grant(0, 10, 1, &[1], 100);
    short.units = 2;
    assert!(rules(lease(vec![short])).contains(&"slots"));
}

#[test]
fn fifo() {
    let mut a = grant(0, 500, 10, &[0], 600);
    a.queued_us = Some(5);
    a.max_gap_us = Some(400);
    // B invoked after A queued, granted after A: fine.
    let ok = lease(vec![a.clone(), grant(100, 700, 11, &[0], 800)]);
    assert_eq!(rules(ok), Vec::<&str>::new());
    // B invoked after A queued, granted before A (smaller token): not FIFO.
    let bad = lease(vec![a.clone(), grant(100, 110, 9, &[1], 120)]);
    assert_eq!(rules(bad), vec!["fifo"]);
    // The same during a fault on A's client: not judged.
    let mut faulted = lease(vec![a.clone(), grant(100, 110, 9, &[1], 120)]);
    faulted.push(Record::Fault(Fault {
        kind: "freeze".into(),
        target: "client0".into(),
        start_us: 50,
        end_us: 60,
    }));
    assert_eq!(rules(faulted), Vec::<&str>::new());
    // A stalled for longer than half a waiter lease: it may have lost its place.
    let mut stalled = a.clone();
    stalled.max_gap_us = Some(600_000);
    assert_eq!(
        rules(lease(vec![stalled, grant(100, 110, 9, &[1], 120)])),
        Vec::<&str>::new()
    );
    // B invoked before A was known queued: either order.
    let ok = lease(vec![a, grant(3, 110, 9, &[1], 120)]);
    assert_eq!(rules(ok), Vec::<&str>::new());
}

fn latch(op: &str, inv: u64, ret: u64, outcome: &str, count: Option<u64>) -> Record {
    Record::Latch(LatchOp {
        name: "l".into(),
        op: op.into(),
        inv_us: inv,
        ret_us: ret,
        outcome: outcome.into(),
        count,
        ..LatchOp::default()
    })
}

#[test]
fn latch_rules() {
    let ok = vec![
        meta(),
        latch("count_down", 0, 10, "ok", None),
        latch("count", 11, 12, "ok", Some(1)),
        latch("count_down", 20, 30, "ok", None),
        latch("wait", 5, 31, "ok", None),
        latch("wait", 40, 41, "ok", None),
    ];
    assert_eq!(rules(ok), Vec::<&str>::new());
    // Opened after one count-down of two.
    let early = vec![
        meta(),
        latch("count_down", 0, 10, "ok", None),
        latch("wait", 5, 15, "ok", None),
        latch("count_down", 20, 30, "ok", None),
    ];
    assert_eq!(rules(early), vec!["latch"]);
    // Still closed after both count-downs were acknowledged.
    let late = vec![
        meta(),
        latch("count_down", 0, 10, "ok", None),
        latch("count_down", 20, 30, "ok", None),
        latch("count", 40, 41, "ok", Some(1)),
        latch("wait", 50, 500, "timeout", None),
    ];
    assert_eq!(rules(late), vec!["latch", "latch"]);
    // Behind Sentinels a latch whose set was not acknowledged (then answered "already")
    // is not judged: the set may have been lost in a failover. It is on one server.
    let unset = |deployment: &str| {
        let mut m = meta();
        if let Record::Meta(meta) = &mut m {
            meta.deployment = deployment.into();
        }
        vec![
            m,
            latch(
                "set",
                0,
                5,
                "error: change acknowledged by 1 of the 2 replicas",
                None,
            ),
            latch("set", 6, 7, "already", None),
            latch("count", 10, 11, "ok", Some(0)),
        ]
    };
    assert_eq!(rules(unset("single")), vec!["latch"]);
    assert_eq!(rules(unset("sentinel")), Vec::<&str>::new());
}

fn permit(op: &str, n: i64, inv: u64, ret: u64, release: Option<u64>) -> Record {
    Record::Permit(PermitOp {
        name: "p".into(),
        op: op.into(),
        n,
        inv_us: inv,
        ret_us: ret,
        outcome: "ok".into(),
        release_inv_us: release,
        release_ret_us: release.map(|t| t + 1),
        release_outcome: release.map(|_| "ok".into()),
        ..PermitOp::default()
    })
}

fn permits_final(value: i64) -> Record {
    Record::Final(Final {
        kind: "permits".into(),
        name: "p".into(),
        value,
        waiters: 0,
        at_us: 1000,
    })
}

#[test]
fn permit_rules() {
    let ok = vec![
        meta(),
        permit("acquire", 2, 0, 10, Some(50)),
        permit("add", 1, 20, 21, None),
        permit("acquire", 1, 22, 30, Some(40)),
        permit("add", -1, 60, 61, None),
        permits_final(2),
    ];
    assert_eq!(rules(ok), Vec::<&str>::new());
    // Three held of two.
    let inflated = vec![
        meta(),
        permit("acquire", 2, 0, 10, Some(50)),
        permit("acquire", 1, 22, 30, Some(40)),
        permits_final(2),
    ];
    assert_eq!(rules(inflated), vec!["permits"]);
    // One permit gone at the end.
    let leaked = vec![
        meta(),
        permit("acquire", 1, 0, 10, Some(50)),
        permits_final(1),
    ];
    assert_eq!(rules(leaked), vec!["permits"]);
}

#[test]
fn lease_end() {
    // TIME 5,000,000 µs read between 1,000 and 1,200 µs: a stored end of 5,900 ms is
    // reached by 1,200 + 900,000 µs.
    let look = |believed, end_ms: Option<i64>| Audit {
        via: "read".into(),
        believed_us: believed,
        t0_us: 1_000,
        t1_us: 1_200,
        server_us: Some(5_000_000),
        end_ms,
    };
    let held = |looks: Vec<Audit>| {
        let mut op = grant(0, 10, 1, &[0], 2_000_000);
        op.audits = looks;
        op
    };
    let ok = lease(vec![held(vec![
        look(901_200, Some(5_900)),
        look(1_100, None),
        look(1_200, Some(-7_000)),
    ])]);
    assert_eq!(rules(ok), Vec::<&str>::new());
    // Believed 100 µs past the server's lease: broken though nobody else was granted.
    let late = lease(vec![held(vec![look(901_300, Some(5_900))])]);
    assert_eq!(rules(late), vec!["lease_end"]);
    // The server no longer held it (no entry, a tombstone, a refresh answered "not
    // held") while the holder believed it valid past the look.
    for gone in [None, Some(-7_000)] {
        let bad = lease(vec![held(vec![look(50_000, gone)])]);
        assert_eq!(rules(bad), vec!["lease_end"]);
    }
    let refresh = Audit {
        via: "refresh".into(),
        server_us: None,
        ..look(50_000, None)
    };
    assert_eq!(rules(lease(vec![held(vec![refresh])])), vec!["lease_end"]);
    // Under `volatile` a loss of the state between the grant and the look excuses a
    // lease not found, not a stored one that ends too soon.
    let volatile = |op: LeaseOp| {
        let mut records = lease(vec![op]);
        if let Record::Meta(meta) = &mut records[0] {
            meta.deployment = "volatile".into();
        }
        records.push(Record::Fault(Fault {
            kind: "restart".into(),
            target: "server".into(),
            start_us: 500,
            end_us: 700,
        }));
        records
    };
    assert_eq!(
        rules(volatile(held(vec![look(50_000, None)]))),
        Vec::<&str>::new()
    );
    assert_eq!(
        rules(volatile(held(vec![look(901_300, Some(5_900))]))),
        vec!["lease_end"]
    );
}

#[test]
fn reconcile() {
    let fin = |value, waiters| {
        Record::Final(Final {
            kind: "lease".into(),
            name: "m".into(),
            value,
            waiters,
            at_us: 1000,
        })
    };
    assert_eq!(rules(vec![meta(), fin(0, 0)]), Vec::<&str>::new());
    assert_eq!(rules(vec![meta(), fin(1, 0)]), vec!["reconcile"]);
    assert_eq!(rules(vec![meta(), fin(0, 1)]), vec!["reconcile"]);
}

fn look(after: &str, id: Option<&str>, leased: &[&str], queued: &[&str]) -> Look {
    Look {
        name: "m".into(),
        after: after.into(),
        id: id.map(str::to_owned),
        inv_us: 1_000,
        cancel_us: 2_000,
        t0_us: 402_000,
        t1_us: 402_500,
        leased: leased.iter().map(|s| (*s).to_owned()).collect(),
        queued: queued.iter().map(|s| (*s).to_owned()).collect(),
        ..Look::default()
    }
}

#[test]
fn cancel() {
    let mut released = grant(0, 10, 1, &[0], 1_000);
    released.id = Some("x".into());
    released.release_outcome = Some("cancelled".into());
    let with = |looks: Vec<Look>, extra: Vec<Record>| {
        let mut records = lease(vec![released.clone()]);
        records.extend(looks.into_iter().map(Record::Look));
        records.extend(extra);
        records
    };
    // The cancelled release was applied: its id is gone.
    let ok = with(vec![look("release", Some("x"), &["y"], &[])], vec![]);
    assert_eq!(rules(ok), Vec::<&str>::new());
    // Still held 400 ms after the cancel: stranded.
    let bad = with(vec![look("release", Some("x"), &["x"], &[])], vec![]);
    assert_eq!(rules(bad), vec!["cancel"]);
    // Not judged across a fault on its client, nor after a rollback of the semaphore.
    let fault = |kind: &str, target: &str, at: u64| {
        Record::Fault(Fault {
            kind: kind.into(),
            target: target.into(),
            start_us: at,
            end_us: at + 10,
        })
    };
    let cut = with(
        vec![look("release", Some("x"), &["x"], &[])],
        vec![fault("cut", "client0", 100_000)],
    );
    assert_eq!(rules(cut), Vec::<&str>::new());
    let other = with(
        vec![look("release", Some("x"), &["x"], &[])],
        vec![fault("cut", "client1", 100_000)],
    );
    assert_eq!(rules(other), vec!["cancel"]);
    let rolled = with(
        vec![look("release", Some("x"), &["x"], &[])],
        vec![fault("rollback", "m", 300_000)],
    );
    assert_eq!(rules(rolled), Vec::<&str>::new());

    // A cancelled acquire: a new id that no grant nor call in progress stands behind.
    let mut acquire = look("acquire", None, &["x", "w"], &["w"]);
    acquire.before = vec!["x".into()];
    assert_eq!(rules(with(vec![acquire.clone()], vec![])), vec!["cancel"]);
    // The same with another call waiting then (its request may be "w"): fine.
    let waiting = LeaseOp {
        name: "m".into(),
        op: "acquire".into(),
        client: 1,
        inv_us: 50_000,
        ret_us: 900_000,
        outcome: "stopped".into(),
        ..LeaseOp::default()
    };
    let mut records = with(vec![acquire.clone()], vec![]);
    records.push(Record::Lease(waiting));
    assert_eq!(rules(records), Vec::<&str>::new());
    // Or "w" is a grant the history knows, held at the look.
    let mut held = grant(50_000, 60_000, 2, &[1], 900_000);
    held.id = Some("w".into());
    let mut records = with(vec![acquire.clone()], vec![]);
    records.push(Record::Lease(held.clone()));
    assert_eq!(rules(records), Vec::<&str>::new());
    // Or "w" is the first id of a call granted later under another id: it stalled half a
    // waiter lease or more between check-ins, lost its place and was queued again.
    let mut requeued = grant(50_000, 900_000, 3, &[0], 950_000);
    requeued.id = Some("v".into());
    requeued.max_gap_us = Some(500_000);
    let mut records = with(vec![acquire.clone()], vec![]);
    records.push(Record::Lease(requeued.clone()));
    assert_eq!(rules(records), Vec::<&str>::new());
    // Without such a gap its place was never dropped: "w" is not its.
    requeued.max_gap_us = Some(400_000);
    let mut records = with(vec![acquire.clone()], vec![]);
    records.push(Record::Lease(requeued));
    assert_eq!(rules(records), vec!["cancel"]);
    // Released long before the look: it stands behind nothing any more.
    held.end_us = Some(70_000);
    let mut records = with(vec![acquire.clone()], vec![]);
    records.push(Record::Lease(held));
    assert_eq!(rules(records), vec!["cancel"]);
    // Any fault between the call and the look: not judged.
    assert_eq!(
        rules(with(vec![acquire], vec![fault("kill", "server", 200_000)])),
        Vec::<&str>::new()
    );
}

#[test]
fn cancelled_count_downs_count_and_doubled_ones_are_seen() {
    let cancelled = |inv: u64| {
        Record::Latch(LatchOp {
            name: "l".into(),
            op: "count_down".into(),
            inv_us: inv,
            ret_us: inv + 1,
            outcome: "cancelled".into(),
            ..LatchOp::default()
        })
    };
    // Two count-downs, one cancelled: the latch must read 0 once the cancelled one had
    // time to finish in the background.
    let ok = vec![
        meta(),
        latch("count_down", 0, 10, "ok", None),
        cancelled(20),
        latch("count", 400_000, 400_010, "ok", Some(0)),
    ];
    assert_eq!(rules(ok), Vec::<&str>::new());
    let lost = vec![
        meta(),
        latch("count_down", 0, 10, "ok", None),
        cancelled(20),
        latch("count", 400_000, 400_010, "ok", Some(1)),
    ];
    assert_eq!(rules(lost), vec!["latch"]);
    // Right after the cancel either count is possible.
    let early = vec![
        meta(),
        latch("count_down", 0, 10, "ok", None),
        cancelled(20),
        latch("count", 30, 40, "ok", Some(1)),
    ];
    assert_eq!(rules(early), Vec::<&str>::new());
    // One count-down counted twice (its resend applied again): 0 after one started.
    let doubled = vec![
        meta(),
        latch("count_down", 0, 10, "ok", None),
        latch("count", 20, 30, "ok", Some(0)),
    ];
    assert_eq!(rules(doubled), vec!["latch"]);
}

#[test]
fn a_cancelled_permit_release_gives_back_its_permits() {
    let cancelled = |fault: Option<Record>| {
        let mut op = permit("acquire", 1, 0, 10, Some(50));
        if let Record::Permit(p) = &mut op {
            p.release_outcome = Some("cancelled".into());
        }
        let mut records = vec![meta(), op];
        records.extend(fault);
        records
    };
    let mut gone = cancelled(None);
    gone.push(permits_final(1));
    assert_eq!(rules(gone), vec!["permits"]);
    let mut back = cancelled(None);
    back.push(permits_final(2));
    assert_eq!(rules(back), Vec::<&str>::new());
    // A fault on its client while it ran in the background: it may have failed.
    let mut cut = cancelled(Some(Record::Fault(Fault {
        kind: "cut".into(),
        target: "client0".into(),
        start_us: 100,
        end_us: 100,
    })));
    cut.push(permits_final(1));
    assert_eq!(rules(cut), Vec::<&str>::new());
}

#[test]
fn tokens_go_on_increasing_across_a_state_loss() {
    let mut records = lease(vec![
        grant(0, 10, 500, &[0], 20),
        grant(100, 110, 501, &[0], 120),
        // After the semaphore was rolled back to the state before the second grant, the
        // next token must still be above it.
        grant(300, 310, 501, &[0], 320),
    ]);
    records.push(Record::Fault(Fault {
        kind: "rollback".into(),
        target: "m".into(),
        start_us: 50,
        end_us: 200,
    }));
    assert!(rules(records).contains(&"token"));
}

#[test]
fn a_history_round_trips_through_json_lines() {
    let records = lease(vec![grant(0, 10, 1, &[0], 100)]);
    let mut buf = Vec::new();
    super::super::history::write(&mut buf, &records).unwrap();
    let back = super::super::history::read(&buf[..]).unwrap();
    assert_eq!(back, records);
}
