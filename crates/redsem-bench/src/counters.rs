//! The S1 and S3 equivalents for `PermitSemaphore` and `CountDownLatch`, and S2's 64-task
//! point for `PermitSemaphore`.
//!
//! To know that a waiter really waits before it is released, these read (never write) one
//! key or channel of the layout in `docs/DESIGN.md`: the permit semaphore's `…:queue` zset and
//! the latch's `…:opened` channel. If that layout changes, the wait for readiness times out and
//! the scenario fails loudly.

use std::time::Duration;

use redsem::{CountDownLatch, PermitSemaphore};
use serde::Serialize;
use tokio::time::{Instant, timeout};

use crate::BenchResult;
use crate::admin::Admin;
use crate::core::{ContendedRun, CycleRun, HandoffRun, RawPair, STALL, contended, timed_cycles};
use crate::ctx::Ctx;
use crate::stats::Latency;

/// How long a waiter may take to show up in Redis.
const READY: Duration = Duration::from_secs(5);

#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct CountersRun {
    /// Permit semaphore of 5: try_acquire(1) + release(1).
    pub(crate) permits_s1: Option<CycleRun>,
    /// Permit semaphore of 8, 64 tasks on 1 client: acquire(1) (waiting) + release(1), no
    /// hold (S2's point).
    pub(crate) permits_s2: Option<ContendedRun>,
    /// Permit semaphore of 1: release(1) → a waiting acquire(1) returns.
    pub(crate) permits_s3: Option<HandoffRun>,
    /// Latch: try_set_count(1) + count_down().
    pub(crate) latch_s1: Option<CycleRun>,
    /// Latch of 1: count_down() → a waiting wait() returns.
    pub(crate) latch_s3: Option<HandoffRun>,
}

/// Poll `query` (an integer reply) until it is at least 1.
async fn until_positive(admin: &Admin, query: &redis::Cmd, what: &str) -> BenchResult<()> {
    let deadline = Instant::now() + READY;
    let mut conn = admin.conn();
    loop {
        let v: redis::Value = query.query_async(&mut conn).await?;
        let n = match v {
            redis::Value::Int(n) => n,
            // PUBSUB NUMSUB: [channel, count]
            redis::Value::Array(items) => match items.get(1) {
                Some(redis::Value::Int(n)) => *n,
                _ => 0,
            },
            _ => 0,
        };
        if n >= 1 {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("{what} did not show in Redis within {READY:?}").into());
        }
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

async fn permits_s1(ctx: &Ctx, prefix: &str) -> BenchResult<CycleRun> {
    let client = ctx.redsem(prefix).await?;
    let sem: PermitSemaphore = client.permit_semaphore("p1")?;
    sem.try_set_permits(5).await?;
    let mut yardstick = RawPair::new(&ctx.admin).await?;
    timed_cycles(
        &ctx.admin,
        ctx.sizes.s1_time,
        Some(&mut yardstick),
        || async {
            sem.try_acquire(1).await?;
            sem.release(1).await?;
            Ok(())
        },
    )
    .await
}

async fn permits_s2(ctx: &Ctx, prefix: &str) -> BenchResult<ContendedRun> {
    let client = ctx.redsem(prefix).await?;
    let sem = crate::sem::Permits(client.permit_semaphore("p2")?);
    sem.0.try_set_permits(8).await?;
    contended(&ctx.admin, &[sem], 64, 8, None, ctx.sizes.s2_time).await
}

async fn latch_s1(ctx: &Ctx, prefix: &str) -> BenchResult<CycleRun> {
    let client = ctx.redsem(prefix).await?;
    let latch: CountDownLatch = client.count_down_latch("l1")?;
    let mut yardstick = RawPair::new(&ctx.admin).await?;
    timed_cycles(
        &ctx.admin,
        ctx.sizes.s1_time,
        Some(&mut yardstick),
        || async {
            if !latch.try_set_count(1).await? {
                return Err("try_set_count found the latch counting".into());
            }
            latch.count_down().await?;
            Ok(())
        },
    )
    .await
}

async fn permits_s3(ctx: &Ctx, prefix: &str) -> BenchResult<HandoffRun> {
    let (holder, waiter) = (ctx.redsem(prefix).await?, ctx.redsem(prefix).await?);
    let (h, w) = (
        holder.permit_semaphore("p3")?,
        waiter.permit_semaphore("p3")?,
    );
    h.try_set_permits(1).await?;
    let mut queue = redis::cmd("ZCARD");
    queue.arg(format!("{prefix}:{{permits:p3}}:queue"));
    let mut sample = Vec::new();
    for _ in 0..ctx.sizes.s3_trials {
        h.try_acquire(1).await?;
        let w2 = w.clone();
        let task = tokio::spawn(async move {
            let got = w2.acquire(1).await;
            (Instant::now(), got)
        });
        until_positive(&ctx.admin, &queue, "the waiting permit request").await?;
        let released = Instant::now();
        h.release(1).await?;
        let (granted, got) = timeout(STALL, task).await??;
        got?;
        sample.push(granted.saturating_duration_since(released));
        w.release(1).await?;
    }
    Ok(HandoffRun {
        trials: sample.len(),
        handoff: Latency::of(&sample),
    })
}

async fn latch_s3(ctx: &Ctx, prefix: &str) -> BenchResult<HandoffRun> {
    let (setter, waiter) = (ctx.redsem(prefix).await?, ctx.redsem(prefix).await?);
    let (s, w) = (
        setter.count_down_latch("l3")?,
        waiter.count_down_latch("l3")?,
    );
    let mut listening = redis::cmd("PUBSUB");
    listening
        .arg("NUMSUB")
        .arg(format!("{prefix}:{{latch:l3}}:opened"));
    let mut sample = Vec::new();
    for _ in 0..ctx.sizes.s3_trials {
        if !s.try_set_count(1).await? {
            return Err("try_set_count found the latch counting".into());
        }
        let w2 = w.clone();
        let task = tokio::spawn(async move {
            let got = w2.wait().await;
            (Instant::now(), got)
        });
        until_positive(&ctx.admin, &listening, "the latch waiter's subscription").await?;
        let opened = Instant::now();
        s.count_down().await?;
        let (returned, got) = timeout(STALL, task).await??;
        got?;
        sample.push(returned.saturating_duration_since(opened));
        // Let the waiter's subscription go before the next trial looks for it.
        let mut conn = ctx.admin.conn();
        let deadline = Instant::now() + READY;
        loop {
            let v: (String, i64) = listening.query_async(&mut conn).await?;
            if v.1 == 0 || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_micros(200)).await;
        }
    }
    Ok(HandoffRun {
        trials: sample.len(),
        handoff: Latency::of(&sample),
    })
}

/// The S1 equivalents (`s1`) and the S3 equivalents (`s3`).
pub(crate) async fn run(ctx: &Ctx, s1: bool, s2: bool, s3: bool) -> BenchResult<CountersRun> {
    let prefix = ctx.prefix("pl");
    let mut out = CountersRun::default();
    if s1 {
        out.permits_s1 = Some(permits_s1(ctx, &prefix).await?);
        out.latch_s1 = Some(latch_s1(ctx, &prefix).await?);
    }
    if s2 {
        out.permits_s2 = Some(permits_s2(ctx, &prefix).await?);
    }
    if s3 {
        out.permits_s3 = Some(permits_s3(ctx, &prefix).await?);
        out.latch_s3 = Some(latch_s3(ctx, &prefix).await?);
    }
    ctx.clean(&prefix).await?;
    Ok(out)
}
