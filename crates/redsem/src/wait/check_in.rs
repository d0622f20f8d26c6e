//! When a request gives up ([`Patience`]), and checking in through a connection loss.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

use crate::clock;
use crate::error::{Chain, Result};
use crate::retry::{RETRY_EVERY, unreachable};

/// When a request gives up.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Patience {
    /// One attempt, never queued.
    None,
    /// Queued until the deadline.
    Until(Instant),
    /// Queued until granted.
    Forever,
}

impl Patience {
    /// Queued until `wait` from now (as long as it takes if that is past any instant).
    pub(crate) fn waiting(wait: Option<Duration>) -> Patience {
        match wait.and_then(|w| Instant::now().checked_add(w)) {
            Some(deadline) => Patience::Until(deadline),
            None => Patience::Forever,
        }
    }

    pub(crate) fn deadline(self) -> Option<Instant> {
        match self {
            Patience::Until(deadline) => Some(deadline),
            Patience::None | Patience::Forever => None,
        }
    }
}

/// When one check-in was sent (on [`clock`]), by its first attempt and by the attempt whose
/// answer came back: the two differ when attempts failed in between.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Sent {
    /// The first attempt: what the server holds for the request may date from it. An attempt
    /// whose reply was lost may have been applied, and what it made may have run out before a
    /// later attempt came (a stall, an outage); a wake-up it earned is judged by this instant.
    pub(crate) first: Duration,
    /// The attempt answered: an answer describes the state as of this attempt.
    pub(crate) answered: Duration,
}

impl Sent {
    /// The check-in took more than one attempt (one at least failed, maybe after the server
    /// had applied it).
    pub(crate) fn resent(&self) -> bool {
        self.answered != self.first
    }
}

/// Send a check-in (`call`: an enqueue or a poll) and return its answer with the moments
/// (on [`clock`]) its first and its answered attempt were sent ([`Sent`]). While Redis is unreachable (a dropped connection
/// the connection manager is restoring, a failover) or answers `LOADING` (restarted, reading
/// its data back: the check-in was refused, not applied), try again every [`RETRY_EVERY`] for as
/// long as the waiter lease started by the last answered check-in (sent at `last`) keeps the
/// place on the server, and not past `deadline`; after that, the error is returned
/// ([`Error::Unavailable`](crate::Error::Unavailable)). Every check-in is idempotent per
/// request id, so an attempt that ran but whose answer was lost does no harm.
pub(crate) async fn check_in<T, F, Fut>(
    last: Duration,
    waiter_lease: Duration,
    deadline: Option<Instant>,
    mut call: F,
) -> Result<(T, Sent)>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let first = clock::now();
    let mut sent = first;
    loop {
        match call().await {
            Ok(answer) => {
                let answered = sent;
                return Ok((answer, Sent { first, answered }));
            }
            Err(err)
                if unreachable(&err)
                    && clock::now() + RETRY_EVERY < last + waiter_lease
                    && deadline.is_none_or(|d| Instant::now() + RETRY_EVERY < d) =>
            {
                tracing::debug!(error = %Chain(&err), "check-in failed; trying again within the waiter lease");
                tokio::time::sleep(RETRY_EVERY).await;
                sent = clock::now();
            }
            Err(err) => return Err(err),
        }
    }
}
