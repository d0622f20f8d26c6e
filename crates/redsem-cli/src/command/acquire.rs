//! `redsem acquire NAME --limit N [...]`: take a permit that outlives the command.

use std::process::ExitCode;

use serde::Serialize;

use crate::context::Context;
use crate::error::CliError;
use crate::output;
use crate::request::PermitRequest;
use crate::signals::Signals;

const EXAMPLES: &str = "\
Examples:
  # Take one of 3 permits for 10 minutes; keep its id:
  id=$(redsem acquire reports --limit 3 --lease 10m)
  ./make-report
  redsem release reports \"$id\"

  # One attempt, with the fencing token and slot as JSON:
  redsem acquire reports --limit 3 --no-wait --json
  {\"id\":\"9f2c...\",\"token\":42,\"slot\":1,\"lease_ms\":30000}

The permit is not renewed: it lives one --lease unless `redsem refresh` extends it, and comes
back by itself when the lease ends. Prints the permit id (with --json: id, token, slot and
lease in ms) on one line.

Exit codes: 0 acquired · 1 other error (limit conflict) · 2 usage error ·
65 --tenant held or waiting with another --weight or --cap · 69 Redis unreachable ·
75 no permit in time";

/// Take a permit of NAME and print its id; it lives one lease unless refreshed
#[derive(Debug, clap::Args)]
#[command(after_help = crate::context::MORE, after_long_help = EXAMPLES)]
pub(crate) struct Args {
    #[command(flatten)]
    request: PermitRequest,

    /// Print {"id", "token", "slot", "lease_ms"} as JSON
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct Acquired<'a> {
    id: &'a str,
    token: u64,
    slot: u32,
    lease_ms: u64,
}

impl Args {
    pub(crate) async fn execute(self, ctx: &Context) -> Result<ExitCode, CliError> {
        self.request.check_replica_acks(ctx)?;
        let mut signals = Signals::install()?;
        let redsem = ctx.connect().await?;
        let permit = self
            .request
            .acquire(&redsem, false, ctx, &mut signals)
            .await?;
        let line = if self.json {
            output::json(&Acquired {
                id: permit.id().as_str(),
                token: permit.token().get(),
                slot: permit.slot(),
                lease_ms: output::millis(self.request.options.lease),
            })?
        } else {
            permit.id().to_string()
        };
        // Printed after the permit is forgotten: a reader gone by now does not take it back.
        permit.forget();
        output::print(&line)?;
        Ok(ExitCode::SUCCESS)
    }
}
