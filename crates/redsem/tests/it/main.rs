//! Integration tests of the redsem library against throwaway `redis-server` processes
//! (one per test, from `redsem-test`). One binary, one module per topic.
//!
//! The tests that do not depend on the topology are written once and run twice
//! (`support::both_topologies!`): as `<name>::single` on a server of their own and as
//! `<name>::cluster` on a 3-master cluster that the binary starts once and shares, each test
//! under a prefix of its own.

/// Shared helpers: `TestContext`, `both_topologies!`, `within`.
mod support;

/// Lease semaphore: grants, tokens, slots, renewals, release, status, bad input.
mod lease;

/// The lease semaphore on a 3-master cluster.
mod cluster;

/// Wake-ups on a cluster: sharded pub/sub in each primitive's slot, following the slot.
mod cluster_wakeups;

/// Wake-ups on a cluster without sharded pub/sub (Redis 6.2): classic channels.
mod cluster_classic;

/// Waiting: FIFO order, targeted wake-ups, dead waiters, cancellation, the mutex.
mod waiting;

/// Permit semaphore: counts, FIFO waiting, wake-ups, cancellation, retried releases, round trips.
mod permits;

/// Countdown latch: every waiter wakes, timeouts, lost messages, state, retried count-downs.
mod latch;

/// Faults of the lease semaphore: data loss (restart, flush, failover), resent commands,
/// eviction, huge inputs, stale wake-ups, ACL limits.
mod lease_faults;

/// Faults of the permit semaphore and the latch: data loss, resent commands, eviction.
mod counter_faults;

/// Connect-time checks (eviction policy, ACL rights, prefix) and the pub/sub reconnect backoff.
mod connect_checks;

/// Waiting through faults: a queued grant's lease, dropped connections.
mod wait_faults;

/// The keepalive: one driver per client renews hundreds of permits, a cut-off client loses its
/// permits before their server leases end, settling some permits leaves the others renewed.
mod keepalive;

/// The scripts as a Redis Functions library, and the EVALSHA fallback.
mod functions;

/// The engine chosen at connect without redsem's module: the scripts, or no connection.
mod engine;

/// Observing it: metrics by outcome (recorded by a debugging recorder), spans along a permit's
/// life, `Serialize` of the status, `ensure_permits`, and the blocking facade.
mod observe;

/// A release's local hand-off through a lost reply, and the idle TTL after flush.
mod release_faults;

/// Replica acknowledgements: WAIT with every change, grants given back when not acknowledged.
mod acks;

/// Group commit (one client's operations on a semaphore share a call) and the layout
/// version.
mod group_commit;

/// Through Sentinels: the URL form, connect_sentinel, and load across a forced failover.
mod sentinel;

/// Calls that give something back (releases, count-downs, withdrawals) cancelled at every
/// point of their life: what they give back is given back all the same.
mod cancellation;

/// Every key a script touches arrives in its KEYS, and no script is called without keys
/// (MONITOR and COMMAND GETKEYS over a workload of every operation).
mod script_keys;

/// Fair shares between tenants: a handle per tenant, the status per tenant, conflicts.
mod tenants;

/// Managed services emulated by ACL users refused what each service refuses
/// (`redsem_test::profiles`): every primitive works, or the connect names the refused command.
mod profiles;
