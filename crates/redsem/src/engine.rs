//! Which engine serves a client's calls: the Lua library (`FCALL`, or `EVALSHA` where
//! functions are refused), which every server has, or redsem's Redis module
//! (`crates/redsem-module`), which serves every operation as a command of its own,
//! `REDSEM.<OPERATION>`, on the same keys with the same replies.
//!
//! [`Engine`] is what a client asks for ([`RedsemOptions::engine`](crate::RedsemOptions::engine));
//! the connect asks each server `REDSEM.ENGINE` ([`ask`]) and [`choose`]s. [`EngineState`] is
//! what the connection then remembers (`script::Scripting::engine`): whether calls go to the
//! module, and, when one finds the module gone (a failover to a server without it), the
//! switch back to the scripts for good. [`ServingEngine`] is what [`Redsem::engine`](crate::Redsem::engine) reports.

use std::fmt;
use std::str::FromStr;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use redis::aio::ConnectionLike;
use redis::{RedisError, Value};

use crate::error::{Error, Result, invalid};

/// Which engine runs redsem's operations on the server ([`RedsemOptions::engine`](crate::RedsemOptions::engine)).
///
/// Every operation is a function of redsem's Lua library, which any Redis 7 (or Valkey)
/// runs. A server that loaded redsem's module (`redis-server --loadmodule libredsem_module.so`)
/// also serves each operation as a command, `REDSEM.<OPERATION>`, on the same keys, with the
/// same replies: cheaper for the server on the common paths. Both engines can serve one
/// semaphore at once, so clients can move from one to the other one by one.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> redsem::Result<()> {
/// use redsem::{Engine, Redsem, RedsemOptions};
/// // Refuse to start on a server without the module, rather than run the scripts there.
/// let options = RedsemOptions::default().engine(Engine::Native);
/// let redsem = Redsem::connect_with("redis://127.0.0.1:6379", options).await?;
/// println!("engine: {}", redsem.engine()); // "engine: native (redsem module 0.1.0)"
/// # Ok(())
/// # }
/// ```
///
/// The names `"auto"`, `"scripts"` and `"native"` parse as the variants:
///
/// ```
/// use redsem::Engine;
/// assert_eq!("native".parse::<Engine>().unwrap(), Engine::Native);
/// assert_eq!(Engine::default(), Engine::Auto);
/// assert_eq!(Engine::Scripts.to_string(), "scripts");
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Engine {
    /// The module where the server has it, the scripts where it does not (the default). The
    /// connect sends one `REDSEM.ENGINE`: a server that does not know it, or refuses it (an
    /// ACL that does not allow it), has the scripts. On a Redis Cluster the module is used
    /// only if every primary has it.
    #[default]
    Auto,
    /// Always the Lua library (`FCALL`, or `EVALSHA` where functions are refused), even where
    /// the module is loaded; nothing is asked at connect.
    Scripts,
    /// The module, or no connection: connecting fails with
    /// [`Error::EngineUnavailable`](crate::Error::EngineUnavailable) where a server (on a
    /// cluster, any primary) does not answer `REDSEM.ENGINE` with a module of this client's
    /// protocol. A server found without it later (after a failover) is served by the scripts.
    Native,
}

impl Engine {
    /// The name of the engine as the CLI and the Python binding take it: `"auto"`,
    /// `"scripts"` or `"native"`.
    pub fn as_str(self) -> &'static str {
        match self {
            Engine::Auto => "auto",
            Engine::Scripts => "scripts",
            Engine::Native => "native",
        }
    }
}

impl fmt::Display for Engine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Engine {
    type Err = Error;

    /// `"auto"`, `"scripts"` or `"native"` (any case).
    fn from_str(s: &str) -> Result<Engine> {
        match s.to_ascii_lowercase().as_str() {
            "auto" => Ok(Engine::Auto),
            "scripts" => Ok(Engine::Scripts),
            "native" => Ok(Engine::Native),
            _ => Err(invalid(format!(
                "engine must be \"auto\", \"scripts\" or \"native\", got {s:?}"
            ))),
        }
    }
}

/// The engine that serves a client's calls now ([`Redsem::engine`](crate::Redsem::engine)).
///
/// Its `Display` is what `redsem status` and `redsem doctor` print after `engine:`:
/// `native (redsem module 0.1.0)` or `scripts`. With the `serde` feature it is written
/// `{"name":"native","version":"0.1.0"}` or `{"name":"scripts"}`.
///
/// # Examples
///
/// ```no_run
/// # async fn example(redsem: redsem::Redsem) {
/// use redsem::ServingEngine;
/// match redsem.engine() {
///     ServingEngine::Native { version, .. } => println!("redsem module {version}"),
///     ServingEngine::Scripts { why, .. } => println!("Lua scripts: {why}"),
///     other => println!("{other}"),
/// }
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(
    feature = "serde",
    derive(serde::Serialize),
    serde(tag = "name", rename_all = "lowercase")
)]
#[non_exhaustive]
pub enum ServingEngine {
    /// The Lua library, by `FCALL` (or `EVALSHA`).
    #[non_exhaustive]
    Scripts {
        /// Why not the module, in words: it was not asked for ([`Engine::Scripts`]), which
        /// server has no module and what it answered, or the call that found it gone.
        #[cfg_attr(feature = "serde", serde(skip))]
        why: String,
    },
    /// redsem's module, by `REDSEM.<OPERATION>` commands.
    #[non_exhaustive]
    Native {
        /// The module's version, as `REDSEM.ENGINE` answered it at connect (on a cluster,
        /// the first primary's).
        version: String,
    },
}

impl ServingEngine {
    /// Whether the module serves the calls.
    pub fn is_native(&self) -> bool {
        matches!(self, ServingEngine::Native { .. })
    }

    /// `"native"` or `"scripts"`.
    pub fn name(&self) -> &'static str {
        match self {
            ServingEngine::Scripts { .. } => "scripts",
            ServingEngine::Native { .. } => "native",
        }
    }
}

impl fmt::Display for ServingEngine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ServingEngine::Scripts { .. } => f.write_str("scripts"),
            ServingEngine::Native { version } => write!(f, "native (redsem module {version})"),
        }
    }
}

/// What a connection remembers about its engine: whether calls go to the module, and what
/// [`Redsem::engine`](crate::Redsem::engine) says.
#[derive(Debug)]
pub(crate) struct EngineState {
    /// Calls go by `REDSEM.<OPERATION>`. Read on every call; written at connect and by a
    /// fall-back (under `detail`).
    native: AtomicBool,
    detail: Mutex<Detail>,
}

#[derive(Debug)]
struct Detail {
    /// The module's version, while native.
    version: String,
    /// Why the scripts, while not native.
    why: String,
    /// Whether this connection is counted in the `redsem_engine` gauge.
    counted: bool,
}

impl Default for EngineState {
    fn default() -> Self {
        EngineState {
            native: AtomicBool::new(false),
            detail: Mutex::new(Detail {
                version: String::new(),
                why: "not chosen yet".to_owned(),
                counted: false,
            }),
        }
    }
}

impl EngineState {
    fn detail(&self) -> std::sync::MutexGuard<'_, Detail> {
        self.detail.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether calls go to the module.
    pub(crate) fn is_native(&self) -> bool {
        self.native.load(Ordering::Relaxed)
    }

    /// Serve as `choice` says (at connect).
    pub(crate) fn set(&self, choice: Choice) {
        let mut detail = self.detail();
        let was = self.is_native();
        let native = match choice {
            Choice::Native { version } => {
                detail.version = version;
                true
            }
            Choice::Scripts { why } => {
                detail.why = why;
                false
            }
        };
        self.native.store(native, Ordering::Relaxed);
        if detail.counted && was != native {
            crate::observe::engine_clients(was, -1);
            crate::observe::engine_clients(native, 1);
        }
    }

    /// Count this connection in the `redsem_engine` gauge (once the client is made), or
    /// no longer (when it goes).
    pub(crate) fn count(&self, on: bool) {
        let mut detail = self.detail();
        if detail.counted != on {
            detail.counted = on;
            crate::observe::engine_clients(self.is_native(), if on { 1 } else { -1 });
        }
    }

    /// A call found no module where it was used (`err`: the server's answer): serve by the
    /// scripts from now on. True if this was the switch (the first such call).
    pub(crate) fn fall_back(&self, err: &RedisError) -> bool {
        let mut detail = self.detail();
        if !self.native.swap(false, Ordering::Relaxed) {
            return false;
        }
        detail.why = format!("a call found the redsem module gone ({err})");
        if detail.counted {
            crate::observe::engine_clients(true, -1);
            crate::observe::engine_clients(false, 1);
        }
        drop(detail);
        crate::observe::engine_fell_back();
        tracing::warn!(error = %err, "the redsem module is gone from the server: serving by the Lua scripts from now on");
        true
    }

    /// What [`Redsem::engine`](crate::Redsem::engine) reports.
    pub(crate) fn serving(&self) -> ServingEngine {
        let detail = self.detail();
        if self.is_native() {
            ServingEngine::Native {
                version: detail.version.clone(),
            }
        } else {
            ServingEngine::Scripts {
                why: detail.why.clone(),
            }
        }
    }
}

/// Whether `err`, the answer to a `REDSEM.<OPERATION>`, says the server cannot serve it: it
/// does not know the command (no module: a failover to a server without it, an unloaded
/// module) or the user may not run it. Such a command did not run.
pub(crate) fn module_missing(err: &RedisError) -> bool {
    let text = err.to_string().to_ascii_lowercase();
    let refused =
        text.contains("unknown command") || err.code() == Some("NOPERM") || text.contains("noperm");
    refused && text.contains("redsem.")
}

/// What one server answered to `REDSEM.ENGINE`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// The module, serving the Lua library named `library`.
    Module { version: String, library: String },
    /// No module, or none this client can use: what the server said.
    Absent { reply: String },
}

/// Ask the server behind `conn` for its module: one `REDSEM.ENGINE`.
///
/// # Errors
///
/// When the server cannot be reached; what it refuses is an [`Answer::Absent`].
pub(crate) async fn ask(conn: &mut impl ConnectionLike) -> Result<Answer> {
    let reply: redis::RedisResult<Value> = redis::cmd("REDSEM.ENGINE").query_async(conn).await;
    match reply {
        Ok(value) => Ok(parse(&value)),
        Err(err) => match Error::from(err) {
            Error::Redis(err) => Ok(Answer::Absent {
                reply: server_said(&err),
            }),
            unavailable => Err(unavailable),
        },
    }
}

/// A server's error as it said it: `ERR unknown command 'REDSEM.ENGINE', ...`.
fn server_said(err: &RedisError) -> String {
    match (err.code(), err.detail()) {
        (Some(code), Some(detail)) => {
            // Redis ends an unknown command's error with its arguments, here none.
            let detail = detail.trim();
            let detail = detail
                .strip_suffix(", with args beginning with:")
                .unwrap_or(detail);
            format!("{code} {detail}")
        }
        _ => err.to_string(),
    }
}

/// `REDSEM.ENGINE`'s reply: `["native", version, library, native calls, Lua calls]`.
fn parse(value: &Value) -> Answer {
    let text = |v: &Value| match v {
        Value::BulkString(bytes) => Some(String::from_utf8_lossy(bytes).into_owned()),
        Value::SimpleString(s) => Some(s.clone()),
        _ => None,
    };
    if let Value::Array(items) = value
        && let [kind, version, library, ..] = items.as_slice()
        && text(kind).as_deref() == Some("native")
        && let (Some(version), Some(library)) = (text(version), text(library))
    {
        return Answer::Module { version, library };
    }
    Answer::Absent {
        reply: format!("REDSEM.ENGINE answered {value:?}, not the redsem module's reply"),
    }
}

/// The engine chosen at connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Choice {
    Native { version: String },
    Scripts { why: String },
}

/// Choose the engine `asked` for, from what each server (`node`, `host:port`) answered to
/// `REDSEM.ENGINE` (`library`: this client's Lua library, which a module must serve).
///
/// # Errors
///
/// [`Error::EngineUnavailable`] when [`Engine::Native`] was asked for and a server cannot
/// serve it.
pub(crate) fn choose(
    asked: Engine,
    answers: Vec<(String, Answer)>,
    library: &str,
) -> Result<Choice> {
    if asked == Engine::Scripts {
        return Ok(Choice::Scripts {
            why: "the scripts were asked for".to_owned(),
        });
    }
    let mut version = None;
    for (node, answer) in answers {
        let reply = match answer {
            Answer::Module {
                version: found,
                library: serves,
            } if serves == library => {
                version.get_or_insert(found);
                continue;
            }
            Answer::Module {
                version: found,
                library: serves,
            } => format!(
                "its redsem module {found} serves the Lua library {serves}, and this client \
                 speaks {library}: load the module of this client's version"
            ),
            Answer::Absent { reply } => {
                format!("{reply} (no redsem module loaded, or the user may not run REDSEM.*)")
            }
        };
        if asked == Engine::Native {
            return Err(Error::EngineUnavailable { asked, node, reply });
        }
        tracing::debug!(%node, %reply, "no redsem module to use: serving by the Lua scripts");
        return Ok(Choice::Scripts {
            why: format!("{node}: {reply}"),
        });
    }
    match version {
        Some(version) => Ok(Choice::Native { version }),
        // No server to ask (a cluster whose primaries could not be listed).
        None if asked == Engine::Native => Err(Error::EngineUnavailable {
            asked,
            node: "the cluster".to_owned(),
            reply: "no primary to ask".to_owned(),
        }),
        None => Ok(Choice::Scripts {
            why: "no primary to ask".to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn module(library: &str) -> Answer {
        Answer::Module {
            version: "0.1.0".into(),
            library: library.into(),
        }
    }

    fn absent() -> Answer {
        Answer::Absent {
            reply: "ERR unknown command 'REDSEM.ENGINE'".into(),
        }
    }

    #[test]
    fn the_module_serves_only_where_every_server_has_it() {
        let both = vec![("a:1".into(), module("lib")), ("b:2".into(), module("lib"))];
        let native = Choice::Native {
            version: "0.1.0".into(),
        };
        assert_eq!(choose(Engine::Auto, both.clone(), "lib").unwrap(), native);
        assert_eq!(choose(Engine::Native, both.clone(), "lib").unwrap(), native);
        assert!(matches!(
            choose(Engine::Scripts, both, "lib").unwrap(),
            Choice::Scripts { .. }
        ));
        let one = vec![("a:1".into(), module("lib")), ("b:2".into(), absent())];
        match choose(Engine::Auto, one.clone(), "lib").unwrap() {
            Choice::Scripts { why } => assert!(why.starts_with("b:2: ERR unknown"), "{why}"),
            other => panic!("{other:?}"),
        }
        match choose(Engine::Native, one, "lib") {
            Err(Error::EngineUnavailable { asked, node, reply }) => {
                assert_eq!((asked, node.as_str()), (Engine::Native, "b:2"));
                assert!(reply.contains("unknown command"), "{reply}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_module_of_another_protocol_is_not_used() {
        let other = vec![("a:1".into(), module("redsem_0123"))];
        assert!(matches!(
            choose(Engine::Auto, other.clone(), "redsem_4567").unwrap(),
            Choice::Scripts { .. }
        ));
        let err = choose(Engine::Native, other, "redsem_4567").unwrap_err();
        assert!(err.to_string().contains("redsem_0123"), "{err}");
    }

    #[test]
    fn the_reply_of_the_module_is_read() {
        let reply = Value::Array(vec![
            Value::BulkString(b"native".to_vec()),
            Value::BulkString(b"0.1.0".to_vec()),
            Value::BulkString(b"redsem_abc".to_vec()),
            Value::Int(3),
            Value::Int(4),
        ]);
        assert_eq!(parse(&reply), module("redsem_abc"));
        assert!(matches!(parse(&Value::Okay), Answer::Absent { .. }));
    }

    #[test]
    fn only_a_refused_redsem_command_means_the_module_is_missing() {
        let err = |text: &'static str| {
            RedisError::from((
                redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
                "An error was signalled by the server",
                text.to_owned(),
            ))
        };
        assert!(module_missing(&err(
            "unknown command 'REDSEM.LEASE_ACQUIRE', with args beginning with: 'k'"
        )));
        assert!(module_missing(&err(
            "NOPERM this user has no permissions to run the 'redsem.lease_status' command"
        )));
        assert!(!module_missing(&err("unknown command 'FCALL'")));
        assert!(!module_missing(&err(
            "NOPERM No permissions to access a key"
        )));
    }

    #[test]
    fn engines_parse_by_name() {
        for engine in [Engine::Auto, Engine::Scripts, Engine::Native] {
            assert_eq!(engine.as_str().parse::<Engine>().unwrap(), engine);
        }
        assert_eq!("NATIVE".parse::<Engine>().unwrap(), Engine::Native);
        assert!("lua".parse::<Engine>().unwrap_err().is_invalid_argument());
    }
}
