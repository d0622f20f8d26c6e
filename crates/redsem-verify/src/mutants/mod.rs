//! `redsem-mutants`: mutation testing of the Lua scripts. See docs/MUTANTS.md.
//!
//! Parse the flags, build the script-test binary and the soak once (feature `lua-dir`), make
//! the catalogue, pick the mutants asked for, judge each (library load, script tests, soak),
//! print one line each and a summary; exit 1 if a mutant not listed as equivalent survived
//! or the score is below `--min-score`.

pub mod catalogue;
pub mod judge;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitCode, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redsem_test::RedisServer;

use catalogue::{Mutant, Source, catalogue};
use judge::{Judge, Outcome};

const USAGE: &str = "\
usage: redsem-mutants [flags]
  --list                 print the catalogue (ids) and exit
  --show                 print each mutant's changed lines (- before, + after) and exit
  --filter SUBSTR        only mutants whose id contains SUBSTR (repeatable: any of them)
  --sample N             a seeded random sample of N mutants, stratified over the files
  --seed S               the sample's seed (default 1)
  --jobs J               mutants judged at once (default 1)
  --test-threads T       threads of one script-test run (default 2)
  --test-timeout SECS    one script-test run's limit (default 120)
  --soak-seeds A,B,..    the soak seeds run on a mutant the tests missed (default 1,2)
  --soak-secs SECS       each soak run's length (default 3)
  --no-soak              judge by the script tests alone
  --release              build the test binary and the soak in release
  --equivalent FILE      ids argued equivalent (default crates/redsem-verify/mutants/equivalent.txt)
  --json FILE            write every outcome as JSON
  --min-score PCT        fail below this score (default 90)";

#[derive(Debug)]
struct Args {
    list: bool,
    show: bool,
    filters: Vec<String>,
    sample: Option<usize>,
    seed: u64,
    jobs: usize,
    test_threads: usize,
    test_timeout: Duration,
    soak_seeds: Vec<u64>,
    soak_duration: Duration,
    release: bool,
    equivalent: PathBuf,
    json: Option<PathBuf>,
    min_score: f64,
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn parse(mut argv: impl Iterator<Item = String>) -> Result<Args, String> {
    let mut args = Args {
        list: false,
        show: false,
        filters: Vec::new(),
        sample: None,
        seed: 1,
        jobs: 1,
        test_threads: 2,
        test_timeout: Duration::from_secs(120),
        soak_seeds: vec![1, 2],
        soak_duration: Duration::from_secs(3),
        release: false,
        equivalent: repo_root().join("crates/redsem-verify/mutants/equivalent.txt"),
        json: None,
        min_score: 90.0,
    };
    while let Some(flag) = argv.next() {
        let mut value = || argv.next().ok_or_else(|| format!("{flag} needs a value"));
        let number = |v: String| v.parse::<u64>().map_err(|e| format!("{flag}: {e}"));
        match flag.as_str() {
            "--list" => args.list = true,
            "--show" => args.show = true,
            "--filter" => args.filters.push(value()?),
            "--sample" => args.sample = Some(usize::try_from(number(value()?)?).unwrap_or(0)),
            "--seed" => args.seed = number(value()?)?,
            "--jobs" => args.jobs = usize::try_from(number(value()?)?).unwrap_or(1).max(1),
            "--test-threads" => {
                args.test_threads = usize::try_from(number(value()?)?).unwrap_or(1).max(1);
            }
            "--test-timeout" => args.test_timeout = Duration::from_secs(number(value()?)?),
            "--soak-seeds" => {
                args.soak_seeds = value()?
                    .split(',')
                    .map(|s| s.trim().parse().map_err(|e| format!("--soak-seeds: {e}")))
                    .collect::<Result<_, _>>()?;
            }
            "--soak-secs" => args.soak_duration = Duration::from_secs(number(value()?)?),
            "--no-soak" => args.soak_seeds.clear(),
            "--release" => args.release = true,
            "--equivalent" => args.equivalent = value()?.into(),
            "--json" => args.json = Some(value()?.into()),
            "--min-score" => {
                args.min_score = value()?.parse().map_err(|e| format!("--min-score: {e}"))?;
            }
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown flag {other}\n{USAGE}")),
        }
    }
    Ok(args)
}

/// Every `.lua` file under `lua/`, by its path there without `.lua` (`lease/grants`).
fn sources() -> Result<Vec<Source>, String> {
    fn walk(dir: &Path, prefix: &str, out: &mut Vec<Source>) -> Result<(), String> {
        let entries = std::fs::read_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        for entry in entries.flatten() {
            let path = entry.path();
            let Some(name) = path.file_name().and_then(|s| s.to_str()) else {
                continue;
            };
            if path.is_dir() {
                walk(&path, &format!("{prefix}{name}/"), out)?;
            } else if let Some(stem) = name.strip_suffix(".lua") {
                let text = std::fs::read_to_string(&path)
                    .map_err(|e| format!("{}: {e}", path.display()))?;
                out.push(Source {
                    stem: format!("{prefix}{stem}"),
                    text,
                });
            }
        }
        Ok(())
    }
    let mut out = Vec::new();
    walk(&repo_root().join("crates/redsem/lua"), "", &mut out)?;
    out.sort_by(|a, b| a.stem.cmp(&b.stem));
    Ok(out)
}

/// Print the lines `m` changes in its file.
fn show(m: &Mutant, sources: &[Source]) {
    println!("{}", m.id);
    let Some(source) = sources.iter().find(|s| s.stem == m.file) else {
        return;
    };
    let before: Vec<&str> = source.text.lines().collect();
    let after: Vec<&str> = m.text.lines().collect();
    for (i, (b, a)) in before.iter().zip(&after).enumerate() {
        if b != a {
            println!("  {:>4} - {b}\n  {:>4} + {a}", i + 1, i + 1);
        }
    }
}

/// The ids argued equivalent, with their reasons: `id  reason` per line, `#` comments.
fn equivalents(path: &Path) -> Result<BTreeMap<String, String>, String> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
        Err(e) => return Err(format!("{}: {e}", path.display())),
    };
    Ok(text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| match l.split_once(char::is_whitespace) {
            Some((id, reason)) => (id.to_owned(), reason.trim().to_owned()),
            None => (l.to_owned(), String::new()),
        })
        .collect())
}

/// splitmix64: the sample's random numbers (reproducible from the seed alone).
fn next(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seeded sample of `n` mutants, each file's share proportional to its number of mutants
/// (at least one per file), in catalogue order.
fn sample(mutants: Vec<Mutant>, n: usize, seed: u64) -> Vec<Mutant> {
    let total = mutants.len();
    if n >= total {
        return mutants;
    }
    let mut by_file: BTreeMap<String, Vec<Mutant>> = BTreeMap::new();
    for m in mutants {
        by_file.entry(m.file.clone()).or_default().push(m);
    }
    let mut state = seed;
    let mut out = Vec::new();
    for (_, mut group) in by_file {
        // Largest-remainder rounding would be exact; rounding up per file keeps every file in
        // and overshoots by at most the number of files, trimmed below.
        let share = (group.len() * n).div_ceil(total).max(1);
        for i in (1..group.len()).rev() {
            let j = usize::try_from(next(&mut state) % (i as u64 + 1)).unwrap_or(0);
            group.swap(i, j);
        }
        group.truncate(share);
        out.extend(group);
    }
    while out.len() > n {
        let i = usize::try_from(next(&mut state) % out.len() as u64).unwrap_or(0);
        out.remove(i);
    }
    out.sort_by(|a, b| (&a.file, a.line, &a.id).cmp(&(&b.file, b.line, &b.id)));
    out
}

/// Build with cargo and return the path of the executable `cargo` reports for `wanted`
/// (`"redsem"` with `test`: the lib's test binary; `"redsem-soak"`: the soak).
fn build(args: &[&str], release: bool, wanted: &str, test: bool) -> Result<PathBuf, String> {
    let mut cmd = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    cmd.args(args).arg("--message-format=json");
    if release {
        cmd.arg("--release");
    }
    let out = cmd
        .current_dir(repo_root())
        .stderr(Stdio::inherit())
        .output()
        .map_err(|e| format!("cargo: {e}"))?;
    if !out.status.success() {
        return Err(format!("cargo {} failed", args.join(" ")));
    }
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        if msg["reason"] == "compiler-artifact"
            && msg["target"]["name"] == wanted
            && msg["profile"]["test"] == test
            && let Some(exe) = msg["executable"].as_str()
        {
            return Ok(exe.into());
        }
    }
    Err(format!(
        "cargo {} built no executable {wanted}",
        args.join(" ")
    ))
}

#[derive(Debug, serde::Serialize)]
struct Record {
    id: String,
    file: String,
    line: usize,
    operator: String,
    outcome: &'static str,
    detail: String,
    equivalent: Option<String>,
    seconds: f64,
}

pub fn main() -> ExitCode {
    match run(parse(std::env::args().skip(1))) {
        Ok(code) => code,
        Err(message) => {
            eprintln!("redsem-mutants: {message}");
            ExitCode::from(2)
        }
    }
}

fn run(args: Result<Args, String>) -> Result<ExitCode, String> {
    let args = args?;
    let sources = sources()?;
    let all = catalogue(&sources);
    let total = all.len();
    let mut chosen: Vec<Mutant> = all
        .into_iter()
        .filter(|m| {
            args.filters.is_empty() || args.filters.iter().any(|f| m.id.contains(f.as_str()))
        })
        .collect();
    if let Some(n) = args.sample {
        chosen = sample(chosen, n, args.seed);
    }
    if args.show {
        for m in &chosen {
            show(m, &sources);
        }
        return Ok(ExitCode::SUCCESS);
    }
    if args.list {
        for m in &chosen {
            println!("{}", m.id);
        }
        eprintln!("{} of {total} mutants", chosen.len());
        return Ok(ExitCode::SUCCESS);
    }
    let equivalent = equivalents(&args.equivalent)?;
    let started = Instant::now();
    let test_binary = build(
        &[
            "test",
            "-p",
            "redsem",
            "--lib",
            "--features",
            "lua-dir",
            "--no-run",
        ],
        args.release,
        "redsem",
        true,
    )?;
    let soak_binary = if args.soak_seeds.is_empty() {
        PathBuf::new()
    } else {
        build(
            &["build", "-p", "redsem-verify", "--bin", "redsem-soak"],
            args.release,
            "redsem-soak",
            false,
        )?
    };
    eprintln!(
        "redsem-mutants: built in {:.0} s; judging {} of {total} mutants",
        started.elapsed().as_secs_f64(),
        chosen.len()
    );
    let judge = Judge {
        test_binary,
        soak_binary,
        test_threads: args.test_threads,
        test_timeout: args.test_timeout,
        soak_seeds: args.soak_seeds.clone(),
        soak_duration: args.soak_duration,
    };
    // The unmutated scripts must pass, or every mutant would look killed.
    let baseline = Instant::now();
    match judge.tests("common", Path::new("/nonexistent")) {
        Outcome::Survived => {}
        other => return Err(format!("the unmutated scripts fail their tests: {other:?}")),
    }
    eprintln!(
        "redsem-mutants: unmutated script tests pass ({:.1} s)",
        baseline.elapsed().as_secs_f64()
    );
    let records = judge_all(&judge, &chosen, &equivalent, args.jobs);
    summarise(&args, &records, started)
}

fn judge_all(
    judge: &Judge,
    chosen: &[Mutant],
    equivalent: &BTreeMap<String, String>,
    jobs: usize,
) -> Vec<Record> {
    let next_mutant = AtomicUsize::new(0);
    let records = Mutex::new(Vec::new());
    let judge = Arc::new(judge.clone());
    std::thread::scope(|scope| {
        for _ in 0..jobs {
            scope.spawn(|| {
                let checker = RedisServer::start();
                loop {
                    let i = next_mutant.fetch_add(1, Ordering::Relaxed);
                    let Some(m) = chosen.get(i) else { break };
                    let t = Instant::now();
                    let outcome = judge.judge(m, &checker);
                    let seconds = t.elapsed().as_secs_f64();
                    let eq = equivalent.get(&m.id).cloned();
                    let mark = match (&outcome, &eq) {
                        (Outcome::Survived, Some(_)) => "equivalent",
                        _ => outcome.label(),
                    };
                    println!(
                        "{mark:<10} {:<44} {} ({seconds:.1} s)",
                        m.id,
                        outcome.detail().lines().next().unwrap_or("")
                    );
                    let record = Record {
                        id: m.id.clone(),
                        file: m.file.clone(),
                        line: m.line,
                        operator: m.operator.clone(),
                        outcome: outcome.label(),
                        detail: outcome.detail().to_owned(),
                        equivalent: eq,
                        seconds,
                    };
                    records
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push(record);
                }
            });
        }
    });
    let mut records = records
        .into_inner()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    records.sort_by(|a, b| (&a.file, a.line, &a.id).cmp(&(&b.file, b.line, &b.id)));
    records
}

fn summarise(args: &Args, records: &[Record], started: Instant) -> Result<ExitCode, String> {
    let count = |outcome: &str, eq: bool| {
        records
            .iter()
            .filter(|r| r.outcome == outcome && r.equivalent.is_some() == eq)
            .count()
    };
    let killed = count("killed", false) + count("killed", true);
    let timeout = count("timeout", false) + count("timeout", true);
    let unviable = count("unviable", false) + count("unviable", true);
    let survived = count("survived", false);
    let equivalent = count("survived", true);
    let judged = killed + timeout + survived;
    #[allow(clippy::cast_precision_loss)]
    let score = if judged == 0 {
        100.0
    } else {
        100.0 * (killed + timeout) as f64 / judged as f64
    };
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(records).map_err(|e| e.to_string())?;
        std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "mutants: {} judged, {killed} killed, {survived} survived, {timeout} timeout, \
         {unviable} unviable, {equivalent} equivalent; score {score:.1}% \
         (killed+timeout of the non-equivalent viable); {secs:.0} s",
        records.len()
    );
    for r in records
        .iter()
        .filter(|r| r.outcome == "survived" && r.equivalent.is_none())
    {
        println!("survived: {}", r.id);
    }
    Ok(if survived > 0 || score < args.min_score {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    })
}
