//! `redsem._redsem`: the native half of the Python package `redsem`.
//!
//! Every primitive here is a thin handle on the Rust library's own (`redsem::LeaseSemaphore`,
//! ...), run on one tokio runtime per process, shared by the blocking methods and the
//! asyncio ones (`*_async`, wrapped by `redsem.aio`). The Rust library keeps the leases, the
//! waiting queue and the group commit; this crate only carries calls across.
//!
//! * Blocking calls release the GIL while they wait ([`call::block`]); a wait is cut into
//!   slices with `check_signals` between them, so Ctrl-C raises `KeyboardInterrupt` and the
//!   Rust acquire future is dropped (its request withdrawn) before the exception is raised.
//! * Asyncio calls are spawned on the runtime ([`call::spawn`]); cancelling the task drops the
//!   Rust future, and `redsem.aio` waits for the withdrawal before the cancellation goes on.

// Python keyword arguments become Rust parameters: `connect` and `lease_semaphore` take many.
#![allow(clippy::too_many_arguments)]

use pyo3::prelude::*;

mod call;
mod client;
mod errors;
mod latch;
mod lease;
mod permit;
mod permits;
mod status;

/// The native module, imported by `redsem/__init__.py`.
#[pymodule]
fn _redsem(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(client::connect, m)?)?;
    m.add_function(wrap_pyfunction!(client::connect_async, m)?)?;
    m.add_function(wrap_pyfunction!(call::_shutdown, m)?)?;
    m.add_function(wrap_pyfunction!(call::_after_fork, m)?)?;
    m.add_class::<client::Redsem>()?;
    m.add_class::<lease::LeaseSemaphore>()?;
    m.add_class::<lease::Mutex>()?;
    m.add_class::<permit::Permit>()?;
    m.add_class::<call::Settle>()?;
    m.add_class::<permits::PermitSemaphore>()?;
    m.add_class::<latch::CountDownLatch>()?;
    m.add("VERSION", redsem::VERSION)?;
    Ok(())
}
