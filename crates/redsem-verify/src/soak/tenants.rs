//! Tenants (fair shares, docs/DESIGN.md "Tenants (fair shares)"): which tenant each task's
//! requests on the lease semaphore `t` name, and the flooding tenant's tasks.
//!
//! On `t` (capacity 4) client 0's tasks are tenant `A` (weight 1, no cap), client 1's tenant
//! `B` (weight 3, cap 2), the other clients' the default tenant (no tenant named), and the last
//! client runs `FLOOD_TASKS` more tasks of tenant `F` (weight 1, no cap) that do nothing but
//! lease rounds on `t`: a tenant that keeps many requests queued. The other semaphores name no
//! tenant (their queue is the plain FIFO). Edge holds and probes on `t` are the default
//! tenant's.

use std::collections::BTreeMap;

use redsem::{LeaseOptions, LeaseSemaphore, Redsem, Tenant};

use super::history::TenantConf;

/// The lease semaphore the tenants share, and its capacity.
pub const SEMAPHORE: &str = "t";
pub const CAPACITY: u32 = 4;

/// Tasks of the flooding tenant `F`, on the last client.
const FLOOD_TASKS: u32 = 6;

/// The named tenants: name, weight, cap.
const TENANTS: [(&str, u32, Option<u32>); 3] = [("A", 1, None), ("B", 3, Some(2)), ("F", 1, None)];

fn tenant(name: &str) -> Option<Tenant> {
    let &(name, weight, cap) = TENANTS.iter().find(|(n, _, _)| *n == name)?;
    let tenant = Tenant::new(name).weight(weight);
    Some(match cap {
        Some(cap) => tenant.cap(cap),
        None => tenant,
    })
}

/// For the history's `meta`.
pub fn configured() -> Vec<TenantConf> {
    TENANTS
        .iter()
        .map(|&(tenant, weight, cap)| TenantConf {
            name: SEMAPHORE.to_owned(),
            tenant: tenant.to_owned(),
            weight,
            cap,
        })
        .collect()
}

/// How many flooding tasks client `client` of `clients` runs beside its usual ones.
pub fn flood_tasks(client: u32, clients: u32) -> u32 {
    if client + 1 == clients.max(1) {
        FLOOD_TASKS
    } else {
        0
    }
}

/// A task's lease semaphores: every one of `capacity`, `t` for the task's tenant; a flooding
/// task (`flood`) has only `t`, for tenant `F`.
pub fn leases(
    redsem: &Redsem,
    capacity: &BTreeMap<String, u32>,
    options: &LeaseOptions,
    client: u32,
    flood: bool,
) -> Vec<LeaseSemaphore> {
    let named = match (flood, client) {
        (true, _) => tenant("F"),
        (false, 0) => tenant("A"),
        (false, 1) => tenant("B"),
        _ => None,
    };
    capacity
        .iter()
        .filter(|(name, _)| !flood || name.as_str() == SEMAPHORE)
        .map(|(name, &cap)| {
            let options = match &named {
                Some(t) if name.as_str() == SEMAPHORE => options.clone().tenant(t.clone()),
                _ => options.clone(),
            };
            redsem
                .lease_semaphore_with(name, cap, options)
                .unwrap_or_else(|e| panic!("{e}"))
        })
        .collect()
}
