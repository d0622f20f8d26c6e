//! Sorted sets kept as skip lists once they hold a crowd.
//!
//! Redis keeps a sorted set of up to `zset-max-listpack-entries` (128) members as a listpack,
//! which every insert walks member by member twice (is the member there? where does its score
//! go?): about 20 k instructions per `ZADD` at 64 members, most of a contended cycle's cost.
//! A skip list inserts and removes in a few hundred. Redis's limits are about memory; for a
//! queue that changes on every cycle the time matters more, so the native paths turn a lease
//! semaphore's set into a skip list as it reaches [`SKIPLIST_AT`] members.
//!
//! The module API has no call for an encoding. Redis converts a listpack as soon as a member
//! longer than `zset-max-listpack-value` is added, and does not convert back when it is
//! removed (only a key emptied and made again starts as a listpack), so [`crowded`] adds such
//! a member, [`PAD`], and removes it in the same command: the key's contents are as before,
//! nothing is replicated or notified for it (replicas and the AOF get the call's own writes
//! and keep their own encoding), and the Lua, which reads the same key, gets the same
//! answers from either encoding.

use std::ffi::c_int;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::api::{
    self, RedisModuleCtx, RedisModuleKey, RedisModuleString, Str, api, key_type, raw,
};

/// A set of this many members or more is kept as a skip list by the native paths, unless
/// the load argument `skiplist-at N` says otherwise (0: never).
pub(crate) const SKIPLIST_AT: usize = 16;
static THRESHOLD: AtomicUsize = AtomicUsize::new(SKIPLIST_AT);

/// The load argument `skiplist-at N`.
pub(crate) fn configure(value: &str) -> Result<(), String> {
    let n = value
        .parse::<usize>()
        .map_err(|_| format!("`skiplist-at` wants a number of members, not `{value}`"))?;
    THRESHOLD.store(n, Ordering::Relaxed);
    Ok(())
}

/// The longest member padding is made for: a server whose `zset-max-listpack-value` is
/// longer keeps its listpacks (padding that long would cost more than it saves).
const LONGEST_PAD: usize = 1024;

/// `zset-max-listpack-value` as read at load (64 if it could not be read).
static LISTPACK_VALUE: AtomicUsize = AtomicUsize::new(64);

/// The padding member's first bytes (a member no client of redsem writes; if one ever is,
/// ZADD NX leaves it and nothing of it is removed).
pub(crate) const PAD: &[u8] = b"\xffredsem:skiplist:";

/// Read `zset-max-listpack-value` (at load; a server that refuses CONFIG GET keeps 64).
pub(crate) unsafe fn init(ctx: *mut RedisModuleCtx) {
    let reply = api!(RedisModule_Call)(
        ctx,
        c"CONFIG".as_ptr(),
        c"cc".as_ptr(),
        c"GET".as_ptr(),
        c"zset-max-listpack-value".as_ptr(),
    );
    if reply.is_null() {
        return;
    }
    if api!(RedisModule_CallReplyType)(reply) == raw::REDISMODULE_REPLY_ARRAY as c_int
        && api!(RedisModule_CallReplyLength)(reply) == 2
    {
        let value = api!(RedisModule_CallReplyArrayElement)(reply, 1);
        let mut len = 0usize;
        let p = api!(RedisModule_CallReplyStringPtr)(value, &mut len);
        if !p.is_null()
            && let Some(n) = std::str::from_utf8(std::slice::from_raw_parts(p.cast::<u8>(), len))
                .ok()
                .and_then(|s| s.parse::<usize>().ok())
        {
            LISTPACK_VALUE.store(n, Ordering::Relaxed);
        }
    }
    api!(RedisModule_FreeCallReply)(reply);
}

/// The padding member for a limit of `limit` bytes (None: too long to be worth it).
fn pad(limit: usize) -> Option<Vec<u8>> {
    if limit >= LONGEST_PAD {
        return None;
    }
    let mut member = PAD.to_vec();
    member.resize(limit.max(PAD.len()) + 1, b'.');
    Some(member)
}

/// A set that will hold `members` members after this call's writes: a skip list from now on
/// if that is [`SKIPLIST_AT`] or more (an empty key is left alone: it is made by the writes).
pub(crate) unsafe fn crowded(ctx: *mut RedisModuleCtx, key: *mut RedisModuleKey, members: usize) {
    let at = THRESHOLD.load(Ordering::Relaxed);
    if at == 0 || members < at || key_type(key) != raw::REDISMODULE_KEYTYPE_ZSET {
        return;
    }
    let Some(member) = pad(LISTPACK_VALUE.load(Ordering::Relaxed)) else {
        return;
    };
    let m = Str::new(ctx, &member);
    let mut flags = raw::REDISMODULE_ZADD_NX as c_int;
    if api!(RedisModule_ZsetAdd)(key, f64::NEG_INFINITY, m.ptr, &mut flags) == api::OK
        && flags & raw::REDISMODULE_ZADD_ADDED as c_int != 0
    {
        let mut deleted = 0;
        api!(RedisModule_ZsetRem)(key, m.ptr, &mut deleted);
    }
}

/// Before the Lua serves a call: the crowded sorted sets among its keys (`names`, those at
/// `sets`) made skip lists, so that the Lua's ZADDs and ZRANGEs on them cost what the native
/// paths' do. A key is opened for writing only if it is a set that crowded.
pub(crate) unsafe fn before_lua(
    ctx: *mut RedisModuleCtx,
    names: &[*mut RedisModuleString],
    sets: &[usize],
) {
    let at = THRESHOLD.load(Ordering::Relaxed);
    if at == 0 {
        return;
    }
    let open = api!(RedisModule_OpenKey);
    let close = api!(RedisModule_CloseKey);
    for &i in sets {
        let Some(&name) = names.get(i) else {
            continue;
        };
        let key = open(ctx, name, raw::REDISMODULE_READ as c_int).cast::<RedisModuleKey>();
        let members = if key_type(key) == raw::REDISMODULE_KEYTYPE_ZSET {
            api!(RedisModule_ValueLength)(key)
        } else {
            0
        };
        close(key);
        if members >= at {
            let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int;
            let key = open(ctx, name, mode).cast::<RedisModuleKey>();
            crowded(ctx, key, members);
            close(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_padding_is_one_byte_longer_than_the_limit_and_none_past_the_longest() {
        assert_eq!(pad(64).map(|m| m.len()), Some(65));
        assert!(pad(64).unwrap().starts_with(PAD));
        assert_eq!(pad(0).map(|m| m.len()), Some(PAD.len() + 1));
        assert_eq!(pad(LONGEST_PAD - 1).map(|m| m.len()), Some(LONGEST_PAD));
        assert_eq!(pad(LONGEST_PAD), None);
    }
}
