use std::io::Write as _;
use std::net::TcpListener;
use std::process::Stdio;
use std::time::Duration;

use redsem_test::RedisServer;
use serde_json::Value;

use crate::support::{World, bare, finish};

#[test]
fn flock_and_timeout_spellings_are_accepted_wherever_they_fit() {
    let world = World::new();
    world.acquire("jobs", 1, &["--lease", "30s"]);
    // Held: each gives up; how soon shows which wait it understood.
    let cases: &[(&[&str], Duration)] = &[
        (
            &["run", "jobs", "-l", "1", "-w", "0.3", "--", "true"],
            Duration::from_millis(300),
        ),
        (
            &["run", "jobs", "-l", "1", "--timeout", "300ms", "--", "true"],
            Duration::from_millis(300),
        ),
        (&["lock", "jobs", "-n", "--", "true"], Duration::ZERO),
        (
            &["lock", "jobs", "--nonblock", "-c", "true"],
            Duration::ZERO,
        ),
        (
            &["acquire", "jobs", "-l", "1", "--timeout", "0.2"],
            Duration::from_millis(200),
        ),
        (&["acquire", "jobs", "-l", "1", "-n"], Duration::ZERO),
    ];
    for (args, waited) in cases {
        let out = world.run(args).expect(75);
        assert!(
            out.elapsed >= *waited,
            "{args:?} gave up after {:?}",
            out.elapsed
        );
        assert!(
            out.elapsed < Duration::from_secs(5),
            "{args:?} waited {:?}",
            out.elapsed
        );
    }

    world.run(&["latch", "ready", "set", "1"]).success();
    for args in [
        &["latch", "ready", "await", "-w", "0.2"][..],
        &["latch", "ready", "await", "--wait", "200ms"][..],
        &["latch", "ready", "await", "--timeout", "0.2"][..],
        &["latch", "ready", "await", "--no-wait"][..],
    ] {
        let out = world.run(args).expect(75);
        assert!(out.error().contains("still counting"), "{args:?}: {out:?}");
    }
    world.run(&["latch", "ready", "count-down"]).success();
    world
        .run(&["latch", "ready", "await", "--nonblock"])
        .success();

    world.run(&["permits", "gpu", "try-set", "1"]).success();
    world.run(&["permits", "gpu", "acquire", "-n"]).success();
    world
        .run(&["permits", "gpu", "acquire", "--timeout", "0.2"])
        .expect(75);
    world
        .run(&["permits", "gpu", "acquire", "-w", "1", "2"])
        .expect(75);
}

#[test]
fn a_shell_string_runs_with_sh_and_the_command_sees_its_semaphores_name() {
    let world = World::new();
    let out = world.run(&[
        "run",
        "nightly",
        "-l",
        "2",
        "-c",
        "echo \"$REDSEM_NAME $REDSEM_SLOT\"; exit 3",
    ]);
    assert_eq!(out.code(), 3, "{out:?}");
    assert_eq!(out.stdout, "nightly 0\n");
    let out = world
        .run(&[
            "run",
            "nightly",
            "-l",
            "2",
            "--",
            "sh",
            "-c",
            "echo $REDSEM_NAME",
        ])
        .success();
    assert_eq!(out.stdout, "nightly\n");
    // Options after the command's name are the command's own.
    let out = world
        .run(&["run", "nightly", "-l", "2", "echo", "--limit", "-n"])
        .success();
    assert_eq!(out.stdout, "--limit -n\n");
}

#[test]
fn lock_is_run_with_a_limit_of_one_on_the_same_semaphore() {
    let world = World::new();
    let out = world
        .run(&[
            "lock",
            "deploy",
            "--holder",
            "ci-7",
            "--",
            "sh",
            "-c",
            "echo $REDSEM_NAME $REDSEM_SLOT",
        ])
        .success();
    assert_eq!(out.stdout, "deploy 0\n");
    let holder = world.acquire("deploy", 1, &["--lease", "30s"]);
    let out = world
        .run(&["lock", "deploy", "--no-wait", "--", "true"])
        .expect(75);
    assert!(out.error().contains("\"deploy\""), "{out:?}");
    world.run(&["release", "deploy", &holder]).success();
    // The limit in force is 1: a run asking for 2 is told so.
    let _held = world.start(&["lock", "deploy", "--", "sleep", "5"]);
    redsem_test::eventually(crate::support::LIMIT, "the lock to be taken", || {
        world.holders("deploy").len() == 1
    });
    let out = world
        .run(&["run", "deploy", "-l", "2", "--", "true"])
        .expect(125);
    assert!(out.error().contains("limit 1 in force"), "{out:?}");
}

#[test]
fn status_recognises_permits_and_latches_and_its_json_carries_held_for() {
    let world = World::new();
    world.run(&["permits", "pool", "try-set", "4"]).success();
    world.run(&["permits", "pool", "acquire", "2"]).success();
    let out = world.run(&["status", "pool"]).success();
    assert!(
        out.stdout.ends_with("\n\npool: 2 permits available\n"),
        "{out:?}"
    );
    let json = world.status("pool");
    assert_eq!(json["permits"]["available"], 2);
    assert_eq!(json["latch"]["state"], "never-set");
    assert_eq!(json["capacity"], Value::Null);

    world.run(&["latch", "ready", "set", "3"]).success();
    world.run(&["latch", "ready", "count-down"]).success();
    let out = world.run(&["status", "ready"]).success();
    assert!(
        out.stdout.ends_with("\n\nready: latch counting, 2 to go\n"),
        "{out:?}"
    );
    assert_eq!(
        world.status("ready")["latch"],
        serde_json::json!({"state": "counting", "count": 2})
    );
    world.run(&["latch", "ready", "count-down"]).success();
    world.run(&["latch", "ready", "count-down"]).success();
    let out = world.run(&["status", "ready"]).success();
    assert!(out.stdout.contains("latch open"), "{out:?}");

    let out = world.run(&["status", "nothing"]).success();
    assert!(out.stdout.contains("\n\nnothing: not in use"), "{out:?}");

    world.acquire("jobs", 2, &["--lease", "30s"]);
    std::thread::sleep(Duration::from_millis(300));
    let holders = world.status("jobs")["holders"].clone();
    let held_for = holders[0]["held_for_ms"].as_u64().expect("held_for_ms");
    assert!((300..30_000).contains(&held_for), "{holders}");
}

#[test]
fn a_reader_that_goes_away_ends_redsem_quietly() {
    let world = World::new();
    world.acquire("jobs", 2, &[]);
    let url = world.server.url();
    for args in [
        &["--url", url.as_str(), "status"][..],
        &["--url", url.as_str(), "status", "jobs", "--json"][..],
        &["completions", "zsh"][..],
        &["--url", url.as_str(), "permits", "gpu", "available"][..],
    ] {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader);
        let mut cmd = bare(args);
        cmd.stdout(Stdio::from(writer));
        let out = finish(cmd);
        assert_eq!(out.code(), 0, "{args:?}: {out:?}");
        assert!(out.stderr.is_empty(), "{args:?}: {out:?}");
    }
}

#[test]
fn a_server_that_is_not_redis_is_named_in_one_line() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(4) {
            let Ok(mut stream) = stream else { continue };
            let _ = stream.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
        }
    });
    let url = format!("redis://127.0.0.1:{port}");
    let out = finish(bare(&["--url", &url, "status"])).expect(69);
    assert!(
        out.error()
            .contains(&format!("{url} is not a Redis server")),
        "{out:?}"
    );
    assert!(!out.error().contains("Parse error"), "{out:?}");
}

#[test]
fn rediss_to_a_plain_text_port_says_to_use_redis() {
    let server = RedisServer::start();
    let port = server.port();
    let url = format!("rediss://127.0.0.1:{port}");
    let out = finish(bare(&["--url", &url, "status"])).expect(69);
    assert!(
        out.error().contains("speaks plain Redis, not TLS"),
        "{out:?}"
    );
    assert!(
        out.error()
            .contains(&format!("use redis://127.0.0.1:{port}")),
        "{out:?}"
    );
}
