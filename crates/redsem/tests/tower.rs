//! The tower layer (`redsem::tower`) in front of real axum servers, talked to over HTTP/1.
//!
//! Each test starts a throwaway redis-server and two copies of an app (two `Redsem` clients,
//! two axum servers on ports of their own) whose `/work` route shares one limit. The handlers
//! count themselves in a shared gauge, so the test sees how many run at once across both.
//!
//! The overhead measurement (`overhead_of_the_layer`, ignored by default) runs with
//! `cargo test --release -p redsem --features tower --test tower -- --ignored --nocapture`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use axum::error_handling::HandleErrorLayer;
use axum::http::StatusCode;
use axum::routing::get;
use axum::{Extension, Router};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use redsem::tower::{HeldLease, LeaseLimitLayer, LimitError, OnLost, ResponseFuture};
use redsem::{LeaseOptions, LeaseSemaphore, Redsem, RedsemOptions};
use redsem_test::{RedisServer, within};
use tokio::sync::watch;
use tower::{Service as _, ServiceBuilder, ServiceExt as _, service_fn};

/// The bound of every wait.
const LIMIT: Duration = Duration::from_secs(10);

/// What the handlers of both apps share.
#[derive(Clone)]
struct Shared {
    /// Handlers running now.
    running: Arc<AtomicUsize>,
    /// The most that ever ran at once.
    most: Arc<AtomicUsize>,
    /// Handlers whose future was dropped before it finished.
    dropped: Arc<AtomicUsize>,
    /// While false, handlers wait (after counting themselves in) until it turns true.
    gate: watch::Receiver<bool>,
    /// How long a handler works once the gate is open.
    work: Duration,
    /// The ids of the permits handlers ran under, in the order they started.
    ids: Arc<Mutex<Vec<redsem::PermitId>>>,
}

/// Counts a handler out of `running` when its future ends, finished or dropped.
struct Running {
    shared: Shared,
    finished: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.shared.running.fetch_sub(1, Ordering::SeqCst);
        if !self.finished {
            self.shared.dropped.fetch_add(1, Ordering::SeqCst);
        }
    }
}

impl Shared {
    fn new(work: Duration, open: bool) -> (Shared, watch::Sender<bool>) {
        let (gate_tx, gate) = watch::channel(open);
        let shared = Shared {
            running: Arc::default(),
            most: Arc::default(),
            dropped: Arc::default(),
            gate,
            work,
            ids: Arc::default(),
        };
        (shared, gate_tx)
    }

    fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }

    /// Wait until `n` handlers run (`what`: who they are, for the panic message).
    async fn until_running(&self, n: usize, what: &str) {
        eventually(what, || {
            let running = self.running();
            async move { running == n }
        })
        .await;
    }

    /// The handler of `/work`: counted in while it runs; waits for the gate, works, and
    /// answers with its fencing token. Under `OnLost::Continue` it stops when the lease is
    /// lost and says so.
    async fn work(self, lease: HeldLease) -> String {
        let now = self.running.fetch_add(1, Ordering::SeqCst) + 1;
        self.most.fetch_max(now, Ordering::SeqCst);
        self.ids
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(lease.id().clone());
        let mut guard = Running {
            shared: self.clone(),
            finished: false,
        };
        let mut gate = self.gate.clone();
        let job = async {
            // A closed channel counts as open: the test is over anyway.
            let _ = gate.wait_for(|open| *open).await;
            tokio::time::sleep(self.work).await;
        };
        let answer = tokio::select! {
            () = job => format!("token {}", lease.token()),
            () = lease.lost() => "lost".to_owned(),
        };
        guard.finished = true;
        answer
    }
}

/// The 429 / 503 / 500 of a refused request, its message in the body.
async fn refused(err: LimitError<Infallible>) -> (StatusCode, String) {
    let status = err
        .http_status()
        .unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (status, err.to_string())
}

/// One app: `/work` behind `layer`, served on a free port of 127.0.0.1 until the test ends.
async fn start_app(layer: LeaseLimitLayer, shared: Shared) -> SocketAddr {
    let app = Router::new()
        .route(
            "/work",
            get(move |Extension(lease): Extension<HeldLease>| shared.clone().work(lease)),
        )
        .route_layer(
            ServiceBuilder::new()
                .layer(HandleErrorLayer::new(refused))
                .layer(layer),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a free port");
    let addr = listener.local_addr().expect("the bound address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    addr
}

/// A `GET` of `path` over a connection of its own: the status and the body.
async fn get_path(addr: SocketAddr, path: &str) -> (StatusCode, String) {
    let stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("connect to the app");
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("HTTP/1 handshake");
    let driver = tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header("host", addr.to_string())
        .body(Empty::<Bytes>::new())
        .expect("a request");
    let response = sender.send_request(request).await.expect("a response");
    let status = response.status();
    let body = response
        .into_body()
        .collect()
        .await
        .expect("the body")
        .to_bytes();
    driver.abort();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A redis-server, and two clients of it: the two apps' own.
struct Fleet {
    clients: [Redsem; 2],
    _server: RedisServer,
}

impl Fleet {
    async fn start() -> Fleet {
        let server = RedisServer::start();
        let mut clients = Vec::new();
        for _ in 0..2 {
            let options = RedsemOptions::default().prefix("tower");
            let client = within(
                LIMIT,
                "connect",
                Redsem::connect_with(&server.url(), options),
            )
            .await
            .expect("connect to the test server");
            clients.push(client);
        }
        let [a, b]: [Redsem; 2] = clients.try_into().unwrap_or_else(|_| unreachable!());
        Fleet {
            clients: [a, b],
            _server: server,
        }
    }

    /// The semaphore `name` of capacity `capacity`, as each app opens it.
    fn semaphores(&self, name: &str, capacity: u32, lease: Duration) -> [LeaseSemaphore; 2] {
        self.clients.clone().map(|client| {
            client
                .lease_semaphore_with(name, capacity, LeaseOptions::default().lease(lease))
                .expect("open the semaphore")
        })
    }

    /// Two apps, each behind the layer `layer` makes of its own client's semaphore.
    async fn apps(
        &self,
        sems: &[LeaseSemaphore; 2],
        shared: &Shared,
        layer: impl Fn(LeaseSemaphore) -> LeaseLimitLayer,
    ) -> [SocketAddr; 2] {
        let first = start_app(layer(sems[0].clone()), shared.clone()).await;
        let second = start_app(layer(sems[1].clone()), shared.clone()).await;
        [first, second]
    }
}

/// Poll `cond` every 5 ms until it holds; panics naming `what` after `LIMIT`.
async fn eventually<F: Future<Output = bool>>(what: &str, mut cond: impl FnMut() -> F) {
    let deadline = Instant::now() + LIMIT;
    while !cond().await {
        assert!(
            Instant::now() < deadline,
            "timed out: {what} within {LIMIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Units in use and requests queued, as Redis has them.
async fn usage(sem: &LeaseSemaphore) -> (u64, usize) {
    let status = within(LIMIT, "status", sem.status()).await.expect("status");
    (status.in_use, status.waiters.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn waiting_requests_of_two_apps_never_exceed_the_limit_and_all_succeed() {
    const N: u32 = 3;
    const REQUESTS: usize = 40;
    let fleet = Fleet::start().await;
    let sems = fleet.semaphores("wait", N, Duration::from_secs(5));
    let (shared, _gate) = Shared::new(Duration::from_millis(25), true);
    let addrs = fleet
        .apps(&sems, &shared, |sem| {
            LeaseLimitLayer::waiting(sem, Duration::from_secs(8))
        })
        .await;

    let started = Instant::now();
    let mut requests = tokio::task::JoinSet::new();
    for n in 0..REQUESTS {
        let addr = addrs[n % 2];
        requests.spawn(async move { get_path(addr, "/work").await });
    }
    let mut tokens = Vec::new();
    while let Some(answer) = within(LIMIT, "the 40 requests", requests.join_next()).await {
        let (status, body) = answer.expect("a request task");
        assert_eq!(status, StatusCode::OK, "{body}");
        let token: u64 = body
            .strip_prefix("token ")
            .and_then(|t| t.parse().ok())
            .unwrap_or_else(|| panic!("a token in {body:?}"));
        tokens.push(token);
    }
    let took = started.elapsed();
    tokens.sort_unstable();
    tokens.dedup();
    assert_eq!(tokens.len(), REQUESTS, "one distinct fencing token each");
    let most = shared.most.load(Ordering::SeqCst);
    println!("{REQUESTS} requests over 2 apps, limit {N}: at most {most} at once, {took:?}");
    assert!(most <= N as usize, "{most} handlers ran at once, limit {N}");
    // 40 requests of 25 ms each take turns: the limit was reached, not just stayed under.
    assert_eq!(most, N as usize, "the limit was never reached");
    assert_eq!(usage(&sems[0]).await, (0, 0), "every permit given back");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn shedding_apps_answer_429_at_once_while_the_limit_is_held() {
    const N: u32 = 2;
    let fleet = Fleet::start().await;
    let sems = fleet.semaphores("shed", N, Duration::from_secs(5));
    let (shared, gate) = Shared::new(Duration::ZERO, false);
    let addrs = fleet.apps(&sems, &shared, LeaseLimitLayer::shedding).await;

    // One held request on each app: the limit is full.
    let held: Vec<_> = addrs
        .iter()
        .map(|&addr| tokio::spawn(get_path(addr, "/work")))
        .collect();
    shared
        .until_running(N as usize, "both handlers running")
        .await;

    let mut slowest = Duration::ZERO;
    for n in 0..10 {
        let started = Instant::now();
        let (status, body) = within(LIMIT, "a shed request", get_path(addrs[n % 2], "/work")).await;
        slowest = slowest.max(started.elapsed());
        assert_eq!(status, StatusCode::TOO_MANY_REQUESTS, "{body}");
        assert!(body.contains("concurrency limit reached"), "{body}");
    }
    println!("10 requests shed, the slowest answered in {slowest:?}");
    // At once: one round trip to Redis, not a wait (the handlers stay blocked throughout).
    assert!(slowest < Duration::from_millis(500), "{slowest:?}");
    assert_eq!(shared.running(), N as usize);
    assert_eq!(
        usage(&sems[0]).await,
        (u64::from(N), 0),
        "no shed request queued"
    );

    gate.send_replace(true);
    for request in held {
        let (status, body) = within(LIMIT, "a held request", request)
            .await
            .expect("a request task");
        assert_eq!(status, StatusCode::OK, "{body}");
    }
    assert_eq!(usage(&sems[1]).await, (0, 0), "every permit given back");
    let (status, _) = within(LIMIT, "a request after", get_path(addrs[1], "/work")).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(shared.most.load(Ordering::SeqCst), N as usize);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_wait_that_runs_out_answers_503_and_leaves_the_queue() {
    let fleet = Fleet::start().await;
    let sems = fleet.semaphores("timeout", 1, Duration::from_secs(5));
    let (shared, gate) = Shared::new(Duration::ZERO, false);
    let wait = Duration::from_millis(300);
    let addrs = fleet
        .apps(&sems, &shared, |sem| LeaseLimitLayer::waiting(sem, wait))
        .await;

    let held = tokio::spawn(get_path(addrs[0], "/work"));
    shared.until_running(1, "the first handler running").await;
    let started = Instant::now();
    let (status, body) = within(LIMIT, "a request that waits", get_path(addrs[1], "/work")).await;
    let waited = started.elapsed();
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("timed out"), "{body}");
    assert!(
        waited >= wait,
        "answered after {waited:?}, before its wait of {wait:?}"
    );
    assert_eq!(
        usage(&sems[0]).await,
        (1, 0),
        "the timed-out request left the queue"
    );

    gate.send_replace(true);
    let (status, _) = within(LIMIT, "the held request", held)
        .await
        .expect("a request task");
    assert_eq!(status, StatusCode::OK);
    assert_eq!(usage(&sems[0]).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_client_that_goes_away_gives_its_permit_and_its_place_in_line_back() {
    let fleet = Fleet::start().await;
    let sems = fleet.semaphores("gone", 1, Duration::from_secs(30));
    let (shared, gate) = Shared::new(Duration::ZERO, false);
    let addrs = fleet
        .apps(&sems, &shared, |sem| LeaseLimitLayer::waiting(sem, LIMIT))
        .await;

    // A holds the only unit (app 0), B waits in line for it (app 1).
    let a = tokio::spawn(get_path(addrs[0], "/work"));
    shared.until_running(1, "A's handler running").await;
    let b = tokio::spawn(get_path(addrs[1], "/work"));
    eventually("B queued", || async { usage(&sems[0]).await == (1, 1) }).await;

    // B's client goes away: its request leaves the queue; the lease stays with A.
    b.abort();
    let started = Instant::now();
    eventually("B's request out of the queue", || async {
        usage(&sems[0]).await == (1, 0)
    })
    .await;
    println!(
        "queued request withdrawn {:?} after its client left",
        started.elapsed()
    );

    // A's client goes away: the server drops the handler, the permit comes back long before
    // its 30 s lease would end.
    a.abort();
    let started = Instant::now();
    eventually("A's permit released", || async {
        usage(&sems[1]).await == (0, 0)
    })
    .await;
    let released = started.elapsed();
    println!("held permit released {released:?} after its client left");
    assert!(released < Duration::from_secs(5), "{released:?}");
    assert_eq!(
        shared.dropped.load(Ordering::SeqCst),
        1,
        "A's handler was dropped"
    );
    assert_eq!(shared.running(), 0);

    // The unit serves the next request at once.
    gate.send_replace(true);
    let (status, body) = within(LIMIT, "a request after", get_path(addrs[1], "/work")).await;
    assert_eq!(status, StatusCode::OK, "{body}");
}

/// Holds the only unit with a handler blocked on the gate, releases that permit by id from
/// the other client (as an operator's `redsem release` would), and returns the answer the
/// blocked request got, with how long after the release it came.
async fn answer_after_losing_the_lease(on_lost: OnLost) -> (StatusCode, String, Duration, Shared) {
    let fleet = Fleet::start().await;
    let sems = fleet.semaphores("lost", 1, Duration::from_millis(600));
    let (shared, _gate) = Shared::new(Duration::ZERO, false);
    let addrs = fleet
        .apps(&sems, &shared, |sem| {
            LeaseLimitLayer::waiting(sem, LIMIT).on_lost(on_lost)
        })
        .await;
    let request = tokio::spawn(get_path(addrs[0], "/work"));
    shared.until_running(1, "the handler running").await;
    let id = shared
        .ids
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .first()
        .cloned()
        .expect("the handler's permit id");
    within(LIMIT, "release by id", sems[1].release_id(&id))
        .await
        .expect("release the permit by id");
    let started = Instant::now();
    let (status, body) = within(LIMIT, "the answer", request)
        .await
        .expect("a request task");
    (status, body, started.elapsed(), shared)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_lease_stops_the_request_with_503_by_default() {
    let (status, body, after, shared) = answer_after_losing_the_lease(OnLost::Abort).await;
    println!("lost lease: {status} {after:?} after the release: {body}");
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("lost"), "{body}");
    // Found by the next renewal, due every third of the 600 ms lease.
    assert!(after < Duration::from_secs(2), "{after:?}");
    assert_eq!(
        shared.dropped.load(Ordering::SeqCst),
        1,
        "the handler was dropped"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_lease_reaches_the_handler_under_on_lost_continue() {
    let (status, body, after, shared) = answer_after_losing_the_lease(OnLost::Continue).await;
    println!("lost lease, handler told: {status} {after:?} after the release: {body}");
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body, "lost", "the handler saw the loss and answered itself");
    assert!(after < Duration::from_secs(2), "{after:?}");
    assert_eq!(
        shared.dropped.load(Ordering::SeqCst),
        0,
        "the handler finished"
    );
}

/// Median and 99th percentile of `samples` (sorted here).
fn quantiles(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

/// A request through the layer's `Service` (no HTTP: `oneshot` on a service that answers at
/// once) against the bare cycle of the library it wraps, in the same run on one server,
/// alternating: `try_acquire` + `release` against a shedding layer, `acquire_timeout` +
/// `release` against a waiting one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement: run with --release -- --ignored --nocapture"]
async fn overhead_of_the_layer() {
    const CYCLES: usize = 2000;
    let fleet = Fleet::start().await;
    let [sem, _] = fleet.semaphores("bench", 4, Duration::from_secs(30));
    let answer = service_fn(|_: http::Request<()>| async { Ok::<_, Infallible>(()) });
    let shed = ServiceBuilder::new()
        .layer(LeaseLimitLayer::shedding(sem.clone()))
        .service(answer);
    let wait = ServiceBuilder::new()
        .layer(LeaseLimitLayer::waiting(sem.clone(), LIMIT))
        .service(answer);
    let mut times: [Vec<Duration>; 4] = Default::default();
    // A warm-up: connections, scripts loaded, caches.
    for _ in 0..200 {
        let permit = sem.try_acquire().await.expect("a permit");
        permit.release().await.expect("release");
        shed.clone()
            .oneshot(http::Request::new(()))
            .await
            .expect("through the layer");
    }
    for _ in 0..CYCLES {
        let started = Instant::now();
        let permit = sem.try_acquire().await.expect("a permit");
        permit.release().await.expect("release");
        times[0].push(started.elapsed());

        let started = Instant::now();
        shed.clone()
            .oneshot(http::Request::new(()))
            .await
            .expect("through the shedding layer");
        times[1].push(started.elapsed());

        let started = Instant::now();
        let permit = sem.acquire_timeout(LIMIT).await.expect("a permit");
        permit.release().await.expect("release");
        times[2].push(started.elapsed());

        let started = Instant::now();
        wait.clone()
            .oneshot(http::Request::new(()))
            .await
            .expect("through the waiting layer");
        times[3].push(started.elapsed());
    }
    let names = [
        "bare try_acquire + release",
        "layer, shedding (oneshot)",
        "bare acquire_timeout + release",
        "layer, waiting (oneshot)",
    ];
    for (name, samples) in names.iter().zip(times.iter_mut()) {
        let (median, p99) = quantiles(samples);
        println!("{name:32} {CYCLES} cycles: median {median:?}, p99 {p99:?}");
    }
    assert_eq!(usage(&sem).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_inner_error_comes_through_and_the_permit_still_goes_back() {
    let fleet = Fleet::start().await;
    let [sem, _] = fleet.semaphores("inner", 1, Duration::from_secs(30));
    let failing = service_fn(|request: http::Request<()>| async move {
        let lease = request
            .extensions()
            .get::<HeldLease>()
            .cloned()
            .expect("the lease in the request's extensions");
        Err::<(), _>(std::io::Error::other(format!(
            "failed under token {}",
            lease.token()
        )))
    });
    let service = ServiceBuilder::new()
        .layer(LeaseLimitLayer::shedding(sem.clone()))
        .service(failing);
    for _ in 0..3 {
        let outcome = within(
            LIMIT,
            "a call",
            service.clone().oneshot(http::Request::new(())),
        )
        .await;
        match outcome {
            Err(LimitError::Inner(err)) => {
                assert!(err.to_string().starts_with("failed under token"))
            }
            other => panic!("expected the inner error, got {other:?}"),
        }
        // Given back before the call answered: the next (shedding) call finds it free.
        assert_eq!(usage(&sem).await, (0, 0));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_permit_goes_back_with_the_response_even_if_the_handler_keeps_its_lease() {
    let fleet = Fleet::start().await;
    let [sem, _] = fleet.semaphores("kept", 1, Duration::from_secs(30));
    let kept: Arc<Mutex<Vec<HeldLease>>> = Arc::default();
    let keeping = service_fn({
        let kept = kept.clone();
        move |request: http::Request<()>| {
            let kept = kept.clone();
            async move {
                let lease = request.extensions().get::<HeldLease>().cloned();
                let lease = lease.expect("the lease in the request's extensions");
                let token = lease.token();
                // A clone outlives the response (as one moved into a spawned task would).
                kept.lock().unwrap_or_else(|p| p.into_inner()).push(lease);
                Ok::<_, Infallible>(token)
            }
        }
    });
    let service = ServiceBuilder::new()
        .layer(LeaseLimitLayer::shedding(sem.clone()))
        .service(keeping);
    for n in 0..3 {
        let token = within(
            LIMIT,
            "a call",
            service.clone().oneshot(http::Request::new(())),
        )
        .await
        .unwrap_or_else(|err| panic!("call {n}: {err}"));
        // Given back before the call answered, clone or not: the next (shedding) call of a
        // limit of 1 finds it free.
        assert_eq!(usage(&sem).await, (0, 0), "call {n}");
        let kept = kept.lock().unwrap_or_else(|p| p.into_inner());
        let lease = kept.last().expect("the kept lease");
        assert_eq!(lease.token(), token);
        assert!(lease.is_lost(), "the kept clone reads a released permit");
    }
    let kept = std::mem::take(&mut *kept.lock().unwrap_or_else(|p| p.into_inner()));
    for lease in &kept {
        within(LIMIT, "lost() of a kept clone", lease.lost()).await;
    }
    drop(kept);
    within(LIMIT, "flush", fleet.clients[0].flush()).await;
    assert_eq!(usage(&sem).await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_response_future_is_a_named_type_that_shows_its_lease_while_the_request_runs() {
    let fleet = Fleet::start().await;
    let [sem, _] = fleet.semaphores("named", 1, Duration::from_secs(30));
    let (gate_tx, gate) = watch::channel(false);
    let gated = service_fn(move |request: http::Request<()>| {
        let mut gate = gate.clone();
        async move {
            let _ = gate.wait_for(|open| *open).await;
            let token = request
                .extensions()
                .get::<HeldLease>()
                .map(HeldLease::token);
            Ok::<_, Infallible>(token)
        }
    });
    let mut service = ServiceBuilder::new()
        .layer(LeaseLimitLayer::shedding(sem.clone()).on_lost(OnLost::Continue))
        .service(gated);
    let ready = within(LIMIT, "ready", service.ready())
        .await
        .expect("ready");
    let future: ResponseFuture<_, http::Request<()>> = ready.call(http::Request::new(()));
    fn spawnable<F: Future + Send + 'static>(_: &F) {}
    spawnable(&future);
    assert!(future.is_waiting() && future.lease().is_none());
    assert_eq!(future.on_lost(), OnLost::Continue);
    assert!(format!("{future:?}").contains("acquiring"), "{future:?}");
    let mut future = std::pin::pin!(future);
    // Polled until the permit is held and the request runs (behind the closed gate).
    let deadline = Instant::now() + LIMIT;
    while future.lease().is_none() {
        let polled = std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await;
        assert!(
            polled.is_pending(),
            "answered behind a closed gate: {polled:?}"
        );
        assert!(Instant::now() < deadline, "no permit within {LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let token = future.lease().map(HeldLease::token);
    assert!(!future.is_waiting());
    assert!(format!("{future:?}").contains("running"), "{future:?}");
    assert_eq!(usage(&sem).await, (1, 0), "the request holds the unit");
    gate_tx.send_replace(true);
    let answer = within(LIMIT, "the answer", future).await.expect("answered");
    assert_eq!(answer, token, "the handler saw the future's lease");
    assert_eq!(usage(&sem).await, (0, 0));
}
