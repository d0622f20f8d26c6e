//! `redsem latch NAME set|count-down|await|count`: a countdown latch shared through Redis.

use std::io::Write as _;
use std::process::ExitCode;
use std::time::Duration;

use redsem::{CountDownLatch, Error, LatchState};
use tokio::time::Instant;

use crate::context::Context;
use crate::error::{CliError, exit};
use crate::output;
use crate::request::Patience;
use crate::signals::{self, Signals};
use crate::spinner::Spinner;
use crate::values;

const EXAMPLES: &str = "\
Examples:
  # A deploy waits until 3 workers have warmed their caches (at most 10 min):
  redsem latch caches-warm set 3
  redsem latch caches-warm await --wait 10m && ./switch-traffic
  # ... and each worker, when done:
  redsem latch caches-warm count-down

  redsem latch caches-warm count       # count-downs to go (0 once open)

At 0 the latch opens: every `await`, on every machine, returns, and the latch is gone, so
it can be set again. `await` on a latch that was never set returns at once; `await
--require-set` waits for it to be set and open.

Exit codes: 0 ok · 1 `set` found it already counting · 2 usage error ·
69 Redis unreachable · 74 Redis lost the latch while awaited · 75 `await --wait` ran out";

const SET_EXAMPLES: &str = "\
Examples:
  redsem latch workers-ready set 3
  # Set it once, whoever comes first:
  redsem latch workers-ready set 3 || echo \"already counting\"

Exit codes: 0 set · 1 already counting (left as it is) · 2 usage error (COUNT 0, negative or
not a number) · 69 Redis unreachable";

const COUNT_DOWN_EXAMPLES: &str = "\
Examples:
  ./warm-cache && redsem latch caches-warm count-down

Counting down a latch that is not counting (open, or never set) does nothing. Safe to repeat
after a dropped connection: one call counts once.

Exit codes: 0 ok · 2 usage error · 69 Redis unreachable";

const AWAIT_EXAMPLES: &str = "\
Examples:
  redsem latch workers-ready await
  redsem latch workers-ready await -w 30s || redsem latch workers-ready count
  redsem latch workers-ready await --no-wait && echo open
  redsem latch workers-ready await --require-set -w 10m  # before the setter

Returns when the count reaches 0, or at once if the latch is not counting (open, or never set:
set it before anyone awaits it, or pass --require-set to wait for the set too). Leaves the
latch as it is. --wait is also spelled --timeout.

Exit codes: 0 open · 2 usage error · 69 Redis unreachable · 74 Redis lost the latch while it
was awaited · 75 still counting (or, with --require-set, never set) at --wait (with --no-wait:
now)";

const COUNT_EXAMPLES: &str = "\
Examples:
  redsem latch workers-ready count
  2

Prints the count-downs to go on one line: 0 when the latch is open or was never set; for a
latch never set (or open over an hour ago) a note on stderr says so.

Exit codes: 0 ok · 2 usage error · 69 Redis unreachable";

/// Set, count down, await or read the countdown latch NAME
#[derive(Debug, clap::Args)]
#[command(after_help = crate::context::MORE, after_long_help = EXAMPLES, arg_required_else_help = false)]
pub(crate) struct Args {
    /// The latch's name
    #[arg(value_name = "NAME", value_parser = values::name)]
    name: String,

    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, clap::Subcommand)]
enum Action {
    /// Set the count to COUNT, unless the latch is counting already
    #[command(after_help = crate::context::MORE, after_long_help = SET_EXAMPLES, allow_negative_numbers = true)]
    Set {
        /// How many count-downs open the latch
        #[arg(value_name = "COUNT", value_parser = values::count)]
        count: u64,
    },
    /// Take one from the count; at 0 the latch opens
    #[command(after_help = crate::context::MORE, after_long_help = COUNT_DOWN_EXAMPLES)]
    CountDown,
    /// Wait until the count reaches 0
    #[command(
        after_help = crate::context::MORE,
        after_long_help = AWAIT_EXAMPLES,
        mut_arg("no_wait", |arg| arg.help("Do not wait: exit 0 if the latch is open now, 75 if \
            it is counting (or, with --require-set, never set)"))
    )]
    Await {
        #[command(flatten)]
        patience: Patience,
        /// Wait for the latch to be set too, when it was never set (a worker that may start
        /// before the setter), instead of returning at once
        #[arg(long)]
        require_set: bool,
    },
    /// Print the count-downs to go (0 when not counting)
    #[command(after_help = crate::context::MORE, after_long_help = COUNT_EXAMPLES)]
    Count,
}

impl Args {
    pub(crate) async fn execute(self, ctx: &Context) -> Result<ExitCode, CliError> {
        match self.action {
            Action::Set { count } => set(&open(ctx, &self.name).await?, count).await,
            Action::CountDown => {
                open(ctx, &self.name).await?.count_down().await?;
                Ok(ExitCode::SUCCESS)
            }
            Action::Await {
                patience,
                require_set,
            } => {
                // Before connecting, so a signal during the connect ends the wait too.
                let mut signals = Signals::install()?;
                let latch = open(ctx, &self.name).await?;
                if patience.no_wait {
                    return check(&latch, require_set).await;
                }
                let started = Instant::now();
                if require_set {
                    let set = until_set(&latch, patience.wait, &mut signals);
                    if let Some(code) = set.await? {
                        return Ok(code);
                    }
                }
                let left = patience.wait.map(|w| w.saturating_sub(started.elapsed()));
                wait(&latch, left, ctx, &mut signals).await
            }
            Action::Count => {
                let latch = open(ctx, &self.name).await?;
                let count = match latch.state().await? {
                    LatchState::Counting(n) => n,
                    LatchState::Done => 0,
                    LatchState::NeverSet => {
                        output::print("0")?;
                        // A note, not an error: 0 is the answer scripts read either way.
                        tracing::info!("latch never set");
                        let _ = writeln!(
                            std::io::stderr(),
                            "redsem: latch {:?} was never set (or opened over an hour ago): \
                             not counting, and `await` returns at once (--require-set waits \
                             for a set)",
                            latch.name()
                        );
                        return Ok(ExitCode::SUCCESS);
                    }
                };
                output::print(&count.to_string())?;
                Ok(ExitCode::SUCCESS)
            }
        }
    }
}

async fn open(ctx: &Context, name: &str) -> Result<CountDownLatch, CliError> {
    Ok(ctx.connect().await?.count_down_latch(name)?)
}

async fn set(latch: &CountDownLatch, count: u64) -> Result<ExitCode, CliError> {
    if latch.try_set_count(count).await? {
        return Ok(ExitCode::SUCCESS);
    }
    // Best effort: it may have opened since.
    let to_go = match latch.count().await {
        Ok(n) if n > 0 => format!(" ({n} to go)"),
        _ => String::new(),
    };
    Err(CliError::new(
        exit::FAILURE,
        format!(
            "latch {:?} is already counting{to_go}; not set",
            latch.name()
        ),
    ))
}

/// `await --no-wait`: 0 if the latch is open now, 75 if it is counting (or never set, with
/// `--require-set`).
async fn check(latch: &CountDownLatch, require_set: bool) -> Result<ExitCode, CliError> {
    match latch.state().await? {
        LatchState::Counting(n) => Err(CliError::new(
            exit::NOT_ACQUIRED,
            format!("latch {:?} is still counting at {n}", latch.name()),
        )),
        LatchState::NeverSet if require_set => Err(never_set(latch)),
        LatchState::NeverSet | LatchState::Done => Ok(ExitCode::SUCCESS),
    }
}

fn never_set(latch: &CountDownLatch) -> CliError {
    CliError::new(
        exit::NOT_ACQUIRED,
        format!("latch {:?} was never set (--require-set)", latch.name()),
    )
}

/// How often `await --require-set` looks whether a latch never set has been set.
const SET_POLL: Duration = Duration::from_millis(250);

/// `await --require-set`: wait (at most `timeout`) until the latch is no longer "never set".
/// `Some(0)` when it is already open (set and counted down since), `None` when it is counting.
/// Silent: the wait that follows announces itself.
async fn until_set(
    latch: &CountDownLatch,
    timeout: Option<Duration>,
    signals: &mut Signals,
) -> Result<Option<ExitCode>, CliError> {
    let what = format!("latch {:?} to be set", latch.name());
    let deadline = timeout.map(|t| Instant::now() + t);
    loop {
        match latch.state().await? {
            LatchState::Counting(_) => return Ok(None),
            LatchState::Done => return Ok(Some(ExitCode::SUCCESS)),
            LatchState::NeverSet => {}
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(never_set(latch));
        }
        let nap = deadline.map_or(SET_POLL, |d| {
            SET_POLL.min(d.saturating_duration_since(Instant::now()))
        });
        tokio::select! {
            () = tokio::time::sleep(nap) => {}
            signal = signals.recv() => {
                return Err(signals::interrupted(signal, &format!("waiting for {what}")));
            }
        }
    }
}

async fn wait(
    latch: &CountDownLatch,
    timeout: Option<Duration>,
    ctx: &Context,
    signals: &mut Signals,
) -> Result<ExitCode, CliError> {
    let what = format!("latch {:?}", latch.name());
    let mut spinner = Spinner::plain(what.clone(), ctx.progress(true));
    let started = Instant::now();
    let opened = async {
        match timeout {
            Some(timeout) => latch.wait_timeout(timeout).await,
            None => latch.wait().await,
        }
    };
    let opened = tokio::select! {
        opened = opened => opened,
        signal = signals.recv() => {
            return Err(signals::interrupted(signal, &format!("waiting for {what}")));
        }
        never = spinner.spin() => match never {},
    };
    drop(spinner);
    match opened {
        Ok(()) => {
            tracing::info!(waited = %output::duration(started.elapsed()), "{what} open");
            Ok(ExitCode::SUCCESS)
        }
        Err(Error::Timeout { waited, .. }) => {
            let to_go = match latch.count().await {
                Ok(n) if n > 0 => format!(" at {n}"),
                _ => String::new(),
            };
            Err(CliError::new(
                exit::NOT_ACQUIRED,
                format!(
                    "{what} still counting{to_go} after {} (timed out)",
                    output::duration(waited)
                ),
            ))
        }
        Err(err) => Err(err.into()),
    }
}
