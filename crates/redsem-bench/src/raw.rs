//! S8, the physical limit: a minimal EVALSHA (`return 1`) and PING, at the concurrencies
//! the other scenarios use, on the same server.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use serde::Serialize;
use tokio::time::Instant;

use crate::BenchResult;
use crate::core::Snap;
use crate::ctx::Ctx;
use crate::stats::{Latency, rate};

#[derive(Debug, Clone, Serialize)]
pub(crate) struct RawPoint {
    pub(crate) tasks: usize,
    pub(crate) connections: usize,
    pub(crate) evalsha_per_s: f64,
    pub(crate) evalsha: Latency,
    /// Server time of one `return 1` EVALSHA (`INFO commandstats`), µs.
    pub(crate) evalsha_usec_per_call: f64,
    /// Server CPU over wall time while EVALSHA ran (1.0 = one core busy).
    pub(crate) evalsha_redis_cpu_share: f64,
    pub(crate) ping_per_s: f64,
    pub(crate) ping: Latency,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct RawRun {
    pub(crate) points: Vec<RawPoint>,
}

impl RawRun {
    pub(crate) fn point(&self, tasks: usize, connections: usize) -> Option<&RawPoint> {
        self.points
            .iter()
            .find(|p| p.tasks == tasks && p.connections == connections)
    }
}

/// `tasks` tasks over `conns`, each sending `cmd` back to back for `time`.
async fn hammer(
    conns: &[MultiplexedConnection],
    tasks: usize,
    time: Duration,
    cmd: &redis::Cmd,
) -> BenchResult<(f64, Latency)> {
    let start = Instant::now();
    let deadline = start + time;
    let mut set = tokio::task::JoinSet::new();
    for i in 0..tasks {
        let mut conn = conns[i % conns.len()].clone();
        let cmd = cmd.clone();
        set.spawn(async move {
            let mut sample = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                let _: redis::Value = cmd.query_async(&mut conn).await?;
                sample.push(t.elapsed());
            }
            BenchResult::Ok(sample)
        });
    }
    let mut sample = Vec::new();
    while let Some(joined) = set.join_next().await {
        sample.extend(joined??);
    }
    let elapsed = start.elapsed();
    Ok((rate(sample.len() as u64, elapsed), Latency::of(&sample)))
}

/// Measure every `(tasks, connections)` point.
pub(crate) async fn run(ctx: &Ctx, points: &[(usize, usize)]) -> BenchResult<RawRun> {
    let mut admin = ctx.admin.conn();
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return 1")
        .query_async(&mut admin)
        .await?;
    let mut evalsha = redis::cmd("EVALSHA");
    evalsha.arg(&sha).arg(0);
    let ping = redis::cmd("PING");
    let most = points.iter().map(|p| p.1).max().unwrap_or(1);
    let mut conns = Vec::with_capacity(most);
    for _ in 0..most {
        conns.push(ctx.admin.client.get_multiplexed_async_connection().await?);
    }
    let mut out = Vec::new();
    for &(tasks, connections) in points {
        let conns = &conns[..connections];
        let snap = Snap::take(&ctx.admin).await?;
        let (evalsha_per_s, evalsha_lat) =
            hammer(conns, tasks, ctx.sizes.s8_time, &evalsha).await?;
        let load = snap.load(&ctx.admin, evalsha_lat.count as u64).await?;
        let (ping_per_s, ping_lat) = hammer(conns, tasks, ctx.sizes.s8_time, &ping).await?;
        out.push(RawPoint {
            tasks,
            connections,
            evalsha_per_s,
            evalsha: evalsha_lat,
            evalsha_usec_per_call: load.evalsha_usec_per_call,
            evalsha_redis_cpu_share: load.redis_cpu_share,
            ping_per_s,
            ping: ping_lat,
        });
    }
    Ok(RawRun { points: out })
}
