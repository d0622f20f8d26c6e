//! The rules on lease semaphores: capacity and slots, tokens, lease ends, the looks after
//! cancelled calls, first in first out.

use std::collections::{BTreeMap, HashMap};

use super::super::history::{Fault, LeaseOp, Look, Meta, Record};
use super::*;

/// The believed intervals of `grants` as a sweep: (instant, whether it starts, index in
/// `grants`), in time order, ends before starts at the same instant (intervals are half-open).
/// Grants believed for no time are left out.
pub(super) fn believed_events(grants: &[&LeaseOp]) -> Vec<(u64, bool, usize)> {
    let mut events: Vec<(u64, bool, usize)> = Vec::new();
    for (i, op) in grants.iter().enumerate() {
        if let Some((start, end)) = op.believed()
            && end > start
        {
            events.push((start, true, i));
            events.push((end, false, i));
        }
    }
    events.sort_unstable();
    events
}

pub(super) fn check_capacity_and_slots(
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
        let events = believed_events(grants);
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
pub(super) fn check_tokens(name: &str, ops: &[&LeaseOp], out: &mut Vec<Violation>) {
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
pub(super) fn check_lease_ends(
    name: &str,
    ops: &[&LeaseOp],
    losses: &[&Fault],
    out: &mut Vec<Violation>,
) {
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
///   in progress then (or ended within `SETTLE_US`) that got no grant it knows, or whose
///   check-ins were half a waiter lease apart (it may have been queued again under a new
///   id). One more is a request left queued, or a unit granted and never given back.
pub(super) fn check_looks(
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
                // Other calls that may stand behind an id the history does not know: those
                // that got no grant, and those whose check-ins were half a waiter lease apart
                // or more (the FIFO rule's bound): such a call may have lost its place and
                // been queued again under a new id (`Gone`), the history knowing it by the
                // id of its grant only, while its first id stays listed until its waiter
                // lease ends.
                let requeued = |op: &LeaseOp| {
                    op.max_gap_us
                        .is_some_and(|gap| gap >= meta.waiter_lease_ms * 1000 / 2)
                };
                let unnamed = ops
                    .iter()
                    .filter(|op| op.op != "status" && (op.id.is_none() || requeued(op)))
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

/// The `fifo` rule over `ops`: every request of a semaphore without tenants, or one tenant's
/// (`rule` `tenant_fifo`: first in, first out within a tenant).
pub(super) fn check_fifo(
    rule: &'static str,
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
                let tenant = b.tenant.as_deref().map(|t| format!(" of tenant {t:?}"));
                out.push(Violation {
                    rule,
                    at_us: b.ret_us,
                    detail: format!(
                        "{name}: token {:?} invoked after token {:?}{} was queued, but granted first",
                        b.token,
                        a.token,
                        tenant.unwrap_or_default()
                    ),
                    excerpt: vec![Record::Lease(a.clone()), Record::Lease((*b).clone())],
                });
            }
            reported += 1;
        }
    }
}
