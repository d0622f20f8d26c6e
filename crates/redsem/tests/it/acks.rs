//! Replica acknowledgements (`RedsemOptions::replica_acks`) against a primary with one
//! replica: confirmed changes, a frozen replica (SIGSTOP: it answers no `WAIT`), grants given
//! back, renewals and releases reported, and no `WAIT` at all when the option is off.

use std::process::Command;
use std::time::Duration;

use redsem::{Error, LeaseOptions, LeasePermit, LeaseSemaphore, Redsem, RedsemOptions};
use redsem_test::{RedisServer, within};

use crate::support::no_functions_user;
use crate::support::{Needs, skip_without};

const LIMIT: Duration = Duration::from_secs(10);
/// The acknowledgement timeout of the tests: each call the frozen replica does not answer
/// takes this long; a healthy replica answers in well under a millisecond, but the machine
/// may be busy.
const ACK_TIMEOUT: Duration = Duration::from_secs(1);

/// A primary and one replica, in sync.
struct Pair {
    primary: RedisServer,
    replica: RedisServer,
}

impl Pair {
    fn start() -> Pair {
        let primary = RedisServer::start();
        let replica = RedisServer::start_replica_of(&primary);
        replica.wait_replicated_from(&primary);
        Pair { primary, replica }
    }

    /// A client of the primary (prefix `t`) with `options`.
    async fn client(&self, options: RedsemOptions) -> Redsem {
        within(
            LIMIT,
            "connect",
            Redsem::connect_with(&self.primary.url(), options.prefix("t")),
        )
        .await
        .expect("connect to the primary")
    }

    /// A client asking one replica to acknowledge every change, with the function library
    /// loaded and replicated (loading it is a write the replica takes a while to apply).
    async fn acking(&self) -> Redsem {
        let redsem = self
            .client(RedsemOptions::default().replica_acks(1, ACK_TIMEOUT))
            .await;
        let warm = redsem.lease_semaphore("warm-up", 1).expect("handle");
        within(LIMIT, "status", warm.status())
            .await
            .expect("status");
        self.replica.wait_replicated_from(&self.primary);
        redsem
    }

    /// Stop the replica (SIGSTOP) until the guard is dropped: it takes nothing in and
    /// acknowledges nothing. (On Redis 7.0 `CLIENT PAUSE <ms> WRITE` or `ALL` on the replica
    /// stops its acknowledgements too, since it holds back the stream from its primary — a
    /// `SET` then `WAIT 1 500` on one connection answers 0 — but a stopped process stops
    /// whatever the version does with paused links.)
    fn freeze_replica(&self) -> Frozen {
        signal(self.replica.pid(), "-STOP");
        Frozen(self.replica.pid())
    }

    /// `WAIT` commands the primary ran.
    fn waits(&self) -> u64 {
        command_calls(&self.primary, "wait")
    }

    /// Once the replica has caught up: it holds the same keys under `t:` as the primary, with
    /// the same values (`DUMP`, or the fields of a hash), and says how many there are. (Compared again for a while if
    /// they differ: a background tidy may write between the two reads.)
    fn assert_replica_agrees(&self) -> usize {
        // A hash is compared by its fields (sorted): a hash table's DUMP lists them in the
        // order of its buckets, which differs between two servers holding the same fields.
        let dump = |server: &RedisServer| -> Vec<(String, Vec<u8>)> {
            let mut conn = server.connection();
            let mut keys: Vec<String> = redis::cmd("KEYS")
                .arg("t:*")
                .query(&mut conn)
                .expect("KEYS");
            keys.sort();
            keys.into_iter()
                .map(|key| {
                    let kind: String = redis::cmd("TYPE").arg(&key).query(&mut conn).expect("TYPE");
                    let value = if kind == "hash" {
                        let fields: std::collections::BTreeMap<String, String> =
                            redis::cmd("HGETALL")
                                .arg(&key)
                                .query(&mut conn)
                                .expect("HGETALL");
                        format!("{fields:?}").into_bytes()
                    } else {
                        redis::cmd("DUMP").arg(&key).query(&mut conn).expect("DUMP")
                    };
                    (key, value)
                })
                .collect()
        };
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            self.replica.wait_replicated_from(&self.primary);
            let (primary, replica) = (dump(&self.primary), dump(&self.replica));
            if primary == replica || std::time::Instant::now() > deadline {
                assert_eq!(
                    primary, replica,
                    "the replica's state differs from the primary's"
                );
                return primary.len();
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A stopped process, continued on drop.
struct Frozen(u32);

impl Drop for Frozen {
    fn drop(&mut self) {
        signal(self.0, "-CONT");
    }
}

fn signal(pid: u32, which: &str) {
    let status = Command::new("kill")
        .arg(which)
        .arg(pid.to_string())
        .status()
        .expect("run kill");
    assert!(status.success(), "kill {which} {pid}: {status}");
}

/// `calls` of `cmdstat_<command>` in `INFO commandstats` (0 if never run).
fn command_calls(server: &RedisServer, command: &str) -> u64 {
    let info = server.info("commandstats");
    let needle = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(&needle))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

/// A pair, a client asking for acks, and the semaphore `jobs` (capacity 1, leases of 10 s)
/// through that client and through one that does not.
async fn jobs() -> (Pair, Redsem, LeaseSemaphore, LeaseSemaphore) {
    let pair = Pair::start();
    let options = LeaseOptions::default().lease(Duration::from_secs(10));
    let acking = pair.acking().await;
    let plain = pair.client(RedsemOptions::default()).await;
    let sem = acking
        .lease_semaphore_with("jobs", 1, options.clone())
        .expect("handle");
    let other = plain
        .lease_semaphore_with("jobs", 1, options)
        .expect("handle");
    (pair, acking, sem, other)
}

/// A unit of `sem`, which must be free.
async fn take(sem: &LeaseSemaphore) -> LeasePermit {
    within(LIMIT, "try_acquire", sem.try_acquire())
        .await
        .expect("a free unit, granted")
}

async fn give_back(permit: LeasePermit) {
    within(LIMIT, "release", permit.release())
        .await
        .expect("released");
}

async fn in_use(sem: &LeaseSemaphore) -> u64 {
    within(LIMIT, "status", sem.status())
        .await
        .expect("status")
        .in_use
}

fn assert_not_replicated<T: std::fmt::Debug>(got: redsem::Result<T>, wanted: usize, acked: usize) {
    match got {
        Err(Error::NotReplicated {
            acked: a,
            wanted: w,
        }) => assert_eq!((a, w), (acked, wanted)),
        other => {
            panic!("expected NotReplicated {{ acked: {acked}, wanted: {wanted} }}, got {other:?}")
        }
    }
}

#[tokio::test]
async fn a_grant_and_its_release_each_send_one_wait_and_are_confirmed_by_the_replica() {
    if skip_without(
        Needs::Functions,
        "a_grant_and_its_release_each_send_one_wait_and_are_confirmed_by_the_replica",
        "counts one WAIT per change, the script loaded beforehand (by EVALSHA a first call meets NOSCRIPT and is sent again with its WAIT)",
    ) {
        return;
    }
    let (pair, _, sem, _) = jobs().await;
    let before = pair.waits();
    give_back(take(&sem).await).await;
    let waits = pair.waits() - before;
    println!("WAITs for one try_acquire + release with acks(1): {waits}");
    assert_eq!(waits, 2, "one WAIT with the grant, one with the release");
    // Reads send none.
    in_use(&sem).await;
    assert_eq!(pair.waits() - before, 2);
}

#[tokio::test]
async fn asking_for_more_replicas_than_acknowledge_reports_how_many_did() {
    let pair = Pair::start();
    let redsem = pair
        .client(RedsemOptions::default().replica_acks(2, ACK_TIMEOUT))
        .await;
    let sem = redsem.lease_semaphore("jobs", 1).expect("handle");
    let got = within(LIMIT, "try_acquire", sem.try_acquire()).await;
    println!("try_acquire with acks(2) and one replica: {got:?}");
    // WAIT answered 1: the one replica there is.
    assert_not_replicated(got, 2, 1);
    assert_eq!(in_use(&sem).await, 0, "the grant was given back");
}

#[tokio::test]
async fn a_grant_the_frozen_replica_does_not_acknowledge_is_given_back_and_the_unit_is_free() {
    let (pair, acking, sem, other) = jobs().await;
    let lock = acking.mutex("ledger").expect("mutex");
    {
        let _frozen = pair.freeze_replica();
        let got = within(LIMIT, "try_acquire", sem.try_acquire()).await;
        println!("try_acquire with the replica frozen: {got:?}");
        assert_not_replicated(got, 1, 0);
        assert_not_replicated(within(LIMIT, "try_lock", lock.try_lock()).await, 1, 0);
        // Given back: free at once for a client without acks, the replica still frozen.
        let status = within(LIMIT, "status", other.status())
            .await
            .expect("status");
        assert_eq!((status.in_use, status.holders.len()), (0, 0));
        give_back(take(&other).await).await;
    }
    // The replica is back: grants are confirmed again, and the state is whole.
    let permit = take(&sem).await;
    assert_eq!(in_use(&other).await, 1);
    give_back(permit).await;
    let guard = within(LIMIT, "try_lock", lock.try_lock())
        .await
        .expect("lock");
    within(LIMIT, "unlock", guard.unlock())
        .await
        .expect("unlock");
    let keys = pair.assert_replica_agrees();
    println!("keys the primary and the replica agree on: {keys}");
}

#[tokio::test]
async fn a_waiter_granted_while_the_replica_is_frozen_gives_the_grant_back() {
    let (pair, _, sem, other) = jobs().await;
    let held = take(&other).await;
    let waiter = tokio::spawn(async move { sem.acquire_timeout(Duration::from_secs(8)).await });
    within(LIMIT, "the waiter queues", async {
        while other.status().await.expect("status").waiters.is_empty() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
    let frozen = pair.freeze_replica();
    // The release that grants it asks for no acknowledgement (a client without acks): the
    // waiter's own poll does.
    give_back(held).await;
    let got = within(LIMIT, "the waiter's answer", waiter)
        .await
        .expect("the waiter task");
    println!("a waiter granted while the replica is frozen: {got:?}");
    assert_not_replicated(got, 1, 0);
    let permit = take(&other).await;
    drop(frozen);
    give_back(permit).await;
}

#[tokio::test]
async fn a_renewal_or_release_not_acknowledged_returns_the_error() {
    let (pair, _, sem, other) = jobs().await;
    let permit = take(&sem).await;
    let frozen = pair.freeze_replica();
    let renewed = within(LIMIT, "refresh", permit.refresh()).await;
    println!("refresh with the replica frozen: {renewed:?}");
    assert_not_replicated(renewed, 1, 0);
    assert!(
        permit.is_held(),
        "an unconfirmed renewal does not lose the permit"
    );
    let released = within(LIMIT, "release", permit.release()).await;
    println!("release with the replica frozen: {released:?}");
    assert_not_replicated(released, 1, 0);
    // Applied on the primary all the same.
    assert_eq!(in_use(&other).await, 0);
    drop(frozen);
    pair.replica.wait_replicated_from(&pair.primary);
    give_back(take(&other).await).await;
}

#[tokio::test]
async fn without_acks_or_with_zero_replicas_no_wait_is_sent() {
    let pair = Pair::start();
    for options in [
        RedsemOptions::default(),
        RedsemOptions::default().replica_acks(0, ACK_TIMEOUT),
    ] {
        assert_eq!(options.replica_acks, None);
        let redsem = pair.client(options).await;
        let sem = redsem.lease_semaphore("jobs", 1).expect("handle");
        let permits = redsem.permit_semaphore("pool").expect("handle");
        let latch = redsem.count_down_latch("start").expect("handle");
        within(LIMIT, "cycles", async {
            for _ in 0..3 {
                let permit = sem.try_acquire().await.expect("grant");
                permit.refresh().await.expect("refresh");
                permit.release().await.expect("release");
            }
            permits.try_set_permits(2).await.expect("set");
            permits.try_acquire(1).await.expect("acquire");
            permits.release(1).await.expect("release");
            latch.try_set_count(1).await.expect("set");
            latch.count_down().await.expect("count down");
        })
        .await;
    }
    assert_eq!(pair.waits(), 0);
}

#[tokio::test]
async fn permits_granted_without_acknowledgement_are_given_back() {
    let pair = Pair::start();
    let acking = pair.acking().await;
    let plain = pair.client(RedsemOptions::default()).await;
    let pool = acking.permit_semaphore("pool").expect("handle");
    let other = plain.permit_semaphore("pool").expect("handle");
    within(LIMIT, "set", pool.try_set_permits(2))
        .await
        .expect("set and acknowledged");
    within(LIMIT, "acquire", pool.try_acquire(1))
        .await
        .expect("acquired and acknowledged");
    let before = pair.waits();
    {
        let _frozen = pair.freeze_replica();
        let got = within(LIMIT, "try_acquire", pool.try_acquire(1)).await;
        println!("permit try_acquire with the replica frozen: {got:?}");
        assert_not_replicated(got, 1, 0);
        // Given back: one permit left for a client without acks.
        let available = within(LIMIT, "available", other.available_permits())
            .await
            .expect("available");
        assert_eq!(available, 1);
        // A release not acknowledged is applied and reported.
        let released = within(LIMIT, "release", pool.release(1)).await;
        assert_not_replicated(released, 1, 0);
        let available = within(LIMIT, "available", other.available_permits())
            .await
            .expect("available");
        assert_eq!(available, 2);
        within(LIMIT, "other acquire", other.try_acquire(2))
            .await
            .expect("both permits free");
    }
    pair.assert_replica_agrees();
    // (The failed acquire's own clean-up withdraws its id in the background, a third WAIT
    // whose timing the test does not control.)
    println!("WAITs with the replica frozen: {}", pair.waits() - before);
}

#[tokio::test]
async fn a_drain_not_acknowledged_gives_back_what_it_took() {
    let pair = Pair::start();
    let acking = pair.acking().await;
    let plain = pair.client(RedsemOptions::default()).await;
    let pool = acking.permit_semaphore("pool").expect("handle");
    let other = plain.permit_semaphore("pool").expect("handle");
    within(LIMIT, "set", pool.try_set_permits(3))
        .await
        .expect("set and acknowledged");
    {
        let _frozen = pair.freeze_replica();
        let got = within(LIMIT, "drain_permits", pool.drain_permits()).await;
        println!("drain_permits with the replica frozen: {got:?}");
        assert_not_replicated(got, 1, 0);
        // The 3 it took are free again: nothing is held after the error.
        let available = within(LIMIT, "available", other.available_permits())
            .await
            .expect("available");
        assert_eq!(available, 3, "the drained permits were given back");
    }
    pair.assert_replica_agrees();
    // Acknowledged, the same drain keeps what it took.
    assert_eq!(
        within(LIMIT, "drain_permits", pool.drain_permits())
            .await
            .expect("acknowledged"),
        3
    );
    assert_eq!(
        within(LIMIT, "available", other.available_permits())
            .await
            .expect("available"),
        0
    );
}

#[tokio::test]
async fn a_count_down_not_acknowledged_is_applied_and_reported() {
    let pair = Pair::start();
    let acking = pair.acking().await;
    let latch = acking.count_down_latch("start").expect("handle");
    within(LIMIT, "set", latch.try_set_count(2))
        .await
        .expect("set");
    let frozen = pair.freeze_replica();
    let got = within(LIMIT, "count_down", latch.count_down()).await;
    assert_not_replicated(got, 1, 0);
    assert_eq!(
        within(LIMIT, "count", latch.count()).await.expect("count"),
        1
    );
    drop(frozen);
    within(LIMIT, "count_down", latch.count_down())
        .await
        .expect("acknowledged");
    assert_eq!(
        within(LIMIT, "count", latch.count()).await.expect("count"),
        0
    );
}

#[tokio::test]
async fn by_evalsha_each_change_still_carries_its_wait_and_a_flushed_script_is_reloaded() {
    if skip_without(
        Needs::Functions,
        "by_evalsha_each_change_still_carries_its_wait_and_a_flushed_script_is_reloaded",
        "refuses FCALL by an ACL rule (-fcall)",
    ) {
        return;
    }
    let pair = Pair::start();
    let () = no_functions_user()
        .query(&mut pair.primary.connection())
        .expect("ACL SETUSER");
    let url = format!("redis://nofunc:pw@127.0.0.1:{}/", pair.primary.port());
    let options = RedsemOptions::default()
        .prefix("t")
        .replica_acks(1, ACK_TIMEOUT);
    let redsem = within(LIMIT, "connect", Redsem::connect_with(&url, options))
        .await
        .expect("connect as the user without functions");
    let sem = redsem.lease_semaphore("jobs", 1).expect("handle");
    give_back(take(&sem).await).await;
    pair.replica.wait_replicated_from(&pair.primary);
    let () = redis::cmd("SCRIPT")
        .arg("FLUSH")
        .query(&mut pair.primary.connection())
        .expect("SCRIPT FLUSH");
    let (evalsha, waits) = (command_calls(&pair.primary, "evalsha"), pair.waits());
    give_back(take(&sem).await).await;
    let evalsha = command_calls(&pair.primary, "evalsha") - evalsha;
    let waits = pair.waits() - waits;
    println!("after SCRIPT FLUSH, one cycle by EVALSHA: {evalsha} EVALSHA, {waits} WAIT");
    // Each script (the grant's, the release's: a batch of one operation goes as that
    // operation's own script) answered NOSCRIPT once, its WAIT beside it, then ran after
    // SCRIPT LOAD with a WAIT again.
    assert_eq!((evalsha, waits), (4, 4));
    {
        let _frozen = pair.freeze_replica();
        assert_not_replicated(within(LIMIT, "try_acquire", sem.try_acquire()).await, 1, 0);
        assert_eq!(in_use(&sem).await, 0, "given back by EVALSHA too");
    }
}

#[tokio::test]
async fn on_a_cluster_the_wait_runs_on_the_node_that_ran_the_script() {
    if skip_without(
        Needs::Functions,
        "on_a_cluster_the_wait_runs_on_the_node_that_ran_the_script",
        "counts one WAIT per change, the script loaded beforehand (by EVALSHA a first call meets NOSCRIPT and is sent again with its WAIT)",
    ) {
        return;
    }
    // Masters without replicas: WAIT 1 answers 0 after its timeout, on the node it ran on.
    let cluster = redsem_test::RedisCluster::start(3);
    let seeds = cluster.urls();
    let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
    let options = RedsemOptions::default()
        .prefix("t")
        .replica_acks(1, Duration::from_millis(50));
    let acking = within(
        LIMIT,
        "connect",
        Redsem::connect_cluster_with(&seeds, options),
    )
    .await
    .expect("connect");
    let plain = within(
        LIMIT,
        "connect",
        Redsem::connect_cluster_with(&seeds, RedsemOptions::default().prefix("t")),
    )
    .await
    .expect("connect");
    let owner = cluster.node_for_key("t:{lease:jobs}:state").port();
    // The connect-time check sent each primary one `WAIT 0 1`: counted from here on.
    let before: Vec<u64> = cluster
        .nodes()
        .iter()
        .map(|node| command_calls(node, "wait"))
        .collect();
    let sem = acking.lease_semaphore("jobs", 1).expect("handle");
    // Load the function library first (a read, no WAIT).
    within(LIMIT, "status", sem.status()).await.expect("status");
    let got = within(LIMIT, "try_acquire", sem.try_acquire()).await;
    println!("try_acquire on a cluster without replicas, acks(1): {got:?}");
    assert_not_replicated(got, 1, 0);
    let waits: Vec<(u16, u64)> = cluster
        .nodes()
        .iter()
        .zip(&before)
        .map(|(node, before)| (node.port(), command_calls(node, "wait") - before))
        .collect();
    println!("WAITs per node (owner {owner}): {waits:?}");
    for (port, calls) in waits {
        assert_eq!(calls, u64::from(port == owner), "node {port}");
    }
    let other = plain.lease_semaphore("jobs", 1).expect("handle");
    give_back(take(&other).await).await;
}

/// A grant the replicas did not acknowledge is given back once, by the request's own withdraw
/// and without a `WAIT` of its own: the try runs three scripts (the grant, the give-back, the
/// idle semaphore's tidy) and one `WAIT`. (Before, the script wrapper gave it back and the
/// waiting engine's guard then withdrew the same id again in the background, with a `WAIT`.)
#[tokio::test]
async fn a_grant_not_acknowledged_is_given_back_once_without_a_wait() {
    if skip_without(
        Needs::Functions,
        "a_grant_not_acknowledged_is_given_back_once_without_a_wait",
        "counts FCALL calls",
    ) {
        return;
    }
    let (pair, acking, sem, other) = jobs().await;
    let _frozen = pair.freeze_replica();
    let (scripts, waits) = (command_calls(&pair.primary, "fcall"), pair.waits());
    assert_not_replicated(within(LIMIT, "try_acquire", sem.try_acquire()).await, 1, 0);
    within(LIMIT, "background work", acking.flush()).await;
    assert_eq!(
        (
            command_calls(&pair.primary, "fcall") - scripts,
            pair.waits() - waits
        ),
        (3, 1),
        "(scripts, WAITs) for one try whose grant was given back"
    );
    assert_eq!(in_use(&other).await, 0);
}
