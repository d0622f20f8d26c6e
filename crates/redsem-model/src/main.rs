//! `cargo run --release -p redsem-model -- --clients 3 --capacity 2`: one exhaustive check,
//! its state count and time, and the counterexample of every property it broke.

use std::process::ExitCode;

use redsem_model::{Bug, Config, Faults, LeaseModel, check, describe_path};

const USAGE: &str = "usage: redsem-model [--clients N] [--capacity N] [--tries N] [--rounds N] [--horizon TICKS]
                    [--faults N] [--no-lose-reply] [--no-lose-wake] [--no-stall] [--no-restart]
                    [--state-loss] [--bug none|grant-skips-queue|release-keeps-slot|token-not-raised|no-clock-step|
                           stale-wake-up|news-cleared-on-resend|wake-after-resend|
                           mark-dropped-at-low|release-renumbered]
                    [--watch capacity|slots|validity|tokens|fifo|release|return] [--threads N]";

/// The prefixes of the `always` properties, for `--watch`.
const PROPERTIES: [&str; 7] = [
    "capacity", "slots", "validity", "tokens", "fifo", "release", "return",
];

fn main() -> ExitCode {
    match run(std::env::args().skip(1).collect()) {
        Ok(clean) if clean => ExitCode::SUCCESS,
        Ok(_) => ExitCode::FAILURE,
        Err(message) => {
            eprintln!("redsem-model: {message}\n{USAGE}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Vec<String>) -> Result<bool, String> {
    let (mut clients, mut capacity, mut rounds, mut horizon, mut threads) = (2, 1, 1, None, 1);
    let mut tries = 0;
    let mut faults = Faults {
        lose_reply: true,
        lose_wake: true,
        stall: 5,
        restart: true,
        state_loss: false,
        budget: 1,
    };
    let mut bug = Bug::None;
    let mut watch = None;
    let mut args = args.into_iter();
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or(format!("{arg} needs a value"));
        let number = |v: String| v.parse::<u8>().map_err(|_| format!("not a number: {v}"));
        match arg.as_str() {
            "--clients" => clients = number(value()?)?,
            "--capacity" => capacity = number(value()?)?,
            "--rounds" => rounds = number(value()?)?,
            "--tries" => tries = number(value()?)?,
            "--horizon" => horizon = Some(number(value()?)?),
            "--faults" => faults.budget = number(value()?)?,
            "--threads" => threads = number(value()?)?,
            "--no-lose-reply" => faults.lose_reply = false,
            "--no-lose-wake" => faults.lose_wake = false,
            "--no-stall" => faults.stall = 0,
            "--no-restart" => faults.restart = false,
            "--state-loss" => faults.state_loss = true,
            "--watch" => {
                let name = value()?;
                watch = Some(
                    PROPERTIES
                        .into_iter()
                        .find(|p| *p == name)
                        .ok_or(format!("no such property: {name}"))?,
                );
            }
            "--bug" => {
                let name = value()?;
                bug = Bug::from_name(&name).ok_or(format!("no such bug: {name}"))?;
            }
            other => return Err(format!("unknown argument {other}")),
        }
    }
    if !(1..=4).contains(&clients) || !(1..=4).contains(&capacity) {
        return Err(String::from("--clients and --capacity must be 1..=4"));
    }
    let mut cfg = Config::new(usize::from(clients), capacity)
        .with_tries(usize::from(tries))
        .with_rounds(usize::from(rounds))
        .with_faults(faults)
        .with_bug(bug);
    if let Some(horizon) = horizon {
        cfg = cfg.with_horizon(horizon);
    }
    println!("model: {cfg:?}");
    let model = match watch {
        Some(prefix) => LeaseModel::watching(cfg.clone(), prefix),
        None => LeaseModel::new(cfg.clone()),
    };
    let outcome = check(model.clone(), usize::from(threads));
    println!(
        "checked: {} unique states ({} generated), depth {}, {:.1} s",
        outcome.unique_states,
        outcome.states,
        outcome.max_depth,
        outcome.elapsed.as_secs_f64()
    );
    for name in &outcome.reached {
        println!("reached: {name}");
    }
    for name in &outcome.unreached {
        println!("not reached: {name}");
    }
    for (name, path) in &outcome.broken {
        println!("\nBROKEN: {name}\n{}", describe_path(&model, path));
    }
    Ok(outcome.broken.is_empty())
}
