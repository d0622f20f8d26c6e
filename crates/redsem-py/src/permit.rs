//! `Permit`: a held `redsem::LeasePermit`, renewed by the library's keepalive while it lives,
//! and a watcher that tells Python when its lease is lost.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex, MutexGuard, PoisonError};

use pyo3::PyTraverseError;
use pyo3::gc::PyVisit;
use pyo3::prelude::*;
use pyo3::types::PyType;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::call::{
    Owned, block, detached, generation, maybe_seconds, runtime, spawn, spawn_into_python,
};

fn lock<T>(m: &StdMutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

/// What the permit and its watcher task share.
struct Watch {
    /// The holder lets go (release, or the Python object collected): the watcher stops.
    stop: CancellationToken,
    /// The permit ended: lost, released, or collected.
    gone: CancellationToken,
    /// It ended because its lease was lost.
    lost: AtomicBool,
    /// Called once, on a thread of the runtime's blocking pool, when the lease is lost.
    callbacks: StdMutex<Vec<Py<PyAny>>>,
}

/// The Rust permit and its watcher.
pub(crate) struct Held {
    /// `None` once released. The watcher holds another `Arc` (and `refresh`, for the length
    /// of one call): the release goes through a shared reference, whoever else holds one.
    permit: StdMutex<Option<Arc<redsem::LeasePermit>>>,
    watch: Arc<Watch>,
    watcher: StdMutex<Option<JoinHandle<()>>>,
}

impl Held {
    fn permit(&self) -> Option<Arc<redsem::LeasePermit>> {
        lock(&self.permit).clone()
    }

    /// Let go of the Rust permit, to release it: `None` if it was released already. The
    /// watcher is stopped first, so the release does not read as a loss.
    async fn take(&self) -> Option<Arc<redsem::LeasePermit>> {
        let permit = lock(&self.permit).take()?;
        self.watch.stop.cancel();
        let watcher = lock(&self.watcher).take();
        if let Some(watcher) = watcher {
            let _ = watcher.await;
        }
        self.watch.gone.cancel();
        Some(permit)
    }
}

impl crate::call::AtExit for Held {
    /// The release of a permit still held when the interpreter exits.
    fn release_at_exit(
        self: Arc<Self>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'static>> {
        Box::pin(async move {
            if let Some(permit) = self.take().await {
                let _ = permit.release_shared().await;
            }
        })
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        // The Rust permit releases itself in the background when dropped inside the runtime.
        // The watcher holds it too: once it let go (on `stop`), the last `Arc` goes in a
        // task that `flush` waits for.
        let permit = lock(&self.permit).take();
        let watcher = lock(&self.watcher).take();
        self.watch.stop.cancel();
        self.watch.gone.cancel();
        if permit.is_some() || watcher.is_some() {
            generation().drops.spawn_on(
                async move {
                    if let Some(watcher) = watcher {
                        let _ = watcher.await;
                    }
                    drop(permit);
                },
                runtime().handle(),
            );
        }
    }
}

/// The task that waits for the permit's `lost()` and tells Python.
async fn watch(permit: Arc<redsem::LeasePermit>, watch: Arc<Watch>) {
    tokio::select! {
        biased;
        () = watch.stop.cancelled() => {}
        () = permit.lost() => {
            let callbacks = {
                let mut callbacks = lock(&watch.callbacks);
                watch.lost.store(true, Ordering::SeqCst);
                std::mem::take(&mut *callbacks)
            };
            watch.gone.cancel();
            if !callbacks.is_empty() {
                let _ = spawn_into_python(move || call_back(callbacks)).await;
            }
        }
    }
    drop(permit);
}

/// Call each of `callbacks` with no argument; an exception is reported as unraisable.
fn call_back(callbacks: Vec<Py<PyAny>>) {
    Python::attach(|py| {
        for callback in callbacks {
            if let Err(err) = callback.call0(py) {
                err.write_unraisable(py, Some(callback.bind(py)));
            }
        }
    });
}

/// A permit of a lease semaphore: some units held under a lease that is renewed in the
/// background while the permit lives.
///
/// Use it as a context manager (`with sem.acquire() as permit:`), or call `release()`. A
/// permit that is garbage-collected unreleased is released in the background. Pass `token`
/// to the resource you protect: it grows with every grant, so the resource can refuse a
/// holder whose lease ended.
#[pyclass(module = "redsem", frozen)]
pub(crate) struct Permit {
    id: String,
    token: u64,
    slots: Vec<u32>,
    semaphore: String,
    client: Owned<redsem::Redsem>,
    held: Owned<Arc<Held>>,
}

impl Permit {
    /// Follow `permit`, granted by a semaphore of `client`.
    pub(crate) fn start(client: redsem::Redsem, permit: redsem::LeasePermit) -> Permit {
        let shared = Arc::new(Watch {
            stop: CancellationToken::new(),
            gone: CancellationToken::new(),
            lost: AtomicBool::new(false),
            callbacks: StdMutex::new(Vec::new()),
        });
        let id = permit.id().to_string();
        let token = permit.token().get();
        let slots = permit.slots().to_vec();
        let semaphore = permit.semaphore().to_owned();
        let permit = Arc::new(permit);
        let watcher = runtime().spawn(watch(permit.clone(), shared.clone()));
        let held = Arc::new(Held {
            permit: StdMutex::new(Some(permit)),
            watch: shared,
            watcher: StdMutex::new(Some(watcher)),
        });
        let weak: std::sync::Weak<Held> = Arc::downgrade(&held);
        generation().track(weak);
        Permit {
            id,
            token,
            slots,
            semaphore,
            client: Owned::new(client),
            held: Owned::new(held),
        }
    }

    fn not_held(&self) -> redsem::Error {
        redsem::Error::NotHeld {
            name: self.semaphore.clone(),
            id: self.id.clone(),
        }
    }

    /// The release: `NotHeld` when it was released already, or when it was not held any
    /// more (lost, or released by id elsewhere).
    fn release_future(
        &self,
    ) -> PyResult<impl Future<Output = redsem::Result<()>> + Send + 'static> {
        let held = self.held.get()?.clone();
        let not_held = self.not_held();
        Ok(async move {
            match held.take().await {
                Some(permit) => permit.release_shared().await,
                None => Err(not_held),
            }
        })
    }

    /// What leaving a `with` block does: release, unless released already. With `raising`
    /// (the block raised nothing), a permit found not held raises: `LeaseLost` if its lease
    /// was lost (the block ran without it at the end), else `NotHeld`.
    fn exit_future(
        &self,
        raising: bool,
    ) -> PyResult<impl Future<Output = redsem::Result<()>> + Send + 'static> {
        let held = self.held.get()?;
        let released = lock(&held.permit).is_none();
        let was_held = held.permit().is_some_and(|p| p.is_held());
        let watch = held.watch.clone();
        let (name, id) = (self.semaphore.clone(), self.id.clone());
        let release = self.release_future()?;
        Ok(async move {
            if released {
                return Ok(());
            }
            match release.await {
                Err(redsem::Error::NotHeld { .. })
                    if raising && (!was_held || watch.lost.load(Ordering::SeqCst)) =>
                {
                    Err(redsem::Error::LeaseLost { name, id })
                }
                Err(_) if !raising => Ok(()),
                other => other,
            }
        })
    }

    fn refresh_future(
        &self,
    ) -> PyResult<impl Future<Output = redsem::Result<()>> + Send + 'static> {
        let permit = self.held.get()?.permit();
        let not_held = self.not_held();
        Ok(async move {
            match permit {
                Some(permit) => permit.refresh().await,
                None => Err(not_held),
            }
        })
    }

    fn is_held_now(&self) -> PyResult<bool> {
        Ok(self.held.get()?.permit().is_some_and(|p| p.is_held()))
    }
}

#[pymethods]
impl Permit {
    /// The permit id: 32 hex digits.
    #[getter]
    fn id(&self) -> &str {
        &self.id
    }

    /// The fencing token of this grant: larger than every earlier grant's.
    #[getter]
    fn token(&self) -> u64 {
        self.token
    }

    /// The slots of this permit, one per unit, each in `range(capacity)`.
    #[getter]
    fn slots(&self) -> Vec<u32> {
        self.slots.clone()
    }

    /// The first (lowest) slot.
    #[getter]
    fn slot(&self) -> u32 {
        self.slots.first().copied().unwrap_or_default()
    }

    /// The name of its semaphore.
    #[getter]
    fn semaphore(&self) -> &str {
        &self.semaphore
    }

    /// True while the permit is known held: not released, not lost, and its lease cannot have
    /// ended (no round trip).
    fn is_held(&self) -> PyResult<bool> {
        self.is_held_now()
    }

    /// redis-py's name for `is_held()`: True while this permit is held by us (no round trip).
    fn owned(&self) -> PyResult<bool> {
        self.is_held_now()
    }

    /// True once the lease was lost (a renewal found it gone, or it may have ended
    /// unrenewed); false while held and after a release.
    fn is_lost(&self) -> PyResult<bool> {
        let held = self.held.get()?;
        Ok(held.watch.lost.load(Ordering::SeqCst) || held.permit().is_some_and(|p| p.is_lost()))
    }

    /// Seconds the lease is certain to last without another renewal (0.0 once it may have
    /// ended, or after the release).
    fn time_left(&self) -> PyResult<f64> {
        Ok(self
            .held
            .get()?
            .permit()
            .map_or(0.0, |p| p.time_left().as_secs_f64()))
    }

    /// Release the permit; the next in line gets its units. Raises `NotHeld` if it was not
    /// held any more (released already, its lease ended, or released by id elsewhere).
    fn release(&self, py: Python<'_>) -> PyResult<()> {
        block(py, None, self.release_future()?)
    }

    /// `release`, as an asyncio awaitable. Cancelling it does not cancel the release: it
    /// goes on in the background (`flush()` waits for it).
    fn release_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, detached(self.release_future()?))
    }

    /// Renew the lease now (the background renewal does it every third of the lease).
    /// Raises `LeaseLost` if it was lost, `NotHeld` after the release.
    fn refresh(&self, py: Python<'_>) -> PyResult<()> {
        block(py, None, self.refresh_future()?)
    }

    /// `refresh`, as an asyncio awaitable.
    fn refresh_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.refresh_future()?)
    }

    /// Block until the lease is lost, or the permit released, or `timeout` seconds passed
    /// (`None` or `inf`: no limit); the GIL is released meanwhile and Ctrl-C interrupts it.
    /// Returns True if the lease was lost.
    #[pyo3(signature = (timeout=None))]
    fn wait_lost(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<bool> {
        let limit = maybe_seconds("timeout", timeout)?;
        let watch = self.held.get()?.watch.clone();
        block(py, Some(self.client.get()?), async move {
            match limit {
                Some(limit) => {
                    let _ = tokio::time::timeout(limit, watch.gone.cancelled()).await;
                }
                None => watch.gone.cancelled().await,
            }
            Ok(watch.lost.load(Ordering::SeqCst))
        })
    }

    /// An asyncio awaitable that ends when the lease is lost (True) or the permit is released
    /// (False).
    fn lost_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let watch = self.held.get()?.watch.clone();
        spawn(py, async move {
            watch.gone.cancelled().await;
            Ok(watch.lost.load(Ordering::SeqCst))
        })
    }

    /// Call `callback()` (no argument) once if the lease is lost: at once if it is lost
    /// already, else from a background thread when it is. Not called after a release.
    fn on_lost(&self, py: Python<'_>, callback: Py<PyAny>) -> PyResult<()> {
        let watch = &self.held.get()?.watch;
        let now = {
            let mut callbacks = lock(&watch.callbacks);
            if watch.lost.load(Ordering::SeqCst) {
                true
            } else {
                callbacks.push(callback.clone_ref(py));
                false
            }
        };
        if now {
            callback.call0(py)?;
        }
        Ok(())
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    /// Release the permit. When the block raised nothing and the lease was lost meanwhile,
    /// raise `LeaseLost`: the block's work ran without the permit at its end. Never swallows
    /// the block's exception.
    #[pyo3(signature = (exc_type=None, _exc=None, _tb=None))]
    fn __exit__(
        &self,
        py: Python<'_>,
        exc_type: Option<Bound<'_, PyType>>,
        _exc: Option<Bound<'_, PyAny>>,
        _tb: Option<Bound<'_, PyAny>>,
    ) -> PyResult<()> {
        block(py, None, self.exit_future(exc_type.is_none())?)
    }

    /// `__exit__` for `redsem.aio`'s `__aexit__`: an awaitable. Cancelling it does not
    /// cancel the release: it goes on in the background.
    fn exit_async<'py>(&self, py: Python<'py>, raising: bool) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, detached(self.exit_future(raising)?))
    }

    fn __repr__(&self) -> String {
        let held = self
            .held
            .peek()
            .is_some_and(|h| h.permit().is_some_and(|p| p.is_held()));
        format!(
            "<redsem.Permit semaphore={:?} id={} token={} slots={:?} held={}>",
            self.semaphore,
            self.id,
            self.token,
            self.slots,
            if held { "True" } else { "False" }
        )
    }

    fn __traverse__(&self, visit: PyVisit<'_>) -> Result<(), PyTraverseError> {
        if let Some(held) = self.held.peek()
            && let Ok(callbacks) = held.watch.callbacks.try_lock()
        {
            for callback in callbacks.iter() {
                visit.call(callback)?;
            }
        }
        Ok(())
    }

    fn __clear__(&self) {
        if let Some(held) = self.held.peek() {
            lock(&held.watch.callbacks).clear();
        }
    }
}
