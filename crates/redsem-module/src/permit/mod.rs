//! The permit semaphore's native paths: `fast_acquire` and `fast_add` of
//! crates/redsem/lua/permit/fast.lua (a grant the count holds, and an addition, a release,
//! with nobody waiting), on the same keys through the module key API.
//!
//! As in crate::lease: taken only where the Lua's fast path would be, declined before any
//! write otherwise (the command then runs the operation's Lua).
//!
//! KEYS (permit/layout.lua): 1 count (string), 2 queue, 3 waiters (not touched here: nobody
//! waits), 4 records (hash), 5 meta, 6 applied (not touched here).

mod general;

use std::ffi::{c_char, c_int};
use std::ptr;

use crate::api::{
    self, Keys, Read, RedisModuleCtx, RedisModuleKey, RedisModuleString, Str, api, is_or_empty,
    key_type, raw,
};
use crate::clock;
use crate::record::{Session, Text, decimal, hex};
use crate::replicate::Effects;

/// The layout this protocol writes (permit/layout.lua: LAYOUT).
const LAYOUT: &[u8] = b"2";
/// The count's range (common.lua: MAX_INT).
const MAX_INT: i64 = (1 << 53) - 1;

/// The records hash's fields the fast paths read, in this order.
const KEEP: usize = 0;
const PRUNE: usize = 1;
const WLEN: usize = 2;
const QLEN: usize = 3;
const LIVE: usize = 4;
const WIDE_AT: usize = 5;
const LAYOUT_AT: usize = 6;
const RECORD: usize = 7;
const SESSION: usize = 8;
const FIELDS: usize = 9;

struct Names([*mut RedisModuleString; 7]);
// SAFETY: made at load, read-only afterwards, used on Redis's main thread only.
unsafe impl Send for Names {}
unsafe impl Sync for Names {}
static NAMES: std::sync::OnceLock<Names> = std::sync::OnceLock::new();

/// Make the field names (at load).
pub(crate) unsafe fn init() {
    let names = [
        &b"keep"[..],
        b"prune",
        b"wlen",
        b"qlen",
        b"live",
        b"wide",
        b"layout",
    ]
    .map(|name| api::create(ptr::null_mut(), name));
    let _ = NAMES.set(Names(names));
}

/// The count and the records, open, if the records are a hash and the count a string (or
/// none) without a TTL (INCRBY keeps a TTL, a native write would not: the Lua then).
unsafe fn open(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> Option<Keys<2>> {
    let keys = Keys::<2>::open(ctx, &[argv[1], argv[4]]);
    let [count, records] = keys.0;
    let ok = key_type(records) == raw::REDISMODULE_KEYTYPE_HASH
        && is_or_empty(key_type(count), raw::REDISMODULE_KEYTYPE_STRING)
        && api!(RedisModule_GetExpire)(count) == raw::REDISMODULE_NO_EXPIRE as i64;
    ok.then_some(keys)
}

/// `read_records(name)`: the fields, the record `name` and the session record (their names
/// made by the caller).
unsafe fn read(
    ctx: *mut RedisModuleCtx,
    records: *mut RedisModuleKey,
    record: *mut RedisModuleString,
    session: &Str,
) -> Read<FIELDS> {
    let mut r = Read::<FIELDS>::new(ctx);
    let n = &NAMES.get().expect("made at load").0;
    let [keep, prune, wlen, qlen, live, wide, layout, rec_v, ses_v] = &mut r.v;
    api!(RedisModule_HashGet)(
        records,
        raw::REDISMODULE_HASH_NONE as c_int,
        n[0],
        keep as *mut _,
        n[1],
        prune as *mut _,
        n[2],
        wlen as *mut _,
        n[3],
        qlen as *mut _,
        n[4],
        live as *mut _,
        n[5],
        wide as *mut _,
        n[6],
        layout as *mut _,
        record,
        rec_v as *mut _,
        session.ptr,
        ses_v as *mut _,
        ptr::null::<c_char>(),
    );
    r
}

/// `quiet(stored)`: the bookkeeping in place, of this layout, nobody waiting, no grant
/// uncollected, no session record due to be dropped.
fn quiet(s: &Read<FIELDS>, now: u64) -> bool {
    if s.get(LIVE).is_some()
        || s.get(KEEP).is_none()
        || s.get(WIDE_AT).is_none()
        || s.get(LAYOUT_AT) != Some(LAYOUT)
    {
        return false;
    }
    if s.get(WLEN).is_some_and(|w| w != b"0") || s.get(QLEN).is_some_and(|q| q != b"0") {
        return false;
    }
    s.get(PRUNE)
        .and_then(decimal)
        .is_some_and(|prune| now < prune)
}

/// An integer as Redis writes one (`0`, or an optional `-` and digits without a leading zero),
/// within i64.
fn canonical(b: &[u8]) -> Option<i64> {
    let digits = b.strip_prefix(b"-").unwrap_or(b);
    if digits.is_empty()
        || digits.len() > 19
        || (digits[0] == b'0' && b != b"0")
        || !digits.iter().all(u8::is_ascii_digit)
    {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// The count's text (None: no count).
unsafe fn count_text<'a>(key: *mut RedisModuleKey) -> Option<&'a [u8]> {
    if key_type(key) == raw::REDISMODULE_KEYTYPE_EMPTY {
        return None;
    }
    let mut len = 0usize;
    let p = api!(RedisModule_StringDMA)(key, &mut len, raw::REDISMODULE_READ as c_int);
    if p.is_null() {
        None
    } else {
        Some(std::slice::from_raw_parts(p.cast::<u8>(), len))
    }
}

/// `fast_mark(stored, seq, mark)`: the session record with the call marked, if the call is
/// neither stale nor marked and the record needs no renewal and keeps no other marks.
fn fast_mark(s: &Read<FIELDS>, seq_text: &[u8], low: u64, mark: &[u8], now: u64) -> Option<Text> {
    let seq = hex(seq_text)?;
    let session = Session::parse(s.get(SESSION))?;
    if s.get(SESSION).is_some() && (session.stale(seq) || session.marked(seq_text, seq)) {
        return None;
    }
    session.put(low, seq_text, mark, now)
}

/// Set the count to `value` and the session record; raise the events and replicate as
/// `INCRBY count <by>` and `HSET records <session> <record>`.
unsafe fn write(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
    keys: &Keys<2>,
    value: i64,
    by: &[u8],
    session: &Str,
    marked: &Text,
) {
    let [count, records] = keys.0;
    let mut text = Text::new();
    if value < 0 {
        text.push(b"-");
    }
    text.decimal(value.unsigned_abs());
    let v_count = Str::new(ctx, text.as_bytes());
    api!(RedisModule_StringSet)(count, v_count.ptr);
    let v_mark = Str::new(ctx, marked.as_bytes());
    api!(RedisModule_HashSet)(
        records,
        raw::REDISMODULE_HASH_NONE as c_int,
        session.ptr,
        v_mark.ptr,
        ptr::null::<c_char>(),
    );
    let mut effects = Effects::new(ctx);
    effects.notify(raw::REDISMODULE_NOTIFY_STRING, c"incrby", argv[1]);
    effects.notify(raw::REDISMODULE_NOTIFY_HASH, c"hset", argv[4]);
    if effects.replicating() {
        let v_by = Str::new(ctx, by);
        effects.replicate(c"INCRBY", &[argv[1], v_by.ptr]);
        effects.replicate(c"HSET", &[argv[4], session.ptr, v_mark.ptr]);
    }
}

/// The name "<prefix><id>" as a string for this call (None: too long for the native path).
unsafe fn name(ctx: *mut RedisModuleCtx, prefix: &[u8], id: &[u8]) -> Option<Str> {
    Some(Str::new(ctx, Text::of(&[prefix, id])?.as_bytes()))
}

/// permit_acquire natively: the fast path, else (a live semaphore) the general one.
pub(crate) unsafe fn acquire(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> bool {
    fast_acquire(ctx, argv) || general::acquire(ctx, argv)
}

/// permit_add natively: the fast path, else (a live semaphore) the general one.
pub(crate) unsafe fn add(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> bool {
    fast_add(ctx, argv) || general::add(ctx, argv)
}

pub(crate) use general::{batch, poll};

/// permit_acquire's fast path: a new request that the count holds, nobody waiting.
/// ARGV (argv[7..]): 1 id, 2 permits k, 3 mode, 4 waiter lease ms, 5 channel, 6 seq,
/// 7 session id, 8 low mark. Answers whether it replied.
unsafe fn fast_acquire(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> bool {
    if argv.len() != 15 {
        return false;
    }
    let a = |i: usize| api::bytes(argv[6 + i]);
    let (Some(k), Some(low)) = (decimal(a(2)), hex(a(8))) else {
        return false;
    };
    let Some(keys) = open(ctx, argv) else {
        return false;
    };
    let Some((now, _)) = clock::now(ctx) else {
        return false;
    };
    let (Some(record), Some(sess)) = (name(ctx, b"r:", a(1)), name(ctx, b"s:", a(7))) else {
        return false;
    };
    let s = read(ctx, keys.0[1], record.ptr, &sess);
    if s.get(RECORD).is_some() || !quiet(&s, now) {
        return false;
    }
    // read_count(): an integer within +-MAX_INT as the scripts write one, else foreign.
    let Some(count) = count_text(keys.0[0])
        .and_then(canonical)
        .filter(|c| c.abs() <= MAX_INT)
    else {
        return false;
    };
    // (k = 0 would be INCRBY -0, which Redis refuses: the Lua answers it.)
    let k = k as i64;
    if k == 0 || count < k {
        return false;
    }
    let Some(mark) = Text::of(&[b"G", a(2)]) else {
        return false;
    };
    let Some(marked) = fast_mark(&s, a(6), low, mark.as_bytes(), now) else {
        return false;
    };
    let mut by = Text::new();
    by.push(b"-");
    by.decimal(k.unsigned_abs());
    write(ctx, argv, &keys, count - k, by.as_bytes(), &sess, &marked);
    api::reply_array(ctx, 1);
    api::reply_bulk(ctx, b"GRANTED");
    true
}

/// permit_add's fast path: an addition within the range, nobody waiting. ARGV (argv[7..]):
/// 1 request id, 2 delta, 3 seq, 4 session id, 5 low mark. Answers whether it replied.
unsafe fn fast_add(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> bool {
    if argv.len() != 12 {
        return false;
    }
    let a = |i: usize| api::bytes(argv[6 + i]);
    let (Some(delta), Some(low)) = (canonical(a(2)).filter(|d| d.abs() <= MAX_INT), hex(a(5)))
    else {
        return false;
    };
    let Some(keys) = open(ctx, argv) else {
        return false;
    };
    let Some((now, _)) = clock::now(ctx) else {
        return false;
    };
    let Some(sess) = name(ctx, b"s:", a(4)) else {
        return false;
    };
    let s = read(
        ctx,
        keys.0[1],
        NAMES.get().expect("made at load").0[KEEP],
        &sess,
    );
    if !quiet(&s, now) {
        return false;
    }
    let Some(marked) = fast_mark(&s, a(3), low, b"A", now) else {
        return false;
    };
    // INCRBY: an absent count is 0; a value INCRBY refuses, or a result out of range: the Lua.
    let before = match count_text(keys.0[0]) {
        None => 0,
        Some(text) => match canonical(text) {
            Some(n) => n,
            None => return false,
        },
    };
    let Some(count) = before.checked_add(delta) else {
        return false;
    };
    if count.abs() > MAX_INT || before.abs() > MAX_INT {
        return false;
    }
    write(ctx, argv, &keys, count, a(2), &sess, &marked);
    api::reply_array(ctx, 2);
    api::reply_bulk(ctx, b"ADDED");
    api::reply_integer(ctx, count);
    true
}
