//! A Redis Cluster's topology, as redsem reads it: the primaries and their slots from
//! `CLUSTER NODES`, the hash slot of a key, and a client for one node.

use redis::ConnectionAddr;

use crate::error::Result;

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
///
/// An empty `host` is the seed's: a node that never met another one (a one-node cluster)
/// reports its own address as empty in `CLUSTER NODES` and `CLUSTER SLOTS`, meaning "the
/// address you asked", and such a cluster has no node but the one the seed reached.
#[cfg_attr(not(any(feature = "cluster", feature = "sentinel")), allow(dead_code))]
pub(crate) fn node_client(seed: &redis::Client, host: &str, port: u16) -> Result<redis::Client> {
    let info = seed.get_connection_info().clone();
    let host = match (host, info.addr()) {
        (
            "",
            ConnectionAddr::Tcp(seed_host, _)
            | ConnectionAddr::TcpTls {
                host: seed_host, ..
            },
        ) => seed_host.clone(),
        _ => host.to_owned(),
    };
    let addr = match info.addr() {
        ConnectionAddr::TcpTls {
            insecure,
            tls_params,
            ..
        } => ConnectionAddr::TcpTls {
            host,
            port,
            insecure: *insecure,
            tls_params: tls_params.clone(),
        },
        _ => ConnectionAddr::Tcp(host, port),
    };
    Ok(redis::Client::open(info.set_addr(addr))?)
}

/// Whether every primary of the cluster has sharded pub/sub (`SPUBLISH`, `SSUBSCRIBE`: Redis
/// 7.0 and later), told by capability: `COMMAND INFO SPUBLISH` on each primary, which names
/// the command where the server has it and answers nil where it does not (Redis 6.2), never
/// by `redis_version`. One primary without it (a cluster being upgraded) is enough for
/// classic channels: a script's `SPUBLISH` would fail there.
///
/// Where `COMMAND` cannot be asked (refused by the ACL or by a managed service, which then
/// runs Redis 7 or later), the answer is yes, as before this check.
#[cfg(feature = "cluster")]
pub(crate) async fn has_sharded_pubsub(conn: &mut redis::cluster_async::ClusterConnection) -> bool {
    use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
    let mut cmd = redis::cmd("COMMAND");
    cmd.arg("INFO").arg("SPUBLISH");
    let routing = RoutingInfo::MultiNode((
        MultipleNodeRoutingInfo::AllMasters,
        Some(ResponsePolicy::CombineArrays),
    ));
    match conn.route_command(cmd, routing).await {
        Ok(answer) => names_every_command(&answer),
        Err(err) => {
            tracing::debug!(error = %err, "COMMAND INFO SPUBLISH refused: sharded pub/sub assumed");
            true
        }
    }
}

/// Whether a `COMMAND INFO` answer (one entry per command asked, from every node) describes
/// each command: nil for a command the server lacks.
#[cfg_attr(not(feature = "cluster"), allow(dead_code))]
fn names_every_command(answer: &redis::Value) -> bool {
    match answer {
        redis::Value::Array(entries) => {
            !entries.is_empty() && !entries.iter().any(|e| matches!(e, redis::Value::Nil))
        }
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn an_empty_node_host_is_the_seeds() {
        let seed = redis::Client::open("redis://u:p@10.1.2.3:7000/0").expect("seed");
        let empty = node_client(&seed, "", 7001).expect("client");
        assert_eq!(
            empty.get_connection_info().addr(),
            &ConnectionAddr::Tcp("10.1.2.3".to_owned(), 7001)
        );
        let named = node_client(&seed, "10.9.9.9", 7002).expect("client");
        assert_eq!(
            named.get_connection_info().addr(),
            &ConnectionAddr::Tcp("10.9.9.9".to_owned(), 7002)
        );
    }

    #[test]
    fn slots_are_those_of_redis_cluster() {
        // Values from `CLUSTER KEYSLOT`.
        assert_eq!(slot_of("foo"), 12182);
        assert_eq!(slot_of("{user1000}.following"), slot_of("user1000"));
        assert_eq!(slot_of("123456789"), 0x31C3); // the CRC16/XMODEM check value
        assert_eq!(slot_of("a{}b"), slot_of("a{}b"));
    }

    #[test]
    fn a_nil_in_command_info_means_a_node_without_the_command() {
        use redis::Value;
        let entry = Value::Array(vec![Value::BulkString(b"spublish".to_vec())]);
        assert!(names_every_command(&Value::Array(vec![
            entry.clone(),
            entry.clone()
        ])));
        assert!(!names_every_command(&Value::Array(vec![entry, Value::Nil])));
        assert!(!names_every_command(&Value::Array(vec![Value::Nil])));
        assert!(!names_every_command(&Value::Array(vec![])));
    }
}
