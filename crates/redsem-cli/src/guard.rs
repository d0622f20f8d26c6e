//! `run` and `lock` as two processes (Linux): a small guard, the process the caller started
//! and signals, and under it the worker that holds the permit and runs the command. Each
//! covers the other's death by SIGKILL, which no process can catch for itself:
//!
//! * the guard killed: the worker gets SIGTERM (`PR_SET_PDEATHSIG`) and ends as for a
//!   SIGTERM: the command and everything it started are stopped, then the permit released;
//! * the worker killed (the OOM killer, a `kill -9` of it): the guard is a child subreaper
//!   above it, so the command's orphaned tree is re-parented to the guard, which kills all of
//!   it at once.
//!
//! Only both killed at once (`kill -9` of the process group) leaves the command's children
//! running: the command itself still dies with the worker (its own parent-death signal).
//!
//! The guard forks before any thread exists, blocks the signals it forwards and waits for
//! them and for its children with `sigwaitinfo`: it runs no async code and holds no lock.

use crate::error::exit;

/// Split into guard and worker. In the worker: `None`, go on. In the guard: `Some(code)`,
/// the exit code to leave with (the worker's), once the worker and every process under it
/// have ended. Elsewhere than Linux, or if `fork` fails: `None`, one process as before.
///
/// Must be called before any other thread of the process is started.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
pub(crate) fn split() -> Option<u8> {
    use nix::sys::signal::{SigSet, SigmaskHow, Signal, sigprocmask};
    use nix::unistd::{ForkResult, fork, getpid, getppid};

    let mut waited = SigSet::empty();
    for signal in [
        Signal::SIGINT,
        Signal::SIGTERM,
        Signal::SIGHUP,
        Signal::SIGCHLD,
    ] {
        waited.add(signal);
    }
    let mut before = SigSet::empty();
    if let Err(err) = sigprocmask(SigmaskHow::SIG_BLOCK, Some(&waited), Some(&mut before)) {
        tracing::debug!(%err, "cannot block signals: running without a guard process");
        return None;
    }
    let guard = getpid();
    // SAFETY: called before any other thread of this process exists (no runtime yet), so
    // the child is a full copy of a single-threaded process and may run any code.
    match unsafe { fork() } {
        Ok(ForkResult::Child) => {
            // The worker: SIGTERM when the guard dies, even by SIGKILL; the guard's
            // signals unblocked again (pending ones are not inherited).
            let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGTERM);
            let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&before), None);
            if getppid() != guard {
                // The guard died before the parent-death signal was set: nothing was asked
                // of Redis yet, stop as SIGTERM would.
                std::process::exit(i32::from(exit::SIGNALLED) + Signal::SIGTERM as i32);
            }
            None
        }
        Ok(ForkResult::Parent { child }) => {
            if let Err(err) = nix::sys::prctl::set_child_subreaper(true) {
                tracing::debug!(%err, "the guard cannot become a child subreaper");
            }
            Some(watch(child, &waited))
        }
        Err(err) => {
            let _ = sigprocmask(SigmaskHow::SIG_SETMASK, Some(&before), None);
            tracing::debug!(%err, "cannot fork: running without a guard process");
            None
        }
    }
}

/// Elsewhere: one process, as before.
#[cfg(not(target_os = "linux"))]
pub(crate) fn split() -> Option<u8> {
    None
}

/// The guard's life: pass the signals sent to it on to `worker`, reap what ends, and once the
/// worker has ended kill whatever is left under the guard; the worker's exit code.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn watch(worker: nix::unistd::Pid, waited: &nix::sys::signal::SigSet) -> u8 {
    use nix::libc;
    use nix::sys::signal::{Signal, kill};

    loop {
        // SAFETY: `siginfo_t` is plain data, valid zeroed; `sigwaitinfo` fills it.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: both pointers are valid for the call.
        let number = unsafe { libc::sigwaitinfo(waited.as_ref(), &mut info) };
        let Ok(signal) = Signal::try_from(number) else {
            continue; // EINTR
        };
        if signal == Signal::SIGCHLD {
            if let Some(code) = reap(worker) {
                kill_what_is_left();
                return code;
            }
            continue;
        }
        // Sent by a process (`kill`): pass it on. From the terminal (Ctrl-C) the kernel sends
        // it to the whole foreground process group, the worker included: not twice.
        if info.si_code == libc::SI_USER || info.si_code == libc::SI_QUEUE {
            let _ = kill(worker, signal);
        }
    }
}

/// Reap every child that has ended; the worker's exit code once it has (128 + N if signal N
/// ended it).
#[cfg(target_os = "linux")]
fn reap(worker: nix::unistd::Pid) -> Option<u8> {
    use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
    let mut code = None;
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, status)) if pid == worker => {
                code = Some(u8::try_from(status & 0xff).unwrap_or(exit::FAILURE));
            }
            Ok(WaitStatus::Signaled(pid, signal, _)) if pid == worker => {
                code = Some(exit::SIGNALLED.saturating_add(signal as u8));
            }
            Ok(WaitStatus::StillAlive) | Err(_) => return code,
            Ok(_) => {}
        }
    }
}

/// SIGKILL every process still under the guard (the command's tree, orphaned by a worker that
/// was killed), again until none lives or 5 s have passed.
#[cfg(target_os = "linux")]
fn kill_what_is_left() {
    use nix::sys::signal::Signal;
    use nix::sys::wait::{WaitPidFlag, waitpid};
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while crate::tree::signal_all(Signal::SIGKILL, None) > 0 && std::time::Instant::now() < deadline
    {
        std::thread::sleep(std::time::Duration::from_millis(10));
        while let Ok(status) = waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            if status == nix::sys::wait::WaitStatus::StillAlive {
                break;
            }
        }
    }
}
