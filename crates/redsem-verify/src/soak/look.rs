//! Looks at the server beside the clients: what it stores for a grant, and who it lists as
//! holding or waiting, read on a connection of its own that bypasses the proxies.

use std::sync::Arc;
use std::time::Duration;

use redis::aio::MultiplexedConnection;

/// A client's connection for looks at the server (no proxy), shared by its tasks and the
/// looks they leave to run later.
pub type Looker = Arc<tokio::sync::Mutex<Auditor>>;

/// Reads a grant's lease end and the server's `TIME` in one transaction, on a connection of
/// its own that bypasses the proxies (made again after a fault cut it).
pub struct Auditor {
    client: redis::Client,
    con: Option<MultiplexedConnection>,
}

/// What a look reads: `TIME` (seconds, microseconds) and the lease end's score, if any.
type Look = ((u64, u64), Option<f64>);

/// How long a look at the server may take before it is given up (unrecorded).
const LOOK_LIMIT: Duration = Duration::from_millis(500);

impl Auditor {
    pub fn new(url: &str) -> Option<Auditor> {
        Some(Auditor {
            client: redis::Client::open(url).ok()?,
            con: None,
        })
    }

    /// The connection of the looks, made (again) if there is none; `None` if it cannot be made
    /// within `LOOK_LIMIT`.
    async fn connection(&mut self) -> Option<&mut MultiplexedConnection> {
        if self.con.is_none() {
            let made =
                tokio::time::timeout(LOOK_LIMIT, self.client.get_multiplexed_async_connection())
                    .await;
            self.con = made.ok().and_then(Result::ok);
        }
        self.con.as_mut()
    }

    /// `TIME` in µs and the score of `id` in `key`, or `None` if the server could not be
    /// asked.
    pub async fn look(&mut self, key: &str, id: &str) -> Option<(u64, Option<i64>)> {
        let con = self.connection().await?;
        let mut pipe = redis::pipe();
        pipe.atomic().cmd("TIME").cmd("ZSCORE").arg(key).arg(id);
        let read: Result<redis::RedisResult<Look>, _> =
            tokio::time::timeout(LOOK_LIMIT, pipe.query_async(con)).await;
        match read {
            Ok(Ok(((secs, micros), score))) => {
                // (Scores are whole milliseconds, exact in an f64.)
                #[allow(clippy::cast_possible_truncation)]
                let end = score.map(|s| s as i64);
                Some((secs * 1_000_000 + micros, end))
            }
            _ => {
                self.con = None;
                None
            }
        }
    }
}

impl Auditor {
    /// `TIME` in µs, the ids with a positive score in `name`'s `leases` (holders and waiters;
    /// session records are negative) and the ids in its `queue`, read in one transaction;
    /// `None` if the server could not be asked.
    pub async fn list(&mut self, name: &str) -> Option<(u64, Vec<String>, Vec<String>)> {
        let con = self.connection().await?;
        let mut pipe = redis::pipe();
        pipe.atomic()
            .cmd("TIME")
            .cmd("ZRANGEBYSCORE")
            .arg(leases_key(name))
            .arg("(0")
            .arg("+inf")
            .cmd("ZRANGE")
            .arg(format!("redsem:{{lease:{name}}}:queue"))
            .arg(0)
            .arg(-1);
        type Listed = ((u64, u64), Vec<String>, Vec<String>);
        let read: Result<redis::RedisResult<Listed>, _> =
            tokio::time::timeout(LOOK_LIMIT, pipe.query_async(con)).await;
        match read {
            Ok(Ok(((secs, micros), leased, queued))) => {
                Some((secs * 1_000_000 + micros, leased, queued))
            }
            _ => {
                self.con = None;
                None
            }
        }
    }
}

/// The `leases` key of the lease semaphore `name` (crates/redsem/src/keys.rs, default prefix).
pub fn leases_key(name: &str) -> String {
    format!("redsem:{{lease:{name}}}:leases")
}
