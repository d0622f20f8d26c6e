//! redsem's native engine: a Redis module that serves every operation of the protocol as a
//! command, on the same keys in the same layout as the Lua library, with the same replies.
//!
//! ```text
//! redis-server --loadmodule target/release/libredsem_module.so
//! REDSEM.LEASE_ACQUIRE <leases> <queue> <state> <slots> <the ARGV of lease_acquire>
//! REDSEM.ENGINE          -> ["native", <module version>, <library name>, <native calls>, <Lua calls>]
//! ```
//!
//! One command per operation, `REDSEM.<OPERATION>` (`lease_acquire`, `permit_add`, ...: the
//! functions of the Lua library, crates/redsem/lua), taking the operation's keys and then its
//! ARGV exactly as the function takes them. No `numkeys`: every operation of a primitive takes
//! the same keys (the lease semaphore six, the latch four, the permit semaphore six).
//!
//! Each command first tries its native paths, if the operation has them: the uncontended
//! cycles of both semaphores (the Lua's fast paths done through the module key API, taken only
//! where the Lua's would be), and their contended calls (`lease/general.rs`,
//! `permit/general.rs`: worked out in memory, written only when the whole call is one they
//! take). Every other call runs the operation's Lua function within the
//! same command (`delegate`): so both engines answer every call alike, one semaphore can be
//! served by both at once, and a server, replica or client without the module goes on with
//! the scripts. The differential runner (crates/redsem-verify, docs/DIFFERENTIAL.md) checks
//! the two engines call by call.
//!
//! Load arguments, for tests and measurement only: `library <name>` (run the functions of the
//! library `<name>`, loaded by the test, instead of the shipped one), `clock <key>` (read the
//! time from the list `<key>`, `[seconds, microseconds]`), `noreplicate` (do not replicate the
//! native paths' writes: what that costs, never for use). And one for use: `skiplist-at N`
//! (keep a semaphore's sorted sets as skip lists from N members, 16 unless given; 0:
//! leave them to Redis's `zset-max-listpack-entries`; see `encoding`).

#![allow(unsafe_code)]

mod api;
mod clock;
mod delegate;
mod encoding;
mod hash;
mod lease;
mod permit;
mod record;
mod replicate;
mod reply;
mod session;
mod zset;

use std::ffi::{CString, c_int};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use api::{ERR, OK, RedisModuleCtx, RedisModuleString, api, args, bytes, raw};
use delegate::Function;

/// A native path: replies and answers true, or declines (false) before any write.
type Native = unsafe fn(*mut RedisModuleCtx, &[*mut RedisModuleString]) -> bool;

/// One served operation: its Lua function and its native path, if any.
#[derive(Debug)]
struct Operation {
    function: Function,
    /// How many keys it takes (its primitive's).
    keys: usize,
    native: Option<Native>,
    /// Which of its keys are sorted sets (see encoding::before_lua).
    sets: &'static [usize],
}

static OPERATIONS: OnceLock<Vec<Operation>> = OnceLock::new();

/// Calls served by a native path, and by the Lua, since the module was loaded.
static NATIVE_CALLS: AtomicU64 = AtomicU64::new(0);
static LUA_CALLS: AtomicU64 = AtomicU64::new(0);

/// The native path of the operation `name`, if it has one.
fn native_path(name: &str) -> Option<Native> {
    match name {
        "lease_acquire" => Some(lease::acquire),
        "lease_release" => Some(lease::release),
        "lease_batch" => Some(lease::batch),
        "permit_acquire" => Some(permit::acquire),
        "permit_add" => Some(permit::add),
        "permit_poll" => Some(permit::poll),
        "permit_batch" => Some(permit::batch),
        _ => None,
    }
}

/// The keys of the operation `name` that are sorted sets which grow with the waiters (the
/// layouts: lease/layout.lua, permit/layout.lua).
fn sorted_sets(name: &str) -> &'static [usize] {
    if name.starts_with("lease_") {
        &[0, 1, 4, 5] // leases, queue, tenants, tqueue
    } else if name.starts_with("permit_") {
        &[1, 2] // queue, waiters
    } else {
        &[]
    }
}

/// Serve the operation at `index` of [`OPERATIONS`].
unsafe fn serve(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
    index: usize,
) -> c_int {
    let argv = args(argv, argc);
    let Some(op) = OPERATIONS.get().and_then(|ops| ops.get(index)) else {
        return api::reply_error(ctx, c"ERR redsem: no such operation");
    };
    if argv.len() <= op.keys {
        return api!(RedisModule_WrongArity)(ctx);
    }
    if let Some(native) = op.native
        && native(ctx, argv)
    {
        NATIVE_CALLS.fetch_add(1, Relaxed);
        return OK;
    }
    LUA_CALLS.fetch_add(1, Relaxed);
    encoding::before_lua(ctx, &argv[1..=op.keys], op.sets);
    delegate::run(ctx, &op.function, argv)
}

/// One `extern "C"` handler per operation index (Redis calls a plain function per command).
macro_rules! handlers {
    ($($i:literal)*) => {
        const HANDLERS: &[raw::RedisModuleCmdFunc] = &[$({
            unsafe extern "C" fn handler(ctx: *mut RedisModuleCtx, argv: *mut *mut RedisModuleString, argc: c_int) -> c_int {
                // SAFETY: called by Redis with the command's context and arguments.
                unsafe { serve(ctx, argv, argc, $i) }
            }
            Some(handler)
        }),*];
    };
}

handlers!(0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30 31);

/// `REDSEM.ENGINE`: `["native", <module version>, <library name>, <calls served natively>,
/// <calls served by the Lua>]`, how a client finds the module (one command).
unsafe extern "C" fn engine(
    ctx: *mut RedisModuleCtx,
    _argv: *mut *mut RedisModuleString,
    _argc: c_int,
) -> c_int {
    // SAFETY: called by Redis with the command's context.
    unsafe {
        api::reply_array(ctx, 5);
        api::reply_bulk(ctx, b"native");
        api::reply_bulk(ctx, env!("CARGO_PKG_VERSION").as_bytes());
        api::reply_bulk(ctx, redsem::protocol_library().0.as_bytes());
        api::reply_integer(ctx, NATIVE_CALLS.load(Relaxed) as i64);
        api::reply_integer(ctx, LUA_CALLS.load(Relaxed) as i64);
    }
    OK
}

/// Apply the load arguments.
unsafe fn configure(argv: &[*mut RedisModuleString]) -> Result<(), String> {
    let mut library = None;
    let mut i = 0;
    while i < argv.len() {
        let arg = String::from_utf8_lossy(bytes(argv[i])).into_owned();
        let value = || {
            argv.get(i + 1)
                .map(|v| String::from_utf8_lossy(bytes(*v)).into_owned())
        };
        match arg.as_str() {
            "library" => {
                library = Some(value().ok_or("`library` wants a name")?);
                i += 1;
            }
            "clock" => {
                clock::plant(&value().ok_or("`clock` wants a key")?)?;
                i += 1;
            }
            "skiplist-at" => {
                encoding::configure(&value().ok_or("`skiplist-at` wants a number")?)?;
                i += 1;
            }
            "noreplicate" => replicate::switch_off(),
            other => return Err(format!("unknown load argument `{other}`")),
        }
        i += 1;
    }
    delegate::configure(library.as_deref())
}

/// Log `msg` at warning level (at load, before failing it).
unsafe fn warn(ctx: *mut RedisModuleCtx, msg: &str) {
    if let Ok(msg) = CString::new(msg) {
        api!(RedisModule_Log)(ctx, c"warning".as_ptr(), c"%s".as_ptr(), msg.as_ptr());
    }
}

/// # Safety
/// Called by Redis when it loads the module.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn RedisModule_OnLoad(
    ctx: *mut RedisModuleCtx,
    argv: *mut *mut RedisModuleString,
    argc: c_int,
) -> c_int {
    unsafe {
        if raw::Export_RedisModule_Init(
            ctx,
            c"redsem".as_ptr(),
            1,
            raw::REDISMODULE_APIVER_1 as c_int,
        ) == ERR
        {
            return ERR;
        }
        if let Err(e) = configure(args(argv, argc)) {
            warn(ctx, &format!("redsem: {e}"));
            return ERR;
        }
        if replicate::watch(ctx) == ERR {
            warn(
                ctx,
                "redsem: could not follow the server's replication events",
            );
            return ERR;
        }
        encoding::init(ctx);
        lease::init();
        permit::init();
        let names: Vec<(&'static str, usize)> = redsem::protocol_operations().collect();
        if names.len() > HANDLERS.len() {
            warn(ctx, "redsem: more operations than handlers");
            return ERR;
        }
        let ops = names
            .iter()
            .map(|&(name, keys)| Operation {
                function: Function::of(name, keys),
                keys,
                native: native_path(name),
                sets: sorted_sets(name),
            })
            .collect();
        if OPERATIONS.set(ops).is_err() {
            return ERR;
        }
        let create = api!(RedisModule_CreateCommand);
        for (&(name, keys), handler) in names.iter().zip(HANDLERS) {
            let Ok(command) = CString::new(format!("redsem.{name}")) else {
                return ERR;
            };
            // The keys come first (one hash tag: one slot), so a cluster routes and checks them.
            if create(
                ctx,
                command.as_ptr(),
                *handler,
                c"write deny-oom".as_ptr(),
                1,
                keys as c_int,
                1,
            ) == ERR
            {
                return ERR;
            }
        }
        if create(
            ctx,
            c"redsem.engine".as_ptr(),
            Some(engine),
            c"readonly fast".as_ptr(),
            0,
            0,
            0,
        ) == ERR
        {
            return ERR;
        }
    }
    OK
}
