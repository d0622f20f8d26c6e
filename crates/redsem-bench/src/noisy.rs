//! S12, noisy neighbour: tenant A keeps hundreds of requests queued while tenant B sends a few
//! at a time, on one lease semaphore; once as the plain FIFO (no tenant named) and once with
//! both as tenants of equal weight. What B waits, and what the fair shares cost in cycles/s.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redsem::{LeaseOptions, LeaseSemaphore, Tenant};
use serde::Serialize;
use tokio::sync::watch;
use tokio::time::{Instant, sleep, timeout};

use crate::BenchResult;
use crate::core::{STALL, Snap};
use crate::ctx::Ctx;
use crate::stats::{Latency, rate};

/// One mode's S12 run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct NoisyRun {
    /// `fifo` (no tenant named) or `shares` (A and B tenants of weight 1).
    pub(crate) mode: &'static str,
    pub(crate) a_tasks: usize,
    pub(crate) b_tasks: usize,
    pub(crate) capacity: usize,
    pub(crate) hold_ms: f64,
    pub(crate) elapsed_s: f64,
    /// B's time from calling acquire to holding the permit (an acquire still waiting at the
    /// end counted with its wait so far), in ms.
    pub(crate) b_wait_p50_ms: f64,
    pub(crate) b_wait_p99_ms: f64,
    pub(crate) b_wait: Latency,
    /// A's waits (the backlog's).
    pub(crate) a_wait: Latency,
    /// Cycles of A and B together whose release returned within the time, per second.
    pub(crate) cycles_per_s: f64,
    pub(crate) a_cycles: u64,
    pub(crate) b_cycles: u64,
    /// capacity ÷ hold: the rate if every unit were always held.
    pub(crate) ceiling_per_s: f64,
    /// A's requests queued in Redis when B started.
    pub(crate) a_queued_at_start: usize,
    /// Most holders seen at once in this process.
    pub(crate) max_holders: usize,
    /// Every task came back within the stall limit after the time was up.
    pub(crate) all_finished: bool,
    /// Server CPU over wall time (`INFO cpu`).
    pub(crate) redis_cpu_share: f64,
}

/// S12: the plain FIFO, then fair shares, on the same sizes.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct NoisyNeighbourRun {
    pub(crate) fifo: NoisyRun,
    pub(crate) shares: NoisyRun,
}

/// What one task did.
#[derive(Default)]
struct TaskLog {
    waits: Vec<Duration>,
    /// When each of its releases returned.
    released: Vec<Instant>,
}

/// Loops acquire → hold → release until `stop` turns true (an acquire waiting then is
/// dropped: withdrawn, and counted with the time it had waited).
fn spawn_loop(
    set: &mut tokio::task::JoinSet<BenchResult<(bool, TaskLog)>>,
    sem: LeaseSemaphore,
    is_b: bool,
    hold: Duration,
    mut stop: watch::Receiver<bool>,
    holders: Arc<(AtomicUsize, AtomicUsize)>,
) {
    set.spawn(async move {
        let mut log = TaskLog::default();
        while !*stop.borrow() {
            let t = Instant::now();
            let permit = tokio::select! {
                permit = sem.acquire() => permit?,
                _ = stop.wait_for(|&stopped| stopped) => {
                    log.waits.push(t.elapsed());
                    break;
                }
            };
            log.waits.push(t.elapsed());
            let now_holding = holders.0.fetch_add(1, Ordering::SeqCst) + 1;
            holders.1.fetch_max(now_holding, Ordering::SeqCst);
            sleep(hold).await;
            holders.0.fetch_sub(1, Ordering::SeqCst);
            permit.release().await?;
            log.released.push(Instant::now());
        }
        BenchResult::Ok((is_b, log))
    });
}

async fn noisy(ctx: &Ctx, prefix: &str, shares: bool) -> BenchResult<NoisyRun> {
    let sz = &ctx.sizes;
    let (capacity, hold, time) = (sz.s12_capacity, sz.s12_hold, sz.s12_time);
    let name = if shares { "s12-shares" } else { "s12-fifo" };
    // A on two clients (its backlog), B on its own.
    let mut clients = Vec::new();
    let mut sems = Vec::new();
    for tenant in ["A", "A", "B"] {
        let client = ctx.redsem(prefix).await?;
        let mut options = LeaseOptions::default();
        if shares {
            options = options.tenant(Tenant::new(tenant));
        }
        sems.push(client.lease_semaphore_with(name, capacity as u32, options)?);
        clients.push(client);
    }
    let holders = Arc::new((AtomicUsize::new(0), AtomicUsize::new(0)));
    let mut set = tokio::task::JoinSet::new();
    // A's backlog first; the clock starts once Redis has queued it (all but the units free).
    let (stop_tx, stop_rx) = watch::channel(false);
    for i in 0..sz.s12_a_tasks {
        let (sem, stop, holders) = (sems[i % 2].clone(), stop_rx.clone(), holders.clone());
        spawn_loop(&mut set, sem, false, hold, stop, holders);
    }
    let backlog = sz.s12_a_tasks.saturating_sub(capacity);
    let a_queued_at_start = timeout(STALL, async {
        loop {
            let queued = sems[0].status().await?.waiters.len();
            if queued >= backlog {
                return BenchResult::Ok(queued);
            }
            sleep(Duration::from_millis(5)).await;
        }
    })
    .await??;
    let snap = Snap::take(&ctx.admin).await?;
    let start = Instant::now();
    let deadline = start + time;
    for _ in 0..sz.s12_b_tasks {
        let (sem, stop, holders) = (sems[2].clone(), stop_rx.clone(), holders.clone());
        spawn_loop(&mut set, sem, true, hold, stop, holders);
    }
    tokio::time::sleep_until(deadline).await;
    stop_tx.send_replace(true);
    let mut logs = Vec::new();
    let all_finished = timeout(STALL, async {
        while let Some(joined) = set.join_next().await {
            logs.push(joined??);
        }
        BenchResult::Ok(())
    })
    .await
    .map(|r| r.map(|()| true))
    .unwrap_or(Ok(false))?;
    set.abort_all();
    let in_time = |l: &TaskLog| {
        l.released
            .iter()
            .filter(|&&at| at >= start && at <= deadline)
            .count() as u64
    };
    let a_cycles: u64 = logs
        .iter()
        .filter(|(b, _)| !b)
        .map(|(_, l)| in_time(l))
        .sum();
    let b_cycles: u64 = logs
        .iter()
        .filter(|(b, _)| *b)
        .map(|(_, l)| in_time(l))
        .sum();
    let server = snap.load(&ctx.admin, a_cycles + b_cycles).await?;
    for client in &clients {
        timeout(STALL, client.flush()).await?;
    }
    let waits = |b: bool| -> Vec<Duration> {
        logs.iter()
            .filter(|(is_b, _)| *is_b == b)
            .flat_map(|(_, l)| l.waits.iter().copied())
            .collect()
    };
    let b_wait = Latency::of(&waits(true));
    Ok(NoisyRun {
        mode: if shares { "shares" } else { "fifo" },
        a_tasks: sz.s12_a_tasks,
        b_tasks: sz.s12_b_tasks,
        capacity,
        hold_ms: hold.as_secs_f64() * 1e3,
        elapsed_s: time.as_secs_f64(),
        b_wait_p50_ms: b_wait.p50_us / 1e3,
        b_wait_p99_ms: b_wait.p99_us / 1e3,
        b_wait,
        a_wait: Latency::of(&waits(false)),
        cycles_per_s: rate(a_cycles + b_cycles, time),
        a_cycles,
        b_cycles,
        ceiling_per_s: capacity as f64 / hold.as_secs_f64().max(1e-9),
        a_queued_at_start,
        max_holders: holders.1.load(Ordering::SeqCst),
        all_finished,
        redis_cpu_share: server.redis_cpu_share,
    })
}

pub(crate) async fn run(ctx: &Ctx) -> BenchResult<NoisyNeighbourRun> {
    let prefix = ctx.prefix("s12");
    let fifo = noisy(ctx, &prefix, false).await?;
    let shares = noisy(ctx, &prefix, true).await?;
    ctx.clean(&prefix).await?;
    Ok(NoisyNeighbourRun { fifo, shares })
}
