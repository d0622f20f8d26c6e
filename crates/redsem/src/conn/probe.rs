//! The connect-time check of one node: its eviction policy (`INFO memory`) and the user's
//! ACL rights, probed by a script that writes nothing.

use std::sync::LazyLock;

use redis::aio::ConnectionLike;
use redis::{ErrorKind, Script, ServerErrorKind, Value};

use crate::error::Result;

/// The connect-time probe of the user's ACL rights, run by EVALSHA with a key and a channel
/// under the prefix (`KEYS[1]`, `ARGV[1]`): asks `redis.acl_check_cmd` (Redis 7) about every
/// command redsem's scripts and its pub/sub connection run, with those as their key or
/// channel (and, for a sharded channel, `SPUBLISH`, `SSUBSCRIBE` and `SUNSUBSCRIBE` too). It
/// writes nothing. Returns the names of the commands refused; nothing on servers without
/// `redis.acl_check_cmd`.
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
if string.byte(c, -1) == 125 then -- a sharded channel (a cluster's, ending with '}': keys::is_sharded)
  local sharded = { {'SPUBLISH', c, ''}, {'SSUBSCRIBE', c}, {'SUNSUBSCRIBE', c} }
  for _, probe in ipairs(sharded) do probes[#probes + 1] = probe end
end
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
    /// Whether every change is sent with a `WAIT` (`RedsemOptions::replica_acks`): then the
    /// check sends `WAIT 0 1` too (it returns at once), which some services refuse.
    pub(crate) waits: bool,
}

/// Check one node in one round trip: `INFO memory` (the eviction policy), `SCRIPT LOAD` of the
/// ACL probe and its `EVALSHA` (script rights, key rights, the rights of every command the
/// scripts run, channel rights), and `WAIT 0 1` when every change will be sent with a `WAIT`.
/// Writes no data.
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
    if probe.waits {
        pipe.cmd("WAIT").arg(0).arg(1);
    }
    let replies: Vec<redis::RedisResult<Value>> = pipe.query_async(conn).await?;
    let mut replies = replies.into_iter();
    let mut findings = Findings::default();
    let node = probe.node;
    let (info, load, eval, wait) = (
        replies.next(),
        replies.next(),
        replies.next(),
        replies.next(),
    );
    // Refused by the ACL (NOPERM) or by the service (ElastiCache Serverless has no WAIT):
    // every change would fail.
    if let Some(Err(err)) = &wait {
        findings.unsuitable.push((
            "ACL commands".to_owned(),
            format!(
                "{node}: the server refuses WAIT ({err}), which replica_acks sends with every \
                 change, so every change would fail; grant +wait, or connect without \
                 replica_acks where the server has no WAIT"
            ),
        ));
    }
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
            let pubsub = [
                "PUBLISH",
                "SUBSCRIBE",
                "UNSUBSCRIBE",
                "PING",
                "SPUBLISH",
                "SSUBSCRIBE",
                "SUNSUBSCRIBE",
            ];
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
                         channels under {prefix}:); allow them with {} +@pubsub +ping (all \
                         of it: {rules})",
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
        let mut dirs = vec![std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("lua")];
        let mut files = Vec::new();
        while let Some(dir) = dirs.pop() {
            for entry in std::fs::read_dir(&dir).expect("lua dir") {
                let path = entry.expect("entry").path();
                if path.is_dir() {
                    dirs.push(path);
                } else {
                    files.push(path);
                }
            }
        }
        let mut missing = Vec::new();
        for path in files {
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
}
