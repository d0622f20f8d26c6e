//! The rule on permit semaphores: the permits held at once and the final count.

use super::super::history::{Fault, PermitOp, Record};
use super::*;

pub(super) fn check_permits(
    name: &str,
    initial: i64,
    ops: &[&PermitOp],
    fin: Option<&super::super::history::Final>,
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
