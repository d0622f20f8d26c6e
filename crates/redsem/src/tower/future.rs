//! [`ResponseFuture`]: the future a [`LeaseLimit`](super::LeaseLimit) call returns, in three
//! steps: take a permit, run the inner service's future under it, give the permit back.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, ready};

use futures_util::future::BoxFuture;
use pin_project_lite::pin_project;
use tokio_util::sync::WaitForCancellationFutureOwned;
use tower_service::Service;

use super::{Admission, CarryLease, HeldLease, LimitError, OnLost};
use crate::{Error, LeasePermit, LeaseSemaphore};

pin_project! {
    /// The response future of a [`LeaseLimit`](super::LeaseLimit) service: it takes a unit
    /// of the semaphore, hands the request (carrying its [`HeldLease`]) to the inner service,
    /// runs the inner future under the permit, and releases the permit before it answers.
    ///
    /// Dropping it cleans up at every step: a request still queued for a unit leaves the
    /// queue, a held permit is released in the background, and a release under way runs to
    /// its end.
    ///
    /// `S` is the inner service and `Req` its request type: the request is kept here until
    /// the permit is held, and the inner service's future ([`Service::Future`]) runs inside
    /// this one, unboxed. (Only the library's acquire and release are boxed.)
    #[must_use = "futures do nothing unless you `.await` or poll them"]
    pub struct ResponseFuture<S, Req>
    where
        S: Service<Req>,
    {
        #[pin]
        state: State<S, Req>,
        on_lost: OnLost,
    }
}

pin_project! {
    #[project = StateProj]
    enum State<S, Req>
    where
        S: Service<Req>,
    {
        /// Waiting for a unit; the service found ready and the request wait with it.
        Acquiring {
            acquire: BoxFuture<'static, crate::Result<LeasePermit>>,
            call: Option<(S, Req)>,
        },
        /// The inner future runs under the permit.
        Running {
            #[pin]
            response: S::Future,
            #[pin]
            lost: WaitForCancellationFutureOwned,
            lease: HeldLease,
        },
        /// The permit is being released; the inner outcome waits for it.
        Releasing {
            release: BoxFuture<'static, ()>,
            outcome: Option<Result<S::Response, S::Error>>,
            lease: HeldLease,
        },
        /// Answered.
        Done,
    }
}

impl<S, Req> ResponseFuture<S, Req>
where
    S: Service<Req>,
{
    /// The future of a call of `inner` (found ready) with `request`, under a unit of `sem`.
    pub(super) fn new(
        inner: S,
        request: Req,
        sem: crate::Result<LeaseSemaphore>,
        admission: Admission,
        on_lost: OnLost,
    ) -> ResponseFuture<S, Req> {
        let acquire: BoxFuture<'static, crate::Result<LeasePermit>> = match admission {
            Admission::Wait(timeout) => {
                Box::pin(async move { sem?.acquire_timeout(timeout).await })
            }
            Admission::Shed => Box::pin(async move { sem?.try_acquire().await }),
        };
        ResponseFuture {
            state: State::Acquiring {
                acquire,
                call: Some((inner, request)),
            },
            on_lost,
        }
    }

    /// The request's lease, once the permit is held and until the future answers (`None`
    /// while it waits for a unit, and once it has answered).
    pub fn lease(&self) -> Option<&HeldLease> {
        match &self.state {
            State::Running { lease, .. } | State::Releasing { lease, .. } => Some(lease),
            State::Acquiring { .. } | State::Done => None,
        }
    }

    /// True while it waits for a unit of the semaphore (queued, or asking Redis).
    pub fn is_waiting(&self) -> bool {
        matches!(self.state, State::Acquiring { .. })
    }

    /// What it does if the lease is lost while the inner future runs.
    pub fn on_lost(&self) -> OnLost {
        self.on_lost
    }
}

impl<S, Req> Future for ResponseFuture<S, Req>
where
    S: Service<Req>,
    Req: CarryLease,
{
    type Output = Result<S::Response, LimitError<S::Error>>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        loop {
            let this = self.as_mut().project();
            let next = match this.state.project() {
                StateProj::Acquiring { acquire, call } => {
                    let permit = match ready!(acquire.as_mut().poll(cx)) {
                        Ok(permit) => Arc::new(permit),
                        Err(err) => {
                            self.as_mut().project().state.set(State::Done);
                            return Poll::Ready(Err(refused(err)));
                        }
                    };
                    // Taken only here, as the state moves on: never missing.
                    let Some((mut inner, mut request)) = call.take() else {
                        return Poll::Pending;
                    };
                    let lease = HeldLease { permit };
                    request.carry(lease.clone());
                    State::Running {
                        response: inner.call(request),
                        lost: lease.permit.lost_owned(),
                        lease,
                    }
                }
                StateProj::Running {
                    response,
                    lost,
                    lease,
                } => {
                    // The loss first: once it is known, a response is not returned even if it
                    // is ready in the same wake-up (it may have been made after the loss).
                    if *this.on_lost == OnLost::Abort && lost.poll(cx).is_ready() {
                        let err = Error::LeaseLost {
                            name: lease.semaphore().to_owned(),
                            id: lease.id().to_string(),
                        };
                        // The permit goes with the inner future: a lost permit dropped is
                        // released in the background, for units held still.
                        self.as_mut().project().state.set(State::Done);
                        return Poll::Ready(Err(LimitError::LeaseLost(err)));
                    }
                    let outcome = ready!(response.poll(cx));
                    let permit = lease.permit.clone();
                    State::Releasing {
                        release: Box::pin(async move { give_back(&permit).await }),
                        outcome: Some(outcome),
                        lease: lease.clone(),
                    }
                }
                StateProj::Releasing {
                    release, outcome, ..
                } => {
                    ready!(release.as_mut().poll(cx));
                    // Taken only here, as the state moves on: never missing.
                    let Some(outcome) = outcome.take() else {
                        return Poll::Pending;
                    };
                    self.as_mut().project().state.set(State::Done);
                    return Poll::Ready(outcome.map_err(LimitError::Inner));
                }
                // Polled after it answered: it stays pending (which the `Future` contract
                // allows), rather than panic.
                StateProj::Done => return Poll::Pending,
            };
            self.as_mut().project().state.set(next);
        }
    }
}

impl<S, Req> fmt::Debug for ResponseFuture<S, Req>
where
    S: Service<Req>,
{
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = match &self.state {
            State::Acquiring { .. } => "acquiring",
            State::Running { .. } => "running",
            State::Releasing { .. } => "releasing",
            State::Done => "done",
        };
        f.debug_struct("ResponseFuture")
            .field("state", &state)
            .field("lease", &self.lease())
            .field("on_lost", &self.on_lost)
            .finish()
    }
}

/// The layer's error for a permit not taken.
fn refused<E>(err: Error) -> LimitError<E> {
    match err {
        Error::NoPermit { .. } => LimitError::Busy(err),
        Error::Timeout { .. } => LimitError::TimedOut(err),
        err => LimitError::Redis(err),
    }
}

/// Release `permit` and wait for the release to be done, whoever still holds a clone of its
/// [`HeldLease`]. The release runs to its end even if this future is dropped half-way
/// ([`LeasePermit::release_shared`] is cancel safe in effect).
async fn give_back(permit: &LeasePermit) {
    match permit.release_shared().await {
        Ok(()) => {}
        // Lost while the request ran (`OnLost::Continue`), or released by id meanwhile.
        Err(err) if err.is_not_held() => {
            tracing::debug!(semaphore = %permit.semaphore(), error = %err, "the permit of a finished request was no longer held");
        }
        Err(err) => tracing::warn!(
            semaphore = %permit.semaphore(),
            error = %err,
            "the permit of a finished request could not be released; its lease ends by itself"
        ),
    }
}
