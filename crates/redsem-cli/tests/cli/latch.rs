use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use crate::support::World;

#[test]
fn set_sets_the_count_once_and_exits_1_naming_the_count_when_it_is_already_counting() {
    let world = World::new();
    let out = world.run(&["latch", "ready", "set", "3"]).success();
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");
    assert_eq!(world.latch_count("ready"), 3);

    let out = world.run(&["latch", "ready", "set", "5"]).expect(1);
    assert!(
        out.error()
            .contains("latch \"ready\" is already counting (3 to go)"),
        "{out:?}"
    );
    assert!(out.stdout.is_empty(), "{out:?}");
    assert_eq!(world.latch_count("ready"), 3, "left as it was");
}

#[test]
fn count_down_takes_one_and_at_zero_the_latch_opens_and_may_be_set_again() {
    let world = World::new();
    world.run(&["latch", "ready", "set", "2"]).success();
    world.run(&["latch", "ready", "count-down"]).success();
    assert_eq!(world.latch_count("ready"), 1);
    world.run(&["latch", "ready", "count-down"]).success();
    assert_eq!(world.latch_count("ready"), 0);

    let out = world.run(&["latch", "ready", "count-down"]).success();
    assert!(
        out.stderr.is_empty(),
        "counting down an open latch does nothing: {out:?}"
    );
    assert_eq!(world.latch_count("ready"), 0);
    world.run(&["latch", "ready", "set", "4"]).success();
    assert_eq!(world.latch_count("ready"), 4);
}

#[test]
fn count_prints_0_for_a_latch_never_set_and_count_down_leaves_it_unset() {
    let world = World::new();
    let out = world.run(&["latch", "nothing", "count"]).success();
    assert_eq!(out.stdout, "0\n");
    world.run(&["latch", "nothing", "count-down"]).success();
    assert_eq!(world.latch_count("nothing"), 0);
    world.run(&["latch", "nothing", "set", "1"]).success();
}

#[test]
fn await_returns_at_once_when_the_latch_was_never_set_or_has_opened() {
    let world = World::new();
    let out = world.run(&["latch", "nothing", "await"]).success();
    assert!(out.stdout.is_empty() && out.stderr.is_empty(), "{out:?}");

    world.run(&["latch", "ready", "set", "1"]).success();
    world.run(&["latch", "ready", "count-down"]).success();
    world
        .run(&["latch", "ready", "await", "--timeout", "5s"])
        .success();
}

#[test]
fn awaiting_processes_return_when_other_processes_count_the_latch_down_to_zero() {
    let world = World::new();
    world.run(&["latch", "ready", "set", "3"]).success();
    // (--quiet: a wait over 300 ms, as on a loaded machine, would print its waiting line.)
    let mut forever = world.start(&["latch", "ready", "await", "--quiet"]);
    let mut bounded = world.start(&["latch", "ready", "await", "--timeout", "30s", "--quiet"]);
    world.wait_for_latch_listeners("ready", 2);

    world.run(&["latch", "ready", "count-down"]).success();
    world.run(&["latch", "ready", "count-down"]).success();
    assert!(
        !forever.has_exited() && !bounded.has_exited(),
        "they wait while the count is 1"
    );
    world.run(&["latch", "ready", "count-down"]).success();
    let opened = Instant::now();
    // Woken by the opening message, not by the once-a-second re-check.
    for waiter in [forever, bounded] {
        let out = waiter.wait_within(Duration::from_millis(500)).success();
        assert!(out.stderr.is_empty(), "{out:?}");
    }
    assert!(opened.elapsed() < Duration::from_millis(500));
}

#[test]
fn await_exits_75_when_the_timeout_runs_out_honoured_within_200ms() {
    let world = World::new();
    world.run(&["latch", "ready", "set", "2"]).success();
    let out = world
        .run(&["latch", "ready", "await", "--timeout", "500ms"])
        .expect(75);
    assert!(
        out.elapsed >= Duration::from_millis(500) && out.elapsed <= Duration::from_millis(700),
        "--timeout 500ms took {:?}",
        out.elapsed
    );
    assert!(
        out.error().contains("latch \"ready\" still counting at 2"),
        "{out:?}"
    );
    assert!(out.error().contains("timed out"), "{out:?}");
    assert!(out.stdout.is_empty(), "{out:?}");
    assert_eq!(world.latch_count("ready"), 2, "awaiting changes nothing");
}

#[test]
fn a_signal_while_awaiting_exits_128_plus_its_number() {
    let world = World::new();
    world.run(&["latch", "ready", "set", "1"]).success();
    let waiter = world.start(&["latch", "ready", "await"]);
    world.wait_for_latch_listeners("ready", 1);
    waiter.signal(Signal::SIGTERM);
    let out = waiter.wait().expect(143);
    assert!(
        out.error()
            .contains("interrupted by SIGTERM while waiting for latch \"ready\""),
        "{out:?}"
    );
    assert_eq!(world.latch_count("ready"), 1);
}

#[test]
fn latches_are_kept_apart_by_the_prefix() {
    let world = World::new();
    world
        .run(&["--prefix", "one", "latch", "ready", "set", "1"])
        .success();
    world
        .run(&["--prefix", "two", "latch", "ready", "set", "2"])
        .success();
    let out = world
        .run(&["--prefix", "two", "latch", "ready", "count"])
        .success();
    assert_eq!(out.stdout, "2\n");
    assert_eq!(
        world.latch_count("ready"),
        0,
        "nothing under the default prefix"
    );
}

#[test]
fn a_spinner_shows_the_wait_for_a_latch_or_permits_on_a_terminal() {
    let world = World::new();
    world.run(&["latch", "ready", "set", "1"]).success();
    world.run(&["permits", "gpu", "try-set", "0"]).success();
    let url = world.server.url();
    for (args, shown) in [
        (
            "latch ready await --timeout 600ms",
            "waiting for latch \"ready\"",
        ),
        (
            "permits gpu acquire 2 --wait 600ms",
            "waiting for 2 permits of \"gpu\"",
        ),
    ] {
        // `script` gives redsem a terminal for stderr and copies what it writes to stdout.
        let line = format!("{} --url {url} {args}", crate::support::REDSEM);
        let mut cmd = std::process::Command::new("script");
        cmd.args(["-qec", &line, "/dev/null"])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let out = crate::support::Running::start(cmd).wait();
        assert_eq!(out.code(), 75, "{out:?}");
        assert!(out.stdout.contains(shown), "{args}: {out:?}");
        assert!(out.stdout.contains("timed out"), "{args}: {out:?}");
    }
}

#[test]
fn await_exits_74_when_redis_loses_the_latch_while_it_waits() {
    let world = World::new();
    world.run(&["latch", "ready", "set", "2"]).success();
    let waiting = world.start(&["latch", "ready", "await", "--timeout", "30s"]);
    world.wait_for_latch_listeners("ready", 1);
    let () = redsem::redis::cmd("FLUSHALL")
        .query(&mut world.server.connection())
        .expect("FLUSHALL");
    let out = waiting.wait().expect(74);
    assert!(
        out.error().contains("lost the state of \"ready\""),
        "{out:?}"
    );
}
