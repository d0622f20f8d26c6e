//! The subcommands, one file each: its arguments (clap) and its `execute`.
//!
//! Adding one is one file here plus one line in [`Command`] and one in
//! [`Command::execute`].

mod acquire;
mod completions;
mod doctor;
mod latch;
mod permits;
mod refresh;
mod release;
mod run;
mod serve;
mod status;

use std::ffi::OsString;
use std::process::ExitCode;

pub(crate) use run::own_failure;

use crate::context::Context;
use crate::error::CliError;

#[derive(Debug, clap::Subcommand)]
pub(crate) enum Command {
    Run(run::Args),
    Lock(run::LockArgs),
    Acquire(acquire::Args),
    Refresh(refresh::Args),
    Release(release::Args),
    Status(status::Args),
    Doctor(doctor::Args),
    Serve(serve::Args),
    Permits(permits::Args),
    Latch(latch::Args),
    Completions(completions::Args),
}

impl Command {
    /// The command `run` or `lock` is to run, with its arguments, as given; `None` for the
    /// other subcommands.
    pub(crate) fn command_words(&self) -> Option<&[OsString]> {
        match self {
            Command::Run(args) => Some(args.command_words()),
            Command::Lock(args) => Some(args.command_words()),
            _ => None,
        }
    }

    pub(crate) async fn execute(self, ctx: &Context) -> Result<ExitCode, CliError> {
        match self {
            Command::Run(args) => args.execute(ctx).await,
            Command::Lock(args) => args.execute(ctx).await,
            Command::Acquire(args) => args.execute(ctx).await,
            Command::Refresh(args) => args.execute(ctx).await,
            Command::Release(args) => args.execute(ctx).await,
            Command::Status(args) => args.execute(ctx).await,
            Command::Doctor(args) => args.execute(ctx).await,
            Command::Serve(args) => args.execute(ctx).await,
            Command::Permits(args) => args.execute(ctx).await,
            Command::Latch(args) => args.execute(ctx).await,
            Command::Completions(args) => args.execute(ctx),
        }
    }
}
