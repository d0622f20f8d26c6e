//! The fair lease semaphore: `LeaseSemaphore` hands out `LeasePermit`s.

mod batch;
mod options;
mod permit;
mod release;
mod request;
mod status;

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use tracing::Instrument as _;

pub use options::LeaseOptions;
pub use permit::LeasePermit;
pub use status::{Holder, Status, TenantStatus, Waiter};

use crate::batch::Batcher;
use crate::client::Redsem;
use crate::error::{Error, Result, invalid};
use crate::keys::LeaseKeys;
use crate::observe::{Attempt, Meter, op_span};
use crate::script::{self, Acquire, Release};
use crate::types::PermitId;
use crate::wait::{self, Patience};
use request::LeaseRequest;

pub use crate::types::{MAX_LEASE, MAX_UNITS, MIN_LEASE};

/// A fair, counting semaphore shared through Redis, whose permits are leases.
///
/// * At most `capacity` units are held at any instant of Redis time.
/// * Each grant gets a [`FencingToken`](crate::FencingToken) larger than every earlier one and
///   a slot number in `0..capacity`, distinct among live holders.
/// * Waiters are served strictly first-in-first-out; a `try_acquire` fails while anyone waits.
/// * A permit is renewed in the background; if its holder dies, it comes back within one lease.
///   A waiter that dies keeps its place, and a grant made to it afterwards, no longer than
///   its waiter lease ([`LeaseOptions::waiter_lease`]).
///
/// Cloning is cheap and clones share the capacity set by [`LeaseSemaphore::set_capacity`].
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> redsem::Result<()> {
/// let redsem = redsem::Redsem::connect("redis://127.0.0.1:6379").await?;
/// let sem = redsem.lease_semaphore("reports", 2)?;
/// let permit = sem.acquire().await?;
/// tokio::select! {
///     () = permit.lost() => eprintln!("lease lost, stopping"),
///     () = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
/// }
/// permit.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct LeaseSemaphore {
    inner: Arc<SemInner>,
}

/// Redis counts lease ends in whole milliseconds of its clock (`TIME`, rounded down): a lease
/// it starts at 12.999 ms ends `lease` after 12 ms, up to 1 ms before `lease` after the
/// request reached it. A permit's local validity, counted from before the request was sent,
/// ends this much sooner, so it never outlives the server's lease. (The soak's long run found
/// a holder whose local validity ended 237 µs after its unit was granted to the next waiter.)
pub(crate) const SERVER_CLOCK_STEP: Duration = Duration::from_millis(1);

#[derive(Debug)]
pub(crate) struct SemInner {
    pub(crate) redsem: Redsem,
    pub(crate) name: String,
    pub(crate) keys: LeaseKeys,
    /// Where this client's waiters on it are woken ([`Redsem::wake_channel_for`]).
    pub(crate) wake_channel: String,
    capacity: AtomicU32,
    pub(crate) options: LeaseOptions,
    /// Its metrics (`primitive` is `lease` or `mutex`).
    pub(crate) meter: Meter,
    /// The client's group commit on this semaphore (`None`: one call per operation, see
    /// [`RedsemOptions::group_commit`](crate::RedsemOptions::group_commit)).
    pub(crate) batcher: Option<Arc<Batcher<batch::LeaseGroup>>>,
}

impl LeaseSemaphore {
    pub(crate) fn new(
        redsem: Redsem,
        name: &str,
        capacity: u32,
        options: LeaseOptions,
        primitive: &'static str,
    ) -> Result<Self> {
        if name.is_empty() {
            return Err(invalid("the semaphore name must not be empty"));
        }
        if capacity == 0 {
            return Err(invalid("capacity must be at least 1, got 0"));
        }
        options.validate()?;
        let keys = LeaseKeys::new(redsem.prefix(), name);
        let wake_channel = redsem.wake_channel_for("lease", name);
        let meter = Meter::new(primitive, name, &redsem.shared.metric_names)
            .with_tenant(options.tenant.as_ref().map(crate::types::Tenant::name));
        let batcher = redsem.group_commit().then(|| {
            let group = batch::LeaseGroup {
                redsem: redsem.clone(),
                keys: keys.clone(),
                wake_channel: wake_channel.clone(),
            };
            redsem.shared_for(&keys.all[2], || Batcher::new(group))
        });
        Ok(LeaseSemaphore {
            inner: Arc::new(SemInner {
                batcher,
                meter,
                redsem,
                name: name.to_owned(),
                keys,
                wake_channel,
                capacity: AtomicU32::new(capacity),
                options,
            }),
        })
    }

    /// A handle on the same semaphore whose requests are for `tenant` (the others' options
    /// and the capacity as this handle's). Cheap: for a tenant per request, as a gateway
    /// takes it from each request.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
    /// let permit = sem.for_tenant(redsem::Tenant::new("acme").weight(2))?.acquire().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for a tenant name, weight or cap out of range.
    pub fn for_tenant(&self, tenant: crate::types::Tenant) -> Result<LeaseSemaphore> {
        tenant.validate()?;
        let inner = &self.inner;
        let meter = inner.meter.again().with_tenant(Some(tenant.name()));
        Ok(LeaseSemaphore {
            inner: Arc::new(SemInner {
                redsem: inner.redsem.clone(),
                name: inner.name.clone(),
                keys: inner.keys.clone(),
                wake_channel: inner.wake_channel.clone(),
                capacity: AtomicU32::new(self.capacity()),
                options: inner.options.clone().tenant(tenant),
                meter,
                batcher: inner.batcher.clone(),
            }),
        })
    }

    /// The semaphore's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The capacity this handle requests (the one it was opened with, or last set).
    pub fn capacity(&self) -> u32 {
        self.inner.capacity.load(Ordering::Relaxed)
    }

    /// The options of this handle.
    pub fn options(&self) -> &LeaseOptions {
        &self.inner.options
    }

    /// Take one unit if one is free and nobody waits; one round trip, never queued.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
    /// match sem.try_acquire().await {
    ///     Ok(permit) => println!("got slot {}", permit.slot()),
    ///     Err(e) if e.is_not_acquired() => println!("busy, try later"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NoPermit`] when all units are held or others wait; [`Error::CapacityConflict`]
    /// when the semaphore is in use with another capacity; [`Error::AlreadyHeld`] under
    /// [`LeaseOptions::one_per_label`]; [`Error::WrongType`] when one of its keys holds a
    /// foreign value; [`Error::Unavailable`] when Redis cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe, as [`PermitSemaphore::try_acquire`](crate::PermitSemaphore::try_acquire):
    /// if the future is dropped (or fails to hear the answer) after the request was sent, a
    /// unit granted meanwhile is released in the background (tracked by
    /// [`Redsem::flush`](crate::Redsem::flush)); if that cannot be sent, the lease runs out.
    pub async fn try_acquire(&self) -> Result<LeasePermit> {
        self.request(1, Patience::None).await
    }

    /// Take `units` units at once if they are free and nobody waits.
    ///
    /// The permit carries `units` slots ([`LeasePermit::slots`]) and one fencing token.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
    /// let permit = sem.try_acquire_many(2).await?;
    /// assert_eq!(permit.slots().len(), 2);
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`LeaseSemaphore::try_acquire`]; [`Error::InvalidArgument`] when `units` is 0 or
    /// larger than the capacity.
    ///
    /// # Cancel safety
    ///
    /// As [`LeaseSemaphore::try_acquire`].
    pub async fn try_acquire_many(&self, units: u32) -> Result<LeasePermit> {
        self.request(units, Patience::None).await
    }

    /// Wait in line for one unit, as long as it takes.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
    /// let permit = sem.acquire().await?;
    /// // ... use the resource, passing permit.token() along ...
    /// permit.release().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::CapacityConflict`], [`Error::AlreadyHeld`], [`Error::WrongType`] as for
    /// [`LeaseSemaphore::try_acquire`]; [`Error::Unavailable`] when Redis cannot be reached
    /// while queuing or checking in.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future (or a surrounding timeout) withdraws the request, and a
    /// unit granted to it in the meantime is released; the place in the queue is lost. The
    /// withdrawal is sent in the background; if it cannot be, the waiter lease cleans up.
    pub async fn acquire(&self) -> Result<LeasePermit> {
        self.request(1, Patience::Forever).await
    }

    /// Wait in line for `units` units at once.
    ///
    /// A large request at the head of the line is never overtaken by smaller ones behind it.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
    /// let permit = sem.acquire_many(3).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`LeaseSemaphore::acquire`]; [`Error::InvalidArgument`] when `units` is 0 or larger
    /// than the capacity.
    ///
    /// # Cancel safety
    ///
    /// As [`LeaseSemaphore::acquire`].
    pub async fn acquire_many(&self, units: u32) -> Result<LeasePermit> {
        self.request(units, Patience::Forever).await
    }

    /// Wait in line for one unit for at most `wait`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
    /// use std::time::Duration;
    /// match sem.acquire_timeout(Duration::from_secs(5)).await {
    ///     Ok(permit) => permit.release().await?,
    ///     Err(e) if e.is_timeout() => eprintln!("gave up"),
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Timeout`] when `wait` runs out (the request is withdrawn first, or, if Redis
    /// cannot be reached then, in the background once it can); otherwise as
    /// [`LeaseSemaphore::acquire`].
    ///
    /// # Cancel safety
    ///
    /// As [`LeaseSemaphore::acquire`].
    pub async fn acquire_timeout(&self, wait: Duration) -> Result<LeasePermit> {
        self.acquire_many_timeout(1, wait).await
    }

    /// Wait in line for `units` units for at most `wait`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
    /// let permit = sem.acquire_many_timeout(2, std::time::Duration::from_secs(1)).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`LeaseSemaphore::acquire_timeout`] and [`LeaseSemaphore::acquire_many`].
    ///
    /// # Cancel safety
    ///
    /// As [`LeaseSemaphore::acquire`].
    pub async fn acquire_many_timeout(&self, units: u32, wait: Duration) -> Result<LeasePermit> {
        let patience = Patience::waiting(Some(wait));
        self.request(units, patience).await
    }

    /// A snapshot of the semaphore: capacity in force, live holders, queued requests.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
    /// let status = sem.status().await?;
    /// for holder in &status.holders {
    ///     println!("{} token {} expires in {:?}", holder.id, holder.token, holder.expires_in);
    /// }
    /// println!("{} waiting", status.waiters.len());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::WrongType`], [`Error::Unavailable`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn status(&self) -> Result<Status> {
        let raw = script::lease_status(&mut self.inner.redsem.conn(), &self.inner.keys)
            .instrument(op_span!(self.inner.meter, "redsem.status"))
            .await?;
        Ok(Status::from_raw(raw))
    }

    /// Change the capacity stored with the semaphore, whoever holds it.
    ///
    /// Shrinking never revokes live permits: new grants wait until the units in use fall below
    /// the new capacity. Growing admits queued requests at once. Returns the previous capacity,
    /// if one was stored. This handle adopts the new capacity; other handles opened with the
    /// old one get [`Error::CapacityConflict`] while the semaphore is in use.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
    /// let before = sem.set_capacity(10).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`] for 0; [`Error::WrongType`], [`Error::Unavailable`].
    ///
    /// # Cancel safety
    ///
    /// If dropped after sending, the change may or may not have been made.
    pub async fn set_capacity(&self, capacity: u32) -> Result<Option<u32>> {
        if capacity == 0 {
            return Err(invalid("capacity must be at least 1, got 0"));
        }
        let old =
            script::lease_set_capacity(&mut self.inner.redsem.conn(), &self.inner.keys, capacity)
                .instrument(op_span!(self.inner.meter, "redsem.set_capacity"))
                .await?;
        self.inner.capacity.store(capacity, Ordering::Relaxed);
        Ok(old)
    }

    /// Extend the lease of the permit `id` (held by any process) to `lease` from now.
    ///
    /// For tools that hold permits across processes (the CLI's `acquire` / `refresh`).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
    /// let id = redsem::PermitId::new("0123456789abcdef0123456789abcdef");
    /// sem.refresh_id(&id, std::time::Duration::from_secs(30)).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if the permit is gone; [`Error::InvalidArgument`] for a lease out of
    /// range; [`Error::WrongType`], [`Error::Unavailable`].
    ///
    /// # Cancel safety
    ///
    /// If dropped after sending, the lease may or may not have been extended.
    pub async fn refresh_id(&self, id: &PermitId, lease: Duration) -> Result<()> {
        LeaseOptions::default().lease(lease).validate()?;
        let span = op_span!(self.inner.meter, "redsem.renew");
        span.record("id", id.as_str());
        let held = script::lease_refresh(
            &mut self.inner.redsem.conn(),
            &self.inner.keys,
            id.as_str(),
            lease,
        )
        .instrument(span)
        .await?;
        if held {
            Ok(())
        } else {
            Err(self.inner.not_held(id))
        }
    }

    /// Release the permit `id` (held by any process), or withdraw the queued request `id`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
    /// sem.release_id(&redsem::PermitId::new("0123456789abcdef0123456789abcdef")).await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::NotHeld`] if there is no such permit or request; [`Error::WrongType`],
    /// [`Error::Unavailable`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe in effect: once called, the release happens (in the background if this
    /// future is dropped before it answers); only its answer is lost.
    pub async fn release_id(&self, id: &PermitId) -> Result<()> {
        let span = op_span!(self.inner.meter, "redsem.release");
        span.record("id", id.as_str());
        let (inner, owned) = (self.inner.clone(), id.clone());
        // Run to its end even if this future is dropped: a release, once called, happens.
        let released = self
            .inner
            .redsem
            .run_to_end(async move { inner.release(owned.as_str()).await }.instrument(span))
            .await?;
        match released {
            Release::Released | Release::Dequeued => Ok(()),
            Release::NotHeld => Err(self.inner.not_held(id)),
        }
    }

    /// Wait in line for `units` units, for at most `wait` (`None`: as long as it takes),
    /// calling `progress` with the number of requests ahead each time that is learned (when
    /// queued, and at every check-in).
    ///
    /// For progress displays such as the CLI's spinner.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
    /// let permit = sem
    ///     .acquire_with_progress(1, None, |ahead| eprintln!("{ahead} ahead of us"))
    ///     .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`LeaseSemaphore::acquire_many_timeout`].
    ///
    /// # Cancel safety
    ///
    /// As [`LeaseSemaphore::acquire`].
    pub async fn acquire_with_progress(
        &self,
        units: u32,
        wait: Option<Duration>,
        progress: impl FnMut(u64) + Send,
    ) -> Result<LeasePermit> {
        let patience = Patience::waiting(wait);
        self.request_reporting(units, patience, progress).await
    }

    async fn request(&self, units: u32, patience: Patience) -> Result<LeasePermit> {
        self.request_reporting(units, patience, |_| {}).await
    }

    /// The request, measured ([`crate::observe`]) and run in its span.
    async fn request_reporting(
        &self,
        units: u32,
        patience: Patience,
        progress: impl FnMut(u64) + Send,
    ) -> Result<LeasePermit> {
        let attempt = Attempt::start(
            &self.inner.meter,
            op_span!(self.inner.meter, "redsem.acquire"),
            Some(u64::from(units)),
        );
        let span = attempt.span().clone();
        let result = self
            .request_unmeasured(units, patience, progress, &attempt)
            .instrument(span.clone())
            .await;
        if let Ok(permit) = &result {
            span.record("token", permit.token().get());
        }
        attempt.finish(&result);
        result
    }

    async fn request_unmeasured(
        &self,
        units: u32,
        patience: Patience,
        mut progress: impl FnMut(u64) + Send,
        attempt: &Attempt<'_>,
    ) -> Result<LeasePermit> {
        let capacity = self.capacity();
        if units == 0 || units > capacity.min(MAX_UNITS) {
            return Err(invalid(format!(
                "cannot request {units} units of {:?}: must be 1..={} (its capacity, and at most \
                 {MAX_UNITS} at once)",
                self.inner.name,
                capacity.min(MAX_UNITS)
            )));
        }
        let request = LeaseRequest {
            sem: self,
            capacity,
            units,
        };
        let won = wait::acquire(&request, patience, |position| {
            attempt.queued();
            progress(position);
        })
        .await?;
        // The server started the lease `delay` after the check-in it answered, which it
        // received after `sent`. A grant taken from a wake-up may be unclaimed: the server
        // keeps it only until the waiter lease of that check-in ends, unless the permit's
        // first renewal (due within half of that) claims it first.
        let options = &self.inner.options;
        let mut valid_until = won.sent + won.grant.delay + options.lease;
        if won.handed {
            valid_until = valid_until.min(won.sent + options.waiter_lease);
        }
        let valid_until = valid_until.saturating_sub(SERVER_CLOCK_STEP);
        Ok(LeasePermit::start(
            self.inner.clone(),
            won.id,
            won.grant.token,
            won.grant.slots,
            valid_until,
        ))
    }

    fn refusal(&self, reply: Acquire, requested: u32) -> Error {
        let name = self.inner.name.clone();
        match reply {
            Acquire::Conflict { current } => Error::CapacityConflict {
                name,
                requested,
                current,
            },
            Acquire::Label(label) => Error::AlreadyHeld { name, label },
            Acquire::Tenant {
                tenant,
                weight,
                cap,
            } => {
                let asked = self.inner.options.tenant.as_ref();
                Error::TenantConflict {
                    name,
                    tenant,
                    requested_weight: asked.map_or(1, crate::types::Tenant::weight_of),
                    requested_cap: asked.and_then(crate::types::Tenant::cap_of),
                    weight,
                    cap,
                }
            }
            Acquire::TooBig { capacity } => invalid(format!(
                "cannot request more units of {name:?} than its capacity {capacity}"
            )),
            Acquire::TooMany { most } => invalid(format!(
                "cannot request more than {most} units of {name:?} at once"
            )),
            other => Error::Protocol {
                script: "lease_acquire",
                detail: format!("unexpected reply {other:?}"),
            },
        }
    }
}
