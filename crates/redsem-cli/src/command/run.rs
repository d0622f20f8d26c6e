//! `redsem run NAME --limit N [...] -- CMD [ARG...]`: run a command while holding a permit;
//! `redsem lock NAME [...] -- CMD [ARG...]`, the same with `--limit 1`.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use nix::sys::signal::Signal;
use redsem::LeasePermit;
use tokio::time::Instant;

use crate::child::{self, Child};
use crate::context::Context;
use crate::error::{CliError, exit};
use crate::output;
use crate::request::{PermitRequest, RequestOptions};
use crate::signals::Signals;
use crate::tree;
use crate::values;

/// What `run --help` and `lock --help` say after their examples: the environment, the
/// lease, signals, and every exit code.
const HOW_IT_RUNS: &str = "\
The command gets REDSEM_NAME (NAME), REDSEM_ID (the permit id), REDSEM_TOKEN (the fencing
token: pass it to the resource you protect) and REDSEM_SLOT (0..N-1, distinct among current
holders). It is looked up (PATH) before the wait, so a typo fails at once. redsem renews the
lease while the command runs and releases the permit when it exits, then exits with the
command's code (128 + signal if a signal ended it).

If renewals stop succeeding (Redis unreachable or paused, the permit gone), the command is
stopped before the lease can end on the server: it gets SIGTERM when --grace plus a margin
(a tenth of --lease, at most 100ms) is all that is left of the lease without a renewal,
SIGKILL when only the margin is left, and redsem exits 76. So --grace must fit in the lease:
at most a third of --lease (the rest is for renewals to be retried); by default 10s, or a
third of --lease if that is shorter. If the permit is known gone earlier (Redis says so),
SIGTERM comes at once. If redsem itself was stopped (SIGSTOP, a suspended machine) past the
end of the lease, the command gets SIGKILL at once when redsem resumes: the lease may already
be someone else's, which is what the fencing token is for.

What the command starts is part of it: on Linux redsem adopts the processes it leaves
behind (also daemons in a session of their own). When the command exits, those still running
get SIGTERM, then SIGKILL after --grace, before the permit is released; when renewals fail,
SIGTERM and SIGKILL go to all of them.

SIGINT, SIGTERM and SIGHUP sent to redsem are forwarded to the command (from a terminal,
Ctrl-C reaches both, so the command may see SIGINT twice). On Linux the process started is
a guard above the one that holds the permit: SIGKILL to it still stops the command's whole
tree and releases the permit; SIGKILL to the worker under it has the guard kill the orphaned
tree at once (exit 137). Only both killed at once leaves the command's children running.

Off a terminal, a wait is announced by one line on stderr (\"redsem: waiting for NAME: 3
ahead\"; --quiet: none); -v logs how long it took.

Exit codes:
  the command's own, once it ran (128 + N if signal N ended it)
  65     --tenant T holds or waits with another --weight or --cap than this
         request's; the command never started
  69     Redis unreachable, or not a Redis server; the command never started
  74     Redis lost the semaphore's state; the command never started
  75     no permit in time (--wait ran out, or --no-wait found none), or
         with --replica-acks the replicas did not acknowledge the grant in
         time (it was given back); the command never started
  76     lease lost, or renewals failed: the command was stopped before the
         lease could end
  78     Redis not suitable: eviction policy or ACL (see --server-checks); never
         started
  125    redsem failed by itself: a usage error (also --grace longer than a
         third of --lease), a --limit conflict, --one-per-holder refused, any
         other error
  126    the command was found but cannot be run (not executable, a directory)
  127    the command was not found
  128+N  redsem got signal N while waiting; the command never started
A command that exits 69, 75, ... itself passes that code on.";

const EXAMPLES: &str = "\
Examples:
  # At most 2 exports at once, across all machines; wait for a turn:
  redsem run nightly-export --limit 2 -- ./export.sh --full

  # Skip this run if another machine is already at it:
  redsem run db-migrate -l 1 --no-wait --holder \"$(hostname)\" -- ./migrate

  # Tenants share the 16 units in fair shares (acme twice as much as a
  # weight-1 tenant, at most 8 at once); every request of acme names the
  # same --weight and --cap:
  redsem run llm --limit 16 --tenant acme --weight 2 --cap 8 -- ./infer.sh

  # Give up after 5 minutes; a shell command line with -c:
  redsem run reports -l 3 -w 5m -c 'echo \"slot $REDSEM_SLOT, $REDSEM_TOKEN\"'
";

const LOCK_EXAMPLES: &str = "\
Examples:
  # One deploy at a time, across all machines:
  redsem lock deploy -- ./deploy.sh production

  # Skip if another machine holds it; give up after 30 seconds otherwise:
  redsem lock cron-cleanup --nonblock -- ./cleanup
  redsem lock cron-cleanup -w 30 -c 'make clean && make'

`redsem lock NAME` is `redsem run NAME --limit 1`: the same lock as the library's
`Redsem::mutex(NAME)`.
";

/// Run a command while holding a permit of NAME; release it when the command exits
#[derive(Debug, clap::Args)]
#[command(after_help = crate::context::MORE, after_long_help = format!("{EXAMPLES}\n{HOW_IT_RUNS}"))]
pub(crate) struct Args {
    #[command(flatten)]
    request: PermitRequest,

    #[command(flatten)]
    launch: Launch,
}

/// Run a command while holding the lock NAME (run with --limit 1)
#[derive(Debug, clap::Args)]
#[command(after_help = crate::context::MORE, after_long_help = format!("{LOCK_EXAMPLES}\n{HOW_IT_RUNS}"))]
pub(crate) struct LockArgs {
    /// The lock's name
    #[arg(value_name = "NAME", value_parser = values::name)]
    name: String,

    #[command(flatten)]
    options: RequestOptions,

    #[command(flatten)]
    launch: Launch,
}

/// The command and how it is stopped.
#[derive(Debug, clap::Args)]
struct Launch {
    /// When renewals fail, how long the command has between SIGTERM and SIGKILL, both sent
    /// before the lease can end; at most a third of --lease [default: 10s, or a third of
    /// --lease if shorter]
    #[arg(long, value_name = "DUR", value_parser = values::duration)]
    grace: Option<Duration>,

    /// Run STRING with `sh -c` instead of CMD
    #[arg(
        short = 'c',
        long = "command",
        value_name = "STRING",
        conflicts_with = "argv"
    )]
    shell_command: Option<OsString>,

    /// The command to run and its arguments (after `--` if an option of redsem's could be
    /// taken for one of them)
    #[arg(
        value_name = "CMD",
        required_unless_present = "shell_command",
        trailing_var_arg = true
    )]
    argv: Vec<OsString>,
}

impl Launch {
    /// CMD and its arguments as given (none with `-c`).
    fn words(&self) -> &[OsString] {
        &self.argv
    }

    /// The command line to start: CMD ARG..., or `sh -c STRING`.
    fn argv(&self) -> Vec<OsString> {
        match &self.shell_command {
            Some(line) => vec!["sh".into(), "-c".into(), line.clone()],
            None => self.argv.clone(),
        }
    }
}

impl LockArgs {
    /// CMD and its arguments as given (none with `-c`).
    pub(crate) fn command_words(&self) -> &[OsString] {
        self.launch.words()
    }

    pub(crate) async fn execute(self, ctx: &Context) -> Result<ExitCode, CliError> {
        let request = PermitRequest {
            name: self.name,
            limit: 1,
            options: self.options,
        };
        Args {
            request,
            launch: self.launch,
        }
        .execute(ctx)
        .await
    }
}

/// How long before the lease may end SIGKILL is sent, so that the command is dead by then: a
/// tenth of the lease, at most 100 ms.
fn kill_margin(lease: Duration) -> Duration {
    (lease / 10).min(Duration::from_millis(100))
}

/// The default grace: 10 s, or a third of the lease if that is shorter.
fn default_grace(lease: Duration) -> Duration {
    (lease / 3).min(Duration::from_secs(10))
}

impl Args {
    /// CMD and its arguments as given (none with `-c`).
    pub(crate) fn command_words(&self) -> &[OsString] {
        self.launch.words()
    }

    /// Everything that can fail before the command starts fails with [`exit::RUN_FAILED`] in
    /// place of 1 and 2, so that those stay the command's own.
    pub(crate) async fn execute(self, ctx: &Context) -> Result<ExitCode, CliError> {
        self.run(ctx).await.map_err(own_failure)
    }

    async fn run(self, ctx: &Context) -> Result<ExitCode, CliError> {
        let grace = self.grace()?;
        self.request.check_replica_acks(ctx)?;
        let argv = self.launch.argv();
        let program = argv
            .first()
            .ok_or_else(|| CliError::new(exit::USAGE, "no command to run"))?;
        let resolved = child::resolve(program)?;
        let mut signals = Signals::install()?;
        let redsem = ctx.connect().await?;
        let permit = self
            .request
            .acquire(&redsem, true, ctx, &mut signals)
            .await?;
        // A grant handed over to a waiter runs on its waiter lease, which may have less left
        // than the grace: renew it before the command starts rather than stop it at once.
        if permit.time_left() <= grace + kill_margin(self.request.options.lease)
            && let Err(err) = permit.refresh().await
        {
            release(permit).await;
            return Err(err.into());
        }
        // Processes the command leaves behind are re-parented to redsem, so that they are
        // found and stopped before the permit goes back.
        tree::adopt_orphans();
        let child = match Child::spawn(&resolved, &argv, &permit) {
            Ok(child) => child,
            Err(err) => {
                release(permit).await;
                return Err(err);
            }
        };
        self.supervise(child, permit, signals, grace).await
    }

    /// `--grace`, or its default; refused if it does not fit in the lease.
    fn grace(&self) -> Result<Duration, CliError> {
        let lease = self.request.options.lease;
        let Some(grace) = self.launch.grace else {
            return Ok(default_grace(lease));
        };
        if grace > lease / 3 {
            return Err(CliError::new(
                exit::USAGE,
                format!(
                    "--grace {} is longer than a third of --lease {}: the command must get \
                     SIGTERM and SIGKILL before the lease can end, and renewals need the rest \
                     of it; use --grace {} or less, or a longer --lease",
                    output::duration(grace),
                    output::duration(lease),
                    output::duration(lease / 3)
                ),
            ));
        }
        Ok(grace)
    }

    /// Forward signals until the command exits; stop it before the lease can end if renewals
    /// stop succeeding: SIGTERM when `grace` + the kill margin is left of the lease (or at once
    /// if the permit is known lost), SIGKILL when the margin is left (or `grace` after SIGTERM).
    async fn supervise(
        &self,
        mut child: Child,
        permit: LeasePermit,
        mut signals: Signals,
        grace: Duration,
    ) -> Result<ExitCode, CliError> {
        let lease = self.request.options.lease;
        let margin = kill_margin(lease);
        // When SIGTERM was sent.
        let mut terminated: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let left = permit.time_left();
            if terminated.is_none() && (!permit.is_held() || left <= grace + margin) {
                if left <= margin {
                    // No time left for a grace: the lease may end (or have ended) any moment.
                    kill_tree(&mut child).await;
                    return Err(self.stopped(
                        &permit,
                        "killed the command with SIGKILL at once, as \
                         the lease could end any moment (or had ended while redsem was stopped)",
                    ));
                }
                tracing::warn!(left = ?left, "renewals failing: stopping the command before the lease can end");
                child.signal(Signal::SIGTERM);
                tree::signal_all(Signal::SIGTERM, child.id());
                terminated = Some(now);
            }
            // The next moment to act: SIGKILL after SIGTERM, or SIGTERM.
            let act_at = match terminated {
                Some(sent) => (sent + grace).min(now + left.saturating_sub(margin)),
                None => now + left.saturating_sub(grace + margin),
            };
            if terminated.is_some() && act_at <= now {
                kill_tree(&mut child).await;
                let how = format!(
                    "killed the command with SIGKILL {} after SIGTERM, before the lease could end",
                    output::duration(now - terminated.unwrap_or(now))
                );
                return Err(self.stopped(&permit, &how));
            }
            // Deadlines are on the permit's clock, which counts suspended time and tokio's
            // timers do not: look again at least every quarter lease.
            let nap = act_at.saturating_duration_since(now).min(lease / 4);
            tokio::select! {
                biased;
                status = child.wait() => {
                    let status = status?;
                    // What the command left running goes before the permit does.
                    let deadline = match terminated {
                        Some(sent) => (sent + grace).min(now + left.saturating_sub(margin)),
                        None => now + grace.min(left.saturating_sub(margin)),
                    };
                    end_leftovers(deadline, terminated.is_none()).await;
                    if terminated.is_some() {
                        return Err(self.stopped(
                            &permit,
                            "stopped the command with SIGTERM before the lease could end",
                        ));
                    }
                    if !permit.is_held() {
                        // It ended, but after the lease could have ended: part of its run was
                        // not covered by the permit.
                        return Err(self.stopped(&permit, "the command exited after that"));
                    }
                    release(permit).await;
                    return Ok(ExitCode::from(child::exit_code(status)));
                }
                () = permit.lost(), if terminated.is_none() => {}
                signal = signals.recv() => child.signal(signal),
                () = tokio::time::sleep(nap) => {}
            }
        }
    }

    /// The error of a command stopped because its lease was lost or could not be renewed.
    fn stopped(&self, permit: &LeasePermit, then: &str) -> CliError {
        let why = if permit.is_held() {
            "renewals failed"
        } else {
            "it may have ended, or Redis no longer has it"
        };
        CliError::new(
            exit::LEASE_LOST,
            format!(
                "lost the lease of {:?} (permit {}) while the command ran ({why}); {then}",
                self.request.name,
                permit.id()
            ),
        )
    }
}

/// `err` with the code `run` gives redsem's own failures: 125 for 1 (any other error) and 2
/// (usage), which a command may well exit with itself.
pub(crate) fn own_failure(err: CliError) -> CliError {
    match err.code() {
        exit::FAILURE | exit::USAGE => err.with_code(exit::RUN_FAILED),
        _ => err,
    }
}

/// SIGKILL the command and everything it started, and wait until all of it is gone.
async fn kill_tree(child: &mut Child) {
    child.signal(Signal::SIGKILL);
    tree::signal_all(Signal::SIGKILL, child.id());
    child.reap().await;
    tree::kill_all(KILL_PATIENCE, None).await;
}

/// How long SIGKILL is repeated at a tree that keeps forking (or has a process stuck in the
/// kernel) before redsem gives up on it.
const KILL_PATIENCE: Duration = Duration::from_secs(5);

/// After the command exited: stop the processes it left running (background jobs, daemons):
/// SIGTERM (if `term`), then SIGKILL at `deadline` for those still there, so that none of
/// them runs on once the permit is given back.
async fn end_leftovers(deadline: Instant, term: bool) {
    let left = tree::living();
    if left.is_empty() {
        return;
    }
    tracing::warn!(
        processes = left.len(),
        "the command exited and left processes running: stopping them before the permit goes back"
    );
    if term {
        tree::signal_all(Signal::SIGTERM, None);
        let patience = deadline.saturating_duration_since(Instant::now());
        if tree::ended_within(patience, None).await {
            return;
        }
    }
    tree::kill_all(KILL_PATIENCE, None).await;
}

/// Release `permit`; a failure is logged only, since the lease ends by itself.
async fn release(permit: LeasePermit) {
    let id = permit.id().clone();
    match permit.release().await {
        Ok(()) => tracing::info!(%id, "permit released"),
        Err(err) => {
            let err = crate::error::chain(&err);
            tracing::warn!(%id, %err, "could not release the permit; its lease will end by itself")
        }
    }
}
