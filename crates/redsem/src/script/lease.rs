//! The lease semaphore's operations (`lua/lease/`): their typed call wrappers and reply
//! types.

use std::time::Duration;

use redis::Value;

use super::acks::{Acked, Scripting};
use super::library::{
    Call, LEASE_ACQUIRE, LEASE_BATCH, LEASE_POLL, LEASE_REFRESH, LEASE_RELEASE, LEASE_SET_CAPACITY,
    LEASE_STATUS, LEASE_TIDY,
};
use super::reply::{Reply, confirmed, millis};
use crate::error::{Error, Result};
use crate::keys::LeaseKeys;
use crate::session::{Caller, Hex, Session};
use crate::types::Tenant;

/// What `lease_acquire` and `lease_poll` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Acquire {
    Granted {
        token: u64,
        slots: Vec<u32>,
    },
    Queued {
        position: u64,
        recheck: Duration,
    },
    Busy {
        in_use: u64,
        waiters: u64,
    },
    Gone,
    Conflict {
        current: u32,
    },
    /// The tenant's weight and cap in force differ from the request's.
    Tenant {
        tenant: String,
        weight: u32,
        cap: Option<u32>,
    },
    Label(String),
    TooBig {
        capacity: u32,
    },
    TooMany {
        most: u32,
    },
}

/// What `lease_release` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Release {
    Released,
    Dequeued,
    NotHeld,
}

/// What `lease_release` answers in full.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Released {
    pub(crate) outcome: Release,
    /// The semaphore is idle and its keys carry no TTL yet: send `lease_tidy` soon.
    pub(crate) idle: bool,
    /// Grants made to waiters on the caller's channel (wake-up messages, not published).
    pub(crate) handed: Vec<String>,
}

/// A holder as `lease_status` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawHolder {
    pub(crate) id: String,
    pub(crate) label: String,
    pub(crate) token: u64,
    pub(crate) left_ms: i64,
    pub(crate) held_ms: i64,
    pub(crate) slots: Vec<u32>,
    /// Its tenant ("" the default one).
    pub(crate) tenant: String,
}

/// A waiter as `lease_status` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawWaiter {
    pub(crate) id: String,
    pub(crate) label: String,
    pub(crate) units: u32,
    pub(crate) waited_ms: i64,
    /// Its tenant ("" the default one).
    pub(crate) tenant: String,
}

/// A tenant as `lease_status` lists it (only while a named tenant holds or waits).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawTenant {
    pub(crate) name: String,
    pub(crate) held: u64,
    pub(crate) waiters: u64,
    pub(crate) weight: u32,
    pub(crate) cap: Option<u32>,
}

/// What `lease_status` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawStatus {
    pub(crate) capacity: Option<u32>,
    pub(crate) in_use: u64,
    pub(crate) holders: Vec<RawHolder>,
    pub(crate) waiters: Vec<RawWaiter>,
    pub(crate) tenants: Vec<RawTenant>,
}

/// The arguments of one new request.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Request<'a> {
    pub(crate) id: &'a str,
    pub(crate) capacity: u32,
    pub(crate) units: u32,
    pub(crate) lease: Duration,
    pub(crate) label: &'a str,
    pub(crate) one_per_label: bool,
    pub(crate) wait: bool,
    pub(crate) waiter_lease: Duration,
    pub(crate) channel: &'a str,
    /// This call: the caller's session and the call's number in it.
    pub(crate) call: Caller<'a>,
    /// Its tenant (none: the default tenant).
    pub(crate) tenant: Option<&'a Tenant>,
}

impl Request<'_> {
    /// The tenant's name, weight and cap as the scripts take them ("" for none), added to
    /// `call`.
    fn tenant_args(&self, call: Call) -> Call {
        tenant_args(self.tenant, call)
    }
}

/// A tenant's name, weight and cap as the scripts take them ("" for none), added to `call`.
fn tenant_args(tenant: Option<&Tenant>, call: Call) -> Call {
    match tenant {
        None => call.arg("").arg("").arg(""),
        Some(t) => {
            let call = call.arg(t.name()).arg(t.weight_of());
            match t.cap_of() {
                Some(cap) => call.arg(cap),
                None => call.arg(""),
            }
        }
    }
}

/// Who releases an id, as `lease_release` takes it.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ReleaseBy<'a> {
    /// A release of a permit by this numbered call: its resend answers as it did, while a
    /// release of an id that another call released answers [`Release::NotHeld`].
    Holder(Caller<'a>),
    /// A withdrawal of a request (a cancelled acquire), with the number of its call that went
    /// unanswered (its enqueue or a check-in), if one did: a late copy of it is then refused.
    Withdrawal {
        session: &'a Session,
        pending: Option<u64>,
    },
}

impl<'a> ReleaseBy<'a> {
    /// The session, the kind ("r" or "w") and the sequence number as the scripts take them.
    fn parts(self) -> (&'a Session, &'static str, u64) {
        match self {
            ReleaseBy::Holder(call) => (call.session, "r", call.seq),
            ReleaseBy::Withdrawal { session, pending } => (session, "w", pending.unwrap_or(0)),
        }
    }
}

pub(crate) async fn lease_acquire(
    conn: &mut impl Scripting,
    keys: &LeaseKeys,
    req: &Request<'_>,
) -> Result<Acquire> {
    let call = LEASE_ACQUIRE
        .key(&keys.all[..])
        .arg(req.id)
        .arg(req.capacity)
        .arg(req.units)
        .arg(millis(req.lease))
        .arg(req.label)
        .arg(if req.one_per_label { "1" } else { "0" })
        .arg(if req.wait { "wait" } else { "try" })
        .arg(millis(req.waiter_lease))
        .arg(req.channel)
        .arg(Hex(req.call.seq))
        .arg(req.call.session.id())
        .arg(Hex(req.call.session.low()));
    let acked = req.tenant_args(call).invoke_acked(conn).await?;
    lease_granted("lease_acquire", acked)
}

pub(crate) async fn lease_poll(
    conn: &mut impl Scripting,
    keys: &LeaseKeys,
    id: &str,
    lease: Duration,
    waiter_lease: Duration,
) -> Result<Acquire> {
    let acked = LEASE_POLL
        .key(&keys.all[..])
        .arg(id)
        .arg(millis(lease))
        .arg(millis(waiter_lease))
        .invoke_acked(conn)
        .await?;
    lease_granted("lease_poll", acked)
}

/// Decode what `lease_acquire` or `lease_poll` answered with the acknowledgements of its
/// `WAIT`: a grant they did not confirm fails the call with
/// [`Error::NotReplicated`](crate::Error::NotReplicated); the waiting engine, which holds the
/// request, gives it back ([`crate::wait`]). (Only a grant: a queued request that a failover
/// loses learns it at its next check-in.)
fn lease_granted(script: &'static str, acked: Acked) -> Result<Acquire> {
    let outcome = decode_acquire(script, acked.reply)?;
    match (outcome, acked.unconfirmed) {
        (Acquire::Granted { .. }, Some(why)) => Err(why),
        (outcome, _) => Ok(outcome),
    }
}

/// True if the lease was extended, false if the permit is not held.
pub(crate) async fn lease_refresh(
    conn: &mut impl Scripting,
    keys: &LeaseKeys,
    id: &str,
    lease: Duration,
) -> Result<bool> {
    let acked = LEASE_REFRESH
        .key(&keys.all[..])
        .arg(id)
        .arg(millis(lease))
        .invoke_acked(conn)
        .await?;
    let r = Reply::new("lease_refresh", acked.reply)?;
    match r.status.as_str() {
        "OK" => confirmed(true, acked.unconfirmed),
        "NOTHELD" => Ok(false),
        _ => Err(r.unexpected()),
    }
}

/// Release (or withdraw) `id`; `channel` is the caller's wake channel, whose grants come back
/// in the reply. `by` says who: a holder's release resent answers as it did, any other
/// release of `id` afterwards answers [`Release::NotHeld`].
pub(crate) async fn lease_release(
    conn: &mut impl Scripting,
    keys: &LeaseKeys,
    id: &str,
    channel: &str,
    by: ReleaseBy<'_>,
) -> Result<Released> {
    let (session, kind, seq) = by.parts();
    let acked = LEASE_RELEASE
        .key(&keys.all[..])
        .arg(id)
        .arg(channel)
        .arg(Hex(seq))
        .arg(session.id())
        .arg(Hex(session.low()))
        .arg(kind)
        .invoke_acked(conn)
        .await?;
    let released = decode_release(acked.reply)?;
    let Some(why) = acked.unconfirmed else {
        return Ok(released);
    };
    if released.outcome == Release::NotHeld {
        return Ok(released);
    }
    // Applied, but the call fails: what the caller would have done with the reply is done
    // here. Our waiters' grants go by pub/sub (back to our own subscription), and an idle
    // semaphore gets its TTL now.
    if !released.handed.is_empty() {
        let mut pipe = redis::pipe();
        // (By the rule of the scripts: keys::is_sharded.)
        let publish = match crate::keys::is_sharded(channel) {
            true => "SPUBLISH",
            false => "PUBLISH",
        };
        for grant in &released.handed {
            pipe.cmd(publish).arg(channel).arg(grant).ignore();
        }
        if let Err(err) = pipe.query_async::<()>(conn).await {
            tracing::debug!(error = %err, "could not publish the grants of an unacknowledged release; the waiters will check in");
        }
    }
    if released.idle
        && let Err(err) = lease_tidy(conn, keys).await
    {
        tracing::debug!(error = %crate::error::Chain(&err), "could not give an idle semaphore its TTL");
    }
    Err(why)
}

/// One operation of a group commit (`lease_batch`).
#[derive(Debug, Clone)]
pub(crate) enum BatchOp {
    /// A new request, as `lease_acquire` takes it (the channel is the batch's).
    Acquire {
        id: String,
        capacity: u32,
        units: u32,
        lease: Duration,
        label: String,
        one_per_label: bool,
        wait: bool,
        waiter_lease: Duration,
        seq: u64,
        tenant: Option<Tenant>,
    },
    /// A release (`kind` "r") or a withdrawal ("w") of `id` by the call numbered `seq` (the
    /// session is the batch's: the same client's).
    Release {
        kind: &'static str,
        id: String,
        seq: u64,
    },
}

impl BatchOp {
    /// A new request, as `lease_acquire` takes it (the channel is the batch's).
    pub(crate) fn acquire(req: &Request<'_>) -> BatchOp {
        BatchOp::Acquire {
            id: req.id.to_owned(),
            capacity: req.capacity,
            units: req.units,
            lease: req.lease,
            label: req.label.to_owned(),
            one_per_label: req.one_per_label,
            wait: req.wait,
            waiter_lease: req.waiter_lease,
            seq: req.call.seq,
            tenant: req.tenant.cloned(),
        }
    }

    /// A release of `id` (the session is the batch's: the same client's).
    pub(crate) fn release(id: &str, by: ReleaseBy<'_>) -> BatchOp {
        let (_, kind, seq) = by.parts();
        BatchOp::Release {
            kind,
            id: id.to_owned(),
            seq,
        }
    }

    /// Whether its change waits for the replica acknowledgements the client asks for (a
    /// withdrawal does not: see `Redsem::conn_unacked`).
    pub(crate) fn acked(&self) -> bool {
        match self {
            BatchOp::Acquire { .. } => true,
            BatchOp::Release { kind, .. } => *kind == "r",
        }
    }

    /// Its arguments as `lease_batch` takes them, added to `call`: "a" and those of
    /// `lease_acquire` but the channel, the session and its low mark; or "r"/"w", the id and
    /// the number.
    fn batched(&self, call: Call) -> Call {
        match self {
            BatchOp::Acquire { seq, tenant, .. } => {
                let call = self.acquire_head(call.arg("a")).arg(Hex(*seq));
                tenant_args(tenant.as_ref(), call)
            }
            BatchOp::Release { kind, id, seq } => call.arg(*kind).arg(id).arg(Hex(*seq)),
        }
    }

    /// An acquire's arguments from its id to its waiter lease, added to `call`.
    fn acquire_head(&self, call: Call) -> Call {
        match self {
            BatchOp::Acquire {
                id,
                capacity,
                units,
                lease,
                label,
                one_per_label,
                wait,
                waiter_lease,
                ..
            } => call
                .arg(id)
                .arg(*capacity)
                .arg(*units)
                .arg(millis(*lease))
                .arg(label)
                .arg(if *one_per_label { "1" } else { "0" })
                .arg(if *wait { "wait" } else { "try" })
                .arg(millis(*waiter_lease)),
            BatchOp::Release { .. } => call,
        }
    }
}

/// What `lease_batch` answers: each operation's reply in order, and for the whole batch
/// whether the semaphore is left idle and the grants made to waiters on the caller's channel.
#[derive(Debug)]
pub(crate) struct BatchReply {
    pub(crate) replies: Vec<Value>,
    pub(crate) idle: bool,
    pub(crate) handed: Vec<String>,
    /// Why the batch's changes are not confirmed by the replicas asked for (see [`Acked`]).
    pub(crate) unconfirmed: Option<crate::error::Error>,
}

/// Apply `ops` in order in one call (`lease_batch`); `channel` is the caller's wake channel,
/// `session` its session (every operation's number is in it).
pub(crate) async fn lease_batch(
    conn: &mut impl Scripting,
    keys: &LeaseKeys,
    channel: &str,
    session: &Session,
    ops: &[BatchOp],
) -> Result<BatchReply> {
    if let [op] = ops {
        return lease_single(conn, keys, channel, session, op).await;
    }
    let mut call = LEASE_BATCH
        .key(&keys.all[..])
        .arg(channel)
        .arg(session.id())
        .arg(Hex(session.low()));
    for op in ops {
        call = op.batched(call);
    }
    let acked = call.invoke_acked(conn).await?;
    let (replies, mut r) = Reply::batch("lease_batch", acked.reply, ops.len())?;
    let (idle, handed) = idle_and_handed(&mut r)?;
    Ok(BatchReply {
        replies,
        idle,
        handed,
        unconfirmed: acked.unconfirmed,
    })
}

/// The end of a release's (or a batch's) reply: the idle flag and the grants handed back
/// (every value after it).
fn idle_and_handed(r: &mut Reply) -> Result<(bool, Vec<String>)> {
    let idle = r.int()? == 1;
    let mut handed = Vec::new();
    for item in r.rest() {
        match item {
            Value::BulkString(bytes) => handed.push(String::from_utf8_lossy(&bytes).into_owned()),
            other => return Err(r.bad("a grant message", &other)),
        }
    }
    Ok((idle, handed))
}

/// A release's outcome, the status of its reply.
fn release_outcome(r: &Reply) -> Result<Release> {
    match r.status.as_str() {
        "RELEASED" => Ok(Release::Released),
        "DEQUEUED" => Ok(Release::Dequeued),
        "NOTHELD" => Ok(Release::NotHeld),
        _ => Err(r.unexpected()),
    }
}

/// A batch of one operation, sent as `lease_acquire` or `lease_release` (a call of
/// `lease_batch` costs a little more than either: its operations are parsed in Lua) and
/// answered as `lease_batch` would.
async fn lease_single(
    conn: &mut impl Scripting,
    keys: &LeaseKeys,
    channel: &str,
    session: &Session,
    op: &BatchOp,
) -> Result<BatchReply> {
    let call = match op {
        BatchOp::Acquire { seq, tenant, .. } => {
            let call = op
                .acquire_head(LEASE_ACQUIRE.key(&keys.all[..]))
                .arg(channel)
                .arg(Hex(*seq))
                .arg(session.id())
                .arg(Hex(session.low()));
            tenant_args(tenant.as_ref(), call)
        }
        // lease_release takes id, channel, number, session, low mark, kind.
        BatchOp::Release { kind, id, seq } => LEASE_RELEASE
            .key(&keys.all[..])
            .arg(id)
            .arg(channel)
            .arg(Hex(*seq))
            .arg(session.id())
            .arg(Hex(session.low()))
            .arg(*kind),
    };
    let acked = call.invoke_acked(conn).await?;
    if let BatchOp::Acquire { .. } = op {
        return Ok(BatchReply {
            replies: vec![acked.reply],
            idle: false,
            handed: Vec::new(),
            unconfirmed: acked.unconfirmed,
        });
    }
    let mut r = Reply::new("lease_release", acked.reply)?;
    let status = Value::Array(vec![Value::SimpleString(r.status.clone())]);
    let (idle, handed) = idle_and_handed(&mut r)?;
    Ok(BatchReply {
        replies: vec![status],
        idle,
        handed,
        unconfirmed: acked.unconfirmed,
    })
}

/// An acquire's reply in a batch, with the batch's acknowledgements: as [`lease_acquire`]
/// answers it.
pub(crate) fn batch_acquire(reply: Value, unconfirmed: Option<Error>) -> Result<Acquire> {
    lease_granted("lease_acquire", Acked { reply, unconfirmed })
}

/// A release's reply in a batch, with the batch's acknowledgements: as [`lease_release`]
/// answers it (an applied release the replicas did not confirm fails, applied).
pub(crate) fn batch_release(reply: Value, unconfirmed: Option<Error>) -> Result<Release> {
    let outcome = release_outcome(&Reply::new("lease_release", reply)?)?;
    match unconfirmed {
        Some(why) if outcome != Release::NotHeld => Err(why),
        _ => Ok(outcome),
    }
}

fn decode_release(reply: Value) -> Result<Released> {
    let mut r = Reply::new("lease_release", reply)?;
    let outcome = release_outcome(&r)?;
    let (idle, handed) = idle_and_handed(&mut r)?;
    Ok(Released {
        outcome,
        idle,
        handed,
    })
}

/// Give an idle semaphore's keys their TTL (nothing if it is live again).
pub(crate) async fn lease_tidy(conn: &mut impl Scripting, keys: &LeaseKeys) -> Result<()> {
    let reply: Value = LEASE_TIDY.key(&keys.all[..]).invoke_async(conn).await?;
    let r = Reply::new("lease_tidy", reply)?;
    match r.status.as_str() {
        "OK" => Ok(()),
        _ => Err(r.unexpected()),
    }
}

pub(crate) async fn lease_status(conn: &mut impl Scripting, keys: &LeaseKeys) -> Result<RawStatus> {
    let reply: Value = LEASE_STATUS.key(&keys.all[..]).invoke_async(conn).await?;
    let mut r = Reply::new("lease_status", reply)?;
    if r.status != "STATUS" {
        return Err(r.unexpected());
    }
    let capacity = u32::try_from(r.int()?).ok();
    let in_use = r.uint()?;
    let mut holders = Vec::new();
    for item in r.array()? {
        let mut h = Reply::nested("lease_status", item)?;
        holders.push(RawHolder {
            id: h.string()?,
            label: h.string()?,
            token: h.uint()?,
            left_ms: h.int()?,
            held_ms: h.int()?,
            slots: h.slots()?,
            tenant: h.string()?,
        });
    }
    let mut waiters = Vec::new();
    for item in r.array()? {
        let mut w = Reply::nested("lease_status", item)?;
        waiters.push(RawWaiter {
            id: w.string()?,
            label: w.string()?,
            units: w.u32()?,
            waited_ms: w.int()?,
            tenant: w.string()?,
        });
    }
    let mut tenants = Vec::new();
    for item in r.array()? {
        let mut t = Reply::nested("lease_status", item)?;
        tenants.push(RawTenant {
            name: t.string()?,
            held: t.uint()?,
            waiters: t.uint()?,
            weight: t.u32()?,
            cap: u32::try_from(t.int()?).ok(),
        });
    }
    Ok(RawStatus {
        capacity,
        in_use,
        holders,
        waiters,
        tenants,
    })
}

/// Returns the capacity in force before the change, if one was stored.
pub(crate) async fn lease_set_capacity(
    conn: &mut impl Scripting,
    keys: &LeaseKeys,
    capacity: u32,
) -> Result<Option<u32>> {
    let acked = LEASE_SET_CAPACITY
        .key(&keys.all[..])
        .arg(capacity)
        .invoke_acked(conn)
        .await?;
    let mut r = Reply::new("lease_set_capacity", acked.reply)?;
    match r.status.as_str() {
        "OK" => confirmed(u32::try_from(r.int()?).ok(), acked.unconfirmed),
        _ => Err(r.unexpected()),
    }
}

fn decode_acquire(script: &'static str, reply: Value) -> Result<Acquire> {
    let mut r = Reply::new(script, reply)?;
    let status = r.status.clone();
    Ok(match status.as_str() {
        "GRANTED" => Acquire::Granted {
            token: r.uint()?,
            slots: r.rest_slots()?,
        },
        "QUEUED" => Acquire::Queued {
            position: r.uint()?,
            recheck: Duration::from_millis(r.uint()?),
        },
        "BUSY" => Acquire::Busy {
            in_use: r.uint()?,
            waiters: r.uint()?,
        },
        "GONE" => Acquire::Gone,
        "CONFLICT" => Acquire::Conflict { current: r.u32()? },
        "TENANT" => Acquire::Tenant {
            tenant: r.string()?,
            weight: r.u32()?,
            cap: u32::try_from(r.int()?).ok(),
        },
        "LABEL" => Acquire::Label(r.string()?),
        "TOOBIG" => Acquire::TooBig { capacity: r.u32()? },
        "TOOMANY" => Acquire::TooMany { most: r.u32()? },
        _ => return Err(r.unexpected()),
    })
}

#[cfg(test)]
mod tests;
