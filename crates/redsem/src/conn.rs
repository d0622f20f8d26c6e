//! The command connection: one Redis server or a Redis Cluster. Nothing outside this file
//! knows which.

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// Every command goes through this: multiplexed, reconnecting, cheap to clone.
#[derive(Clone)]
pub(crate) enum Conn {
    /// One server (or a primary behind a proxy), through a reconnecting manager.
    Single(ConnectionManager),
    /// A cluster: each script goes to the node owning its keys' slot.
    Cluster(ClusterConnection),
}

impl ConnectionLike for Conn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Conn::Single(c) => c.req_packed_command(cmd),
            Conn::Cluster(c) => c.req_packed_command(cmd),
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
            Conn::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Conn::Single(c) => c.get_db(),
            Conn::Cluster(c) => c.get_db(),
        }
    }
}

/// The primaries of a cluster, as `(host, port)`, from `CLUSTER NODES`.
pub(crate) fn primaries(cluster_nodes: &str) -> Vec<(String, u16)> {
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
            Some((host.to_owned(), port.parse().ok()?))
        })
        .collect()
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
        assert_eq!(
            primaries(nodes),
            vec![
                ("127.0.0.1".to_owned(), 30001),
                ("127.0.0.1".to_owned(), 30002)
            ]
        );
    }
}
