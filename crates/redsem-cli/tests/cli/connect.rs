use redsem::redis;
use redsem_test::{RedisServer, TlsRedisServer};

use crate::support::{bare, closed_port, finish};

#[test]
fn a_user_and_password_in_the_url_are_used_and_never_shown() {
    // An ACL user besides the default one, so the harness can still PING without a password.
    let server = RedisServer::start_with(&["--user", "app", "on", ">s3cret", "~*", "&*", "+@all"]);
    let port = server.port();
    let good = format!("redis://app:s3cret@127.0.0.1:{port}");
    let out = finish(bare(&["--url", &good, "acquire", "jobs", "--limit", "1"])).success();
    assert_eq!(out.stdout.trim().len(), 32);

    let wrong = format!("redis://app:wrong-secret@127.0.0.1:{port}");
    let out = finish(bare(&["--url", &wrong, "status"]));
    assert_ne!(out.code(), 0);
    out.assert_one_error_line();
    assert!(!out.stderr.contains("wrong-secret"), "{out:?}");

    let unreachable = format!("redis://app:s3cret@127.0.0.1:{}", closed_port());
    let out = finish(bare(&["--url", &unreachable, "status"])).expect(69);
    assert!(!out.stderr.contains("s3cret"), "{out:?}");
    assert!(out.error().contains("app:***@"), "{out:?}");
}

#[test]
fn rediss_urls_connect_over_tls_trusting_the_ca_given_by_tls_ca_or_its_env_var() {
    let tls = TlsRedisServer::start();
    let url = tls.tls_url();
    let ca = tls.ca_cert().to_string_lossy().into_owned();
    let out = finish(bare(&[
        "--url", &url, "--tls-ca", &ca, "acquire", "jobs", "--limit", "1", "--json",
    ]))
    .success();
    assert!(out.stdout.contains("\"token\":1"), "{out:?}");

    let mut from_env = bare(&["--url", &url, "status", "jobs"]);
    from_env.env("REDSEM_TLS_CA", &ca);
    let out = finish(from_env).success();
    assert!(out.stdout.contains("\n\njobs: 1 of 1 in use"), "{out:?}");

    let mut latch = bare(&["latch", "ready", "set", "2"]);
    latch.env("REDIS_URL", &url).env("REDSEM_TLS_CA", &ca);
    finish(latch).success();
    let count: u64 = redis::cmd("GET")
        .arg("redsem:{latch:ready}:count")
        .query(&mut tls.server.connection())
        .expect("the latch, seen through the plain port");
    assert_eq!(count, 2);
}

#[test]
fn a_self_signed_certificate_is_refused_with_exit_69_unless_its_ca_is_trusted() {
    let tls = TlsRedisServer::start();
    let url = tls.tls_url();
    let out = finish(bare(&["--url", &url, "status", "jobs"])).expect(69);
    assert!(out.error().contains(&url), "{out:?}");
    assert!(out.error().contains("certificate"), "{out:?}");
    assert!(out.error().contains("--tls-ca"), "{out:?}");

    let other = TlsRedisServer::start();
    let wrong_ca = other.ca_cert().to_string_lossy().into_owned();
    let out = finish(bare(&["--url", &url, "--tls-ca", &wrong_ca, "status"])).expect(69);
    assert!(out.error().contains("certificate"), "{out:?}");
    assert!(out.error().contains(&wrong_ca), "{out:?}");
}

#[test]
fn tls_options_that_would_weaken_or_skip_tls_are_usage_errors() {
    let tls = TlsRedisServer::start();
    let ca = tls.ca_cert().to_string_lossy().into_owned();
    let insecure = format!("{}#insecure", tls.tls_url());
    let out = finish(bare(&["--url", &insecure, "status"])).expect(2);
    assert!(out.error().contains("#insecure"), "{out:?}");
    assert!(out.error().contains("--tls-ca"), "{out:?}");

    let plain = tls.server.url();
    let out = finish(bare(&["--url", &plain, "--tls-ca", &ca, "status"])).expect(2);
    assert!(out.error().contains("rediss://"), "{out:?}");

    let missing = tls.server.dir().join("no-such-ca.pem");
    let missing = missing.to_string_lossy();
    let out = finish(bare(&[
        "--url",
        &tls.tls_url(),
        "--tls-ca",
        &missing,
        "status",
    ]))
    .expect(2);
    assert!(out.error().contains("no-such-ca.pem"), "{out:?}");

    let out = finish(bare(&["--url", &tls.tls_url(), "--tls-ca", "", "status"])).expect(2);
    assert!(out.error().contains("must not be empty"), "{out:?}");
}

#[test]
fn a_server_that_may_evict_live_state_is_refused_with_exit_78_unless_told_otherwise() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let url = server.url();
    let out = finish(bare(&["--url", &url, "acquire", "jobs", "--limit", "1"])).expect(78);
    assert!(out.error().contains("maxmemory-policy"), "{out:?}");
    assert!(out.error().contains("allkeys-lru"), "{out:?}");
    assert!(out.error().contains("noeviction"), "{out:?}");
    assert!(out.error().contains("--server-checks warn"), "{out:?}");
    finish(bare(&["--url", &url, "--server-checks", "warn", "status"])).success();
    let mut off = bare(&["--url", &url, "status"]);
    off.env("REDSEM_SERVER_CHECKS", "off");
    finish(off).success();
    let out = finish(bare(&["--url", &url, "--server-checks", "maybe", "status"])).expect(2);
    assert!(out.error().contains("enforce"), "{out:?}");
}

#[test]
fn a_user_without_rights_on_redsems_channels_is_refused_with_exit_78_naming_them() {
    let server = RedisServer::start_with(&["--user", "app", "on", ">pw", "~*", "+@all"]);
    let url = format!("redis://app:pw@127.0.0.1:{}", server.port());
    let out = finish(bare(&["--url", &url, "--prefix", "jobs", "status"])).expect(78);
    assert!(out.error().contains("&jobs:*"), "{out:?}");
    assert!(!out.stderr.contains(":pw@"), "{out:?}");
}

#[test]
fn a_prefix_with_braces_is_a_usage_error() {
    let server = RedisServer::start();
    let out = finish(bare(&[
        "--url",
        &server.url(),
        "--prefix",
        "app{1}",
        "status",
    ]))
    .expect(2);
    assert!(out.error().contains("brace"), "{out:?}");
}
