//! The time a native path runs at, read once per call, as the scripts read it: the server's
//! clock (`TIME`, gettimeofday), in milliseconds and microseconds.
//!
//! A test configuration (`clock <key>` at load) plants it instead: the list at `<key>` holds
//! `[seconds, microseconds]` as `TIME` answers, the same key the differential runner's Lua
//! variants read, so both engines of a run see the same now.

use std::ffi::CString;
use std::sync::OnceLock;
use std::time::{SystemTime, UNIX_EPOCH};

use crate::api::{RedisModuleCtx, api, raw};

static PLANTED: OnceLock<CString> = OnceLock::new();

/// Plant the clock at the list `key` (a test configuration).
pub(crate) fn plant(key: &str) -> Result<(), String> {
    let key = CString::new(key).map_err(|_| "a clock key with a NUL byte".to_owned())?;
    PLANTED
        .set(key)
        .map_err(|_| "the clock was planted twice".to_owned())
}

/// Now: (ms, µs) since the epoch. None when a planted clock cannot be read (the call then
/// takes the reference path, which fails or reads it as the scripts do).
pub(crate) unsafe fn now(ctx: *mut RedisModuleCtx) -> Option<(u64, u64)> {
    let us = match PLANTED.get() {
        None => {
            let d = SystemTime::now().duration_since(UNIX_EPOCH).ok()?;
            d.as_secs() * 1_000_000 + u64::from(d.subsec_micros())
        }
        Some(key) => planted(ctx, key)?,
    };
    Some((us / 1000, us))
}

unsafe fn planted(ctx: *mut RedisModuleCtx, key: &CString) -> Option<u64> {
    let reply = api!(RedisModule_Call)(
        ctx,
        c"LRANGE".as_ptr(),
        c"ccc".as_ptr(),
        key.as_ptr(),
        c"0".as_ptr(),
        c"1".as_ptr(),
    );
    if reply.is_null() {
        return None;
    }
    let number = |i: usize| -> Option<u64> {
        let element = api!(RedisModule_CallReplyArrayElement)(reply, i);
        if element.is_null()
            || api!(RedisModule_CallReplyType)(element) != raw::REDISMODULE_REPLY_STRING as i32
        {
            return None;
        }
        let mut len = 0usize;
        let p = api!(RedisModule_CallReplyStringPtr)(element, &mut len);
        std::str::from_utf8(std::slice::from_raw_parts(p.cast::<u8>(), len))
            .ok()?
            .parse()
            .ok()
    };
    let now = match (number(0), number(1)) {
        (Some(s), Some(us)) => Some(s * 1_000_000 + us),
        _ => None,
    };
    api!(RedisModule_FreeCallReply)(reply);
    now
}
