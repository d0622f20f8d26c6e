//! Counted permits as Redisson's `RSemaphore` has them: a pool of 4 GPUs shared by jobs that
//! take 1 or 2 at a time. Permits have no owner and no lease: whoever takes them gives them
//! back (and a crashed job does not), waiters are served first in, first out.
//!
//! ```text
//! cargo run -p redsem --example permits          # against redis://127.0.0.1:6379
//! ```

mod support;

use std::process::ExitCode;
use std::time::Duration;

use redsem::Redsem;

#[tokio::main]
async fn main() -> ExitCode {
    let url = support::redis_url();
    support::exit_code(&url, run(&url).await)
}

async fn run(url: &str) -> redsem::Result<()> {
    let redsem = Redsem::connect(url).await?;
    let gpus = redsem.permit_semaphore("example-gpus")?;
    // Start from a clean pool each run of the example; `try_set_permits` sets them only
    // if nobody has yet, which is what every job would call at start-up.
    gpus.delete().await?;
    gpus.try_set_permits(4).await?;
    println!("available: {}", gpus.available_permits().await?);

    // Four jobs, run concurrently (as separate processes would).
    let jobs = [(0, 2), (1, 2), (2, 1), (3, 2)].map(|(job, wants)| {
        let gpus = gpus.clone();
        async move {
            gpus.acquire(wants).await?;
            println!("job-{job}: training on {wants} GPU(s)");
            tokio::time::sleep(Duration::from_millis(200)).await;
            // Give back what was taken; a release is applied once even if resent.
            gpus.release(wants).await?;
            println!("job-{job}: done");
            Ok::<_, redsem::Error>(())
        }
    });
    futures_util::future::try_join_all(jobs).await?;

    // One GPU out for repair: the count may go below what is taken.
    gpus.add_permits(-1).await?;
    match gpus.try_acquire(4).await {
        Err(e) if e.is_not_acquired() => println!("4 at once: {e}"),
        other => other?,
    }
    println!("available: {}", gpus.available_permits().await?);
    gpus.delete().await?;
    Ok(())
}
