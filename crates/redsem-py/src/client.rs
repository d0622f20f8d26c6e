//! `connect` and the client handle, `Redsem`: the factory of every primitive.

use pyo3::prelude::*;

use crate::call::{Owned, block, flush, seconds, spawn};
use crate::errors::invalid;
use crate::latch::CountDownLatch;
use crate::lease::{LeaseSemaphore, Mutex};
use crate::permits::PermitSemaphore;

/// The URL schemes `connect` takes.
const SCHEMES: &str = "redis://, rediss://, redis+unix://, unix://, redis+cluster://, \
    rediss+cluster://, redis+sentinel:// or rediss+sentinel://";

/// Refuse a URL without a scheme, naming the forms taken (redis-rs says only
/// "InvalidClientConfig").
fn check_url(url: &str) -> PyResult<()> {
    if url.contains("://") {
        return Ok(());
    }
    Err(invalid(format!(
        "url must start with {SCHEMES} (for example redis://127.0.0.1:6379/0), got {:?}",
        url.split('@').next_back().unwrap_or_default()
    )))
}

/// The smallest lease the library takes (its `MIN_LEASE`), checked here to say it in seconds.
const MIN_LEASE_SECS: f64 = 0.030;

/// `secs` as a lease: at least [`MIN_LEASE_SECS`].
fn lease_seconds(what: &str, secs: f64) -> PyResult<std::time::Duration> {
    if secs.is_finite() && (0.0..MIN_LEASE_SECS).contains(&secs) {
        return Err(invalid(format!(
            "{what} must be at least {MIN_LEASE_SECS:.3} s to be renewed in time, got {secs} s"
        )));
    }
    seconds(what, secs)
}

/// The options of `connect`, read from its keyword arguments.
fn options(
    prefix: Option<String>,
    connect_timeout: f64,
    response_timeout: f64,
    server_checks: &str,
    group_commit: bool,
    tls_root_cert: Option<std::path::PathBuf>,
    engine: &str,
) -> PyResult<redsem::RedsemOptions> {
    let checks = match server_checks {
        "enforce" => redsem::ServerChecks::Enforce,
        "warn" => redsem::ServerChecks::Warn,
        "off" => redsem::ServerChecks::Off,
        other => {
            return Err(invalid(format!(
                "server_checks must be \"enforce\", \"warn\" or \"off\", got {other:?}"
            )));
        }
    };
    let engine = match engine {
        "auto" => redsem::Engine::Auto,
        "scripts" => redsem::Engine::Scripts,
        "native" => redsem::Engine::Native,
        other => {
            return Err(invalid(format!(
                "engine must be \"auto\", \"scripts\" or \"native\", got {other:?}"
            )));
        }
    };
    let mut options = redsem::RedsemOptions::default()
        .connect_timeout(seconds("connect_timeout", connect_timeout)?)
        .response_timeout(seconds("response_timeout", response_timeout)?)
        .server_checks(checks)
        .group_commit(group_commit)
        .engine(engine);
    if let Some(prefix) = prefix {
        options = options.prefix(prefix);
    }
    if let Some(path) = tls_root_cert {
        options = options.tls_root_cert(path);
    }
    Ok(options)
}

/// Connect to the Redis at `url` (blocking; the GIL is released meanwhile).
///
/// `url` is `redis://[user:password@]host[:port][/db]` (`rediss://` for TLS, `redis+unix://`
/// for a socket), `redis+cluster://host:port,host:port` for a Redis Cluster by its seed nodes,
/// or `redis+sentinel://host:port,host:port/master[/db]` for the primary that Sentinels
/// watch. Keys start with `prefix` (default `"redsem"`). The server is checked first
/// (`server_checks`: `"enforce"` refuses an `allkeys-*` eviction policy or missing ACL
/// rights with `redsem.Unsuitable`, `"warn"` logs them, `"off"` skips the check).
///
/// `engine`: what runs the operations on the server. `"auto"` (the default) uses redsem's
/// Redis module where the server has it (on a cluster, every primary) and the Lua scripts
/// elsewhere; `"scripts"` always the scripts; `"native"` the module, or
/// `redsem.EngineUnavailable` where it is not loaded. `Redsem.engine` says which serves.
#[pyfunction]
#[pyo3(signature = (url, *, prefix=None, connect_timeout=2.0, response_timeout=5.0,
    server_checks="enforce", group_commit=true, tls_root_cert=None, engine="auto"))]
pub(crate) fn connect(
    py: Python<'_>,
    url: &str,
    prefix: Option<String>,
    connect_timeout: f64,
    response_timeout: f64,
    server_checks: &str,
    group_commit: bool,
    tls_root_cert: Option<std::path::PathBuf>,
    engine: &str,
) -> PyResult<Redsem> {
    let options = options(
        prefix,
        connect_timeout,
        response_timeout,
        server_checks,
        group_commit,
        tls_root_cert,
        engine,
    )?;
    check_url(url)?;
    let url = url.to_owned();
    // Not cut into slices for Ctrl-C: bounded by `connect_timeout` (and the server checks by
    // `response_timeout`).
    let inner = block(py, None, redsem::Redsem::connect_with(&url, options))?;
    Ok(Redsem {
        inner: Owned::new(inner),
    })
}

/// `connect`, as an asyncio awaitable (`redsem.aio.connect`).
#[pyfunction]
#[pyo3(signature = (url, *, prefix=None, connect_timeout=2.0, response_timeout=5.0,
    server_checks="enforce", group_commit=true, tls_root_cert=None, engine="auto"))]
pub(crate) fn connect_async<'py>(
    py: Python<'py>,
    url: &str,
    prefix: Option<String>,
    connect_timeout: f64,
    response_timeout: f64,
    server_checks: &str,
    group_commit: bool,
    tls_root_cert: Option<std::path::PathBuf>,
    engine: &str,
) -> PyResult<Bound<'py, PyAny>> {
    let options = options(
        prefix,
        connect_timeout,
        response_timeout,
        server_checks,
        group_commit,
        tls_root_cert,
        engine,
    )?;
    check_url(url)?;
    let url = url.to_owned();
    spawn(py, async move {
        let inner = redsem::Redsem::connect_with(&url, options).await?;
        Ok(Redsem {
            inner: Owned::new(inner),
        })
    })
}

/// A connection to one Redis deployment, from `redsem.connect`: one multiplexed command
/// connection and one pub/sub connection, shared by every primitive and permit made from it.
#[pyclass(module = "redsem", frozen)]
pub(crate) struct Redsem {
    inner: Owned<redsem::Redsem>,
}

/// The lease options of `lease_semaphore` and `mutex`, from their keyword arguments.
fn lease_options(
    lease: f64,
    waiter_lease: f64,
    label: Option<String>,
    one_per_label: bool,
    keepalive: bool,
) -> PyResult<redsem::LeaseOptions> {
    let mut options = redsem::LeaseOptions::default()
        .lease(lease_seconds("lease", lease)?)
        .waiter_lease(lease_seconds("waiter_lease", waiter_lease)?)
        .one_per_label(one_per_label)
        .keepalive(keepalive);
    if let Some(label) = label {
        options = options.label(label);
    }
    Ok(options)
}

#[pymethods]
impl Redsem {
    /// The key prefix.
    #[getter]
    fn prefix(&self) -> PyResult<&str> {
        Ok(self.inner.get()?.prefix())
    }

    /// The engine that serves the calls now: `"native"` (redsem's Redis module) or
    /// `"scripts"` (the Lua library). No round trip.
    #[getter]
    fn engine(&self) -> PyResult<&'static str> {
        Ok(self.inner.get()?.engine().name())
    }

    /// A fair lease semaphore of `capacity` units. No round trip.
    ///
    /// `lease`: how long a permit lives without renewal (seconds; renewed in the background
    /// every third of it while held). `waiter_lease`: how long a queued request keeps its
    /// place without checking in. `label`: recorded with each permit (shown by `status()`);
    /// with `one_per_label`, at most one permit or request per label.
    #[pyo3(signature = (name, capacity, *, lease=30.0, waiter_lease=10.0, label=None,
        one_per_label=false, keepalive=true))]
    fn lease_semaphore(
        &self,
        name: &str,
        capacity: i128,
        lease: f64,
        waiter_lease: f64,
        label: Option<String>,
        one_per_label: bool,
        keepalive: bool,
    ) -> PyResult<LeaseSemaphore> {
        let options = lease_options(lease, waiter_lease, label, one_per_label, keepalive)?;
        let inner = self.inner.get()?;
        let sem = inner
            .lease_semaphore_with(name, crate::lease::capacity(capacity)?, options)
            .map_err(crate::errors::to_py)?;
        Ok(LeaseSemaphore::new(inner.clone(), sem))
    }

    /// A distributed mutex: a lease semaphore of capacity 1. No round trip.
    #[pyo3(signature = (name, *, lease=30.0, waiter_lease=10.0, label=None,
        one_per_label=false, keepalive=true))]
    fn mutex(
        &self,
        name: &str,
        lease: f64,
        waiter_lease: f64,
        label: Option<String>,
        one_per_label: bool,
        keepalive: bool,
    ) -> PyResult<Mutex> {
        let options = lease_options(lease, waiter_lease, label, one_per_label, keepalive)?;
        let inner = self.inner.get()?;
        let mutex = inner
            .mutex_with(name, options)
            .map_err(crate::errors::to_py)?;
        Ok(Mutex::new(inner.clone(), mutex.semaphore().clone()))
    }

    /// Counted permits without owners or leases (Redisson's `RSemaphore`), FIFO waiting.
    ///
    /// `permits`: the count to start with: set before the first acquire if nobody ever set
    /// it (and again if the server lost it).
    #[pyo3(signature = (name, *, waiter_lease=10.0, permits=None))]
    fn permit_semaphore(
        &self,
        name: &str,
        waiter_lease: f64,
        permits: Option<u32>,
    ) -> PyResult<PermitSemaphore> {
        let mut options =
            redsem::PermitOptions::default().waiter_lease(seconds("waiter_lease", waiter_lease)?);
        if let Some(permits) = permits {
            options = options.permits(permits);
        }
        let inner = self.inner.get()?;
        let sem = inner
            .permit_semaphore_with(name, options)
            .map_err(crate::errors::to_py)?;
        Ok(PermitSemaphore::new(inner.clone(), sem))
    }

    /// A countdown latch (Redisson's `RCountDownLatch`). `recheck`: how often a waiter
    /// re-reads the count without a wake-up (the most a lost message can delay it).
    #[pyo3(signature = (name, *, recheck=1.0))]
    fn count_down_latch(&self, name: &str, recheck: f64) -> PyResult<CountDownLatch> {
        let options = redsem::LatchOptions::default().recheck(seconds("recheck", recheck)?);
        let inner = self.inner.get()?;
        let latch = inner
            .count_down_latch_with(name, options)
            .map_err(crate::errors::to_py)?;
        Ok(CountDownLatch::new(inner.clone(), latch))
    }

    /// Wait (at most `timeout` seconds) until the releases and withdrawals sent in the
    /// background (by permits that were garbage-collected, by interrupted waits) are done.
    #[pyo3(signature = (timeout=5.0))]
    fn flush(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let limit = seconds("timeout", timeout)?;
        let inner = self.inner.get()?.clone();
        block(py, None, async move {
            let _ = tokio::time::timeout(limit, flush(&inner)).await;
            Ok(())
        })
    }

    /// `flush`, as an asyncio awaitable.
    #[pyo3(signature = (timeout=5.0))]
    fn flush_async<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Bound<'py, PyAny>> {
        let limit = seconds("timeout", timeout)?;
        let inner = self.inner.get()?.clone();
        spawn(py, async move {
            let _ = tokio::time::timeout(limit, flush(&inner)).await;
            Ok(())
        })
    }

    /// The names of the lease semaphores under this prefix with state in Redis (SCAN).
    fn lease_semaphore_names(&self, py: Python<'_>) -> PyResult<Vec<String>> {
        let inner = self.inner.get()?.clone();
        block(py, None, async move { inner.lease_semaphore_names().await })
    }

    /// `lease_semaphore_names`, as an asyncio awaitable.
    fn lease_semaphore_names_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let inner = self.inner.get()?.clone();
        spawn(py, async move { inner.lease_semaphore_names().await })
    }

    fn __repr__(&self) -> String {
        match self.inner.peek() {
            Some(inner) => format!("<redsem.Redsem prefix={:?}>", inner.prefix()),
            None => "<redsem.Redsem>".to_owned(),
        }
    }
}
