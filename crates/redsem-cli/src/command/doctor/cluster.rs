//! `doctor` on a Redis Cluster (`redis+cluster://`): the checks of one server on every
//! primary, each row naming its node, and one `cluster` row for the whole: every primary's
//! `cluster_state` and whether every slot is served.

use std::collections::HashMap;

use redsem::ServerFinding;
use redsem::redis::{self, aio::MultiplexedConnection};

use super::{Check, Status, check, node_checks};
use crate::context::Context;
use crate::error::{CliError, exit};
use crate::target::Nodes;

/// How many hash slots a cluster has.
const SLOTS: u32 = 16_384;

/// `CLUSTER INFO` of one node as `field -> value`, or why it could not be read.
type ClusterInfo = Result<HashMap<String, String>, String>;

/// A primary as `CLUSTER NODES` lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Primary {
    host: String,
    port: u16,
    /// How many slots it serves (ranges and single slots; slots being imported or migrated
    /// are counted where they are now).
    slots: u32,
    /// How many replicas follow it.
    replicas: usize,
    /// Flagged `fail` or `fail?` by the node that was asked.
    failing: bool,
}

impl Primary {
    fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// Every check of `doctor` for the cluster of `nodes`: those of one server on each primary,
/// and the `cluster` row (state and slot coverage).
pub(super) async fn cluster_checks(
    ctx: &Context,
    nodes: &Nodes,
    findings: &[ServerFinding],
) -> Result<Vec<Check>, CliError> {
    let mut checks = Vec::new();
    let (mut seed, seed_addr) = first_seed(ctx, nodes).await?;
    let topology: Result<String, _> = redis::cmd("CLUSTER")
        .arg("NODES")
        .query_async(&mut seed)
        .await;
    let primaries = match topology {
        Ok(text) => {
            let asked = seed_addr.rsplit_once(':').map_or("", |(host, _)| host);
            primaries(&text, asked.trim_matches(['[', ']']))
        }
        Err(err) => {
            checks.push(check(
                "cluster",
                Status::Warn,
                format!(
                    "{seed_addr} refused CLUSTER NODES ({err}), so only the seed nodes of --url \
                     are checked, not every primary; allow +cluster|nodes"
                ),
            ));
            seeds_as_primaries(nodes)
        }
    };
    let mut states = Vec::new();
    for primary in &primaries {
        let addr = primary.addr();
        let url = nodes.node_url(&primary.host, primary.port, None);
        match ctx.node_connection(&url).await {
            Ok(mut conn) => {
                let info = super::info(&mut conn).await;
                checks.extend(
                    node_checks(ctx.replica_acks(), &mut conn, &info, findings, Some(&addr)).await,
                );
                states.push((addr, cluster_info(&mut conn).await));
            }
            Err(err) => checks.push(
                check(
                    "cluster",
                    Status::Fail,
                    format!(
                        "this primary cannot be reached ({err}); the semaphores in its slots \
                         cannot be used until it is back or a replica takes over"
                    ),
                )
                .on(Some(&addr)),
            ),
        }
    }
    checks.push(coverage(&primaries, &states));
    Ok(checks)
}

/// A connection to the first seed of `nodes` that answers, and its address.
async fn first_seed(
    ctx: &Context,
    nodes: &Nodes,
) -> Result<(MultiplexedConnection, String), CliError> {
    let mut failures = Vec::new();
    for (host, port) in nodes.addresses().iter().cloned() {
        match ctx
            .node_connection(&nodes.node_url(&host, port, None))
            .await
        {
            Ok(conn) => return Ok((conn, format!("{host}:{port}"))),
            Err(err) => failures.push(err.to_string()),
        }
    }
    Err(CliError::new(
        exit::UNAVAILABLE,
        format!("no seed node answered: {}", failures.join("; ")),
    ))
}

/// The seeds of `--url`, checked in place of the primaries when `CLUSTER NODES` is refused.
fn seeds_as_primaries(nodes: &Nodes) -> Vec<Primary> {
    nodes
        .addresses()
        .iter()
        .cloned()
        .map(|(host, port)| Primary {
            host,
            port,
            slots: 0,
            replicas: 0,
            failing: false,
        })
        .collect()
}

/// The primaries that serve slots, from the text of `CLUSTER NODES` as the node at host
/// `asked` answered it, in slot order. An empty address is `asked`'s: a node that never met
/// another one (a one-node cluster) lists itself so.
fn primaries(text: &str, asked: &str) -> Vec<Primary> {
    let lines: Vec<Vec<&str>> = text
        .lines()
        .map(|l| l.split_whitespace().collect())
        .filter(|f: &Vec<&str>| f.len() >= 8)
        .collect();
    let mut found: Vec<(u32, Primary)> = Vec::new();
    for fields in &lines {
        let flags: Vec<&str> = fields[2].split(',').collect();
        if !flags.contains(&"master") {
            continue;
        }
        // ip:port@cport[,hostname]
        let addr = fields[1].split(['@', ',']).next().unwrap_or_default();
        let Some((host, port)) = addr.rsplit_once(':') else {
            continue;
        };
        let Ok(port) = port.parse::<u16>() else {
            continue;
        };
        if port == 0 {
            continue;
        }
        let host = if host.is_empty() { asked } else { host };
        let ranges: Vec<(u32, u32)> = fields[8..]
            .iter()
            .filter(|s| !s.starts_with('['))
            .filter_map(|s| match s.split_once('-') {
                Some((a, b)) => Some((a.parse().ok()?, b.parse().ok()?)),
                None => s.parse().ok().map(|n| (n, n)),
            })
            .collect();
        if ranges.is_empty() {
            continue;
        }
        let id = fields[0];
        let primary = Primary {
            host: host.trim_matches(['[', ']']).to_owned(),
            port,
            slots: ranges.iter().map(|(a, b)| b.saturating_sub(*a) + 1).sum(),
            replicas: lines.iter().filter(|f| f[3] == id).count(),
            failing: flags.iter().any(|f| f.starts_with("fail")),
        };
        let first = ranges.iter().map(|(a, _)| *a).min().unwrap_or(0);
        found.push((first, primary));
    }
    found.sort_by_key(|(first, _)| *first);
    found.into_iter().map(|(_, p)| p).collect()
}

/// `CLUSTER INFO` as `field -> value`, or why it could not be read.
async fn cluster_info(conn: &mut MultiplexedConnection) -> ClusterInfo {
    let text: String = redis::cmd("CLUSTER")
        .arg("INFO")
        .query_async(conn)
        .await
        .map_err(|e| e.to_string())?;
    Ok(text
        .lines()
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.to_owned(), v.trim().to_owned()))
        .collect())
}

/// The `cluster` row: each primary's `cluster_state`, and whether every slot is assigned and
/// served, from `CLUSTER NODES` and the primaries' `CLUSTER INFO`.
fn coverage(primaries: &[Primary], states: &[(String, ClusterInfo)]) -> Check {
    let mut failures = Vec::new();
    let mut warnings = Vec::new();
    let mut assigned = primaries.iter().map(|p| p.slots).sum::<u32>();
    let mut slots_fail = 0;
    let mut slots_pfail = 0;
    for (addr, state) in states {
        let info = match state {
            Ok(info) => info,
            Err(err) => {
                warnings.push(format!(
                    "{addr} refused CLUSTER INFO ({err}; allow +cluster|info)"
                ));
                continue;
            }
        };
        let field = |name: &str| info.get(name).map_or("unknown", String::as_str);
        let count = |name: &str| info.get(name).and_then(|n| n.parse::<u32>().ok());
        if field("cluster_state") != "ok" {
            failures.push(format!(
                "{addr} has cluster_state {}",
                field("cluster_state")
            ));
        }
        if let Some(n) = count("cluster_slots_assigned") {
            assigned = assigned.min(n);
        }
        slots_fail = slots_fail.max(count("cluster_slots_fail").unwrap_or(0));
        slots_pfail = slots_pfail.max(count("cluster_slots_pfail").unwrap_or(0));
    }
    for primary in primaries.iter().filter(|p| p.failing) {
        failures.push(format!("{} is flagged failing", primary.addr()));
    }
    if assigned < SLOTS {
        failures.push(format!(
            "{} of {SLOTS} slots have no primary",
            SLOTS - assigned
        ));
    }
    if slots_fail > 0 {
        failures.push(format!("{slots_fail} slots are served by a failed primary"));
    }
    if slots_pfail > 0 {
        warnings.push(format!(
            "{slots_pfail} slots are served by a primary some nodes cannot reach (pfail)"
        ));
    }
    let bare: Vec<String> = primaries
        .iter()
        .filter(|p| p.replicas == 0)
        .map(Primary::addr)
        .collect();
    let replicas = if primaries.is_empty() || bare.is_empty() {
        "every primary has a replica".to_owned()
    } else if bare.len() == primaries.len() {
        "no primary has a replica: one that fails takes its slots' semaphores with it until it \
         is back"
            .to_owned()
    } else {
        format!(
            "without a replica: {} (if one fails, its slots' semaphores are unusable until it \
             is back)",
            bare.join(", ")
        )
    };
    let served = format!(
        "{} primaries, {assigned} of {SLOTS} slots assigned; {replicas}",
        primaries.len()
    );
    if !failures.is_empty() {
        let mut said = failures;
        said.extend(warnings);
        return check(
            "cluster",
            Status::Fail,
            format!(
                "{}: the semaphores in those slots cannot be used; fix the cluster (redis-cli \
                 --cluster check HOST:PORT) ({served})",
                said.join("; ")
            ),
        );
    }
    if !warnings.is_empty() {
        return check(
            "cluster",
            Status::Warn,
            format!("{} ({served})", warnings.join("; ")),
        );
    }
    check(
        "cluster",
        Status::Ok,
        format!("cluster_state ok on every primary, every slot served: {served}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "\
e7d1eec 127.0.0.1:30002@40002 master - 0 1700000000000 2 connected 5461-10922
67ed2db 127.0.0.1:30001@40001,host-a myself,master - 0 1700000000000 1 connected 0-5460 [93->-e7d1eec]
292f8b3 127.0.0.1:30004@40004 slave 67ed2db 0 1700000000000 1 connected
824fe11 127.0.0.1:30003@40003 master,fail? - 0 1700000000000 3 connected 10923-16383
6ec2392 :0@0 master,noaddr - 0 1700000000000 0 disconnected
";

    #[test]
    fn primaries_are_read_from_cluster_nodes_in_slot_order() {
        let found = primaries(NODES, "10.0.0.9");
        let summary: Vec<(String, u32, usize, bool)> = found
            .iter()
            .map(|p| (p.addr(), p.slots, p.replicas, p.failing))
            .collect();
        assert_eq!(
            summary,
            [
                ("127.0.0.1:30001".to_owned(), 5461, 1, false),
                ("127.0.0.1:30002".to_owned(), 5462, 0, false),
                ("127.0.0.1:30003".to_owned(), 5461, 0, true),
            ]
        );
    }

    #[test]
    fn an_empty_address_is_the_asked_nodes() {
        let one = "07c3 :7391@17391 myself,master - 0 0 1 connected 0-16383\n";
        let found = primaries(one, "127.0.0.1");
        assert_eq!(found.len(), 1);
        assert_eq!(
            (found[0].addr(), found[0].slots),
            ("127.0.0.1:7391".to_owned(), 16384)
        );
    }

    #[test]
    fn coverage_fails_on_a_failing_primary_and_names_it() {
        let found = primaries(NODES, "10.0.0.9");
        let ok: HashMap<String, String> = [("cluster_state", "ok")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        let states = vec![("127.0.0.1:30001".to_owned(), Ok(ok))];
        let row = coverage(&found, &states);
        assert_eq!(row.status, Status::Fail, "{row:?}");
        assert!(
            row.detail.contains("127.0.0.1:30003 is flagged failing"),
            "{row:?}"
        );
        assert!(
            row.detail
                .contains("without a replica: 127.0.0.1:30002, 127.0.0.1:30003")
        );
        let healthy: Vec<Primary> = found
            .into_iter()
            .map(|p| Primary {
                failing: false,
                ..p
            })
            .collect();
        assert_eq!(coverage(&healthy, &states).status, Status::Ok);
        let missing = &healthy[..2];
        let row = coverage(missing, &states);
        assert!(
            row.detail.contains("5461 of 16384 slots have no primary"),
            "{row:?}"
        );
    }
}
