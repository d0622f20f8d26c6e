//! What the script tests share: a time limit for every wait, a wake channel, throwaway
//! servers and connections to them (one without channel rights), the engine the operations
//! run on, its pub/sub messages, and eviction.
//!
//! # The engine under test
//!
//! The tests run every operation by the Lua library (`FCALL`, or `EVALSHA` where a test writes
//! a raw call as a script), unless `REDSEM_TEST_MODULE` names redsem's module
//! (`libredsem_module.so`, from `cargo build -p redsem-module`): then every server they start
//! loads it ([`start_server`], [`start_cluster`]), and every operation call goes as the
//! module's command, `REDSEM.<OPERATION>` on the same keys and ARGV. The switch is made in
//! three places: a [`Conn`] runs the typed wrappers (and `Call`) on the module's engine; a
//! raw call ([`raw`]) is sent as the command instead of `EVALSHA`; a call to add to a `MULTI`
//! ([`op_command`]) is the command instead of `FCALL`. A [`Conn`] on the module's engine
//! also fails the test at once if an operation still goes by the scripts (an `FCALL` of the
//! library or an `EVALSHA` of an operation) or the module refuses its command.

use std::sync::{Arc, LazyLock};
use std::time::Duration;

use futures_util::StreamExt;
use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::{
    Arg, AsyncCommands, Cmd, FromRedisValue, Pipeline, RedisFuture, RedisResult, ScriptInvocation,
    ToRedisArgs, Value,
};
use redsem_test::{RedisCluster, RedisServer, within};

use crate::engine::{self, Answer, Engine, EngineState};
use crate::error::{Error, Result};
use crate::script::Scripting;
use crate::script::library::{ALL, LIBRARY, Op};
use crate::session::Session;

/// How long any one wait of a script test may take before it fails.
pub(super) const LIMIT: Duration = Duration::from_secs(10);

/// The wake channel the tests' requests name.
pub(super) const CHANNEL: &str = "t:wake:test";

/// The session every call of the script tests is made in (its low mark stays 1: it never opens a
/// number itself, the calls name theirs).
pub(super) fn session() -> &'static Session {
    static SESSION: std::sync::LazyLock<std::sync::Arc<Session>> =
        std::sync::LazyLock::new(Session::new);
    &SESSION
}

/// A number of the test session that is the same for the same `name` (so that a call made
/// again under it is a resend).
pub(super) fn number(name: &str) -> u64 {
    name.bytes().fold(1_469_598_103u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(1_099_511)
    }) % 1_000_000_000
        + 1
}

/// Redis time in microseconds, read off the server.
pub(super) async fn server_micros(conn: &mut Conn) -> u64 {
    let (s, us): (u64, u64) = redis::cmd("TIME").query_async(conn).await.expect("TIME");
    s * 1_000_000 + us
}

/// Redis time in milliseconds, as the scripts count it.
pub(super) async fn server_millis(conn: &mut Conn) -> i64 {
    i64::try_from(server_micros(conn).await / 1000).expect("a time in ms fits i64")
}

/// The module the operations run on: the file `REDSEM_TEST_MODULE` names (made absolute), or
/// `None` (unset or empty): the Lua library.
///
/// # Panics
///
/// If the variable names no file.
pub(super) fn module() -> Option<&'static str> {
    static MODULE: LazyLock<Option<String>> = LazyLock::new(|| {
        let named = std::env::var_os("REDSEM_TEST_MODULE").filter(|p| !p.is_empty())?;
        let path = std::fs::canonicalize(&named).unwrap_or_else(|e| {
            panic!(
                "REDSEM_TEST_MODULE={}: {e} (build it: cargo build -p redsem-module)",
                std::path::Path::new(&named).display()
            )
        });
        Some(path.to_str().expect("a UTF-8 module path").to_owned())
    });
    MODULE.as_deref()
}

/// A throwaway server started with `extra` arguments and, where there is one, the module under
/// test loaded ([`module`]).
pub(super) fn start_server(extra: &[&str]) -> RedisServer {
    match module() {
        Some(path) => {
            let mut args = extra.to_vec();
            args.extend(["--loadmodule", path]);
            RedisServer::start_with(&args)
        }
        None => RedisServer::start_with(extra),
    }
}

/// A throwaway cluster of `masters` nodes, each with the module under test loaded where there
/// is one ([`module`]).
pub(super) fn start_cluster(masters: usize) -> RedisCluster {
    match module() {
        Some(path) => {
            let args = ["--loadmodule", path];
            RedisCluster::start_each_with(&vec![&args[..]; masters])
        }
        None => RedisCluster::start(masters),
    }
}

/// A connection the script tests run the operations on: the Lua library, as a plain
/// connection does, or with the module under test ([`module`]) its commands, on the engine
/// the connect chose as a client's does (`REDSEM.ENGINE` asked of every server, and the
/// module used only if each serves this build's library).
///
/// On the module's engine it fails the test at once where an operation would still go by
/// the scripts (an `FCALL` of the library's functions, an `EVALSHA` of an operation's
/// script) or the module refuses its command (unknown, or not for this user): a call must
/// not pass for the module's when the scripts answered it.
#[derive(Clone)]
pub(super) struct Conn<C = MultiplexedConnection> {
    inner: C,
    native: Option<Arc<EngineState>>,
}

impl<C> Conn<C> {
    /// `inner`, on the module's engine when the variable names one: each of `servers`
    /// (`(host:port, a connection to it)`) is asked `REDSEM.ENGINE`.
    async fn new<S: ConnectionLike>(inner: C, servers: Vec<(String, S)>) -> Conn<C> {
        if module().is_none() {
            return Conn {
                inner,
                native: None,
            };
        }
        let mut answers: Vec<(String, Answer)> = Vec::new();
        for (node, mut conn) in servers {
            let answer = within(LIMIT, "REDSEM.ENGINE", engine::ask(&mut conn))
                .await
                .expect("REDSEM.ENGINE");
            answers.push((node, answer));
        }
        let choice = engine::choose(Engine::Native, answers, &LIBRARY.name).unwrap_or_else(|e| {
            panic!("REDSEM_TEST_MODULE is set, and the module does not serve the tests: {e}")
        });
        let state = EngineState::default();
        state.set(choice);
        assert!(state.is_native(), "the module's engine chosen");
        Conn {
            inner,
            native: Some(Arc::new(state)),
        }
    }

    /// Whether the operations go to the module.
    pub(super) fn is_native(&self) -> bool {
        self.native.is_some()
    }
}

/// The SHA1 of every operation's script.
fn script_hashes() -> &'static [String] {
    static HASHES: LazyLock<Vec<String>> = LazyLock::new(|| {
        ALL.iter()
            .map(|op| op.script().get_hash().to_owned())
            .collect()
    });
    &HASHES
}

/// Fail the test if `cmd` runs an operation by the scripts: an `FCALL` of one of the
/// library's functions, or an `EVALSHA` of an operation's script.
fn assert_not_by_the_scripts(cmd: &Cmd) {
    let mut args = cmd.args_iter().filter_map(|arg| match arg {
        Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let (Some(name), Some(what)) = (args.next(), args.next()) else {
        return;
    };
    let name = String::from_utf8_lossy(name).to_ascii_uppercase();
    let what = String::from_utf8_lossy(what);
    let by_the_scripts = match name.as_str() {
        "FCALL" | "FCALL_RO" => what.starts_with(&format!("{}_", LIBRARY.name)),
        "EVALSHA" | "EVALSHA_RO" => script_hashes()
            .iter()
            .any(|hash| hash.eq_ignore_ascii_case(&what)),
        _ => false,
    };
    assert!(
        !by_the_scripts,
        "REDSEM_TEST_MODULE is set, and an operation went by the scripts: {name} {what}"
    );
}

/// Fail the test if `cmd` runs an operation (a function of the library, an operation's
/// script) with no keys (`numkeys` 0): a proxy routes a script by its keys and cannot route
/// one without (see `library/key_check.rs`). A test's own helper scripts may go without.
fn assert_keys_named(cmd: &Cmd) {
    let mut args = cmd.args_iter().filter_map(|arg| match arg {
        Arg::Simple(bytes) => Some(bytes),
        _ => None,
    });
    let (Some(name), Some(what), Some(numkeys)) = (args.next(), args.next(), args.next()) else {
        return;
    };
    let name = String::from_utf8_lossy(name).to_ascii_uppercase();
    let called = String::from_utf8_lossy(what);
    let operation = match name.as_str() {
        "FCALL" | "FCALL_RO" => called.starts_with(&format!("{}_", LIBRARY.name)),
        "EVALSHA" | "EVALSHA_RO" => script_hashes()
            .iter()
            .any(|hash| hash.eq_ignore_ascii_case(&called)),
        _ => false,
    };
    if operation {
        assert!(
            numkeys != b"0",
            "{name} {} sent with no keys",
            String::from_utf8_lossy(what)
        );
    }
}

impl<C: ConnectionLike + Send> ConnectionLike for Conn<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        assert_keys_named(cmd);
        if self.native.is_none() {
            return self.inner.req_packed_command(cmd);
        }
        assert_not_by_the_scripts(cmd);
        Box::pin(async move {
            let reply = self.inner.req_packed_command(cmd).await;
            if let Err(e) = &reply {
                assert!(
                    !engine::module_missing(e),
                    "REDSEM_TEST_MODULE is set, and the server refused the module's command: {e}"
                );
            }
            reply
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        pipeline.cmd_iter().for_each(assert_keys_named);
        if self.native.is_some() {
            pipeline.cmd_iter().for_each(assert_not_by_the_scripts);
        }
        self.inner.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.inner.get_db()
    }
}

impl<C: ConnectionLike + Send> Scripting for Conn<C> {
    fn engine(&self) -> Option<&EngineState> {
        self.native.as_deref()
    }
}

/// A plain connection to `server`: its calls go by the Lua library whether the module is
/// loaded or not (for the tests of the library's own loading and calls).
pub(super) async fn connect_plain(server: &RedisServer) -> MultiplexedConnection {
    within(
        LIMIT,
        "connect",
        server.client().get_multiplexed_async_connection(),
    )
    .await
    .expect("connect")
}

/// `conn`, a connection to `server`, as a [`Conn`].
async fn conn_to(server: &RedisServer, conn: MultiplexedConnection) -> Conn {
    let node = format!("127.0.0.1:{}", server.port());
    Conn::new(conn.clone(), vec![(node, conn)]).await
}

/// A connection to `server`.
pub(super) async fn connect(server: &RedisServer) -> Conn {
    conn_to(server, connect_plain(server).await).await
}

/// A connection to `server` made with `config` (a longer response timeout...).
pub(super) async fn connect_with(
    server: &RedisServer,
    config: &redis::AsyncConnectionConfig,
) -> Conn {
    let conn = within(
        LIMIT,
        "connect",
        server
            .client()
            .get_multiplexed_async_connection_with_config(config),
    )
    .await
    .expect("connect");
    conn_to(server, conn).await
}

/// A connection to `cluster` (every primary asked for the module, as a client's connect asks).
pub(super) async fn connect_cluster(
    cluster: &RedisCluster,
) -> Conn<redis::cluster_async::ClusterConnection> {
    let client = redis::cluster::ClusterClient::new(cluster.urls()).expect("cluster client");
    let conn = within(LIMIT, "cluster connect", client.get_async_connection())
        .await
        .expect("connect");
    let mut primaries = Vec::new();
    if module().is_some() {
        for node in cluster.nodes() {
            primaries.push((
                format!("127.0.0.1:{}", node.port()),
                connect_plain(node).await,
            ));
        }
    }
    Conn::new(conn, primaries).await
}

/// A connection as a user who may run every command on every key but publish to no channel
/// (`resetchannels`): every `PUBLISH` of a script is refused with `NOPERM`.
pub(super) async fn connect_without_channels(server: &RedisServer) -> Conn {
    let mut admin = connect_plain(server).await;
    let () = redis::cmd("ACL")
        .arg(&[
            "SETUSER",
            "nochannels",
            "on",
            ">pw",
            "~*",
            "+@all",
            "resetchannels",
        ])
        .query_async(&mut admin)
        .await
        .expect("ACL SETUSER");
    let url = format!("redis://nochannels:pw@127.0.0.1:{}/", server.port());
    let client = redis::Client::open(url).expect("url");
    let conn = within(LIMIT, "connect", client.get_multiplexed_async_connection())
        .await
        .expect("connect as the user without channels");
    conn_to(server, conn).await
}

/// A pub/sub connection to `server`, subscribed to `channel`.
pub(super) async fn subscribe(server: &RedisServer, channel: &str) -> redis::aio::PubSub {
    let mut pubsub = within(LIMIT, "pubsub", server.client().get_async_pubsub())
        .await
        .expect("pubsub");
    within(LIMIT, "subscribe", pubsub.subscribe(channel))
        .await
        .expect("subscribe");
    pubsub
}

/// Assert that nothing was published on `channel` since `pubsub` subscribed to it: a marker
/// published now (by a plain connection to `server`) is the first message there.
pub(super) async fn assert_nothing_published(
    server: &RedisServer,
    pubsub: &mut redis::aio::PubSub,
    channel: &str,
) {
    let marker = "the marker after the calls";
    let mut admin = connect_plain(server).await;
    let _: i64 = redis::cmd("PUBLISH")
        .arg(channel)
        .arg(marker)
        .query_async(&mut admin)
        .await
        .expect("PUBLISH");
    let first = next_message(pubsub).await;
    assert_eq!(
        first, marker,
        "a message was published on {channel} for a user who may publish on no channel"
    );
}

/// The next message's payload.
pub(super) async fn next_message(pubsub: &mut redis::aio::PubSub) -> String {
    let msg = within(LIMIT, "a message", pubsub.on_message().next())
        .await
        .expect("a message");
    msg.get_payload().expect("payload")
}

/// `SCRIPT LOAD` of `script`: a pipeline or a `MULTI` runs a script by `EVALSHA` alone, and
/// does not send it again on `NOSCRIPT`.
pub(super) async fn load_script(conn: &mut Conn, script: &redis::Script) {
    let _: String = script
        .prepare_invoke()
        .load_async(conn)
        .await
        .expect("SCRIPT LOAD");
}

/// The key's `PTTL`.
pub(super) async fn pttl(conn: &mut Conn, key: &str) -> i64 {
    conn.pttl(key).await.expect("PTTL")
}

/// `INFO` field `name` of section `section`, as a number.
async fn info_number(conn: &mut Conn, section: &str, name: &str) -> u64 {
    let info: String = redis::cmd("INFO")
        .arg(section)
        .query_async(conn)
        .await
        .expect("INFO");
    info.lines()
        .find_map(|l| l.strip_prefix(&format!("{name}:")))
        .and_then(|v| v.trim().parse().ok())
        .expect("an INFO field")
}

/// Limit the server's memory to what it uses plus a megabyte, then write filler keys with
/// a TTL (candidates for `volatile-*` eviction) until `evictions` keys were evicted.
pub(super) async fn evict_by_filling(conn: &mut Conn, evictions: u64) {
    let used = info_number(conn, "memory", "used_memory").await;
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory")
        .arg(used + 1_000_000)
        .query_async(conn)
        .await
        .expect("CONFIG SET maxmemory");
    let filler = "x".repeat(1000);
    within(LIMIT, "filling until keys are evicted", async {
        let mut n = 0_u64;
        while info_number(conn, "stats", "evicted_keys").await < evictions {
            let mut pipe = redis::pipe();
            for _ in 0..200 {
                n += 1;
                pipe.cmd("SET")
                    .arg(format!("filler:{n}"))
                    .arg(&filler)
                    .arg("EX")
                    .arg(3600)
                    .ignore();
            }
            let () = pipe.query_async(conn).await.expect("fillers");
        }
    })
    .await;
}

/// Clear the keys `all` and put a list at `key`, one of them: a value of a type that no
/// primitive keeps at any of its keys.
pub(super) async fn only_a_foreign_list_at(conn: &mut Conn, all: &[String], key: &str) {
    let _: () = conn.del(all).await.expect("del");
    let _: () = conn.rpush(key, "foreign").await.expect("rpush");
}

/// Assert that each `(script, result)` is the [`Error::WrongType`] that names `key`, the
/// primitive's key `#i`, where the test put a foreign value.
#[track_caller]
pub(super) fn assert_wrong_type(results: Vec<(&str, Result<()>)>, key: &str, i: usize) {
    for (script, result) in results {
        match result {
            Err(Error::WrongType { key: got, .. }) => assert_eq!(got, key, "{script}"),
            other => panic!("{script} on foreign key #{i}: {other:?}"),
        }
    }
}

/// A script that writes the Redis time (ms) as the score of member `ARGV[1]` in the zset
/// `KEYS[1]` and as the field `ARGV[2]` of the hash `KEYS[2]` (a lease end and the hint that
/// says when the first one falls due).
const PLANT_NOW: &str = "local t = redis.call('TIME') \
    local now = string.format('%d', t[1] * 1000 + math.floor(t[2] / 1000)) \
    redis.call('ZADD', KEYS[1], now, ARGV[1]) \
    redis.call('HSET', KEYS[2], ARGV[2], now) \
    return now";

/// A MULTI that first makes `member`'s end in `zset` and the field `field` of `hash` the Redis
/// time: the call added after it then runs in that millisecond or one just after, which is
/// how a test reaches a boundary of "now" (`<=` against `<`, a time read 5 ms off). The
/// first reply is the time planted.
pub(super) fn plant_now(zset: &str, member: &str, hash: &str, field: &str) -> redis::Pipeline {
    let mut pipe = redis::pipe();
    pipe.atomic()
        .cmd("EVAL")
        .arg(PLANT_NOW)
        .arg(2)
        .arg(zset)
        .arg(hash)
        .arg(member)
        .arg(field);
    pipe
}

/// A call of `op` on `keys` as one command, to add to a `MULTI` (its ARGV after): `FCALL
/// <function> <numkeys> <keys>`, or with the module under test ([`module`]) its command,
/// `REDSEM.<OPERATION> <keys>`.
pub(super) fn op_command(op: &Op, keys: &[String]) -> Cmd {
    if module().is_some() {
        let mut cmd = redis::cmd(op.command());
        cmd.arg(keys);
        return cmd;
    }
    let mut cmd = redis::cmd("FCALL");
    cmd.arg(op.function()).arg(keys.len()).arg(keys);
    cmd
}

/// A call of `op` with raw KEYS and ARGV, as a test writes it: the operation's script
/// (`EVALSHA`), or with the module under test ([`module`]) its command,
/// `REDSEM.<OPERATION> <keys> <args>`.
pub(super) fn raw(op: &'static Op) -> Raw {
    Raw {
        op,
        keys: Vec::new(),
        args: Vec::new(),
    }
}

/// A raw call of an operation ([`raw`]).
pub(super) struct Raw {
    op: &'static Op,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Raw {
    /// Add key(s) (a slice adds each).
    pub(super) fn key(mut self, key: impl ToRedisArgs) -> Raw {
        self.keys.extend(key.to_redis_args());
        self
    }

    /// Add argument(s) (a slice adds each).
    pub(super) fn arg(mut self, arg: impl ToRedisArgs) -> Raw {
        self.args.extend(arg.to_redis_args());
        self
    }

    /// The module's command.
    fn command(&self) -> Cmd {
        let mut cmd = redis::cmd(self.op.command());
        for key in &self.keys {
            cmd.arg(key);
        }
        for arg in &self.args {
            cmd.arg(arg);
        }
        cmd
    }

    /// The script's invocation.
    fn invocation(&self) -> ScriptInvocation<'static> {
        let mut invocation = self.op.script().prepare_invoke();
        for key in &self.keys {
            invocation.key(key);
        }
        for arg in &self.args {
            invocation.arg(arg);
        }
        invocation
    }

    /// Send it: `EVALSHA` (the script loaded on `NOSCRIPT`), or the module's command.
    pub(super) async fn invoke_async<T: FromRedisValue>(&self, conn: &mut Conn) -> RedisResult<T> {
        if module().is_some() {
            self.command().query_async(conn).await
        } else {
            self.invocation().invoke_async(conn).await
        }
    }

    /// Add it to `pipe`: `EVALSHA` (a pipeline does not load the script: [`load_for_multi`]
    /// first), or the module's command.
    pub(super) fn add_to<'p>(&self, pipe: &'p mut Pipeline) -> &'p mut Pipeline {
        if module().is_some() {
            pipe.add_command(self.command())
        } else {
            pipe.invoke_script(&self.invocation())
        }
    }
}

/// `SCRIPT LOAD` of `op`'s script, for a pipeline or a `MULTI` that runs it raw ([`Raw::add_to`]);
/// nothing with the module under test, whose command needs no loading.
pub(super) async fn load_for_multi(conn: &mut Conn, op: &Op) {
    if module().is_none() {
        load_script(conn, op.script()).await;
    }
}
