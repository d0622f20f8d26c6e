//! The native engine answers every call as the scripts do: the differential runner
//! (crates/redsem-verify, docs/DIFFERENTIAL.md) sends the same seeded calls of every operation
//! to the Lua library and to this module in one server and compares every reply, every
//! message published and every key after each call. And a native path changed is seen.

mod support;

use redsem_test::RedisServer;
use redsem_verify::diff::{self, Config, EngineKind, Report};
use support::module;

fn config(seed: u64, steps: u64) -> Config {
    Config {
        seed,
        steps,
        engines: [EngineKind::Scripts, EngineKind::Native],
        patches: Vec::new(),
        module: Some(module()),
    }
}

fn run(server: &RedisServer, config: &Config) -> Report {
    diff::run(server, config)
        .unwrap_or_else(|e| panic!("seed {}: the run failed: {e}", config.seed))
}

fn server(config: &Config) -> RedisServer {
    let args = config.server_args().expect("the module's arguments");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    RedisServer::start_with(&args)
}

#[test]
fn the_native_engine_answers_every_call_as_the_scripts() {
    let server = server(&config(1, 0));
    let mut calls = 0;
    // Seeds 1 to 4; fewer with REDSEM_MODULE_DIFF_SEEDS (the mutation run: each mutant pays
    // for a whole test run).
    let seeds = std::env::var("REDSEM_MODULE_DIFF_SEEDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(4);
    for seed in 1..=seeds {
        let report = run(&server, &config(seed, 2_500));
        if let Some(divergence) = &report.divergence {
            panic!("seed {seed}: {divergence}");
        }
        assert_eq!(report.steps, 2_500);
        assert!(
            report.lost > 0 && report.resends > 0 && report.faults > 0,
            "seed {seed}: {report:?}"
        );
        calls += report.steps;
    }
    // The native paths were taken: the module answered a good share of the calls without
    // running the Lua (the uncontended cycles and the lease's general paths: about a fifth).
    let (_, _, _, native, lua): (String, String, String, u64, u64) = redis::cmd("REDSEM.ENGINE")
        .query(&mut server.connection())
        .expect("REDSEM.ENGINE");
    eprintln!("{calls} calls: {native} native, {lua} by the Lua");
    assert_eq!(native + lua, calls, "every call reaches the module once");
    assert!(
        native > calls / 8,
        "only {native} of {calls} calls took a native path"
    );
}
