//! The engines a differential run compares: each serves the protocol's operations (same
//! KEYS, same ARGV, same replies) on a key space of its own in one server.
//!
//! The engines are variants of the Lua library (as shipped, or with its fast paths turned
//! off: every call takes the general path) and the native engine, the module of
//! crates/redsem-module (`REDSEM.<OPERATION>` commands, which run the Lua where they have no
//! native path). Every engine reads the time from a planted clock, a list key the runner sets
//! before each step, so two engines that run the same call one after the other see the same
//! "now", and the runner can move time on at will (leases and sessions expire without
//! waiting): the Lua variants read it in place of `TIME`, the module is loaded with
//! `clock <key>` ([`module_args`]).

use redis::{Connection, Value};

/// The key holding the planted clock: `[seconds, microseconds]`, as `TIME` answers.
pub const CLOCK_KEY: &str = "redsem-diff:clock";

/// One way of serving the protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EngineKind {
    /// The Lua library as the client loads it (its fast paths on).
    Scripts,
    /// The Lua library with every fast path turned off: the general path answers every call.
    ScriptsGeneral,
    /// The module (crates/redsem-module), loaded by the server with [`module_args`]: its
    /// native paths, and the Lua library (as shipped, the clock planted) for every other call.
    Native,
}

/// The name of the library the module runs its Lua from in a run (`library <name>`).
const NATIVE_LIBRARY: &str = "diff_native";

/// The arguments that make `redis-server` load the module at `path` as a run needs it: its
/// Lua from the library the runner loads, its time from the planted clock.
pub fn module_args(path: &std::path::Path) -> Vec<String> {
    vec![
        "--loadmodule".to_owned(),
        path.display().to_string(),
        "library".to_owned(),
        NATIVE_LIBRARY.to_owned(),
        "clock".to_owned(),
        CLOCK_KEY.to_owned(),
    ]
}

impl EngineKind {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Scripts => "scripts",
            EngineKind::ScriptsGeneral => "scripts-general",
            EngineKind::Native => "native",
        }
    }

    /// The kind named `name` on the command line.
    pub fn parse(name: &str) -> Option<EngineKind> {
        [
            EngineKind::Scripts,
            EngineKind::ScriptsGeneral,
            EngineKind::Native,
        ]
        .into_iter()
        .find(|kind| kind.name() == name)
    }
}

/// A change made to the library's text before it is loaded, on top of the engine's own:
/// how a test shows that the runner tells a changed protocol from the original (a bug put
/// back). `find` must occur exactly once.
#[derive(Debug, Clone)]
pub struct Patch {
    /// The text replaced.
    pub find: String,
    /// What replaces it.
    pub replace: String,
}

/// An engine loaded into the server: calls go to its functions.
#[derive(Debug)]
pub struct Engine {
    /// The prefix of its functions' names (`<library>_`); None: the module's commands.
    functions: Option<String>,
}

/// Replace the one occurrence of `find` in `text`; an error names `what` if there is not
/// exactly one (the library changed under the runner: its transforms must follow).
fn replace_once(text: &str, find: &str, replace: &str, what: &str) -> Result<String, String> {
    match text.matches(find).count() {
        1 => Ok(text.replacen(find, replace, 1)),
        n => Err(format!(
            "{what}: expected the library to hold `{}` once, found it {n} times",
            find.escape_debug()
        )),
    }
}

/// The library's source as `kind` serves it, renamed `name`, with `patches` applied.
fn source_for(kind: EngineKind, name: &str, patches: &[Patch]) -> Result<String, String> {
    let empty = tempfile::tempdir().map_err(|e| format!("a temp dir: {e}"))?;
    // No file in an empty directory replaces a built-in one: the library as compiled in.
    let mut source = redsem::library_source_with(empty.path());
    let first = source.lines().next().unwrap_or_default();
    let shipped = first
        .strip_prefix("#!lua name=")
        .ok_or_else(|| format!("the library's first line is not a shebang: {first}"))?
        .to_owned();
    // Its own name, so that variants load side by side (the name prefixes every function).
    source = source.replace(&shipped, name);
    // The planted clock in place of TIME: same reply shape, both engines read the same now.
    source = replace_once(
        &source,
        "rcall('TIME')",
        &format!("redis.call('LRANGE', '{CLOCK_KEY}', 0, 1)"),
        "the planted clock",
    )?;
    if kind == EngineKind::ScriptsGeneral {
        source = replace_once(
            &source,
            "local function settled(body, name, mode, fast, arg)\n",
            "local function settled(body, name, mode, fast, arg)\n  fast = nil\n",
            "fast paths off",
        )?;
    }
    for patch in patches {
        source = replace_once(&source, &patch.find, &patch.replace, "a patch")?;
    }
    Ok(source)
}

impl Engine {
    /// Load `kind` (with `patches`) into the server behind `conn`, as library `name` (the
    /// native engine: its Lua, as the library the module was told to run).
    pub fn load(
        conn: &mut Connection,
        kind: EngineKind,
        name: &str,
        patches: &[Patch],
    ) -> Result<Engine, String> {
        let (lua, name) = match kind {
            EngineKind::Native => (EngineKind::Scripts, NATIVE_LIBRARY),
            other => (other, name),
        };
        let source = source_for(lua, name, patches)?;
        redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&source)
            .query::<String>(conn)
            .map_err(|e| format!("loading {}: {e}", kind.name()))?;
        if kind == EngineKind::Native {
            redis::cmd("REDSEM.ENGINE")
                .query::<Value>(conn)
                .map_err(|e| format!("the native engine needs the module loaded ({e})"))?;
        }
        Ok(Engine {
            functions: (kind != EngineKind::Native).then(|| format!("{name}_")),
        })
    }

    /// Run operation `op` (a Lua file's name, e.g. `lease_acquire`) with `keys` and `args`:
    /// its reply, an error reply as a value.
    pub fn call(&self, conn: &mut Connection, op: &str, keys: &[String], args: &[String]) -> Value {
        let mut cmd = match &self.functions {
            Some(prefix) => {
                let mut fcall = redis::cmd("FCALL");
                fcall.arg(format!("{prefix}{op}")).arg(keys.len());
                fcall
            }
            None => redis::cmd(&format!("REDSEM.{}", op.to_ascii_uppercase())),
        };
        let reply = cmd.arg(keys).arg(args).query::<Value>(conn);
        match reply {
            Ok(value) => value,
            Err(e) => Value::SimpleString(format!("error reply: {e}")),
        }
    }
}

/// Plant the clock at `micros` (µs since the epoch).
pub fn plant_clock(conn: &mut Connection, micros: u64) -> redis::RedisResult<()> {
    redis::pipe()
        .atomic()
        .del(CLOCK_KEY)
        .rpush(
            CLOCK_KEY,
            &[
                (micros / 1_000_000).to_string(),
                (micros % 1_000_000).to_string(),
            ],
        )
        .query(conn)
}
