//! The command's whole process tree: everything it started, also what outlived its parent or
//! put itself in a session of its own (a daemon), so that none of it runs on once the permit
//! is given back.
//!
//! On Linux `redsem` makes itself a child subreaper (`PR_SET_CHILD_SUBREAPER`, as init
//! systems and container inits do): a process of the tree whose parent exits is re-parented
//! to `redsem` rather than to init. The tree is then every living process whose chain of
//! parents leads to `redsem`, read from `/proc`; orphans that exit are reaped here. Elsewhere
//! there is no such tree: only the command itself is watched.

use std::time::Duration;

use nix::sys::signal::Signal;
use nix::unistd::Pid;

/// How often the tree is looked at while waiting for it to end.
const LOOK_EVERY: Duration = Duration::from_millis(20);

/// Have processes of the tree that lose their parent re-parented to this process, so that
/// they stay in the tree. Linux only; elsewhere nothing.
pub(crate) fn adopt_orphans() {
    #[cfg(target_os = "linux")]
    if let Err(err) = nix::sys::prctl::set_child_subreaper(true) {
        tracing::warn!(%err, "cannot become a child subreaper: processes the command leaves behind may outlive it");
    }
}

/// The living processes (zombies left out) that descend from this one.
pub(crate) fn living() -> Vec<Pid> {
    descendants().into_iter().map(|p| p.pid).collect()
}

/// Send `signal` to every living process of the tree but `skip` (the command itself, which
/// its `Child` signals); how many it went to.
pub(crate) fn signal_all(signal: Signal, skip: Option<u32>) -> usize {
    let mut living = living();
    living.retain(|pid| u32::try_from(pid.as_raw()).ok() != skip);
    for &pid in &living {
        if let Err(err) = nix::sys::signal::kill(pid, signal) {
            tracing::debug!(%pid, %err, "could not signal a process of the command's tree; it has exited");
        }
    }
    if !living.is_empty() {
        tracing::info!(
            processes = living.len(),
            signal = signal.as_str(),
            "signalled the command's tree"
        );
    }
    living.len()
}

/// Wait until no process of the tree lives, for at most `limit`; reaps the orphans re-parented
/// here meanwhile (never `skip`, the command itself, which its `tokio::process::Child` reaps).
/// Whether the tree is gone.
pub(crate) async fn ended_within(limit: Duration, skip: Option<u32>) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        reap_orphans(skip);
        let mut living = living();
        living.retain(|pid| u32::try_from(pid.as_raw()).ok() != skip);
        if living.is_empty() {
            return true;
        }
        let now = tokio::time::Instant::now();
        if now >= deadline {
            return false;
        }
        tokio::time::sleep(LOOK_EVERY.min(deadline - now)).await;
    }
}

/// SIGKILL the whole tree, again and again (a process may fork while it is being killed),
/// until none of it lives. SIGKILL cannot be ignored, so this ends unless a process is stuck
/// in the kernel (uninterruptible sleep): then it gives up after `limit`. Whether it is gone.
pub(crate) async fn kill_all(limit: Duration, skip: Option<u32>) -> bool {
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if signal_all(Signal::SIGKILL, skip) == 0 {
            reap_orphans(skip);
            return true;
        }
        if ended_within(LOOK_EVERY, skip).await {
            return true;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                left = living().len(),
                "processes of the command's tree survived SIGKILL"
            );
            return false;
        }
    }
}

/// One process read from `/proc`.
#[derive(Debug, Clone, Copy)]
struct Proc {
    pid: Pid,
    parent: Pid,
    zombie: bool,
}

/// Reap the direct children that have exited, except `skip`.
fn reap_orphans(skip: Option<u32>) {
    let me = nix::unistd::getpid();
    for proc in all_processes() {
        let own = u32::try_from(proc.pid.as_raw()).ok();
        if proc.parent == me && proc.zombie && own != skip {
            let _ = nix::sys::wait::waitpid(proc.pid, Some(nix::sys::wait::WaitPidFlag::WNOHANG));
        }
    }
}

/// The living descendants of this process.
fn descendants() -> Vec<Proc> {
    let all = all_processes();
    let mut found: Vec<Proc> = Vec::new();
    let mut parents = vec![nix::unistd::getpid()];
    while let Some(parent) = parents.pop() {
        for proc in all.iter().filter(|p| p.parent == parent) {
            if !found.iter().any(|f| f.pid == proc.pid) {
                found.push(*proc);
                parents.push(proc.pid);
            }
        }
    }
    found.retain(|p| !p.zombie);
    found
}

/// Every process of the system, as `/proc` lists it (none where there is no `/proc`).
fn all_processes() -> Vec<Proc> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|entry| {
        let entry = entry.ok()?;
        let pid: i32 = entry.file_name().to_str()?.parse().ok()?;
        let stat = std::fs::read_to_string(entry.path().join("stat")).ok()?;
        parse_stat(pid, &stat)
    })
    .collect()
}

/// A `/proc/PID/stat` line: `pid (comm) state ppid ...`, where comm may hold spaces and
/// parentheses, so the fields are read after its last `)`.
fn parse_stat(pid: i32, stat: &str) -> Option<Proc> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = fields.next()?;
    let parent: i32 = fields.next()?.parse().ok()?;
    Some(Proc {
        pid: Pid::from_raw(pid),
        parent: Pid::from_raw(parent),
        zombie: state == "Z" || state == "X",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_lines_are_read_after_the_last_parenthesis_of_the_name() {
        let proc = parse_stat(42, "42 (a (b) c) S 7 42 42 0 -1").expect("parsed");
        assert_eq!(
            (proc.pid.as_raw(), proc.parent.as_raw(), proc.zombie),
            (42, 7, false)
        );
        let zombie = parse_stat(5, "5 (sh) Z 1 5 5").expect("parsed");
        assert!(zombie.zombie);
        assert!(parse_stat(1, "garbage").is_none());
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn a_spawned_process_and_its_child_are_in_the_tree() {
        let mut child = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & wait"])
            .spawn()
            .expect("spawn sh");
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while living().len() < 2 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        let tree = living();
        let _ = child.kill();
        let _ = child.wait();
        for pid in tree.iter().filter(|p| p.as_raw() != child.id() as i32) {
            let _ = nix::sys::signal::kill(*pid, Signal::SIGKILL);
        }
        assert!(tree.len() >= 2, "sh and its sleep: {tree:?}");
    }
}
