//! The rule on latches: waits, counts and count-downs agree.

use super::super::history::{Fault, LatchOp, Record};
use super::*;

/// Whether the latch's first set was acknowledged (`ok`), as the replicas confirm it.
pub(super) fn set_acknowledged(ops: &[&LatchOp]) -> bool {
    ops.iter()
        .filter(|o| o.op == "set")
        .min_by_key(|o| o.inv_us)
        .is_none_or(|o| o.outcome == "ok")
}

pub(super) fn check_latch(
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
