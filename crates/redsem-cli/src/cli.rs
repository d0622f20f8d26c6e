//! The command line: global options, parsing (clap), and [`run`], which parses, sets up
//! logging and the runtime, and executes the subcommand.

use std::ffi::OsString;
use std::io::IsTerminal as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::{ArgAction, Parser};
use redsem::{Redsem, RedsemOptions};

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

Exit codes:
  0 ok · 1 other error (limit conflict, not held, ...) · 2 usage error ·
  69 Redis unreachable · 75 no permit in time · 76 lease lost during `run`";

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

    /// Log to stderr: -v info, -vv debug, -vvv trace (RUST_LOG overrides)
    #[arg(short, long, global = true, action = ArgAction::Count)]
    verbose: u8,

    /// No spinner while waiting
    #[arg(short, long, global = true)]
    quiet: bool,
}

/// What every subcommand gets: how to reach Redis, and how to talk to the user.
#[derive(Debug)]
pub(crate) struct Context {
    url: String,
    prefix: String,
    quiet: bool,
}

impl Context {
    /// Connect to Redis with the global options.
    pub(crate) async fn connect(&self) -> Result<Redsem, CliError> {
        // rediss:// goes through rustls; name its crypto provider once for the process (an
        // error means one is already installed).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let options = RedsemOptions::default().prefix(self.prefix.as_str());
        Redsem::connect_with(&self.url, options).await.map_err(
            |err| match std::error::Error::source(&err) {
                Some(cause) if err.is_unavailable() => CliError::new(
                    exit::UNAVAILABLE,
                    format!("cannot reach Redis at {}: {cause}", redacted(&self.url)),
                ),
                _ => CliError::from(err),
            },
        )
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
        prefix: cli.global.prefix,
        quiet: cli.global.quiet,
    };
    let outcome = runtime.block_on(cli.command.execute(&ctx));
    runtime.block_on(settle());
    outcome
}

/// The clap error on one line: its first paragraph, without the `error:` tag.
fn usage_error(err: &clap::Error) -> CliError {
    let text = err.render().to_string();
    let first = text.split("\n\n").next().unwrap_or_default();
    let first = first.trim().strip_prefix("error:").unwrap_or(first);
    CliError::new(exit::USAGE, format!("{} (see --help)", first.trim()))
}

/// Wait until the tasks left behind by the command (a withdrawal, a release) are done.
async fn settle() {
    let handle = tokio::runtime::Handle::current();
    let deadline = tokio::time::Instant::now() + SETTLE_LIMIT;
    while handle.metrics().num_alive_tasks() > 0 && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
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
