//! What every script answers, read one value at a time: `{status, values...}`, with the
//! `WRONGTYPE` status (one of our keys holds a foreign value) turned into
//! [`Error::WrongType`] and the `LAYOUT` status (a state of another layout) into
//! [`Error::Incompatible`] for every script alike; and the two reply shapes that the permit
//! and latch scripts share (`try_set`, `delete`).

use std::time::Duration;

use redis::Value;

use super::acks::Acked;
use crate::error::{Error, Result};

/// `value`, or the error of a change the replicas did not confirm.
pub(super) fn confirmed<T>(value: T, unconfirmed: Option<Error>) -> Result<T> {
    unconfirmed.map_or(Ok(value), Err)
}

/// `d` in whole milliseconds, as the scripts take durations (saturating).
pub(super) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// A cursor over a script's reply: `{status, values...}`. A `WRONGTYPE` status becomes
/// [`Error::WrongType`] here, for every script alike.
pub(super) struct Reply {
    script: &'static str,
    pub(super) status: String,
    rest: std::vec::IntoIter<Value>,
}

impl Reply {
    pub(super) fn new(script: &'static str, reply: Value) -> Result<Self> {
        let mut r = Self::nested(script, reply)?;
        r.status = r.string()?;
        if r.status == "WRONGTYPE" {
            return Err(Error::WrongType {
                key: r.string()?,
                actual: r.string()?,
                expected: r.string()?,
            });
        }
        if r.status == "LAYOUT" {
            return Err(Error::Incompatible {
                key: r.string()?,
                found: r.string()?,
                ours: r.string()?,
            });
        }
        Ok(r)
    }

    /// A group commit's reply: `{{each operation's reply, in order}, more...}`, one reply per
    /// operation (`ops`); the replies, and the cursor over what follows them. A reply that is
    /// one status for the whole batch (a foreign value, another layout) is its error.
    pub(super) fn batch(
        script: &'static str,
        reply: Value,
        ops: usize,
    ) -> Result<(Vec<Value>, Self)> {
        let answered =
            matches!(&reply, Value::Array(items) if matches!(items.first(), Some(Value::Array(_))));
        if !answered {
            return Err(Reply::new(script, reply)?.unexpected());
        }
        let mut r = Reply::nested(script, reply)?;
        let replies = r.array()?;
        if replies.len() != ops {
            return Err(Error::Protocol {
                script,
                detail: format!("{} replies to {} operations", replies.len(), ops),
            });
        }
        Ok((replies, r))
    }

    pub(super) fn nested(script: &'static str, reply: Value) -> Result<Self> {
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

    pub(super) fn bad(&self, what: &str, got: &Value) -> Error {
        Error::Protocol {
            script: self.script,
            detail: format!("expected {what}, got {got:?}"),
        }
    }

    pub(super) fn unexpected(&self) -> Error {
        Error::Protocol {
            script: self.script,
            detail: format!("unknown status {:?}", self.status),
        }
    }

    pub(super) fn string(&mut self) -> Result<String> {
        match self.next()? {
            Value::BulkString(bytes) => Ok(String::from_utf8_lossy(&bytes).into_owned()),
            Value::SimpleString(s) => Ok(s),
            Value::Int(n) => Ok(n.to_string()),
            other => Err(self.bad("a string", &other)),
        }
    }

    pub(super) fn int(&mut self) -> Result<i64> {
        match self.next()? {
            Value::Int(n) => Ok(n),
            other => Err(self.bad("an integer", &other)),
        }
    }

    pub(super) fn uint(&mut self) -> Result<u64> {
        let n = self.int()?;
        u64::try_from(n).map_err(|_| self.bad("a non-negative integer", &Value::Int(n)))
    }

    pub(super) fn u32(&mut self) -> Result<u32> {
        let n = self.int()?;
        u32::try_from(n).map_err(|_| self.bad("a 32-bit count", &Value::Int(n)))
    }

    pub(super) fn array(&mut self) -> Result<Vec<Value>> {
        match self.next()? {
            Value::Array(items) => Ok(items),
            other => Err(self.bad("an array", &other)),
        }
    }

    /// The values left, all of them.
    pub(super) fn rest(&mut self) -> Vec<Value> {
        self.rest.by_ref().collect()
    }

    /// The slots that end a grant's reply: every value left.
    pub(super) fn rest_slots(&mut self) -> Result<Vec<u32>> {
        let items = self.rest();
        self.slot_numbers(items)
    }

    /// The next value, an array of slots (a holder's in `lease_status`).
    pub(super) fn slots(&mut self) -> Result<Vec<u32>> {
        let items = self.array()?;
        self.slot_numbers(items)
    }

    fn slot_numbers(&self, items: Vec<Value>) -> Result<Vec<u32>> {
        items
            .into_iter()
            .map(|v| match v {
                Value::Int(n) => u32::try_from(n).map_err(|_| self.bad("a slot", &Value::Int(n))),
                other => Err(self.bad("a slot", &other)),
            })
            .collect()
    }
}

/// A `try_set`'s answer: a count it set must be confirmed, one already there was not changed.
pub(super) fn decode_set(script: &'static str, acked: Acked) -> Result<bool> {
    let r = Reply::new(script, acked.reply)?;
    match r.status.as_str() {
        "SET" => confirmed(true, acked.unconfirmed),
        "EXISTS" => Ok(false),
        _ => Err(r.unexpected()),
    }
}

/// A `delete`'s answer: a deletion must be confirmed, nothing deleted changed nothing.
pub(super) fn decode_deleted(script: &'static str, acked: Acked) -> Result<bool> {
    let mut r = Reply::new(script, acked.reply)?;
    if r.status != "DELETED" {
        return Err(r.unexpected());
    }
    if r.int()? == 1 {
        confirmed(true, acked.unconfirmed)
    } else {
        Ok(false)
    }
}
