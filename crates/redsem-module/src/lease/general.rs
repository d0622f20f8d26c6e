//! The lease semaphore's contended paths natively: `acquire()`, `release()` and the group
//! commit `lease_batch` of crates/redsem/lua/lease/requests.lua, with the queue, the grants
//! and the session marks they make (lease/queue.lua, lease/grants.lua, common.lua), on a
//! settled state.
//!
//! A call is worked out in memory first, over what it reads of the keys ([`Call`]: the
//! state's fields as a cache, the two sorted sets as their changes over the keys, the slot
//! bitmap as a copy), and written only when the whole call is one these paths take. Where
//! the Lua would do something not done here (settle expired leases or prune session records,
//! repair disagreeing counters, adopt or refuse a layout, grant several units at once, answer
//! a resend, store a new capacity, keep a TTL, read a number written oddly, ...) the call is
//! declined with nothing written, and the command runs the Lua (crate::delegate). So every
//! reply, record, counter, key and wake-up is the one the Lua makes: the differential runner
//! (crates/redsem-verify) checks it call by call.

use super::call::{Call, Counters, NH, NT, QLEN, SEQ, TNEXT, TOK, USED};
use super::view::{Record, Reply, bulk, int, integral};
use crate::api::{self, RedisModuleCtx, RedisModuleString};
use crate::record::{Native, decimal, decimal_text, hex, join};

/// lease/layout.lua: MAX_UNITS.
pub(super) const MAX_UNITS: u64 = 4096;
/// The most waiters one native call grants: the call's reads and writes are kept in lists
/// searched by name, fine for the few a release or a group commit admits, not for the
/// thousands one release may admit after a capacity is raised (those calls run the Lua).
const MAX_GRANTS: usize = 64;

impl Call<'_> {
    /// grant(id, 1, label, lease, expires): a unit's slot, lease entry, token and record.
    /// Answers the token and the slot. (Several units: declined.)
    unsafe fn grant(
        &mut self,
        id: &[u8],
        k: u64,
        label: &[u8],
        lease: u64,
        expires: u64,
    ) -> Native<(u64, u64)> {
        if k != 1 {
            return None;
        }
        let token = (self.c.tok? + 1).max(self.now_us);
        if self.c.used > 0 && self.bits.is_empty() && self.slots_stored {
            return None; // (BITPOS answers -1 on an empty string: the Lua's SETBIT fails)
        }
        let slot = if self.c.used > 0 {
            self.first_clear()
        } else {
            0
        };
        self.set_bit(slot, true)?;
        self.add_lease(id, expires);
        self.set(TOK, token);
        let record = join(&[
            b"h|",
            &decimal_text(token),
            b"|1|",
            &decimal_text(self.now),
            b"|",
            &decimal_text(lease),
            b"|",
            &decimal_text(slot),
            b"|",
            label,
        ]);
        self.put(&join(&[b"r:", id]), Some(record));
        self.set(USED, self.c.used + k);
        self.set(NH, self.c.nh + 1);
        Some((token, slot))
    }

    /// promote(): grant, in arrival order, every waiter at the head of the queue that fits.
    pub(super) unsafe fn promote(&mut self) -> Native<()> {
        while self.c.qlen > 0 && self.budget > 0 {
            if self.granted == MAX_GRANTS {
                return None; // (a call that admits a crowd: the Lua, which does it in one pass)
            }
            let head = self.queue.first(self.ctx)?; // (none: repair())
            match self.record(&head)? {
                None | Some(Record::Holder { .. }) => {
                    self.queue.set(&head, None);
                    self.set(QLEN, self.c.qlen.saturating_sub(1));
                }
                Some(Record::Waiter {
                    k, channel, label, ..
                }) if k > self.c.cap => {
                    self.drop_waiter(&head, &label)?;
                    self.leases.set(&head, None);
                    self.outbox.push((channel, head));
                }
                Some(Record::Waiter { k, .. }) if self.c.used + k > self.c.cap => return Some(()),
                Some(Record::Waiter {
                    k,
                    lease,
                    wl,
                    channel,
                    label,
                }) => {
                    self.budget = self.budget.saturating_sub(k);
                    let now = self.now as i64;
                    let place_ends = match self.leases.score(self.ctx, &head) {
                        Some(score) => integral(score)?,
                        None => now + wl as i64,
                    };
                    let checked_in = place_ends - wl as i64;
                    let mine = self.mine.as_deref() == Some(&channel[..]);
                    let mut ends = now + lease as i64;
                    if !mine {
                        ends = place_ends.min(ends).max(now + 1);
                    }
                    let (token, slot) =
                        self.grant(&head, k, &label, lease, u64::try_from(ends).ok()?)?;
                    self.granted += 1;
                    self.queue.set(&head, None);
                    self.set(QLEN, self.c.qlen.saturating_sub(1));
                    let message = join(&[
                        &head,
                        b"|",
                        &decimal_text(token),
                        b"|",
                        &decimal_text(slot),
                        b"|",
                        &decimal_text((now - checked_in).max(0) as u64),
                    ]);
                    if mine {
                        self.handed.push(message);
                    } else {
                        self.outbox.push((channel, message));
                    }
                    if self.c.used >= self.c.cap {
                        return Some(());
                    }
                }
            }
        }
        Some(())
    }

    /// drop_waiter(id, r) (its lease entry is the caller's to remove).
    unsafe fn drop_waiter(&mut self, id: &[u8], label: &[u8]) -> Native<()> {
        self.queue.set(id, None);
        self.put(&join(&[b"r:", id]), None);
        self.set(QLEN, self.c.qlen.saturating_sub(1));
        self.label_add(label, -1)
    }

    /// mark(seq, letter): the call marked in its session record, a renewal registered.
    unsafe fn mark(&mut self, seq: &[u8], letter: &[u8]) -> Native<()> {
        if let Some(renewed) = self.session.put(self.low, seq, letter, self.now)? {
            let name = self.session.name.clone();
            if self.leases.add(self.ctx, &name, -(renewed as f64)) {
                self.set(NT, self.c.nt + 1);
            }
            if self.c.tnext == 0 {
                self.set(TNEXT, renewed);
            }
        }
        Some(())
    }

    /// recheck_ms(id, waiter_lease, behind).
    unsafe fn recheck_ms(&mut self, id: &[u8], wl: u64, behind: bool) -> u64 {
        let mut wait = (wl / 3) as i64;
        if self.c.next > 0 && !behind && self.queue.first(self.ctx).as_deref() == Some(id) {
            wait = wait.min(self.c.next as i64 - self.now as i64 + 1);
        }
        wait.max(1) as u64
    }

    /// acquire(request): see lease/requests.lua.
    unsafe fn acquire(&mut self, r: &Request) -> Native<Reply> {
        let (cap, k) = (decimal(r.cap)?, decimal(r.k)?);
        let (lease, wl) = (decimal(r.lease)?, decimal(r.waiter_lease)?);
        if k > MAX_UNITS {
            return Some(Reply::Array(vec![bulk(b"TOOMANY"), int(MAX_UNITS)]));
        }
        let seq = hex(r.seq)?;
        if self.session.stale(seq) || self.session.mark(r.seq, seq)?.as_deref() == Some(b"X") {
            return Some(Reply::Array(vec![bulk(b"GONE")]));
        }
        if self.record(r.id)?.is_some() {
            return None; // (a resend: answer_resend())
        }
        if self.c.cap != cap {
            return None; // (CONFLICT, or a capacity stored)
        }
        if k > cap {
            return Some(Reply::Array(vec![bulk(b"TOOBIG"), int(cap)]));
        }
        if r.exclusive == b"1" && self.label_held(r.label)? {
            return Some(Reply::Array(vec![bulk(b"LABEL"), bulk(r.label)]));
        }
        let fits = |c: &Counters| c.qlen == 0 && c.used + k <= cap;
        if !fits(&self.c) {
            self.check()?;
        }
        if fits(&self.c) {
            let (token, slot) = self.grant(r.id, k, r.label, lease, self.now + lease)?;
            self.label_add(r.label, 1)?;
            return Some(Reply::Array(vec![bulk(b"GRANTED"), int(token), int(slot)]));
        }
        if r.mode != b"wait" {
            return Some(Reply::Array(vec![
                bulk(b"BUSY"),
                int(self.c.used),
                int(self.c.qlen),
            ]));
        }
        // enqueue()
        let position = self.c.qlen;
        self.queue.set(r.id, Some((self.c.seq + 1) as f64));
        self.add_lease(r.id, self.now + wl);
        self.set(SEQ, self.c.seq + 1);
        self.set(QLEN, position + 1);
        let record = join(&[
            b"w|",
            &decimal_text(k),
            b"|",
            &decimal_text(self.now),
            b"|",
            &decimal_text(lease),
            b"|",
            &decimal_text(wl),
            b"|",
            &decimal_text(r.channel.len() as u64),
            b"|",
            r.channel,
            r.label,
        ]);
        self.put(&join(&[b"r:", r.id]), Some(record));
        self.label_add(r.label, 1)?;
        let recheck = self.recheck_ms(r.id, wl, position > 0);
        Some(Reply::Array(vec![
            bulk(b"QUEUED"),
            int(position),
            int(recheck),
        ]))
    }

    /// release(request): see lease/requests.lua. Answers the outcome.
    unsafe fn release(&mut self, id: &[u8], seq: &[u8], kind: &[u8]) -> Native<&'static [u8]> {
        if kind == b"r" {
            let number = hex(seq)?;
            if self.session.stale(number) {
                return Some(b"NOTHELD");
            }
            match self.session.mark(seq, number)?.as_deref() {
                Some(b"R") => return Some(b"RELEASED"),
                Some(b"D") => return Some(b"DEQUEUED"),
                _ => {}
            }
        } else if kind != b"w" {
            return None;
        }
        let record = self.record(id)?;
        if record.is_some() {
            self.leases.set(id, None);
        }
        let outcome: &'static [u8] = match &record {
            Some(Record::Holder { k, slots, label }) => {
                for &slot in slots {
                    self.set_bit(slot, false)?;
                }
                self.put(&join(&[b"r:", id]), None);
                self.set(USED, self.c.used.saturating_sub(*k));
                self.set(NH, self.c.nh.saturating_sub(1));
                self.label_add(label, -1)?;
                b"RELEASED"
            }
            Some(Record::Waiter { label, .. }) => {
                self.drop_waiter(id, label)?;
                b"DEQUEUED"
            }
            None => b"NOTHELD",
        };
        match (&record, kind) {
            (Some(Record::Holder { .. }), b"r") => self.mark(seq, b"R")?,
            (Some(Record::Waiter { .. }), b"r") => self.mark(seq, b"D")?,
            (_, b"w") if seq != b"0" => self.mark(seq, b"X")?,
            _ => {}
        }
        self.promote()?;
        Some(outcome)
    }
}

/// An acquire's arguments, as lease_acquire and lease_batch give them.
#[derive(Debug)]
struct Request<'r> {
    id: &'r [u8],
    cap: &'r [u8],
    k: &'r [u8],
    lease: &'r [u8],
    label: &'r [u8],
    exclusive: &'r [u8],
    mode: &'r [u8],
    waiter_lease: &'r [u8],
    channel: &'r [u8],
    seq: &'r [u8],
}

/// lease_acquire, ARGV (argv[5..]): 1 id, 2 capacity, 3 units, 4 lease ms, 5 label, 6 one per
/// label, 7 mode, 8 waiter lease ms, 9 channel, 10 seq, 11 session id, 12 low mark.
pub(crate) unsafe fn acquire(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> bool {
    if argv.len() != 17 {
        return false;
    }
    let a = |i: usize| api::bytes(argv[4 + i]);
    let request = Request {
        id: a(1),
        cap: a(2),
        k: a(3),
        lease: a(4),
        label: a(5),
        exclusive: a(6),
        mode: a(7),
        waiter_lease: a(8),
        channel: a(9),
        seq: a(10),
    };
    (|| {
        let mut call = Call::load(ctx, argv, a(11), a(12), None)?;
        let reply = call.acquire(&request)?;
        call.save(&reply)
    })()
    .is_some()
}

/// lease_release, ARGV (argv[5..]): 1 id, 2 channel, 3 seq, 4 session id, 5 low mark,
/// 6 "r" | "w".
pub(crate) unsafe fn release(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> bool {
    if argv.len() != 11 {
        return false;
    }
    let a = |i: usize| api::bytes(argv[4 + i]);
    (|| {
        let mut call = Call::load(ctx, argv, a(4), a(5), Some(a(2)))?;
        call.defer_idle = true;
        let outcome = call.release(a(1), a(3), a(6))?;
        let reply = call.released(bulk(outcome), call.idle());
        call.save(&reply)
    })()
    .is_some()
}

/// lease_batch, ARGV (argv[5..]): 1 channel, 2 session id, 3 low mark, then the operations:
/// "a", id, capacity, units, lease, label, "1" | "0", mode, waiter lease, seq; "r" | "w",
/// id, seq.
pub(crate) unsafe fn batch(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> bool {
    if argv.len() < 8 {
        return false;
    }
    let a = |i: usize| api::bytes(argv[4 + i]);
    let n = argv.len() - 5; // (ARGV runs from 1 to n: argv[5..])
    (|| {
        let channel = a(1);
        let mut ops = Vec::new();
        let mut i = 4;
        while i <= n {
            match a(i) {
                b"a" if i + 9 <= n => {
                    ops.push(Ok(Request {
                        id: a(i + 1),
                        cap: a(i + 2),
                        k: a(i + 3),
                        lease: a(i + 4),
                        label: a(i + 5),
                        exclusive: a(i + 6),
                        mode: a(i + 7),
                        waiter_lease: a(i + 8),
                        channel,
                        seq: a(i + 9),
                    }));
                    i += 10;
                }
                kind @ (b"r" | b"w") if i + 2 <= n => {
                    ops.push(Err((kind, a(i + 1), a(i + 2))));
                    i += 3;
                }
                _ => return None, // (an error reply: the Lua's)
            }
        }
        let mut call = Call::load(ctx, argv, a(2), a(3), Some(channel))?;
        let mut replies = Vec::with_capacity(ops.len());
        for op in &ops {
            replies.push(match op {
                Ok(request) => call.acquire(request)?,
                Err((kind, id, seq)) => {
                    call.defer_idle = true;
                    Reply::Array(vec![bulk(call.release(id, seq, kind)?)])
                }
            });
        }
        let idle = call.defer_idle && call.idle();
        let reply = call.released(Reply::Array(replies), idle);
        call.save(&reply)
    })()
    .is_some()
}
