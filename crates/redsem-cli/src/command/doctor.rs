//! `redsem doctor [--json]`: check the server the way an operator needs — version, eviction
//! policy, persistence, replicas, cluster state, ACL rights, clock — and say what to change.
//!
//! The eviction policy and ACL rights come from the library's own connect-time probe
//! ([`redsem::Redsem::check_server`]); the rest from `INFO`, `CONFIG GET` and `TIME`. On a
//! cluster every primary is checked ([`cluster`]); behind Sentinels the primary they name,
//! and the Sentinels themselves ([`sentinel`]).

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use redsem::redis::{self, aio::MultiplexedConnection};
use redsem::{ServerChecks, ServerFinding, ServingEngine, Verdict};
use serde::Serialize;

use crate::context::Context;
use crate::error::{CliError, exit};
use crate::output::{self, table};
use crate::target::Target;
use crate::values::ReplicaAcks;

mod cluster;
mod sentinel;

use cluster::cluster_checks;

const EXAMPLES: &str = "\
Examples:
  redsem doctor
  redsem --url redis://app:pw@cache.internal:6379 doctor --json
  {\"server\":\"redis://app:***@cache.internal:6379\",\"worst\":\"warn\",\"checks\":
   [{\"check\":\"version\",\"status\":\"ok\",
   \"detail\":\"Redis 7.2.4: functions available\"}, ...]}
  redsem --url redis+cluster://10.0.0.1:7000,10.0.0.2:7000 doctor
  redsem --url redis+sentinel://10.0.0.5:26379,10.0.0.6:26379/mymaster doctor

Checks: version (7 or later for functions; older servers run redsem's scripts by
EVALSHA), engine (which engine serves, --engine: native, redsem's Redis module, or the Lua
scripts, and why), maxmemory-policy (allkeys-* may evict held permits), persistence (AOF, RDB or
none: what a restart loses), replication (replicas and their lag; a replica cannot be
written), cluster (cluster_state), acl (the user's rights on the prefix's keys, channels
and commands), clock (server TIME against this machine's clock; redsem only uses the
server's, so a difference matters to people reading times, not to the guarantees).

The table's first line names the server (--url, its password hidden; and whether it is the
default, no --url or REDIS_URL) and the prefix; the JSON has it as \"server\".

On a cluster (redis+cluster://) every primary is checked, each row naming its node
(\"node\" in JSON), and the cluster row covers every primary's cluster_state, the slots
assigned and served, and the primaries without a replica. Behind Sentinels
(redis+sentinel://) the primary they name is checked, and a sentinel row says which
Sentinels answer and whether they agree on the primary, the quorum and whether a failover
can be authorized (CKQUORUM), and the replicas known with their link and lag; a
min-replicas row advises min-replicas-to-write 1 (a primary left by its replicas after a
failover then refuses the writes that would be lost).

Exit codes: 0 every check ok · 1 the worst is a warning · 78 a check failed (redsem's
guarantees would not hold, or it cannot work) · 2 usage error · 69 Redis unreachable";

/// A difference between the server's clock and this machine's above which `clock` warns.
const CLOCK_TOLERANCE: Duration = Duration::from_secs(1);

/// Replication lag (seconds since the replica's last acknowledgement) above which
/// `replication` warns.
const LAG_TOLERANCE: u64 = 1;

/// Check the server: version, eviction, persistence, replicas, cluster, ACL rights, clock
#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
pub(crate) struct Args {
    /// Print JSON instead of a table
    #[arg(long)]
    json: bool,
}

/// How one check went; ordered from best to worst.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    Ok,
    Warn,
    Fail,
}

impl Status {
    fn label(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Warn => "warn",
            Status::Fail => "fail",
        }
    }

    fn exit_code(self) -> u8 {
        match self {
            Status::Ok => 0,
            Status::Warn => 1,
            Status::Fail => exit::UNSUITABLE,
        }
    }
}

/// One row of the report.
#[derive(Debug, Serialize)]
struct Check {
    check: &'static str,
    status: Status,
    /// The node it is about (`host:port`), on a cluster or behind Sentinels.
    #[serde(skip_serializing_if = "Option::is_none")]
    node: Option<String>,
    detail: String,
}

fn check(check: &'static str, status: Status, detail: impl Into<String>) -> Check {
    Check {
        check,
        status,
        node: None,
        detail: detail.into(),
    }
}

impl Check {
    /// The same check, about `node`.
    fn on(self, node: Option<&str>) -> Check {
        Check {
            node: node.map(str::to_owned),
            ..self
        }
    }
}

#[derive(Debug, Serialize)]
struct Report {
    /// The server checked: `--url` with any password hidden.
    server: String,
    worst: Status,
    checks: Vec<Check>,
}

/// The order of the rows: every node's row of one check, then the next check.
const ORDER: [&str; 10] = [
    "version",
    "engine",
    "maxmemory-policy",
    "persistence",
    "replication",
    "min-replicas",
    "cluster",
    "sentinel",
    "acl",
    "clock",
];

impl Args {
    pub(crate) async fn execute(self, ctx: &Context) -> Result<ExitCode, CliError> {
        let redsem = ctx.connect_checking(ServerChecks::Off).await?;
        let findings = redsem.check_server().await?;
        let mut checks = match ctx.target()? {
            Target::Server => {
                let mut conn = ctx.node_connection(ctx.url()).await?;
                let info = info(&mut conn).await;
                let mut checks =
                    node_checks(ctx.replica_acks(), &mut conn, &info, &findings, None).await;
                checks.push(cluster(&info, &mut conn).await);
                checks
            }
            Target::Cluster(nodes) => cluster_checks(ctx, &nodes, &findings).await?,
            Target::Sentinel {
                sentinels: nodes,
                master,
                db,
                ..
            } => {
                let (host, port) = ctx.primary_of(&nodes, &master).await?;
                let node = format!("{host}:{port}");
                let mut conn = ctx
                    .node_connection(&nodes.node_url(&host, port, db))
                    .await?;
                let info = info(&mut conn).await;
                let mut checks =
                    node_checks(ctx.replica_acks(), &mut conn, &info, &findings, Some(&node)).await;
                checks.push(sentinel::row(ctx, &nodes, &master, (&host, port), &info).await);
                checks.push(
                    sentinel::min_replicas_row(&mut conn, &info)
                        .await
                        .on(Some(&node)),
                );
                checks
            }
            _ => return Err(crate::target::unsupported(ctx.url())),
        };
        checks.push(acl(&findings, ctx.prefix()));
        checks.push(engine(&redsem.engine()));
        checks.retain(|c| !c.detail.is_empty());
        // A stable sort: the nodes stay in their order within each check.
        checks.sort_by_key(|c| ORDER.iter().position(|&name| name == c.check));
        let worst = checks.iter().map(|c| c.status).max().unwrap_or(Status::Ok);
        if self.json {
            let server = ctx.redacted_url();
            output::print(&output::json(&Report {
                server,
                worst,
                checks,
            })?)?;
        } else {
            let rows: Vec<Vec<String>> = checks
                .iter()
                .map(|c| {
                    let detail = match &c.node {
                        Some(node) => format!("{node}: {}", c.detail),
                        None => c.detail.clone(),
                    };
                    vec![c.check.to_owned(), c.status.label().to_owned(), detail]
                })
                .collect();
            let table = table(&["CHECK", "STATUS", "DETAIL"], &rows);
            let header = format!("server {}, prefix {}", ctx.server(), ctx.prefix());
            output::print(&format!("{header}\n\n{}", table.trim_end()))?;
        }
        Ok(ExitCode::from(worst.exit_code()))
    }
}

/// The checks of one server (all but `cluster`, `sentinel` and the library's `acl`), each
/// about `node` (none for the one server of a plain URL); `findings` are the library's, of
/// which those naming `node` count here; `acks` is `--replica-acks`.
async fn node_checks(
    acks: Option<ReplicaAcks>,
    conn: &mut MultiplexedConnection,
    info: &HashMap<String, String>,
    findings: &[ServerFinding],
    node: Option<&str>,
) -> Vec<Check> {
    let mine: Vec<ServerFinding> = findings
        .iter()
        .filter(|f| node.is_none_or(|node| names_node(&f.problem, node)))
        .cloned()
        .collect();
    vec![
        version(info).on(node),
        eviction(info, &mine).on(node),
        persistence(info, conn).await.on(node),
        replication(info, acks).on(node),
        clock(conn).await.on(node),
    ]
}

/// Which engine serves (`--engine`): redsem's Redis module, or the Lua scripts and why. Either
/// is ok: the connect failed already if `--engine native` found no module.
fn engine(serving: &ServingEngine) -> Check {
    match serving {
        ServingEngine::Scripts { why, .. } => {
            check("engine", Status::Ok, format!("{serving} ({why})"))
        }
        native => check("engine", Status::Ok, native.to_string()),
    }
}

/// Whether `text` names the node `host:port` (and not one whose port starts with this one's).
fn names_node(text: &str, node: &str) -> bool {
    text.match_indices(node).any(|(at, _)| {
        !text[at + node.len()..]
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_digit())
    })
}

/// The field of [`info`]'s map that holds, when `INFO` was refused, why (a name no server
/// uses: it has a space).
const INFO_REFUSED: &str = "(info refused)";

/// `INFO` (every default section) as `field -> value`. When it is refused (managed services
/// may: Upstash did not have it) the map holds only [`INFO_REFUSED`], the server's answer.
async fn info(conn: &mut MultiplexedConnection) -> HashMap<String, String> {
    let text: String = match redis::cmd("INFO").query_async(conn).await {
        Ok(text) => text,
        Err(err) => return HashMap::from([(INFO_REFUSED.to_owned(), err.to_string())]),
    };
    text.lines()
        .filter_map(|line| line.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect()
}

/// Why `field` is not in `info`: INFO was refused (and what the server said), or it answered
/// without that field (a service may leave sections out).
fn unread(info: &HashMap<String, String>, field: &str) -> String {
    match info.get(INFO_REFUSED) {
        Some(why) => format!("INFO is refused ({why})"),
        None => format!("INFO shows no {field}"),
    }
}

/// `CONFIG GET name`, or why it could not be read: managed services refuse `CONFIG`
/// (ElastiCache, MemoryDB, Memorystore, Azure; the error says how).
async fn config(conn: &mut MultiplexedConnection, name: &str) -> Result<String, String> {
    let pairs: HashMap<String, String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg(name)
        .query_async(conn)
        .await
        .map_err(|e| format!("CONFIG GET refused: {e}"))?;
    pairs
        .get(name)
        .cloned()
        .ok_or_else(|| format!("CONFIG GET {name} answered nothing"))
}

/// The server and its version, recognised by `server_name` (Valkey 8 and later report
/// `redis_version:7.2.4` whatever they are, with their own version in `valkey_version`),
/// never by `redis_version` alone.
fn version(info: &HashMap<String, String>) -> Check {
    let Some(redis_version) = info.get("redis_version") else {
        return check(
            "version",
            Status::Warn,
            format!(
                "unknown: {} (allow +info to have the server checked)",
                unread(info, "redis_version")
            ),
        );
    };
    let (server, version) = match info.get("server_name").map(String::as_str) {
        Some("valkey") => (
            "Valkey",
            info.get("valkey_version").unwrap_or(redis_version),
        ),
        Some(other) if !other.is_empty() && other != "redis" => (other, redis_version),
        _ => ("Redis", redis_version),
    };
    // Every Valkey has functions (it forked from Redis 7.2); Redis since 7.
    let major: u32 = redis_version
        .split('.')
        .next()
        .and_then(|m| m.parse().ok())
        .unwrap_or(0);
    if major >= 7 {
        check(
            "version",
            Status::Ok,
            format!("{server} {version}: functions available"),
        )
    } else {
        check(
            "version",
            Status::Warn,
            format!(
                "{server} {version}: no functions (Redis 7), so redsem runs its scripts by \
                 EVALSHA and the ACL rights cannot be checked in full; upgrade to Redis 7 or later"
            ),
        )
    }
}

fn eviction(info: &HashMap<String, String>, findings: &[ServerFinding]) -> Check {
    let found = findings.iter().filter(|f| f.setting == "maxmemory-policy");
    if let Some(worst) = found.max_by_key(|f| f.verdict == Verdict::Unsuitable) {
        let status = match worst.verdict {
            Verdict::Unsuitable => Status::Fail,
            _ => Status::Warn,
        };
        return check("maxmemory-policy", status, for_the_cli(&worst.problem));
    }
    let policy = info
        .get("maxmemory_policy")
        .map_or("unknown", String::as_str);
    let limit = info.get("maxmemory").map_or("0", String::as_str);
    let detail = match (policy, limit) {
        ("noeviction", "0") => "noeviction, no maxmemory limit: nothing is evicted".to_owned(),
        ("noeviction", _) => format!(
            "noeviction: nothing is evicted; when memory is full ({} maxmemory) grants and \
             releases fail with OOM errors until memory is freed",
            info.get("maxmemory_human").map_or(limit, String::as_str)
        ),
        (policy, _) => {
            format!("{policy}: live redsem state carries no TTL, so only idle state can be evicted")
        }
    };
    check("maxmemory-policy", Status::Ok, detail)
}

async fn persistence(info: &HashMap<String, String>, conn: &mut MultiplexedConnection) -> Check {
    let Some(aof) = info.get("aof_enabled") else {
        return check(
            "persistence",
            Status::Warn,
            format!("unknown: {}", unread(info, "aof_enabled")),
        );
    };
    if aof == "1" {
        return match config(conn, "appendfsync").await.as_deref() {
            Ok("always") => check(
                "persistence",
                Status::Ok,
                "AOF, appendfsync always: a restart loses nothing",
            ),
            Ok("everysec") => check(
                "persistence",
                Status::Ok,
                "AOF, appendfsync everysec: a restart (of the machine) may lose the last second's \
                 grants and releases; appendfsync always loses nothing",
            ),
            Ok(other) => check(
                "persistence",
                Status::Warn,
                format!(
                    "AOF, appendfsync {other}: the OS decides when it reaches disk, so a machine \
                     restart may lose recent grants; set appendfsync everysec or always"
                ),
            ),
            Err(why) => check(
                "persistence",
                Status::Ok,
                format!(
                    "AOF on (INFO aof_enabled:1; appendfsync unknown, {why}; always loses \
                     nothing, everysec up to a second)"
                ),
            ),
        };
    }
    let save = config(conn, "save").await;
    let lost = "a restart loses the grants since the last snapshot: their holders learn at \
                their next renewal, and until then new grants may coexist with them";
    match save.as_deref() {
        Ok("") => check(
            "persistence",
            Status::Warn,
            "none (appendonly no, no save points): a restart loses every grant, holders learn \
             at their next renewal and until then new grants may coexist with them; set \
             appendonly yes (appendfsync everysec or always)",
        ),
        Ok(points) => check(
            "persistence",
            Status::Warn,
            format!("RDB snapshots only (save {points}): {lost}; set appendonly yes"),
        ),
        Err(why) => check(
            "persistence",
            Status::Warn,
            format!(
                "appendonly no (INFO aof_enabled:0; save points unknown, {why}{}): {lost}; \
                 set appendonly yes (managed services: their persistence setting)",
                last_snapshot(info)
            ),
        ),
    }
}

/// What INFO says of the last RDB snapshot, for when the save points cannot be read:
/// `; INFO: last snapshot at <unix time>, N changes since`, or nothing.
fn last_snapshot(info: &HashMap<String, String>) -> String {
    match (
        info.get("rdb_last_save_time"),
        info.get("rdb_changes_since_last_save"),
    ) {
        (Some(at), Some(changes)) => {
            format!("; INFO: last snapshot at {at} (unix time), {changes} changes since")
        }
        _ => String::new(),
    }
}

fn replication(info: &HashMap<String, String>, acks: Option<ReplicaAcks>) -> Check {
    let Some(role) = info.get("role") else {
        return check(
            "replication",
            Status::Warn,
            format!("unknown: {}", unread(info, "role")),
        );
    };
    if role == "slave" {
        let primary = format!(
            "{}:{}",
            info.get("master_host").map_or("?", String::as_str),
            info.get("master_port").map_or("?", String::as_str)
        );
        return check(
            "replication",
            Status::Fail,
            format!(
                "this server is a replica of {primary} and refuses writes; point --url at the \
                 primary"
            ),
        );
    }
    let count: usize = info
        .get("connected_slaves")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    if count == 0 {
        if let Some(acks) = acks {
            return check(
                "replication",
                Status::Fail,
                format!(
                    "primary without replicas, and --replica-acks {}: every grant would be \
                     given back and every change fail (exit 75); add replicas or drop \
                     --replica-acks",
                    acks.replicas
                ),
            );
        }
        return check(
            "replication",
            Status::Ok,
            "primary, no replicas: nothing is lost to a failover (and nothing takes over if \
             this server fails)",
        );
    }
    let mut lagging = Vec::new();
    let mut replicas = Vec::new();
    let mut online = 0;
    for n in 0..count {
        let Some(line) = info.get(&format!("slave{n}")) else {
            continue;
        };
        let fields: HashMap<&str, &str> = line
            .split(',')
            .filter_map(|kv| kv.split_once('='))
            .collect();
        let name = format!(
            "{}:{}",
            fields.get("ip").unwrap_or(&"?"),
            fields.get("port").unwrap_or(&"?")
        );
        let state = fields.get("state").copied().unwrap_or("?");
        let lag: u64 = fields.get("lag").and_then(|l| l.parse().ok()).unwrap_or(0);
        if state == "online" {
            online += 1;
        }
        if state != "online" || lag > LAG_TOLERANCE {
            lagging.push(format!("{name} ({state}, lag {lag}s)"));
        }
        replicas.push(format!("{name} lag {lag}s"));
    }
    if let Some(acks) = acks
        && online < acks.replicas
    {
        return check(
            "replication",
            Status::Fail,
            format!(
                "--replica-acks {} but {online} of {count} replica(s) online ({}): every grant \
                 would be given back and every change fail (exit 75); lower --replica-acks or \
                 bring the replicas back",
                acks.replicas,
                replicas.join(", ")
            ),
        );
    }
    let failover = match acks {
        None => "replication is asynchronous: a failover loses the grants the replica had not \
                 received (those holders learn at their next renewal); --replica-acks 1 has \
                 each change wait for a replica"
            .to_owned(),
        Some(acks) => format!(
            "each change waits for {} replica(s) (--replica-acks), so a failover to one that \
             acknowledged it keeps it",
            acks.replicas
        ),
    };
    if lagging.is_empty() {
        check(
            "replication",
            Status::Ok,
            format!(
                "primary, {count} replica(s) online ({}); {failover}",
                replicas.join(", ")
            ),
        )
    } else {
        check(
            "replication",
            Status::Warn,
            format!(
                "replica(s) behind or not online: {}; {failover}; check the replicas' links \
                 and load",
                lagging.join(", ")
            ),
        )
    }
}

async fn cluster(info: &HashMap<String, String>, conn: &mut MultiplexedConnection) -> Check {
    if info.get("cluster_enabled").map(String::as_str) != Some("1") {
        return check("cluster", Status::Ok, "");
    }
    let text: Result<String, _> = redis::cmd("CLUSTER").arg("INFO").query_async(conn).await;
    let Ok(text) = text else {
        return check(
            "cluster",
            Status::Warn,
            "cluster mode, state unknown: CLUSTER INFO refused (allow +cluster|info)",
        );
    };
    let state = text
        .lines()
        .find_map(|l| l.strip_prefix("cluster_state:"))
        .map_or("unknown", str::trim);
    if state == "ok" {
        check("cluster", Status::Ok, "cluster mode, cluster_state ok")
    } else {
        check(
            "cluster",
            Status::Fail,
            format!(
                "cluster mode, cluster_state {state}: slots are not all served, so some \
                 semaphores cannot be used; fix the cluster (redis-cli --cluster check)"
            ),
        )
    }
}

fn acl(findings: &[ServerFinding], prefix: &str) -> Check {
    let problems: Vec<&ServerFinding> = findings
        .iter()
        .filter(|f| f.setting.starts_with("ACL"))
        .collect();
    if problems.is_empty() {
        return check(
            "acl",
            Status::Ok,
            format!(
                "the user may run every command redsem needs on keys and channels under \
                 {prefix}:"
            ),
        );
    }
    let status = if problems.iter().any(|f| f.verdict == Verdict::Unsuitable) {
        Status::Fail
    } else {
        Status::Warn
    };
    let detail: Vec<String> = problems.iter().map(|f| for_the_cli(&f.problem)).collect();
    check("acl", status, detail.join("; "))
}

/// A library finding in the CLI's words: its option instead of the library's.
fn for_the_cli(problem: &str) -> String {
    problem.replace("ServerChecks::Warn", "--server-checks warn")
}

async fn clock(conn: &mut MultiplexedConnection) -> Check {
    let before = SystemTime::now();
    let time: Result<(u64, u64), _> = redis::cmd("TIME").query_async(conn).await;
    let after = SystemTime::now();
    let Ok((secs, micros)) = time else {
        return check(
            "clock",
            Status::Warn,
            "unknown: TIME refused (allow +time; redsem's scripts read it)",
        );
    };
    let server = Duration::from_secs(secs) + Duration::from_micros(micros);
    let since = |t: SystemTime| t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let local = (since(before) + since(after)) / 2;
    let (diff, way) = if server >= local {
        (server - local, "ahead of")
    } else {
        (local - server, "behind")
    };
    let shown = output::duration(diff);
    if diff > CLOCK_TOLERANCE {
        check(
            "clock",
            Status::Warn,
            format!(
                "the server's clock is {shown} {way} this machine's; redsem uses only the \
                 server's, so this misleads people reading times, not the guarantees; run NTP \
                 on both"
            ),
        )
    } else {
        check(
            "clock",
            Status::Ok,
            format!("the server's clock is within {shown} of this machine's"),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn what_info_did_not_say_is_told_from_what_it_refused() {
        // Refused: the server's answer is shown.
        let refused = info(&[(INFO_REFUSED, "NOPERM no permissions to run 'info'")]);
        let version = version(&refused);
        assert!(
            version
                .detail
                .contains("INFO is refused (NOPERM no permissions"),
            "{}",
            version.detail
        );
        assert_eq!(
            replication(&refused, None).detail,
            "unknown: INFO is refused (NOPERM no permissions to run 'info')"
        );
        // Answered without a section (Upstash leaves some out): the field is named.
        let partial = info(&[("redis_version", "6.2.0")]);
        assert_eq!(
            replication(&partial, None).detail,
            "unknown: INFO shows no role"
        );
    }

    #[test]
    fn the_server_is_named_by_server_name_and_valkey_by_its_own_version() {
        let valkey = version(&info(&[
            ("redis_version", "7.2.4"),
            ("server_name", "valkey"),
            ("valkey_version", "8.1.1"),
        ]));
        assert_eq!(valkey.detail, "Valkey 8.1.1: functions available");
        let redis = version(&info(&[("redis_version", "7.0.15")]));
        assert_eq!(redis.detail, "Redis 7.0.15: functions available");
        let old = version(&info(&[
            ("redis_version", "6.2.14"),
            ("server_name", "redis"),
        ]));
        assert!(
            old.detail.starts_with("Redis 6.2.14: no functions"),
            "{}",
            old.detail
        );
        assert!(matches!(old.status, Status::Warn));
    }
}
