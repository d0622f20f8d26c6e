use std::path::Path;

use redsem::redis;
use redsem_test::{RedisCluster, RedisSentinels, RedisServer, eventually};

use crate::support::{LIMIT, Outcome, Running, bare, finish};

/// `redis+cluster://` with every node of `cluster` as a seed.
fn cluster_url(cluster: &RedisCluster) -> String {
    let seeds: Vec<String> = cluster
        .urls()
        .iter()
        .map(|url| {
            url.trim_start_matches("redis://")
                .trim_end_matches('/')
                .to_owned()
        })
        .collect();
    format!("redis+cluster://{}", seeds.join(","))
}

/// `redsem --url URL ARGS...`.
fn redsem(url: &str, args: &[&str]) -> std::process::Command {
    let mut all = vec!["--url", url];
    all.extend_from_slice(args);
    bare(&all)
}

/// `text` split at spaces: a command line without quoting.
fn words(text: &str) -> Vec<&str> {
    text.split(' ').collect()
}

/// The JSON of `status NAME --json` through `url`.
fn status(url: &str, name: &str) -> serde_json::Value {
    let out = finish(redsem(url, &["status", name, "--json"])).success();
    serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"))
}

/// A `run NAME --limit 1 --holder WHO` whose command notes its start and end in `log` and
/// holds on until the file `WHO.go` in `dir` exists.
fn turn(url: &str, dir: &Path, who: &str) -> Running {
    let script = format!(
        "echo \"start {who} $REDSEM_TOKEN\" >> log; touch {who}.started; \
         while [ ! -e {who}.go ]; do sleep 0.01; done; echo \"end {who}\" >> log"
    );
    let mut cmd = redsem(
        url,
        &[
            "run", "jobs", "--limit", "1", "--holder", who, "--lease", "5s", "--", "sh", "-c",
            &script,
        ],
    );
    cmd.current_dir(dir);
    Running::start(cmd)
}

/// Through `url`: two `run`s of one semaphore with `--limit 1` take turns (the second starts
/// only after the first ended, with a larger token), and `status` shows the holder and the
/// waiter meanwhile.
fn two_runs_take_turns_and_status_shows_the_holder(url: &str, dir: &Path) {
    let first = turn(url, dir, "first");
    eventually(LIMIT, "the first command started", || {
        dir.join("first.started").exists()
    });
    let second = turn(url, dir, "second");
    eventually(LIMIT, "the second run waits", || {
        status(url, "jobs")["waiters"].as_array().map(Vec::len) == Some(1)
    });
    let now = status(url, "jobs");
    let holders = now["holders"].as_array().expect("holders is an array");
    assert_eq!(holders.len(), 1, "{now}");
    assert_eq!(holders[0]["label"], "first", "{now}");
    assert_eq!(now["capacity"], 1, "{now}");
    assert!(
        !dir.join("second.started").exists(),
        "the second command waits while the first runs"
    );

    std::fs::write(dir.join("first.go"), "").expect("write first.go");
    first.wait().success();
    eventually(LIMIT, "the second command started", || {
        dir.join("second.started").exists()
    });
    assert_eq!(status(url, "jobs")["holders"][0]["label"], "second");
    std::fs::write(dir.join("second.go"), "").expect("write second.go");
    second.wait().success();

    let log = std::fs::read_to_string(dir.join("log")).expect("read the log");
    let lines: Vec<Vec<&str>> = log.lines().map(|l| l.split(' ').collect()).collect();
    let order: Vec<String> = lines.iter().map(|l| l[..2].join(" ")).collect();
    assert_eq!(
        order,
        ["start first", "end first", "start second", "end second"],
        "{log}"
    );
    let token = |line: &[&str]| -> u64 { line[2].parse().expect("a token") };
    assert!(token(&lines[2]) > token(&lines[0]), "{log}");
    assert!(
        status(url, "jobs")["holders"]
            .as_array()
            .is_some_and(Vec::is_empty)
    );
}

#[test]
fn two_runs_through_a_cluster_url_take_turns_and_status_shows_the_holder() {
    let cluster = RedisCluster::start(3);
    let dir = cluster.nodes()[0].dir();
    two_runs_take_turns_and_status_shows_the_holder(&cluster_url(&cluster), dir);
}

#[test]
fn two_runs_through_a_sentinel_url_take_turns_and_status_shows_the_holder() {
    let deployment = RedisSentinels::start();
    let dir = deployment.nodes()[0].dir();
    two_runs_take_turns_and_status_shows_the_holder(&deployment.url(), dir);
}

#[test]
fn a_sentinel_url_reaches_the_primary_the_sentinels_name_after_a_failover() {
    let deployment = RedisSentinels::start();
    let url = deployment.url();
    finish(redsem(
        &url,
        &["acquire", "before", "-l", "1", "--lease", "1m"],
    ))
    .success();
    let new = deployment.failover();
    settled(&deployment, new);
    // The old primary is a replica now and refuses writes: a grant shows the new one is used.
    finish(redsem(
        &url,
        &["acquire", "after", "-l", "1", "--lease", "1m"],
    ))
    .success();
    let primary = deployment
        .nodes()
        .iter()
        .find(|n| n.port() == new)
        .expect("the new primary is a node");
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("redsem:{lease:after}:*")
        .query(&mut primary.connection())
        .expect("KEYS on the new primary");
    assert!(!keys.is_empty(), "the permit is on the new primary");
}

#[test]
fn a_run_through_a_sentinel_url_keeps_its_permit_across_a_failover() {
    let deployment = RedisSentinels::start();
    let url = deployment.url();
    let dir = deployment.nodes()[0].dir();
    let first = turn(&url, dir, "first");
    eventually(LIMIT, "the command started", || {
        dir.join("first.started").exists()
    });
    let old = deployment.primary().port();
    let new = deployment.failover();
    settled(&deployment, new);
    // More than a lease (5 s) on: a renewal reached the new primary, or the permit would be
    // gone from it and the command stopped (exit 76).
    assert_ne!(old, new);
    std::thread::sleep(std::time::Duration::from_secs(6));
    let now = status(&url, "jobs");
    assert_eq!(now["holders"][0]["label"], "first", "{now}");
    std::fs::write(dir.join("first.go"), "").expect("write first.go");
    first.wait().success();
    let second = turn(&url, dir, "second");
    std::fs::write(dir.join("second.go"), "").expect("write second.go");
    second.wait().success();
}

/// Wait until the failover to the primary on port `new` is over: every Sentinel's `SENTINEL
/// MASTER` names it, with no failover in progress.
///
/// `RedisSentinels::failover` returns as soon as every Sentinel's `GET-MASTER-ADDR-BY-NAME`
/// names the new primary, which the leader answers while it still reconfigures the replicas;
/// its `SENTINEL MASTER(S)` names the old primary until the end, and the `redis` crate's
/// sentinel client, which the library's first connection goes through, reads that one (and
/// the old primary still answers `ROLE` as a master until it is demoted): a client that
/// connects in between writes to the old primary, and the write is lost when it is demoted.
/// Without this wait the test fails for that reason (a library matter, reported).
fn settled(deployment: &RedisSentinels, new: u16) {
    eventually(LIMIT, "the failover is over on every Sentinel", || {
        deployment.sentinel_urls().iter().all(|url| {
            let master: Option<std::collections::HashMap<String, String>> =
                redis::Client::open(url.as_str())
                    .and_then(|c| c.get_connection())
                    .and_then(|mut c| {
                        redis::cmd("SENTINEL")
                            .arg("MASTER")
                            .arg(deployment.master_name())
                            .query(&mut c)
                    })
                    .ok();
            master.is_some_and(|m| {
                m.get("port").map(String::as_str) == Some(new.to_string().as_str())
                    && !m
                        .get("flags")
                        .is_some_and(|f| f.contains("failover_in_progress"))
            })
        })
    });
}

/// `redsem --url URL doctor --json`: the outcome and its report.
fn doctor(url: &str) -> (Outcome, serde_json::Value) {
    doctor_with(url, &[])
}

/// `redsem --url URL OPTIONS... doctor --json`.
fn doctor_with(url: &str, options: &[&str]) -> (Outcome, serde_json::Value) {
    let mut args = options.to_vec();
    args.extend(["doctor", "--json"]);
    let out = finish(redsem(url, &args));
    assert!(out.stderr.is_empty(), "nothing on stderr: {out:?}");
    let report = serde_json::from_str(&out.stdout).unwrap_or_else(|e| panic!("{e}: {out:?}"));
    (out, report)
}

/// The rows of `check` in a `doctor --json` report: `(node, status, detail)`.
fn rows(report: &serde_json::Value, check: &str) -> Vec<(String, String, String)> {
    let text = |v: &serde_json::Value| v.as_str().unwrap_or_default().to_owned();
    report["checks"]
        .as_array()
        .expect("checks is an array")
        .iter()
        .filter(|c| c["check"] == check)
        .map(|c| (text(&c["node"]), text(&c["status"]), text(&c["detail"])))
        .collect()
}

#[test]
fn doctor_checks_every_primary_of_a_cluster_and_names_the_node_with_an_allkeys_policy() {
    let cluster = RedisCluster::start(3);
    let url = cluster_url(&cluster);
    let nodes: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|n| format!("127.0.0.1:{}", n.port()))
        .collect();

    let (out, report) = doctor(&url);
    assert_eq!(out.code(), 1, "only warnings: {out:?}");
    assert_eq!(report["worst"], "warn", "{report}");
    for check in [
        "version",
        "maxmemory-policy",
        "persistence",
        "replication",
        "clock",
    ] {
        let found = rows(&report, check);
        let mut named: Vec<&str> = found.iter().map(|(node, ..)| node.as_str()).collect();
        named.sort_unstable();
        let mut expected: Vec<&str> = nodes.iter().map(String::as_str).collect();
        expected.sort_unstable();
        assert_eq!(named, expected, "{check}: one row per primary: {report}");
        let status = if check == "persistence" { "warn" } else { "ok" };
        assert!(
            found.iter().all(|(_, s, _)| s == status),
            "{check} {status} on every primary: {report}"
        );
    }
    let cluster_rows = rows(&report, "cluster");
    assert_eq!(cluster_rows.len(), 1, "{report}");
    let (node, status, detail) = &cluster_rows[0];
    assert_eq!((node.as_str(), status.as_str()), ("", "ok"), "{report}");
    assert!(detail.contains("16384 of 16384 slots assigned"), "{detail}");
    assert_eq!(rows(&report, "acl")[0].1, "ok", "{report}");

    let table = finish(redsem(&url, &["doctor"]));
    assert_eq!(table.code(), 1, "{table:?}");
    assert!(table.stdout.contains("\n\nCHECK"), "{table:?}");
    assert!(
        table
            .stdout
            .lines()
            .any(|l| l.starts_with("persistence") && l.contains(&format!("{}: none", nodes[1]))),
        "the table names the node in its detail: {table:?}"
    );

    let evicting = &cluster.nodes()[1];
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("maxmemory-policy")
        .arg("allkeys-lru")
        .query(&mut evicting.connection())
        .expect("CONFIG SET");
    let (out, report) = doctor(&url);
    assert_eq!(out.code(), 78, "{out:?}");
    assert_eq!(report["worst"], "fail", "{report}");
    let eviction = rows(&report, "maxmemory-policy");
    let failed: Vec<&(String, String, String)> =
        eviction.iter().filter(|(_, s, _)| s == "fail").collect();
    assert_eq!(failed.len(), 1, "{report}");
    let (node, _, detail) = failed[0];
    assert_eq!(node, &nodes[1], "{report}");
    assert!(detail.contains("allkeys-lru"), "{detail}");
    assert!(detail.contains(&nodes[1]), "{detail}");
    assert_eq!(
        eviction.iter().filter(|(_, s, _)| s == "ok").count(),
        2,
        "{report}"
    );
}

#[test]
fn a_malformed_cluster_or_sentinel_url_is_a_one_line_usage_error() {
    for (url, says) in [
        ("redis+sentinel://127.0.0.1:26379", "no master name"),
        (
            "redis+cluster://127.0.0.1:7000,,127.0.0.1:7001",
            "empty host",
        ),
        ("redis+cluster://a:pw@127.0.0.1:7000/2", "only database 0"),
    ] {
        let out = finish(redsem(url, &["status"])).expect(2);
        assert!(out.error().contains(says), "{url}: {out:?}");
        assert!(!out.stderr.contains("pw@"), "{out:?}");
        // `run` keeps 1 and 2 for its command: its own usage errors exit 125.
        finish(redsem(url, &["run", "x", "-l", "1", "--", "true"])).expect(125);
    }
}

#[test]
fn unreachable_cluster_and_sentinel_urls_and_an_unknown_master_exit_69() {
    let (a, b) = (crate::support::closed_port(), crate::support::closed_port());
    for url in [
        format!("redis+cluster://127.0.0.1:{a},127.0.0.1:{b}"),
        format!("redis+sentinel://127.0.0.1:{a},127.0.0.1:{b}/mymaster"),
    ] {
        let out = finish(redsem(&url, &["status"])).expect(69);
        assert!(out.error().starts_with("cannot reach Redis at"), "{out:?}");
    }
    let deployment = RedisSentinels::start();
    let url = deployment.url().replace(deployment.master_name(), "nosuch");
    let out = finish(redsem(&url, &["status"])).expect(69);
    assert!(out.error().contains("\"nosuch\""), "{out:?}");
    let out = finish(redsem(&url, &["doctor"])).expect(69);
    assert!(out.error().contains("\"nosuch\""), "{out:?}");
}

#[test]
fn doctor_behind_sentinels_checks_the_primary_and_reports_the_sentinels_and_replicas() {
    let deployment = RedisSentinels::start();
    let primary = format!("127.0.0.1:{}", deployment.primary().port());
    let (out, report) = doctor(&deployment.url());
    assert_eq!(out.code(), 1, "persistence is off in the kit: {out:?}");
    for check in ["version", "maxmemory-policy", "replication", "clock"] {
        let found = rows(&report, check);
        assert_eq!(found.len(), 1, "{check}: {report}");
        assert_eq!(
            found[0].0, primary,
            "{check} is about the primary: {report}"
        );
        // replication warns if a replica lags on a busy machine: not a failure.
        assert_ne!(found[0].1, "fail", "{check}: {report}");
    }
    let replication = &rows(&report, "replication")[0].2;
    for replica in deployment.nodes().iter().skip(1) {
        let port = replica.port().to_string();
        assert!(replication.contains(&port), "{replication}");
    }
    let sentinel = rows(&report, "sentinel");
    assert_eq!(sentinel.len(), 1, "{report}");
    let (_, status, detail) = &sentinel[0];
    assert_ne!(status, "fail", "{report}");
    assert!(detail.contains("3 of 3 Sentinels answer"), "{detail}");
    assert!(detail.contains(&format!("naming {primary}")), "{detail}");
    assert!(detail.contains("quorum 2"), "{detail}");
    assert!(detail.contains("2 replica(s) known"), "{detail}");
    for replica in deployment.nodes().iter().skip(1) {
        assert!(
            detail.contains(&format!("127.0.0.1:{} link ok", replica.port())),
            "{detail}"
        );
    }

    // min-replicas-to-write is advised (the kit's servers run without it), then passes.
    let advice = rows(&report, "min-replicas");
    assert_eq!(advice.len(), 1, "{report}");
    assert_eq!(advice[0].1, "warn", "{report}");
    assert!(
        advice[0].2.contains("set min-replicas-to-write 1"),
        "{report}"
    );
    let () = redis::cmd("CONFIG")
        .arg("SET")
        .arg("min-replicas-to-write")
        .arg(1)
        .query(&mut deployment.primary().connection())
        .expect("CONFIG SET min-replicas-to-write");
    let (_, report) = doctor(&deployment.url());
    let advice = rows(&report, "min-replicas");
    assert_eq!(advice[0].1, "ok", "{report}");
    assert!(advice[0].2.contains("min-replicas-to-write 1"), "{report}");

    // A Sentinel that is gone is named, as a warning.
    let gone = crate::support::closed_port();
    let url = deployment.url().replacen(
        "redis+sentinel://",
        &format!("redis+sentinel://127.0.0.1:{gone},"),
        1,
    );
    let (_, report) = doctor(&url);
    let (_, status, detail) = &rows(&report, "sentinel")[0];
    assert_eq!(status, "warn", "{report}");
    assert!(detail.contains(&format!("127.0.0.1:{gone}")), "{detail}");
    assert!(detail.contains("3 of 4 Sentinels answer"), "{detail}");
}

#[test]
fn with_replica_acks_a_grant_no_replica_acknowledges_is_given_back_and_exits_75() {
    let alone = RedisServer::start();
    let url = alone.url();
    let args = words("--replica-acks 1/50ms run jobs -l 1 -- echo never");
    let out = finish(redsem(&url, &args)).expect(75);
    assert!(out.stdout.is_empty(), "the command never ran: {out:?}");
    assert!(out.error().contains("0 of the 1 replicas"), "{out:?}");
    assert!(out.error().contains("given back"), "{out:?}");
    let now = status(&url, "jobs");
    assert_eq!(
        now["holders"],
        serde_json::json!([]),
        "nothing is held: {now}"
    );
    // Without the option the same server grants at once.
    finish(redsem(&url, &["run", "jobs", "-l", "1", "--", "true"])).success();
    // The environment spells it too.
    let mut cmd = redsem(&url, &["acquire", "jobs", "-l", "1"]);
    cmd.env("REDSEM_REPLICA_ACKS", "1/50ms");
    finish(cmd).expect(75);
}

#[test]
fn with_replica_acks_run_holds_and_releases_a_permit_the_replica_acknowledged() {
    let primary = RedisServer::start();
    let _replica = RedisServer::start_replica_of(&primary);
    online(&primary, 1);
    let url = primary.url();
    let mut args = words("--replica-acks 1 run jobs -l 1 --lease 3s -- sh -c");
    args.push("sleep 0.5; echo \"$REDSEM_TOKEN\"");
    let out = finish(redsem(&url, &args)).success();
    assert!(!out.stdout.trim().is_empty(), "{out:?}");
    let now = status(&url, "jobs");
    assert_eq!(now["holders"], serde_json::json!([]), "released: {now}");
}

/// Wait until `primary` counts `n` replicas online (its own view, which `WAIT` and `doctor`
/// go by; a replica may see its link up a moment before).
fn online(primary: &RedisServer, n: usize) {
    eventually(LIMIT, "the primary sees its replicas online", || {
        primary.info("replication").matches("state=online").count() >= n
    });
}

#[test]
fn a_malformed_replica_acks_is_a_usage_error() {
    for bad in ["two", "1/forever", "1/10s", "-1"] {
        let out = finish(bare(&[&format!("--replica-acks={bad}"), "status"])).expect(2);
        assert!(out.error().contains("--replica-acks"), "{bad}: {out:?}");
    }
    // A wait for the replicas longer than a third of the lease, before anything is sent.
    let url = format!("redis://127.0.0.1:{}", crate::support::closed_port());
    let out = finish(redsem(
        &url,
        &words("--replica-acks 1/1s acquire x -l 1 --lease 2s"),
    ));
    let out = out.expect(2);
    assert!(out.error().contains("a third of --lease"), "{out:?}");
    let out = finish(redsem(
        &url,
        &words("--replica-acks 1/1s lock x --lease 2s -- true"),
    ));
    out.expect(125);
}

#[test]
fn doctor_with_replica_acks_fails_a_user_who_may_not_run_wait() {
    let server =
        RedisServer::start_with(&["--user", "app", "on", ">pw", "~*", "&*", "+@all", "-wait"]);
    let url = format!("redis://app:pw@127.0.0.1:{}", server.port());
    let (_, report) = doctor_with(&url, &["--replica-acks", "1"]);
    let acl = rows(&report, "acl");
    assert!(
        acl.iter()
            .any(|(_, status, detail)| status == "fail" && detail.contains("+wait")),
        "{report}"
    );
    let (_, report) = doctor(&url);
    assert!(
        rows(&report, "acl")
            .iter()
            .all(|(_, status, _)| status == "ok"),
        "WAIT is only needed with --replica-acks: {report}"
    );
}

#[test]
fn doctor_fails_replica_acks_the_primary_cannot_get() {
    let primary = RedisServer::start_with(&["--appendonly", "yes"]);
    let (out, report) = doctor_with(&primary.url(), &["--replica-acks", "1"]);
    assert_eq!(out.code(), 78, "{out:?}");
    let (_, status, detail) = &rows(&report, "replication")[0];
    assert_eq!(status, "fail", "{report}");
    assert!(detail.contains("without replicas"), "{detail}");

    let _replica = RedisServer::start_replica_of(&primary);
    online(&primary, 1);
    let (_, report) = doctor_with(&primary.url(), &["--replica-acks", "1"]);
    let (_, status, detail) = &rows(&report, "replication")[0];
    // ok, or warn if the replica lags on a busy machine: not a failure.
    assert_ne!(status, "fail", "{report}");
    assert!(
        detail.contains("each change waits for 1 replica(s)"),
        "{detail}"
    );
    let (out, report) = doctor_with(&primary.url(), &["--replica-acks", "2"]);
    assert_eq!(out.code(), 78, "{out:?}");
    let (_, _, detail) = &rows(&report, "replication")[0];
    assert!(
        detail.contains("--replica-acks 2 but 1 of 1 replica(s) online"),
        "{detail}"
    );
}

#[test]
fn run_and_doctor_reach_a_tls_cluster_with_tls_ca() {
    let tls = redsem_test::TlsRedisCluster::start(3);
    let url = tls.tls_url();
    let ca = tls.ca_cert().display().to_string();

    let mut args = vec!["--tls-ca", &ca];
    args.extend(words("run jobs --limit 1 -- sh -c"));
    args.push("echo token $REDSEM_TOKEN");
    let out = finish(redsem(&url, &args)).success();
    assert!(out.stdout.starts_with("token "), "{out:?}");

    // Every primary is checked over TLS too: one row per node, by its TLS port.
    let (out, report) = doctor_with(&url, &["--tls-ca", &ca]);
    assert_eq!(out.code(), 1, "only warnings (no persistence): {out:?}");
    let mut named: Vec<String> = rows(&report, "version")
        .into_iter()
        .map(|(node, ..)| node)
        .collect();
    named.sort_unstable();
    let mut tls_nodes: Vec<&str> = url
        .trim_start_matches("rediss+cluster://")
        .split(',')
        .collect();
    tls_nodes.sort_unstable();
    assert_eq!(named, tls_nodes, "one version row per primary: {report}");

    // Without the CA the nodes' certificate is not trusted: unreachable, exit 69.
    finish(redsem(&url, &["run", "jobs", "--limit", "1", "--", "true"])).expect(69);
}
