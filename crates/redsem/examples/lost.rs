//! Stop the work when the lease is lost: the work runs under `tokio::select!` against
//! `LeasePermit::lost()`, which fires as soon as the permit is known gone, and at the latest
//! before its lease could have ended unrenewed (Redis unreachable, this process paused). Here
//! the loss is staged: an operator releases the permit by its id, as
//! `redsem release NAME ID` would, and the next renewal finds it gone.
//!
//! ```text
//! cargo run -p redsem --example lost             # against redis://127.0.0.1:6379
//! ```

mod support;

use std::process::ExitCode;
use std::time::Duration;

use redsem::{FencingToken, LeaseOptions, Redsem};

#[tokio::main]
async fn main() -> ExitCode {
    let url = support::redis_url();
    support::exit_code(&url, run(&url).await)
}

async fn run(url: &str) -> redsem::Result<()> {
    let redsem = Redsem::connect(url).await?;
    // Renewed every third of the lease while held.
    let options = LeaseOptions::default().lease(Duration::from_millis(900));
    let exports = redsem.lease_semaphore_with("example-lost", 1, options)?;
    let permit = exports.acquire().await?;
    println!(
        "holding permit {} with token {}",
        permit.id(),
        permit.token()
    );

    // The operator, elsewhere, takes the permit away after a second.
    let operator = exports.clone();
    let id = permit.id().clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(1)).await;
        println!("operator: releasing {id}");
        if let Err(e) = operator.release_id(&id).await {
            eprintln!("operator: {e}");
        }
    });

    tokio::select! {
        // Dropping the work future cancels it between two batches: nothing is written
        // after the permit is known lost.
        () = permit.lost() => {
            println!("lease lost: stopped the work; the next holder's token is larger");
        }
        () = work(permit.token()) => {
            permit.release().await?;
        }
    }
    Ok(())
}

/// Writes batches forever, each stamped with the fencing token so that the store can refuse
/// writes from a holder that has been overtaken.
async fn work(token: FencingToken) {
    for batch in 0.. {
        println!("writing batch {batch} with token {token}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
