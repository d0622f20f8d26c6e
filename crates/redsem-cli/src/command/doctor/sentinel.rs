//! The `sentinel` row of `doctor` behind Sentinels (`redis+sentinel://`): whether every
//! Sentinel of `--url` answers and names the same primary, the quorum and whether it can be
//! reached, and the replicas a failover could promote, with their lag.

use std::collections::HashMap;

use redsem::redis;

use super::{Check, LAG_TOLERANCE, Status, check};
use crate::context::Context;
use crate::target::Nodes;

/// What one Sentinel said about the master.
#[derive(Debug)]
struct View {
    /// `SENTINEL MASTER`'s fields (`ip`, `port`, `flags`, `quorum`, `num-other-sentinels`, ...).
    master: HashMap<String, String>,
    /// `SENTINEL CKQUORUM`: `Ok` with its text, or the refusal.
    quorum: Result<String, String>,
    /// `SENTINEL REPLICAS`: each replica's fields.
    replicas: Vec<HashMap<String, String>>,
}

/// Ask every Sentinel of `nodes` about `master`, whose primary is at `primary` and answered
/// `INFO` with `info` (for the replicas' lag), and judge what they say.
pub(super) async fn row(
    ctx: &Context,
    nodes: &Nodes,
    master: &str,
    primary: (&str, u16),
    info: &HashMap<String, String>,
) -> Check {
    let mut views = Vec::new();
    let mut silent = Vec::new();
    for (host, port) in nodes.addresses().iter().cloned() {
        let addr = format!("{host}:{port}");
        match ask(ctx, nodes, &host, port, master).await {
            Ok(view) => views.push((addr, view)),
            Err(why) => silent.push(format!("{addr} ({why})")),
        }
    }
    judge(master, primary, &views, &silent, &replica_lags(info))
}

/// One Sentinel's view of `master`.
async fn ask(
    ctx: &Context,
    nodes: &Nodes,
    host: &str,
    port: u16,
    master: &str,
) -> Result<View, String> {
    let mut conn = ctx
        .sentinel_connection(nodes, host, port)
        .await
        .map_err(|e| e.to_string())?;
    let sentinel = |sub: &str| {
        let mut cmd = redis::cmd("SENTINEL");
        cmd.arg(sub).arg(master);
        cmd
    };
    let fields: HashMap<String, String> = sentinel("MASTER")
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string())?;
    let quorum: Result<String, String> = sentinel("CKQUORUM")
        .query_async(&mut conn)
        .await
        .map_err(|e| e.to_string());
    let replicas: Vec<HashMap<String, String>> = sentinel("REPLICAS")
        .query_async(&mut conn)
        .await
        .unwrap_or_default();
    Ok(View {
        master: fields,
        quorum,
        replicas,
    })
}

/// The lag in seconds of each replica (`ip:port`) in the primary's `INFO replication`.
fn replica_lags(info: &HashMap<String, String>) -> HashMap<String, u64> {
    info.iter()
        .filter(|(k, _)| k.starts_with("slave") && k[5..].parse::<u32>().is_ok())
        .filter_map(|(_, line)| {
            let fields: HashMap<&str, &str> = line
                .split(',')
                .filter_map(|kv| kv.split_once('='))
                .collect();
            let addr = format!("{}:{}", fields.get("ip")?, fields.get("port")?);
            Some((addr, fields.get("lag")?.parse().ok()?))
        })
        .collect()
}

/// The `sentinel` row from what the Sentinels said (`views`), which ones did not answer
/// (`silent`), and the replicas' lag as the primary sees it.
fn judge(
    master: &str,
    (host, port): (&str, u16),
    views: &[(String, View)],
    silent: &[String],
    lags: &HashMap<String, u64>,
) -> Check {
    let primary = format!("{host}:{port}");
    let mut fails = Vec::new();
    let mut warns = Vec::new();
    if !silent.is_empty() {
        warns.push(format!(
            "no answer about {master:?} from {}",
            silent.join(", ")
        ));
    }
    let field = |view: &View, name: &str| view.master.get(name).cloned().unwrap_or_default();
    let others: Vec<String> = views
        .iter()
        .filter(|(_, v)| format!("{}:{}", field(v, "ip"), field(v, "port")) != primary)
        .map(|(addr, v)| format!("{addr} names {}:{}", field(v, "ip"), field(v, "port")))
        .collect();
    if !others.is_empty() {
        fails.push(format!(
            "the Sentinels disagree on the primary ({}, others {primary}): clients may write to \
             two primaries",
            others.join(", ")
        ));
    }
    let Some((_, first)) = views.first() else {
        return check(
            "sentinel",
            Status::Fail,
            format!(
                "no Sentinel answered about {master:?}: {}",
                silent.join(", ")
            ),
        );
    };
    let flags = field(first, "flags");
    if flags.split(',').any(|f| f == "s_down" || f == "o_down") {
        warns.push(format!("the primary is flagged {flags} (seen as down)"));
    }
    let known = field(first, "num-other-sentinels")
        .parse::<u32>()
        .map_or_else(|_| "?".to_owned(), |n| (n + 1).to_string());
    let quorum_set = field(first, "quorum");
    let quorum = match views.iter().find_map(|(_, v)| v.quorum.as_ref().ok()) {
        Some(_) => "a failover can be authorized".to_owned(),
        None => {
            let why = first.quorum.as_ref().err().cloned().unwrap_or_default();
            warns.push(format!(
                "CKQUORUM refused ({why}): a failover could not be authorized; run more \
                 Sentinels, or fix the links between them"
            ));
            "no failover possible".to_owned()
        }
    };
    let mut replicas = Vec::new();
    for replica in &first.replicas {
        let get = |name: &str| replica.get(name).map_or("?", String::as_str);
        let addr = format!("{}:{}", get("ip"), get("port"));
        let flags = get("flags");
        let link = get("master-link-status");
        let lag = lags.get(&addr).copied();
        let shown = lag.map_or_else(|| "lag unknown".to_owned(), |l| format!("lag {l}s"));
        let down = flags
            .split(',')
            .any(|f| matches!(f, "s_down" | "o_down" | "disconnected"));
        if down || link != "ok" || lag.is_none_or(|l| l > LAG_TOLERANCE) {
            warns.push(format!(
                "replica {addr} is behind or unusable ({flags}, link {link}, {shown})"
            ));
        }
        replicas.push(format!("{addr} link {link}, {shown}"));
    }
    if replicas.is_empty() {
        warns.push("the Sentinels know no replica: a failover has nothing to promote".to_owned());
    }
    let summary = format!(
        "{} of {} Sentinels answer, naming {primary} as {master:?}; {known} Sentinels known, \
         quorum {quorum_set}: {quorum}; {} replica(s) known{}",
        views.len(),
        views.len() + silent.len(),
        replicas.len(),
        if replicas.is_empty() {
            String::new()
        } else {
            format!(" ({})", replicas.join("; "))
        },
    );
    let (status, found) = if !fails.is_empty() {
        fails.extend(warns);
        (Status::Fail, fails)
    } else if !warns.is_empty() {
        (Status::Warn, warns)
    } else {
        (Status::Ok, Vec::new())
    };
    let detail = if found.is_empty() {
        summary
    } else {
        format!("{}; {summary}", found.join("; "))
    };
    check("sentinel", status, detail)
}

/// The `min-replicas` row behind Sentinels: `min-replicas-to-write` and `min-replicas-max-lag`
/// of the primary (`CONFIG GET`), judged against its replicas (`INFO`).
pub(super) async fn min_replicas_row(
    conn: &mut redis::aio::MultiplexedConnection,
    info: &HashMap<String, String>,
) -> Check {
    let to_write = super::config(conn, "min-replicas-to-write")
        .await
        .ok()
        .and_then(|v| v.parse().ok());
    let max_lag = super::config(conn, "min-replicas-max-lag")
        .await
        .ok()
        .and_then(|v| v.parse().ok());
    let replicas = info
        .get("connected_slaves")
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    judge_min_replicas(to_write, max_lag, replicas)
}

/// What `min-replicas-to-write` (`to_write`) and `min-replicas-max-lag` (`max_lag`, seconds) buy
/// behind Sentinels, on a primary with `replicas` connected.
///
/// A forced failover (or one of a primary cut off from the others) leaves the old primary a
/// primary, taking writes, until the Sentinels demote it (about 10 s after a forced one); a
/// client that has not moved yet is granted there, and those grants are lost. With
/// `min-replicas-to-write 1` the old primary refuses writes (`NOREPLICAS`) once no replica
/// follows it any more (at once when its last replica leaves it, `max_lag` seconds after its
/// last acknowledgement when cut off). Every replica counted is one the new primary must also
/// have after a failover, where the old primary is not yet its replica: asking for all of them
/// refuses every write until it is.
fn judge_min_replicas(to_write: Option<u64>, max_lag: Option<u64>, replicas: u64) -> Check {
    const ADVICE: &str = "set min-replicas-to-write 1 and min-replicas-max-lag 10 (or less) \
                          on every data node (CONFIG SET, and in redis.conf)";
    let Some(to_write) = to_write else {
        return check(
            "min-replicas",
            Status::Warn,
            format!("unknown: CONFIG GET is refused; behind Sentinels, {ADVICE}"),
        );
    };
    let lag = max_lag.map_or_else(|| "?".to_owned(), |l| l.to_string());
    if to_write == 0 {
        return check(
            "min-replicas",
            Status::Warn,
            format!(
                "min-replicas-to-write 0: after a failover the old primary takes writes until \
                 the Sentinels demote it (about 10 s after a forced one), and clients that have \
                 not moved yet lose the grants made there; {ADVICE}, so that it refuses them \
                 once no replica follows it (a new primary then also refuses writes until the \
                 replica re-pointed to it has synced)"
            ),
        );
    }
    if to_write > replicas {
        return check(
            "min-replicas",
            Status::Fail,
            format!(
                "min-replicas-to-write {to_write} with {replicas} replica(s) connected: every \
                 write is refused (NOREPLICAS)"
            ),
        );
    }
    if to_write == replicas {
        return check(
            "min-replicas",
            Status::Warn,
            format!(
                "min-replicas-to-write {to_write} with {replicas} replica(s): after a failover \
                 the new primary has one replica fewer until the old one follows it (about 10 s \
                 after a forced failover) and refuses every write meanwhile; use at most {}",
                replicas.saturating_sub(1).max(1)
            ),
        );
    }
    check(
        "min-replicas",
        Status::Ok,
        format!(
            "min-replicas-to-write {to_write}, min-replicas-max-lag {lag}s: a primary that no \
             replica follows any more (demoted by a failover, or cut off) refuses writes"
        ),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn min_replicas_is_advised_behind_sentinels_and_judged_against_the_replicas() {
        let row = judge_min_replicas(Some(0), Some(10), 2);
        assert_eq!(row.status, Status::Warn, "{row:?}");
        assert!(
            row.detail.contains("set min-replicas-to-write 1"),
            "{row:?}"
        );
        let row = judge_min_replicas(Some(1), Some(10), 2);
        assert_eq!(row.status, Status::Ok, "{row:?}");
        assert!(row.detail.contains("max-lag 10s"), "{row:?}");
        let row = judge_min_replicas(Some(2), Some(10), 2);
        assert_eq!(row.status, Status::Warn, "{row:?}");
        assert!(row.detail.contains("use at most 1"), "{row:?}");
        let row = judge_min_replicas(Some(3), Some(10), 2);
        assert_eq!(row.status, Status::Fail, "{row:?}");
        let row = judge_min_replicas(None, None, 2);
        assert_eq!(row.status, Status::Warn, "{row:?}");
    }

    fn map(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn view(port: &str, replica_link: &str) -> View {
        View {
            master: map(&[
                ("ip", "127.0.0.1"),
                ("port", port),
                ("flags", "master"),
                ("quorum", "2"),
                ("num-other-sentinels", "2"),
            ]),
            quorum: Ok("OK 3 usable Sentinels".to_owned()),
            replicas: vec![map(&[
                ("ip", "127.0.0.1"),
                ("port", "7001"),
                ("flags", "slave"),
                ("master-link-status", replica_link),
            ])],
        }
    }

    #[test]
    fn sentinels_that_agree_with_a_replica_in_sync_are_ok() {
        let views = [("s1:26379".to_owned(), view("7000", "ok"))];
        let lags = [("127.0.0.1:7001".to_owned(), 0)].into_iter().collect();
        let row = judge("m", ("127.0.0.1", 7000), &views, &[], &lags);
        assert_eq!(row.status, Status::Ok, "{row:?}");
        assert!(
            row.detail.contains("3 Sentinels known, quorum 2"),
            "{row:?}"
        );
        assert!(
            row.detail.contains("127.0.0.1:7001 link ok, lag 0s"),
            "{row:?}"
        );
    }

    #[test]
    fn a_disagreement_on_the_primary_fails_and_a_broken_replica_warns() {
        let lags = HashMap::new();
        let views = [
            ("s1:26379".to_owned(), view("7000", "ok")),
            ("s2:26379".to_owned(), view("7002", "ok")),
        ];
        let row = judge("m", ("127.0.0.1", 7000), &views, &[], &lags);
        assert_eq!(row.status, Status::Fail, "{row:?}");
        assert!(
            row.detail.contains("s2:26379 names 127.0.0.1:7002"),
            "{row:?}"
        );

        let views = [("s1:26379".to_owned(), view("7000", "err"))];
        let silent = ["s3:26379 (refused)".to_owned()];
        let row = judge("m", ("127.0.0.1", 7000), &views, &silent, &lags);
        assert_eq!(row.status, Status::Warn, "{row:?}");
        assert!(
            row.detail.contains("no answer about \"m\" from s3:26379"),
            "{row:?}"
        );
        assert!(
            row.detail.contains("replica 127.0.0.1:7001 is behind"),
            "{row:?}"
        );
    }
}
