//! `LeaseSemaphore` and `Mutex` (a lease semaphore of capacity 1): their calls, once each as
//! futures ([`Core`]), run blocking or as asyncio awaitables by the two Python classes.

use std::future::Future;
use std::time::Duration;

use pyo3::prelude::*;

use crate::call::{Settle, block, maybe_seconds, seconds, spawn, spawn_wait};
use crate::permit::Permit;
use crate::status::{Json, status_future};

/// A lease semaphore and the client it came from.
#[derive(Clone)]
struct Core {
    client: redsem::Redsem,
    sem: redsem::LeaseSemaphore,
}

impl Core {
    /// Wait in line for `units` units, at most `wait` (`None`: as long as it takes).
    fn acquire(
        &self,
        units: u32,
        wait: Option<Duration>,
    ) -> impl Future<Output = redsem::Result<Permit>> + Send + 'static {
        let Core { client, sem } = self.clone();
        async move {
            let permit = match wait {
                Some(wait) => sem.acquire_many_timeout(units, wait).await?,
                None => sem.acquire_many(units).await?,
            };
            Ok(Permit::start(client, permit))
        }
    }

    /// Take `units` units if free and nobody waits; `None` when busy.
    fn try_acquire(
        &self,
        units: u32,
    ) -> impl Future<Output = redsem::Result<Option<Permit>>> + Send + 'static {
        let Core { client, sem } = self.clone();
        async move {
            match sem.try_acquire_many(units).await {
                Ok(permit) => Ok(Some(Permit::start(client, permit))),
                Err(redsem::Error::NoPermit { .. }) => Ok(None),
                Err(other) => Err(other),
            }
        }
    }

    fn status(&self) -> impl Future<Output = redsem::Result<Json>> + Send + 'static {
        status_future(self.client.clone(), self.sem.clone())
    }
}

/// A fair counting semaphore shared through Redis, whose permits are leases.
///
/// At most `capacity` units are held at any instant of Redis time; waiters are served
/// first-in-first-out (a `try_acquire` fails while anyone waits); each grant has a fencing
/// token larger than every earlier one and slots in `range(capacity)`; a permit is renewed in
/// the background, and comes back within one lease if its process dies.
#[pyclass(module = "redsem", frozen)]
pub(crate) struct LeaseSemaphore {
    core: Core,
}

impl LeaseSemaphore {
    pub(crate) fn new(client: redsem::Redsem, sem: redsem::LeaseSemaphore) -> Self {
        LeaseSemaphore {
            core: Core { client, sem },
        }
    }
}

#[pymethods]
impl LeaseSemaphore {
    /// The semaphore's name.
    #[getter]
    fn name(&self) -> &str {
        self.core.sem.name()
    }

    /// The capacity this handle asks for (the one it was opened with, or last set).
    #[getter]
    fn capacity(&self) -> u32 {
        self.core.sem.capacity()
    }

    /// Wait in line (FIFO) for `units` units; returns a `Permit`, which is also a context
    /// manager. With `timeout` (seconds), raise `redsem.Timeout` when not granted in time.
    /// The GIL is released while waiting; Ctrl-C raises `KeyboardInterrupt`. A request that
    /// times out or is interrupted has left the queue when the exception is raised.
    #[pyo3(signature = (units=1, *, timeout=None))]
    fn acquire(&self, py: Python<'_>, units: u32, timeout: Option<f64>) -> PyResult<Permit> {
        let wait = maybe_seconds("timeout", timeout)?;
        block(py, Some(&self.core.client), self.core.acquire(units, wait))
    }

    /// `acquire` for `redsem.aio`: an awaitable and its `Settle`.
    #[pyo3(signature = (units=1, timeout=None))]
    fn acquire_async<'py>(
        &self,
        py: Python<'py>,
        units: u32,
        timeout: Option<f64>,
    ) -> PyResult<(Bound<'py, PyAny>, Settle)> {
        let wait = maybe_seconds("timeout", timeout)?;
        spawn_wait(py, &self.core.client, self.core.acquire(units, wait))
    }

    /// Take `units` units if they are free and nobody waits (one round trip, never queued):
    /// a `Permit`, or `None` when busy.
    #[pyo3(signature = (units=1))]
    fn try_acquire(&self, py: Python<'_>, units: u32) -> PyResult<Option<Permit>> {
        block(py, None, self.core.try_acquire(units))
    }

    /// `try_acquire`, as an asyncio awaitable.
    #[pyo3(signature = (units=1))]
    fn try_acquire_async<'py>(&self, py: Python<'py>, units: u32) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.core.try_acquire(units))
    }

    /// A snapshot, as the dict of the CLI's `redsem status NAME --json`: `name`, `capacity`
    /// (None when none is stored), `in_use`, `holders` (id, label, token, slots,
    /// expires_in_ms, held_for_ms), `waiters` (id, label, units, waiting_for_ms), and the
    /// permits (`{"available": n}`) and latch (`{"state": ..., "count": n}`) of the same name.
    fn status(&self, py: Python<'_>) -> PyResult<Json> {
        block(py, None, self.core.status())
    }

    /// `status`, as an asyncio awaitable.
    fn status_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.core.status())
    }

    /// Store a new capacity, whoever holds the semaphore (shrinking revokes nothing); returns
    /// the previous one, or None.
    fn set_capacity(&self, py: Python<'_>, capacity: u32) -> PyResult<Option<u32>> {
        let sem = self.core.sem.clone();
        block(py, None, async move { sem.set_capacity(capacity).await })
    }

    /// `set_capacity`, as an asyncio awaitable.
    fn set_capacity_async<'py>(
        &self,
        py: Python<'py>,
        capacity: u32,
    ) -> PyResult<Bound<'py, PyAny>> {
        let sem = self.core.sem.clone();
        spawn(py, async move { sem.set_capacity(capacity).await })
    }

    /// Release the permit `id`, held by any process (or withdraw the queued request `id`).
    /// Raises `NotHeld` when there is none.
    fn release_id(&self, py: Python<'_>, id: &str) -> PyResult<()> {
        let sem = self.core.sem.clone();
        let id = redsem::PermitId::new(id);
        block(py, None, async move { sem.release_id(&id).await })
    }

    /// `release_id`, as an asyncio awaitable.
    fn release_id_async<'py>(&self, py: Python<'py>, id: &str) -> PyResult<Bound<'py, PyAny>> {
        let sem = self.core.sem.clone();
        let id = redsem::PermitId::new(id);
        spawn(py, async move { sem.release_id(&id).await })
    }

    /// Extend the lease of the permit `id`, held by any process, to `lease` seconds from now.
    fn refresh_id(&self, py: Python<'_>, id: &str, lease: f64) -> PyResult<()> {
        let sem = self.core.sem.clone();
        let id = redsem::PermitId::new(id);
        let lease = seconds("lease", lease)?;
        block(py, None, async move { sem.refresh_id(&id, lease).await })
    }

    /// `refresh_id`, as an asyncio awaitable.
    fn refresh_id_async<'py>(
        &self,
        py: Python<'py>,
        id: &str,
        lease: f64,
    ) -> PyResult<Bound<'py, PyAny>> {
        let sem = self.core.sem.clone();
        let id = redsem::PermitId::new(id);
        let lease = seconds("lease", lease)?;
        spawn(py, async move { sem.refresh_id(&id, lease).await })
    }

    fn __repr__(&self) -> String {
        format!(
            "<redsem.LeaseSemaphore name={:?} capacity={}>",
            self.core.sem.name(),
            self.core.sem.capacity()
        )
    }
}

/// A distributed mutex: a fair lease semaphore of capacity 1. `lock()` returns a `Permit`.
#[pyclass(module = "redsem", frozen)]
pub(crate) struct Mutex {
    core: Core,
}

impl Mutex {
    pub(crate) fn new(client: redsem::Redsem, sem: redsem::LeaseSemaphore) -> Self {
        Mutex {
            core: Core { client, sem },
        }
    }
}

#[pymethods]
impl Mutex {
    /// The mutex's name.
    #[getter]
    fn name(&self) -> &str {
        self.core.sem.name()
    }

    /// Wait in line for the lock, as `LeaseSemaphore.acquire`.
    #[pyo3(signature = (*, timeout=None))]
    fn lock(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Permit> {
        let wait = maybe_seconds("timeout", timeout)?;
        block(py, Some(&self.core.client), self.core.acquire(1, wait))
    }

    /// `lock` for `redsem.aio`: an awaitable and its `Settle`.
    #[pyo3(signature = (timeout=None))]
    fn lock_async<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<(Bound<'py, PyAny>, Settle)> {
        let wait = maybe_seconds("timeout", timeout)?;
        spawn_wait(py, &self.core.client, self.core.acquire(1, wait))
    }

    /// Take the lock if it is free and nobody waits: a `Permit`, or `None`.
    fn try_lock(&self, py: Python<'_>) -> PyResult<Option<Permit>> {
        block(py, None, self.core.try_acquire(1))
    }

    /// `try_lock`, as an asyncio awaitable.
    fn try_lock_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.core.try_acquire(1))
    }

    /// A snapshot, as `LeaseSemaphore.status`.
    fn status(&self, py: Python<'_>) -> PyResult<Json> {
        block(py, None, self.core.status())
    }

    /// `status`, as an asyncio awaitable.
    fn status_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.core.status())
    }

    fn __repr__(&self) -> String {
        format!("<redsem.Mutex name={:?}>", self.core.sem.name())
    }
}
