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
//! * `tenant_cap`, `tenant_share`, `tenant_fifo` on a semaphore whose tenants the history
//!   configures (`tenants.rs`): no tenant above its cap; no grant to a tenant that surely
//!   held more per weight than a surely waiting tenant whose head surely fitted its cap could
//!   have; `fifo` within each tenant (in place of `fifo` across them).
//!
//! Under `deployment == "volatile"` (no persistence, restarts lose the state) the capacity and
//! slot rules compare only grants made between the same two state losses, as README's "Safety by
//! deployment" promises; tokens are checked across losses. Under `sentinel` (every change
//! acknowledged by both replicas) the rules hold across failovers as on one server; only a
//! latch whose set was not acknowledged is left out (docs/SOAK.md).

use std::collections::BTreeMap;

mod latch;
mod lease;
mod permits;
mod tenants;
#[cfg(test)]
mod tests;

use super::history::{Fault, LatchOp, LeaseOp, Look, Meta, PermitOp, Record};
use latch::{check_latch, set_acknowledged};
use lease::{check_capacity_and_slots, check_fifo, check_lease_ends, check_looks, check_tokens};
use permits::check_permits;
use tenants::{check_caps, check_shares};

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
        if meta.tenants.iter().any(|t| t.name == *name) {
            for group in tenants::by_tenant(ops).values() {
                check_fifo("tenant_fifo", name, group, &faults, &meta, &mut out);
            }
            check_caps(name, ops, &meta.tenants, &losses, &mut out);
            check_shares(name, ops, &meta.tenants, &faults, &losses, &meta, &mut out);
        } else {
            check_fifo("fifo", name, ops, &faults, &meta, &mut out);
        }
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

/// Whether a fault that reaches `client` (one on its proxy, or on the server), widened by
/// `slack` after its end, overlaps `from..=to`.
fn faulted(faults: &[Fault], client: u32, from: u64, to: u64, slack: u64) -> bool {
    faults.iter().any(|f| {
        let reaches = !f.target.starts_with("client") || f.target == format!("client{client}");
        reaches && f.start_us <= to && f.end_us.saturating_add(slack) >= from
    })
}
