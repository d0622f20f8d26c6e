//! A mutex shared by three tasks (or processes, or machines): one at a time holds it, each
//! with a fencing token to hand to what it protects; `try_lock` gives up at once and
//! `lock_timeout` after a while.
//!
//! ```text
//! cargo run -p redsem --example mutex            # against redis://127.0.0.1:6379
//! REDIS_URL=redis://host:6380 cargo run -p redsem --example mutex
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
    let mutex = redsem.mutex("example-mutex")?;

    // Three workers, run concurrently (as separate processes would).
    let workers = (0..3).map(|worker| {
        let mutex = mutex.clone();
        async move {
            // Waits in line, first come first served.
            let guard = mutex.lock().await?;
            // The guard is a lease permit: its token grows with every holder.
            println!("worker-{worker}: holds the lock, token {}", guard.token());
            tokio::time::sleep(Duration::from_millis(200)).await;
            guard.unlock().await
        }
    });
    let workers = futures_util::future::try_join_all(workers);

    // While the workers take turns: one attempt, then a bounded wait.
    let main = async {
        tokio::time::sleep(Duration::from_millis(50)).await;
        match mutex.try_lock().await {
            Ok(guard) => guard.unlock().await?,
            Err(e) if e.is_not_acquired() => println!("main: try_lock: busy ({e})"),
            Err(e) => return Err(e),
        }
        match mutex.lock_timeout(Duration::from_secs(5)).await {
            Ok(guard) => {
                println!("main: got it after the workers, token {}", guard.token());
                guard.unlock().await
            }
            Err(e) if e.is_timeout() => {
                println!("main: still busy after 5 s");
                Ok(())
            }
            Err(e) => Err(e),
        }
    };
    tokio::try_join!(workers, main)?;
    Ok(())
}
