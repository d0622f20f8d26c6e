use std::collections::BTreeSet;
use std::time::Duration;

use redsem::redis;
use serde_json::Value;

use crate::support::{World, bare, finish};

fn keys_of(value: &Value) -> BTreeSet<&str> {
    value
        .as_object()
        .unwrap_or_else(|| panic!("an object: {value}"))
        .keys()
        .map(String::as_str)
        .collect()
}

fn set<'a>(keys: &[&'a str]) -> BTreeSet<&'a str> {
    keys.iter().copied().collect()
}

#[test]
fn acquire_prints_the_id_or_json_with_token_slot_and_lease() {
    let world = World::new();
    let id = world.acquire("jobs", 2, &[]);
    assert_eq!(id.len(), 32, "{id}");
    let out = world
        .run(&[
            "acquire", "jobs", "--limit", "2", "--lease", "1500ms", "--json",
        ])
        .success();
    let json: Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(keys_of(&json), set(&["id", "token", "slot", "lease_ms"]));
    assert!(json["id"].is_string());
    // Tokens are seeded from the server's clock, so only their order is known.
    let token = json["token"].as_u64().expect("a whole token");
    assert!(token > 0, "{json}");
    assert_eq!(json["slot"], 1);
    assert_eq!(json["lease_ms"], 1500);
    assert_eq!(out.stdout.lines().count(), 1);
}

#[test]
fn an_acquired_permit_lives_one_lease_unless_refreshed() {
    let world = World::new();
    let kept = world.acquire("jobs", 2, &["--lease", "400ms"]);
    let dropped = world.acquire("jobs", 2, &["--lease", "400ms"]);
    world
        .run(&["refresh", "jobs", &kept, "--lease", "5s"])
        .success();
    std::thread::sleep(Duration::from_millis(600));
    assert_eq!(world.holders("jobs"), vec![kept.clone()]);
    world.run(&["refresh", "jobs", &dropped]).expect(1);
    world.run(&["release", "jobs", &kept]).success();
    assert!(world.holders("jobs").is_empty());
}

#[test]
fn status_json_matches_the_contract() {
    let world = World::new();
    let empty = world.status("nothing-here");
    assert_eq!(
        empty,
        serde_json::json!({
            "name": "nothing-here", "capacity": null, "in_use": 0, "holders": [], "waiters": [],
            "permits": {"available": 0}, "latch": {"state": "never-set", "count": 0},
            "server": world.server.url(), "engine": {"name": "scripts"}
        })
    );

    let labelled = world.acquire("jobs", 2, &["--holder", "web-1", "--lease", "20s"]);
    let anonymous = world.acquire("jobs", 2, &[]);
    let waiter = world.start(&["acquire", "jobs", "--limit", "2", "--holder", "web-3"]);
    world.wait_for_waiters("jobs", 1);

    let status = world.status("jobs");
    assert_eq!(
        keys_of(&status),
        set(&[
            "name", "capacity", "in_use", "holders", "waiters", "permits", "latch", "server",
            "engine"
        ])
    );
    assert_eq!(status["name"], "jobs");
    assert_eq!(status["capacity"], 2);
    assert_eq!(status["in_use"], 2);
    assert_eq!(status["waiters"].as_array().map(Vec::len), Some(1));
    let holders = status["holders"].as_array().expect("holders");
    assert_eq!(holders.len(), 2);
    for (holder, id, label, slot) in [
        (&holders[0], &labelled, Value::from("web-1"), 0),
        (&holders[1], &anonymous, Value::Null, 1),
    ] {
        assert_eq!(
            keys_of(holder),
            set(&[
                "id",
                "label",
                "token",
                "slots",
                "expires_in_ms",
                "held_for_ms"
            ])
        );
        assert_eq!(holder["id"], id.as_str());
        assert_eq!(holder["label"], label);
        assert!(holder["token"].is_u64());
        assert_eq!(holder["slots"], serde_json::json!([slot]));
        assert!(holder["expires_in_ms"].is_i64());
    }
    let left = holders[0]["expires_in_ms"].as_i64().expect("i64");
    assert!(left > 15_000 && left <= 20_000, "{left}");
    assert!(holders[0]["token"].as_u64() < holders[1]["token"].as_u64());
    let queue = status["waiters"].as_array().expect("waiters");
    assert_eq!(queue.len(), 1);
    assert_eq!(
        keys_of(&queue[0]),
        set(&["id", "label", "units", "waiting_for_ms"])
    );
    assert_eq!(queue[0]["label"], "web-3");
    assert_eq!(queue[0]["units"], 1);

    world.run(&["release", "jobs", &anonymous]).success();
    let out = waiter.wait().success();
    assert_eq!(out.stdout.trim().len(), 32);
}

#[test]
fn status_shows_a_table_a_person_reads_at_a_glance() {
    let world = World::new();
    world.acquire("jobs", 3, &["--holder", "web-1"]);
    let out = world.run(&["status", "jobs"]).success();
    assert!(
        out.stdout.contains("\n\njobs: 1 of 3 in use, 0 waiting"),
        "{out:?}"
    );
    for column in [
        "HOLDER",
        "TOKEN",
        "SLOT",
        "LEASE LEFT",
        "HELD FOR",
        "ID",
        "web-1",
    ] {
        assert!(out.stdout.contains(column), "{column}: {out:?}");
    }
}

#[test]
fn status_without_a_name_lists_the_semaphores_under_the_prefix() {
    let world = World::new();
    world.acquire("alpha", 2, &[]);
    world.acquire("beta", 1, &[]);
    world.acquire("other", 1, &["--prefix", "elsewhere"]);
    let out = world.run(&["status", "--json"]).success();
    let list: Value = serde_json::from_str(&out.stdout).expect("JSON");
    let names: Vec<&str> = list
        .as_array()
        .expect("a list")
        .iter()
        .map(|entry| entry["name"].as_str().expect("a name"))
        .collect();
    assert_eq!(names, ["alpha", "beta"]);
    assert_eq!(
        keys_of(&list[0]),
        keys_of(&world.status("alpha")),
        "each entry as status NAME --json"
    );
    assert_eq!(list[1]["capacity"], 1);
    assert_eq!(list[1]["in_use"], 1);
    let table = world.run(&["status"]).success().stdout;
    assert!(table.contains("alpha") && table.contains("beta") && !table.contains("other"));
    let none = world.run(&["--prefix", "empty", "status"]).success().stdout;
    assert!(none.contains("no semaphores"), "{none}");
}

#[test]
fn global_options_go_before_or_after_the_subcommand_or_come_from_the_environment() {
    let world = World::new();
    let url = world.server.url();
    finish(bare(&[
        "--url", &url, "--prefix", "before", "acquire", "a", "--limit", "1",
    ]))
    .success();
    finish(bare(&[
        "acquire", "b", "--limit", "1", "--url", &url, "--prefix", "after",
    ]))
    .success();
    let mut from_env = bare(&["acquire", "c", "--limit", "1"]);
    from_env.env("REDIS_URL", &url).env("REDSEM_PREFIX", "env");
    finish(from_env).success();

    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut world.server.connection())
        .expect("KEYS");
    assert!(!keys.is_empty());
    for key in &keys {
        assert!(
            ["before:", "after:", "env:"]
                .iter()
                .any(|p| key.starts_with(p)),
            "every key starts with the prefix: {key}"
        );
    }
    for prefix in ["before", "after", "env"] {
        assert!(
            keys.iter().any(|k| k.starts_with(prefix)),
            "{prefix}: {keys:?}"
        );
    }
}

#[test]
fn every_subcommand_has_help_with_examples_and_exits_0() {
    let subcommands: &[&[&str]] = &[
        &["run"],
        &["lock"],
        &["acquire"],
        &["refresh"],
        &["release"],
        &["status"],
        &["doctor"],
        &["completions"],
        &["latch"],
        &["latch", "ready", "set"],
        &["latch", "ready", "count-down"],
        &["latch", "ready", "await"],
        &["latch", "ready", "count"],
        &["permits"],
        &["permits", "gpu", "add"],
        &["permits", "gpu", "try-set"],
        &["permits", "gpu", "acquire"],
        &["permits", "gpu", "release"],
        &["permits", "gpu", "available"],
    ];
    for sub in subcommands {
        let mut args = sub.to_vec();
        args.push("--help");
        let out = finish(bare(&args)).success();
        assert!(out.stdout.contains("Examples:"), "{sub:?}: {out:?}");
        if sub[0] != "completions" {
            assert!(out.stdout.contains("Exit codes:"), "{sub:?}: {out:?}");
        }
        assert!(out.stderr.is_empty());
    }
    let out = finish(bare(&["--help"])).success();
    assert!(out.stdout.contains("Examples:") && out.stdout.contains("REDIS_URL"));
    let out = finish(bare(&["--version"])).success();
    assert!(out.stdout.starts_with("redsem "), "{out:?}");
}

#[test]
fn completions_are_printed_for_each_shell() {
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let out = finish(bare(&["completions", shell])).success();
        assert!(out.stdout.contains("redsem"), "{shell}");
    }
}

#[test]
fn status_says_which_engine_serves() {
    let world = World::new();
    world.acquire("jobs", 2, &[]);
    for args in [&["status", "jobs"][..], &["status"]] {
        let out = world.run(args).success();
        assert_eq!(
            out.stdout.lines().nth(1),
            Some("engine: scripts"),
            "the second line: {out:?}"
        );
    }
    let out = world
        .run(&["--engine", "scripts", "status", "jobs"])
        .success();
    assert_eq!(
        out.stdout.lines().nth(1),
        Some("engine: scripts"),
        "{out:?}"
    );
    assert_eq!(
        world.status("jobs")["engine"],
        serde_json::json!({"name": "scripts"})
    );
    let out = world.run(&["--engine", "lua", "status"]).expect(2);
    assert!(
        out.error().contains("native"),
        "the values are listed: {out:?}"
    );
}
