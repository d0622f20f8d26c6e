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

/// A `redis-server` process on a free port of 127.0.0.1, with its own temporary directory.
///
/// Dropping it kills and reaps the process and removes the directory. On Linux the server also
/// gets `SIGKILL` when the thread that started it exits (`PR_SET_PDEATHSIG`), so a test killed by
/// a timeout leaves no server behind; start servers on the test's own thread, not on a
/// short-lived one.
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
        RedisServer::launch(extra_args, false)
    }

    /// Start one node of a cluster: cluster mode on, and its bus port (`port + 10000`) free.
    pub(crate) fn start_cluster_node() -> RedisServer {
        RedisServer::launch(Vec::new(), true)
    }

    fn launch(mut extra_args: Vec<OsString>, cluster: bool) -> RedisServer {
        let dir = tempfile::Builder::new()
            .prefix("redsem-test-")
            .tempdir()
            .expect("create a temporary directory for redis-server");
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
        let bin = binary("REDSEM_REDIS_SERVER", "redis-server");
        let mut cmd = Command::new(&bin);
        cmd.arg("--port")
            .arg(self.port.to_string())
            .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(self.log_path())
            .args(["--enable-debug-command", "yes", "--daemonize", "no"])
            .args(&self.extra_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr);
        die_with_parent(&mut cmd);
        let process = cmd
            .spawn()
            .unwrap_or_else(|e| spawn_failed(&bin, "REDSEM_REDIS_SERVER", &e));
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

/// The binary named by the environment variable `var`, or `default` from the `PATH`.
pub(crate) fn binary(var: &str, default: &str) -> OsString {
    env::var_os(var).unwrap_or_else(|| default.into())
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

fn last_lines(text: &str) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(LOG_TAIL_LINES)..].join("\n")
}

/// Have the kernel kill the server with `SIGKILL` when the spawning thread dies.
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
