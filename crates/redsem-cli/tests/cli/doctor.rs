use redsem_test::RedisServer;

use crate::support::{Outcome, bare, finish};

/// `redsem --url URL [--prefix P] doctor --json`: the outcome and its report.
fn doctor(url: &str, extra: &[&str]) -> (Outcome, serde_json::Value) {
    let mut args = vec!["--url", url];
    args.extend_from_slice(extra);
    args.extend_from_slice(&["doctor", "--json"]);
    let out = finish(bare(&args));
    assert!(out.stderr.is_empty(), "nothing on stderr: {out:?}");
    let report = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    (out, report)
}

/// The status and detail of `check` in a `doctor --json` report.
fn finding(report: &serde_json::Value, check: &str) -> (String, String) {
    let found = report["checks"]
        .as_array()
        .expect("checks is an array")
        .iter()
        .find(|c| c["check"] == check)
        .unwrap_or_else(|| panic!("no {check} in {report}"));
    (
        found["status"].as_str().expect("status").to_owned(),
        found["detail"].as_str().expect("detail").to_owned(),
    )
}

#[test]
fn doctor_fails_an_allkeys_eviction_policy_with_exit_78_and_says_what_to_set() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let (out, report) = doctor(&server.url(), &[]);
    assert_eq!(out.code(), 78, "{out:?}");
    assert_eq!(report["worst"], "fail", "{report}");
    let (status, detail) = finding(&report, "maxmemory-policy");
    assert_eq!(status, "fail", "{report}");
    assert!(detail.contains("allkeys-lru"), "{detail}");
    assert!(detail.contains("noeviction"), "{detail}");
    assert!(detail.contains("--server-checks warn"), "{detail}");
    assert_eq!(finding(&report, "acl").0, "ok", "{report}");
}

#[test]
fn doctor_warns_with_exit_1_about_a_server_without_persistence() {
    // The harness starts servers with `--save "" --appendonly no`.
    let server = RedisServer::start();
    let (out, report) = doctor(&server.url(), &[]);
    assert_eq!(out.code(), 1, "{out:?}");
    assert_eq!(report["worst"], "warn", "{report}");
    let (status, detail) = finding(&report, "persistence");
    assert_eq!(status, "warn", "{report}");
    assert!(detail.starts_with("none"), "{detail}");
    assert!(detail.contains("appendonly yes"), "{detail}");
    for ok in ["version", "maxmemory-policy", "replication", "acl", "clock"] {
        assert_eq!(finding(&report, ok).0, "ok", "{ok}: {report}");
    }

    let rdb = RedisServer::start_with(&["--save", "3600 1"]);
    let (out, report) = doctor(&rdb.url(), &[]);
    assert_eq!(out.code(), 1, "{out:?}");
    let (status, detail) = finding(&report, "persistence");
    assert_eq!(status, "warn", "{report}");
    assert!(detail.starts_with("RDB snapshots only"), "{detail}");
}

#[test]
fn doctor_fails_a_user_without_rights_on_redsems_channels_naming_them() {
    let server = RedisServer::start_with(&["--user", "app", "on", ">pw", "~*", "+@all"]);
    let url = format!("redis://app:pw@127.0.0.1:{}", server.port());
    let (out, report) = doctor(&url, &["--prefix", "jobs"]);
    assert_eq!(out.code(), 78, "{out:?}");
    let (status, detail) = finding(&report, "acl");
    assert_eq!(status, "fail", "{report}");
    assert!(detail.contains("&jobs:*"), "{detail}");
    assert!(detail.contains("SUBSCRIBE"), "{detail}");
    assert!(!out.stdout.contains("pw@"), "{out:?}");
}

#[test]
fn doctor_passes_a_server_with_aof_with_exit_0_and_prints_a_table() {
    let server = RedisServer::start_with(&["--appendonly", "yes"]);
    let (out, report) = doctor(&server.url(), &[]);
    assert_eq!(out.code(), 0, "{out:?}");
    assert_eq!(report["worst"], "ok", "{report}");
    let (_, detail) = finding(&report, "persistence");
    assert!(detail.starts_with("AOF, appendfsync everysec"), "{detail}");

    let out = finish(bare(&["--url", &server.url(), "doctor"])).success();
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert_eq!(
        lines[0],
        format!("server {}, prefix redsem", server.url()),
        "{out:?}"
    );
    assert!(lines[2].starts_with("CHECK"), "{out:?}");
    for check in [
        "version",
        "maxmemory-policy",
        "persistence",
        "replication",
        "acl",
        "clock",
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.starts_with(check) && l.contains(" ok ")),
            "{check} ok in {out:?}"
        );
    }
}

#[test]
fn doctor_reports_replicas_on_the_primary_and_fails_a_replica() {
    let primary = RedisServer::start_with(&["--appendonly", "yes"]);
    let replica = RedisServer::start_replica_of(&primary);
    replica.wait_replicated_from(&primary);

    let (out, report) = doctor(&primary.url(), &[]);
    let (status, detail) = finding(&report, "replication");
    assert_eq!(status, "ok", "{report}");
    assert!(detail.contains("1 replica(s) online"), "{detail}");
    assert!(detail.contains(&replica.port().to_string()), "{detail}");
    assert_eq!(out.code(), 0, "{out:?}");

    let (out, report) = doctor(&replica.url(), &[]);
    assert_eq!(out.code(), 78, "{out:?}");
    let (status, detail) = finding(&report, "replication");
    assert_eq!(status, "fail", "{report}");
    assert!(
        detail.contains(&format!("replica of 127.0.0.1:{}", primary.port())),
        "{detail}"
    );
}

#[test]
fn doctor_says_which_engine_serves_and_why() {
    let server = RedisServer::start_with(&["--appendonly", "yes"]);
    let (out, report) = doctor(&server.url(), &[]);
    assert_eq!(out.code(), 0, "{out:?}");
    let (status, detail) = finding(&report, "engine");
    assert_eq!(status, "ok", "{report}");
    // No module on this server: the scripts, and what REDSEM.ENGINE answered.
    assert!(
        detail.starts_with(&format!(
            "scripts (127.0.0.1:{}: ERR unknown command 'REDSEM.ENGINE'",
            server.port()
        )),
        "{detail}"
    );
    let (_, report) = doctor(&server.url(), &["--engine", "scripts"]);
    let (_, detail) = finding(&report, "engine");
    assert_eq!(detail, "scripts (the scripts were asked for)");
    let table = finish(bare(&["--url", &server.url(), "doctor"])).success();
    assert!(
        table
            .stdout
            .lines()
            .any(|l| l.starts_with("engine") && l.contains(" ok ") && l.contains("scripts")),
        "{table:?}"
    );
}

#[test]
fn engine_native_without_the_module_exits_78_naming_the_server() {
    let server = RedisServer::start();
    let out = finish(bare(&[
        "--url",
        &server.url(),
        "--engine",
        "native",
        "doctor",
    ]))
    .expect(78);
    let error = out.error();
    assert!(error.contains("--engine native"), "{out:?}");
    assert!(
        error.contains(&format!("127.0.0.1:{}", server.port())),
        "{out:?}"
    );
    assert!(error.contains("unknown command"), "{out:?}");
    let mut status = bare(&["--url", &server.url(), "status"]);
    status.env("REDSEM_ENGINE", "native");
    finish(status).expect(78);
}
