//! The scripts of the permit semaphore (`lua/permit_*.lua`) and of the countdown latch
//! (`lua/latch_*.lua`), their typed call wrappers, and the retry of retry-safe mutations.

use std::future::Future;
use std::sync::LazyLock;
use std::time::Duration;

use redis::aio::ConnectionLike;
use redis::{Script, Value};

use super::{Reply, millis};
use crate::error::Result;
use crate::keys::{LatchKeys, PermitKeys};

macro_rules! permit_script {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("../../lua/permit_prelude.lua"),
                include_str!(concat!("../../lua/", $file))
            ))
        })
    };
}

macro_rules! latch_script {
    ($file:literal) => {
        LazyLock::new(|| {
            Script::new(concat!(
                include_str!("../../lua/latch_prelude.lua"),
                include_str!(concat!("../../lua/", $file))
            ))
        })
    };
}

pub(crate) static PERMIT_ACQUIRE: LazyLock<Script> = permit_script!("permit_acquire.lua");
pub(crate) static PERMIT_POLL: LazyLock<Script> = permit_script!("permit_poll.lua");
pub(crate) static PERMIT_WITHDRAW: LazyLock<Script> = permit_script!("permit_withdraw.lua");
pub(crate) static PERMIT_ADD: LazyLock<Script> = permit_script!("permit_add.lua");
pub(crate) static PERMIT_TRY_SET: LazyLock<Script> = permit_script!("permit_try_set.lua");
pub(crate) static PERMIT_AVAILABLE: LazyLock<Script> = permit_script!("permit_available.lua");
pub(crate) static PERMIT_DRAIN: LazyLock<Script> = permit_script!("permit_drain.lua");
pub(crate) static PERMIT_DELETE: LazyLock<Script> = permit_script!("permit_delete.lua");

pub(crate) static LATCH_TRY_SET: LazyLock<Script> = latch_script!("latch_try_set.lua");
pub(crate) static LATCH_COUNT_DOWN: LazyLock<Script> = latch_script!("latch_count_down.lua");
pub(crate) static LATCH_STATE: LazyLock<Script> = latch_script!("latch_state.lua");
pub(crate) static LATCH_DELETE: LazyLock<Script> = latch_script!("latch_delete.lua");

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

/// What `latch_count_down` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CountDown {
    Counted(u64),
    /// The request id was applied before; nothing changed.
    Repeated(u64),
    /// No latch is counting: never set, opened, or deleted.
    Absent,
}

/// What `latch_state` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawLatchState {
    Counting(u64),
    Done,
    Never,
}

pub(crate) async fn permit_acquire(
    conn: &mut impl ConnectionLike,
    keys: &PermitKeys,
    id: &str,
    permits: u32,
    wait: bool,
    waiter_lease: Duration,
    channel: &str,
) -> Result<PermitAcquire> {
    let reply: Value = PERMIT_ACQUIRE
        .key(&keys.all[..])
        .arg(id)
        .arg(permits)
        .arg(if wait { "wait" } else { "try" })
        .arg(millis(waiter_lease))
        .arg(channel)
        .invoke_async(conn)
        .await?;
    decode_acquire("permit_acquire", reply)
}

pub(crate) async fn permit_poll(
    conn: &mut impl ConnectionLike,
    keys: &PermitKeys,
    id: &str,
    waiter_lease: Duration,
) -> Result<PermitAcquire> {
    let reply: Value = PERMIT_POLL
        .key(&keys.all[..])
        .arg(id)
        .arg(millis(waiter_lease))
        .invoke_async(conn)
        .await?;
    decode_acquire("permit_poll", reply)
}

pub(crate) async fn permit_withdraw(
    conn: &mut impl ConnectionLike,
    keys: &PermitKeys,
    id: &str,
) -> Result<Withdrawal> {
    let reply: Value = PERMIT_WITHDRAW
        .key(&keys.all[..])
        .arg(id)
        .invoke_async(conn)
        .await?;
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
    conn: &mut impl ConnectionLike,
    keys: &PermitKeys,
    request: &str,
    delta: i64,
) -> Result<Addition> {
    let reply: Value = PERMIT_ADD
        .key(&keys.all[..])
        .arg(request)
        .arg(delta)
        .invoke_async(conn)
        .await?;
    let mut r = Reply::new("permit_add", reply)?;
    let status = r.status.clone();
    Ok(match status.as_str() {
        "ADDED" => Addition::Applied(r.int()?),
        "REPEATED" => Addition::Repeated(r.int()?),
        "RANGE" => Addition::OutOfRange(r.int()?),
        _ => return Err(r.unexpected()),
    })
}

/// True if the count was set by this call (or by an earlier call with the same request id).
pub(crate) async fn permit_try_set(
    conn: &mut impl ConnectionLike,
    keys: &PermitKeys,
    request: &str,
    permits: u32,
) -> Result<bool> {
    let reply: Value = PERMIT_TRY_SET
        .key(&keys.all[..])
        .arg(request)
        .arg(permits)
        .invoke_async(conn)
        .await?;
    decode_set("permit_try_set", reply)
}

pub(crate) async fn permit_available(
    conn: &mut impl ConnectionLike,
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

/// The number of permits taken.
pub(crate) async fn permit_drain(conn: &mut impl ConnectionLike, keys: &PermitKeys) -> Result<u64> {
    let reply: Value = PERMIT_DRAIN.key(&keys.all[..]).invoke_async(conn).await?;
    let mut r = Reply::new("permit_drain", reply)?;
    if r.status != "DRAINED" {
        return Err(r.unexpected());
    }
    r.uint()
}

/// True if the count was set.
pub(crate) async fn permit_delete(
    conn: &mut impl ConnectionLike,
    keys: &PermitKeys,
) -> Result<bool> {
    let reply: Value = PERMIT_DELETE.key(&keys.all[..]).invoke_async(conn).await?;
    decode_deleted("permit_delete", reply)
}

/// True if the count was set by this call (or by an earlier call with the same request id).
pub(crate) async fn latch_try_set(
    conn: &mut impl ConnectionLike,
    keys: &LatchKeys,
    request: &str,
    count: u64,
) -> Result<bool> {
    let reply: Value = LATCH_TRY_SET
        .key(&keys.all[..])
        .arg(request)
        .arg(count)
        .invoke_async(conn)
        .await?;
    decode_set("latch_try_set", reply)
}

pub(crate) async fn latch_count_down(
    conn: &mut impl ConnectionLike,
    keys: &LatchKeys,
    request: &str,
) -> Result<CountDown> {
    let reply: Value = LATCH_COUNT_DOWN
        .key(&keys.all[..])
        .arg(request)
        .arg(&keys.channel)
        .invoke_async(conn)
        .await?;
    let mut r = Reply::new("latch_count_down", reply)?;
    let status = r.status.clone();
    Ok(match status.as_str() {
        "COUNTED" => CountDown::Counted(r.uint()?),
        "REPEATED" => CountDown::Repeated(r.uint()?),
        "ABSENT" => CountDown::Absent,
        _ => return Err(r.unexpected()),
    })
}

pub(crate) async fn latch_state(
    conn: &mut impl ConnectionLike,
    keys: &LatchKeys,
) -> Result<RawLatchState> {
    let reply: Value = LATCH_STATE.key(&keys.all[..]).invoke_async(conn).await?;
    let mut r = Reply::new("latch_state", reply)?;
    let status = r.status.clone();
    Ok(match status.as_str() {
        "COUNTING" => RawLatchState::Counting(r.uint()?),
        "DONE" => RawLatchState::Done,
        "NEVER" => RawLatchState::Never,
        _ => return Err(r.unexpected()),
    })
}

/// True if the latch was counting.
pub(crate) async fn latch_delete(conn: &mut impl ConnectionLike, keys: &LatchKeys) -> Result<bool> {
    let reply: Value = LATCH_DELETE
        .key(&keys.all[..])
        .arg(&keys.channel)
        .invoke_async(conn)
        .await?;
    decode_deleted("latch_delete", reply)
}

/// Run a retry-safe mutation (one that carries a request id the script remembers), and run it
/// once more, with the same id, if Redis could not be reached: the first attempt may or may
/// not have been applied, and the script applies the id at most once.
pub(crate) async fn retry_once<T, F, Fut>(what: &'static str, mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    match call().await {
        Err(err) if err.is_unavailable() => {
            tracing::debug!(operation = what, error = %err, "retrying once with the same request id");
            call().await
        }
        other => other,
    }
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

fn decode_set(script: &'static str, reply: Value) -> Result<bool> {
    let r = Reply::new(script, reply)?;
    match r.status.as_str() {
        "SET" => Ok(true),
        "EXISTS" => Ok(false),
        _ => Err(r.unexpected()),
    }
}

fn decode_deleted(script: &'static str, reply: Value) -> Result<bool> {
    let mut r = Reply::new(script, reply)?;
    if r.status != "DELETED" {
        return Err(r.unexpected());
    }
    Ok(r.int()? == 1)
}
