//! `--acks`: what replica acknowledgements (`RedsemOptions::replica_acks`) cost on S1's
//! cycle (try_acquire + release of a free unit), on a primary with one replica started here
//! (whatever `--url` says: the scenario needs a replica it knows is there).
//!
//! Two clients of the primary, one without acks and one with `replica_acks(1, 100 ms)`, run
//! the cycle in alternating slices, so both see the same machine. Every cycle with acks sends
//! its two scripts each with a `WAIT` in the same round trip; the primary's `INFO
//! commandstats` confirms how many `WAIT`s that was.

use std::time::{Duration, Instant};

use redsem::{LeaseOptions, Redsem, RedsemOptions};
use redsem_test::RedisServer;
use serde::Serialize;

use crate::BenchResult;
use crate::overhead::{cycle, slice};
use crate::sem;
use crate::stats::Latency;

/// The acknowledgement asked for: one replica, 100 ms.
const REPLICAS: usize = 1;
const TIMEOUT: Duration = Duration::from_millis(100);
/// Length of one slice.
const SLICE: Duration = Duration::from_millis(250);

/// S1's cycle without and with replica acks, timed in alternating slices.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct AcksOverhead {
    /// Replicas asked for, and the timeout, in ms.
    pub(crate) replicas: usize,
    pub(crate) timeout_ms: u64,
    /// try_acquire + release without acks.
    pub(crate) without: Latency,
    /// The same with `replica_acks(1, 100 ms)`.
    pub(crate) with: Latency,
    /// Cycles per second one task ran in each mode (1 / mean).
    pub(crate) without_cycles_per_s: f64,
    pub(crate) with_cycles_per_s: f64,
    /// `with.p50_us / without.p50_us - 1`, in percent.
    pub(crate) p50_overhead_pct: f64,
    /// `WAIT`s the primary ran per cycle with acks (2: the grant's and the release's).
    pub(crate) waits_per_cycle: f64,
}

/// Start a primary with one replica, then time the cycle for `time` in each mode.
pub(crate) async fn run(time: Duration) -> BenchResult<AcksOverhead> {
    // On this worker thread, which lives as long as the runtime: the harness kills a server
    // when the thread that started it ends.
    let (primary, replica) = tokio::task::block_in_place(|| {
        let primary = RedisServer::start();
        let replica = RedisServer::start_replica_of(&primary);
        (primary, replica)
    });
    let outcome = measure(&primary, time).await;
    tokio::task::block_in_place(|| drop((replica, primary)));
    outcome
}

async fn measure(primary: &RedisServer, time: Duration) -> BenchResult<AcksOverhead> {
    let url = primary.url();
    let connect = |options: RedsemOptions| Redsem::connect_with(&url, options.prefix("bench-acks"));
    let plain = connect(RedsemOptions::default()).await?;
    let acking = connect(RedsemOptions::default().replica_acks(REPLICAS, TIMEOUT)).await?;
    let without = sem::Redsem(plain.lease_semaphore_with("s1", 5, LeaseOptions::default())?);
    let with = sem::Redsem(acking.lease_semaphore_with("s1", 5, LeaseOptions::default())?);
    for _ in 0..20 {
        cycle(&without).await?;
        cycle(&with).await?;
    }
    let waits_before = waits(primary);
    let len = SLICE.min(time);
    let (mut plain_sample, mut acked_sample) = (Vec::new(), Vec::new());
    let mut elapsed = Duration::ZERO;
    while elapsed < time {
        let start = Instant::now();
        slice(&without, len, &mut plain_sample).await?;
        slice(&with, len, &mut acked_sample).await?;
        elapsed += start.elapsed() / 2;
    }
    let waits = waits(primary).saturating_sub(waits_before);
    plain.flush().await;
    acking.flush().await;
    let (without, with) = (Latency::of(&plain_sample), Latency::of(&acked_sample));
    let per_s = |l: &Latency| 1e6 / l.mean_us.max(1e-9);
    Ok(AcksOverhead {
        replicas: REPLICAS,
        timeout_ms: u64::try_from(TIMEOUT.as_millis()).unwrap_or(u64::MAX),
        without_cycles_per_s: per_s(&without),
        with_cycles_per_s: per_s(&with),
        p50_overhead_pct: (with.p50_us / without.p50_us.max(1e-9) - 1.0) * 100.0,
        waits_per_cycle: waits as f64 / with.count.max(1) as f64,
        without,
        with,
    })
}

/// `WAIT`s the server ran (`cmdstat_wait` of `INFO commandstats`).
fn waits(server: &RedisServer) -> u64 {
    let info = tokio::task::block_in_place(|| server.info("commandstats"));
    info.lines()
        .find_map(|line| line.strip_prefix("cmdstat_wait:calls="))
        .and_then(|rest| rest.split(',').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or(0)
}

impl AcksOverhead {
    /// The lines `redsem-bench` prints.
    pub(crate) fn summary(&self) -> String {
        format!(
            "S1 try_acquire + release on a primary with one replica, without / with \
             replica_acks({}, {} ms) (alternating slices):\n  \
             without: {:.0} cycles/s, p50 {:.1} µs, p99 {:.1} µs ({} cycles)\n  \
             with:    {:.0} cycles/s, p50 {:.1} µs, p99 {:.1} µs ({} cycles)\n  \
             overhead: p50 {:+.1} %; WAITs per cycle with acks: {:.2}",
            self.replicas,
            self.timeout_ms,
            self.without_cycles_per_s,
            self.without.p50_us,
            self.without.p99_us,
            self.without.count,
            self.with_cycles_per_s,
            self.with.p50_us,
            self.with.p99_us,
            self.with.count,
            self.p50_overhead_pct,
            self.waits_per_cycle,
        )
    }
}
