//! `CountDownLatch`: a count that, at zero, opens every waiter in every process.

use std::future::Future;

use pyo3::prelude::*;

use crate::call::{Owned, Settle, block, maybe_seconds, spawn, spawn_wait};
use crate::status::{Json, json};

/// A countdown latch shared through Redis, like Redisson's `RCountDownLatch`: set a count
/// once, count it down from anywhere, and every waiter in every process returns at zero.
///
/// `wait()` returns at once for a latch that is not counting (opened, or never set); a
/// waiter whose latch vanished from Redis while counting (a restart without persistence)
/// gets `redsem.StateLost`, never a false opening.
#[pyclass(module = "redsem", frozen)]
pub(crate) struct CountDownLatch {
    client: Owned<redsem::Redsem>,
    latch: Owned<redsem::CountDownLatch>,
}

impl CountDownLatch {
    pub(crate) fn new(client: redsem::Redsem, latch: redsem::CountDownLatch) -> Self {
        CountDownLatch {
            client: Owned::new(client),
            latch: Owned::new(latch),
        }
    }

    /// Run `op` on a clone of the Rust latch: the future of one call.
    fn with<T, F, Fut>(
        &self,
        op: F,
    ) -> PyResult<impl Future<Output = redsem::Result<T>> + Send + 'static>
    where
        F: FnOnce(redsem::CountDownLatch) -> Fut + Send + 'static,
        Fut: Future<Output = redsem::Result<T>> + Send + 'static,
    {
        Ok(op(self.latch.get()?.clone()))
    }

    fn wait_future(
        &self,
        timeout: Option<f64>,
    ) -> PyResult<impl Future<Output = redsem::Result<()>> + Send + 'static> {
        let wait = maybe_seconds("timeout", timeout)?;
        self.with(move |latch| async move {
            match wait {
                Some(wait) => latch.wait_timeout(wait).await,
                None => latch.wait().await,
            }
        })
    }

    fn state_future(
        &self,
    ) -> PyResult<impl Future<Output = redsem::Result<Json>> + Send + 'static> {
        self.with(|latch| async move { json(&latch.state().await?, "latch_state") })
    }
}

#[pymethods]
impl CountDownLatch {
    /// The latch's name.
    #[getter]
    fn name(&self) -> PyResult<&str> {
        Ok(self.latch.get()?.name())
    }

    /// Set the count to `count` unless the latch is counting already; True if this call set
    /// it (retry-safe). An opened latch can be set again.
    fn try_set_count(&self, py: Python<'_>, count: u64) -> PyResult<bool> {
        block(
            py,
            None,
            self.with(move |l| async move { l.try_set_count(count).await })?,
        )
    }

    /// `try_set_count`, as an asyncio awaitable.
    fn try_set_count_async<'py>(&self, py: Python<'py>, count: u64) -> PyResult<Bound<'py, PyAny>> {
        spawn(
            py,
            self.with(move |l| async move { l.try_set_count(count).await })?,
        )
    }

    /// Count down by one (retry-safe: applied once); at zero every waiter is opened. The
    /// count-downs left (0: this one opened it), or None if the latch was not counting.
    fn count_down(&self, py: Python<'_>) -> PyResult<Option<u64>> {
        block(
            py,
            None,
            self.with(|l| async move { l.count_down().await })?,
        )
    }

    /// `count_down`, as an asyncio awaitable.
    fn count_down_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        // Cancelling the caller does not cancel the count-down: the library runs it to its
        // end in the background (`CountDownLatch::count_down`).
        spawn(py, self.with(|l| async move { l.count_down().await })?)
    }

    /// The count-downs still to go (0 when not counting).
    fn count(&self, py: Python<'_>) -> PyResult<u64> {
        block(py, None, self.with(|l| async move { l.count().await })?)
    }

    /// `count`, as an asyncio awaitable.
    fn count_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.with(|l| async move { l.count().await })?)
    }

    /// `{"state": "counting" | "open" | "never-set", "count": n}`, as the CLI's status JSON.
    fn state(&self, py: Python<'_>) -> PyResult<Json> {
        block(py, None, self.state_future()?)
    }

    /// `state`, as an asyncio awaitable.
    fn state_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.state_future()?)
    }

    /// Block until the count reaches zero. With `timeout` (seconds), raise `redsem.Timeout`
    /// when it does not in time. The GIL is released while waiting; Ctrl-C raises
    /// `KeyboardInterrupt`.
    #[pyo3(signature = (*, timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<()> {
        let op = self.wait_future(timeout)?;
        block(py, Some(self.client.get()?), op)
    }

    /// `wait` for `redsem.aio`: an awaitable and its `Settle`.
    #[pyo3(signature = (timeout=None))]
    fn wait_async<'py>(
        &self,
        py: Python<'py>,
        timeout: Option<f64>,
    ) -> PyResult<(Bound<'py, PyAny>, Settle)> {
        let op = self.wait_future(timeout)?;
        spawn_wait(py, self.client.get()?, op)
    }

    /// Delete the latch (opening its waiters); True if it existed.
    fn delete(&self, py: Python<'_>) -> PyResult<bool> {
        block(py, None, self.with(|l| async move { l.delete().await })?)
    }

    /// `delete`, as an asyncio awaitable.
    fn delete_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        spawn(py, self.with(|l| async move { l.delete().await })?)
    }

    fn __repr__(&self) -> String {
        match self.latch.peek() {
            Some(latch) => format!("<redsem.CountDownLatch name={:?}>", latch.name()),
            None => "<redsem.CountDownLatch>".to_owned(),
        }
    }
}
