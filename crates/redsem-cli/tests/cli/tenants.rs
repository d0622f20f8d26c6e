//! Tenants: `--tenant`, `--weight` and `--cap` on `run`, `lock` and `acquire`; `status` (table
//! and JSON) and `serve` (page and JSON) per tenant; exit 65 when a tenant is named with
//! settings other than those in force.

use nix::sys::signal::Signal;

use crate::observe::get;
use crate::support::{World, listen_port};

/// The entry of `tenant` in a status JSON's `tenants`.
fn tenant<'a>(status: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    status["tenants"]
        .as_array()
        .unwrap_or_else(|| panic!("no tenants in {status}"))
        .iter()
        .find(|t| t["name"] == name)
        .unwrap_or_else(|| panic!("no tenant {name:?} in {status}"))
}

#[test]
fn status_shows_each_tenants_held_units_waiters_weight_and_cap() {
    let world = World::new();
    let acme = [
        "--lease", "1m", "--tenant", "acme", "--weight", "2", "--cap", "1",
    ];
    world.acquire("llm", 3, &acme);
    world.acquire("llm", 3, &["--lease", "1m"]);
    // acme is at its cap: its next request waits although a unit is free.
    let waiter = world.start(&[
        "-q", "acquire", "llm", "--limit", "3", "--lease", "1m", "--tenant", "acme", "--weight",
        "2", "--cap", "1",
    ]);
    world.wait_for_waiters("llm", 1);

    let status = world.status("llm");
    let acme = tenant(&status, "acme");
    assert_eq!(
        (
            &acme["held"],
            &acme["waiters"],
            &acme["weight"],
            &acme["cap"]
        ),
        (&1.into(), &1.into(), &2.into(), &1.into()),
        "{status}"
    );
    let default = tenant(&status, "");
    assert_eq!(
        (&default["held"], &default["cap"]),
        (&1.into(), &serde_json::Value::Null)
    );
    assert_eq!(status["in_use"], 2, "{status}");

    let table = world.run(&["status", "llm"]).success().stdout;
    let row = table
        .lines()
        .find(|line| line.starts_with("acme "))
        .unwrap_or_else(|| panic!("no row for acme in:\n{table}"));
    assert_eq!(
        row.split_whitespace().collect::<Vec<_>>(),
        ["acme", "1", "1", "2", "1"]
    );
    assert!(table.contains("TENANT"), "{table}");
    assert!(table.contains("(default)"), "{table}");
    drop(waiter);
}

#[test]
fn status_json_has_no_tenants_field_when_no_tenant_is_named() {
    let world = World::new();
    world.acquire("plain", 2, &["--lease", "1m"]);
    let status = world.status("plain");
    assert_eq!(status["in_use"], 1, "{status}");
    assert!(status.get("tenants").is_none(), "{status}");
    let table = world.run(&["status", "plain"]).success().stdout;
    assert!(!table.contains("TENANT"), "{table}");
}

#[test]
fn run_and_lock_hold_their_permit_for_the_tenant_named() {
    let world = World::new();
    for (args, name) in [
        (
            &[
                "run", "jobs", "--limit", "2", "--tenant", "acme", "--weight", "3",
            ][..],
            "jobs",
        ),
        (
            &["lock", "deploy", "--tenant", "ops", "--cap", "1"][..],
            "deploy",
        ),
    ] {
        let path = world.path(&format!("{name}.json"));
        let path = path.to_str().expect("a UTF-8 path");
        // The command reads the status while the permit is held, through the binary itself.
        let line = format!(
            "{} --url {} status {name} --json > {path}",
            crate::support::REDSEM,
            world.server.url()
        );
        world.run(&[args, &["-c", &line][..]].concat()).success();
        let status: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(path).expect("the command wrote the status"),
        )
        .expect("status JSON");
        let tenant_name = args[args.iter().position(|a| *a == "--tenant").expect("named") + 1];
        assert_eq!(status["holders"][0]["tenant"], tenant_name, "{status}");
        assert_eq!(tenant(&status, tenant_name)["held"], 1, "{status}");
    }
    // Released when the command ended.
    assert!(world.holders("jobs").is_empty());
}

#[test]
fn a_tenant_named_with_other_settings_exits_65_naming_both() {
    let world = World::new();
    world.acquire(
        "llm",
        4,
        &["--lease", "1m", "--tenant", "acme", "--weight", "2"],
    );
    for args in [
        &[
            "acquire", "llm", "--limit", "4", "--tenant", "acme", "--weight", "3",
        ][..],
        &[
            "run", "llm", "--limit", "4", "--tenant", "acme", "--cap", "2", "--", "true",
        ][..],
    ] {
        let out = world.run(args).expect(65);
        out.assert_one_error_line();
        assert!(out.error().contains("tenant \"acme\""), "{out:?}");
        assert!(out.error().contains("--weight 2 and no --cap"), "{out:?}");
    }
    // The same settings are no conflict.
    world
        .run(&[
            "run", "llm", "--limit", "4", "--tenant", "acme", "--weight", "2", "--", "true",
        ])
        .success();
}

#[test]
fn weight_and_cap_without_a_tenant_or_out_of_range_are_usage_errors() {
    let world = World::new();
    for (args, code) in [
        (&["acquire", "jobs", "--limit", "2", "--weight", "2"][..], 2),
        (
            &["run", "jobs", "--limit", "2", "--cap", "1", "--", "true"][..],
            125,
        ),
        (
            &[
                "acquire", "jobs", "--limit", "2", "--tenant", "a", "--cap", "0",
            ][..],
            2,
        ),
        (
            &[
                "acquire", "jobs", "--limit", "2", "--tenant", "a", "--weight", "1000001",
            ][..],
            2,
        ),
        (&["acquire", "jobs", "--limit", "2", "--tenant", ""][..], 2),
    ] {
        let out = world.run(args).expect(code);
        out.assert_one_error_line();
    }
    assert!(world.holders("jobs").is_empty());
}

#[test]
fn serve_shows_tenants_on_its_page_and_in_its_json() {
    let world = World::new();
    world.acquire(
        "llm",
        2,
        &["--lease", "1m", "--tenant", "acme", "--cap", "2"],
    );
    world.acquire("plain", 2, &["--lease", "1m"]);
    let port = listen_port();
    let serve = world.start(&["serve", "--listen", &format!("127.0.0.1:{port}")]);
    let (code, page) = get(port, "/");
    assert_eq!(code, 200);
    assert!(page.contains("<caption>Tenants</caption>"), "{page}");
    assert!(page.contains("<tr><td>acme</td>"), "{page}");
    let (code, body) = get(port, "/status.json");
    assert_eq!(code, 200);
    let all: serde_json::Value = serde_json::from_str(&body).expect("JSON");
    let entries = all.as_array().expect("a list");
    let llm = entries
        .iter()
        .find(|e| e["name"] == "llm")
        .expect("llm listed");
    let acme = tenant(llm, "acme");
    assert_eq!(
        (&acme["held"], &acme["cap"]),
        (&1.into(), &2.into()),
        "{llm}"
    );
    let plain = entries
        .iter()
        .find(|e| e["name"] == "plain")
        .expect("plain listed");
    assert!(plain.get("tenants").is_none(), "{plain}");
    let (code, metrics) = get(port, "/metrics");
    assert_eq!(code, 200);
    assert!(
        metrics.contains("\nredsem_tenant_used{name=\"llm\",tenant=\"acme\"} 1\n"),
        "{metrics}"
    );
    assert!(
        metrics.contains("\nredsem_tenant_waiters{name=\"llm\",tenant=\"acme\"} 0\n"),
        "{metrics}"
    );
    assert!(!metrics.contains("tenant_used{name=\"plain\""), "{metrics}");
    serve.signal(Signal::SIGTERM);
    assert_eq!(serve.wait().code(), 0);
}
