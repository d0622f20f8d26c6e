//! A [tower](https://docs.rs/tower) layer that bounds the requests in flight across a whole
//! fleet: each request holds a permit of a [`LeaseSemaphore`] while it runs.
//!
//! [`LeaseLimitLayer`] wraps a service in a [`LeaseLimit`]. Every call takes one unit of the
//! semaphore before the inner service sees the request, and gives it back when the response
//! future completes. Since the semaphore lives in Redis, the bound holds for every process
//! that opens the same semaphore name with the same capacity: ten replicas of an app behind a
//! limit of 4 run at most 4 of those requests at any moment, all replicas together.
//!
//! # Two ways to meet a full semaphore
//!
//! * [`LeaseLimitLayer::waiting`]: the request joins the semaphore's first-in-first-out queue
//!   and waits up to the given time. Past it, the call fails with [`LimitError::TimedOut`]
//!   (an HTTP app answers 503 Service Unavailable).
//! * [`LeaseLimitLayer::shedding`]: one attempt, no queue. When every unit is held, or others
//!   are queued for one, the call fails at once with [`LimitError::Busy`] (an HTTP app
//!   answers 429 Too Many Requests).
//!
//! Other failures of the semaphore (Redis unreachable, a capacity conflict with another
//! process, ...) come as [`LimitError::Redis`]; the inner service's own errors as
//! [`LimitError::Inner`]. [`LimitError::http_status`] suggests a status code for each of the
//! layer's own errors.
//!
//! # Where the permit is taken and given back
//!
//! * `poll_ready` only asks the inner service; it never touches Redis. The permit is
//!   requested inside the future that `call` returns (a [`ResponseFuture`]), so dropping that
//!   future always cleans up: a request still queued leaves the queue (the library's acquire
//!   withdraws it on drop), and a held permit is released.
//! * The inner service that was found ready is the one that gets the request, once the permit
//!   is held (the usual clone-and-swap of tower middleware, so the service must be `Clone`).
//! * When the inner future completes, the permit is released and the release is awaited
//!   before the response is handed on, so a client that sends its next request after reading
//!   the last response never finds its own earlier request still holding a unit. Dropping
//!   the response future in the middle of the release cannot stop it: the release runs to
//!   its end in the background. The permit goes back then even if the handler kept a clone
//!   of its [`HeldLease`]: the layer releases it through a shared reference
//!   ([`LeasePermit::release_shared`](crate::LeasePermit::release_shared)).
//! * A response future dropped before completion (the HTTP client went away and the server
//!   dropped the handler) drops the permit, which releases it in the background.
//!
//! # A lease lost while the request runs
//!
//! A permit is a lease, renewed in the background. If renewals fail for a whole lease (Redis
//! unreachable, the process paused), the unit may already be someone else's. What the layer
//! does then is set with [`LeaseLimitLayer::on_lost`]:
//!
//! * [`OnLost::Abort`] (the default): the inner future is dropped as soon as the loss is
//!   known, and the call fails with [`LimitError::LeaseLost`] (an HTTP app answers 503). The
//!   request's work stops at its next `.await`, so no more of it runs outside the limit. A
//!   response that was complete before the loss was noticed is still returned; one that
//!   becomes ready in the same wake-up as the loss is not.
//! * [`OnLost::Continue`]: the request runs on, and the response is returned as usual. The
//!   handler can watch the lease itself through the [`HeldLease`] in the request's
//!   extensions ([`HeldLease::lost`], [`HeldLease::is_lost`]), for instance to stop writing
//!   when its fencing token may be stale.
//!
//! In both modes an [`http::Request`] carries a [`HeldLease`] in its extensions: the
//! permit's fencing token, slot and id, for handlers that pass the token on to the storage
//! they protect. Other request types can receive it by implementing [`CarryLease`].
//!
//! # Tenants
//!
//! [`LeaseLimitLayer::tenant_from`] takes each request's [`Tenant`](crate::Tenant) from the
//! request (a header, an API key's owner): the requests then share the limit in the
//! semaphore's fair shares, so one caller's flood does not keep another's requests waiting
//! behind it (see [`Tenant`](crate::Tenant) for the grant order, weights and caps).
//! `examples/axum_limit.rs` takes it from an `x-tenant` header.
//!
//! # Examples
//!
//! An axum route limited to 4 requests in flight over all replicas; a request waits up to
//! 2 s for its turn:
//!
//! ```no_run
//! use std::time::Duration;
//!
//! use axum::{Router, error_handling::HandleErrorLayer, http::StatusCode, routing::get};
//! use redsem::tower::{LeaseLimitLayer, LimitError};
//! use tower::ServiceBuilder;
//!
//! # async fn example() -> redsem::Result<()> {
//! let redsem = redsem::Redsem::connect("redis://127.0.0.1:6379").await?;
//! let sem = redsem.lease_semaphore("reports-endpoint", 4)?;
//! let app: Router = Router::new().route("/reports", get(|| async { "done" })).route_layer(
//!     ServiceBuilder::new()
//!         .layer(HandleErrorLayer::new(|err: LimitError<std::convert::Infallible>| async move {
//!             let status = err.http_status().unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
//!             (status, err.to_string())
//!         }))
//!         .layer(LeaseLimitLayer::waiting(sem, Duration::from_secs(2))),
//! );
//! # let _ = app;
//! # Ok(())
//! # }
//! ```
//!
//! The layer on a plain tower service, shedding when busy:
//!
//! ```no_run
//! use redsem::tower::{LeaseLimitLayer, LimitError};
//! use tower::{ServiceBuilder, ServiceExt as _, service_fn};
//!
//! # async fn example(sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
//! let service = ServiceBuilder::new()
//!     .layer(LeaseLimitLayer::shedding(sem))
//!     .service(service_fn(|request: http::Request<()>| async move {
//!         Ok::<_, std::convert::Infallible>(request.uri().path().len())
//!     }));
//! match service.oneshot(http::Request::new(())).await {
//!     Ok(length) => println!("answered: {length}"),
//!     Err(LimitError::Busy(_)) => println!("busy, try again later"),
//!     Err(err) => eprintln!("failed: {err}"),
//! }
//! # Ok(())
//! # }
//! ```
//!
//! A handler that reads its fencing token and stops when the lease is lost
//! ([`OnLost::Continue`] leaves that to the handler):
//!
//! ```no_run
//! use axum::Extension;
//! use redsem::tower::HeldLease;
//!
//! async fn export(Extension(lease): Extension<HeldLease>) -> String {
//!     tokio::select! {
//!         () = lease.lost() => "lease lost, export stopped".to_owned(),
//!         () = tokio::time::sleep(std::time::Duration::from_millis(50)) => {
//!             format!("exported under token {}", lease.token())
//!         }
//!     }
//! }
//! # let _ = export;
//! ```

mod error;
mod future;
mod lease;
mod tenant;

use std::task::{Context, Poll};
use std::time::Duration;

use tower_layer::Layer;
use tower_service::Service;

pub use error::LimitError;
pub use future::ResponseFuture;
pub use lease::{CarryLease, HeldLease};
pub use tenant::{NoTenant, TENANT_HANDLES, TenantFrom, TenantOf};

use crate::{LeaseSemaphore, Tenant};

/// How a request meets a semaphore whose units are all held.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Admission {
    /// Queue (first in, first out) for at most this long, then fail with
    /// [`LimitError::TimedOut`].
    Wait(Duration),
    /// Fail at once with [`LimitError::Busy`].
    Shed,
}

/// What happens to a running request whose lease is lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum OnLost {
    /// Drop the inner future and fail the call with [`LimitError::LeaseLost`].
    #[default]
    Abort,
    /// Let the request run to its end; the handler learns of the loss through its
    /// [`HeldLease`].
    Continue,
}

/// A [`Layer`] that wraps services in a [`LeaseLimit`].
///
/// # Examples
///
/// ```no_run
/// # fn example(sem: redsem::LeaseSemaphore) {
/// use redsem::tower::{LeaseLimitLayer, OnLost};
///
/// let layer = LeaseLimitLayer::waiting(sem, std::time::Duration::from_millis(500))
///     .on_lost(OnLost::Continue);
/// # let _ = layer;
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct LeaseLimitLayer<T = NoTenant> {
    sem: LeaseSemaphore,
    admission: Admission,
    on_lost: OnLost,
    tenant: T,
}

impl LeaseLimitLayer {
    /// A layer whose requests meet a full semaphore as `admission` says.
    pub fn new(sem: LeaseSemaphore, admission: Admission) -> LeaseLimitLayer {
        LeaseLimitLayer {
            sem,
            admission,
            on_lost: OnLost::default(),
            tenant: NoTenant,
        }
    }

    /// Requests queue for a unit for at most `timeout` ([`Admission::Wait`]).
    pub fn waiting(sem: LeaseSemaphore, timeout: Duration) -> LeaseLimitLayer {
        LeaseLimitLayer::new(sem, Admission::Wait(timeout))
    }

    /// Requests that find no free unit fail at once ([`Admission::Shed`]).
    pub fn shedding(sem: LeaseSemaphore) -> LeaseLimitLayer {
        LeaseLimitLayer::new(sem, Admission::Shed)
    }
}

impl<T> LeaseLimitLayer<T> {
    /// What to do with a request whose lease is lost while it runs (default
    /// [`OnLost::Abort`]).
    pub fn on_lost(mut self, on_lost: OnLost) -> LeaseLimitLayer<T> {
        self.on_lost = on_lost;
        self
    }

    /// Take each request's tenant from the request itself: `tenant(&request)` names it
    /// (`None`: the default tenant), and the request queues in the semaphore's fair shares
    /// as that tenant ([`Tenant`]: weight and cap; every request of a tenant should name the
    /// same ones, or it fails with [`Error::TenantConflict`](crate::Error::TenantConflict),
    /// as [`LimitError::Redis`]). A tenant out of range (an empty or too long name) fails the
    /// call with [`LimitError::Redis`] holding
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) before Redis is asked.
    ///
    /// The handle of each tenant ([`LeaseSemaphore::for_tenant`]) is kept, up to
    /// [`TENANT_HANDLES`] tenants, and shared by the clones of the layer and its services.
    ///
    /// # Examples
    ///
    /// The tenant from a header, `x-tenant`:
    ///
    /// ```no_run
    /// # fn example(sem: redsem::LeaseSemaphore) {
    /// use redsem::Tenant;
    /// use redsem::tower::LeaseLimitLayer;
    ///
    /// let layer = LeaseLimitLayer::waiting(sem, std::time::Duration::from_secs(2))
    ///     .tenant_from(|request: &http::Request<axum::body::Body>| {
    ///         let name = request.headers().get("x-tenant")?.to_str().ok()?;
    ///         Some(Tenant::new(name))
    ///     });
    /// # let _ = layer;
    /// # }
    /// ```
    pub fn tenant_from<F, Req>(self, tenant: F) -> LeaseLimitLayer<TenantFrom<F>>
    where
        F: Fn(&Req) -> Option<Tenant>,
    {
        LeaseLimitLayer {
            sem: self.sem,
            admission: self.admission,
            on_lost: self.on_lost,
            tenant: TenantFrom::new(tenant),
        }
    }
}

impl<S, T: Clone> Layer<S> for LeaseLimitLayer<T> {
    type Service = LeaseLimit<S, T>;

    fn layer(&self, inner: S) -> LeaseLimit<S, T> {
        LeaseLimit {
            inner,
            sem: self.sem.clone(),
            admission: self.admission,
            on_lost: self.on_lost,
            tenant: self.tenant.clone(),
        }
    }
}

/// A service that runs each request of its inner service under a permit of a
/// [`LeaseSemaphore`] (see [the module](self)).
#[derive(Debug, Clone)]
pub struct LeaseLimit<S, T = NoTenant> {
    inner: S,
    sem: LeaseSemaphore,
    admission: Admission,
    on_lost: OnLost,
    tenant: T,
}

impl<S> LeaseLimit<S> {
    /// Wrap `inner` (as [`LeaseLimitLayer::new`] does).
    pub fn new(inner: S, sem: LeaseSemaphore, admission: Admission) -> LeaseLimit<S> {
        LeaseLimitLayer::new(sem, admission).layer(inner)
    }
}

impl<S, T> LeaseLimit<S, T> {
    /// The wrapped service.
    pub fn get_ref(&self) -> &S {
        &self.inner
    }

    /// The semaphore the requests take their permits from.
    pub fn semaphore(&self) -> &LeaseSemaphore {
        &self.sem
    }
}

impl<S, T, Req> Service<Req> for LeaseLimit<S, T>
where
    S: Service<Req> + Clone,
    T: TenantOf<Req>,
    Req: CarryLease,
{
    type Response = S::Response;
    type Error = LimitError<S::Error>;
    type Future = ResponseFuture<S, Req>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        // Readiness of the inner service only: the permit is taken in the call's future, so
        // that dropping that future is all a caller needs to do to give it up.
        self.inner.poll_ready(cx).map_err(LimitError::Inner)
    }

    fn call(&mut self, request: Req) -> ResponseFuture<S, Req> {
        // The instance that was polled ready serves this request; a clone takes its place.
        let replacement = self.inner.clone();
        let inner = std::mem::replace(&mut self.inner, replacement);
        let sem = self.tenant.semaphore_for(&self.sem, &request);
        ResponseFuture::new(inner, request, sem, self.admission, self.on_lost)
    }
}
