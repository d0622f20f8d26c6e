//! Connecting a [`Redsem`]: to one server by its URL (which may name a cluster or Sentinels
//! instead) or to a Redis Cluster, with the server checks run before the handle is made.
//! Connecting through Sentinels is in `sentinel.rs`.

use redis::aio::ConnectionManagerConfig;

#[cfg(feature = "cluster")]
use super::checks::check_primaries;
use super::checks::judge;
use super::{Conn, Redsem, RedsemOptions, ServerChecks};
use crate::error::{Result, invalid};
use crate::keys;
use crate::types::PermitId;
use crate::url::ConnectTarget;

/// The TLS roots a connect trusts beside the built-in ones: the PEM file of
/// [`RedsemOptions::tls_root_cert`], read once (a cluster's seeds and its cluster client, which
/// connects to the nodes it finds, share it).
#[derive(Clone, Default)]
struct Roots {
    #[cfg(feature = "tls")]
    certs: Option<redis::TlsCertificates>,
}

impl Roots {
    fn read(options: &RedsemOptions) -> Result<Roots> {
        let Some(path) = &options.tls_root_cert else {
            return Ok(Roots::default());
        };
        #[cfg(feature = "tls")]
        {
            let pem = std::fs::read(path).map_err(|e| {
                invalid(format!(
                    "cannot read the TLS root certificate {}: {e}",
                    path.display()
                ))
            })?;
            Ok(Roots {
                certs: Some(redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem),
                }),
            })
        }
        #[cfg(not(feature = "tls"))]
        Err(invalid(format!(
            "TLS root certificate {} given, but redsem was built without the `tls` feature",
            path.display()
        )))
    }

    /// A client for `url`, trusting these roots.
    fn open(&self, url: &str) -> Result<redis::Client> {
        let bad_url = |e: redis::RedisError| {
            invalid(format!("bad redis url {}: {e}", crate::url::redact(url)))
        };
        #[cfg(feature = "tls")]
        {
            if url.starts_with("rediss://") {
                // The process-wide rustls provider; another part of the program may have set one.
                let _ = rustls::crypto::ring::default_provider().install_default();
            }
            if let Some(certs) = &self.certs {
                return redis::Client::build_with_tls(url, certs.clone()).map_err(bad_url);
            }
        }
        redis::Client::open(url).map_err(bad_url)
    }
}

impl Redsem {
    /// Connect to the Redis at `url` with the default options.
    ///
    /// `url` is one of:
    ///
    /// | form | what it names |
    /// |---|---|
    /// | `redis://[user:password@]host[:port][/db]` | one server (`rediss://` for TLS, the default `tls` feature; any other form the `redis` crate reads, such as `redis+unix://`) |
    /// | `redis+cluster://[user:password@]host[:port][,host[:port]...]` | a Redis Cluster by its seed nodes (default port 6379), as [`Redsem::connect_cluster`] |
    /// | `redis+sentinel://[user:password@]host[:port][,host[:port]...]/master[/db]` | the primary that the Sentinels at the hosts (default port 26379) watch as `master`, as [`Redsem::connect_sentinel`]: followed across failovers |
    ///
    /// `rediss+cluster://` and `rediss+sentinel://` speak TLS to every node and Sentinel. The
    /// user and password are the data nodes' (every seed; the primary behind the Sentinels);
    /// the Sentinels are asked without them. The `+cluster`/`+sentinel` suffix of the scheme
    /// follows redis-rs's own `redis+unix://`, so the scheme still starts with `redis` or
    /// `rediss` (and says whether it is TLS); Lettuce's `redis-sentinel://` has no TLS twin, and
    /// its `#master` fragment is a path segment here, where a database can follow it. Query
    /// parameters are refused in these two forms.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> redsem::Result<()> {
    /// let one = redsem::Redsem::connect("redis://127.0.0.1:6379/0").await?;
    /// let behind_sentinels =
    ///     redsem::Redsem::connect("redis+sentinel://10.0.0.5:26379,10.0.0.6/mymaster/0").await?;
    /// let cluster = redsem::Redsem::connect("redis+cluster://10.0.0.1:7000,10.0.0.2:7000").await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// [`Error::InvalidArgument`](crate::Error::InvalidArgument) for a malformed URL (its
    /// password is not in the message), or a cluster or sentinel URL when redsem was built
    /// without the `cluster` or `sentinel` feature; [`Error::Unavailable`](crate::Error::Unavailable)
    /// when Redis cannot be reached, [`Error::Redis`](crate::Error::Redis) when it refuses the
    /// connection (bad password, ...).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: dropping the future drops the half-open connection.
    pub async fn connect(url: &str) -> Result<Redsem> {
        Self::connect_with(url, RedsemOptions::default()).await
    }

    /// Connect to the Redis at `url` with `options`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> redsem::Result<()> {
    /// use redsem::{Redsem, RedsemOptions};
    /// let redsem = Redsem::connect_with(
    ///     "redis://127.0.0.1:6379",
    ///     RedsemOptions::default().prefix("myapp"),
    /// )
    /// .await?;
    /// assert_eq!(redsem.prefix(), "myapp");
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redsem::connect`]; also [`Error::InvalidArgument`](crate::Error::InvalidArgument)
    /// for an empty prefix or one with `{` or `}` (the braces that make a primitive's keys share
    /// one cluster slot), and [`Error::Unsuitable`](crate::Error::Unsuitable) when the server
    /// checks (see [`ServerChecks`]) find an `allkeys-*` eviction policy or missing ACL rights;
    /// [`Error::EngineUnavailable`](crate::Error::EngineUnavailable) when
    /// [`RedsemOptions::engine`] asks for [`Engine::Native`](crate::Engine::Native) and the
    /// server has no redsem module.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    pub async fn connect_with(url: &str, options: RedsemOptions) -> Result<Redsem> {
        match ConnectTarget::parse(url)? {
            ConnectTarget::Server => {
                if let Some(why) = options.problem() {
                    return Err(invalid(why));
                }
                let client = Roots::read(&options)?.open(url)?;
                Self::connect_primary(crate::conn::Source::Fixed(Box::new(client)), options).await
            }
            #[cfg(feature = "cluster")]
            ConnectTarget::Cluster(hosts) => {
                let seeds = hosts.node_urls();
                let seeds: Vec<&str> = seeds.iter().map(String::as_str).collect();
                Self::connect_cluster_with(&seeds, options).await
            }
            #[cfg(not(feature = "cluster"))]
            ConnectTarget::Cluster(_) => Err(invalid(format!(
                "{} names a cluster, but redsem was built without the `cluster` feature",
                crate::url::redact(url)
            ))),
            #[cfg(feature = "sentinel")]
            ConnectTarget::Sentinel {
                sentinels,
                master,
                db,
            } => Self::connect_sentinel_target(&sentinels, &master, db, options).await,
            #[cfg(not(feature = "sentinel"))]
            ConnectTarget::Sentinel { .. } => Err(invalid(format!(
                "{} names Sentinels, but redsem was built without the `sentinel` feature",
                crate::url::redact(url)
            ))),
        }
    }

    /// Connect to the primary of `source` (one server, or the one Sentinels name), and run
    /// the server checks there.
    pub(super) async fn connect_primary(
        source: crate::conn::Source,
        options: RedsemOptions,
    ) -> Result<Redsem> {
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(options.connect_timeout))
            .set_response_timeout(Some(options.response_timeout))
            .set_number_of_retries(1);
        let mut conn = crate::conn::Single::new(source, config).await?;
        let client = conn.source().client().0;
        let node = client.get_connection_info().addr().to_string();
        let wake_channel = keys::wake_channel(&options.prefix, PermitId::random().as_str());
        if options.server_checks != ServerChecks::Off {
            let key = keys::acl_probe_key(&options.prefix, 0);
            let rules = options.acl_rules();
            let probe = crate::conn::Probe {
                node: &node,
                prefix: &options.prefix,
                key: &key,
                channel: &wake_channel,
                rules: &rules,
                waits: options.replica_acks.is_some(),
            };
            let findings = crate::conn::check_node(&mut conn, &probe).await?;
            judge(options.server_checks, vec![findings])?;
        }
        let engine = super::engine::for_server(&mut conn, &node, &options).await?;
        let conn = Conn::Single(conn);
        conn.engine_state().set(engine);
        Ok(Self::assemble(
            conn,
            vec![client],
            options,
            wake_channel,
            false,
        ))
    }

    /// Connect to a Redis Cluster through any of its nodes (`seeds`), with the default
    /// options.
    ///
    /// Every key of one primitive shares one hash tag, so each script runs on the one node
    /// that owns it; wake-ups use classic pub/sub, which a cluster forwards to every node.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> redsem::Result<()> {
    /// let redsem = redsem::Redsem::connect_cluster(&[
    ///     "redis://10.0.0.1:7000",
    ///     "redis://10.0.0.2:7000",
    /// ])
    /// .await?;
    /// let sem = redsem.lease_semaphore("exports", 4)?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redsem::connect_with`], with the server checks run on every primary (and, for
    /// [`Engine::Native`](crate::Engine::Native), a module wanted on every primary); TLS root
    /// certificates are not supported for clusters yet
    /// ([`Error::InvalidArgument`](crate::Error::InvalidArgument)).
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    #[cfg(feature = "cluster")]
    pub async fn connect_cluster(seeds: &[&str]) -> Result<Redsem> {
        Self::connect_cluster_with(seeds, RedsemOptions::default()).await
    }

    /// Connect to a Redis Cluster with `options`.
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> redsem::Result<()> {
    /// use redsem::{Redsem, RedsemOptions};
    /// let redsem =
    ///     Redsem::connect_cluster_with(&["redis://10.0.0.1:7000"], RedsemOptions::default().prefix("app"))
    ///         .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redsem::connect_cluster`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    #[cfg(feature = "cluster")]
    pub async fn connect_cluster_with(seeds: &[&str], options: RedsemOptions) -> Result<Redsem> {
        if let Some(why) = options.problem() {
            return Err(invalid(why));
        }
        if seeds.is_empty() {
            return Err(invalid("a cluster needs at least one seed node URL"));
        }
        let roots = Roots::read(&options)?;
        let clients = seeds
            .iter()
            .map(|url| roots.open(url))
            .collect::<Result<Vec<_>>>()?;
        let builder = redis::cluster::ClusterClient::builder(
            clients.iter().map(|c| c.get_connection_info().clone()),
        )
        .connection_timeout(options.connect_timeout)
        .response_timeout(options.response_timeout);
        // The nodes found through the seeds are trusted by the same root as the seeds.
        #[cfg(feature = "tls")]
        let builder = match roots.certs {
            Some(certs) => builder.certs(certs),
            None => builder,
        };
        let cluster = builder
            .build()
            .map_err(|e| invalid(format!("bad cluster seeds {seeds:?}: {e}")))?;
        let mut conn = cluster.get_async_connection().await?;
        let wake_channel = keys::wake_channel(&options.prefix, PermitId::random().as_str());
        if options.server_checks != ServerChecks::Off {
            let findings = check_primaries(&mut conn, &clients, &options, &wake_channel).await?;
            judge(options.server_checks, findings)?;
        }
        let engine = super::engine::for_cluster(&mut conn, &clients, &options).await?;
        // Redis 6.2 has no sharded pub/sub: its clusters keep classic channels.
        let sharded = crate::conn::has_sharded_pubsub(&mut conn).await;
        let conn = Conn::Cluster(conn, Default::default());
        conn.engine_state().set(engine);
        Ok(Self::assemble(
            conn,
            clients,
            options,
            wake_channel,
            sharded,
        ))
    }
}
