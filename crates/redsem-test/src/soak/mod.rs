//! `redsem-soak`: random operations from several clients under a seeded schedule of faults,
//! every operation recorded, and an offline checker over the history. See docs/SOAK.md.

mod checker;
mod history;
mod nemesis;
mod ops;
mod rng;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::process::ExitCode;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use redsem::{LeaseOptions, PermitOptions, Redsem, RedsemOptions};
use redsem_test::{FaultProxy, RedisServer};

use history::{Final, Meta, Record};

const USAGE: &str = "usage: redsem-soak [--duration 60s] [--seed N] [--clients 3] [--tasks 6] \
[--deployment single|volatile] [--lease-ms 1000] [--history FILE] | --check FILE";

#[derive(Debug, Clone)]
struct Args {
    duration: Duration,
    seed: u64,
    clients: u32,
    tasks: u32,
    deployment: String,
    lease: Duration,
    history: Option<String>,
    check: Option<String>,
}

fn parse_duration(s: &str) -> Result<Duration, String> {
    let (num, unit) = s
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .map_or((s, "s"), |i| s.split_at(i));
    let n: f64 = num.parse().map_err(|_| format!("bad duration {s:?}"))?;
    let secs = match unit {
        "ms" => n / 1000.0,
        "s" => n,
        "m" => n * 60.0,
        "h" => n * 3600.0,
        _ => return Err(format!("bad duration unit in {s:?}")),
    };
    Ok(Duration::from_secs_f64(secs))
}

fn parse_args() -> Result<Args, String> {
    let mut args = Args {
        duration: Duration::from_secs(60),
        seed: 1,
        clients: 3,
        tasks: 6,
        deployment: "single".into(),
        lease: Duration::from_millis(1000),
        history: None,
        check: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or(format!("{flag} needs a value"));
        match flag.as_str() {
            "--duration" => args.duration = parse_duration(&value()?)?,
            "--seed" => args.seed = value()?.parse().map_err(|e| format!("--seed: {e}"))?,
            "--clients" => {
                args.clients = value()?.parse().map_err(|e| format!("--clients: {e}"))?
            }
            "--tasks" => args.tasks = value()?.parse().map_err(|e| format!("--tasks: {e}"))?,
            "--lease-ms" => {
                args.lease = Duration::from_millis(
                    value()?.parse().map_err(|e| format!("--lease-ms: {e}"))?,
                );
            }
            "--deployment" => {
                let d = value()?;
                if d != "single" && d != "volatile" {
                    return Err(format!(
                        "--deployment {d}: single or volatile (sentinel is not built yet)"
                    ));
                }
                args.deployment = d;
            }
            "--history" => args.history = Some(value()?),
            "--check" => args.check = Some(value()?),
            "-h" | "--help" => return Err(USAGE.into()),
            _ => return Err(format!("unknown argument {flag}\n{USAGE}")),
        }
    }
    Ok(args)
}

pub fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let started = Instant::now();
    let (records, faults) = if let Some(path) = &args.check {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("cannot open {path}: {e}");
                return ExitCode::from(2);
            }
        };
        match history::read(BufReader::new(file)) {
            Ok(records) => {
                let mut faults = BTreeMap::new();
                for r in &records {
                    if let Record::Fault(f) = r {
                        *faults.entry(f.kind.clone()).or_insert(0u64) += 1;
                    }
                }
                (records, faults)
            }
            Err(e) => {
                eprintln!("{path}: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        run(&args)
    };
    if let Some(path) = &args.history {
        let written =
            File::create(path).and_then(|f| history::write(&mut BufWriter::new(f), &records));
        if let Err(e) = written {
            eprintln!("cannot write {path}: {e}");
        }
    }
    let violations = checker::check(&records);
    let seed = records
        .iter()
        .find_map(|r| match r {
            Record::Meta(m) => Some(m.seed),
            _ => None,
        })
        .unwrap_or(args.seed);
    let mut by_rule: BTreeMap<&str, u64> = BTreeMap::new();
    for v in &violations {
        *by_rule.entry(v.rule).or_insert(0) += 1;
    }
    for v in violations.iter().take(10) {
        println!("VIOLATION [{}] seed {seed}: {}", v.rule, v.detail);
        for r in &v.excerpt {
            println!("  {}", serde_json::to_string(r).unwrap_or_default());
        }
    }
    let operations: u64 = records.iter().map(history::operations).sum();
    let fault_total: u64 = faults.values().sum();
    let faults_text: Vec<String> = faults.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let rules_text: Vec<String> = by_rule.iter().map(|(k, v)| format!("{k} {v}")).collect();
    println!(
        "soak: seed {seed}, {:.1} s, {operations} operations, {fault_total} faults ({}), {} violations{}",
        started.elapsed().as_secs_f64(),
        faults_text.join(", "),
        violations.len(),
        if rules_text.is_empty() {
            String::new()
        } else {
            format!(" ({})", rules_text.join(", "))
        }
    );
    if violations.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// Run the soak: servers, clients, nemesis; returns the history and the faults by kind.
fn run(args: &Args) -> (Vec<Record>, BTreeMap<String, u64>) {
    let volatile = args.deployment == "volatile";
    let server_args: &[&str] = if volatile {
        &[]
    } else {
        // A small rewrite threshold keeps the AOF short, so a restart loads it within the kit's
        // ready timeout even after an hour of writes (a 30-minute run once grew it past that).
        &[
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--auto-aof-rewrite-min-size",
            "4mb",
        ]
    };
    let server = RedisServer::start_with(server_args);
    let proxies: Arc<Vec<FaultProxy>> = Arc::new(
        (0..args.clients)
            .map(|_| FaultProxy::start(server.port()))
            .collect(),
    );
    let rec = Arc::new(ops::Recorder::new());
    let lease = args.lease;
    let waiter_lease = args.lease;
    let capacity: BTreeMap<String, u32> = [("a", 1), ("b", 2), ("c", 3)]
        .map(|(n, c)| (n.to_owned(), c))
        .into();
    let permits: BTreeMap<String, u32> = if volatile {
        BTreeMap::new()
    } else {
        [("p", 3), ("q", 1)].map(|(n, c)| (n.to_owned(), c)).into()
    };
    let latch_count = 5;
    rec.push(Record::Meta(Meta {
        seed: args.seed,
        deployment: args.deployment.clone(),
        capacity: capacity.clone(),
        permits: permits.clone(),
        latch_count,
        lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
        waiter_lease_ms: u64::try_from(waiter_lease.as_millis()).unwrap_or(u64::MAX),
    }));

    // The nemesis owns the server: a restarted redis-server is tied to the thread that started
    // it (parent-death signal), so that thread lives until the end of the run.
    let nemesis_until = Instant::now() + args.duration.saturating_sub(settle(args.duration));
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let (counts_tx, counts_rx) = std::sync::mpsc::channel();
    let nemesis_thread = {
        let mut nemesis = nemesis::Nemesis {
            rng: rng::Rng::new(args.seed),
            rec: Arc::clone(&rec),
            proxies: Arc::clone(&proxies),
            lease,
            lose_names: capacity.keys().cloned().collect(),
            volatile,
        };
        let mut server = server;
        thread::spawn(move || {
            let counts = nemesis.run(&mut server, nemesis_until);
            let _ = counts_tx.send(counts);
            let _ = done_rx.recv();
            drop(server);
        })
    };

    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("cannot start a tokio runtime: {e}"),
    };
    runtime.block_on(async {
        let options = RedsemOptions::default()
            .connect_timeout(Duration::from_secs(1))
            .response_timeout(Duration::from_secs(1));
        let mut clients = Vec::new();
        for proxy in proxies.iter() {
            let redsem = match Redsem::connect_with(&proxy.url(), options.clone()).await {
                Ok(r) => r,
                Err(e) => panic!("cannot connect through {}: {e}", proxy.url()),
            };
            clients.push(redsem);
        }
        let lease_options = LeaseOptions::default()
            .lease(lease)
            .waiter_lease(waiter_lease);
        let permit_options = PermitOptions::default().waiter_lease(waiter_lease);
        for (name, &n) in &permits {
            let sem = clients[0]
                .permit_semaphore_with(name, permit_options.clone())
                .unwrap_or_else(|e| panic!("{e}"));
            sem.try_set_permits(n)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let mut handles = Vec::new();
        let latches_set = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let latch_reached = Arc::new(std::sync::atomic::AtomicU64::new(0));
        if !volatile {
            let r = clients[0].clone();
            handles.push(tokio::spawn(ops::latch_setter(
                move |e| r.count_down_latch(&format!("l{e}")).ok(),
                latch_count,
                Arc::clone(&rec),
                Arc::clone(&latches_set),
                Arc::clone(&latch_reached),
                stop_rx.clone(),
            )));
        }
        for (c, redsem) in clients.iter().enumerate() {
            for t in 0..args.tasks {
                let leases = capacity
                    .iter()
                    .map(|(name, &cap)| {
                        redsem
                            .lease_semaphore_with(name, cap, lease_options.clone())
                            .unwrap_or_else(|e| panic!("{e}"))
                    })
                    .collect();
                let psems = permits
                    .keys()
                    .map(|name| {
                        redsem
                            .permit_semaphore_with(name, permit_options.clone())
                            .unwrap_or_else(|e| panic!("{e}"))
                    })
                    .collect();
                let r = redsem.clone();
                let task = ops::Task {
                    client: u32::try_from(c).unwrap_or(0),
                    task: t,
                    rec: Arc::clone(&rec),
                    leases,
                    permits: psems,
                    latch: Box::new(move |e| r.count_down_latch(&format!("l{e}")).ok()),
                    latches_set: Arc::clone(&latches_set),
                    latch_reached: Arc::clone(&latch_reached),
                    stop: stop_rx.clone(),
                    rng: rng::Rng::new(
                        args.seed
                            ^ (u64::from(u32::try_from(c).unwrap_or(0)) << 32 | u64::from(t))
                            ^ 0x5eed,
                    ),
                    weights: if volatile { [1, 0, 0] } else { [60, 25, 15] },
                };
                handles.push(tokio::spawn(task.run()));
            }
        }
        tokio::time::sleep(args.duration).await;
        let _ = stop_tx.send(true);
        for h in handles {
            let _ = h.await;
        }
        // Every lease and waiter lease could have ended by now; nothing may be left.
        tokio::time::sleep(lease + waiter_lease + Duration::from_millis(500)).await;
        for (name, &cap) in &capacity {
            let sem = clients[0]
                .lease_semaphore_with(name, cap, lease_options.clone())
                .unwrap_or_else(|e| panic!("{e}"));
            match sem.status().await {
                Ok(status) => rec.push(Record::Final(Final {
                    kind: "lease".into(),
                    name: name.clone(),
                    value: i64::try_from(status.in_use).unwrap_or(i64::MAX),
                    waiters: status.waiters.len() as u64,
                    at_us: rec.now(),
                })),
                Err(e) => eprintln!("final status of {name}: {e}"),
            }
        }
        for name in permits.keys() {
            let sem = clients[0]
                .permit_semaphore_with(name, permit_options.clone())
                .unwrap_or_else(|e| panic!("{e}"));
            match sem.available_permits().await {
                Ok(available) => rec.push(Record::Final(Final {
                    kind: "permits".into(),
                    name: name.clone(),
                    value: available,
                    waiters: 0,
                    at_us: rec.now(),
                })),
                Err(e) => eprintln!("final count of {name}: {e}"),
            }
        }
    });
    drop(runtime);
    let counts = counts_rx.recv().unwrap_or_default();
    let _ = done_tx.send(());
    let _ = nemesis_thread.join();
    let records = std::mem::take(
        &mut *rec
            .records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    (records, counts)
}

/// How long before the end the nemesis stops, so the last faults heal before the final checks.
fn settle(duration: Duration) -> Duration {
    (duration / 5).min(Duration::from_secs(5))
}
