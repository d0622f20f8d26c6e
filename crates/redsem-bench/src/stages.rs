//! `--hold-stages`: where the time of S2's hold-1 ms loop goes. The same loop as
//! S2's hold point (64 tasks, capacity 8, each holder sleeping 1 ms before it releases), with
//! every step of every cycle timestamped in the task that ran it:
//!
//! acquire called → acquire returned (hold starts) → `sleep(1 ms)` returned → release sent →
//! release returned → (the unit's next holder's) acquire returned.
//!
//! redsem's units are matched from one holder to the next by slot (a released slot is the
//! one its next holder gets); the polling baseline has no slots, so only its per-task steps
//! are split.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::Duration;

use redsem::{LeaseOptions, LeasePermit};
use serde::Serialize;
use tokio::time::{Instant, timeout};

use crate::BenchResult;
use crate::admin::Admin;
use crate::core::{STALL, ServerLoad, Snap};
use crate::ctx::Ctx;
use crate::sem::{self, BenchSem};
use crate::stats::{Latency, rate};

/// The slot a permit holds, where the algorithm has slots.
pub(crate) trait Slotted {
    fn slot_of(&self) -> Option<u32>;
}

impl Slotted for LeasePermit {
    fn slot_of(&self) -> Option<u32> {
        Some(self.slot())
    }
}

impl Slotted for String {
    fn slot_of(&self) -> Option<u32> {
        None
    }
}

/// One cycle of one task, times from the start of the run.
#[derive(Debug, Clone, Copy)]
struct Cycle {
    slot: Option<u32>,
    called: Duration,
    granted: Duration,
    slept: Duration,
    released: Duration,
    /// Releases of this process in flight (sent, not answered) when this one was sent, itself
    /// included.
    releases_in_flight: usize,
    /// The release returned within the time (counted in the cycles/s).
    in_time: bool,
}

/// Share of a sample in each band of milliseconds.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Bands {
    /// [0, 1.5), [1.5, 2.5), [2.5, 3.5), [3.5, ∞) ms.
    pub(crate) below_1_5_ms: f64,
    pub(crate) ms_1_5_to_2_5: f64,
    pub(crate) ms_2_5_to_3_5: f64,
    pub(crate) above_3_5_ms: f64,
}

impl Bands {
    fn of(sample: &[Duration]) -> Bands {
        let n = sample.len().max(1) as f64;
        let share = |lo: f64, hi: f64| {
            sample
                .iter()
                .filter(|d| {
                    let ms = d.as_secs_f64() * 1e3;
                    ms >= lo && ms < hi
                })
                .count() as f64
                / n
        };
        Bands {
            below_1_5_ms: share(0.0, 1.5),
            ms_1_5_to_2_5: share(1.5, 2.5),
            ms_2_5_to_3_5: share(2.5, 3.5),
            above_3_5_ms: share(3.5, f64::INFINITY),
        }
    }
}

/// The stages of one algorithm's hold loop.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StagesRun {
    pub(crate) algorithm: &'static str,
    pub(crate) tasks: usize,
    pub(crate) clients: usize,
    pub(crate) capacity: usize,
    pub(crate) hold_ms: f64,
    pub(crate) cycles: u64,
    pub(crate) cycles_per_s: f64,
    /// Acquire called → returned.
    pub(crate) wait: Latency,
    /// Acquire returned → `sleep(hold)` returned: the hold as tokio's timer made it.
    pub(crate) hold: Latency,
    pub(crate) hold_bands: Bands,
    /// Release sent → release returned.
    pub(crate) release: Latency,
    /// Release sent → the same unit's next holder's acquire returned (redsem, matched by slot).
    pub(crate) handoff: Option<Latency>,
    /// Release returned → the next holder's acquire returned (may be negative: the waiter can
    /// run before the releasing task resumes; negative values count as 0 here).
    pub(crate) reply_to_next_holder: Option<Latency>,
    /// One unit's cycle: a holder's acquire returned → its next holder's (redsem, by slot).
    pub(crate) unit_cycle: Option<Latency>,
    pub(crate) unit_cycle_bands: Option<Bands>,
    /// Release returned → the same task's next acquire returned (its next turn).
    pub(crate) release_to_own_next_grant: Latency,
    /// Releases of the process in flight when one was sent (itself included).
    pub(crate) releases_in_flight: Latency,
    /// Sleeps that returned within 200 µs of the previous one, in a row: the mean size of a
    /// group of holders whose sleeps ended together (the timer fires them in one turn).
    pub(crate) mean_sleep_group: f64,
    /// Client→server round trips per cycle (redsem: `FCALL`s from commandstats; polling: its
    /// own count).
    pub(crate) round_trips_per_cycle: f64,
    /// This process's CPU (user + system, all threads) per cycle, µs: the client side's work,
    /// on the cores Redis shares.
    pub(crate) client_cpu_us_per_cycle: f64,
    /// Per cycle of the whole run (the cycles that ended after the time included).
    pub(crate) server: ServerLoad,
}

fn lat(sample: &[Duration]) -> Latency {
    Latency::of(sample)
}

/// The loop: how many tasks, the capacity, how long each holder holds, for how long.
#[derive(Clone, Copy)]
struct Shape {
    tasks: usize,
    capacity: usize,
    hold: Duration,
    time: Duration,
}

/// Run the hold loop on `sems` and split its cycles; `trips` counts a baseline's round trips.
async fn stages<S>(
    admin: &Admin,
    algorithm: &'static str,
    sems: &[S],
    shape: Shape,
    trips: Option<&AtomicU64>,
) -> BenchResult<StagesRun>
where
    S: BenchSem,
    S::Permit: Slotted,
{
    let Shape {
        tasks,
        capacity,
        hold,
        time,
    } = shape;
    let in_flight = Arc::new(AtomicUsize::new(0));
    let trips_before = trips.map(|t| t.load(Ordering::Relaxed));
    let snap = Snap::take(admin).await?;
    let cpu_before = process_cpu_seconds();
    let start = Instant::now();
    let deadline = start + time;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..tasks {
        let sem = sems[i % sems.len()].clone();
        let in_flight = in_flight.clone();
        set.spawn(async move {
            let mut log = Vec::new();
            while Instant::now() < deadline {
                let called = start.elapsed();
                let permit = sem.acquire(|| {}).await?;
                let granted = start.elapsed();
                let slot = permit.slot_of();
                tokio::time::sleep(hold).await;
                let slept = start.elapsed();
                let releases_in_flight = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                sem.release(permit).await?;
                in_flight.fetch_sub(1, Ordering::SeqCst);
                let released = start.elapsed();
                log.push(Cycle {
                    slot,
                    called,
                    granted,
                    slept,
                    released,
                    releases_in_flight,
                    in_time: Instant::now() <= deadline,
                });
            }
            BenchResult::Ok(log)
        });
    }
    let mut per_task = Vec::with_capacity(tasks);
    timeout(time + STALL, async {
        while let Some(joined) = set.join_next().await {
            per_task.push(joined??);
        }
        BenchResult::Ok(())
    })
    .await??;
    let client_cpu = process_cpu_seconds() - cpu_before;
    // Every cycle, the last ones that ended after the time included: the per-cycle ratios
    // count the commands of those too.
    let every = per_task.iter().map(Vec::len).sum::<usize>().max(1) as u64;
    let all: Vec<Cycle> = per_task
        .iter()
        .flatten()
        .copied()
        .filter(|c| c.in_time)
        .collect();
    let n = all.len() as u64;
    let mut server = snap.load(admin, every).await?;
    server.count_direct(S::DIRECT_COMMANDS);
    let round_trips_per_cycle = match (trips, trips_before) {
        (Some(t), Some(before)) => (t.load(Ordering::Relaxed) - before) as f64 / every as f64,
        _ => server.evalsha_per_cycle,
    };

    let wait: Vec<Duration> = all.iter().map(|c| c.granted - c.called).collect();
    let held: Vec<Duration> = all.iter().map(|c| c.slept - c.granted).collect();
    let release: Vec<Duration> = all.iter().map(|c| c.released - c.slept).collect();
    let flights: Vec<Duration> = all
        .iter()
        .map(|c| Duration::from_micros(c.releases_in_flight as u64))
        .collect();
    // A task's next turn: its release returned → its next acquire returned.
    let own_next: Vec<Duration> = per_task
        .iter()
        .flat_map(|log| {
            log.windows(2)
                .filter(|w| w[1].in_time)
                .map(|w| w[1].granted.saturating_sub(w[0].released))
        })
        .collect();
    // Sleep ends in time order, grouped when within 200 µs of the previous one.
    let mut ends: Vec<Duration> = all.iter().map(|c| c.slept).collect();
    ends.sort_unstable();
    let groups = 1 + ends
        .windows(2)
        .filter(|w| w[1] - w[0] > Duration::from_micros(200))
        .count();
    let mean_sleep_group = ends.len() as f64 / groups as f64;

    // redsem: one unit's successive holders, by slot.
    let mut by_slot: std::collections::BTreeMap<u32, Vec<Cycle>> = Default::default();
    for c in &all {
        if let Some(s) = c.slot {
            by_slot.entry(s).or_default().push(*c);
        }
    }
    let (mut handoff, mut reply_next, mut unit_cycle) = (Vec::new(), Vec::new(), Vec::new());
    for cycles in by_slot.values_mut() {
        cycles.sort_by_key(|c| c.granted);
        for w in cycles.windows(2) {
            let (a, b) = (w[0], w[1]);
            // Only a direct hand-off: the next holder was waiting when the unit was released.
            if b.called < a.slept {
                handoff.push(b.granted.saturating_sub(a.slept));
                reply_next.push(b.granted.saturating_sub(a.released));
                unit_cycle.push(b.granted - a.granted);
            }
        }
    }
    let slotted = !by_slot.is_empty();
    Ok(StagesRun {
        algorithm,
        tasks,
        clients: sems.len(),
        capacity,
        hold_ms: hold.as_secs_f64() * 1e3,
        cycles: n,
        cycles_per_s: rate(n, time),
        wait: lat(&wait),
        hold: lat(&held),
        hold_bands: Bands::of(&held),
        release: lat(&release),
        handoff: slotted.then(|| lat(&handoff)),
        reply_to_next_holder: slotted.then(|| lat(&reply_next)),
        unit_cycle: slotted.then(|| lat(&unit_cycle)),
        unit_cycle_bands: slotted.then(|| Bands::of(&unit_cycle)),
        release_to_own_next_grant: lat(&own_next),
        releases_in_flight: lat(&flights),
        mean_sleep_group,
        round_trips_per_cycle,
        client_cpu_us_per_cycle: client_cpu * 1e6 / every as f64,
        server,
    })
}

/// CPU seconds (user + system) this process has used, from `/proc/self/stat` (0 elsewhere).
fn process_cpu_seconds() -> f64 {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return 0.0;
    };
    // Fields after the command name (which ends with the last ')'): utime and stime are the
    // 12th and 13th of them, in clock ticks (100 a second on Linux).
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or("", |(_, rest)| rest)
        .split_whitespace()
        .collect();
    let ticks = |i: usize| {
        fields
            .get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(0.0)
    };
    (ticks(11) + ticks(12)) / 100.0
}

/// redsem on 1 and 4 clients, then the polling baseline on 1 connection, each the S2 hold
/// loop (64 tasks, capacity 8, `Sizes::s2_hold`) for `Sizes::s2_time`.
pub(crate) async fn run(ctx: &Ctx) -> BenchResult<Vec<StagesRun>> {
    let prefix = ctx.prefix("stages");
    let shape = Shape {
        tasks: 64,
        capacity: 8,
        hold: ctx.sizes.s2_hold,
        time: ctx.sizes.s2_time,
    };
    let capacity = shape.capacity;
    let mut out = Vec::new();
    for clients in [1, 4] {
        let sems = ctx
            .redsem_sems(
                &prefix,
                &format!("r{clients}"),
                capacity as u32,
                LeaseOptions::default(),
                clients,
            )
            .await?;
        out.push(stages(&ctx.admin, "redsem", &sems, shape, None).await?);
    }
    let trips = Arc::new(AtomicU64::new(0));
    let polling: Vec<sem::Polling> = ctx
        .polling_sems(&prefix, "p1", capacity as u64, 1, &trips)
        .await?;
    out.push(stages(&ctx.admin, "polling", &polling, shape, Some(&trips)).await?);
    ctx.clean(&prefix).await?;
    Ok(out)
}

/// The stages, one block per run, for stdout.
pub(crate) fn summary(runs: &[StagesRun]) -> String {
    use std::fmt::Write as _;
    let ms = |us: f64| format!("{:.3}", us / 1e3);
    let p = |l: &Latency| format!("{} / {} / {}", ms(l.p50_us), ms(l.mean_us), ms(l.p99_us));
    let opt = |l: &Option<Latency>| l.as_ref().map_or_else(|| "—".to_owned(), p);
    let bands = |b: &Bands| {
        format!(
            "<1.5 {:.0} %, 1.5–2.5 {:.0} %, 2.5–3.5 {:.0} %, ≥3.5 {:.0} %",
            b.below_1_5_ms * 1e2,
            b.ms_1_5_to_2_5 * 1e2,
            b.ms_2_5_to_3_5 * 1e2,
            b.above_3_5_ms * 1e2
        )
    };
    let mut out = String::from(
        "S2 hold loop, stage by stage (ms, p50 / mean / p99; 64 tasks, capacity 8):\n",
    );
    for r in runs {
        let _ = writeln!(
            out,
            "  {} on {} client(s), hold {} ms: {:.0} cycles/s, {:.2} round trips and {:.1} commands per cycle, Redis busy {:.0} %, {:.0} µs of Redis CPU and {:.0} µs of this process's per cycle",
            r.algorithm,
            r.clients,
            r.hold_ms,
            r.cycles_per_s,
            r.round_trips_per_cycle,
            r.server.commands_per_cycle,
            r.server.redis_cpu_share * 1e2,
            r.server.redis_cpu_us_per_cycle,
            r.client_cpu_us_per_cycle
        );
        let _ = writeln!(
            out,
            "    acquire returned → sleep returned (hold)   {}  [{}]",
            p(&r.hold),
            bands(&r.hold_bands)
        );
        let _ = writeln!(
            out,
            "    release sent → returned                    {}",
            p(&r.release)
        );
        let _ = writeln!(
            out,
            "    release returned → next holder's grant     {}",
            opt(&r.reply_to_next_holder)
        );
        let _ = writeln!(
            out,
            "    release sent → next holder's grant         {}",
            opt(&r.handoff)
        );
        let _ = writeln!(
            out,
            "    one unit's cycle                           {}  [{}]",
            opt(&r.unit_cycle),
            r.unit_cycle_bands
                .as_ref()
                .map_or_else(|| "—".to_owned(), bands)
        );
        let _ = writeln!(
            out,
            "    release returned → own next grant          {}",
            p(&r.release_to_own_next_grant)
        );
        let _ = writeln!(
            out,
            "    acquire wait                               {}",
            p(&r.wait)
        );
        let _ = writeln!(
            out,
            "    releases in flight at send p50 / max       {:.0} / {:.0}; holders whose sleeps end together: {:.1}",
            r.releases_in_flight.p50_us, r.releases_in_flight.max_us, r.mean_sleep_group
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bands_split_a_sample_by_milliseconds() {
        let sample: Vec<Duration> = [1_000u64, 1_900, 2_100, 2_600, 4_000]
            .iter()
            .map(|&us| Duration::from_micros(us))
            .collect();
        let b = Bands::of(&sample);
        assert_eq!(b.below_1_5_ms, 0.2);
        assert_eq!(b.ms_1_5_to_2_5, 0.4);
        assert_eq!(b.ms_2_5_to_3_5, 0.2);
        assert_eq!(b.above_3_5_ms, 0.2);
    }
}
