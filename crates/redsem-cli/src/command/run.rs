//! `redsem run NAME --limit N [...] -- CMD [ARG...]`: run a command while holding a permit.

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;

use redsem::LeasePermit;

use crate::child::{self, Child, Stopped};
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

If the lease is lost (Redis unreachable, redsem paused) the command gets SIGTERM before the
lease can have ended, SIGKILL after --grace, and redsem exits 76. SIGINT, SIGTERM and SIGHUP
sent to redsem are forwarded to the command (from a terminal, Ctrl-C reaches both, so the
command may see SIGINT twice). If redsem is killed, the command is killed too.

Exit codes: the command's own · 2 usage error · 69 Redis unreachable · 75 no permit in time
(the command never started) · 76 lease lost · 126/127 the command cannot be run / not found";

/// Run a command while holding a permit of NAME; release it when the command exits
#[derive(Debug, clap::Args)]
#[command(after_help = EXAMPLES)]
pub(crate) struct Args {
    #[command(flatten)]
    request: PermitRequest,

    /// After the lease is lost, how long the command has between SIGTERM and SIGKILL
    #[arg(long, value_name = "DUR", default_value = "10s", value_parser = values::duration)]
    grace: Duration,

    /// The command to run and its arguments (after `--` if they start with a dash)
    #[arg(
        value_name = "CMD",
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true
    )]
    command: Vec<OsString>,
}

impl Args {
    pub(crate) async fn execute(self, ctx: &Context) -> Result<ExitCode, CliError> {
        let mut signals = Signals::install()?;
        let redsem = ctx.connect().await?;
        let permit = self
            .request
            .acquire(&redsem, true, ctx, &mut signals)
            .await?;
        tracing::info!(id = %permit.id(), token = %permit.token(), slot = permit.slot(), "permit acquired");
        let child = match Child::spawn(&self.command, &permit) {
            Ok(child) => child,
            Err(err) => {
                release(permit).await;
                return Err(err);
            }
        };
        self.supervise(child, permit, signals).await
    }

    /// Forward signals until the command exits or the permit is lost.
    async fn supervise(
        &self,
        mut child: Child,
        permit: LeasePermit,
        mut signals: Signals,
    ) -> Result<ExitCode, CliError> {
        loop {
            tokio::select! {
                biased;
                status = child.wait() => {
                    let status = status?;
                    if !permit.is_held() {
                        // It ended, but after the lease could have ended: part of its run was
                        // not covered by the permit.
                        return Err(self.lost(&permit, "the command exited after that"));
                    }
                    release(permit).await;
                    return Ok(ExitCode::from(child::exit_code(status)));
                }
                () = permit.lost() => {
                    let how = match child.stop(self.grace).await {
                        Stopped::Terminated => "stopped the command with SIGTERM".to_owned(),
                        Stopped::Killed => format!(
                            "killed the command with SIGKILL after a {} grace",
                            output::duration(self.grace)
                        ),
                    };
                    return Err(self.lost(&permit, &how));
                }
                signal = signals.recv() => child.signal(signal),
            }
        }
    }

    fn lost(&self, permit: &LeasePermit, then: &str) -> CliError {
        CliError::new(
            exit::LEASE_LOST,
            format!(
                "lost the lease of {:?} (permit {}) while the command ran; {then}",
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
