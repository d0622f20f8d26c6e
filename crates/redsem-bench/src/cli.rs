//! Command-line arguments.

use std::collections::BTreeSet;
use std::path::PathBuf;

use clap::Parser;

/// Benchmark redsem against the seeds' classic fair semaphore, the polling semaphore of npm
/// `redis-semaphore` and the raw EVALSHA limit, side by side on one Redis. Prints a table; `--out` writes every figure as JSON.
///
/// Exit status: 0 when every invariant held, 1 when one was violated or a scenario failed,
/// 2 for a usage or set-up error.
#[derive(Debug, Parser)]
#[command(name = "redsem-bench", version)]
pub(crate) struct Args {
    /// Redis to measure on; by default a throwaway `redis-server` is started (and stopped).
    #[arg(long)]
    pub(crate) url: Option<String>,

    /// Load redsem's native engine into the throwaway server (the module file,
    /// `cargo build --release -p redsem-module` makes target/release/libredsem_module.so):
    /// redsem's clients then serve by it (`Engine::Auto`), every other contender as before.
    /// Not with `--url` (load it into that server yourself).
    #[arg(long, value_name = "PATH", conflicts_with = "url")]
    pub(crate) module: Option<PathBuf>,
    /// Write every figure to this JSON file.
    #[arg(long, value_name = "FILE.json")]
    pub(crate) out: Option<PathBuf>,

    /// Every scenario at tiny sizes (a few seconds in all); invariants are still checked.
    #[arg(long)]
    pub(crate) smoke: bool,

    /// Run only these scenarios, e.g. `S1,S3,S7` (S7 = the seeds' algorithm through S1–S4,
    /// S9 = the polling baseline through S1–S4, S10 = many waiters, redsem and polling,
    /// S11 = steady state: a minute of uncontended cycles, Redis memory and server time,
    /// S12 = noisy neighbour: plain FIFO against fair shares between two tenants).
    #[arg(long, value_name = "S1,S2,...", value_parser = parse_scenarios)]
    pub(crate) only: Option<BTreeSet<u8>>,

    /// Also time S1 with a metrics recorder installed (the Prometheus exporter's), in slices
    /// alternating with S1 without one: what redsem's metrics cost.
    #[arg(long)]
    pub(crate) recorder: bool,

    /// Also time S1 on a primary with one replica (started here, whatever `--url` says)
    /// without and with `replica_acks(1, 100 ms)`, in alternating slices: what replica
    /// acknowledgements cost.
    #[arg(long)]
    pub(crate) acks: bool,

    /// Also time S3 (hand-off: release → the waiter's grant) on a Redis Cluster of three
    /// primaries started here (whatever `--url` says), holder and waiter on two clients, and
    /// count the pub/sub messages the cluster bus carried to the nodes that do not own the
    /// semaphore's slot.
    #[arg(long)]
    pub(crate) cluster_handoff: bool,

    /// Also run S2's hold loop (64 tasks, capacity 8, hold 1 ms) with every step of every
    /// cycle timestamped, for redsem on 1 and 4 clients and the polling baseline: where the
    /// hand-off time goes.
    #[arg(long)]
    pub(crate) hold_stages: bool,

    /// How long S11 (steady state) runs each semaphore, in seconds (default 60; 1 in
    /// `--smoke`). Its server time per cycle is compared between the first and the last 10 s.
    #[arg(long, value_name = "SECONDS", value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) s11_seconds: Option<u64>,

    /// Run redsem's clients with group commit off (`RedsemOptions::group_commit(false)`):
    /// one call per operation, as before group commit, for a before/after comparison.
    #[arg(long)]
    pub(crate) no_group_commit: bool,
}

impl Args {
    pub(crate) fn runs(&self, scenario: u8) -> bool {
        self.only.as_ref().is_none_or(|set| set.contains(&scenario))
    }
}

fn parse_scenarios(s: &str) -> Result<BTreeSet<u8>, String> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.strip_prefix(['S', 's'])
                .and_then(|n| n.parse::<u8>().ok())
                .filter(|n| (1..=12).contains(n))
                .ok_or_else(|| format!("unknown scenario {p:?}: expected S1 to S12"))
        })
        .collect::<Result<BTreeSet<u8>, String>>()
        .and_then(|set| {
            if set.is_empty() {
                Err("no scenario named".to_owned())
            } else {
                Ok(set)
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scenario_lists_accept_either_case_and_reject_unknown_ones() {
        assert_eq!(
            parse_scenarios("S1, s3,S7,S9,S10,S11,s12").unwrap(),
            BTreeSet::from([1, 3, 7, 9, 10, 11, 12])
        );
        assert!(parse_scenarios("S13").is_err());
        assert!(parse_scenarios("S0").is_err());
        assert!(parse_scenarios("x").is_err());
        assert!(parse_scenarios("").is_err());
    }
}
