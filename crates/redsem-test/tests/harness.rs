//! Tests of the harness against the real `redis-server` and `redis-cli`.

use std::time::Duration;

use redis::Commands;
use redsem_test::{RedisCluster, RedisServer, eventually, within};

const LIMIT: Duration = Duration::from_secs(5);

fn process_exists(pid: u32) -> bool {
    let pid = i32::try_from(pid).expect("pid fits in i32");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
}

#[test]
fn server_answers_ping_and_set_get() {
    let server = RedisServer::start();
    let mut con = server.connection();
    let pong: String = redis::cmd("PING").query(&mut con).expect("PING");
    assert_eq!(pong, "PONG");
    let () = con.set("greeting", "hello").expect("SET");
    let value: String = con.get("greeting").expect("GET");
    assert_eq!(value, "hello");
    assert_eq!(
        server.url(),
        format!("redis://127.0.0.1:{}/", server.port())
    );
}

#[test]
fn server_runs_without_persistence_in_its_own_dir() {
    let server = RedisServer::start_with(&["--maxmemory", "10mb"]);
    let mut con = server.connection();
    let config = |con: &mut redis::Connection, name: &str| -> String {
        let pair: (String, String) = redis::cmd("CONFIG")
            .arg("GET")
            .arg(name)
            .query(con)
            .expect("CONFIG GET");
        pair.1
    };
    assert_eq!(config(&mut con, "save"), "");
    assert_eq!(config(&mut con, "appendonly"), "no");
    assert_eq!(config(&mut con, "maxmemory"), "10485760");
    assert_eq!(config(&mut con, "dir"), server.dir().display().to_string());
    assert!(
        server.log().contains("Ready to accept connections"),
        "log:\n{}",
        server.log()
    );
}

#[test]
fn two_servers_get_different_ports() {
    let first = RedisServer::start();
    let second = RedisServer::start();
    assert_ne!(first.port(), second.port());
    assert_ne!(first.pid(), second.pid());
    assert_ne!(first.dir(), second.dir());
}

#[test]
fn stop_breaks_connections_and_restart_brings_the_same_port_back_with_an_empty_script_cache() {
    let mut server = RedisServer::start();
    let (port, old_pid) = (server.port(), server.pid());
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return 1")
        .query(&mut server.connection())
        .expect("SCRIPT LOAD");
    let script_exists = |server: &RedisServer| -> Vec<i64> {
        redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(&sha)
            .query(&mut server.connection())
            .expect("SCRIPT EXISTS")
    };
    assert_eq!(script_exists(&server), [1]);

    server.stop();
    server.stop(); // idempotent
    assert!(!server.is_running());
    assert!(
        server.client().get_connection().is_err(),
        "a stopped server accepts connections"
    );

    server.restart();
    assert!(server.is_running());
    assert_eq!(server.port(), port);
    assert_ne!(server.pid(), old_pid);
    assert!(
        !process_exists(old_pid),
        "the old process {old_pid} is still alive"
    );
    assert_eq!(script_exists(&server), [0]);
}

#[test]
fn drop_kills_the_process_and_removes_the_dir() {
    let server = RedisServer::start();
    let (pid, dir) = (server.pid(), server.dir().to_path_buf());
    assert!(process_exists(pid));
    drop(server);
    eventually(LIMIT, "the dropped server's process exits", || {
        !process_exists(pid)
    });
    assert!(!dir.exists(), "{} was not removed", dir.display());
}

/// A server started on a thread that exits (as a `spawn_blocking` thread of tokio does when it
/// idles out) keeps running: the parent-death signal is tied to the kit's spawner thread, which
/// lives as long as the process. It used to be tied to the starting thread, and a
/// `RedisSentinels` started on a `spawn_blocking` thread lost all its servers ~10 s later.
#[cfg(target_os = "linux")]
#[test]
fn a_server_started_on_a_short_lived_thread_outlives_it() {
    let mut server = std::thread::spawn(RedisServer::start)
        .join()
        .expect("the starting thread did not panic");
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        server.is_running(),
        "the server died with the thread that started it"
    );
    let pong: String = redis::cmd("PING")
        .query(&mut server.connection())
        .expect("PING");
    assert_eq!(pong, "PONG");
}

/// Run by [`a_server_dies_with_the_process_that_started_it`] in a child process: start a server,
/// print its pid, and leave without stopping it.
#[test]
#[ignore = "run by a_server_dies_with_the_process_that_started_it"]
fn start_a_server_and_leave_it() {
    let server = RedisServer::start();
    println!("server pid {}", server.pid());
    std::mem::forget(server);
}

/// A server whose test process exits without stopping it gets `SIGKILL`.
#[cfg(target_os = "linux")]
#[test]
fn a_server_dies_with_the_process_that_started_it() {
    let output = std::process::Command::new(std::env::current_exe().expect("the test binary"))
        .args([
            "--ignored",
            "--exact",
            "start_a_server_and_leave_it",
            "--nocapture",
        ])
        .output()
        .expect("run the test binary");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let pid: u32 = stdout
        .lines()
        .find_map(|line| line.strip_prefix("server pid "))
        .and_then(|pid| pid.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in the child's output:\n{stdout}"));
    eventually(LIMIT, "the orphaned server gets SIGKILL", || {
        !process_exists(pid)
    });
}

#[test]
fn debug_command_is_enabled() {
    let server = RedisServer::start();
    let () = redis::cmd("DEBUG")
        .arg("SLEEP")
        .arg(0)
        .query(&mut server.connection())
        .expect("DEBUG SLEEP 0");
}

#[test]
fn three_master_cluster_serves_every_slot_and_hash_tagged_scripts() {
    let cluster = RedisCluster::start(3);
    assert_eq!(cluster.nodes().len(), 3);
    assert!(cluster.proxies().is_empty());
    let node_urls: Vec<String> = cluster.nodes().iter().map(RedisServer::url).collect();
    assert_eq!(cluster.urls(), node_urls);
    for node in cluster.nodes() {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut node.connection())
            .expect("CLUSTER INFO");
        assert!(info.contains("cluster_state:ok"), "{info}");
    }

    let mut con = cluster
        .client()
        .get_connection()
        .expect("connect to the cluster");
    // "foo" and "bar" hash to slots 12182 and 5061, which different masters serve.
    for key in ["foo", "bar"] {
        let () = con.set(key, key).expect("SET in the cluster");
        let value: String = con.get(key).expect("GET in the cluster");
        assert_eq!(value, key);
        // Asked directly, only the owner answers (the others reply MOVED).
        let direct: String = cluster
            .node_for_key(key)
            .connection()
            .get(key)
            .expect("GET on node_for_key");
        assert_eq!(direct, key);
    }
    let both: Vec<String> = redis::cmd("EVAL")
        .arg("redis.call('SET', KEYS[1], ARGV[1]); redis.call('SET', KEYS[2], ARGV[1]); return redis.call('MGET', KEYS[1], KEYS[2])")
        .arg(2)
        .arg("{x}:a")
        .arg("{x}:b")
        .arg("v")
        .query(&mut con)
        .expect("EVAL on two keys of one slot");
    assert_eq!(both, ["v", "v"]);
}

#[tokio::test]
async fn within_returns_the_output_in_time() {
    let value = within(LIMIT, "a ready future", async { 7 }).await;
    assert_eq!(value, 7);
}

#[tokio::test]
#[should_panic(expected = "timed out: a pending future did not complete within 20ms")]
async fn within_panics_on_timeout() {
    within(
        Duration::from_millis(20),
        "a pending future",
        std::future::pending::<()>(),
    )
    .await;
}

#[test]
#[should_panic(expected = "timed out: a false condition did not happen within 20ms")]
fn eventually_panics_on_timeout() {
    eventually(Duration::from_millis(20), "a false condition", || false);
}

#[test]
#[should_panic(expected = "Bad directive or wrong number of arguments")]
fn a_server_that_cannot_start_panics_with_its_complaint() {
    RedisServer::start_with(&["--no-such-option", "1"]);
}
