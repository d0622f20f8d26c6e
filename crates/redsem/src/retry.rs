//! The retry policy of retry-safe calls: once, with the same sequence number, after Redis could
//! not be reached; and for as long as a restarted server answers `LOADING`. A call made in
//! the background, which no caller would send again, is sent while Redis cannot be reached
//! for a patience of its own ([`until_reached`]).
//!
//! A call is retry-safe when its script applies it at most once: a resend of a call whose
//! first attempt was applied changes nothing and answers as the first did. The semaphores'
//! and the latch's calls carry a sequence number of the client's session
//! ([`crate::session`]), marked in the session's record while the call is in flight. Such a call
//! that fails with an unavailable server ([`Error::is_unavailable`](crate::Error::is_unavailable):
//! an I/O error, a refused or dropped connection, a timeout) may or may not have been applied, and sending it once more
//! settles which. Any other error (a refusal, a protocol error, a shortfall of replica
//! acknowledgements) is returned as it is: resending would not change it.

use std::future::Future;
use std::time::Duration;

use redis::{ErrorKind, ServerErrorKind};

use crate::error::{Chain, Error, Result};

/// How often a waiter checks in again, and a permit's renewal is tried again, while Redis is
/// unreachable (within the waiter lease or the lease).
pub(crate) const RETRY_EVERY: Duration = Duration::from_millis(50);

/// How long a retry-safe call is resent while the server answers `LOADING` (a restarted
/// server reading its AOF or RDB refuses every command until it has).
pub(crate) const LOADING_PATIENCE: Duration = Duration::from_secs(30);

/// The server is loading its data after a restart: the call was refused, not applied.
fn loading(err: &Error) -> bool {
    matches!(err, Error::Redis(e) if e.kind() == ErrorKind::Server(ServerErrorKind::BusyLoading))
}

/// The server could not be reached, or refused the call while loading its data: the cases in
/// which the waiting engine and a background withdrawal send an idempotent call again.
pub(crate) fn unreachable(err: &Error) -> bool {
    err.is_unavailable() || loading(err)
}

/// Run `call`, and run it once more if Redis could not be reached; while the server answers
/// `LOADING` (it restarted and reads its data), keep sending it every [`RETRY_EVERY`] for up
/// to [`LOADING_PATIENCE`]: a call it refused was not applied, and a retry-safe call given up
/// then would be lost with what it carries (a permit release has no lease to end it).
/// `what` names the operation in the debug event of the retry.
///
/// `call` must send the same request id each time: that is what makes the second attempt
/// safe when the first was applied after all.
///
/// # Errors
///
/// The last attempt's error after an unavailable or loading server, or the first attempt's
/// error of any other kind.
pub(crate) async fn retry_once<T, F, Fut>(what: &'static str, mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut result = call().await;
    if let Err(err) = &result
        && err.is_unavailable()
    {
        tracing::debug!(operation = what, error = %Chain(err), "retrying once with the same request id");
        result = call().await;
    }
    let deadline = tokio::time::Instant::now() + LOADING_PATIENCE;
    while let Err(err) = &result
        && loading(err)
        && tokio::time::Instant::now() < deadline
    {
        tracing::debug!(
            operation = what,
            "the server is loading its data; sending again with the same request id"
        );
        tokio::time::sleep(RETRY_EVERY).await;
        result = call().await;
    }
    result
}

/// Run `call`, and send it again every [`RETRY_EVERY`] while Redis cannot be reached or
/// answers `LOADING` ([`unreachable`]), for up to `patience`: for a call that must reach the
/// server in the end and that nothing else would send again (a withdrawal made in the
/// background). `call` must be idempotent.
///
/// # Errors
///
/// The last attempt's error once `patience` has passed, or the first error of any other kind.
pub(crate) async fn until_reached<T, F, Fut>(patience: Duration, mut call: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        match call().await {
            Err(err) if unreachable(&err) && tokio::time::Instant::now() < deadline => {
                tokio::time::sleep(RETRY_EVERY).await;
            }
            result => return result,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU32, Ordering};

    use super::*;

    fn refused() -> Error {
        Error::Protocol {
            script: "test",
            detail: "refused".into(),
        }
    }

    fn unreachable_server() -> Error {
        Error::Unavailable(redis::RedisError::from(std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "refused",
        )))
    }

    /// Run `until_reached` with `patience` on a call that always fails with `err()`; returns
    /// how many times it was sent, or panics after 5 s.
    async fn attempts(patience: Duration, err: fn() -> Error) -> u32 {
        let calls = AtomicU32::new(0);
        let sent = until_reached(patience, || {
            calls.fetch_add(1, Ordering::SeqCst);
            async move { Err::<(), _>(err()) }
        });
        let result = tokio::time::timeout(Duration::from_secs(5), sent)
            .await
            .expect("until_reached gave up in time");
        assert!(result.is_err());
        calls.load(Ordering::SeqCst)
    }

    #[tokio::test]
    async fn a_background_call_refused_for_another_reason_than_an_unreachable_server_is_sent_once()
    {
        assert_eq!(attempts(Duration::from_secs(30), refused).await, 1);
    }

    #[tokio::test]
    async fn a_background_call_to_an_unreachable_server_is_sent_again_until_its_patience_ends() {
        // Every 50 ms for 200 ms, and then given up (`attempts` bounds the wait).
        let n = attempts(Duration::from_millis(200), unreachable_server).await;
        assert!(n >= 2, "sent {n} times");
    }
}
