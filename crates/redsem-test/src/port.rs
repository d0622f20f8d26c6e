//! Free TCP ports on 127.0.0.1.

use std::net::TcpListener;

/// The cluster bus listens on `port + 10000`, so cluster ports must stay below this.
const MAX_CLUSTER_PORT: u16 = 55535;

/// Offset of the cluster bus port from the client port.
pub(crate) const CLUSTER_BUS_OFFSET: u16 = 10000;

/// A port that is free right now (bind to port 0, read it, release it).
///
/// With `cluster_bus`, `port + 10000` must be free too. Another process may still take the
/// port before the server binds it; callers retry when the server exits early.
pub(crate) fn free_port(cluster_bus: bool) -> u16 {
    for _ in 0..100 {
        let port = bind_any();
        if !cluster_bus || (port < MAX_CLUSTER_PORT && is_free(port + CLUSTER_BUS_OFFSET)) {
            return port;
        }
    }
    panic!("found no free port on 127.0.0.1 (cluster_bus: {cluster_bus}) after 100 tries");
}

/// Whether `port` can be bound on 127.0.0.1 right now.
pub(crate) fn is_free(port: u16) -> bool {
    TcpListener::bind(("127.0.0.1", port)).is_ok()
}

fn bind_any() -> u16 {
    let listener =
        TcpListener::bind(("127.0.0.1", 0)).expect("bind 127.0.0.1:0 to find a free port");
    listener
        .local_addr()
        .expect("read the local address of a bound listener")
        .port()
}
