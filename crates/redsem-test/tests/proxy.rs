//! Tests of `FaultProxy` in front of a real `redis-server`.

use std::net::TcpListener;
use std::time::{Duration, Instant};

use redis::Commands;
use redsem_test::{FaultProxy, RedisServer, eventually, within};

const LIMIT: Duration = Duration::from_secs(5);

/// A sync connection to `url` whose reads give up after `LIMIT`.
fn connect(url: &str) -> redis::RedisResult<redis::Connection> {
    let con = redis::Client::open(url)?.get_connection_with_timeout(LIMIT)?;
    con.set_read_timeout(Some(LIMIT))?;
    Ok(con)
}

fn ping(con: &mut redis::Connection) -> redis::RedisResult<String> {
    redis::cmd("PING").query(con)
}

/// How many clients the server has, not counting the connection that asks.
fn clients_of(server: &RedisServer) -> usize {
    let list: String = redis::cmd("CLIENT")
        .arg("LIST")
        .query(&mut server.connection())
        .expect("CLIENT LIST");
    list.lines().count() - 1
}

fn counter(server: &RedisServer, key: &str) -> Option<i64> {
    server.connection().get(key).expect("GET on the server")
}

#[test]
fn the_proxy_forwards_and_counts_its_connections() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    assert_ne!(proxy.port(), server.port());
    assert_eq!(proxy.target_port(), server.port());
    assert_eq!(proxy.url(), format!("redis://127.0.0.1:{}/", proxy.port()));
    assert_eq!(proxy.connections(), 0);

    let mut first = connect(&proxy.url()).expect("connect through the proxy");
    let () = first.set("k", "v").expect("SET through the proxy");
    let mut second = connect(&proxy.url()).expect("connect through the proxy");
    let value: String = second.get("k").expect("GET through the proxy");
    assert_eq!(value, "v");
    // A large value crosses the proxy in many chunks.
    let big = "x".repeat(1 << 20);
    let () = first.set("big", &big).expect("SET 1 MiB");
    let back: String = second.get("big").expect("GET 1 MiB");
    assert!(back == big, "1 MiB came back altered");
    assert_eq!(proxy.connections(), 2);
    assert_eq!(clients_of(&server), 2);

    drop(first);
    eventually(LIMIT, "a closed client's connection is gone", || {
        proxy.connections() == 1
    });
    eventually(LIMIT, "the server sees the client leave", || {
        clients_of(&server) == 1
    });
}

#[test]
fn cut_all_closes_every_open_connection_and_new_ones_still_work() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut cons: Vec<redis::Connection> = (0..3)
        .map(|_| connect(&proxy.url()).expect("connect through the proxy"))
        .collect();
    for con in &mut cons {
        assert_eq!(ping(con).expect("PING"), "PONG");
    }
    assert_eq!(proxy.connections(), 3);

    proxy.cut_all();
    assert_eq!(proxy.connections(), 0);
    for con in &mut cons {
        let started = Instant::now();
        let reply = ping(con);
        assert!(reply.is_err(), "PING on a cut connection: {reply:?}");
        assert!(
            started.elapsed() < LIMIT,
            "the client waited for its timeout"
        );
    }
    eventually(LIMIT, "the server sees its clients leave", || {
        clients_of(&server) == 0
    });

    let mut fresh = connect(&proxy.url()).expect("connect after cut_all");
    assert_eq!(ping(&mut fresh).expect("PING after cut_all"), "PONG");
}

#[test]
fn a_lost_reply_means_the_command_ran_but_the_client_saw_the_connection_drop() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut con = connect(&proxy.url()).expect("connect through the proxy");
    let n: i64 = con.incr("n", 1).expect("INCR before arming");
    assert_eq!(n, 1);

    // The bytes of the INCR above are still in the proxy's look-behind: they must not match.
    proxy.drop_reply_after(b"INCR");
    assert_eq!(ping(&mut con).expect("PING does not match"), "PONG");
    assert_eq!(proxy.triggered(), 0);

    let started = Instant::now();
    let lost: redis::RedisResult<i64> = con.incr("n", 1);
    assert!(lost.is_err(), "the reply was delivered: {lost:?}");
    assert!(
        started.elapsed() < Duration::from_millis(900),
        "the connection closed when the reply came, not after the 1 s fallback: {:?}",
        started.elapsed()
    );
    assert_eq!(proxy.triggered(), 1);
    assert_eq!(counter(&server, "n"), Some(2), "the INCR did not run");
    assert_eq!(proxy.connections(), 0);

    // One-shot: the next INCR, on a new connection, gets its reply.
    let mut again = connect(&proxy.url()).expect("reconnect");
    let n: i64 = again.incr("n", 1).expect("INCR after the fault");
    assert_eq!(n, 3);
    assert_eq!(proxy.triggered(), 1);
}

#[test]
fn a_pattern_is_found_in_the_arguments_and_across_two_writes() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut raw = std::net::TcpStream::connect(("127.0.0.1", proxy.port())).expect("connect");
    raw.set_read_timeout(Some(LIMIT)).expect("read timeout");
    proxy.drop_reply_after(b"request-42");
    // `SET k request-42`, the pattern split between two writes with a pause between them.
    use std::io::{Read, Write};
    raw.write_all(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$10\r\nreque")
        .expect("write the first half");
    raw.flush().expect("flush");
    std::thread::sleep(Duration::from_millis(50));
    assert_eq!(proxy.triggered(), 0);
    raw.write_all(b"st-42\r\n").expect("write the second half");
    let mut reply = Vec::new();
    let read = raw.read_to_end(&mut reply);
    assert!(
        reply.is_empty(),
        "the reply came through: {:?} ({read:?})",
        String::from_utf8_lossy(&reply)
    );
    assert_eq!(proxy.triggered(), 1);
    let value: String = server.connection().get("k").expect("GET");
    assert_eq!(value, "request-42");
}

#[test]
fn a_lost_reply_that_never_comes_closes_the_connection_after_a_second() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut con = connect(&proxy.url()).expect("connect through the proxy");
    proxy.drop_reply_after(b"BLPOP");
    let started = Instant::now();
    // BLPOP on an empty list with no timeout: the server never answers.
    let reply: redis::RedisResult<Option<(String, String)>> = con.blpop("empty", 0.0);
    let waited = started.elapsed();
    assert!(reply.is_err(), "BLPOP returned: {reply:?}");
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(3),
        "closed after {waited:?}"
    );
    assert_eq!(proxy.triggered(), 1);
}

#[test]
fn set_delay_adds_latency_each_way_and_zero_removes_it() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut con = connect(&proxy.url()).expect("connect through the proxy");
    let delay = Duration::from_millis(100);
    proxy.set_delay(delay);
    let started = Instant::now();
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
    let slow = started.elapsed();
    assert!(slow >= 2 * delay, "one round trip took {slow:?}");

    proxy.set_delay(Duration::ZERO);
    let started = Instant::now();
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
    let fast = started.elapsed();
    assert!(fast < delay, "one round trip without delay took {fast:?}");
}

#[test]
fn a_refusing_proxy_cuts_what_is_open_and_closes_what_comes_until_turned_off() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut open = connect(&proxy.url()).expect("connect through the proxy");
    assert_eq!(ping(&mut open).expect("PING"), "PONG");

    proxy.set_refusing(true);
    assert!(ping(&mut open).is_err(), "an open connection survived");
    for _ in 0..3 {
        let attempt = connect(&proxy.url()).and_then(|mut con| ping(&mut con));
        assert!(attempt.is_err(), "a refusing proxy answered: {attempt:?}");
    }
    assert_eq!(proxy.connections(), 0);
    eventually(LIMIT, "the server sees its client leave", || {
        clients_of(&server) == 0
    });

    proxy.set_refusing(false);
    let mut back = connect(&proxy.url()).expect("connect after refusing");
    assert_eq!(ping(&mut back).expect("PING"), "PONG");
}

#[test]
fn an_outage_before_a_request_keeps_it_from_the_server_until_turned_off() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let mut con = connect(&proxy.url()).expect("connect through the proxy");
    proxy.refuse_before(b"INCR");
    assert_eq!(ping(&mut con).expect("PING does not match"), "PONG");
    assert_eq!(proxy.triggered(), 0);

    let lost: redis::RedisResult<i64> = con.incr("n", 1);
    assert!(lost.is_err(), "the INCR was answered: {lost:?}");
    assert_eq!(proxy.triggered(), 1);
    assert_eq!(counter(&server, "n"), None, "the INCR reached the server");
    let attempt = connect(&proxy.url()).and_then(|mut con| ping(&mut con));
    assert!(
        attempt.is_err(),
        "the proxy answered during the outage: {attempt:?}"
    );

    // One-shot: turned off, the same command goes through.
    proxy.set_refusing(false);
    let mut back = connect(&proxy.url()).expect("connect after the outage");
    let n: i64 = back.incr("n", 1).expect("INCR after the outage");
    assert_eq!(n, 1);
    assert_eq!(proxy.triggered(), 1);
}

#[test]
fn dropping_the_proxy_frees_its_port_and_closes_its_connections() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let port = proxy.port();
    let mut con = connect(&proxy.url()).expect("connect through the proxy");
    proxy.set_delay(Duration::from_secs(30)); // a forwarding thread asleep must not hold Drop up
    let started = Instant::now();
    drop(proxy);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "drop took {:?}",
        started.elapsed()
    );
    assert!(
        TcpListener::bind(("127.0.0.1", port)).is_ok(),
        "port {port} is still taken"
    );
    assert!(ping(&mut con).is_err(), "a connection survived the proxy");
    eventually(LIMIT, "the server sees the proxied client leave", || {
        clients_of(&server) == 0
    });
}

#[test]
fn a_proxy_in_front_of_a_stopped_server_closes_connections_and_works_after_restart() {
    let mut server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    server.stop();
    let attempt = connect(&proxy.url()).and_then(|mut con| ping(&mut con));
    assert!(attempt.is_err(), "a stopped server answered: {attempt:?}");
    server.restart();
    let mut con = connect(&proxy.url()).expect("connect after restart");
    assert_eq!(ping(&mut con).expect("PING"), "PONG");
}

/// From a single-threaded runtime: the proxy needs no help from it. A plain (non-cluster)
/// multiplexed connection does not resend a request whose reply was lost: the caller gets the
/// error and the command ran once.
#[tokio::test(flavor = "current_thread")]
async fn a_multiplexed_connection_reports_a_lost_reply_without_resending() {
    let server = RedisServer::start();
    let proxy = FaultProxy::start(server.port());
    let client = redis::Client::open(proxy.url()).expect("proxy URL");
    let mut con = within(LIMIT, "connect", client.get_multiplexed_async_connection())
        .await
        .expect("connect through the proxy");
    proxy.drop_reply_after(b"INCR");
    let reply: redis::RedisResult<i64> = within(
        LIMIT,
        "INCR with a lost reply",
        redis::cmd("INCR").arg("n").query_async(&mut con),
    )
    .await;
    assert!(reply.is_err(), "the lost reply arrived: {reply:?}");
    assert_eq!(proxy.triggered(), 1);
    assert_eq!(counter(&server, "n"), Some(1));
}
