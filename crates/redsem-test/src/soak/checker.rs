//! The offline checker: reads a history and reports every guarantee it shows broken.
//!
//! The rules (see docs/SOAK.md for why each is sound under faults):
//!
//! * `capacity`: at no instant do the believed intervals of one semaphore's grants hold more
//!   units than its capacity. A believed interval runs from the grant's reply to the earliest of
//!   the release being sent, `lost()` firing and the end of the local validity.
//! * `token`: if grant A's reply came before grant B was invoked, A's token is below B's.
//! * `slots`: a grant has as many distinct slots as units, each below the capacity, and
//!   overlapping believed intervals share no slot.
//! * `fifo`: a waiter A that saw itself queued before B was invoked, and whose wait no fault
//!   overlapped, is granted before B: A's token is below B's.
//! * `latch`: a wait never succeeds, nor a count reads lower, than the count-downs sent by then
//!   allow; a count never reads higher, nor a wait times out without a fault, once enough
//!   count-downs were acknowledged.
//! * `permits`: the permits held at once never exceed those there could be; the final count
//!   matches the ledger of acknowledged operations (within what unacknowledged ones allow).
//! * `reconcile`: at the end no lease unit is in use and no one waits.
//! * `lease_end`: no holder believes its grant valid later than the lease the server stored
//!   for it (read while it was held, beside the server's `TIME`), nor after the server said
//!   it no longer held it; whether or not anyone else was granted the unit.
//! * `cancel`: a lease release cancelled at any point leaves its unit held no
//!   longer than the background release takes; a cancelled acquire leaves no request queued
//!   and no unit held. (A cancelled permit release is counted given back by `permits`, a
//!   cancelled count-down counted by `latch`.)
//!
//! Under `deployment == "volatile"` (no persistence, restarts lose the state) the capacity and
//! slot rules compare only grants made between the same two state losses, as README's "Safety by
//! deployment" promises; tokens are checked across losses. Under `sentinel` (every change
//! acknowledged by both replicas) the rules hold across failovers as on one server; only a
//! latch whose set was not acknowledged is left out (docs/SOAK.md).

use std::collections::{BTreeMap, HashMap};

use super::history::{Fault, LatchOp, LeaseOp, Look, Meta, PermitOp, Record};

/// One broken guarantee, with the records that show it.
#[derive(Debug, Clone)]
pub struct Violation {
    pub rule: &'static str,
    /// When the history shows it (µs since the start: the reply or look that broke it).
    pub at_us: u64,
    pub detail: String,
    pub excerpt: Vec<Record>,
}

/// Fault kinds that lose state: a lease semaphore's keys deleted or rolled back, or a restart
/// without persistence.
fn loses_state(fault: &Fault, meta: &Meta) -> bool {
    fault.kind == "lose_state"
        || fault.kind == "rollback"
        || (meta.deployment == "volatile" && fault.kind == "restart")
}

/// How long a call given up (cancelled) may take to finish in the background, or a release
/// sent may take to be applied, without a fault (µs). The looks come `LOOK_AFTER_MS` after
/// the cancel, a little later.
const SETTLE_US: u64 = 300_000;

pub fn check(records: &[Record]) -> Vec<Violation> {
    let mut meta = Meta::default();
    let mut faults = Vec::new();
    let mut lease: BTreeMap<&str, Vec<&LeaseOp>> = BTreeMap::new();
    let mut permits: BTreeMap<&str, Vec<&PermitOp>> = BTreeMap::new();
    let mut latches: BTreeMap<&str, Vec<&LatchOp>> = BTreeMap::new();
    let mut finals = Vec::new();
    let mut looks: BTreeMap<&str, Vec<&Look>> = BTreeMap::new();
    for record in records {
        match record {
            Record::Meta(m) => meta = m.clone(),
            Record::Fault(f) => faults.push(f.clone()),
            Record::Lease(op) => lease.entry(&op.name).or_default().push(op),
            Record::Permit(op) => permits.entry(&op.name).or_default().push(op),
            Record::Latch(op) => latches.entry(&op.name).or_default().push(op),
            Record::Final(f) => finals.push(f.clone()),
            Record::Look(l) => looks.entry(&l.name).or_default().push(l),
        }
    }
    let mut out = Vec::new();
    for (name, ops) in &lease {
        let capacity = meta.capacity.get(*name).copied().unwrap_or(u32::MAX);
        let losses: Vec<&Fault> = faults
            .iter()
            .filter(|f| loses_state(f, &meta) && (f.target == "server" || f.target == *name))
            .collect();
        check_capacity_and_slots(name, capacity, ops, &losses, &mut out);
        check_tokens(name, ops, &mut out);
        check_fifo(name, ops, &faults, &meta, &mut out);
        if meta.deployment != "sentinel" {
            check_lease_ends(name, ops, &losses, &mut out);
        }
        let name_looks = looks.get(name).map_or(&[][..], Vec::as_slice);
        check_looks(name, ops, name_looks, &faults, &losses, &meta, &mut out);
    }
    for (name, ops) in &latches {
        if meta.deployment == "sentinel" && !set_acknowledged(ops) {
            // A set the replicas did not acknowledge may be lost in a failover, and the
            // setter's retry is answered "already set" from the primary that has it, with no
            // `WAIT` (a read): the latch may be unset on the next primary, where it reads 0.
            continue;
        }
        check_latch(
            name,
            meta.latch_count,
            ops,
            &faults,
            meta.waiter_lease_ms * 1000,
            &mut out,
        );
    }
    for (name, ops) in &permits {
        let initial = meta.permits.get(*name).copied().unwrap_or(0);
        let fin = finals
            .iter()
            .find(|f| f.kind == "permits" && f.name == *name);
        check_permits(name, i64::from(initial), ops, fin, &faults, &mut out);
    }
    for fin in &finals {
        if fin.kind == "lease" && (fin.value != 0 || fin.waiters != 0) {
            out.push(Violation {
                rule: "reconcile",
                at_us: fin.at_us,
                detail: format!(
                    "{}: {} units in use and {} waiting at the end, after every lease could have ended",
                    fin.name, fin.value, fin.waiters
                ),
                excerpt: vec![Record::Final(fin.clone())],
            });
        }
    }
    out
}

/// Which state epoch `op`'s grant belongs to (the number of losses before it), or `None` if a
/// loss overlaps the grant itself.
fn epoch(op: &LeaseOp, losses: &[&Fault]) -> Option<usize> {
    let mut n = 0;
    for f in losses {
        if f.end_us < op.inv_us {
            n += 1;
        } else if f.start_us <= op.ret_us {
            return None;
        }
    }
    Some(n)
}

fn check_capacity_and_slots(
    name: &str,
    capacity: u32,
    ops: &[&LeaseOp],
    losses: &[&Fault],
    out: &mut Vec<Violation>,
) {
    let mut by_epoch: BTreeMap<usize, Vec<&LeaseOp>> = BTreeMap::new();
    for op in ops.iter().filter(|op| op.granted()) {
        let distinct: std::collections::BTreeSet<u32> = op.slots.iter().copied().collect();
        if distinct.len() != op.units as usize || op.slots.iter().any(|&s| s >= capacity) {
            out.push(Violation {
                rule: "slots",
                at_us: op.ret_us,
                detail: format!(
                    "{name}: a grant of {} units has slots {:?} (capacity {capacity})",
                    op.units, op.slots
                ),
                excerpt: vec![Record::Lease((*op).clone())],
            });
        }
        if let Some(e) = epoch(op, losses) {
            by_epoch.entry(e).or_default().push(op);
        }
    }
    for grants in by_epoch.values() {
        // Ends before starts at the same instant: intervals are half-open.
        let mut events: Vec<(u64, bool, usize)> = Vec::new();
        for (i, op) in grants.iter().enumerate() {
            if let Some((start, end)) = op.believed()
                && end > start
            {
                events.push((start, true, i));
                events.push((end, false, i));
            }
        }
        events.sort_by_key(|&(t, is_start, i)| (t, is_start, i));
        let mut active: Vec<usize> = Vec::new();
        let mut used: u64 = 0;
        let mut slot_owner: HashMap<u32, usize> = HashMap::new();
        let (mut over_reported, mut slot_reported) = (false, false);
        for (_, is_start, i) in events {
            let op = grants[i];
            if is_start {
                for &slot in &op.slots {
                    if let Some(&other) = slot_owner.get(&slot)
                        && !slot_reported
                    {
                        slot_reported = true;
                        out.push(Violation {
                                rule: "slots",
                                at_us: op.ret_us,
                                detail: format!(
                                    "{name}: slot {slot} given to token {:?} while token {:?} believed it held it",
                                    op.token, grants[other].token
                                ),
                                excerpt: vec![
                                    Record::Lease(grants[other].clone()),
                                    Record::Lease(op.clone()),
                                ],
                            });
                    }
                }
                for &slot in &op.slots {
                    slot_owner.insert(slot, i);
                }
                active.push(i);
                used += u64::from(op.units);
                if used > u64::from(capacity) && !over_reported {
                    over_reported = true;
                    out.push(Violation {
                        rule: "capacity",
                        at_us: op.ret_us,
                        detail: format!(
                            "{name}: {used} units believed held at once, capacity {capacity}"
                        ),
                        excerpt: active
                            .iter()
                            .map(|&j| Record::Lease(grants[j].clone()))
                            .collect(),
                    });
                }
            } else {
                active.retain(|&j| j != i);
                used -= u64::from(op.units);
                for slot in &op.slots {
                    if slot_owner.get(slot) == Some(&i) {
                        slot_owner.remove(slot);
                    }
                }
            }
        }
    }
}

/// For each grant B, the largest token among grants whose reply came before B's invocation.
fn check_tokens(name: &str, ops: &[&LeaseOp], out: &mut Vec<Violation>) {
    let mut grants: Vec<&LeaseOp> = ops.iter().copied().filter(|op| op.granted()).collect();
    grants.sort_by_key(|op| op.ret_us);
    // prefix[k] = index (in `grants`) of the largest token among grants[..=k].
    let mut prefix: Vec<usize> = Vec::with_capacity(grants.len());
    for (k, op) in grants.iter().enumerate() {
        let best = match prefix.last() {
            Some(&b) if grants[b].token >= op.token => b,
            _ => k,
        };
        prefix.push(best);
    }
    let mut seen: HashMap<u64, usize> = HashMap::new();
    let mut reported = 0;
    for (k, b) in grants.iter().enumerate() {
        let token = b.token.unwrap_or(0);
        if let Some(&other) = seen.get(&token) {
            if reported < 3 {
                out.push(Violation {
                    rule: "token",
                    at_us: b.ret_us,
                    detail: format!("{name}: token {token} granted twice"),
                    excerpt: vec![
                        Record::Lease(grants[other].clone()),
                        Record::Lease((*b).clone()),
                    ],
                });
            }
            reported += 1;
        }
        seen.insert(token, k);
        let before = grants.partition_point(|a| a.ret_us < b.inv_us);
        if before == 0 {
            continue;
        }
        let a = grants[prefix[before - 1]];
        if a.token >= b.token {
            if reported < 3 {
                out.push(Violation {
                    rule: "token",
                    at_us: b.ret_us,
                    detail: format!(
                        "{name}: token {} granted after token {:?} was already answered",
                        token, a.token
                    ),
                    excerpt: vec![Record::Lease(a.clone()), Record::Lease((*b).clone())],
                });
            }
            reported += 1;
        }
    }
}

/// Each look at the server (`LeaseOp::audits`) against the holder's belief just before it: a
/// `TIME` of T read between local `t0` and `t1` means the server reaches a stored lease end E
/// by `t1 + (E - T)`; a grant it no longer held (no entry, a tombstone, a refresh answered
/// "not held") had ended by `t1`. A local validity later than that outlasts the server's
/// lease. Under `volatile` a look that finds no lease is not judged if a state loss came
/// between the grant and the look (README allows the old holder to go on believing).
fn check_lease_ends(name: &str, ops: &[&LeaseOp], losses: &[&Fault], out: &mut Vec<Violation>) {
    let mut found: Vec<Violation> = Vec::new();
    for op in ops.iter().filter(|op| op.granted()) {
        for look in &op.audits {
            let Some(by) = look.server_end_by() else {
                continue;
            };
            let gone = look.end_ms.is_none_or(|e| e <= 0);
            let between = |f: &&&Fault| f.start_us <= look.t1_us && f.end_us >= op.inv_us;
            let lost_state = losses.iter().any(|f| between(&f));
            // A rollback puts back the lease end of an older renewal.
            let rolled_back = losses.iter().any(|f| between(&f) && f.kind == "rollback");
            if look.believed_us <= by || (gone && lost_state) || rolled_back {
                continue;
            }
            let server = if gone {
                format!(
                    "the server no longer held it ({} at {} us)",
                    look.via, look.t1_us
                )
            } else {
                format!(
                    "the server's lease (end {} ms, read at TIME {} us, {}..{} us) ends by {by} us",
                    look.end_ms.unwrap_or(0),
                    look.server_us.unwrap_or(0),
                    look.t0_us,
                    look.t1_us
                )
            };
            found.push(Violation {
                rule: "lease_end",
                at_us: look.t1_us,
                detail: format!(
                    "{name}: token {:?} believed valid until {} us, {} us after {server}",
                    op.token,
                    look.believed_us,
                    look.believed_us - by
                ),
                excerpt: vec![Record::Lease((*op).clone())],
            });
        }
    }
    found.sort_by_key(|v| v.at_us);
    let shown = found.len().min(3);
    if found.len() > shown {
        let more = found.len() - shown;
        found.truncate(shown);
        if let Some(last) = found.last_mut() {
            last.detail
                .push_str(&format!(" (and {more} more looks like it)"));
        }
    }
    out.extend(found);
}

/// The `cancel` rule, over the looks taken `LOOK_AFTER_MS` after a cancelled
/// lease call, on a connection that no proxy stands in. A look is judged only if no fault
/// came between the call and the look (one reaching the client for a release, any for an
/// acquire, whose request id the history does not know) and no state loss of the semaphore
/// within a lease before it (a rollback puts back ids the server had let go).
///
/// * `release`: the permit's id must no longer be listed (held, with a positive lease): a
///   release, once called, happens, also in the background if its future was dropped.
/// * `acquire`: the ids listed at the look but not just before the call, that belong to no
///   grant of the history whose permit was alive (or ended within `SETTLE_US`) then, are
///   requests the history cannot name: at most one per other lease call of the semaphore
///   in progress then (or ended within `SETTLE_US`) that got no grant it knows. One more is a
///   request left queued, or a unit granted and never given back.
fn check_looks(
    name: &str,
    ops: &[&LeaseOp],
    looks: &[&Look],
    faults: &[Fault],
    losses: &[&Fault],
    meta: &Meta,
    out: &mut Vec<Violation>,
) {
    let lease_us = meta.lease_ms * 1000;
    let mut found: Vec<Violation> = Vec::new();
    for look in looks {
        let lost = losses
            .iter()
            .any(|f| f.start_us <= look.t1_us && f.end_us + lease_us >= look.inv_us);
        if lost {
            continue;
        }
        match look.after.as_str() {
            "release" => {
                let Some(id) = look.id.as_deref() else {
                    continue;
                };
                if !look.leased.iter().any(|l| l == id)
                    || faulted(faults, look.client, look.inv_us, look.t1_us, 0)
                {
                    continue;
                }
                let mut excerpt: Vec<Record> = ops
                    .iter()
                    .filter(|op| op.id.as_deref() == Some(id))
                    .map(|op| Record::Lease((*op).clone()))
                    .collect();
                excerpt.push(Record::Look((*look).clone()));
                found.push(Violation {
                    rule: "cancel",
                    at_us: look.t1_us,
                    detail: format!(
                        "{name}: the release of {id} was cancelled at {} us, and {} us later the server still held it",
                        look.cancel_us,
                        look.t0_us.saturating_sub(look.cancel_us)
                    ),
                    excerpt,
                });
            }
            "acquire" => {
                let anywhere = faults
                    .iter()
                    .any(|f| f.start_us <= look.t1_us && f.end_us + SETTLE_US >= look.inv_us);
                if anywhere {
                    continue;
                }
                let alive = |op: &&&LeaseOp| {
                    op.inv_us <= look.t1_us
                        && op.end_us.unwrap_or(u64::MAX).saturating_add(SETTLE_US) >= look.t0_us
                };
                let known: std::collections::HashSet<&str> = ops
                    .iter()
                    .filter(alive)
                    .filter_map(|op| op.id.as_deref())
                    .collect();
                let mut unknown: Vec<&str> = look
                    .leased
                    .iter()
                    .chain(&look.queued)
                    .map(String::as_str)
                    .filter(|id| !look.before.iter().any(|b| b == id) && !known.contains(id))
                    .collect();
                unknown.sort_unstable();
                unknown.dedup();
                // Other calls that may stand behind an id the history does not know.
                let unnamed = ops
                    .iter()
                    .filter(|op| op.op != "status" && op.id.is_none())
                    .filter(|op| {
                        !(op.client == look.client
                            && op.task == look.task
                            && op.inv_us == look.inv_us)
                    })
                    .filter(|op| op.inv_us <= look.t1_us && op.ret_us + SETTLE_US >= look.t0_us)
                    .count();
                if unknown.len() <= unnamed {
                    continue;
                }
                found.push(Violation {
                    rule: "cancel",
                    at_us: look.t1_us,
                    detail: format!(
                        "{name}: an acquire cancelled at {} us; {} us later the server listed {} request(s) no call of the history stands behind ({}; {unnamed} unnamed calls in progress)",
                        look.cancel_us,
                        look.t0_us.saturating_sub(look.cancel_us),
                        unknown.len() - unnamed,
                        unknown.join(", ")
                    ),
                    excerpt: vec![Record::Look((*look).clone())],
                });
            }
            _ => {}
        }
    }
    found.sort_by_key(|v| v.at_us);
    let shown = found.len().min(3);
    if found.len() > shown {
        let more = found.len() - shown;
        found.truncate(shown);
        if let Some(last) = found.last_mut() {
            last.detail.push_str(&format!(" (and {more} more like it)"));
        }
    }
    out.extend(found);
}

/// Whether a fault that reaches `client` (one on its proxy, or on the server), widened by
/// `slack` after its end, overlaps `from..=to`.
fn faulted(faults: &[Fault], client: u32, from: u64, to: u64, slack: u64) -> bool {
    faults.iter().any(|f| {
        let reaches = !f.target.starts_with("client") || f.target == format!("client{client}");
        reaches && f.start_us <= to && f.end_us.saturating_add(slack) >= from
    })
}

fn check_fifo(
    name: &str,
    ops: &[&LeaseOp],
    faults: &[Fault],
    meta: &Meta,
    out: &mut Vec<Violation>,
) {
    let slack = meta.waiter_lease_ms * 1000;
    // Waiters that queued and were granted with no fault during their wait.
    let mut waiters: Vec<(u64, &LeaseOp)> = ops
        .iter()
        .filter(|op| op.granted() && !faulted(faults, op.client, op.inv_us, op.ret_us, slack))
        // A waiter whose client stalled (no check-in answered for half a waiter lease: a
        // starved runtime is a fault the nemesis does not log) may have lost its place.
        .filter(|op| op.max_gap_us.is_some_and(|gap| gap < slack / 2))
        .filter_map(|op| op.queued_us.map(|q| (q, *op)))
        .collect();
    waiters.sort_by_key(|&(q, _)| q);
    let mut prefix: Vec<usize> = Vec::with_capacity(waiters.len());
    for (k, (_, op)) in waiters.iter().enumerate() {
        let best = match prefix.last() {
            Some(&b) if waiters[b].1.token >= op.token => b,
            _ => k,
        };
        prefix.push(best);
    }
    let mut reported = 0;
    for b in ops.iter().filter(|op| op.granted()) {
        let before = waiters.partition_point(|&(q, _)| q < b.inv_us);
        if before == 0 {
            continue;
        }
        let a = waiters[prefix[before - 1]].1;
        if a.token > b.token {
            if reported < 3 {
                out.push(Violation {
                    rule: "fifo",
                    at_us: b.ret_us,
                    detail: format!(
                        "{name}: token {:?} invoked after token {:?} was queued, but granted first",
                        b.token, a.token
                    ),
                    excerpt: vec![Record::Lease(a.clone()), Record::Lease((*b).clone())],
                });
            }
            reported += 1;
        }
    }
}

/// Whether the latch's first set was acknowledged (`ok`), as the replicas confirm it.
fn set_acknowledged(ops: &[&LatchOp]) -> bool {
    ops.iter()
        .filter(|o| o.op == "set")
        .min_by_key(|o| o.inv_us)
        .is_none_or(|o| o.outcome == "ok")
}

fn check_latch(
    name: &str,
    count: u64,
    ops: &[&LatchOp],
    faults: &[Fault],
    slack: u64,
    out: &mut Vec<Violation>,
) {
    let mut downs: Vec<&LatchOp> = ops
        .iter()
        .copied()
        .filter(|o| o.op == "count_down")
        .collect();
    let mut sent: Vec<u64> = downs.iter().map(|o| o.inv_us).collect();
    sent.sort_unstable();
    // A count-down, once called, happens: one cancelled (its future dropped) is
    // counted as acknowledged `SETTLE_US` after the cancel, unless a fault reaching its client
    // came in between (the background count-down may have failed, as an unanswered one may).
    let settled = |o: &LatchOp| {
        o.outcome == "cancelled" && !faulted(faults, o.client, o.inv_us, o.ret_us + SETTLE_US, 0)
    };
    downs.retain(|o| o.outcome == "ok" || settled(o));
    let confirmed = |o: &LatchOp| {
        if o.outcome == "ok" {
            o.ret_us
        } else {
            o.ret_us + SETTLE_US
        }
    };
    downs.sort_by_key(|o| confirmed(o));
    let acked: Vec<u64> = downs.iter().map(|o| confirmed(o)).collect();
    let mut reported = 0;
    let mut report = |detail: String, op: &LatchOp, extra: Option<&LatchOp>| {
        if reported < 3 {
            let mut excerpt = Vec::new();
            if let Some(e) = extra {
                excerpt.push(Record::Latch(e.clone()));
            }
            excerpt.push(Record::Latch(op.clone()));
            out.push(Violation {
                rule: "latch",
                at_us: op.ret_us,
                detail,
                excerpt,
            });
        }
        reported += 1;
    };
    for op in ops {
        if op.outcome != "ok" && op.outcome != "timeout" {
            continue;
        }
        let sent_before = sent.partition_point(|&t| t < op.ret_us) as u64;
        let acked_before = acked.partition_point(|&t| t < op.inv_us) as u64;
        let least = count.saturating_sub(sent_before);
        let most = count.saturating_sub(acked_before);
        let seen = match (op.op.as_str(), op.outcome.as_str()) {
            ("wait", "ok") => Some(0),
            // A count-down answers the count it left: a read made by the call itself.
            ("count" | "count_down", "ok") => op.count,
            ("wait", "timeout") => {
                if most == 0 && !faulted(faults, op.client, op.inv_us, op.ret_us, slack) {
                    let last = downs.get(count as usize - 1).copied();
                    report(
                        format!(
                            "{name}: a wait timed out although {count} count-downs were acknowledged before it began"
                        ),
                        op,
                        last,
                    );
                }
                None
            }
            _ => None,
        };
        if let Some(seen) = seen {
            if seen < least {
                report(
                    format!(
                        "{name}: {} read {seen} when only {sent_before} of {count} count-downs had been sent",
                        op.op
                    ),
                    op,
                    None,
                );
            } else if seen > most {
                let last = downs.get(acked_before as usize - 1).copied();
                report(
                    format!(
                        "{name}: count read {seen} after {acked_before} of {count} count-downs were acknowledged"
                    ),
                    op,
                    last,
                );
            }
        }
    }
}

fn check_permits(
    name: &str,
    initial: i64,
    ops: &[&PermitOp],
    fin: Option<&super::history::Final>,
    faults: &[Fault],
    out: &mut Vec<Violation>,
) {
    // Inflation. Every permit held at once was held on the server at the latest of their
    // grants, which came after each of them was invoked: the permits that existed then are at
    // most the initial ones, plus the additions sent before now, minus the removals
    // acknowledged before the latest invocation among the holders.
    let mut additions: Vec<(u64, i64)> = Vec::new();
    let mut removals: Vec<(u64, i64)> = Vec::new();
    let mut events: Vec<(u64, bool, usize)> = Vec::new();
    let (mut lo, mut hi, mut bounded) = (initial, initial, true);
    for (i, op) in ops.iter().enumerate() {
        let ok = op.outcome == "ok";
        if op.op == "add" {
            if op.n > 0 {
                additions.push((op.inv_us, op.n));
            } else if ok {
                removals.push((op.ret_us, op.n));
            }
            if ok {
                lo += op.n;
                hi += op.n;
            } else if op.n > 0 {
                hi += op.n;
            } else {
                lo += op.n;
            }
        } else if ok {
            if op.n > 0 {
                events.push((op.ret_us, true, i));
                events.push((op.release_inv_us.unwrap_or(u64::MAX), false, i));
            }
            // A release cancelled at any point gives its permits back all the same (issue
            // 33), unless a fault reaching its client came while it ran in the background.
            let given_back = match op.release_outcome.as_deref() {
                Some("ok") => true,
                Some("cancelled") => {
                    let (from, to) = (
                        op.release_inv_us.unwrap_or(0),
                        op.release_ret_us.unwrap_or(0),
                    );
                    !faulted(faults, op.client, from, to + SETTLE_US, 0)
                }
                _ => false,
            };
            if op.n > 0 && !given_back {
                lo -= op.n;
            }
        } else if op.op == "drain" && op.outcome.starts_with("error") {
            bounded = false;
        } else if op.outcome.starts_with("error") {
            lo -= op.n;
        }
    }
    additions.sort_unstable();
    removals.sort_unstable();
    let sum_before = |list: &[(u64, i64)], t: u64| -> i64 {
        list[..list.partition_point(|&(at, _)| at < t)]
            .iter()
            .map(|&(_, n)| n)
            .sum()
    };
    // Releases first at equal times.
    events.sort_by_key(|&(t, is_start, i)| (t, is_start, i));
    let mut holding: Vec<usize> = Vec::new();
    for (t, is_start, i) in events {
        if !is_start {
            holding.retain(|&j| j != i);
            continue;
        }
        holding.push(i);
        let held: i64 = holding.iter().map(|&j| ops[j].n).sum();
        let latest = holding.iter().map(|&j| ops[j].inv_us).max().unwrap_or(0);
        let most = initial + sum_before(&additions, t) + sum_before(&removals, latest);
        if held > most {
            out.push(Violation {
                rule: "permits",
                at_us: t,
                detail: format!("{name}: {held} permits held at once, at most {most} existed"),
                excerpt: holding
                    .iter()
                    .map(|&j| Record::Permit(ops[j].clone()))
                    .collect(),
            });
            return;
        }
    }
    if let Some(fin) = fin
        && (fin.value > hi || (bounded && fin.value < lo) || fin.waiters != 0)
    {
        out.push(Violation {
                rule: "permits",
                at_us: fin.at_us,
                detail: format!(
                    "{name}: {} permits available and {} waiting at the end; the ledger allows {lo}..={hi} and none waiting",
                    fin.value, fin.waiters
                ),
                excerpt: vec![Record::Final(fin.clone())],
            });
    }
}

#[cfg(test)]
mod tests {
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
}
