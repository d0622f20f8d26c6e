//! What a native path's writes tell the rest of the server: keyspace events, as the commands
//! the scripts send would raise them, and replication of the writes as those plain commands
//! (`SETBIT`, `ZADD`, `HSET`, ...), so a replica or an AOF without the module follows, as
//! they follow the scripts' effects. Redis wraps them, with the command's other effects, in
//! one `MULTI`/`EXEC`.
//!
//! Replicating costs a native cycle about a quarter of its work (`RedisModule_Replicate`
//! looks the command up by name and builds its arguments), and Redis pays it even where
//! nothing listens: it drops the effects only afterwards. So the module replicates only
//! where Redis would send the effects anywhere, by Redis's own rule: the AOF is on, or this
//! server is a primary with a replication backlog or replicas (or a replica: its writes
//! come from its primary, never from a client). The AOF is asked on every call (the context
//! flags); the backlog is read from `INFO replication` when it can have changed: at load,
//! when loading ends, when a child is forked (a full sync forks after the backlog is made,
//! and before it every write lands in the snapshot the replica loads), and when a replica
//! or this server's role changes. Between those it only stays or appears (a backlog is freed
//! only after `repl-backlog-ttl` without replicas, and then replicating on is merely
//! wasted work), so the rule errs on the side of replicating.

use std::ffi::{CStr, c_char, c_int};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::api::{ERR, OK, RedisModuleCtx, RedisModuleString, api, raw};

/// Off only by the load argument `noreplicate`: for measuring what replication costs, never
/// for use (a replica or the AOF would miss the native paths' writes).
static REPLICATE: AtomicBool = AtomicBool::new(true);

/// Whether a replica may read the replication stream: a backlog, a replica, or this server a
/// replica. True until first read.
static LISTENERS: AtomicBool = AtomicBool::new(true);

/// Turn replication of the native paths' writes off (`noreplicate`).
pub(crate) fn switch_off() {
    REPLICATE.store(false, Relaxed);
}

/// Read `INFO replication` into [`LISTENERS`].
unsafe fn read_listeners(ctx: *mut RedisModuleCtx) {
    let info = api!(RedisModule_GetServerInfo)(ctx, c"replication".as_ptr());
    if info.is_null() {
        LISTENERS.store(true, Relaxed);
        return;
    }
    let mut err: c_int = 0;
    let backlog =
        api!(RedisModule_ServerInfoGetFieldSigned)(info, c"repl_backlog_active".as_ptr(), &mut err);
    let backlog_known = err == 0;
    let replicas =
        api!(RedisModule_ServerInfoGetFieldSigned)(info, c"connected_slaves".as_ptr(), &mut err);
    let replicas_known = err == 0;
    let role = api!(RedisModule_ServerInfoGetFieldC)(info, c"role".as_ptr());
    let primary = !role.is_null() && CStr::from_ptr(role).to_bytes() == b"master";
    let quiet = backlog_known && replicas_known && primary && backlog == 0 && replicas == 0;
    LISTENERS.store(!quiet, Relaxed);
    api!(RedisModule_FreeServerInfo)(ctx, info);
}

unsafe extern "C" fn on_event(
    ctx: *mut RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _sub: u64,
    _data: *mut std::ffi::c_void,
) {
    // SAFETY: called by Redis on its main thread with a context for the event.
    unsafe { read_listeners(ctx) }
}

unsafe extern "C" fn on_loading(
    ctx: *mut RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    sub: u64,
    _data: *mut std::ffi::c_void,
) {
    if sub == raw::REDISMODULE_SUBEVENT_LOADING_ENDED {
        // SAFETY: as in on_event.
        unsafe { read_listeners(ctx) }
    } else {
        LISTENERS.store(true, Relaxed);
    }
}

/// Read the replication state now and follow it (at load).
pub(crate) unsafe fn watch(ctx: *mut RedisModuleCtx) -> c_int {
    read_listeners(ctx);
    let subscribe = api!(RedisModule_SubscribeToServerEvent);
    // (The header's RedisModuleEvent_* constants are static to C: made here, version 1.)
    let events: [(u64, raw::RedisModuleEventCallback); 4] = [
        (raw::REDISMODULE_EVENT_FORK_CHILD, Some(on_event)),
        (raw::REDISMODULE_EVENT_REPLICA_CHANGE, Some(on_event)),
        (
            raw::REDISMODULE_EVENT_REPLICATION_ROLE_CHANGED,
            Some(on_event),
        ),
        (raw::REDISMODULE_EVENT_LOADING, Some(on_loading)),
    ];
    for (id, callback) in events {
        if subscribe(ctx, raw::RedisModuleEvent { id, dataver: 1 }, callback) == ERR {
            return ERR;
        }
    }
    OK
}

/// The effects of one native call.
#[derive(Debug)]
pub(crate) struct Effects {
    ctx: *mut RedisModuleCtx,
}

impl Effects {
    pub(crate) fn new(ctx: *mut RedisModuleCtx) -> Effects {
        Effects { ctx }
    }

    /// Raise the keyspace event `event` of class `class` on `key`.
    pub(crate) unsafe fn notify(
        &mut self,
        class: c_int,
        event: &CStr,
        key: *mut RedisModuleString,
    ) {
        api!(RedisModule_NotifyKeyspaceEvent)(self.ctx, class, event.as_ptr(), key);
    }

    /// Whether the writes are replicated: where a replica or the AOF would receive them.
    pub(crate) unsafe fn replicating(&self) -> bool {
        REPLICATE.load(Relaxed)
            && (LISTENERS.load(Relaxed)
                || api!(RedisModule_GetContextFlags)(self.ctx)
                    & raw::REDISMODULE_CTX_FLAGS_AOF as c_int
                    != 0)
    }

    /// Replicate `command` with `args`.
    pub(crate) unsafe fn replicate(&mut self, command: &CStr, args: &[*mut RedisModuleString]) {
        api!(RedisModule_Replicate)(
            self.ctx,
            command.as_ptr(),
            c"v".as_ptr(),
            args.as_ptr(),
            args.len(),
        );
    }
}

/// `PUBLISH channel message` as the caller's user (ACL checked), errors ignored as the Lua's
/// pcall ignores them; `SPUBLISH` for a channel whose last byte is '}' (common.lua's rule: a
/// cluster client's channel in the primitive's slot). Replicated where the Lua's would be
/// (not in a cluster, which carries messages on its bus).
pub(crate) unsafe fn publish(
    ctx: *mut RedisModuleCtx,
    channel: &[u8],
    message: &[u8],
    replicating: bool,
) {
    let cluster =
        api!(RedisModule_GetContextFlags)(ctx) & raw::REDISMODULE_CTX_FLAGS_CLUSTER as c_int != 0;
    let flags = if replicating && !cluster {
        c"!CEbb"
    } else {
        c"CEbb"
    };
    let command = if channel.last() == Some(&b'}') {
        c"SPUBLISH"
    } else {
        c"PUBLISH"
    };
    let reply = api!(RedisModule_Call)(
        ctx,
        command.as_ptr(),
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
