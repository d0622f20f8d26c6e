//! The managed services' refusals, emulated (`redsem_test::profiles`): logged in as each
//! service's user, `run`, `lock`, `acquire`, `status`, `serve` and `doctor` work, `doctor`
//! says what it could not read and why; where redsem cannot work (no scripts on OCI Cache's
//! sharded clusters, no `WAIT` for `--replica-acks` on ElastiCache Serverless) the error names
//! the refused command.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;

use redsem_test::profiles::{self, Profile};
use redsem_test::{RedisServer, eventually};

use crate::support::{LIMIT, Outcome, Running, bare, finish, listen_port};

/// `redsem --url URL ARGS...`, run to the end.
fn redsem(url: &str, args: &[&str]) -> Outcome {
    let mut all = vec!["--url", url];
    all.extend_from_slice(args);
    finish(bare(&all))
}

/// The profile's server and its user's URL.
fn login(profile: &Profile) -> (RedisServer, String) {
    let server = profile.start_server();
    let url = profile.login(&server);
    (server, url)
}

/// `doctor --json ARGS...`: the outcome and the report.
fn doctor(url: &str, args: &[&str]) -> (Outcome, serde_json::Value) {
    let mut all = vec!["doctor", "--json"];
    all.extend_from_slice(args);
    let out = redsem(url, &all);
    let report = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    (out, report)
}

/// The `(status, detail)` of every row of `check` in a doctor report.
fn rows(report: &serde_json::Value, check: &str) -> Vec<(String, String)> {
    report["checks"]
        .as_array()
        .expect("checks")
        .iter()
        .filter(|c| c["check"] == check)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_owned(),
                c["detail"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// The body of `GET /metrics` once `serve` answers 200 (polled, at most [`LIMIT`]).
fn metrics(port: u16) -> String {
    let mut body = String::new();
    eventually(LIMIT, "serve answers /metrics", || {
        let Ok(mut stream) = TcpStream::connect(("127.0.0.1", port)) else {
            return false;
        };
        let _ = stream.set_read_timeout(Some(LIMIT));
        let mut reply = String::new();
        if stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .is_err()
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
    body
}

#[test]
fn run_lock_status_and_serve_work_as_each_managed_services_user() {
    for profile in profiles::usable() {
        let name = profile.name;
        let (_server, url) = login(profile);
        redsem(&url, &["run", "jobs", "--limit", "2", "--", "true"]).success();
        redsem(&url, &["lock", "door", "--", "true"]).success();
        let id = redsem(&url, &["acquire", "jobs", "--limit", "2", "--lease", "30s"]).success();
        let id = id.stdout.trim().to_owned();
        let status = redsem(&url, &["status", "jobs", "--json"]).success();
        let status: serde_json::Value =
            serde_json::from_str(&status.stdout).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(status["holders"][0]["id"], id.as_str(), "{name}: {status}");
        // Every semaphore, listed (SCAN; ElastiCache Serverless refuses KEYS).
        let all = redsem(&url, &["status"]).success();
        assert!(all.stdout.contains("jobs"), "{name}: {all:?}");
        redsem(&url, &["release", "jobs", &id]).success();

        let port = listen_port();
        let listen = format!("127.0.0.1:{port}");
        let serve = Running::start(bare(&["--url", &url, "serve", "--listen", &listen]));
        let body = metrics(port);
        assert!(body.contains("redsem_up 1"), "{name}: {body}");
        drop(serve);
    }
}

#[test]
fn doctor_says_what_each_managed_service_would_not_let_it_read_and_why() {
    for profile in profiles::usable() {
        let name = profile.name;
        let (_server, url) = login(profile);
        let (out, report) = doctor(&url, &[]);
        assert_ne!(out.code(), 78, "{name}: nothing fails: {report}");
        assert_eq!(rows(&report, "acl")[0].0, "ok", "{name}: {report}");
        let (_, persistence) = &rows(&report, "persistence")[0];
        let (_, version) = &rows(&report, "version")[0];
        if profile.refuses("info") {
            // Read from INFO: unread, and the server's answer is shown.
            for detail in [version, persistence] {
                assert!(
                    detail.contains("INFO is refused") && detail.contains("no permissions"),
                    "{name}: {detail}"
                );
            }
        } else if profile.refuses("config|get") {
            // INFO answers what it can (AOF off); the save points need CONFIG GET.
            assert!(
                persistence.contains("INFO aof_enabled:0")
                    && persistence.contains("CONFIG GET refused"),
                "{name}: {persistence}"
            );
            assert!(version.contains("functions available"), "{name}: {version}");
        } else {
            // OCI Cache refuses CONFIG SET only: read in full (the test server saves nothing).
            assert!(
                persistence.starts_with("none (appendonly no, no save points)"),
                "{name}: {persistence}"
            );
        }
    }
    // Azure answers `ERR unknown command`, not NOPERM: said as it is.
    let (_server, url) = login(&profiles::AZURE_PROFILE);
    let (_, report) = doctor(&url, &[]);
    let (_, persistence) = &rows(&report, "persistence")[0];
    assert!(persistence.contains("unknown command"), "{persistence}");
}

#[test]
fn on_a_service_without_scripts_run_and_doctor_name_the_refused_commands() {
    let (_server, url) = login(&profiles::OCI_SHARDED_PROFILE);
    let out = redsem(&url, &["run", "jobs", "--limit", "2", "--", "true"]).expect(78);
    for command in ["SCRIPT LOAD", "EVALSHA"] {
        assert!(out.error().contains(command), "names {command}: {out:?}");
    }
    let (out, report) = doctor(&url, &[]);
    assert_eq!(out.code(), 78, "{report}");
    let (status, detail) = &rows(&report, "acl")[0];
    assert_eq!(status, "fail", "{report}");
    assert!(detail.contains("EVALSHA"), "{detail}");
}

#[test]
fn replica_acks_where_wait_is_refused_fail_naming_wait() {
    let (_server, url) = login(&profiles::AWS_SERVERLESS_PROFILE);
    let out = redsem(
        &url,
        &[
            "--replica-acks",
            "1",
            "run",
            "jobs",
            "--limit",
            "2",
            "--",
            "true",
        ],
    )
    .expect(78);
    assert!(out.error().contains("WAIT"), "{out:?}");
    let (out, report) = doctor(&url, &["--replica-acks", "1"]);
    assert_eq!(out.code(), 78, "{report}");
    assert!(
        rows(&report, "acl")
            .iter()
            .any(|(status, detail)| status == "fail" && detail.contains("WAIT")),
        "{report}"
    );
}
