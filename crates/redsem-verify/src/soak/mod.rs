//! `redsem-soak`: random operations from several clients under a seeded schedule of faults,
//! every operation recorded, and an offline checker over the history. See docs/SOAK.md.

mod checker;
mod edge;
mod engine;
mod history;
mod look;
mod nemesis;
mod ops;
mod task;
mod tenants;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, BufWriter};
use std::process::ExitCode;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use redsem::{Engine, LeaseOptions, PermitOptions, Redsem, RedsemOptions, ServingEngine};
use redsem_test::{FaultProxy, RedisSentinels, RedisServer};

use engine::{EngineMode, describe, engine_fallbacks, engine_report, served_by, server_calls};
use history::{Final, Meta, Record};

const USAGE: &str = "usage: redsem-soak [--duration 60s] [--seed N] [--clients 3] [--tasks 6] \
[--deployment single|volatile|sentinel] [--lease-ms 1000] [--data-dir DIR] [--history FILE] \
[--no-edges] [--no-cancels] [--engine scripts|native|mixed] [--module PATH] | --check FILE";

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
    data_dir: Option<String>,
    /// Holds that run to their lease end, their probes and looks at the server (`edge.rs`).
    edges: bool,
    /// Calls cancelled at random points and looked after, state losses of lease semaphores
    /// and lost count-down replies.
    cancels: bool,
    /// Which engine the clients ask for (`--engine`).
    engine: EngineMode,
    /// redsem's module (`--module`, made absolute), loaded by every server the soak starts.
    module: Option<String>,
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
        data_dir: None,
        edges: true,
        cancels: true,
        engine: EngineMode::Scripts,
        module: None,
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
                if !["single", "volatile", "sentinel"].contains(&d.as_str()) {
                    return Err(format!("--deployment {d}: single, volatile or sentinel"));
                }
                args.deployment = d;
            }
            "--history" => args.history = Some(value()?),
            "--data-dir" => args.data_dir = Some(value()?),
            "--check" => args.check = Some(value()?),
            "--no-edges" => args.edges = false,
            "--no-cancels" => args.cancels = false,
            "--engine" => {
                args.engine = match value()?.as_str() {
                    "scripts" => EngineMode::Scripts,
                    "native" => EngineMode::Native,
                    "mixed" => EngineMode::Mixed,
                    e => return Err(format!("--engine {e}: scripts, native or mixed\n{USAGE}")),
                };
            }
            "--module" => {
                let path = value()?;
                let module =
                    std::fs::canonicalize(&path).map_err(|e| format!("--module {path}: {e}"))?;
                if !module.is_file() {
                    return Err(format!("--module {path}: not a file"));
                }
                let module = module
                    .into_os_string()
                    .into_string()
                    .map_err(|p| format!("--module {}: not UTF-8", p.display()))?;
                args.module = Some(module);
            }
            "-h" | "--help" => return Err(USAGE.into()),
            _ => return Err(format!("unknown argument {flag}\n{USAGE}")),
        }
    }
    if args.engine != EngineMode::Scripts && args.module.is_none() && args.check.is_none() {
        return Err(format!(
            "--engine {} needs --module PATH, redsem's module for the servers to load \
             (target/release/libredsem_module.so after cargo build --release -p redsem-module)\n\
             {USAGE}",
            args.engine.as_str()
        ));
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
    let records = if let Some(path) = &args.check {
        let file = match File::open(path) {
            Ok(f) => f,
            Err(e) => {
                eprintln!("cannot open {path}: {e}");
                return ExitCode::from(2);
            }
        };
        match history::read(BufReader::new(file)) {
            Ok(records) => records,
            Err(e) => {
                eprintln!("{path}: {e}");
                return ExitCode::from(2);
            }
        }
    } else {
        run(&args)
    };
    // Counted from the history, so faults recorded before a nemesis panic are counted too.
    let mut faults: BTreeMap<String, u64> = BTreeMap::new();
    for r in &records {
        if let Record::Fault(f) = r {
            *faults.entry(f.kind.clone()).or_insert(0) += 1;
        }
    }
    if let Some(path) = &args.history {
        let written =
            File::create(path).and_then(|f| history::write(&mut BufWriter::new(f), &records));
        if let Err(e) = written {
            eprintln!("cannot write {path}: {e}");
        }
    }
    let violations = checker::check(&records);
    let meta = records.iter().find_map(|r| match r {
        Record::Meta(m) => Some(m),
        _ => None,
    });
    let seed = meta.map_or(args.seed, |m| m.seed);
    // Histories from before the engine choice ran the scripts.
    let engine = meta.and_then(|m| m.engine.as_deref()).unwrap_or("scripts");
    let fallbacks = meta.map_or(0, engine_fallbacks);
    if let Some(m) = meta {
        println!("{}", engine_report(m));
    }
    let mut by_rule: BTreeMap<&str, u64> = BTreeMap::new();
    for v in &violations {
        *by_rule.entry(v.rule).or_insert(0) += 1;
    }
    for v in violations.iter().take(10) {
        println!(
            "VIOLATION [{}] seed {seed} at {:.3} s: {}",
            v.rule,
            v.at_us as f64 / 1e6,
            v.detail
        );
        for r in &v.excerpt {
            println!("  {}", serde_json::to_string(r).unwrap_or_default());
        }
    }
    let operations: u64 = records.iter().map(history::operations).sum();
    let fault_total: u64 = faults.values().sum();
    let faults_text: Vec<String> = faults.iter().map(|(k, v)| format!("{k} {v}")).collect();
    let rules_text: Vec<String> = by_rule.iter().map(|(k, v)| format!("{k} {v}")).collect();
    // The first violation in the run's time: how long the soak needed to see one.
    let first = violations
        .iter()
        .min_by_key(|v| v.at_us)
        .map(|v| format!(", the first at {:.3} s ({})", v.at_us as f64 / 1e6, v.rule))
        .unwrap_or_default();
    let fallbacks_text = if fallbacks > 0 {
        format!(" ({fallbacks} clients no longer on the engine asked at the end)")
    } else {
        String::new()
    };
    println!(
        "soak: seed {seed}, engine {engine}{fallbacks_text}, {:.1} s, {operations} operations, {fault_total} faults ({}), {} violations{}{first}",
        started.elapsed().as_secs_f64(),
        faults_text.join(", "),
        violations.len(),
        if rules_text.is_empty() {
            String::new()
        } else {
            format!(" ({})", rules_text.join(", "))
        }
    );
    // A client that left the engine asked for ran part of the soak on the other one: not a
    // violation of a rule, but not the run that was asked for either.
    if violations.is_empty() && fallbacks == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// The servers of one run.
pub enum Deployment {
    /// One `redis-server` (`single`, `volatile`).
    Single(RedisServer),
    /// A primary, two replicas and three Sentinels (`sentinel`).
    Sentinel(RedisSentinels),
}

impl Deployment {
    /// The port of the server that takes writes now (for a Sentinel deployment, the primary
    /// the Sentinels name).
    pub fn primary_port(&self) -> u16 {
        match self {
            Deployment::Single(server) => server.port(),
            Deployment::Sentinel(s) => s.primary().port(),
        }
    }
}

/// Where a client connects.
#[derive(Debug, Clone)]
enum Target {
    Url(String),
    Sentinel(Vec<String>, String),
}

impl Target {
    async fn connect(&self, options: RedsemOptions) -> redsem::Result<Redsem> {
        match self {
            Target::Url(url) => Redsem::connect_with(url, options).await,
            Target::Sentinel(urls, master) => {
                let urls: Vec<&str> = urls.iter().map(String::as_str).collect();
                Redsem::connect_sentinel_with(&urls, master, options).await
            }
        }
    }
}

/// The directory under which the single server keeps its AOF: `--data-dir`, else `/dev/shm`
/// when it is a writable directory (a tmpfs: `appendfsync always` costs little there), else
/// the kit's default.
fn data_root(args: &Args) -> Option<std::path::PathBuf> {
    if let Some(dir) = &args.data_dir {
        return Some(dir.into());
    }
    let shm = std::path::Path::new("/dev/shm");
    let writable = tempfile::Builder::new()
        .prefix("redsem-soak-probe-")
        .tempdir_in(shm)
        .is_ok();
    writable.then(|| shm.to_path_buf())
}

fn current_thread_runtime() -> tokio::runtime::Runtime {
    match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => panic!("cannot start a tokio runtime: {e}"),
    }
}

/// Run the soak: servers, clients, nemesis; returns the history.
#[allow(clippy::too_many_lines)]
fn run(args: &Args) -> Vec<Record> {
    let volatile = args.deployment == "volatile";
    let sentinel = args.deployment == "sentinel";
    // Every data node loads the module (the Sentinels are no data nodes); the kit keeps a
    // server's arguments across its restarts, so a restarted server has it too.
    let module_args: Vec<&str> = match &args.module {
        Some(path) => vec!["--loadmodule", path],
        None => Vec::new(),
    };
    let mut deployment = if sentinel {
        Deployment::Sentinel(RedisSentinels::start_with(&module_args))
    } else {
        let mut server_args: Vec<&str> = if volatile {
            Vec::new()
        } else {
            // A small rewrite threshold keeps the AOF short, so a restart loads it within the
            // kit's ready timeout even after an hour of writes (a 30-minute run once grew it
            // past that).
            vec![
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
                "--auto-aof-rewrite-min-size",
                "4mb",
            ]
        };
        server_args.extend(&module_args);
        let server = match data_root(args) {
            Some(root) => RedisServer::start_in(&root, &server_args),
            None => RedisServer::start_with(&server_args),
        };
        Deployment::Single(server)
    };
    // Clients of one server reach it through their own proxies; Sentinel discovery hands the
    // clients the primary's own address, so there are no proxies there.
    let (proxies, direct): (Vec<FaultProxy>, Target) = match &deployment {
        Deployment::Single(server) => (
            (0..args.clients)
                .map(|_| FaultProxy::start(server.port()))
                .collect(),
            Target::Url(server.url()),
        ),
        Deployment::Sentinel(s) => (
            Vec::new(),
            Target::Sentinel(s.sentinel_urls(), s.master_name().to_owned()),
        ),
    };
    let proxies = Arc::new(proxies);
    // The server's own address for the edge holds' looks at it (no proxy in between); behind
    // Sentinels the primary moves, and none is looked at.
    let audit_url = match &deployment {
        Deployment::Single(server) => Some(server.url()),
        Deployment::Sentinel(_) => None,
    };
    let edge_gate = Arc::new(task::EdgeGate::new((300, 1500)));
    let targets: Vec<Target> = (0..args.clients as usize)
        .map(|c| match proxies.get(c) {
            Some(proxy) => Target::Url(proxy.url()),
            None => direct.clone(),
        })
        .collect();
    let rec = Arc::new(task::Recorder::new());
    let lease = args.lease;
    let waiter_lease = args.lease;
    let capacity: BTreeMap<String, u32> = [
        ("a", 1),
        ("b", 2),
        ("c", 3),
        (tenants::SEMAPHORE, tenants::CAPACITY),
    ]
    .map(|(n, c)| (n.to_owned(), c))
    .into();
    let permits: BTreeMap<String, u32> = if volatile {
        BTreeMap::new()
    } else {
        [("p", 3), ("q", 1)].map(|(n, c)| (n.to_owned(), c)).into()
    };
    let latch_count = 12;
    rec.push(Record::Meta(Meta {
        seed: args.seed,
        deployment: args.deployment.clone(),
        capacity: capacity.clone(),
        permits: permits.clone(),
        latch_count,
        lease_ms: u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
        waiter_lease_ms: u64::try_from(waiter_lease.as_millis()).unwrap_or(u64::MAX),
        engine: Some(args.engine.as_str().to_owned()),
        client_engines: (0..targets.len())
            .map(|c| args.engine.client(c).as_str().to_owned())
            .collect(),
        tenants: tenants::configured(),
        ..Meta::default()
    }));
    let mut options = RedsemOptions::default()
        .connect_timeout(Duration::from_secs(1))
        .response_timeout(Duration::from_secs(1));
    if sentinel {
        // Every change acknowledged by both replicas: whichever the Sentinels promote has
        // every grant a client holds, so the limit and the other rules hold across a failover
        // (README "Safety by deployment"; with acks(1) the replica promoted may not be the
        // one that acknowledged, and a grant made in the failover can be lost).
        options = options.replica_acks(2, Duration::from_millis(100));
    }
    let lease_options = LeaseOptions::default()
        .lease(lease)
        .waiter_lease(waiter_lease);
    let permit_options = PermitOptions::default().waiter_lease(waiter_lease);

    // A control client on this thread sets the permits up and reads the final state.
    let control_rt = current_thread_runtime();
    let control = control_rt.block_on(async {
        let asked = args.engine.client(0);
        let control = match direct.connect(options.clone().engine(asked)).await {
            Ok(r) => r,
            Err(e) => panic!("cannot connect the control client: {e}"),
        };
        if let Err(e) = served_by(&control, asked, "the control client") {
            panic!("{e}");
        }
        for (name, &n) in &permits {
            let sem = control
                .permit_semaphore_with(name, permit_options.clone())
                .unwrap_or_else(|e| panic!("{e}"));
            sem.try_set_permits(n)
                .await
                .unwrap_or_else(|e| panic!("{e}"));
        }
        control
    });

    // Each client (one `Redsem` and its tasks) runs on its own current-thread runtime on its
    // own OS thread, so the nemesis can freeze one client's runtime as a whole.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let latches_set = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let latch_reached = Arc::new(std::sync::atomic::AtomicU64::new(0));
    // Each client sends its runtime once connected (and served by the engine it asked), or
    // why it is not.
    let (ready_tx, ready_rx) =
        std::sync::mpsc::channel::<(usize, Result<tokio::runtime::Handle, String>)>();
    let mut client_threads = Vec::new();
    // What each client's engine is at the end of the run.
    let served_at_end: Vec<Arc<std::sync::Mutex<Option<ServingEngine>>>> =
        targets.iter().map(|_| Arc::default()).collect();
    for (c, target) in targets.iter().enumerate() {
        let target = target.clone();
        let engine = args.engine.client(c);
        let options = options.clone().engine(engine);
        let options_direct = options.clone();
        let lease_options = lease_options.clone();
        let permit_options = permit_options.clone();
        let capacity = capacity.clone();
        let permits = permits.clone();
        let rec = Arc::clone(&rec);
        let stop_rx = stop_rx.clone();
        let latches_set = Arc::clone(&latches_set);
        let latch_reached = Arc::clone(&latch_reached);
        let ready_tx = ready_tx.clone();
        let served_at_end = Arc::clone(&served_at_end[c]);
        let (seed, tasks, cancels) = (args.seed, args.tasks, args.cancels);
        let clients = u32::try_from(targets.len()).unwrap_or(1);
        let look_url = audit_url.clone();
        let edges = args.edges.then(|| {
            (
                Arc::clone(&edge_gate),
                direct.clone(),
                audit_url.clone(),
                lease_options.clone().lease(task::EDGE_LEASE),
            )
        });
        let spawned = thread::Builder::new()
            .name(format!("client{c}"))
            .spawn(move || {
                let rt = current_thread_runtime();
                rt.block_on(async move {
                    let not_ready = |why: String| {
                        let _ = ready_tx.send((c, Err(why)));
                    };
                    let redsem = match target.connect(options).await {
                        Ok(r) => r,
                        Err(e) => return not_ready(format!("client {c} cannot connect: {e}")),
                    };
                    if let Err(e) = served_by(&redsem, engine, &format!("client {c}")) {
                        return not_ready(e);
                    }
                    // The edge holds' probes reach the server directly, on the same engine.
                    let edges = match edges {
                        Some((gate, direct, url, options)) => {
                            match direct.connect(options_direct).await {
                                Ok(probe) => {
                                    let who = format!("client {c}'s probe client");
                                    if let Err(e) = served_by(&probe, engine, &who) {
                                        return not_ready(e);
                                    }
                                    Some((gate, probe, url, options))
                                }
                                Err(e) => {
                                    return not_ready(format!(
                                        "client {c} cannot connect its probe client: {e}"
                                    ));
                                }
                            }
                        }
                        None => None,
                    };
                    // One connection for the looks after cancelled calls, shared by the tasks.
                    let looker: Option<look::Looker> = look_url
                        .as_deref()
                        .filter(|_| cancels)
                        .and_then(look::Auditor::new)
                        .map(|a| Arc::new(tokio::sync::Mutex::new(a)));
                    let mut handles = Vec::new();
                    if c == 0 && !volatile {
                        let r = redsem.clone();
                        handles.push(tokio::spawn(ops::latch_setter(
                            move |e| r.count_down_latch(&format!("l{e}")).ok(),
                            latch_count,
                            Arc::clone(&rec),
                            Arc::clone(&latches_set),
                            Arc::clone(&latch_reached),
                            stop_rx.clone(),
                        )));
                    }
                    let client = u32::try_from(c).unwrap_or(0);
                    for t in 0..tasks + tenants::flood_tasks(client, clients) {
                        // A flooding task: lease rounds on the tenants' semaphore only.
                        let flood = t >= tasks;
                        let leases =
                            tenants::leases(&redsem, &capacity, &lease_options, client, flood);
                        let psems = permits
                            .iter()
                            .map(|(name, &initial)| {
                                let sem = redsem
                                    .permit_semaphore_with(name, permit_options.clone())
                                    .unwrap_or_else(|e| panic!("{e}"));
                                (sem, initial)
                            })
                            .collect();
                        let edge = edges.as_ref().filter(|_| !flood);
                        let edge = edge.map(|(gate, probe, url, options)| {
                            edge_kit(gate, &redsem, probe, url.as_deref(), options, &capacity)
                        });
                        let r = redsem.clone();
                        let task = task::Task {
                            client,
                            task: t,
                            rec: Arc::clone(&rec),
                            leases,
                            permits: psems,
                            latch: Box::new(move |e| r.count_down_latch(&format!("l{e}")).ok()),
                            latches_set: Arc::clone(&latches_set),
                            latch_reached: Arc::clone(&latch_reached),
                            stop: stop_rx.clone(),
                            rng: redsem_verify::rng::Rng::new(
                                seed ^ (u64::from(client) << 32 | u64::from(t)) ^ 0x5eed,
                            ),
                            weights: if volatile || flood {
                                [1, 0, 0]
                            } else {
                                [60, 25, 15]
                            },
                            // Across a failover permits can be lost for good (a release or
                            // a give-back the new primary missed, docs/SOAK.md): waits get
                            // a limit there.
                            permit_wait_limit: sentinel.then_some(Duration::from_secs(3)),
                            edge,
                            cancels,
                            looker: looker.clone(),
                        };
                        handles.push(tokio::spawn(task.run()));
                    }
                    let _ = ready_tx.send((c, Ok(tokio::runtime::Handle::current())));
                    for h in handles {
                        let _ = h.await;
                    }
                    // Calls cancelled near the end finish in the background: let them, before
                    // this runtime (and its tasks) is gone and the final state is read.
                    let _ = tokio::time::timeout(Duration::from_secs(5), redsem.flush()).await;
                    *served_at_end
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(redsem.engine());
                });
            });
        match spawned {
            Ok(handle) => client_threads.push(handle),
            Err(e) => panic!("cannot start client thread {c}: {e}"),
        }
    }
    drop(ready_tx);
    let mut runtimes: Vec<Option<tokio::runtime::Handle>> = vec![None; targets.len()];
    for _ in 0..targets.len() {
        match ready_rx.recv_timeout(Duration::from_secs(30)) {
            Ok((c, Ok(handle))) => runtimes[c] = Some(handle),
            Ok((_, Err(why))) => panic!("{why}"),
            Err(e) => panic!("a client did not connect: {e}"),
        }
    }
    let runtimes: Vec<tokio::runtime::Handle> = runtimes.into_iter().flatten().collect();

    // The nemesis borrows the deployment (it restarts the server, fails the primary over) on
    // its own thread; this thread, which owns the servers, lives until the end of the run.
    let nemesis_until = Instant::now() + args.duration.saturating_sub(settle(args.duration));
    let mut nemesis = nemesis::Nemesis {
        rng: redsem_verify::rng::Rng::new(args.seed),
        rec: Arc::clone(&rec),
        proxies: Arc::clone(&proxies),
        runtimes,
        lease,
        lose_names: capacity.keys().cloned().collect(),
        deployment: args.deployment.clone(),
        edges: Arc::clone(&edge_gate),
        state_losses: args.cancels,
        native: (0..targets.len())
            .map(|c| args.engine.client(c) == Engine::Native)
            .collect(),
    };
    thread::scope(|scope| {
        let nemesis_thread = scope.spawn(|| nemesis.run(&mut deployment, nemesis_until));
        thread::sleep(args.duration);
        let _ = stop_tx.send(true);
        for (c, t) in client_threads.into_iter().enumerate() {
            if t.join().is_err() {
                eprintln!("client thread {c} panicked");
            }
        }
        if nemesis_thread.join().is_err() {
            eprintln!("the nemesis panicked");
        }
    });

    // Every lease and waiter lease could have ended by now; nothing may be left.
    thread::sleep(lease + waiter_lease + Duration::from_millis(500));
    control_rt.block_on(async {
        for (name, &cap) in &capacity {
            let sem = control
                .lease_semaphore_with(name, cap, lease_options.clone())
                .unwrap_or_else(|e| panic!("{e}"));
            match retried(|| sem.status()).await {
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
            let sem = control
                .permit_semaphore_with(name, permit_options.clone())
                .unwrap_or_else(|e| panic!("{e}"));
            match retried(|| sem.available_permits()).await {
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
    let server_calls = server_calls(deployment.primary_port());
    drop(control);
    drop(control_rt);
    drop(deployment);
    let at_end: Vec<String> = served_at_end
        .iter()
        .enumerate()
        .map(|(c, served)| {
            let served = served
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .clone();
            let asked = args.engine.client(c);
            match served {
                Some(served) => {
                    if served.name() != asked.as_str() {
                        eprintln!(
                            "ENGINE client {c} asked for {asked}, served by {} at the end",
                            describe(&served)
                        );
                    }
                    served.name().to_owned()
                }
                None => "unknown".to_owned(),
            }
        })
        .collect();
    rec.with_meta(|meta| {
        meta.client_engines_at_end = at_end;
        meta.server_calls = server_calls;
    });
    std::mem::take(
        &mut *rec
            .records
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    )
}

/// What one task needs for its edge holds: handles with the edge lease (without and with
/// keep-alive) and on the direct probe client, per lease semaphore, and an auditor.
fn edge_kit(
    gate: &Arc<task::EdgeGate>,
    redsem: &Redsem,
    probe: &Redsem,
    audit_url: Option<&str>,
    options: &LeaseOptions,
    capacity: &BTreeMap<String, u32>,
) -> task::EdgeKit {
    let sem = |r: &Redsem, name: &str, cap: u32, options: LeaseOptions| {
        r.lease_semaphore_with(name, cap, options)
            .unwrap_or_else(|e| panic!("{e}"))
    };
    task::EdgeKit {
        gate: Arc::clone(gate),
        leases: capacity
            .iter()
            .map(|(name, &cap)| {
                [
                    sem(redsem, name, cap, options.clone().keepalive(false)),
                    sem(redsem, name, cap, options.clone()),
                ]
            })
            .collect(),
        probes: capacity
            .iter()
            .map(|(name, &cap)| sem(probe, name, cap, options.clone()))
            .collect(),
        auditor: audit_url.and_then(look::Auditor::new),
    }
}

/// `call`, tried up to three times (the control client's connection may have been cut by a
/// fault while it idled).
async fn retried<T, F: Future<Output = redsem::Result<T>>>(
    mut call: impl FnMut() -> F,
) -> redsem::Result<T> {
    let mut last = call().await;
    for _ in 0..2 {
        if last.is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        last = call().await;
    }
    last
}

/// How long before the end the nemesis stops, so the last faults heal before the final checks.
fn settle(duration: Duration) -> Duration {
    (duration / 5).min(Duration::from_secs(5))
}
