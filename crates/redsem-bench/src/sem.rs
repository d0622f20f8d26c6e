//! The two semaphores under test behind one interface: redsem's `LeaseSemaphore` and the
//! seeds' classic fair semaphore, so S1–S4 run the same code on both.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redis::aio::MultiplexedConnection;
use redsem::{LeasePermit, LeaseSemaphore};

use crate::BenchResult;

/// A semaphore as the scenarios use it.
pub(crate) trait BenchSem: Clone + Send + Sync + 'static {
    type Permit: Send + 'static;

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
