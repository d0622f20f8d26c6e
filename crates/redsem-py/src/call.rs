//! Carrying a Rust future across to Python: the runtime, blocking calls that release the GIL
//! and heed Ctrl-C, asyncio calls, and seconds given as floats.
//!
//! The runtime belongs to one process. A child made by `os.fork()` has none of its threads, so
//! the child gets a fresh runtime on first use ([`generation`]), and the objects made in the
//! parent ([`Owned`]) refuse use in the child with `redsem.WrongProcess` instead of waiting
//! forever on threads that do not exist there.
//!
//! At interpreter exit (`atexit`, [`shutdown`]) the permits still held are released and the
//! runtime stops calling into Python: a runtime thread that took the GIL while the interpreter
//! is being torn down crashed it.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Arc, Mutex as StdMutex, PoisonError, RwLock, Weak};
use std::time::Duration;

use pyo3::prelude::*;
use pyo3_async_runtimes::TaskLocals;
use pyo3_async_runtimes::generic::{ContextExt, Runtime as AsyncRuntime};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub(crate) use crate::errors::human;
use crate::errors::{invalid, to_py, wrong_process};

/// How long a blocking wait runs before it checks for a signal (Ctrl-C) again.
const SLICE: Duration = Duration::from_millis(50);

/// How long a withdrawal (of an interrupted or cancelled wait) is waited for before the
/// interruption goes on; past it, the withdrawal carries on in the background.
const SETTLE: Duration = Duration::from_secs(5);

/// How long the interpreter's exit waits for the releases of the permits still held.
const AT_EXIT: Duration = Duration::from_secs(2);

/// The runtime of one process and what goes with it.
pub(crate) struct Generation {
    /// The process it runs in.
    pid: u32,
    /// It keeps the connections, renews the permits (keepalive), and delivers the wake-ups
    /// of every client made in this process.
    pub(crate) runtime: tokio::runtime::Runtime,
    /// The hand-overs of permits whose Python object was collected (see `permit.rs`): each
    /// waits for its watcher to let go of the Rust permit, whose drop then starts its release.
    pub(crate) drops: TaskTracker,
    /// The permits alive in this process, for their release at exit.
    permits: StdMutex<Vec<Weak<dyn AtExit>>>,
    /// True once the interpreter exits: no runtime thread calls into Python any more. Every
    /// call into Python from a runtime thread holds the read side for its length.
    exited: RwLock<bool>,
}

/// The generation of this process; null before the first use.
static CURRENT: AtomicPtr<Generation> = AtomicPtr::new(std::ptr::null_mut());

/// The generation of this process, if it made one.
fn current() -> Option<&'static Generation> {
    let pointer = CURRENT.load(Ordering::Acquire);
    // SAFETY: a non-null pointer in CURRENT comes from `Box::leak` in `generation` and is
    // never freed: a generation lives as long as the process (a forked child leaves its
    // parent's generation alone, as its threads are not there to stop).
    let generation = unsafe { pointer.as_ref() }?;
    (generation.pid == std::process::id()).then_some(generation)
}

/// The generation of this process: the runtime it started on first use, or a fresh one in a
/// forked child (the parent's is left as it is: its threads are not in the child).
pub(crate) fn generation() -> &'static Generation {
    loop {
        if let Some(generation) = current() {
            return generation;
        }
        let seen = CURRENT.load(Ordering::Acquire);
        let fresh = Box::into_raw(Box::new(Generation {
            pid: std::process::id(),
            runtime: tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("redsem")
                .enable_all()
                .build()
                .unwrap_or_else(|e| panic!("redsem: cannot start a tokio runtime: {e}")),
            drops: TaskTracker::new(),
            permits: StdMutex::new(Vec::new()),
            exited: RwLock::new(false),
        }));
        if let Err(_other) =
            CURRENT.compare_exchange(seen, fresh, Ordering::AcqRel, Ordering::Acquire)
        {
            // Another thread of this process started one first: use that, and stop this one
            // (its threads have nothing to do yet).
            // SAFETY: `fresh` came from `Box::into_raw` above and was never published.
            let unused = unsafe { Box::from_raw(fresh) };
            unused.runtime.shutdown_background();
        }
    }
}

/// The process's runtime (see [`generation`]).
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    &generation().runtime
}

impl Generation {
    /// Run `f`, which calls into Python from a runtime thread, unless the interpreter exits;
    /// then `f` is forgotten with what it holds (a Python object freed now could crash it).
    fn call_python(&self, f: impl FnOnce()) {
        let exited = self.exited.read().unwrap_or_else(PoisonError::into_inner);
        if *exited {
            std::mem::forget(f);
        } else {
            f();
        }
    }

    /// Follow `held` for its release at exit.
    pub(crate) fn track(&self, held: Weak<dyn AtExit>) {
        let mut permits = self.permits.lock().unwrap_or_else(PoisonError::into_inner);
        if permits.len() >= 64 && permits.len().is_power_of_two() {
            permits.retain(|p| p.strong_count() > 0);
        }
        permits.push(held);
    }
}

/// Something held that the interpreter's exit gives back (a permit).
pub(crate) trait AtExit: Send + Sync {
    /// Give it back.
    fn release_at_exit(
        self: Arc<Self>,
    ) -> std::pin::Pin<Box<dyn Future<Output = ()> + Send + 'static>>;
}

/// Call `f` (which takes the GIL) on a thread of the runtime's blocking pool, unless the
/// interpreter exits meanwhile.
pub(crate) fn spawn_into_python(f: impl FnOnce() + Send + 'static) -> tokio::task::JoinHandle<()> {
    let generation = generation();
    generation
        .runtime
        .spawn_blocking(move || generation.call_python(f))
}

/// What a child forked by `os.fork()` does first (`os.register_at_fork`, registered by
/// `redsem/__init__.py`), on the thread that forked: reseed that thread's random generator.
/// The library draws its ids (permits, requests, client sessions) from it, and the children
/// of one parent would otherwise draw the same ids as each other: a request of one taken for
/// a resend of another's, and granted the same permit.
#[pyfunction]
pub(crate) fn _after_fork() {
    let _ = rand::rng().reseed();
}

/// What the interpreter's exit does (`atexit`, registered by `redsem/__init__.py`): release
/// the permits still held (at most 2 s), then stop calling into Python from the runtime.
/// The runtime itself runs on until the process ends (releases dropped late still go out).
#[pyfunction]
pub(crate) fn _shutdown(py: Python<'_>) {
    // A child that never used redsem has nothing to do (and must not start a runtime).
    let Some(generation) = current() else {
        return;
    };
    let held: Vec<_> = generation
        .permits
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .drain(..)
        .filter_map(|p| p.upgrade())
        .collect();
    py.detach(|| {
        generation.runtime.block_on(async {
            let mut releases = tokio::task::JoinSet::new();
            for held in held {
                releases.spawn(held.release_at_exit());
            }
            let _ = tokio::time::timeout(AT_EXIT, async {
                releases.join_all().await;
                generation.drops.close();
                generation.drops.wait().await;
            })
            .await;
        });
        // From here on no runtime thread takes the GIL: the write side waits for the calls
        // into Python in progress (the GIL is released meanwhile, so that they can end).
        *generation
            .exited
            .write()
            .unwrap_or_else(PoisonError::into_inner) = true;
    });
}

/// The runtime of the asyncio bridge (`pyo3_async_runtimes`): this process's runtime, and
/// its results handed to Python only while the interpreter lives.
pub(crate) struct Bridge;

tokio::task_local! {
    static LOCALS: TaskLocals;
}

impl AsyncRuntime for Bridge {
    type JoinError = tokio::task::JoinError;
    type JoinHandle = tokio::task::JoinHandle<()>;

    fn spawn<F>(fut: F) -> Self::JoinHandle
    where
        F: Future<Output = ()> + Send + 'static,
    {
        runtime().spawn(fut)
    }

    fn spawn_blocking<F>(f: F) -> Self::JoinHandle
    where
        F: FnOnce() + Send + 'static,
    {
        spawn_into_python(f)
    }
}

impl ContextExt for Bridge {
    fn scope<F, R>(locals: TaskLocals, fut: F) -> Pin<Box<dyn Future<Output = R> + Send>>
    where
        F: Future<Output = R> + Send + 'static,
    {
        Box::pin(LOCALS.scope(locals, fut))
    }

    fn get_task_locals() -> Option<TaskLocals> {
        LOCALS
            .try_with(|locals| Python::attach(|_py| locals.clone()))
            .ok()
    }
}

/// A value made in one process: in a child forked from it, [`Owned::get`] refuses it
/// (`redsem.WrongProcess`) and dropping it does nothing (its connections and tasks belong to
/// the parent's runtime, which has no threads in the child; the parent keeps using them).
pub(crate) struct Owned<T> {
    pid: u32,
    value: Option<T>,
}

impl<T> Owned<T> {
    pub(crate) fn new(value: T) -> Self {
        Owned {
            pid: std::process::id(),
            value: Some(value),
        }
    }

    /// The value, in the process that made it.
    pub(crate) fn get(&self) -> PyResult<&T> {
        match &self.value {
            Some(value) if self.pid == std::process::id() => Ok(value),
            _ => Err(wrong_process(self.pid)),
        }
    }

    /// The value whatever the process (for what only reads it, such as `repr`).
    pub(crate) fn peek(&self) -> Option<&T> {
        self.value.as_ref()
    }
}

impl<T> Drop for Owned<T> {
    fn drop(&mut self) {
        if let Some(value) = self.value.take()
            && self.pid != std::process::id()
        {
            std::mem::forget(value);
        }
    }
}

/// Run `fut` to its end on the runtime, the GIL released, the calling thread blocked.
///
/// With `interrupt` (a wait), the future runs in slices with a signal check between them: a
/// signal handler that raises (Ctrl-C's `KeyboardInterrupt`) drops the future there, inside
/// the runtime so that its clean-up (the withdrawal of a queued request) is started, and the
/// exception is raised once that clean-up was done (at most [`SETTLE`]) through
/// `redsem::Redsem::flush`. Without it, the call runs to its end (a release or a read,
/// bounded by the client's response timeout).
pub(crate) fn block<T: Send>(
    py: Python<'_>,
    interrupt: Option<&redsem::Redsem>,
    fut: impl Future<Output = redsem::Result<T>> + Send,
) -> PyResult<T> {
    let rt = runtime();
    let Some(client) = interrupt else {
        return py.detach(|| rt.block_on(fut)).map_err(to_py);
    };
    let mut fut = Box::pin(fut);
    loop {
        // The timer is made inside `block_on`: it needs the runtime's context.
        let step =
            py.detach(|| rt.block_on(async { tokio::time::timeout(SLICE, fut.as_mut()).await }));
        match step {
            Ok(done) => return done.map_err(to_py),
            Err(_slice_over) => {
                if let Err(raised) = py.check_signals() {
                    py.detach(|| {
                        let _inside = rt.enter();
                        drop(fut);
                        rt.block_on(settle(client));
                    });
                    return Err(raised);
                }
            }
        }
    }
}

/// Wait (at most [`SETTLE`]) for the clean-up the client sent in the background.
async fn settle(client: &redsem::Redsem) {
    let _ = tokio::time::timeout(SETTLE, flush(client)).await;
}

/// Wait until the collected permits were handed over, then for the client's background
/// releases and withdrawals (`redsem::Redsem::flush`).
pub(crate) async fn flush(client: &redsem::Redsem) {
    let drops = &generation().drops;
    drops.close();
    drops.wait().await;
    drops.reopen();
    client.flush().await;
}

/// `fut` as an asyncio awaitable of the running loop. Cancelling it (or the task awaiting it)
/// drops `fut` on the runtime.
pub(crate) fn spawn<'py, T>(
    py: Python<'py>,
    fut: impl Future<Output = redsem::Result<T>> + Send + 'static,
) -> PyResult<Bound<'py, PyAny>>
where
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    pyo3_async_runtimes::generic::future_into_py::<Bridge, _, _>(py, async move {
        fut.await.map_err(to_py)
    })
}

/// `fut` run as a task of its own: awaiting the future returned and dropping it half-way
/// (a cancelled asyncio call) leaves `fut` running to its end in the background, tracked by
/// `flush`. The library's own give-backs (`release_id`, permit releases, count-downs) already
/// run to their end (`Redsem::run_to_end`); this is for a permit's release and `with` exit,
/// whose Python-side steps (stopping the watcher, taking the permit) come before the
/// library's release and must not be cut between.
pub(crate) fn detached<T: Send + 'static>(
    fut: impl Future<Output = redsem::Result<T>> + Send + 'static,
) -> impl Future<Output = redsem::Result<T>> + Send + 'static {
    let generation = generation();
    let task = generation.drops.spawn_on(fut, generation.runtime.handle());
    async move {
        match task.await {
            Ok(done) => done,
            Err(err) if err.is_panic() => std::panic::resume_unwind(err.into_panic()),
            Err(_) => Err(redsem::Error::Protocol {
                script: "-",
                detail: "the redsem runtime stopped before the call ended".to_owned(),
            }),
        }
    }
}

/// As [`spawn`], for a wait that may be cancelled: also a [`Settle`], whose `wait()` tells
/// when the cancelled future was dropped and the withdrawal it started has been sent.
pub(crate) fn spawn_wait<'py, T>(
    py: Python<'py>,
    client: &redsem::Redsem,
    fut: impl Future<Output = redsem::Result<T>> + Send + 'static,
) -> PyResult<(Bound<'py, PyAny>, Settle)>
where
    T: for<'a> IntoPyObject<'a> + Send + 'static,
{
    let dropped = CancellationToken::new();
    let guard = dropped.clone().drop_guard();
    let awaitable = spawn(py, async move {
        let _guard = guard;
        fut.await
    })?;
    let settle = Settle {
        dropped,
        client: Owned::new(client.clone()),
    };
    Ok((awaitable, settle))
}

/// What a cancelled asyncio wait leaves to finish: `redsem.aio` awaits `wait()` before it lets
/// the cancellation go on, so the request has left the queue when the caller sees it.
#[pyclass(module = "redsem._redsem", frozen)]
pub(crate) struct Settle {
    dropped: CancellationToken,
    client: Owned<redsem::Redsem>,
}

#[pymethods]
impl Settle {
    /// An awaitable: done once the Rust future is gone and its withdrawal was sent (at most
    /// 5 s; then it goes on in the background).
    fn wait<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let dropped = self.dropped.clone();
        let client = self.client.get()?.clone();
        spawn(py, async move {
            let _ = tokio::time::timeout(SETTLE, dropped.cancelled()).await;
            settle(&client).await;
            Ok(())
        })
    }
}

/// `secs` seconds as a duration, for the argument `what`.
pub(crate) fn seconds(what: &str, secs: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(secs).map_err(|_| {
        invalid(format!(
            "{what} must be a finite, non-negative number of seconds, got {secs}"
        ))
    })
}

/// As [`seconds`], for an optional time limit: `None` or `float('inf')` is no limit.
pub(crate) fn maybe_seconds(what: &str, secs: Option<f64>) -> PyResult<Option<Duration>> {
    secs.filter(|s| *s != f64::INFINITY)
        .map(|s| seconds(what, s))
        .transpose()
}
