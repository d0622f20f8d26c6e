//! Every Lua operation, registered once, and how it is run: as a function of one Redis
//! Functions library (`FCALL`) on Redis 7 and later, or as a script (`EVALSHA`) where functions
//! are not available.
//!
//! The library holds `common.lua`, then one `do ... end` block per primitive with its prelude
//! (its topic files in `lua/<primitive>/`, joined in a fixed order: `LEASE_PRELUDE`...) and
//! one `redis.register_function` per operation (`lua/<primitive>/<operation>.lua`), so the helpers are created once when the
//! library loads, not on every call as in a script. Its name carries a version (a hash of all
//! the sources), and so do its functions (`redsem_<version>_<operation>`): clients of two
//! versions load two libraries side by side and never call each other's code.
//!
//! A call is `FCALL`. If the server does not know the function (a new server, a restart
//! without persistence, a failover to a node that never had it), the library is loaded with
//! `FUNCTION LOAD REPLACE` (on a cluster, redis-rs sends that to every primary) and the call
//! sent again. If the server refuses functions (Redis before 7, an ACL without `FCALL` or
//! `FUNCTION`), the call goes by `EVALSHA` (reloading the script on `NOSCRIPT`), and a
//! [`Scripting`] connection that can remember it goes straight there from then on.
//!
//! Where the connection's engine is redsem's module (`RedsemOptions::engine`, see
//! `crate::engine`), a call is its command instead, `REDSEM.<OPERATION> <keys> <args>`, the
//! same keys and ARGV without `numkeys`. A server that does not know the command (a failover
//! to one without the module) has the call sent by `FCALL` as above, and the connection
//! stays with the scripts from then on.
//!
//! A call that changes state goes by [`Call::invoke_acked`], which sends a `WAIT` with it
//! where the connection asks for replica acknowledgements (see `acks`).

use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::{LazyLock, OnceLock};

use redis::{
    Arg, Cmd, ErrorKind, FromRedisValue, RedisError, RedisResult, Script, ServerErrorKind,
    ToRedisArgs,
};

use super::acks::{Acked, Scripting, Sent, send, shortfall};
use crate::engine::{EngineState, module_missing};
use crate::error::Result;
use crate::types::ReplicaAcks;

const COMMON: &str = include_str!("../../lua/common.lua");

/// `(file, the text compiled in)` of each named `lua/<file>.lua`, in the order given.
macro_rules! lua_files {
    ($($file:literal),* $(,)?) => {
        &[$(($file, include_str!(concat!("../../lua/", $file, ".lua")))),*]
    };
}

/// The lease semaphore's prelude, topic by topic, in the order it is joined: a file may use
/// what the files before it define.
const LEASE_PRELUDE: &[(&str, &str)] = lua_files![
    "lease/layout",
    "lease/tenants",
    "lease/grants",
    "lease/state",
    "lease/sessions",
    "lease/queue",
    "lease/settle",
    "lease/requests",
    "lease/fast",
];

/// The permit semaphore's prelude, topic by topic, in the order it is joined.
const PERMIT_PRELUDE: &[(&str, &str)] = lua_files![
    "permit/layout",
    "permit/sessions",
    "permit/count",
    "permit/queue",
    "permit/state",
    "permit/settle",
    "permit/requests",
    "permit/fast",
];

/// The latch's prelude: one file.
const LATCH_PRELUDE: &[(&str, &str)] = lua_files!["latch/prelude"];

/// Which prelude an operation runs after.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Primitive {
    Lease,
    Permit,
    Latch,
}

impl Primitive {
    /// How many keys each of its operations takes (its `KEYS`, `crate::keys`).
    pub(crate) fn keys(self) -> usize {
        match self {
            Primitive::Lease => crate::keys::LeaseKeys::COUNT,
            Primitive::Permit => crate::keys::PermitKeys::COUNT,
            Primitive::Latch => crate::keys::LatchKeys::COUNT,
        }
    }

    /// Its prelude's files (name and the text compiled in), in the order they are joined.
    pub(crate) fn prelude_files(self) -> &'static [(&'static str, &'static str)] {
        match self {
            Primitive::Lease => LEASE_PRELUDE,
            Primitive::Permit => PERMIT_PRELUDE,
            Primitive::Latch => LATCH_PRELUDE,
        }
    }

    /// Its prelude: its files joined, as `read(file, the text compiled in)` gives each.
    fn prelude_with(
        self,
        read: &dyn Fn(&'static str, &'static str) -> Cow<'static, str>,
    ) -> String {
        self.prelude_files()
            .iter()
            .map(|&(file, builtin)| read(file, builtin))
            .collect()
    }

    /// Its prelude as this process runs it (see [`lua`]), joined once.
    fn prelude(self) -> &'static str {
        static JOINED: [OnceLock<String>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
        let at = match self {
            Primitive::Lease => 0,
            Primitive::Permit => 1,
            Primitive::Latch => 2,
        };
        JOINED[at].get_or_init(|| self.prelude_with(&|file, builtin| lua(file, builtin).into()))
    }
}

/// The source of `lua/<file>.lua`: the text compiled in, or, in a build with the feature
/// `lua-dir` while `REDSEM_LUA_DIR` names a directory, that directory's `<file>.lua` when it
/// has one. Read once per file and kept for the life of the process. This is how the mutation
/// runner (`redsem-mutants`, docs/MUTANTS.md) tries a changed script against the tests and the
/// soak without a rebuild; no other build reads anything here.
fn lua(file: &'static str, builtin: &'static str) -> &'static str {
    #[cfg(feature = "lua-dir")]
    {
        use std::collections::HashMap;
        use std::sync::Mutex;
        static READ: LazyLock<Mutex<HashMap<&'static str, &'static str>>> =
            LazyLock::new(Mutex::default);
        if let Some(dir) = std::env::var_os("REDSEM_LUA_DIR") {
            let mut read = READ
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            if let Some(text) = read.get(file) {
                return text;
            }
            let path = std::path::Path::new(&dir).join(format!("{file}.lua"));
            if let Ok(text) = std::fs::read_to_string(path) {
                let text: &'static str = Box::leak(text.into_boxed_str());
                read.insert(file, text);
                return text;
            }
        }
    }
    let _ = file;
    builtin
}

/// One operation: a Lua body (`lua/<file>.lua`) that runs after its primitive's prelude.
#[derive(Debug)]
pub(crate) struct Op {
    pub(crate) name: &'static str,
    /// Its file in `lua/`, without `.lua`: `lease/acquire` for `lease_acquire`.
    pub(crate) file: &'static str,
    pub(crate) primitive: Primitive,
    body: &'static str,
    script: OnceLock<Script>,
    function: OnceLock<String>,
    /// Its command in redsem's module, `REDSEM.<OPERATION>`.
    command: OnceLock<String>,
}

/// `Op`s as statics, one per operation file `lua/<primitive>/<file>.lua`: the one place an
/// operation is declared. A test (`tests.rs`) checks that every Lua file is common.lua, a
/// prelude's or here exactly once, and that an operation file starts with its header.
macro_rules! ops {
    ($($konst:ident = $primitive:ident $name:literal $file:literal;)*) => {
        $(
            pub(crate) static $konst: Op = Op {
                name: $name,
                file: $file,
                primitive: Primitive::$primitive,
                body: include_str!(concat!("../../lua/", $file, ".lua")),
                script: OnceLock::new(),
                function: OnceLock::new(),
                command: OnceLock::new(),
            };
        )*
        /// Every operation: the library registers each, tests check each.
        pub(crate) static ALL: &[&Op] = &[$(&$konst),*];
    };
}

ops! {
    LEASE_ACQUIRE = Lease "lease_acquire" "lease/acquire";
    LEASE_BATCH = Lease "lease_batch" "lease/batch";
    LEASE_POLL = Lease "lease_poll" "lease/poll";
    LEASE_REFRESH = Lease "lease_refresh" "lease/refresh";
    LEASE_RELEASE = Lease "lease_release" "lease/release";
    LEASE_STATUS = Lease "lease_status" "lease/status";
    LEASE_SET_CAPACITY = Lease "lease_set_capacity" "lease/set_capacity";
    LEASE_TIDY = Lease "lease_tidy" "lease/tidy";
    PERMIT_ACQUIRE = Permit "permit_acquire" "permit/acquire";
    PERMIT_BATCH = Permit "permit_batch" "permit/batch";
    PERMIT_POLL = Permit "permit_poll" "permit/poll";
    PERMIT_WITHDRAW = Permit "permit_withdraw" "permit/withdraw";
    PERMIT_ADD = Permit "permit_add" "permit/add";
    PERMIT_TRY_SET = Permit "permit_try_set" "permit/try_set";
    PERMIT_AVAILABLE = Permit "permit_available" "permit/available";
    PERMIT_DRAIN = Permit "permit_drain" "permit/drain";
    PERMIT_DELETE = Permit "permit_delete" "permit/delete";
    LATCH_TRY_SET = Latch "latch_try_set" "latch/try_set";
    LATCH_COUNT_DOWN = Latch "latch_count_down" "latch/count_down";
    LATCH_STATE = Latch "latch_state" "latch/state";
    LATCH_DELETE = Latch "latch_delete" "latch/delete";
}

/// The library: its name and its source, built once.
pub(crate) struct Library {
    pub(crate) name: String,
    pub(crate) source: String,
}

pub(crate) static LIBRARY: LazyLock<Library> =
    LazyLock::new(|| assemble(&|file, builtin| lua(file, builtin).into()));

/// The library made of each Lua file's text, as `read(file, the text compiled in)` gives it;
/// its name (and its functions' names) carry a hash of all the texts.
fn assemble(read: &dyn Fn(&'static str, &'static str) -> Cow<'static, str>) -> Library {
    let common = read("common", COMMON);
    let preludes: Vec<(Primitive, String)> =
        [Primitive::Latch, Primitive::Lease, Primitive::Permit]
            .into_iter()
            .map(|primitive| (primitive, primitive.prelude_with(read)))
            .collect();
    let prelude = |primitive: Primitive| {
        preludes
            .iter()
            .find(|(p, _)| *p == primitive)
            .map_or("", |(_, text)| text.as_str())
    };
    let bodies: Vec<Cow<'static, str>> = ALL.iter().map(|op| read(op.file, op.body)).collect();
    let mut sources = String::from(common.as_ref());
    for (op, body) in ALL.iter().zip(&bodies) {
        sources.push_str(op.name);
        sources.push_str(prelude(op.primitive));
        sources.push_str(body);
    }
    let hash = Script::new(&sources).get_hash().to_owned();
    let name = format!("redsem_{}", &hash[..12]);
    let mut source = format!("#!lua name={name}\n{common}\n");
    for (primitive, text) in &preludes {
        source.push_str("do\n");
        source.push_str(text);
        for (op, body) in ALL
            .iter()
            .zip(&bodies)
            .filter(|(op, _)| op.primitive == *primitive)
        {
            source.push_str(&format!(
                "redis.register_function('{name}_{}', function(KEYS, ARGV)\nbegin(KEYS)\n{body}\nend)\n",
                op.name
            ));
        }
        source.push_str("end\n");
    }
    // The tests run every operation with the keys check (see `key_check`).
    #[cfg(test)]
    let source = key_check::instrument(&source);
    Library { name, source }
}

/// The library as this build assembles it, with the `<file>.lua` files that `dir` has in place
/// of the ones compiled in: what the Lua mutation runner loads to tell a mutant that does not
/// compile (docs/MUTANTS.md). For the project's own tests (feature `lua-dir`), not for use.
#[cfg(feature = "lua-dir")]
#[doc(hidden)]
pub fn library_source_with(dir: &std::path::Path) -> String {
    assemble(
        &|file, builtin| match std::fs::read_to_string(dir.join(format!("{file}.lua"))) {
            Ok(text) => text.into(),
            Err(_) => builtin.into(),
        },
    )
    .source
}

/// The library as this build ships it: its name (which prefixes its functions' names,
/// `<name>_<operation>`) and its source, for `FUNCTION LOAD`. For the native engine
/// (`crates/redsem-module`), which runs an operation's Lua for every call it has no native
/// path for; not for use.
#[doc(hidden)]
pub fn protocol_library() -> (&'static str, &'static str) {
    (&LIBRARY.name, &LIBRARY.source)
}

/// Every operation's name (`lease_acquire`, ...) and how many keys it takes, in the order
/// the library registers them. For the native engine, which serves each as a command; not
/// for use.
#[doc(hidden)]
pub fn protocol_operations() -> impl Iterator<Item = (&'static str, usize)> {
    ALL.iter().map(|op| (op.name, op.primitive.keys()))
}

impl Op {
    /// The operation's Lua body (see [`lua`]).
    fn body(&self) -> &'static str {
        lua(self.file, self.body)
    }

    /// The function's name in the library (built once).
    pub(crate) fn function(&self) -> &str {
        self.function
            .get_or_init(|| format!("{}_{}", LIBRARY.name, self.name))
    }

    /// Its command in redsem's module: `REDSEM.LEASE_ACQUIRE` for `lease_acquire` (built
    /// once).
    pub(crate) fn command(&self) -> &str {
        self.command
            .get_or_init(|| format!("REDSEM.{}", self.name.to_ascii_uppercase()))
    }

    /// The same operation as a script, for `EVALSHA`.
    pub(crate) fn script(&self) -> &Script {
        self.script.get_or_init(|| {
            let source = format!(
                "{}\n{}\nbegin(KEYS)\n{}",
                lua("common", COMMON),
                self.primitive.prelude(),
                self.body()
            );
            // The tests run every operation with the keys check (see `key_check`).
            #[cfg(test)]
            let source = key_check::instrument(&source);
            Script::new(&source)
        })
    }

    /// Start a call with its first key.
    pub(crate) fn key(&'static self, key: impl ToRedisArgs) -> Call {
        // Room for a lease acquire's 6 keys and 16 arguments without growing.
        let mut command = Cmd::with_capacity(24, 512);
        command.arg(self.command());
        Call {
            op: self,
            command,
            keys: 0,
            args: 0,
        }
        .key(key)
    }
}

/// The keys and arguments of one call of an [`Op`], written once, as the module's command
/// (`REDSEM.<OP> key... arg...`): the native engine sends it as it is, and `FCALL` and
/// `EVALSHA` copy its keys and arguments behind their own heads.
pub(crate) struct Call {
    op: &'static Op,
    command: Cmd,
    /// How many of the command's arguments are keys (they come first).
    keys: usize,
    /// How many are arguments, after the keys.
    args: usize,
}

impl Call {
    /// Add key(s) (a slice adds each), before any argument: the keys come first.
    pub(crate) fn key(mut self, key: impl ToRedisArgs) -> Call {
        debug_assert_eq!(
            self.args,
            0,
            "a key after the arguments of {}",
            self.op.function()
        );
        let before = self.command.args_iter().len();
        self.command.arg(key);
        self.keys += self.command.args_iter().len() - before;
        self
    }

    /// Add argument(s) (a slice adds each).
    pub(crate) fn arg(mut self, arg: impl ToRedisArgs) -> Call {
        let before = self.command.args_iter().len();
        self.command.arg(arg);
        self.args += self.command.args_iter().len() - before;
        self
    }

    /// The keys, then the arguments: the command's arguments after its name.
    fn keys_and_args(&self) -> (impl Iterator<Item = &[u8]>, impl Iterator<Item = &[u8]>) {
        let simple = |arg| match arg {
            Arg::Simple(bytes) => Some(bytes),
            _ => None,
        };
        let mut all = self.command.args_iter().skip(1).filter_map(simple);
        let keys: Vec<&[u8]> = all.by_ref().take(self.keys).collect();
        (keys.into_iter(), all)
    }

    /// Run it: `FCALL`, loading the library if the server lacks it, or `EVALSHA` where
    /// functions are refused. Sends no `WAIT`: for reads (and housekeeping).
    pub(crate) async fn invoke_async<T: FromRedisValue>(
        &self,
        conn: &mut impl Scripting,
    ) -> RedisResult<T> {
        let sent = self.run(conn, None).await;
        redis::from_redis_value(sent.reply?).map_err(Into::into)
    }

    /// Run a call that changes state, as [`invoke_async`](Self::invoke_async), with `WAIT` in
    /// the same round trip when the connection asks for replica acknowledgements.
    ///
    /// # Errors
    ///
    /// The script's failure; a shortfall of acknowledgements is not an error here but
    /// [`Acked::unconfirmed`], for the caller to act on (give a grant back) first.
    pub(crate) async fn invoke_acked(&self, conn: &mut impl Scripting) -> Result<Acked> {
        let acks = conn.replica_acks();
        let sent = self.run(conn, acks).await;
        let reply = sent.reply?;
        Ok(Acked {
            reply,
            unconfirmed: acks.and_then(|acks| shortfall(acks, sent.wait)),
        })
    }

    async fn run(&self, conn: &mut impl Scripting, acks: Option<ReplicaAcks>) -> Sent {
        // No call goes out without keys: a proxy routes a script by them, and one with none
        // it cannot route (ElastiCache Serverless, cluster proxies refuse it).
        if self.keys == 0 {
            return Sent {
                reply: Err(no_keys(self.op)),
                wait: None,
            };
        }
        if conn.engine().is_some_and(EngineState::is_native) {
            let sent = send(conn, &self.command, acks).await;
            match &sent.reply {
                // Not run: no module there (any more), or not for this user. This call and
                // every later one go by the scripts.
                Err(e) if module_missing(e) => {
                    if let Some(engine) = conn.engine() {
                        engine.fall_back(e);
                    }
                }
                _ => return sent,
            }
        }
        let refused = conn
            .functions_refused()
            .is_some_and(|r| r.load(Ordering::Relaxed));
        if !refused {
            let fcall = self.headed(&["FCALL".as_bytes(), self.op.function().as_bytes()]);
            let mut sent = send(conn, &fcall, acks).await;
            if matches!(&sent.reply, Err(e) if unknown_function(e)) {
                crate::observe::script_reloaded();
                let loaded: RedisResult<()> = redis::cmd("FUNCTION")
                    .arg("LOAD")
                    .arg("REPLACE")
                    .arg(&LIBRARY.source)
                    .query_async(conn)
                    .await;
                sent = match loaded {
                    Ok(()) => send(conn, &fcall, acks).await,
                    Err(e) => Sent {
                        reply: Err(e),
                        wait: None,
                    },
                };
            }
            match &sent.reply {
                Err(e) if functions_unusable(e) => {
                    tracing::debug!(error = %e, "redis refuses functions; running scripts by EVALSHA");
                    if let Some(refused) = conn.functions_refused() {
                        refused.store(true, Ordering::Relaxed);
                    }
                }
                _ => return sent,
            }
        }
        let script = self.op.script();
        if acks.is_none() {
            let mut invocation = script.prepare_invoke();
            let (keys, args) = self.keys_and_args();
            for key in keys {
                invocation.key(key);
            }
            for arg in args {
                invocation.arg(arg);
            }
            return Sent {
                reply: invocation.invoke_async(conn).await,
                wait: None,
            };
        }
        let evalsha = self.headed(&["EVALSHA".as_bytes(), script.get_hash().as_bytes()]);
        let sent = send(conn, &evalsha, acks).await;
        match &sent.reply {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                match script.load_async(conn).await {
                    Ok(_) => send(conn, &evalsha, acks).await,
                    Err(e) => Sent {
                        reply: Err(e),
                        wait: None,
                    },
                }
            }
            _ => sent,
        }
    }

    /// `FCALL fn` or `EVALSHA sha` (`head`), the number of keys, the keys and the arguments.
    fn headed(&self, head: &[&[u8]]) -> Cmd {
        let (keys, args) = self.keys_and_args();
        let mut command = Cmd::with_capacity(
            self.command.args_iter().len() + 2,
            self.command
                .args_iter()
                .map(|a| match a {
                    Arg::Simple(bytes) => bytes.len(),
                    _ => 0,
                })
                .sum::<usize>()
                + 64,
        );
        for part in head {
            command.arg(*part);
        }
        command.arg(self.keys);
        for key in keys {
            command.arg(key);
        }
        for arg in args {
            command.arg(arg);
        }
        command
    }
}

/// The error of a call made with no keys, which is never sent.
fn no_keys(op: &Op) -> RedisError {
    RedisError::from((
        ErrorKind::Client,
        "an operation called with no keys is not sent",
        op.name.to_owned(),
    ))
}

/// The server does not have the function (the library is not loaded there). Redis has no
/// code of its own for it (`ERR Function not found` on Redis 7.0 to 8, Valkey 8.1 and 9.1),
/// so this one is told by its text.
fn unknown_function(err: &RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::ResponseError)
        && err.detail().is_some_and(|d| {
            d.trim_start()
                .to_ascii_lowercase()
                .starts_with("function not found")
        })
}

/// The server cannot or will not run functions: no such command (Redis < 7: "unknown command
/// `FCALL`", in backquotes where Redis 7 and Valkey quote it), an ACL that refuses `FCALL`
/// or `FUNCTION LOAD` (NOPERM, by its code), or a library it does not accept (Valkey says
/// `server.register_function` where Redis says `redis.register_function`; both start
/// "Error registering functions").
fn functions_unusable(err: &RedisError) -> bool {
    let text = err.to_string().to_ascii_lowercase();
    unknown_function(err)
        || err.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
        || text.contains("noperm")
        || text.contains("unknown command")
        || text.contains("error compiling")
        || text.contains("error registering")
}

#[cfg(test)]
mod key_check;
#[cfg(test)]
mod tests;
