//! The Rust side of `bench/cycle.py`: one uncontended cycle (try_acquire + release of a lease
//! permit) timed `N` times against the Redis at `URL`, from Rust, on a multi-thread runtime
//! like the Python package's. Prints one JSON line: median and p99 per cycle in µs.
//!
//! `cargo run --release --example cycle -- redis://127.0.0.1:PORT 2000`

use std::time::Instant;

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let url = args.next().ok_or("usage: cycle URL [N]")?;
    let n: usize = args.next().map_or(Ok(2000), |s| s.parse())?;
    let redsem = redsem::Redsem::connect(&url).await?;
    let sem = redsem.lease_semaphore("bench-cycle-rust", 1)?;
    for _ in 0..n / 10 {
        sem.try_acquire().await?.release().await?;
    }
    let mut micros = Vec::with_capacity(n);
    for _ in 0..n {
        let start = Instant::now();
        sem.try_acquire().await?.release().await?;
        micros.push(start.elapsed().as_secs_f64() * 1e6);
    }
    micros.sort_by(f64::total_cmp);
    let at = |q: f64| micros[((micros.len() - 1) as f64 * q).round() as usize];
    println!(
        "{{\"api\": \"rust\", \"n\": {n}, \"median_us\": {:.1}, \"p99_us\": {:.1}}}",
        at(0.5),
        at(0.99)
    );
    Ok(())
}
