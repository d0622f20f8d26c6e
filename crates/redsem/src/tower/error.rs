//! [`LimitError`]: what a call through the layer can end with.

use std::fmt;

use crate::Error;

/// The error of a [`LeaseLimit`](super::LeaseLimit) service: the layer's own outcomes, or
/// the inner service's error.
#[derive(Debug)]
#[non_exhaustive]
pub enum LimitError<E> {
    /// Shedding ([`Admission::Shed`](super::Admission::Shed)): every unit was held, or other
    /// requests were queued first. Holds the library's [`Error::NoPermit`].
    Busy(Error),
    /// Waiting ([`Admission::Wait`](super::Admission::Wait)): no unit came free in time. The
    /// request left the queue. Holds the library's [`Error::Timeout`].
    TimedOut(Error),
    /// The lease was lost while the request ran, and it was stopped
    /// ([`OnLost::Abort`](super::OnLost::Abort)). Holds the library's [`Error::LeaseLost`].
    LeaseLost(Error),
    /// The semaphore failed otherwise: Redis unreachable, a capacity conflict, a key of the
    /// wrong type, ...
    Redis(Error),
    /// The inner service failed.
    Inner(E),
}

impl<E> LimitError<E> {
    /// The library's error behind one of the layer's outcomes; `None` for
    /// [`LimitError::Inner`].
    pub fn redsem_error(&self) -> Option<&Error> {
        match self {
            LimitError::Busy(err)
            | LimitError::TimedOut(err)
            | LimitError::LeaseLost(err)
            | LimitError::Redis(err) => Some(err),
            LimitError::Inner(_) => None,
        }
    }

    /// A status code for an HTTP answer to one of the layer's own errors: 429 Too Many
    /// Requests when shed, 503 Service Unavailable when the wait timed out, the lease was
    /// lost or Redis could not be reached, 500 for other failures of the semaphore (a
    /// misconfiguration); `None` for the inner service's errors, which are the app's to map.
    ///
    /// # Examples
    ///
    /// ```
    /// use redsem::tower::LimitError;
    ///
    /// let err: LimitError<std::io::Error> = LimitError::Busy(redsem::Error::NoPermit {
    ///     name: "api".to_owned(),
    ///     capacity: 4,
    ///     in_use: 4,
    ///     waiters: 0,
    /// });
    /// assert_eq!(err.http_status(), Some(http::StatusCode::TOO_MANY_REQUESTS));
    /// ```
    pub fn http_status(&self) -> Option<http::StatusCode> {
        Some(match self {
            LimitError::Busy(_) => http::StatusCode::TOO_MANY_REQUESTS,
            LimitError::TimedOut(_) | LimitError::LeaseLost(_) => {
                http::StatusCode::SERVICE_UNAVAILABLE
            }
            LimitError::Redis(err) if err.is_unavailable() => http::StatusCode::SERVICE_UNAVAILABLE,
            LimitError::Redis(_) => http::StatusCode::INTERNAL_SERVER_ERROR,
            LimitError::Inner(_) => return None,
        })
    }
}

impl<E: fmt::Display> fmt::Display for LimitError<E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LimitError::Busy(err) => write!(f, "concurrency limit reached: {err}"),
            LimitError::TimedOut(err) => write!(f, "concurrency limit: {err}"),
            LimitError::LeaseLost(err) => write!(f, "request stopped: {err}"),
            LimitError::Redis(_) => f.write_str("concurrency limit unavailable"),
            LimitError::Inner(err) => err.fmt(f),
        }
    }
}

impl<E: std::error::Error + 'static> std::error::Error for LimitError<E> {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Its message is the inner error's own: the chain goes on below it.
            LimitError::Inner(err) => err.source(),
            LimitError::Redis(err) => Some(err),
            LimitError::Busy(err) | LimitError::TimedOut(err) | LimitError::LeaseLost(err) => {
                err.source()
            }
        }
    }
}
