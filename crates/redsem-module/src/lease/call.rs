//! One general native call of the lease semaphore (general.rs), worked out in memory: the
//! state's fields read once and cached, its counters, the sorted sets as changes over the
//! keys, a copy of the slot bitmap, the session record, the grants handed back and the
//! wake-ups; load() as lease/state.lua's load() and settle() where they have nothing but
//! promote to do, save() as common.lua's save() with keep().

use std::ffi::{c_char, c_int};
use std::ptr;

use super::view::{Record, Reply, bulk, int, parse, send};
use super::{LAYOUT, MAX_BIT, PRUNE_LAG_MS};
use crate::api::{
    self, Keys, Read, RedisModuleCtx, RedisModuleKey, RedisModuleString, Str, api, is_or_empty,
    key_type, raw,
};
use crate::clock;
use crate::hash::Fields;
use crate::record::{Native, decimal, decimal_text, hex, join};
use crate::replicate::{Effects, publish};
use crate::session::SessionRecord;
use crate::zset::Zset;

/// lease/layout.lua: WORK_BUDGET.
const WORK_BUDGET: u64 = 4096;
/// The largest slot bitmap copied (a capacity of half a million units).
const MAX_BITMAP: usize = 1 << 16;

/// The state's counters (lease/state.lua's load()), and which of them the call changed.
#[derive(Debug, Default)]
pub(super) struct Counters {
    pub(super) cap: u64,
    pub(super) used: u64,
    pub(super) qlen: u64,
    pub(super) seq: u64,
    pub(super) nh: u64,
    pub(super) nt: u64,
    pub(super) next: u64,
    pub(super) tnext: u64,
    /// The last token (None: not a count; a grant then declines).
    pub(super) tok: Option<u64>,
}

pub(super) const COUNTER_NAMES: [&[u8]; 8] = [
    b"used", b"qlen", b"seq", b"nh", b"nt", b"next", b"tnext", b"tok",
];
pub(super) const USED: usize = 0;
pub(super) const QLEN: usize = 1;
pub(super) const SEQ: usize = 2;
pub(super) const NH: usize = 3;
pub(super) const NT: usize = 4;
pub(super) const NEXT: usize = 5;
pub(super) const TNEXT: usize = 6;
pub(super) const TOK: usize = 7;

/// One call, worked out in memory (see the top of this file).
pub(super) struct Call<'a> {
    pub(super) ctx: *mut RedisModuleCtx,
    pub(super) argv: &'a [*mut RedisModuleString],
    pub(super) keys: Keys<4>,
    pub(super) leases: Zset,
    pub(super) queue: Zset,
    /// The slot bitmap: its copy, its length as stored, the bits set or cleared (in order).
    pub(super) bits: Vec<u8>,
    pub(super) stored_bits: usize,
    pub(super) slots_stored: bool,
    pub(super) touched: Vec<u64>,
    /// The state hash's fields read and put.
    pub(super) fields: Fields,
    pub(super) c: Counters,
    pub(super) dirty: [bool; 8],
    pub(super) now: u64,
    pub(super) now_us: u64,
    pub(super) low: u64,
    pub(super) session: SessionRecord,
    pub(super) budget: u64,
    /// Waiters granted by promote() so far (see general.rs, MAX_GRANTS).
    pub(super) granted: usize,
    pub(super) checked: bool,
    pub(super) defer_idle: bool,
    /// The caller's wake channel; the grants made to waiters on it; the wake-ups to publish.
    pub(super) mine: Option<Vec<u8>>,
    pub(super) handed: Vec<Vec<u8>>,
    pub(super) outbox: Vec<(Vec<u8>, Vec<u8>)>,
}

/// The state's fields load() reads, in this order: layout, cap, then COUNTER_NAMES, idle.
const STATE_FIELDS: [&[u8]; 11] = [
    b"layout", b"cap", b"used", b"qlen", b"seq", b"nh", b"nt", b"next", b"tnext", b"tok", b"idle",
];

/// Their names as strings made once (read-only afterwards, Redis's main thread only).
struct StateNames([*mut RedisModuleString; 11]);
// SAFETY: made once, never changed, used on Redis's main thread only.
unsafe impl Send for StateNames {}
unsafe impl Sync for StateNames {}
static STATE_NAMES: std::sync::OnceLock<StateNames> = std::sync::OnceLock::new();

/// The fields of STATE_FIELDS by one HashGet.
#[rustfmt::skip]
unsafe fn read_counters(ctx: *mut RedisModuleCtx, state: *mut RedisModuleKey) -> Read<11> {
    let n = &STATE_NAMES
        // SAFETY: strings with no context, kept for the module's life.
        .get_or_init(|| StateNames(STATE_FIELDS.map(|f| unsafe { api::create(ptr::null_mut(), f) })))
        .0;
    let mut r = Read::<11>::new(ctx);
    let [a, b, c, d, e, f, g, h, i, j, k] = &mut r.v;
    api!(RedisModule_HashGet)(state, raw::REDISMODULE_HASH_NONE as c_int,
        n[0], a as *mut _, n[1], b as *mut _, n[2], c as *mut _, n[3], d as *mut _, n[4], e as *mut _,
        n[5], f as *mut _, n[6], g as *mut _, n[7], h as *mut _, n[8], i as *mut _, n[9], j as *mut _,
        n[10], k as *mut _, ptr::null::<c_char>());
    r
}

impl<'a> Call<'a> {
    /// begin() and load() of the state, then settle() where it has nothing to do but
    /// promote (no lease ended, no session record to prune). None: declined.
    pub(super) unsafe fn load(
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
            leases: Zset::new(leases),
            queue: Zset::new(queue),
            keys,
            bits: Vec::new(),
            stored_bits: 0,
            slots_stored: key_type(slots) != raw::REDISMODULE_KEYTYPE_EMPTY,
            touched: Vec::new(),
            fields: Fields::new(state),
            c: Counters::default(),
            dirty: [false; 8],
            now,
            now_us,
            low: hex(low)?,
            session: SessionRecord::parse(Vec::new(), None)?,
            budget: WORK_BUDGET,
            granted: 0,
            checked: false,
            defer_idle: false,
            mine: mine.map(<[u8]>::to_vec),
            handed: Vec::new(),
            outbox: Vec::new(),
        };
        let stored = read_counters(ctx, state);
        if stored.get(0) != Some(LAYOUT) {
            return None; // (another layout, or none: adopted or refused by the Lua)
        }
        let count = |i: usize| -> Native<u64> { stored.get(i).map_or(Some(0), decimal) };
        stored.get(NH + 2)?;
        call.c.cap = decimal(stored.get(1)?)?;
        call.c.used = count(USED + 2)?;
        call.c.qlen = count(QLEN + 2)?;
        call.c.seq = count(SEQ + 2)?;
        call.c.nh = count(NH + 2)?;
        call.c.nt = count(NT + 2)?;
        call.c.next = count(NEXT + 2)?;
        call.c.tnext = count(TNEXT + 2)?;
        call.c.tok = count(TOK + 2);
        let idle = count(10)?;
        drop(stored);
        if idle != 0 || (call.c.used > 0) != (call.c.nh > 0) {
            return None; // (keep() persists, or repair() rebuilds)
        }
        if (call.c.tnext != 0 && call.c.tnext + PRUNE_LAG_MS <= now) || call.c.next <= now {
            return None; // (settle has records to prune or leases to look at)
        }
        let name = join(&[b"s:", session]);
        let raw = call.field_opt(&name);
        call.session = SessionRecord::parse(name, raw)?;
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
    pub(super) unsafe fn field_opt(&mut self, name: &[u8]) -> Option<Vec<u8>> {
        self.fields.get(self.ctx, name)
    }

    pub(super) fn put(&mut self, name: &[u8], value: Option<Vec<u8>>) {
        self.fields.put(name, value);
    }

    pub(super) fn set(&mut self, counter: usize, value: u64) {
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

    pub(super) unsafe fn record(&mut self, id: &[u8]) -> Native<Option<Record>> {
        let raw = self.field_opt(&join(&[b"r:", id]));
        parse(raw.as_deref())
    }

    /// label_add(label, delta).
    pub(super) unsafe fn label_add(&mut self, label: &[u8], delta: i64) -> Native<()> {
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
    pub(super) unsafe fn label_held(&mut self, label: &[u8]) -> Native<bool> {
        if label.is_empty() {
            return Some(false);
        }
        Some(match self.field_opt(&join(&[b"label:", label])) {
            None => false,
            Some(text) => decimal(&text)? > 0,
        })
    }

    /// `BITPOS slots 0` (past the end if every bit is set).
    pub(super) fn first_clear(&self) -> u64 {
        for (i, &byte) in self.bits.iter().enumerate() {
            if byte != 0xff {
                return i as u64 * 8 + u64::from((!byte).leading_zeros());
            }
        }
        self.bits.len() as u64 * 8
    }

    /// `SETBIT slots bit on`, growing the copy as SETBIT grows the string.
    pub(super) fn set_bit(&mut self, bit: u64, on: bool) -> Native<()> {
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
    pub(super) unsafe fn check(&mut self) -> Native<()> {
        if self.checked {
            return Some(());
        }
        self.checked = true;
        let bits: u64 = self.bits.iter().map(|b| u64::from(b.count_ones())).sum();
        (self.leases.card(self.ctx) == self.c.nh + self.c.qlen + self.c.nt && bits == self.c.used)
            .then_some(())
    }

    /// add_lease(id, ends).
    pub(super) unsafe fn add_lease(&mut self, id: &[u8], ends: u64) {
        self.leases.set(id, Some(ends as f64));
        if self.c.next == 0 || ends < self.c.next {
            self.set(NEXT, ends);
        }
    }

    /// needs_idle_ttl() (the idle deadline is 0 here: load() declines any other).
    pub(super) fn idle(&self) -> bool {
        self.c.used == 0 && self.c.qlen == 0
    }

    /// {outcome, idle flag, grants handed back...}: released().
    pub(super) fn released(&self, outcome: Reply, idle: bool) -> Reply {
        let mut reply = vec![outcome, int(u64::from(idle))];
        reply.extend(self.handed.iter().map(|m| bulk(m)));
        Reply::Array(reply)
    }

    /// keep() and save(): the fields, the sorted sets and the bitmap written, the wake-ups
    /// published, the reply sent. None (nothing written): keep() would give the idle TTL.
    pub(super) unsafe fn save(self, reply: &Reply) -> Native<()> {
        if self.idle() && !self.defer_idle {
            return None;
        }
        let session = if self.session.dirty {
            Some(self.session.text()?)
        } else {
            None
        };
        let ctx = self.ctx;
        let [leases, queue, _, slots] = self.keys.0;
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
        writes.extend(self.fields.changed());
        if let Some(text) = session {
            writes.push((self.session.name.clone(), text));
        }
        self.fields.write(ctx, h_name, &writes, &mut effects);

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

#[cfg(test)]
mod tests {
    use std::mem::ManuallyDrop;

    use super::*;

    /// A call over no keys, for its in-memory parts (never dropped: it opened no key).
    fn call() -> ManuallyDrop<Call<'static>> {
        ManuallyDrop::new(Call {
            ctx: ptr::null_mut(),
            argv: &[],
            keys: Keys([ptr::null_mut(); 4]),
            leases: Zset::new(ptr::null_mut()),
            queue: Zset::new(ptr::null_mut()),
            bits: Vec::new(),
            stored_bits: 0,
            slots_stored: false,
            touched: Vec::new(),
            fields: Fields::new(ptr::null_mut()),
            c: Counters::default(),
            dirty: [false; 8],
            now: 0,
            now_us: 0,
            low: 0,
            session: SessionRecord::parse(Vec::new(), None).unwrap(),
            budget: WORK_BUDGET,
            granted: 0,
            checked: false,
            defer_idle: false,
            mine: None,
            handed: Vec::new(),
            outbox: Vec::new(),
        })
    }

    #[test]
    fn each_counter_is_set_and_marked_changed() {
        for (i, name) in COUNTER_NAMES.iter().enumerate() {
            let mut c = call();
            c.set(i, 7);
            let v = &c.c;
            let got = [
                v.used,
                v.qlen,
                v.seq,
                v.nh,
                v.nt,
                v.next,
                v.tnext,
                v.tok.unwrap_or(0),
            ];
            let want: [u64; 8] = std::array::from_fn(|j| if j == i { 7 } else { 0 });
            assert_eq!(got, want, "{}", String::from_utf8_lossy(name));
            assert_eq!(c.c.tok.is_some(), i == TOK);
            assert!((0..8).all(|j| c.dirty[j] == (j == i)));
        }
    }

    #[test]
    fn the_slot_bitmap_copy_is_read_and_written_as_bitpos_and_setbit() {
        let mut c = call();
        assert_eq!(c.first_clear(), 0);
        c.bits = vec![0xff, 0b1110_1111];
        assert_eq!(c.first_clear(), 11);
        c.bits = vec![0xff, 0xff];
        assert_eq!(c.first_clear(), 16);
        c.bits = vec![0x7f];
        assert_eq!(c.first_clear(), 0);

        let mut c = call();
        c.set_bit(10, true).unwrap();
        assert_eq!(c.bits, [0x00, 0x20]);
        c.set_bit(0, true).unwrap();
        c.set_bit(17, true).unwrap();
        assert_eq!(c.bits, [0x80, 0x20, 0x40]);
        c.set_bit(10, false).unwrap();
        c.set_bit(3, false).unwrap();
        assert_eq!(c.bits, [0x80, 0x00, 0x40]);
        assert_eq!(c.touched, [10, 0, 17, 10, 3]);
        // The copy stops at MAX_BITMAP bytes: past it, declined, nothing changed.
        let last = MAX_BITMAP as u64 * 8 - 1;
        assert_eq!(c.set_bit(last + 1, true), None);
        assert_eq!(c.bits.len(), 3);
        assert_eq!(c.set_bit(last, true), Some(()));
        assert_eq!(c.bits.len(), MAX_BITMAP);
        assert_eq!(c.bits[MAX_BITMAP - 1], 0x01);
        assert_eq!(c.set_bit(MAX_BIT + 1, true), None);
    }

    #[test]
    fn a_call_is_idle_with_nothing_held_or_queued_and_hands_back_its_grants() {
        let mut c = call();
        assert!(c.idle());
        c.c.used = 1;
        assert!(!c.idle());
        c.c.used = 0;
        c.c.qlen = 1;
        assert!(!c.idle());
        c.handed.push(b"q1|5|0|0".to_vec());
        let reply = c.released(bulk(b"RELEASED"), true);
        assert_eq!(
            format!("{reply:?}"),
            format!(
                "{:?}",
                Reply::Array(vec![bulk(b"RELEASED"), Reply::Int(1), bulk(b"q1|5|0|0")])
            )
        );
        let reply = c.released(bulk(b"NOTHELD"), false);
        assert_eq!(
            format!("{reply:?}"),
            format!(
                "{:?}",
                Reply::Array(vec![bulk(b"NOTHELD"), Reply::Int(0), bulk(b"q1|5|0|0")])
            )
        );
    }
}
