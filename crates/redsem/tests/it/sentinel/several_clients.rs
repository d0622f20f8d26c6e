//! Three clients (`connect_sentinel`), four tasks each, on one semaphore across a forced
//! failover: the most holders at once by believed validity, grants the old primary made after
//! the promotion, and when each client moved.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redsem::{Error, LeaseOptions, Redsem, RedsemOptions};
use redsem_test::RedisSentinels;

use super::{connect_sentinel, count, failover, kind};
use crate::support::within;

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
        // One setting a CONFIG SET: Redis 6.2 takes no pairs.
        let mut conn = node.connection();
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("min-replicas-to-write")
            .arg(min_replicas_to_write)
            .query(&mut conn)
            .expect("CONFIG SET min-replicas-to-write");
        let () = redis::cmd("CONFIG")
            .arg("SET")
            .arg("min-replicas-max-lag")
            .arg(10)
            .query(&mut conn)
            .expect("CONFIG SET min-replicas-max-lag");
    }
    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(connect_sentinel(&deployment, options.clone()).await);
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
