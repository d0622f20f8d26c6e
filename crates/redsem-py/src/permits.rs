//! `PermitSemaphore`: counted permits without owners or leases, FIFO waiting.

use std::future::Future;

use pyo3::prelude::*;

use crate::call::{Owned, Settle, block, maybe_seconds, spawn, spawn_wait};

/// Counted permits shared through Redis, like Redisson's `RSemaphore`: a number of available
/// permits that anyone may take (`acquire`) and add to (`release`, `add_permits`).
///
/// Permits have no owners and no leases: a process that dies holding some does not give them
/// back (use a `LeaseSemaphore` when that matters). Waiters are served first-in-first-out; a
/// large request at the head of the line is never overtaken by smaller ones.
#[pyclass(module = "redsem", frozen)]
pub(crate) struct PermitSemaphore {
    client: Owned<redsem::Redsem>,
    sem: Owned<redsem::PermitSemaphore>,
}

impl PermitSemaphore {
    pub(crate) fn new(client: redsem::Redsem, sem: redsem::PermitSemaphore) -> Self {
        PermitSemaphore {
            client: Owned::new(client),
            sem: Owned::new(sem),
        }
    }

    /// Run `op` on a clone of the Rust semaphore: the future of one call.
    fn with<T, F, Fut>(
        &self,
        op: F,
    ) -> PyResult<impl Future<Output = redsem::Result<T>> + Send + 'static>
    where
        F: FnOnce(redsem::PermitSemaphore) -> Fut + Send + 'static,
        Fut: Future<Output = redsem::Result<T>> + Send + 'static,
    {
        Ok(op(self.sem.get()?.clone()))
    }

    fn acquire_future(
        &self,
        permits: u32,
        timeout: Option<f64>,
    ) -> PyResult<impl Future<Output = redsem::Result<()>> + Send + 'static> {
        let wait = maybe_seconds("timeout", timeout)?;
        self.with(move |sem| async move {
            match wait {
                Some(wait) => sem.acquire_timeout(permits, wait).await,
                None => sem.acquire(permits).await,
            }
        })
    }

    fn try_acquire_future(
        &self,
        permits: u32,
    ) -> PyResult<impl Future<Output = redsem::Result<bool>> + Send + 'static> {
        self.with(move |sem| async move {
            match sem.try_acquire(permits).await {
                Ok(()) => Ok(true),
                Err(redsem::Error::NotEnoughPermits { .. }) => Ok(false),
                Err(other) => Err(other),
            }
        })
    }
}

#[pymethods]
impl PermitSemaphore {
    /// Set the number of available permits to `permits` if it was never set. Returns True if
    /// this call set it (retry-safe).
    fn try_set_permits(&self, py: Python<'_>, permits: u32) -> PyResult<bool> {
        block(
            py,
            None,
            self.with(move |sem| async move { sem.try_set_permits(permits).await })?,
        )
    }

    /// `try_set_permits`, as an asyncio awaitable.
    fn try_set_permits_async<'py>(
        &self,
        py: Python<'py>,
        permits: u32,
    ) -> PyResult<Bound<'py, PyAny>> {
        spawn(
            py,
            self.with(move |sem| async move { sem.try_set_permits(permits).await })?,
        )
    }

    /// Set the count to `permits` if it never was (or the server lost it); else leave it.
    /// Returns True if this call set it.
    fn ensure_permits(&self, py: Python<'_>, permits: u32) -> PyResult<bool> {
        block(
            py,
            None,
            self.with(move |sem| async move { sem.ensure_permits(permits).await })?,
        )
    }

    /// `ensure_permits`, as an asyncio awaitable.
    fn ensure_permits_async<'py>(
        &self,
        py: Python<'py>,
        permits: u32,
    ) -> PyResult<Bound<'py, PyAny>> {
        spawn(
            py,
            self.with(move |sem| async move { sem.ensure_permits(permits).await })?,
        )
    }

    /// Add `delta` permits (negative: take them away; the count may go below zero).
    fn add_permits(&self, py: Python<'_>, delta: i64) -> PyResult<()> {
        block(
            py,
            None,
            self.with(move |sem| async move { sem.add_permits(delta).await })?,
        )
    }

    /// `add_permits`, as an asyncio awaitable.
    fn add_permits_async<'py>(&self, py: Python<'py>, delta: i64) -> PyResult<Bound<'py, PyAny>> {
        // Run to its end by the library even if the caller is cancelled.
        spawn(
            py,
            self.with(move |sem| async move { sem.add_permits(delta).await })?,
        )
    }

    /// The permits available now (negative after `add_permits` took more than there were;
    /// 0 when never set).
    fn available_permits(&self, py: Python<'_>) -> PyResult<i64> {
        block(
            py,
            None,
            self.with(move |sem| async move { sem.available_permits().await })?,
        )
    }

    /// `available_permits`, as an asyncio awaitable.
    fn available_permits_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(
            py,
            self.with(move |sem| async move { sem.available_permits().await })?,
        )
    }

    /// Take every available permit; returns how many were taken.
    fn drain_permits(&self, py: Python<'_>) -> PyResult<u64> {
        block(
            py,
            None,
            self.with(move |sem| async move { sem.drain_permits().await })?,
        )
    }

    /// `drain_permits`, as an asyncio awaitable.
    fn drain_permits_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(
            py,
            self.with(move |sem| async move { sem.drain_permits().await })?,
        )
    }

    /// Delete the semaphore's count and queue; True if there was something to delete.
    fn delete(&self, py: Python<'_>) -> PyResult<bool> {
        block(
            py,
            None,
            self.with(move |sem| async move { sem.delete().await })?,
        )
    }

    /// `delete`, as an asyncio awaitable.
    fn delete_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.with(move |sem| async move { sem.delete().await })?)
    }

    /// The semaphore's name.
    #[getter]
    fn name(&self) -> PyResult<&str> {
        Ok(self.sem.get()?.name())
    }

    /// Give back `permits` permits (anyone may; retry-safe, applied once).
    #[pyo3(signature = (permits=1))]
    fn release(&self, py: Python<'_>, permits: u32) -> PyResult<()> {
        block(
            py,
            None,
            self.with(move |sem| async move { sem.release(permits).await })?,
        )
    }

    /// `release`, as an asyncio awaitable.
    #[pyo3(signature = (permits=1))]
    fn release_async<'py>(&self, py: Python<'py>, permits: u32) -> PyResult<Bound<'py, PyAny>> {
        // Cancelling the caller does not cancel the release: the library runs it to its end
        // in the background (`PermitSemaphore::release`).
        spawn(
            py,
            self.with(move |sem| async move { sem.release(permits).await })?,
        )
    }

    /// Wait in line (FIFO) for `permits` permits. With `timeout` (seconds), raise
    /// `redsem.Timeout` when not granted in time. The GIL is released while waiting; Ctrl-C
    /// raises `KeyboardInterrupt`; a timed-out or interrupted request has left the queue.
    #[pyo3(signature = (permits=1, *, timeout=None))]
    fn acquire(&self, py: Python<'_>, permits: u32, timeout: Option<f64>) -> PyResult<()> {
        let op = self.acquire_future(permits, timeout)?;
        block(py, Some(self.client.get()?), op)
    }

    /// `acquire` for `redsem.aio`: an awaitable and its `Settle`.
    #[pyo3(signature = (permits=1, timeout=None))]
    fn acquire_async<'py>(
        &self,
        py: Python<'py>,
        permits: u32,
        timeout: Option<f64>,
    ) -> PyResult<(Bound<'py, PyAny>, Settle)> {
        let op = self.acquire_future(permits, timeout)?;
        spawn_wait(py, self.client.get()?, op)
    }

    /// Take `permits` permits if available and nobody waits: True, or False (never queued).
    #[pyo3(signature = (permits=1))]
    fn try_acquire(&self, py: Python<'_>, permits: u32) -> PyResult<bool> {
        block(py, None, self.try_acquire_future(permits)?)
    }

    /// `try_acquire`, as an asyncio awaitable.
    #[pyo3(signature = (permits=1))]
    fn try_acquire_async<'py>(&self, py: Python<'py>, permits: u32) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.try_acquire_future(permits)?)
    }

    fn __repr__(&self) -> String {
        match self.sem.peek() {
            Some(sem) => format!("<redsem.PermitSemaphore name={:?}>", sem.name()),
            None => "<redsem.PermitSemaphore>".to_owned(),
        }
    }
}
