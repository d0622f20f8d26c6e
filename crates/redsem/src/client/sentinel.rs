//! Connecting a [`Redsem`] through Sentinels: the primary they name is found, connected to
//! as one server, and followed across failovers (`crate::conn::Sentinels`).

use super::{Redsem, RedsemOptions};
use crate::error::{Result, invalid};

impl Redsem {
    /// Connect to the primary that the Sentinels at `sentinels` watch as `master_name`, with
    /// the default options, and follow it when they fail over to another.
    ///
    /// Each of `sentinels` is the URL of one Sentinel, `redis://[user:password@]host:port` (or
    /// `rediss://` for TLS to it and to the data nodes); its user and password are the
    /// Sentinel's. The primary is reached without a password: for one that needs a password
    /// or another database, connect with a `redis+sentinel://` URL (see
    /// [`Redsem::connect`]).
    ///
    /// The Sentinels are asked which primary they name as soon as one of them announces a
    /// new one (each client listens to every Sentinel's `+switch-master` events), once a
    /// second (`SENTINEL MASTER` to each, on kept connections; the answer of the latest
    /// configuration epoch wins, so a Sentinel that has not heard of a failover yet cannot
    /// move the client back), and after an error that says the primary may have moved (a
    /// dropped connection, `READONLY` from a demoted primary, a timeout; at most one question
    /// at a time, at most every 250 ms). So every client moves when the failover's leader
    /// announces it, within milliseconds of each other, and the once-a-second look remains
    /// for a Sentinel whose events are missed (or whose user may not `SUBSCRIBE` to
    /// `+switch-master`). When the client moves, every permit held
    /// through it is renewed at once on the new primary: a grant the new primary does not
    /// have fires its holder's [`LeasePermit::lost`](crate::LeasePermit::lost) then, not a
    /// third of a lease later. When they name another one, the next
    /// command goes there (one refused with `READONLY` or a dropped connection is sent again,
    /// which every script applies once), and the pub/sub connection moves too, where queued
    /// requests subscribe again. The once-a-second look matters: after a forced failover
    /// (`SENTINEL FAILOVER`) the old primary stays a primary, taking writes that will be
    /// lost, until the Sentinels demote it about ten seconds later. Holders keep renewing on
    /// the new primary, or are told through [`LeasePermit::lost`](crate::LeasePermit::lost)
    /// that their lease is gone: the grants and renewals the new primary missed (those of
    /// the last moments before the switch) are lost as after a restart (see the README's
    /// guarantees; [`RedsemOptions::replica_acks`] narrows that window).
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> redsem::Result<()> {
    /// let redsem = redsem::Redsem::connect_sentinel(
    ///     &["redis://10.0.0.5:26379", "redis://10.0.0.6:26379"],
    ///     "mymaster",
    /// )
    /// .await?;
    /// let sem = redsem.lease_semaphore("exports", 4)?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redsem::connect_with`]; [`Error::Unavailable`](crate::Error::Unavailable) or
    /// [`Error::Redis`](crate::Error::Redis) when no Sentinel names a primary that answers
    /// as one, [`Error::InvalidArgument`](crate::Error::InvalidArgument) for no Sentinel or a
    /// malformed URL.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    #[cfg(feature = "sentinel")]
    pub async fn connect_sentinel(sentinels: &[&str], master_name: &str) -> Result<Redsem> {
        Self::connect_sentinel_with(sentinels, master_name, RedsemOptions::default()).await
    }

    /// Connect through Sentinels with `options`: see [`Redsem::connect_sentinel`].
    ///
    /// The server checks run on the primary, as for [`Redsem::connect_with`].
    ///
    /// # Examples
    ///
    /// ```no_run
    /// # async fn example() -> redsem::Result<()> {
    /// use redsem::{Redsem, RedsemOptions};
    /// let redsem = Redsem::connect_sentinel_with(
    ///     &["redis://10.0.0.5:26379"],
    ///     "mymaster",
    ///     RedsemOptions::default().prefix("app"),
    /// )
    /// .await?;
    /// # Ok(())
    /// # }
    /// ```
    ///
    /// # Errors
    ///
    /// As [`Redsem::connect_sentinel`].
    ///
    /// # Cancel safety
    ///
    /// Cancel safe.
    #[cfg(feature = "sentinel")]
    pub async fn connect_sentinel_with(
        sentinels: &[&str],
        master_name: &str,
        options: RedsemOptions,
    ) -> Result<Redsem> {
        use redis::IntoConnectionInfo;
        if sentinels.is_empty() {
            return Err(invalid(
                "connecting through Sentinels needs at least one Sentinel URL",
            ));
        }
        let infos = sentinels
            .iter()
            .map(|url| {
                url.into_connection_info().map_err(|e| {
                    invalid(format!("bad sentinel url {}: {e}", crate::url::redact(url)))
                })
            })
            .collect::<Result<Vec<_>>>()?;
        let tls = infos
            .iter()
            .any(|info| matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }));
        let nodes = redis::sentinel::SentinelNodeConnectionInfo::default();
        let nodes = if tls {
            nodes.set_tls_mode(redis::TlsMode::Secure)
        } else {
            nodes
        };
        // A `String`: `build` takes one without the `tls` feature, `impl AsRef<str>` with it.
        let name = String::from(master_name);
        let asker = redis::sentinel::SentinelClient::build(
            infos.clone(),
            name,
            Some(nodes),
            redis::sentinel::SentinelServerType::Master,
        )
        .map_err(|e| invalid(format!("cannot ask Sentinels for {master_name:?}: {e}")))?;
        Self::connect_through(asker, infos, master_name, tls, options).await
    }

    /// Connect as a `redis+sentinel://` URL says.
    #[cfg(feature = "sentinel")]
    pub(super) async fn connect_sentinel_target(
        sentinels: &crate::url::TargetHosts,
        master_name: &str,
        db: Option<u32>,
        options: RedsemOptions,
    ) -> Result<Redsem> {
        let tls = sentinels.is_tls();
        let (username, password) = sentinels.credentials();
        let addrs: Vec<redis::ConnectionAddr> = sentinels
            .addresses()
            .iter()
            .map(|(host, port)| {
                if tls {
                    redis::ConnectionAddr::TcpTls {
                        host: host.clone(),
                        port: *port,
                        insecure: false,
                        tls_params: None,
                    }
                } else {
                    redis::ConnectionAddr::Tcp(host.clone(), *port)
                }
            })
            .collect();
        let infos = addrs
            .iter()
            .map(|addr| redis::IntoConnectionInfo::into_connection_info(addr.clone()))
            .collect::<redis::RedisResult<Vec<_>>>()?;
        let mut builder = redis::sentinel::SentinelClientBuilder::new(
            addrs,
            master_name,
            redis::sentinel::SentinelServerType::Master,
        )?
        .set_client_to_redis_db(i64::from(db.unwrap_or(0)));
        if tls {
            builder = builder
                .set_client_to_redis_tls_mode(redis::TlsMode::Secure)
                .set_client_to_sentinel_tls_mode(redis::TlsMode::Secure);
        }
        if let Some(username) = &username {
            builder = builder.set_client_to_redis_username(username);
        }
        if let Some(password) = &password {
            builder = builder.set_client_to_redis_password(password);
        }
        let asker = builder
            .build()
            .map_err(|e| invalid(format!("cannot ask Sentinels for {master_name:?}: {e}")))?;
        Self::connect_through(asker, infos, master_name, tls, options).await
    }

    /// Find the primary with `asker`, then connect to it as to one server.
    #[cfg(feature = "sentinel")]
    async fn connect_through(
        asker: redis::sentinel::SentinelClient,
        sentinels: Vec<redis::ConnectionInfo>,
        master_name: &str,
        tls: bool,
        options: RedsemOptions,
    ) -> Result<Redsem> {
        if let Some(why) = options.problem() {
            return Err(invalid(why));
        }
        if options.tls_root_cert.is_some() {
            return Err(invalid(
                "TLS root certificates are not supported through Sentinels yet",
            ));
        }
        #[cfg(feature = "tls")]
        if tls {
            // The process-wide rustls provider; another part of the program may have set one.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        #[cfg(not(feature = "tls"))]
        if tls {
            return Err(invalid(
                "TLS to Sentinels asked for, but redsem was built without the `tls` feature",
            ));
        }
        // One question: the Sentinels (connect), then ROLE on the primary they name (connect).
        let timeout = options.connect_timeout * 2 + options.response_timeout;
        let sentinels =
            crate::conn::Sentinels::start(asker, sentinels, master_name, timeout).await?;
        let source = crate::conn::Source::Sentinel(sentinels);
        let moved = source.moved();
        let redsem = Self::connect_primary(source, options).await?;
        // Every permit held through this client proves itself on the new primary at once.
        if let Some(moved) = moved {
            redsem.shared.keepalive.renew_all_when(moved);
        }
        Ok(redsem)
    }
}
