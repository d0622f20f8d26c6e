//! The blocking facade, for code without an async runtime: three threads share a semaphore of
//! capacity 2, each permit released when it is dropped.
//!
//! ```text
//! cargo run -p redsem --features blocking --example blocking   # against redis://127.0.0.1:6379
//! ```

mod support;

use std::process::ExitCode;
use std::thread;
use std::time::Duration;

use redsem::blocking::Redsem;

fn main() -> ExitCode {
    let url = support::redis_url();
    support::exit_code(&url, run(&url))
}

fn run(url: &str) -> redsem::Result<()> {
    let redsem = Redsem::connect(url)?;
    let exports = redsem.lease_semaphore("example-blocking", 2)?;
    let workers: Vec<_> = (1..=3)
        .map(|n| {
            let exports = exports.clone();
            thread::spawn(move || -> redsem::Result<()> {
                let permit = exports.acquire()?; // blocks in line, first come first served
                println!(
                    "worker {n}: token {} slot {}",
                    permit.token(),
                    permit.slot()
                );
                thread::sleep(Duration::from_millis(300));
                drop(permit); // released here, before the next line runs
                println!("worker {n}: done");
                Ok(())
            })
        })
        .collect();
    for worker in workers {
        match worker.join() {
            Ok(outcome) => outcome?,
            Err(_) => eprintln!("a worker panicked"),
        }
    }
    Ok(())
}
