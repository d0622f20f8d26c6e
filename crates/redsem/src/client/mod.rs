//! `Redsem`, the entry point: one command connection, one pub/sub connection, shared by
//! every primitive and task made from it.
//!
//! Here: the handle and what it shares ([`Shared`]: connections, notifier, keepalive,
//! background clean-up), `flush`, and the listing of semaphores. Beside it: `options.rs`
//! ([`RedsemOptions`], [`ServerChecks`]), `connect.rs` (connecting to one server or a
//! cluster), `sentinel.rs` (through Sentinels), `checks.rs` (the server checks and their
//! findings). The factory methods of the primitives are in `crate::factory`.

mod checks;
mod connect;
mod engine;
mod options;
#[cfg(feature = "sentinel")]
mod sentinel;

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

pub use checks::{ServerFinding, Verdict};
pub use options::{RedsemOptions, ServerChecks};

pub(crate) use crate::conn::Conn;
use crate::error::Result;
use crate::keepalive::Keepalive;
use crate::keys;
use crate::notify::Notifier;
use crate::observe::MetricNames;
pub use crate::types::ReplicaAcks;

/// How long after a release that left a semaphore idle its keys get their TTL.
const TIDY_AFTER: Duration = Duration::from_secs(1);

/// Every key matching `pattern` on the node behind `conn`, with `SCAN` (never `KEYS`).
async fn scan(
    conn: &mut impl redis::aio::ConnectionLike,
    pattern: &str,
    found: &mut Vec<String>,
) -> Result<()> {
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(pattern)
            .arg("COUNT")
            .arg(500)
            .query_async(conn)
            .await?;
        found.extend(batch);
        if next == 0 {
            return Ok(());
        }
        cursor = next;
    }
}

/// A handle to one Redis deployment: the entry point of redsem.
///
/// It owns one multiplexed, auto-reconnecting command connection and, once something waits,
/// one pub/sub connection; every primitive and permit made from it shares both. Cloning is
/// cheap (an `Arc`); the connections close when the last clone and the last permit are gone.
///
/// # Examples
///
/// ```no_run
/// # async fn example() -> redsem::Result<()> {
/// let redsem = redsem::Redsem::connect("redis://127.0.0.1:6379").await?;
/// let jobs = redsem.lease_semaphore("nightly-export", 2)?;
/// let permit = jobs.try_acquire().await?;
/// println!("token {} slot {}", permit.token(), permit.slot());
/// permit.release().await?;
/// # Ok(())
/// # }
/// ```
#[derive(Clone)]
pub struct Redsem {
    pub(crate) shared: Arc<Shared>,
}

pub(crate) struct Shared {
    pub(crate) conn: Conn,
    /// Where the pub/sub connection may go: the server, or each seed node of a cluster
    /// (a cluster forwards every PUBLISH to every node).
    pub(crate) pubsub_clients: Vec<redis::Client>,
    pub(crate) prefix: String,
    /// Which names the metrics show.
    pub(crate) metric_names: MetricNames,
    /// The replica acknowledgements every change waits for.
    pub(crate) replica_acks: Option<ReplicaAcks>,
    /// The channel on which this client's queued requests are told they were granted.
    pub(crate) wake_channel: String,
    /// Whether wake-ups go by sharded pub/sub: on a cluster whose primaries all have it.
    sharded_pubsub: bool,
    /// The client's session: the sequence numbers of its retry-safe calls.
    pub(crate) session: Arc<crate::session::Session>,
    notifier: OnceCell<Notifier>,
    /// Cancelled when the last handle goes: stops the pub/sub task.
    pub(crate) closed: CancellationToken,
    /// Releases and withdrawals sent in the background from `Drop`.
    background: TaskTracker,
    /// Renews the lease permits and fires their `lost()`: one driver task for all of them.
    pub(crate) keepalive: Keepalive,
    /// Semaphores (their state keys) with a `lease_tidy` pending.
    tidy: std::sync::Mutex<std::collections::HashSet<String>>,
    /// How many [`Redsem::flush`]es are under way: while one is, tidies (pending or
    /// started meanwhile) run at once rather than after their delay.
    hurry: tokio::sync::watch::Sender<u64>,
    /// Whether lease operations go by group commit ([`RedsemOptions::group_commit`]).
    group_commit: bool,
    /// What the handles of one primitive (by key) share: see [`Redsem::shared_for`].
    per_key: std::sync::Mutex<
        std::collections::HashMap<String, std::sync::Weak<dyn std::any::Any + Send + Sync>>,
    >,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.closed.cancel();
        self.conn.engine_state().count(false);
    }
}

impl fmt::Debug for Redsem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let servers: Vec<String> = match &self.shared.conn {
            // Behind Sentinels, the primary now (not the first one).
            Conn::Single(single) => vec![single.primary()],
            #[cfg(feature = "cluster")]
            Conn::Cluster(..) => self
                .shared
                .pubsub_clients
                .iter()
                .map(|c| c.get_connection_info().addr().to_string())
                .collect(),
        };
        f.debug_struct("Redsem")
            .field("prefix", &self.shared.prefix)
            .field("servers", &servers)
            .field("engine", &self.shared.conn.engine_state().serving().name())
            .finish_non_exhaustive()
    }
}

impl Redsem {
    fn assemble(
        conn: Conn,
        pubsub_clients: Vec<redis::Client>,
        options: RedsemOptions,
        wake_channel: String,
        sharded_pubsub: bool,
    ) -> Redsem {
        let closed = CancellationToken::new();
        crate::observe::describe_metrics();
        conn.engine_state().count(true);
        Redsem {
            shared: Arc::new(Shared {
                conn,
                pubsub_clients,
                wake_channel,
                sharded_pubsub,
                session: crate::session::Session::new(),
                prefix: options.prefix,
                metric_names: options.metric_names,
                replica_acks: options.replica_acks,
                notifier: OnceCell::new(),
                keepalive: Keepalive::new(closed.clone()),
                closed,
                background: TaskTracker::new(),
                tidy: std::sync::Mutex::default(),
                hurry: tokio::sync::watch::Sender::new(0),
                group_commit: options.group_commit,
                per_key: std::sync::Mutex::default(),
            }),
        }
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.shared.prefix
    }

    /// The engine that serves this client's calls now: redsem's module, or the Lua scripts
    /// (see [`Engine`](crate::Engine)). No round trip.
    ///
    /// It is chosen at connect, and changes once at most: from the module to the scripts, the
    /// first time a call finds the module gone (behind Sentinels, a failover to a server
    /// without it); that call and every later one go by the scripts.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> redsem::Result<()> {
    /// let redsem = redsem::Redsem::connect("redis://127.0.0.1:6379").await?;
    /// println!("engine: {}", redsem.engine());
    /// # Ok(())
    /// # }
    /// ```
    pub fn engine(&self) -> crate::ServingEngine {
        self.shared.conn.engine_state().serving()
    }

    /// The names of the lease semaphores under this prefix that have state in Redis (in use,
    /// or idle for less than an hour). Uses `SCAN`, never `KEYS`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
    /// for name in redsem.lease_semaphore_names().await? {
    ///     let status = redsem.lease_semaphore(&name, 1)?.status().await?;
    ///     println!("{name}: {} in use", status.in_use);
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`crate::Error::Unavailable`] when Redis cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn lease_semaphore_names(&self) -> Result<Vec<String>> {
        let pattern = keys::lease_state_pattern(&self.shared.prefix);
        self.names(&pattern, |prefix, key| {
            keys::lease_name_of_state(prefix, key)
        })
        .await
    }

    /// The names of the permit semaphores under this prefix whose count is stored. Uses
    /// `SCAN`, never `KEYS`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
    /// for name in redsem.permit_semaphore_names().await? {
    ///     let free = redsem.permit_semaphore(&name)?.available_permits().await?;
    ///     println!("{name}: {free} available");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`crate::Error::Unavailable`] when Redis cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn permit_semaphore_names(&self) -> Result<Vec<String>> {
        let pattern = keys::kind_pattern(&self.shared.prefix, "permits");
        self.names(&pattern, |prefix, key| {
            keys::name_of_key(prefix, "permits", &["count"], key)
        })
        .await
    }

    /// The names of the countdown latches under this prefix that are counting or opened
    /// within [`crate::LATCH_DONE_TTL`]. Uses `SCAN`, never `KEYS`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
    /// for name in redsem.count_down_latch_names().await? {
    ///     let state = redsem.count_down_latch(&name)?.state().await?;
    ///     println!("{name}: {state:?}");
    /// }
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`crate::Error::Unavailable`] when Redis cannot be reached.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn count_down_latch_names(&self) -> Result<Vec<String>> {
        let pattern = keys::kind_pattern(&self.shared.prefix, "latch");
        self.names(&pattern, |prefix, key| {
            keys::name_of_key(prefix, "latch", &["count", "done"], key)
        })
        .await
    }

    /// The names in the keys matching `pattern` on every primary, as `name_of` reads them,
    /// sorted, each once.
    async fn names(
        &self,
        pattern: &str,
        name_of: impl Fn(&str, &str) -> Option<String>,
    ) -> Result<Vec<String>> {
        let pattern = pattern.to_owned();
        let mut found = Vec::new();
        match self.shared.conn.clone() {
            Conn::Single(mut conn) => scan(&mut conn, &pattern, &mut found).await?,
            #[cfg(feature = "cluster")]
            Conn::Cluster(mut conn, _) => {
                // SCAN walks one node: walk every primary.
                let nodes: String = redis::cmd("CLUSTER")
                    .arg("NODES")
                    .query_async(&mut conn)
                    .await?;
                let Some(seed) = self.shared.pubsub_clients.first() else {
                    return Ok(Vec::new());
                };
                for primary in crate::conn::primaries(&nodes) {
                    let client = crate::conn::node_client(seed, &primary.host, primary.port)?;
                    let mut node = client.get_multiplexed_async_connection().await?;
                    scan(&mut node, &pattern, &mut found).await?;
                }
            }
        }
        let mut names: Vec<String> = found
            .iter()
            .filter_map(|key| name_of(&self.shared.prefix, key))
            .collect();
        names.sort();
        names.dedup();
        Ok(names)
    }

    /// Wait until the clean-up that dropped permits and cancelled acquires sent in the
    /// background (a release, a withdrawal) has finished.
    ///
    /// Call it before a short-lived program exits, so a permit dropped on the way out is
    /// released rather than left to run out its lease.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(redsem: redsem::Redsem, sem: redsem::LeaseSemaphore) -> redsem::Result<()> {
    /// let permit = sem.acquire().await?;
    /// drop(permit); // released in the background
    /// redsem.flush().await;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: the background work goes on.
    pub async fn flush(&self) {
        /// Counts the flush out again however it ends (also cancelled).
        struct Hurrying<'a>(&'a tokio::sync::watch::Sender<u64>);
        impl Drop for Hurrying<'_> {
            fn drop(&mut self) {
                self.0.send_modify(|n| *n = n.saturating_sub(1));
            }
        }
        self.shared.hurry.send_modify(|n| *n += 1);
        let _hurrying = Hurrying(&self.shared.hurry);
        let tracker = &self.shared.background;
        tracker.close();
        tracker.wait().await;
        tracker.reopen();
    }

    /// Run clean-up `work` in the background (from `Drop`), tracked for [`Redsem::flush`].
    /// Without a runtime (dropped outside one) the work is skipped: leases end by themselves.
    pub(crate) fn spawn_cleanup(&self, work: impl Future<Output = ()> + Send + 'static) {
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            self.shared.background.spawn_on(work, &handle);
        }
    }

    /// Run `work`, a call that gives something back (a release, a count-down), to its end
    /// even if the caller stops waiting for it. It runs in place, in the caller's task, and
    /// counts for [`Redsem::flush`] while it does; dropping this future (a `select!`, a
    /// timeout, a cancelled asyncio task) hands what is left of it to a task of its own,
    /// tracked the same way, so nothing it gives back is stranded until a lease ends. (In
    /// place, not spawned: a task per call cost an uncontended cycle a wake-up of another
    /// worker thread.)
    ///
    /// Outside a tokio runtime `work` runs in place and is lost with its future.
    pub(crate) async fn run_to_end<T: Send + 'static>(
        &self,
        work: impl Future<Output = Result<T>> + Send + 'static,
    ) -> Result<T> {
        let Ok(handle) = tokio::runtime::Handle::try_current() else {
            return work.await;
        };
        let mut rest = ToTheEnd {
            work: Some(Box::pin(work)),
            background: self.shared.background.clone(),
            handle,
            _counted: self.shared.background.token(),
        };
        let answer = std::future::poll_fn(|cx| match rest.work.as_mut() {
            Some(work) => work.as_mut().poll(cx),
            None => std::task::Poll::Pending,
        })
        .await;
        rest.work = None;
        answer
    }

    /// Whether wake-ups go by sharded pub/sub: on a Redis Cluster whose primaries have it
    /// (each in its primitive's slot, `SPUBLISH` to the one node that owns it); classic
    /// pub/sub on one server, behind Sentinels and on a cluster without it (Redis 6.2, where
    /// the cluster bus carries every `PUBLISH` to every node).
    pub(crate) fn sharded_wake_ups(&self) -> bool {
        self.shared.sharded_pubsub
    }

    /// The channel on which this client's queued requests on the primitive `{<kind>:<name>}`
    /// are told they were granted: the client's one classic channel, or on a cluster one in
    /// the primitive's slot (see [`keys::is_sharded`](crate::keys::is_sharded)).
    pub(crate) fn wake_channel_for(&self, kind: &str, name: &str) -> String {
        if self.sharded_wake_ups() {
            crate::keys::shard_wake_channel(&self.shared.wake_channel, kind, name)
        } else {
            self.shared.wake_channel.clone()
        }
    }

    /// Whether lease operations go by group commit ([`RedsemOptions::group_commit`]).
    pub(crate) fn group_commit(&self) -> bool {
        self.shared.group_commit
    }

    /// The value of this client for the primitive of `key` that every handle of it shares
    /// (made by `make` on first use, forgotten once no handle holds it): a semaphore's group
    /// commit.
    pub(crate) fn shared_for<T: std::any::Any + Send + Sync>(
        &self,
        key: &str,
        make: impl FnOnce() -> T,
    ) -> Arc<T> {
        let mut values = self
            .shared
            .per_key
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(value) = values
            .get(key)
            .and_then(std::sync::Weak::upgrade)
            .and_then(|v| v.downcast::<T>().ok())
        {
            return value;
        }
        // Forget the values no handle holds any more.
        values.retain(|_, v| v.strong_count() > 0);
        let value = Arc::new(make());
        let erased: Arc<dyn std::any::Any + Send + Sync> = value.clone();
        values.insert(key.to_owned(), Arc::downgrade(&erased));
        value
    }

    /// After a release (or a batch) on the semaphore of `keys`: hand the grants it made to
    /// waiters of this client to them (no pub/sub hop), and tidy the semaphore if it was
    /// left idle.
    pub(crate) async fn after_release(
        &self,
        keys: &crate::keys::LeaseKeys,
        handed: &[String],
        idle: bool,
    ) {
        if !handed.is_empty() {
            let notifier = self.notifier().await;
            for grant in handed {
                notifier.deliver(grant);
            }
        }
        if idle {
            self.tidy_later(keys);
        }
    }

    /// Send `lease_tidy` for the semaphore of `keys` in a moment (at once on
    /// [`Redsem::flush`]), unless one is pending: a release left it idle, and its keys get
    /// their TTL only if nobody took it again meanwhile (see `lua/lease/tidy.lua`).
    pub(crate) fn tidy_later(&self, keys: &crate::keys::LeaseKeys) {
        let key = keys.all[2].clone();
        let fresh = self
            .shared
            .tidy
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone());
        if !fresh {
            return;
        }
        let redsem = self.clone();
        let keys = keys.clone();
        let mut hurry = self.shared.hurry.subscribe();
        self.spawn_cleanup(async move {
            tokio::select! {
                () = tokio::time::sleep(TIDY_AFTER) => {}
                _ = hurry.wait_for(|flushing| *flushing > 0) => {}
            }
            redsem
                .shared
                .tidy
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&key);
            if let Err(err) = crate::script::lease_tidy(&mut redsem.conn(), &keys).await {
                tracing::debug!(key = %key, error = %crate::error::Chain(&err), "could not give an idle semaphore its TTL");
            }
        });
    }

    /// The client's session ([`crate::session`]).
    pub(crate) fn session(&self) -> &Arc<crate::session::Session> {
        &self.shared.session
    }

    /// The command connection, carrying the replica acknowledgements the scripts' changes
    /// wait for.
    pub(crate) fn conn(&self) -> crate::script::Acking<Conn> {
        crate::script::Acking {
            conn: self.shared.conn.clone(),
            acks: self.shared.replica_acks,
        }
    }

    /// The command connection without replica acknowledgements: for withdrawals, which
    /// undo a request or a grant and need none (lost in a failover, what they undo is dropped
    /// by its own lease, or was not on the replicas either).
    pub(crate) fn conn_unacked(&self) -> crate::script::Acking<Conn> {
        crate::script::Acking {
            conn: self.shared.conn.clone(),
            acks: None,
        }
    }

    /// [`conn`](Self::conn) if `acked`, else [`conn_unacked`](Self::conn_unacked): a group
    /// commit waits for acknowledgements unless all it carries are withdrawals.
    pub(crate) fn conn_acked_if(&self, acked: bool) -> crate::script::Acking<Conn> {
        if acked {
            self.conn()
        } else {
            self.conn_unacked()
        }
    }

    /// The pub/sub side, started on first use.
    pub(crate) async fn notifier(&self) -> &Notifier {
        self.shared
            .notifier
            .get_or_init(|| async {
                let shared = &self.shared;
                let place = match &shared.conn {
                    Conn::Single(single) => crate::notify::Place::Single {
                        clients: shared.pubsub_clients.clone(),
                        source: Some(single.source().clone()),
                    },
                    // Classic pub/sub on any node: the seeds, one after another.
                    #[cfg(feature = "cluster")]
                    Conn::Cluster(..) if !shared.sharded_pubsub => crate::notify::Place::Single {
                        clients: shared.pubsub_clients.clone(),
                        source: None,
                    },
                    #[cfg(feature = "cluster")]
                    Conn::Cluster(cluster, _) => crate::notify::Place::Cluster {
                        seeds: shared.pubsub_clients.clone(),
                        cluster: cluster.clone(),
                    },
                };
                Notifier::start(place, shared.wake_channel.clone(), shared.closed.clone())
            })
            .await
    }
}

/// The part of a [`Redsem::run_to_end`] call not yet run: spawned, tracked, when its awaiter
/// drops it.
struct ToTheEnd<W: Future + Send + 'static> {
    work: Option<std::pin::Pin<Box<W>>>,
    background: TaskTracker,
    handle: tokio::runtime::Handle,
    /// Counts the call for [`Redsem::flush`] while it runs in place.
    _counted: tokio_util::task::task_tracker::TaskTrackerToken,
}

impl<W: Future + Send + 'static> Drop for ToTheEnd<W> {
    fn drop(&mut self) {
        if let Some(work) = self.work.take() {
            self.background.spawn_on(
                async move {
                    let _ = work.await;
                },
                &self.handle,
            );
        }
    }
}
