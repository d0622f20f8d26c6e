//! `redsem refresh NAME ID [--lease DUR]`: extend a permit taken by `acquire`.

use std::process::ExitCode;
use std::time::Duration;

use redsem::PermitId;

use crate::context::Context;
use crate::error::CliError;
use crate::values;

const EXAMPLES: &str = "\
Examples:
  id=$(redsem acquire deploy --limit 1 --lease 2m)
  # Keep it for 2 more minutes from now:
  redsem refresh deploy \"$id\" --lease 2m

Exit codes: 0 extended · 1 not held (released, or its lease ended) · 2 usage error ·
69 Redis unreachable";

/// Extend the lease of permit ID of NAME to DUR from now
#[derive(Debug, clap::Args)]
#[command(after_help = crate::context::MORE, after_long_help = EXAMPLES)]
pub(crate) struct Args {
    /// The semaphore's name
    #[arg(value_name = "NAME", value_parser = values::name)]
    name: String,

    /// The permit id, as printed by `redsem acquire`
    #[arg(value_name = "ID", value_parser = values::id)]
    id: String,

    /// The new lease, from now
    #[arg(long, value_name = "DUR", default_value = "30s", value_parser = values::lease)]
    lease: Duration,
}

impl Args {
    pub(crate) async fn execute(self, ctx: &Context) -> Result<ExitCode, CliError> {
        let redsem = ctx.connect().await?;
        // The capacity only matters when acquiring: any value opens the handle.
        let sem = redsem.lease_semaphore(&self.name, 1)?;
        sem.refresh_id(&PermitId::new(self.id), self.lease).await?;
        Ok(ExitCode::SUCCESS)
    }
}
