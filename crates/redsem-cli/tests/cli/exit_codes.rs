use std::time::{Duration, Instant};

use redsem::redis;

use crate::support::{World, bare, closed_port};

#[test]
fn exit_0_when_a_permit_is_acquired_refreshed_and_released() {
    let world = World::new();
    let id = world.acquire("jobs", 2, &["--lease", "5s"]);
    world
        .run(&["refresh", "jobs", &id, "--lease", "10s"])
        .success();
    world.run(&["release", "jobs", &id]).success();
    assert!(world.holders("jobs").is_empty());
}

#[test]
fn exit_1_naming_both_limits_when_the_limit_differs_from_the_one_in_force() {
    let world = World::new();
    world.acquire("jobs", 2, &[]);
    // `run` and `lock` exit 125 instead of 1, which is the command's to use.
    for (args, code) in [
        (&["acquire", "jobs", "--limit", "3"][..], 1),
        (&["run", "jobs", "--limit", "3", "--", "true"][..], 125),
        (&["lock", "jobs", "--", "true"][..], 125),
    ] {
        let out = world.run(args).expect(code);
        let limit = if args[0] == "lock" { "1" } else { "3" };
        assert!(out.error().contains(&format!("--limit {limit}")), "{out:?}");
        assert!(out.error().contains("limit 2 in force"), "{out:?}");
    }
}

#[test]
fn exit_1_when_one_per_holder_finds_the_holder_already_in() {
    let world = World::new();
    let flags = ["--limit", "3", "--holder", "10.0.0.7", "--one-per-holder"];
    let first = world
        .run(&[&["acquire", "jobs"][..], &flags[..]].concat())
        .success();
    assert!(!first.stdout.trim().is_empty());
    let out = world
        .run(&[&["run", "jobs"][..], &flags[..], &["--", "true"][..]].concat())
        .expect(125);
    out.assert_one_error_line();
    assert!(
        out.error().contains("already held by \"10.0.0.7\""),
        "{out:?}"
    );
    // Another holder still gets in.
    world
        .run(&[
            "run",
            "jobs",
            "--limit",
            "3",
            "--holder",
            "10.0.0.8",
            "--one-per-holder",
            "--",
            "true",
        ])
        .success();
}

#[test]
fn exit_1_and_not_held_for_a_permit_that_is_gone() {
    let world = World::new();
    let unknown = "0123456789abcdef0123456789abcdef";
    for args in [
        &["refresh", "jobs", unknown][..],
        &["release", "jobs", unknown][..],
    ] {
        let out = world.run(args).expect(1);
        assert!(out.error().contains("not held"), "{out:?}");
    }

    let released = world.acquire("jobs", 1, &[]);
    world.run(&["release", "jobs", &released]).success();
    // Released again (another call: each run of redsem is a client session of its own, and
    // only a resend of the same call answers as it did), and refreshed: the permit is gone.
    for again in ["release", "refresh"] {
        let out = world.run(&[again, "jobs", &released]).expect(1);
        assert!(out.error().contains("not held"), "{again}: {out:?}");
    }

    let expired = world.acquire("jobs", 1, &["--lease", "100ms"]);
    std::thread::sleep(Duration::from_millis(250));
    let out = world.run(&["refresh", "jobs", &expired]).expect(1);
    assert!(out.error().contains("not held"), "{out:?}");
}

#[test]
fn exit_1_when_a_key_of_a_latch_or_permits_holds_a_foreign_value() {
    let world = World::new();
    let mut conn = world.server.connection();
    for key in ["redsem:{latch:ready}:count", "redsem:{permits:gpu}:count"] {
        let () = redis::cmd("RPUSH")
            .arg(key)
            .arg("not redsem's")
            .query(&mut conn)
            .expect("RPUSH");
    }
    let cases: &[&[&str]] = &[
        &["latch", "ready", "set", "3"],
        &["latch", "ready", "count-down"],
        &["latch", "ready", "await", "--timeout", "1s"],
        &["latch", "ready", "count"],
        &["permits", "gpu", "add", "-1"],
        &["permits", "gpu", "try-set", "2"],
        &["permits", "gpu", "acquire", "--wait", "1s"],
        &["permits", "gpu", "release"],
        &["permits", "gpu", "available"],
    ];
    for args in cases {
        let out = world.run(args).expect(1);
        assert!(out.error().contains("left untouched"), "{args:?}: {out:?}");
    }
}

#[test]
fn exit_2_on_one_line_for_bad_flags_and_values() {
    let world = World::new();
    let cases: &[(&[&str], &str)] = &[
        (&["acquire", "jobs", "--limit", "0"], "at least 1"),
        (&["acquire", "jobs", "--limit", "-1"], "at least 1"),
        (&["acquire", "jobs", "--limit=-5"], "at least 1"),
        (&["acquire", "jobs", "--limit", "two"], "not a whole number"),
        (&["acquire", "jobs", "--limit", "1.5"], "not a whole number"),
        (&["acquire", "jobs", "--limit", "99999999999"], "at most"),
        (
            &["acquire", "jobs", "--limit", "1", "--lease", "0s"],
            "lease",
        ),
        (
            &["acquire", "jobs", "--limit", "1", "--lease", "0"],
            "lease",
        ),
        (
            &["acquire", "jobs", "--limit", "1", "--lease", "5x"],
            "unit",
        ),
        (&["acquire", "jobs", "--limit", "1", "--lease", "-5"], "-5"),
        (
            &["acquire", "jobs", "--limit", "1", "--wait", "soon"],
            "wait",
        ),
        (&["acquire", "", "--limit", "1"], "name must not be empty"),
        (&["acquire", "jobs"], "--limit"),
        (
            &[
                "acquire",
                "jobs",
                "--limit",
                "1",
                "--wait",
                "1s",
                "--no-wait",
            ],
            "--no-wait",
        ),
        (
            &["acquire", "jobs", "--limit", "1", "--holder", ""],
            "label",
        ),
        (&["acquire", "jobs", "--limit", "1", "--bogus"], "--bogus"),
        (
            &["acquire", "jobs", "-l", "1", "-w", "1", "-n"],
            "--no-wait",
        ),
        (&["refresh", "jobs", "id", "--lease", "0s"], "lease"),
        (&["refresh", "jobs"], "ID"),
        (&["release", "", "id"], "name must not be empty"),
        (&["status", ""], "name must not be empty"),
        (&["--prefix", "", "status"], "prefix"),
        (&["completions", "cmd.exe"], "cmd.exe"),
        (&["latch", "", "count"], "name must not be empty"),
        (&["latch", "ready"], "subcommand"),
        (&["latch", "ready", "open"], "open"),
        (&["latch", "ready", "set"], "COUNT"),
        (&["latch", "ready", "set", "0"], "at least 1"),
        (&["latch", "ready", "set", "-3"], "at least 1"),
        (&["latch", "ready", "set", "three"], "not a whole number"),
        (&["latch", "ready", "set", "9007199254740992"], "at most"),
        (&["latch", "ready", "await", "--timeout", "5x"], "unit"),
        (
            &["latch", "ready", "await", "--wait", "1", "--no-wait"],
            "--no-wait",
        ),
        (&["latch", "ready", "count-down", "2"], "2"),
        (&["permits", "", "available"], "name must not be empty"),
        (&["permits", "gpu"], "subcommand"),
        (&["permits", "gpu", "add"], "<N>"),
        (&["permits", "gpu", "add", "0"], "must not be 0"),
        (&["permits", "gpu", "add", "1.5"], "not a whole number"),
        (&["permits", "gpu", "add", "9007199254740992"], "within"),
        (&["permits", "gpu", "try-set", "-1"], "negative"),
        (&["permits", "gpu", "try-set", "lots"], "not a whole number"),
        (&["permits", "gpu", "acquire", "0"], "at least 1"),
        (&["permits", "gpu", "acquire", "-2"], "at least 1"),
        (&["permits", "gpu", "acquire", "two"], "not a whole number"),
        (&["permits", "gpu", "acquire", "4294967296"], "at most"),
        (&["permits", "gpu", "acquire", "--wait", "soon"], "wait"),
        (
            &["permits", "gpu", "acquire", "--wait", "1s", "--no-wait"],
            "--no-wait",
        ),
        (&["permits", "gpu", "release", "0"], "at least 1"),
        (&["permits", "gpu", "release", "-1"], "at least 1"),
        (&["permits", "gpu", "available", "3"], "3"),
        (&["frobnicate"], "frobnicate"),
    ];
    for (args, mention) in cases {
        let out = world.run(args);
        assert_eq!(out.code(), 2, "{args:?}: {out:?}");
        out.assert_one_error_line();
        assert!(
            out.error().contains(mention),
            "{args:?} should mention {mention:?}: {out:?}"
        );
        assert!(out.stdout.is_empty(), "{args:?}: {out:?}");
    }
    let keys: u64 = redis::cmd("DBSIZE")
        .query(&mut world.server.connection())
        .expect("DBSIZE");
    assert_eq!(keys, 0, "a usage error writes nothing");
}

#[test]
fn run_and_lock_exit_125_on_one_line_for_bad_flags_and_values_before_touching_redis() {
    let world = World::new();
    let cases: &[(&[&str], &str)] = &[
        // A typo is refused, not taken for the command, wherever it stands before `--`.
        (
            &["run", "jobs", "--limit", "1", "--bogus", "--", "true"],
            "--bogus",
        ),
        (
            &["run", "jobs", "--bogus", "--limit", "1", "--", "true"],
            "--bogus",
        ),
        (&["lock", "jobs", "--wiat", "5", "--", "true"], "--wiat"),
        (&["run", "jobs", "--limit", "1"], "CMD"),
        (&["lock", "jobs"], "CMD"),
        (
            &["run", "jobs", "-l", "1", "-c", "true", "--", "true"],
            "--command",
        ),
        (
            &["run", "", "--limit", "1", "--", "true"],
            "name must not be empty",
        ),
        (&["run", "jobs", "--limit", "0", "--", "true"], "at least 1"),
        (
            &["run", "jobs", "--limit", "1", "--grace", "x", "--", "true"],
            "grace",
        ),
        (
            &["lock", "jobs", "--no-wait", "--wait", "1", "--", "true"],
            "--no-wait",
        ),
        (
            &["--prefix", "", "run", "jobs", "-l", "1", "--", "true"],
            "prefix",
        ),
        (
            &["-v", "lock", "jobs", "--lease", "1ms", "--", "true"],
            "lease",
        ),
    ];
    for (args, mention) in cases {
        let out = world.run(args);
        assert_eq!(out.code(), 125, "{args:?}: {out:?}");
        out.assert_one_error_line();
        assert!(
            out.error().contains(mention),
            "{args:?} should mention {mention:?}: {out:?}"
        );
    }
    let keys: u64 = redis::cmd("DBSIZE")
        .query(&mut world.server.connection())
        .expect("DBSIZE");
    assert_eq!(keys, 0, "a usage error writes nothing");
    // The command's own 1 and 2 stay its own.
    for code in ["1", "2"] {
        let out = world.run(&[
            "run",
            "jobs",
            "-l",
            "1",
            "--",
            "sh",
            "-c",
            &format!("exit {code}"),
        ]);
        assert_eq!(out.code().to_string(), code, "{out:?}");
        assert!(out.stderr.is_empty(), "{out:?}");
    }
}

#[test]
fn exit_69_when_redis_is_unreachable() {
    let world = World::new();
    let url = format!("redis://127.0.0.1:{}", closed_port());
    let marker = world.path("started");
    let touch = format!("touch {}", marker.display());
    let cases: &[&[&str]] = &[
        &["acquire", "jobs", "--limit", "1"],
        &["run", "jobs", "--limit", "1", "--", "sh", "-c", &touch],
        &["lock", "jobs", "-c", &touch],
        &["refresh", "jobs", "0123"],
        &["release", "jobs", "0123"],
        &["status", "jobs"],
        &["status"],
        &["latch", "ready", "set", "3"],
        &["latch", "ready", "count-down"],
        &["latch", "ready", "await"],
        &["latch", "ready", "count"],
        &["permits", "gpu", "add", "-1"],
        &["permits", "gpu", "try-set", "2"],
        &["permits", "gpu", "acquire"],
        &["permits", "gpu", "release"],
        &["permits", "gpu", "available"],
    ];
    for args in cases {
        let mut all = vec!["--url", url.as_str()];
        all.extend_from_slice(args);
        let out = crate::support::finish(bare(&all)).expect(69);
        assert!(out.error().contains(&url), "{out:?}");
    }
    assert!(!marker.exists(), "run started its command without a permit");
}

#[test]
fn exit_75_when_no_permit_is_free_and_no_wait() {
    let world = World::new();
    world.acquire("jobs", 1, &[]);
    let out = world
        .run(&["acquire", "jobs", "--limit", "1", "--no-wait"])
        .expect(75);
    assert!(out.stdout.is_empty());
    let marker = world.path("started");
    let touch = format!("touch {}", marker.display());
    world
        .run(&[
            "run",
            "jobs",
            "--limit",
            "1",
            "--no-wait",
            "--",
            "sh",
            "-c",
            &touch,
        ])
        .expect(75);
    assert!(!marker.exists(), "the command ran without a permit");
}

#[test]
fn exit_75_when_the_wait_runs_out_honoured_within_200ms() {
    let world = World::new();
    world.acquire("jobs", 1, &["--lease", "10s"]);
    let marker = world.path("started");
    let touch = format!("touch {}", marker.display());
    for args in [
        &["acquire", "jobs", "--limit", "1", "--wait", "500ms"][..],
        &[
            "run", "jobs", "--limit", "1", "--wait", "500ms", "--", "sh", "-c", &touch,
        ][..],
    ] {
        let out = world.run(args).expect(75);
        assert!(
            out.elapsed >= Duration::from_millis(500) && out.elapsed <= Duration::from_millis(700),
            "--wait 500ms took {:?}",
            out.elapsed
        );
        assert!(out.error().contains("\"jobs\""), "{out:?}");
    }
    assert!(!marker.exists(), "the command ran without a permit");
    assert_eq!(
        world.status("jobs")["waiters"],
        serde_json::json!([]),
        "the timed-out requests left the queue"
    );
}

#[test]
fn exit_76_when_redis_goes_away_while_the_command_runs() {
    let mut world = World::new();
    let pidfile = world.path("child.pid");
    let script = format!("echo $$ > {}; exec sleep 30", pidfile.display());
    let running = world.start(&[
        "run", "jobs", "--limit", "1", "--lease", "600ms", "--", "sh", "-c", &script,
    ]);
    let child = world.pid_in(&pidfile);
    world.server.stop();
    let stopped = Instant::now();
    let out = running.wait().expect(76);
    assert!(out.error().contains("lost the lease"), "{out:?}");
    assert!(
        !crate::support::alive(child),
        "the command outlived its permit"
    );
    // The permit is declared lost no later than its lease ends (600ms after the last
    // renewal, which is before the server stopped).
    assert!(
        stopped.elapsed() < Duration::from_millis(600 + 300),
        "lost {:?} after Redis went away",
        stopped.elapsed()
    );
}
