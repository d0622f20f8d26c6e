//! The history: one JSON line per record. Times are microseconds since the soak started,
//! read from one monotonic clock shared by every client (they all run in this process).

use std::collections::BTreeMap;
use std::io::{BufRead, Write};

use serde::{Deserialize, Serialize};

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
// Most records are leases: boxing them would cost each an allocation and save no memory.
#[allow(clippy::large_enum_variant)]
pub enum Record {
    /// The run's settings (first line).
    Meta(Meta),
    /// A fault the nemesis injected: `start_us..end_us` is when it was in force (a kill has
    /// `end_us == start_us`).
    Fault(Fault),
    /// A lease semaphore operation; a grant carries its whole holding (release or drop).
    Lease(LeaseOp),
    /// A permit semaphore operation; an acquire carries its release.
    Permit(PermitOp),
    /// A countdown latch operation.
    Latch(LatchOp),
    /// What `status` showed after the nemesis stopped and every lease could have ended.
    Final(Final),
    /// A look at a lease semaphore's server state a while after a call to it was cancelled
    /// ([`LOOK_AFTER_MS`]).
    Look(Look),
}

/// The run's settings, as the checker needs them.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Meta {
    pub seed: u64,
    pub deployment: String,
    /// Capacity of each lease semaphore.
    pub capacity: BTreeMap<String, u32>,
    /// Permits each permit semaphore was set to at the start.
    pub permits: BTreeMap<String, u32>,
    /// The count each latch was set to.
    pub latch_count: u64,
    pub lease_ms: u64,
    pub waiter_lease_ms: u64,
    /// The engine the run asked for: `scripts`, `native` or `mixed` (absent from histories
    /// written before the soak had the choice, which ran the scripts).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<String>,
    /// Each client's engine by client number, `native` or `scripts`: the one asked, which
    /// the client reported serving at connect (the run stops otherwise).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_engines: Vec<String>,
    /// Each client's engine as it reported it at the end of the run (a native client falls
    /// back to the scripts for good when a call finds no module).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub client_engines_at_end: Vec<String>,
    /// What the server that took writes at the end counted since it last started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_calls: Option<ServerCalls>,
    /// The tenants the soak drives on its lease semaphores, with their weights and caps
    /// (none named: the default tenant, weight 1, no cap).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tenants: Vec<TenantConf>,
}

/// A tenant of a lease semaphore, as every request naming it configures it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct TenantConf {
    /// The lease semaphore.
    pub name: String,
    pub tenant: String,
    pub weight: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cap: Option<u32>,
}

/// Commands a server counted since it last started (a restart or a failover starts over).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct ServerCalls {
    /// `REDSEM.<OP>` commands (`INFO commandstats`; `REDSEM.ENGINE` left out).
    pub redsem_commands: u64,
    /// `FCALL` commands (`INFO commandstats`).
    pub fcall: u64,
    /// Of the module's calls, those served by a native path and those by the Lua function
    /// within the command (`REDSEM.ENGINE`); absent without the module.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub native_paths: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub module_lua: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Fault {
    pub kind: String,
    /// Which client's proxy, `server`, or a semaphore name.
    pub target: String,
    pub start_us: u64,
    pub end_us: u64,
}

/// `acquire`, `acquire_many`, `try`, `timeout`, `cancel` (dropped mid-wait), `status`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct LeaseOp {
    pub client: u32,
    pub task: u32,
    pub name: String,
    pub op: String,
    /// The tenant the request named (none: the default tenant).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    pub units: u32,
    pub inv_us: u64,
    pub ret_us: u64,
    /// `ok`, `busy`, `timeout`, `cancelled`, `stopped` or `error: ...`.
    pub outcome: String,
    /// When the client first learned it was queued (the first progress report).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queued_us: Option<u64>,
    /// The longest time between the invocation, each "queued" answer of a check-in and the
    /// reply: under half a waiter lease, the request cannot have lost its place (docs/SOAK.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_gap_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<u64>,
    /// A grant's permit id (what the server lists it under).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub slots: Vec<u32>,
    /// For a grant, how it ended: `release`, `drop`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
    /// When the release was sent (or the permit dropped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_ret_us: Option<u64>,
    /// `ok`, `not_held`, `cancelled` (the release future dropped before it answered, at
    /// `release_ret_us`: its outcome unknown) or `error: ...`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_outcome: Option<String>,
    /// The outcome of a `refresh()` made while held, if one was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refresh: Option<String>,
    /// When `lost()` fired, if it did while held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_us: Option<u64>,
    /// The end of the local validity the client believed (`expires_at`), the latest of the
    /// samples taken while it was still ahead (at the grant, after the hold, after a refresh):
    /// `ret_us` if it had ended before the grant was first seen.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_until_us: Option<u64>,
    /// `status`: units in use it showed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub in_use: Option<u64>,
    /// For a hold that runs to its lease end (`src/soak/edge.rs`): `expire` (no keep-alive),
    /// `forget` (`forget()`ed, believed until its validity ends) or `stall` (kept alive
    /// until a `lease_end` fault or the hold's end).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub edge: Option<String>,
    /// What the server stored for the grant while it was held, beside what the holder
    /// believed then (the `lease_end` rule).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub audits: Vec<Audit>,
}

/// One look at the server's side of a held grant, and the holder's local validity just
/// before it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Audit {
    /// `read`: the lease entry and `TIME` read on a connection of its own (no proxy);
    /// `refresh`: a `refresh()` the server answered "not held".
    pub via: String,
    /// The holder's local validity, read before `t0_us` while it was still ahead.
    pub believed_us: u64,
    /// Local instants before the request was sent and after its reply (rounded up).
    pub t0_us: u64,
    pub t1_us: u64,
    /// The server's `TIME` in microseconds (`read`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_us: Option<u64>,
    /// The lease end stored (ms of server time); absent or not positive: the server no longer
    /// counts the grant as held (no entry, or a tombstone).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end_ms: Option<i64>,
}

impl Audit {
    /// The latest local instant by which the server's lease has ended, as this look shows:
    /// its `TIME` T was read between `t0` and `t1`, so the server reaches a stored end E no
    /// later than `t1 + (E - T)`; a grant the server no longer holds ended before `t1`.
    pub fn server_end_by(&self) -> Option<u64> {
        match (self.end_ms, self.server_us) {
            (Some(end), Some(now)) if end > 0 => {
                let by = i128::from(self.t1_us) + i128::from(end) * 1000 - i128::from(now);
                Some(u64::try_from(by.max(0)).unwrap_or(u64::MAX))
            }
            (Some(end), None) if end > 0 => None,
            _ => Some(self.t1_us),
        }
    }
}

impl LeaseOp {
    /// Whether the operation was granted a permit.
    pub fn granted(&self) -> bool {
        self.outcome == "ok" && self.token.is_some()
    }

    /// The interval the holder believed it held the permit: from the grant's reply to the
    /// earliest of the release (or drop), `lost()` and the end of its local validity.
    pub fn believed(&self) -> Option<(u64, u64)> {
        if !self.granted() {
            return None;
        }
        let mut end = u64::MAX;
        for t in [self.end_us, self.lost_us, self.valid_until_us]
            .into_iter()
            .flatten()
        {
            end = end.min(t);
        }
        if end == u64::MAX {
            end = self.ret_us;
        }
        Some((self.ret_us, end.max(self.ret_us)))
    }
}

/// `acquire`, `try`, `timeout`, `cancel`, `drain`, `add`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct PermitOp {
    pub client: u32,
    pub task: u32,
    pub name: String,
    pub op: String,
    /// Permits asked for (`acquire`), taken (`drain`) or added (`add`, may be negative).
    pub n: i64,
    pub inv_us: u64,
    pub ret_us: u64,
    pub outcome: String,
    /// For permits taken: when their release was sent, its reply and its outcome.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_inv_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_ret_us: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub release_outcome: Option<String>,
}

/// `count_down`, `wait`, `count`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct LatchOp {
    pub client: u32,
    pub task: u32,
    pub name: String,
    pub op: String,
    pub inv_us: u64,
    pub ret_us: u64,
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
}

/// A look at what the server lists for a lease semaphore ([`LOOK_AFTER_MS`] after a call to it
/// was cancelled), on a connection of its own that no proxy stands in.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Look {
    pub client: u32,
    pub task: u32,
    pub name: String,
    /// What was cancelled: `release` (a permit's release) or `acquire` (an acquire).
    pub after: String,
    /// `release`: the permit's id.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// When the cancelled call was invoked, and when it was given up.
    pub inv_us: u64,
    pub cancel_us: u64,
    /// Where it was cancelled: `poll N` (after its first poll and N turns of the runtime) or
    /// `after N us`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub point: String,
    /// `acquire`: the ids the server listed (held or queued) just before the call.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub before: Vec<String>,
    /// Local instants before the look was sent and after its reply (rounded up).
    pub t0_us: u64,
    pub t1_us: u64,
    /// Ids with a lease on the server (holders and waiters: a positive score in `leases`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub leased: Vec<String>,
    /// Ids in the queue (waiters).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queued: Vec<String>,
}

/// How long after a cancelled call its look is taken: a third of the soak's lease and a
/// little more. A release or withdrawal carried on in the background has long been applied
/// by then (without a fault); a unit stranded by it, last renewed at most a third of a lease
/// before the cancel, is still held until two thirds of a lease after it.
pub const LOOK_AFTER_MS: u64 = 400;

/// What a primitive showed at the end.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct Final {
    pub kind: String,
    pub name: String,
    /// Lease: units in use; permits: available permits.
    pub value: i64,
    pub waiters: u64,
    pub at_us: u64,
}

/// How many operations (calls into the library) a record stands for.
pub fn operations(record: &Record) -> u64 {
    match record {
        Record::Lease(op) => 1 + u64::from(op.end.is_some()) + u64::from(op.refresh.is_some()),
        Record::Permit(op) => 1 + u64::from(op.release_inv_us.is_some()),
        Record::Latch(_) => 1,
        _ => 0,
    }
}

pub fn write(out: &mut impl Write, records: &[Record]) -> std::io::Result<()> {
    for record in records {
        serde_json::to_writer(&mut *out, record)?;
        out.write_all(b"\n")?;
    }
    Ok(())
}

pub fn read(input: impl BufRead) -> Result<Vec<Record>, String> {
    let mut records = Vec::new();
    for (n, line) in input.lines().enumerate() {
        let line = line.map_err(|e| format!("line {}: {e}", n + 1))?;
        if line.trim().is_empty() {
            continue;
        }
        records.push(serde_json::from_str(&line).map_err(|e| format!("line {}: {e}", n + 1))?);
    }
    Ok(records)
}
