//! The global options (`--url`, `--prefix`, ...) and the [`Context`] every subcommand gets
//! from them: how to reach Redis (connecting, and saying in one line why it failed), and how to
//! talk to the user.
//!
//! The command line (`cli.rs`) builds it and the subcommands (`command/`) take it; it names
//! neither, so the CLI reads top-down: cli → command → context.

use std::cell::OnceCell;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::time::Duration;

use clap::ArgAction;
use redsem::{Engine, Redsem, RedsemOptions, ServerChecks};

use crate::error::{CliError, exit};
use crate::spinner::Progress;
use crate::target::{Nodes, Target, redacted};
use crate::values;

/// The Redis used when neither `--url` nor `REDIS_URL` names one.
pub(crate) const DEFAULT_URL: &str = "redis://127.0.0.1:6379";

/// What `-h` says after the options: the examples, notes and exit codes are in `--help`.
pub(crate) const MORE: &str = "Examples, details and exit codes: --help";

/// Options every subcommand takes, before or after its name.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Global options")]
pub(crate) struct GlobalArgs {
    /// Redis to use: one server, a cluster (redis+cluster://) or the primary behind Sentinels
    /// (redis+sentinel://) [default: redis://127.0.0.1:6379]
    ///
    /// One server: redis://[user:password@]host[:port][/db] (rediss:// for TLS); a cluster:
    /// redis+cluster://host:port[,host:port...]; the primary that Sentinels watch:
    /// redis+sentinel://host[:port][,host[:port]...]/MASTER[/db].
    ///
    /// A cluster URL lists seed nodes (any of them will do; default port 6379); a Sentinel URL
    /// lists Sentinels (default port 26379) and the name they monitor the primary under. A
    /// user:password@ applies to the data nodes, not to the Sentinels. rediss+cluster:// and
    /// rediss+sentinel:// use TLS throughout.
    ///
    /// Without --url or REDIS_URL: redis://127.0.0.1:6379 (status and doctor say so, and -v
    /// logs it).
    // No clap default: an absent URL is told apart from one given (see `Context::server`).
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "REDIS_URL",
        hide_env_values = true
    )]
    url: Option<String>,

    /// For rediss://: trust the CA certificates in this PEM file instead of the system's
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "REDSEM_TLS_CA",
        hide_short_help = true,
        hide_env_values = true,
        value_parser = values::file
    )]
    tls_ca: Option<PathBuf>,

    /// Start of every key redsem writes, to keep apart applications sharing one Redis
    #[arg(
        long,
        global = true,
        value_name = "P",
        env = "REDSEM_PREFIX",
        default_value = "redsem",
        hide_env_values = true,
        value_parser = values::prefix
    )]
    prefix: String,

    /// What to do if Redis is set up so that redsem's guarantees would not hold (an allkeys-*
    /// eviction policy, missing ACL rights): refuse with exit 78, warn and go on, or not check
    #[arg(
        long,
        global = true,
        value_name = "WHAT",
        env = "REDSEM_SERVER_CHECKS",
        hide_short_help = true,
        default_value = "enforce",
        hide_env_values = true
    )]
    server_checks: ServerChecksArg,

    /// Have every grant, renewal and release confirmed by N replicas of the primary (WAIT),
    /// waiting at most DUR for them (default 1s, at most a third of --lease; 0 turns it off)
    ///
    /// A grant the replicas do not acknowledge in time is given back and the command exits 75
    /// (nothing is held; try later). A release, count-down or other change not acknowledged
    /// stands on the primary, but a failover to a replica that missed it may undo it; it exits
    /// 75 too, and repeating it would apply it twice. The user needs +wait. Each change waits
    /// about one more round trip, to the slowest of the N fastest replicas.
    #[arg(
        long,
        global = true,
        value_name = "N[/DUR]",
        env = "REDSEM_REPLICA_ACKS",
        hide_short_help = true,
        hide_env_values = true,
        value_parser = values::replica_acks
    )]
    replica_acks: Option<values::ReplicaAcks>,

    /// Which engine runs redsem's operations on the server: redsem's module where it is loaded
    /// (auto), always the Lua scripts, or the module only (refuse with exit 78 without it)
    ///
    /// The module (redis-server --loadmodule libredsem_module.so) serves every operation as a
    /// REDSEM.<OPERATION> command, with the same effect as the scripts; both can serve one
    /// semaphore at once. status and doctor say which engine serves.
    #[arg(
        long,
        global = true,
        value_name = "ENGINE",
        env = "REDSEM_ENGINE",
        hide_short_help = true,
        default_value = "auto",
        hide_env_values = true
    )]
    engine: EngineArg,

    /// Log to stderr: -v info, -vv debug, -vvv trace (RUST_LOG overrides)
    #[arg(short, long, global = true, action = ArgAction::Count)]
    pub(crate) verbose: u8,

    /// Say nothing while waiting: no spinner, no "waiting for" line
    #[arg(short, long, global = true)]
    quiet: bool,
}

/// `--server-checks`: see `redsem::ServerChecks`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum ServerChecksArg {
    /// Refuse to work with such a server (exit 78)
    Enforce,
    /// Log a warning (shown with -v) and go on
    Warn,
    /// Do not check
    Off,
}

/// `--engine`: see `redsem::Engine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum EngineArg {
    /// redsem's module where the server has it (on a cluster, every primary), else the scripts
    Auto,
    /// The Lua scripts, even where the module is loaded
    Scripts,
    /// The module; refuse to work without it (exit 78)
    Native,
}

impl From<EngineArg> for Engine {
    fn from(arg: EngineArg) -> Self {
        match arg {
            EngineArg::Auto => Engine::Auto,
            EngineArg::Scripts => Engine::Scripts,
            EngineArg::Native => Engine::Native,
        }
    }
}

impl From<ServerChecksArg> for ServerChecks {
    fn from(arg: ServerChecksArg) -> Self {
        match arg {
            ServerChecksArg::Enforce => ServerChecks::Enforce,
            ServerChecksArg::Warn => ServerChecks::Warn,
            ServerChecksArg::Off => ServerChecks::Off,
        }
    }
}

/// What every subcommand gets: how to reach Redis, how to talk to the user, and the grammar
/// of the whole command line (for `completions`).
#[derive(Debug)]
pub(crate) struct Context {
    url: String,
    /// Whether `url` is [`DEFAULT_URL`] because neither `--url` nor `REDIS_URL` gave one.
    url_defaulted: bool,
    tls_ca: Option<PathBuf>,
    prefix: String,
    server_checks: ServerChecks,
    /// `--engine`.
    engine: Engine,
    /// `--replica-acks`, when on (N above 0).
    replica_acks: Option<values::ReplicaAcks>,
    quiet: bool,
    /// The client `connect` made, kept so its background clean-up is awaited before exit.
    connected: OnceCell<Redsem>,
    /// The whole command line's grammar, built on demand: `cli::Cli`'s, which this module does
    /// not name.
    grammar: fn() -> clap::Command,
}

impl Context {
    /// The context of a command run with the global options `global`, in the command line
    /// whose grammar `grammar` builds.
    pub(crate) fn new(global: GlobalArgs, grammar: fn() -> clap::Command) -> Self {
        let url_defaulted = global.url.is_none();
        if url_defaulted {
            tracing::info!("no --url or REDIS_URL: using the default, {DEFAULT_URL}");
        }
        Context {
            url: global.url.unwrap_or_else(|| DEFAULT_URL.to_owned()),
            url_defaulted,
            tls_ca: global.tls_ca,
            prefix: global.prefix,
            server_checks: global.server_checks.into(),
            engine: global.engine.into(),
            replica_acks: global.replica_acks.filter(|acks| acks.replicas > 0),
            quiet: global.quiet,
            connected: OnceCell::new(),
            grammar,
        }
    }

    /// The whole command line's grammar (every subcommand and option), as clap builds it.
    pub(crate) fn grammar(&self) -> clap::Command {
        (self.grammar)()
    }

    /// Connect to Redis with the global options.
    pub(crate) async fn connect(&self) -> Result<Redsem, CliError> {
        self.connect_checking(self.server_checks).await
    }

    /// Connect as [`connect`](Self::connect) does, with the server checks as `checks` says
    /// (`doctor` reports them itself instead).
    pub(crate) async fn connect_checking(&self, checks: ServerChecks) -> Result<Redsem, CliError> {
        let target = self.target()?;
        self.check_tls(&target)?;
        let mut options = RedsemOptions::default()
            .prefix(self.prefix.as_str())
            .server_checks(checks)
            .engine(self.engine);
        if let Some(ca) = &self.tls_ca {
            options = options.tls_root_cert(ca);
        }
        if let Some(acks) = self.replica_acks {
            options = options.replica_acks(acks.replicas, acks.timeout);
        }
        // The library reads the cluster and sentinel forms too; behind Sentinels it follows
        // the primary across failovers (a `run` outlives one).
        let redsem = match Redsem::connect_with(&self.url, options).await {
            Ok(redsem) => redsem,
            Err(err) => return Err(self.connect_error(&target, err).await),
        };
        Ok(self.connected.get_or_init(|| redsem).clone())
    }

    /// `--url`, as given (with its password: do not show it).
    pub(crate) fn url(&self) -> &str {
        &self.url
    }

    /// The server the command talks to, as people may see it: `--url` with any password
    /// hidden, and `(the default: no --url or REDIS_URL)` after it when none was given.
    pub(crate) fn server(&self) -> String {
        server(&self.url, self.url_defaulted)
    }

    /// `--url` with any password hidden, as JSON output names the server.
    pub(crate) fn redacted_url(&self) -> String {
        redacted(&self.url)
    }

    /// What `--url` names: one server, a cluster, or the primary behind Sentinels.
    pub(crate) fn target(&self) -> Result<Target, CliError> {
        crate::target::parse(&self.url)
    }

    /// The address of the primary that the Sentinels of `nodes` watch as `master`: the answer
    /// of the first Sentinel that knows it.
    pub(crate) async fn primary_of(
        &self,
        nodes: &Nodes,
        master: &str,
    ) -> Result<(String, u16), CliError> {
        let mut failures = Vec::new();
        for (host, port) in nodes.addresses().iter().cloned() {
            let asked = async {
                let mut conn = self.sentinel_connection(nodes, &host, port).await?;
                let reply: Option<(String, u16)> = redsem::redis::cmd("SENTINEL")
                    .arg("GET-MASTER-ADDR-BY-NAME")
                    .arg(master)
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| CliError::new(exit::UNAVAILABLE, e.to_string()))?;
                Ok::<_, CliError>(reply)
            };
            match asked.await {
                Ok(Some(primary)) => return Ok(primary),
                Ok(None) => failures.push(format!("{host}:{port} knows no master {master:?}")),
                Err(err) => failures.push(format!("{host}:{port}: {err}")),
            }
        }
        Err(CliError::new(
            exit::UNAVAILABLE,
            format!(
                "no Sentinel of {} gave the address of master {master:?}: {}",
                redacted(&self.url),
                failures.join("; ")
            ),
        ))
    }

    /// A plain connection to the Sentinel at `host:port` of `nodes` (TLS with `rediss+`,
    /// without the data nodes' password).
    pub(crate) async fn sentinel_connection(
        &self,
        nodes: &Nodes,
        host: &str,
        port: u16,
    ) -> Result<redsem::redis::aio::MultiplexedConnection, CliError> {
        self.node_connection(&nodes.without_credentials().node_url(host, port, None))
            .await
    }

    /// A plain connection to the one server at `url` (with `--tls-ca`): a node of a cluster,
    /// the primary behind Sentinels, a Sentinel.
    pub(crate) async fn node_connection(
        &self,
        url: &str,
    ) -> Result<redsem::redis::aio::MultiplexedConnection, CliError> {
        let unavailable = |e: redsem::redis::RedisError| {
            CliError::new(
                exit::UNAVAILABLE,
                format!("cannot reach Redis at {}: {e}", redacted(url)),
            )
        };
        let client = match &self.tls_ca {
            None => redsem::redis::Client::open(url).map_err(unavailable)?,
            Some(ca) => {
                let pem = std::fs::read(ca).map_err(|e| {
                    CliError::new(exit::USAGE, format!("cannot read {}: {e}", ca.display()))
                })?;
                let certs = redsem::redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(pem),
                };
                redsem::redis::Client::build_with_tls(url, certs).map_err(unavailable)?
            }
        };
        let config = redsem::redis::AsyncConnectionConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(5)));
        client
            .get_multiplexed_async_connection_with_config(&config)
            .await
            .map_err(unavailable)
    }

    /// `--prefix`.
    pub(crate) fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `--replica-acks`, when on.
    pub(crate) fn replica_acks(&self) -> Option<values::ReplicaAcks> {
        self.replica_acks
    }

    /// What went wrong connecting, in one line that says what to do.
    async fn connect_error(&self, target: &Target, err: redsem::Error) -> CliError {
        let url = redacted(&self.url);
        if let redsem::Error::Redis(cause) = &err
            && cause.kind() == redsem::redis::ErrorKind::Parse
        {
            return CliError::new(
                exit::UNAVAILABLE,
                format!(
                    "{url} is not a Redis server: its answer is not the Redis protocol; check \
                     the host and port of --url / REDIS_URL"
                ),
            );
        }
        if let (Target::Sentinel { master, .. }, redsem::Error::Redis(cause)) = (target, &err)
            && matches!(
                cause.kind(),
                redsem::redis::ErrorKind::MasterNameNotFoundBySentinel
                    | redsem::redis::ErrorKind::NoValidReplicasFoundBySentinel
            )
        {
            return CliError::new(
                exit::UNAVAILABLE,
                format!(
                    "no Sentinel of {url} names a primary for {master:?} that answers as one: \
                     check the name after the hosts (as in their `sentinel monitor NAME ...`), \
                     or wait for a failover to end"
                ),
            );
        }
        let Some(cause) = std::error::Error::source(&err).filter(|_| err.is_unavailable()) else {
            return CliError::from(err);
        };
        let refused = matches!(&err, redsem::Error::Unavailable(c) if c.is_connection_refusal());
        if matches!(target, Target::Server)
            && crate::target::is_tls(target, &self.url)
            && !refused
            && !tls_refused(&err)
            && let Some((host, port)) = host_and_port(&self.url)
            && speaks_plain_redis(&host, port).await
        {
            let plain = url.replacen("rediss://", "redis://", 1);
            return CliError::new(
                exit::UNAVAILABLE,
                format!(
                    "cannot reach Redis at {url}: {host}:{port} speaks plain Redis, not TLS; \
                     use {plain}, or the server's TLS port"
                ),
            );
        }
        CliError::new(
            exit::UNAVAILABLE,
            format!(
                "cannot reach Redis at {url}: {}{}",
                crate::error::chain(cause),
                self.unreachable_hint(target, &err)
            ),
        )
    }

    /// Refuse what would not be the TLS the user asked for: `#insecure` (no certificate
    /// checks) and `--tls-ca` with a plain `redis://` URL.
    fn check_tls(&self, target: &Target) -> Result<(), CliError> {
        if let Some((_, "insecure")) = self.url.split_once('#') {
            return Err(CliError::new(
                exit::USAGE,
                format!(
                    "{}: #insecure (no certificate checks) is not supported; trust the \
                     server's CA with --tls-ca FILE",
                    redacted(&self.url)
                ),
            ));
        }
        if let Some(ca) = &self.tls_ca
            && !crate::target::is_tls(target, &self.url)
        {
            return Err(CliError::new(
                exit::USAGE,
                format!(
                    "--tls-ca {} is for rediss:// URLs (and rediss+cluster://, \
                     rediss+sentinel://), and {} is not TLS",
                    ca.display(),
                    redacted(&self.url)
                ),
            ));
        }
        Ok(())
    }

    /// What to try next when Redis cannot be reached: start one (connection refused), or
    /// trust its CA (a refused TLS handshake); nothing for other failures.
    fn unreachable_hint(&self, target: &Target, err: &redsem::Error) -> String {
        if !crate::target::is_tls(target, &self.url) || !tls_refused(err) {
            return match err {
                redsem::Error::Unavailable(cause)
                    if cause.is_connection_refusal() && matches!(target, Target::Server) =>
                {
                    " (start one with `redis-server --daemonize yes`, or point --url / REDIS_URL \
                     at another)"
                        .to_owned()
                }
                _ => String::new(),
            };
        }
        match &self.tls_ca {
            None => " (TLS refused; to trust a private CA, pass --tls-ca FILE)".to_owned(),
            Some(ca) => format!(" (TLS refused with --tls-ca {})", ca.display()),
        }
    }

    /// Wait (at most [`SETTLE_LIMIT`]) for the clean-up the command left in the background:
    /// a withdrawn request, a dropped permit's release.
    pub(crate) async fn settle(&self) {
        let Some(redsem) = self.connected.get() else {
            return;
        };
        if tokio::time::timeout(SETTLE_LIMIT, redsem.flush())
            .await
            .is_err()
        {
            tracing::warn!("a release or withdrawal still unsent at exit; its lease will end it");
        }
    }

    /// How to show a wait on stderr (if `waits`): a spinner on a terminal, one line off it,
    /// nothing with `--quiet`.
    pub(crate) fn progress(&self, waits: bool) -> Progress {
        if self.quiet || !waits {
            Progress::Off
        } else if std::io::stderr().is_terminal() {
            Progress::Spinner
        } else {
            Progress::Line
        }
    }
}

/// `url` as people may see it: its password hidden, and said to be the default if `defaulted`.
fn server(url: &str, defaulted: bool) -> String {
    if defaulted {
        format!("{} (the default: no --url or REDIS_URL)", redacted(url))
    } else {
        redacted(url)
    }
}

/// How long, at most, to let background clean-ups (a withdrawn request, a dropped permit's
/// release) finish before the process exits.
const SETTLE_LIMIT: Duration = Duration::from_secs(1);
/// Whether `err` comes from a failed TLS handshake: rustls errors reach us as I/O errors of
/// kind `InvalidData` (tokio-rustls), which redis keeps behind an `Arc`.
fn tls_refused(err: &redsem::Error) -> bool {
    let mut cause = std::error::Error::source(err);
    while let Some(err) = cause {
        let io = err.downcast_ref::<std::io::Error>().or_else(|| {
            err.downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>()
                .and_then(|inner| inner.downcast_ref::<std::io::Error>())
        });
        if io.is_some_and(|io| io.kind() == std::io::ErrorKind::InvalidData) {
            return true;
        }
        cause = err.source();
    }
    false
}

/// The host and port of a `redis://` or `rediss://` URL (default port 6379).
fn host_and_port(url: &str) -> Option<(String, u16)> {
    let (_, rest) = url.split_once("://")?;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    if let Some(bracketed) = host_port.strip_prefix('[') {
        let (host, after) = bracketed.split_once(']')?;
        let port = after.strip_prefix(':').map_or(Ok(6379), str::parse).ok()?;
        return Some((host.to_owned(), port));
    }
    match host_port.rsplit_once(':') {
        Some((host, port)) => Some((host.to_owned(), port.parse().ok()?)),
        None => Some((host_port.to_owned(), 6379)),
    }
}

/// Whether `host:port` answers a plain-text `PING` as Redis does (`+PONG`, or `-NOAUTH` when
/// it wants a password), within a second: told a TLS handshake, such a server says nothing.
async fn speaks_plain_redis(host: &str, port: u16) -> bool {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let probe = async {
        let mut stream = tokio::net::TcpStream::connect((host, port)).await.ok()?;
        stream.write_all(b"PING\r\n").await.ok()?;
        let mut reply = [0u8; 16];
        let n = stream.read(&mut reply).await.ok()?;
        let reply = reply.get(..n)?;
        Some(reply.starts_with(b"+PONG") || reply.starts_with(b"-NOAUTH"))
    };
    tokio::time::timeout(Duration::from_secs(1), probe)
        .await
        .ok()
        .flatten()
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_and_port_are_read_from_urls() {
        let hp = |url| host_and_port(url);
        assert_eq!(hp("rediss://db:6380"), Some(("db".into(), 6380)));
        assert_eq!(hp("rediss://u:p@db:6380/0"), Some(("db".into(), 6380)));
        assert_eq!(hp("rediss://db"), Some(("db".into(), 6379)));
        assert_eq!(hp("rediss://[::1]:7000"), Some(("::1".into(), 7000)));
        assert_eq!(hp("rediss://db:port"), None);
    }

    #[test]
    fn the_server_is_named_without_its_password_and_said_to_be_the_default() {
        assert_eq!(
            server("redis://app:secret@db:6380/2", false),
            "redis://app:***@db:6380/2"
        );
        assert_eq!(
            server(DEFAULT_URL, true),
            "redis://127.0.0.1:6379 (the default: no --url or REDIS_URL)"
        );
    }
}
