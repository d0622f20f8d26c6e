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
  {'ZADD', k, '1', 'm'}, {'ZCARD', k}, {'ZRANGE', k, '0', '1'}, {'ZRANGEBYSCORE', k, '0', '1'}, {'ZRANGEBYLEX', k, '-', '+'}, {'ZLEXCOUNT', k, '-', '+'}, {'ZREVRANGEBYSCORE', k, '1', '0'},
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
    // Redis Enterprise's Active-Active databases (and Azure's active geo-replication, built
    // on them) add a `crdt` section to INFO; other servers answer an unknown section with
    // nothing.
    pipe.cmd("INFO").arg("crdt");
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
    let (info, crdt, load, eval, wait) = (
        replies.next(),
        replies.next(),
        replies.next(),
        replies.next(),
        replies.next(),
    );
    let info_refused = matches!(&info, Some(Err(_)));
    match crdt.map(|r| r.and_then(|v| redis::from_redis_value::<String>(v).map_err(Into::into))) {
        Some(Ok(crdt)) => {
            if let Some(field) = multi_primary(&crdt) {
                findings.unsuitable.push((
                    "multi-primary".to_owned(),
                    format!(
                        "{node} is an instance of a multi-primary database (Active-Active, \
                         CRDT: INFO shows {field}): each region takes writes on its own and \
                         merges them later, so two regions can grant the same unit at once and \
                         hand out the same fencing token; redsem needs one primary for each \
                         key; use a database without Active-Active (active geo-replication), \
                         or accept the risk with ServerChecks::Warn"
                    ),
                ));
            }
        }
        Some(Err(err)) if !info_refused => findings.unchecked.push((
            "multi-primary".to_owned(),
            format!(
                "{node}: INFO crdt failed ({err}); whether it is a multi-primary (Active-Active) \
                 database is unknown"
            ),
        )),
        _ => {}
    }
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
            let on_key = err.detail().is_some_and(refuses_a_key);
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

/// Whether a `NOPERM` refusal's text is about a key rather than the command. Every server
/// words it its own way (Redis 6.2: "this user has no permissions to access one of the keys
/// used as arguments"; Redis 7, Valkey 8 and 9: "No permissions to access a key"), and a
/// refused command names the user ("User apikey has no permissions to run the 'evalsha'
/// command"), so a user's name with "key" in it is no key refusal: only the phrase counts
/// (a user's name holds no spaces).
fn refuses_a_key(detail: &str) -> bool {
    let detail = detail.to_ascii_lowercase();
    detail.contains("permissions to access") && detail.contains(" key")
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

/// The first `crdt_` field of an `INFO crdt` reply: there is one on an instance of a
/// multi-primary database (Redis Enterprise Active-Active: `crdt_config_version`,
/// `crdt_replid`, ...), none anywhere else.
fn multi_primary(info: &str) -> Option<&str> {
    info.lines()
        .map(str::trim)
        .find(|line| line.starts_with("crdt_"))
        .map(|line| line.split(':').next().unwrap_or(line))
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

    /// The fields Redis Enterprise documents for the `crdt` section of INFO on an
    /// Active-Active database ("Develop applications with Active-Active databases", INFO).
    const ACTIVE_ACTIVE_INFO: &str = "# CRDT\r\ncrdt_config_version:3\r\ncrdt_slots:0-16383\r\n\
        crdt_replid:1,2\r\ncrdt_clock:1042\r\ncrdt_ovc:1:1042,2:988\r\n";

    /// As Redis 6.2.14, 7.0.15, Valkey 8.1.8 and 9.1.2 word their refusals.
    #[test]
    fn a_key_refusal_is_told_from_a_command_refusal_on_every_server() {
        for key in [
            "this user has no permissions to access one of the keys used as arguments",
            "No permissions to access a key",
        ] {
            assert!(refuses_a_key(key), "{key}");
        }
        for command in [
            "this user has no permissions to run the 'evalsha' command or its subcommand",
            "User u has no permissions to run the 'evalsha' command",
            "User apikey has no permissions to run the 'evalsha' command",
            "User keys has no permissions to run the 'evalsha' command",
            "No permissions to access a channel",
        ] {
            assert!(!refuses_a_key(command), "{command}");
        }
    }

    /// The same on the server under test, in its own words, for a user whose name has "key"
    /// in it.
    #[tokio::test]
    async fn the_servers_own_key_refusal_is_told_from_its_command_refusal() {
        let server = redsem_test::RedisServer::start();
        let open = |url: String| async move {
            let client = redis::Client::open(url).expect("url");
            redsem_test::within(
                std::time::Duration::from_secs(10),
                "connect",
                client.get_multiplexed_async_connection(),
            )
            .await
            .expect("connect")
        };
        let mut admin = open(server.url()).await;
        let rules = [
            "SETUSER",
            "keyholder",
            "on",
            ">pw",
            "~p:*",
            "&*",
            "+@all",
            "-set",
        ];
        let () = redis::cmd("ACL")
            .arg(&rules)
            .query_async(&mut admin)
            .await
            .expect("ACL SETUSER");
        let mut user = open(format!("redis://keyholder:pw@127.0.0.1:{}", server.port())).await;
        let refusal = |reply: redis::RedisResult<Value>| {
            let err = reply.expect_err("refused");
            assert!(is_noperm(&err), "{err}");
            err.detail().unwrap_or_default().to_owned()
        };
        let key = refusal(redis::cmd("GET").arg("other").query_async(&mut user).await);
        assert!(refuses_a_key(&key), "{key}");
        let command = refusal(
            redis::cmd("SET")
                .arg("p:a")
                .arg(1)
                .query_async(&mut user)
                .await,
        );
        assert!(!refuses_a_key(&command), "{command}");
    }

    #[test]
    fn a_crdt_section_marks_a_multi_primary_database() {
        assert_eq!(
            multi_primary(ACTIVE_ACTIVE_INFO),
            Some("crdt_config_version")
        );
        assert_eq!(multi_primary(""), None);
        assert_eq!(
            multi_primary("# Memory\r\nused_memory:1\r\nmaxmemory_policy:noeviction\r\n"),
            None
        );
    }

    /// A connection that answers `INFO crdt` as an Active-Active instance does and passes
    /// every other command of a pipeline to the server, one by one.
    struct ActiveActive<C>(C);

    impl<C: ConnectionLike + Send> ConnectionLike for ActiveActive<C> {
        fn req_packed_command<'a>(
            &'a mut self,
            cmd: &'a redis::Cmd,
        ) -> redis::RedisFuture<'a, Value> {
            self.0.req_packed_command(cmd)
        }

        fn req_packed_commands<'a>(
            &'a mut self,
            pipeline: &'a redis::Pipeline,
            _offset: usize,
            _count: usize,
        ) -> redis::RedisFuture<'a, Vec<Value>> {
            Box::pin(async move {
                let mut replies = Vec::new();
                for cmd in pipeline.cmd_iter() {
                    let args: Vec<Vec<u8>> = cmd
                        .args_iter()
                        .filter_map(|arg| match arg {
                            redis::Arg::Simple(bytes) => Some(bytes.to_ascii_lowercase()),
                            _ => None,
                        })
                        .collect();
                    if args == [b"info".to_vec(), b"crdt".to_vec()] {
                        replies.push(Value::BulkString(ACTIVE_ACTIVE_INFO.into()));
                    } else {
                        replies.push(self.0.req_packed_command(cmd).await?);
                    }
                }
                Ok(replies)
            })
        }

        fn get_db(&self) -> i64 {
            self.0.get_db()
        }
    }

    /// On a server without Active-Active the check finds nothing; one whose INFO has a crdt
    /// section is unsuitable, named as multi-primary.
    #[tokio::test]
    async fn the_connect_check_refuses_an_active_active_database() {
        let server = redsem_test::RedisServer::start();
        let client = redis::Client::open(server.url()).expect("url");
        let conn = redsem_test::within(
            std::time::Duration::from_secs(10),
            "connect",
            client.get_multiplexed_async_connection(),
        )
        .await
        .expect("connect");
        let probe = Probe {
            node: "n:1",
            prefix: "p",
            key: "p:{acl}:probe",
            channel: "p:wake:x",
            rules: "~p:* &p:*",
            waits: false,
        };
        let plain = check_node(&mut conn.clone(), &probe)
            .await
            .expect("checked");
        assert!(
            !plain.unsuitable.iter().any(|(s, _)| s == "multi-primary"),
            "{:?}",
            plain.unsuitable
        );
        assert!(plain.unchecked.is_empty(), "{:?}", plain.unchecked);
        let aa = check_node(&mut ActiveActive(conn), &probe)
            .await
            .expect("checked");
        let found: Vec<&String> = aa
            .unsuitable
            .iter()
            .filter(|(s, _)| s == "multi-primary")
            .map(|(_, problem)| problem)
            .collect();
        assert_eq!(found.len(), 1, "{:?}", aa.unsuitable);
        assert!(
            found[0].contains("INFO shows crdt_config_version"),
            "{}",
            found[0]
        );
    }
}
