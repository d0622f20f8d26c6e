//! `redsem completions SHELL`: print a completion script.

use std::process::ExitCode;

use clap::CommandFactory as _;
use clap_complete::Shell;

use crate::cli::Cli;
use crate::error::CliError;
use crate::output;

const EXAMPLES: &str = "\
Examples:
  redsem completions bash > ~/.local/share/bash-completion/completions/redsem
  redsem completions zsh > ~/.zfunc/_redsem
  redsem completions fish > ~/.config/fish/completions/redsem.fish";

/// Print the completion script for SHELL on stdout
#[derive(Debug, clap::Args)]
#[command(after_help = crate::cli::MORE, after_long_help = EXAMPLES)]
pub(crate) struct Args {
    /// The shell to complete in
    #[arg(value_name = "SHELL")]
    shell: Shell,
}

impl Args {
    pub(crate) fn execute(self) -> Result<ExitCode, CliError> {
        let mut command = Cli::command();
        // Into memory first: clap_complete panics on a write error, and a closed pipe
        // (`redsem completions zsh | head -1`) is not one to report.
        let mut script = Vec::new();
        clap_complete::generate(self.shell, &mut command, "redsem", &mut script);
        output::write(&script)?;
        Ok(ExitCode::SUCCESS)
    }
}
