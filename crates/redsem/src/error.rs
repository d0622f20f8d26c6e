//! The one error type of redsem.

use std::time::Duration;

/// A `Result` whose error is [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in redsem.
///
/// Expected outcomes of a synchronization primitive ([`Error::NoPermit`], [`Error::Timeout`],
/// [`Error::NotHeld`], ...) are variants of their own, so callers can match on them; transport
/// and server failures keep the [`redis::RedisError`] that caused them in
/// [`source()`](std::error::Error::source). Use the `is_*` helpers rather than matching
/// message text.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// Redis could not be reached: connection refused, dropped, or a command timed out.
    ///
    /// Like every variant that keeps a cause, its message does not repeat it: the cause is
    /// in [`source()`](std::error::Error::source), for error reporters that print the chain.
    #[error("redis unavailable")]
    Unavailable(#[source] redis::RedisError),
    /// Redis answered with an error that redsem does not expect.
    #[error("redis error")]
    Redis(#[source] redis::RedisError),
    /// `try_*` found no room: all units in use, or other requests are queued first.
    #[error("no permit of {name:?} available ({in_use} of {capacity} in use, {waiters} waiting)")]
    NoPermit {
        /// Name of the primitive.
        name: String,
        /// Capacity in force.
        capacity: u32,
        /// Units held when the attempt was made.
        in_use: u64,
        /// Requests queued ahead when the attempt was made.
        waiters: u64,
    },
    /// `try_acquire` of a [`PermitSemaphore`](crate::PermitSemaphore) found fewer permits
    /// available than requested, or other requests queued first.
    #[error(
        "{requested} permits of {name:?} not available ({available} available, {waiters} waiting)"
    )]
    NotEnoughPermits {
        /// Name of the semaphore.
        name: String,
        /// Permits requested.
        requested: u32,
        /// Permits available when the attempt was made (may be negative).
        available: i64,
        /// Requests queued ahead when the attempt was made.
        waiters: u64,
    },
    /// A waiting acquire ran out of time.
    #[error("timed out after {waited:?} waiting for {name:?}")]
    Timeout {
        /// Name of the primitive.
        name: String,
        /// How long the call waited.
        waited: Duration,
    },
    /// A refresh or release of a permit that is no longer held (released, or its lease ended).
    #[error("permit {id} of {name:?} is not held")]
    NotHeld {
        /// Name of the semaphore.
        name: String,
        /// The permit id.
        id: String,
    },
    /// A permit was lost while in use: its lease ended or may have ended before it was renewed.
    #[error("lease of permit {id} of {name:?} lost")]
    LeaseLost {
        /// Name of the semaphore.
        name: String,
        /// The permit id.
        id: String,
    },
    /// The semaphore is in use with a different capacity than the one it was opened with.
    #[error("capacity {requested} of {name:?} differs from capacity {current} in force")]
    CapacityConflict {
        /// Name of the semaphore.
        name: String,
        /// Capacity this handle was opened with.
        requested: u32,
        /// Capacity stored with the semaphore.
        current: u32,
    },
    /// A tenant holds or waits with a weight or cap other than those this request names
    /// (see [`Tenant`](crate::Tenant)): callers configured the tenant differently.
    #[error(
        "tenant {tenant:?} of {name:?} asks for weight {requested_weight} and cap {}, but weight {weight} and cap {} are in force while it holds or waits",
        cap_text(*requested_cap),
        cap_text(*cap)
    )]
    TenantConflict {
        /// Name of the semaphore.
        name: String,
        /// The tenant.
        tenant: String,
        /// The weight this request named.
        requested_weight: u32,
        /// The cap this request named.
        requested_cap: Option<u32>,
        /// The weight in force.
        weight: u32,
        /// The cap in force.
        cap: Option<u32>,
    },
    /// With one permit per label, the label already holds (or waits for) a permit.
    #[error("{name:?} already held by {label:?}")]
    AlreadyHeld {
        /// Name of the semaphore.
        name: String,
        /// The holder label.
        label: String,
    },
    /// An argument was rejected before anything was sent to Redis.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A key where redsem keeps its state holds a value of another type; it was left untouched.
    #[error("key {key:?} holds a {actual}, expected a {expected}; left untouched")]
    WrongType {
        /// The key.
        key: String,
        /// The type found.
        actual: String,
        /// The type redsem keeps there.
        expected: String,
    },
    /// The primitive's state vanished from Redis while a call relied on it: a restart without
    /// persistence, a failover to a replica that had not received it, a `FLUSHALL`, or
    /// eviction. Nothing was granted or opened because of it.
    #[error("the state of {name:?} was lost by the Redis server ({detail})")]
    StateLost {
        /// Name of the primitive.
        name: String,
        /// What was found missing.
        detail: String,
    },
    /// The server (or the user redsem logs in as) is set up so that redsem's guarantees would
    /// not hold: an eviction policy that may drop live state, or missing ACL rights on redsem's
    /// keys, channels or commands. Found when connecting; see `RedsemOptions`.
    #[error("redis server not suitable for redsem: {setting}: {problem}")]
    Unsuitable {
        /// The setting or right concerned, e.g. `maxmemory-policy` or `ACL channels`.
        setting: String,
        /// What is wrong and what to change.
        problem: String,
    },
    /// The engine asked for ([`RedsemOptions::engine`](crate::RedsemOptions::engine):
    /// [`Engine::Native`](crate::Engine::Native)) cannot serve on `node`: it has no redsem
    /// module (`REDSEM.ENGINE` unknown), the user may not run the module's commands, or its
    /// module serves another version of the protocol. Found when connecting; nothing was
    /// written. Load the module (`redis-server --loadmodule libredsem_module.so`), allow its
    /// commands, or connect with [`Engine::Auto`](crate::Engine::Auto).
    #[error("the {asked} engine was asked for, but {node} cannot serve it: {reply}")]
    EngineUnavailable {
        /// The engine asked for.
        asked: crate::Engine,
        /// The server that cannot serve it (`host:port`).
        node: String,
        /// What it answered to `REDSEM.ENGINE`, and what that means.
        reply: String,
    },
    /// With [`RedsemOptions::replica_acks`](crate::RedsemOptions::replica_acks), the `WAIT`
    /// sent with a change found fewer replicas than asked for holding it when its timeout ran
    /// out. The change was applied on the primary, but a failover may lose it.
    ///
    /// What that means depends on the call:
    ///
    /// * **A grant** (`acquire`, `try_acquire`, a queued request granted): it was given back
    ///   at once (with the same request id: a release applied at most once), so nothing is
    ///   held and nobody else is kept waiting for it.
    /// * **A renewal**: the lease was extended on the primary, but the holder does not count
    ///   on it; the permit's local validity is not moved and the keepalive tries again. If no
    ///   renewal is acknowledged before the lease runs out, the permit is reported lost.
    /// * **A release** (or another change: a count-down, added permits, a new capacity): it
    ///   is in force on the primary, and waiters may already have been granted what it freed;
    ///   only a failover to a replica that never received it can undo it. Do not send it
    ///   again to make sure: a release or count-down resent with a new request id would be
    ///   applied twice.
    #[error("change acknowledged by {acked} of the {wanted} replicas asked for")]
    NotReplicated {
        /// Replicas that acknowledged the change within the timeout.
        acked: usize,
        /// Replicas asked for.
        wanted: usize,
    },
    /// A script answered in a shape redsem does not understand (a bug or a foreign script).
    #[error("unexpected reply from {script}: {detail}")]
    Protocol {
        /// Which script.
        script: &'static str,
        /// What was wrong.
        detail: String,
    },
    /// The state in Redis was written by a version of redsem that keeps it in another
    /// layout; it was left untouched. Clients of two layouts cannot share a primitive: stop
    /// the old clients, let the primitive drain (or delete it), then start the new ones
    /// (README, "Upgrading").
    #[error(
        "the state at {key:?} has layout {found}, this version of redsem reads layout {ours}: \
         drain it, then upgrade every client"
    )]
    Incompatible {
        /// The state key.
        key: String,
        /// The layout found there.
        found: String,
        /// The layout this version reads and writes.
        ours: String,
    },
}

impl Error {
    /// True when the request could not be granted: [`Error::NoPermit`],
    /// [`Error::NotEnoughPermits`] or [`Error::Timeout`].
    pub fn is_not_acquired(&self) -> bool {
        matches!(
            self,
            Error::NoPermit { .. } | Error::NotEnoughPermits { .. } | Error::Timeout { .. }
        )
    }

    /// True for [`Error::Timeout`].
    pub fn is_timeout(&self) -> bool {
        matches!(self, Error::Timeout { .. })
    }

    /// True for [`Error::NotHeld`] and [`Error::LeaseLost`].
    pub fn is_not_held(&self) -> bool {
        matches!(self, Error::NotHeld { .. } | Error::LeaseLost { .. })
    }

    /// True when Redis could not be reached.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, Error::Unavailable(_))
    }

    /// True for [`Error::InvalidArgument`].
    pub fn is_invalid_argument(&self) -> bool {
        matches!(self, Error::InvalidArgument(_))
    }

    /// True for [`Error::NotReplicated`]: a change the primary applied, not acknowledged by
    /// enough replicas in time.
    pub fn is_not_replicated(&self) -> bool {
        matches!(self, Error::NotReplicated { .. })
    }
}

impl Error {
    /// The same error again, for each of several callers that one failed call answered (a
    /// group commit). The variants a script call can fail with are copied; any other is
    /// described in a [`Error::Protocol`].
    pub(crate) fn duplicate(&self) -> Error {
        match self {
            Error::Unavailable(e) => Error::Unavailable(e.clone()),
            Error::Redis(e) => Error::Redis(e.clone()),
            Error::NotReplicated { acked, wanted } => Error::NotReplicated {
                acked: *acked,
                wanted: *wanted,
            },
            Error::WrongType {
                key,
                actual,
                expected,
            } => Error::WrongType {
                key: key.clone(),
                actual: actual.clone(),
                expected: expected.clone(),
            },
            Error::Incompatible { key, found, ours } => Error::Incompatible {
                key: key.clone(),
                found: found.clone(),
                ours: ours.clone(),
            },
            Error::Protocol { script, detail } => Error::Protocol {
                script,
                detail: detail.clone(),
            },
            other => Error::Protocol {
                script: "lease_batch",
                detail: Chain(other).to_string(),
            },
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(err: redis::RedisError) -> Self {
        if err.is_io_error()
            || err.is_connection_refusal()
            || err.is_connection_dropped()
            || err.is_timeout()
        {
            Error::Unavailable(err)
        } else {
            Error::Redis(err)
        }
    }
}

pub(crate) fn invalid(msg: impl Into<String>) -> Error {
    Error::InvalidArgument(msg.into())
}

/// An error and every `source()` below it, joined by ": " — for logs, where the messages
/// themselves leave the cause to the chain.
pub(crate) struct Chain<'a>(pub(crate) &'a Error);

impl std::fmt::Display for Chain<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)?;
        let mut source = std::error::Error::source(self.0);
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

/// A tenant's cap as an error message says it.
fn cap_text(cap: Option<u32>) -> String {
    cap.map_or_else(|| "none".to_owned(), |c| c.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_values() {
        let err = Error::CapacityConflict {
            name: "jobs".into(),
            requested: 5,
            current: 3,
        };
        assert_eq!(
            err.to_string(),
            "capacity 5 of \"jobs\" differs from capacity 3 in force"
        );
        let err = Error::NoPermit {
            name: "jobs".into(),
            capacity: 2,
            in_use: 2,
            waiters: 1,
        };
        assert!(err.is_not_acquired());
        assert!(err.to_string().contains("2 of 2 in use, 1 waiting"));
    }

    #[test]
    fn the_chain_for_logs_carries_the_cause() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused here");
        let err = Error::from(redis::RedisError::from(io));
        let chain = Chain(&err).to_string();
        assert!(chain.starts_with(&err.to_string()), "{chain}");
        assert!(chain.contains("refused here"), "{chain}");
    }

    #[test]
    fn connection_refusal_is_unavailable() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = Error::from(redis::RedisError::from(io));
        assert!(err.is_unavailable(), "{err:?}");
        assert!(std::error::Error::source(&err).is_some());
    }

    #[test]
    fn messages_do_not_repeat_their_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = Error::from(redis::RedisError::from(io));
        let source = std::error::Error::source(&err).map(ToString::to_string);
        assert_eq!(err.to_string(), "redis unavailable");
        assert!(source.is_some_and(|s| s.contains("refused")));
        let err = Error::Redis(redis::RedisError::from((
            redis::ErrorKind::Parse,
            "unexpected byte",
        )));
        assert_eq!(err.to_string(), "redis error");
    }
}
