//! The server checks: the eviction policy and the user's ACL rights, on the server or on
//! every primary of a cluster (the per-node probe is `crate::conn::check_node`), what they
//! find ([`ServerFinding`], [`Verdict`]) and how a connect acts on it ([`ServerChecks`]).

use super::{Conn, Redsem, RedsemOptions, ServerChecks};
use crate::error::{Error, Result};
use crate::keys;

/// Run the server checks on every primary of a cluster, each through its own connection
/// (one pipelined round trip per node), with a probe key the node serves.
#[cfg(feature = "cluster")]
pub(super) async fn check_primaries(
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
    // A primary without slots holds no key of redsem's (and may be a node on its way to
    // becoming a replica, as CLUSTER NODES showed it a moment ago: WAIT would be refused).
    for primary in crate::conn::primaries(&nodes)
        .into_iter()
        .filter(|p| !p.slots.is_empty())
    {
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
            waits: options.replica_acks.is_some(),
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
pub(super) fn judge(checks: ServerChecks, findings: Vec<crate::conn::Findings>) -> Result<()> {
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

impl Redsem {
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
                // (Behind Sentinels: the primary now, not the one first connected to.)
                let node = single.primary();
                let key = keys::acl_probe_key(&shared.prefix, 0);
                let probe = crate::conn::Probe {
                    node: &node,
                    prefix: &shared.prefix,
                    key: &key,
                    channel: &shared.wake_channel,
                    rules: &rules,
                    waits: shared.replica_acks.is_some(),
                };
                vec![crate::conn::check_node(&mut single.clone(), &probe).await?]
            }
            #[cfg(feature = "cluster")]
            Conn::Cluster(conn, _) => {
                let mut options = RedsemOptions::default().prefix(shared.prefix.as_str());
                options.replica_acks = shared.replica_acks;
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
}
