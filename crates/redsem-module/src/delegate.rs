//! The reference path: an operation's Lua function, run from inside the module's command.
//!
//! Every call a native path does not take (it declines before its first write) runs the
//! operation's function of the Lua library, `FCALL <library>_<operation> 4 <keys> <args>`,
//! within the same command, so atomically, and its reply is the command's. The function's
//! own effects are replicated as the scripts' are (as commands). So the module answers every
//! call exactly as the scripts do, and is faster only where it has a native path.
//!
//! The library is the one this build of redsem ships ([`redsem::protocol_library`]); if the
//! server does not have it (a new server, a restart, `FUNCTION FLUSH`), the module loads it
//! (`FUNCTION LOAD REPLACE`, replicated) and calls again, as the client library does. A test
//! configuration may name another library (`library <name>` at load): then nothing is
//! loaded, the runner has loaded it.

use std::ffi::{CString, c_int};
use std::sync::OnceLock;

use crate::api::{self, RedisModuleCallReply, RedisModuleCtx, RedisModuleString, api, raw};

/// The functions' name prefix and, for the shipped library, its source.
#[derive(Debug)]
pub(crate) struct Library {
    prefix: String,
    source: Option<CString>,
}

static LIBRARY: OnceLock<Library> = OnceLock::new();

/// Set the library at load: `name` given by a test configuration, or the shipped one.
pub(crate) fn configure(name: Option<&str>) -> Result<(), String> {
    let library = match name {
        Some(name) => Library {
            prefix: format!("{name}_"),
            source: None,
        },
        None => {
            let (name, source) = redsem::protocol_library();
            let source = CString::new(source)
                .map_err(|_| "the library's source holds a NUL byte".to_owned())?;
            Library {
                prefix: format!("{name}_"),
                source: Some(source),
            }
        }
    };
    LIBRARY
        .set(library)
        .map_err(|_| "the library was configured twice".to_owned())
}

/// The function's name of each operation, made once at load (C strings for `RM_Call`).
#[derive(Debug)]
pub(crate) struct Function {
    name: CString,
    /// Its number of keys, as `FCALL` takes it.
    keys: CString,
}

impl Function {
    pub(crate) fn of(operation: &str, keys: usize) -> Function {
        let prefix = LIBRARY.get().map_or("", |l| l.prefix.as_str());
        Function {
            name: CString::new(format!("{prefix}{operation}")).unwrap_or_default(),
            keys: CString::new(keys.to_string()).unwrap_or_default(),
        }
    }
}

/// A call reply, freed when dropped.
struct Reply(*mut RedisModuleCallReply);

impl Drop for Reply {
    fn drop(&mut self) {
        if !self.0.is_null() {
            // SAFETY: a reply RM_Call made, freed once.
            unsafe { api!(RedisModule_FreeCallReply)(self.0) };
        }
    }
}

/// `FCALL` the function with the command's keys and arguments (`argv[1..]`: its keys, then
/// the operation's ARGV).
unsafe fn fcall(
    ctx: *mut RedisModuleCtx,
    function: &Function,
    argv: &[*mut RedisModuleString],
) -> Reply {
    let rest = &argv[1..];
    // "!": replicate what the function does; "C": run it as the caller's user, so its ACL
    // applies inside as it does to a client's FCALL (a PUBLISH to a channel the user may not
    // use is refused); "E": errors (also those before it runs) come back as an error reply;
    // "v": the keys and arguments as they came.
    Reply(api!(RedisModule_Call)(
        ctx,
        c"FCALL".as_ptr(),
        c"!CEccv".as_ptr(),
        function.name.as_ptr(),
        function.keys.as_ptr(),
        rest.as_ptr(),
        rest.len(),
    ))
}

/// Whether `reply` is the error of a function the server does not have.
unsafe fn function_missing(reply: &Reply) -> bool {
    if reply.0.is_null()
        || api!(RedisModule_CallReplyType)(reply.0) != raw::REDISMODULE_REPLY_ERROR as c_int
    {
        return false;
    }
    let mut len = 0usize;
    let p = api!(RedisModule_CallReplyStringPtr)(reply.0, &mut len);
    let text = if p.is_null() {
        &[][..]
    } else {
        std::slice::from_raw_parts(p.cast::<u8>(), len)
    };
    text.windows(18).any(|w| w == b"Function not found")
}

/// Run the operation's Lua for this call and reply with what it answers.
pub(crate) unsafe fn run(
    ctx: *mut RedisModuleCtx,
    function: &Function,
    argv: &[*mut RedisModuleString],
) -> c_int {
    let mut reply = fcall(ctx, function, argv);
    if function_missing(&reply)
        && let Some(source) = LIBRARY.get().and_then(|l| l.source.as_ref())
    {
        let loaded = Reply(api!(RedisModule_Call)(
            ctx,
            c"FUNCTION".as_ptr(),
            c"!Eccc".as_ptr(),
            c"LOAD".as_ptr(),
            c"REPLACE".as_ptr(),
            source.as_ptr(),
        ));
        if !loaded.0.is_null()
            && api!(RedisModule_CallReplyType)(loaded.0) == raw::REDISMODULE_REPLY_ERROR as c_int
        {
            api!(RedisModule_ReplyWithCallReply)(ctx, loaded.0);
            return api::OK;
        }
        drop(loaded);
        reply = fcall(ctx, function, argv);
    }
    if reply.0.is_null() {
        return api::reply_error(
            ctx,
            c"ERR redsem: the operation's function could not be called",
        );
    }
    api!(RedisModule_ReplyWithCallReply)(ctx, reply.0);
    api::OK
}
