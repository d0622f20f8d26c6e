//! What a native path's writes tell the rest of the server: keyspace events, as the commands
//! the scripts send would raise them, and replication of the writes as those plain commands
//! (`SETBIT`, `ZADD`, `HSET`, ...), so a replica or an AOF without the module follows, as
//! they follow the scripts' effects. Redis wraps them, with the command's other effects, in
//! one `MULTI`/`EXEC`.

use std::ffi::{CStr, c_int};
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};

use crate::api::{RedisModuleCtx, RedisModuleString, api};

/// Off only by the load argument `noreplicate`: for measuring what replication costs, never
/// for use (a replica or the AOF would miss the native paths' writes).
static REPLICATE: AtomicBool = AtomicBool::new(true);

/// Turn replication of the native paths' writes off (`noreplicate`).
pub(crate) fn switch_off() {
    REPLICATE.store(false, Relaxed);
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

    /// Whether the writes are replicated.
    pub(crate) fn replicating(&self) -> bool {
        REPLICATE.load(Relaxed)
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
