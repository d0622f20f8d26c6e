//! The lease semaphore's native paths: `fast_acquire` and `fast_release` of
//! crates/redsem/lua/lease/fast.lua, the uncontended cycle, on the same keys through the
//! module key API.
//!
//! Each takes a call only where the Lua's fast path would, and then does what it does: the
//! same writes, the same records, the same reply. Where it would not (a waiter, a due lease or
//! session record, a label, several units, a resend, a session record to renew, a foreign
//! value, another layout, a number written oddly, ...) it declines before its first write,
//! and the command runs the operation's Lua (crate::delegate), fast path and all.
//!
//! KEYS (lease/layout.lua): 1 leases (zset), 2 queue (zset; not touched here: nobody
//! waits), 3 state (hash), 4 slots (string bitmap); 5 tenants and 6 tqueue (zsets) are
//! dropped before these paths see the call, and any call naming a tenant is declined
//! ([`untenanted`]).

mod call;
mod general;
mod view;

use std::ffi::{c_char, c_int};
use std::ptr;

use crate::api::{
    self, Keys, Read, RedisModuleCtx, RedisModuleKey, RedisModuleString, Str, api, is_or_empty,
    key_type, raw,
};
use crate::clock;
use crate::record::{Session, Text, decimal, fmt, hex};
use crate::replicate::Effects;

/// lease_acquire: the uncontended grant (`fast_acquire`), else the general path on a settled
/// state (general.rs), else declined (the Lua). A request naming a tenant is declined.
pub(crate) unsafe fn acquire(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> bool {
    let Some(argv) = untenanted(argv, false) else {
        return false;
    };
    let argv = &argv[..];
    (!queued(ctx, argv) && fast_acquire(ctx, argv)) || general::acquire(ctx, argv)
}

/// lease_release: the uncontended release (`fast_release`), else the general path.
pub(crate) unsafe fn release(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> bool {
    let Some(argv) = untenanted(argv, false) else {
        return false;
    };
    let argv = &argv[..];
    (!queued(ctx, argv) && fast_release(ctx, argv)) || general::release(ctx, argv)
}

/// Whether the queue key holds anyone: then no fast path applies where the general one would
/// not do the same, and its read of the state is spared. (A fast path needs qlen 0; with the
/// queue not empty the general path grants or releases as it would.)
unsafe fn queued(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> bool {
    if argv.len() < 5 {
        return false;
    }
    // (KeyExists, where the server has it, looks the key up without opening it. A foreign
    // value there sends the call to the general path, which declines it: the Lua serves it.)
    if let Some(exists) = raw::RedisModule_KeyExists {
        return exists(ctx, argv[2]) != 0;
    }
    let queue = Keys::<1>::open(ctx, &argv[2..3]);
    key_type(queue.0[0]) == raw::REDISMODULE_KEYTYPE_ZSET
}

/// lease_batch: the general path. A batch with a request naming a tenant is declined.
pub(crate) unsafe fn batch(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> bool {
    let Some(argv) = untenanted(argv, true) else {
        return false;
    };
    general::batch(ctx, &argv)
}

/// The lease operations' keys as the library this module was built with sends them: the four
/// these paths work on (leases, queue, state, slots), then `tenants` and `tqueue`
/// (lua/lease/tenants.lua), which they never touch: a state with tenants is of layout 3, which
/// every path here declines, and one of layout 2 has nothing in them.
const KEYS_SENT: usize = 6;

/// The command's arguments as these paths know them, without the tenants' two keys and
/// without the tenant, weight and cap of each acquire (an acquire's ARGV 13 to 15; in a batch,
/// the last three of each "a" operation), if every one of those is empty; None (declined: the
/// Lua serves it) if one names a tenant, or the keys are not the ones these paths know.
unsafe fn untenanted(argv: &[*mut RedisModuleString], batch: bool) -> Option<Args> {
    if !lease_keys() || argv.len() <= KEYS_SENT {
        return None;
    }
    let args = &argv[KEYS_SENT + 1..];
    let empty = |at: &[*mut RedisModuleString]| at.iter().all(|a| api::bytes(*a).is_empty());
    if !batch {
        // lease_acquire takes 15 arguments, the last three its tenant's (lease_release 6):
        // the command's name and four keys, then at most 12 (on the stack: no allocation).
        let args = match args.len() {
            15 if empty(&args[12..]) => &args[..12],
            15 => return None,
            n if n <= 12 => args,
            _ => return None,
        };
        let mut out = [ptr::null_mut(); 17];
        out[..5].copy_from_slice(&argv[..5]);
        out[5..5 + args.len()].copy_from_slice(args);
        return Some(Args::Call(out, 5 + args.len()));
    }
    let mut out = Vec::with_capacity(argv.len());
    out.extend_from_slice(&argv[..5]);
    // lease_batch: channel, session id, low mark, then "a" + 12 | "r"/"w" + 2.
    out.extend_from_slice(args.get(..3)?);
    let mut i = 3;
    while i < args.len() {
        match api::bytes(args[i]) {
            b"a" => {
                let op = args.get(i..i + 13)?;
                if !empty(&op[10..]) {
                    return None;
                }
                out.extend_from_slice(&op[..10]);
                i += 13;
            }
            _ => {
                out.extend_from_slice(args.get(i..i + 3)?);
                i += 3;
            }
        }
    }
    Some(Args::Batch(out))
}

/// A lease command's arguments as the native paths take them (see [`untenanted`]).
enum Args {
    /// An acquire's or a release's, and how many.
    Call([*mut RedisModuleString; 17], usize),
    /// A batch's.
    Batch(Vec<*mut RedisModuleString>),
}

impl std::ops::Deref for Args {
    type Target = [*mut RedisModuleString];

    fn deref(&self) -> &Self::Target {
        match self {
            Args::Call(a, n) => &a[..*n],
            Args::Batch(v) => v,
        }
    }
}

/// Whether the lease operations of the library this module was built with take the keys
/// [`untenanted`] knows (lease/layout.lua); with any other layout of keys every call runs
/// the Lua.
fn lease_keys() -> bool {
    static SAME: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *SAME.get_or_init(|| {
        redsem::protocol_operations()
            .any(|(name, keys)| name == "lease_acquire" && keys == KEYS_SENT)
    })
}

/// The layout this protocol writes (lease/layout.lua: LAYOUT).
const LAYOUT: &[u8] = b"2";
/// How late a due session record may be pruned (lease/layout.lua: PRUNE_LAG_MS).
const PRUNE_LAG_MS: u64 = 2000;

/// The state's fields the fast paths read, in this order.
const CAP: usize = 0;
const USED: usize = 1;
const QLEN: usize = 2;
const IDLE: usize = 3;
const TOK: usize = 4;
const NH: usize = 5;
const NEXT: usize = 6;
const TNEXT: usize = 7;
const LAYOUT_AT: usize = 8;
const RECORD: usize = 9;
const SESSION: usize = 10;
const FIELDS: usize = 11;

/// The constant field names as strings made once at load: reading by them makes no string
/// per name per call.
struct Names([*mut RedisModuleString; 9]);
// SAFETY: made at load, read-only afterwards, used on Redis's main thread only.
unsafe impl Send for Names {}
unsafe impl Sync for Names {}
static NAMES: std::sync::OnceLock<Names> = std::sync::OnceLock::new();

/// Make the field names (at load).
pub(crate) unsafe fn init() {
    let names = [
        &b"cap"[..],
        b"used",
        b"qlen",
        b"idle",
        b"tok",
        b"nh",
        b"next",
        b"tnext",
        b"layout",
    ]
    .map(|name| api::create(ptr::null_mut(), name));
    let _ = NAMES.set(Names(names));
}

/// The keys, open, if their types are those a fast path works on: the state a hash, leases a
/// zset or none, slots a string or none.
unsafe fn open(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> Option<Keys<3>> {
    let keys = Keys::<3>::open(ctx, &[argv[1], argv[3], argv[4]]);
    let [leases, state, slots] = keys.0;
    let ok = key_type(state) == raw::REDISMODULE_KEYTYPE_HASH
        && is_or_empty(key_type(leases), raw::REDISMODULE_KEYTYPE_ZSET)
        && is_or_empty(key_type(slots), raw::REDISMODULE_KEYTYPE_STRING);
    ok.then_some(keys)
}

/// `read_state(name)`: the fields, the record `r:<id>` and the session record `s:<session>`
/// (their names made by the caller, which writes them too); `tok` only if `with_tok` (a
/// release makes no token).
#[rustfmt::skip]
unsafe fn read(ctx: *mut RedisModuleCtx, state: *mut RedisModuleKey, record: &Str, session: &Str, with_tok: bool) -> Read<FIELDS> {
    let mut r = Read::<FIELDS>::new(ctx);
    let n = &NAMES.get().expect("made at load").0;
    let [cap, used, qlen, idle, tok, nh, next, tnext, layout, rec_v, ses_v] = &mut r.v;
    let get = api!(RedisModule_HashGet);
    let none = raw::REDISMODULE_HASH_NONE as c_int;
    if with_tok {
        get(state, none, n[CAP], cap as *mut _, n[USED], used as *mut _, n[QLEN], qlen as *mut _, n[IDLE], idle as *mut _,
            n[TOK], tok as *mut _, n[NH], nh as *mut _, n[NEXT], next as *mut _, n[TNEXT], tnext as *mut _,
            n[LAYOUT_AT], layout as *mut _, record.ptr, rec_v as *mut _, session.ptr, ses_v as *mut _, ptr::null::<c_char>());
    } else {
        get(state, none, n[CAP], cap as *mut _, n[USED], used as *mut _, n[QLEN], qlen as *mut _, n[IDLE], idle as *mut _,
            n[NH], nh as *mut _, n[NEXT], next as *mut _, n[TNEXT], tnext as *mut _,
            n[LAYOUT_AT], layout as *mut _, record.ptr, rec_v as *mut _, session.ptr, ses_v as *mut _, ptr::null::<c_char>());
    }
    r
}

/// The fields read, each as its bytes (None: absent), taken once.
type Fields<'a> = [Option<&'a [u8]>; FIELDS];

/// A counter as `count()` reads it: absent is 0.
fn count(s: &Fields, i: usize) -> Option<u64> {
    s[i].map_or(Some(0), decimal)
}

/// `quiet(stored, room)`: of this layout, counters agreeing, nobody queued, no idle TTL,
/// nothing due; with `room`, a unit free. Answers (cap, used, nh, next).
fn quiet(s: &Fields, now: u64, room: bool) -> Option<(u64, u64, u64, u64)> {
    s[CAP]?;
    if s[QLEN] != Some(b"0") || s[LAYOUT_AT] != Some(LAYOUT) || s[NH].is_none() {
        return None;
    }
    if s[IDLE].is_some_and(|idle| idle != b"0") {
        return None;
    }
    let (cap, used, nh) = (count(s, CAP)?, count(s, USED)?, count(s, NH)?);
    if (room && used >= cap) || (used > 0) != (nh > 0) {
        return None;
    }
    let (next, tnext) = (count(s, NEXT)?, count(s, TNEXT)?);
    if next <= now || (tnext > 0 && tnext + PRUNE_LAG_MS <= now) {
        return None;
    }
    Some((cap, used, nh, next))
}

/// The name "<prefix><id>" as a string for this call (None: too long for the native path).
unsafe fn name(ctx: *mut RedisModuleCtx, prefix: &[u8], id: &[u8]) -> Option<Str> {
    Some(Str::new(ctx, Text::of(&[prefix, id])?.as_bytes()))
}

/// What both fast paths start from: the keys open (of the types a fast path works on), the
/// names of the caller's record and session record, and the state read with them.
struct Loaded {
    keys: Keys<3>,
    record: Str,
    sess: Str,
    s: Read<FIELDS>,
}

/// Open the keys and read the state with the record `r:<id>` and the session record
/// `s:<session>` (None: not a fast path's keys, or a name too long).
unsafe fn load(
    ctx: *mut RedisModuleCtx,
    argv: &[*mut RedisModuleString],
    id: &[u8],
    session: &[u8],
    with_tok: bool,
) -> Option<Loaded> {
    let keys = open(ctx, argv)?;
    let (record, sess) = (name(ctx, b"r:", id)?, name(ctx, b"s:", session)?);
    let s = read(ctx, keys.0[1], &record, &sess, with_tok);
    Some(Loaded {
        keys,
        record,
        sess,
        s,
    })
}

/// The slot bitmap's first clear bit (`BITPOS slots 0`: past the end if none; None for an
/// empty string, where BITPOS answers -1 and the Lua's SETBIT fails).
unsafe fn first_clear(key: *mut RedisModuleKey) -> Option<u64> {
    if key_type(key) == raw::REDISMODULE_KEYTYPE_EMPTY {
        return Some(0);
    }
    let mut len = 0usize;
    let p = api!(RedisModule_StringDMA)(key, &mut len, raw::REDISMODULE_READ as c_int);
    let b = if p.is_null() {
        &[][..]
    } else {
        std::slice::from_raw_parts(p.cast::<u8>(), len)
    };
    if b.is_empty() {
        return None;
    }
    for (i, &byte) in b.iter().enumerate() {
        if byte != 0xff {
            return Some(i as u64 * 8 + u64::from((!byte).leading_zeros()));
        }
    }
    Some(len as u64 * 8)
}

/// `SETBIT slots bit on`, growing the string as SETBIT does.
unsafe fn set_bit(key: *mut RedisModuleKey, bit: u64, on: bool) {
    let byte = (bit / 8) as usize;
    let mut len = 0usize;
    let dma = api!(RedisModule_StringDMA);
    let write = raw::REDISMODULE_WRITE as c_int;
    let mut p = if key_type(key) == raw::REDISMODULE_KEYTYPE_EMPTY {
        ptr::null_mut()
    } else {
        dma(key, &mut len, write)
    };
    if p.is_null() || len <= byte {
        api!(RedisModule_StringTruncate)(key, byte + 1);
        p = dma(key, &mut len, write);
    }
    let p = p.cast::<u8>();
    let mask = 0x80u8 >> (bit % 8);
    if on {
        *p.add(byte) |= mask;
    } else {
        *p.add(byte) &= !mask;
    }
}

/// The most bits SETBIT takes (a 512 MB string).
const MAX_BIT: u64 = (1 << 32) - 1;

/// lease_acquire's fast path: one unit, no label, a new request, room and nobody queued.
/// ARGV (argv[5..]): 1 id, 2 capacity, 3 units, 4 lease ms, 5 label, 6 one per label, 7 mode,
/// 8 waiter lease ms, 9 channel, 10 seq, 11 session id, 12 low mark. Answers whether it
/// replied (false: nothing was written, the Lua runs).
unsafe fn fast_acquire(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> bool {
    if argv.len() != 17 {
        return false;
    }
    let a = |i: usize| api::bytes(argv[4 + i]);
    if a(3) != b"1" || !a(5).is_empty() {
        return false;
    }
    let (Some(want), Some(lease), Some(_), Some(seq)) =
        (decimal(a(2)), decimal(a(4)), decimal(a(8)), hex(a(10)))
    else {
        return false;
    };
    let Some(Loaded {
        keys,
        record,
        sess: _,
        s,
    }) = load(ctx, argv, a(1), a(11), true)
    else {
        return false;
    };
    let [leases, state, slots] = keys.0;
    let s = &s.all();
    if s[RECORD].is_some() {
        return false;
    }
    let Some((now, now_us)) = clock::now(ctx) else {
        return false;
    };
    let Some((cap, used, nh, next)) = quiet(s, now, true) else {
        return false;
    };
    if want != cap {
        return false;
    }
    if s[SESSION].is_some() {
        let Some(session) = Session::parse(s[SESSION]) else {
            return false;
        };
        if session.stale(seq) || session.marked(a(10), seq) {
            return false;
        }
    }
    let Some(last) = count(s, TOK) else {
        return false;
    };
    let token = (last + 1).max(now_us);
    let ends = now + lease;
    let slot = if used > 0 {
        first_clear(slots)
    } else {
        Some(0)
    };
    let Some(slot) = slot else {
        return false;
    };
    let mut held = Text::new();
    let made = (|| {
        held.push(b"h|")?
            .decimal(token)?
            .push(b"|1|")?
            .decimal(now)?
            .push(b"|")?
            .decimal(lease)?
            .push(b"|")?;
        held.decimal(slot)?.push(b"|").map(|_| ())
    })();
    if made.is_none() || slot > MAX_BIT || ends > 1 << 53 {
        return false;
    }

    // The writes: SETBIT, ZADD, HSET (with `next` if this lease ends first).
    set_bit(slots, slot, true);
    if key_type(leases) != raw::REDISMODULE_KEYTYPE_EMPTY {
        crate::encoding::crowded(ctx, leases, api!(RedisModule_ValueLength)(leases) + 1);
    }
    let mut flags = 0;
    api!(RedisModule_ZsetAdd)(leases, ends as f64, argv[5], &mut flags);
    let (mut b1, mut b2, mut b3) = ([0u8; 20], [0u8; 20], [0u8; 20]);
    let v_used = Str::new(ctx, fmt(&mut b1, used + 1));
    let v_nh = Str::new(ctx, fmt(&mut b2, nh + 1));
    let v_tok = Str::new(ctx, fmt(&mut b3, token));
    let v_held = Str::new(ctx, held.as_bytes());
    let v_next = (ends < next).then(|| Str::new(ctx, fmt(&mut b1, ends)));
    let n = &NAMES.get().expect("made at load").0;
    let hset = api!(RedisModule_HashSet);
    let none = raw::REDISMODULE_HASH_NONE as c_int;
    match &v_next {
        None => hset(
            state,
            none,
            n[USED],
            v_used.ptr,
            n[NH],
            v_nh.ptr,
            n[TOK],
            v_tok.ptr,
            record.ptr,
            v_held.ptr,
            ptr::null::<c_char>(),
        ),
        Some(v_next) => hset(
            state,
            none,
            n[USED],
            v_used.ptr,
            n[NH],
            v_nh.ptr,
            n[TOK],
            v_tok.ptr,
            record.ptr,
            v_held.ptr,
            n[NEXT],
            v_next.ptr,
            ptr::null::<c_char>(),
        ),
    };

    let mut effects = Effects::new(ctx);
    effects.notify(raw::REDISMODULE_NOTIFY_STRING, c"setbit", argv[4]);
    effects.notify(raw::REDISMODULE_NOTIFY_ZSET, c"zadd", argv[1]);
    effects.notify(raw::REDISMODULE_NOTIFY_HASH, c"hset", argv[3]);
    if effects.replicating() {
        let bit = Str::new(ctx, fmt(&mut b2, slot));
        let end = Str::new(ctx, fmt(&mut b3, ends));
        effects.replicate(c"SETBIT", &[argv[4], bit.ptr, one()]);
        effects.replicate(c"ZADD", &[argv[1], end.ptr, argv[5]]);
        let fields = [
            argv[3], n[USED], v_used.ptr, n[NH], v_nh.ptr, n[TOK], v_tok.ptr, record.ptr,
            v_held.ptr,
        ];
        match &v_next {
            None => effects.replicate(c"HSET", &fields),
            Some(v_next) => {
                effects.replicate(c"HSET", &[&fields[..], &[n[NEXT], v_next.ptr]].concat())
            }
        }
    }

    api::reply_array(ctx, 3);
    api::reply_bulk(ctx, b"GRANTED");
    api::reply_integer(ctx, token as i64);
    api::reply_integer(ctx, slot as i64);
    true
}

/// The slot of a holder record of one unit without a label, "h|token|1|at|lease|slot|"
/// (`^h|%d+|1|%d+|%d+|(%d+)|$`).
fn one_unit_slot(raw: &[u8]) -> Option<u64> {
    let [h, t, k, at, lease, slot, label] = view::seven_fields(raw)?;
    if h != b"h" || k != b"1" || !label.is_empty() {
        return None;
    }
    let digits = |b: &[u8]| !b.is_empty() && b.iter().all(u8::is_ascii_digit);
    if !(digits(t) && digits(at) && digits(lease)) {
        return None;
    }
    decimal(slot).filter(|&s| s <= MAX_BIT)
}

/// lease_release's fast path: a holder of one unit without a label, nobody queued, a session
/// record that needs no renewal and keeps no other marks. ARGV (argv[5..]): 1 id, 2 channel,
/// 3 seq, 4 session id, 5 low mark, 6 "r" | "w". Answers whether it replied.
unsafe fn fast_release(ctx: *mut RedisModuleCtx, argv: &[*mut RedisModuleString]) -> bool {
    if argv.len() != 11 {
        return false;
    }
    let a = |i: usize| api::bytes(argv[4 + i]);
    if a(6) != b"r" {
        return false;
    }
    let (Some(seq), Some(low)) = (hex(a(3)), hex(a(5))) else {
        return false;
    };
    let Some(Loaded {
        keys,
        record,
        sess,
        s,
    }) = load(ctx, argv, a(1), a(4), false)
    else {
        return false;
    };
    let s = &s.all();
    let [leases, state, slots] = keys.0;
    let Some((now, _)) = clock::now(ctx) else {
        return false;
    };
    let Some((_, used, nh, _)) = quiet(s, now, false) else {
        return false;
    };
    let Some(slot) = s[RECORD].and_then(one_unit_slot) else {
        return false;
    };
    let Some(session) = Session::parse(s[SESSION]) else {
        return false;
    };
    if session.stale(seq) {
        return false;
    }
    let Some(marked) = session.put(low, a(3), b"R", now) else {
        return false;
    };

    // The writes: SETBIT, ZREM, HSET, HDEL.
    set_bit(slots, slot, false);
    let mut deleted = 0;
    api!(RedisModule_ZsetRem)(leases, argv[5], &mut deleted);
    let (used, nh) = (used.saturating_sub(1), nh.saturating_sub(1));
    let (mut b1, mut b2) = ([0u8; 20], [0u8; 20]);
    let v_used = Str::new(ctx, fmt(&mut b1, used));
    let v_nh = Str::new(ctx, fmt(&mut b2, nh));
    let v_mark = Str::new(ctx, marked.as_bytes());
    let n = &NAMES.get().expect("made at load").0;
    api!(RedisModule_HashSet)(
        state,
        raw::REDISMODULE_HASH_NONE as c_int,
        n[USED],
        v_used.ptr,
        n[NH],
        v_nh.ptr,
        sess.ptr,
        v_mark.ptr,
        record.ptr,
        api::HASH_DELETE,
        ptr::null::<c_char>(),
    );

    let mut effects = Effects::new(ctx);
    effects.notify(raw::REDISMODULE_NOTIFY_STRING, c"setbit", argv[4]);
    effects.notify(raw::REDISMODULE_NOTIFY_ZSET, c"zrem", argv[1]);
    effects.notify(raw::REDISMODULE_NOTIFY_HASH, c"hset", argv[3]);
    effects.notify(raw::REDISMODULE_NOTIFY_HASH, c"hdel", argv[3]);
    if effects.replicating() {
        let bit = Str::new(ctx, fmt(&mut b1, slot));
        effects.replicate(c"SETBIT", &[argv[4], bit.ptr, zero()]);
        effects.replicate(c"ZREM", &[argv[1], argv[5]]);
        effects.replicate(
            c"HSET",
            &[
                argv[3], n[USED], v_used.ptr, n[NH], v_nh.ptr, sess.ptr, v_mark.ptr,
            ],
        );
        effects.replicate(c"HDEL", &[argv[3], record.ptr]);
    }

    api::reply_array(ctx, 2);
    api::reply_bulk(ctx, b"RELEASED");
    api::reply_integer(ctx, i64::from(used == 0));
    true
}

/// The strings "1" and "0", made once.
struct Bits([*mut RedisModuleString; 2]);
// SAFETY: made at load, read-only afterwards, main thread only.
unsafe impl Send for Bits {}
unsafe impl Sync for Bits {}
static BITS: std::sync::OnceLock<Bits> = std::sync::OnceLock::new();

fn bit_text(i: usize) -> *mut RedisModuleString {
    BITS.get_or_init(|| {
        // SAFETY: a string with no context (kept for the module's life).
        Bits(unsafe {
            [
                api::create(ptr::null_mut(), b"0"),
                api::create(ptr::null_mut(), b"1"),
            ]
        })
    })
    .0[i]
}

fn zero() -> *mut RedisModuleString {
    bit_text(0)
}

fn one() -> *mut RedisModuleString {
    bit_text(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A settled state: capacity 2, one holder, its lease ending at 20 s, no session record
    /// registered for pruning; read at 10 s.
    const NOW: u64 = 10_000;

    fn state() -> Fields<'static> {
        let mut s: Fields = [None; FIELDS];
        s[CAP] = Some(b"2");
        s[USED] = Some(b"1");
        s[QLEN] = Some(b"0");
        s[NH] = Some(b"1");
        s[NEXT] = Some(b"20000");
        s[LAYOUT_AT] = Some(LAYOUT);
        s
    }

    fn with(changes: &[(usize, Option<&'static [u8]>)]) -> Fields<'static> {
        let mut s = state();
        for &(i, v) in changes {
            s[i] = v;
        }
        s
    }

    #[test]
    fn a_fast_path_takes_only_a_settled_state_of_its_layout() {
        assert_eq!(quiet(&state(), NOW, true), Some((2, 1, 1, 20_000)));
        assert_eq!(quiet(&state(), NOW, false), Some((2, 1, 1, 20_000)));
        // Nothing held: the counters agree at zero.
        let empty = with(&[(USED, None), (NH, Some(b"0"))]);
        assert_eq!(quiet(&empty, NOW, true), Some((2, 0, 0, 20_000)));
        // An idle TTL of 0 is none.
        assert!(quiet(&with(&[(IDLE, Some(b"0"))]), NOW, true).is_some());
        for (why, s) in [
            ("no capacity", with(&[(CAP, None)])),
            ("someone queued", with(&[(QLEN, Some(b"1"))])),
            ("no queue count", with(&[(QLEN, None)])),
            ("another layout", with(&[(LAYOUT_AT, Some(b"3"))])),
            ("no layout", with(&[(LAYOUT_AT, None)])),
            ("no holder count", with(&[(NH, None)])),
            ("an idle TTL", with(&[(IDLE, Some(b"5"))])),
            ("a count written oddly", with(&[(USED, Some(b"01x"))])),
            ("holders but no units", with(&[(USED, Some(b"0"))])),
            ("units but no holders", with(&[(NH, Some(b"0"))])),
            ("a lease end due", with(&[(NEXT, Some(b"10000"))])),
            ("no lease end", with(&[(NEXT, None)])),
            ("a session record due", with(&[(TNEXT, Some(b"8000"))])),
        ] {
            assert_eq!(quiet(&s, NOW, false), None, "{why}");
        }
    }

    #[test]
    fn a_fast_acquire_needs_a_free_unit_and_a_session_record_is_due_after_its_lag() {
        let full = with(&[(USED, Some(b"2"))]);
        assert_eq!(quiet(&full, NOW, true), None);
        assert_eq!(quiet(&full, NOW, false), Some((2, 2, 1, 20_000)));
        // A lease end one millisecond ahead is not due.
        let next = with(&[(NEXT, Some(b"10001"))]);
        assert_eq!(quiet(&next, NOW, true), Some((2, 1, 1, 10_001)));
        // A session record registered for pruning is due PRUNE_LAG_MS after its expiry.
        let not_due = (NOW - PRUNE_LAG_MS + 1).to_string().into_bytes().leak();
        let due = (NOW - PRUNE_LAG_MS).to_string().into_bytes().leak();
        assert!(quiet(&with(&[(TNEXT, Some(not_due))]), NOW, true).is_some());
        assert!(quiet(&with(&[(TNEXT, Some(due))]), NOW, true).is_none());
        // One registered later than now is not due either; none registered, 0, neither.
        assert!(quiet(&with(&[(TNEXT, Some(b"10500"))]), NOW, true).is_some());
        assert!(quiet(&with(&[(TNEXT, Some(b"0"))]), NOW, true).is_some());
    }

    #[test]
    fn a_counter_absent_reads_as_zero_and_one_written_oddly_as_none() {
        let s = with(&[(USED, Some(b"7")), (TOK, Some(b"-1"))]);
        assert_eq!(count(&s, USED), Some(7));
        assert_eq!(count(&s, TNEXT), Some(0));
        assert_eq!(count(&s, TOK), None);
    }

    #[test]
    fn the_fast_release_reads_the_slot_of_a_plain_one_unit_holder_record() {
        assert_eq!(one_unit_slot(b"h|17|1|100|5000|3|"), Some(3));
        assert_eq!(one_unit_slot(b"h|17|1|100|5000|4294967295|"), Some(MAX_BIT));
        for odd in [
            &b"h|17|1|100|5000|4294967296|"[..], // past the last bit SETBIT takes
            b"h|17|2|100|5000|3-4|",             // two units
            b"h|17|1|100|5000|3|a",              // a label
            b"w|1|100|5000|300|2|c0",            // a waiter
            b"x|17|1|100|5000|3|",
            b"h|1x|1|100|5000|3|",
            b"h||1|100|5000|3|",
            b"h|17|1|1.5|5000|3|",
            b"h|17|1||5000|3|",
            b"h|17|1|100|-1|3|",
            b"h|17|1|100||3|",
            b"h|17|1|100|5000|3",
            b"h|17|1|100|5000||",
        ] {
            assert_eq!(one_unit_slot(odd), None, "{}", String::from_utf8_lossy(odd));
        }
    }
}
