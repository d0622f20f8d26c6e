//! Choosing the engine at connect ([`RedsemOptions::engine`]): one `REDSEM.ENGINE` to the
//! server, or to every primary of a cluster, then `crate::engine::choose`.

use super::RedsemOptions;
use crate::engine::{Choice, Engine, ask, choose};
use crate::error::Result;
use crate::script::protocol_library;

/// The engine for the one server behind `conn` (`node`, `host:port`, for messages).
///
/// # Errors
///
/// [`Error::EngineUnavailable`](crate::Error::EngineUnavailable) when the module was asked for
/// and the server cannot serve it; [`Error::Unavailable`](crate::Error::Unavailable) when it
/// cannot be reached.
pub(super) async fn for_server(
    conn: &mut impl redis::aio::ConnectionLike,
    node: &str,
    options: &RedsemOptions,
) -> Result<Choice> {
    let answers = match options.engine {
        Engine::Scripts => Vec::new(),
        _ => vec![(node.to_owned(), ask(conn).await?)],
    };
    choose(options.engine, answers, protocol_library().0)
}

/// The engine for a cluster: the module only if every primary (listed by `CLUSTER NODES`,
/// each asked on a connection of its own, as `seeds` reach it) has it.
///
/// # Errors
///
/// As [`for_server`].
#[cfg(feature = "cluster")]
pub(super) async fn for_cluster(
    conn: &mut redis::cluster_async::ClusterConnection,
    seeds: &[redis::Client],
    options: &RedsemOptions,
) -> Result<Choice> {
    if options.engine == Engine::Scripts {
        return choose(options.engine, Vec::new(), protocol_library().0);
    }
    let nodes: redis::RedisResult<String> =
        redis::cmd("CLUSTER").arg("NODES").query_async(conn).await;
    let nodes = match nodes.map_err(crate::Error::from) {
        Ok(nodes) => nodes,
        Err(crate::Error::Redis(refused)) => {
            let answer = crate::engine::Answer::Absent {
                reply: format!("CLUSTER NODES, to find the primaries, was refused: {refused}"),
            };
            return choose(
                options.engine,
                vec![("the cluster".to_owned(), answer)],
                protocol_library().0,
            );
        }
        Err(unavailable) => return Err(unavailable),
    };
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(options.connect_timeout))
        .set_response_timeout(Some(options.response_timeout));
    let mut answers = Vec::new();
    if let Some(seed) = seeds.first() {
        for primary in crate::conn::primaries(&nodes) {
            let node = format!("{}:{}", primary.host, primary.port);
            let client = crate::conn::node_client(seed, &primary.host, primary.port)?;
            let mut node_conn = client
                .get_multiplexed_async_connection_with_config(&config)
                .await?;
            answers.push((node, ask(&mut node_conn).await?));
        }
    }
    choose(options.engine, answers, protocol_library().0)
}
