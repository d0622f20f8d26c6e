//! A countdown latch: a deploy waits until three workers have warmed their caches; each
//! counts down once when ready, and every waiter, in every process, is let through at 0.
//!
//! ```text
//! cargo run -p redsem --example latch            # against redis://127.0.0.1:6379
//! ```

mod support;

use std::process::ExitCode;
use std::time::Duration;

use redsem::{LatchState, Redsem};

#[tokio::main]
async fn main() -> ExitCode {
    let url = support::redis_url();
    support::exit_code(&url, run(&url).await)
}

async fn run(url: &str) -> redsem::Result<()> {
    let redsem = Redsem::connect(url).await?;
    let warm = redsem.count_down_latch("example-caches-warm")?;
    warm.delete().await?;
    // Whoever comes first sets it; a second `try_set_count` while counting is refused.
    assert!(warm.try_set_count(3).await?);

    // Three workers, run concurrently with the deploy (as separate processes would).
    let workers = (1..=3u64).map(|worker| {
        let warm = warm.clone();
        async move {
            tokio::time::sleep(Duration::from_millis(150 * worker)).await;
            println!("worker-{worker}: cache warm");
            // Counts once, even if resent after a dropped connection.
            warm.count_down().await.map(drop)
        }
    });
    let workers = futures_util::future::try_join_all(workers);

    let deploy = async {
        if let LatchState::Counting(n) = warm.state().await? {
            println!("deploy: waiting for {n} workers");
        }
        match warm.wait_timeout(Duration::from_secs(10)).await {
            Ok(()) => println!("deploy: all warm, switching traffic"),
            Err(e) if e.is_timeout() => {
                println!("deploy: {} still cold after 10 s", warm.count().await?);
            }
            Err(e) => return Err(e),
        }
        Ok(())
    };
    tokio::try_join!(workers, deploy)?;
    // Open now, and remembered as opened (not "never set") for a while.
    println!("state: {:?}", warm.state().await?);
    Ok(())
}
