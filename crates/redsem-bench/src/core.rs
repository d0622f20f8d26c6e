//! S1–S4 written once over [`BenchSem`], so redsem, the seeds' algorithm (S7) and the polling
//! baseline (S9) run the very same measuring code.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use serde::Serialize;
use tokio::sync::oneshot;
use tokio::time::{Instant, timeout};

use crate::BenchResult;
use crate::admin::{Admin, CommandStats};
use crate::sem::BenchSem;
use crate::stats::{Latency, inversions, rate};

/// How long any single wait in a scenario may take before the scenario fails.
pub(crate) const STALL: Duration = Duration::from_secs(30);

/// What the server did during a measurement, per cycle.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct ServerLoad {
    /// `INFO commandstats` call deltas per cycle, by command. Commands run inside scripts are
    /// counted here too (under their own names); the admin's `INFO` calls are left out.
    pub(crate) commandstats_per_cycle: BTreeMap<String, f64>,
    /// EVALSHA calls per cycle: client→server commands for redsem, one round trip each.
    pub(crate) evalsha_per_cycle: f64,
    /// Mean server time of one EVALSHA (`usec` delta / `calls` delta), µs.
    pub(crate) evalsha_usec_per_call: f64,
    /// Server CPU (`used_cpu_user + used_cpu_sys` delta) per cycle, µs.
    pub(crate) redis_cpu_us_per_cycle: f64,
    /// Server CPU over wall time: 1.0 = one core fully busy (Redis runs commands on one).
    pub(crate) redis_cpu_share: f64,
    /// Every command Redis ran, per cycle: the sum of `commandstats_per_cycle` (calls inside
    /// scripts and transactions included, `MULTI` and `EXEC` included).
    pub(crate) commands_per_cycle: f64,
    /// `INFO commandstats` `usec` deltas per cycle, by command. A script's or an `EXEC`'s
    /// `usec` includes the calls it makes, which are also counted under their own names.
    pub(crate) commandstats_usec_per_cycle: BTreeMap<String, f64>,
    /// Server time of the commands the clients sent, per cycle (`usec` of the script and
    /// transaction calls, and of the algorithm's direct commands; the calls made inside are
    /// not added again), µs.
    pub(crate) command_usec_per_cycle: f64,
}

/// Commands that run others inside them, always sent by a client. Their `usec` includes
/// the calls they make.
const ENTRY_COMMANDS: &[&str] = &[
    "eval",
    "evalsha",
    "eval_ro",
    "evalsha_ro",
    "fcall",
    "fcall_ro",
    "multi",
    "exec",
];

impl ServerLoad {
    /// Add the server time of `direct` (commands the algorithm sends outside scripts and
    /// transactions) to `command_usec_per_cycle`.
    pub(crate) fn count_direct(&mut self, direct: &[&str]) {
        self.command_usec_per_cycle += direct
            .iter()
            .filter(|name| !ENTRY_COMMANDS.contains(name))
            .filter_map(|name| self.commandstats_usec_per_cycle.get(*name))
            .sum::<f64>();
    }
}

/// A snapshot of the server counters.
pub(crate) struct Snap {
    stats: CommandStats,
    cpu: f64,
    at: Instant,
}

impl Snap {
    pub(crate) async fn take(admin: &Admin) -> BenchResult<Snap> {
        Ok(Snap {
            stats: admin.commandstats().await?,
            cpu: admin.cpu_seconds().await?,
            at: Instant::now(),
        })
    }

    /// The load from `self` to now, spread over `cycles`.
    pub(crate) async fn load(self, admin: &Admin, cycles: u64) -> BenchResult<ServerLoad> {
        let mut meter = Meter::default();
        meter.add(admin, self).await?;
        Ok(meter.load(cycles))
    }
}

/// Server counters summed over several measured intervals.
#[derive(Default)]
pub(crate) struct Meter {
    stats: CommandStats,
    cpu: f64,
    wall: f64,
}

impl Meter {
    /// Add the interval from `from` to now.
    pub(crate) async fn add(&mut self, admin: &Admin, from: Snap) -> BenchResult<()> {
        let after = Snap::take(admin).await?;
        for (name, d) in after.stats.since(&from.stats).0 {
            if name == "info" {
                continue;
            }
            let sum = self.stats.0.entry(name).or_default();
            sum.calls += d.calls;
            sum.usec += d.usec;
        }
        self.cpu += (after.cpu - from.cpu).max(0.0);
        self.wall += after.at.duration_since(from.at).as_secs_f64();
        Ok(())
    }

    pub(crate) fn load(&self, cycles: u64) -> ServerLoad {
        let d = &self.stats;
        let n = cycles.max(1) as f64;
        // Script calls: EVALSHA, or FCALL where redsem runs its function library.
        let evalsha = d.calls("evalsha") + d.calls("fcall");
        let usec: BTreeMap<String, f64> =
            d.0.iter()
                .map(|(k, v)| (k.clone(), v.usec as f64 / n))
                .collect();
        let command_usec_per_cycle = ENTRY_COMMANDS
            .iter()
            .filter_map(|name| usec.get(*name))
            .sum();
        let commands = d.per(cycles);
        ServerLoad {
            commands_per_cycle: commands.values().sum(),
            commandstats_usec_per_cycle: usec,
            command_usec_per_cycle,
            evalsha_per_cycle: evalsha as f64 / n,
            evalsha_usec_per_call: if evalsha > 0 {
                (d.usec("evalsha") + d.usec("fcall")) as f64 / evalsha as f64
            } else {
                0.0
            },
            commandstats_per_cycle: commands,
            redis_cpu_us_per_cycle: self.cpu * 1e6 / n,
            redis_cpu_share: if self.wall > 0.0 {
                self.cpu / self.wall
            } else {
                0.0
            },
        }
    }
}

/// Two raw EVALSHA round trips (`return 1`), the yardstick of S1, timed in slices that
/// alternate with the measured cycles so both see the same machine load.
pub(crate) struct RawPair {
    conn: MultiplexedConnection,
    evalsha: redis::Cmd,
}

impl RawPair {
    pub(crate) async fn new(admin: &Admin) -> BenchResult<RawPair> {
        let mut conn = admin.client.get_multiplexed_async_connection().await?;
        let sha: String = redis::cmd("SCRIPT")
            .arg("LOAD")
            .arg("return 1")
            .query_async(&mut conn)
            .await?;
        let mut evalsha = redis::cmd("EVALSHA");
        evalsha.arg(sha).arg(0);
        Ok(RawPair { conn, evalsha })
    }

    async fn pair(&mut self) -> BenchResult<()> {
        for _ in 0..2 {
            let _: i64 = self.evalsha.query_async(&mut self.conn).await?;
        }
        Ok(())
    }
}

/// Length of one measuring slice when S1 alternates with its yardstick.
const SLICE: Duration = Duration::from_millis(250);

/// S1: one client, try_acquire + release in a loop.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CycleRun {
    pub(crate) cycles: u64,
    pub(crate) elapsed_s: f64,
    pub(crate) cycles_per_s: f64,
    /// Time of one try_acquire + release.
    pub(crate) cycle: Latency,
    /// Two raw EVALSHA round trips (`return 1`, one connection), timed in slices alternating
    /// with the cycles: the S1 yardstick under the same machine load.
    pub(crate) two_raw_evalsha: Option<Latency>,
    pub(crate) server: ServerLoad,
}

pub(crate) async fn cycles<S: BenchSem>(
    admin: &Admin,
    sem: &S,
    time: Duration,
    yardstick: Option<&mut RawPair>,
) -> BenchResult<CycleRun> {
    let mut run = timed_cycles(admin, time, yardstick, || uncontended_cycle(sem)).await?;
    run.server.count_direct(S::DIRECT_COMMANDS);
    Ok(run)
}

/// One try_acquire + release of a free unit.
pub(crate) async fn uncontended_cycle<S: BenchSem>(sem: &S) -> BenchResult<()> {
    let p = sem
        .try_acquire()
        .await?
        .ok_or("an uncontended try_acquire found no free unit")?;
    sem.release(p).await
}

/// The cycles of one measured loop, slice by slice.
#[derive(Default)]
struct Slices {
    meter: Meter,
    sample: Vec<Duration>,
    elapsed: Duration,
}

impl Slices {
    /// Run `cycle` back to back for `len`, metering the server.
    async fn slice<F, Fut>(
        &mut self,
        admin: &Admin,
        len: Duration,
        cycle: &mut F,
    ) -> BenchResult<()>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = BenchResult<()>>,
    {
        let snap = Snap::take(admin).await?;
        let start = Instant::now();
        while start.elapsed() < len {
            let t = Instant::now();
            cycle().await?;
            self.sample.push(t.elapsed());
        }
        self.elapsed += start.elapsed();
        self.meter.add(admin, snap).await
    }

    fn run(&self, two_raw_evalsha: Option<Latency>) -> CycleRun {
        let n = self.sample.len() as u64;
        CycleRun {
            cycles: n,
            elapsed_s: self.elapsed.as_secs_f64(),
            cycles_per_s: rate(n, self.elapsed),
            cycle: Latency::of(&self.sample),
            two_raw_evalsha,
            server: self.meter.load(n),
        }
    }
}

impl RawPair {
    /// Two raw round trips back to back for `len`, each pair's time pushed to `sample`.
    async fn slice(&mut self, len: Duration, sample: &mut Vec<Duration>) -> BenchResult<()> {
        let start = Instant::now();
        while start.elapsed() < len {
            let t = Instant::now();
            self.pair().await?;
            sample.push(t.elapsed());
        }
        Ok(())
    }
}

/// Run `cycle` back to back for `time` (after 20 warm-up cycles), in slices that alternate
/// with the `yardstick`, if any.
pub(crate) async fn timed_cycles<F, Fut>(
    admin: &Admin,
    time: Duration,
    mut yardstick: Option<&mut RawPair>,
    mut cycle: F,
) -> BenchResult<CycleRun>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = BenchResult<()>>,
{
    // Warm up: scripts loaded, connections open.
    for _ in 0..20 {
        cycle().await?;
    }
    let len = SLICE.min(time);
    let mut cycles = Slices::default();
    let mut reference = Vec::new();
    while cycles.elapsed < time {
        cycles.slice(admin, len, &mut cycle).await?;
        if let Some(raw) = yardstick.as_deref_mut() {
            raw.slice(len, &mut reference).await?;
        }
    }
    Ok(cycles.run(yardstick.map(|_| Latency::of(&reference))))
}

/// S1 on two semaphores at once: slices of `a`'s cycles, `b`'s cycles and the yardstick in
/// turn until each has run for `time`, so both see the same machine (the VM changes speed
/// for seconds at a time). Both runs carry the same yardstick.
pub(crate) async fn cycles_side_by_side<A: BenchSem, B: BenchSem>(
    admin: &Admin,
    a: &A,
    b: &B,
    time: Duration,
    yardstick: &mut RawPair,
) -> BenchResult<(CycleRun, CycleRun)> {
    let mut cycle_a = || uncontended_cycle(a);
    let mut cycle_b = || uncontended_cycle(b);
    for _ in 0..20 {
        cycle_a().await?;
        cycle_b().await?;
    }
    let len = SLICE.min(time);
    let (mut runs_a, mut runs_b) = (Slices::default(), Slices::default());
    let mut reference = Vec::new();
    while runs_a.elapsed < time {
        runs_a.slice(admin, len, &mut cycle_a).await?;
        runs_b.slice(admin, len, &mut cycle_b).await?;
        yardstick.slice(len, &mut reference).await?;
    }
    let raw = Latency::of(&reference);
    let (mut run_a, mut run_b) = (runs_a.run(Some(raw.clone())), runs_b.run(Some(raw)));
    run_a.server.count_direct(A::DIRECT_COMMANDS);
    run_b.server.count_direct(B::DIRECT_COMMANDS);
    Ok((run_a, run_b))
}

/// S2: many tasks over a few clients, acquire (waiting) + release for a fixed time.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ContendedRun {
    pub(crate) tasks: usize,
    pub(crate) clients: usize,
    pub(crate) capacity: usize,
    /// How long each holder held, ms; 0 = across one `yield_now` only.
    pub(crate) hold_ms: f64,
    pub(crate) cycles: u64,
    pub(crate) elapsed_s: f64,
    pub(crate) cycles_per_s: f64,
    /// Time from calling acquire to holding the permit.
    pub(crate) wait: Latency,
    /// Most holders seen at once in this process (counted between acquire and release).
    pub(crate) max_holders: usize,
    /// Every task came back within the stall limit after the time was up.
    pub(crate) all_finished: bool,
    pub(crate) server: ServerLoad,
}

pub(crate) async fn contended<S: BenchSem>(
    admin: &Admin,
    sems: &[S],
    tasks: usize,
    capacity: usize,
    hold: Option<Duration>,
    time: Duration,
) -> BenchResult<ContendedRun> {
    let holders = Arc::new(AtomicUsize::new(0));
    let max_holders = Arc::new(AtomicUsize::new(0));
    let snap = Snap::take(admin).await?;
    let start = Instant::now();
    let deadline = start + time;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..tasks {
        let sem = sems[i % sems.len()].clone();
        let (holders, max_holders) = (holders.clone(), max_holders.clone());
        set.spawn(async move {
            let mut waits = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                let p = sem.acquire(|| {}).await?;
                let waited = t.elapsed();
                let now_holding = holders.fetch_add(1, Ordering::SeqCst) + 1;
                max_holders.fetch_max(now_holding, Ordering::SeqCst);
                // Let other holders of this process overlap with this one.
                match hold {
                    Some(hold) => tokio::time::sleep(hold).await,
                    None => tokio::task::yield_now().await,
                }
                holders.fetch_sub(1, Ordering::SeqCst);
                sem.release(p).await?;
                if Instant::now() <= deadline {
                    waits.push(waited);
                }
            }
            BenchResult::Ok(waits)
        });
    }
    let mut waits = Vec::new();
    let all_finished = timeout(time + STALL, async {
        while let Some(joined) = set.join_next().await {
            waits.extend(joined??);
        }
        BenchResult::Ok(())
    })
    .await
    .map(|r| r.map(|()| true))
    .unwrap_or(Ok(false))?;
    set.abort_all();
    let n = waits.len() as u64;
    let mut server = snap.load(admin, n).await?;
    server.count_direct(S::DIRECT_COMMANDS);
    Ok(ContendedRun {
        tasks,
        clients: sems.len(),
        capacity,
        hold_ms: hold.map_or(0.0, |h| h.as_secs_f64() * 1e3),
        cycles: n,
        elapsed_s: time.as_secs_f64(),
        cycles_per_s: rate(n, time),
        wait: Latency::of(&waits),
        max_holders: max_holders.load(Ordering::SeqCst),
        all_finished,
        server,
    })
}

/// S3: capacity 1, one waiter: release → the waiter's grant.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct HandoffRun {
    pub(crate) trials: usize,
    /// From calling release on the holder to the waiter's acquire returning.
    pub(crate) handoff: Latency,
}

pub(crate) async fn handoff<S: BenchSem>(
    holder: &S,
    waiter: &S,
    trials: usize,
) -> BenchResult<HandoffRun> {
    let mut sample = Vec::with_capacity(trials);
    for _ in 0..trials {
        let held = timeout(STALL, holder.try_acquire())
            .await??
            .ok_or("S3: the holder found no free unit")?;
        let (queued_tx, queued_rx) = oneshot::channel();
        let w = waiter.clone();
        let task = tokio::spawn(async move {
            let got = w
                .acquire(move || {
                    let _ = queued_tx.send(());
                })
                .await;
            (Instant::now(), got)
        });
        timeout(STALL, queued_rx).await??;
        let released = Instant::now();
        holder.release(held).await?;
        let (granted, permit) = timeout(STALL, task).await??;
        sample.push(granted.saturating_duration_since(released));
        waiter.release(permit?).await?;
    }
    Ok(HandoffRun {
        trials,
        handoff: Latency::of(&sample),
    })
}

/// S4: waiters enqueued one at a time in a known order, then served.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FairnessRun {
    pub(crate) waiters: usize,
    /// Pairs served against arrival order (0 = strictly first-in-first-out).
    pub(crate) inversions: u64,
    /// Arrival index of each grant, in grant order.
    pub(crate) grant_order: Vec<usize>,
}

pub(crate) async fn fairness<S: BenchSem>(
    holder: &S,
    waiters: &[S],
    n: usize,
) -> BenchResult<FairnessRun> {
    let held = timeout(STALL, holder.try_acquire())
        .await??
        .ok_or("S4: the holder found no free unit")?;
    let served = Arc::new(AtomicUsize::new(0));
    let mut set = tokio::task::JoinSet::new();
    for arrival in 0..n {
        let sem = waiters[arrival % waiters.len()].clone();
        let served = served.clone();
        let (queued_tx, queued_rx) = oneshot::channel();
        set.spawn(async move {
            let permit = sem
                .acquire(move || {
                    let _ = queued_tx.send(());
                })
                .await?;
            // Capacity 1: grants are serial, so this counter is the grant order.
            let rank = served.fetch_add(1, Ordering::SeqCst);
            sem.release(permit).await?;
            BenchResult::Ok((rank, arrival))
        });
        // The next waiter starts only once this one is visibly waiting.
        timeout(STALL, queued_rx).await??;
    }
    holder.release(held).await?;
    let mut order = vec![usize::MAX; n];
    timeout(STALL, async {
        while let Some(joined) = set.join_next().await {
            let (rank, arrival) = joined??;
            order[rank] = arrival;
        }
        BenchResult::Ok(())
    })
    .await??;
    Ok(FairnessRun {
        waiters: n,
        inversions: inversions(&order),
        grant_order: order,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::admin::parse_commandstats;

    #[tokio::test]
    async fn side_by_side_cycles_alternate_and_share_one_yardstick() {
        use std::sync::atomic::AtomicU64;

        use redsem_test::{RedisServer, within};

        use crate::sem::Polling;

        let server = RedisServer::start();
        let admin = within(STALL, "connect", Admin::connect(&server.url()))
            .await
            .unwrap();
        let trips = Arc::new(AtomicU64::new(0));
        let (a, b) = (
            Polling::new(admin.conn(), "side:a", 5, trips.clone()),
            Polling::new(admin.conn(), "side:b", 5, trips.clone()),
        );
        let mut raw = within(STALL, "yardstick", RawPair::new(&admin))
            .await
            .unwrap();
        let time = Duration::from_millis(60);
        let (ra, rb) = within(
            STALL,
            "side by side",
            cycles_side_by_side(&admin, &a, &b, time, &mut raw),
        )
        .await
        .unwrap();
        for r in [&ra, &rb] {
            assert!(r.cycles > 0 && r.elapsed_s >= time.as_secs_f64());
            assert_eq!(r.server.commandstats_per_cycle.get("zrem"), Some(&1.0));
            assert!(r.server.command_usec_per_cycle > 0.0);
        }
        let (ya, yb) = (ra.two_raw_evalsha.unwrap(), rb.two_raw_evalsha.unwrap());
        assert!(ya.count > 0);
        assert_eq!(ya.count, yb.count);
    }

    #[test]
    fn server_time_per_cycle_counts_a_scripts_calls_once() {
        // Two cycles of the polling baseline: 2 EVALSHA (each running ZREMRANGEBYSCORE, ZCARD,
        // ZADD, PEXPIRE) and 2 ZREM sent by the client.
        let stats = parse_commandstats(
            "cmdstat_evalsha:calls=2,usec=30\r\n\
             cmdstat_zremrangebyscore:calls=2,usec=4\r\n\
             cmdstat_zcard:calls=2,usec=2\r\n\
             cmdstat_zadd:calls=2,usec=4\r\n\
             cmdstat_pexpire:calls=2,usec=2\r\n\
             cmdstat_zrem:calls=2,usec=6\r\n",
        );
        let meter = Meter {
            stats,
            cpu: 100e-6,
            wall: 1.0,
        };
        let mut load = meter.load(2);
        assert_eq!(load.commands_per_cycle, 6.0);
        assert_eq!(load.evalsha_per_cycle, 1.0);
        assert_eq!(load.redis_cpu_us_per_cycle, 50.0);
        // Only the scripts so far: 30 µs over 2 cycles.
        assert_eq!(load.command_usec_per_cycle, 15.0);
        load.count_direct(&["zrem"]);
        assert_eq!(load.command_usec_per_cycle, 18.0);
        // An entry command listed as direct is not counted twice.
        load.count_direct(&["evalsha"]);
        assert_eq!(load.command_usec_per_cycle, 18.0);
    }
}
