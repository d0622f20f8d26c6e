//! S5, scale: cycle latency as live holders grow, and many waiting tasks in one process.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use futures_util::{StreamExt, TryStreamExt, stream};
use redsem::{LeaseOptions, LeasePermit, LeaseSemaphore};
use serde::Serialize;
use tokio::sync::Notify;
use tokio::time::{Instant, timeout};

use crate::BenchResult;
use crate::core::{CycleRun, RawPair, STALL, timed_cycles};
use crate::ctx::Ctx;

/// Concurrent requests when filling a semaphore with holders.
const FILL_CONCURRENCY: usize = 128;

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Level {
    /// Live holders while timing.
    pub(crate) holders: usize,
    /// try_acquire + release of one more unit, timed in slices alternating with two raw
    /// EVALSHA round trips (`two_raw_evalsha`), as in S1.
    pub(crate) run: CycleRun,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct Connections {
    /// Ordinary (command) connections.
    pub(crate) normal: usize,
    /// Connections in pub/sub mode.
    pub(crate) pubsub: usize,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct ScaleRun {
    pub(crate) levels: Vec<Level>,
    /// Holders granted per second while filling to the last level.
    pub(crate) fill_per_s: f64,
    /// Waiting tasks started in this process, all on one `Redsem` client.
    pub(crate) waiters: usize,
    /// Queued requests Redis reported (`status`) once every task was waiting.
    pub(crate) queued_in_redis: usize,
    /// Seconds until every task was queued.
    pub(crate) enqueue_s: f64,
    /// Connections that client opened (server `CLIENT LIST`, ids newer than the client).
    pub(crate) connections: Connections,
    /// Process RSS before starting the waiters and once they all wait.
    pub(crate) rss_before_bytes: u64,
    pub(crate) rss_waiting_bytes: u64,
    pub(crate) rss_per_waiter_bytes: f64,
}

/// Take `n` more units of `sem`, `FILL_CONCURRENCY` requests at a time.
pub(crate) async fn fill(sem: &LeaseSemaphore, n: usize) -> BenchResult<Vec<LeasePermit>> {
    let permits: Vec<LeasePermit> = stream::iter(0..n)
        .map(|_| sem.try_acquire())
        .buffer_unordered(FILL_CONCURRENCY)
        .try_collect()
        .await?;
    Ok(permits)
}

/// Start `n` tasks waiting on `sem`; returns once Redis has queued every one of them.
pub(crate) async fn start_waiters(
    sem: &LeaseSemaphore,
    n: usize,
) -> BenchResult<tokio::task::JoinSet<()>> {
    let queued = Arc::new(AtomicUsize::new(0));
    let all = Arc::new(Notify::new());
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..n {
        let sem = sem.clone();
        let (queued, all) = (queued.clone(), all.clone());
        set.spawn(async move {
            let mut first = true;
            let progress = move |_ahead: u64| {
                if std::mem::take(&mut first) && queued.fetch_add(1, Ordering::SeqCst) + 1 == n {
                    all.notify_one();
                }
            };
            // Never granted while the scenario runs; aborted (and withdrawn) at the end.
            let _ = sem.acquire_with_progress(1, None, progress).await;
        });
    }
    timeout(STALL, all.notified()).await?;
    Ok(set)
}

/// Abort waiting tasks and wait (bounded) until Redis has no queued request left.
pub(crate) async fn stop_waiters(
    sem: &LeaseSemaphore,
    mut set: tokio::task::JoinSet<()>,
) -> BenchResult<()> {
    set.abort_all();
    while set.join_next().await.is_some() {}
    let deadline = Instant::now() + STALL;
    while !sem.status().await?.waiters.is_empty() {
        if Instant::now() > deadline {
            return Err("withdrawn waiters are still queued".into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(())
}

pub(crate) async fn run(ctx: &Ctx) -> BenchResult<ScaleRun> {
    let sizes = &ctx.sizes;
    let prefix = ctx.prefix("s5");

    // Many waiting tasks on one fresh client (first, while the process is small).
    let since = ctx.admin.last_client_id().await?;
    let client = ctx.redsem(&prefix).await?;
    let sem = client.lease_semaphore("queue", 1)?;
    let holder = sem.try_acquire().await?;
    let rss_before_bytes = crate::admin::rss_bytes();
    let t = Instant::now();
    let waiting = start_waiters(&sem, sizes.s5_waiters).await?;
    let enqueue_s = t.elapsed().as_secs_f64();
    let rss_waiting_bytes = crate::admin::rss_bytes();
    let queued_in_redis = sem.status().await?.waiters.len();
    let mine: Vec<_> = ctx
        .admin
        .clients()
        .await?
        .into_iter()
        .filter(|c| c.id > since)
        .collect();
    let connections = Connections {
        normal: mine.iter().filter(|c| !c.pubsub).count(),
        pubsub: mine.iter().filter(|c| c.pubsub).count(),
    };
    stop_waiters(&sem, waiting).await?;
    holder.release().await?;
    drop(sem);
    drop(client);
    ctx.clean(&prefix).await?;

    // Cycle latency as live holders grow.
    let most = sizes.s5_levels.iter().copied().max().unwrap_or(0);
    let capacity = u32::try_from(most + 1)?;
    // Holders that stay put for the whole scenario: no renewals, a long lease.
    let options = LeaseOptions::default()
        .keepalive(false)
        .lease(Duration::from_secs(3600));
    let client = ctx.redsem(&prefix).await?;
    let sem = client.lease_semaphore_with("scale", capacity, options)?;
    let mut yardstick = RawPair::new(&ctx.admin).await?;
    let mut held: Vec<LeasePermit> = Vec::new();
    let mut levels = Vec::new();
    let mut fill_per_s = 0.0;
    for &level in &sizes.s5_levels {
        let more = level.saturating_sub(held.len());
        let t = Instant::now();
        held.extend(fill(&sem, more).await?);
        fill_per_s = more as f64 / t.elapsed().as_secs_f64().max(1e-9);
        let run = timed_cycles(&ctx.admin, sizes.s5_time, Some(&mut yardstick), || async {
            sem.try_acquire().await?.release().await?;
            Ok(())
        })
        .await?;
        levels.push(Level {
            holders: held.len(),
            run,
        });
    }
    // Leave them to the key clean-up rather than 100,000 releases.
    for p in held {
        p.forget();
    }
    ctx.clean(&prefix).await?;

    Ok(ScaleRun {
        levels,
        fill_per_s,
        waiters: sizes.s5_waiters,
        queued_in_redis,
        enqueue_s,
        connections,
        rss_before_bytes,
        rss_waiting_bytes,
        rss_per_waiter_bytes: rss_waiting_bytes.saturating_sub(rss_before_bytes) as f64
            / sizes.s5_waiters.max(1) as f64,
    })
}
