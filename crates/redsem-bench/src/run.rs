//! parse → set up (server, runtime) → run the chosen scenarios → judge → print and write.

use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use redsem::LeaseOptions;
use serde::Serialize;

use crate::BenchResult;
use crate::admin::Admin;
use crate::cli::Args;
use crate::core;
use crate::ctx::{Ctx, Sizes};
use crate::overhead;
use crate::report::{BaselineRun, Figures, Invariant, Target};
use crate::sem::{self, BenchSem};
use crate::{acks, cluster, cost, counters, many, noisy, raw, scale, stages, steady};

#[derive(Debug, Serialize)]
struct Machine {
    nproc: usize,
    cpu_model: String,
    redis_version: String,
    /// "own redis-server" or the URL given.
    server: String,
    /// The engine redsem's clients were served by: "scripts" or "native (redsem module ...)".
    engine: String,
    /// `/proc/loadavg` when the run started: the machine is shared.
    load_average: String,
}

#[derive(Serialize)]
struct Output<'a> {
    bench: &'static str,
    version: &'static str,
    mode: &'static str,
    /// Whether redsem's clients ran with group commit (`--no-group-commit`: false).
    group_commit: bool,
    machine: Machine,
    sizes: &'a Sizes,
    duration_s: f64,
    figures: &'a Figures,
    targets: &'a [Target],
    invariants: &'a [Invariant],
    errors: &'a [String],
    /// `--recorder`: S1 without and with a metrics recorder.
    #[serde(skip_serializing_if = "Option::is_none")]
    recorder_overhead: Option<&'a overhead::RecorderOverhead>,
    /// `--acks`: S1 without and with replica acknowledgements.
    #[serde(skip_serializing_if = "Option::is_none")]
    acks_overhead: Option<&'a acks::AcksOverhead>,
    /// `--cluster-handoff`: S3 on a three-primary cluster.
    #[serde(skip_serializing_if = "Option::is_none")]
    cluster_handoff: Option<&'a cluster::ClusterHandoff>,
    /// `--hold-stages`: S2's hold loop, stage by stage.
    #[serde(skip_serializing_if = "Option::is_none")]
    hold_stages: Option<&'a [stages::StagesRun]>,
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, v)| v.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".to_owned())
}

pub(crate) fn run(args: Args) -> BenchResult<ExitCode> {
    // Started on the main thread: the harness ties the server's life to the starting thread.
    let own = match &args.url {
        Some(_) => None,
        None => Some(match &args.module {
            Some(module) => {
                // (The server runs in a directory of its own: an absolute path.)
                let module = std::fs::canonicalize(module)?.display().to_string();
                redsem_test::RedisServer::start_with(&["--loadmodule", &module])
            }
            None => redsem_test::RedisServer::start(),
        }),
    };
    let url = match (&args.url, &own) {
        (Some(url), _) => url.clone(),
        (None, Some(server)) => server.url(),
        (None, None) => unreachable!("a server was started when no URL was given"),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    // Every scenario runs on the worker pool, as application code does, never on the
    // blocking `block_on` thread (whose wake-ups would add to every latency).
    let code = runtime
        .block_on(async move { tokio::spawn(async move { measure(&args, url).await }).await })??;
    drop(runtime);
    drop(own);
    Ok(code)
}

async fn step<T>(
    name: &str,
    errors: &mut Vec<String>,
    fut: impl Future<Output = BenchResult<T>>,
) -> Option<T> {
    eprint!("{name} ... ");
    let t = Instant::now();
    match fut.await {
        Ok(v) => {
            eprintln!("{:.1} s", t.elapsed().as_secs_f64());
            Some(v)
        }
        Err(e) => {
            eprintln!("FAILED after {:.1} s: {e}", t.elapsed().as_secs_f64());
            errors.push(format!("{name}: {e}"));
            None
        }
    }
}

async fn measure(args: &Args, url: String) -> BenchResult<ExitCode> {
    let started = Instant::now();
    // Before any redsem client exists: its metrics go to the recorder in place.
    let recorder = if args.recorder {
        Some(overhead::install()?)
    } else {
        None
    };
    let admin = Admin::connect(&url).await?;
    let machine = Machine {
        nproc: std::thread::available_parallelism().map_or(1, |n| n.get()),
        cpu_model: cpu_model(),
        redis_version: admin.redis_version().await?,
        load_average: std::fs::read_to_string("/proc/loadavg")
            .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
            .unwrap_or_default(),
        engine: redsem::Redsem::connect(&url).await?.engine().to_string(),
        server: if args.url.is_some() {
            url.clone()
        } else {
            "own redis-server".to_owned()
        },
    };
    let mut sizes = if args.smoke {
        Sizes::smoke()
    } else {
        Sizes::full()
    };
    if let Some(seconds) = args.s11_seconds {
        sizes.s11_time = Duration::from_secs(seconds);
    }
    let mut ctx = Ctx::new(url, admin, sizes);
    ctx.group_commit = !args.no_group_commit;
    let mut figures = Figures::default();
    let mut errors = Vec::new();
    let e = &mut errors;

    if args.runs(1) {
        figures.s1 = step("S1 uncontended", e, s1(&ctx)).await;
    }
    let mut recorder_overhead = None;
    if let Some((on, handle)) = &recorder {
        recorder_overhead = step(
            "S1 without and with a metrics recorder",
            e,
            overhead::run(&ctx, ctx.sizes.s1_time, on, handle),
        )
        .await;
    }
    let mut acks_overhead = None;
    if args.acks {
        acks_overhead = step(
            "S1 without and with replica acks",
            e,
            acks::run(ctx.sizes.s1_time),
        )
        .await;
    }
    let mut cluster_handoff = None;
    if args.cluster_handoff {
        cluster_handoff = step(
            "S3 hand-off on a three-primary cluster",
            e,
            cluster::run(ctx.sizes.s3_trials, ctx.group_commit),
        )
        .await;
    }
    let mut hold_stages = None;
    if args.hold_stages {
        hold_stages = step("S2 hold loop, stage by stage", e, stages::run(&ctx)).await;
    }
    if args.runs(2)
        && let Some((s2, s2_hold)) = step("S2 contended", e, s2(&ctx)).await
    {
        figures.s2 = s2;
        figures.s2_hold = s2_hold;
    }
    if args.runs(3) {
        figures.s3 = step("S3 hand-off", e, s3(&ctx)).await;
    }
    if args.runs(1) || args.runs(2) || args.runs(3) {
        figures.permit_and_latch = step(
            "S1/S3 equivalents: permit semaphore and latch",
            e,
            counters::run(&ctx, args.runs(1), args.runs(2), args.runs(3)),
        )
        .await;
    }
    if args.runs(4) {
        figures.s4 = step("S4 fairness", e, s4(&ctx)).await;
    }
    if args.runs(5) {
        figures.s5 = step("S5 scale", e, scale::run(&ctx)).await;
    }
    if args.runs(6) {
        figures.s6 = step("S6 Redis cost", e, cost::run(&ctx)).await;
    }
    if args.runs(7) {
        figures.s7 = step("S7 the seeds' algorithm", e, s7(&ctx)).await;
    }
    if args.runs(9) {
        figures.s9 = step("S9 the polling baseline", e, s9(&ctx)).await;
    }
    if args.runs(10) {
        figures.s10 = step("S10 many waiters", e, many::run(&ctx)).await;
    }
    if args.runs(8) {
        let mut points = vec![(1, 1)];
        for &c in &ctx.sizes.s2_clients {
            for &t in &ctx.sizes.s2_tasks {
                points.push((t, c));
            }
        }
        figures.s8 = step("S8 raw limit", e, raw::run(&ctx, &points)).await;
    }
    if args.runs(11) {
        figures.s11 = step("S11 steady state", e, steady::run(&ctx)).await;
    }
    if args.runs(12) {
        figures.s12 = step("S12 noisy neighbour", e, noisy::run(&ctx)).await;
    }

    let targets = figures.targets();
    let invariants = figures.invariants();
    println!(
        "redsem-bench {} — {} cores, {}, Redis {}, redsem served by {}, load average {} at the start\n",
        if args.smoke { "smoke" } else { "full run" },
        machine.nproc,
        machine.cpu_model,
        machine.redis_version,
        machine.engine,
        machine.load_average
    );
    print!("{}", figures.table(&targets, &invariants));
    if let Some(o) = &recorder_overhead {
        println!(
            "\nS1 try_acquire + release, metrics recorder off / on (alternating slices):\n  \
             without: p50 {:.1} µs, mean {:.1} µs, p99 {:.1} µs ({} cycles)\n  \
             with:    p50 {:.1} µs, mean {:.1} µs, p99 {:.1} µs ({} cycles)\n  \
             overhead: p50 {:+.1} %, mean {:+.1} % ({} lines of Prometheus text recorded)",
            o.without.p50_us,
            o.without.mean_us,
            o.without.p99_us,
            o.without.count,
            o.with.p50_us,
            o.with.mean_us,
            o.with.p99_us,
            o.with.count,
            o.p50_overhead_pct,
            o.mean_overhead_pct,
            o.exposition_lines
        );
    }
    if let Some(a) = &acks_overhead {
        println!("\n{}", a.summary());
    }
    if let Some(c) = &cluster_handoff {
        println!("\n{}", c.summary());
    }
    if let Some(s) = &hold_stages {
        print!("\n{}", stages::summary(s));
    }
    for err in &errors {
        println!("  ERROR {err}");
    }
    let duration_s = started.elapsed().as_secs_f64();
    println!("\n{duration_s:.1} s in all");
    if let Some(path) = &args.out {
        let out = Output {
            bench: "redsem-bench",
            version: env!("CARGO_PKG_VERSION"),
            mode: if args.smoke { "smoke" } else { "full" },
            group_commit: ctx.group_commit,
            machine,
            sizes: &ctx.sizes,
            duration_s,
            figures: &figures,
            targets: &targets,
            invariants: &invariants,
            errors: &errors,
            recorder_overhead: recorder_overhead.as_ref(),
            acks_overhead: acks_overhead.as_ref(),
            cluster_handoff: cluster_handoff.as_ref(),
            hold_stages: hold_stages.as_deref(),
        };
        std::fs::write(path, serde_json::to_string_pretty(&out)? + "\n")
            .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    }
    let violated = invariants.iter().any(|i| !i.held);
    Ok(if violated || !errors.is_empty() {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    })
}

async fn s1(ctx: &Ctx) -> BenchResult<core::CycleRun> {
    let prefix = ctx.prefix("s1");
    let sems = ctx
        .redsem_sems(&prefix, "s1", 5, LeaseOptions::default(), 1)
        .await?;
    let mut yardstick = core::RawPair::new(&ctx.admin).await?;
    let run = core::cycles(
        &ctx.admin,
        &sems[0],
        ctx.sizes.s1_time,
        Some(&mut yardstick),
    )
    .await?;
    ctx.clean(&prefix).await?;
    Ok(run)
}

/// The S2 points (tasks, clients) of this run without a hold.
fn s2_plain(ctx: &Ctx) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    for &clients in &ctx.sizes.s2_clients {
        for &tasks in &ctx.sizes.s2_tasks {
            out.push((tasks, clients));
        }
    }
    out
}

/// Run the S2 `points` (tasks, clients), capacity 8, each holder holding for `hold`, on the
/// semaphores `make(clients, name)` gives.
async fn s2_points<S: BenchSem, F, Fut>(
    ctx: &Ctx,
    points: &[(usize, usize)],
    hold: Option<Duration>,
    make: F,
) -> BenchResult<Vec<core::ContendedRun>>
where
    F: Fn(usize, String) -> Fut,
    Fut: Future<Output = BenchResult<Vec<S>>>,
{
    let mut out = Vec::new();
    for &(tasks, clients) in points {
        let name = match hold {
            None => format!("s2-{tasks}-{clients}"),
            Some(_) => format!("s2h-{tasks}-{clients}"),
        };
        let sems = make(clients, name).await?;
        out.push(core::contended(&ctx.admin, &sems, tasks, 8, hold, ctx.sizes.s2_time).await?);
    }
    Ok(out)
}

/// S2 without a hold, then the hold points.
async fn s2(ctx: &Ctx) -> BenchResult<(Vec<core::ContendedRun>, Vec<core::ContendedRun>)> {
    let prefix = ctx.prefix("s2");
    let make = |clients, name: String| {
        let prefix = prefix.clone();
        async move {
            ctx.redsem_sems(&prefix, &name, 8, LeaseOptions::default(), clients)
                .await
        }
    };
    let plain = s2_points(ctx, &s2_plain(ctx), None, make).await?;
    let held = s2_points(
        ctx,
        &ctx.sizes.s2_hold_points,
        Some(ctx.sizes.s2_hold),
        make,
    )
    .await?;
    ctx.clean(&prefix).await?;
    Ok((plain, held))
}

async fn s3(ctx: &Ctx) -> BenchResult<core::HandoffRun> {
    let prefix = ctx.prefix("s3");
    let sems = ctx
        .redsem_sems(&prefix, "s3", 1, LeaseOptions::default(), 2)
        .await?;
    let run = core::handoff(&sems[0], &sems[1], ctx.sizes.s3_trials).await?;
    ctx.clean(&prefix).await?;
    Ok(run)
}

async fn s4(ctx: &Ctx) -> BenchResult<core::FairnessRun> {
    let prefix = ctx.prefix("s4");
    let sems = ctx
        .redsem_sems(&prefix, "s4", 1, LeaseOptions::default(), 5)
        .await?;
    let run = core::fairness(&sems[0], &sems[1..], ctx.sizes.s4_waiters).await?;
    ctx.clean(&prefix).await?;
    Ok(run)
}

/// S1–S4 and the S2 hold points on a baseline algorithm: `make(name, capacity, clients)`
/// gives one handle per client; `trips` counts the round trips they send. With `alongside`,
/// S1 alternates its slices with that redsem semaphore's (capacity 5 too).
async fn baseline<S: BenchSem, F, Fut>(
    ctx: &Ctx,
    trips: &AtomicU64,
    alongside: Option<&sem::Redsem>,
    make: F,
) -> BenchResult<BaselineRun>
where
    F: Fn(String, u64, usize) -> Fut,
    Fut: Future<Output = BenchResult<Vec<S>>>,
{
    let mut out = BaselineRun::default();
    let sems = make("s1".to_owned(), 5, 1).await?;
    let before = trips.load(Ordering::Relaxed);
    let mut yardstick = core::RawPair::new(&ctx.admin).await?;
    let run = match alongside {
        Some(redsem) => {
            let (run, redsem_run) = core::cycles_side_by_side(
                &ctx.admin,
                &sems[0],
                redsem,
                ctx.sizes.s1_time,
                &mut yardstick,
            )
            .await?;
            out.s1_redsem_alongside = Some(redsem_run);
            run
        }
        None => {
            core::cycles(
                &ctx.admin,
                &sems[0],
                ctx.sizes.s1_time,
                Some(&mut yardstick),
            )
            .await?
        }
    };
    let after = trips.load(Ordering::Relaxed);
    // 20 warm-up cycles ran before the measured ones.
    out.s1_round_trips_per_cycle = (after - before) as f64 / (run.cycles + 20).max(1) as f64;
    out.s1 = Some(run);

    let contended = |clients, name| make(name, 8, clients);
    out.s2 = s2_points(ctx, &s2_plain(ctx), None, &contended).await?;
    out.s2_hold = s2_points(
        ctx,
        &ctx.sizes.s2_hold_points,
        Some(ctx.sizes.s2_hold),
        &contended,
    )
    .await?;

    let sems = make("s3".to_owned(), 1, 2).await?;
    out.s3 = Some(core::handoff(&sems[0], &sems[1], ctx.sizes.s3_trials).await?);

    let sems = make("s4".to_owned(), 1, 5).await?;
    out.s4 = Some(core::fairness(&sems[0], &sems[1..], ctx.sizes.s4_waiters).await?);
    Ok(out)
}

async fn s7(ctx: &Ctx) -> BenchResult<BaselineRun> {
    let prefix = ctx.prefix("s7");
    let trips = Arc::new(AtomicU64::new(0));
    let out = baseline(ctx, &trips, None, |name, limit, clients| {
        let (prefix, trips) = (prefix.clone(), trips.clone());
        async move { ctx.seeds_sems(&prefix, &name, limit, clients, &trips).await }
    })
    .await?;
    ctx.clean(&prefix).await?;
    Ok(out)
}

async fn s9(ctx: &Ctx) -> BenchResult<BaselineRun> {
    let prefix = ctx.prefix("s9");
    let trips = Arc::new(AtomicU64::new(0));
    // redsem's S1 again, in slices alternating with the baseline's: the S1 ratio.
    let redsem = ctx
        .redsem_sems(&prefix, "s1-redsem", 5, LeaseOptions::default(), 1)
        .await?;
    let out = baseline(ctx, &trips, Some(&redsem[0]), |name, limit, clients| {
        let (prefix, trips) = (prefix.clone(), trips.clone());
        async move {
            ctx.polling_sems(&prefix, &name, limit, clients, &trips)
                .await
        }
    })
    .await?;
    ctx.clean(&prefix).await?;
    Ok(out)
}
