//! The command line: global options, parsing (clap), and [`run`], which parses, sets up
//! logging and the runtime, and executes the subcommand.

use std::cell::OnceCell;
use std::ffi::OsString;
use std::io::IsTerminal as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgAction, Parser};
use redsem::{Redsem, RedsemOptions, ServerChecks};

use crate::command::Command;
use crate::error::{CliError, exit};
use crate::{logging, values};

const EXAMPLES: &str = "\
Examples:
  # Run the nightly export on at most 2 machines at once; wait for a turn:
  redsem run nightly-export --limit 2 -- ./export.sh --full

  # Hold a permit across shell commands, then give it back:
  id=$(redsem acquire deploy --limit 1 --lease 5m)
  redsem refresh deploy \"$id\" --lease 5m
  redsem release deploy \"$id\"

  # See who holds what:
  redsem --url redis://cache.internal:6379 status
  redsem status nightly-export --json

  # Counted permits without owners or leases, and a countdown latch:
  redsem permits gpu try-set 4
  redsem permits gpu acquire 2 --wait 1m && ./train && redsem permits gpu release 2
  redsem latch workers-ready set 3
  redsem latch workers-ready count-down          # in each of the 3 workers, when ready
  redsem latch workers-ready await --timeout 5m  # returns when all 3 have counted down

  # TLS with a private CA:
  redsem --url rediss://cache.internal:6380 --tls-ca /etc/redis/ca.pem status

Exit codes:
  0 ok · 1 other error (limit conflict, not held, already set, ...) · 2 usage error ·
  69 Redis unreachable (also: its TLS certificate not trusted) · 74 Redis lost the state of
  the semaphore or latch (restart without persistence, failover, flush, eviction) · 75 no
  permit in time, or a latch still counting at --timeout · 76 lease lost during `run` ·
  78 Redis not suitable: an allkeys-* eviction policy, or the user lacks ACL rights on the
  prefix's keys, channels or commands (see --server-checks)";

/// Distributed semaphores on Redis, from a shell: run a command on at most N machines at
/// once, and inspect or manage permits.
#[derive(Debug, Parser)]
#[command(name = "redsem", version, after_help = EXAMPLES, max_term_width = 100)]
pub(crate) struct Cli {
    #[command(flatten)]
    global: GlobalArgs,

    #[command(subcommand)]
    command: Command,
}

/// Options every subcommand takes, before or after its name.
#[derive(Debug, clap::Args)]
#[command(next_help_heading = "Global options")]
struct GlobalArgs {
    /// Redis to use: redis://[user:password@]host[:port][/db], or rediss:// for TLS
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "REDIS_URL",
        default_value = "redis://127.0.0.1:6379",
        hide_env_values = true
    )]
    url: String,

    /// For rediss://: trust the CA certificates in this PEM file instead of the system's
    #[arg(
        long,
        global = true,
        value_name = "FILE",
        env = "REDSEM_TLS_CA",
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
        default_value = "enforce",
        hide_env_values = true
    )]
    server_checks: ServerChecksArg,

    /// Log to stderr: -v info, -vv debug, -vvv trace (RUST_LOG overrides)
    #[arg(short, long, global = true, action = ArgAction::Count)]
    verbose: u8,

    /// No spinner while waiting
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

impl From<ServerChecksArg> for ServerChecks {
    fn from(arg: ServerChecksArg) -> Self {
        match arg {
            ServerChecksArg::Enforce => ServerChecks::Enforce,
            ServerChecksArg::Warn => ServerChecks::Warn,
            ServerChecksArg::Off => ServerChecks::Off,
        }
    }
}

/// What every subcommand gets: how to reach Redis, and how to talk to the user.
#[derive(Debug)]
pub(crate) struct Context {
    url: String,
    tls_ca: Option<PathBuf>,
    prefix: String,
    server_checks: ServerChecks,
    quiet: bool,
    /// The client `connect` made, kept so its background clean-up is awaited before exit.
    connected: OnceCell<Redsem>,
}

impl Context {
    /// Connect to Redis with the global options.
    pub(crate) async fn connect(&self) -> Result<Redsem, CliError> {
        self.check_tls()?;
        let mut options = RedsemOptions::default()
            .prefix(self.prefix.as_str())
            .server_checks(self.server_checks);
        if let Some(ca) = &self.tls_ca {
            options = options.tls_root_cert(ca);
        }
        let redsem = Redsem::connect_with(&self.url, options)
            .await
            .map_err(|err| match std::error::Error::source(&err) {
                Some(cause) if err.is_unavailable() => CliError::new(
                    exit::UNAVAILABLE,
                    format!(
                        "cannot reach Redis at {}: {cause}{}",
                        redacted(&self.url),
                        self.unreachable_hint(&err)
                    ),
                ),
                _ => CliError::from(err),
            })?;
        Ok(self.connected.get_or_init(|| redsem).clone())
    }

    /// Refuse what would not be the TLS the user asked for: `#insecure` (no certificate
    /// checks) and `--tls-ca` with a plain `redis://` URL.
    fn check_tls(&self) -> Result<(), CliError> {
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
            && !self.url.starts_with("rediss://")
        {
            return Err(CliError::new(
                exit::USAGE,
                format!(
                    "--tls-ca {} is for rediss:// URLs, and {} is not TLS",
                    ca.display(),
                    redacted(&self.url)
                ),
            ));
        }
        Ok(())
    }

    /// What to try next when Redis cannot be reached: start one (connection refused), or
    /// trust its CA (a refused TLS handshake); nothing for other failures.
    fn unreachable_hint(&self, err: &redsem::Error) -> String {
        if !self.url.starts_with("rediss://") || !tls_refused(err) {
            return match err {
                redsem::Error::Unavailable(cause) if cause.is_connection_refusal() => {
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
    async fn settle(&self) {
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

    /// Whether to draw progress on stderr: it is a terminal and `--quiet` was not given.
    pub(crate) fn show_progress(&self) -> bool {
        !self.quiet && std::io::stderr().is_terminal()
    }
}

/// How long, at most, to let background clean-ups (a withdrawn request, a dropped permit's
/// release) finish before the process exits.
const SETTLE_LIMIT: Duration = Duration::from_secs(1);

/// Parse `args`, then execute the subcommand; the `Err` is printed by `main`.
pub(crate) fn run(args: impl IntoIterator<Item = OsString>) -> Result<ExitCode, CliError> {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(err) if !err.use_stderr() => {
            // --help and --version: clap prints them as they are, on stdout.
            let _ = err.print();
            return Ok(ExitCode::SUCCESS);
        }
        Err(err) => return Err(usage_error(&err)),
    };
    logging::init(cli.global.verbose);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::new(exit::FAILURE, format!("cannot start a runtime: {e}")))?;
    let ctx = Context {
        url: cli.global.url,
        tls_ca: cli.global.tls_ca,
        prefix: cli.global.prefix,
        server_checks: cli.global.server_checks.into(),
        quiet: cli.global.quiet,
        connected: OnceCell::new(),
    };
    runtime.block_on(async {
        let outcome = cli.command.execute(&ctx).await;
        ctx.settle().await;
        outcome
    })
}

/// The clap error on one line: its first paragraph, without the `error:` tag.
fn usage_error(err: &clap::Error) -> CliError {
    let text = err.render().to_string();
    let first = text.split("\n\n").next().unwrap_or_default();
    let first = first.trim().strip_prefix("error:").unwrap_or(first);
    CliError::new(exit::USAGE, format!("{} (see --help)", first.trim()))
}

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

/// `url` without its password, for messages.
fn redacted(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return url.to_owned();
    };
    let authority_end = rest.find('/').unwrap_or(rest.len());
    match rest[..authority_end].rfind('@') {
        Some(at) => {
            let user = rest[..at].split(':').next().unwrap_or_default();
            format!("{scheme}://{user}:***@{}", &rest[at + 1..])
        }
        None => url.to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    #[test]
    fn passwords_are_not_shown() {
        assert_eq!(
            redacted("redis://app:s3cret@db:6379/0"),
            "redis://app:***@db:6379/0"
        );
        assert_eq!(redacted("redis://db:6379"), "redis://db:6379");
    }

    #[test]
    fn usage_errors_fit_on_one_line() {
        let err = Cli::try_parse_from(["redsem", "acquire", "jobs"]).unwrap_err();
        let cli = usage_error(&err);
        assert_eq!(cli.code(), exit::USAGE);
        assert!(!cli.to_string().contains('\n'));
        assert!(cli.to_string().contains("--limit"), "{cli}");
    }
}
