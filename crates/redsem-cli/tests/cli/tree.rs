//! `run` and the command's whole process tree: what the command starts (background jobs, a
//! daemon in a session of its own) is gone before the permit is given back and before the
//! lease can end.

use std::path::Path;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::support::{LIMIT, World, alive, pause_and_read_lease_end, unpause, wait_dead};

/// `cmd &` and its pid written to `pidfile`.
fn background(cmd: &str, pidfile: &Path) -> String {
    format!("{cmd} & echo $! > {}", pidfile.display())
}

/// A loop that ignores SIGTERM (only SIGKILL ends it).
const DEAF: &str = "sh -c \"trap '' TERM; while :; do sleep 0.05; done\"";

#[test]
fn sigterm_to_redsem_stops_the_commands_background_jobs_before_the_permit_goes_back() {
    let world = World::new();
    let (a, b, ready) = (
        world.path("a.pid"),
        world.path("b.pid"),
        world.path("ready"),
    );
    // The shape: a background sleep and a foreground one, then `wait`; plus a
    // background job that ignores SIGTERM, which only SIGKILL after the grace stops.
    let script = format!(
        "{}; {}; touch {}; sleep 22; wait",
        background("sleep 21", &a),
        background(DEAF, &b),
        ready.display()
    );
    let running = world.start(&[
        "run", "jobs", "--limit", "1", "--grace", "1s", "--", "sh", "-c", &script,
    ]);
    world.pid_in(&ready_marker(&ready));
    let (sleeper, deaf) = (world.pid_in(&a), world.pid_in(&b));
    running.signal(Signal::SIGTERM);
    // While the deaf job lives (its grace), the permit is still held.
    let mut seen_held_while_alive = 0;
    let deadline = std::time::Instant::now() + LIMIT;
    while alive(deaf) && std::time::Instant::now() < deadline {
        let held = world.holders("jobs").len();
        if alive(deaf) {
            assert_eq!(
                held, 1,
                "the permit went back while a job of the command still ran"
            );
            seen_held_while_alive += 1;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = running.wait();
    assert_eq!(out.code(), 143, "the shell died of SIGTERM: {out:?}");
    assert!(!alive(sleeper), "the background sleep outlived redsem");
    assert!(!alive(deaf), "the job ignoring SIGTERM outlived redsem");
    assert!(world.holders("jobs").is_empty(), "released at the end");
    assert!(
        seen_held_while_alive > 0,
        "the deaf job was never seen alive after SIGTERM"
    );
}

/// `pid_in` waits for a file holding a pid; the ready marker holds none, so give it one.
fn ready_marker(ready: &Path) -> std::path::PathBuf {
    let deadline = std::time::Instant::now() + LIMIT;
    while !ready.exists() {
        assert!(
            std::time::Instant::now() < deadline,
            "the script never got ready"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    std::fs::write(ready, format!("{}\n", std::process::id())).expect("write marker");
    ready.to_path_buf()
}

#[test]
fn a_command_that_daemonizes_does_not_leave_its_daemon_running_past_the_permit() {
    let world = World::new();
    let pidfile = world.path("daemon.pid");
    // The daemon goes to a session of its own (setsid), away from the command's process
    // group, and the command exits at once.
    let script = format!(
        "setsid sh -c 'echo $$ > {}; exec sleep 30' </dev/null >/dev/null 2>&1 & \
         while [ ! -s {} ]; do sleep 0.01; done; exit 0",
        pidfile.display(),
        pidfile.display()
    );
    let out = world.run(&[
        "run", "jobs", "--limit", "1", "--grace", "1s", "--", "sh", "-c", &script,
    ]);
    assert_eq!(out.code(), 0, "{out:?}");
    let daemon = world.pid_in(&pidfile);
    assert!(!alive(daemon), "the daemon outlived the command's permit");
    assert!(world.holders("jobs").is_empty());
}

#[test]
fn a_lost_lease_kills_the_commands_whole_tree_before_the_lease_can_end() {
    let world = World::new();
    let (pidfile, idfile) = (world.path("job.pid"), world.path("id"));
    let script = format!(
        "echo $REDSEM_ID > {}; {}; wait",
        idfile.display(),
        background(DEAF, &pidfile)
    );
    let running = world.start(&[
        "run", "jobs", "--limit", "1", "--lease", "900ms", "--grace", "200ms", "--", "sh", "-c",
        &script,
    ]);
    let job = world.pid_in(&pidfile);
    let id = std::fs::read_to_string(&idfile).expect("the permit id");
    let lease_end = pause_and_read_lease_end(&world, &id);
    wait_dead(job, LIMIT);
    let died = std::time::Instant::now();
    let out = running.wait();
    unpause(&world);
    out.expect(76);
    assert!(
        died < lease_end,
        "the command's background job died {:?} after the lease could have ended",
        died - lease_end
    );
}

#[test]
fn sigkill_of_redsem_stops_the_whole_tree_and_gives_the_permit_back_at_once() {
    let world = World::new();
    let (a, b) = (world.path("a.pid"), world.path("b.pid"));
    let script = format!(
        "{}; {}; wait",
        background("sleep 21", &a),
        background(DEAF, &b)
    );
    let running = world.start(&[
        "run", "jobs", "--limit", "1", "--lease", "20s", "--grace", "500ms", "--", "sh", "-c",
        &script,
    ]);
    let (sleeper, deaf) = (world.pid_in(&a), world.pid_in(&b));
    // The process the caller started, as `kill -9 $!` would.
    running.signal(Signal::SIGKILL);
    let killed = std::time::Instant::now();
    wait_dead(sleeper, LIMIT);
    wait_dead(deaf, LIMIT);
    redsem_test::eventually(LIMIT, "the permit to come back", || {
        world.holders("jobs").is_empty()
    });
    assert!(
        killed.elapsed() < Duration::from_secs(10),
        "the permit came back {:?} after SIGKILL: it was left to its 20 s lease",
        killed.elapsed()
    );
    drop(running);
}

#[test]
fn sigkill_of_the_worker_kills_the_orphaned_tree_at_once() {
    let world = World::new();
    let (pidfile, jobfile) = (world.path("sh.pid"), world.path("job.pid"));
    let script = format!(
        "echo $$ > {}; {}; wait",
        pidfile.display(),
        background(DEAF, &jobfile)
    );
    let running = world.start(&[
        "run", "jobs", "--limit", "1", "--lease", "20s", "--", "sh", "-c", &script,
    ]);
    let (shell, job) = (world.pid_in(&pidfile), world.pid_in(&jobfile));
    // The process that holds the permit dies without a word (the OOM killer, say).
    nix::sys::signal::kill(running.worker(), Signal::SIGKILL).expect("SIGKILL the worker");
    let took = wait_dead(job, Duration::from_secs(5));
    assert!(!alive(shell), "the command outlived its worker");
    let out = running.wait();
    assert_eq!(
        out.code(),
        137,
        "the guard reports the worker's SIGKILL: {out:?}"
    );
    println!("the orphaned job died {took:?} after its worker");
}
