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
use std::ops::Deref;
use std::sync::Arc;
use std::time::Duration;

use crate::error::{Error, Result};
use crate::{
    FencingToken, LatchOptions, LatchState, LeaseOptions, PermitId, PermitOptions, RedsemOptions,
    Status,
};

/// A runtime that shuts down (in the background) when its last handle goes: the permits and
/// primitives keep it alive as long as they live.
struct Runtime(Option<tokio::runtime::Runtime>);

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
        Ok(Mutex {
            inner: self.inner.mutex(name)?,
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

/// The blocking [`crate::LeaseSemaphore`].
#[derive(Clone)]
pub struct LeaseSemaphore {
    inner: crate::LeaseSemaphore,
    runtime: Arc<Runtime>,
}

impl fmt::Debug for LeaseSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::LeaseSemaphore")
            .field(&self.inner)
            .finish()
    }
}

impl LeaseSemaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// The capacity this handle requests.
    pub fn capacity(&self) -> u32 {
        self.inner.capacity()
    }

    fn permit(&self, permit: Result<crate::LeasePermit>) -> Result<LeasePermit> {
        Ok(LeasePermit {
            inner: permit?,
            runtime: self.runtime.clone(),
        })
    }

    /// Take one unit if one is free and nobody waits, as
    /// [`crate::LeaseSemaphore::try_acquire`].
    ///
    /// # Errors
    ///
    /// As [`crate::LeaseSemaphore::try_acquire`].
    pub fn try_acquire(&self) -> Result<LeasePermit> {
        self.permit(self.runtime.block_on(self.inner.try_acquire()))
    }

    /// Wait in line for one unit, as [`crate::LeaseSemaphore::acquire`].
    ///
    /// # Errors
    ///
    /// As [`crate::LeaseSemaphore::acquire`].
    pub fn acquire(&self) -> Result<LeasePermit> {
        self.permit(self.runtime.block_on(self.inner.acquire()))
    }

    /// Wait in line for `units` units, as [`crate::LeaseSemaphore::acquire_many`].
    ///
    /// # Errors
    ///
    /// As [`crate::LeaseSemaphore::acquire_many`].
    pub fn acquire_many(&self, units: u32) -> Result<LeasePermit> {
        self.permit(self.runtime.block_on(self.inner.acquire_many(units)))
    }

    /// Wait in line for one unit for at most `wait`, as
    /// [`crate::LeaseSemaphore::acquire_timeout`] (the request is withdrawn when it runs
    /// out).
    ///
    /// # Errors
    ///
    /// As [`crate::LeaseSemaphore::acquire_timeout`].
    pub fn acquire_timeout(&self, wait: Duration) -> Result<LeasePermit> {
        self.permit(self.runtime.block_on(self.inner.acquire_timeout(wait)))
    }

    /// A snapshot of holders and queue, as [`crate::LeaseSemaphore::status`].
    ///
    /// # Errors
    ///
    /// As [`crate::LeaseSemaphore::status`].
    pub fn status(&self) -> Result<Status> {
        self.runtime.block_on(self.inner.status())
    }
}

/// The blocking [`crate::LeasePermit`]: renewed in the background while it lives, released
/// when dropped (the drop waits for the release).
#[must_use = "dropping a LeasePermit releases it"]
pub struct LeasePermit {
    inner: crate::LeasePermit,
    runtime: Arc<Runtime>,
}

impl fmt::Debug for LeasePermit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::LeasePermit")
            .field(&self.inner)
            .finish()
    }
}

impl LeasePermit {
    fn permit(&self) -> &crate::LeasePermit {
        &self.inner
    }

    /// The permit id.
    pub fn id(&self) -> &PermitId {
        self.permit().id()
    }

    /// The fencing token of this grant.
    pub fn token(&self) -> FencingToken {
        self.permit().token()
    }

    /// The first slot of this permit.
    pub fn slot(&self) -> u32 {
        self.permit().slot()
    }

    /// All slots of this permit.
    pub fn slots(&self) -> &[u32] {
        self.permit().slots()
    }

    /// True while the permit is known to be held, as [`crate::LeasePermit::is_held`]: check
    /// it between steps of long work.
    pub fn is_held(&self) -> bool {
        self.permit().is_held()
    }

    /// How long the lease is certain to last without another renewal.
    pub fn time_left(&self) -> Duration {
        self.permit().time_left()
    }

    /// Renew the lease now, as [`crate::LeasePermit::refresh`].
    ///
    /// # Errors
    ///
    /// As [`crate::LeasePermit::refresh`].
    pub fn refresh(&self) -> Result<()> {
        self.runtime.block_on(self.permit().refresh())
    }

    /// Release the permit and hand its units to the next in line, as
    /// [`crate::LeasePermit::release`].
    ///
    /// # Errors
    ///
    /// As [`crate::LeasePermit::release`].
    pub fn release(mut self) -> Result<()> {
        self.runtime.block_on(self.inner.release_in_place())
    }

    /// Stop renewing and leave the permit held until its lease runs out, as
    /// [`crate::LeasePermit::forget`].
    pub fn forget(mut self) {
        self.inner.forget_in_place();
    }
}

impl Drop for LeasePermit {
    fn drop(&mut self) {
        if self.inner.is_settled() || tokio::runtime::Handle::try_current().is_ok() {
            // Settled; or dropped inside async code, where blocking would panic: the inner
            // permit's own drop releases it in the background, on that runtime.
            return;
        }
        if let Err(err) = self.runtime.block_on(self.inner.release_in_place()) {
            tracing::warn!(id = %self.inner.id(), error = %crate::error::Chain(&err),
                "could not release a dropped permit; its lease will end by itself");
        }
    }
}

/// The blocking [`crate::Mutex`].
#[derive(Clone)]
pub struct Mutex {
    inner: crate::Mutex,
    runtime: Arc<Runtime>,
}

impl fmt::Debug for Mutex {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::Mutex").field(&self.inner).finish()
    }
}

/// A held blocking [`Mutex`]: a [`LeasePermit`] (reachable through `Deref`), unlocked when
/// dropped.
#[must_use = "dropping a MutexGuard unlocks the mutex"]
#[derive(Debug)]
pub struct MutexGuard {
    permit: LeasePermit,
}

impl Mutex {
    /// The mutex's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    fn guard(&self, guard: Result<crate::MutexGuard>) -> Result<MutexGuard> {
        Ok(MutexGuard {
            permit: LeasePermit {
                inner: guard?.into_permit(),
                runtime: self.runtime.clone(),
            },
        })
    }

    /// Wait in line for the lock, as [`crate::Mutex::lock`].
    ///
    /// # Errors
    ///
    /// As [`crate::Mutex::lock`].
    pub fn lock(&self) -> Result<MutexGuard> {
        self.guard(self.runtime.block_on(self.inner.lock()))
    }

    /// Take the lock if it is free and nobody waits, as [`crate::Mutex::try_lock`].
    ///
    /// # Errors
    ///
    /// As [`crate::Mutex::try_lock`].
    pub fn try_lock(&self) -> Result<MutexGuard> {
        self.guard(self.runtime.block_on(self.inner.try_lock()))
    }

    /// Wait in line for the lock for at most `wait`, as [`crate::Mutex::lock_timeout`].
    ///
    /// # Errors
    ///
    /// As [`crate::Mutex::lock_timeout`].
    pub fn lock_timeout(&self, wait: Duration) -> Result<MutexGuard> {
        self.guard(self.runtime.block_on(self.inner.lock_timeout(wait)))
    }
}

impl MutexGuard {
    /// Unlock and hand the lock to the next in line.
    ///
    /// # Errors
    ///
    /// As [`crate::LeasePermit::release`].
    pub fn unlock(self) -> Result<()> {
        self.permit.release()
    }
}

impl Deref for MutexGuard {
    type Target = LeasePermit;

    fn deref(&self) -> &LeasePermit {
        &self.permit
    }
}

/// The blocking [`crate::PermitSemaphore`].
#[derive(Clone)]
pub struct PermitSemaphore {
    inner: crate::PermitSemaphore,
    runtime: Arc<Runtime>,
}

impl fmt::Debug for PermitSemaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::PermitSemaphore")
            .field(&self.inner)
            .finish()
    }
}

impl PermitSemaphore {
    /// The semaphore's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// As [`crate::PermitSemaphore::try_set_permits`].
    ///
    /// # Errors
    ///
    /// As [`crate::PermitSemaphore::try_set_permits`].
    pub fn try_set_permits(&self, permits: u32) -> Result<bool> {
        self.runtime.block_on(self.inner.try_set_permits(permits))
    }

    /// As [`crate::PermitSemaphore::ensure_permits`].
    ///
    /// # Errors
    ///
    /// As [`crate::PermitSemaphore::ensure_permits`].
    pub fn ensure_permits(&self, permits: u32) -> Result<bool> {
        self.runtime.block_on(self.inner.ensure_permits(permits))
    }

    /// As [`crate::PermitSemaphore::add_permits`].
    ///
    /// # Errors
    ///
    /// As [`crate::PermitSemaphore::add_permits`].
    pub fn add_permits(&self, delta: i64) -> Result<()> {
        self.runtime.block_on(self.inner.add_permits(delta))
    }

    /// As [`crate::PermitSemaphore::try_acquire`].
    ///
    /// # Errors
    ///
    /// As [`crate::PermitSemaphore::try_acquire`].
    pub fn try_acquire(&self, permits: u32) -> Result<()> {
        self.runtime.block_on(self.inner.try_acquire(permits))
    }

    /// As [`crate::PermitSemaphore::acquire`].
    ///
    /// # Errors
    ///
    /// As [`crate::PermitSemaphore::acquire`].
    pub fn acquire(&self, permits: u32) -> Result<()> {
        self.runtime.block_on(self.inner.acquire(permits))
    }

    /// As [`crate::PermitSemaphore::acquire_timeout`].
    ///
    /// # Errors
    ///
    /// As [`crate::PermitSemaphore::acquire_timeout`].
    pub fn acquire_timeout(&self, permits: u32, wait: Duration) -> Result<()> {
        self.runtime
            .block_on(self.inner.acquire_timeout(permits, wait))
    }

    /// As [`crate::PermitSemaphore::release`].
    ///
    /// # Errors
    ///
    /// As [`crate::PermitSemaphore::release`].
    pub fn release(&self, permits: u32) -> Result<()> {
        self.runtime.block_on(self.inner.release(permits))
    }

    /// As [`crate::PermitSemaphore::available_permits`].
    ///
    /// # Errors
    ///
    /// As [`crate::PermitSemaphore::available_permits`].
    pub fn available_permits(&self) -> Result<i64> {
        self.runtime.block_on(self.inner.available_permits())
    }

    /// As [`crate::PermitSemaphore::drain_permits`].
    ///
    /// # Errors
    ///
    /// As [`crate::PermitSemaphore::drain_permits`].
    pub fn drain_permits(&self) -> Result<u64> {
        self.runtime.block_on(self.inner.drain_permits())
    }
}

/// The blocking [`crate::CountDownLatch`].
#[derive(Clone)]
pub struct CountDownLatch {
    inner: crate::CountDownLatch,
    runtime: Arc<Runtime>,
}

impl fmt::Debug for CountDownLatch {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("blocking::CountDownLatch")
            .field(&self.inner)
            .finish()
    }
}

impl CountDownLatch {
    /// The latch's name.
    pub fn name(&self) -> &str {
        self.inner.name()
    }

    /// As [`crate::CountDownLatch::try_set_count`].
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::try_set_count`].
    pub fn try_set_count(&self, count: u64) -> Result<bool> {
        self.runtime.block_on(self.inner.try_set_count(count))
    }

    /// As [`crate::CountDownLatch::count_down`].
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::count_down`].
    pub fn count_down(&self) -> Result<()> {
        self.runtime.block_on(self.inner.count_down())
    }

    /// As [`crate::CountDownLatch::count`].
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::count`].
    pub fn count(&self) -> Result<u64> {
        self.runtime.block_on(self.inner.count())
    }

    /// As [`crate::CountDownLatch::state`].
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::state`].
    pub fn state(&self) -> Result<LatchState> {
        self.runtime.block_on(self.inner.state())
    }

    /// Block until the latch is not counting, as [`crate::CountDownLatch::wait`].
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::wait`].
    pub fn wait(&self) -> Result<()> {
        self.runtime.block_on(self.inner.wait())
    }

    /// As [`crate::CountDownLatch::wait_timeout`].
    ///
    /// # Errors
    ///
    /// As [`crate::CountDownLatch::wait_timeout`].
    pub fn wait_timeout(&self, wait: Duration) -> Result<()> {
        self.runtime.block_on(self.inner.wait_timeout(wait))
    }
}
