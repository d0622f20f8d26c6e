//! S6, what Redis pays: commands per uncontended cycle (counted on the server with MONITOR,
//! which tells a client's commands from those a script runs), and memory per live holder,
//! per waiter and per idle semaphore.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt;
use redsem::LeaseOptions;
use serde::Serialize;
use tokio::time::timeout;

use crate::BenchResult;
use crate::core::STALL;
use crate::ctx::Ctx;
use crate::scale::{fill, start_waiters, stop_waiters};
use crate::sem::BenchSem;

/// Commands seen by the server during some cycles.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Wire {
    pub(crate) cycles: u64,
    /// Commands clients sent, per cycle (EVALSHA counts once, MULTI and EXEC count).
    pub(crate) client_commands_per_cycle: f64,
    pub(crate) client_commands: BTreeMap<String, f64>,
    /// Commands run inside scripts (`redis.call`), per cycle.
    pub(crate) script_calls_per_cycle: f64,
    pub(crate) script_calls: BTreeMap<String, f64>,
    /// Round trips per cycle, counted by the bench's own seeds client (redsem: one per
    /// EVALSHA by construction).
    pub(crate) round_trips_per_cycle: f64,
}

/// Memory Redis spends, in bytes.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Memory {
    pub(crate) holders: usize,
    /// `INFO memory` `used_memory` delta per live holder.
    pub(crate) per_holder_used_memory: f64,
    /// `MEMORY USAGE` of the semaphore's keys, delta per live holder.
    pub(crate) per_holder_keys: f64,
    pub(crate) waiters: usize,
    pub(crate) per_waiter_used_memory: f64,
    pub(crate) per_waiter_keys: f64,
    pub(crate) idle_semaphores: usize,
    pub(crate) per_idle_used_memory: f64,
    pub(crate) per_idle_keys: f64,
    /// Keys an idle semaphore keeps (all expire an hour after the last lease but the
    /// fencing-token counter).
    pub(crate) keys_per_idle: f64,
}

/// Server time of one kind of call, from SLOWLOG with a threshold of 0 µs.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct CallTime {
    /// What the bench called (in order of first appearance within a cycle).
    pub(crate) operation: String,
    /// The command and, for EVALSHA, the first 12 hex digits of the script's SHA1.
    pub(crate) command: String,
    pub(crate) calls: u64,
    pub(crate) mean_us: f64,
    pub(crate) p50_us: f64,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct CostRun {
    /// Server time of each redsem script of an uncontended cycle.
    pub(crate) redsem_script_times: Vec<CallTime>,
    /// The same for a `return 1` EVALSHA, for scale.
    pub(crate) raw_evalsha_time: Vec<CallTime>,
    pub(crate) redsem: Wire,
    pub(crate) seeds: Wire,
    pub(crate) memory: Memory,
}

/// One MONITOR line: (from a script?, command name).
fn parse_monitor(line: &str) -> Option<(bool, String)> {
    let open = line.find('[')?;
    let close = open + line[open..].find(']')?;
    let origin = &line[open + 1..close];
    let rest = &line[close + 1..];
    let q1 = rest.find('"')?;
    let q2 = q1 + 1 + rest[q1 + 1..].find('"')?;
    Some((
        origin.ends_with(" lua"),
        rest[q1 + 1..q2].to_ascii_lowercase(),
    ))
}

/// Run `work` (which performs `cycles` cycles) under MONITOR and count what the server ran.
async fn watch<F: Future<Output = BenchResult<()>>>(
    ctx: &Ctx,
    cycles: u64,
    work: F,
) -> BenchResult<Wire> {
    let mark = format!("{}-mark", ctx.prefix("s6"));
    let (start_mark, end_mark) = (format!("{mark}-start"), format!("{mark}-end"));
    let monitor = ctx.admin.client.get_async_monitor().await?;
    let (seen_start, started) = tokio::sync::oneshot::channel();
    let (start_q, end_q) = (format!("\"{start_mark}\""), format!("\"{end_mark}\""));
    let collector = tokio::spawn(async move {
        let mut lines = monitor.into_on_message::<String>();
        let mut seen_start = Some(seen_start);
        let mut out = Vec::new();
        while let Some(line) = lines.next().await {
            if line.contains(&start_q) {
                if let Some(tx) = seen_start.take() {
                    let _ = tx.send(());
                }
            } else if line.contains(&end_q) {
                break;
            } else if seen_start.is_none() {
                out.push(line);
            }
        }
        out
    });
    let echo = |m: &str| {
        let mut c = redis::cmd("ECHO");
        c.arg(m);
        c
    };
    let mut conn = ctx.admin.conn();
    // MONITOR takes effect asynchronously: repeat the start mark until it is seen.
    let mut started = started;
    loop {
        let _: String = echo(&start_mark).query_async(&mut conn).await?;
        tokio::select! {
            r = &mut started => { r?; break; }
            () = tokio::time::sleep(Duration::from_millis(20)) => {}
        }
    }
    work.await?;
    let _: String = echo(&end_mark).query_async(&mut conn).await?;
    let lines = timeout(STALL, collector).await??;
    let mut wire = Wire {
        cycles,
        ..Wire::default()
    };
    let n = cycles.max(1) as f64;
    for (lua, name) in lines.iter().filter_map(|l| parse_monitor(l)) {
        let map = if lua {
            &mut wire.script_calls
        } else {
            &mut wire.client_commands
        };
        *map.entry(name).or_default() += 1.0 / n;
    }
    wire.client_commands_per_cycle = wire.client_commands.values().sum();
    wire.script_calls_per_cycle = wire.script_calls.values().sum();
    Ok(wire)
}

fn text(v: &redis::Value) -> String {
    match v {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::SimpleString(s) => s.clone(),
        redis::Value::Int(n) => n.to_string(),
        _ => String::new(),
    }
}

async fn config_get(
    conn: &mut redis::aio::MultiplexedConnection,
    name: &str,
) -> BenchResult<String> {
    let v: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async(conn)
        .await?;
    Ok(v.get(1).cloned().unwrap_or_default())
}

async fn config_set(
    conn: &mut redis::aio::MultiplexedConnection,
    name: &str,
    value: &str,
) -> BenchResult<()> {
    let _: () = redis::cmd("CONFIG")
        .arg("SET")
        .arg(name)
        .arg(value)
        .query_async(conn)
        .await?;
    Ok(())
}

/// Run `work` with SLOWLOG recording every command, and return the server time of each kind
/// of call, named by `operations` in order of first appearance. The server's SLOWLOG settings
/// are restored afterwards.
async fn call_times<F: Future<Output = BenchResult<()>>>(
    ctx: &Ctx,
    operations: &[&str],
    work: F,
) -> BenchResult<Vec<CallTime>> {
    let mut conn = ctx.admin.conn();
    let threshold = config_get(&mut conn, "slowlog-log-slower-than").await?;
    let max_len = config_get(&mut conn, "slowlog-max-len").await?;
    config_set(&mut conn, "slowlog-max-len", "100000").await?;
    config_set(&mut conn, "slowlog-log-slower-than", "0").await?;
    let _: () = redis::cmd("SLOWLOG")
        .arg("RESET")
        .query_async(&mut conn)
        .await?;
    let worked = work.await;
    let log: redis::RedisResult<redis::Value> = redis::cmd("SLOWLOG")
        .arg("GET")
        .arg(-1)
        .query_async(&mut conn)
        .await;
    config_set(&mut conn, "slowlog-log-slower-than", &threshold).await?;
    config_set(&mut conn, "slowlog-max-len", &max_len).await?;
    worked?;
    let log = log?;
    // Oldest first; (command, durations) in order of first appearance.
    let mut entries = match log {
        redis::Value::Array(v) => v,
        _ => Vec::new(),
    };
    entries.reverse();
    let mut kinds: Vec<(String, Vec<f64>)> = Vec::new();
    for e in entries {
        let redis::Value::Array(fields) = e else {
            continue;
        };
        let (Some(redis::Value::Int(us)), Some(redis::Value::Array(args))) =
            (fields.get(2), fields.get(3))
        else {
            continue;
        };
        let name = args
            .first()
            .map(text)
            .unwrap_or_default()
            .to_ascii_lowercase();
        if !matches!(name.as_str(), "evalsha" | "eval" | "fcall") {
            continue;
        }
        let sha = args.get(1).map(text).unwrap_or_default();
        let command = format!("{name} {}", sha.get(..12).unwrap_or(&sha));
        match kinds.iter_mut().find(|k| k.0 == command) {
            Some(k) => k.1.push(*us as f64),
            None => kinds.push((command, vec![*us as f64])),
        }
    }
    Ok(kinds
        .into_iter()
        .enumerate()
        .map(|(i, (command, mut us))| {
            us.sort_by(f64::total_cmp);
            CallTime {
                operation: operations
                    .get(i)
                    .map_or_else(|| format!("call {i}"), |s| (*s).to_owned()),
                command,
                calls: us.len() as u64,
                mean_us: us.iter().sum::<f64>() / us.len().max(1) as f64,
                p50_us: crate::stats::percentile(&us, 50.0),
            }
        })
        .collect())
}

async fn cycles<S: BenchSem>(sem: &S, n: u64) -> BenchResult<()> {
    for _ in 0..n {
        let p = sem.try_acquire().await?.ok_or("no free unit")?;
        sem.release(p).await?;
    }
    Ok(())
}

/// Wait until `used_memory` stops moving (lazy frees, client buffers), then read it.
async fn quiet_memory(ctx: &Ctx) -> BenchResult<i64> {
    let mut last = ctx.admin.used_memory().await?;
    for _ in 0..20 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let now = ctx.admin.used_memory().await?;
        if now == last {
            break;
        }
        last = now;
    }
    Ok(last)
}

pub(crate) async fn run(ctx: &Ctx) -> BenchResult<CostRun> {
    let sizes = &ctx.sizes;
    let n = sizes.s6_cycles as u64;

    // Commands per uncontended cycle, redsem.
    let prefix = ctx.prefix("s6c");
    let sems = ctx
        .redsem_sems(&prefix, "cycle", 5, LeaseOptions::default(), 1)
        .await?;
    cycles(&sems[0], 10).await?; // scripts loaded
    let redsem_script_times =
        call_times(ctx, &["try_acquire", "release"], cycles(&sems[0], n)).await?;
    let sha: String = redis::cmd("SCRIPT")
        .arg("LOAD")
        .arg("return 1")
        .query_async(&mut ctx.admin.conn())
        .await?;
    let raw_evalsha_time = call_times(ctx, &["EVALSHA `return 1`"], async {
        let mut conn = ctx.admin.conn();
        for _ in 0..n {
            let _: i64 = redis::cmd("EVALSHA")
                .arg(&sha)
                .arg(0)
                .query_async(&mut conn)
                .await?;
        }
        Ok(())
    })
    .await?;
    let redsem = watch(ctx, n, cycles(&sems[0], n)).await?;
    let redsem = Wire {
        round_trips_per_cycle: redsem.client_commands_per_cycle,
        ..redsem
    };
    drop(sems);

    // The same for the seeds' algorithm.
    let trips = Arc::new(AtomicU64::new(0));
    let seeds = ctx.seeds_sems(&prefix, "cycle", 5, 1, &trips).await?;
    cycles(&seeds[0], 10).await?;
    let before = trips.load(Ordering::Relaxed);
    let mut seeds_wire = watch(ctx, n, cycles(&seeds[0], n)).await?;
    seeds_wire.round_trips_per_cycle =
        (trips.load(Ordering::Relaxed) - before) as f64 / n.max(1) as f64;
    drop(seeds);
    ctx.clean(&prefix).await?;

    // Memory per live holder and per waiter.
    let prefix = ctx.prefix("s6m");
    let options = LeaseOptions::default()
        .keepalive(false)
        .lease(Duration::from_secs(3600));
    let client = ctx.redsem(&prefix).await?;
    let capacity = u32::try_from(sizes.s6_holders + 1)?;
    let sem = client.lease_semaphore_with("memory", capacity, options)?;
    let first = sem.try_acquire().await?; // the semaphore exists from here on
    let pattern = format!("{prefix}:*");
    let (mem0, keys0) = (
        quiet_memory(ctx).await?,
        ctx.admin.memory_usage(&pattern).await?,
    );
    let held = fill(&sem, sizes.s6_holders).await?;
    let (mem1, keys1) = (
        quiet_memory(ctx).await?,
        ctx.admin.memory_usage(&pattern).await?,
    );
    // Now full: every new request waits.
    let waiting = start_waiters(&sem, sizes.s6_waiters).await?;
    let (mem2, keys2) = (
        quiet_memory(ctx).await?,
        ctx.admin.memory_usage(&pattern).await?,
    );
    stop_waiters(&sem, waiting).await?;
    for p in held {
        p.forget();
    }
    first.forget();
    ctx.clean(&prefix).await?;

    // Memory per idle semaphore: used once, then left alone.
    let prefix = ctx.prefix("s6i");
    let pattern = format!("{prefix}:*");
    let client = ctx.redsem(&prefix).await?;
    let mem3 = quiet_memory(ctx).await?;
    for i in 0..sizes.s6_idle {
        let s = client.lease_semaphore(&format!("idle-{i}"), 1)?;
        s.try_acquire().await?.release().await?;
    }
    let (mem4, keys4, nkeys) = (
        quiet_memory(ctx).await?,
        ctx.admin.memory_usage(&pattern).await?,
        ctx.admin.keys(&pattern).await?.len(),
    );
    ctx.clean(&prefix).await?;

    let per = |d: i64, n: usize| d as f64 / n.max(1) as f64;
    Ok(CostRun {
        redsem_script_times,
        raw_evalsha_time,
        redsem,
        seeds: seeds_wire,
        memory: Memory {
            holders: sizes.s6_holders,
            per_holder_used_memory: per(mem1 - mem0, sizes.s6_holders),
            per_holder_keys: per(keys1 - keys0, sizes.s6_holders),
            waiters: sizes.s6_waiters,
            per_waiter_used_memory: per(mem2 - mem1, sizes.s6_waiters),
            per_waiter_keys: per(keys2 - keys1, sizes.s6_waiters),
            idle_semaphores: sizes.s6_idle,
            per_idle_used_memory: per(mem4 - mem3, sizes.s6_idle),
            per_idle_keys: per(keys4, sizes.s6_idle),
            keys_per_idle: nkeys as f64 / sizes.s6_idle.max(1) as f64,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn monitor_lines_tell_client_commands_from_script_calls() {
        assert_eq!(
            parse_monitor(r#"1700000000.123456 [0 127.0.0.1:50000] "EVALSHA" "ab12" "7""#),
            Some((false, "evalsha".to_owned()))
        );
        assert_eq!(
            parse_monitor(r#"1700000000.123457 [0 lua] "zadd" "k" "1" "m""#),
            Some((true, "zadd".to_owned()))
        );
        assert_eq!(parse_monitor("OK"), None);
    }
}
