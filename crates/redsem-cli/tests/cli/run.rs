use std::fs::File;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use redsem_test::eventually;

use crate::support::{LIMIT, Running, World, alive, pause_and_read_lease_end, unpause, wait_dead};

/// A `sh -c` script that first writes the shell's pid to `pidfile`, then runs `rest`.
fn with_pidfile(pidfile: &std::path::Path, rest: &str) -> String {
    format!("echo $$ > {}; {rest}", pidfile.display())
}

#[test]
fn the_command_sees_its_permit_in_its_environment_and_it_is_released_after() {
    let world = World::new();
    let show = r#"echo "$REDSEM_ID $REDSEM_TOKEN $REDSEM_SLOT""#;
    let mut last_token = 0;
    for _ in 0..3 {
        let out = world
            .run(&["run", "jobs", "--limit", "3", "--", "sh", "-c", show])
            .success();
        let fields: Vec<&str> = out.stdout.split_whitespace().collect();
        let [id, token, slot] = fields[..] else {
            panic!("three values: {out:?}");
        };
        assert_eq!(id.len(), 32, "{id}");
        assert!(id.chars().all(|c| c.is_ascii_hexdigit()), "{id}");
        let token: u64 = token.parse().expect("REDSEM_TOKEN is a number");
        assert!(
            token > last_token,
            "tokens increase: {token} after {last_token}"
        );
        last_token = token;
        let slot: u32 = slot.parse().expect("REDSEM_SLOT is a number");
        assert!(slot < 3, "slot {slot}");
        assert!(
            world.holders("jobs").is_empty(),
            "released after the command"
        );
    }
}

#[test]
fn the_commands_exit_code_is_passed_through_and_a_signal_adds_128() {
    let world = World::new();
    let out = world.run(&["run", "jobs", "--limit", "1", "--", "sh", "-c", "exit 7"]);
    assert_eq!(out.code(), 7, "{out:?}");
    assert!(
        out.stderr.is_empty(),
        "the command's failure is its own to report: {out:?}"
    );
    let out = world.run(&[
        "run",
        "jobs",
        "--limit",
        "1",
        "--",
        "sh",
        "-c",
        "kill -TERM $$",
    ]);
    assert_eq!(out.code(), 143, "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    assert!(world.holders("jobs").is_empty());
}

#[test]
fn the_command_inherits_stdin_stdout_and_stderr() {
    let world = World::new();
    let input = world.path("input");
    std::fs::write(&input, "hello from stdin\n").expect("write input");
    let mut cmd = world.redsem(&[
        "run",
        "jobs",
        "--limit",
        "1",
        "--",
        "sh",
        "-c",
        "cat; echo to-stderr >&2",
    ]);
    cmd.stdin(File::open(&input).expect("open input"));
    let out = Running::start(cmd).wait().success();
    assert_eq!(out.stdout, "hello from stdin\n");
    assert_eq!(out.stderr, "to-stderr\n");
}

#[test]
fn a_command_that_cannot_be_run_fails_at_once_without_waiting_for_a_permit() {
    let world = World::new();
    // Held, so a `run` that looked for its command only once granted would wait 30 s.
    world.acquire("jobs", 1, &["--lease", "30s"]);
    let script = world.path("script.sh");
    std::fs::write(&script, "#!/bin/sh\necho ran\n").expect("write the script");
    let script = script.to_string_lossy().into_owned();
    let dir = world.server.dir().to_string_lossy().into_owned();
    let cases: &[(&[&str], i32, &str)] = &[
        (
            &["--", "./no-such-command"],
            127,
            "./no-such-command: no such file",
        ),
        (
            &["--", "no-such-command-anywhere"],
            127,
            "not found in PATH",
        ),
        (&["--", &script], 126, "not executable"),
        (&["--", &dir], 126, "directory"),
    ];
    for (command, code, mention) in cases {
        let args = [&["run", "jobs", "--limit", "1"][..], command].concat();
        let out = world.run(&args).expect(*code);
        assert!(out.error().contains(mention), "{args:?}: {out:?}");
        assert!(
            out.elapsed < Duration::from_secs(5),
            "{args:?} waited: {out:?}"
        );
    }
    assert_eq!(
        world.status("jobs")["waiters"],
        serde_json::json!([]),
        "nothing queued"
    );
    assert_eq!(world.holders("jobs").len(), 1);
}

#[test]
fn sigterm_and_sigint_are_forwarded_and_the_permit_released_after_the_command_exits() {
    let world = World::new();
    // SIGTERM: `sleep` dies of it, and redsem reports 128 + 15.
    let pidfile = world.path("term.pid");
    let running = world.start(&[
        "run",
        "jobs",
        "--limit",
        "1",
        "--",
        "sh",
        "-c",
        &with_pidfile(&pidfile, "exec sleep 30"),
    ]);
    let child = world.pid_in(&pidfile);
    running.signal(Signal::SIGTERM);
    let out = running.wait();
    assert_eq!(out.code(), 143, "{out:?}");
    assert!(!alive(child));
    assert!(world.holders("jobs").is_empty());

    // SIGINT: the command traps it and exits 42, which redsem passes on.
    let pidfile = world.path("int.pid");
    // The trap is set before the pid is written, so the signal cannot come before it.
    let trap = format!(
        "trap 'kill $!; exit 42' INT; echo $$ > {}; sleep 30 >/dev/null 2>&1 & wait",
        pidfile.display()
    );
    let running = world.start(&["run", "jobs", "--limit", "1", "--", "sh", "-c", &trap]);
    world.pid_in(&pidfile);
    running.signal(Signal::SIGINT);
    let out = running.wait();
    assert_eq!(out.code(), 42, "{out:?}");
    assert!(world.holders("jobs").is_empty());
}

#[test]
fn a_signal_while_waiting_withdraws_the_request_and_never_starts_the_command() {
    let world = World::new();
    world.acquire("jobs", 1, &["--lease", "10s"]);
    let marker = world.path("started");
    let touch = format!("touch {}", marker.display());
    let running = world.start(&["run", "jobs", "--limit", "1", "--", "sh", "-c", &touch]);
    world.wait_for_waiters("jobs", 1);
    running.signal(Signal::SIGINT);
    let out = running.wait().expect(130);
    assert!(out.error().contains("interrupted"), "{out:?}");
    assert!(!marker.exists());
    assert_eq!(
        world.status("jobs")["waiters"],
        serde_json::json!([]),
        "the request was withdrawn"
    );
}

#[test]
fn sigkill_of_redsem_kills_the_command_and_the_permit_comes_back_within_the_lease() {
    let world = World::new();
    let lease = Duration::from_millis(800);
    let pidfile = world.path("child.pid");
    let running = world.start(&[
        "run",
        "jobs",
        "--limit",
        "1",
        "--lease",
        "800ms",
        "--",
        "sh",
        "-c",
        &with_pidfile(&pidfile, "exec sleep 30"),
    ]);
    let child = world.pid_in(&pidfile);
    running.signal(Signal::SIGKILL);
    let killed = Instant::now();
    wait_dead(child, Duration::from_secs(2));
    eventually(LIMIT, "the permit to come back", || {
        world
            .run(&[
                "acquire",
                "jobs",
                "--limit",
                "1",
                "--no-wait",
                "--lease",
                "5s",
            ])
            .status
            .success()
    });
    assert!(
        killed.elapsed() < lease + Duration::from_millis(300),
        "the permit came back {:?} after redsem died (lease {lease:?})",
        killed.elapsed()
    );
    drop(running);
}

#[test]
fn a_command_running_many_lease_periods_is_never_killed_early() {
    let world = World::new();
    let out = world
        .run(&[
            "run", "jobs", "--limit", "1", "--lease", "300ms", "--", "sleep", "2",
        ])
        .success();
    assert!(out.elapsed >= Duration::from_secs(2), "{out:?}");
    assert!(out.stderr.is_empty(), "{out:?}");
    assert!(world.holders("jobs").is_empty());
}

#[test]
fn a_redsem_stopped_longer_than_the_lease_kills_its_command_when_resumed_and_exits_76() {
    let world = World::new();
    let pidfile = world.path("child.pid");
    let running = world.start(&[
        "run",
        "jobs",
        "--limit",
        "1",
        "--lease",
        "300ms",
        "--",
        "sh",
        "-c",
        &with_pidfile(&pidfile, "exec sleep 30"),
    ]);
    let child = world.pid_in(&pidfile);
    // The worker renews the lease (the process started is its guard).
    let worker = running.worker();
    nix::sys::signal::kill(worker, Signal::SIGSTOP).expect("SIGSTOP");
    let stopped = Instant::now();
    // While redsem is stopped the lease ends and another holder may take the permit: this
    // is what the fencing token is for.
    eventually(LIMIT, "the lease to end on the server", || {
        world.holders("jobs").is_empty()
    });
    let lease_gone = stopped.elapsed();
    std::thread::sleep(Duration::from_millis(800).saturating_sub(lease_gone));
    assert!(alive(child), "the command runs on while redsem is stopped");
    nix::sys::signal::kill(worker, Signal::SIGCONT).expect("SIGCONT");
    let resumed = Instant::now();
    let stop_took = wait_dead(child, Duration::from_secs(2));
    let out = running.wait().expect(76);
    assert!(out.error().contains("lost the lease"), "{out:?}");
    // The lease may already be someone else's: no grace.
    assert!(out.error().contains("SIGKILL at once"), "{out:?}");
    println!(
        "SIGSTOP test: the command was terminated {:?} after SIGCONT (redsem stopped {:?}, \
         lease 300ms seen gone on the server {lease_gone:?} after SIGSTOP); \
         redsem exited 76 {:?} after SIGCONT",
        stop_took,
        resumed - stopped,
        resumed.elapsed()
    );
}

#[test]
fn a_command_ignoring_sigterm_is_killed_after_the_grace() {
    let mut world = World::new();
    let pidfile = world.path("child.pid");
    let running = world.start(&[
        "run",
        "jobs",
        "--limit",
        "1",
        "--lease",
        "300ms",
        "--grace",
        "100ms",
        "--",
        "sh",
        "-c",
        // The trap is set before the pid is written.
        &format!(
            "trap '' TERM; echo $$ > {}; while :; do sleep 0.05; done",
            pidfile.display()
        ),
    ]);
    let child = world.pid_in(&pidfile);
    world.server.stop();
    let out = running.wait().expect(76);
    // Why the lease is given up: the renewals failed (the server is gone), or, on a machine
    // slow enough that a renewal came after the 300 ms lease ended but before the server
    // stopped, the server no longer had it. Either way the command gets SIGTERM, then SIGKILL.
    assert!(
        out.error().contains("renewals failed") || out.error().contains("lost the lease"),
        "{out:?}"
    );
    assert!(out.error().contains("SIGKILL"), "{out:?}");
    assert!(out.error().contains("after SIGTERM"), "{out:?}");
    assert!(!alive(child));
}

#[test]
fn a_grace_longer_than_a_third_of_the_lease_is_refused_before_anything_runs() {
    let world = World::new();
    let marker = world.path("started");
    let touch = format!("touch {}", marker.display());
    let out = world
        .run(&[
            "run", "jobs", "--limit", "1", "--lease", "3s", "--grace", "1100ms", "--", "sh", "-c",
            &touch,
        ])
        .expect(125);
    assert!(out.error().contains("--grace 1.1s"), "{out:?}");
    assert!(out.error().contains("a third of --lease 3.0s"), "{out:?}");
    assert!(!marker.exists());
    assert!(world.holders("jobs").is_empty());
    // Without --grace, a short lease gets a third of it.
    world
        .run(&[
            "run", "jobs", "--limit", "1", "--lease", "300ms", "--", "true",
        ])
        .success();
}

#[test]
fn run_waits_in_line_and_starts_the_command_when_a_permit_is_released() {
    let world = World::new();
    let holder = world.acquire("jobs", 1, &["--lease", "10s"]);
    let running = world.start(&["run", "jobs", "--limit", "1", "--", "echo", "my turn"]);
    world.wait_for_waiters("jobs", 1);
    let mut running = running;
    assert!(!running.has_exited(), "it waits while the permit is held");
    world.run(&["release", "jobs", &holder]).success();
    let out = running.wait().success();
    assert_eq!(out.stdout, "my turn\n");
    assert_eq!(
        out.stderr, "redsem: waiting for \"jobs\": next in line\n",
        "off a terminal, one line when the wait starts and no spinner"
    );
}

#[test]
fn quiet_keeps_the_waiting_line_off_stderr_and_verbose_tells_the_time_waited() {
    let world = World::new();
    world.acquire("jobs", 1, &["--lease", "700ms"]);
    let out = world
        .run(&["run", "jobs", "-l", "1", "--quiet", "--", "true"])
        .success();
    assert!(out.stderr.is_empty(), "{out:?}");
    world.acquire("jobs", 1, &["--lease", "700ms"]);
    let out = world
        .run(&["-v", "run", "jobs", "-l", "1", "--", "true"])
        .success();
    let line = out
        .stderr
        .lines()
        .find(|l| l.contains("permit acquired"))
        .unwrap_or_else(|| panic!("no acquired line: {out:?}"));
    assert!(line.contains("waited="), "{line}");
    assert!(
        out.stderr.contains("redsem: waiting for \"jobs\""),
        "{out:?}"
    );
}

#[test]
fn a_spinner_shows_the_wait_on_a_terminal_unless_quiet() {
    let world = World::new();
    // Held for 800ms each time, so each `run` waits (and spins) a while.
    world.acquire("jobs", 1, &["--lease", "800ms"]);
    let url = world.server.url();
    let on_terminal = |quiet: &str| {
        // `script` gives redsem a terminal for stderr and copies what it writes to stdout.
        let line = format!(
            "{} --url {url} {quiet} run jobs --limit 1 --lease 2s -- echo granted",
            crate::support::REDSEM
        );
        let mut cmd = std::process::Command::new("script");
        cmd.args(["-qec", &line, "/dev/null"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        Running::start(cmd).wait().success().stdout
    };
    let shown = on_terminal("");
    assert!(shown.contains("waiting for \"jobs\""), "{shown:?}");
    assert!(shown.contains("granted"), "{shown:?}");
    world.acquire("jobs", 1, &["--lease", "800ms"]);
    let quiet = on_terminal("--quiet");
    assert!(!quiet.contains("waiting for"), "{quiet:?}");
    assert!(quiet.contains("granted"), "{quiet:?}");
}

/// Renewals made impossible (`CLIENT PAUSE WRITE` blocks every script; reads still answer):
/// a command that ignores SIGTERM is dead by SIGKILL before its lease can have ended on the
/// server, measured against the lease end Redis itself holds for the permit.
#[test]
fn a_command_ignoring_sigterm_is_dead_before_the_lease_can_end_when_renewals_stop() {
    let world = World::new();
    let pidfile = world.path("child.pid");
    let idfile = world.path("child.id");
    let running = world.start(&[
        "run",
        "jobs",
        "--limit",
        "1",
        "--lease",
        "900ms",
        "--grace",
        "200ms",
        "--",
        "sh",
        "-c",
        &format!(
            "trap '' TERM; echo $REDSEM_ID > {}; echo $$ > {}; while :; do sleep 0.02; done",
            idfile.display(),
            pidfile.display()
        ),
    ]);
    let child = world.pid_in(&pidfile);
    let id = std::fs::read_to_string(&idfile).expect("the permit id");
    // No script runs from here on, so the lease end Redis holds can no longer move.
    let asked = Instant::now();
    let lease_end = pause_and_read_lease_end(&world, &id);
    let left = lease_end.saturating_duration_since(asked);
    wait_dead(child, LIMIT);
    let died = Instant::now();
    let out = running.wait();
    unpause(&world);
    let out = out.expect(76);
    assert!(out.error().contains("SIGKILL"), "{out:?}");
    assert!(
        died < lease_end,
        "the command died {:?} after the lease could have ended on the server \
         ({left:?} of it were left when renewals stopped)",
        died - lease_end
    );
    println!(
        "pause test: the command died {:?} before the lease's end on the server",
        lease_end - died
    );
}
