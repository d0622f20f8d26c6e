//! Thin wrappers over the Redis module C API: the function pointers `RedisModule_Init` fills,
//! called directly (the `redis-module` crate's safe layer allocates per call, and the hot
//! paths are a few dozen API calls each).
//!
//! Everything here is `unsafe`: it must run on Redis's main thread, inside a command (or the
//! load) whose context `ctx` is, with strings and keys that context owns.

use std::ffi::{CStr, c_char, c_int};

pub(crate) use redis_module::raw::{
    self, RedisModuleCallReply, RedisModuleCtx, RedisModuleKey, RedisModuleString,
};

pub(crate) const OK: c_int = raw::REDISMODULE_OK as c_int;
pub(crate) const ERR: c_int = raw::REDISMODULE_ERR as c_int;
/// `REDISMODULE_HASH_DELETE`: the value that deletes a field in `RedisModule_HashSet`.
#[allow(clippy::manual_dangling_ptr)] // (the C header's value, 1: not a pointer to anything)
pub(crate) const HASH_DELETE: *mut RedisModuleString = 1usize as *mut RedisModuleString;

/// An API function by its name: filled at load, so never absent in a loaded module.
macro_rules! api {
    ($name:ident) => {{
        // SAFETY: written once by RedisModule_Init at load, before any command runs.
        #[allow(unused_unsafe)]
        let f = unsafe { $crate::api::raw::$name };
        f.expect(concat!(stringify!($name), " is filled by RedisModule_Init"))
    }};
}
pub(crate) use api;

/// A command's arguments as a slice (`argv[0]` is the command's name).
pub(crate) unsafe fn args<'a>(
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> &'a [*mut RedisModuleString] {
    if argv.is_null() || argc <= 0 {
        return &[];
    }
    std::slice::from_raw_parts(argv, argc as usize)
}

/// The bytes of a string (valid while the string lives).
pub(crate) unsafe fn bytes<'a>(s: *const RedisModuleString) -> &'a [u8] {
    let mut len = 0usize;
    let p = api!(RedisModule_StringPtrLen)(s, &mut len);
    if p.is_null() {
        return &[];
    }
    std::slice::from_raw_parts(p.cast::<u8>(), len)
}

/// A new string holding `b` (freed with [`free`], or by the context's automatic memory).
pub(crate) unsafe fn create(ctx: *mut RedisModuleCtx, b: &[u8]) -> *mut RedisModuleString {
    api!(RedisModule_CreateString)(ctx, b.as_ptr().cast::<c_char>(), b.len())
}

/// Free a string made by [`create`] (null: nothing).
pub(crate) unsafe fn free(ctx: *mut RedisModuleCtx, s: *mut RedisModuleString) {
    if !s.is_null() {
        api!(RedisModule_FreeString)(ctx, s);
    }
}

/// A string made for one call, freed when dropped.
pub(crate) struct Str {
    ctx: *mut RedisModuleCtx,
    pub(crate) ptr: *mut RedisModuleString,
}

impl Str {
    pub(crate) unsafe fn new(ctx: *mut RedisModuleCtx, b: &[u8]) -> Str {
        Str {
            ctx,
            ptr: create(ctx, b),
        }
    }
}

impl std::fmt::Debug for Str {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Str")
    }
}

impl Drop for Str {
    fn drop(&mut self) {
        // SAFETY: made by `new` in the same command, freed once.
        unsafe { free(self.ctx, self.ptr) };
    }
}

/// Reply with a bulk string.
pub(crate) unsafe fn reply_bulk(ctx: *mut RedisModuleCtx, b: &[u8]) {
    api!(RedisModule_ReplyWithStringBuffer)(ctx, b.as_ptr().cast::<c_char>(), b.len());
}

/// Reply with an integer.
pub(crate) unsafe fn reply_integer(ctx: *mut RedisModuleCtx, n: i64) {
    api!(RedisModule_ReplyWithLongLong)(ctx, n);
}

/// Reply with an array of `n` elements (the next `n` replies).
pub(crate) unsafe fn reply_array(ctx: *mut RedisModuleCtx, n: usize) {
    api!(RedisModule_ReplyWithArray)(ctx, n as std::ffi::c_long);
}

/// Reply with an error (`msg` starts with its code, as `ERR ...`).
pub(crate) unsafe fn reply_error(ctx: *mut RedisModuleCtx, msg: &CStr) -> c_int {
    api!(RedisModule_ReplyWithError)(ctx, msg.as_ptr());
    OK
}

/// The type of an opened key, as `REDISMODULE_KEYTYPE_*`.
pub(crate) unsafe fn key_type(key: *mut RedisModuleKey) -> isize {
    api!(RedisModule_KeyType)(key) as isize
}

/// The keys of one call, opened for reading and writing, closed when dropped.
pub(crate) struct Keys<const N: usize>(pub(crate) [*mut RedisModuleKey; N]);

impl<const N: usize> Keys<N> {
    /// Open `names` (the command's key arguments).
    pub(crate) unsafe fn open(ctx: *mut RedisModuleCtx, names: &[*mut RedisModuleString]) -> Self {
        let mode = (raw::REDISMODULE_READ | raw::REDISMODULE_WRITE) as c_int;
        let open = api!(RedisModule_OpenKey);
        Keys(std::array::from_fn(|i| {
            open(ctx, names[i], mode).cast::<RedisModuleKey>()
        }))
    }
}

impl<const N: usize> std::fmt::Debug for Keys<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Keys")
    }
}

impl<const N: usize> Drop for Keys<N> {
    fn drop(&mut self) {
        let close = api!(RedisModule_CloseKey);
        for key in self.0 {
            // SAFETY: opened by `open` in the same command, closed once.
            unsafe { close(key) };
        }
    }
}

/// Whether `t` (a key's type) is `want` or no key at all.
pub(crate) fn is_or_empty(t: isize, want: isize) -> bool {
    t == want || t == raw::REDISMODULE_KEYTYPE_EMPTY
}

/// Values read from a hash by [`hash_get`], freed when dropped. Null: the field is absent.
pub(crate) struct Read<const N: usize> {
    ctx: *mut RedisModuleCtx,
    pub(crate) v: [*mut RedisModuleString; N],
}

impl<const N: usize> Read<N> {
    /// Every field as read (None: absent), each string's bytes taken once.
    pub(crate) fn all(&self) -> [Option<&[u8]>; N] {
        std::array::from_fn(|i| self.get(i))
    }

    /// The field at `i` as read (None: absent).
    pub(crate) fn get(&self, i: usize) -> Option<&[u8]> {
        let s = self.v[i];
        // SAFETY: a string read by HashGet, alive until drop.
        if s.is_null() {
            None
        } else {
            Some(unsafe { bytes(s) })
        }
    }
}

impl<const N: usize> std::fmt::Debug for Read<N> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Read")
    }
}

impl<const N: usize> Drop for Read<N> {
    fn drop(&mut self) {
        for s in self.v {
            // SAFETY: strings HashGet made, freed once.
            unsafe { free(self.ctx, s) };
        }
    }
}

impl<const N: usize> Read<N> {
    pub(crate) fn new(ctx: *mut RedisModuleCtx) -> Self {
        Read {
            ctx,
            v: [std::ptr::null_mut(); N],
        }
    }
}
