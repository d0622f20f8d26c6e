//! Several tasks share a lease semaphore of capacity 2: at most two run at once, each with a
//! fencing token and a slot.
//!
//! ```text
//! cargo run -p redsem --example share            # against redis://127.0.0.1:6379
//! REDIS_URL=redis://host:6380 cargo run -p redsem --example share
//! ```

use std::process::ExitCode;
use std::time::Duration;

use redsem::{LeaseOptions, Redsem};

#[tokio::main]
async fn main() -> ExitCode {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let redsem = match Redsem::connect(&url).await {
        Ok(redsem) => redsem,
        Err(e) if e.is_unavailable() => {
            eprintln!(
                "no Redis at {url}: start one with `redis-server --daemonize yes` or point REDIS_URL elsewhere"
            );
            return ExitCode::from(69);
        }
        Err(e) => {
            eprintln!("cannot connect to {url}: {e}");
            return ExitCode::FAILURE;
        }
    };

    let mut tasks = Vec::new();
    for worker in 0..5 {
        let options = LeaseOptions::default()
            .lease(Duration::from_secs(5))
            .label(format!("worker-{worker}"));
        let sem = match redsem.lease_semaphore_with("example-share", 2, options) {
            Ok(sem) => sem,
            Err(e) => {
                eprintln!("{e}");
                return ExitCode::FAILURE;
            }
        };
        tasks.push(tokio::spawn(async move {
            let permit = sem.acquire().await?;
            println!(
                "worker-{worker}: got token {:>4} in slot {}",
                permit.token(),
                permit.slot()
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
            println!("worker-{worker}: done, releasing slot {}", permit.slot());
            permit.release().await
        }));
    }
    let mut failed = false;
    for task in tasks {
        match task.await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                eprintln!("{e}");
                failed = true;
            }
            Err(e) => {
                eprintln!("task failed: {e}");
                failed = true;
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
