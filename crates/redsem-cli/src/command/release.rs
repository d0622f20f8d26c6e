//! `redsem release NAME ID`: give back a permit taken by `acquire`.

use std::process::ExitCode;

use redsem::PermitId;

use crate::context::Context;
use crate::error::CliError;
use crate::values;

const EXAMPLES: &str = "\
Examples:
  id=$(redsem acquire deploy --limit 1)
  ./deploy.sh
  redsem release deploy \"$id\"

  # Release whatever the holder labelled ci-42 holds:
  redsem status deploy --json |
    jq -r '.holders[] | select(.holder == \"ci-42\") | .id' |
    xargs -n1 redsem release deploy

Exit codes: 0 released · 1 not held (already released, or its lease ended) · 2 usage error ·
69 Redis unreachable";

/// Release permit ID of NAME (or withdraw a queued request)
#[derive(Debug, clap::Args)]
#[command(after_help = crate::context::MORE, after_long_help = EXAMPLES)]
pub(crate) struct Args {
    /// The semaphore's name
    #[arg(value_name = "NAME", value_parser = values::name)]
    name: String,

    /// The permit id, as printed by `redsem acquire`
    #[arg(value_name = "ID", value_parser = values::id)]
    id: String,
}

impl Args {
    pub(crate) async fn execute(self, ctx: &Context) -> Result<ExitCode, CliError> {
        let redsem = ctx.connect().await?;
        // The capacity only matters when acquiring: any value opens the handle.
        let sem = redsem.lease_semaphore(&self.name, 1)?;
        sem.release_id(&PermitId::new(self.id)).await?;
        Ok(ExitCode::SUCCESS)
    }
}
