//! What a new user trips on: typos get clap's suggestion, errors name what is
//! accepted, `status` lists every kind of primitive, one JSON schema, a latch never set is
//! told from an open one, short and long help.

use crate::support::{World, bare, finish};

#[test]
fn a_mistyped_option_or_subcommand_gets_the_suggestion_on_its_one_line() {
    let out = finish(bare(&["run", "demo", "--limt", "2", "--", "true"])).expect(125);
    assert!(
        out.error().contains("a similar argument exists: '--limit'"),
        "{out:?}"
    );
    assert!(!out.error().contains("to pass"), "{out:?}");
    let out = finish(bare(&["stauts"])).expect(2);
    assert!(
        out.error()
            .contains("a similar subcommand exists: 'status'"),
        "{out:?}"
    );
    let world = World::new();
    let out = world.run(&["status", "--jsn"]).expect(2);
    assert!(out.error().contains("'--json'"), "{out:?}");
}

#[test]
fn a_bad_duration_names_the_units_accepted_not_the_parsers_list() {
    let out = finish(bare(&["status", "x", "--watch", "5x"])).expect(2);
    assert!(out.error().contains("unknown unit \"x\""), "{out:?}");
    assert!(out.error().contains("500ms, 2s, 1m 30s"), "{out:?}");
    assert!(!out.error().contains("supported units"), "{out:?}");
    let out = finish(bare(&["run", "x", "-w", "5x", "--", "true"])).expect(125);
    assert!(out.error().contains("500ms, 2s"), "{out:?}");
}

#[test]
fn a_url_of_an_unknown_scheme_names_the_schemes_accepted() {
    for url in ["foo://127.0.0.1:6379", "redis+clutser://127.0.0.1:7000"] {
        let out = finish(bare(&["--url", url, "status"])).expect(2);
        let scheme = url.split("://").next().unwrap_or_default();
        assert!(
            out.error()
                .contains(&format!("unknown scheme \"{scheme}\"")),
            "{out:?}"
        );
        for form in [
            "redis://",
            "rediss://",
            "redis+cluster://",
            "redis+sentinel://",
        ] {
            assert!(out.error().contains(form), "{form} in {out:?}");
        }
        assert!(!out.error().contains("InvalidClientConfig"), "{out:?}");
    }
    let out = finish(bare(&["--url", "localhost:6379", "status"])).expect(2);
    assert!(out.error().contains("no scheme"), "{out:?}");
}

#[test]
fn short_help_is_short_and_the_long_help_has_the_examples_and_exit_codes() {
    for sub in [
        &["run"][..],
        &["lock"],
        &["acquire"],
        &["status"],
        &["latch", "x", "await"],
        &["permits", "x", "acquire"],
        &[],
    ] {
        let mut short: Vec<&str> = sub.to_vec();
        short.push("-h");
        let out = finish(bare(&short)).success();
        assert!(
            !out.stdout.contains("Exit codes"),
            "{short:?}: {}",
            out.stdout
        );
        assert!(
            !out.stdout.contains("--replica-acks"),
            "{short:?}: {}",
            out.stdout
        );
        assert!(out.stdout.contains("--help"), "{short:?}: {}", out.stdout);
        let lines = out.stdout.lines().count();
        assert!(lines <= 45, "{short:?}: {lines} lines: {}", out.stdout);
        let mut long: Vec<&str> = sub.to_vec();
        long.push("--help");
        let out = finish(bare(&long)).success();
        assert!(
            out.stdout.contains("Exit codes"),
            "{long:?}: {}",
            out.stdout
        );
        assert!(
            out.stdout.contains("--replica-acks"),
            "{long:?}: {}",
            out.stdout
        );
    }
}

#[test]
fn a_latch_never_set_is_told_from_an_open_one_and_await_can_require_a_set() {
    let world = World::new();
    let out = world.run(&["latch", "never", "count"]).success();
    assert_eq!(out.stdout, "0\n");
    assert!(out.stderr.contains("never set"), "{out:?}");
    world.run(&["latch", "opened", "set", "1"]).success();
    world.run(&["latch", "opened", "count-down"]).success();
    let out = world.run(&["latch", "opened", "count"]).success();
    assert_eq!(out.stdout, "0\n");
    assert!(!out.stderr.contains("never set"), "{out:?}");
    assert_eq!(world.status("never")["latch"]["state"], "never-set");
    assert_eq!(world.status("opened")["latch"]["state"], "open");

    // --require-set: a latch never set is not open.
    let out = world
        .run(&["latch", "never", "await", "--require-set", "--no-wait"])
        .expect(75);
    assert!(out.error().contains("never set"), "{out:?}");
    world
        .run(&["latch", "opened", "await", "--require-set", "--no-wait"])
        .success();
    let out = world
        .run(&["latch", "never", "await", "--require-set", "-w", "300ms"])
        .expect(75);
    assert!(out.error().contains("never set"), "{out:?}");
    // A worker that starts before the setter waits for the set, then for the count-down.
    let worker = world.start(&["latch", "late", "await", "--require-set", "-w", "10s"]);
    std::thread::sleep(std::time::Duration::from_millis(400));
    world.run(&["latch", "late", "set", "1"]).success();
    world.wait_for_latch_listeners("late", 1);
    world.run(&["latch", "late", "count-down"]).success();
    worker.wait().success();

    let help = world.run(&["latch", "x", "await", "--help"]).success();
    assert!(!help.stdout.contains("never queue"), "{}", help.stdout);
}

#[test]
fn status_without_a_name_lists_permit_pools_and_latches_too() {
    let world = World::new();
    world.acquire("exports", 2, &[]);
    world.run(&["permits", "gpu", "try-set", "1"]).success();
    world.run(&["latch", "ready", "set", "3"]).success();
    let out = world.run(&["status"]).success();
    for (name, what) in [("exports", "1"), ("gpu", "1"), ("ready", "3 to go")] {
        let line = out
            .stdout
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} listed: {out:?}"));
        assert!(line.contains(what), "{line}");
    }
    let list: serde_json::Value =
        serde_json::from_str(&world.run(&["status", "--json"]).success().stdout).expect("JSON");
    let names: Vec<&str> = list
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|entry| entry["name"].as_str())
        .collect();
    assert_eq!(names, ["exports", "gpu", "ready"]);
    assert_eq!(list[1]["permits"]["available"], 1);
    assert_eq!(list[2]["latch"]["state"], "counting");
    let out = world.run(&["status", "gpu"]).success();
    assert!(
        out.stdout.ends_with("\n\ngpu: 1 permit available\n"),
        "{out:?}"
    );
}

#[test]
fn status_json_and_serves_status_json_are_one_type() {
    use std::io::{Read as _, Write as _};
    let world = World::new();
    world.acquire("jobs", 2, &["--holder", "web-1", "--lease", "20s"]);
    let cli = world.status("jobs");
    let port = crate::support::listen_port();
    let listen = format!("127.0.0.1:{port}");
    let serve = world.start(&["serve", "--listen", &listen]);
    let mut body = String::new();
    redsem_test::eventually(crate::support::LIMIT, "serve answers", || {
        let Ok(mut stream) = std::net::TcpStream::connect(&listen) else {
            return false;
        };
        let request = format!("GET /status.json HTTP/1.0\r\nHost: {listen}\r\n\r\n");
        let mut reply = String::new();
        if stream.write_all(request.as_bytes()).is_err()
            || stream.read_to_string(&mut reply).is_err()
        {
            return false;
        }
        body = reply
            .split("\r\n\r\n")
            .nth(1)
            .unwrap_or_default()
            .to_owned();
        reply.starts_with("HTTP/1.1 200") || reply.starts_with("HTTP/1.0 200")
    });
    drop(serve);
    let served: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let entry = &served[0];
    let lease_keys = ["name", "capacity", "in_use", "holders", "waiters"];
    for key in lease_keys {
        assert!(entry.get(key).is_some(), "{key} in {entry}");
        assert!(cli.get(key).is_some(), "{key} in {cli}");
    }
    assert_eq!(entry["name"], cli["name"]);
    assert_eq!(entry["capacity"], cli["capacity"]);
    let fields = |holder: &serde_json::Value| {
        let mut keys: Vec<String> = holder
            .as_object()
            .expect("an object")
            .keys()
            .cloned()
            .collect();
        keys.sort();
        keys
    };
    assert_eq!(fields(&entry["holders"][0]), fields(&cli["holders"][0]));
    assert_eq!(
        fields(&cli["holders"][0]),
        [
            "expires_in_ms",
            "held_for_ms",
            "id",
            "label",
            "slots",
            "token"
        ]
    );
    assert_eq!(cli["holders"][0]["label"], "web-1");
    assert!(cli["waiters"].is_array(), "{cli}");
    assert!(entry["waiters"].is_array(), "{entry}");
    // One type, one schema: the same fields, the permits and the latch included.
    assert_eq!(fields(entry), fields(&cli));
    assert_eq!(entry["permits"], cli["permits"]);
    assert_eq!(entry["latch"], cli["latch"]);
}
