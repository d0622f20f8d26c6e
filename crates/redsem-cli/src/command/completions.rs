//! `redsem completions SHELL`: print a completion script.

use std::process::ExitCode;

use clap_complete::Shell;

use crate::context::Context;
use crate::error::CliError;
use crate::output;

const EXAMPLES: &str = "\
Examples:
  redsem completions bash > ~/.local/share/bash-completion/completions/redsem
  redsem completions zsh > ~/.zfunc/_redsem
  redsem completions fish > ~/.config/fish/completions/redsem.fish";

/// Print the completion script for SHELL on stdout
#[derive(Debug, clap::Args)]
#[command(after_help = crate::context::MORE, after_long_help = EXAMPLES)]
pub(crate) struct Args {
    /// The shell to complete in
    #[arg(value_name = "SHELL")]
    shell: Shell,
}

impl Args {
    pub(crate) fn execute(self, ctx: &Context) -> Result<ExitCode, CliError> {
        let mut command = ctx.grammar();
        // Into memory first: clap_complete panics on a write error, and a closed pipe
        // (`redsem completions zsh | head -1`) is not one to report.
        let mut script = Vec::new();
        clap_complete::generate(self.shell, &mut command, "redsem", &mut script);
        output::write(&script)?;
        Ok(ExitCode::SUCCESS)
    }
}
