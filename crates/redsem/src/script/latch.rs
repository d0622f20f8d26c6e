//! The countdown latch's operations (`lua/latch/`): their typed call wrappers and reply
//! types.

use redis::Value;

use super::acks::Scripting;
use super::library::{LATCH_COUNT_DOWN, LATCH_DELETE, LATCH_STATE, LATCH_TRY_SET};
use super::reply::{Reply, confirmed, decode_deleted, decode_set};
use crate::error::Result;
use crate::keys::LatchKeys;
use crate::session::{Caller, Hex};

/// What `latch_count_down` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum CountDown {
    Counted(u64),
    /// The call was applied before (or is a late copy of one answered); nothing changed.
    Repeated(u64),
    /// No latch is counting: never set, opened, or deleted.
    Absent,
}

/// What `latch_state` answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RawLatchState {
    Counting(u64),
    /// Opened (reached zero) within the last hour.
    Done,
    /// Deleted while counting, within the last hour.
    Deleted,
    /// Never set, deleted while not counting, stopped counting over an hour ago, or lost.
    Never,
}

/// True if the count was set by this call (or by an earlier attempt of it: the same `call`).
pub(crate) async fn latch_try_set(
    conn: &mut impl Scripting,
    keys: &LatchKeys,
    count: u64,
    call: Caller<'_>,
) -> Result<bool> {
    let acked = LATCH_TRY_SET
        .key(&keys.all[..])
        .arg(Hex(call.seq))
        .arg(call.session.id())
        .arg(Hex(call.session.low()))
        .arg(count)
        .invoke_acked(conn)
        .await?;
    decode_set("latch_try_set", acked)
}

pub(crate) async fn latch_count_down(
    conn: &mut impl Scripting,
    keys: &LatchKeys,
    call: Caller<'_>,
) -> Result<CountDown> {
    let acked = LATCH_COUNT_DOWN
        .key(&keys.all[..])
        .arg(Hex(call.seq))
        .arg(call.session.id())
        .arg(Hex(call.session.low()))
        .arg(&keys.channel)
        .invoke_acked(conn)
        .await?;
    let mut r = Reply::new("latch_count_down", acked.reply)?;
    let status = r.status.clone();
    match status.as_str() {
        "COUNTED" => confirmed(CountDown::Counted(r.uint()?), acked.unconfirmed),
        "REPEATED" => confirmed(CountDown::Repeated(r.uint()?), acked.unconfirmed),
        "ABSENT" => Ok(CountDown::Absent),
        _ => Err(r.unexpected()),
    }
}

pub(crate) async fn latch_state(
    conn: &mut impl Scripting,
    keys: &LatchKeys,
) -> Result<RawLatchState> {
    let reply: Value = LATCH_STATE.key(&keys.all[..]).invoke_async(conn).await?;
    let mut r = Reply::new("latch_state", reply)?;
    let status = r.status.clone();
    Ok(match status.as_str() {
        "COUNTING" => RawLatchState::Counting(r.uint()?),
        "DONE" => RawLatchState::Done,
        "DELETED" => RawLatchState::Deleted,
        "NEVER" => RawLatchState::Never,
        _ => return Err(r.unexpected()),
    })
}

/// True if the latch was counting.
pub(crate) async fn latch_delete(conn: &mut impl Scripting, keys: &LatchKeys) -> Result<bool> {
    let acked = LATCH_DELETE
        .key(&keys.all[..])
        .arg(&keys.channel)
        .invoke_acked(conn)
        .await?;
    decode_deleted("latch_delete", acked)
}

#[cfg(test)]
mod tests;
