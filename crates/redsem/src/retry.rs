//! The retry policy of retry-safe calls: once, with the same request id, after Redis could
//! not be reached.
//!
//! A call is retry-safe when it carries a request id that its script remembers (for about a
//! minute, `REMEMBER_MS` in `lua/common.lua`) and applies at most once: a resend of a call
//! whose first attempt was applied changes nothing and answers as the first did. Such a call
//! that fails with an unavailable server ([`Error::is_unavailable`](crate::Error::is_unavailable):
//! an I/O error, a refused or dropped connection, a timeout) may or may not have been applied, and sending it once more
//! settles which. Any other error (a refusal, a protocol error, a shortfall of replica
//! acknowledgements) is returned as it is: resending would not change it.

use std::future::Future;
use std::time::Duration;

use crate::error::{Chain, Result};

/// How often a waiter checks in again, and a permit's renewal is tried again, while Redis is
/// unreachable (within the waiter lease or the lease).
pub(crate) const RETRY_EVERY: Duration = Duration::from_millis(50);

/// Run `call`, and run it once more if Redis could not be reached. `what` names the
/// operation in the debug event of the retry.
///
/// `call` must send the same request id each time: that is what makes the second attempt
/// safe when the first was applied after all.
///
/// # Errors
///
/// The second attempt's error after an unavailable server, or the first attempt's error of
/// any other kind.
pub(crate) async fn retry_once<T, F, Fut>(what: &'static str, mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    match call().await {
        Err(err) if err.is_unavailable() => {
            tracing::debug!(operation = what, error = %Chain(&err), "retrying once with the same request id");
            call().await
        }
        other => other,
    }
}
