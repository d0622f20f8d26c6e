//! [`RedsemOptions`], the options of a connection, and [`ServerChecks`], what it does about
//! a server set up so that redsem's guarantees would not hold.

use std::time::Duration;

#[cfg(doc)]
use super::Redsem;
use crate::engine::Engine;
use crate::keys;
use crate::observe::MetricNames;
use crate::types::ReplicaAcks;

/// Options for [`Redsem::connect_with`].
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RedsemOptions {
    /// Every key and channel redsem writes starts with this (default `redsem`).
    pub prefix: String,
    /// How long one connection attempt may take (default 2 s).
    pub connect_timeout: Duration,
    /// How long one command may take before it fails as unavailable (default 5 s).
    pub response_timeout: Duration,
    /// For `rediss://`: trust only the CA certificates in this PEM file instead of the
    /// system's (default none: the system's roots and the webpki roots).
    pub tls_root_cert: Option<std::path::PathBuf>,
    /// What to do when the server is set up so that redsem's guarantees would not hold
    /// (default [`ServerChecks::Enforce`]).
    pub server_checks: ServerChecks,
    /// Which primitive names the metrics carry in their `name` label (default
    /// [`MetricNames::Each`]): see [`MetricNames`] to bound the label cardinality.
    pub metric_names: MetricNames,
    /// Confirm every change with `WAIT` (default none): see
    /// [`RedsemOptions::replica_acks`].
    pub replica_acks: Option<ReplicaAcks>,
    /// Send the lease operations this client's tasks have in flight on one semaphore
    /// together (default on): see [`RedsemOptions::group_commit`].
    pub group_commit: bool,
    /// Which engine runs the operations on the server: redsem's module where the server
    /// has it, or the Lua scripts (default [`Engine::Auto`]): see
    /// [`RedsemOptions::engine`].
    pub engine: Engine,
}

/// What [`Redsem::connect_with`] and [`Redsem::connect_cluster_with`] do about a server (or
/// a user) set up so that redsem's guarantees would not hold.
///
/// The checks take one pipelined round trip per node (on a cluster, per primary: ACLs and
/// settings are per node) and write no data:
///
/// * **Eviction policy**, read from `INFO memory` (so it works where `CONFIG` is disabled, as on
///   most managed services). An `allkeys-*` policy lets Redis evict the state of held permits
///   when memory is full, after which a unit can be granted twice: refused. `noeviction` is the
///   safest (when memory is full, writes fail with an OOM error, which redsem reports as
///   [`Error::Redis`](crate::Error::Redis), and nothing is lost); `volatile-*` policies are
///   accepted, since only idle redsem state carries a TTL. If `INFO` is refused by the ACL the
///   policy is unknown and a warning is logged.
/// * **ACL rights**: an `EVALSHA` (after `SCRIPT LOAD`) of a probe script naming a key and a
///   channel under the prefix, which asks `redis.acl_check_cmd` (Redis 7) whether the user may
///   run every command redsem's scripts run on redsem's keys, and `PUBLISH`, `SUBSCRIBE`,
///   `UNSUBSCRIBE` on its channels. A refusal of a key, a channel or a command is reported with
///   the pattern or command to allow. A user that lacks them would otherwise fail on its first
///   call, or worse, halfway through a waiter's hand-off.
///
/// What a user needs, for the default prefix `redsem` (verified by running every primitive,
/// waits included, as exactly this user):
///
/// ```text
/// ACL SETUSER app on >password resetkeys ~redsem:* resetchannels &redsem:* -@all +@read +@write +@scripting -@dangerous +@pubsub +ping +info +time
/// ```
///
/// `+@pubsub` covers `PUBLISH`/`SUBSCRIBE` and, on a Redis Cluster, the sharded
/// `SPUBLISH`/`SSUBSCRIBE` the wake-ups go by there (the channel pattern confines it to
/// redsem's channels); it is a category, so Redis 6, which lacks the sharded commands, takes
/// the same line. [`RedsemOptions::acl_rules`] gives the part after the password for any prefix. On a
/// Redis Cluster also allow `+cluster|slots +cluster|nodes` (topology, and the list of
/// primaries to check). `+info` is optional: without it the eviction policy is not checked.
/// Key and channel patterns confine `@read`/`@write` to redsem's keys; `-@dangerous` takes
/// away `FLUSHALL`, `KEYS`, `CONFIG` and the like.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> redsem::Result<()> {
/// use redsem::{Redsem, RedsemOptions, ServerChecks};
/// // A shared cache with `allkeys-lru`: accept the risk, with a warning in the log.
/// let redsem = Redsem::connect_with(
///     "redis://cache.internal:6379",
///     RedsemOptions::default().server_checks(ServerChecks::Warn),
/// )
/// .await?;
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum ServerChecks {
    /// Refuse to connect with [`Error::Unsuitable`](crate::Error::Unsuitable) (the default).
    /// What cannot be checked (`INFO` refused) is logged as a warning.
    #[default]
    Enforce,
    /// Check, and log each problem as a `tracing` warning; connect anyway.
    Warn,
    /// Do not check (no extra round trip).
    Off,
}

impl Default for RedsemOptions {
    fn default() -> Self {
        RedsemOptions {
            prefix: "redsem".to_owned(),
            connect_timeout: Duration::from_secs(2),
            response_timeout: Duration::from_secs(5),
            tls_root_cert: None,
            server_checks: ServerChecks::Enforce,
            metric_names: MetricNames::Each,
            replica_acks: None,
            group_commit: true,
            engine: Engine::Auto,
        }
    }
}

impl RedsemOptions {
    /// Set the key prefix.
    #[must_use]
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// Set the connect timeout.
    #[must_use]
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.connect_timeout = timeout;
        self
    }

    /// Trust the CA certificates in the PEM file at `path` for `rediss://` connections: to one
    /// server, and to every node of a cluster (`rediss+cluster://`, or TLS seeds of
    /// [`Redsem::connect_cluster_with`](crate::Redsem::connect_cluster_with)). Not yet through
    /// Sentinels: connecting refuses it there (`InvalidArgument`).
    #[must_use]
    pub fn tls_root_cert(mut self, path: impl Into<std::path::PathBuf>) -> Self {
        self.tls_root_cert = Some(path.into());
        self
    }

    /// Set what to do about a server set up so that redsem's guarantees would not hold (see
    /// [`ServerChecks`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use redsem::{RedsemOptions, ServerChecks};
    /// let options = RedsemOptions::default().server_checks(ServerChecks::Warn);
    /// assert_eq!(options.server_checks, ServerChecks::Warn);
    /// ```
    #[must_use]
    pub fn server_checks(mut self, checks: ServerChecks) -> Self {
        self.server_checks = checks;
        self
    }

    /// The ACL rules a Redis user needs to use redsem with this prefix, to put after
    /// `ACL SETUSER <user> on ><password>` (see [`ServerChecks`]). With
    /// [`replica_acks`](Self::replica_acks) set they end in `+wait`; with
    /// [`engine`](Self::engine) [`Engine::Native`], in the module's commands, each by name
    /// (`ACL SETUSER` refuses them where the module is not loaded).
    ///
    /// # Examples
    ///
    /// ```
    /// use redsem::RedsemOptions;
    /// let rules = RedsemOptions::default().prefix("app").acl_rules();
    /// assert!(rules.starts_with("resetkeys ~app:* resetchannels &app:* -@all"));
    /// let acked = RedsemOptions::default().replica_acks(1, std::time::Duration::from_millis(100));
    /// assert!(acked.acl_rules().ends_with(" +wait"));
    /// ```
    pub fn acl_rules(&self) -> String {
        let prefix = keys::escape_glob(&self.prefix);
        let wait = if self.replica_acks.is_some() {
            " +wait"
        } else {
            ""
        };
        let mut rules = format!(
            "resetkeys ~{prefix}:* resetchannels &{prefix}:* -@all +@read +@write +@scripting \
             -@dangerous +@pubsub +ping +info +time{wait}"
        );
        if self.engine == Engine::Native {
            for (operation, _) in crate::script::protocol_operations() {
                rules.push_str(" +redsem.");
                rules.push_str(operation);
            }
            rules.push_str(" +redsem.engine");
        }
        rules
    }

    /// Set which primitive names the metrics carry in their `name` label (see
    /// [`MetricNames`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use redsem::{MetricNames, RedsemOptions};
    /// // Names made per job would make one time series each: hide them.
    /// let options = RedsemOptions::default().metric_names(MetricNames::Hidden);
    /// assert!(!options.metric_names.shows("job-81723"));
    /// ```
    #[must_use]
    pub fn metric_names(mut self, names: MetricNames) -> Self {
        self.metric_names = names;
        self
    }

    /// Set the per-command response timeout.
    #[must_use]
    pub fn response_timeout(mut self, timeout: Duration) -> Self {
        self.response_timeout = timeout;
        self
    }

    /// Have every grant, renewal and release confirmed by `replicas` replicas of the primary,
    /// waiting at most `timeout` for them; `replicas` 0 turns it off (the default).
    ///
    /// Redis replicates asynchronously: a grant the primary made and answered may not have
    /// reached any replica when the primary fails, and the replica promoted in its place
    /// (by Sentinel, a cluster failover, a managed service) knows nothing of it and grants the
    /// same unit again. With this option each call that changes state (the scripts of an
    /// acquire, a renewal, a release, a cancelled request, a count-down, added or drained
    /// permits, a new capacity) is sent in one pipeline with `WAIT replicas timeout`, in the
    /// same round trip, on the node that ran it. When fewer replicas acknowledged it in time:
    ///
    /// * a **grant** is given back at once (released with its own request id, so at most once)
    ///   and the call fails with [`Error::NotReplicated`](crate::Error::NotReplicated): nothing
    ///   is held, and the unit is free for the next request;
    /// * a **renewal** fails with that error: the holder does not count on the new lease, the
    ///   keepalive tries again, and the permit is reported lost if none is acknowledged before
    ///   its lease ends;
    /// * a **release** (or count-down, ...) fails with that error although the primary applied
    ///   it: only a failover to a replica that missed it can undo it.
    ///
    /// Reads (status, available permits, latch state) send no `WAIT`. A waiter's check-in
    /// does: it writes (it renews the waiter's place) and it is how a waiter collects its
    /// grant, so with this option a waiter takes a grant only from a check-in the replicas
    /// acknowledged, never from the wake-up message alone.
    ///
    /// What it costs and what it does not cover:
    ///
    /// * A round trip lasts until the replicas acknowledged (about one more round trip to the
    ///   slowest of the `replicas` fastest replicas). `docs/BENCHMARKS.md` has the figures.
    /// * `WAIT` blocks the connection it runs on, and every call of one [`Redsem`] shares one
    ///   connection (per node): while replicas lag, the calls of this client are served one
    ///   `timeout` after the other. Keep `timeout` short next to the leases (a renewal stuck
    ///   behind others can make a permit lost), and well under the response timeout (5 s by
    ///   default), or the calls fail as [`Error::Unavailable`](crate::Error::Unavailable).
    /// * An acknowledged change is in the replicas' memory, not on their disks; and a replica
    ///   that acknowledged may still not be the one promoted. It narrows the window in which a
    ///   failover loses a grant; it does not make Redis a consensus system.
    /// * `WAIT` counts the replicas holding what its own connection wrote. A change resent
    ///   after a lost reply (the connection dropped) that the script answers from its memory
    ///   of the first attempt, writing nothing, is confirmed on the new connection without
    ///   telling whether the first attempt's write reached the replicas. The same holds for
    ///   the caller's own second try after [`Error::NotReplicated`](crate::Error::NotReplicated):
    ///   the change is on the primary, so `try_set_count` (or `try_set_permits`) answers
    ///   `false`, "already set", from the unacknowledged set, and a failover can still lose
    ///   it. Until a later change is acknowledged, treat such a change as uncertain.
    /// * The user needs the right to run `WAIT` (`+wait`; [`acl_rules`](Self::acl_rules) adds
    ///   it when this option is set).
    ///
    /// A `timeout` of zero is taken as 1 ms (`WAIT` with 0 would wait forever). It must be
    /// shorter than [`response_timeout`](Self::response_timeout): `WAIT` holds the answer back
    /// for up to `timeout`, and a call whose answer comes after the response timeout would be
    /// reported as failed although the primary applied it; connecting with such options fails
    /// with [`Error::InvalidArgument`](crate::Error::InvalidArgument).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> redsem::Result<()> {
    /// use std::time::Duration;
    /// use redsem::{Error, Redsem, RedsemOptions};
    /// let options = RedsemOptions::default().replica_acks(1, Duration::from_millis(100));
    /// let redsem = Redsem::connect_with("redis://127.0.0.1:6379", options).await?;
    /// let jobs = redsem.lease_semaphore("exports", 2)?;
    /// match jobs.try_acquire().await {
    ///     Ok(permit) => permit.release().await?,
    ///     // No replica took the grant in time: it was given back, nothing is held.
    ///     Err(Error::NotReplicated { acked, wanted }) => {
    ///         eprintln!("only {acked} of {wanted} replicas answered; try later");
    ///     }
    ///     Err(other) => return Err(other),
    /// }
    /// # Ok(())
    /// # }
    /// ```
    #[must_use]
    pub fn replica_acks(mut self, replicas: usize, timeout: Duration) -> Self {
        self.replica_acks = (replicas > 0).then_some(ReplicaAcks {
            replicas,
            timeout: timeout.max(Duration::from_millis(1)),
        });
        self
    }

    /// Group commit (default on): the acquires, releases and withdrawals that this
    /// client's tasks have in flight on one lease or permit semaphore go to Redis in one call, which
    /// reads the time and the state once and writes back once, applying them in order with
    /// the outcomes each would have had alone. It costs Redis less per operation when many
    /// tasks share a semaphore, and nothing when one does: no call waits for a batch to fill
    /// (see `docs/DESIGN.md`, "Group commit"). Off: one call per operation.
    ///
    /// # Examples
    ///
    /// ```
    /// let options = redsem::RedsemOptions::default().group_commit(false);
    /// assert!(!options.group_commit);
    /// ```
    #[must_use]
    pub fn group_commit(mut self, on: bool) -> Self {
        self.group_commit = on;
        self
    }

    /// Choose the engine that runs the operations on the server (see [`Engine`]): with
    /// [`Engine::Auto`] (the default) the connect sends one `REDSEM.ENGINE` and uses redsem's
    /// module where every server (on a cluster, every primary) has it, the Lua scripts
    /// otherwise; [`Engine::Native`] refuses to connect without the module
    /// ([`Error::EngineUnavailable`](crate::Error::EngineUnavailable)); [`Engine::Scripts`]
    /// never uses it. [`Redsem::engine`] says which one serves.
    ///
    /// Both engines answer every call alike on the same keys, so clients of either kind can
    /// share a semaphore. A call that finds the module gone (behind Sentinels, a failover to
    /// a server without it) is sent again as a script, and so is every later call of that
    /// client.
    ///
    /// The module's commands have no ACL category on Redis 7.0: a user needs them allowed by
    /// name (`+redsem.engine +redsem.lease_acquire ...`; [`acl_rules`](Self::acl_rules) lists
    /// them with [`Engine::Native`]). Under an ACL that does not allow `REDSEM.ENGINE`,
    /// [`Engine::Auto`] serves by the scripts.
    ///
    /// # Examples
    ///
    /// ```
    /// use redsem::{Engine, RedsemOptions};
    /// let options = RedsemOptions::default().engine(Engine::Native);
    /// assert_eq!(options.engine, Engine::Native);
    /// assert!(options.acl_rules().ends_with(" +redsem.engine"));
    /// ```
    #[must_use]
    pub fn engine(mut self, engine: Engine) -> Self {
        self.engine = engine;
        self
    }

    /// Why these options cannot be used to connect, if they cannot.
    pub(crate) fn problem(&self) -> Option<String> {
        if let Some(why) = crate::keys::prefix_problem(&self.prefix) {
            return Some(why);
        }
        match self.replica_acks {
            Some(acks) if acks.timeout >= self.response_timeout => Some(format!(
                "the replica acknowledgement timeout {:?} must be shorter than the response \
                 timeout {:?}: a call waiting that long for replicas would be reported as \
                 failed although the primary applied it",
                acks.timeout, self.response_timeout
            )),
            _ => None,
        }
    }
}
