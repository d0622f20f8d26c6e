//! One throwaway `redis-server` process.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use std::{env, fs, io, thread};

use crate::{POLL_INTERVAL, port};

/// How long a (re)started server may take to answer `PING`.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How many ports `start` tries before giving up.
const START_ATTEMPTS: usize = 5;
/// Connect and read timeout of the harness's own connections.
const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// How many lines of the log go into a panic message.
const LOG_TAIL_LINES: usize = 40;
/// How long a replica may take to sync, catch up, or become a primary.
const REPLICATION_TIMEOUT: Duration = Duration::from_secs(10);
/// How long [`RedisServer::fill_until_evicting`] may write before it gives up.
const FILL_TIMEOUT: Duration = Duration::from_secs(20);
/// Size of each filler value written by [`RedisServer::fill_until_evicting`].
const FILLER_BYTES: usize = 4096;
/// How many filler keys go into one pipeline.
const FILLER_BATCH: usize = 32;
/// The TTL of filler keys written with `ttl: true`.
const FILLER_TTL_MS: u64 = 3_600_000;

/// A `redis-server` process on a free port of 127.0.0.1, with its own temporary directory.
///
/// Dropping it kills and reaps the process and removes the directory. On Linux the server also
/// gets `SIGKILL` when the test process exits (`PR_SET_PDEATHSIG`, set from one spawning thread
/// that lives as long as the process), so a test killed by a timeout leaves no server behind;
/// a server may be started on any thread, a short-lived one too.
#[derive(Debug)]
pub struct RedisServer {
    process: Option<Child>,
    pid: u32,
    port: u16,
    extra_args: Vec<OsString>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    /// Start a throwaway server with the default arguments and wait until it answers `PING`.
    ///
    /// # Panics
    ///
    /// If `redis-server` is missing or does not become ready after 5 attempts.
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    /// Like [`start`](Self::start), with `extra_args` appended to the `redis-server` arguments.
    ///
    /// # Panics
    ///
    /// If `redis-server` is missing or does not become ready after 5 attempts.
    pub fn start_with(extra_args: &[&str]) -> RedisServer {
        let extra_args = extra_args.iter().map(OsString::from).collect();
        RedisServer::launch(extra_args, false, None)
    }

    /// Like [`start_with`](Self::start_with), with the server's temporary directory (its AOF
    /// and RDB files) created under `root` instead of the default place: e.g. a tmpfs such as
    /// `/dev/shm`, where `appendfsync always` costs little.
    ///
    /// The default place is `$REDSEM_TEST_TMPDIR` if it is set, else the system's temporary
    /// directory (`$TMPDIR`, `/tmp`).
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start), and if no directory can be created under `root`.
    pub fn start_in(root: &Path, extra_args: &[&str]) -> RedisServer {
        let extra_args = extra_args.iter().map(OsString::from).collect();
        RedisServer::launch(extra_args, false, Some(root))
    }

    /// Start a throwaway replica of `primary` (`--replicaof 127.0.0.1 <primary port>`), and wait
    /// until its link to the primary is up, the initial sync is complete and the primary lists it
    /// online.
    ///
    /// The replica is read-only; [`promote`](Self::promote) makes it a primary. It stays a replica
    /// across [`restart`](Self::restart) (and syncs again from scratch). The primary's
    /// `repl-diskless-sync-delay` is set to 0, so the sync starts at once instead of after 5 s.
    ///
    /// # Panics
    ///
    /// If the server does not start, or the sync is not complete within 10 s; the message
    /// carries the log tail of both servers.
    pub fn start_replica_of(primary: &RedisServer) -> RedisServer {
        RedisServer::start_replica_of_with(primary, &[])
    }

    /// Like [`start_replica_of`](Self::start_replica_of), with `extra_args` appended to the
    /// replica's `redis-server` arguments (e.g. `--loadmodule PATH`); they are kept across
    /// [`restart`](Self::restart), as [`start_with`](Self::start_with)'s are.
    ///
    /// # Panics
    ///
    /// As [`start_replica_of`](Self::start_replica_of).
    pub fn start_replica_of_with(primary: &RedisServer, extra_args: &[&str]) -> RedisServer {
        // Diskless sync waits 5 s by default for more replicas to come: start it at once.
        let () = primary
            .query(
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("repl-diskless-sync-delay")
                    .arg(0),
            )
            .unwrap_or_else(|e| primary.fail(&format!("CONFIG SET on the primary failed: {e}")));
        let port = primary.port().to_string();
        let mut args = vec!["--replicaof", "127.0.0.1", &port];
        args.extend_from_slice(extra_args);
        let replica = RedisServer::start_with(&args);
        replica.wait_replication_state(primary, "the initial sync from the primary", |info| {
            field(info, "role") == Some("slave")
                && field(info, "master_link_status") == Some("up")
                && field(info, "master_sync_in_progress") == Some("0")
        });
        // The replica reports its link up before the primary has its first acknowledgement and
        // lists it `state=online` (until then `wait_bgsave`): wait for the primary's view too,
        // or a WAIT or an INFO on the primary right after this call does not count it.
        let listed = format!("port={},state=online", replica.port());
        primary.wait_replication_state(&replica, "listing the new replica online", |info| {
            info.lines()
                .any(|line| line.starts_with("slave") && line.contains(&listed))
        });
        replica
    }

    /// Wait until this replica has applied everything `primary` had written when the call began:
    /// its `slave_repl_offset` reaches the primary's `master_repl_offset`.
    ///
    /// Call it after the writes that the replica must have before a failover.
    ///
    /// # Panics
    ///
    /// If this server is not a replica of `primary`, or has not caught up within 10 s; the
    /// message carries the log tail of both servers.
    pub fn wait_replicated_from(&self, primary: &RedisServer) {
        let info = primary.info("replication");
        let target: u64 = field(&info, "master_repl_offset")
            .and_then(|offset| offset.parse().ok())
            .unwrap_or_else(|| {
                primary.fail(&format!(
                    "no master_repl_offset in the primary's INFO replication:\n{info}"
                ))
            });
        let mine = self.info("replication");
        if field(&mine, "master_port") != Some(primary.port().to_string().as_str()) {
            self.fail(&format!(
                "the server on port {} is not a replica of the one on port {}:\n{mine}",
                self.port,
                primary.port()
            ));
        }
        self.wait_replication_state(
            primary,
            &format!("catching up with the primary's offset {target}"),
            |info| {
                field(info, "master_link_status") == Some("up")
                    && field(info, "slave_repl_offset")
                        .and_then(|offset| offset.parse::<u64>().ok())
                        .is_some_and(|offset| offset >= target)
            },
        );
    }

    /// Make this replica a primary: `REPLICAOF NO ONE`, then wait until it reports `role:master`.
    ///
    /// A promoted replica has exactly what it had applied. Two ways to have it miss the last
    /// writes of the primary, both deterministic (see `tests/replication.rs`):
    ///
    /// * **Hold the stream back**: `CLIENT PAUSE <ms> WRITE` on the replica postpones the
    ///   commands it receives from its primary; promoted during the pause, it drops them (Redis
    ///   7.0: the postponed commands of the old master link are discarded with it).
    /// * **Split brain**: promote first, then write to the old primary, which goes on accepting
    ///   writes from the clients still connected to it.
    ///
    /// ```no_run
    /// use redis::Commands;
    /// use redsem_test::RedisServer;
    ///
    /// let mut primary = RedisServer::start();
    /// let replica = RedisServer::start_replica_of(&primary);
    /// let () = primary.connection().set("k", 1).unwrap();
    /// replica.wait_replicated_from(&primary); // the replica has k = 1
    /// let () = redis::cmd("CLIENT").arg("PAUSE").arg(60_000).arg("WRITE")
    ///     .query(&mut replica.connection()).unwrap();
    /// // "The last write": acknowledged by the primary, held back on the replica.
    /// let () = primary.connection().set("k", 2).unwrap();
    /// replica.promote();
    /// primary.stop(); // the old primary dies; clients move to `replica`, where k = 1
    /// let () = redis::cmd("CLIENT").arg("UNPAUSE").query(&mut replica.connection()).unwrap();
    /// ```
    ///
    /// A `DEBUG SLEEP` on the replica is racy instead: when it wakes, whether it first applies
    /// the stream it buffered or runs `REPLICAOF NO ONE` depends on the order in which its event
    /// loop serves the two connections.
    ///
    /// # Panics
    ///
    /// If `REPLICAOF NO ONE` fails or the role does not change within 10 s.
    ///
    /// Its `repl-diskless-sync-delay` is set to 0 afterwards, like a primary's in
    /// [`start_replica_of`](Self::start_replica_of).
    pub fn promote(&self) {
        let () = self
            .query(redis::cmd("REPLICAOF").arg("NO").arg("ONE"))
            .unwrap_or_else(|e| self.fail(&format!("REPLICAOF NO ONE failed: {e}")));
        let deadline = Instant::now() + REPLICATION_TIMEOUT;
        loop {
            let info = self.info("replication");
            if field(&info, "role") == Some("master") {
                break;
            }
            if Instant::now() >= deadline {
                self.fail(&format!(
                    "still not a primary {REPLICATION_TIMEOUT:?} after REPLICAOF NO ONE:\n{info}"
                ));
            }
            thread::sleep(POLL_INTERVAL);
        }
        // A primary now: a server made its replica (the old primary coming back) syncs at once,
        // as from start_replica_of's primary, not after the default 5 s.
        let () = self
            .query(
                redis::cmd("CONFIG")
                    .arg("SET")
                    .arg("repl-diskless-sync-delay")
                    .arg(0),
            )
            .unwrap_or_else(|e| self.fail(&format!("CONFIG SET after promotion failed: {e}")));
    }

    /// Delete every key of every database (`FLUSHALL SYNC`).
    ///
    /// # Panics
    ///
    /// If the command fails (on a replica, for one: it is read-only).
    pub fn flushall(&self) {
        let () = self
            .query(redis::cmd("FLUSHALL").arg("SYNC"))
            .unwrap_or_else(|e| self.fail(&format!("FLUSHALL SYNC failed: {e}")));
    }

    /// Start a throwaway server that evicts keys: `--maxmemory <maxmemory>` (e.g. `"2mb"`) and
    /// `--maxmemory-policy <policy>` (e.g. `"volatile-lru"`, `"allkeys-lru"`, `"noeviction"`).
    ///
    /// A fresh server uses about 1 MB, so a `maxmemory` of a few MB makes
    /// [`fill_until_evicting`](Self::fill_until_evicting) quick.
    ///
    /// # Panics
    ///
    /// If the server does not start (an unknown policy, a malformed size: the message says so).
    pub fn start_with_eviction(policy: &str, maxmemory: &str) -> RedisServer {
        RedisServer::start_with(&["--maxmemory", maxmemory, "--maxmemory-policy", policy])
    }

    /// Write filler keys (`redsem-test:filler:<n>`, 4 KiB each, with a one-hour TTL if `ttl`)
    /// until the server evicts at least one key, and return `evicted_keys` of `INFO stats` then.
    ///
    /// With a `volatile-*` policy only keys with a TTL are candidates: fill with `ttl: true` to
    /// make room by evicting the filler (and any other key with a TTL), while keys without a TTL
    /// stay; with `ttl: false` the server runs out of candidates and refuses writes instead.
    ///
    /// # Panics
    ///
    /// If a write is refused (`OOM`: the policy has nothing it may evict) or nothing was evicted
    /// after 20 s of writing (no `maxmemory`, or a huge one).
    pub fn fill_until_evicting(&self, ttl: bool) -> u64 {
        let before = self.evicted_keys();
        let mut con = self.connection();
        let _ = con.set_read_timeout(Some(IO_TIMEOUT));
        let value = vec![b'x'; FILLER_BYTES];
        let deadline = Instant::now() + FILL_TIMEOUT;
        let mut written = 0usize;
        loop {
            let mut pipe = redis::pipe();
            for n in written..written + FILLER_BATCH {
                let set = pipe
                    .cmd("SET")
                    .arg(format!("redsem-test:filler:{n}"))
                    .arg(&value);
                if ttl {
                    set.arg("PX").arg(FILLER_TTL_MS);
                }
                set.ignore();
            }
            if let Err(e) = pipe.query::<()>(&mut con) {
                self.fail(&format!(
                    "a filler write failed after {written} keys (ttl: {ttl}): {e}; \
                     an OOM error means the eviction policy has no key it may evict"
                ));
            }
            written += FILLER_BATCH;
            let evicted = self.evicted_keys();
            if evicted > before {
                return evicted;
            }
            if Instant::now() >= deadline {
                self.fail(&format!(
                    "nothing was evicted after {written} filler keys in {FILL_TIMEOUT:?}; \
                     INFO memory:\n{}",
                    self.info("memory")
                ));
            }
        }
    }

    /// `evicted_keys` of `INFO stats`: how many keys the server has evicted since it started.
    ///
    /// # Panics
    ///
    /// If the server cannot be reached or reports no such field.
    pub fn evicted_keys(&self) -> u64 {
        let info = self.info("stats");
        field(&info, "evicted_keys")
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| self.fail(&format!("no evicted_keys in INFO stats:\n{info}")))
    }

    /// The text of `INFO <section>`.
    ///
    /// # Panics
    ///
    /// If the server cannot be reached.
    pub fn info(&self, section: &str) -> String {
        self.query(redis::cmd("INFO").arg(section))
            .unwrap_or_else(|e| self.fail(&format!("INFO {section} failed: {e}")))
    }

    /// Poll this server's `INFO replication` until `done` accepts it; on a timeout the panic
    /// carries the log tails of this server and `other` (the other end of the link).
    fn wait_replication_state(&self, other: &RedisServer, what: &str, done: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + REPLICATION_TIMEOUT;
        loop {
            let info: redis::RedisResult<String> =
                self.query(redis::cmd("INFO").arg("replication"));
            let last = match info {
                Ok(info) if done(&info) => return,
                Ok(info) => info,
                Err(e) => format!("INFO replication failed: {e}"),
            };
            if Instant::now() >= deadline {
                panic!(
                    "server on port {}: {what} did not complete within {REPLICATION_TIMEOUT:?}\n\
                     its INFO replication:\n{last}\n{}\nthe other end, port {}:\n{}",
                    self.port,
                    self.log_tail(),
                    other.port(),
                    other.log_tail()
                );
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// Start one node of a cluster: cluster mode on, and its bus port (`port + 10000`) free.
    pub(crate) fn start_cluster_node() -> RedisServer {
        RedisServer::launch(Vec::new(), true, None)
    }

    /// Start one node of a cluster with more arguments.
    pub(crate) fn start_cluster_node_with(extra_args: &[&str]) -> RedisServer {
        RedisServer::launch(extra_args.iter().map(OsString::from).collect(), true, None)
    }

    fn launch(mut extra_args: Vec<OsString>, cluster: bool, root: Option<&Path>) -> RedisServer {
        let from_env = env::var_os("REDSEM_TEST_TMPDIR").filter(|d| !d.is_empty());
        let root = root
            .map(Path::to_path_buf)
            .or_else(|| from_env.map(PathBuf::from))
            .unwrap_or_else(env::temp_dir);
        let dir = tempfile::Builder::new()
            .prefix("redsem-test-")
            .tempdir_in(&root)
            .unwrap_or_else(|e| {
                panic!(
                    "create a temporary directory for redis-server in {}: {e}",
                    root.display()
                )
            });
        let nodes_conf = dir.path().join("nodes.conf");
        if cluster {
            let mut cluster_args: Vec<OsString> = vec![
                "--cluster-enabled".into(),
                "yes".into(),
                "--cluster-config-file".into(),
                nodes_conf.clone().into(),
                "--cluster-node-timeout".into(),
                "2000".into(),
            ];
            cluster_args.append(&mut extra_args);
            extra_args = cluster_args;
        }
        let mut server = RedisServer {
            process: None,
            pid: 0,
            port: 0,
            extra_args,
            dir,
        };
        let mut failures = Vec::new();
        for attempt in 1..=START_ATTEMPTS {
            server.port = port::free_port(cluster);
            // A failed attempt may have left a node identity bound to its old port.
            let _ = fs::remove_file(&nodes_conf);
            match server.spawn() {
                Ok(()) => return server,
                Err(why) => {
                    failures.push(format!("attempt {attempt} on port {}: {why}", server.port));
                    server.stop();
                }
            }
        }
        server.fail(&format!(
            "redis-server did not start after {START_ATTEMPTS} attempts:\n{}",
            failures.join("\n")
        ))
    }

    /// The TCP port the server listens on (stays the same across [`restart`](Self::restart)).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of the server, `redis://127.0.0.1:PORT/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// A client for the server (does not connect yet).
    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).expect("the URL of a test server is valid")
    }

    /// A new sync connection to the server.
    ///
    /// # Panics
    ///
    /// If the server cannot be reached; the message includes the tail of the log.
    pub fn connection(&self) -> redis::Connection {
        self.client()
            .get_connection_with_timeout(IO_TIMEOUT)
            .unwrap_or_else(|e| self.fail(&format!("cannot connect to {}: {e}", self.url())))
    }

    /// The process id of the current (or, once stopped, the last) server process.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The contents of the server's log file (empty if it does not exist yet).
    pub fn log(&self) -> String {
        fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    /// The server's temporary directory, which holds its log and any files it writes.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Kill the server and wait for it to exit. Does nothing if it is already stopped.
    ///
    /// The port and directory are kept, so [`restart`](Self::restart) can bring it back.
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            // `kill` fails only if the process has already exited; `wait` reaps it either way.
            let _ = process.kill();
            let _ = process.wait();
        }
    }

    /// Stop the server if it runs, then start a new process on the same port and directory and
    /// wait until it answers `PING`. The new process has no data and an empty script cache.
    ///
    /// # Panics
    ///
    /// If the port stays busy or the new process does not become ready.
    pub fn restart(&mut self) {
        self.stop();
        let deadline = Instant::now() + READY_TIMEOUT;
        let mut failures = Vec::new();
        for attempt in 1..=START_ATTEMPTS {
            while !port::is_free(self.port) {
                if Instant::now() >= deadline {
                    self.fail(&format!(
                        "port {} is still busy {READY_TIMEOUT:?} after stopping the server",
                        self.port
                    ));
                }
                thread::sleep(POLL_INTERVAL);
            }
            match self.spawn() {
                Ok(()) => return,
                Err(why) => {
                    failures.push(format!("attempt {attempt}: {why}"));
                    self.stop();
                }
            }
        }
        self.fail(&format!(
            "redis-server did not restart on port {}:\n{}",
            self.port,
            failures.join("\n")
        ))
    }

    /// Whether the server process is still alive.
    pub fn is_running(&mut self) -> bool {
        match &mut self.process {
            Some(process) => matches!(process.try_wait(), Ok(None)),
            None => false,
        }
    }

    /// `CONFIG SET name value` now, and `--name value` on every later (re)start.
    pub(crate) fn set_config_persistently(&mut self, name: &str, value: &str) {
        let () = self
            .query(redis::cmd("CONFIG").arg("SET").arg(name).arg(value))
            .unwrap_or_else(|e| self.fail(&format!("CONFIG SET {name} {value} failed: {e}")));
        self.extra_args.push(format!("--{name}").into());
        self.extra_args.push(value.into());
    }

    /// Run `cmd` on a fresh connection with short timeouts.
    pub(crate) fn query<T: redis::FromRedisValue>(
        &self,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        let mut con = self.client().get_connection_with_timeout(IO_TIMEOUT)?;
        con.set_read_timeout(Some(IO_TIMEOUT))?;
        cmd.query(&mut con)
    }

    /// Panic with `message` and the tail of the server's log and stderr.
    pub(crate) fn fail(&self, message: &str) -> ! {
        panic!("{message}\n{}", self.log_tail())
    }

    /// The last lines of the log (and of stderr, where config errors go), for panic messages.
    pub(crate) fn log_tail(&self) -> String {
        let mut tail = format!(
            "--- last {LOG_TAIL_LINES} lines of {} ---\n{}",
            self.log_path().display(),
            last_lines(&self.log())
        );
        let stderr = fs::read_to_string(self.stderr_path()).unwrap_or_default();
        if !stderr.trim().is_empty() {
            tail.push_str(&format!("\n--- stderr ---\n{}", last_lines(&stderr)));
        }
        tail
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("redis.log")
    }

    fn stderr_path(&self) -> PathBuf {
        self.dir.path().join("stderr.log")
    }

    /// Spawn a process on `self.port` and wait until it answers.
    fn spawn(&mut self) -> Result<(), String> {
        let stderr =
            fs::File::create(self.stderr_path()).expect("create the stderr file of redis-server");
        let process = spawn_redis_server(
            |cmd| {
                cmd.arg("--port")
                    .arg(self.port.to_string())
                    .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                    .arg("--dir")
                    .arg(self.dir.path())
                    .arg("--logfile")
                    .arg(self.log_path())
                    .args(debug_command_args())
                    .args(["--daemonize", "no"])
                    .args(&self.extra_args);
            },
            stderr,
        );
        self.pid = process.id();
        self.process = Some(process);
        self.wait_ready()
    }

    /// Poll until our process answers `PING`, or report why not.
    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(process) = &mut self.process {
                match process.try_wait() {
                    Ok(None) => {}
                    Ok(Some(status)) => {
                        return Err(format!("redis-server exited early ({status})"));
                    }
                    Err(e) => return Err(format!("cannot check on redis-server: {e}")),
                }
            }
            let last_error = match self.probe() {
                Ok(()) => return Ok(()),
                Err(e) => e,
            };
            if Instant::now() >= deadline {
                return Err(format!(
                    "no answer to PING within {READY_TIMEOUT:?} (last error: {last_error})"
                ));
            }
            thread::sleep(POLL_INTERVAL);
        }
    }

    /// `PING` the port, and check that it is our process that answers, not a leftover one.
    fn probe(&self) -> Result<(), String> {
        let pong: String = self.query(&redis::cmd("PING")).map_err(|e| e.to_string())?;
        let info: String = self
            .query(redis::cmd("INFO").arg("server"))
            .map_err(|e| e.to_string())?;
        let ours = format!("process_id:{}", self.pid);
        match (pong.as_str(), info.lines().any(|line| line.trim() == ours)) {
            ("PONG", true) => Ok(()),
            ("PONG", false) => Err("another process answers on this port".to_owned()),
            (other, _) => Err(format!("PING answered {other:?}")),
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `--enable-debug-command yes` where the server knows the option (Redis 7 and Valkey), nothing
/// before Redis 7, which refuses the option as a bad directive and allows `DEBUG` always.
fn debug_command_args() -> &'static [&'static str] {
    static ARGS: std::sync::OnceLock<&'static [&'static str]> = std::sync::OnceLock::new();
    ARGS.get_or_init(|| {
        let bin = binary("REDSEM_REDIS_SERVER", "redis-server");
        // "Redis server v=6.2.14 sha=..." (Valkey: "Valkey server v=8.1.8 ...").
        let major = Command::new(&bin)
            .arg("--version")
            .output()
            .ok()
            .and_then(|out| {
                let text = String::from_utf8_lossy(&out.stdout).into_owned();
                let version = text.split_whitespace().find_map(|w| w.strip_prefix("v="))?;
                version.split('.').next()?.parse::<u32>().ok()
            });
        match major {
            Some(major) if major < 7 => &[],
            _ => &["--enable-debug-command", "yes"],
        }
    })
}

/// The binary named by the environment variable `var`, or `default` from the `PATH`.
pub(crate) fn binary(var: &str, default: &str) -> OsString {
    env::var_os(var).unwrap_or_else(|| default.into())
}

/// Spawn `redis-server` with the arguments `args` adds, stdout discarded and stderr to
/// `stderr`, killed when the calling thread dies.
///
/// # Panics
///
/// If the binary cannot be run.
pub(crate) fn spawn_redis_server(args: impl FnOnce(&mut Command), stderr: fs::File) -> Child {
    let bin = binary("REDSEM_REDIS_SERVER", "redis-server");
    let mut cmd = Command::new(&bin);
    args(&mut cmd);
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(stderr);
    die_with_parent(&mut cmd);
    spawn_from_the_spawner(cmd).unwrap_or_else(|e| spawn_failed(&bin, "REDSEM_REDIS_SERVER", &e))
}

/// A request to the spawner thread: the command, and where to send the child.
type SpawnRequest = (Command, std::sync::mpsc::Sender<io::Result<Child>>);

/// Spawn `cmd` from one thread that lives as long as the process.
///
/// The kernel's parent-death signal (`PR_SET_PDEATHSIG`, see `die_with_parent`) fires when the
/// *thread* that forked the child exits, not the process. A server started on a transient
/// thread (a `spawn_blocking` thread of tokio, which idles out after 10 s) would be killed with
/// it; spawned from here, every server dies with the process instead.
fn spawn_from_the_spawner(cmd: Command) -> io::Result<Child> {
    static SPAWNER: std::sync::OnceLock<std::sync::Mutex<std::sync::mpsc::Sender<SpawnRequest>>> =
        std::sync::OnceLock::new();
    let spawner = SPAWNER.get_or_init(|| {
        let (requests, incoming) = std::sync::mpsc::channel::<SpawnRequest>();
        thread::Builder::new()
            .name("redsem-test-spawner".to_owned())
            .spawn(move || {
                for (mut cmd, reply) in incoming {
                    let _ = reply.send(cmd.spawn());
                }
            })
            .expect("start the thread that spawns the test servers");
        std::sync::Mutex::new(requests)
    });
    let (reply, answer) = std::sync::mpsc::channel();
    spawner
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .send((cmd, reply))
        .map_err(|_| io::Error::other("the spawner thread is gone"))?;
    answer
        .recv()
        .map_err(|_| io::Error::other("the spawner thread did not answer"))?
}

/// Panic because `bin` (configured by `$var`) could not be run.
pub(crate) fn spawn_failed(bin: &OsString, var: &str, error: &io::Error) -> ! {
    if error.kind() == io::ErrorKind::NotFound {
        panic!(
            "cannot run {bin:?}: not found. Install Redis (`apt-get install -y redis-server`, \
             which also brings redis-cli) or point ${var} at the binary"
        );
    }
    panic!("cannot run {bin:?} (set by ${var}): {error}");
}

/// The value of `name` in the `name:value` lines of an `INFO` reply.
fn field<'a>(info: &'a str, name: &str) -> Option<&'a str> {
    info.lines().find_map(|line| {
        let (key, value) = line.trim_end().split_once(':')?;
        (key == name).then_some(value)
    })
}

fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

/// Have the kernel kill the server with `SIGKILL` when the spawning thread dies (the spawner
/// thread, which lives as long as the process).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut Command) {
    use nix::errno::Errno;
    use nix::sys::{prctl, signal::Signal};
    use std::os::unix::process::CommandExt;

    let parent = nix::unistd::getpid();
    // SAFETY: the closure runs in the forked child before `exec`. It only makes the syscalls
    // prctl(2) and getppid(2), which are async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            prctl::set_pdeathsig(Signal::SIGKILL)?;
            // If the parent died before `prctl`, no signal would ever come: do not start.
            if nix::unistd::getppid() != parent {
                return Err(Errno::ESRCH.into());
            }
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn die_with_parent(_cmd: &mut Command) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn field_reads_info_lines() {
        let info = "# Replication\r\nrole:slave\r\nmaster_port:6380\r\nslave_repl_offset:42\r\n";
        assert_eq!(field(info, "role"), Some("slave"));
        assert_eq!(field(info, "slave_repl_offset"), Some("42"));
        assert_eq!(field(info, "master_repl_offset"), None);
        assert_eq!(field(info, "# Replication"), None);
    }

    #[test]
    fn last_lines_keeps_the_tail() {
        let text: String = (1..=50).map(|i| format!("line {i}\n")).collect();
        let tail = last_lines(&text);
        assert!(tail.starts_with("line 11\n"), "{tail}");
        assert!(tail.ends_with("line 50"), "{tail}");
        assert_eq!(last_lines("a\nb"), "a\nb");
    }

    #[test]
    #[should_panic(expected = "apt-get install -y redis-server")]
    fn a_missing_binary_says_how_to_install_it() {
        let missing = io::Error::from(io::ErrorKind::NotFound);
        spawn_failed(&"no-such-redis".into(), "REDSEM_REDIS_SERVER", &missing);
    }
}
