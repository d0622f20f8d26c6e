//! S10, many waiters: far more tasks than units, each holding for a while, for redsem's lease
//! semaphore and the polling baseline. Where a fair queue with wake-ups should beat
//! pollers outright: the waiters cost Redis nothing while they wait, and nobody starves.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use redsem::LeaseOptions;
use serde::Serialize;
use tokio::time::{Instant, timeout, timeout_at};

use crate::BenchResult;
use crate::admin::Admin;
use crate::core::{STALL, ServerLoad, Snap};
use crate::ctx::Ctx;
use crate::sem::{self, BenchSem};
use crate::stats::{Latency, rate};

/// One algorithm's S10 run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ManyRun {
    pub(crate) tasks: usize,
    pub(crate) clients: usize,
    pub(crate) capacity: usize,
    pub(crate) hold_ms: f64,
    pub(crate) elapsed_s: f64,
    /// Cycles whose release returned within the time.
    pub(crate) cycles: u64,
    pub(crate) cycles_per_s: f64,
    /// capacity ÷ hold: the rate if every unit were always held.
    pub(crate) ceiling_per_s: f64,
    /// Time from calling acquire to holding the permit: every acquire that returned within
    /// the time, and every one still waiting when the time was up, counted with the time it
    /// had waited by then.
    pub(crate) wait: Latency,
    /// Acquires still waiting when the time was up (in `wait` with their wait so far).
    pub(crate) waiting_at_end: usize,
    /// Tasks that never got a permit in the whole time.
    pub(crate) never_granted: usize,
    /// Most holders seen at once in this process.
    pub(crate) max_holders: usize,
    /// Every task came back within the stall limit after the time was up.
    pub(crate) all_finished: bool,
    /// Server CPU over wall time (`INFO cpu`): 1.0 = one core fully busy.
    pub(crate) redis_cpu_share: f64,
    /// `INFO stats` `total_commands_processed` delta over wall time (commands run inside
    /// scripts included; the bench's own few `INFO` calls too).
    pub(crate) commands_per_s: f64,
    /// Client round trips per second (script calls and plain commands the clients sent, from
    /// `INFO commandstats`; calls inside scripts left out).
    pub(crate) client_commands_per_s: f64,
    pub(crate) server: ServerLoad,
}

/// S10: redsem and the polling baseline, one after the other, on the same sizes.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ManyWaitersRun {
    pub(crate) redsem: ManyRun,
    pub(crate) polling: ManyRun,
}

/// What one task did.
#[derive(Default)]
struct TaskLog {
    waits: Vec<Duration>,
    waiting_at_end: bool,
    granted: u64,
    cycles: u64,
}

/// `tasks` tasks spread over `sems` (one per client), each looping acquire → hold → release
/// until `time` is up; an acquire still waiting then is dropped (withdrawn).
async fn many<S: BenchSem>(
    admin: &Admin,
    sems: &[S],
    tasks: usize,
    capacity: usize,
    hold: Duration,
    time: Duration,
) -> BenchResult<ManyRun> {
    let holders = Arc::new(AtomicUsize::new(0));
    let max_holders = Arc::new(AtomicUsize::new(0));
    let commands_before = admin.total_commands().await?;
    let snap = Snap::take(admin).await?;
    let start = Instant::now();
    let deadline = start + time;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..tasks {
        let sem = sems[i % sems.len()].clone();
        let (holders, max_holders) = (holders.clone(), max_holders.clone());
        set.spawn(async move {
            let mut log = TaskLog::default();
            while Instant::now() < deadline {
                let t = Instant::now();
                let Ok(permit) = timeout_at(deadline, sem.acquire(|| {})).await else {
                    log.waits.push(t.elapsed());
                    log.waiting_at_end = true;
                    break;
                };
                let permit = permit?;
                log.waits.push(t.elapsed());
                log.granted += 1;
                let now_holding = holders.fetch_add(1, Ordering::SeqCst) + 1;
                max_holders.fetch_max(now_holding, Ordering::SeqCst);
                tokio::time::sleep(hold).await;
                holders.fetch_sub(1, Ordering::SeqCst);
                sem.release(permit).await?;
                if Instant::now() <= deadline {
                    log.cycles += 1;
                }
            }
            BenchResult::Ok(log)
        });
    }
    let mut logs = Vec::with_capacity(tasks);
    let all_finished = timeout(time + STALL, async {
        while let Some(joined) = set.join_next().await {
            logs.push(joined??);
        }
        BenchResult::Ok(())
    })
    .await
    .map(|r| r.map(|()| true))
    .unwrap_or(Ok(false))?;
    set.abort_all();
    let cycles: u64 = logs.iter().map(|l| l.cycles).sum();
    let wall = start.elapsed();
    let mut server = snap.load(admin, cycles).await?;
    let commands_after = admin.total_commands().await?;
    server.count_direct(S::DIRECT_COMMANDS);
    let waits: Vec<Duration> = logs.iter().flat_map(|l| l.waits.iter().copied()).collect();
    let client_commands = server
        .commandstats_per_cycle
        .iter()
        .filter(|(name, _)| is_client_command(name, S::DIRECT_COMMANDS))
        .map(|(_, per_cycle)| per_cycle)
        .sum::<f64>()
        * cycles as f64;
    Ok(ManyRun {
        tasks,
        clients: sems.len(),
        capacity,
        hold_ms: hold.as_secs_f64() * 1e3,
        elapsed_s: time.as_secs_f64(),
        cycles,
        cycles_per_s: rate(cycles, time),
        ceiling_per_s: capacity as f64 / hold.as_secs_f64().max(1e-9),
        wait: Latency::of(&waits),
        waiting_at_end: logs.iter().filter(|l| l.waiting_at_end).count(),
        never_granted: logs.iter().filter(|l| l.granted == 0).count() + (tasks - logs.len()),
        max_holders: max_holders.load(Ordering::SeqCst),
        all_finished,
        redis_cpu_share: server.redis_cpu_share,
        commands_per_s: rate(commands_after.saturating_sub(commands_before), wall),
        client_commands_per_s: client_commands / wall.as_secs_f64().max(1e-9),
        server,
    })
}

/// Whether `name` (as `INFO commandstats` names it) is a command a client sends: a script or
/// transaction call, or one of the algorithm's `direct` commands.
fn is_client_command(name: &str, direct: &[&str]) -> bool {
    matches!(
        name,
        "evalsha" | "eval" | "fcall" | "fcall_ro" | "evalsha_ro" | "eval_ro" | "multi" | "exec"
    ) || direct.contains(&name)
}

pub(crate) async fn run(ctx: &Ctx) -> BenchResult<ManyWaitersRun> {
    let sz = &ctx.sizes;
    let prefix = ctx.prefix("s10");
    let capacity = sz.s10_capacity;
    // redsem: its own clients, kept to flush the withdrawals of the acquires dropped at the end.
    let mut clients = Vec::with_capacity(sz.s10_clients);
    let mut sems = Vec::with_capacity(sz.s10_clients);
    for _ in 0..sz.s10_clients {
        let client = ctx.redsem(&prefix).await?;
        sems.push(sem::Redsem(client.lease_semaphore_with(
            "s10",
            capacity as u32,
            LeaseOptions::default(),
        )?));
        clients.push(client);
    }
    let redsem = many(
        &ctx.admin,
        &sems,
        sz.s10_tasks,
        capacity,
        sz.s10_hold,
        sz.s10_time,
    )
    .await?;
    for client in &clients {
        timeout(STALL, client.flush()).await?;
    }
    let trips = Arc::new(AtomicU64::new(0));
    let polling = ctx
        .polling_sems(&prefix, "s10", capacity as u64, sz.s10_clients, &trips)
        .await?;
    let polling = many(
        &ctx.admin,
        &polling,
        sz.s10_tasks,
        capacity,
        sz.s10_hold,
        sz.s10_time,
    )
    .await?;
    ctx.clean(&prefix).await?;
    Ok(ManyWaitersRun { redsem, polling })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn client_commands_are_the_calls_a_client_sends() {
        assert!(is_client_command("fcall", &[]));
        assert!(is_client_command("evalsha", &["zrem"]));
        assert!(is_client_command("zrem", &["zrem"]));
        assert!(!is_client_command("zrem", &[]));
        assert!(!is_client_command("zadd", &["zrem"]));
    }
}
