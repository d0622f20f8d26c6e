//! Defects found by using the binary as a user would, each kept fixed by a test.

use redsem::redis;
use redsem_test::{RedisServer, eventually};

use crate::support::{LIMIT, bare, finish};

/// A one-node cluster (`--cluster-enabled yes`, every slot added, never met another node)
/// answers CLUSTER SLOTS and CLUSTER NODES with an empty address for itself, meaning "the
/// address you asked": `--url redis+cluster://` to it works (it failed with exit 69, "failed
/// to lookup address information").
#[test]
fn status_through_a_one_node_cluster_that_reports_an_empty_address() {
    let server = RedisServer::start_with(&["--cluster-enabled", "yes"]);
    let mut admin = server.connection();
    let _: () = redis::cmd("CLUSTER")
        .arg("ADDSLOTSRANGE")
        .arg(0)
        .arg(16383)
        .query(&mut admin)
        .expect("CLUSTER ADDSLOTSRANGE");
    eventually(LIMIT, "the one-node cluster is ok", || {
        let info: String = redis::cmd("CLUSTER")
            .arg("INFO")
            .query(&mut admin)
            .expect("CLUSTER INFO");
        info.contains("cluster_state:ok")
    });
    let url = format!("redis+cluster://127.0.0.1:{}", server.port());
    let out = finish(bare(&["--url", &url, "status", "x"])).success();
    assert!(out.stdout.contains('x'), "{out:?}");
    let id = finish(bare(&["--url", &url, "acquire", "x", "--limit", "1"]))
        .success()
        .stdout
        .trim()
        .to_owned();
    finish(bare(&["--url", &url, "release", "x", &id])).success();
}
