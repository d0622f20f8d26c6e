//! Carrying a Rust future across to Python: the runtime, blocking calls that release the GIL
//! and heed Ctrl-C, asyncio calls, and seconds given as floats.

use std::future::Future;
use std::sync::{LazyLock, OnceLock};
use std::time::Duration;

use pyo3::prelude::*;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::errors::{invalid, to_py};

/// How long a blocking wait runs before it checks for a signal (Ctrl-C) again.
const SLICE: Duration = Duration::from_millis(50);

/// How long a withdrawal (of an interrupted or cancelled wait) is waited for before the
/// interruption goes on; past it, the withdrawal carries on in the background.
const SETTLE: Duration = Duration::from_secs(5);

static RUNTIME: OnceLock<tokio::runtime::Runtime> = OnceLock::new();

/// The process's one runtime: it keeps the connections, renews the permits (keepalive), and
/// delivers the wake-ups of every client made in this process.
pub(crate) fn runtime() -> &'static tokio::runtime::Runtime {
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("redsem")
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("redsem: cannot start a tokio runtime: {e}"))
    })
}

/// Start the runtime and have the asyncio bridge use it.
pub(crate) fn install_runtime() {
    // Already set by an earlier import (a second interpreter of the process): the same runtime.
    let _ = pyo3_async_runtimes::tokio::init_with_runtime(runtime());
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

/// The hand-overs of permits whose Python object was collected (see `permit.rs`): each
/// waits for its watcher to let go of the Rust permit, whose drop then starts its release.
pub(crate) static DROPS: LazyLock<TaskTracker> = LazyLock::new(TaskTracker::new);

/// Wait until the collected permits were handed over, then for the client's background
/// releases and withdrawals (`redsem::Redsem::flush`).
pub(crate) async fn flush(client: &redsem::Redsem) {
    DROPS.close();
    DROPS.wait().await;
    DROPS.reopen();
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
    pyo3_async_runtimes::tokio::future_into_py(py, async move { fut.await.map_err(to_py) })
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
        client: client.clone(),
    };
    Ok((awaitable, settle))
}

/// What a cancelled asyncio wait leaves to finish: `redsem.aio` awaits `wait()` before it lets
/// the cancellation go on, so the request has left the queue when the caller sees it.
#[pyclass(module = "redsem._redsem", frozen)]
pub(crate) struct Settle {
    dropped: CancellationToken,
    client: redsem::Redsem,
}

#[pymethods]
impl Settle {
    /// An awaitable: done once the Rust future is gone and its withdrawal was sent (at most
    /// 5 s; then it goes on in the background).
    fn wait<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let dropped = self.dropped.clone();
        let client = self.client.clone();
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

/// As [`seconds`], for an optional argument.
pub(crate) fn maybe_seconds(what: &str, secs: Option<f64>) -> PyResult<Option<Duration>> {
    secs.map(|s| seconds(what, s)).transpose()
}
