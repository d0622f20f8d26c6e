//! The client session: how a resent call is told from a new one without the server keeping
//! every request id it has seen.
//!
//! Each [`Redsem`](crate::Redsem) client is one session (a random id). Every call that
//! changes a semaphore and may be resent takes the next sequence number of its session
//! ([`Session::open`]) and keeps it open until it has its answer (resends included). With
//! each call goes the session's *low mark* ([`Session::low`]): the lowest number still open,
//! so every number below it belongs to a call the client has its answer to, or has given up.
//! The server keeps one small record per session and primitive (`lua/common.lua`): the marks
//! of the calls at or above the low mark whose answers a resend must find, which go as the
//! low mark passes them, and the low mark itself, below which a late copy of a call is
//! never applied. What it keeps grows with the calls a client has in flight, not with how
//! many it has made.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use crate::types::PermitId;

/// One client's session: its id, its next sequence number and the numbers still open.
#[derive(Debug)]
pub(crate) struct Session {
    id: String,
    next: AtomicU64,
    open: Mutex<BTreeSet<u64>>,
}

/// A sequence number of a session, open until dropped.
#[derive(Debug)]
pub(crate) struct Seq {
    session: Arc<Session>,
    n: u64,
}

impl Session {
    /// A new session with a random id; its first number is 1.
    pub(crate) fn new() -> Arc<Session> {
        Arc::new(Session {
            id: PermitId::random().as_str().to_owned(),
            next: AtomicU64::new(1),
            open: Mutex::default(),
        })
    }

    /// The session's id, as the scripts name its record.
    pub(crate) fn id(&self) -> &str {
        &self.id
    }

    /// The next sequence number, open until the returned [`Seq`] is dropped.
    pub(crate) fn open(self: &Arc<Self>) -> Seq {
        let mut open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        // (Taken under the lock: a number is open before any low mark can pass it.)
        let n = self.next.fetch_add(1, Ordering::Relaxed);
        open.insert(n);
        Seq {
            session: Arc::clone(self),
            n,
        }
    }

    /// The low mark: the lowest number still open, or the next one if none is.
    pub(crate) fn low(&self) -> u64 {
        let open = self.open.lock().unwrap_or_else(PoisonError::into_inner);
        open.first()
            .copied()
            .unwrap_or_else(|| self.next.load(Ordering::Relaxed))
    }
}

/// Which call of which client session a script call is (see [`crate::session`]): its
/// session, and its number in it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caller<'a> {
    pub(crate) session: &'a Session,
    pub(crate) seq: u64,
}

impl<'a> Caller<'a> {
    pub(crate) fn new(session: &'a Session, seq: u64) -> Self {
        Caller { session, seq }
    }
}

/// A session number as the scripts read it: hexadecimal text (`lua/common.lua`; Lua reads
/// a hexadecimal number with `strtoul`, a decimal one with `strtod`, which costs several
/// times as much on every call).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Hex(pub(crate) u64);

impl Hex {
    /// The digits, lowercase, without leading zeros ("0" for 0), in a buffer and its used
    /// tail: written on every call, so without the formatting machinery.
    fn digits(&self) -> ([u8; 16], usize) {
        const DIGITS: &[u8; 16] = b"0123456789abcdef";
        let mut buf = [0u8; 16];
        let (mut n, mut start) = (self.0, 16);
        loop {
            start -= 1;
            buf[start] = DIGITS[(n & 0xf) as usize];
            n >>= 4;
            if n == 0 {
                return (buf, start);
            }
        }
    }
}

impl std::fmt::Display for Hex {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{:x}", self.0)
    }
}

impl redis::ToRedisArgs for Hex {
    fn write_redis_args<W>(&self, out: &mut W)
    where
        W: ?Sized + redis::RedisWrite,
    {
        let (buf, start) = self.digits();
        out.write_arg(&buf[start..]);
    }
}

impl Seq {
    /// The number.
    pub(crate) fn n(&self) -> u64 {
        self.n
    }
}

impl Drop for Seq {
    fn drop(&mut self) {
        self.session
            .open
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.n);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_low_mark_is_the_lowest_number_still_open() {
        let session = Session::new();
        assert_eq!(session.low(), 1, "nothing open: the next number");
        let a = session.open();
        let b = session.open();
        let c = session.open();
        assert_eq!((a.n(), b.n(), c.n()), (1, 2, 3));
        assert_eq!(session.low(), 1);
        drop(b);
        assert_eq!(session.low(), 1, "a is still open");
        drop(a);
        assert_eq!(session.low(), 3, "b and a are answered, c is not");
        drop(c);
        assert_eq!(session.low(), 4);
    }

    #[test]
    fn session_numbers_travel_as_lowercase_hexadecimal() {
        assert_eq!(Hex(0).to_string(), "0");
        assert_eq!(Hex(255).to_string(), "ff");
        assert_eq!(Hex(1 << 52).to_string(), "10000000000000");
        for n in [0, 1, 15, 16, 255, 4096, 1 << 52, u64::MAX - 1, u64::MAX] {
            assert_eq!(
                redis::ToRedisArgs::to_redis_args(&Hex(n)),
                vec![format!("{n:x}").into_bytes()],
                "{n}"
            );
        }
    }

    #[test]
    fn sessions_have_distinct_ids() {
        assert_ne!(Session::new().id(), Session::new().id());
    }
}
