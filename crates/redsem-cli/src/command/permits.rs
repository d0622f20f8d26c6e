//! `redsem permits NAME add|try-set|acquire|release|available`: counted permits without
//! owners or leases, like Redisson's `RSemaphore`.

use std::process::ExitCode;
use std::time::Duration;

use redsem::{Error, PermitSemaphore};
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
  # 4 GPUs shared by every job; a job takes 2 while it trains:
  redsem permits gpu try-set 4
  redsem permits gpu acquire 2 -w 10m &&
    { ./train; redsem permits gpu release 2; }

  redsem permits gpu available         # free now (may be negative)
  redsem permits gpu add -1            # one GPU out for repair
  redsem permits gpu add 1             # ... and back

Permits are plain counts: anyone may release them, and a process that dies holding some does
not give them back. For permits that come back by themselves, see `redsem acquire` and
`redsem run`. Waiting is first in, first out: a request for 2 is not overtaken by requests
for 1 behind it.

Exit codes: 0 ok · 1 `try-set` found them already set · 2 usage error ·
69 Redis unreachable · 75 not acquired in time";

const ADD_EXAMPLES: &str = "\
Examples:
  redsem permits gpu add 2             # two more GPUs
  redsem permits gpu add -3            # three fewer: available may go below 0

Waiters that now fit are served. Sets the permits (from 0) if they were never set. Safe to
repeat after a dropped connection: one call adds once.

Exit codes: 0 ok · 2 usage error (N 0 or not a number, or the count would pass ±(2^53 - 1)) ·
69 Redis unreachable";

const TRY_SET_EXAMPLES: &str = "\
Examples:
  # Set up 4 permits once, whichever machine comes first:
  redsem permits gpu try-set 4 || true

  # Closed until someone adds or releases permits:
  redsem permits gate try-set 0

Exit codes: 0 set · 1 already set (left as they are) · 2 usage error (N negative or not a
number) · 69 Redis unreachable";

const ACQUIRE_EXAMPLES: &str = "\
Examples:
  redsem permits gpu acquire           # one permit, waiting as long as it takes
  redsem permits gpu acquire 2 --wait 30s
  redsem permits gpu acquire --no-wait || echo \"busy\"

The permits are taken until `release` gives them back: nothing releases them by itself.
Waiting is first in, first out; a request for N waits until N are free. Interrupted while
waiting (Ctrl-C), it takes nothing.

Exit codes: 0 taken · 2 usage error (N 0, negative or not a number) · 69 Redis unreachable ·
75 not taken in time (with --no-wait: not free now)";

const RELEASE_EXAMPLES: &str = "\
Examples:
  redsem permits gpu release           # give back one
  redsem permits gpu release 2

Anyone may release, also permits it never acquired. Waiters that now fit are served. Safe to
repeat after a dropped connection: one call releases once.

Exit codes: 0 ok · 2 usage error (N 0, negative or not a number, or the count would pass
2^53 - 1) · 69 Redis unreachable";

const AVAILABLE_EXAMPLES: &str = "\
Examples:
  redsem permits gpu available
  3

Prints the permits free now on one line: negative after `add` took more than there were, 0
when never set.

Exit codes: 0 ok · 2 usage error · 69 Redis unreachable";

/// Add, set, acquire, release or count the permits of NAME (no owners, no leases)
#[derive(Debug, clap::Args)]
#[command(after_help = crate::context::MORE, after_long_help = EXAMPLES, arg_required_else_help = false)]
pub(crate) struct Args {
    /// The semaphore's name
    #[arg(value_name = "NAME", value_parser = values::name)]
    name: String,

    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, clap::Subcommand)]
enum Action {
    /// Add N permits (a negative N takes them away)
    #[command(after_help = crate::context::MORE, after_long_help = ADD_EXAMPLES, allow_negative_numbers = true)]
    Add {
        /// How many permits to add
        #[arg(value_name = "N", value_parser = values::delta)]
        permits: i64,
    },
    /// Set the permits to N, unless they were set before
    #[command(after_help = crate::context::MORE, after_long_help = TRY_SET_EXAMPLES, allow_negative_numbers = true)]
    TrySet {
        /// How many permits there are at first
        #[arg(value_name = "N", value_parser = values::initial_permits)]
        permits: u32,
    },
    /// Take N permits, waiting in line for them
    #[command(after_help = crate::context::MORE, after_long_help = ACQUIRE_EXAMPLES, allow_negative_numbers = true)]
    Acquire {
        /// How many permits to take
        #[arg(value_name = "N", default_value = "1", value_parser = values::permits)]
        permits: u32,

        #[command(flatten)]
        patience: Patience,
    },
    /// Give back N permits
    #[command(after_help = crate::context::MORE, after_long_help = RELEASE_EXAMPLES, allow_negative_numbers = true)]
    Release {
        /// How many permits to give back
        #[arg(value_name = "N", default_value = "1", value_parser = values::permits)]
        permits: u32,
    },
    /// Print the number of permits free now
    #[command(after_help = crate::context::MORE, after_long_help = AVAILABLE_EXAMPLES)]
    Available,
}

impl Args {
    pub(crate) async fn execute(self, ctx: &Context) -> Result<ExitCode, CliError> {
        match self.action {
            Action::Add { permits } => {
                open(ctx, &self.name).await?.add_permits(permits).await?;
            }
            Action::TrySet { permits } => try_set(&open(ctx, &self.name).await?, permits).await?,
            Action::Acquire { permits, patience } => {
                // Before connecting, so a signal during the connect ends the wait too.
                let mut signals = Signals::install()?;
                let sem = open(ctx, &self.name).await?;
                let patience = match (patience.no_wait, patience.wait) {
                    (true, _) => Wait::None,
                    (false, Some(wait)) => Wait::Until(wait),
                    (false, None) => Wait::Forever,
                };
                acquire(&sem, permits, patience, ctx, &mut signals).await?;
            }
            Action::Release { permits } => {
                open(ctx, &self.name).await?.release(permits).await?;
            }
            Action::Available => {
                let available = open(ctx, &self.name).await?.available_permits().await?;
                output::print(&available.to_string())?;
            }
        }
        Ok(ExitCode::SUCCESS)
    }
}

/// How long `acquire` waits.
#[derive(Debug, Clone, Copy)]
enum Wait {
    /// `--no-wait`: one attempt.
    None,
    /// `--wait DUR`.
    Until(Duration),
    /// As long as it takes.
    Forever,
}

async fn open(ctx: &Context, name: &str) -> Result<PermitSemaphore, CliError> {
    Ok(ctx.connect().await?.permit_semaphore(name)?)
}

async fn try_set(sem: &PermitSemaphore, permits: u32) -> Result<(), CliError> {
    if sem.try_set_permits(permits).await? {
        return Ok(());
    }
    // Best effort: only to say where they stand.
    let available = match sem.available_permits().await {
        Ok(n) => format!(" ({n} available)"),
        Err(_) => String::new(),
    };
    Err(CliError::new(
        exit::FAILURE,
        format!(
            "the permits of {:?} are already set{available}; left as they are",
            sem.name()
        ),
    ))
}

/// Take `permits` as `patience` says; a signal while waiting withdraws the request (the
/// library gives back permits handed to it meanwhile) and ends with exit 128 + signal.
async fn acquire(
    sem: &PermitSemaphore,
    permits: u32,
    patience: Wait,
    ctx: &Context,
    signals: &mut Signals,
) -> Result<(), CliError> {
    let what = permits_of(permits, sem.name());
    let waits = !matches!(patience, Wait::None);
    let mut spinner = Spinner::plain(what.clone(), ctx.progress(waits));
    let started = Instant::now();
    let taken = async {
        match patience {
            Wait::None => sem.try_acquire(permits).await,
            Wait::Until(wait) => sem.acquire_timeout(permits, wait).await,
            Wait::Forever => sem.acquire(permits).await,
        }
    };
    let taken = tokio::select! {
        taken = taken => taken,
        signal = signals.recv() => {
            return Err(signals::interrupted(signal, &format!("waiting for {what}")));
        }
        never = spinner.spin() => match never {},
    };
    match taken {
        Ok(()) => {
            tracing::info!(waited = %output::duration(started.elapsed()), "took {what}");
            Ok(())
        }
        Err(Error::Timeout { waited, .. }) => Err(CliError::new(
            exit::NOT_ACQUIRED,
            format!(
                "{what} not free within {} (timed out)",
                output::duration(waited)
            ),
        )),
        Err(err) => Err(err.into()),
    }
}

/// `1 permit of "gpu"`, `2 permits of "gpu"`.
fn permits_of(permits: u32, name: &str) -> String {
    let noun = if permits == 1 { "permit" } else { "permits" };
    format!("{permits} {noun} of {name:?}")
}
