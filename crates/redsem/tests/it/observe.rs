//! Metrics, `Serialize` of the status, `ensure_permits`, and the blocking facade, on
//! real throwaway servers.
//!
//! One `DebuggingRecorder` is installed for the whole test binary. Its snapshots take the
//! values out (counters are swapped to 0, histograms drained), so every test reads through
//! [`figures`], which adds each snapshot to one shared store; tests keep apart by using names
//! no other test uses.

use std::collections::BTreeMap;
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use redsem::{MetricNames, PermitOptions, RedsemOptions, Tenant};

use crate::support::{LIMIT, RedisServer, TestContext, connect_with, cycle, short, within};
use crate::support::{Needs, skip_without};

/// Counters and histogram samples seen so far, by `metric{label=value,...}` (labels sorted).
#[derive(Default)]
struct Store {
    counters: BTreeMap<String, u64>,
    histograms: BTreeMap<String, Vec<f64>>,
}

fn store() -> &'static (Snapshotter, Mutex<Store>) {
    static STORE: OnceLock<(Snapshotter, Mutex<Store>)> = OnceLock::new();
    STORE.get_or_init(|| {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        recorder
            .install()
            .expect("no other recorder in this test binary");
        (snapshotter, Mutex::new(Store::default()))
    })
}

/// Install the recorder (before the primitives report anything).
fn record() {
    store();
}

fn series(name: &str, labels: &[(&str, &str)]) -> String {
    let mut labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
    labels.sort();
    format!("{name}{{{}}}", labels.join(","))
}

/// Everything recorded until now.
fn figures() -> std::sync::MutexGuard<'static, Store> {
    let (snapshotter, store) = store();
    let mut store = store.lock().unwrap_or_else(|p| p.into_inner());
    for (key, _, _, value) in snapshotter.snapshot().into_vec() {
        let key = key.key();
        let labels: Vec<(&str, &str)> = key.labels().map(|l| (l.key(), l.value())).collect();
        let id = series(key.name(), &labels);
        match value {
            DebugValue::Counter(n) => *store.counters.entry(id).or_default() += n,
            DebugValue::Histogram(xs) => store
                .histograms
                .entry(id)
                .or_default()
                .extend(xs.into_iter().map(|x| x.into_inner())),
            // A snapshot swaps a gauge to 0: read one from a recorder of its own (below).
            DebugValue::Gauge(_) => {}
        }
    }
    store
}

fn counter(name: &str, labels: &[(&str, &str)]) -> u64 {
    figures()
        .counters
        .get(&series(name, labels))
        .copied()
        .unwrap_or(0)
}

fn samples(name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
    figures()
        .histograms
        .get(&series(name, labels))
        .cloned()
        .unwrap_or_default()
}

/// Poll (every 10 ms, at most [`LIMIT`]) until `cond` holds.
async fn until(what: &str, mut cond: impl FnMut() -> bool) {
    within(LIMIT, what, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_are_counted_by_outcome_and_timed() {
    record();
    let ctx = TestContext::start().await;
    let name = "obs-outcomes";
    let sem = ctx.redsem.lease_semaphore(name, 1).expect("sem");
    let l = |outcome| [("primitive", "lease"), ("name", name), ("outcome", outcome)];

    let first = within(LIMIT, "try_acquire", sem.try_acquire())
        .await
        .expect("free");
    let busy = within(LIMIT, "try_acquire busy", sem.try_acquire()).await;
    assert!(busy.expect_err("held").is_not_acquired());
    let late = within(
        LIMIT,
        "acquire_timeout",
        sem.acquire_timeout(Duration::from_millis(100)),
    )
    .await;
    assert!(late.expect_err("held").is_timeout());
    // Cancelled: the acquire future is dropped while it waits.
    let cut = tokio::time::timeout(Duration::from_millis(100), sem.acquire()).await;
    assert!(cut.is_err(), "the unit is held, so the acquire waits");

    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await }
    });
    within(LIMIT, "queued", async {
        while sem.status().await.expect("status").waiters.len() != 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(30)).await;
    within(LIMIT, "release", first.release())
        .await
        .expect("release");
    let second = within(LIMIT, "waiter granted", waiter)
        .await
        .expect("join")
        .expect("granted");
    within(LIMIT, "release", second.release())
        .await
        .expect("release");

    assert_eq!(counter("redsem_acquires_total", &l("granted")), 2);
    assert_eq!(counter("redsem_acquires_total", &l("busy")), 1);
    assert_eq!(counter("redsem_acquires_total", &l("timeout")), 1);
    assert_eq!(counter("redsem_acquires_total", &l("cancelled")), 1);
    let timed = samples("redsem_acquire_seconds", &l("timeout"));
    assert_eq!(timed.len(), 1);
    assert!(
        timed[0] >= 0.1,
        "the timed-out acquire waited 100 ms: {timed:?}"
    );
    let lease = [("primitive", "lease"), ("name", name)];
    let queued = samples("redsem_queue_wait_seconds", &lease);
    assert_eq!(queued.len(), 1, "only the waiter that queued and got in");
    assert!(queued[0] >= 0.03, "it waited at least 30 ms: {queued:?}");
    assert_eq!(samples("redsem_hold_seconds", &lease).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquires_that_name_a_tenant_are_counted_by_tenant() {
    record();
    let ctx = TestContext::start().await;
    let name = "obs-tenants";
    let sem = ctx.redsem.lease_semaphore(name, 1).expect("sem");
    let acme = sem.for_tenant(Tenant::new("obs-acme")).expect("tenant");
    let beta = sem.for_tenant(Tenant::new("obs-beta")).expect("tenant");
    let t = |tenant, outcome| {
        [
            ("primitive", "lease"),
            ("name", name),
            ("tenant", tenant),
            ("outcome", outcome),
        ]
    };

    let first = within(LIMIT, "try_acquire", acme.try_acquire())
        .await
        .expect("free");
    let busy = within(LIMIT, "try_acquire busy", beta.try_acquire()).await;
    assert!(busy.expect_err("held").is_not_acquired());
    let waiter = tokio::spawn({
        let beta = beta.clone();
        async move { beta.acquire().await }
    });
    until("beta queued", || {
        counter("redsem_tenant_acquires_total", &t("obs-beta", "busy")) == 1
    })
    .await;
    within(LIMIT, "queued", async {
        while sem.status().await.expect("status").waiters.len() != 1 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    within(LIMIT, "release", first.release())
        .await
        .expect("release");
    let second = within(LIMIT, "beta granted", waiter)
        .await
        .expect("join")
        .expect("granted");
    within(LIMIT, "release", second.release())
        .await
        .expect("release");
    // A handle whose options name the tenant counts the same way; the plain one only in the
    // series without a tenant.
    let options = redsem::LeaseOptions::default().tenant(Tenant::new("obs-gamma"));
    let gamma = ctx
        .redsem
        .lease_semaphore_with(name, 1, options)
        .expect("sem");
    for sem in [&gamma, &sem] {
        let permit = within(LIMIT, "try_acquire", sem.try_acquire())
            .await
            .expect("free");
        within(LIMIT, "release", permit.release())
            .await
            .expect("release");
    }

    assert_eq!(
        counter("redsem_tenant_acquires_total", &t("obs-acme", "granted")),
        1
    );
    assert_eq!(
        counter("redsem_tenant_acquires_total", &t("obs-beta", "granted")),
        1
    );
    assert_eq!(
        counter("redsem_tenant_acquires_total", &t("obs-gamma", "granted")),
        1
    );
    let all = [
        ("primitive", "lease"),
        ("name", name),
        ("outcome", "granted"),
    ];
    assert_eq!(counter("redsem_acquires_total", &all), 4);
    let beta_wait = [
        ("primitive", "lease"),
        ("name", name),
        ("tenant", "obs-beta"),
    ];
    assert_eq!(
        samples("redsem_tenant_queue_wait_seconds", &beta_wait).len(),
        1
    );
    let by_tenant: Vec<String> = figures()
        .counters
        .keys()
        .filter(|k| k.starts_with("redsem_tenant_acquires_total") && k.contains(name))
        .cloned()
        .collect();
    assert_eq!(
        by_tenant.len(),
        4,
        "acme, beta (busy, granted), gamma: {by_tenant:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn renewals_and_lost_leases_are_counted() {
    record();
    let ctx = TestContext::start().await;
    let renewed = ctx
        .redsem
        .lease_semaphore_with("obs-renewed", 1, short(90))
        .expect("sem");
    let permit = within(LIMIT, "acquire", renewed.acquire())
        .await
        .expect("acquire");
    let ok = [
        ("primitive", "lease"),
        ("name", "obs-renewed"),
        ("outcome", "ok"),
    ];
    let mut seen = 0;
    until("two renewals", || {
        seen += counter("redsem_renewals_total", &ok);
        seen >= 2
    })
    .await;
    within(LIMIT, "release", permit.release())
        .await
        .expect("release");

    let name = "obs-lost";
    let unrenewed = ctx
        .redsem
        .lease_semaphore_with(name, 1, short(60).keepalive(false))
        .expect("sem");
    let permit = within(LIMIT, "acquire", unrenewed.acquire())
        .await
        .expect("acquire");
    within(LIMIT, "lost", permit.lost()).await;
    drop(permit);
    let labels = [("primitive", "lease"), ("name", name)];
    assert_eq!(counter("redsem_leases_lost_total", &labels), 1);
    assert_eq!(
        samples("redsem_hold_seconds", &labels).len(),
        1,
        "the hold ends once, at the loss, not again at the drop"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn permits_and_latches_report_under_their_own_primitive() {
    record();
    let ctx = TestContext::start().await;
    let permits = ctx.redsem.permit_semaphore("obs-pool").expect("permits");
    within(LIMIT, "ensure", permits.ensure_permits(1))
        .await
        .expect("ensure");
    within(LIMIT, "acquire", permits.acquire(1))
        .await
        .expect("acquire");
    let busy = within(LIMIT, "try_acquire", permits.try_acquire(1)).await;
    assert!(busy.expect_err("none left").is_not_acquired());
    within(LIMIT, "release", permits.release(1))
        .await
        .expect("release");
    let pool = |outcome| {
        [
            ("primitive", "permits"),
            ("name", "obs-pool"),
            ("outcome", outcome),
        ]
    };
    assert_eq!(counter("redsem_acquires_total", &pool("granted")), 1);
    assert_eq!(counter("redsem_acquires_total", &pool("busy")), 1);
    assert_eq!(
        counter(
            "redsem_permits_released_total",
            &[("primitive", "permits"), ("name", "obs-pool")]
        ),
        1
    );

    let latch = ctx.redsem.count_down_latch("obs-latch").expect("latch");
    within(LIMIT, "set", latch.try_set_count(1))
        .await
        .expect("set");
    let waiting = tokio::spawn({
        let latch = latch.clone();
        async move { latch.wait().await }
    });
    within(LIMIT, "count down", latch.count_down())
        .await
        .expect("count down");
    within(LIMIT, "wait", waiting)
        .await
        .expect("join")
        .expect("opened");
    let labels = [("primitive", "latch"), ("name", "obs-latch")];
    assert_eq!(counter("redsem_latch_count_downs_total", &labels), 1);
    let opened = [
        ("primitive", "latch"),
        ("name", "obs-latch"),
        ("outcome", "opened"),
    ];
    assert_eq!(counter("redsem_latch_waits_total", &opened), 1);
    assert_eq!(samples("redsem_latch_wait_seconds", &opened).len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_outside_the_allow_list_share_one_label_value() {
    record();
    let server = RedisServer::start();
    let options = RedsemOptions::default()
        .prefix("t")
        .metric_names(MetricNames::only(["obs-shown"]));
    let redsem = connect_with(&server.url(), options).await.expect("connect");
    for name in ["obs-secret-1", "obs-secret-2"] {
        let lock = redsem.mutex(name).expect("mutex");
        let guard = within(LIMIT, "lock", lock.try_lock()).await.expect("lock");
        within(LIMIT, "unlock", guard.unlock())
            .await
            .expect("unlock");
    }
    let shown = redsem.mutex("obs-shown").expect("mutex");
    within(LIMIT, "lock", shown.try_lock())
        .await
        .expect("lock")
        .unlock()
        .await
        .expect("unlock");
    let granted = |name| {
        [
            ("primitive", "mutex"),
            ("name", name),
            ("outcome", "granted"),
        ]
    };
    assert_eq!(counter("redsem_acquires_total", &granted("*")), 2);
    assert_eq!(counter("redsem_acquires_total", &granted("obs-shown")), 1);
    assert_eq!(
        counter("redsem_acquires_total", &granted("obs-secret-1")),
        0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pubsub_reconnect_is_counted() {
    record();
    let ctx = TestContext::start().await;
    // Make the client open its pub/sub connection: a waiter of a held semaphore.
    let sem = ctx
        .redsem
        .lease_semaphore_with("obs-pubsub", 1, short(3000))
        .expect("sem");
    let held = within(LIMIT, "acquire", sem.acquire())
        .await
        .expect("acquire");
    let waiter = tokio::spawn({
        let sem = sem.clone();
        async move { sem.acquire().await }
    });
    within(LIMIT, "subscribed", async {
        while ctx.clients_of_type("pubsub").await == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    let mut seen = counter("redsem_pubsub_reconnects_total", &[]);
    let before = seen;
    assert!(ctx.kill_clients("pubsub").await >= 1);
    until("a reconnect counted", || {
        seen += counter("redsem_pubsub_reconnects_total", &[]);
        seen > before
    })
    .await;
    within(LIMIT, "release", held.release())
        .await
        .expect("release");
    within(LIMIT, "waiter", waiter)
        .await
        .expect("join")
        .expect("granted")
        .release()
        .await
        .expect("release");
}

#[tokio::test]
async fn status_serializes_with_ids_tokens_and_milliseconds() {
    let ctx = TestContext::start().await;
    let sem = ctx
        .redsem
        .lease_semaphore_with(
            "obs-json",
            1,
            redsem::LeaseOptions::default().label("web-1"),
        )
        .expect("sem");
    let permit = within(LIMIT, "acquire", sem.acquire())
        .await
        .expect("acquire");
    let status = within(LIMIT, "status", sem.status()).await.expect("status");
    let json = serde_json::to_value(&status).expect("serialize");
    assert_eq!(json["capacity"], 1);
    assert_eq!(json["in_use"], 1);
    let holder = &json["holders"][0];
    assert_eq!(holder["id"], permit.id().as_str());
    assert_eq!(holder["token"], permit.token().get());
    assert_eq!(holder["label"], "web-1");
    assert_eq!(holder["slots"], serde_json::json!([0]));
    assert!(holder["expires_in_ms"].as_u64().expect("ms") > 20_000);
    assert!(holder["held_for_ms"].is_u64());
    assert_eq!(json["waiters"], serde_json::json!([]));
    let state = serde_json::to_value(redsem::LatchState::Counting(3)).expect("serialize");
    assert_eq!(state, serde_json::json!({"state": "counting", "count": 3}));
    permit.release().await.expect("release");
}

#[tokio::test]
async fn the_status_report_of_a_name_serializes_as_the_cli_and_python_show_it() {
    let ctx = TestContext::start().await;
    let sem = ctx
        .redsem
        .lease_semaphore_with("jobs", 2, redsem::LeaseOptions::default().label("web-1"))
        .expect("sem");
    let permit = within(LIMIT, "acquire", sem.acquire())
        .await
        .expect("acquire");
    let latch = ctx.redsem.count_down_latch("jobs").expect("latch");
    latch.try_set_count(3).await.expect("set the latch");
    let report = within(LIMIT, "report", ctx.redsem.status_report("jobs"))
        .await
        .expect("report");
    assert_eq!(report.name, "jobs");
    assert_eq!((report.lease.capacity, report.lease.in_use), (Some(2), 1));
    assert_eq!(report.lease.holders[0].id, *permit.id());
    assert_eq!(report.permits.available, 0);
    assert_eq!(report.latch, redsem::LatchState::Counting(3));
    let json = serde_json::to_value(&report).expect("serialize");
    let mut keys: Vec<&str> = json
        .as_object()
        .expect("an object")
        .keys()
        .map(String::as_str)
        .collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        [
            "capacity", "holders", "in_use", "latch", "name", "permits", "waiters"
        ],
        "{json}"
    );
    assert_eq!(json["name"], "jobs");
    assert_eq!(json["capacity"], 2);
    assert_eq!(json["holders"][0]["id"], permit.id().as_str());
    assert_eq!(json["holders"][0]["label"], "web-1");
    assert_eq!(json["permits"], serde_json::json!({"available": 0}));
    assert_eq!(
        json["latch"],
        serde_json::json!({"state": "counting", "count": 3})
    );
    for (state, shown) in [
        (
            redsem::LatchState::NeverSet,
            serde_json::json!({"state": "never-set", "count": 0}),
        ),
        (
            redsem::LatchState::Done,
            serde_json::json!({"state": "open", "count": 0}),
        ),
    ] {
        assert_eq!(serde_json::to_value(state).expect("serialize"), shown);
    }
    // A name with nothing stored reads as empty, and nothing is created by reading it.
    let empty = ctx.redsem.status_report("none").await.expect("report");
    assert_eq!(empty.lease.capacity, None);
    assert_eq!(empty.latch, redsem::LatchState::NeverSet);
    assert!(
        ctx.keys().await.iter().all(|key| !key.contains("none")),
        "{:?}",
        ctx.keys().await
    );
    permit.release().await.expect("release");
}

#[tokio::test]
async fn a_fresh_pool_with_expected_permits_does_not_wait_on_zero() {
    let ctx = TestContext::start().await;
    let options = PermitOptions::default().permits(2);
    let pool = ctx
        .redsem
        .permit_semaphore_with("obs-fresh", options)
        .expect("permits");
    within(LIMIT, "acquire from a never-set pool", pool.acquire(2))
        .await
        .expect("the expected count was set first");
    // Another process expecting another size leaves the count in force alone.
    let other = ctx
        .client()
        .await
        .permit_semaphore_with("obs-fresh", PermitOptions::default().permits(5))
        .expect("permits");
    let busy = within(LIMIT, "try_acquire", other.try_acquire(1)).await;
    assert!(busy.expect_err("all taken").is_not_acquired());
    assert!(!other.ensure_permits(7).await.expect("ensure"));
    assert_eq!(pool.available_permits().await.expect("available"), 0);
}

#[test]
fn the_blocking_facade_works_without_a_runtime_and_releases_on_drop() {
    let server = RedisServer::start();
    let redsem =
        redsem::blocking::Redsem::connect_with(&server.url(), RedsemOptions::default().prefix("t"))
            .expect("connect");
    let sem = redsem.lease_semaphore("obs-blocking", 1).expect("sem");
    let permit = sem.try_acquire().expect("free");
    assert!(permit.is_held());
    assert!(sem.try_acquire().expect_err("held").is_not_acquired());
    drop(permit); // waits for the release
    let again = sem.try_acquire().expect("released by the drop");

    // A waiter on another thread gets in when the holder releases.
    let (granted, got) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn({
        let sem = sem.clone();
        move || {
            let permit = sem.acquire().expect("acquire");
            granted.send(permit.token()).expect("send");
            permit.release().expect("release");
        }
    });
    redsem_test::eventually(LIMIT, "the waiter queued", || {
        !sem.status().expect("status").waiters.is_empty()
    });
    let first = again.token();
    again.release().expect("release");
    let token = got.recv_timeout(LIMIT).expect("the waiter was granted");
    assert!(token > first);
    waiter.join().expect("waiter thread");

    let lock = redsem.mutex("obs-blocking-mutex").expect("mutex");
    let guard = lock.lock().expect("lock");
    assert!(lock.try_lock().is_err());
    guard.unlock().expect("unlock");
    // With options: the lease given, not the default 30 s.
    let short_lease = Duration::from_secs(2);
    let lock = redsem
        .mutex_with(
            "obs-blocking-mutex-2",
            redsem::LeaseOptions::default().lease(short_lease),
        )
        .expect("mutex with options");
    let guard = lock.lock().expect("lock");
    let left = guard.time_left();
    assert!(
        left > Duration::ZERO && left <= short_lease,
        "{left:?} left of a {short_lease:?} lease"
    );
    guard.unlock().expect("unlock");

    let pool = redsem
        .permit_semaphore("obs-blocking-pool")
        .expect("permits");
    assert!(pool.ensure_permits(2).expect("ensure"));
    pool.acquire(2).expect("acquire");
    assert_eq!(pool.available_permits().expect("available"), 0);
    pool.release(2).expect("release");

    let latch = redsem
        .count_down_latch("obs-blocking-latch")
        .expect("latch");
    assert!(latch.try_set_count(1).expect("set"));
    latch.count_down().expect("count down");
    latch.wait_timeout(LIMIT).expect("open");
}

#[tokio::test]
async fn a_function_library_load_is_counted_as_a_script_reload() {
    if skip_without(
        Needs::Functions,
        "a_function_library_load_is_counted_as_a_script_reload",
        "counts a FUNCTION LOAD",
    ) {
        return;
    }
    record();
    let ctx = TestContext::start().await;
    let before = counter("redsem_script_reloads_total", &[]);
    // A fresh server has no library: the first call loads it.
    let sem = ctx.redsem.lease_semaphore("obs-reload", 1).expect("sem");
    cycle(&sem).await.expect("acquire and release");
    // (Cumulative over the binary; other tests' fresh servers add to it too, but without a
    // count at every load it would stay where it was.)
    let after = counter("redsem_script_reloads_total", &[]);
    assert!(after > before, "no reload counted ({before} -> {after})");
}

#[test]
fn the_engine_gauge_counts_the_clients_each_engine_serves() {
    // A recorder of this thread alone, and a runtime that runs every task on it: a snapshot
    // swaps each gauge to 0, so the binary's shared recorder can read 0 here whenever another
    // test has just taken a snapshot.
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("runtime");
        runtime.block_on(async {
            let ctx = TestContext::start().await;
            let gauges: BTreeMap<String, f64> = snapshotter
                .snapshot()
                .into_vec()
                .into_iter()
                .filter_map(|(key, _, _, value)| match value {
                    DebugValue::Gauge(x) => {
                        let key = key.key();
                        let labels: Vec<(&str, &str)> =
                            key.labels().map(|l| (l.key(), l.value())).collect();
                        Some((series(key.name(), &labels), x.into_inner()))
                    }
                    _ => None,
                })
                .collect();
            let gauge = |engine: &str| {
                gauges
                    .get(&series("redsem_engine", &[("engine", engine)]))
                    .copied()
            };
            // No server of this binary loads the module: every client is served by the
            // scripts (the other tests' clients too, so only a lower bound for them).
            assert!(!ctx.redsem.engine().is_native());
            assert!(
                gauge("scripts").is_some_and(|n| n >= 1.0),
                "{:?}",
                gauge("scripts")
            );
            assert_eq!(gauge("native"), Some(0.0));
        });
    });
}
