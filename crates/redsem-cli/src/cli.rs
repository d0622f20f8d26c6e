//! The command line: its grammar (clap; the global options are in [`crate::context`]), and
//! [`run`], which parses, sets up logging and the runtime, and executes the subcommand.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;
use clap::error::ErrorKind;

use crate::command::Command;
use crate::context::{Context, GlobalArgs, MORE};
use crate::error::{CliError, exit};
use crate::logging;

const EXAMPLES: &str = "\
Examples:
  # Run the nightly export on at most 2 machines at once; wait for a turn:
  redsem run nightly-export --limit 2 -- ./export.sh --full

  # One deploy at a time; skip it if one is running (flock's spellings work):
  redsem lock deploy --nonblock -- ./deploy.sh

  # Hold a permit across shell commands, then give it back:
  id=$(redsem acquire deploy --limit 1 --lease 5m)
  redsem refresh deploy \"$id\" --lease 5m
  redsem release deploy \"$id\"

  # See who holds what:
  redsem --url redis://cache.internal:6379 status
  redsem status nightly-export --json

  # Counted permits without owners or leases, and a countdown latch:
  redsem permits gpu try-set 4
  redsem permits gpu acquire 2 -w 1m &&
    { ./train; redsem permits gpu release 2; }
  redsem latch workers-ready set 3
  redsem latch workers-ready count-down   # in each of the 3 workers, when ready
  redsem latch workers-ready await -w 5m  # returns when all 3 have counted down

  # Is this Redis set up for redsem? (exit 0 ok, 1 a warning, 78 a failure)
  redsem --url redis://cache.internal:6379 doctor

  # A Redis Cluster (any seed nodes), and the primary that Sentinels watch:
  redsem --url redis+cluster://10.0.0.1:7000,10.0.0.2:7000 status
  redsem --url redis+sentinel://10.0.0.5:26379,10.0.0.6:26379/mymaster \\
    lock deploy -- ./deploy.sh

  # TLS with a private CA:
  redsem --url rediss://cache.internal:6380 --tls-ca /etc/redis/ca.pem status

  # Only with redsem's Redis module (exit 78 where it is not loaded; status
  # and doctor say which engine serves):
  redsem --engine native lock deploy -- ./deploy.sh

Durations: 500ms, 2s, 1m 30s, or a number of seconds (30). -w/--wait is also spelled
--timeout, -n/--no-wait also --nonblock.

Exit codes (of `run` and `lock`: see `redsem run --help`):
  0   ok
  1   other error (limit conflict, not held, already set, ...)
  2   usage error
  65  --tenant T holds or waits with another --weight or --cap than the
      request's (callers configured the tenant differently)
  69  Redis unreachable (also: its TLS certificate not trusted), or not Redis
  74  Redis lost the state of the semaphore or latch (restart without
      persistence, failover, flush, eviction)
  75  no permit in time, or a latch still counting at --wait; with
      --replica-acks, a change the replicas did not acknowledge in time
  76  lease lost during `run`
  78  Redis not suitable: an allkeys-* eviction policy, or the user lacks ACL
      rights on the prefix's keys, channels or commands (see --server-checks);
      or --engine native and a server without redsem's module";

/// Distributed semaphores on Redis, from a shell: run a command on at most N machines at
/// once, and inspect or manage permits.
#[derive(Debug, Parser)]
#[command(
    name = "redsem",
    version,
    after_help = MORE,
    after_long_help = EXAMPLES,
    max_term_width = 100,
    arg_required_else_help = true
)]
pub(crate) struct Cli {
    #[command(flatten)]
    global: GlobalArgs,

    #[command(subcommand)]
    command: Command,
}

/// Parse `args`, then execute the subcommand; the `Err` is printed by `main`.
pub(crate) fn run(args: impl IntoIterator<Item = OsString>) -> Result<ExitCode, CliError> {
    let args: Vec<OsString> = args.into_iter().collect();
    if args.len() <= 1 {
        // `redsem` alone: the short help (as `-h`), on stderr as it is no answer, and a usage
        // error; also when REDIS_URL or another variable gives an option (clap then asks for a
        // subcommand in one line instead).
        use clap::CommandFactory as _;
        let help = Cli::command().render_help().to_string();
        let _ = std::io::Write::write_all(&mut std::io::stderr(), help.as_bytes());
        return Ok(ExitCode::from(exit::USAGE));
    }
    let cli = match Cli::try_parse_from(&args) {
        Ok(cli) => cli,
        Err(err) if !err.use_stderr() => {
            // --help and --version: clap prints them as they are, on stdout.
            let _ = err.print();
            return Ok(ExitCode::SUCCESS);
        }
        Err(err) if err.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand => {
            // `redsem permits` and the like: the help, on stderr as it is no answer, and a
            // usage error.
            let _ = err.print();
            return Ok(ExitCode::from(exit::USAGE));
        }
        Err(err) if runs_a_command(&args) => {
            let missing = err.kind() == ErrorKind::MissingRequiredArgument;
            let error = match swallowing_word(&args).filter(|_| missing) {
                Some(word) => stray_word_error(&word),
                None => usage_error(&err),
            };
            return Err(crate::command::own_failure(error));
        }
        Err(err) => return Err(usage_error(&err)),
    };
    if let Some(word) = cli
        .command
        .command_words()
        .and_then(|cmd| stray_word(&args, cmd))
    {
        return Err(crate::command::own_failure(stray_word_error(word)));
    }
    // `run` and `lock`: a guard process above the one that holds the permit, so that a
    // SIGKILL of either still stops the command's whole tree (Linux; `guard`).
    if cli.command.command_words().is_some()
        && let Some(code) = crate::guard::split()
    {
        return Ok(ExitCode::from(code));
    }
    logging::init(cli.global.verbose);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| CliError::new(exit::FAILURE, format!("cannot start a runtime: {e}")))?;
    let ctx = Context::new(cli.global, <Cli as clap::CommandFactory>::command);
    runtime.block_on(async {
        let outcome = cli.command.execute(&ctx).await;
        ctx.settle().await;
        outcome
    })
}

/// The word of `args` (the whole command line) that clap took for the start of `cmd` (the
/// command of `run` or `lock`, with its arguments) though a `--` follows it: options before
/// `--` are parsed strictly, so a stray word there is a mistake (`run demo -l 2 parsecs --
/// true`), never the command. `None` when `cmd` follows a `--`, or has none in it.
fn stray_word<'a>(args: &[OsString], cmd: &'a [OsString]) -> Option<&'a OsString> {
    // clap takes every word after the first of the command for it: `cmd` ends the line.
    let start = args.len().checked_sub(cmd.len())?;
    let after_dashes = start
        .checked_sub(1)
        .and_then(|before| args.get(before))
        .is_some_and(|word| word == "--");
    if after_dashes || !cmd.iter().any(|word| word == "--") {
        return None;
    }
    cmd.first()
}

/// The usage error of a stray `word` before `--`.
fn stray_word_error(word: &OsString) -> CliError {
    CliError::new(
        exit::USAGE,
        format!(
            "unexpected argument '{}' before '--': redsem's options go before '--' and the \
             command after it (see --help)",
            word.to_string_lossy()
        ),
    )
}

/// For a `run` or `lock` line that does not parse: the stray word before `--` that clap took
/// for the command, swallowing the options after it (`run x extra -l 1 -- true` misses its
/// `--limit`), found as the word nearest the `--` whose removal lets the line parse.
fn swallowing_word(args: &[OsString]) -> Option<OsString> {
    let dashes = args.iter().position(|word| word == "--")?;
    // Never the subcommand or its NAME: the first two words that are not options.
    let name = args
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(_, word)| !word.to_string_lossy().starts_with('-'))
        .nth(1)?
        .0;
    (name + 1..dashes).rev().find_map(|at| {
        let word = &args[at];
        if word.to_string_lossy().starts_with('-') {
            return None;
        }
        let mut without = args.to_vec();
        without.remove(at);
        Cli::try_parse_from(&without).ok().map(|_| word.clone())
    })
}

/// Whether the subcommand in `args` is `run` or `lock`, whose own failures exit 125: the first
/// word that is neither an option nor the value of a global option.
fn runs_a_command(args: &[OsString]) -> bool {
    const TAKE_VALUES: [&str; 6] = [
        "--url",
        "--tls-ca",
        "--prefix",
        "--server-checks",
        "--replica-acks",
        "--engine",
    ];
    let mut words = args.iter().skip(1).map(|a| a.to_string_lossy());
    while let Some(word) = words.next() {
        if TAKE_VALUES.contains(&word.as_ref()) {
            words.next();
        } else if !word.starts_with('-') {
            return word == "run" || word == "lock";
        }
    }
    false
}

/// The clap error on one line: its first paragraph, without the `error:` tag, and its tips
/// ("a similar argument exists: '--limit'"), but not the one that says to put a value after
/// `--` (after `--`, `run` takes the command).
fn usage_error(err: &clap::Error) -> CliError {
    let text = err.render().to_string();
    let mut paragraphs = text.split("\n\n");
    let first = paragraphs.next().unwrap_or_default().trim();
    let first = first.strip_prefix("error:").unwrap_or(first).trim();
    let tips: Vec<&str> = paragraphs
        .flat_map(str::lines)
        .map(str::trim)
        .filter(|line| line.starts_with("tip:") && !line.starts_with("tip: to pass"))
        .collect();
    let mut message = first.to_owned();
    for tip in tips {
        message.push_str("; ");
        message.push_str(tip);
    }
    CliError::new(exit::USAGE, format!("{message} (see --help)"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    /// Every indented line of every help's examples and notes (commands, tables) fits 80
    /// columns, so that no terminal wraps a command in the middle and copy-paste takes it
    /// whole; prose fits the 100 columns help is wrapped at.
    #[test]
    fn help_texts_fit_80_columns() {
        fn check(command: &clap::Command, path: &str, long: &mut Vec<String>) {
            for text in [command.get_after_help(), command.get_after_long_help()]
                .into_iter()
                .flatten()
            {
                for line in text.to_string().lines() {
                    let width = if line.starts_with(' ') { 80 } else { 100 };
                    if line.chars().count() > width {
                        long.push(format!("{path}: {line}"));
                    }
                }
            }
            for sub in command.get_subcommands() {
                check(sub, &format!("{path} {}", sub.get_name()), long);
            }
        }
        let mut long = Vec::new();
        check(&Cli::command(), "redsem", &mut long);
        assert!(long.is_empty(), "too wide:\n{}", long.join("\n"));
    }

    #[test]
    fn the_subcommand_is_found_past_global_options() {
        let args = |words: &[&str]| -> Vec<OsString> {
            std::iter::once("redsem")
                .chain(words.iter().copied())
                .map(OsString::from)
                .collect()
        };
        assert!(runs_a_command(&args(&["run", "x"])));
        assert!(runs_a_command(&args(&[
            "--url",
            "redis://h",
            "-v",
            "lock",
            "x"
        ])));
        assert!(runs_a_command(&args(&["--prefix", "run", "run"])));
        assert!(runs_a_command(&args(&["--engine", "native", "run", "x"])));
        assert!(!runs_a_command(&args(&["--engine", "run", "status"])));
        assert!(!runs_a_command(&args(&["--prefix", "run", "status"])));
        assert!(!runs_a_command(&args(&["status", "run"])));
        assert!(!runs_a_command(&args(&["--url=redis://h", "acquire"])));
    }

    #[test]
    fn a_word_before_the_dashes_is_not_taken_for_the_command() {
        let stray = |words: &[&str]| -> Option<String> {
            let args: Vec<OsString> = std::iter::once("redsem")
                .chain(words.iter().copied())
                .map(OsString::from)
                .collect();
            let cli = Cli::try_parse_from(&args).expect("parses");
            let cmd = cli.command.command_words().expect("run or lock");
            stray_word(&args, cmd).map(|w| w.to_string_lossy().into_owned())
        };
        let run = ["run", "demo", "--limit", "2", "--lease", "3"];
        let with = |tail: &[&'static str]| -> Vec<&'static str> {
            run.iter().chain(tail).copied().collect()
        };
        assert_eq!(
            stray(&with(&["parsecs", "--", "true"])),
            Some("parsecs".into())
        );
        assert_eq!(
            stray(&["lock", "x", "-n", "oops", "--", "true"]),
            Some("oops".into())
        );
        assert_eq!(stray(&with(&["--", "true"])), None);
        // A stray word before the options swallows them: the line does not parse at all.
        let line = |words: &[&str]| -> Vec<OsString> {
            std::iter::once("redsem")
                .chain(words.iter().copied())
                .map(OsString::from)
                .collect()
        };
        assert_eq!(
            swallowing_word(&line(&["run", "x", "extra", "-l", "1", "--", "true"])),
            Some(OsString::from("extra"))
        );
        assert_eq!(
            swallowing_word(&line(&["run", "x", "-l", "--", "true"])),
            None,
            "a line that no removal mends keeps clap's own error"
        );
        assert_eq!(stray(&with(&["true", "-x"])), None);
        assert_eq!(stray(&with(&["--", "grep", "--", "-v"])), None);
        assert_eq!(stray(&with(&["-c", "echo --"])), None);
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
