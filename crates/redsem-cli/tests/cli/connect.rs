use std::process::Command;

use redsem_test::RedisServer;

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
fn rediss_urls_connect_over_tls() {
    let certs = tempfile::tempdir().expect("temp dir");
    let (cert, key) = (certs.path().join("cert.pem"), certs.path().join("key.pem"));
    let made = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args(["-subj", "/CN=localhost", "-keyout"])
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("openssl makes a self-signed certificate");
    assert!(made.status.success(), "{made:?}");
    let tls_port = closed_port().to_string();
    let (cert, key) = (cert.to_string_lossy(), key.to_string_lossy());
    let _server = RedisServer::start_with(&[
        "--tls-port",
        &tls_port,
        "--tls-cert-file",
        &cert,
        "--tls-key-file",
        &key,
        "--tls-auth-clients",
        "no",
    ]);
    // `#insecure`: the certificate is self-signed, so only the encryption is checked here.
    let url = format!("rediss://127.0.0.1:{tls_port}/#insecure");
    let out = finish(bare(&[
        "--url", &url, "acquire", "jobs", "--limit", "1", "--json",
    ]))
    .success();
    assert!(out.stdout.contains("\"token\":1"), "{out:?}");
    let out = finish(bare(&["--url", &url, "status", "jobs"])).success();
    assert!(out.stdout.starts_with("jobs: 1 of 1 in use"), "{out:?}");
}
