//! Through Sentinels: connecting by `redis+sentinel://` and `connect_sentinel`, and 16-way load
//! on one lease semaphore across a forced failover (`SENTINEL FAILOVER`), with a waiter
//! queued and a holder renewing through it.
//!
//! What is asserted is what the README's guarantees promise across a failover: fencing tokens
//! keep increasing in grant order (they are `max(last + 1, server time)`, one clock here), and
//! the holders' own view never has more than `capacity` holders at once, except with a grant
//! the promoted replica missed, whose holder then learns it (its release answers that it was
//! not held, or its `lost()` fires). Figures are printed with `eprintln!` for the reports;
//! nothing about them is asserted.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redsem::{Error, LeaseOptions, Redsem, RedsemOptions};
use redsem_test::RedisSentinels;

use crate::support::{LIMIT, within};

/// Tasks contending for the semaphore.
const TASKS: usize = 16;
/// Its units.
const CAPACITY: u32 = 4;
/// How long the load runs, and when the failover starts in it.
const LOAD: Duration = Duration::from_secs(20);
const FAILOVER_AT: Duration = Duration::from_secs(8);

/// One grant, from its holder's side.
#[derive(Debug, Clone)]
struct Grant {
    /// When `acquire` was called and when it returned the permit.
    asked: Instant,
    granted: Instant,
    /// When the holder stopped counting on it (called `release`).
    released: Instant,
    token: u64,
    /// The server did not know it any more when it was released (or its `lost()` fired).
    lost: bool,
}

/// What the load saw.
#[derive(Debug, Default)]
struct Load {
    grants: Vec<Grant>,
    /// Acquires that failed (unavailable, not replicated, ...), by error.
    failed_acquires: Vec<String>,
    failed_releases: Vec<String>,
}

async fn connect(deployment: &RedisSentinels, options: RedsemOptions) -> Redsem {
    within(
        LIMIT,
        "connect through the sentinels",
        Redsem::connect_with(&deployment.url(), options.prefix("t")),
    )
    .await
    .expect("connect through the sentinels")
}

/// Run a failover of `deployment` on a blocking thread; returns when every sentinel names the
/// new primary, with its port.
async fn failover(deployment: &Arc<RedisSentinels>) -> u16 {
    let deployment = deployment.clone();
    within(
        Duration::from_secs(40),
        "SENTINEL FAILOVER",
        tokio::task::spawn_blocking(move || deployment.failover()),
    )
    .await
    .expect("the failover thread")
}

/// One task of the load: acquire, hold a few ms, release, until `end`.
async fn worker(redsem: Redsem, n: usize, end: Instant, load: Arc<Mutex<Load>>) {
    // A request the promoted replica has but whose client moved on (granted and released on
    // the old primary in the seconds before the switch) blocks the queue until its waiter
    // lease ends: keep that short.
    let lease = LeaseOptions::default()
        .lease(Duration::from_secs(3))
        .waiter_lease(Duration::from_secs(2));
    let sem = redsem
        .lease_semaphore_with("load", CAPACITY, lease)
        .expect("semaphore");
    let mut round = 0u64;
    while Instant::now() < end {
        round += 1;
        let asked = Instant::now();
        let permit = match sem.acquire_timeout(Duration::from_secs(5)).await {
            Ok(permit) => permit,
            Err(err) => {
                load.lock().unwrap().failed_acquires.push(kind(&err));
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let granted = Instant::now();
        let token = permit.token().get();
        // 5 to 35 ms, different per task and round.
        let hold = 5 + (n as u64 * 7 + round * 13) % 31;
        tokio::time::sleep(Duration::from_millis(hold)).await;
        let lost_before = !permit.is_held();
        let released = Instant::now();
        let outcome = permit.release().await;
        let lost = lost_before
            || matches!(
                outcome,
                Err(Error::NotHeld { .. } | Error::LeaseLost { .. })
            );
        let mut load = load.lock().unwrap();
        if let Err(err) = &outcome {
            load.failed_releases.push(kind(err));
        }
        load.grants.push(Grant {
            asked,
            granted,
            released,
            token,
            lost,
        });
    }
}

/// How many times each error occurs.
fn count(errors: &[String]) -> std::collections::BTreeMap<&str, usize> {
    let mut counted = std::collections::BTreeMap::new();
    for e in errors {
        *counted.entry(e.as_str()).or_default() += 1;
    }
    counted
}

/// An error's variant name, for counting.
fn kind(err: &Error) -> String {
    if let Error::Redis(cause) = err {
        return format!("Redis({cause})");
    }
    let text = format!("{err:?}");
    text.split(['(', ' ', '{'])
        .next()
        .unwrap_or_default()
        .to_owned()
}

/// Instants at which the holders' own view has more than `capacity` holders, and how many of
/// those are not explained by lost grants (more holders than capacity even without the grants
/// the server forgot).
fn over_capacity(grants: &[Grant]) -> (usize, usize) {
    // +1 at granted, -1 at released; releases first at equal instants.
    let mut events: Vec<(Instant, i32, bool)> = grants
        .iter()
        .flat_map(|g| [(g.granted, 1, g.lost), (g.released, -1, g.lost)])
        .collect();
    events.sort_by_key(|&(at, delta, _)| (at, delta));
    let (mut held, mut known, mut over, mut unexplained) = (0i64, 0i64, 0, 0);
    for (_, delta, lost) in events {
        held += i64::from(delta);
        if !lost {
            known += i64::from(delta);
        }
        if delta > 0 && held > i64::from(CAPACITY) {
            over += 1;
            if known > i64::from(CAPACITY) {
                unexplained += 1;
            }
        }
    }
    (over, unexplained)
}

/// Pairs of grants where one was granted before the other was asked for, yet has the larger
/// token: the order a client can see.
fn tokens_out_of_order(grants: &[Grant]) -> usize {
    let mut by_granted: Vec<&Grant> = grants.iter().collect();
    by_granted.sort_by_key(|g| g.granted);
    let mut by_asked: Vec<&Grant> = grants.iter().collect();
    by_asked.sort_by_key(|g| g.asked);
    let (mut i, mut highest, mut out_of_order) = (0, 0u64, 0);
    for later in by_asked {
        while i < by_granted.len() && by_granted[i].granted < later.asked {
            highest = highest.max(by_granted[i].token);
            i += 1;
        }
        if later.token <= highest {
            out_of_order += 1;
        }
    }
    out_of_order
}

/// 16 tasks on one semaphore for 20 s through the sentinels, a forced failover 8 s in; a waiter
/// queued and a holder holding across it. Prints the figures; asserts the invariants.
async fn load_across_a_failover(label: &str, options: RedsemOptions) {
    let deployment = Arc::new(RedisSentinels::start());
    let redsem = connect(&deployment, options.clone()).await;
    let start = Instant::now();
    let end = start + LOAD;
    let load = Arc::new(Mutex::new(Load::default()));
    let workers: Vec<_> = (0..TASKS)
        .map(|n| tokio::spawn(worker(redsem.clone(), n, end, load.clone())))
        .collect();

    // A holder across the failover, and a waiter queued behind it before the failover.
    let other = connect(&deployment, options).await;
    let queue = redsem
        .lease_semaphore_with(
            "queue",
            1,
            LeaseOptions::default().lease(Duration::from_secs(2)),
        )
        .expect("semaphore");
    let holder = within(LIMIT, "the holder's grant", queue.acquire())
        .await
        .expect("holder");
    let waiter_queue = other
        .lease_semaphore_with(
            "queue",
            1,
            LeaseOptions::default().waiter_lease(Duration::from_secs(10)),
        )
        .expect("semaphore");
    let waiter = tokio::spawn(async move {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            // With replica acks a check-in on the old primary is not acknowledged: ask again.
            let permit = waiter_queue
                .acquire_timeout(deadline.saturating_duration_since(Instant::now()))
                .await;
            match permit {
                Err(err) if err.is_not_replicated() && Instant::now() < deadline => {}
                permit => return (Instant::now(), permit),
            }
        }
    });
    crate::support::until("the waiter is queued", || async {
        queue.status().await.is_ok_and(|s| s.waiters.len() == 1)
    })
    .await;

    tokio::time::sleep(FAILOVER_AT.saturating_sub(start.elapsed())).await;
    let before = deployment.primary().port();
    let switch = Instant::now();
    let after = failover(&deployment).await;
    let switched = switch.elapsed();
    assert_ne!(before, after);

    // The holder keeps renewing on the new primary, or learns it lost its permit.
    let lost = tokio::select! {
        () = holder.lost() => true,
        () = tokio::time::sleep(Duration::from_secs(4)) => false,
    };
    let still_held = holder.is_held();
    let released_at = Instant::now();
    let holder_release = holder.release().await;
    let (waiter_granted_at, waiter_permit) =
        within(Duration::from_secs(40), "the queued waiter", waiter)
            .await
            .expect("the waiter task");
    let waiter_permit =
        waiter_permit.expect("the waiter queued before the failover gets its permit after it");

    for worker in workers {
        within(Duration::from_secs(40), "a load task", worker)
            .await
            .expect("a load task");
    }
    let load = Arc::try_unwrap(load)
        .expect("tasks done")
        .into_inner()
        .unwrap();
    let grants = &load.grants;
    let (over, unexplained) = over_capacity(grants);
    let out_of_order = tokens_out_of_order(grants);
    let lost_grants = grants.iter().filter(|g| g.lost).count();
    let mut granted: Vec<Instant> = grants.iter().map(|g| g.granted).collect();
    granted.sort();
    let first_after = granted.iter().find(|&&at| at >= switch + switched);
    let gap = granted
        .windows(2)
        .map(|w| (w[1] - w[0], w[0] - start))
        .max_by_key(|&(gap, _)| gap)
        .unwrap_or_default();
    eprintln!(
        "sentinel failover [{label}]: {} grants in {:?} by {TASKS} tasks (capacity {CAPACITY}); \
         failover {before} -> {after} took {switched:?} (SENTINEL FAILOVER until every sentinel \
         names the new primary); longest gap between grants {:?}, from {:?} after the load \
         began (failover began at {:?}); first grant after the sentinels agreed: {:?} later; \
         failed acquires {:?}; failed releases {:?}; grants lost {lost_grants}; instants over \
         capacity (holders' view) {over}, unexplained by lost grants {unexplained}; tokens out of \
         order {out_of_order}; holder across the failover: lost() {lost}, still held {still_held}, \
         release {:?}; queued waiter granted {:?} after the holder's release",
        grants.len(),
        LOAD,
        gap.0,
        gap.1,
        switch - start,
        first_after.map(|&at| at - (switch + switched)),
        count(&load.failed_acquires),
        count(&load.failed_releases),
        holder_release.as_ref().map_err(kind),
        waiter_granted_at.saturating_duration_since(released_at),
    );

    assert!(grants.len() > 100, "the load ran: {} grants", grants.len());
    assert!(
        first_after.is_some(),
        "no grant after the failover completed"
    );
    assert_eq!(
        out_of_order, 0,
        "fencing tokens went backwards across the failover"
    );
    assert_eq!(
        unexplained, 0,
        "more holders than capacity that no lost grant explains"
    );
    assert!(
        lost || still_held,
        "the holder neither renewed on the new primary nor learnt it lost its permit"
    );
    waiter_permit.release().await.expect("the waiter's release");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_semaphore_under_load_carries_on_across_a_sentinel_failover() {
    load_across_a_failover("no acks", RedsemOptions::default()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_semaphore_with_replica_acks_carries_on_across_a_sentinel_failover() {
    let acks = RedsemOptions::default().replica_acks(1, Duration::from_millis(100));
    load_across_a_failover("replica acks 1, 100 ms", acks).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_sentinel_finds_the_primary_and_a_url_with_a_database_selects_it() {
    let deployment = Arc::new(RedisSentinels::start());
    let urls = deployment.sentinel_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let redsem = within(
        LIMIT,
        "connect_sentinel",
        Redsem::connect_sentinel_with(
            &urls,
            deployment.master_name(),
            RedsemOptions::default().prefix("t"),
        ),
    )
    .await
    .expect("connect_sentinel");
    let permit = redsem
        .lease_semaphore("s", 1)
        .expect("semaphore")
        .try_acquire()
        .await
        .expect("a grant on the primary");
    permit.release().await.expect("release");

    let in_db_3 = within(
        LIMIT,
        "connect with a database",
        Redsem::connect_with(
            &format!("{}/3", deployment.url()),
            RedsemOptions::default().prefix("t"),
        ),
    )
    .await
    .expect("connect to database 3");
    let held = in_db_3
        .lease_semaphore("in-3", 1)
        .expect("semaphore")
        .try_acquire()
        .await
        .expect("grant");
    let mut con = deployment.primary().connection();
    let in_3: Vec<String> = redis::pipe()
        .cmd("SELECT")
        .arg(3)
        .ignore()
        .cmd("KEYS")
        .arg("t:*in-3*")
        .query(&mut con)
        .map(|(keys,): (Vec<String>,)| keys)
        .expect("KEYS in database 3");
    assert!(!in_3.is_empty(), "the semaphore's keys are in database 3");
    held.release().await.expect("release");

    let unknown = within(
        LIMIT,
        "connect to an unknown master",
        Redsem::connect_sentinel(&urls, "no-such-master"),
    )
    .await
    .expect_err("no sentinel knows that master");
    eprintln!("unknown master: {unknown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_primary_is_left_behind_once_the_sentinels_promote_a_replica() {
    let mut deployment = RedisSentinels::start();
    let url = deployment.url();
    let redsem = within(
        LIMIT,
        "connect through the sentinels",
        Redsem::connect_with(&url, RedsemOptions::default().prefix("t")),
    )
    .await
    .expect("connect");
    let sem = redsem.lease_semaphore("killed", 1).expect("semaphore");
    let first = deployment.primary().port();
    assert!(
        format!("{redsem:?}").contains(&format!(":{first}\"")),
        "{redsem:?} names the primary on port {first}"
    );
    let before = sem.try_acquire().await.expect("a grant before");
    let token = before.token().get();
    before.release().await.expect("release");
    let killed = deployment.kill_primary();
    let started = Instant::now();
    // Refused connections until the sentinels agree the primary is down and promote a
    // replica (down-after 1 s); then the client moves on its next error or look.
    let after = within(
        Duration::from_secs(40),
        "a grant on the new primary",
        async {
            loop {
                match sem.try_acquire().await {
                    Ok(permit) => return permit,
                    Err(err) => {
                        assert!(
                            err.is_unavailable() || matches!(err, Error::Redis(_)),
                            "{err:?}"
                        );
                        tokio::time::sleep(Duration::from_millis(50)).await;
                    }
                }
            }
        },
    )
    .await;
    eprintln!(
        "sentinel failover after a killed primary (port {killed}): first grant {:?} after the kill",
        started.elapsed()
    );
    assert!(after.token().get() > token, "tokens keep increasing");
    after.release().await.expect("release on the new primary");
    // The client names the primary it now talks to, not the first one.
    let shown = format!("{redsem:?}");
    assert!(
        !shown.contains(&format!(":{killed}\"")),
        "{shown} still names the killed primary on port {killed}"
    );
}

/// A client that connects in the last moments of a forced failover (every Sentinel already
/// names the new primary by address, but the leader still lists the old one in `SENTINEL
/// MASTERS`, and the old one still answers `ROLE` as a primary) writes to the new primary:
/// the first connection is decided by the configuration epoch, as every later check is. The
/// redis crate's sentinel client alone picked the old primary (3 of 3 runs, found through the
/// CLI), whose writes are lost when the Sentinels demote it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_connecting_as_a_failover_ends_writes_to_the_new_primary() {
    let deployment = Arc::new(RedisSentinels::start());
    let old = deployment.primary().port();
    let new = failover(&deployment).await;
    assert_ne!(old, new);
    let redsem = connect(&deployment, RedsemOptions::default()).await;
    let sem = redsem.lease_semaphore("after", 1).expect("semaphore");
    let permit = within(LIMIT, "grant", sem.try_acquire())
        .await
        .expect("granted");
    let holds = |port: u16| {
        let node = deployment
            .nodes()
            .iter()
            .find(|n| n.port() == port)
            .expect("node");
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("t:*after*")
            .query(&mut node.connection())
            .expect("KEYS");
        !keys.is_empty()
    };
    assert!(
        holds(new),
        "the grant (token {}) is not on the new primary {new} (on the old {old}: {})",
        permit.token(),
        holds(old)
    );
    permit.release().await.expect("release");
}

/// Clients of the multi-client failover run.
const CLIENTS: usize = 3;
/// Tasks in each.
const TASKS_PER_CLIENT: usize = 4;
/// The semaphore's units in that run.
const SHARED_CAPACITY: u32 = 3;
/// How long that load runs, and when the failover is forced in it.
const SHARED_LOAD: Duration = Duration::from_secs(16);
const SHARED_FAILOVER_AT: Duration = Duration::from_secs(7);

/// One grant of the multi-client run, from its holder's side.
#[derive(Debug, Clone)]
struct Held {
    client: usize,
    granted: Instant,
    /// When the holder stopped counting on it: its release call, or its `lost()`.
    ended: Instant,
    /// Its holder was told the grant was gone (`lost()` fired, or the release answered that
    /// it was not held).
    told: bool,
    /// The primary the client named before the acquire was sent and after it answered.
    primary_before: u16,
    primary_after: u16,
    /// The release answered `Ok`.
    released_ok: bool,
    /// What a failed release answered, when not that the permit was not held.
    release_error: Option<String>,
}

/// The port of the primary a client names (its `Debug`).
fn primary_port(redsem: &Redsem) -> u16 {
    let shown = format!("{redsem:?}");
    shown
        .rsplit_once(':')
        .and_then(|(_, rest)| {
            rest.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .ok()
        })
        .unwrap_or_default()
}

/// One task of the multi-client load: acquire, hold 20 to 60 ms (watching `lost()`), release,
/// pause.
async fn holder_task(
    redsem: Redsem,
    client: usize,
    n: usize,
    end: Instant,
    load: Arc<Mutex<Vec<Held>>>,
    refused: Arc<Mutex<Vec<String>>>,
) {
    let lease = LeaseOptions::default()
        .lease(Duration::from_secs(3))
        .waiter_lease(Duration::from_secs(2));
    let sem = redsem
        .lease_semaphore_with("shared", SHARED_CAPACITY, lease)
        .expect("semaphore");
    let mut round = 0u64;
    while Instant::now() < end {
        round += 1;
        let primary_before = primary_port(&redsem);
        let permit = match sem.acquire_timeout(Duration::from_secs(5)).await {
            Ok(permit) => permit,
            Err(err) => {
                refused.lock().unwrap().push(kind(&err));
                tokio::time::sleep(Duration::from_millis(20)).await;
                continue;
            }
        };
        let granted = Instant::now();
        let primary_after = primary_port(&redsem);
        let hold = 20 + (client as u64 * 17 + n as u64 * 7 + round * 13) % 41;
        let lost_during = tokio::select! {
            () = permit.lost() => true,
            () = tokio::time::sleep(Duration::from_millis(hold)) => false,
        };
        let ended = Instant::now();
        let outcome = permit.release().await;
        let told = lost_during
            || matches!(
                outcome,
                Err(Error::NotHeld { .. } | Error::LeaseLost { .. })
            );
        load.lock().unwrap().push(Held {
            client,
            granted,
            ended,
            told,
            primary_before,
            primary_after,
            released_ok: outcome.is_ok(),
            release_error: outcome.as_ref().err().filter(|_| !told).map(kind),
        });
        // 200 to 500 ms between grants: the semaphore is not saturated (about one of its 3
        // units in use on average), so a client that moved finds free units.
        let pause = 200 + (client as u64 * 31 + n as u64 * 11 + round * 29) % 301;
        tokio::time::sleep(Duration::from_millis(pause)).await;
    }
}

/// The most holders at once, counting each grant from its grant to its end (`ended`), over
/// `grants`; with how long that count stayed above `capacity` in total.
fn most_at_once<'a>(grants: impl Iterator<Item = &'a Held>, capacity: u32) -> (i64, Duration) {
    let mut events: Vec<(Instant, i64)> = grants
        .flat_map(|g| [(g.granted, 1), (g.ended, -1)])
        .collect();
    events.sort();
    let (mut held, mut most, mut over, mut since) = (0i64, 0i64, Duration::ZERO, None);
    for (at, delta) in events {
        held += delta;
        most = most.max(held);
        if held > i64::from(capacity) {
            since.get_or_insert(at);
        } else if let Some(from) = since.take() {
            over += at - from;
        }
    }
    (most, over)
}

/// Poll `ROLE` on the nodes other than `old` until one answers as a master: when the replica
/// the Sentinels chose was promoted.
fn wait_promotion(deployment: &RedisSentinels, old: u16, limit: Duration) -> Option<Instant> {
    let deadline = Instant::now() + limit;
    let nodes: Vec<&redsem_test::RedisServer> = deployment
        .nodes()
        .iter()
        .filter(|n| n.port() != old)
        .collect();
    // The promoted replica's clients are killed (`CLIENT KILL TYPE normal`): reconnect.
    let mut conns: Vec<Option<redis::Connection>> = nodes.iter().map(|_| None).collect();
    while Instant::now() < deadline {
        for (node, con) in nodes.iter().zip(&mut conns) {
            let con = con.get_or_insert_with(|| node.connection());
            let role: redis::RedisResult<Vec<redis::Value>> = redis::cmd("ROLE").query(con);
            let Ok(role) = role else {
                *con = node.connection();
                continue;
            };
            let first = role
                .first()
                .and_then(|v| redis::from_redis_value::<String>(v.clone()).ok());
            if first.as_deref() == Some("master") {
                return Some(Instant::now());
            }
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    None
}

/// Three clients (`connect_sentinel`), four tasks each, on one capacity-3 semaphore with 3 s
/// leases; `SENTINEL FAILOVER` 7 s in. Measures: the most holders at once by believed validity
/// (every holder, and the holders never told of a loss), grants made and released `Ok` on the
/// old primary after the promotion (lost without anyone told), and when each client moved.
async fn several_clients_across_a_failover(
    label: &str,
    options: RedsemOptions,
    min_replicas_to_write: u32,
) {
    let deployment = Arc::new(RedisSentinels::start());
    for node in deployment.nodes() {
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("min-replicas-to-write")
            .arg(min_replicas_to_write)
            .arg("min-replicas-max-lag")
            .arg(10)
            .query(&mut node.connection())
            .expect("CONFIG SET min-replicas-to-write");
    }
    let urls = deployment.sentinel_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        let redsem = within(
            LIMIT,
            "connect_sentinel",
            Redsem::connect_sentinel_with(&urls, deployment.master_name(), options.clone()),
        )
        .await
        .expect("connect_sentinel");
        clients.push(redsem);
        // Clients that did not start together: their once-a-second looks are not aligned.
        tokio::time::sleep(Duration::from_millis(1000 / CLIENTS as u64)).await;
    }
    let old = deployment.primary().port();
    let start = Instant::now();
    let end = start + SHARED_LOAD;
    let load = Arc::new(Mutex::new(Vec::new()));
    let refused = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (client, redsem) in clients.iter().enumerate() {
        for n in 0..TASKS_PER_CLIENT {
            tasks.push(tokio::spawn(holder_task(
                redsem.clone(),
                client,
                n,
                end,
                load.clone(),
                refused.clone(),
            )));
        }
    }
    // When each client names another primary.
    let watchers: Vec<_> = clients
        .iter()
        .map(|redsem| {
            let redsem = redsem.clone();
            tokio::spawn(async move {
                let deadline = Instant::now() + Duration::from_secs(40);
                while Instant::now() < deadline {
                    if primary_port(&redsem) != old {
                        return Some(Instant::now());
                    }
                    tokio::time::sleep(Duration::from_millis(1)).await;
                }
                None
            })
        })
        .collect();

    tokio::time::sleep(SHARED_FAILOVER_AT.saturating_sub(start.elapsed())).await;
    let promoted = {
        let deployment = deployment.clone();
        tokio::task::spawn_blocking(move || {
            wait_promotion(&deployment, old, Duration::from_secs(30))
        })
    };
    let fault = Instant::now();
    let new = failover(&deployment).await;
    let promoted = within(Duration::from_secs(40), "the promotion", promoted)
        .await
        .expect("the promotion watcher")
        .expect("a replica was promoted");
    let mut switched = Vec::new();
    for watcher in watchers {
        let at = within(Duration::from_secs(45), "a client's switch", watcher)
            .await
            .expect("the switch watcher")
            .expect("every client moves to the new primary");
        switched.push(at);
    }
    for task in tasks {
        within(Duration::from_secs(40), "a load task", task)
            .await
            .expect("a load task");
    }
    let grants = Arc::try_unwrap(load)
        .expect("tasks done")
        .into_inner()
        .unwrap();

    let (most, over_for) = most_at_once(grants.iter(), SHARED_CAPACITY);
    let (most_untold, untold_over_for) =
        most_at_once(grants.iter().filter(|g| !g.told), SHARED_CAPACITY);
    // Granted by the old primary after the replica was promoted: the new primary never had it.
    let on_old_after =
        |g: &&Held| g.primary_before == old && g.primary_after == old && g.granted > promoted;
    let after_promotion = grants.iter().filter(on_old_after).count();
    // A grant answered just after the promotion may have been made just before it (and be
    // on the new primary): one released `Ok` after its client moved, so on the new primary,
    // was known there.
    let known_to_new = |g: &Held| g.released_ok && g.ended > switched[g.client];
    // Released `Ok` on the old primary, before its client moved: lost with it, nobody told.
    let silently_lost = grants
        .iter()
        .filter(on_old_after)
        .filter(|g| !g.told && g.released_ok && g.ended <= switched[g.client])
        .count();
    // Still held when their client moved, never told, and not released there either: their
    // release failed otherwise (as with `NOREPLICAS` from a new primary whose replica is
    // still syncing), so whether the new primary had them is not known.
    let held_past_switch = grants
        .iter()
        .filter(on_old_after)
        .filter(|g| !g.told && !known_to_new(g) && g.ended > switched[g.client])
        .count();
    let release_errors: Vec<String> = grants
        .iter()
        .filter_map(|g| g.release_error.clone())
        .collect();
    // Of those, never told although held while a grant of the new primary was held: two
    // primaries' holders counted on their units at once.
    let on_new: Vec<&Held> = grants.iter().filter(|g| g.primary_before == new).collect();
    let first_on_new = on_new.iter().map(|g| g.granted).min();
    let overlapping = grants
        .iter()
        .filter(on_old_after)
        .filter(|g| {
            !g.told
                && !known_to_new(g)
                && on_new
                    .iter()
                    .any(|n| n.granted < g.ended && g.granted < n.ended)
        })
        .count();
    let told = grants.iter().filter(|g| g.told).count();
    let switch_times: Vec<String> = switched
        .iter()
        .map(|at| format!("{:?}", at.saturating_duration_since(promoted)))
        .collect();
    let per_client: Vec<usize> = (0..CLIENTS)
        .map(|c| grants.iter().filter(|g| g.client == c).count())
        .collect();
    let last_on_old = grants.iter().filter(on_old_after).map(|g| g.granted).max();
    let old_after_new = match (first_on_new, last_on_old) {
        (Some(first), Some(last)) if last > first => last - first,
        _ => Duration::ZERO,
    };
    eprintln!(
        "several clients across a sentinel failover [{label}]: {} grants ({per_client:?} per \
         client); failover {old} -> {new}; replica promoted {:?} after SENTINEL FAILOVER; \
         clients switched {switch_times:?} after the promotion; most holders at once {most} \
         (above capacity {SHARED_CAPACITY} for {over_for:?} in all), of holders never told \
         {most_untold} ({untold_over_for:?}); grants by the old primary after the promotion \
         {after_promotion}: released Ok on the old primary and never told {silently_lost}, \
         held past their client's switch and neither told nor released there \
         {held_past_switch}, never told though held beside a grant of the new primary \
         {overlapping}; the old primary granted until {old_after_new:?} after \
         the new one's first grant; holders told of a loss {told}; acquires refused {:?}; \
         releases failed otherwise {:?}",
        grants.len(),
        promoted.saturating_duration_since(fault),
        count(&refused.lock().unwrap()),
        count(&release_errors),
    );
    assert!(grants.len() > 100, "the load ran: {} grants", grants.len());
    assert!(
        most_untold <= i64::from(SHARED_CAPACITY),
        "{most_untold} holders at once that were never told of a loss, on capacity \
         {SHARED_CAPACITY}"
    );
    assert_eq!(
        overlapping, 0,
        "grants of the old primary after the promotion, held beside grants of the new primary, \
         whose holders were never told"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_clients_across_a_sentinel_failover() {
    several_clients_across_a_failover("no acks", RedsemOptions::default().prefix("t"), 0).await;
}

/// The same with `min-replicas-to-write 1` on every data node (what `redsem doctor` advises
/// behind Sentinels): the old primary refuses writes once no replica follows it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_clients_across_a_sentinel_failover_with_min_replicas_to_write() {
    several_clients_across_a_failover(
        "no acks, min-replicas-to-write 1",
        RedsemOptions::default().prefix("t"),
        1,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_clients_with_replica_acks_across_a_sentinel_failover() {
    let acks = RedsemOptions::default()
        .prefix("t")
        .replica_acks(1, Duration::from_millis(100));
    several_clients_across_a_failover("replica acks 1, 100 ms", acks, 0).await;
}

/// A holder whose grant the new primary does not have learns it at once when its client
/// moves, not at its next renewal: every permit is renewed as soon as the client follows the
/// Sentinels to another primary. The grant is taken out of both replicas behind the
/// primary's back (they are made writable for it), so the promoted one does not know it.
/// Before, `lost()` fired at the next renewal, a third of the 60 s lease after the grant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_holder_unknown_to_the_new_primary_is_told_as_soon_as_its_client_moves() {
    let deployment = Arc::new(RedisSentinels::start());
    let urls = deployment.sentinel_urls();
    let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
    let redsem = within(
        LIMIT,
        "connect_sentinel",
        Redsem::connect_sentinel_with(
            &urls,
            deployment.master_name(),
            RedsemOptions::default().prefix("t"),
        ),
    )
    .await
    .expect("connect_sentinel");
    let sem = redsem
        .lease_semaphore_with(
            "unknown",
            1,
            LeaseOptions::default().lease(Duration::from_secs(60)),
        )
        .expect("semaphore");
    let permit = within(LIMIT, "grant", sem.try_acquire())
        .await
        .expect("granted");
    let primary = deployment.primary();
    for replica in deployment
        .nodes()
        .iter()
        .filter(|n| n.port() != primary.port())
    {
        replica.wait_replicated_from(primary);
        let mut con = replica.connection();
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("replica-read-only")
            .arg("no")
            .query(&mut con)
            .expect("CONFIG SET replica-read-only no");
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg("t:*unknown*")
            .query(&mut con)
            .expect("KEYS");
        assert!(!keys.is_empty(), "the grant reached the replica");
        let () = redis::cmd("DEL")
            .arg(&keys)
            .query(&mut con)
            .expect("DEL on the replica");
    }
    let old = primary.port();
    let new = failover(&deployment).await;
    assert_ne!(old, new);
    let agreed = Instant::now();
    let told = tokio::select! {
        () = permit.lost() => Some(agreed.elapsed()),
        () = tokio::time::sleep(Duration::from_secs(8)) => None,
    };
    eprintln!("a holder unknown to the new primary: lost() {told:?} after the Sentinels agreed");
    assert!(
        told.is_some(),
        "the holder was not told within 8 s that the new primary does not know its grant \
         (its next renewal is 20 s after the grant)"
    );
    assert!(matches!(
        permit.release().await,
        Err(Error::NotHeld { .. } | Error::LeaseLost { .. })
    ));
}
