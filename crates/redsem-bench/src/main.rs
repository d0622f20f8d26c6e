//! `redsem-bench`: measures redsem against the seeds' classic fair semaphore, the polling
//! semaphore of npm `redis-semaphore` and the raw EVALSHA limit, side by side in one run on
//! one Redis. See `docs/BENCHMARKS.md`.

mod acks;
mod admin;
mod cli;
mod cluster;
mod core;
mod cost;
mod counters;
mod ctx;
mod many;
mod noisy;
mod overhead;
mod raw;
mod report;
mod run;
mod scale;
mod sem;
mod stages;
mod stats;
mod steady;

use std::process::ExitCode;

use clap::Parser;

/// The error of a failed scenario or set-up step.
pub(crate) type BenchResult<T> = Result<T, Box<dyn std::error::Error + Send + Sync>>;

fn main() -> ExitCode {
    let args = cli::Args::parse();
    match run::run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("redsem-bench: {e}");
            ExitCode::from(2)
        }
    }
}
