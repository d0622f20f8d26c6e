//! The engines a differential run compares: each serves the protocol's operations (same
//! KEYS, same ARGV, same replies) on a key space of its own in one server.
//!
//! Today these are variants of the Lua library: as shipped, or with its fast paths turned
//! off (every call takes the general path). Every variant reads the time from a planted
//! clock, a list key the runner sets before each step, so two engines that run the same call
//! one after the other see the same "now", and the runner can move time on at will (leases
//! and sessions expire without waiting).

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
}

impl EngineKind {
    /// Its name on the command line.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Scripts => "scripts",
            EngineKind::ScriptsGeneral => "scripts-general",
        }
    }

    /// The kind named `name` on the command line.
    pub fn parse(name: &str) -> Option<EngineKind> {
        [EngineKind::Scripts, EngineKind::ScriptsGeneral]
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
    /// The prefix of its functions' names (`<library>_`).
    functions: String,
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
    /// Load `kind` (with `patches`) into the server behind `conn`, as library `name`.
    pub fn load(
        conn: &mut Connection,
        kind: EngineKind,
        name: &str,
        patches: &[Patch],
    ) -> Result<Engine, String> {
        let source = source_for(kind, name, patches)?;
        redis::cmd("FUNCTION")
            .arg("LOAD")
            .arg("REPLACE")
            .arg(&source)
            .query::<String>(conn)
            .map_err(|e| format!("loading {}: {e}", kind.name()))?;
        Ok(Engine {
            functions: format!("{name}_"),
        })
    }

    /// Run operation `op` (a Lua file's name, e.g. `lease_acquire`) with `keys` and `args`:
    /// its reply, an error reply as a value.
    pub fn call(&self, conn: &mut Connection, op: &str, keys: &[String], args: &[String]) -> Value {
        let reply = redis::cmd("FCALL")
            .arg(format!("{}{op}", self.functions))
            .arg(keys.len())
            .arg(keys)
            .arg(args)
            .query::<Value>(conn);
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
