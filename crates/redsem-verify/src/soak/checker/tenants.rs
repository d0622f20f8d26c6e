//! The rules on tenants (fair shares between tenants of one lease semaphore, docs/DESIGN.md
//! "Tenants (fair shares)"; docs/SOAK.md says why each is sound under faults):
//!
//! * `tenant_cap`: at no instant do the believed intervals of one tenant's grants hold more
//!   units than its cap (as `capacity`, per tenant, between the same two state losses).
//! * `tenant_share`: a grant G to tenant X while a waiter of tenant Y surely waited is wrong if X
//!   surely held more per weight than Y could have, and Y's head surely fitted Y's cap.
//! * `tenant_fifo`: the `fifo` rule within each tenant (`lease::check_fifo` per tenant).

use std::collections::BTreeMap;

use super::super::history::{Fault, LeaseOp, Meta, Record, TenantConf};
use super::*;

/// The tenant a request named; `""` is the default tenant.
pub(super) fn tenant_of(op: &LeaseOp) -> &str {
    op.tenant.as_deref().unwrap_or("")
}

/// Weight and cap of `tenant` on semaphore `name` (the default tenant: 1, none). `None`: a
/// named tenant the history does not configure.
fn conf(confs: &[TenantConf], name: &str, tenant: &str) -> Option<(u64, Option<u64>)> {
    if tenant.is_empty() {
        return Some((1, None));
    }
    confs
        .iter()
        .find(|c| c.name == name && c.tenant == tenant)
        .map(|c| (u64::from(c.weight), c.cap.map(u64::from)))
}

/// `ops` grouped by tenant.
pub(super) fn by_tenant<'a>(ops: &[&'a LeaseOp]) -> BTreeMap<&'a str, Vec<&'a LeaseOp>> {
    let mut groups: BTreeMap<&str, Vec<&LeaseOp>> = BTreeMap::new();
    for op in ops {
        groups.entry(tenant_of(op)).or_default().push(op);
    }
    groups
}

/// `tenant_cap`: a sweep over the believed intervals of each capped tenant's grants, per state
/// epoch (ends before starts at equal times: intervals are half-open).
pub(super) fn check_caps(
    name: &str,
    ops: &[&LeaseOp],
    confs: &[TenantConf],
    losses: &[&Fault],
    out: &mut Vec<Violation>,
) {
    for (tenant, group) in by_tenant(ops) {
        let Some((_, Some(cap))) = conf(confs, name, tenant) else {
            continue;
        };
        let mut by_epoch: BTreeMap<usize, Vec<&LeaseOp>> = BTreeMap::new();
        for op in group.iter().filter(|op| op.granted()) {
            if let Some(e) = epoch(op, losses) {
                by_epoch.entry(e).or_default().push(op);
            }
        }
        for grants in by_epoch.values() {
            let events = super::lease::believed_events(grants);
            let mut active: Vec<usize> = Vec::new();
            let mut held = 0;
            for (_, is_start, i) in events {
                if !is_start {
                    active.retain(|&j| j != i);
                    held -= u64::from(grants[i].units);
                    continue;
                }
                active.push(i);
                held += u64::from(grants[i].units);
                if held > cap {
                    out.push(Violation {
                        rule: "tenant_cap",
                        at_us: grants[i].ret_us,
                        detail: format!(
                            "{name}: tenant {tenant:?} believed to hold {held} units at once, its cap {cap}"
                        ),
                        excerpt: active
                            .iter()
                            .map(|&j| Record::Lease(grants[j].clone()))
                            .collect(),
                    });
                    return;
                }
            }
        }
    }
}

/// `tenant_share`. Tokens increase in the order the server grants (within a state epoch), so
/// for a grant G (invoked at `inv`, answered at `ret`, made on the server at some instant `m`
/// between) of tenant X:
///
/// * X surely held at `m` the units of its other grants H with a lower token (granted before
///   `m`) whose believed interval ends at or after `ret` (still held at `m`): `held_x`;
/// * a tenant Y surely waited at `m` if a waiter W of Y that the `fifo` rule judges (granted,
///   no fault reaching its client during its wait widened by a waiter lease, check-ins under
///   half a waiter lease apart) saw itself queued by `inv` and has a higher token (granted
///   after `m`);
/// * Y held at most `could_y` at `m`: the units of every request of Y invoked by `ret` that
///   may still have held then: a grant with a lower token unless its release was answered
///   `ok` before `inv`; a request with any other outcome but `busy` (its reply lost, or granted
///   while it was given up), and a release not answered `ok`, up to `SETTLE_US` after its end
///   (the library releases in the background), or a lease, a waiter lease and `FAULT_US` more
///   where a fault reached its client meanwhile or its check-ins were half a waiter lease
///   apart (a request queued again under a new id may leave its first one behind);
/// * Y's head surely fits its cap if `could_y` + the most units any request of Y asked for is
///   within it.
///
/// Then `held_x / weight_x > could_y / weight_y` means X was granted while Y, with a lower
/// held / weight, waited for its turn: a violation. Not judged near a state loss of the
/// semaphore (a rollback puts back holders the history saw go), nor for a grant whose
/// invocation–reply overlaps one or lasts over `MAX_GRANT_US`.
pub(super) fn check_shares(
    name: &str,
    ops: &[&LeaseOp],
    confs: &[TenantConf],
    faults: &[Fault],
    losses: &[&Fault],
    meta: &Meta,
    out: &mut Vec<Violation>,
) {
    let lease_us = meta.lease_ms * 1000;
    let slack = meta.waiter_lease_ms * 1000;
    let long = lease_us + slack + FAULT_US;
    let groups = by_tenant(ops);
    // Until when a request may hold what the server gave it (µs), if at all.
    let may_hold_until = |op: &LeaseOp| -> Option<u64> {
        if op.op == "status" || op.outcome == "busy" {
            return None;
        }
        if op.granted() && op.release_outcome.as_deref() == Some("ok") {
            return op.release_ret_us;
        }
        let end = [op.end_us, op.release_ret_us, op.lost_us, op.valid_until_us]
            .into_iter()
            .flatten()
            .fold(op.ret_us, u64::max);
        let stalled = op.max_gap_us.is_some_and(|gap| gap >= slack / 2)
            || faulted(faults, op.client, op.inv_us, end + SETTLE_US, 0);
        Some(end + if stalled { long } else { SETTLE_US })
    };
    let mut tenants: BTreeMap<&str, Side> = BTreeMap::new();
    for (&tenant, group) in &groups {
        let Some((weight, cap)) = conf(confs, name, tenant) else {
            continue;
        };
        // Waiters the `fifo` rule judges, by when they saw themselves queued, with the
        // running maximum of their tokens.
        let mut waiters: Vec<(u64, &LeaseOp)> = group
            .iter()
            .filter(|op| {
                op.granted()
                    && op.max_gap_us.is_some_and(|gap| gap < slack / 2)
                    && !faulted(faults, op.client, op.inv_us, op.ret_us, slack)
            })
            .filter_map(|op| op.queued_us.map(|q| (q, *op)))
            .collect();
        waiters.sort_by_key(|&(q, _)| q);
        let mut latest: Vec<usize> = Vec::with_capacity(waiters.len());
        for (k, (_, op)) in waiters.iter().enumerate() {
            latest.push(match latest.last() {
                Some(&b) if waiters[b].1.token >= op.token => b,
                _ => k,
            });
        }
        let mut holds: Vec<(u64, u64, &LeaseOp)> = group
            .iter()
            .filter_map(|op| op.believed().map(|(s, e)| (op.inv_us, e.max(s), *op)))
            .filter(|&(_, e, op)| e > op.ret_us)
            .collect();
        holds.sort_by_key(|&(s, _, _)| s);
        let mut spans: Vec<(u64, u64, &LeaseOp)> = group
            .iter()
            .filter_map(|op| may_hold_until(op).map(|until| (op.inv_us, until, *op)))
            .collect();
        spans.sort_by_key(|&(s, _, _)| s);
        let most_units = group
            .iter()
            .map(|op| u64::from(op.units))
            .max()
            .unwrap_or(1);
        tenants.insert(
            tenant,
            Side {
                weight,
                cap,
                most_units,
                waiters,
                latest,
                holds: Sweep::new(holds),
                spans: Sweep::new(spans),
            },
        );
    }
    let mut grants: Vec<&LeaseOp> = ops.iter().copied().filter(|op| op.granted()).collect();
    grants.sort_by_key(|op| op.ret_us);
    let mut found = 0;
    for g in grants {
        let x = tenant_of(g);
        // The sweeps move forward with every grant, judged or not.
        for side in tenants.values_mut() {
            side.holds.to(g.ret_us, g.ret_us);
            side.spans
                .to(g.ret_us, g.ret_us.saturating_sub(MAX_GRANT_US));
        }
        let Some(e) = epoch(g, losses) else {
            continue;
        };
        // A grant that took long is left out: who held what is known too loosely over it.
        if g.ret_us - g.inv_us > MAX_GRANT_US
            || losses
                .iter()
                .any(|f| f.start_us <= g.ret_us && f.end_us + long >= g.inv_us)
        {
            continue;
        }
        let Some(side_x) = tenants.get(x) else {
            continue;
        };
        let held: Vec<&LeaseOp> = side_x
            .holds
            .active()
            .filter(|h| h.token < g.token && epoch(h, losses) == Some(e))
            .collect();
        let held_x: u64 = held.iter().map(|h| u64::from(h.units)).sum();
        if held_x == 0 {
            continue;
        }
        for (&y, side) in tenants.iter().filter(|(y, _)| **y != x) {
            let before = side.waiters.partition_point(|&(q, _)| q <= g.inv_us);
            let Some(waiter) = before
                .checked_sub(1)
                .map(|k| side.waiters[side.latest[k]].1)
                .filter(|w| w.token > g.token)
            else {
                continue;
            };
            let could_y: u64 = side
                .spans
                .active_with_end()
                .filter(|&(until, o)| until >= g.inv_us && !(o.granted() && o.token > g.token))
                .map(|(_, o)| u64::from(o.units))
                .sum();
            if side.cap.is_some_and(|cap| could_y + side.most_units > cap)
                || held_x * side.weight <= could_y * side_x.weight
            {
                continue;
            }
            found += 1;
            if found <= 3 {
                let mut excerpt: Vec<Record> =
                    held.iter().map(|h| Record::Lease((*h).clone())).collect();
                excerpt.push(Record::Lease(g.clone()));
                excerpt.push(Record::Lease(waiter.clone()));
                out.push(Violation {
                    rule: "tenant_share",
                    at_us: g.ret_us,
                    detail: format!(
                        "{name}: token {:?} granted to tenant {x:?} holding {held_x} units (weight {}) while tenant {y:?} (weight {}) waited holding at most {could_y} (its waiter's token {:?})",
                        g.token, side_x.weight, side.weight, waiter.token
                    ),
                    excerpt,
                });
            }
            break;
        }
    }
}

/// One tenant's side of `check_shares`.
struct Side<'a> {
    weight: u64,
    cap: Option<u64>,
    most_units: u64,
    waiters: Vec<(u64, &'a LeaseOp)>,
    latest: Vec<usize>,
    holds: Sweep<'a>,
    spans: Sweep<'a>,
}

/// Intervals (start, end) in the order of their starts, and those begun by the sweep's
/// instant and not ended before its horizon.
struct Sweep<'a> {
    items: Vec<(u64, u64, &'a LeaseOp)>,
    next: usize,
    active: Vec<usize>,
}

impl<'a> Sweep<'a> {
    fn new(items: Vec<(u64, u64, &'a LeaseOp)>) -> Sweep<'a> {
        Sweep {
            items,
            next: 0,
            active: Vec::new(),
        }
    }

    /// Take in the intervals begun by `now`, let go of those ended before `horizon`.
    fn to(&mut self, now: u64, horizon: u64) {
        while self.next < self.items.len() && self.items[self.next].0 <= now {
            self.active.push(self.next);
            self.next += 1;
        }
        let items = &self.items;
        self.active.retain(|&i| items[i].1 >= horizon);
    }

    fn active(&self) -> impl Iterator<Item = &'a LeaseOp> + '_ {
        self.active.iter().map(|&i| self.items[i].2)
    }

    fn active_with_end(&self) -> impl Iterator<Item = (u64, &'a LeaseOp)> + '_ {
        self.active
            .iter()
            .map(|&i| (self.items[i].1, self.items[i].2))
    }
}

/// The longest invocation–reply of a grant `tenant_share` judges (µs).
const MAX_GRANT_US: u64 = 1_000_000;

/// How long after its end a request whose client a fault reached may still have something
/// on the server: the longest fault that holds requests back (`frozen_client`, 2 s) and more.
const FAULT_US: u64 = 3_000_000;

#[cfg(test)]
mod tests {
    use super::*;

    /// Semaphore "m" of capacity 2 with tenants A (weight 1) and B (weight 3, cap 1).
    fn history(ops: Vec<LeaseOp>) -> Vec<Record> {
        let conf = |tenant: &str, weight, cap| TenantConf {
            name: "m".into(),
            tenant: tenant.into(),
            weight,
            cap,
        };
        let mut records = vec![Record::Meta(Meta {
            seed: 1,
            deployment: "single".into(),
            capacity: [("m".to_owned(), 2)].into(),
            lease_ms: 1000,
            waiter_lease_ms: 1000,
            tenants: vec![conf("A", 1, None), conf("B", 3, Some(1))],
            ..Meta::default()
        })];
        records.extend(ops.into_iter().map(Record::Lease));
        records
    }

    /// The rules broken, but `slots` (the grants here carry made-up slots).
    fn rules(records: &[Record]) -> Vec<&'static str> {
        let rules = check(records).into_iter().map(|v| v.rule);
        rules.filter(|&rule| rule != "slots").collect()
    }

    /// A grant of one unit to `tenant` (A on client 0, B on client 1), released at `end`
    /// (the release answered `ok` 5 µs later).
    fn grant(tenant: &str, inv: u64, ret: u64, token: u64, end: u64) -> LeaseOp {
        LeaseOp {
            client: u32::from(tenant == "B"),
            name: "m".into(),
            op: "acquire".into(),
            tenant: Some(tenant.into()),
            units: 1,
            inv_us: inv,
            ret_us: ret,
            outcome: "ok".into(),
            token: Some(token),
            slots: vec![u32::try_from(token % 2).unwrap_or(0)],
            end: Some("release".into()),
            end_us: Some(end),
            release_ret_us: Some(end + 5),
            release_outcome: Some("ok".into()),
            valid_until_us: Some(end + 1_000_000),
            ..LeaseOp::default()
        }
    }

    /// A grant that waited: it saw itself queued at `queued`, check-ins close together.
    fn waiter(tenant: &str, inv: u64, queued: u64, ret: u64, token: u64, end: u64) -> LeaseOp {
        let mut op = grant(tenant, inv, ret, token, end);
        op.queued_us = Some(queued);
        op.max_gap_us = Some(ret - queued);
        op
    }

    #[test]
    fn tenant_cap_counts_what_one_tenant_believes_it_holds() {
        // B (cap 1) holds one unit, then another after the first ended: fine.
        let ok = history(vec![grant("B", 0, 10, 1, 100), grant("B", 90, 110, 2, 200)]);
        assert_eq!(rules(&ok), Vec::<&str>::new());
        // The second while the first is still believed held: over B's cap (not the capacity).
        let bad = history(vec![grant("B", 0, 10, 1, 100), grant("B", 20, 30, 2, 200)]);
        assert_eq!(rules(&bad), vec!["tenant_cap"]);
        // A has no cap: two at once are fine.
        let ok = history(vec![grant("A", 0, 10, 1, 100), grant("A", 20, 30, 2, 200)]);
        assert_eq!(rules(&ok), Vec::<&str>::new());
    }

    #[test]
    fn tenant_share_sees_a_grant_to_the_tenant_holding_more_per_weight() {
        // A holds one unit (token 1) to 1000; B queued at 25 and is granted at 900 (token 5);
        // meanwhile A is granted again (token 3, invoked at 100): A held 1 / 1, B 0 / 3.
        let held = grant("A", 0, 10, 1, 1000);
        let b = waiter("B", 20, 25, 900, 5, 950);
        let bad = history(vec![held.clone(), grant("A", 100, 110, 3, 120), b.clone()]);
        assert_eq!(rules(&bad), vec!["tenant_share"]);
        // B's turn granted first: fine.
        let ok = history(vec![
            held.clone(),
            waiter("A", 100, 105, 990, 6, 995),
            waiter("B", 20, 25, 110, 3, 120),
        ]);
        assert_eq!(rules(&ok), Vec::<&str>::new());
        // B known queued only after A's grant was invoked: either order.
        let late = waiter("B", 20, 150, 900, 5, 950);
        let ok = history(vec![held.clone(), grant("A", 100, 110, 3, 120), late]);
        assert_eq!(rules(&ok), Vec::<&str>::new());
        // B may still have held a unit then (its release answered after A's invocation): at
        // its cap, it was skipped.
        let maybe = grant("B", 10, 22, 2, 100);
        let ok = history(vec![
            held.clone(),
            maybe,
            grant("A", 100, 110, 3, 120),
            b.clone(),
        ]);
        assert_eq!(rules(&ok), Vec::<&str>::new());
        // A fault on B's client during its wait: its place may have been lost.
        let mut faulted = history(vec![held.clone(), grant("A", 100, 110, 3, 120), b]);
        faulted.push(Record::Fault(Fault {
            kind: "freeze".into(),
            target: "client1".into(),
            start_us: 50,
            end_us: 60,
        }));
        assert_eq!(rules(&faulted), Vec::<&str>::new());
    }

    #[test]
    fn tenant_share_weighs_the_units_held() {
        // B (weight 3) holds one unit and is granted another while A (weight 1) waits, A
        // holding one: 1 / 3 < 1 / 1, B's turn. (Capacity 2 counts three: that is the
        // capacity rule's business; B's cap is 1, so B is uncapped here for this check.)
        let conf = |tenant: &str, weight, cap| TenantConf {
            name: "m".into(),
            tenant: tenant.into(),
            weight,
            cap,
        };
        let with = |ops: Vec<LeaseOp>| {
            let mut records = history(ops);
            if let Some(Record::Meta(meta)) = records.first_mut() {
                meta.capacity.insert("m".into(), 4);
                meta.tenants = vec![conf("A", 1, None), conf("B", 3, None)];
            }
            records
        };
        let a_held = grant("A", 0, 10, 1, 1000);
        let b_held = grant("B", 0, 12, 2, 1000);
        let a = waiter("A", 20, 25, 900, 9, 950);
        let ok = with(vec![
            a_held.clone(),
            b_held.clone(),
            grant("B", 100, 110, 3, 120),
            a.clone(),
        ]);
        assert_eq!(rules(&ok), Vec::<&str>::new());
        // A holding nothing: 1 / 3 > 0 / 1, A's turn was overtaken.
        let bad = with(vec![b_held, grant("B", 100, 110, 3, 120), a]);
        assert_eq!(rules(&bad), vec!["tenant_share"]);
    }

    #[test]
    fn tenant_fifo_orders_within_a_tenant_only() {
        let a = waiter("A", 0, 5, 500, 10, 600);
        // Another of A invoked after A's waiter queued, granted first: not FIFO within A.
        let bad = history(vec![a.clone(), grant("A", 100, 110, 9, 120)]);
        assert_eq!(rules(&bad), vec!["tenant_fifo"]);
        // One of B (below its cap, and nobody's turn overtaken: A holds nothing) may pass.
        let ok = history(vec![a, grant("B", 100, 110, 9, 120)]);
        assert_eq!(rules(&ok), Vec::<&str>::new());
    }
}
