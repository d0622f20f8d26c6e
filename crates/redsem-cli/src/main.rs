//! `redsem`: run a command under a distributed permit, and inspect or manage permits, from a
//! shell. See `redsem --help`.
//!
//! The flow is parse ([`cli`]) → validate (value parsers in [`values`], the library's checks)
//! → execute ([`command`], each subcommand given the [`context::Context`] of the global
//! options); every failure is a [`error::CliError`] that carries its exit code, and only `main`
//! prints it, once, as one line.

mod child;
mod cli;
mod command;
mod context;
mod error;
mod format;
mod guard;
mod logging;
mod output;
mod request;
mod signals;
mod spinner;
mod target;
mod tree;
mod values;

use std::process::ExitCode;

fn main() -> ExitCode {
    error::install_panic_hook();
    match cli::run(std::env::args_os()) {
        Ok(code) => code,
        Err(err) => err.report(),
    }
}
