//! What `Redsem::connect_with` checks on the server before anything is written: the eviction
//! policy, the ACL rights of the user on redsem's keys, channels and commands, the prefix;
//! and the pub/sub connection coming back quickly however often it was lost.

use std::time::{Duration, Instant};

use redsem::{Error, Redsem, RedsemOptions, ServerChecks};

use crate::support::connect_with as connect;
use crate::support::{
    LIMIT, RedisServer, TestContext, connect_cluster_with, cycle, short, until, within,
};
use crate::support::{Needs, skip_without};

/// The rights the rustdoc of [`ServerChecks`] documents, for the prefix `redsem`, after
/// `ACL SETUSER <user> on ><password>`. Kept identical to the documented line.
const DOCUMENTED_RIGHTS: &str = "resetkeys ~redsem:* resetchannels &redsem:* -@all +@read \
     +@write +@scripting -@dangerous +@pubsub +ping +info +time";

fn options(prefix: &str) -> RedsemOptions {
    RedsemOptions::default().prefix(prefix)
}

/// `ACL SETUSER name on >pw RULES...` on `server`; returns the URL that logs in as `name`.
fn user(server: &RedisServer, name: &str, rules: &str) -> String {
    let mut admin = server.connection();
    let _: () = redis::cmd("ACL")
        .arg("SETUSER")
        .arg(name)
        .arg("reset")
        // (Redis 6.2's `reset` leaves the user every channel: `acl-pubsub-default`.)
        .arg("resetchannels")
        .arg("on")
        .arg(">pw")
        .arg(rules.split_whitespace().collect::<Vec<_>>())
        .query(&mut admin)
        .expect("ACL SETUSER");
    format!("redis://{name}:pw@127.0.0.1:{}", server.port())
}

#[track_caller]
fn unsuitable(result: redsem::Result<Redsem>) -> (String, String) {
    match result {
        Err(Error::Unsuitable { setting, problem }) => (setting, problem),
        other => panic!("expected Error::Unsuitable, got {other:?}"),
    }
}

#[tokio::test]
async fn an_allkeys_eviction_policy_is_refused_unless_checks_are_relaxed() {
    let server = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let (setting, problem) = unsuitable(connect(&server.url(), options("t")).await);
    assert_eq!(setting, "maxmemory-policy");
    assert!(problem.contains("allkeys-lru"), "{problem}");
    assert!(
        problem.contains("noeviction"),
        "says what to use: {problem}"
    );
    for checks in [ServerChecks::Warn, ServerChecks::Off] {
        let redsem = connect(&server.url(), options("t").server_checks(checks))
            .await
            .unwrap_or_else(|e| panic!("{checks:?}: {e}"));
        let sem = redsem.lease_semaphore("jobs", 1).expect("sem");
        cycle(&sem).await.expect("acquire and release");
    }
}

#[tokio::test]
async fn volatile_and_noeviction_policies_are_accepted() {
    for policy in ["noeviction", "volatile-lru", "volatile-ttl"] {
        let server = RedisServer::start_with(&["--maxmemory-policy", policy]);
        connect(&server.url(), options("t"))
            .await
            .unwrap_or_else(|e| panic!("{policy}: {e}"));
    }
}

/// Connecting (prefix `t`) as a user `name` with `rules` is refused: the setting names
/// `missing` (keys, channels, commands) and the problem names `allow`, the rule to add.
/// Returns the user's URL.
async fn a_user_is_refused_naming(
    server: &RedisServer,
    name: &str,
    rules: &str,
    missing: &str,
    allow: &str,
) -> String {
    let url = user(server, name, rules);
    let (setting, problem) = unsuitable(connect(&url, options("t")).await);
    assert!(setting.contains(missing), "{setting}");
    assert!(problem.contains(allow), "names what to allow: {problem}");
    url
}

#[tokio::test]
async fn a_user_without_rights_on_the_channels_is_refused_naming_them() {
    if skip_without(
        Needs::AclCheckCmd,
        "a_user_without_rights_on_the_channels_is_refused_naming_them",
        "takes a user without channel rights to be refused, which only redis.acl_check_cmd in a script can tell",
    ) {
        return;
    }
    let server = RedisServer::start();
    let rules = "~t:* resetchannels +@all";
    a_user_is_refused_naming(&server, "nochan", rules, "channels", "&t:*").await;
}

#[tokio::test]
async fn a_user_without_rights_on_the_keys_is_refused_naming_them() {
    let server = RedisServer::start();
    let rules = "~other:* &* +@all";
    a_user_is_refused_naming(&server, "nokeys", rules, "keys", "~t:*").await;
}

#[tokio::test]
async fn a_user_without_scripting_is_refused_naming_the_commands() {
    let server = RedisServer::start();
    let rules = "~t:* &t:* +@all -@scripting";
    let url =
        a_user_is_refused_naming(&server, "noscripts", rules, "commands", "+@scripting").await;
    // Off: no check, and the first call fails instead.
    let redsem = connect(&url, options("t").server_checks(ServerChecks::Off))
        .await
        .expect("no checks");
    let sem = redsem.lease_semaphore("jobs", 1).expect("sem");
    sem.try_acquire().await.expect_err("no EVALSHA");
}

#[tokio::test]
async fn info_refused_by_the_acl_does_not_fail_the_connect() {
    let server = RedisServer::start();
    let url = user(
        &server,
        "noinfo",
        &DOCUMENTED_RIGHTS
            .replace("redsem:", "t:")
            .replace(" +info", ""),
    );
    let redsem = connect(&url, options("t")).await.expect("connect");
    let sem = redsem.lease_semaphore("jobs", 1).expect("sem");
    cycle(&sem).await.expect("acquire and release");
}

/// Every primitive, waits included, as a user with exactly the documented rights.
#[tokio::test]
async fn a_user_with_exactly_the_documented_rights_can_use_every_primitive() {
    assert_eq!(RedsemOptions::default().acl_rules(), DOCUMENTED_RIGHTS);
    let server = RedisServer::start();
    let url = user(&server, "app", DOCUMENTED_RIGHTS);
    let a = connect(&url, RedsemOptions::default()).await.expect("a");
    let b = connect(&url, RedsemOptions::default()).await.expect("b");

    // Lease semaphore: a waiter in b is woken by a's release (pub/sub hand-off).
    let sem_a = a.lease_semaphore_with("jobs", 1, short(500)).expect("sem");
    let sem_b = b.lease_semaphore_with("jobs", 1, short(500)).expect("sem");
    let held = sem_a.try_acquire().await.expect("acquire");
    let waiter = tokio::spawn(async move { sem_b.acquire().await });
    until("b to queue", || async {
        sem_a.status().await.expect("status").waiters.len() == 1
    })
    .await;
    held.release().await.expect("release");
    let handed = within(LIMIT, "hand-off", waiter)
        .await
        .expect("join")
        .expect("b acquires");
    assert!(handed.is_held());
    handed.release().await.expect("release b");
    assert_eq!(
        a.lease_semaphore_names().await.expect("names"),
        vec!["jobs".to_owned()]
    );
    a.mutex("m")
        .expect("mutex")
        .lock()
        .await
        .expect("lock")
        .unlock()
        .await
        .expect("unlock");

    // Permit semaphore: a waiter for 2 permits is served when they are added.
    let permits_a = a.permit_semaphore("gpu").expect("permits");
    let permits_b = b.permit_semaphore("gpu").expect("permits");
    assert!(permits_a.try_set_permits(1).await.expect("try_set"));
    let taker = tokio::spawn(async move { permits_b.acquire(2).await });
    until("the permit waiter to queue", || async {
        matches!(
            permits_a.try_acquire(2).await,
            Err(Error::NotEnoughPermits { waiters: 1, .. })
        )
    })
    .await;
    permits_a.add_permits(1).await.expect("add");
    within(LIMIT, "permits", taker)
        .await
        .expect("join")
        .expect("b takes 2");
    permits_a.release(2).await.expect("release");
    assert_eq!(permits_a.available_permits().await.expect("available"), 2);
    assert_eq!(permits_a.drain_permits().await.expect("drain"), 2);

    // Latch: a waiter in b opens when a counts down to zero.
    let latch_a = a.count_down_latch("ready").expect("latch");
    let latch_b = b.count_down_latch("ready").expect("latch");
    assert!(latch_a.try_set_count(1).await.expect("set"));
    let opened = tokio::spawn(async move { latch_b.wait().await });
    tokio::time::sleep(Duration::from_millis(50)).await;
    latch_a.count_down().await.expect("count down");
    within(LIMIT, "latch", opened)
        .await
        .expect("join")
        .expect("opened");
    assert!(latch_a.state().await.expect("state").is_open());
    a.flush().await;
}

#[tokio::test]
async fn a_prefix_with_braces_is_refused_before_connecting() {
    // No server at all: the prefix is checked first.
    let url = "redis://127.0.0.1:1";
    for prefix in ["app{1}", "{app}", "a}b", "x{"] {
        let err = Redsem::connect_with(url, options(prefix))
            .await
            .expect_err(prefix);
        assert!(err.is_invalid_argument(), "{prefix}: {err:?}");
        assert!(err.to_string().contains("brace"), "says why: {err}");
        let err = Redsem::connect_cluster_with(&[url], options(prefix))
            .await
            .expect_err(prefix);
        assert!(err.is_invalid_argument(), "{prefix}: {err:?}");
    }
}

/// Checks run on every primary of a cluster: ACLs are per node.
#[tokio::test]
async fn on_a_cluster_every_primary_is_checked() {
    if skip_without(
        Needs::AclCheckCmd,
        "on_a_cluster_every_primary_is_checked",
        "takes a user without channel rights to be refused, which only redis.acl_check_cmd in a script can tell",
    ) {
        return;
    }
    let cluster = redsem_test::RedisCluster::start(3);
    let rules = format!("{DOCUMENTED_RIGHTS} +cluster|slots +cluster|nodes");
    let urls: Vec<String> = cluster
        .nodes()
        .iter()
        .map(|node| user(node, "app", &rules))
        .collect();
    let redsem = connect_cluster_with(&urls, RedsemOptions::default())
        .await
        .expect("documented rights on every node");
    let sem = redsem.lease_semaphore("jobs", 1).expect("sem");
    cycle(&sem).await.expect("acquire and release");
    // The last node's user loses its channel rights; the seed is the first node.
    let last = cluster.nodes().last().expect("a node");
    user(last, "app", &rules.replace("&redsem:*", ""));
    let (setting, problem) =
        unsuitable(connect_cluster_with(&urls[..1], RedsemOptions::default()).await);
    assert!(setting.contains("channels"), "{setting}");
    assert!(
        problem.contains(&last.port().to_string()),
        "names the node: {problem}"
    );
}

/// A pub/sub connection killed ten times over comes back as fast the eleventh time as the
/// first: the reconnect backoff starts over after each successful subscription.
#[tokio::test]
async fn the_pubsub_connection_comes_back_quickly_however_often_it_was_lost() {
    let ctx = TestContext::start().await;
    // A waiter starts the pub/sub connection.
    let sem = ctx.redsem.lease_semaphore("jobs", 1).expect("sem");
    let _held = sem.try_acquire().await.expect("acquire");
    let other = ctx.client().await;
    let waiting = other.lease_semaphore("jobs", 1).expect("sem");
    let waiter = tokio::spawn(async move { waiting.acquire().await });
    let subscribed = || async { ctx.clients_of_type("pubsub").await == 1 };
    until("the first subscription", subscribed).await;
    let mut took = Vec::new();
    for _ in 0..11 {
        assert_eq!(ctx.kill_clients("pubsub").await, 1);
        let killed = Instant::now();
        until("the resubscription", subscribed).await;
        took.push(killed.elapsed());
    }
    let last = *took.last().expect("eleven");
    // Behaviour bound, not a performance target: the backoff used to grow to 2 s for good.
    assert!(
        last < Duration::from_secs(1),
        "the 11th resubscription took {last:?} (all: {took:?})"
    );
    waiter.abort();
}

/// A replica acknowledgement timeout as long as the response timeout would report calls whose
/// replicas were slow as failed although the primary applied them: refused before connecting,
/// on every way in (one server, cluster and sentinel URLs).
#[tokio::test]
async fn an_ack_timeout_not_shorter_than_the_response_timeout_is_refused() {
    let ctx = TestContext::start().await;
    let url = ctx.server.url();
    let too_long = RedsemOptions::default()
        .response_timeout(Duration::from_secs(1))
        .replica_acks(1, Duration::from_secs(1));
    for target in [
        url.clone(),
        url.replacen("redis://", "redis+cluster://", 1),
        format!("redis+sentinel://127.0.0.1:{}/mymaster", ctx.server.port()),
    ] {
        let refused = Redsem::connect_with(&target, too_long.clone()).await;
        match refused {
            Err(Error::InvalidArgument(why)) => assert!(
                why.contains("shorter than the response timeout"),
                "{target}: {why}"
            ),
            other => panic!("{target}: {other:?}"),
        }
    }
    let fine = RedsemOptions::default()
        .response_timeout(Duration::from_secs(1))
        .replica_acks(1, Duration::from_millis(200));
    connect(&url, fine)
        .await
        .expect("a shorter ack timeout connects");
}

/// A one-node cluster that never met another node answers CLUSTER SLOTS and CLUSTER NODES
/// with an empty address for itself ("the address you asked"): it is usable, through
/// `connect_cluster` and the `redis+cluster://` URL, with the server checks on.
#[tokio::test]
async fn a_one_node_cluster_reporting_an_empty_address_is_usable() {
    let server = RedisServer::start_with(&["--cluster-enabled", "yes"]);
    let mut admin = server.connection();
    // (ADDSLOTS, each slot named: Redis 6.2 has no ADDSLOTSRANGE.)
    let _: () = redis::cmd("CLUSTER")
        .arg("ADDSLOTS")
        .arg((0..16384).collect::<Vec<u16>>())
        .query(&mut admin)
        .expect("CLUSTER ADDSLOTS");
    redsem_test::eventually(LIMIT, "the one-node cluster is ok", || {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut admin)
            .expect("CLUSTER INFO");
        info.contains("cluster_state:ok")
    });
    let nodes: String = redis::cmd("CLUSTER")
        .arg("NODES")
        .query(&mut admin)
        .expect("CLUSTER NODES");
    assert!(
        nodes.starts_with(&format!("{} :", nodes.split(' ').next().unwrap_or(""))),
        "the node reports an empty address for itself: {nodes}"
    );
    let urls = [server.url()];
    let by_seeds = connect_cluster_with(&urls, options("one"))
        .await
        .expect("connect_cluster to a one-node cluster");
    let url = format!("redis+cluster://127.0.0.1:{}", server.port());
    let by_url = connect(&url, options("one"))
        .await
        .expect("connect by redis+cluster:// URL to a one-node cluster");
    for redsem in [&by_seeds, &by_url] {
        let sem = redsem.lease_semaphore("jobs", 1).expect("sem");
        let permit = within(LIMIT, "acquire", sem.try_acquire())
            .await
            .expect("try_acquire: a free unit");
        assert_eq!(sem.status().await.expect("status").holders.len(), 1);
        permit.release().await.expect("release");
        assert_eq!(
            by_seeds.lease_semaphore_names().await.expect("names"),
            vec!["jobs".to_owned()]
        );
    }
}
