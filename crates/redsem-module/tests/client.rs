//! The client library picks this engine ([`redsem::Engine`]): where the module is loaded, the
//! default `Auto` sends every call as a `REDSEM.<OPERATION>` command; without it, the scripts;
//! `Native` without it fails at connect; `Scripts` never sends a module command. Both engines
//! serve one semaphore at once, and a client whose server loses the module goes on with the
//! scripts. Real servers throughout, each test its own.

mod support;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redsem::{Engine, Error, Redsem, RedsemOptions, ServingEngine};
use redsem_test::{RedisCluster, RedisServer, within};
use support::module;

/// The most any one step of a test may take.
const LIMIT: Duration = Duration::from_secs(20);

/// A server with the module loaded (and `extra` arguments).
fn with_module(extra: &[&str]) -> RedisServer {
    let module = module();
    let mut args = vec!["--loadmodule", module.to_str().expect("a UTF-8 path")];
    args.extend_from_slice(extra);
    RedisServer::start_with(&args)
}

/// A 3-master cluster, the module loaded on the nodes `loaded` says.
fn cluster_with_module(loaded: [bool; 3]) -> RedisCluster {
    let module = module();
    let load = ["--loadmodule", module.to_str().expect("a UTF-8 path")];
    let args: Vec<&[&str]> = loaded
        .iter()
        .map(|&on| if on { &load[..] } else { &[][..] })
        .collect();
    RedisCluster::start_each_with(&args)
}

async fn connect_cluster(cluster: &RedisCluster, engine: Engine) -> redsem::Result<Redsem> {
    let urls = cluster.urls();
    let seeds: Vec<&str> = urls.iter().map(String::as_str).collect();
    let options = RedsemOptions::default().engine(engine);
    within(
        LIMIT,
        "connect to the cluster",
        Redsem::connect_cluster_with(&seeds, options),
    )
    .await
}

async fn connect(server: &RedisServer, engine: Engine) -> redsem::Result<Redsem> {
    let options = RedsemOptions::default().engine(engine);
    within(
        LIMIT,
        "connect",
        Redsem::connect_with(&server.url(), options),
    )
    .await
}

/// `REDSEM.ENGINE`'s counters: calls served natively, calls run by the Lua.
fn module_calls(server: &RedisServer) -> (u64, u64) {
    let (kind, _, _, native, lua): (String, String, String, u64, u64) = redis::cmd("REDSEM.ENGINE")
        .query(&mut server.connection())
        .expect("REDSEM.ENGINE");
    assert_eq!(kind, "native");
    (native, lua)
}

/// The commands `INFO commandstats` lists as called (`redsem.lease_acquire`, `fcall`, ...),
/// each with its `calls`.
fn command_calls(server: &RedisServer) -> HashMap<String, u64> {
    server
        .info("commandstats")
        .lines()
        .filter_map(|line| line.strip_prefix("cmdstat_"))
        .filter_map(|line| line.split_once(':'))
        .map(|(name, stats)| {
            let calls = stats
                .split(',')
                .find_map(|stat| stat.strip_prefix("calls="))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0);
            (name.to_owned(), calls)
        })
        .collect()
}

/// The names of the commands called.
fn commands_called(server: &RedisServer) -> Vec<String> {
    command_calls(server).into_keys().collect()
}

/// How many `FCALL`s the clients sent themselves: those the module did not send for the calls
/// it ran by the Lua (one each, and one more after each `FUNCTION LOAD` of the library).
fn client_fcalls(server: &RedisServer) -> u64 {
    let calls = command_calls(server);
    let of = |name: &str| calls.get(name).copied().unwrap_or(0);
    let (_, lua) = module_calls(server);
    of("fcall").saturating_sub(lua + of("function|load"))
}

/// One lease semaphore cycle: acquire, release.
async fn lease_cycle(redsem: &Redsem, name: &str) {
    let sem = redsem.lease_semaphore(name, 1).expect("a semaphore");
    let permit = within(LIMIT, "acquire", sem.acquire())
        .await
        .expect("granted");
    within(LIMIT, "release", permit.release())
        .await
        .expect("released");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_picks_the_module_where_it_is_loaded() {
    let server = with_module(&[]);
    let redsem = connect(&server, Engine::Auto).await.expect("connected");
    match redsem.engine() {
        ServingEngine::Native { version, .. } => assert_eq!(version, env!("CARGO_PKG_VERSION")),
        other => panic!("the module is loaded, yet {other:?}"),
    }
    assert_eq!(
        redsem.engine().to_string(),
        format!("native (redsem module {})", env!("CARGO_PKG_VERSION"))
    );
    // The first cycle makes the semaphore's state: the module runs the Lua for that. A cycle
    // of a semaphore in use takes the native paths.
    lease_cycle(&redsem, "jobs").await;
    let (before, _) = module_calls(&server);
    lease_cycle(&redsem, "jobs").await;
    let (after, _) = module_calls(&server);
    assert!(
        after >= before + 2,
        "the acquire and the release went the native way: {before} -> {after} native calls"
    );
    let called = commands_called(&server);
    assert!(
        called.iter().any(|c| c == "redsem.lease_acquire"),
        "{called:?}"
    );
    assert!(
        called.iter().any(|c| c == "redsem.lease_release"),
        "{called:?}"
    );
    assert_eq!(
        client_fcalls(&server),
        0,
        "every FCALL was the module's own"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_picks_the_scripts_without_the_module() {
    let server = RedisServer::start();
    let redsem = connect(&server, Engine::Auto).await.expect("connected");
    match redsem.engine() {
        ServingEngine::Scripts { why, .. } => {
            assert!(why.contains("unknown command"), "{why}");
            assert!(
                why.contains(&server.port().to_string()),
                "names the server: {why}"
            );
        }
        other => panic!("no module loaded, yet {other:?}"),
    }
    assert_eq!(redsem.engine().to_string(), "scripts");
    lease_cycle(&redsem, "jobs").await;
    let called = commands_called(&server);
    assert!(called.iter().any(|c| c == "fcall"), "{called:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_without_the_module_fails_at_connect_with_a_typed_error() {
    let server = RedisServer::start();
    match connect(&server, Engine::Native).await {
        Err(Error::EngineUnavailable { asked, node, reply }) => {
            assert_eq!(asked, Engine::Native);
            assert_eq!(node, format!("127.0.0.1:{}", server.port()));
            assert!(reply.contains("unknown command"), "{reply}");
        }
        other => panic!("expected EngineUnavailable, got {other:?}"),
    }
    // Nothing was written.
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg("*")
        .query(&mut server.connection())
        .expect("KEYS");
    assert!(keys.is_empty(), "{keys:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn native_with_the_module_serves_natively() {
    let server = with_module(&[]);
    let redsem = connect(&server, Engine::Native).await.expect("connected");
    assert!(redsem.engine().is_native(), "{:?}", redsem.engine());
    lease_cycle(&redsem, "jobs").await;
    let called = commands_called(&server);
    assert!(
        called.iter().any(|c| c == "redsem.lease_acquire"),
        "{called:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scripts_with_the_module_loaded_send_fcall_only() {
    let server = with_module(&[]);
    let redsem = connect(&server, Engine::Scripts).await.expect("connected");
    assert!(!redsem.engine().is_native(), "{:?}", redsem.engine());
    lease_cycle(&redsem, "jobs").await;
    let permits = redsem.permit_semaphore("pool").expect("permits");
    within(LIMIT, "try_set_permits", permits.try_set_permits(2))
        .await
        .expect("set");
    within(LIMIT, "try_acquire", permits.try_acquire(1))
        .await
        .expect("acquired");
    within(LIMIT, "release", permits.release(1))
        .await
        .expect("released");
    // Read before anything asks REDSEM.ENGINE here: not even the connect did.
    let called = commands_called(&server);
    assert!(
        !called.iter().any(|c| c.starts_with("redsem.")),
        "no module command with Engine::Scripts: {called:?}"
    );
    assert!(called.iter().any(|c| c == "fcall"), "{called:?}");
    assert_eq!(module_calls(&server), (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutex_permits_and_latch_work_on_the_native_engine() {
    let server = with_module(&[]);
    let redsem = connect(&server, Engine::Native).await.expect("connected");

    let mutex = redsem.mutex("deploy").expect("a mutex");
    let guard = within(LIMIT, "lock", mutex.lock()).await.expect("locked");
    assert!(
        within(LIMIT, "try_lock", mutex.try_lock())
            .await
            .is_err_and(|e| e.is_not_acquired()),
        "a second lock while held"
    );
    within(LIMIT, "unlock", guard.unlock())
        .await
        .expect("unlocked");
    let guard = within(LIMIT, "try_lock", mutex.try_lock())
        .await
        .expect("free again");
    within(LIMIT, "unlock", guard.unlock())
        .await
        .expect("unlocked");

    let permits = redsem.permit_semaphore("gpu").expect("permits");
    assert!(
        within(LIMIT, "try_set_permits", permits.try_set_permits(3))
            .await
            .expect("set")
    );
    within(LIMIT, "acquire", permits.acquire(2))
        .await
        .expect("two acquired");
    assert!(
        within(LIMIT, "try_acquire", permits.try_acquire(2))
            .await
            .is_err_and(|e| e.is_not_acquired()),
        "only one left"
    );
    assert_eq!(
        within(LIMIT, "available", permits.available_permits())
            .await
            .expect("read"),
        1
    );
    within(LIMIT, "release", permits.release(2))
        .await
        .expect("released");
    assert_eq!(
        within(LIMIT, "available", permits.available_permits())
            .await
            .expect("read"),
        3
    );

    let latch = redsem.count_down_latch("ready").expect("a latch");
    assert!(
        within(LIMIT, "try_set_count", latch.try_set_count(2))
            .await
            .expect("set")
    );
    let waiter = {
        let latch = latch.clone();
        tokio::spawn(async move { latch.wait_timeout(LIMIT).await })
    };
    within(LIMIT, "count_down", latch.count_down())
        .await
        .expect("counted down");
    within(LIMIT, "count_down", latch.count_down())
        .await
        .expect("counted down");
    within(LIMIT, "the waiter", waiter)
        .await
        .expect("the waiter's task")
        .expect("opened");
    assert!(
        within(LIMIT, "state", latch.state())
            .await
            .expect("read")
            .is_open()
    );

    let called = commands_called(&server);
    for command in [
        "redsem.lease_acquire",
        "redsem.lease_release",
        "redsem.permit_try_set",
        "redsem.permit_acquire",
        "redsem.permit_available",
        "redsem.latch_try_set",
        "redsem.latch_count_down",
        "redsem.latch_state",
    ] {
        assert!(called.iter().any(|c| c == command), "{command}: {called:?}");
    }
    assert_eq!(
        client_fcalls(&server),
        0,
        "every FCALL was the module's own"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_semaphore_served_by_both_engines_at_once_keeps_its_invariants() {
    const CAPACITY: usize = 2;
    const ROUNDS: usize = 25;
    let server = with_module(&[]);
    let native = connect(&server, Engine::Native).await.expect("connected");
    let scripts = connect(&server, Engine::Scripts).await.expect("connected");
    assert!(native.engine().is_native() && !scripts.engine().is_native());
    // Units held now, as the holders count them; and the most seen at once.
    let held = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::new();
    for (n, client) in [&native, &scripts, &native, &scripts, &native, &scripts]
        .into_iter()
        .enumerate()
    {
        let sem = client
            .lease_semaphore("shared", CAPACITY as u32)
            .expect("a semaphore");
        let (held, most) = (Arc::clone(&held), Arc::clone(&most));
        tasks.push(tokio::spawn(async move {
            let mut tokens = Vec::new();
            for round in 0..ROUNDS {
                let permit = sem
                    .acquire_timeout(LIMIT)
                    .await
                    .unwrap_or_else(|e| panic!("task {n}, round {round}: {e}"));
                let now = held.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                assert!(now <= CAPACITY, "{now} units held at once");
                assert!(permit.slot() < CAPACITY as u32);
                tokens.push(permit.token());
                tokio::time::sleep(Duration::from_millis(1 + (round % 3) as u64)).await;
                held.fetch_sub(1, Ordering::SeqCst);
                permit
                    .release()
                    .await
                    .unwrap_or_else(|e| panic!("task {n}, round {round}: {e}"));
            }
            tokens
        }));
    }
    let mut tokens = Vec::new();
    for task in tasks {
        let mine = within(Duration::from_secs(60), "a task's rounds", task)
            .await
            .expect("the task");
        assert!(
            mine.windows(2).all(|w| w[0] < w[1]),
            "one task's tokens increase: {mine:?}"
        );
        tokens.extend(mine);
    }
    tokens.sort();
    let count = tokens.len();
    tokens.dedup();
    assert_eq!(tokens.len(), count, "no fencing token granted twice");
    assert_eq!(count, 6 * ROUNDS);
    assert_eq!(
        most.load(Ordering::SeqCst),
        CAPACITY,
        "the capacity was used"
    );
    let status = within(
        LIMIT,
        "status",
        native.lease_semaphore("shared", 2).unwrap().status(),
    )
    .await
    .expect("status");
    assert_eq!(status.in_use, 0);
    assert!(status.holders.is_empty() && status.waiters.is_empty());
    let calls = command_calls(&server);
    assert!(
        calls.keys().any(|c| c.starts_with("redsem.lease_")),
        "the native client sent the module's commands: {calls:?}"
    );
    assert!(
        client_fcalls(&server) > 0,
        "the scripts client sent FCALLs: {calls:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_whose_server_loses_the_module_goes_on_with_the_scripts() {
    let server = with_module(&["--enable-module-command", "yes"]);
    let redsem = connect(&server, Engine::Native).await.expect("connected");
    let sem = redsem.lease_semaphore("jobs", 1).expect("a semaphore");
    let held = within(LIMIT, "acquire", sem.acquire())
        .await
        .expect("granted");
    // As after a failover to a server without the module.
    let () = redis::cmd("MODULE")
        .arg("UNLOAD")
        .arg("redsem")
        .query(&mut server.connection())
        .expect("MODULE UNLOAD");
    // The release of the permit the module granted, then a whole cycle, by the scripts.
    within(LIMIT, "release", held.release())
        .await
        .expect("released by FCALL");
    lease_cycle(&redsem, "jobs").await;
    match redsem.engine() {
        ServingEngine::Scripts { why, .. } => assert!(why.contains("gone"), "{why}"),
        other => panic!("the module is gone, yet {other:?}"),
    }
    let called = commands_called(&server);
    assert!(called.iter().any(|c| c == "fcall"), "{called:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_acl_rules_for_the_native_engine_allow_its_commands() {
    let server = with_module(&[]);
    let options = RedsemOptions::default().engine(Engine::Native);
    let rules: Vec<String> = options.acl_rules().split(' ').map(str::to_owned).collect();
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("app")
        .arg("on")
        .arg(">secret")
        .arg(&rules)
        .query(&mut server.connection())
        .expect("ACL SETUSER with the rules for Engine::Native");
    let url = format!("redis://app:secret@127.0.0.1:{}", server.port());
    let redsem = within(LIMIT, "connect", Redsem::connect_with(&url, options))
        .await
        .expect("connected as the user");
    assert!(redsem.engine().is_native(), "{:?}", redsem.engine());
    lease_cycle(&redsem, "jobs").await;
    // With the rules of Engine::Auto the module's commands are not allowed: the scripts serve.
    let rules = RedsemOptions::default().acl_rules();
    let () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg("plain")
        .arg("on")
        .arg(">secret")
        .arg(rules.split(' ').collect::<Vec<_>>())
        .query(&mut server.connection())
        .expect("ACL SETUSER");
    let url = format!("redis://plain:secret@127.0.0.1:{}", server.port());
    let redsem = within(LIMIT, "connect", Redsem::connect(&url))
        .await
        .expect("connected as the user");
    match redsem.engine() {
        ServingEngine::Scripts { why, .. } => assert!(
            why.contains("NOPERM") || why.contains("no permissions"),
            "{why}"
        ),
        other => panic!("REDSEM.ENGINE is not allowed, yet {other:?}"),
    }
    lease_cycle(&redsem, "jobs").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_a_cluster_the_module_serves_only_where_every_primary_has_it() {
    let cluster = cluster_with_module([true, true, true]);
    let redsem = connect_cluster(&cluster, Engine::Auto)
        .await
        .expect("connected");
    assert!(redsem.engine().is_native(), "{:?}", redsem.engine());
    // Names spread over the nodes: each cycle goes to the module of the node that owns it.
    let names: Vec<String> = (0..6).map(|i| format!("jobs-{i}")).collect();
    for name in &names {
        lease_cycle(&redsem, name).await;
    }
    for name in &names {
        let node = cluster.node_for_key(&format!("redsem:{{lease:{name}}}:state"));
        let called = commands_called(node);
        assert!(
            called.iter().any(|c| c == "redsem.lease_acquire"),
            "{name} on port {}: {called:?}",
            node.port()
        );
    }
    drop(redsem);
    drop(cluster);

    // One primary without the module: Auto serves by the scripts, Native refuses it.
    let cluster = cluster_with_module([true, true, false]);
    let bare = format!(":{}", cluster.nodes()[2].port());
    let redsem = connect_cluster(&cluster, Engine::Auto)
        .await
        .expect("connected");
    match redsem.engine() {
        ServingEngine::Scripts { why, .. } => {
            assert!(
                why.contains(&bare) && why.contains("unknown command"),
                "{why}"
            );
        }
        other => panic!("a primary has no module, yet {other:?}"),
    }
    lease_cycle(&redsem, "jobs").await;
    match connect_cluster(&cluster, Engine::Native).await {
        Err(Error::EngineUnavailable { node, reply, .. }) => {
            assert!(node.ends_with(&bare), "{node}");
            assert!(reply.contains("unknown command"), "{reply}");
        }
        other => panic!("expected EngineUnavailable, got {other:?}"),
    }
}
