//! Replica acknowledgements: the `WAIT` that goes with a change, and how its answer is
//! judged.
//!
//! A call that changes state goes by [`Call::invoke_acked`](super::library::Call::invoke_acked): where the connection asks for
//! replica acknowledgements (`RedsemOptions::replica_acks`), each `FCALL`, `EVALSHA` or
//! `REDSEM.<OPERATION>` is sent
//! in one pipeline with `WAIT replicas timeout`. Redis answers `WAIT` after the commands sent
//! before it on the same connection, so it counts the replicas holding the script's writes;
//! on a cluster, redis-rs sends a pipeline to the node of its first command with a key (the
//! script's), and a keyless `WAIT` goes with it.
//!
//! A shortfall is not an error of the call here but [`Acked::unconfirmed`]: the wrapper that
//! made the change decides (a grant is given back first; any other change fails, applied).

use std::sync::atomic::AtomicBool;

use redis::aio::ConnectionLike;
use redis::{Cmd, ErrorKind, Pipeline, RedisError, RedisFuture, RedisResult, Value};

use crate::engine::EngineState;
use crate::error::Error;
use crate::types::ReplicaAcks;

/// A connection and the replica acknowledgements its client asks for (what
/// `Redsem::conn` hands out).
#[derive(Clone)]
pub(crate) struct Acking<C> {
    pub(crate) conn: C,
    pub(crate) acks: Option<ReplicaAcks>,
}

impl<C: ConnectionLike> ConnectionLike for Acking<C> {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        self.conn.req_packed_command(cmd)
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        self.conn.req_packed_commands(pipeline, offset, count)
    }

    fn get_db(&self) -> i64 {
        self.conn.get_db()
    }
}

impl<C: Scripting> Scripting for Acking<C> {
    fn functions_refused(&self) -> Option<&AtomicBool> {
        self.conn.functions_refused()
    }

    fn replica_acks(&self) -> Option<ReplicaAcks> {
        self.acks
    }

    fn engine(&self) -> Option<&EngineState> {
        self.conn.engine()
    }
}

/// The reply of a change, and whether the replicas asked for acknowledged it.
#[derive(Debug)]
pub(crate) struct Acked {
    pub(crate) reply: Value,
    /// Why the change is not confirmed: [`Error::NotReplicated`], or the error `WAIT`
    /// answered; `None` when confirmed or when no acknowledgement was asked for.
    pub(crate) unconfirmed: Option<Error>,
}

/// One command's answer and, if a `WAIT` went with it, the `WAIT`'s.
pub(super) struct Sent {
    pub(super) reply: RedisResult<Value>,
    pub(super) wait: Option<RedisResult<Value>>,
}

/// Send `cmd`, followed in the same pipeline by `WAIT` when `acks` asks for it.
pub(super) async fn send(conn: &mut impl Scripting, cmd: &Cmd, acks: Option<ReplicaAcks>) -> Sent {
    let Some(acks) = acks else {
        return Sent {
            reply: cmd.query_async(conn).await,
            wait: None,
        };
    };
    let mut pipe = redis::pipe();
    // Each reply on its own: an error of the script must not hide the WAIT's, nor the other
    // way round (a refused WAIT must not pass for a refused FCALL and have it sent again).
    pipe.ignore_errors();
    pipe.add_command(cmd.clone());
    pipe.cmd("WAIT").arg(acks.replicas).arg(
        u64::try_from(acks.timeout.as_millis())
            .unwrap_or(u64::MAX)
            .max(1),
    );
    match pipe.query_async::<Vec<RedisResult<Value>>>(conn).await {
        Ok(replies) => {
            let mut replies = replies.into_iter();
            let reply = replies.next().unwrap_or_else(|| {
                Err(RedisError::from((
                    ErrorKind::Parse,
                    "no reply to the script in the WAIT pipeline",
                )))
            });
            Sent {
                reply,
                wait: replies.next(),
            }
        }
        Err(err) => Sent {
            reply: Err(err),
            wait: None,
        },
    }
}

/// What `WAIT` answered, against what `acks` asked for: `None` when enough replicas
/// acknowledged.
pub(super) fn shortfall(acks: ReplicaAcks, wait: Option<RedisResult<Value>>) -> Option<Error> {
    let wanted = acks.replicas;
    match wait {
        Some(Ok(Value::Int(n))) => {
            let acked = usize::try_from(n).unwrap_or(0);
            (acked < wanted).then_some(Error::NotReplicated { acked, wanted })
        }
        Some(Ok(other)) => Some(Error::Protocol {
            script: "WAIT",
            detail: format!("expected an integer, got {other:?}"),
        }),
        Some(Err(err)) => Some(err.into()),
        None => Some(Error::Protocol {
            script: "WAIT",
            detail: "no reply".into(),
        }),
    }
}

/// A connection scripts run on.
pub(crate) trait Scripting: ConnectionLike + Send {
    /// Where this connection remembers that its server refuses functions; `None`: try them on
    /// every call.
    fn functions_refused(&self) -> Option<&AtomicBool> {
        None
    }

    /// The replica acknowledgements each change waits for; `None`: no `WAIT`.
    fn replica_acks(&self) -> Option<ReplicaAcks> {
        None
    }

    /// Whether calls go to redsem's module (`REDSEM.<OPERATION>`) rather than the Lua
    /// library, and where a call that finds the module gone switches this connection to the
    /// scripts; `None`: always the scripts.
    fn engine(&self) -> Option<&EngineState> {
        None
    }
}

impl Scripting for redis::aio::MultiplexedConnection {}

#[cfg(feature = "cluster")]
impl Scripting for redis::cluster_async::ClusterConnection {}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use redis::ServerErrorKind;

    use super::*;

    const ONE: ReplicaAcks = ReplicaAcks {
        replicas: 1,
        timeout: Duration::from_millis(100),
    };

    #[test]
    fn a_wait_that_counts_enough_replicas_confirms_the_change() {
        assert!(shortfall(ONE, Some(Ok(Value::Int(1)))).is_none());
        assert!(shortfall(ONE, Some(Ok(Value::Int(2)))).is_none());
    }

    #[test]
    fn a_wait_short_of_replicas_or_failing_leaves_the_change_unconfirmed() {
        assert!(matches!(
            shortfall(ONE, Some(Ok(Value::Int(0)))),
            Some(Error::NotReplicated {
                acked: 0,
                wanted: 1
            })
        ));
        let refused = RedisError::from((ErrorKind::Server(ServerErrorKind::NoPerm), "no WAIT"));
        assert!(matches!(
            shortfall(ONE, Some(Err(refused))),
            Some(Error::Redis(_))
        ));
        assert!(matches!(
            shortfall(ONE, Some(Ok(Value::Nil))),
            Some(Error::Protocol { .. })
        ));
        assert!(matches!(shortfall(ONE, None), Some(Error::Protocol { .. })));
    }
}
