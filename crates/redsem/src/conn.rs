//! The command connection: one Redis server or a Redis Cluster. Nothing outside this file
//! knows which.

use std::sync::{Arc, LazyLock, Mutex};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
#[cfg(feature = "cluster")]
use redis::cluster_async::ClusterConnection;
use redis::{
    Cmd, ConnectionAddr, ErrorKind, Pipeline, RedisFuture, Script, ServerErrorKind, Value,
};

use crate::error::Result;

/// Every command goes through this: multiplexed, reconnecting, cheap to clone.
#[derive(Clone)]
pub(crate) enum Conn {
    /// One server (or a primary behind a proxy), through a reconnecting manager.
    Single(Single),
    /// A cluster: each script goes to the node owning its keys' slot.
    #[cfg(feature = "cluster")]
    /// (And whether its primaries refuse functions; see `script::Scripting`.)
    Cluster(ClusterConnection, Arc<std::sync::atomic::AtomicBool>),
}

/// A [`ConnectionManager`] that is replaced when a reconnection fails for good.
///
/// The manager reconnects by itself after I/O errors, but a reconnection refused with an
/// error of another kind (an `AUTH` refused while a password was being rotated) stays its
/// answer to every later command. Here such a failure starts a fresh manager (lazily: it
/// connects on the next command), so the client recovers as soon as the server accepts it
/// again.
#[derive(Clone)]
pub(crate) struct Single {
    inner: Arc<SingleInner>,
}

struct SingleInner {
    client: redis::Client,
    config: ConnectionManagerConfig,
    /// The manager in use and how many times it was replaced.
    current: Mutex<(u64, ConnectionManager)>,
    /// The server refused functions: scripts go by EVALSHA (see `script::Scripting`).
    functions_refused: std::sync::atomic::AtomicBool,
}

impl Single {
    pub(crate) async fn new(
        client: redis::Client,
        config: ConnectionManagerConfig,
    ) -> Result<Single> {
        let manager = ConnectionManager::new_with_config(client.clone(), config.clone()).await?;
        Ok(Single {
            inner: Arc::new(SingleInner {
                client,
                config,
                current: Mutex::new((0, manager)),
                functions_refused: std::sync::atomic::AtomicBool::new(false),
            }),
        })
    }

    fn current(&self) -> (u64, ConnectionManager) {
        let current = self.inner.current.lock().unwrap_or_else(|p| p.into_inner());
        (current.0, current.1.clone())
    }

    /// After `err` from the manager of `generation`: replace it if the error is one the
    /// manager never recovers from by itself.
    fn after_error(&self, generation: u64, err: &redis::RedisError) {
        if err.kind() != ErrorKind::AuthenticationFailed {
            return;
        }
        let Ok(fresh) = ConnectionManager::new_lazy_with_config(
            self.inner.client.clone(),
            self.inner.config.clone(),
        ) else {
            return;
        };
        let mut current = self.inner.current.lock().unwrap_or_else(|p| p.into_inner());
        if current.0 == generation {
            tracing::warn!(error = %err, "redis refused to authenticate a reconnection; starting over");
            *current = (generation + 1, fresh);
        }
    }
}

impl ConnectionLike for Single {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut manager) = self.current();
            let result = manager.req_packed_command(cmd).await;
            if let Err(err) = &result {
                self.after_error(generation, err);
            }
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut manager) = self.current();
            let result = manager.req_packed_commands(pipeline, offset, count).await;
            if let Err(err) = &result {
                self.after_error(generation, err);
            }
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.current().1.get_db()
    }
}

impl crate::script::Scripting for Conn {
    fn functions_refused(&self) -> Option<&std::sync::atomic::AtomicBool> {
        match self {
            Conn::Single(single) => Some(&single.inner.functions_refused),
            #[cfg(feature = "cluster")]
            Conn::Cluster(_, refused) => Some(refused),
        }
    }
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c, _) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Conn::Single(c) => c.req_packed_commands(pipeline, offset, count),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c, _) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            #[cfg(feature = "cluster")]
            Conn::Cluster(c, _) => c.get_db(),
        }
    }
}

/// One primary of a cluster, from `CLUSTER NODES`.
#[derive(Debug, Clone, PartialEq, Eq)]
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(crate) struct Primary {
    pub(crate) host: String,
    pub(crate) port: u16,
    /// The hash slots it serves, as inclusive ranges.
    pub(crate) slots: Vec<(u16, u16)>,
}

/// The primaries of a cluster that are not failing, from `CLUSTER NODES`.
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(crate) fn primaries(cluster_nodes: &str) -> Vec<Primary> {
    cluster_nodes
        .lines()
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let flags = fields.get(2)?;
            if !flags.split(',').any(|f| f == "master") || flags.contains("fail") {
                return None;
            }
            // ip:port@cport[,hostname]
            let addr = fields.get(1)?.split('@').next()?;
            let (host, port) = addr.rsplit_once(':')?;
            // Slots: `0-5460` or `5461`; `[5461->-...]` (migrating) entries are skipped.
            let slots = fields
                .iter()
                .skip(8)
                .filter_map(|range| match range.split_once('-') {
                    Some((from, to)) => Some((from.parse().ok()?, to.parse().ok()?)),
                    None => range.parse().ok().map(|slot| (slot, slot)),
                })
                .collect();
            Some(Primary {
                host: host.to_owned(),
                port: port.parse().ok()?,
                slots,
            })
        })
        .collect()
}

/// The cluster hash slot of `key` (CRC16/XMODEM of its hash tag, modulo 16384).
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(crate) fn slot_of(key: &str) -> u16 {
    let bytes = key.as_bytes();
    let hashed = bytes
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let rest = &bytes[open + 1..];
            let len = rest.iter().position(|&b| b == b'}')?;
            (len > 0).then(|| &rest[..len])
        })
        .unwrap_or(bytes);
    let mut crc: u16 = 0;
    for &byte in hashed {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % 16384
}

/// A client for one node of a cluster, with the credentials, database and TLS of `seed`.
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
pub(crate) fn node_client(seed: &redis::Client, host: &str, port: u16) -> Result<redis::Client> {
    let info = seed.get_connection_info().clone();
    let addr = match info.addr() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host: host.to_owned(),
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host.to_owned(), port),
    };
    Ok(redis::Client::open(info.set_addr(addr))?)
}

/// The connect-time probe of the user's ACL rights, run by EVALSHA with a key and a channel
/// under the prefix (`KEYS[1]`, `ARGV[1]`): asks `redis.acl_check_cmd` (Redis 7) about every
/// command redsem's scripts and its pub/sub connection run, with those as their key or
/// channel. It writes nothing. Returns the names of the commands refused; nothing on servers
/// without `redis.acl_check_cmd`.
///
/// Keep the list in step with the commands of `lua/*.lua`.
const ACL_PROBE_LUA: &str = r#"
if not redis.acl_check_cmd then return {} end
local k, c = KEYS[1], ARGV[1]
local probes = {
  {'TIME'}, {'TYPE', k}, {'EXISTS', k}, {'DEL', k}, {'GET', k}, {'SET', k, '1'},
  {'INCRBY', k, '1'}, {'DECR', k}, {'DECRBY', k, '1'}, {'PEXPIRE', k, '1'},
  {'PEXPIREAT', k, '1'}, {'PERSIST', k},
  {'HGET', k, 'f'}, {'HMGET', k, 'f'}, {'HGETALL', k}, {'HLEN', k}, {'HSET', k, 'f', '1'},
  {'HINCRBY', k, 'f', '1'}, {'HDEL', k, 'f'},
  {'ZADD', k, '1', 'm'}, {'ZCARD', k}, {'ZRANGE', k, '0', '1'}, {'ZRANGEBYSCORE', k, '0', '1'}, {'ZREVRANGEBYSCORE', k, '1', '0'},
  {'ZRANK', k, 'm'}, {'ZSCORE', k, 'm'}, {'ZREM', k, 'm'}, {'ZREMRANGEBYRANK', k, '0', '1'},
  {'ZREMRANGEBYSCORE', k, '0', '1'}, {'BITPOS', k, '0'}, {'SETBIT', k, '0', '1'},
  {'BITCOUNT', k}, {'SETRANGE', k, '0', 'x'}, {'STRLEN', k},
  {'PING'}, {'PUBLISH', c, ''}, {'SUBSCRIBE', c}, {'UNSUBSCRIBE', c},
}
local refused = {}
for _, probe in ipairs(probes) do
  local ok, allowed = pcall(redis.acl_check_cmd, unpack(probe))
  if ok and not allowed then refused[#refused + 1] = probe[1] end
end
return refused
"#;

static ACL_PROBE: LazyLock<Script> = LazyLock::new(|| Script::new(ACL_PROBE_LUA));

/// What the connect-time check of one node found.
#[derive(Debug, Default)]
pub(crate) struct Findings {
    /// Settings under which redsem's guarantees would not hold: (setting, problem).
    pub(crate) unsuitable: Vec<(String, String)>,
    /// What could not be checked, and why: (setting, what).
    pub(crate) unchecked: Vec<(String, String)>,
}

/// Where and as whom one node is checked.
pub(crate) struct Probe<'a> {
    /// How the node is named in messages (`host:port`).
    pub(crate) node: &'a str,
    /// The key prefix, for the ACL patterns in messages.
    pub(crate) prefix: &'a str,
    /// A key under the prefix that this node serves; never written.
    pub(crate) key: &'a str,
    /// A channel under the prefix.
    pub(crate) channel: &'a str,
    /// The ACL rules redsem needs, for messages.
    pub(crate) rules: &'a str,
}

/// Check one node in one round trip: `INFO memory` (the eviction policy), `SCRIPT LOAD` of the
/// ACL probe and its `EVALSHA` (script rights, key rights, the rights of every command the
/// scripts run, channel rights). Writes no data.
///
/// # Errors
///
/// Only when the node cannot be reached; what the node refuses is a finding.
pub(crate) async fn check_node(
    conn: &mut impl ConnectionLike,
    probe: &Probe<'_>,
) -> Result<Findings> {
    let mut pipe = redis::pipe();
    pipe.ignore_errors();
    pipe.cmd("INFO").arg("memory");
    pipe.cmd("SCRIPT").arg("LOAD").arg(ACL_PROBE_LUA);
    pipe.cmd("EVALSHA")
        .arg(ACL_PROBE.get_hash())
        .arg(1)
        .arg(probe.key)
        .arg(probe.channel);
    let replies: Vec<redis::RedisResult<Value>> = pipe.query_async(conn).await?;
    let mut replies = replies.into_iter();
    let mut findings = Findings::default();
    let node = probe.node;
    let (info, load, eval) = (replies.next(), replies.next(), replies.next());
    match info.map(|r| r.and_then(|v| redis::from_redis_value::<String>(v).map_err(Into::into))) {
        Some(Ok(info)) => match eviction_policy(&info) {
            Some(policy) if policy.starts_with("allkeys-") => findings.unsuitable.push((
                "maxmemory-policy".to_owned(),
                format!(
                    "{node} has maxmemory-policy {policy}: when memory is full Redis evicts any \
                     key, including the state of held permits, and a unit could then be \
                     granted twice; set maxmemory-policy to noeviction (writes then fail with \
                     OOM errors when memory is full, which redsem reports as errors) or to a \
                     volatile-* policy (only idle redsem state carries a TTL), or accept the \
                     risk with ServerChecks::Warn"
                ),
            )),
            Some(_) => {}
            None => findings.unchecked.push((
                "maxmemory-policy".to_owned(),
                format!(
                    "{node}: INFO memory shows no maxmemory_policy; the eviction policy is unknown"
                ),
            )),
        },
        Some(Err(err)) if is_noperm(&err) => findings.unchecked.push((
            "maxmemory-policy".to_owned(),
            format!(
                "{node}: INFO is refused by the ACL, so the eviction policy cannot be checked; \
                 make sure it is noeviction or volatile-* (allow +info to have it checked)"
            ),
        )),
        Some(Err(err)) => findings.unchecked.push((
            "maxmemory-policy".to_owned(),
            format!("{node}: INFO memory failed ({err}); the eviction policy is unknown"),
        )),
        None => {}
    }
    let rules = probe.rules;
    if let Some(Err(err)) = &load
        && is_noperm(err)
    {
        findings.unsuitable.push((
            "ACL commands".to_owned(),
            format!(
                "{node}: the user may not run SCRIPT LOAD, which redsem needs to (re)load its \
                 scripts; grant {rules}"
            ),
        ));
    }
    match eval {
        Some(Ok(refused)) => {
            let refused: Vec<String> = redis::from_redis_value(refused).unwrap_or_default();
            let pubsub = ["PUBLISH", "SUBSCRIBE", "UNSUBSCRIBE", "PING"];
            let (on_channels, on_keys): (Vec<String>, Vec<String>) = refused
                .into_iter()
                .partition(|c| pubsub.contains(&c.as_str()));
            let prefix = probe.prefix;
            if !on_keys.is_empty() {
                findings.unsuitable.push((
                    "ACL commands".to_owned(),
                    format!(
                        "{node}: the user may not run {} (redsem's scripts run them on keys \
                         under {prefix}:); grant {rules}",
                        on_keys.join(", ")
                    ),
                ));
            }
            if !on_channels.is_empty() {
                findings.unsuitable.push((
                    "ACL channels".to_owned(),
                    format!(
                        "{node}: the user may not run {} on channel {} (waiters are woken on \
                         channels under {prefix}:); allow them with {} +publish +subscribe \
                         +unsubscribe +ping (all of it: {rules})",
                        on_channels.join(", "),
                        probe.channel,
                        channel_pattern(rules),
                    ),
                ));
            }
        }
        Some(Err(err)) if is_noperm(&err) => {
            let on_key = err.detail().is_some_and(|d| d.contains("key"));
            findings.unsuitable.push(if on_key {
                (
                    "ACL keys".to_owned(),
                    format!(
                        "{node}: the user may not use key {} (redsem keeps its state in keys \
                         under {}:); allow them with {} (all of it: {rules})",
                        probe.key,
                        probe.prefix,
                        key_pattern(rules),
                    ),
                )
            } else {
                (
                    "ACL commands".to_owned(),
                    format!(
                        "{node}: the user may not run EVALSHA, which every redsem operation is; \
                         grant {rules}"
                    ),
                )
            });
        }
        // MOVED (a slot in migration), NOSCRIPT (SCRIPT LOAD refused): nothing more to learn.
        Some(Err(err)) => findings.unchecked.push((
            "ACL commands".to_owned(),
            format!("{node}: the ACL probe failed ({err}); rights not checked"),
        )),
        None => {}
    }
    Ok(findings)
}

fn is_noperm(err: &redis::RedisError) -> bool {
    err.kind() == ErrorKind::Server(ServerErrorKind::NoPerm)
}

/// The `~...` key pattern in `rules`.
fn key_pattern(rules: &str) -> &str {
    rules
        .split_whitespace()
        .find(|r| r.starts_with('~'))
        .unwrap_or_default()
}

/// The `&...` channel pattern in `rules`.
fn channel_pattern(rules: &str) -> &str {
    rules
        .split_whitespace()
        .find(|r| r.starts_with('&'))
        .unwrap_or_default()
}

/// `maxmemory_policy` of an `INFO memory` reply.
fn eviction_policy(info: &str) -> Option<&str> {
    info.lines()
        .find_map(|line| line.strip_prefix("maxmemory_policy:"))
        .map(str::trim)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_acl_probe_asks_about_every_command_the_scripts_run() {
        let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua");
        let mut missing = Vec::new();
        for entry in std::fs::read_dir(&dir).expect("lua dir") {
            let path = entry.expect("entry").path();
            let text = std::fs::read_to_string(&path).expect("read");
            // Commands appear as the first quoted upper-case word after `call(` / `pcall(`.
            for (i, _) in text.match_indices("call(") {
                let rest = &text[i..];
                let Some(open) = rest.find('\'') else {
                    continue;
                };
                let word: String = rest[open + 1..]
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase())
                    .collect();
                if word.len() > 1
                    && rest[..open].lines().count() == 1
                    && !ACL_PROBE_LUA.contains(&format!("{{'{word}'"))
                {
                    missing.push(format!("{word} ({})", path.display()));
                }
            }
        }
        missing.sort();
        missing.dedup();
        assert!(missing.is_empty(), "not in ACL_PROBE_LUA: {missing:?}");
    }

    #[test]
    fn primaries_are_read_from_cluster_nodes() {
        let nodes = "\
07c3 127.0.0.1:30001@40001 myself,master - 0 0 1 connected 0-5460
67ed 127.0.0.1:30002@40002 master - 0 1426238316232 2 connected 5461-10922
292f 127.0.0.1:30004@40004 slave 07c3 0 1426238318243 4 connected
824f 127.0.0.1:30003@40003 master,fail - 0 1426238317741 3 connected
";
        let primary = |port, slots| Primary {
            host: "127.0.0.1".to_owned(),
            port,
            slots: vec![slots],
        };
        assert_eq!(
            primaries(nodes),
            vec![primary(30001, (0, 5460)), primary(30002, (5461, 10922))]
        );
    }

    #[test]
    fn single_slots_and_migrating_entries_are_read() {
        let nodes = "a 10.0.0.1:7000@17000 master - 0 0 1 connected 0-10 12 [13->-b]\n";
        assert_eq!(primaries(nodes)[0].slots, vec![(0, 10), (12, 12)]);
    }

    #[test]
    fn slots_are_those_of_redis_cluster() {
        // Values from `CLUSTER KEYSLOT`.
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("123456789"), 0x31C3); // the CRC16/XMODEM check value
        assert_eq!(slot_of("a{}b"), slot_of("a{}b"));
    }
}
