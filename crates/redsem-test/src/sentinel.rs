//! A throwaway Sentinel deployment: a primary, two replicas and three sentinels.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::Child;
use std::thread;
use std::time::{Duration, Instant};
use std::{fs, io};

use crate::server::spawn_redis_server;
use crate::{POLL_INTERVAL, RedisServer, port};

/// The name the sentinels monitor the primary under.
const MASTER_NAME: &str = "redsem-primary";
/// How many sentinels must agree that the primary is down (of three).
const QUORUM: usize = 2;
/// How long the primary may be unreachable before a sentinel calls it down.
const DOWN_AFTER_MS: u64 = 1000;
/// The sentinels' `failover-timeout`; a second failover of the same primary by the same
/// sentinel can start only after twice this.
const FAILOVER_TIMEOUT_MS: u64 = 4000;
/// How long the sentinels may take to find each other and the replicas.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a failover (forced or not) may take until every sentinel names the new primary.
const FAILOVER_WAIT: Duration = Duration::from_secs(30);
/// How long a sentinel may take to answer `PING` after it was spawned.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// How many ports a sentinel tries before giving up.
const START_ATTEMPTS: usize = 5;
/// Connect and read timeout of the harness's own connections to sentinels.
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// A primary with two replicas, watched by three sentinels (`redis-server --sentinel`), every
/// process on a free port of 127.0.0.1 in its own temporary directory.
///
/// The sentinels monitor the primary as [`master_name`](Self::master_name) with quorum 2,
/// `down-after-milliseconds` 1000 and `failover-timeout` 4000, so a primary that dies is
/// replaced within a few seconds. [`failover`](Self::failover) forces a failover (`SENTINEL
/// FAILOVER`) and [`kill_primary`](Self::kill_primary) kills the primary for an unforced one.
///
/// The methods block (sync connections, polling): from async tests call them in
/// `tokio::task::spawn_blocking` or on a multi-threaded runtime. Dropping it kills every
/// process and removes their directories.
///
/// ```no_run
/// use redsem_test::RedisSentinels;
///
/// let deployment = RedisSentinels::start();
/// let before = deployment.primary().port();
/// let after = deployment.failover();
/// assert_ne!(before, after);
/// println!("clients connect through {}", deployment.url());
/// ```
#[derive(Debug)]
pub struct RedisSentinels {
    /// The primary it started with and its two replicas; roles change with failovers.
    nodes: Vec<RedisServer>,
    sentinels: Vec<Sentinel>,
}

impl RedisSentinels {
    /// Start a primary, two replicas of it and three sentinels monitoring it, and wait until
    /// every sentinel knows both replicas and the two other sentinels (so a failover can elect
    /// a leader and promote a replica at once).
    ///
    /// # Panics
    ///
    /// If a process does not start, or the sentinels do not discover each other within 20 s;
    /// the message carries the sentinels' log tails.
    pub fn start() -> RedisSentinels {
        RedisSentinels::start_with(&[])
    }

    /// Like [`start`](Self::start), with `extra_args` appended to the `redis-server` arguments
    /// of the primary and both replicas (not of the sentinels): e.g. `--loadmodule PATH`, so
    /// that whichever node is promoted has the module. Each node keeps them across
    /// [`RedisServer::restart`].
    ///
    /// # Panics
    ///
    /// As [`start`](Self::start).
    pub fn start_with(extra_args: &[&str]) -> RedisSentinels {
        let primary = RedisServer::start_with(extra_args);
        let replicas = [
            RedisServer::start_replica_of_with(&primary, extra_args),
            RedisServer::start_replica_of_with(&primary, extra_args),
        ];
        // A replica the Sentinels promote starts the syncs of the others at once, as
        // `start_replica_of`'s primary and a `promote`d replica do, not after the default 5 s.
        for replica in &replicas {
            let () = replica
                .query(
                    redis::cmd("CONFIG")
                        .arg("SET")
                        .arg("repl-diskless-sync-delay")
                        .arg(0),
                )
                .unwrap_or_else(|e| replica.fail(&format!("CONFIG SET on a replica failed: {e}")));
        }
        let primary_port = primary.port();
        let mut nodes = vec![primary];
        nodes.extend(replicas);
        let sentinels = (0..3).map(|_| Sentinel::start(primary_port)).collect();
        let deployment = RedisSentinels { nodes, sentinels };
        deployment.wait_discovered();
        deployment
    }

    /// The name the sentinels monitor the primary under.
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// The URL of every sentinel, `redis://127.0.0.1:PORT/`.
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels
            .iter()
            .map(|s| format!("redis://127.0.0.1:{}/", s.port))
            .collect()
    }

    /// The whole deployment as one URL of redsem's sentinel form:
    /// `redis+sentinel://127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3/<master name>`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|s| format!("127.0.0.1:{}", s.port))
            .collect();
        format!("redis+sentinel://{}/{MASTER_NAME}", hosts.join(","))
    }

    /// The data nodes: the first primary, then its two replicas (roles change with failovers).
    pub fn nodes(&self) -> &[RedisServer] {
        &self.nodes
    }

    /// The current primary, as the first sentinel that answers names it
    /// (`SENTINEL GET-MASTER-ADDR-BY-NAME`).
    ///
    /// # Panics
    ///
    /// If no sentinel answers, or the one named is not one of [`nodes`](Self::nodes).
    pub fn primary(&self) -> &RedisServer {
        let port = self
            .sentinels
            .iter()
            .find_map(|s| s.master_port().ok())
            .unwrap_or_else(|| self.fail("no sentinel names a primary"));
        self.node_on(port)
    }

    /// Force a failover (`SENTINEL FAILOVER`, which needs no agreement), then wait until every
    /// sentinel names the new primary and it answers `ROLE` as a master. Returns its port.
    ///
    /// A sentinel refuses a second failover of the same primary within 8 s (twice the
    /// `failover-timeout`): this retries the command on every sentinel until one accepts it.
    ///
    /// # Panics
    ///
    /// If no sentinel accepts the failover, or it does not complete within 30 s.
    pub fn failover(&self) -> u16 {
        let old = self.primary().port();
        let deadline = Instant::now() + FAILOVER_WAIT;
        let mut refusals = Vec::new();
        'started: loop {
            for sentinel in &self.sentinels {
                match sentinel
                    .query::<String>(redis::cmd("SENTINEL").arg("FAILOVER").arg(MASTER_NAME))
                {
                    Ok(_) => break 'started,
                    Err(e) => refusals.push(format!("sentinel {}: {e}", sentinel.port)),
                }
            }
            if Instant::now() >= deadline {
                self.fail(&format!(
                    "no sentinel accepted SENTINEL FAILOVER within {FAILOVER_WAIT:?}:\n{}",
                    refusals.join("\n")
                ));
            }
            thread::sleep(Duration::from_millis(200));
        }
        self.wait_new_primary(old, deadline)
    }

    /// Kill the current primary (`SIGKILL`), so that the sentinels fail over by themselves
    /// after `down-after-milliseconds`; returns its port. Wait for the outcome with
    /// [`wait_new_primary_within`](Self::wait_new_primary_within).
    ///
    /// # Panics
    ///
    /// As [`primary`](Self::primary).
    pub fn kill_primary(&mut self) -> u16 {
        let port = self.primary().port();
        let index = self.index_of(port);
        self.nodes[index].stop();
        port
    }

    /// Wait until every sentinel names a primary other than the one on `old_port`, and that one
    /// answers `ROLE` as a master; returns its port.
    ///
    /// # Panics
    ///
    /// If that does not happen within `limit`.
    pub fn wait_new_primary_within(&self, old_port: u16, limit: Duration) -> u16 {
        self.wait_new_primary(old_port, Instant::now() + limit)
    }

    fn wait_new_primary(&self, old: u16, deadline: Instant) -> u16 {
        loop {
            let named: Vec<Result<u16, String>> = self
                .sentinels
                .iter()
                .map(|s| s.master_port().map_err(|e| e.to_string()))
                .collect();
            let last = if let Some(Ok(new)) = named.first()
                && *new != old
                && named.iter().all(|n| n.as_ref() == Ok(new))
            {
                let role = self.node_role(*new);
                if role.as_deref() == Ok("master") {
                    return *new;
                }
                format!("all sentinels name port {new}; its ROLE: {role:?}")
            } else {
                format!("sentinels name {named:?} (old primary on {old})")
            };
            if Instant::now() >= deadline {
                self.fail(&format!("the failover did not complete in time: {last}"));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// Block until the sentinels have found each other and both replicas.
    fn wait_discovered(&self) {
        let deadline = Instant::now() + DISCOVERY_TIMEOUT;
        loop {
            let counts: Vec<(usize, usize)> = self
                .sentinels
                .iter()
                .map(|s| {
                    let count = |sub: &str| {
                        s.query::<Vec<redis::Value>>(
                            redis::cmd("SENTINEL").arg(sub).arg(MASTER_NAME),
                        )
                        .map_or(0, |v| v.len())
                    };
                    (count("REPLICAS"), count("SENTINELS"))
                })
                .collect();
            if counts.iter().all(|&(r, s)| r >= 2 && s >= 2) {
                return;
            }
            if Instant::now() >= deadline {
                self.fail(&format!(
                    "the sentinels did not discover each other and the replicas within \
                     {DISCOVERY_TIMEOUT:?}: (replicas, other sentinels) per sentinel: {counts:?}"
                ));
            }
            thread::sleep(Duration::from_millis(50));
        }
    }

    /// `ROLE`'s first element on the node listening on `port`.
    fn node_role(&self, port: u16) -> redis::RedisResult<String> {
        let node = self.node_on(port);
        let role: Vec<redis::Value> = node.query(&redis::cmd("ROLE"))?;
        match role.first() {
            Some(v) => redis::from_redis_value(v.clone()).map_err(Into::into),
            None => Ok(String::new()),
        }
    }

    fn index_of(&self, port: u16) -> usize {
        self.nodes
            .iter()
            .position(|n| n.port() == port)
            .unwrap_or_else(|| self.fail(&format!("a sentinel names port {port}, none of ours")))
    }

    fn node_on(&self, port: u16) -> &RedisServer {
        &self.nodes[self.index_of(port)]
    }

    /// Panic with `message` and the log tails of every sentinel.
    fn fail(&self, message: &str) -> ! {
        let mut text = message.to_owned();
        for sentinel in &self.sentinels {
            let _ = write!(text, "\n{}", sentinel.log_tail());
        }
        panic!("{text}")
    }
}

/// One `redis-server --sentinel` process.
#[derive(Debug)]
struct Sentinel {
    process: Option<Child>,
    port: u16,
    dir: tempfile::TempDir,
}

impl Sentinel {
    fn start(primary_port: u16) -> Sentinel {
        let dir = tempfile::Builder::new()
            .prefix("redsem-sentinel-")
            .tempdir()
            .expect("create a temporary directory for a sentinel");
        let mut sentinel = Sentinel {
            process: None,
            port: 0,
            dir,
        };
        let mut failures = Vec::new();
        for attempt in 1..=START_ATTEMPTS {
            sentinel.port = port::free_port(false);
            match sentinel.spawn(primary_port) {
                Ok(()) => return sentinel,
                Err(why) => {
                    failures.push(format!(
                        "attempt {attempt} on port {}: {why}",
                        sentinel.port
                    ));
                    sentinel.stop();
                }
            }
        }
        panic!(
            "a sentinel did not start after {START_ATTEMPTS} attempts:\n{}\n{}",
            failures.join("\n"),
            sentinel.log_tail()
        );
    }

    /// Write a fresh config (a sentinel rewrites its own) and start the process on it.
    fn spawn(&mut self, primary_port: u16) -> Result<(), String> {
        let config = self.dir.path().join("sentinel.conf");
        let text = format!(
            "port {port}\nbind 127.0.0.1\ndaemonize no\ndir {dir}\nlogfile {log}\n\
             sentinel monitor {MASTER_NAME} 127.0.0.1 {primary_port} {QUORUM}\n\
             sentinel down-after-milliseconds {MASTER_NAME} {DOWN_AFTER_MS}\n\
             sentinel failover-timeout {MASTER_NAME} {FAILOVER_TIMEOUT_MS}\n\
             sentinel parallel-syncs {MASTER_NAME} 2\n",
            port = self.port,
            dir = self.dir.path().display(),
            log = self.log_path().display(),
        );
        fs::write(&config, text).map_err(|e| format!("cannot write {}: {e}", config.display()))?;
        let stderr = fs::File::create(self.dir.path().join("stderr.log"))
            .map_err(|e| format!("cannot create the stderr file: {e}"))?;
        let process = spawn_redis_server(
            |cmd| {
                cmd.arg(&config).arg("--sentinel");
            },
            stderr,
        );
        self.process = Some(process);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(process) = &mut self.process
                && let Ok(Some(status)) = process.try_wait()
            {
                return Err(format!("the sentinel exited early ({status})"));
            }
            match self.query::<String>(&redis::cmd("PING")) {
                Ok(pong) if pong == "PONG" => return Ok(()),
                Ok(other) => return Err(format!("PING answered {other:?}")),
                Err(e) if Instant::now() >= deadline => {
                    return Err(format!("no answer to PING within {READY_TIMEOUT:?}: {e}"));
                }
                Err(_) => thread::sleep(POLL_INTERVAL),
            }
        }
    }

    /// The port of the primary this sentinel names now.
    fn master_port(&self) -> redis::RedisResult<u16> {
        let addr: Option<(String, u16)> = self.query(
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(MASTER_NAME),
        )?;
        addr.map(|(_, port)| port).ok_or_else(|| {
            redis::RedisError::from(io::Error::new(
                io::ErrorKind::NotFound,
                "the sentinel knows no such master",
            ))
        })
    }

    fn query<T: redis::FromRedisValue>(&self, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}/", self.port))?;
        let mut con = client.get_connection_with_timeout(IO_TIMEOUT)?;
        con.set_read_timeout(Some(IO_TIMEOUT))?;
        cmd.query(&mut con)
    }

    fn log_path(&self) -> PathBuf {
        self.dir.path().join("sentinel.log")
    }

    fn log_tail(&self) -> String {
        let log = fs::read_to_string(self.log_path()).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        let tail = lines[lines.len().saturating_sub(20)..].join("\n");
        format!("--- sentinel on port {} ---\n{tail}", self.port)
    }

    fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            let _ = process.kill();
            let _ = process.wait();
        }
    }
}

impl Drop for Sentinel {
    fn drop(&mut self) {
        self.stop();
    }
}
