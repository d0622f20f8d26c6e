//! Running the built `redsem` against a throwaway server, with a deadline on every wait.

use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use redsem::redis;
use redsem_test::{RedisServer, eventually};

/// The binary under test.
pub(crate) const REDSEM: &str = env!("CARGO_BIN_EXE_redsem");

/// The limit of any wait that should end quickly: a hang fails instead of stalling.
pub(crate) const LIMIT: Duration = Duration::from_secs(10);

/// One test's world: its own Redis server and a scratch directory (the server's).
pub(crate) struct World {
    pub(crate) server: RedisServer,
}

impl World {
    pub(crate) fn new() -> Self {
        World {
            server: RedisServer::start(),
        }
    }

    /// `redsem --url <this server> ARGS...`, with no `REDIS_URL`, `REDSEM_PREFIX`,
    /// `REDSEM_ENGINE` or `RUST_LOG` leaking in from the environment.
    pub(crate) fn redsem(&self, args: &[&str]) -> Command {
        let url = self.server.url();
        let mut all = vec!["--url", url.as_str()];
        all.extend_from_slice(args);
        bare(&all)
    }

    /// Run `redsem ARGS...` to the end (at most [`LIMIT`]).
    pub(crate) fn run(&self, args: &[&str]) -> Outcome {
        finish(self.redsem(args))
    }

    /// Start `redsem ARGS...` in the background.
    pub(crate) fn start(&self, args: &[&str]) -> Running {
        Running::start(self.redsem(args))
    }

    /// A path in the test's scratch directory.
    pub(crate) fn path(&self, name: &str) -> PathBuf {
        self.server.dir().join(name)
    }

    /// The JSON of `status NAME --json`.
    pub(crate) fn status(&self, name: &str) -> serde_json::Value {
        let out = self.run(&["status", name, "--json"]).success();
        serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
    }

    /// The ids of the live holders of NAME.
    pub(crate) fn holders(&self, name: &str) -> Vec<String> {
        let status = self.status(name);
        status["holders"]
            .as_array()
            .expect("holders is an array")
            .iter()
            .map(|h| h["id"].as_str().expect("id is a string").to_owned())
            .collect()
    }

    /// `acquire NAME --limit N ARGS...`, returning the printed permit id.
    pub(crate) fn acquire(&self, name: &str, limit: u32, args: &[&str]) -> String {
        let limit = limit.to_string();
        let mut all = vec!["acquire", name, "--limit", &limit];
        all.extend(args);
        let out = self.run(&all).success();
        out.stdout.trim().to_owned()
    }

    /// Wait until NAME has `n` waiters.
    pub(crate) fn wait_for_waiters(&self, name: &str, n: u64) {
        let deadline = Instant::now() + LIMIT;
        loop {
            let status = self.status(name);
            if status["waiters"].as_array().map(Vec::len) == usize::try_from(n).ok() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{name} did not get {n} waiters within {LIMIT:?}; last status {status}"
            );
            thread::sleep(Duration::from_millis(5));
        }
    }

    /// `permits NAME available`, as a number.
    pub(crate) fn available(&self, name: &str) -> i64 {
        let out = self.run(&["permits", name, "available"]).success();
        out.stdout
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{e}: {out:?}"))
    }

    /// `latch NAME count`, as a number.
    pub(crate) fn latch_count(&self, name: &str) -> u64 {
        let out = self.run(&["latch", name, "count"]).success();
        out.stdout
            .trim()
            .parse()
            .unwrap_or_else(|e| panic!("{e}: {out:?}"))
    }

    /// The requests queued for permits of NAME: read from the answer to a `--no-wait` request
    /// for more permits than there can ever be ("... (N available, K waiting)"), which takes
    /// nothing.
    pub(crate) fn permit_waiters(&self, name: &str) -> u64 {
        let out = self
            .run(&["permits", name, "acquire", "4294967295", "--no-wait"])
            .expect(75);
        let waiting = out
            .error()
            .strip_suffix(" waiting)")
            .and_then(|s| s.rsplit(' ').next())
            .and_then(|n| n.parse().ok());
        waiting.unwrap_or_else(|| panic!("no waiter count in {out:?}"))
    }

    /// Wait until NAME has `n` queued requests for permits.
    pub(crate) fn wait_for_permit_waiters(&self, name: &str, n: u64) {
        let mut last = None;
        eventually(LIMIT, &format!("{n} waiting for permits of {name}"), || {
            last = Some(self.permit_waiters(name));
            last == Some(n)
        });
    }

    /// Wait until `n` processes listen for latch NAME to open: subscribers to its channels
    /// (`redsem:{latch:NAME}:...`, the prefix, kind and name every key and channel of it
    /// starts with).
    pub(crate) fn wait_for_latch_listeners(&self, name: &str, n: i64) {
        let mut conn = self.server.connection();
        let pattern = format!("redsem:{{latch:{name}}}:*");
        eventually(LIMIT, &format!("{n} listening to latch {name}"), || {
            let channels: Vec<String> = redis::cmd("PUBSUB")
                .arg("CHANNELS")
                .arg(&pattern)
                .query(&mut conn)
                .expect("PUBSUB CHANNELS");
            if channels.is_empty() {
                return false;
            }
            let counts: Vec<(String, i64)> = redis::cmd("PUBSUB")
                .arg("NUMSUB")
                .arg(&channels)
                .query(&mut conn)
                .expect("PUBSUB NUMSUB");
            counts.iter().map(|(_, k)| k).sum::<i64>() >= n
        });
    }

    /// Wait until the file at `path` holds a pid (written by `echo $$ > path`), and return it.
    pub(crate) fn pid_in(&self, path: &PathBuf) -> i32 {
        let mut pid = None;
        eventually(LIMIT, "the command wrote its pid", || {
            pid = std::fs::read_to_string(path)
                .ok()
                .and_then(|s| s.trim().parse().ok());
            pid.is_some()
        });
        pid.expect("checked above")
    }
}

/// Whether `line` is the one that announces a wait off a terminal.
pub(crate) fn is_wait_line(line: &str) -> bool {
    line.starts_with("redsem: waiting for ")
}

/// `redsem ARGS...` with nothing set but the arguments.
pub(crate) fn bare(args: &[&str]) -> Command {
    let mut cmd = Command::new(REDSEM);
    cmd.args(args)
        .env_remove("REDIS_URL")
        .env_remove("REDSEM_PREFIX")
        .env_remove("REDSEM_ENGINE")
        .env_remove("RUST_LOG")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    cmd
}

/// Run `cmd` to the end (at most [`LIMIT`]).
pub(crate) fn finish(cmd: Command) -> Outcome {
    Running::start(cmd).wait()
}

/// How a finished `redsem` went.
#[derive(Debug)]
pub(crate) struct Outcome {
    pub(crate) status: ExitStatus,
    pub(crate) stdout: String,
    pub(crate) stderr: String,
    /// From start to exit.
    pub(crate) elapsed: Duration,
}

impl Outcome {
    /// The exit code (panics if a signal ended it).
    pub(crate) fn code(&self) -> i32 {
        self.status
            .code()
            .unwrap_or_else(|| panic!("redsem died of a signal: {self:?}"))
    }

    /// Check the exit code; for a failure, that stderr is exactly one `redsem: ` line.
    #[track_caller]
    pub(crate) fn expect(self, code: i32) -> Self {
        assert_eq!(self.code(), code, "exit code of {self:?}");
        if code != 0 {
            self.assert_one_error_line();
        }
        self
    }

    #[track_caller]
    pub(crate) fn success(self) -> Self {
        self.expect(0)
    }

    /// Checks that stderr is one `redsem: ` error line, after at most the one line that
    /// announces a wait off a terminal.
    #[track_caller]
    pub(crate) fn assert_one_error_line(&self) {
        let lines: Vec<&str> = self.stderr.lines().filter(|l| !is_wait_line(l)).collect();
        assert_eq!(lines.len(), 1, "one error line on stderr: {self:?}");
        assert!(lines[0].starts_with("redsem: "), "{self:?}");
        assert!(!self.stderr.contains("panicked"), "{self:?}");
        assert!(
            self.stderr.lines().filter(|l| is_wait_line(l)).count() <= 1,
            "at most one waiting line: {self:?}"
        );
    }

    /// The one error line, without its `redsem: ` tag.
    pub(crate) fn error(&self) -> &str {
        let line = self.stderr.lines().rfind(|l| !is_wait_line(l));
        line.unwrap_or_default().trim_start_matches("redsem: ")
    }
}

/// A `redsem` running in the background; killed if still running when dropped.
pub(crate) struct Running {
    child: Child,
    started: Instant,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
}

impl Running {
    pub(crate) fn start(mut cmd: Command) -> Self {
        let started = Instant::now();
        let mut child = cmd.spawn().expect("start redsem");
        let stdout = child.stdout.take().map(drain);
        let stderr = child.stderr.take().map(drain);
        Running {
            child,
            started,
            stdout,
            stderr,
        }
    }

    pub(crate) fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).expect("pid fits"))
    }

    pub(crate) fn signal(&self, signal: Signal) {
        kill(self.pid(), signal).expect("signal redsem");
    }

    /// The worker: the process under `redsem run`'s guard (the process started) that holds
    /// the permit and runs the command (Linux).
    pub(crate) fn worker(&self) -> Pid {
        let children = format!("/proc/{0}/task/{0}/children", self.pid());
        let deadline = Instant::now() + LIMIT;
        loop {
            let listed = std::fs::read_to_string(&children).unwrap_or_default();
            if let Some(pid) = listed.split_whitespace().next() {
                return Pid::from_raw(pid.parse().expect("a pid"));
            }
            assert!(Instant::now() < deadline, "redsem run started no worker");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Whether it has exited (without reaping the output).
    pub(crate) fn has_exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Wait for the exit, at most [`LIMIT`].
    pub(crate) fn wait(self) -> Outcome {
        self.wait_within(LIMIT)
    }

    /// Wait for the exit, at most `limit`; kill it and panic after that.
    pub(crate) fn wait_within(mut self, limit: Duration) -> Outcome {
        let deadline = Instant::now() + limit;
        let status = loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                break status;
            }
            if Instant::now() >= deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                let stderr = self.stderr.take().map(join).unwrap_or_default();
                panic!("redsem did not exit within {limit:?}; stderr: {stderr}");
            }
            thread::sleep(Duration::from_millis(2));
        };
        let elapsed = self.started.elapsed();
        Outcome {
            status,
            stdout: self.stdout.take().map(join).unwrap_or_default(),
            stderr: self.stderr.take().map(join).unwrap_or_default(),
            elapsed,
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn drain(mut pipe: impl std::io::Read + Send + 'static) -> JoinHandle<String> {
    thread::spawn(move || {
        let mut text = String::new();
        let _ = pipe.read_to_string(&mut text);
        text
    })
}

fn join(handle: JoinHandle<String>) -> String {
    handle.join().unwrap_or_default()
}

/// Whether `pid` is a live process: not gone, and not a zombie waiting to be reaped (the
/// container's init may never reap the orphans it adopts).
pub(crate) fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => {
            let state = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().next());
            !matches!(state, Some("Z" | "X"))
        }
        Err(_) => false,
    }
}

/// Wait until `pid` is dead (at most `limit`); return how long that took, to about 0.1 ms.
pub(crate) fn wait_dead(pid: i32, limit: Duration) -> Duration {
    let start = Instant::now();
    while alive(pid) {
        assert!(
            start.elapsed() < limit,
            "process {pid} still alive after {limit:?}"
        );
        thread::sleep(Duration::from_micros(100));
    }
    start.elapsed()
}

/// A port for `serve --listen`, its own: one the kernel hands out free now (bind to port 0),
/// not [`closed_port`], which gives every caller the same low port (two `serve`s of tests
/// running at once would then share it, and one test read the other's page).
pub(crate) fn listen_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0))
        .and_then(|listener| listener.local_addr())
        .expect("a free port on 127.0.0.1")
        .port()
}

/// A port of 127.0.0.1 with nothing listening on it, and that nothing of the tests will take:
/// one below 1024 that refuses a connection now. (A free port of the ephemeral range, found by
/// binding port 0, could be taken by a server another test starts at the same moment.)
pub(crate) fn closed_port() -> u16 {
    (1..1024)
        .find(|port| {
            std::net::TcpStream::connect_timeout(
                &std::net::SocketAddr::from(([127, 0, 0, 1], *port)),
                Duration::from_millis(200),
            )
            .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
        })
        .expect("a port below 1024 that refuses connections")
}

/// Hold every write of `world`'s server (`CLIENT PAUSE 5000 WRITE`: no script runs, so no
/// renewal) and read the end Redis holds for the lease of permit `id` of `jobs`: the local
/// instant before which it cannot end. Undo with [`unpause`].
pub(crate) fn pause_and_read_lease_end(world: &World, id: &str) -> Instant {
    let mut admin = world.server.connection();
    let () = redsem::redis::cmd("CLIENT")
        .arg("PAUSE")
        .arg(5000)
        .arg("WRITE")
        .query(&mut admin)
        .expect("CLIENT PAUSE");
    let asked = Instant::now();
    let (lease_end_ms, (secs, micros)): (Option<f64>, (u64, u64)) = redsem::redis::pipe()
        .cmd("ZSCORE")
        .arg("redsem:{lease:jobs}:leases")
        .arg(id.trim())
        .cmd("TIME")
        .query(&mut admin)
        .expect("ZSCORE, TIME");
    let lease_end_ms = lease_end_ms.expect("the permit's lease end");
    let now_ms = (secs * 1_000_000 + micros) as f64 / 1000.0;
    // TIME ran after `asked`, so the lease ends no earlier than this local instant.
    asked + Duration::from_secs_f64(((lease_end_ms - now_ms) / 1000.0).max(0.0))
}

/// `CLIENT UNPAUSE` on `world`'s server.
pub(crate) fn unpause(world: &World) {
    let () = redsem::redis::cmd("CLIENT")
        .arg("UNPAUSE")
        .query(&mut world.server.connection())
        .expect("CLIENT UNPAUSE");
}
