//! The permit semaphore's operations (`lua/permit/`): their typed call wrappers and
//! reply types.

use std::time::Duration;

use redis::Value;

use super::acks::{Acked, Scripting};
use super::library::{
    PERMIT_ACQUIRE, PERMIT_ADD, PERMIT_AVAILABLE, PERMIT_BATCH, PERMIT_DELETE, PERMIT_DRAIN,
    PERMIT_POLL, PERMIT_TRY_SET, PERMIT_WITHDRAW,
};
use super::reply::{Reply, confirmed, decode_deleted, decode_set, millis};
use crate::error::{Error, Result};
use crate::keys::PermitKeys;
use crate::session::{Caller, Hex, Session};

/// What `permit_acquire` and `permit_poll` answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PermitAcquire {
    Granted,
    Queued { position: u64, recheck: Duration },
    Busy { available: i64, waiters: u64 },
    Gone,
}

/// What `permit_withdraw` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Withdrawal {
    /// It was waiting; nothing was taken.
    Withdrawn,
    /// It had been granted this many permits; they were given back.
    Returned(u64),
    /// No such request, or already withdrawn.
    Unknown,
}

/// What `permit_add` answers; each carries the permits available afterwards.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Addition {
    Applied(i64),
    /// The request id was applied before; nothing changed.
    Repeated(i64),
    /// The count would have left ±(2^53 - 1); nothing changed.
    OutOfRange(i64),
}

/// What `permit_available` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Availability {
    pub(crate) available: i64,
    pub(crate) waiters: u64,
    pub(crate) set: bool,
}

// (The script's five arguments, its connection, keys and call: a struct would be built only
// to be taken apart again.)
#[allow(clippy::too_many_arguments)]
pub(crate) async fn permit_acquire(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    id: &str,
    permits: u32,
    wait: bool,
    waiter_lease: Duration,
    channel: &str,
    call: Caller<'_>,
) -> Result<PermitAcquire> {
    let acked = PERMIT_ACQUIRE
        .key(&keys.all[..])
        .arg(id)
        .arg(permits)
        .arg(if wait { "wait" } else { "try" })
        .arg(millis(waiter_lease))
        .arg(channel)
        .arg(Hex(call.seq))
        .arg(call.session.id())
        .arg(Hex(call.session.low()))
        .invoke_acked(conn)
        .await?;
    permits_granted("permit_acquire", acked)
}

pub(crate) async fn permit_poll(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    id: &str,
    waiter_lease: Duration,
    call: Caller<'_>,
) -> Result<PermitAcquire> {
    let acked = PERMIT_POLL
        .key(&keys.all[..])
        .arg(id)
        .arg(millis(waiter_lease))
        .arg(Hex(call.seq))
        .arg(call.session.id())
        .arg(Hex(call.session.low()))
        .invoke_acked(conn)
        .await?;
    permits_granted("permit_poll", acked)
}

/// Decode what `permit_acquire` or `permit_poll` answered with the acknowledgements of its
/// `WAIT`: permits granted without them fail the call with
/// [`Error::NotReplicated`](crate::Error::NotReplicated); the waiting engine, which holds the
/// request, gives them back ([`crate::wait`]).
pub(crate) fn permits_granted(script: &'static str, acked: Acked) -> Result<PermitAcquire> {
    let outcome = decode_acquire(script, acked.reply)?;
    match (outcome, acked.unconfirmed) {
        (PermitAcquire::Granted, Some(why)) => Err(why),
        (outcome, _) => Ok(outcome),
    }
}

/// Withdraw request `id`; `pending` is the number of its call that went unanswered (its
/// enqueue or a check-in), if one did: what that call took is given back too.
pub(crate) async fn permit_withdraw(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    id: &str,
    session: &Session,
    pending: Option<u64>,
) -> Result<Withdrawal> {
    let acked = PERMIT_WITHDRAW
        .key(&keys.all[..])
        .arg(id)
        .arg(Hex(pending.unwrap_or(0)))
        .arg(session.id())
        .arg(Hex(session.low()))
        .invoke_acked(conn)
        .await?;
    withdrawn(acked)
}

/// A withdrawal's answer: a change that gave permits back or left the queue must be
/// confirmed; an unknown id changed nothing.
pub(crate) fn withdrawn(acked: Acked) -> Result<Withdrawal> {
    match decode_withdrawal(acked.reply)? {
        Withdrawal::Unknown => Ok(Withdrawal::Unknown),
        changed => confirmed(changed, acked.unconfirmed),
    }
}

fn decode_withdrawal(reply: Value) -> Result<Withdrawal> {
    let mut r = Reply::new("permit_withdraw", reply)?;
    let status = r.status.clone();
    Ok(match status.as_str() {
        "WITHDRAWN" => Withdrawal::Withdrawn,
        "RETURNED" => Withdrawal::Returned(r.uint()?),
        "UNKNOWN" => Withdrawal::Unknown,
        _ => return Err(r.unexpected()),
    })
}

pub(crate) async fn permit_add(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    request: &str,
    delta: i64,
    call: Caller<'_>,
) -> Result<Addition> {
    let acked = PERMIT_ADD
        .key(&keys.all[..])
        .arg(request)
        .arg(delta)
        .arg(Hex(call.seq))
        .arg(call.session.id())
        .arg(Hex(call.session.low()))
        .invoke_acked(conn)
        .await?;
    added(acked)
}

/// An addition's answer (applied, or applied before, must be confirmed).
pub(crate) fn added(acked: Acked) -> Result<Addition> {
    let mut r = Reply::new("permit_add", acked.reply)?;
    let status = r.status.clone();
    match status.as_str() {
        "ADDED" => confirmed(Addition::Applied(r.int()?), acked.unconfirmed),
        "REPEATED" => confirmed(Addition::Repeated(r.int()?), acked.unconfirmed),
        "RANGE" => Ok(Addition::OutOfRange(r.int()?)),
        _ => Err(r.unexpected()),
    }
}

/// One operation of a permit semaphore's group commit (`permit_batch`), its arguments
/// encoded.
#[derive(Debug, Clone)]
pub(crate) struct PermitOp {
    args: Vec<Vec<u8>>,
    /// Whether its change waits for the replica acknowledgements the client asks for (a
    /// withdrawal does not: see `Redsem::conn_unacked`).
    pub(crate) acked: bool,
}

impl PermitOp {
    /// A new request `id` for `permits`, as `permit_acquire` takes it (the channel is the
    /// batch's).
    /// The call is numbered `seq` in the batch's session (the client's).
    pub(crate) fn acquire(
        id: &str,
        permits: u32,
        wait: bool,
        waiter_lease: Duration,
        seq: u64,
    ) -> Self {
        let mode: &[u8] = if wait { b"wait" } else { b"try" };
        PermitOp {
            args: vec![
                b"a".to_vec(),
                id.as_bytes().to_vec(),
                permits.to_string().into_bytes(),
                mode.to_vec(),
                millis(waiter_lease).to_string().into_bytes(),
                Hex(seq).to_string().into_bytes(),
            ],
            acked: true,
        }
    }

    /// An addition of `delta` permits (a release), the call numbered `seq`.
    pub(crate) fn add(id: &str, delta: i64, seq: u64) -> Self {
        PermitOp {
            args: vec![
                b"m".to_vec(),
                id.as_bytes().to_vec(),
                delta.to_string().into_bytes(),
                Hex(seq).to_string().into_bytes(),
            ],
            acked: true,
        }
    }

    /// A check-in of the queued request `id` (collects a grant, or renews its place), as
    /// `permit_poll` takes it, the call numbered `seq`.
    pub(crate) fn poll(id: &str, waiter_lease: Duration, seq: u64) -> Self {
        PermitOp {
            args: vec![
                b"p".to_vec(),
                id.as_bytes().to_vec(),
                millis(waiter_lease).to_string().into_bytes(),
                Hex(seq).to_string().into_bytes(),
            ],
            acked: true,
        }
    }

    /// A withdrawal of the request `id`, naming its unanswered call (`pending`), if any.
    pub(crate) fn withdraw(id: &str, pending: Option<u64>) -> Self {
        PermitOp {
            args: vec![
                b"w".to_vec(),
                id.as_bytes().to_vec(),
                Hex(pending.unwrap_or(0)).to_string().into_bytes(),
            ],
            acked: false,
        }
    }
}

/// Apply `ops` in order in one call (`permit_batch`; one alone as its own script); each
/// operation's reply in order, and why the changes are not confirmed, if they are not.
/// `channel` is the caller's wake channel.
pub(crate) async fn permit_batch(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    channel: &str,
    session: &Session,
    ops: &[PermitOp],
) -> Result<(Vec<Value>, Option<Error>)> {
    // (One operation alone: its own script, its arguments but the kind, the channel after an
    // acquire's first four, then the session and its low mark.)
    let call = match ops {
        [op] => {
            let (script, channel_at) = match op.args.first().map(Vec::as_slice) {
                Some(b"a") => (&PERMIT_ACQUIRE, Some(5)),
                Some(b"m") => (&PERMIT_ADD, None),
                Some(b"p") => (&PERMIT_POLL, None),
                _ => (&PERMIT_WITHDRAW, None),
            };
            let mut call = script.key(&keys.all[..]);
            for (i, arg) in op.args.iter().enumerate().skip(1) {
                if Some(i) == channel_at {
                    call = call.arg(channel);
                }
                call = call.arg(&arg[..]);
            }
            call.arg(session.id()).arg(Hex(session.low()))
        }
        _ => ops.iter().flat_map(|op| &op.args).fold(
            PERMIT_BATCH
                .key(&keys.all[..])
                .arg(channel)
                .arg(session.id())
                .arg(Hex(session.low())),
            |call, arg| call.arg(&arg[..]),
        ),
    };
    let acked = call.invoke_acked(conn).await?;
    if ops.len() == 1 {
        return Ok((vec![acked.reply], acked.unconfirmed));
    }
    let (replies, _) = Reply::batch("permit_batch", acked.reply, ops.len())?;
    Ok((replies, acked.unconfirmed))
}

/// True if the count was set by this call (or by an earlier call with the same request id).
pub(crate) async fn permit_try_set(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    request: &str,
    permits: u32,
    call: Caller<'_>,
) -> Result<bool> {
    let acked = PERMIT_TRY_SET
        .key(&keys.all[..])
        .arg(request)
        .arg(permits)
        .arg(Hex(call.seq))
        .arg(call.session.id())
        .arg(Hex(call.session.low()))
        .invoke_acked(conn)
        .await?;
    decode_set("permit_try_set", acked)
}

pub(crate) async fn permit_available(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
) -> Result<Availability> {
    let reply: Value = PERMIT_AVAILABLE
        .key(&keys.all[..])
        .invoke_async(conn)
        .await?;
    let mut r = Reply::new("permit_available", reply)?;
    if r.status != "AVAILABLE" {
        return Err(r.unexpected());
    }
    Ok(Availability {
        available: r.int()?,
        waiters: r.uint()?,
        set: r.int()? == 1,
    })
}

/// The number of permits taken (by this call, or by an earlier call with the same request id),
/// and why the drain is not confirmed, if it is not: the caller gives back what it took when
/// the replicas did not acknowledge.
pub(crate) async fn permit_drain(
    conn: &mut impl Scripting,
    keys: &PermitKeys,
    request: &str,
    call: Caller<'_>,
) -> Result<(u64, Option<Error>)> {
    let acked = PERMIT_DRAIN
        .key(&keys.all[..])
        .arg(request)
        .arg(Hex(call.seq))
        .arg(call.session.id())
        .arg(Hex(call.session.low()))
        .invoke_acked(conn)
        .await?;
    let mut r = Reply::new("permit_drain", acked.reply)?;
    if r.status != "DRAINED" {
        return Err(r.unexpected());
    }
    Ok((r.uint()?, acked.unconfirmed))
}

/// True if the count was set.
pub(crate) async fn permit_delete(conn: &mut impl Scripting, keys: &PermitKeys) -> Result<bool> {
    let acked = PERMIT_DELETE.key(&keys.all[..]).invoke_acked(conn).await?;
    decode_deleted("permit_delete", acked)
}

fn decode_acquire(script: &'static str, reply: Value) -> Result<PermitAcquire> {
    let mut r = Reply::new(script, reply)?;
    let status = r.status.clone();
    Ok(match status.as_str() {
        "GRANTED" => PermitAcquire::Granted,
        "QUEUED" => PermitAcquire::Queued {
            position: r.uint()?,
            recheck: Duration::from_millis(r.uint()?),
        },
        "BUSY" => PermitAcquire::Busy {
            available: r.int()?,
            waiters: r.uint()?,
        },
        "GONE" => PermitAcquire::Gone,
        _ => return Err(r.unexpected()),
    })
}

#[cfg(test)]
mod tests;
