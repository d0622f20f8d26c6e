//! The client's side of a cycle, for counting its instructions with callgrind
//! (`scripts/client_instructions.py` runs it twice under valgrind and takes the difference, so
//! start-up and connecting cancel out).
//!
//! ```text
//! client_cycle URL lease|polling|contended|floor CYCLES
//! ```
//!
//! * `lease`: one redsem client, capacity 5, `try_acquire` then `release`, back to back.
//! * `polling`: the polling baseline's cycle as redsem-bench's S9 sends it (one `EVALSHA` of
//!   its attempt script, one `ZREM`) on a plain multiplexed connection.
//! * `contended`: 64 tasks of one redsem client, capacity 8, `acquire`, one `yield_now`,
//!   `release` (S2's loop).
//! * `floor`: the lease cycle's two calls as the native engine takes them
//!   (`REDSEM.LEASE_ACQUIRE`, `REDSEM.LEASE_RELEASE`: the same keys, arguments and replies as
//!   the library's, one session) sent by bare redis-rs with no library around them: what the
//!   protocol's commands and replies cost a client by themselves. Needs the module.
//!
//! Prints the time per cycle (meaningless under valgrind; a sanity check otherwise). Exits 1
//! with the error if a call fails.

use std::process::ExitCode;
use std::time::Instant;

/// The polling baseline's attempt, the script redsem-bench's S9 sends (limit 5, lock
/// timeout 10 s here).
const POLL_ATTEMPT: &str = include_str!("../src/poll_attempt.lua");

type Failure = Box<dyn std::error::Error + Send + Sync>;

async fn lease(url: &str, cycles: usize) -> Result<(), Failure> {
    let client = redsem::Redsem::connect(url).await?;
    let sem = client.lease_semaphore("client-cycle", 5)?;
    for _ in 0..cycles {
        sem.try_acquire().await?.release().await?;
    }
    Ok(())
}

async fn polling(url: &str, cycles: usize) -> Result<(), Failure> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let attempt = redis::Script::new(POLL_ATTEMPT);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)?
        .as_millis() as u64;
    for i in 0..cycles {
        let id = format!("{:032x}", rand::random::<u128>());
        let granted: i64 = attempt
            .key("client-cycle-poll")
            .arg(5)
            .arg(&id)
            .arg(now + i as u64)
            .arg(10_000)
            .invoke_async(&mut conn)
            .await?;
        if granted != 1 {
            return Err("the polling attempt was refused with nobody holding".into());
        }
        let _: i64 = redis::cmd("ZREM")
            .arg("client-cycle-poll")
            .arg(&id)
            .query_async(&mut conn)
            .await?;
    }
    Ok(())
}

async fn contended(url: &str, cycles: usize) -> Result<(), Failure> {
    let client = redsem::Redsem::connect(url).await?;
    let sem = client.lease_semaphore("client-cycle-contended", 8)?;
    let mut tasks = Vec::new();
    for _ in 0..64 {
        let sem = sem.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..cycles / 64 {
                let permit = sem.acquire().await?;
                tokio::task::yield_now().await;
                permit.release().await?;
            }
            Ok::<(), redsem::Error>(())
        }));
    }
    for task in tasks {
        task.await??;
    }
    Ok(())
}

async fn floor(url: &str, cycles: usize) -> Result<(), Failure> {
    let client = redis::Client::open(url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let keys: Vec<String> = ["leases", "queue", "state", "slots", "tenants", "tqueue"]
        .iter()
        .map(|part| format!("client-cycle:{{lease:floor}}:{part}"))
        .collect();
    let session = format!("{:032x}", rand::random::<u128>());
    let status = |reply: &redis::Value| match reply {
        redis::Value::Array(items) => match items.first() {
            Some(redis::Value::SimpleString(s)) => s.clone(),
            Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into_owned(),
            _ => String::new(),
        },
        _ => String::new(),
    };
    for i in 0..cycles as u64 {
        let id = format!("{:032x}", rand::random::<u128>());
        let (acquire, release) = (2 * i + 1, 2 * i + 2);
        let granted: redis::Value = redis::cmd("REDSEM.LEASE_ACQUIRE")
            .arg(&keys)
            .arg(&id)
            .arg(5)
            .arg(1)
            .arg(30_000)
            .arg("")
            .arg("0")
            .arg("try")
            .arg(10_000)
            .arg("c")
            .arg(format!("{acquire:x}"))
            .arg(&session)
            .arg(format!("{acquire:x}"))
            .arg("")
            .arg("")
            .arg("")
            .query_async(&mut conn)
            .await?;
        if status(&granted) != "GRANTED" {
            return Err(format!("acquire answered {granted:?}").into());
        }
        let released: redis::Value = redis::cmd("REDSEM.LEASE_RELEASE")
            .arg(&keys)
            .arg(&id)
            .arg("c")
            .arg(format!("{release:x}"))
            .arg(&session)
            .arg(format!("{release:x}"))
            .arg("r")
            .query_async(&mut conn)
            .await?;
        if status(&released) != "RELEASED" {
            return Err(format!("release answered {released:?}").into());
        }
    }
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().collect();
    let (Some(url), Some(kind), Some(Ok(cycles))) = (
        args.get(1),
        args.get(2),
        args.get(3).map(|n| n.parse::<usize>()),
    ) else {
        eprintln!("usage: client_cycle URL lease|polling|contended|floor CYCLES");
        return ExitCode::from(2);
    };
    let started = Instant::now();
    let done = match kind.as_str() {
        "lease" => lease(url, cycles).await,
        "polling" => polling(url, cycles).await,
        "contended" => contended(url, cycles).await,
        "floor" => floor(url, cycles).await,
        _ => {
            eprintln!("unknown cycle {kind:?}: lease, polling, contended or floor");
            return ExitCode::from(2);
        }
    };
    if let Err(err) = done {
        eprintln!("client_cycle {kind}: {err}");
        return ExitCode::FAILURE;
    }
    let per_cycle = started.elapsed().as_secs_f64() * 1e6 / cycles.max(1) as f64;
    println!("{kind}: {cycles} cycles, {per_cycle:.1} µs per cycle");
    ExitCode::SUCCESS
}
