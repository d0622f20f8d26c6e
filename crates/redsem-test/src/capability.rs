//! What the server binary the tests run (`$REDSEM_REDIS_SERVER`) can do, told by capability,
//! never by its version: some tests use Redis 7 features themselves (the function library,
//! sharded pub/sub, TLS in the build) and are skipped on a server without them (Redis 6.2,
//! a build without TLS).

use std::sync::OnceLock;

use crate::RedisServer;

/// What the server binary has, asked once of a throwaway server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Capabilities {
    /// The function library (`FUNCTION`, `FCALL`: Redis 7.0).
    pub functions: bool,
    /// Sharded pub/sub (`SPUBLISH`, `SSUBSCRIBE`: Redis 7.0).
    pub sharded_pubsub: bool,
    /// TLS, built in.
    pub tls: bool,
    /// `redis.acl_check_cmd` in scripts (Redis 7.0).
    pub acl_check_cmd: bool,
}

impl Capabilities {
    /// The capabilities of the server binary, asked of a throwaway server on first use (from
    /// a thread of its own, so any runtime may call it).
    pub fn of_the_server() -> Capabilities {
        static ASKED: OnceLock<Capabilities> = OnceLock::new();
        *ASKED.get_or_init(|| {
            std::thread::spawn(|| Capabilities::of(&RedisServer::start()))
                .join()
                .expect("the capability probe does not panic")
        })
    }

    /// The capabilities of `server`.
    pub fn of(server: &RedisServer) -> Capabilities {
        Capabilities {
            functions: has_command(server, "FUNCTION"),
            sharded_pubsub: has_command(server, "SPUBLISH"),
            tls: has_tls(server),
            acl_check_cmd: redis::cmd("EVAL")
                .arg("return redis.acl_check_cmd and 1 or 0")
                .arg(0)
                .query::<i64>(&mut server.connection())
                .unwrap_or_else(|e| panic!("EVAL: {e}"))
                == 1,
        }
    }
}

/// Whether `server` has `command`: `COMMAND INFO` names it, and answers nil for a command
/// the server lacks (`FUNCTION` and `SPUBLISH` on Redis 6.2).
pub fn has_command(server: &RedisServer, command: &str) -> bool {
    let answer: Vec<redis::Value> = redis::cmd("COMMAND")
        .arg("INFO")
        .arg(command)
        .query(&mut server.connection())
        .unwrap_or_else(|e| panic!("COMMAND INFO {command}: {e}"));
    !answer.is_empty() && answer.iter().all(|entry| *entry != redis::Value::Nil)
}

/// Whether `server` was built with TLS: `CONFIG GET tls-port` names the setting (a build
/// without TLS has no such setting and answers an empty list).
pub fn has_tls(server: &RedisServer) -> bool {
    let answer: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("tls-port")
        .query(&mut server.connection())
        .unwrap_or_else(|e| panic!("CONFIG GET tls-port: {e}"));
    !answer.is_empty()
}
