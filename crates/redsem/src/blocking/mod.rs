//! The primitives for code without an async runtime, like `reqwest::blocking` (feature
//! `blocking`).
//!
//! A [`Redsem`] here starts a small tokio runtime of its own (one worker thread) that keeps
//! the connections, renews the permits and delivers the wake-ups; each method runs the async
//! one on it and blocks the calling thread until it is done. Permits are released when
//! dropped, and the drop waits for the release (at most the response timeout), so a program
//! that drops its permit and exits leaves nothing held.
//!
//! Do not call these methods from async code: they block the thread, and tokio refuses to
//! block a runtime thread on another runtime (it panics). Use the async API there.
//!
//! # Examples
//!
//! ```no_run
//! fn main() -> redsem::Result<()> {
//!     let redsem = redsem::blocking::Redsem::connect("redis://127.0.0.1:6379")?;
//!     let exports = redsem.lease_semaphore("nightly-export", 2)?;
//!     let permit = exports.acquire()?; // blocks in line, FIFO
//!     println!("token {} slot {}", permit.token(), permit.slot());
//!     // ... the work, passing permit.token() to the resource ...
//!     drop(permit); // released here (or call permit.release()? to see the outcome)
//!     Ok(())
//! }
//! ```

use std::fmt;
use std::sync::Arc;

mod latch;
mod lease;
mod permits;

pub use latch::CountDownLatch;
pub use lease::{LeasePermit, LeaseSemaphore, Mutex, MutexGuard};
pub use permits::PermitSemaphore;

use crate::error::{Error, Result};
use crate::{LatchOptions, LeaseOptions, PermitOptions, RedsemOptions};

/// A runtime that shuts down (in the background) when its last handle goes: the permits and
/// primitives keep it alive as long as they live.
pub(super) struct Runtime(Option<tokio::runtime::Runtime>);

impl Runtime {
    fn start() -> Result<Arc<Runtime>> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("redsem-blocking")
            .enable_all()
            .build()
            .map_err(|e| Error::InvalidArgument(format!("cannot start a tokio runtime: {e}")))?;
        Ok(Arc::new(Runtime(Some(runtime))))
    }

    /// Run `future` to its end on the runtime, blocking the calling thread.
    fn block_on<T>(&self, future: impl Future<Output = Result<T>>) -> Result<T> {
        match &self.0 {
            Some(runtime) => runtime.block_on(future),
            // Only `Drop` takes the runtime, and nothing runs after it.
            None => Err(Error::InvalidArgument(
                "the redsem::blocking runtime is gone".into(),
            )),
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        if let Some(runtime) = self.0.take() {
            // Dropping a runtime blocks while its tasks end; inside async code that panics.
            runtime.shutdown_background();
        }
    }
}

/// The blocking [`crate::Redsem`]: a handle to one Redis deployment, with a runtime of its
/// own. Cloning is cheap.
///
/// # Examples
///
/// ```no_run
/// # fn example() -> redsem::Result<()> {
/// let redsem = redsem::blocking::Redsem::connect("redis://127.0.0.1:6379")?;
/// let lock = redsem.mutex("ledger")?;
/// let guard = lock.lock()?;
/// println!("fencing token {}", guard.token());
/// guard.unlock()?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Redsem {
    inner: crate::Redsem,
    runtime: Arc<Runtime>,
}

impl fmt::Debug for Redsem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::Redsem")
            .field(&self.inner)
            .finish()
    }
}

impl Redsem {
    /// Connect to the Redis at `url`, as [`crate::Redsem::connect`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn example() -> redsem::Result<()> {
    /// let redsem = redsem::blocking::Redsem::connect("redis://127.0.0.1:6379")?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`crate::Redsem::connect`]; [`Error::InvalidArgument`] if no runtime can be
    /// started.
    pub fn connect(url: &str) -> Result<Redsem> {
        Self::connect_with(url, RedsemOptions::default())
    }

    /// Connect with `options`, as [`crate::Redsem::connect_with`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # fn example() -> redsem::Result<()> {
    /// let options = redsem::RedsemOptions::default().prefix("app");
    /// let redsem = redsem::blocking::Redsem::connect_with("redis://127.0.0.1:6379", options)?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`crate::Redsem::connect_with`].
    pub fn connect_with(url: &str, options: RedsemOptions) -> Result<Redsem> {
        let runtime = Runtime::start()?;
        let inner = runtime.block_on(crate::Redsem::connect_with(url, options))?;
        Ok(Redsem { inner, runtime })
    }

    /// The async handle behind this one (to share its connections with async code).
    pub fn as_async(&self) -> &crate::Redsem {
        &self.inner
    }

    /// A fair lease semaphore, as [`crate::Redsem::lease_semaphore`].
    ///
    /// # Errors
    ///
    /// As [`crate::Redsem::lease_semaphore`].
    pub fn lease_semaphore(&self, name: &str, capacity: u32) -> Result<LeaseSemaphore> {
        self.lease_semaphore_with(name, capacity, LeaseOptions::default())
    }

    /// A fair lease semaphore with `options`, as [`crate::Redsem::lease_semaphore_with`].
    ///
    /// # Errors
    ///
    /// As [`crate::Redsem::lease_semaphore_with`].
    pub fn lease_semaphore_with(
        &self,
        name: &str,
        capacity: u32,
        options: LeaseOptions,
    ) -> Result<LeaseSemaphore> {
        Ok(LeaseSemaphore {
            inner: self.inner.lease_semaphore_with(name, capacity, options)?,
            runtime: self.runtime.clone(),
        })
    }

    /// A distributed mutex, as [`crate::Redsem::mutex`].
    ///
    /// # Errors
    ///
    /// As [`crate::Redsem::mutex`].
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        self.mutex_with(name, LeaseOptions::default())
    }

    /// A distributed mutex with `options`, as [`crate::Redsem::mutex_with`].
    ///
    /// # Errors
    ///
    /// As [`crate::Redsem::mutex_with`].
    pub fn mutex_with(&self, name: &str, options: LeaseOptions) -> Result<Mutex> {
        Ok(Mutex {
            inner: self.inner.mutex_with(name, options)?,
            runtime: self.runtime.clone(),
        })
    }

    /// Counted permits, as [`crate::Redsem::permit_semaphore`].
    ///
    /// # Errors
    ///
    /// As [`crate::Redsem::permit_semaphore`].
    pub fn permit_semaphore(&self, name: &str) -> Result<PermitSemaphore> {
        self.permit_semaphore_with(name, PermitOptions::default())
    }

    /// Counted permits with `options`, as [`crate::Redsem::permit_semaphore_with`].
    ///
    /// # Errors
    ///
    /// As [`crate::Redsem::permit_semaphore_with`].
    pub fn permit_semaphore_with(
        &self,
        name: &str,
        options: PermitOptions,
    ) -> Result<PermitSemaphore> {
        Ok(PermitSemaphore {
            inner: self.inner.permit_semaphore_with(name, options)?,
            runtime: self.runtime.clone(),
        })
    }

    /// A countdown latch, as [`crate::Redsem::count_down_latch`].
    ///
    /// # Errors
    ///
    /// As [`crate::Redsem::count_down_latch`].
    pub fn count_down_latch(&self, name: &str) -> Result<CountDownLatch> {
        self.count_down_latch_with(name, LatchOptions::default())
    }

    /// A countdown latch with `options`, as [`crate::Redsem::count_down_latch_with`].
    ///
    /// # Errors
    ///
    /// As [`crate::Redsem::count_down_latch_with`].
    pub fn count_down_latch_with(
        &self,
        name: &str,
        options: LatchOptions,
    ) -> Result<CountDownLatch> {
        Ok(CountDownLatch {
            inner: self.inner.count_down_latch_with(name, options)?,
            runtime: self.runtime.clone(),
        })
    }

    /// Wait until releases and withdrawals sent in the background have finished, as
    /// [`crate::Redsem::flush`].
    pub fn flush(&self) {
        let _ = self.runtime.block_on(async {
            self.inner.flush().await;
            Ok(())
        });
    }
}
