//! `serve` over HTTP (`/metrics`, `/`, `/status.json`) and `status --watch`.

use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::thread;
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use redsem_test::{FaultProxy, RedisServer, eventually};

use crate::support::{LIMIT, Running, World, bare, finish, listen_port};

/// `GET path` on `127.0.0.1:port` (HTTP/1.0, the connection closed by the server): the status
/// code and the body. Connecting is retried until the server listens (at most [`LIMIT`]).
pub(crate) fn get(port: u16, path: &str) -> (u16, String) {
    let deadline = Instant::now() + LIMIT;
    let mut stream = loop {
        match TcpStream::connect(("127.0.0.1", port)) {
            Ok(stream) => break stream,
            Err(e) => {
                assert!(Instant::now() < deadline, "nothing listens on {port}: {e}");
                thread::sleep(Duration::from_millis(10));
            }
        }
    };
    stream.set_read_timeout(Some(LIMIT)).expect("read timeout");
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").expect("send request");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("read the reply");
    let (head, body) = reply.split_once("\r\n\r\n").expect("headers end");
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status code in {head:?}"));
    (code, body.to_owned())
}

/// The value of the series `series` (`name{labels}`) in a Prometheus text body.
fn value(metrics: &str, series: &str) -> f64 {
    metrics
        .lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in:\n{metrics}"))
}

#[test]
fn serve_shows_three_holders_and_five_waiters_over_http() {
    let world = World::new();
    for holder in ["web-1", "web-2", "batch-7"] {
        world.acquire("demo", 3, &["--lease", "1m", "--holder", holder]);
    }
    // Queued one after the other, so the queue's order is known.
    let mut waiters: Vec<Running> = Vec::new();
    for i in 1..=5u64 {
        let label = format!("worker-{i}");
        waiters.push(world.start(&[
            "-q", "acquire", "demo", "--limit", "3", "--lease", "1m", "--holder", &label,
        ]));
        world.wait_for_waiters("demo", i);
    }
    let status = world.status("demo");
    let port = listen_port();
    let listen = format!("127.0.0.1:{port}");
    let serve = world.start(&["serve", "--listen", &listen, "--refresh", "1s"]);

    let (code, metrics) = get(port, "/metrics");
    assert_eq!(code, 200);
    assert_eq!(value(&metrics, "redsem_up"), 1.0);
    assert_eq!(value(&metrics, "redsem_semaphores"), 1.0);
    for (family, expected) in [
        ("capacity", 3.0),
        ("used", 3.0),
        ("holders", 3.0),
        ("waiters", 5.0),
    ] {
        let series = format!("redsem_semaphore_{family}{{name=\"demo\"}}");
        assert_eq!(value(&metrics, &series), expected, "{series}");
    }
    let oldest = value(
        &metrics,
        "redsem_semaphore_oldest_wait_seconds{name=\"demo\"}",
    );
    assert!(oldest > 0.0 && oldest < 60.0, "{oldest}");
    let next = value(
        &metrics,
        "redsem_semaphore_next_lease_end_seconds{name=\"demo\"}",
    );
    assert!(next > 0.0 && next <= 60.0, "{next}");
    assert!(metrics.contains("# TYPE redsem_semaphore_waiters gauge"));
    // No module on this server: the scripts serve.
    assert_eq!(value(&metrics, "redsem_engine{engine=\"scripts\"}"), 1.0);
    assert_eq!(value(&metrics, "redsem_engine{engine=\"native\"}"), 0.0);

    let (code, page) = get(port, "/");
    assert_eq!(code, 200);
    assert!(
        page.contains("<meta http-equiv=\"refresh\" content=\"1\">"),
        "{page}"
    );
    assert!(page.contains("3 of 3 in use · 5 waiting"), "{page}");
    assert!(page.contains("</code>, engine scripts</p>"), "{page}");
    for holder in status["holders"].as_array().expect("holders") {
        let token = holder["token"].to_string();
        assert!(
            page.contains(&format!(">{token}<")),
            "token {token} on the page"
        );
    }
    // The queue in order: each waiter's id after the one before it.
    let mut from = 0;
    for waiter in status["waiters"].as_array().expect("waiters") {
        let id = waiter["id"].as_str().expect("id");
        let at = page[from..]
            .find(id)
            .unwrap_or_else(|| panic!("waiter {id} not after position {from}: {page}"));
        from += at + id.len();
    }
    for i in 1..=5 {
        assert!(page.contains(&format!("worker-{i}")), "{page}");
    }

    let (code, json) = get(port, "/status.json");
    assert_eq!(code, 200);
    let json: serde_json::Value = serde_json::from_str(&json).expect("JSON");
    assert_eq!(json[0]["name"], "demo");
    assert_eq!(json[0]["holders"].as_array().map(Vec::len), Some(3));
    assert_eq!(json[0]["waiters"].as_array().map(Vec::len), Some(5));
    assert_eq!(json[0]["engine"], serde_json::json!({"name": "scripts"}));

    let (code, _) = get(port, "/nothing-here");
    assert_eq!(code, 404);

    serve.signal(Signal::SIGTERM);
    let out = serve.wait();
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(out.stderr.contains(&format!("http://{listen}/")), "{out:?}");
    drop(waiters);
}

#[test]
fn serve_shows_only_the_names_given() {
    let world = World::new();
    world.acquire("shown", 1, &["--lease", "1m"]);
    world.acquire("hidden", 1, &["--lease", "1m"]);
    let port = listen_port();
    let serve = world.start(&["serve", "--listen", &format!("127.0.0.1:{port}"), "shown"]);
    let (_, metrics) = get(port, "/metrics");
    assert_eq!(
        value(&metrics, "redsem_semaphore_used{name=\"shown\"}"),
        1.0
    );
    assert!(!metrics.contains("name=\"hidden\""), "{metrics}");
    serve.signal(Signal::SIGINT);
    assert_eq!(serve.wait().code(), 0);
}

#[test]
fn serve_says_when_it_cannot_listen() {
    let world = World::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = taken.local_addr().expect("addr").to_string();
    let out = world.run(&["serve", "--listen", &addr]).expect(1);
    assert!(
        out.error().contains(&format!("cannot listen on {addr}")),
        "{out:?}"
    );
}

#[test]
fn status_watch_prints_a_view_per_turn_until_interrupted() {
    let world = World::new();
    world.acquire("watched", 2, &["--lease", "1m", "--holder", "web-1"]);
    let watch = world.start(&["status", "watched", "--watch", "100ms", "--json"]);
    // The subject is the period itself: a few turns of it.
    thread::sleep(Duration::from_millis(700));
    watch.signal(Signal::SIGINT);
    let out = watch.wait();
    assert_eq!(out.code(), 0, "{out:?}");
    let views: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}")))
        .collect();
    assert!(views.len() >= 2, "one JSON line per turn: {out:?}");
    for view in &views {
        assert_eq!(view["holders"][0]["label"], "web-1");
    }
}

#[test]
fn status_watch_off_a_terminal_prints_each_table_after_the_last() {
    let world = World::new();
    world.acquire("watched", 2, &["--lease", "1m"]);
    let watch = world.start(&["status", "watched", "--watch", "100ms"]);
    thread::sleep(Duration::from_millis(700));
    watch.signal(Signal::SIGTERM);
    let out = watch.wait();
    assert_eq!(out.code(), 0, "{out:?}");
    let views = out
        .stdout
        .matches("watched: 1 of 2 in use, 0 waiting")
        .count();
    assert!(views >= 2, "{out:?}");
    assert!(
        !out.stdout.contains('\x1b'),
        "no screen control off a terminal: {out:?}"
    );
}

#[test]
fn serve_starts_without_redis_reports_it_down_and_up_once_redis_answers() {
    // A server behind a proxy that refuses it: nothing answers at the URL yet. (Not a stopped
    // server: its port, free, may be handed to another test's server meanwhile.)
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    proxy.set_refusing(true);
    let url = proxy.url();
    let port = listen_port();
    let listen = format!("127.0.0.1:{port}");
    let serve = Running::start(bare(&["--url", &url, "serve", "--listen", &listen]));

    let (code, metrics) = get(port, "/metrics");
    assert_eq!(code, 200, "{metrics}");
    assert_eq!(value(&metrics, "redsem_up"), 0.0, "{metrics}");
    assert!(!metrics.contains("redsem_semaphores"), "{metrics}");
    assert!(
        !metrics.contains("redsem_engine"),
        "no engine yet: {metrics}"
    );
    let (code, page) = get(port, "/");
    assert_eq!(code, 200, "{page}");
    assert!(
        page.contains(&format!("cannot reach Redis at {url}")),
        "the page says why: {page}"
    );
    assert!(page.contains(&format!("<code>{url}</code>")), "{page}");
    let (code, body) = get(port, "/status.json");
    assert_eq!(code, 503, "{body}");

    proxy.set_refusing(false);
    finish(bare(&[
        "--url", &url, "acquire", "jobs", "--limit", "2", "--lease", "1m",
    ]))
    .success();
    let mut metrics = String::new();
    eventually(LIMIT, "serve reads Redis once it answers", || {
        metrics = get(port, "/metrics").1;
        value(&metrics, "redsem_up") == 1.0
    });
    assert_eq!(
        value(&metrics, "redsem_semaphore_used{name=\"jobs\"}"),
        1.0,
        "{metrics}"
    );
    let (code, body) = get(port, "/status.json");
    assert_eq!(code, 200, "{body}");

    serve.signal(Signal::SIGTERM);
    let out = serve.wait();
    assert_eq!(out.code(), 0, "{out:?}");
    assert!(out.stderr.contains("serving anyway"), "{out:?}");
    assert!(
        out.stderr.contains(&format!("Redis at {url} answers now")),
        "{out:?}"
    );
}

#[test]
fn status_and_doctor_name_the_server_they_read_without_its_password() {
    // An ACL user besides the default one, so the harness can still PING without a password.
    let server = RedisServer::start_with(&["--user", "app", "on", ">s3cret", "~*", "&*", "+@all"]);
    let port = server.port();
    let url = format!("redis://app:s3cret@127.0.0.1:{port}");
    let shown = format!("redis://app:***@127.0.0.1:{port}");
    let header = format!("server {shown}, prefix redsem");
    let redsem = |args: &[&str]| {
        let mut all = vec!["--url", url.as_str()];
        all.extend_from_slice(args);
        let out = finish(bare(&all));
        assert!(!out.stdout.contains("s3cret"), "{out:?}");
        assert!(!out.stderr.contains("s3cret"), "{out:?}");
        out
    };
    redsem(&["acquire", "jobs", "--limit", "2"]).success();

    for args in [&["status", "jobs"][..], &["status"]] {
        let out = redsem(args).success();
        assert_eq!(out.stdout.lines().next(), Some(header.as_str()), "{out:?}");
    }
    let one: serde_json::Value =
        serde_json::from_str(&redsem(&["status", "jobs", "--json"]).success().stdout)
            .expect("JSON");
    assert_eq!(one["server"], shown.as_str(), "{one}");
    let all: serde_json::Value =
        serde_json::from_str(&redsem(&["status", "--json"]).success().stdout).expect("JSON");
    assert_eq!(all[0]["server"], shown.as_str(), "{all}");

    let out = redsem(&["doctor"]);
    assert_eq!(out.stdout.lines().next(), Some(header.as_str()), "{out:?}");
    let report: serde_json::Value =
        serde_json::from_str(&redsem(&["doctor", "--json"]).stdout).expect("JSON");
    assert_eq!(report["server"], shown.as_str(), "{report}");
}

#[test]
fn the_default_url_is_named_at_v_when_neither_url_nor_redis_url_is_given() {
    let said = "no --url or REDIS_URL: using the default, redis://127.0.0.1:6379";
    // `completions` does not connect: nothing reaches the Redis on 6379, if any.
    let out = finish(bare(&["-v", "completions", "bash"])).success();
    assert!(out.stderr.contains(said), "{out:?}");
    let out = finish(bare(&[
        "--url",
        "redis://127.0.0.1:1",
        "-v",
        "completions",
        "bash",
    ]))
    .success();
    assert!(!out.stderr.contains(said), "{out:?}");
    let mut from_env = bare(&["-v", "completions", "bash"]);
    from_env.env("REDIS_URL", "redis://127.0.0.1:1");
    let out = finish(from_env).success();
    assert!(!out.stderr.contains(said), "{out:?}");
}
