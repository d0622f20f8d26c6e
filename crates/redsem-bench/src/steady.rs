//! S11, steady state: uncontended cycles flat out on one name for a minute, from
//! several clients, for the lease semaphore and the permit semaphore. What a semaphore keeps
//! per cycle shows here: Redis's `used_memory` from start to end, the size of every key under
//! the semaphore's prefix at the end, and the server time per cycle window by window (a set
//! that grows with throughput makes the last window slower than the first).
//!
//! The key sizes are read from whatever keys exist under the scenario's prefix (`SCAN`), not
//! from a list of the layout's parts: each semaphore runs under a prefix of its own, so the
//! keys found are that name's keys and any per-client keys the library writes there, whatever
//! the layout (`crates/redsem/src/keys.rs` names today's).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use redsem::LeaseOptions;
use serde::Serialize;
use tokio::time::{Instant, sleep, sleep_until, timeout};

use crate::BenchResult;
use crate::admin::{Admin, KeySize};
use crate::core::{STALL, ServerLoad, Snap, uncontended_cycle};
use crate::ctx::Ctx;
use crate::sem::{self, BenchSem};
use crate::stats::rate;

/// Bytes in the MB of the figures (2^20, as `scripts/remembered_ids.py` prints them).
const MB: f64 = 1_048_576.0;

/// Cycles every task runs before the start is measured: scripts loaded, connections open.
const WARM_UP_CYCLES: u64 = 20;

/// One window of a steady run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Window {
    /// Seconds since the start (after the warm-up) at which the window began and ended.
    pub(crate) from_s: f64,
    pub(crate) to_s: f64,
    pub(crate) cycles: u64,
    pub(crate) cycles_per_s: f64,
    /// Server CPU per cycle: the `used_cpu_user + used_cpu_sys` delta of `INFO cpu` ÷ cycles
    /// (network and event loop included). The judged figure: CPU time the server used, which
    /// time it spent descheduled on a shared machine does not inflate.
    pub(crate) redis_cpu_us_per_cycle: f64,
    /// Server time per cycle of the script calls the clients sent (`INFO commandstats` `usec`
    /// of `fcall`/`evalsha`, the commands inside them included). The scripts alone, but timed
    /// by the wall clock around each call: a call descheduled midway counts the wait.
    pub(crate) command_us_per_cycle: f64,
    /// Redis `used_memory` at the window's end.
    pub(crate) used_memory_bytes: i64,
    pub(crate) server: ServerLoad,
}

/// One semaphore's steady run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SteadyRun {
    /// `Redsem` clients (each with its own connections) and tasks on each.
    pub(crate) clients: usize,
    pub(crate) tasks_per_client: usize,
    /// Units of the semaphore: one per task, so no try_acquire is ever refused.
    pub(crate) capacity: usize,
    pub(crate) elapsed_s: f64,
    pub(crate) cycles: u64,
    pub(crate) cycles_per_s: f64,
    /// Redis `used_memory` after the warm-up and at the end of the last window.
    pub(crate) used_memory_start_bytes: i64,
    pub(crate) used_memory_end_bytes: i64,
    /// End minus start, MB (2^20 bytes).
    pub(crate) used_memory_growth_mb: f64,
    /// Every key under the semaphore's prefix once the cycles stopped.
    pub(crate) keys: Vec<KeySize>,
    /// Server CPU per cycle (`Window::redis_cpu_us_per_cycle`) in the first and the last
    /// window: what "the last 10 s no slower than the first" is judged on.
    pub(crate) cpu_us_per_cycle: FirstLast,
    /// Server time in script calls per cycle (`Window::command_us_per_cycle`), same windows.
    pub(crate) command_us_per_cycle: FirstLast,
    pub(crate) windows: Vec<Window>,
}

/// A per-cycle figure in the first and the last window of a run.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub(crate) struct FirstLast {
    pub(crate) first_us: f64,
    pub(crate) last_us: f64,
    pub(crate) last_over_first: f64,
}

impl FirstLast {
    fn of(windows: &[Window], figure: impl Fn(&Window) -> f64) -> FirstLast {
        let first_us = windows.first().map_or(0.0, &figure);
        let last_us = windows.last().map_or(0.0, &figure);
        FirstLast {
            first_us,
            last_us,
            last_over_first: last_us / first_us.max(1e-9),
        }
    }
}

/// S11: the lease semaphore, then the permit semaphore.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SteadyStateRun {
    pub(crate) lease: SteadyRun,
    pub(crate) permits: SteadyRun,
}

/// The window boundaries of a run of `time` in windows of `window`, in seconds from the start:
/// whole windows, the last one shorter if `time` is not a multiple.
fn window_ends(time: Duration, window: Duration) -> Vec<Duration> {
    let window = window.max(Duration::from_millis(1));
    let mut ends = Vec::new();
    let mut end = Duration::ZERO;
    while end < time {
        end = (end + window).min(time);
        ends.push(end);
    }
    ends
}

/// Every task of `sems` (`Sizes::s11_tasks_per_client` on each) runs uncontended cycles
/// until told to stop; the server is read after the warm-up and at the end of every window.
/// The keys under `prefix` are measured, then removed.
async fn steady<S: BenchSem>(ctx: &Ctx, prefix: &str, sems: Vec<S>) -> BenchResult<SteadyRun> {
    let (admin, sz) = (&ctx.admin, &ctx.sizes);
    let (tasks_per_client, time, window) = (sz.s11_tasks_per_client, sz.s11_time, sz.s11_window);
    let tasks = sems.len() * tasks_per_client;
    let cycles = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut set = tokio::task::JoinSet::new();
    for i in 0..tasks {
        let sem = sems[i % sems.len()].clone();
        let (cycles, stop) = (cycles.clone(), stop.clone());
        set.spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                uncontended_cycle(&sem).await?;
                cycles.fetch_add(1, Ordering::Relaxed);
            }
            BenchResult::Ok(())
        });
    }
    let measured = measure_windows(admin, &cycles, tasks as u64, time, window).await;
    stop.store(true, Ordering::Relaxed);
    timeout(STALL, async {
        while let Some(joined) = set.join_next().await {
            joined??;
        }
        BenchResult::Ok(())
    })
    .await
    .map_err(|_| format!("S11 tasks did not stop within {STALL:?}"))??;
    let (start_bytes, elapsed, windows) = measured?;
    let end_bytes = windows.last().map_or(start_bytes, |w| w.used_memory_bytes);
    let keys = admin.key_sizes(&format!("{prefix}:*")).await?;
    let clients = sems.len();
    drop(sems);
    ctx.clean(prefix).await?;
    let total: u64 = windows.iter().map(|w| w.cycles).sum();
    Ok(SteadyRun {
        clients,
        tasks_per_client,
        capacity: tasks,
        elapsed_s: elapsed.as_secs_f64(),
        cycles: total,
        cycles_per_s: rate(total, elapsed),
        used_memory_start_bytes: start_bytes,
        used_memory_end_bytes: end_bytes,
        used_memory_growth_mb: (end_bytes - start_bytes) as f64 / MB,
        keys,
        cpu_us_per_cycle: FirstLast::of(&windows, |w| w.redis_cpu_us_per_cycle),
        command_us_per_cycle: FirstLast::of(&windows, |w| w.command_us_per_cycle),
        windows,
    })
}

/// Wait for the warm-up (`WARM_UP_CYCLES` per task), read `used_memory`, then read the server
/// at the end of every window: (`used_memory` at the start, time measured, windows).
async fn measure_windows(
    admin: &Admin,
    cycles: &AtomicU64,
    tasks: u64,
    time: Duration,
    window: Duration,
) -> BenchResult<(i64, Duration, Vec<Window>)> {
    let warm_up_until = Instant::now() + STALL;
    while cycles.load(Ordering::Relaxed) < WARM_UP_CYCLES * tasks {
        if Instant::now() > warm_up_until {
            return Err(format!("S11 warm-up not done within {STALL:?}").into());
        }
        sleep(Duration::from_millis(5)).await;
    }
    let start_bytes = admin.used_memory().await?;
    let start = Instant::now();
    let mut snap = Snap::take(admin).await?;
    let mut counted = cycles.load(Ordering::Relaxed);
    let mut from = Duration::ZERO;
    let mut windows = Vec::new();
    for end in window_ends(time, window) {
        sleep_until(start + end).await;
        let now = cycles.load(Ordering::Relaxed);
        let in_window = now - counted;
        let server = snap.load(admin, in_window).await?;
        let used_memory = admin.used_memory().await?;
        let to = start.elapsed();
        windows.push(Window {
            from_s: from.as_secs_f64(),
            to_s: to.as_secs_f64(),
            cycles: in_window,
            cycles_per_s: rate(in_window, to.saturating_sub(from)),
            redis_cpu_us_per_cycle: server.redis_cpu_us_per_cycle,
            command_us_per_cycle: server.command_usec_per_cycle,
            used_memory_bytes: used_memory,
            server,
        });
        snap = Snap::take(admin).await?;
        counted = cycles.load(Ordering::Relaxed);
        from = start.elapsed();
    }
    Ok((start_bytes, start.elapsed(), windows))
}

/// `clients` handles on the permit semaphore `s11` under `prefix`, one per `Redsem` client,
/// set to `capacity` permits.
async fn permit_sems(ctx: &Ctx, prefix: &str, capacity: u32) -> BenchResult<Vec<sem::Permits>> {
    let mut sems = Vec::with_capacity(ctx.sizes.s11_clients);
    for _ in 0..ctx.sizes.s11_clients {
        let client = ctx.redsem(prefix).await?;
        sems.push(sem::Permits(client.permit_semaphore("s11")?));
    }
    if let Some(first) = sems.first()
        && !first.0.try_set_permits(capacity).await?
    {
        return Err("S11: try_set_permits found the new permit semaphore already set".into());
    }
    Ok(sems)
}

pub(crate) async fn run(ctx: &Ctx) -> BenchResult<SteadyStateRun> {
    let sz = &ctx.sizes;
    let capacity = u32::try_from(sz.s11_clients * sz.s11_tasks_per_client)?;

    let prefix = ctx.prefix("s11-lease");
    ctx.admin.settle_memory().await?;
    let sems = ctx
        .redsem_sems(
            &prefix,
            "s11",
            capacity,
            LeaseOptions::default(),
            sz.s11_clients,
        )
        .await?;
    let lease = steady(ctx, &prefix, sems).await?;

    let prefix = ctx.prefix("s11-permits");
    ctx.admin.settle_memory().await?;
    let sems = permit_sems(ctx, &prefix, capacity).await?;
    let permits = steady(ctx, &prefix, sems).await?;
    Ok(SteadyStateRun { lease, permits })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_cover_the_time_the_last_one_shorter() {
        let s = Duration::from_secs;
        assert_eq!(
            window_ends(s(60), s(10)),
            (1..=6).map(|i| s(10 * i)).collect::<Vec<_>>()
        );
        assert_eq!(window_ends(s(25), s(10)), vec![s(10), s(20), s(25)]);
        assert_eq!(window_ends(s(5), s(10)), vec![s(5)]);
        assert!(window_ends(Duration::ZERO, s(10)).is_empty());
    }
}
