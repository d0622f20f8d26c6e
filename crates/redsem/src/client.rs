//! `Redsem`, the entry point: one command connection, one pub/sub connection, shared by
//! every primitive and task made from it.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use redis::aio::ConnectionManagerConfig;
use tokio::sync::OnceCell;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::error::{Error, Result, invalid};
use crate::keys;
use crate::lease::keepalive::Keepalive;
use crate::lease::{LeaseOptions, LeaseSemaphore};
use crate::mutex::Mutex;
use crate::notify::Notifier;
use crate::observe::MetricNames;
use crate::types::PermitId;

pub(crate) use crate::conn::Conn;

/// How long after a release that left a semaphore idle its keys get their TTL.
const TIDY_AFTER: Duration = Duration::from_secs(1);

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
/// ACL SETUSER app on >password resetkeys ~redsem:* resetchannels &redsem:* -@all +@read +@write +@scripting -@dangerous +publish +subscribe +unsubscribe +ping +info +time
/// ```
///
/// [`RedsemOptions::acl_rules`] gives the part after the password for any prefix. On a
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

    /// Trust the CA certificates in the PEM file at `path` for `rediss://` connections.
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
    /// `ACL SETUSER <user> on ><password>` (see [`ServerChecks`]).
    ///
    /// # Examples
    ///
    /// ```
    /// use redsem::RedsemOptions;
    /// let rules = RedsemOptions::default().prefix("app").acl_rules();
    /// assert!(rules.starts_with("resetkeys ~app:* resetchannels &app:* -@all"));
    /// ```
    pub fn acl_rules(&self) -> String {
        let prefix = keys::escape_glob(&self.prefix);
        format!(
            "resetkeys ~{prefix}:* resetchannels &{prefix}:* -@all +@read +@write +@scripting \
             -@dangerous +publish +subscribe +unsubscribe +ping +info +time"
        )
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
}

fn open_client(url: &str, options: &RedsemOptions) -> Result<redis::Client> {
    #[cfg(feature = "tls")]
    if url.starts_with("rediss://") {
        // The process-wide rustls provider; another part of the program may have set one.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
    let bad_url = |e: redis::RedisError| invalid(format!("bad redis url {url:?}: {e}"));
    let Some(path) = &options.tls_root_cert else {
        return redis::Client::open(url).map_err(bad_url);
    };
    #[cfg(feature = "tls")]
    {
        let pem = std::fs::read(path).map_err(|e| {
            invalid(format!(
                "cannot read the TLS root certificate {}: {e}",
                path.display()
            ))
        })?;
        let certs = redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(pem),
        };
        redis::Client::build_with_tls(url, certs).map_err(bad_url)
    }
    #[cfg(not(feature = "tls"))]
    {
        Err(invalid(format!(
            "TLS root certificate {} given, but redsem was built without the `tls` feature",
            path.display()
        )))
    }
}

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

/// Run the server checks on every primary of a cluster, each through its own connection
/// (one pipelined round trip per node), with a probe key the node serves.
#[cfg(feature = "cluster")]
async fn check_primaries(
    conn: &mut redis::cluster_async::ClusterConnection,
    seeds: &[redis::Client],
    options: &RedsemOptions,
    wake_channel: &str,
) -> Result<Vec<crate::conn::Findings>> {
    let rules = options.acl_rules();
    let nodes: String = match redis::cmd("CLUSTER").arg("NODES").query_async(conn).await {
        Ok(nodes) => nodes,
        Err(err) if err.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoPerm) => {
            return Ok(vec![crate::conn::Findings {
                unsuitable: vec![(
                    "ACL commands".to_owned(),
                    format!(
                        "the user may not run CLUSTER NODES, which redsem needs to find the \
                         primaries; grant +cluster|slots +cluster|nodes {rules}"
                    ),
                )],
                unchecked: Vec::new(),
            }]);
        }
        Err(err) => return Err(err.into()),
    };
    let Some(seed) = seeds.first() else {
        return Ok(Vec::new());
    };
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(Some(options.response_timeout));
    let mut all = Vec::new();
    for primary in crate::conn::primaries(&nodes) {
        let node = format!("{}:{}", primary.host, primary.port);
        let client = crate::conn::node_client(seed, &primary.host, primary.port)?;
        let mut node_conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        // A key whose slot this node serves, so that the probe runs here rather than
        // answering MOVED (ACL rights are checked before the redirection either way).
        let key = (0..65_536)
            .map(|n| keys::acl_probe_key(&options.prefix, n))
            .find(|key| {
                let slot = crate::conn::slot_of(key);
                primary
                    .slots
                    .iter()
                    .any(|&(from, to)| (from..=to).contains(&slot))
            })
            .unwrap_or_else(|| keys::acl_probe_key(&options.prefix, 0));
        let probe = crate::conn::Probe {
            node: &node,
            prefix: &options.prefix,
            key: &key,
            channel: wake_channel,
            rules: &rules,
        };
        all.push(crate::conn::check_node(&mut node_conn, &probe).await?);
    }
    Ok(all)
}

/// One finding of [`Redsem::check_server`]: a setting under which redsem's guarantees would
/// not hold, or one that could not be checked.
///
/// # Examples
///
/// ```no_run
/// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
/// use redsem::Verdict;
/// for finding in redsem.check_server().await? {
///     if finding.verdict == Verdict::Unsuitable {
///         eprintln!("{}: {}", finding.setting, finding.problem);
///     }
/// }
/// # Ok(())
/// # }
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct ServerFinding {
    /// What was checked: `maxmemory-policy`, `ACL commands`, `ACL keys` or `ACL channels`.
    pub setting: String,
    /// Whether it is unsuitable or could not be checked.
    pub verdict: Verdict,
    /// What was found and what to change, naming the node (`host:port`).
    pub problem: String,
}

/// How bad a [`ServerFinding`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Verdict {
    /// redsem's guarantees would not hold: what [`ServerChecks::Enforce`] refuses.
    Unsuitable,
    /// It could not be checked (a right to look is missing, the probe failed).
    Unchecked,
}

fn public_findings(findings: Vec<crate::conn::Findings>) -> Vec<ServerFinding> {
    let mut out = Vec::new();
    for found in findings {
        for (setting, problem) in found.unsuitable {
            out.push(ServerFinding {
                setting,
                verdict: Verdict::Unsuitable,
                problem,
            });
        }
        for (setting, problem) in found.unchecked {
            out.push(ServerFinding {
                setting,
                verdict: Verdict::Unchecked,
                problem,
            });
        }
    }
    out
}

/// Act on what the server checks found, as `checks` says: an error (Enforce) or warnings.
fn judge(checks: ServerChecks, findings: Vec<crate::conn::Findings>) -> Result<()> {
    let mut settings: Vec<String> = Vec::new();
    let mut problems = Vec::new();
    for found in findings {
        for (_, what) in found.unchecked {
            tracing::warn!("redsem server check: {what}");
        }
        for (setting, problem) in found.unsuitable {
            if checks == ServerChecks::Enforce {
                if !settings.contains(&setting) {
                    settings.push(setting);
                }
                problems.push(problem);
            } else {
                tracing::warn!(
                    %setting,
                    "redsem server check: {problem} (connecting anyway: ServerChecks::Warn)"
                );
            }
        }
    }
    if problems.is_empty() {
        return Ok(());
    }
    Err(Error::Unsuitable {
        setting: settings.join(", "),
        problem: problems.join("; "),
    })
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
    /// The channel on which this client's queued requests are told they were granted.
    pub(crate) wake_channel: String,
    notifier: OnceCell<Notifier>,
    /// Cancelled when the last handle goes: stops the pub/sub task.
    pub(crate) closed: CancellationToken,
    /// Releases and withdrawals sent in the background from `Drop`.
    background: TaskTracker,
    /// Renews the lease permits and fires their `lost()`: one driver task for all of them.
    pub(crate) keepalive: Keepalive,
    /// Semaphores (their state keys) with a `lease_tidy` pending.
    tidy: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Bumped by [`Redsem::flush`]: pending tidies run at once.
    hurry: tokio::sync::watch::Sender<u64>,
}

impl Drop for Shared {
    fn drop(&mut self) {
        self.closed.cancel();
    }
}

impl fmt::Debug for Redsem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Redsem")
            .field("prefix", &self.shared.prefix)
            .field(
                "servers",
                &self
                    .shared
                    .pubsub_clients
                    .iter()
                    .map(|c| c.get_connection_info().addr().to_string())
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

impl Redsem {
    /// Connect to the Redis at `url` with the default options.
    ///
    /// `url` is `redis://[user:password@]host[:port][/db]`, or `rediss://...` for TLS (the
    /// default `tls` feature).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> redsem::Result<()> {
    /// let redsem = redsem::Redsem::connect("redis://127.0.0.1:6379/0").await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a malformed URL, [`Error::Unavailable`](crate::Error::Unavailable) when Redis cannot
    /// be reached, [`Error::Redis`](crate::Error::Redis) when it refuses the connection (bad password, ...).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the half-open connection.
    pub async fn connect(url: &str) -> Result<Redsem> {
        Self::connect_with(url, RedsemOptions::default()).await
    }

    /// Connect to the Redis at `url` with `options`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> redsem::Result<()> {
    /// use redsem::{Redsem, RedsemOptions};
    /// let redsem = Redsem::connect_with(
    ///     "redis://127.0.0.1:6379",
    ///     RedsemOptions::default().prefix("myapp"),
    /// )
    /// .await?;
    /// assert_eq!(redsem.prefix(), "myapp");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redsem::connect`]; also [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// for an empty prefix or one with `{` or `}` (the braces that make a primitive's keys share
    /// one cluster slot), and [`Error::Unsuitable`](crate::Error::Unsuitable) when the server
    /// checks (see [`ServerChecks`]) find an `allkeys-*` eviction policy or missing ACL rights.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn connect_with(url: &str, options: RedsemOptions) -> Result<Redsem> {
        if let Some(why) = keys::prefix_problem(&options.prefix) {
            return Err(invalid(why));
        }
        let client = open_client(url, &options)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout))
            .set_number_of_retries(1);
        let mut conn = crate::conn::Single::new(client.clone(), config).await?;
        let wake_channel = keys::wake_channel(&options.prefix, PermitId::random().as_str());
        if options.server_checks != ServerChecks::Off {
            let node = client.get_connection_info().addr().to_string();
            let key = keys::acl_probe_key(&options.prefix, 0);
            let rules = options.acl_rules();
            let probe = crate::conn::Probe {
                node: &node,
                prefix: &options.prefix,
                key: &key,
                channel: &wake_channel,
                rules: &rules,
            };
            let findings = crate::conn::check_node(&mut conn, &probe).await?;
            judge(options.server_checks, vec![findings])?;
        }
        Ok(Self::assemble(
            Conn::Single(conn),
            vec![client],
            options,
            wake_channel,
        ))
    }

    /// Connect to a Redis Cluster through any of its nodes (`seeds`), with the default
    /// options.
    ///
    /// Every key of one primitive shares one hash tag, so each script runs on the one node
    /// that owns it; wake-ups use classic pub/sub, which a cluster forwards to every node.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> redsem::Result<()> {
    /// let redsem = redsem::Redsem::connect_cluster(&[
    ///     "redis://10.0.0.1:7000",
    ///     "redis://10.0.0.2:7000",
    /// ])
    /// .await?;
    /// let sem = redsem.lease_semaphore("exports", 4)?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redsem::connect_with`], with the server checks run on every primary; TLS root
    /// certificates are not supported for clusters yet
    /// ([`Error::InvalidArgument`](crate::Error::InvalidArgument)).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    #[cfg(feature = "cluster")]
    pub async fn connect_cluster(seeds: &[&str]) -> Result<Redsem> {
        Self::connect_cluster_with(seeds, RedsemOptions::default()).await
    }

    /// Connect to a Redis Cluster with `options`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> redsem::Result<()> {
    /// use redsem::{Redsem, RedsemOptions};
    /// let redsem =
    ///     Redsem::connect_cluster_with(&["redis://10.0.0.1:7000"], RedsemOptions::default().prefix("app"))
    ///         .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redsem::connect_cluster`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    #[cfg(feature = "cluster")]
    pub async fn connect_cluster_with(seeds: &[&str], options: RedsemOptions) -> Result<Redsem> {
        if let Some(why) = keys::prefix_problem(&options.prefix) {
            return Err(invalid(why));
        }
        if seeds.is_empty() {
            return Err(invalid("a cluster needs at least one seed node URL"));
        }
        if options.tls_root_cert.is_some() {
            return Err(invalid(
                "TLS root certificates are not supported for clusters yet",
            ));
        }
        let clients = seeds
            .iter()
            .map(|url| open_client(url, &options))
            .collect::<Result<Vec<_>>>()?;
        let cluster = redis::cluster::ClusterClient::builder(
            clients.iter().map(|c| c.get_connection_info().clone()),
        )
        .connection_timeout(options.connect_timeout)
        .response_timeout(options.response_timeout)
        .build()
        .map_err(|e| invalid(format!("bad cluster seeds {seeds:?}: {e}")))?;
        let mut conn = cluster.get_async_connection().await?;
        let wake_channel = keys::wake_channel(&options.prefix, PermitId::random().as_str());
        if options.server_checks != ServerChecks::Off {
            let findings = check_primaries(&mut conn, &clients, &options, &wake_channel).await?;
            judge(options.server_checks, findings)?;
        }
        Ok(Self::assemble(
            Conn::Cluster(conn, Default::default()),
            clients,
            options,
            wake_channel,
        ))
    }

    fn assemble(
        conn: Conn,
        pubsub_clients: Vec<redis::Client>,
        options: RedsemOptions,
        wake_channel: String,
    ) -> Redsem {
        let closed = CancellationToken::new();
        crate::observe::describe_metrics();
        Redsem {
            shared: Arc::new(Shared {
                conn,
                pubsub_clients,
                wake_channel,
                prefix: options.prefix,
                metric_names: options.metric_names,
                notifier: OnceCell::new(),
                keepalive: Keepalive::new(closed.clone()),
                closed,
                background: TaskTracker::new(),
                tidy: std::sync::Mutex::default(),
                hurry: tokio::sync::watch::Sender::new(0),
            }),
        }
    }

    /// Run the connect-time server checks again and return what they find, whatever
    /// [`ServerChecks`] says: the eviction policy and the user's ACL rights on the prefix's
    /// keys, channels and the commands redsem runs, on the server or every primary of a
    /// cluster. Writes nothing. `redsem doctor` reports these.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> redsem::Result<()> {
    /// use redsem::{Redsem, RedsemOptions, ServerChecks};
    /// let options = RedsemOptions::default().server_checks(ServerChecks::Off);
    /// let redsem = Redsem::connect_with("redis://127.0.0.1:6379", options).await?;
    /// let findings = redsem.check_server().await?;
    /// println!("{} findings", findings.len());
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::Unavailable`](crate::Error::Unavailable) or
    /// [`Error::Redis`](crate::Error::Redis) when a node cannot be reached; what a node
    /// refuses is a finding.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: it only reads.
    pub async fn check_server(&self) -> Result<Vec<ServerFinding>> {
        let shared = &self.shared;
        let rules = RedsemOptions::default()
            .prefix(shared.prefix.as_str())
            .acl_rules();
        let findings = match &shared.conn {
            Conn::Single(single) => {
                let node = shared
                    .pubsub_clients
                    .first()
                    .map(|c| c.get_connection_info().addr().to_string())
                    .unwrap_or_default();
                let key = keys::acl_probe_key(&shared.prefix, 0);
                let probe = crate::conn::Probe {
                    node: &node,
                    prefix: &shared.prefix,
                    key: &key,
                    channel: &shared.wake_channel,
                    rules: &rules,
                };
                vec![crate::conn::check_node(&mut single.clone(), &probe).await?]
            }
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn, _) => {
                let options = RedsemOptions::default().prefix(shared.prefix.as_str());
                check_primaries(
                    &mut conn.clone(),
                    &shared.pubsub_clients,
                    &options,
                    &shared.wake_channel,
                )
                .await?
            }
        };
        Ok(public_findings(findings))
    }

    /// The key prefix.
    pub fn prefix(&self) -> &str {
        &self.shared.prefix
    }

    /// A fair lease semaphore named `name` with `capacity` units and default options.
    ///
    /// Makes no round trip: the capacity is checked against the one stored with the semaphore
    /// when it is first used.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
    /// let exports = redsem.lease_semaphore("exports", 4)?;
    /// let permit = exports.acquire().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an empty name or a capacity of 0.
    pub fn lease_semaphore(&self, name: &str, capacity: u32) -> Result<LeaseSemaphore> {
        self.lease_semaphore_with(name, capacity, LeaseOptions::default())
    }

    /// A fair lease semaphore with `options`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
    /// use std::time::Duration;
    /// use redsem::LeaseOptions;
    /// let options = LeaseOptions::default()
    ///     .lease(Duration::from_secs(10))
    ///     .label("10.0.0.7")
    ///     .one_per_label(true);
    /// let jobs = redsem.lease_semaphore_with("migrate", 3, options)?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an empty name, a capacity of 0, or a lease or waiter
    /// lease too short to renew (under 30 ms).
    pub fn lease_semaphore_with(
        &self,
        name: &str,
        capacity: u32,
        options: LeaseOptions,
    ) -> Result<LeaseSemaphore> {
        LeaseSemaphore::new(self.clone(), name, capacity, options, "lease")
    }

    /// A distributed mutex: a lease semaphore of capacity 1 named `name`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
    /// let lock = redsem.mutex("ledger")?;
    /// let guard = lock.lock().await?;
    /// // ... write with guard.token() as the fencing token ...
    /// guard.unlock().await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for an empty name.
    pub fn mutex(&self, name: &str) -> Result<Mutex> {
        self.mutex_with(name, LeaseOptions::default())
    }

    /// A distributed mutex with `options`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example(redsem: redsem::Redsem) -> redsem::Result<()> {
    /// use std::time::Duration;
    /// let lock = redsem.mutex_with("ledger", redsem::LeaseOptions::default().lease(Duration::from_secs(5)))?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redsem::lease_semaphore_with`].
    pub fn mutex_with(&self, name: &str, options: LeaseOptions) -> Result<Mutex> {
        Ok(Mutex::new(LeaseSemaphore::new(
            self.clone(),
            name,
            1,
            options,
            "mutex",
        )?))
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
        let mut found = Vec::new();
        match self.conn() {
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
            .filter_map(|key| keys::lease_name_of_state(&self.shared.prefix, key))
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
        self.shared.hurry.send_modify(|n| *n += 1);
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

    /// Send `lease_tidy` for the semaphore of `keys` in a moment (at once on
    /// [`Redsem::flush`]), unless one is pending: a release left it idle, and its keys get
    /// their TTL only if nobody took it again meanwhile (see `lua/lease_tidy.lua`).
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
                _ = hurry.changed() => {}
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

    pub(crate) fn conn(&self) -> Conn {
        self.shared.conn.clone()
    }

    /// The pub/sub side, started on first use.
    pub(crate) async fn notifier(&self) -> &Notifier {
        self.shared
            .notifier
            .get_or_init(|| async { Notifier::start(&self.shared) })
            .await
    }
}
