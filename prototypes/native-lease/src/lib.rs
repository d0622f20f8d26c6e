//! Prototype, measurement only (not used by redsem): the lease semaphore's two uncontended fast
//! paths (`fast_acquire` and `fast_release` in crates/redsem/lua/lease/fast.lua) as Redis
//! module commands working on the keys through the module low-level key API.
//!
//!   RXN.LEASE_ACQUIRE 4 leases queue state slots  <ARGV of the FCALL lease_acquire>
//!   RXN.LEASE_RELEASE 4 leases queue state slots  <ARGV of the FCALL lease_release>
//!   RXN.NOOP                                      +OK (the dispatch floor of a module command)
//!
//! Where the Lua's fast path would not apply (no state yet, a waiter, a due lease, a label, a
//! session record to renew, a foreign value, ...) the command changes nothing and answers the
//! error `NOTFAST`: the general paths are not implemented here.

#![allow(unused_unsafe)]

use std::ffi::{CStr, c_char, c_int};
use std::io::Write;
use std::ptr;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::time::{SystemTime, UNIX_EPOCH};

use redis_module::raw::{self, RedisModuleCtx, RedisModuleKey, RedisModuleString};

/// Measurement switches, given as module arguments (`--loadmodule lib.so noreplicate allfields`):
/// `noreplicate` skips RedisModule_Replicate (the effects reach no replica nor AOF: for
/// measuring its cost only); `allfields` reads all 13 fields the scripts' HMGET reads.
static REPLICATE: AtomicBool = AtomicBool::new(true);
static ALL_FIELDS: AtomicBool = AtomicBool::new(false);

/// The state hash's constant field names, in the scripts' HMGET order, made once at load.
struct Fields([*mut RedisModuleString; 11]);
unsafe impl Send for Fields {}
unsafe impl Sync for Fields {}
static FIELDS: std::sync::OnceLock<Fields> = std::sync::OnceLock::new();
const NAMES: [&[u8]; 11] = [b"cap", b"used", b"qlen", b"seq", b"idle", b"tok", b"nh", b"nt", b"next", b"tnext", b"layout"];

const OK: c_int = 0;
const ERR: c_int = 1;
const LAYOUT: &[u8] = b"2";
const PRUNE_LAG_MS: u64 = 2000;
const SESSION_MS: u64 = 600_000;
const SESSION_RENEW_MS: u64 = 60_000;

// ---------------------------------------------------------------------------------------------
// Thin wrappers over the C API (function pointers filled by RedisModule_Init).

macro_rules! api {
    ($name:ident) => {
        unsafe { raw::$name.unwrap() }
    };
}

unsafe fn bytes<'a>(s: *mut RedisModuleString) -> &'a [u8] {
    let mut len = 0usize;
    let p = unsafe { api!(RedisModule_StringPtrLen)(s, &mut len) };
    unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) }
}

unsafe fn create(ctx: *mut RedisModuleCtx, b: &[u8]) -> *mut RedisModuleString {
    unsafe { api!(RedisModule_CreateString)(ctx, b.as_ptr().cast::<c_char>(), b.len()) }
}

unsafe fn free(ctx: *mut RedisModuleCtx, s: *mut RedisModuleString) {
    if !s.is_null() {
        unsafe { api!(RedisModule_FreeString)(ctx, s) }
    }
}

unsafe fn reply_error(ctx: *mut RedisModuleCtx, msg: &CStr) -> c_int {
    unsafe { api!(RedisModule_ReplyWithError)(ctx, msg.as_ptr()) };
    OK
}

unsafe fn reply_bulk(ctx: *mut RedisModuleCtx, b: &[u8]) {
    unsafe { api!(RedisModule_ReplyWithStringBuffer)(ctx, b.as_ptr().cast::<c_char>(), b.len()) };
}

/// The four keys, opened for writing, closed when dropped.
struct Keys {
    leases: *mut RedisModuleKey,
    state: *mut RedisModuleKey,
    slots: *mut RedisModuleKey,
}

impl Keys {
    unsafe fn open(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> Self {
        let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int;
        let open = api!(RedisModule_OpenKey);
        // (The queue, argv[3], is not touched by the fast paths: nobody waits.)
        unsafe { Keys { leases: open(ctx, argv[2], mode), state: open(ctx, argv[4], mode), slots: open(ctx, argv[5], mode) } }
    }

    /// The types the fast paths need: the state a hash, leases a zset or absent, slots a
    /// string or absent.
    unsafe fn types_ok(&self) -> bool {
        let t = api!(RedisModule_KeyType);
        unsafe {
            t(self.state) == raw::REDISMODULE_KEYTYPE_HASH as c_int
                && matches!(t(self.leases), x if x == raw::REDISMODULE_KEYTYPE_ZSET as c_int || x == raw::REDISMODULE_KEYTYPE_EMPTY as c_int)
                && matches!(t(self.slots), x if x == raw::REDISMODULE_KEYTYPE_STRING as c_int || x == raw::REDISMODULE_KEYTYPE_EMPTY as c_int)
        }
    }
}

impl Drop for Keys {
    fn drop(&mut self) {
        let close = api!(RedisModule_CloseKey);
        unsafe {
            close(self.leases);
            close(self.state);
            close(self.slots);
        }
    }
}

/// The state hash's fields as the scripts' HMGET reads them, plus the caller's record and
/// session record: 0 cap, 1 used, 2 qlen, 3 seq, 4 idle, 5 tok, 6 nh, 7 nt, 8 next, 9 tnext,
/// 10 layout, 11 r:<id>, 12 s:<session>. Null: absent.
struct State {
    ctx: *mut RedisModuleCtx,
    v: [*mut RedisModuleString; 13],
}

impl State {
    /// `all`: the 13 fields the scripts' HMGET reads; otherwise only those the fast path uses
    /// (not seq and nt; not tok for a release: `acquire` false).
    unsafe fn read(ctx: *mut RedisModuleCtx, key: *mut RedisModuleKey, record: &CStr, session: &CStr, acquire: bool) -> Self {
        let mut v = [ptr::null_mut(); 13];
        let [a, b, c, d, e, f, g, h, i, j, k, l, m] = &mut v;
        let get = api!(RedisModule_HashGet);
        // The constant field names as strings made once at load (no object per name per call);
        // the caller's two names made here.
        let n = &FIELDS.get().unwrap().0;
        unsafe {
            let (rec, ses) = (create(ctx, record.to_bytes()), create(ctx, session.to_bytes()));
            if ALL_FIELDS.load(Relaxed) {
                get(key, 0, n[0], a as *mut _, n[1], b as *mut _, n[2], c as *mut _, n[3], d as *mut _, n[4], e as *mut _,
                    n[5], f as *mut _, n[6], g as *mut _, n[7], h as *mut _, n[8], i as *mut _, n[9], j as *mut _,
                    n[10], k as *mut _, rec, l as *mut _, ses, m as *mut _, ptr::null::<c_char>());
            } else if acquire {
                get(key, 0, n[0], a as *mut _, n[1], b as *mut _, n[2], c as *mut _, n[4], e as *mut _,
                    n[5], f as *mut _, n[6], g as *mut _, n[8], i as *mut _, n[9], j as *mut _,
                    n[10], k as *mut _, rec, l as *mut _, ses, m as *mut _, ptr::null::<c_char>());
            } else {
                get(key, 0, n[0], a as *mut _, n[1], b as *mut _, n[2], c as *mut _, n[4], e as *mut _,
                    n[6], g as *mut _, n[8], i as *mut _, n[9], j as *mut _,
                    n[10], k as *mut _, rec, l as *mut _, ses, m as *mut _, ptr::null::<c_char>());
            }
            free(ctx, rec);
            free(ctx, ses);
        }
        State { ctx, v }
    }

    fn get(&self, i: usize) -> Option<&[u8]> {
        let s = self.v[i];
        if s.is_null() { None } else { Some(unsafe { bytes(s) }) }
    }

    /// count() of the scripts: an absent field is 0; only plain decimal digits are taken here
    /// (anything else: not the fast path).
    fn count(&self, i: usize) -> Option<u64> {
        match self.get(i) {
            None => Some(0),
            Some(b) => decimal(b),
        }
    }
}

impl Drop for State {
    fn drop(&mut self) {
        for s in self.v {
            unsafe { free(self.ctx, s) };
        }
    }
}

fn decimal(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 19 {
        return None;
    }
    let mut n = 0u64;
    for &c in b {
        if !c.is_ascii_digit() {
            return None;
        }
        n = n * 10 + (c - b'0') as u64;
    }
    Some(n)
}

fn hex(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 16 {
        return None;
    }
    let mut n = 0u64;
    for &c in b {
        let d = match c {
            b'0'..=b'9' => c - b'0',
            b'a'..=b'f' => c - b'a' + 10,
            b'A'..=b'F' => c - b'A' + 10,
            _ => return None,
        };
        n = n << 4 | d as u64;
    }
    Some(n)
}

/// Redis time as the scripts read it (TIME: the server's gettimeofday): ms and µs.
fn clock() -> (u64, u64) {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    let us = d.as_secs() * 1_000_000 + d.subsec_micros() as u64;
    (us / 1000, us)
}

/// quiet() of the scripts: of this layout, counters agreeing, nobody queued, no idle TTL,
/// nothing due; with `room`, a unit free. Answers (cap, used, nh, next).
fn quiet(s: &State, now: u64, room: bool) -> Option<(u64, u64, u64, u64)> {
    s.get(0)?;
    if s.get(2) != Some(b"0") || s.get(10) != Some(LAYOUT) || s.get(6).is_none() {
        return None;
    }
    if let Some(idle) = s.get(4) {
        if idle != b"0" {
            return None;
        }
    }
    let (cap, used, nh) = (s.count(0)?, s.count(1)?, s.count(6)?);
    if (room && used >= cap) || (used > 0) != (nh > 0) {
        return None;
    }
    let (next, tnext) = (s.count(8)?, s.count(9)?);
    if next <= now || (tnext > 0 && tnext + PRUNE_LAG_MS <= now) {
        return None;
    }
    Some((cap, used, nh, next))
}

/// The caller's session record "low|expiry|top|,seq=M,...": (low, expiry text, top, marks).
fn session(raw: Option<&[u8]>) -> (u64, &[u8], u64, &[u8]) {
    let Some(raw) = raw else { return (0, b"0", 0, b"") };
    let mut parts = raw.splitn(4, |&c| c == b'|');
    let (Some(low), Some(expiry), Some(top), Some(rest)) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return (0, b"0", 0, b"");
    };
    match (hex(low), hex(expiry), hex(top)) {
        (Some(l), Some(_), Some(t)) => (l, expiry, t, rest),
        _ => (0, b"0", 0, b""),
    }
}

/// session_mark() of the scripts: whether the record marks the call numbered `seq`.
fn marked(raw: &[u8], seq: &[u8]) -> bool {
    let (_, _, top, marks) = session(Some(raw));
    if marks.is_empty() || hex(seq).unwrap_or(0) > top {
        return false;
    }
    let mut needle = Vec::with_capacity(seq.len() + 2);
    needle.push(b',');
    needle.extend_from_slice(seq);
    needle.push(b'=');
    marks.windows(needle.len()).any(|w| w == needle.as_slice())
}

fn field_name(prefix: &[u8], name: &[u8]) -> Option<std::ffi::CString> {
    let mut v = Vec::with_capacity(prefix.len() + name.len() + 1);
    v.extend_from_slice(prefix);
    v.extend_from_slice(name);
    std::ffi::CString::new(v).ok()
}

/// The slot bitmap through DMA: the first clear bit (BITPOS slots 0: past the end if none).
unsafe fn first_clear(key: *mut RedisModuleKey) -> u64 {
    let mut len = 0usize;
    let p = unsafe { api!(RedisModule_StringDMA)(key, &mut len, raw::REDISMODULE_READ as c_int) };
    let b = unsafe { std::slice::from_raw_parts(p.cast::<u8>(), len) };
    for (i, &byte) in b.iter().enumerate() {
        if byte != 0xff {
            return i as u64 * 8 + (!byte).leading_zeros() as u64;
        }
    }
    len as u64 * 8
}

/// SETBIT slots `bit` `on`, growing the string as SETBIT does.
unsafe fn set_bit(key: *mut RedisModuleKey, bit: u64, on: bool) {
    let byte = (bit / 8) as usize;
    let mut len = 0usize;
    let dma = api!(RedisModule_StringDMA);
    unsafe {
        dma(key, &mut len, raw::REDISMODULE_READ as c_int);
        if len <= byte {
            api!(RedisModule_StringTruncate)(key, byte + 1);
        }
        let p = dma(key, &mut len, raw::REDISMODULE_WRITE as c_int).cast::<u8>();
        let mask = 0x80u8 >> (bit % 8);
        if on { *p.add(byte) |= mask } else { *p.add(byte) &= !mask }
    }
}

fn args<'a>(argv: *mut *mut RedisModuleString, argc: c_int) -> &'a [*mut RedisModuleString] {
    unsafe { std::slice::from_raw_parts(argv, argc as usize) }
}

// ---------------------------------------------------------------------------------------------
// lease_acquire's fast path: one unit, no label, a new request, room and nobody queued.
// ARGV (from argv[6]): 1 id, 2 capacity, 3 units, 4 lease ms, 5 label, 6 one per label, 7 mode,
// 8 waiter lease ms, 9 channel, 10 seq, 11 session id, 12 low mark.

unsafe extern "C" fn lease_acquire(ctx: *mut RedisModuleCtx, argv: *mut *mut RedisModuleString, argc: c_int) -> c_int {
    let argv = args(argv, argc);
    if argc < 18 {
        return unsafe { api!(RedisModule_WrongArity)(ctx) };
    }
    let a = |i: usize| unsafe { bytes(argv[5 + i]) };
    if a(3) != b"1" || !a(5).is_empty() {
        return unsafe { reply_error(ctx, c"NOTFAST label or units") };
    }
    let keys = unsafe { Keys::open(ctx, argv) };
    if !unsafe { keys.types_ok() } {
        return unsafe { reply_error(ctx, c"NOTFAST key types") };
    }
    let (Some(record), Some(sess)) = (field_name(b"r:", a(1)), field_name(b"s:", a(11))) else {
        return unsafe { reply_error(ctx, c"NOTFAST names") };
    };
    let s = unsafe { State::read(ctx, keys.state, &record, &sess, true) };
    let (now, now_us) = clock();
    if s.get(11).is_some() {
        return unsafe { reply_error(ctx, c"NOTFAST resent") };
    }
    if let Some(raw) = s.get(12) {
        let (low, ..) = session(Some(raw));
        if hex(a(10)).unwrap_or(0) < low || marked(raw, a(10)) {
            return unsafe { reply_error(ctx, c"NOTFAST session") };
        }
    }
    let Some((cap, used, nh, next)) = quiet(&s, now, true) else {
        return unsafe { reply_error(ctx, c"NOTFAST state") };
    };
    let (Some(want), Some(lease), Some(_)) = (decimal(a(2)), decimal(a(4)), decimal(a(8))) else {
        return unsafe { reply_error(ctx, c"NOTFAST numbers") };
    };
    let Some(last) = s.get(5).map_or(Some(0), decimal) else {
        return unsafe { reply_error(ctx, c"NOTFAST token") };
    };
    if want != cap {
        return unsafe { reply_error(ctx, c"NOTFAST capacity") };
    }
    let token = (last + 1).max(now_us);
    let ends = now + lease;
    let slot = if used > 0 { unsafe { first_clear(keys.slots) } } else { 0 };

    unsafe {
        set_bit(keys.slots, slot, true);
        let mut flags = 0;
        api!(RedisModule_ZsetAdd)(keys.leases, ends as f64, argv[6], &mut flags);

        // HSET state used nh tok r:<id> <holder record> [next <ends>]
        let mut buf = [0u8; 160];
        let (mut used_t, mut nh_t, mut tok_t, mut ends_t) = ([0u8; 20], [0u8; 20], [0u8; 20], [0u8; 20]);
        let used_t = fmt(&mut used_t, used + 1);
        let nh_t = fmt(&mut nh_t, nh + 1);
        let tok_t = fmt(&mut tok_t, token);
        let ends_t = fmt(&mut ends_t, ends);
        let held = {
            let mut w = &mut buf[..];
            let _ = write!(w, "h|{token}|1|{now}|{lease}|{slot}|");
            let n = 160 - w.len();
            &buf[..n]
        };
        let (v_used, v_nh, v_tok, v_held) = (create(ctx, used_t), create(ctx, nh_t), create(ctx, tok_t), create(ctx, held));
        let set_next = ends < next;
        let v_next = if set_next { create(ctx, ends_t) } else { ptr::null_mut() };
        let hset = api!(RedisModule_HashSet);
        let cf = raw::REDISMODULE_HASH_CFIELDS as c_int;
        if set_next {
            hset(keys.state, cf, c"used".as_ptr(), v_used, c"nh".as_ptr(), v_nh, c"tok".as_ptr(), v_tok,
                record.as_ptr(), v_held, c"next".as_ptr(), v_next, ptr::null::<c_char>());
        } else {
            hset(keys.state, cf, c"used".as_ptr(), v_used, c"nh".as_ptr(), v_nh, c"tok".as_ptr(), v_tok,
                record.as_ptr(), v_held, ptr::null::<c_char>());
        }

        // Keyspace events as the commands' own, and the effects as plain commands.
        let notify = api!(RedisModule_NotifyKeyspaceEvent);
        notify(ctx, raw::REDISMODULE_NOTIFY_STRING, c"setbit".as_ptr(), argv[5]);
        notify(ctx, raw::REDISMODULE_NOTIFY_ZSET, c"zadd".as_ptr(), argv[2]);
        notify(ctx, raw::REDISMODULE_NOTIFY_HASH, c"hset".as_ptr(), argv[4]);
        let rep = api!(RedisModule_Replicate);
        let replicate = REPLICATE.load(Relaxed);
        if replicate {
            rep(ctx, c"SETBIT".as_ptr(), c"slc".as_ptr(), argv[5], slot as i64, c"1".as_ptr());
        }
        if replicate {
            rep(ctx, c"ZADD".as_ptr(), c"sls".as_ptr(), argv[2], ends as i64, argv[6]);
        }
        let rec = record.as_bytes();
        if set_next {
            if replicate {
                rep(ctx, c"HSET".as_ptr(), c"scscscsbscs".as_ptr(), argv[4], c"used".as_ptr(), v_used, c"nh".as_ptr(), v_nh,
                    c"tok".as_ptr(), v_tok, rec.as_ptr(), rec.len(), v_held, c"next".as_ptr(), v_next);
            }
        } else {
            if replicate {
                rep(ctx, c"HSET".as_ptr(), c"scscscsbs".as_ptr(), argv[4], c"used".as_ptr(), v_used, c"nh".as_ptr(), v_nh,
                    c"tok".as_ptr(), v_tok, rec.as_ptr(), rec.len(), v_held);
            }
        }
        for v in [v_used, v_nh, v_tok, v_held, v_next] {
            free(ctx, v);
        }

        // {"GRANTED", token, slot}
        api!(RedisModule_ReplyWithArray)(ctx, 3);
        reply_bulk(ctx, b"GRANTED");
        api!(RedisModule_ReplyWithLongLong)(ctx, token as i64);
        api!(RedisModule_ReplyWithLongLong)(ctx, slot as i64);
    }
    OK
}

fn fmt(buf: &mut [u8; 20], n: u64) -> &[u8] {
    let mut i = 20;
    let mut n = n;
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[i..]
}

/// The slot of a holder record of one unit without a label, "h|token|1|at|lease|slot|".
fn one_unit_slot(raw: &[u8]) -> Option<u64> {
    let mut parts = raw.split(|&c| c == b'|');
    let (h, t, k, at, lease, slot, label) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    if h != b"h" || k != b"1" || !label.is_empty() || parts.next().is_some() {
        return None;
    }
    decimal(t)?;
    decimal(at)?;
    decimal(lease)?;
    decimal(slot)
}

// ---------------------------------------------------------------------------------------------
// lease_release's fast path: a holder of one unit without a label, nobody queued, a session
// record that needs no renewal and keeps no other marks.
// ARGV (from argv[6]): 1 id, 2 channel, 3 seq, 4 session id, 5 low mark, 6 "r" | "w".

unsafe extern "C" fn lease_release(ctx: *mut RedisModuleCtx, argv: *mut *mut RedisModuleString, argc: c_int) -> c_int {
    let argv = args(argv, argc);
    if argc < 12 {
        return unsafe { api!(RedisModule_WrongArity)(ctx) };
    }
    let a = |i: usize| unsafe { bytes(argv[5 + i]) };
    if a(6) != b"r" {
        return unsafe { reply_error(ctx, c"NOTFAST withdrawal") };
    }
    let keys = unsafe { Keys::open(ctx, argv) };
    if !unsafe { keys.types_ok() } {
        return unsafe { reply_error(ctx, c"NOTFAST key types") };
    }
    let (Some(record), Some(sess)) = (field_name(b"r:", a(1)), field_name(b"s:", a(4))) else {
        return unsafe { reply_error(ctx, c"NOTFAST names") };
    };
    let s = unsafe { State::read(ctx, keys.state, &record, &sess, false) };
    let (now, _) = clock();
    let Some((_, used, nh, _)) = quiet(&s, now, false) else {
        return unsafe { reply_error(ctx, c"NOTFAST state") };
    };
    let Some(slot) = s.get(11).and_then(one_unit_slot) else {
        return unsafe { reply_error(ctx, c"NOTFAST record") };
    };
    let seq = a(3);
    let (sl, expiry, top, _) = session(s.get(12));
    if hex(seq).unwrap_or(0) < sl {
        return unsafe { reply_error(ctx, c"NOTFAST stale") };
    }
    // session_put(low, seq, 'R'): only the usual case (no renewal, every earlier mark passed).
    let low = sl.max(hex(a(5)).unwrap_or(0));
    let renew = hex(expiry).unwrap_or(0) + SESSION_RENEW_MS <= now + SESSION_MS;
    if renew || top >= low {
        return unsafe { reply_error(ctx, c"NOTFAST session") };
    }
    let mut mark = Vec::with_capacity(64);
    let _ = write!(mark, "{low:x}|");
    mark.extend_from_slice(expiry);
    mark.push(b'|');
    mark.extend_from_slice(seq);
    mark.extend_from_slice(b"|,");
    mark.extend_from_slice(seq);
    mark.extend_from_slice(b"=R");

    let (used, nh) = (used.saturating_sub(1), nh.saturating_sub(1));
    unsafe {
        set_bit(keys.slots, slot, false);
        let mut deleted = 0;
        api!(RedisModule_ZsetRem)(keys.leases, argv[6], &mut deleted);
        let (mut used_t, mut nh_t) = ([0u8; 20], [0u8; 20]);
        let (v_used, v_nh, v_mark) = (create(ctx, fmt(&mut used_t, used)), create(ctx, fmt(&mut nh_t, nh)), create(ctx, &mark));
        let cf = raw::REDISMODULE_HASH_CFIELDS as c_int;
        api!(RedisModule_HashSet)(keys.state, cf, c"used".as_ptr(), v_used, c"nh".as_ptr(), v_nh, sess.as_ptr(), v_mark,
            record.as_ptr(), 1usize as *mut RedisModuleString /* REDISMODULE_HASH_DELETE */, ptr::null::<c_char>());

        let notify = api!(RedisModule_NotifyKeyspaceEvent);
        notify(ctx, raw::REDISMODULE_NOTIFY_STRING, c"setbit".as_ptr(), argv[5]);
        notify(ctx, raw::REDISMODULE_NOTIFY_ZSET, c"zrem".as_ptr(), argv[2]);
        notify(ctx, raw::REDISMODULE_NOTIFY_HASH, c"hset".as_ptr(), argv[4]);
        notify(ctx, raw::REDISMODULE_NOTIFY_HASH, c"hdel".as_ptr(), argv[4]);
        let rep = api!(RedisModule_Replicate);
        let replicate = REPLICATE.load(Relaxed);
        if replicate {
            rep(ctx, c"SETBIT".as_ptr(), c"slc".as_ptr(), argv[5], slot as i64, c"0".as_ptr());
        }
        if replicate {
            rep(ctx, c"ZREM".as_ptr(), c"ss".as_ptr(), argv[2], argv[6]);
        }
        let sb = sess.as_bytes();
        if replicate {
            rep(ctx, c"HSET".as_ptr(), c"scscsbs".as_ptr(), argv[4], c"used".as_ptr(), v_used, c"nh".as_ptr(), v_nh,
                sb.as_ptr(), sb.len(), v_mark);
        }
        let rb = record.as_bytes();
        if replicate {
            rep(ctx, c"HDEL".as_ptr(), c"sb".as_ptr(), argv[4], rb.as_ptr(), rb.len());
        }
        for v in [v_used, v_nh, v_mark] {
            free(ctx, v);
        }

        // {"RELEASED", idle}
        api!(RedisModule_ReplyWithArray)(ctx, 2);
        reply_bulk(ctx, b"RELEASED");
        api!(RedisModule_ReplyWithLongLong)(ctx, if used == 0 { 1 } else { 0 });
    }
    OK
}

unsafe extern "C" fn noop(ctx: *mut RedisModuleCtx, _argv: *mut *mut RedisModuleString, _argc: c_int) -> c_int {
    unsafe { api!(RedisModule_ReplyWithSimpleString)(ctx, c"OK".as_ptr()) };
    OK
}

/// # Safety
/// Called by Redis when the module is loaded.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn RedisModule_OnLoad(ctx: *mut RedisModuleCtx, argv: *mut *mut RedisModuleString, argc: c_int) -> c_int {
    unsafe {
        if raw::Export_RedisModule_Init(ctx, c"rxn".as_ptr(), 1, raw::REDISMODULE_APIVER_1 as c_int) == ERR {
            return ERR;
        }
        for &arg in args(argv, argc) {
            match bytes(arg) {
                b"noreplicate" => REPLICATE.store(false, Relaxed),
                b"allfields" => ALL_FIELDS.store(true, Relaxed),
                _ => return ERR,
            }
        }
        let _ = FIELDS.set(Fields(NAMES.map(|name| create(ptr::null_mut(), name))));
        let create = api!(RedisModule_CreateCommand);
        type Cmd = unsafe extern "C" fn(*mut RedisModuleCtx, *mut *mut RedisModuleString, c_int) -> c_int;
        let commands: [(&CStr, Cmd, &CStr, c_int, c_int); 3] = [
            (c"rxn.lease_acquire", lease_acquire, c"write deny-oom fast", 2, 5),
            (c"rxn.lease_release", lease_release, c"write fast", 2, 5),
            (c"rxn.noop", noop, c"readonly fast", 0, 0),
        ];
        for (name, f, flags, first, last) in commands {
            if create(ctx, name.as_ptr(), Some(f), flags.as_ptr(), first, last, if first > 0 { 1 } else { 0 }) == ERR {
                return ERR;
            }
        }
    }
    OK
}
