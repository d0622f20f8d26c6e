//! The permit semaphore's contended paths natively, on a live semaphore: `acquire_op`,
//! `add_op` and `check_in` of crates/redsem/lua/permit/requests.lua (a waiter queued, a
//! release that serves the head of the queue, a grant collected), alone (`permit_acquire`,
//! `permit_add`, `permit_poll`) and in a group commit (`permit_batch`), with promote() and
//! queued() of permit/queue.lua and keep() of permit/state.lua.
//!
//! As the lease's general paths (crate::lease): a call is worked out in memory over what it
//! reads (the records hash's fields as a cache, the sorted sets as their changes over the
//! keys: crate::zset), and written only when the whole call is one these paths take. They
//! take a semaphore that is live before and after the call (someone waits or a grant is
//! uncollected: no TTL to give or take), of this layout, with nothing for settle() to drop
//! (no session record due, no waiter lease ended) and plain records and numbers. Anything
//! else (a withdrawal, a waiter's renewal, the last waiter leaving, a count out of range,
//! a crowd of grants, ...) is declined with nothing written, and the command runs the Lua:
//! so every reply, record and wake-up is the Lua's, which the differential runner
//! (crates/redsem-verify) checks call by call.

use std::ffi::{c_char, c_int};
use std::ptr;

use crate::api::{
    self, Keys, RedisModuleCtx, RedisModuleString, Str, api, is_or_empty, key_type, raw,
};
use crate::clock;
use crate::hash::Fields;
use crate::record::{Native, decimal, decimal_text, hex, join};
use crate::replicate::{Effects, publish};
use crate::reply::{Reply, bulk, send};
use crate::session::SessionRecord;
use crate::zset::Zset;

use super::{LAYOUT, MAX_INT, canonical, count_text};

/// permit/layout.lua: MAX_STEPS, KEEP_IDLE_MS, KEEP_MARGIN_MS.
const MAX_STEPS: u64 = 100;
const KEEP_IDLE_MS: u64 = 60_000;
const KEEP_MARGIN_MS: u64 = 30_000;

/// A request's record as permit/layout.lua's parse() reads it (only plain ones).
#[derive(Debug, PartialEq)]
enum Record {
    /// "w|k|since|channel": waiting for k permits (k as written).
    Waiting {
        k: u64,
        digits: Vec<u8>,
        channel: Vec<u8>,
    },
    /// "g|k": granted k permits, not collected.
    Granted { k: u64 },
}

/// parse(raw): Some(None) for no record; None (declined) for one not written plainly.
fn parse(raw: Option<&[u8]>) -> Native<Option<Record>> {
    let Some(raw) = raw else {
        return Some(None);
    };
    let mut p = raw.splitn(4, |&c| c == b'|');
    match (p.next()?, p.next(), p.next(), p.next()) {
        (b"w", Some(k), Some(since), Some(channel)) => {
            decimal(since)?;
            Some(Some(Record::Waiting {
                k: decimal(k)?,
                digits: k.to_vec(),
                channel: channel.to_vec(),
            }))
        }
        (b"g", Some(k), None, None) => Some(Some(Record::Granted { k: decimal(k)? })),
        _ => None,
    }
}

/// One call, worked out in memory.
struct Call<'a> {
    ctx: *mut RedisModuleCtx,
    argv: &'a [*mut RedisModuleString],
    keys: Keys<6>,
    queue: Zset,
    waiters: Zset,
    applied: Zset,
    /// The records hash's fields read and put.
    fields: Fields,
    count: i64,
    /// The permits this call took (its INCRBY is -taken).
    taken: i64,
    keep: u64,
    wlen: u64,
    wnext: Option<u64>,
    qlen: u64,
    /// Which of keep, wlen, wnext, qlen the call changed.
    dirty: [bool; 4],
    /// The meta hash's ticket counter, once read, and whether it changed.
    ticket: Option<i64>,
    now: u64,
    low: u64,
    session: SessionRecord,
    need: u64,
    steps: u64,
    outbox: Vec<(Vec<u8>, Vec<u8>)>,
}

const KEEP: usize = 0;
const WLEN: usize = 1;
const WNEXT: usize = 2;
const QLEN: usize = 3;

impl<'a> Call<'a> {
    /// begin(), load() and settle() where settle has nothing to drop. None: declined.
    unsafe fn load(
        ctx: *mut RedisModuleCtx,
        argv: &'a [*mut RedisModuleString],
        session: &[u8],
        low: &[u8],
    ) -> Native<Call<'a>> {
        let keys = Keys::<6>::open(ctx, &argv[1..7]);
        let [count, queue, waiters, records, meta, applied] = keys.0;
        let zset = raw::REDISMODULE_KEYTYPE_ZSET;
        if key_type(count) != raw::REDISMODULE_KEYTYPE_STRING
            || api!(RedisModule_GetExpire)(count) != raw::REDISMODULE_NO_EXPIRE as i64
            || !is_or_empty(key_type(queue), zset)
            || !is_or_empty(key_type(waiters), zset)
            || key_type(records) != raw::REDISMODULE_KEYTYPE_HASH
            || key_type(meta) != raw::REDISMODULE_KEYTYPE_HASH
            || !is_or_empty(key_type(applied), zset)
        {
            return None;
        }
        let (now, _) = clock::now(ctx)?;
        let mut call = Call {
            ctx,
            argv,
            queue: Zset::new(queue),
            waiters: Zset::new(waiters),
            applied: Zset::new(applied),
            fields: Fields::new(records),
            keys,
            count: 0,
            taken: 0,
            keep: 0,
            wlen: 0,
            wnext: None,
            qlen: 0,
            dirty: [false; 4],
            ticket: None,
            now,
            low: hex(low)?,
            session: SessionRecord::parse(Vec::new(), None)?,
            need: 0,
            steps: 0,
            outbox: Vec::new(),
        };
        if call.field(b"layout").as_deref() != Some(LAYOUT)
            || call.field(b"wide").is_none()
            || call.field(b"live").as_deref() != Some(b"1")
        {
            return None;
        }
        let number = |v: Option<Vec<u8>>| -> Native<Option<u64>> {
            match v {
                None => Some(None),
                Some(text) => decimal(&text).map(Some),
            }
        };
        call.keep = number(call.field(b"keep"))?.filter(|&k| k > 0)?;
        let prune = number(call.field(b"prune"))??;
        call.wlen = number(call.field(b"wlen"))?.unwrap_or(0);
        call.qlen = number(call.field(b"qlen"))?.unwrap_or(0);
        call.wnext = number(call.field(b"wnext"))?;
        if now >= prune || (call.wlen > 0 && now >= call.wnext.unwrap_or(0)) {
            return None; // (settle() has records to prune or waiters to drop)
        }
        // read_count(): an integer within +-MAX_INT as the scripts write one.
        call.count = count_text(count)
            .and_then(canonical)
            .filter(|c| c.abs() <= MAX_INT)?;
        let name = join(&[b"s:", session]);
        let raw = call.field(&name);
        call.session = SessionRecord::parse(name, raw)?;
        call.promote()?;
        Some(call)
    }

    /// `field(name)`: a field of records, read once (None: absent).
    unsafe fn field(&mut self, name: &[u8]) -> Option<Vec<u8>> {
        self.fields.get(self.ctx, name)
    }

    /// `put(name, value)`.
    fn put(&mut self, name: &[u8], value: Option<Vec<u8>>) {
        self.fields.put(name, value);
    }

    unsafe fn record(&mut self, id: &[u8]) -> Native<Option<Record>> {
        let raw = self.field(&join(&[b"r:", id]));
        parse(raw.as_deref())
    }

    fn set(&mut self, which: usize, value: u64) {
        match which {
            KEEP => self.keep = value,
            WLEN => self.wlen = value,
            QLEN => self.qlen = value,
            _ => self.wnext = Some(value),
        }
        self.dirty[which] = true;
    }

    /// `add(delta)` (the count exists: load() declined otherwise).
    fn add(&mut self, delta: i64) -> Native<()> {
        self.count = self.count.checked_add(delta)?;
        self.taken = self.taken.checked_sub(delta)?;
        (self.count.abs() <= MAX_INT).then_some(())
    }

    /// `mark(seq, mark)`: the call marked in its session record, a renewal registered.
    unsafe fn mark(&mut self, seq: &[u8], mark: &[u8]) -> Native<()> {
        if let Some(renewed) = self.session.put(self.low, seq, mark, self.now)? {
            let name = self.session.name.clone();
            self.applied.set(&name, Some(renewed as f64));
            self.need = self.need.max(renewed);
        }
        Some(())
    }

    /// `session_mark(seq)` of a call that is not stale: its mark, if any.
    fn marked(&self, seq: &[u8]) -> Native<Option<Vec<u8>>> {
        self.session.mark(seq, hex(seq)?)
    }

    fn stale(&self, seq: &[u8]) -> Native<bool> {
        Some(self.session.stale(hex(seq)?))
    }

    /// promote(): hand permits, in arrival order, to every waiter at the head that fits.
    unsafe fn promote(&mut self) -> Native<()> {
        while self.qlen > 0 {
            let head = self.queue.first(self.ctx)?; // (none: qlen put to 0, the Lua)
            let (k, digits, channel) = match self.record(&head)? {
                Some(Record::Waiting { k, digits, channel }) => (k, digits, channel),
                _ => return None, // (an entry without a waiter's record: dropped by the Lua)
            };
            if k as i64 > self.count {
                return Some(());
            }
            if self.steps >= MAX_STEPS {
                return None; // (the next head woken without a grant: the Lua)
            }
            self.steps += 1;
            self.queue.set(&head, None);
            self.set(QLEN, self.qlen - 1);
            self.add(-(k as i64))?;
            self.put(&join(&[b"r:", &head]), Some(join(&[b"g|", &digits])));
            self.outbox.push((channel, head));
        }
        Some(())
    }

    /// `queued(id, lease, position)`: the waiter lease started, the QUEUED reply.
    unsafe fn queued(&mut self, id: &[u8], lease: u64, position: u64) -> Native<Reply> {
        let deadline = self.now + lease;
        let added = self.waiters.score(self.ctx, id).is_none();
        self.waiters.set(id, Some(deadline as f64));
        if self.wlen == 0 || self.wnext.is_none_or(|next| deadline < next) {
            self.set(WNEXT, deadline);
        }
        if added {
            self.set(WLEN, self.wlen + 1);
        }
        self.need = self.need.max(deadline);
        Some(Reply::Array(vec![
            bulk(b"QUEUED"),
            Reply::Int(position as i64),
            Reply::Int((lease / 3).max(1) as i64),
        ]))
    }

    /// `HINCRBY meta seq 1`.
    unsafe fn next_ticket(&mut self) -> Native<i64> {
        let ticket = match self.ticket {
            Some(t) => t,
            None => {
                let n = Str::new(self.ctx, b"seq");
                let mut value: *mut RedisModuleString = ptr::null_mut();
                api!(RedisModule_HashGet)(
                    self.keys.0[4],
                    raw::REDISMODULE_HASH_NONE as c_int,
                    n.ptr,
                    &mut value as *mut _,
                    ptr::null::<c_char>(),
                );
                let read = if value.is_null() {
                    Some(0)
                } else {
                    canonical(api::bytes(value))
                };
                api::free(self.ctx, value);
                read?
            }
        };
        let next = ticket.checked_add(1).filter(|t| t.abs() <= MAX_INT)?;
        self.ticket = Some(next);
        Some(next)
    }

    /// `check_in(id, lease, seq)`: a grant collected, or (no record) the answer of a call
    /// that took permits. (A waiter's renewal: declined.)
    unsafe fn check_in(&mut self, id: &[u8], seq: &[u8]) -> Native<Reply> {
        match self.record(id)? {
            Some(Record::Granted { k }) => {
                let removed = self.waiters.score(self.ctx, id).is_some();
                self.waiters.set(id, None);
                self.set(WLEN, self.wlen.saturating_sub(u64::from(removed)));
                self.put(&join(&[b"r:", id]), None);
                self.mark(seq, &join(&[b"G", &decimal_text(k)]))?;
            }
            Some(Record::Waiting { .. }) => return None,
            None => {
                let taken = !self.stale(seq)? && self.marked(seq)?.is_some_and(|m| m[0] == b'G');
                if !taken {
                    return Some(Reply::Array(vec![bulk(b"GONE")]));
                }
            }
        }
        Some(Reply::Array(vec![bulk(b"GRANTED")]))
    }

    /// `acquire_op(id, digits, mode, lease, channel, seq)`.
    unsafe fn acquire(&mut self, r: &Request) -> Native<Reply> {
        let lease = decimal(r.waiter_lease)?;
        if self.stale(r.seq)? {
            return Some(Reply::Array(vec![bulk(b"GONE")]));
        }
        if let Some(m) = self.marked(r.seq)? {
            let answer: &[u8] = if m.first() == Some(&b'G') {
                b"GRANTED"
            } else {
                b"GONE"
            };
            return Some(Reply::Array(vec![bulk(answer)]));
        }
        if self.record(r.id)?.is_some() {
            return self.check_in(r.id, r.seq);
        }
        let k = decimal(r.k)? as i64;
        let (count, position) = (self.count, self.qlen);
        if position == 0 && count >= k {
            self.add(-k)?;
            self.mark(r.seq, &join(&[b"G", r.k]))?;
            return Some(Reply::Array(vec![bulk(b"GRANTED")]));
        }
        if r.mode != b"wait" {
            return Some(Reply::Array(vec![
                bulk(b"BUSY"),
                Reply::Int(count),
                Reply::Int(position as i64),
            ]));
        }
        let reply = self.queued(r.id, lease, position)?;
        let ticket = self.next_ticket()?;
        self.queue.set(r.id, Some(ticket as f64));
        self.set(QLEN, position + 1);
        let record = join(&[
            b"w|",
            &decimal_text(k as u64),
            b"|",
            &decimal_text(self.now),
            b"|",
            r.channel,
        ]);
        self.put(&join(&[b"r:", r.id]), Some(record));
        Some(reply)
    }

    /// `add_op(digits, seq)` (the count read: the queue is not empty, or a batch).
    unsafe fn add_op(&mut self, digits: &[u8], seq: &[u8]) -> Native<Reply> {
        let delta = canonical(digits)?;
        if self.stale(seq)? || self.marked(seq)?.is_some() {
            return Some(Reply::Array(vec![
                bulk(b"REPEATED"),
                Reply::Int(self.count),
            ]));
        }
        if delta.abs() > MAX_INT || (self.count + delta).abs() > MAX_INT {
            return None; // (RANGE: the Lua)
        }
        self.add(delta)?;
        self.mark(seq, b"A")?;
        self.promote()?;
        Some(Reply::Array(vec![bulk(b"ADDED"), Reply::Int(self.count)]))
    }

    /// keep() while live, then save(): the count, the fields, the sorted sets, the ticket,
    /// the reply, the wake-ups. None (nothing written): the call leaves the semaphore idle
    /// (keep() then gives the keys their TTL: the Lua).
    unsafe fn save(mut self, reply: &Reply) -> Native<()> {
        if self.wlen == 0 && self.qlen == 0 {
            return None;
        }
        if self.need + KEEP_MARGIN_MS > self.keep {
            self.set(KEEP, self.need + KEEP_IDLE_MS);
        }
        let session = if self.session.dirty {
            Some(self.session.text()?)
        } else {
            None
        };
        let ctx = self.ctx;
        let [count, _, _, _, meta, _] = self.keys.0;
        let argv = self.argv;
        let mut effects = Effects::new(ctx);
        let replicating = effects.replicating();

        // keep(): INCRBY count -taken.
        if self.taken != 0 {
            let v = Str::new(ctx, &signed(self.count));
            api!(RedisModule_StringSet)(count, v.ptr);
            effects.notify(raw::REDISMODULE_NOTIFY_STRING, c"incrby", argv[1]);
            if replicating {
                let by = Str::new(ctx, &signed(-self.taken));
                effects.replicate(c"INCRBY", &[argv[1], by.ptr]);
            }
        }

        // The records hash.
        let mut writes: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        let values = [self.keep, self.wlen, self.wnext.unwrap_or(0), self.qlen];
        for (i, name) in [&b"keep"[..], b"wlen", b"wnext", b"qlen"]
            .iter()
            .enumerate()
        {
            if self.dirty[i] {
                writes.push((name.to_vec(), Some(decimal_text(values[i]))));
            }
        }
        writes.extend(self.fields.changed());
        if let Some(text) = session {
            writes.push((self.session.name.clone(), text));
        }
        self.fields.write(ctx, argv[4], &writes, &mut effects);

        // HINCRBY meta seq 1 (once per ticket: the last value written).
        if let Some(ticket) = self.ticket {
            let (n, v) = (Str::new(ctx, b"seq"), Str::new(ctx, &signed(ticket)));
            api!(RedisModule_HashSet)(
                meta,
                raw::REDISMODULE_HASH_NONE as c_int,
                n.ptr,
                v.ptr,
                ptr::null::<c_char>(),
            );
            effects.notify(raw::REDISMODULE_NOTIFY_HASH, c"hincrby", argv[5]);
            if replicating {
                effects.replicate(c"HSET", &[argv[5], n.ptr, v.ptr]);
            }
        }

        self.queue.write(ctx, argv[2], &mut effects);
        self.waiters.write(ctx, argv[3], &mut effects);
        self.applied.write(ctx, argv[6], &mut effects);

        send(ctx, reply);
        for (channel, message) in &self.outbox {
            publish(ctx, channel, message, replicating);
        }
        Some(())
    }
}

/// An integer as `%d`.
fn signed(n: i64) -> Vec<u8> {
    let text = decimal_text(n.unsigned_abs());
    if n < 0 { join(&[b"-", &text]) } else { text }
}

/// An acquire's arguments, as permit_acquire and permit_batch give them.
#[derive(Debug)]
struct Request<'r> {
    id: &'r [u8],
    k: &'r [u8],
    mode: &'r [u8],
    waiter_lease: &'r [u8],
    channel: &'r [u8],
    seq: &'r [u8],
}

/// permit_acquire, ARGV (argv[7..]): 1 id, 2 permits k, 3 mode, 4 waiter lease ms,
/// 5 channel, 6 seq, 7 session id, 8 low mark.
pub(crate) unsafe fn acquire(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> bool {
    if argv.len() != 15 {
        return false;
    }
    let a = |i: usize| api::bytes(argv[6 + i]);
    let request = Request {
        id: a(1),
        k: a(2),
        mode: a(3),
        waiter_lease: a(4),
        channel: a(5),
        seq: a(6),
    };
    (|| {
        let mut call = Call::load(ctx, argv, a(7), a(8))?;
        let reply = call.acquire(&request)?;
        call.save(&reply)
    })()
    .is_some()
}

/// permit_add, ARGV (argv[7..]): 1 request id, 2 delta, 3 seq, 4 session id, 5 low mark.
/// (With nobody queued the Lua reads the count lazily: declined.)
pub(crate) unsafe fn add(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> bool {
    if argv.len() != 12 {
        return false;
    }
    let a = |i: usize| api::bytes(argv[6 + i]);
    (|| {
        let mut call = Call::load(ctx, argv, a(4), a(5))?;
        if call.qlen == 0 {
            return None;
        }
        let reply = call.add_op(a(2), a(3))?;
        call.save(&reply)
    })()
    .is_some()
}

/// permit_poll, ARGV (argv[7..]): 1 request id, 2 waiter lease ms, 3 seq, 4 session id,
/// 5 low mark.
pub(crate) unsafe fn poll(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> bool {
    if argv.len() != 12 {
        return false;
    }
    let a = |i: usize| api::bytes(argv[6 + i]);
    (|| {
        decimal(a(2))?;
        let mut call = Call::load(ctx, argv, a(4), a(5))?;
        let reply = call.check_in(a(1), a(3))?;
        call.save(&reply)
    })()
    .is_some()
}

/// One operation of a batch.
#[derive(Debug)]
enum Op<'r> {
    Acquire(Request<'r>),
    Add { delta: &'r [u8], seq: &'r [u8] },
    CheckIn { id: &'r [u8], seq: &'r [u8] },
}

/// permit_batch, ARGV (argv[7..]): 1 channel, 2 session id, 3 low mark, then the
/// operations: "a", id, k, mode, waiter lease, seq; "m", id, delta, seq; "p", id, waiter
/// lease, seq. (A withdrawal "w": declined.)
pub(crate) unsafe fn batch(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> bool {
    if argv.len() < 10 {
        return false;
    }
    let a = |i: usize| api::bytes(argv[6 + i]);
    let n = argv.len() - 7; // (ARGV runs from 1 to n: argv[7..])
    (|| {
        let channel = a(1);
        let mut ops = Vec::new();
        let mut i = 4;
        while i <= n {
            match a(i) {
                b"a" if i + 5 <= n => {
                    ops.push(Op::Acquire(Request {
                        id: a(i + 1),
                        k: a(i + 2),
                        mode: a(i + 3),
                        waiter_lease: a(i + 4),
                        channel,
                        seq: a(i + 5),
                    }));
                    i += 6;
                }
                b"m" if i + 3 <= n => {
                    ops.push(Op::Add {
                        delta: a(i + 2),
                        seq: a(i + 3),
                    });
                    i += 4;
                }
                b"p" if i + 3 <= n => {
                    decimal(a(i + 2))?;
                    ops.push(Op::CheckIn {
                        id: a(i + 1),
                        seq: a(i + 3),
                    });
                    i += 4;
                }
                _ => return None, // (a withdrawal, or an error reply: the Lua's)
            }
        }
        let mut call = Call::load(ctx, argv, a(2), a(3))?;
        let mut replies = Vec::with_capacity(ops.len());
        for op in &ops {
            replies.push(match op {
                Op::Acquire(request) => call.acquire(request)?,
                Op::Add { delta, seq } => call.add_op(delta, seq)?,
                Op::CheckIn { id, seq } => call.check_in(id, seq)?,
            });
        }
        call.save(&Reply::Array(vec![Reply::Array(replies)]))
    })()
    .is_some()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn records_are_read_only_when_written_plainly() {
        assert_eq!(
            parse(Some(b"w|3|1700|ch|x")),
            Some(Some(Record::Waiting {
                k: 3,
                digits: b"3".to_vec(),
                channel: b"ch|x".to_vec()
            }))
        );
        assert_eq!(
            parse(Some(b"w|03|1700|")),
            Some(Some(Record::Waiting {
                k: 3,
                digits: b"03".to_vec(),
                channel: Vec::new()
            }))
        );
        assert_eq!(parse(Some(b"g|5")), Some(Some(Record::Granted { k: 5 })));
        assert_eq!(parse(None), Some(None));
        for odd in [
            &b"g|5|1"[..],
            b"g|",
            b"w|1|x|c",
            b"w|1|2",
            b"x|1",
            b"",
            b"w|-1|2|c",
        ] {
            assert_eq!(parse(Some(odd)), None, "{}", String::from_utf8_lossy(odd));
        }
    }

    #[test]
    fn a_signed_integer_is_written_as_percent_d() {
        assert_eq!(signed(0), b"0");
        assert_eq!(signed(42), b"42");
        assert_eq!(signed(-42), b"-42");
    }
}
