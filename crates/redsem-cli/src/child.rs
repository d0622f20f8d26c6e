//! The command `run` starts: spawned with the permit in its environment, bound to this
//! process's life, signalled, and its exit status as a code.

use std::ffi::{OsStr, OsString};
use std::io;
use std::os::unix::ffi::OsStrExt as _;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::{ExitStatus, Stdio};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use redsem::LeasePermit;

use crate::error::{CliError, exit};

/// A running command.
#[derive(Debug)]
pub(crate) struct Child {
    process: tokio::process::Child,
}

impl Child {
    /// Start `command` with `REDSEM_NAME`, `REDSEM_ID`, `REDSEM_TOKEN` and `REDSEM_SLOT` of
    /// `permit` in its environment and this process's stdin, stdout and stderr. It gets SIGKILL if this
    /// process dies, so it never runs without someone watching its permit.
    ///
    /// `program` is what [`resolve`] found for `argv[0]`; the command sees `argv[0]` as its name.
    ///
    /// # Errors
    ///
    /// Exit 127 if the program is not found, 126 if it cannot be started.
    pub(crate) fn spawn(
        program: &Path,
        argv: &[OsString],
        permit: &LeasePermit,
    ) -> Result<Self, CliError> {
        let (name, args) = argv
            .split_first()
            .ok_or_else(|| CliError::new(exit::USAGE, "no command to run"))?;
        let mut cmd = tokio::process::Command::new(program);
        cmd.arg0(name)
            .args(args)
            .env("REDSEM_NAME", permit.semaphore())
            .env("REDSEM_ID", permit.id().as_str())
            .env("REDSEM_TOKEN", permit.token().to_string())
            .env("REDSEM_SLOT", permit.slot().to_string())
            .stdin(Stdio::inherit())
            .stdout(Stdio::inherit())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        die_with_parent(&mut cmd);
        let process = cmd.spawn().map_err(|e| {
            let code = match e.kind() {
                io::ErrorKind::NotFound => exit::NOT_FOUND,
                _ => exit::CANNOT_EXECUTE,
            };
            CliError::new(code, format!("cannot run {}: {e}", name.to_string_lossy()))
        })?;
        tracing::info!(pid = process.id(), "command started");
        Ok(Child { process })
    }

    /// Send `signal`, unless the command has already exited (and been reaped).
    pub(crate) fn signal(&self, signal: Signal) {
        let Some(pid) = self.process.id().and_then(|p| i32::try_from(p).ok()) else {
            return;
        };
        tracing::info!(pid, signal = signal.as_str(), "signalling the command");
        if let Err(err) = kill(Pid::from_raw(pid), signal) {
            tracing::debug!(pid, %err, "could not signal the command; it has exited");
        }
    }

    /// The command's process id, until it has been reaped.
    pub(crate) fn id(&self) -> Option<u32> {
        self.process.id()
    }

    /// Wait for the command to exit.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub(crate) async fn wait(&mut self) -> Result<ExitStatus, CliError> {
        self.process
            .wait()
            .await
            .map_err(|e| CliError::new(exit::FAILURE, format!("cannot wait for the command: {e}")))
    }

    /// Wait until the command has exited after SIGKILL (which cannot be ignored).
    pub(crate) async fn reap(&mut self) {
        if let Err(err) = self.process.wait().await {
            tracing::warn!(%err, "could not wait for the killed command");
        }
    }
}

/// Find `program` as `execvp` will, before any wait: a path (with a `/`) as it is, a bare name
/// in the directories of `PATH`. Checked up front so that a typo fails at once rather than
/// after queueing for a permit, possibly for hours.
///
/// # Errors
///
/// Exit 127 if there is no such file, 126 if it is not an executable file.
pub(crate) fn resolve(program: &OsStr) -> Result<PathBuf, CliError> {
    let shown = program.to_string_lossy();
    if program.is_empty() {
        return Err(CliError::new(
            exit::NOT_FOUND,
            "cannot run an empty command name",
        ));
    }
    if program.as_bytes().contains(&b'/') {
        let path = PathBuf::from(program);
        return match executable(&path) {
            Ok(()) => Ok(path),
            Err(why) => Err(why.error(&shown)),
        };
    }
    // execvp's search path when PATH is unset (glibc and musl).
    let dirs = std::env::var_os("PATH").unwrap_or_else(|| "/bin:/usr/bin".into());
    let mut refused = None;
    for dir in std::env::split_paths(&dirs) {
        // An empty entry is the current directory.
        let dir = if dir.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            dir
        };
        let path = dir.join(program);
        match executable(&path) {
            Ok(()) => return Ok(path),
            Err(NotRunnable::Missing) => {}
            Err(why) => refused = refused.or(Some((why, path))),
        }
    }
    Err(match refused {
        Some((why, path)) => why.error(&path.to_string_lossy()),
        None => CliError::new(
            exit::NOT_FOUND,
            format!("cannot run {shown}: not found in PATH"),
        ),
    })
}

/// Why a path cannot be executed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum NotRunnable {
    Missing,
    Directory,
    NotExecutable,
}

impl NotRunnable {
    fn error(self, shown: &str) -> CliError {
        let (code, why) = match self {
            NotRunnable::Missing => (exit::NOT_FOUND, "no such file"),
            NotRunnable::Directory => (exit::CANNOT_EXECUTE, "it is a directory"),
            NotRunnable::NotExecutable => {
                (exit::CANNOT_EXECUTE, "permission denied (not executable)")
            }
        };
        CliError::new(code, format!("cannot run {shown}: {why}"))
    }
}

/// Whether `path` is a file with an execute bit.
fn executable(path: &Path) -> Result<(), NotRunnable> {
    let meta = std::fs::metadata(path).map_err(|_| NotRunnable::Missing)?;
    if meta.is_dir() {
        return Err(NotRunnable::Directory);
    }
    // No execute bit at all: `exec` would refuse whoever runs it. Whose bit it is (owner,
    // group, other) is left to `exec`, which fails with 126 as well.
    let mode = meta.permissions().mode();
    let bits = 0o111;
    if mode & bits == 0 {
        return Err(NotRunnable::NotExecutable);
    }
    Ok(())
}

/// The exit code that reports `status`: its code, or 128 + the signal that ended it.
pub(crate) fn exit_code(status: ExitStatus) -> u8 {
    match (status.code(), status.signal()) {
        (Some(code), _) => u8::try_from(code & 0xff).unwrap_or(exit::FAILURE),
        (None, Some(signal)) => {
            exit::SIGNALLED.saturating_add(u8::try_from(signal).unwrap_or(u8::MAX))
        }
        (None, None) => exit::FAILURE,
    }
}

/// Have the kernel send SIGKILL to the command when this process dies (Linux
/// `PR_SET_PDEATHSIG`), even by SIGKILL, so that it never runs on without its permit.
///
/// The signal is bound to the thread that spawns: `redsem` spawns from the main thread of a
/// current-thread runtime, which lives as long as the process.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn die_with_parent(cmd: &mut tokio::process::Command) {
    let parent = nix::unistd::getpid();
    // SAFETY: `pre_exec` runs the closure in the forked child before `exec`. It only makes
    // the `prctl` and `getppid` system calls, which are async-signal-safe, allocates nothing
    // and touches no lock or state shared with other threads of the parent.
    unsafe {
        cmd.pre_exec(move || {
            nix::sys::prctl::set_pdeathsig(Signal::SIGKILL)?;
            // The parent may have died before the prctl: then nobody will kill us; do not run.
            if nix::unistd::getppid() != parent {
                return Err(nix::errno::Errno::ESRCH.into());
            }
            Ok(())
        });
    }
}

/// Elsewhere there is no parent-death signal: a `redsem` killed by SIGKILL leaves its command
/// running, and its permit comes back when the lease ends.
#[cfg(not(target_os = "linux"))]
fn die_with_parent(_cmd: &mut tokio::process::Command) {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commands_are_looked_up_like_execvp() {
        assert!(resolve(OsStr::new("sh")).is_ok());
        assert_eq!(
            resolve(OsStr::new("no-such-command-here"))
                .map_err(|e| e.code())
                .err(),
            Some(exit::NOT_FOUND)
        );
        assert_eq!(
            resolve(OsStr::new("./no-such-command"))
                .map_err(|e| e.code())
                .err(),
            Some(exit::NOT_FOUND)
        );
        assert_eq!(
            resolve(OsStr::new("/")).map_err(|e| e.code()).err(),
            Some(exit::CANNOT_EXECUTE)
        );
    }

    #[test]
    fn exit_codes_pass_through_and_signals_add_128() {
        assert_eq!(exit_code(ExitStatus::from_raw(0)), 0);
        assert_eq!(exit_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(exit_code(ExitStatus::from_raw(15)), 143);
        assert_eq!(exit_code(ExitStatus::from_raw(9)), 137);
    }
}
