//! `redsem-diff`: the differential runner on the command line (see the crate's docs).

use std::process::ExitCode;

use clap::Parser;
use redsem_verify::diff::{self, Config, EngineKind};

/// Send the same seeded calls to two engines of the protocol and compare every reply, every
/// message published and every key after each call.
#[derive(Debug, Parser)]
#[command(name = "redsem-diff")]
struct Args {
    /// The seeds to run, one run each: a number or a range such as 1..=20.
    #[arg(long, default_value = "1")]
    seeds: String,
    /// Calls per seed.
    #[arg(long, default_value_t = 2_000)]
    steps: u64,
    /// The first engine: scripts | scripts-general | native.
    #[arg(long, default_value = "scripts")]
    first: String,
    /// The second engine: scripts | scripts-general | native.
    #[arg(long, default_value = "scripts-general")]
    second: String,
    /// The module for the native engine (`cargo build --release -p redsem-module` makes
    /// target/release/libredsem_module.so).
    #[arg(long)]
    module: Option<std::path::PathBuf>,
}

fn seeds(text: &str) -> Option<Vec<u64>> {
    if let Some((from, to)) = text.split_once("..=") {
        let (from, to) = (from.parse::<u64>().ok()?, to.parse::<u64>().ok()?);
        return Some((from..=to).collect());
    }
    text.split(',').map(|s| s.trim().parse().ok()).collect()
}

fn main() -> ExitCode {
    let args = Args::parse();
    let (Some(first), Some(second)) = (
        EngineKind::parse(&args.first),
        EngineKind::parse(&args.second),
    ) else {
        eprintln!("redsem-diff: an engine is one of: scripts, scripts-general, native");
        return ExitCode::from(2);
    };
    let Some(seeds) = seeds(&args.seeds) else {
        eprintln!("redsem-diff: --seeds takes a number, a list (1,2,3) or a range (1..=20)");
        return ExitCode::from(2);
    };
    let base = Config {
        seed: 0,
        steps: args.steps,
        engines: [first, second],
        patches: Vec::new(),
        module: args.module.clone(),
    };
    let server_args = match base.server_args() {
        Ok(server_args) => server_args,
        Err(e) => {
            eprintln!("redsem-diff: {e}");
            return ExitCode::from(2);
        }
    };
    let server_args: Vec<&str> = server_args.iter().map(String::as_str).collect();
    let server = redsem_test::RedisServer::start_with(&server_args);
    let mut total = 0;
    for seed in seeds {
        let config = Config {
            seed,
            ..base.clone()
        };
        match diff::run(&server, &config) {
            Ok(report) => {
                total += report.steps;
                println!(
                    "seed {seed}: {} calls ({} replies lost, {} resends, {} faults), {} distinct outcomes{}",
                    report.steps,
                    report.lost,
                    report.resends,
                    report.faults,
                    report.outcomes.len(),
                    if report.divergence.is_some() {
                        ", DIFFERENT"
                    } else {
                        ", the same"
                    }
                );
                if let Some(divergence) = report.divergence {
                    eprintln!("{divergence}");
                    return ExitCode::FAILURE;
                }
            }
            Err(e) => {
                eprintln!("redsem-diff: seed {seed}: {e}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!(
        "{} and {}: the same over {total} calls",
        first.name(),
        second.name()
    );
    ExitCode::SUCCESS
}
