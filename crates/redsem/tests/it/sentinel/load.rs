//! 16-way load on one lease semaphore across a forced failover (`SENTINEL FAILOVER`), with a
//! waiter queued and a holder renewing through it.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redsem::{Error, LeaseOptions, Redsem, RedsemOptions};
use redsem_test::RedisSentinels;

use super::{connect, count, failover, kind};
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
