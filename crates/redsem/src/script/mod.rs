//! The Lua scripts and their typed call wrappers: the only place that knows a script's
//! KEYS, ARGV and reply layout.
//!
//! Each script lives in `lua/<primitive>_<operation>.lua` with a header stating its contract.
//! Scripts are compiled into the binary, sent by EVALSHA and reloaded when Redis answers
//! NOSCRIPT (after `SCRIPT FLUSH`, a restart or a failover) by [`redis::Script::invoke_async`].

use std::time::Duration;

use redis::Value;

use crate::error::{Error, Result};
use crate::keys::LeaseKeys;

mod counters;
pub(crate) use counters::*;

mod library;
pub(crate) use library::*;

/// What `lease_acquire` and `lease_poll` answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Acquire {
    Granted { token: u64, slots: Vec<u32> },
    Queued { position: u64, recheck: Duration },
    Busy { in_use: u64, waiters: u64 },
    Gone,
    Conflict { current: u32 },
    Label(String),
    TooBig { capacity: u32 },
    TooMany { most: u32 },
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
}

/// A waiter as `lease_status` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawWaiter {
    pub(crate) id: String,
    pub(crate) label: String,
    pub(crate) units: u32,
    pub(crate) waited_ms: i64,
}

/// What `lease_status` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct RawStatus {
    pub(crate) capacity: Option<u32>,
    pub(crate) in_use: u64,
    pub(crate) holders: Vec<RawHolder>,
    pub(crate) waiters: Vec<RawWaiter>,
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
}

pub(crate) async fn lease_acquire(
    conn: &mut impl Scripting,
    keys: &LeaseKeys,
    req: &Request<'_>,
) -> Result<Acquire> {
    let reply: Value = LEASE_ACQUIRE
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
        .invoke_async(conn)
        .await?;
    decode_acquire("lease_acquire", reply)
}

pub(crate) async fn lease_poll(
    conn: &mut impl Scripting,
    keys: &LeaseKeys,
    id: &str,
    lease: Duration,
    waiter_lease: Duration,
) -> Result<Acquire> {
    let reply: Value = LEASE_POLL
        .key(&keys.all[..])
        .arg(id)
        .arg(millis(lease))
        .arg(millis(waiter_lease))
        .invoke_async(conn)
        .await?;
    decode_acquire("lease_poll", reply)
}

/// True if the lease was extended, false if the permit is not held.
pub(crate) async fn lease_refresh(
    conn: &mut impl Scripting,
    keys: &LeaseKeys,
    id: &str,
    lease: Duration,
) -> Result<bool> {
    let reply: Value = LEASE_REFRESH
        .key(&keys.all[..])
        .arg(id)
        .arg(millis(lease))
        .invoke_async(conn)
        .await?;
    let r = Reply::new("lease_refresh", reply)?;
    match r.status.as_str() {
        "OK" => Ok(true),
        "NOTHELD" => Ok(false),
        _ => Err(r.unexpected()),
    }
}

/// Release (or withdraw) `id`; `channel` is the caller's wake channel, whose grants come back
/// in the reply.
pub(crate) async fn lease_release(
    conn: &mut impl Scripting,
    keys: &LeaseKeys,
    id: &str,
    channel: &str,
) -> Result<Released> {
    let reply: Value = LEASE_RELEASE
        .key(&keys.all[..])
        .arg(id)
        .arg(channel)
        .invoke_async(conn)
        .await?;
    let mut r = Reply::new("lease_release", reply)?;
    let outcome = match r.status.as_str() {
        "RELEASED" => Release::Released,
        "DEQUEUED" => Release::Dequeued,
        "NOTHELD" => Release::NotHeld,
        _ => return Err(r.unexpected()),
    };
    let idle = r.int()? == 1;
    let mut handed = Vec::new();
    for item in r.array()? {
        match item {
            Value::BulkString(bytes) => handed.push(String::from_utf8_lossy(&bytes).into_owned()),
            other => return Err(r.bad("a grant message", &other)),
        }
    }
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
        });
    }
    Ok(RawStatus {
        capacity,
        in_use,
        holders,
        waiters,
    })
}

/// Returns the capacity in force before the change, if one was stored.
pub(crate) async fn lease_set_capacity(
    conn: &mut impl Scripting,
    keys: &LeaseKeys,
    capacity: u32,
) -> Result<Option<u32>> {
    let reply: Value = LEASE_SET_CAPACITY
        .key(&keys.all[..])
        .arg(capacity)
        .invoke_async(conn)
        .await?;
    let mut r = Reply::new("lease_set_capacity", reply)?;
    match r.status.as_str() {
        "OK" => Ok(u32::try_from(r.int()?).ok()),
        _ => Err(r.unexpected()),
    }
}

fn decode_acquire(script: &'static str, reply: Value) -> Result<Acquire> {
    let mut r = Reply::new(script, reply)?;
    let status = r.status.clone();
    Ok(match status.as_str() {
        "GRANTED" => Acquire::Granted {
            token: r.uint()?,
            slots: r.slots()?,
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
        "LABEL" => Acquire::Label(r.string()?),
        "TOOBIG" => Acquire::TooBig { capacity: r.u32()? },
        "TOOMANY" => Acquire::TooMany { most: r.u32()? },
        _ => return Err(r.unexpected()),
    })
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A cursor over a script's reply: `{status, values...}`. A `WRONGTYPE` status becomes
/// [`Error::WrongType`] here, for every script alike.
struct Reply {
    script: &'static str,
    status: String,
    rest: std::vec::IntoIter<Value>,
}

impl Reply {
    fn new(script: &'static str, reply: Value) -> Result<Self> {
        let mut r = Self::nested(script, reply)?;
        r.status = r.string()?;
        if r.status == "WRONGTYPE" {
            return Err(Error::WrongType {
                key: r.string()?,
                actual: r.string()?,
                expected: r.string()?,
            });
        }
        Ok(r)
    }

    fn nested(script: &'static str, reply: Value) -> Result<Self> {
        match reply {
            Value::Array(items) => Ok(Reply {
                script,
                status: String::new(),
                rest: items.into_iter(),
            }),
            other => Err(Error::Protocol {
                script,
                detail: format!("expected an array, got {other:?}"),
            }),
        }
    }

    fn next(&mut self) -> Result<Value> {
        self.rest.next().ok_or_else(|| Error::Protocol {
            script: self.script,
            detail: "reply too short".into(),
        })
    }

    fn bad(&self, what: &str, got: &Value) -> Error {
        Error::Protocol {
            script: self.script,
            detail: format!("expected {what}, got {got:?}"),
        }
    }

    fn unexpected(&self) -> Error {
        Error::Protocol {
            script: self.script,
            detail: format!("unknown status {:?}", self.status),
        }
    }

    fn string(&mut self) -> Result<String> {
        match self.next()? {
            Value::BulkString(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
            Value::SimpleString(s) => Ok(s),
            Value::Int(n) => Ok(n.to_string()),
            other => Err(self.bad("a string", &other)),
        }
    }

    fn int(&mut self) -> Result<i64> {
        match self.next()? {
            Value::Int(n) => Ok(n),
            other => Err(self.bad("an integer", &other)),
        }
    }

    fn uint(&mut self) -> Result<u64> {
        let n = self.int()?;
        u64::try_from(n).map_err(|_| self.bad("a non-negative integer", &Value::Int(n)))
    }

    fn u32(&mut self) -> Result<u32> {
        let n = self.int()?;
        u32::try_from(n).map_err(|_| self.bad("a 32-bit count", &Value::Int(n)))
    }

    fn array(&mut self) -> Result<Vec<Value>> {
        match self.next()? {
            Value::Array(items) => Ok(items),
            other => Err(self.bad("an array", &other)),
        }
    }

    fn slots(&mut self) -> Result<Vec<u32>> {
        let items = self.array()?;
        items
            .into_iter()
            .map(|v| match v {
                Value::Int(n) => u32::try_from(n).map_err(|_| self.bad("a slot", &Value::Int(n))),
                other => Err(self.bad("a slot", &other)),
            })
            .collect()
    }
}

#[cfg(test)]
mod tests;
