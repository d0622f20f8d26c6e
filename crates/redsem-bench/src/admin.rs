//! The bench's own view of the server and of this process: `INFO` sections, `CLIENT LIST`,
//! `MEMORY USAGE`, keys' types and sizes, key clean-up, and the process RSS. One connection of
//! its own, which every connection count leaves out.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use serde::Serialize;

use crate::BenchResult;

/// The admin connection.
pub(crate) struct Admin {
    pub(crate) client: redis::Client,
    conn: MultiplexedConnection,
    /// `CLIENT ID` of `conn`: left out of connection counts.
    id: u64,
}

/// Calls and CPU time of one command, from `INFO commandstats`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub(crate) struct CmdStat {
    pub(crate) calls: u64,
    pub(crate) usec: u64,
}

/// `INFO commandstats`, by command name (`evalsha`, `zadd`, `client|list`, ...).
#[derive(Debug, Clone, Default)]
pub(crate) struct CommandStats(pub(crate) BTreeMap<String, CmdStat>);

impl CommandStats {
    /// What changed from `before` to `self`; commands whose calls did not change are left out.
    pub(crate) fn since(&self, before: &CommandStats) -> CommandStats {
        let mut out = BTreeMap::new();
        for (name, now) in &self.0 {
            let was = before.0.get(name).copied().unwrap_or_default();
            if now.calls > was.calls {
                out.insert(
                    name.clone(),
                    CmdStat {
                        calls: now.calls - was.calls,
                        usec: now.usec.saturating_sub(was.usec),
                    },
                );
            }
        }
        CommandStats(out)
    }

    pub(crate) fn calls(&self, name: &str) -> u64 {
        self.0.get(name).map_or(0, |s| s.calls)
    }

    pub(crate) fn usec(&self, name: &str) -> u64 {
        self.0.get(name).map_or(0, |s| s.usec)
    }

    /// Each command's calls divided by `cycles`.
    pub(crate) fn per(&self, cycles: u64) -> BTreeMap<String, f64> {
        self.0
            .iter()
            .map(|(k, v)| (k.clone(), v.calls as f64 / cycles.max(1) as f64))
            .collect()
    }
}

/// One key's type and size, as S11 reports the keys of a semaphore.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub(crate) struct KeySize {
    pub(crate) key: String,
    /// `TYPE`: `zset`, `hash`, `string`, ...
    pub(crate) kind: String,
    /// Members or fields (`ZCARD`, `HLEN`, `SCARD`, `LLEN`, `XLEN`), or bytes of a string
    /// (`STRLEN`).
    pub(crate) size: i64,
    /// `MEMORY USAGE ... SAMPLES 0` (exact).
    pub(crate) memory_bytes: i64,
}

/// The command that gives the size of a key of `kind` (`TYPE`'s reply).
fn size_command(kind: &str) -> Option<&'static str> {
    match kind {
        "zset" => Some("ZCARD"),
        "hash" => Some("HLEN"),
        "set" => Some("SCARD"),
        "list" => Some("LLEN"),
        "stream" => Some("XLEN"),
        "string" => Some("STRLEN"),
        _ => None,
    }
}

/// Parse the text of `INFO commandstats`.
pub(crate) fn parse_commandstats(info: &str) -> CommandStats {
    let mut out = BTreeMap::new();
    for line in info.lines() {
        let Some(rest) = line.strip_prefix("cmdstat_") else {
            continue;
        };
        let Some((name, fields)) = rest.split_once(':') else {
            continue;
        };
        let mut stat = CmdStat::default();
        for field in fields.split(',') {
            match field.split_once('=') {
                Some(("calls", v)) => stat.calls = v.trim().parse().unwrap_or(0),
                Some(("usec", v)) => stat.usec = v.trim().parse().unwrap_or(0),
                _ => {}
            }
        }
        out.insert(name.to_owned(), stat);
    }
    CommandStats(out)
}

/// The value of `field` in the text of an `INFO` section.
pub(crate) fn info_field(info: &str, field: &str) -> Option<String> {
    info.lines().find_map(|line| {
        line.strip_prefix(field)
            .and_then(|rest| rest.strip_prefix(':'))
            .map(|v| v.trim().to_owned())
    })
}

/// One line of `CLIENT LIST`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClientInfo {
    pub(crate) id: u64,
    /// True for a connection in pub/sub mode (`flags` has `P`).
    pub(crate) pubsub: bool,
}

/// Parse the text of `CLIENT LIST`.
pub(crate) fn parse_client_list(text: &str) -> Vec<ClientInfo> {
    text.lines()
        .filter_map(|line| {
            let mut id = None;
            let mut pubsub = false;
            for field in line.split(' ') {
                match field.split_once('=') {
                    Some(("id", v)) => id = v.parse().ok(),
                    Some(("flags", v)) => pubsub = v.contains('P'),
                    _ => {}
                }
            }
            Some(ClientInfo { id: id?, pubsub })
        })
        .collect()
}

impl Admin {
    pub(crate) async fn connect(url: &str) -> BenchResult<Admin> {
        let client = redis::Client::open(url)?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        let id: u64 = redis::cmd("CLIENT")
            .arg("ID")
            .query_async(&mut conn)
            .await?;
        Ok(Admin { client, conn, id })
    }

    pub(crate) fn conn(&self) -> MultiplexedConnection {
        self.conn.clone()
    }

    pub(crate) async fn info(&self, section: &str) -> BenchResult<String> {
        Ok(redis::cmd("INFO")
            .arg(section)
            .query_async(&mut self.conn())
            .await?)
    }

    pub(crate) async fn commandstats(&self) -> BenchResult<CommandStats> {
        Ok(parse_commandstats(&self.info("commandstats").await?))
    }

    /// Seconds of CPU (user + system) the server has used since it started.
    pub(crate) async fn cpu_seconds(&self) -> BenchResult<f64> {
        let info = self.info("cpu").await?;
        let get = |f| {
            info_field(&info, f)
                .and_then(|v| v.parse::<f64>().ok())
                .unwrap_or(0.0)
        };
        Ok(get("used_cpu_user") + get("used_cpu_sys"))
    }

    /// `total_commands_processed` of `INFO stats`: every command the server has run.
    pub(crate) async fn total_commands(&self) -> BenchResult<u64> {
        let info = self.info("stats").await?;
        Ok(info_field(&info, "total_commands_processed")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }

    pub(crate) async fn used_memory(&self) -> BenchResult<i64> {
        let info = self.info("memory").await?;
        Ok(info_field(&info, "used_memory")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0))
    }

    pub(crate) async fn redis_version(&self) -> BenchResult<String> {
        let info = self.info("server").await?;
        Ok(info_field(&info, "redis_version").unwrap_or_else(|| "unknown".to_owned()))
    }

    /// Every connection but the admin's own.
    pub(crate) async fn clients(&self) -> BenchResult<Vec<ClientInfo>> {
        let text: String = redis::cmd("CLIENT")
            .arg("LIST")
            .query_async(&mut self.conn())
            .await?;
        Ok(parse_client_list(&text)
            .into_iter()
            .filter(|c| c.id != self.id)
            .collect())
    }

    /// The highest client id the server has handed out so far (the admin's own included):
    /// connections opened after this call have larger ids.
    pub(crate) async fn last_client_id(&self) -> BenchResult<u64> {
        let all = self.clients().await?;
        Ok(all.iter().map(|c| c.id).max().unwrap_or(0).max(self.id))
    }

    /// Every key matching `pattern` (SCAN).
    pub(crate) async fn keys(&self, pattern: &str) -> BenchResult<Vec<String>> {
        let mut conn = self.conn();
        let mut cursor: u64 = 0;
        let mut keys = Vec::new();
        loop {
            let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
                .arg(cursor)
                .arg("MATCH")
                .arg(pattern)
                .arg("COUNT")
                .arg(1000)
                .query_async(&mut conn)
                .await?;
            keys.extend(batch);
            if next == 0 {
                break;
            }
            cursor = next;
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    /// Bytes the keys matching `pattern` take, by `MEMORY USAGE ... SAMPLES 0` (exact).
    pub(crate) async fn memory_usage(&self, pattern: &str) -> BenchResult<i64> {
        let mut conn = self.conn();
        let mut total = 0;
        for key in self.keys(pattern).await? {
            total += key_memory(&mut conn, &key).await?;
        }
        Ok(total)
    }

    /// Type, size and memory of every key matching `pattern`.
    pub(crate) async fn key_sizes(&self, pattern: &str) -> BenchResult<Vec<KeySize>> {
        let mut conn = self.conn();
        let mut out = Vec::new();
        for key in self.keys(pattern).await? {
            let kind: String = redis::cmd("TYPE").arg(&key).query_async(&mut conn).await?;
            if kind == "none" {
                // Gone since the SCAN (SCAN may list a key whose time to live has passed).
                continue;
            }
            let size = match size_command(&kind) {
                Some(cmd) => redis::cmd(cmd).arg(&key).query_async(&mut conn).await?,
                None => 0,
            };
            let memory_bytes = key_memory(&mut conn, &key).await?;
            out.push(KeySize {
                key,
                kind,
                size,
                memory_bytes,
            });
        }
        Ok(out)
    }

    /// Wait (up to 10 s) until Redis has no objects left to free in the background
    /// (`lazyfree_pending_objects` of `INFO memory`), so that an `UNLINK` of large keys just
    /// before does not lower `used_memory` during the next measurement.
    pub(crate) async fn settle_memory(&self) -> BenchResult<()> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let info = self.info("memory").await?;
            let pending: u64 = info_field(&info, "lazyfree_pending_objects")
                .and_then(|v| v.parse().ok())
                .unwrap_or(0);
            if pending == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!("{pending} objects still pending lazy free after 10 s").into());
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Remove every key matching `pattern`.
    pub(crate) async fn unlink(&self, pattern: &str) -> BenchResult<()> {
        let mut conn = self.conn();
        for chunk in self.keys(pattern).await?.chunks(500) {
            let _: i64 = redis::cmd("UNLINK")
                .arg(chunk)
                .query_async(&mut conn)
                .await?;
        }
        Ok(())
    }
}

/// Bytes `key` takes, by `MEMORY USAGE ... SAMPLES 0` (exact); 0 for a key that is gone.
async fn key_memory(conn: &mut MultiplexedConnection, key: &str) -> BenchResult<i64> {
    let n: Option<i64> = redis::cmd("MEMORY")
        .arg("USAGE")
        .arg(key)
        .arg("SAMPLES")
        .arg(0)
        .query_async(conn)
        .await?;
    Ok(n.unwrap_or(0))
}

/// This process's resident set size in bytes (`VmRSS` of `/proc/self/status`; 0 elsewhere).
pub(crate) fn rss_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn commandstats_are_parsed_and_subtracted() {
        let before = parse_commandstats(
            "# Commandstats\r\ncmdstat_evalsha:calls=10,usec=100,usec_per_call=10.00,rejected_calls=0,failed_calls=0\r\n",
        );
        let after = parse_commandstats(
            "# Commandstats\r\ncmdstat_evalsha:calls=14,usec=180,usec_per_call=12.86,rejected_calls=0,failed_calls=0\r\ncmdstat_client|list:calls=1,usec=9,usec_per_call=9.00,rejected_calls=0,failed_calls=0\r\n",
        );
        let d = after.since(&before);
        assert_eq!(d.calls("evalsha"), 4);
        assert_eq!(d.usec("evalsha"), 80);
        assert_eq!(d.calls("client|list"), 1);
        assert_eq!(d.per(2)["evalsha"], 2.0);
    }

    #[test]
    fn client_list_lines_give_ids_and_pubsub_flags() {
        let text = "id=3 addr=127.0.0.1:5 laddr=127.0.0.1:6379 fd=8 name= age=1 idle=0 flags=N db=0 sub=0 psub=0\n\
                    id=7 addr=127.0.0.1:6 laddr=127.0.0.1:6379 fd=9 name= age=1 idle=0 flags=P db=0 sub=1 psub=0\n";
        assert_eq!(
            parse_client_list(text),
            vec![
                ClientInfo {
                    id: 3,
                    pubsub: false
                },
                ClientInfo {
                    id: 7,
                    pubsub: true
                },
            ]
        );
    }

    #[test]
    fn key_sizes_are_read_by_the_command_of_their_type() {
        assert_eq!(size_command("zset"), Some("ZCARD"));
        assert_eq!(size_command("hash"), Some("HLEN"));
        assert_eq!(size_command("string"), Some("STRLEN"));
        assert_eq!(size_command("none"), None);
    }

    #[test]
    fn info_fields_are_found_by_exact_name() {
        let info = "used_memory:1000\r\nused_memory_human:1K\r\n";
        assert_eq!(info_field(info, "used_memory").as_deref(), Some("1000"));
        assert_eq!(info_field(info, "used_memory_rss"), None);
    }
}
