//! `LeaseSemaphore` and `Mutex` (a lease semaphore of capacity 1): their calls, once each as
//! futures ([`Core`]), run blocking or as asyncio awaitables by the two Python classes.

use std::future::Future;
use std::time::Duration;

use pyo3::prelude::*;

use crate::call::{Owned, Settle, block, human, maybe_seconds, seconds, spawn, spawn_wait};
use crate::errors::invalid;
use crate::permit::Permit;
use crate::status::{Json, status_future};

/// A lease semaphore and the client it came from.
#[derive(Clone)]
struct Core {
    client: redsem::Redsem,
    sem: redsem::LeaseSemaphore,
}

impl Core {
    /// This core, its requests for `tenant` (none: the handle's own).
    fn for_tenant(&self, tenant: Option<redsem::Tenant>) -> PyResult<Core> {
        let Some(tenant) = tenant else {
            return Ok(self.clone());
        };
        Ok(Core {
            client: self.client.clone(),
            sem: self.sem.for_tenant(tenant).map_err(crate::errors::to_py)?,
        })
    }

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

    /// `acquire` (`blocking`) or `try_acquire` raising `NoPermit` when busy (the non-blocking
    /// form that a `with` statement can use).
    fn acquire_or_raise(
        &self,
        units: u32,
        wait: Option<Duration>,
        blocking: bool,
    ) -> std::pin::Pin<Box<dyn Future<Output = redsem::Result<Permit>> + Send + 'static>> {
        if blocking {
            return Box::pin(self.acquire(units, wait));
        }
        let Core { client, sem } = self.clone();
        Box::pin(async move {
            let permit = sem.try_acquire_many(units).await?;
            Ok(Permit::start(client, permit))
        })
    }

    fn status(&self) -> impl Future<Output = redsem::Result<Json>> + Send + 'static {
        status_future(self.client.clone(), self.sem.clone())
    }

    /// True when some permit holds a unit now (one round trip).
    fn locked(&self) -> impl Future<Output = redsem::Result<bool>> + Send + 'static {
        let sem = self.sem.clone();
        async move { Ok(sem.status().await?.in_use > 0) }
    }

    /// Release the permit `id` of any process; runs to its end if the caller is cancelled.
    fn release_id(
        &self,
        id: &str,
    ) -> PyResult<impl Future<Output = redsem::Result<()>> + Send + 'static> {
        let id = permit_id(id)?;
        let sem = self.sem.clone();
        // Run to its end by the library even if the caller is cancelled.
        Ok(async move { sem.release_id(&id).await })
    }

    /// Extend the lease of the permit `id` of any process to `lease` from now; refused when
    /// that would shorten the lease it has (its holder measures its lease locally and would
    /// not know that it ended early).
    fn refresh_id(
        &self,
        id: &str,
        lease: f64,
    ) -> PyResult<impl Future<Output = redsem::Result<()>> + Send + 'static> {
        let id = permit_id(id)?;
        let lease = seconds("lease", lease)?;
        let sem = self.sem.clone();
        Ok(async move {
            let status = sem.status().await?;
            if let Some(holder) = status.holders.iter().find(|h| h.id == id)
                && holder.expires_in > lease
            {
                return Err(redsem::Error::InvalidArgument(format!(
                    "refresh_id would shorten the lease of permit {id} from {} to {}: its \
                     holder measures its lease locally and would go on as if it held the \
                     permit; release_id ends a permit early",
                    human(holder.expires_in),
                    human(lease)
                )));
            }
            sem.refresh_id(&id, lease).await
        })
    }
}

/// The tenant of `tenant=`, `weight=` and `cap=`: none without a name (then a weight or cap
/// is refused: it would be ignored).
pub(crate) fn tenant(
    tenant: Option<String>,
    weight: Option<i128>,
    cap: Option<i128>,
) -> PyResult<Option<redsem::Tenant>> {
    let Some(name) = tenant else {
        if weight.is_some() || cap.is_some() {
            return Err(invalid(
                "weight= and cap= are a tenant's: name it with tenant=".to_owned(),
            ));
        }
        return Ok(None);
    };
    let mut tenant = redsem::Tenant::new(name);
    if let Some(weight) = weight {
        let weight = u32::try_from(weight)
            .ok()
            .filter(|w| (1..=redsem::MAX_WEIGHT).contains(w))
            .ok_or_else(|| {
                invalid(format!(
                    "weight must be an integer from 1 to {}, got {weight}",
                    redsem::MAX_WEIGHT
                ))
            })?;
        tenant = tenant.weight(weight);
    }
    if let Some(cap) = cap {
        let cap = u32::try_from(cap).ok().filter(|c| *c >= 1).ok_or_else(|| {
            invalid(format!(
                "cap must be an integer from 1 to {}, got {cap}",
                u32::MAX
            ))
        })?;
        tenant = tenant.cap(cap);
    }
    Ok(Some(tenant))
}

/// A permit id from Python: refused when empty (no permit has one).
fn permit_id(id: &str) -> PyResult<redsem::PermitId> {
    if id.is_empty() {
        return Err(crate::errors::invalid(
            "id must be a permit id (32 hex digits), got an empty string".to_owned(),
        ));
    }
    Ok(redsem::PermitId::new(id))
}

/// A fair counting semaphore shared through Redis, whose permits are leases.
///
/// At most `capacity` units are held at any instant of Redis time; waiters are served
/// first-in-first-out (a `try_acquire` fails while anyone waits); each grant has a fencing
/// token larger than every earlier one and slots in `range(capacity)`; a permit is renewed in
/// the background, and comes back within one lease if its process dies.
/// A capacity from Python: an integer from 1 to 2**32 - 1.
pub(crate) fn capacity(value: i128) -> PyResult<u32> {
    u32::try_from(value)
        .ok()
        .filter(|c| *c >= 1)
        .ok_or_else(|| {
            invalid(format!(
                "capacity must be an integer from 1 to {} (2**32 - 1), got {value}",
                u32::MAX
            ))
        })
}

#[pyclass(module = "redsem", frozen)]
pub(crate) struct LeaseSemaphore {
    core: Owned<Core>,
}

impl LeaseSemaphore {
    pub(crate) fn new(client: redsem::Redsem, sem: redsem::LeaseSemaphore) -> Self {
        LeaseSemaphore {
            core: Owned::new(Core { client, sem }),
        }
    }
}

#[pymethods]
impl LeaseSemaphore {
    /// The semaphore's name.
    #[getter]
    fn name(&self) -> PyResult<&str> {
        Ok(self.core.get()?.sem.name())
    }

    /// The capacity this handle asks for (the one it was opened with, or last set).
    #[getter]
    fn capacity(&self) -> PyResult<u32> {
        Ok(self.core.get()?.sem.capacity())
    }

    /// Wait in line (FIFO) for `units` units; returns a `Permit`, which is also a context
    /// manager. With `timeout` (seconds; `None` or `inf`: no limit), raise `redsem.Timeout`
    /// when not granted in time. With `blocking=False`, take the units only if they are free
    /// and nobody waits, else raise `redsem.NoPermit` (the form for `with`). The GIL is
    /// released while waiting; Ctrl-C raises `KeyboardInterrupt`. A request that times out or
    /// is interrupted has left the queue when the exception is raised.
    ///
    /// With `tenant` (a name), the request is that tenant's: tenants share the semaphore in
    /// fair shares (the next free unit goes to the waiting tenant holding the fewest units
    /// per `weight`, default 1), and one holds at most `cap` units (default: no cap). Every
    /// request of a tenant names the same weight and cap, or `redsem.TenantConflict` is raised.
    #[pyo3(signature = (units=1, *, timeout=None, blocking=true, tenant=None, weight=None, cap=None))]
    #[allow(clippy::too_many_arguments)]
    fn acquire(
        &self,
        py: Python<'_>,
        units: u32,
        timeout: Option<f64>,
        blocking: bool,
        tenant: Option<String>,
        weight: Option<i128>,
        cap: Option<i128>,
    ) -> PyResult<Permit> {
        let wait = maybe_seconds("timeout", timeout)?;
        let core = self
            .core
            .get()?
            .for_tenant(self::tenant(tenant, weight, cap)?)?;
        block(
            py,
            Some(&core.client),
            core.acquire_or_raise(units, wait, blocking),
        )
    }

    /// `acquire` for `redsem.aio`: an awaitable and its `Settle`.
    #[pyo3(signature = (units=1, timeout=None, blocking=true, tenant=None, weight=None, cap=None))]
    #[allow(clippy::too_many_arguments)]
    fn acquire_async<'py>(
        &self,
        py: Python<'py>,
        units: u32,
        timeout: Option<f64>,
        blocking: bool,
        tenant: Option<String>,
        weight: Option<i128>,
        cap: Option<i128>,
    ) -> PyResult<(Bound<'py, PyAny>, Settle)> {
        let wait = maybe_seconds("timeout", timeout)?;
        let core = self
            .core
            .get()?
            .for_tenant(self::tenant(tenant, weight, cap)?)?;
        spawn_wait(
            py,
            &core.client,
            core.acquire_or_raise(units, wait, blocking),
        )
    }

    /// Take `units` units if they are free and nobody waits (one round trip, never queued):
    /// a `Permit`, or `None` when busy. `tenant`, `weight`, `cap`: as for `acquire` (with
    /// tenants, granted at once only if it is that tenant's turn).
    #[pyo3(signature = (units=1, *, tenant=None, weight=None, cap=None))]
    fn try_acquire(
        &self,
        py: Python<'_>,
        units: u32,
        tenant: Option<String>,
        weight: Option<i128>,
        cap: Option<i128>,
    ) -> PyResult<Option<Permit>> {
        let core = self
            .core
            .get()?
            .for_tenant(self::tenant(tenant, weight, cap)?)?;
        block(py, None, core.try_acquire(units))
    }

    /// `try_acquire`, as an asyncio awaitable.
    #[pyo3(signature = (units=1, tenant=None, weight=None, cap=None))]
    fn try_acquire_async<'py>(
        &self,
        py: Python<'py>,
        units: u32,
        tenant: Option<String>,
        weight: Option<i128>,
        cap: Option<i128>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let core = self
            .core
            .get()?
            .for_tenant(self::tenant(tenant, weight, cap)?)?;
        spawn(py, core.try_acquire(units))
    }

    /// Store a new capacity, whoever holds the semaphore (shrinking revokes nothing); returns
    /// the previous one, or None.
    fn set_capacity(&self, py: Python<'_>, capacity: i128) -> PyResult<Option<u32>> {
        let capacity = self::capacity(capacity)?;
        let sem = self.core.get()?.sem.clone();
        block(py, None, async move { sem.set_capacity(capacity).await })
    }

    /// `set_capacity`, as an asyncio awaitable.
    fn set_capacity_async<'py>(
        &self,
        py: Python<'py>,
        capacity: i128,
    ) -> PyResult<Bound<'py, PyAny>> {
        let capacity = self::capacity(capacity)?;
        let sem = self.core.get()?.sem.clone();
        spawn(py, async move { sem.set_capacity(capacity).await })
    }

    /// A snapshot, as the dict of the CLI's `redsem status NAME --json`: `name`,
    /// `capacity` (None when none is stored), `in_use`, `holders` (id, label, token,
    /// slots, expires_in_ms, held_for_ms), `waiters` (id, label, units,
    /// waiting_for_ms), and the permits (`{"available": n}`) and latch (`{"state":
    /// ..., "count": n}`) of the same name. While tenants hold or wait, also `tenants`
    /// (name, held, waiters, weight, cap; the default tenant as `""`), and each holder
    /// and waiter of a tenant has its `tenant`.
    fn status(&self, py: Python<'_>) -> PyResult<Json> {
        block(py, None, self.core.get()?.status())
    }

    /// `status`, as an asyncio awaitable.
    fn status_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.core.get()?.status())
    }

    /// True when some permit holds a unit now (one round trip).
    fn locked(&self, py: Python<'_>) -> PyResult<bool> {
        block(py, None, self.core.get()?.locked())
    }

    /// `locked`, as an asyncio awaitable.
    fn locked_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.core.get()?.locked())
    }

    /// Release the permit `id`, held by any process (or withdraw the queued request
    /// `id`). Raises `NotHeld` when there is none, `ValueError` for an empty id.
    fn release_id(&self, py: Python<'_>, id: &str) -> PyResult<()> {
        block(py, None, self.core.get()?.release_id(id)?)
    }

    /// `release_id`, as an asyncio awaitable (cancelling it does not cancel the
    /// release).
    fn release_id_async<'py>(&self, py: Python<'py>, id: &str) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.core.get()?.release_id(id)?)
    }

    /// Extend the lease of the permit `id`, held by any process, to `lease` seconds
    /// from now. Refused (`ValueError`) when that would shorten its lease.
    fn refresh_id(&self, py: Python<'_>, id: &str, lease: f64) -> PyResult<()> {
        block(py, None, self.core.get()?.refresh_id(id, lease)?)
    }

    /// `refresh_id`, as an asyncio awaitable.
    fn refresh_id_async<'py>(
        &self,
        py: Python<'py>,
        id: &str,
        lease: f64,
    ) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.core.get()?.refresh_id(id, lease)?)
    }

    fn __repr__(&self) -> String {
        match self.core.peek() {
            Some(core) => format!(
                "<redsem.LeaseSemaphore name={:?} capacity={}>",
                core.sem.name(),
                core.sem.capacity()
            ),
            None => "<redsem.LeaseSemaphore>".to_owned(),
        }
    }
}

/// A distributed mutex: a fair lease semaphore of capacity 1. `acquire()` (or `lock()`)
/// returns a `Permit`.
#[pyclass(module = "redsem", frozen)]
pub(crate) struct Mutex {
    core: Owned<Core>,
}

impl Mutex {
    pub(crate) fn new(client: redsem::Redsem, sem: redsem::LeaseSemaphore) -> Self {
        Mutex {
            core: Owned::new(Core { client, sem }),
        }
    }

    fn lock_now(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
        blocking: bool,
        tenant: Option<redsem::Tenant>,
    ) -> PyResult<Permit> {
        let wait = maybe_seconds("timeout", timeout)?;
        let core = self.core.get()?.for_tenant(tenant)?;
        block(
            py,
            Some(&core.client),
            core.acquire_or_raise(1, wait, blocking),
        )
    }
}

#[pymethods]
impl Mutex {
    /// The mutex's name.
    #[getter]
    fn name(&self) -> PyResult<&str> {
        Ok(self.core.get()?.sem.name())
    }

    /// Wait in line for the lock, as `LeaseSemaphore.acquire`: a `Permit`, also a context
    /// manager. `blocking=False`: take it only if free, else raise `redsem.NoPermit`.
    /// `tenant`, `weight`, `cap`: as for `LeaseSemaphore.acquire`.
    #[pyo3(signature = (*, timeout=None, blocking=true, tenant=None, weight=None, cap=None))]
    fn acquire(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
        blocking: bool,
        tenant: Option<String>,
        weight: Option<i128>,
        cap: Option<i128>,
    ) -> PyResult<Permit> {
        self.lock_now(py, timeout, blocking, self::tenant(tenant, weight, cap)?)
    }

    /// The same as `acquire`.
    #[pyo3(signature = (*, timeout=None, blocking=true, tenant=None, weight=None, cap=None))]
    fn lock(
        &self,
        py: Python<'_>,
        timeout: Option<f64>,
        blocking: bool,
        tenant: Option<String>,
        weight: Option<i128>,
        cap: Option<i128>,
    ) -> PyResult<Permit> {
        self.lock_now(py, timeout, blocking, self::tenant(tenant, weight, cap)?)
    }

    /// `acquire` for `redsem.aio`: an awaitable and its `Settle`.
    #[pyo3(signature = (timeout=None, blocking=true, tenant=None, weight=None, cap=None))]
    fn lock_async<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
        blocking: bool,
        tenant: Option<String>,
        weight: Option<i128>,
        cap: Option<i128>,
    ) -> PyResult<(Bound<'py, PyAny>, Settle)> {
        let wait = maybe_seconds("timeout", timeout)?;
        let core = self
            .core
            .get()?
            .for_tenant(self::tenant(tenant, weight, cap)?)?;
        spawn_wait(py, &core.client, core.acquire_or_raise(1, wait, blocking))
    }

    /// Take the lock if it is free and nobody waits: a `Permit`, or `None`.
    #[pyo3(signature = (*, tenant=None, weight=None, cap=None))]
    fn try_acquire(
        &self,
        py: Python<'_>,
        tenant: Option<String>,
        weight: Option<i128>,
        cap: Option<i128>,
    ) -> PyResult<Option<Permit>> {
        let core = self
            .core
            .get()?
            .for_tenant(self::tenant(tenant, weight, cap)?)?;
        block(py, None, core.try_acquire(1))
    }

    /// The same as `try_acquire`.
    #[pyo3(signature = (*, tenant=None, weight=None, cap=None))]
    fn try_lock(
        &self,
        py: Python<'_>,
        tenant: Option<String>,
        weight: Option<i128>,
        cap: Option<i128>,
    ) -> PyResult<Option<Permit>> {
        self.try_acquire(py, tenant, weight, cap)
    }

    /// `try_acquire`, as an asyncio awaitable.
    #[pyo3(signature = (tenant=None, weight=None, cap=None))]
    fn try_lock_async<'py>(
        &self,
        py: Python<'py>,
        tenant: Option<String>,
        weight: Option<i128>,
        cap: Option<i128>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let core = self
            .core
            .get()?
            .for_tenant(self::tenant(tenant, weight, cap)?)?;
        spawn(py, core.try_acquire(1))
    }

    /// A snapshot, as the dict of the CLI's `redsem status NAME --json`: `name`,
    /// `capacity` (None when none is stored), `in_use`, `holders` (id, label, token,
    /// slots, expires_in_ms, held_for_ms), `waiters` (id, label, units,
    /// waiting_for_ms), and the permits (`{"available": n}`) and latch (`{"state":
    /// ..., "count": n}`) of the same name. While tenants hold or wait, also `tenants`
    /// (name, held, waiters, weight, cap; the default tenant as `""`), and each holder
    /// and waiter of a tenant has its `tenant`.
    fn status(&self, py: Python<'_>) -> PyResult<Json> {
        block(py, None, self.core.get()?.status())
    }

    /// `status`, as an asyncio awaitable.
    fn status_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.core.get()?.status())
    }

    /// True when some permit holds a unit now (one round trip).
    fn locked(&self, py: Python<'_>) -> PyResult<bool> {
        block(py, None, self.core.get()?.locked())
    }

    /// `locked`, as an asyncio awaitable.
    fn locked_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.core.get()?.locked())
    }

    /// Release the permit `id`, held by any process (or withdraw the queued request
    /// `id`). Raises `NotHeld` when there is none, `ValueError` for an empty id.
    fn release_id(&self, py: Python<'_>, id: &str) -> PyResult<()> {
        block(py, None, self.core.get()?.release_id(id)?)
    }

    /// `release_id`, as an asyncio awaitable (cancelling it does not cancel the
    /// release).
    fn release_id_async<'py>(&self, py: Python<'py>, id: &str) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.core.get()?.release_id(id)?)
    }

    /// Extend the lease of the permit `id`, held by any process, to `lease` seconds
    /// from now. Refused (`ValueError`) when that would shorten its lease.
    fn refresh_id(&self, py: Python<'_>, id: &str, lease: f64) -> PyResult<()> {
        block(py, None, self.core.get()?.refresh_id(id, lease)?)
    }

    /// `refresh_id`, as an asyncio awaitable.
    fn refresh_id_async<'py>(
        &self,
        py: Python<'py>,
        id: &str,
        lease: f64,
    ) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.core.get()?.refresh_id(id, lease)?)
    }

    fn __repr__(&self) -> String {
        match self.core.peek() {
            Some(core) => format!("<redsem.Mutex name={:?}>", core.sem.name()),
            None => "<redsem.Mutex>".to_owned(),
        }
    }
}
