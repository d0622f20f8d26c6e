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

use std::ffi::{c_char, c_int};
use std::ptr;

use super::{HASH_DELETE, LAYOUT, MAX_BIT, PRUNE_LAG_MS};
use crate::api::{
    self, Keys, RedisModuleCtx, RedisModuleKey, RedisModuleString, Str, api, is_or_empty, key_type,
    raw,
};
use crate::clock;
use crate::record::{SESSION_MS, SESSION_RENEW_MS, Text, decimal, fmt, hex};
use crate::replicate::Effects;

/// lease/layout.lua: MAX_UNITS, WORK_BUDGET.
const MAX_UNITS: u64 = 4096;
const WORK_BUDGET: u64 = 4096;
/// The largest slot bitmap copied (a capacity of half a million units).
const MAX_BITMAP: usize = 1 << 16;
/// The largest integer a Lua number holds exactly.
const EXACT: f64 = 9_007_199_254_740_992.0;

/// Declined: the Lua serves the call.
type Native<T> = Option<T>;

/// A reply, built while the call is worked out and sent once it is written.
#[derive(Debug)]
enum Reply {
    Bulk(Vec<u8>),
    Int(i64),
    Array(Vec<Reply>),
}

fn bulk(b: &[u8]) -> Reply {
    Reply::Bulk(b.to_vec())
}

fn int(n: u64) -> Reply {
    Reply::Int(n as i64)
}

unsafe fn send(ctx: *mut RedisModuleCtx, reply: &Reply) {
    match reply {
        Reply::Bulk(b) => api::reply_bulk(ctx, b),
        Reply::Int(n) => api::reply_integer(ctx, *n),
        Reply::Array(items) => {
            api::reply_array(ctx, items.len());
            for item in items {
                send(ctx, item);
            }
        }
    }
}

fn decimal_text(n: u64) -> Vec<u8> {
    let mut b = [0u8; 20];
    fmt(&mut b, n).to_vec()
}

fn join(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

/// A sorted set as the call sees it: the key, and the call's changes over it (a member's
/// new score, or None: removed), written at the end.
struct Zset {
    key: *mut RedisModuleKey,
    changes: Vec<(Vec<u8>, Option<f64>)>,
}

impl Zset {
    unsafe fn stored_score(&self, ctx: *mut RedisModuleCtx, member: &[u8]) -> Option<f64> {
        if key_type(self.key) == raw::REDISMODULE_KEYTYPE_EMPTY {
            return None;
        }
        let m = Str::new(ctx, member);
        let mut score = 0f64;
        (api!(RedisModule_ZsetScore)(self.key, m.ptr, &mut score) == api::OK).then_some(score)
    }

    /// `ZSCORE`.
    unsafe fn score(&self, ctx: *mut RedisModuleCtx, member: &[u8]) -> Option<f64> {
        match self.changes.iter().find(|(m, _)| m == member) {
            Some((_, score)) => *score,
            None => self.stored_score(ctx, member),
        }
    }

    /// `ZADD` (a score) or `ZREM` (None); answers whether the member was absent before.
    unsafe fn set(&mut self, ctx: *mut RedisModuleCtx, member: &[u8], score: Option<f64>) -> bool {
        let absent = self.score(ctx, member).is_none();
        match self.changes.iter_mut().find(|(m, _)| m == member) {
            Some(change) => change.1 = score,
            None => self.changes.push((member.to_vec(), score)),
        }
        absent
    }

    /// `ZCARD`.
    unsafe fn card(&self, ctx: *mut RedisModuleCtx) -> u64 {
        let mut n = if key_type(self.key) == raw::REDISMODULE_KEYTYPE_EMPTY {
            0
        } else {
            api!(RedisModule_ValueLength)(self.key) as u64
        };
        for (member, score) in &self.changes {
            match (self.stored_score(ctx, member).is_some(), score.is_some()) {
                (false, true) => n += 1,
                (true, false) => n -= 1,
                _ => {}
            }
        }
        n
    }

    /// The first member (lowest score, then lowest member), as `ZRANGE key 0 0` would answer
    /// after the changes.
    unsafe fn first(&self, ctx: *mut RedisModuleCtx) -> Option<Vec<u8>> {
        let mut best: Option<(f64, Vec<u8>)> = None;
        if key_type(self.key) != raw::REDISMODULE_KEYTYPE_EMPTY
            && api!(RedisModule_ZsetFirstInScoreRange)(
                self.key,
                f64::NEG_INFINITY,
                f64::INFINITY,
                0,
                0,
            ) == api::OK
        {
            while api!(RedisModule_ZsetRangeEndReached)(self.key) == 0 {
                let mut score = 0f64;
                let element = api!(RedisModule_ZsetRangeCurrentElement)(self.key, &mut score);
                let member = api::bytes(element).to_vec();
                api::free(ctx, element);
                if !self.changes.iter().any(|(m, _)| *m == member) {
                    best = Some((score, member));
                    break;
                }
                api!(RedisModule_ZsetRangeNext)(self.key);
            }
            api!(RedisModule_ZsetRangeStop)(self.key);
        }
        for (member, score) in &self.changes {
            if let Some(score) = *score {
                let before = best
                    .as_ref()
                    .is_none_or(|(s, m)| score < *s || (score == *s && member < m));
                if before {
                    best = Some((score, member.clone()));
                }
            }
        }
        best.map(|(_, member)| member)
    }

    /// Write the changes; replicated as ZADD / ZREM.
    unsafe fn write(
        &self,
        ctx: *mut RedisModuleCtx,
        name: *mut RedisModuleString,
        effects: &mut Effects,
    ) {
        let (mut added, mut removed) = (false, false);
        for (member, score) in &self.changes {
            let m = Str::new(ctx, member);
            match score {
                Some(score) => {
                    let mut flags = 0;
                    api!(RedisModule_ZsetAdd)(self.key, *score, m.ptr, &mut flags);
                    added = true;
                    if effects.replicating() {
                        let s = Str::new(ctx, &decimal_score(*score));
                        effects.replicate(c"ZADD", &[name, s.ptr, m.ptr]);
                    }
                }
                None => {
                    let mut deleted = 0;
                    if key_type(self.key) != raw::REDISMODULE_KEYTYPE_EMPTY {
                        api!(RedisModule_ZsetRem)(self.key, m.ptr, &mut deleted);
                    }
                    removed |= deleted != 0;
                    if deleted != 0 && effects.replicating() {
                        effects.replicate(c"ZREM", &[name, m.ptr]);
                    }
                }
            }
        }
        if added {
            effects.notify(raw::REDISMODULE_NOTIFY_ZSET, c"zadd", name);
        }
        if removed {
            effects.notify(raw::REDISMODULE_NOTIFY_ZSET, c"zrem", name);
        }
    }
}

/// A score as `%d` (every score written here is an integer).
fn decimal_score(score: f64) -> Vec<u8> {
    if score < 0.0 {
        join(&[b"-", &decimal_text((-score) as u64)])
    } else {
        decimal_text(score as u64)
    }
}

/// An integer score as the Lua reads it (`tonumber(ZSCORE ...)`), or None if not a plain one.
fn integral(score: f64) -> Native<i64> {
    (score.fract() == 0.0 && score.abs() <= EXACT).then_some(score as i64)
}

/// The caller's session record as common.lua's session functions keep it during a call.
#[derive(Debug)]
struct Session {
    /// The field, `s:<session>`.
    name: Vec<u8>,
    /// The record's text as it stands (S[S.sess]).
    raw: Option<Vec<u8>>,
    /// Low mark, expiry (hex text), highest number marked, where the marks start (0: none;
    /// 1-based as in Lua).
    sl: u64,
    sx: Vec<u8>,
    sm: u64,
    sp: usize,
    /// The marks once more than one is kept (S.smarks, in S.sorder's order).
    marks: Option<Vec<(Vec<u8>, Vec<u8>)>>,
    dirty: bool,
}

impl Session {
    /// `session()`: None for a record the Lua would read otherwise than plainly.
    fn parse(name: Vec<u8>, raw: Option<Vec<u8>>) -> Native<Session> {
        let mut s = Session {
            name,
            raw,
            sl: 0,
            sx: b"0".to_vec(),
            sm: 0,
            sp: 0,
            marks: None,
            dirty: false,
        };
        if let Some(raw) = &s.raw {
            let mut parts = raw.splitn(4, |&c| c == b'|');
            let (low, expiry, top, rest) =
                (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
            let (low, _, top) = (hex(low)?, hex(expiry)?, hex(top)?);
            s.sl = low;
            s.sx = expiry.to_vec();
            s.sm = top;
            s.sp = raw.len() - rest.len() + 1;
        }
        Some(s)
    }

    /// The marks of the record's text from `sp` on, ",seq=mark" each (None: not plainly so).
    fn marks_of(text: &[u8]) -> Native<Vec<(Vec<u8>, Vec<u8>)>> {
        let mut marks: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        if text.is_empty() {
            return Some(marks);
        }
        if text[0] != b',' {
            return None;
        }
        for item in text[1..].split(|&c| c == b',') {
            let at = item.iter().position(|&c| c == b'=')?;
            let (seq, mark) = (&item[..at], &item[at + 1..]);
            hex(seq)?;
            if mark.is_empty() || mark.contains(&b'=') {
                return None;
            }
            match marks.iter_mut().find(|(s, _)| s == seq) {
                Some(m) => m.1 = mark.to_vec(),
                None => marks.push((seq.to_vec(), mark.to_vec())),
            }
        }
        Some(marks)
    }

    /// `session_stale(seq)`.
    fn stale(&self, seq: u64) -> bool {
        seq < self.sl
    }

    /// `session_mark(seq)`: the mark of the call `seq_text` (None: declined; Some(None):
    /// unmarked).
    fn mark(&self, seq_text: &[u8], seq: u64) -> Native<Option<Vec<u8>>> {
        if let Some(marks) = &self.marks {
            return Some(
                marks
                    .iter()
                    .find(|(s, _)| s == seq_text)
                    .map(|(_, m)| m.clone()),
            );
        }
        if self.sp == 0 || seq > self.sm {
            return Some(None);
        }
        let raw = self.raw.as_ref()?;
        let needle = join(&[b",", seq_text, b"="]);
        let from = self.sp - 1;
        let at = raw[from..].windows(needle.len()).position(|w| w == needle);
        Some(at.and_then(|at| {
            let rest = &raw[from + at + needle.len()..];
            let end = rest.iter().position(|&c| c == b',').unwrap_or(rest.len());
            (end > 0).then(|| rest[..end].to_vec())
        }))
    }

    /// `session_put(low, seq, mark)`: answers the renewed expiry, if the record was renewed.
    fn put(&mut self, low: u64, seq_text: &[u8], mark: &[u8], now: u64) -> Native<Option<u64>> {
        let seq = hex(seq_text)?;
        let low = low.max(self.sl);
        let mut renewed = None;
        if hex(&self.sx)? + SESSION_RENEW_MS <= now + SESSION_MS {
            let at = now + SESSION_MS;
            renewed = Some(at);
            self.sx = Text::new().hex(at)?.as_bytes().to_vec();
        }
        self.sl = low;
        self.dirty = true;
        if self.marks.is_none() && self.sm < low {
            let value = join(&[
                Text::new().hex(low)?.as_bytes(),
                b"|",
                &self.sx,
                b"|",
                seq_text,
                b"|,",
                seq_text,
                b"=",
                mark,
            ]);
            self.sp = value.len() - seq_text.len() - mark.len() - 1;
            self.sm = seq;
            self.raw = Some(value);
            return Some(renewed);
        }
        if self.marks.is_none() {
            // (No record: the Lua fails here, on string.sub of nothing.)
            let raw = self.raw.as_ref()?;
            self.marks = Some(Session::marks_of(&raw[self.sp.checked_sub(1)?..])?);
        }
        let marks = self.marks.as_mut()?;
        match marks.iter_mut().find(|(s, _)| s == seq_text) {
            Some(m) => m.1 = mark.to_vec(),
            None => marks.push((seq_text.to_vec(), mark.to_vec())),
        }
        Some(renewed)
    }

    /// The record to write back: `session_text()` when marks are kept in a table.
    fn text(&self) -> Native<Option<Vec<u8>>> {
        let Some(marks) = &self.marks else {
            return Some(self.raw.clone());
        };
        let (mut kept, mut top) = (Vec::new(), 0);
        for (seq, mark) in marks {
            let number = hex(seq).unwrap_or(0);
            if number >= self.sl {
                kept.extend_from_slice(&join(&[b",", seq, b"=", mark]));
                top = top.max(number);
            }
        }
        let mut t = Vec::new();
        t.extend_from_slice(Text::new().hex(self.sl)?.as_bytes());
        t.push(b'|');
        t.extend_from_slice(&self.sx);
        t.push(b'|');
        t.extend_from_slice(Text::new().hex(top)?.as_bytes());
        t.push(b'|');
        t.extend_from_slice(&kept);
        Some(Some(t))
    }
}

/// A record of the state hash, as lease/layout.lua's parse() reads it (only plain ones).
#[derive(Debug)]
enum Record {
    /// "h|token|units|granted at|lease|slots|label": the slots and the label.
    Holder {
        k: u64,
        slots: Vec<u64>,
        label: Vec<u8>,
    },
    /// "w|units|since|lease|waiter lease|len(channel)|channel label".
    Waiter {
        k: u64,
        lease: u64,
        wl: u64,
        channel: Vec<u8>,
        label: Vec<u8>,
    },
}

/// Plain decimal digits (as `%d+` matches them) read as a count.
fn digits(b: &[u8]) -> Native<u64> {
    decimal(b)
}

/// Slots as runs, "0-2,7": only runs of plain numbers.
fn slots_of(text: &[u8]) -> Native<Vec<u64>> {
    if let Some(one) = decimal(text) {
        return Some(vec![one]);
    }
    let mut slots = Vec::new();
    for run in text.split(|&c| c == b',') {
        let mut ends = run.splitn(2, |&c| c == b'-');
        let first = decimal(ends.next()?)?;
        let last = match ends.next() {
            Some(last) => decimal(last)?,
            None => first,
        };
        if last < first || last - first > MAX_UNITS {
            return None;
        }
        slots.extend(first..=last);
    }
    Some(slots)
}

/// parse(raw): Some(None) for no record; None (declined) for one read otherwise than plainly.
fn parse(raw: Option<&[u8]>) -> Native<Option<Record>> {
    let Some(raw) = raw else {
        return Some(None);
    };
    match raw.first() {
        Some(b'h') => {
            let mut p = raw.splitn(7, |&c| c == b'|');
            let (_, t, k, a, lease, slots, label) = (
                p.next()?,
                p.next()?,
                p.next()?,
                p.next()?,
                p.next()?,
                p.next()?,
                p.next()?,
            );
            digits(t)?;
            digits(a)?;
            digits(lease)?;
            let (k, slots) = (digits(k)?, slots_of(slots)?);
            Some(Some(Record::Holder {
                k,
                slots,
                label: label.to_vec(),
            }))
        }
        Some(b'w') => {
            let mut p = raw.splitn(7, |&c| c == b'|');
            let (_, k, since, lease, wl, clen, rest) = (
                p.next()?,
                p.next()?,
                p.next()?,
                p.next()?,
                p.next()?,
                p.next()?,
                p.next()?,
            );
            digits(since)?;
            let (k, lease, wl, clen) = (
                digits(k)?,
                digits(lease)?,
                digits(wl)?,
                digits(clen)? as usize,
            );
            if clen > rest.len() {
                return None;
            }
            Some(Some(Record::Waiter {
                k,
                lease,
                wl,
                channel: rest[..clen].to_vec(),
                label: rest[clen..].to_vec(),
            }))
        }
        _ => None,
    }
}

/// The state's counters (lease/state.lua's load()), and which of them the call changed.
#[derive(Debug, Default)]
struct Counters {
    cap: u64,
    used: u64,
    qlen: u64,
    seq: u64,
    nh: u64,
    nt: u64,
    next: u64,
    tnext: u64,
    /// The last token (None: not a count; a grant then declines).
    tok: Option<u64>,
}

const COUNTER_NAMES: [&[u8]; 8] = [
    b"used", b"qlen", b"seq", b"nh", b"nt", b"next", b"tnext", b"tok",
];
const USED: usize = 0;
const QLEN: usize = 1;
const SEQ: usize = 2;
const NH: usize = 3;
const NT: usize = 4;
const NEXT: usize = 5;
const TNEXT: usize = 6;
const TOK: usize = 7;

/// One call, worked out in memory (see the top of this file).
struct Call<'a> {
    ctx: *mut RedisModuleCtx,
    argv: &'a [*mut RedisModuleString],
    keys: Keys<4>,
    leases: Zset,
    queue: Zset,
    /// The slot bitmap: its copy, its length as stored, the bits set or cleared (in order).
    bits: Vec<u8>,
    stored_bits: usize,
    slots_stored: bool,
    touched: Vec<u64>,
    /// Fields read (None: absent) and whether the call changed them.
    fields: Vec<(Vec<u8>, Option<Vec<u8>>, bool)>,
    c: Counters,
    dirty: [bool; 8],
    now: u64,
    now_us: u64,
    low: u64,
    session: Session,
    budget: u64,
    checked: bool,
    defer_idle: bool,
    /// The caller's wake channel; the grants made to waiters on it; the wake-ups to publish.
    mine: Option<Vec<u8>>,
    handed: Vec<Vec<u8>>,
    outbox: Vec<(Vec<u8>, Vec<u8>)>,
}

impl<'a> Call<'a> {
    /// begin() and load() of the state, then settle() where it has nothing to do but
    /// promote (no lease ended, no session record to prune). None: declined.
    unsafe fn load(
        ctx: *mut RedisModuleCtx,
        argv: &'a [*mut RedisModuleString],
        session: &[u8],
        low: &[u8],
        mine: Option<&[u8]>,
    ) -> Native<Call<'a>> {
        let keys = Keys::<4>::open(ctx, &argv[1..5]);
        let [leases, queue, state, slots] = keys.0;
        let zset = raw::REDISMODULE_KEYTYPE_ZSET;
        if key_type(state) != raw::REDISMODULE_KEYTYPE_HASH
            || !is_or_empty(key_type(leases), zset)
            || !is_or_empty(key_type(queue), zset)
            || !is_or_empty(key_type(slots), raw::REDISMODULE_KEYTYPE_STRING)
        {
            return None;
        }
        let (now, now_us) = clock::now(ctx)?;
        let mut call = Call {
            ctx,
            argv,
            leases: Zset {
                key: leases,
                changes: Vec::new(),
            },
            queue: Zset {
                key: queue,
                changes: Vec::new(),
            },
            keys,
            bits: Vec::new(),
            stored_bits: 0,
            slots_stored: key_type(slots) != raw::REDISMODULE_KEYTYPE_EMPTY,
            touched: Vec::new(),
            fields: Vec::new(),
            c: Counters::default(),
            dirty: [false; 8],
            now,
            now_us,
            low: hex(low)?,
            session: Session::parse(Vec::new(), None)?,
            budget: WORK_BUDGET,
            checked: false,
            defer_idle: false,
            mine: mine.map(<[u8]>::to_vec),
            handed: Vec::new(),
            outbox: Vec::new(),
        };
        if call.field(b"layout")? != LAYOUT {
            return None; // (another layout, or none: adopted or refused by the Lua)
        }
        let count = |call: &mut Call, name: &[u8]| -> Native<u64> {
            match call.field_opt(name) {
                None => Some(0),
                Some(text) => decimal(&text),
            }
        };
        call.c.cap = decimal(&call.field(b"cap")?)?;
        call.field(b"nh")?;
        call.c.used = count(&mut call, b"used")?;
        call.c.qlen = count(&mut call, b"qlen")?;
        call.c.seq = count(&mut call, b"seq")?;
        call.c.nh = count(&mut call, b"nh")?;
        call.c.nt = count(&mut call, b"nt")?;
        call.c.next = count(&mut call, b"next")?;
        call.c.tnext = count(&mut call, b"tnext")?;
        call.c.tok = count(&mut call, b"tok");
        let idle = count(&mut call, b"idle")?;
        if idle != 0 || (call.c.used > 0) != (call.c.nh > 0) {
            return None; // (keep() persists, or repair() rebuilds)
        }
        if (call.c.tnext != 0 && call.c.tnext + PRUNE_LAG_MS <= now) || call.c.next <= now {
            return None; // (settle has records to prune or leases to look at)
        }
        let name = join(&[b"s:", session]);
        let raw = call.field_opt(&name);
        call.session = Session::parse(name, raw)?;
        if key_type(slots) != raw::REDISMODULE_KEYTYPE_EMPTY {
            let mut len = 0usize;
            let p = api!(RedisModule_StringDMA)(slots, &mut len, raw::REDISMODULE_READ as c_int);
            if len > MAX_BITMAP {
                return None;
            }
            if !p.is_null() {
                call.bits = std::slice::from_raw_parts(p.cast::<u8>(), len).to_vec();
            }
            call.stored_bits = len;
        }
        // settle(): promote_left().
        if call.c.used < call.c.cap {
            call.promote()?;
        }
        Some(call)
    }

    /// A field of the state hash, read once (None: absent).
    unsafe fn field_opt(&mut self, name: &[u8]) -> Option<Vec<u8>> {
        if let Some((_, value, _)) = self.fields.iter().find(|(n, _, _)| n == name) {
            return value.clone();
        }
        let n = Str::new(self.ctx, name);
        let mut value: *mut RedisModuleString = ptr::null_mut();
        api!(RedisModule_HashGet)(
            self.keys.0[2],
            raw::REDISMODULE_HASH_NONE as c_int,
            n.ptr,
            &mut value as *mut _,
            ptr::null::<c_char>(),
        );
        let read = (!value.is_null()).then(|| api::bytes(value).to_vec());
        api::free(self.ctx, value);
        self.fields.push((name.to_vec(), read.clone(), false));
        read
    }

    /// A field that must be there (None: absent, declined).
    unsafe fn field(&mut self, name: &[u8]) -> Native<Vec<u8>> {
        self.field_opt(name)
    }

    fn put(&mut self, name: &[u8], value: Option<Vec<u8>>) {
        match self.fields.iter_mut().find(|(n, _, _)| n == name) {
            Some(f) => {
                f.1 = value;
                f.2 = true;
            }
            None => self.fields.push((name.to_vec(), value, true)),
        }
    }

    fn set(&mut self, counter: usize, value: u64) {
        match counter {
            USED => self.c.used = value,
            QLEN => self.c.qlen = value,
            SEQ => self.c.seq = value,
            NH => self.c.nh = value,
            NT => self.c.nt = value,
            NEXT => self.c.next = value,
            TNEXT => self.c.tnext = value,
            _ => self.c.tok = Some(value),
        }
        self.dirty[counter] = true;
    }

    unsafe fn record(&mut self, id: &[u8]) -> Native<Option<Record>> {
        let raw = self.field_opt(&join(&[b"r:", id]));
        parse(raw.as_deref())
    }

    /// label_add(label, delta).
    unsafe fn label_add(&mut self, label: &[u8], delta: i64) -> Native<()> {
        if label.is_empty() {
            return Some(());
        }
        let name = join(&[b"label:", label]);
        let n = match self.field_opt(&name) {
            None => 0,
            Some(text) => decimal(&text)? as i64,
        } + delta;
        self.put(&name, (n > 0).then(|| decimal_text(n as u64)));
        Some(())
    }

    /// label_held(label).
    unsafe fn label_held(&mut self, label: &[u8]) -> Native<bool> {
        if label.is_empty() {
            return Some(false);
        }
        Some(match self.field_opt(&join(&[b"label:", label])) {
            None => false,
            Some(text) => decimal(&text)? > 0,
        })
    }

    /// `BITPOS slots 0` (past the end if every bit is set).
    fn first_clear(&self) -> u64 {
        for (i, &byte) in self.bits.iter().enumerate() {
            if byte != 0xff {
                return i as u64 * 8 + u64::from((!byte).leading_zeros());
            }
        }
        self.bits.len() as u64 * 8
    }

    /// `SETBIT slots bit on`, growing the copy as SETBIT grows the string.
    fn set_bit(&mut self, bit: u64, on: bool) -> Native<()> {
        if bit > MAX_BIT || bit / 8 >= MAX_BITMAP as u64 {
            return None;
        }
        let byte = (bit / 8) as usize;
        if self.bits.len() <= byte {
            self.bits.resize(byte + 1, 0);
        }
        let mask = 0x80u8 >> (bit % 8);
        if on {
            self.bits[byte] |= mask;
        } else {
            self.bits[byte] &= !mask;
        }
        self.touched.push(bit);
        Some(())
    }

    /// check(): the entries of leases and the bits agree with the counters (once per call).
    /// None: they disagree (repair(): declined).
    unsafe fn check(&mut self) -> Native<()> {
        if self.checked {
            return Some(());
        }
        self.checked = true;
        let bits: u64 = self.bits.iter().map(|b| u64::from(b.count_ones())).sum();
        (self.leases.card(self.ctx) == self.c.nh + self.c.qlen + self.c.nt && bits == self.c.used)
            .then_some(())
    }

    /// add_lease(id, ends).
    unsafe fn add_lease(&mut self, id: &[u8], ends: u64) {
        self.leases.set(self.ctx, id, Some(ends as f64));
        if self.c.next == 0 || ends < self.c.next {
            self.set(NEXT, ends);
        }
    }

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
    unsafe fn promote(&mut self) -> Native<()> {
        while self.c.qlen > 0 && self.budget > 0 {
            let head = self.queue.first(self.ctx)?; // (none: repair())
            match self.record(&head)? {
                None | Some(Record::Holder { .. }) => {
                    self.queue.set(self.ctx, &head, None);
                    self.set(QLEN, self.c.qlen.saturating_sub(1));
                }
                Some(Record::Waiter {
                    k, channel, label, ..
                }) if k > self.c.cap => {
                    self.drop_waiter(&head, &label)?;
                    self.leases.set(self.ctx, &head, None);
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
                    self.queue.set(self.ctx, &head, None);
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
        self.queue.set(self.ctx, id, None);
        self.put(&join(&[b"r:", id]), None);
        self.set(QLEN, self.c.qlen.saturating_sub(1));
        self.label_add(label, -1)
    }

    /// mark(seq, letter): the call marked in its session record, a renewal registered.
    unsafe fn mark(&mut self, seq: &[u8], letter: &[u8]) -> Native<()> {
        if let Some(renewed) = self.session.put(self.low, seq, letter, self.now)? {
            let name = self.session.name.clone();
            if self.leases.set(self.ctx, &name, Some(-(renewed as f64))) {
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
        self.queue
            .set(self.ctx, r.id, Some((self.c.seq + 1) as f64));
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
            self.leases.set(self.ctx, id, None);
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

    /// needs_idle_ttl() (the idle deadline is 0 here: load() declines any other).
    fn idle(&self) -> bool {
        self.c.used == 0 && self.c.qlen == 0
    }

    /// {outcome, idle flag, grants handed back...}: released().
    fn released(&self, outcome: Reply, idle: bool) -> Reply {
        let mut reply = vec![outcome, int(u64::from(idle))];
        reply.extend(self.handed.iter().map(|m| bulk(m)));
        Reply::Array(reply)
    }

    /// keep() and save(): the fields, the sorted sets and the bitmap written, the wake-ups
    /// published, the reply sent. None (nothing written): keep() would give the idle TTL.
    unsafe fn save(self, reply: &Reply) -> Native<()> {
        if self.idle() && !self.defer_idle {
            return None;
        }
        let session = if self.session.dirty {
            Some(self.session.text()?)
        } else {
            None
        };
        let ctx = self.ctx;
        let [leases, queue, state, slots] = self.keys.0;
        let (l_name, q_name, h_name, s_name) =
            (self.argv[1], self.argv[2], self.argv[3], self.argv[4]);
        let mut effects = Effects::new(ctx);
        let replicating = effects.replicating();

        // The state hash: the counters changed, the fields put, the session record.
        let mut writes: Vec<(Vec<u8>, Option<Vec<u8>>)> = Vec::new();
        let values = [
            self.c.used,
            self.c.qlen,
            self.c.seq,
            self.c.nh,
            self.c.nt,
            self.c.next,
            self.c.tnext,
            self.c.tok.unwrap_or(0),
        ];
        for (i, name) in COUNTER_NAMES.iter().enumerate() {
            if self.dirty[i] {
                writes.push((name.to_vec(), Some(decimal_text(values[i]))));
            }
        }
        for (name, value, dirty) in &self.fields {
            if *dirty {
                writes.push((name.clone(), value.clone()));
            }
        }
        if let Some(text) = session {
            writes.push((self.session.name.clone(), text));
        }
        let (mut set_args, mut del_args) = (vec![h_name], vec![h_name]);
        let mut made = Vec::new();
        for (name, value) in &writes {
            let n = Str::new(ctx, name);
            match value {
                Some(v) => {
                    let v = Str::new(ctx, v);
                    api!(RedisModule_HashSet)(
                        state,
                        raw::REDISMODULE_HASH_NONE as c_int,
                        n.ptr,
                        v.ptr,
                        ptr::null::<c_char>(),
                    );
                    set_args.extend([n.ptr, v.ptr]);
                    made.push(v);
                }
                None => {
                    api!(RedisModule_HashSet)(
                        state,
                        raw::REDISMODULE_HASH_NONE as c_int,
                        n.ptr,
                        HASH_DELETE,
                        ptr::null::<c_char>(),
                    );
                    del_args.push(n.ptr);
                }
            }
            made.push(n);
        }
        if set_args.len() > 1 {
            effects.notify(raw::REDISMODULE_NOTIFY_HASH, c"hset", h_name);
            if replicating {
                effects.replicate(c"HSET", &set_args);
            }
        }
        if del_args.len() > 1 {
            effects.notify(raw::REDISMODULE_NOTIFY_HASH, c"hdel", h_name);
            if replicating {
                effects.replicate(c"HDEL", &del_args);
            }
        }
        drop(made);

        self.leases.write(ctx, l_name, &mut effects);
        self.queue.write(ctx, q_name, &mut effects);
        let _ = (leases, queue);

        // The bitmap: as long as SETBIT would have left it.
        if !self.touched.is_empty() {
            let len = self.bits.len().max(self.stored_bits);
            let mut have = 0usize;
            let dma = api!(RedisModule_StringDMA);
            let write = raw::REDISMODULE_WRITE as c_int;
            let mut p = if key_type(slots) == raw::REDISMODULE_KEYTYPE_EMPTY {
                ptr::null_mut()
            } else {
                dma(slots, &mut have, write)
            };
            if p.is_null() || have < len {
                api!(RedisModule_StringTruncate)(slots, len);
                p = dma(slots, &mut have, write);
            }
            if !p.is_null() {
                ptr::copy_nonoverlapping(self.bits.as_ptr(), p.cast::<u8>(), self.bits.len());
            }
            effects.notify(raw::REDISMODULE_NOTIFY_STRING, c"setbit", s_name);
            if replicating {
                for &bit in &self.touched {
                    let on = self.bits[(bit / 8) as usize] & (0x80u8 >> (bit % 8)) != 0;
                    let b = Str::new(ctx, &decimal_text(bit));
                    let v = Str::new(ctx, if on { b"1" } else { b"0" });
                    effects.replicate(c"SETBIT", &[s_name, b.ptr, v.ptr]);
                }
            }
        }

        send(ctx, reply);
        // The wake-ups, last, as the caller's user; a refused PUBLISH changes nothing.
        for (channel, message) in &self.outbox {
            publish(ctx, channel, message, replicating);
        }
        Some(())
    }
}

/// `PUBLISH channel message` as the caller's user (ACL checked), errors ignored as the Lua's
/// pcall ignores them; replicated where the Lua's PUBLISH would be (not in a cluster, which
/// carries messages on its bus).
unsafe fn publish(ctx: *mut RedisModuleCtx, channel: &[u8], message: &[u8], replicating: bool) {
    let cluster =
        api!(RedisModule_GetContextFlags)(ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER as c_int != 0;
    let flags = if replicating && !cluster {
        c"!CEbb"
    } else {
        c"CEbb"
    };
    let reply = api!(RedisModule_Call)(
        ctx,
        c"PUBLISH".as_ptr(),
        flags.as_ptr(),
        channel.as_ptr().cast::<c_char>(),
        channel.len(),
        message.as_ptr().cast::<c_char>(),
        message.len(),
    );
    if !reply.is_null() {
        api!(RedisModule_FreeCallReply)(reply);
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
