//! `redsem run NAME --limit N [...] -- CMD [ARG...]`: run a command while holding a permit.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use nix::sys::signal::Signal;
use redsem::LeasePermit;
use tokio::time::Instant;

use crate::child::{self, Child};
use crate::cli::Context;
use crate::error::{CliError, exit};
use crate::output;
use crate::request::PermitRequest;
use crate::signals::Signals;
use crate::values;

const EXAMPLES: &str = "\
Examples:
  # At most 2 exports at once, across all machines; wait for a turn:
  redsem run nightly-export --limit 2 -- ./export.sh --full

  # Skip this run if another machine is already at it:
  redsem run db-migrate --limit 1 --no-wait --holder \"$(hostname)\" -- ./migrate

  # Give up after 5 minutes; the command sees its permit in its environment:
  redsem run reports --limit 3 --wait 5m -- sh -c 'echo slot $REDSEM_SLOT token $REDSEM_TOKEN'

The command gets REDSEM_ID (the permit id), REDSEM_TOKEN (the fencing token: pass it to the
resource you protect) and REDSEM_SLOT (0..N-1, distinct among current holders). redsem renews
the lease while the command runs and releases the permit when it exits, then exits with the
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

SIGINT, SIGTERM and SIGHUP sent to redsem are forwarded to the command (from a terminal,
Ctrl-C reaches both, so the command may see SIGINT twice). If redsem is killed, the command is
killed too.

Exit codes: the command's own · 2 usage error (also: --grace longer than a third of --lease)
· 69 Redis unreachable · 74 Redis lost the semaphore's state · 75 no permit in time (the
command never started) · 76 lease lost, or renewals failed and the command was stopped ·
78 Redis not suitable (eviction policy, ACL; see --server-checks) · 126/127 the command cannot
be run / not found";

/// Run a command while holding a permit of NAME; release it when the command exits
#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
pub(crate) struct Args {
    #[command(flatten)]
    request: PermitRequest,

    /// When renewals fail, how long the command has between SIGTERM and SIGKILL, both sent
    /// before the lease can end; at most a third of --lease [default: 10s, or a third of
    /// --lease if shorter]
    #[arg(long, value_name = "DUR", value_parser = values::duration)]
    grace: Option<Duration>,

    /// The command to run and its arguments (after `--` if they start with a dash)
    #[arg(
        value_name = "CMD",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<OsString>,
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
    pub(crate) async fn execute(self, ctx: &Context) -> Result<ExitCode, CliError> {
        let grace = self.grace()?;
        let mut signals = Signals::install()?;
        let redsem = ctx.connect().await?;
        let permit = self
            .request
            .acquire(&redsem, true, ctx, &mut signals)
            .await?;
        tracing::info!(id = %permit.id(), token = %permit.token(), slot = permit.slot(), "permit acquired");
        // A grant handed over to a waiter runs on its waiter lease, which may have less left
        // than the grace: renew it before the command starts rather than stop it at once.
        if permit.time_left() <= grace + kill_margin(self.request.lease)
            && let Err(err) = permit.refresh().await
        {
            release(permit).await;
            return Err(err.into());
        }
        let child = match Child::spawn(&self.command, &permit) {
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
        let lease = self.request.lease;
        let Some(grace) = self.grace else {
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
        let lease = self.request.lease;
        let margin = kill_margin(lease);
        // When SIGTERM was sent.
        let mut terminated: Option<Instant> = None;
        loop {
            let now = Instant::now();
            let left = permit.time_left();
            if terminated.is_none() && (!permit.is_held() || left <= grace + margin) {
                if left <= margin {
                    // No time left for a grace: the lease may end (or have ended) any moment.
                    child.signal(Signal::SIGKILL);
                    child.reap().await;
                    return Err(self.stopped(
                        &permit,
                        "killed the command with SIGKILL at once, as \
                         the lease could end any moment (or had ended while redsem was stopped)",
                    ));
                }
                tracing::warn!(left = ?left, "renewals failing: stopping the command before the lease can end");
                child.signal(Signal::SIGTERM);
                terminated = Some(now);
            }
            // The next moment to act: SIGKILL after SIGTERM, or SIGTERM.
            let act_at = match terminated {
                Some(sent) => (sent + grace).min(now + left.saturating_sub(margin)),
                None => now + left.saturating_sub(grace + margin),
            };
            if terminated.is_some() && act_at <= now {
                child.signal(Signal::SIGKILL);
                child.reap().await;
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

/// Release `permit`; a failure is logged only, since the lease ends by itself.
async fn release(permit: LeasePermit) {
    let id = permit.id().clone();
    match permit.release().await {
        Ok(()) => tracing::info!(%id, "permit released"),
        Err(err) => {
            tracing::warn!(%id, %err, "could not release the permit; its lease will end by itself")
        }
    }
}
