//! The semaphores under test behind one interface: redsem's `LeaseSemaphore`, the seeds'
//! classic fair semaphore (S7) and the polling semaphore of the npm `redis-semaphore` package
//! (S9), so S1–S4 run the same code on all three.

use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, LazyLock};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use redsem::{LeasePermit, LeaseSemaphore, PermitSemaphore};

use crate::BenchResult;

/// A semaphore as the scenarios use it.
pub(crate) trait BenchSem: Clone + Send + Sync + 'static {
    type Permit: Send + 'static;

    /// The commands this algorithm sends outside scripts and transactions (lower case, as
    /// `INFO commandstats` names them). Script and transaction calls (`EVALSHA`, `FCALL`,
    /// `MULTI`, `EXEC`, ...) are counted as the client's own without being listed here; the
    /// commands they run inside are not. Used to add up the server time of a cycle without
    /// counting a script's calls twice.
    const DIRECT_COMMANDS: &'static [&'static str];

    /// One attempt, never waiting: `None` when no unit is free.
    fn try_acquire(&self) -> impl Future<Output = BenchResult<Option<Self::Permit>>> + Send;

    /// Wait until granted. `on_wait` runs once, when the request is first told to wait
    /// (redsem: queued in Redis; seeds: the first attempt failed).
    fn acquire(
        &self,
        on_wait: impl FnOnce() + Send + 'static,
    ) -> impl Future<Output = BenchResult<Self::Permit>> + Send;

    fn release(&self, permit: Self::Permit) -> impl Future<Output = BenchResult<()>> + Send;
}

/// redsem's lease semaphore.
#[derive(Debug, Clone)]
pub(crate) struct Redsem(pub(crate) LeaseSemaphore);

impl BenchSem for Redsem {
    type Permit = LeasePermit;
    const DIRECT_COMMANDS: &'static [&'static str] = &[];

    async fn try_acquire(&self) -> BenchResult<Option<LeasePermit>> {
        match self.0.try_acquire().await {
            Ok(permit) => Ok(Some(permit)),
            Err(e) if e.is_not_acquired() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn acquire(&self, on_wait: impl FnOnce() + Send + 'static) -> BenchResult<LeasePermit> {
        let mut on_wait = Some(on_wait);
        let progress = move |_ahead: u64| {
            if let Some(f) = on_wait.take() {
                f();
            }
        };
        Ok(self.0.acquire_with_progress(1, None, progress).await?)
    }

    async fn release(&self, permit: LeasePermit) -> BenchResult<()> {
        Ok(permit.release().await?)
    }
}

/// redsem's permit semaphore, one permit per acquire (its queue and group commit, no lease,
/// token or slot).
#[derive(Debug, Clone)]
pub(crate) struct Permits(pub(crate) PermitSemaphore);

impl BenchSem for Permits {
    type Permit = ();
    const DIRECT_COMMANDS: &'static [&'static str] = &[];

    async fn try_acquire(&self) -> BenchResult<Option<()>> {
        match self.0.try_acquire(1).await {
            Ok(()) => Ok(Some(())),
            Err(e) if e.is_not_acquired() => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    async fn acquire(&self, on_wait: impl FnOnce() + Send + 'static) -> BenchResult<()> {
        // (No progress report to hook: `on_wait` is for the scenarios that need one, not S2.)
        drop(on_wait);
        Ok(self.0.acquire(1).await?)
    }

    async fn release(&self, (): ()) -> BenchResult<()> {
        Ok(self.0.release(1).await?)
    }
}

/// Compare-and-delete: the release that goes with a `SET NX PX` lock.
const RELEASE_LOCK: &str = r"
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
";

/// The seeds' fair semaphore (seed 000 `acquireFairSemaphoreWithLock`, seeds 002/003), as
/// written: a timeout zset (`semname`, id → client clock ms), an owner zset (`semname:owner`,
/// id → counter), a counter (`semname:counter`), two MULTI/EXEC pipelines per attempt, ZREM
/// on failure, all inside a `SET NX PX` lock (`lock:semname`, acquire timeout 3 s, lock
/// timeout 5 s, retried every 1 ms, as Redis in Action's `acquire_lock_with_timeout`).
/// Waiting is a retry loop (every 1 ms), as the seeds' callers do.
#[derive(Clone)]
pub(crate) struct Seeds {
    conn: MultiplexedConnection,
    semname: String,
    owner: String,
    counter: String,
    lock: String,
    limit: u64,
    /// Holder timeout (the seeds' default, 10 s).
    timeout: Duration,
    release_lock: Arc<redis::Script>,
    /// Client→server round trips sent so far.
    pub(crate) round_trips: Arc<AtomicU64>,
}

impl std::fmt::Debug for Seeds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Seeds")
            .field("semname", &self.semname)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// How long the lock may be waited for, and how long it lives (seed 000:
/// `LockUtil.acquireLock(conn, semname, 3, 5)`).
const LOCK_ACQUIRE_TIMEOUT: Duration = Duration::from_secs(3);
const LOCK_TIMEOUT: Duration = Duration::from_secs(5);
/// The retry period of the lock loop and of the waiting loop.
const RETRY: Duration = Duration::from_millis(1);

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn uuid() -> String {
    format!("{:032x}", rand::random::<u128>())
}

impl Seeds {
    pub(crate) fn new(
        conn: MultiplexedConnection,
        semname: &str,
        limit: u64,
        round_trips: Arc<AtomicU64>,
    ) -> Seeds {
        Seeds {
            conn,
            semname: semname.to_owned(),
            owner: format!("{semname}:owner"),
            counter: format!("{semname}:counter"),
            lock: format!("lock:{semname}"),
            limit,
            timeout: Duration::from_secs(10),
            release_lock: Arc::new(redis::Script::new(RELEASE_LOCK)),
            round_trips,
        }
    }

    fn trip(&self) {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
    }

    async fn acquire_lock(&self) -> BenchResult<Option<String>> {
        let id = uuid();
        let end = tokio::time::Instant::now() + LOCK_ACQUIRE_TIMEOUT;
        let mut conn = self.conn.clone();
        while tokio::time::Instant::now() < end {
            self.trip();
            let set: Option<String> = redis::cmd("SET")
                .arg(&self.lock)
                .arg(&id)
                .arg("NX")
                .arg("PX")
                .arg(LOCK_TIMEOUT.as_millis() as u64)
                .query_async(&mut conn)
                .await?;
            if set.is_some() {
                return Ok(Some(id));
            }
            tokio::time::sleep(RETRY).await;
        }
        Ok(None)
    }

    async fn release_lock(&self, id: &str) -> BenchResult<()> {
        self.trip();
        let _: i64 = self
            .release_lock
            .key(&self.lock)
            .arg(id)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Seed 000 `acquireFairSemaphore`.
    async fn acquire_fair(&self) -> BenchResult<Option<String>> {
        let id = uuid();
        let mut conn = self.conn.clone();
        let now = now_ms();
        self.trip();
        let (counter,): (u64,) = redis::pipe()
            .atomic()
            .cmd("ZREMRANGEBYSCORE")
            .arg(&self.semname)
            .arg(0)
            .arg(now.saturating_sub(self.timeout.as_millis() as u64))
            .ignore()
            .cmd("ZINTERSTORE")
            .arg(&self.owner)
            .arg(2)
            .arg(&self.owner)
            .arg(&self.semname)
            .arg("WEIGHTS")
            .arg(1)
            .arg(0)
            .ignore()
            .cmd("INCR")
            .arg(&self.counter)
            .query_async(&mut conn)
            .await?;
        self.trip();
        let (rank,): (Option<u64>,) = redis::pipe()
            .atomic()
            .cmd("ZADD")
            .arg(&self.semname)
            .arg(now_ms())
            .arg(&id)
            .ignore()
            .cmd("ZADD")
            .arg(&self.owner)
            .arg(counter)
            .arg(&id)
            .ignore()
            .cmd("ZRANK")
            .arg(&self.owner)
            .arg(&id)
            .query_async(&mut conn)
            .await?;
        if rank.is_some_and(|r| r < self.limit) {
            return Ok(Some(id));
        }
        self.remove(&id).await?;
        Ok(None)
    }

    /// Seed 000 `releaseFairSemaphore` (also the clean-up of a failed attempt).
    async fn remove(&self, id: &str) -> BenchResult<()> {
        self.trip();
        let _: () = redis::pipe()
            .atomic()
            .cmd("ZREM")
            .arg(&self.semname)
            .arg(id)
            .ignore()
            .cmd("ZREM")
            .arg(&self.owner)
            .arg(id)
            .ignore()
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }

    /// Seed 000 `acquireFairSemaphoreWithLock`.
    async fn acquire_with_lock(&self) -> BenchResult<Option<String>> {
        let Some(lock) = self.acquire_lock().await? else {
            return Ok(None);
        };
        let got = self.acquire_fair().await;
        self.release_lock(&lock).await?;
        got
    }
}

impl BenchSem for Seeds {
    type Permit = String;
    const DIRECT_COMMANDS: &'static [&'static str] = &["set"];

    async fn try_acquire(&self) -> BenchResult<Option<String>> {
        self.acquire_with_lock().await
    }

    async fn acquire(&self, on_wait: impl FnOnce() + Send + 'static) -> BenchResult<String> {
        let mut on_wait = Some(on_wait);
        loop {
            if let Some(id) = self.acquire_with_lock().await? {
                return Ok(id);
            }
            if let Some(f) = on_wait.take() {
                f();
            }
            tokio::time::sleep(RETRY).await;
        }
    }

    async fn release(&self, id: String) -> BenchResult<()> {
        self.remove(&id).await
    }
}

/// One attempt of the polling semaphore: reap the holders whose lease (by the client clocks
/// that wrote them) has ended, count the rest, and join if there is room.
///
/// KEYS[1]: the holders zset (id → client clock ms of the grant or last refresh).
/// ARGV: limit, id, the caller's clock in ms, lock timeout in ms.
/// Returns 1 when granted, 0 when full.
const POLL_ATTEMPT: &str = include_str!("poll_attempt.lua");

/// The polling semaphore's refresh: the same reaping, then a new time for `id` if it still
/// holds. KEYS and ARGV as [`POLL_ATTEMPT`]; returns 1 when refreshed, 0 when the unit is lost.
#[cfg(test)]
const POLL_REFRESH: &str = r"
local key, id = KEYS[1], ARGV[2]
local now, lease = tonumber(ARGV[3]), tonumber(ARGV[4])
redis.call('ZREMRANGEBYSCORE', key, '-inf', now - lease)
if not redis.call('ZSCORE', key, id) then
  return 0
end
redis.call('ZADD', key, now, id)
redis.call('PEXPIRE', key, lease)
return 1
";

static POLL_ATTEMPT_SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(POLL_ATTEMPT));

#[cfg(test)]
static POLL_REFRESH_SCRIPT: LazyLock<redis::Script> =
    LazyLock::new(|| redis::Script::new(POLL_REFRESH));

/// The unfair polling semaphore of the npm `redis-semaphore` package (`Semaphore`, the
/// fastest of the peers surveyed), re-implemented with its defaults: one zset of holders (id →
/// client clock ms), one script per attempt ([`POLL_ATTEMPT`]: `ZREMRANGEBYSCORE` of the
/// holders older than the lock timeout, `ZCARD`, and below the limit `ZADD` + `PEXPIRE`),
/// retried every 10 ms until granted; release is a plain `ZREM`. Ids are random UUID-shaped
/// strings, one per acquire. Time is the client's clock (milliseconds since the epoch), as the
/// package reads `Date.now()`. Lock timeout 10 s; a holder would refresh every 8 s (0.8 × the
/// lock timeout), which no scenario holds long enough to need.
#[derive(Clone)]
pub(crate) struct Polling {
    conn: MultiplexedConnection,
    key: String,
    limit: u64,
    /// How long a holder's entry counts without a refresh (the package's `lockTimeout`).
    lock_timeout: Duration,
    /// Pause between two failed attempts (the package's `retryInterval`).
    retry: Duration,
    /// Client→server round trips sent so far.
    pub(crate) round_trips: Arc<AtomicU64>,
}

impl std::fmt::Debug for Polling {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Polling")
            .field("key", &self.key)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// The package's defaults (`lockTimeout` 10 s, `retryInterval` 10 ms).
pub(crate) const POLL_LOCK_TIMEOUT: Duration = Duration::from_secs(10);
pub(crate) const POLL_RETRY: Duration = Duration::from_millis(10);

/// A random id shaped as the package's `crypto.randomUUID()` (36 characters).
fn uuid_string() -> String {
    let h = format!("{:032x}", rand::random::<u128>());
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

impl Polling {
    pub(crate) fn new(
        conn: MultiplexedConnection,
        key: &str,
        limit: u64,
        round_trips: Arc<AtomicU64>,
    ) -> Polling {
        Polling {
            conn,
            key: key.to_owned(),
            limit,
            lock_timeout: POLL_LOCK_TIMEOUT,
            retry: POLL_RETRY,
            round_trips,
        }
    }

    /// One attempt for `id`, at the client's clock.
    async fn attempt(&self, id: &str) -> BenchResult<bool> {
        self.call(&POLL_ATTEMPT_SCRIPT, id).await
    }

    /// Refresh `id`'s entry to the client's clock: false when it no longer holds.
    #[cfg(test)]
    pub(crate) async fn refresh(&self, id: &str) -> BenchResult<bool> {
        self.call(&POLL_REFRESH_SCRIPT, id).await
    }

    /// One round trip of `script` (attempt or refresh, which take the same arguments) for
    /// `id`: whether it returned 1.
    async fn call(&self, script: &redis::Script, id: &str) -> BenchResult<bool> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let done: i64 = script
            .key(&self.key)
            .arg(self.limit)
            .arg(id)
            .arg(now_ms())
            .arg(self.lock_timeout.as_millis() as u64)
            .invoke_async(&mut self.conn.clone())
            .await?;
        Ok(done == 1)
    }
}

impl BenchSem for Polling {
    type Permit = String;
    const DIRECT_COMMANDS: &'static [&'static str] = &["zrem"];

    /// One attempt (the package's `acquireAttemptsLimit: 1`, without its pause after a failed
    /// last attempt).
    async fn try_acquire(&self) -> BenchResult<Option<String>> {
        let id = uuid_string();
        Ok(self.attempt(&id).await?.then_some(id))
    }

    /// Attempts every 10 ms until granted. The package gives up after `acquireTimeout`
    /// (10 s); here the wait goes on, so starvation shows in the wait times instead of as an
    /// error. The id stays the same across attempts, as one `Semaphore` object's does.
    async fn acquire(&self, on_wait: impl FnOnce() + Send + 'static) -> BenchResult<String> {
        let id = uuid_string();
        let mut on_wait = Some(on_wait);
        loop {
            if self.attempt(&id).await? {
                return Ok(id);
            }
            if let Some(f) = on_wait.take() {
                f();
            }
            tokio::time::sleep(self.retry).await;
        }
    }

    async fn release(&self, id: String) -> BenchResult<()> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let _: i64 = redis::cmd("ZREM")
            .arg(&self.key)
            .arg(&id)
            .query_async(&mut self.conn.clone())
            .await?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use redsem_test::{RedisServer, within};

    use super::*;

    const LIMIT: Duration = Duration::from_secs(10);

    async fn polling(server: &RedisServer, key: &str, limit: u64) -> Polling {
        let conn = within(
            LIMIT,
            "connect",
            server.client().get_multiplexed_async_connection(),
        )
        .await
        .expect("connect to the test server");
        Polling::new(conn, key, limit, Arc::new(AtomicU64::new(0)))
    }

    #[test]
    fn polling_ids_are_shaped_as_uuids() {
        let id = uuid_string();
        assert_eq!(id.len(), 36);
        assert_eq!(
            id.char_indices()
                .filter(|&(_, c)| c == '-')
                .map(|(i, _)| i)
                .collect::<Vec<_>>(),
            vec![8, 13, 18, 23]
        );
        assert_ne!(uuid_string(), id);
    }

    #[tokio::test]
    async fn polling_grants_up_to_the_limit_and_a_release_frees_a_unit() {
        let server = RedisServer::start();
        let sem = polling(&server, "poll:limit", 2).await;
        let a = within(LIMIT, "first", sem.try_acquire()).await.unwrap();
        let b = within(LIMIT, "second", sem.try_acquire()).await.unwrap();
        assert!(a.is_some() && b.is_some());
        assert_eq!(
            within(LIMIT, "third", sem.try_acquire()).await.unwrap(),
            None
        );
        within(LIMIT, "release", sem.release(a.unwrap()))
            .await
            .unwrap();
        assert!(
            within(LIMIT, "after release", sem.try_acquire())
                .await
                .unwrap()
                .is_some()
        );
        // 4 attempts and one release, one round trip each.
        assert_eq!(sem.round_trips.load(Ordering::Relaxed), 5);
    }

    #[tokio::test]
    async fn polling_waiters_retry_until_a_unit_is_released() {
        let server = RedisServer::start();
        let sem = polling(&server, "poll:wait", 1).await;
        let held = within(LIMIT, "holder", sem.try_acquire())
            .await
            .unwrap()
            .expect("a free unit");
        let (told_tx, told_rx) = tokio::sync::oneshot::channel();
        let waiter = sem.clone();
        let task = tokio::spawn(async move {
            waiter
                .acquire(move || {
                    let _ = told_tx.send(());
                })
                .await
        });
        within(LIMIT, "first failed attempt", told_rx)
            .await
            .unwrap();
        within(LIMIT, "release", sem.release(held)).await.unwrap();
        let got = within(LIMIT, "waiter", task).await.unwrap().unwrap();
        assert_eq!(got.len(), 36);
        // The waiter holds the only unit now.
        assert_eq!(
            within(LIMIT, "full again", sem.try_acquire())
                .await
                .unwrap(),
            None
        );
    }

    #[tokio::test]
    async fn polling_reaps_holders_older_than_the_lock_timeout_by_the_client_clock() {
        let server = RedisServer::start();
        let sem = polling(&server, "poll:reap", 1).await;
        let mut conn = sem.conn.clone();
        // A holder whose last refresh is 11 s old by this clock: its lease has ended.
        let stale = now_ms() - 11_000;
        let _: i64 = redis::cmd("ZADD")
            .arg("poll:reap")
            .arg(stale)
            .arg("dead")
            .query_async(&mut conn)
            .await
            .unwrap();
        let id = within(LIMIT, "attempt", sem.try_acquire())
            .await
            .unwrap()
            .expect("the dead holder's unit");
        let holders: Vec<String> = redis::cmd("ZRANGE")
            .arg("poll:reap")
            .arg(0)
            .arg(-1)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(holders, vec![id.clone()]);
        let ttl: i64 = redis::cmd("PTTL")
            .arg("poll:reap")
            .query_async(&mut conn)
            .await
            .unwrap();
        assert!(ttl > 9_000 && ttl <= 10_000, "PTTL {ttl}");
        assert!(within(LIMIT, "refresh", sem.refresh(&id)).await.unwrap());
        assert!(
            !within(LIMIT, "refresh of a stranger", sem.refresh("dead"))
                .await
                .unwrap()
        );
    }
}
