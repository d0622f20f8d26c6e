//! The signals `redsem` catches while it waits or runs a command: SIGINT, SIGTERM, SIGHUP.
//!
//! Caught rather than left to kill the process, so a queued request is withdrawn and a
//! permit released before `redsem` exits, and so `run` can forward them to its command.

use nix::sys::signal::Signal;
use tokio::signal::unix::{SignalKind, signal};

use crate::error::{CliError, exit};

/// Handlers for the signals that end `redsem`, installed for the rest of the process.
#[derive(Debug)]
pub(crate) struct Signals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
    hangup: tokio::signal::unix::Signal,
}

impl Signals {
    pub(crate) fn install() -> Result<Self, CliError> {
        let handler = |kind: SignalKind| {
            signal(kind)
                .map_err(|e| CliError::new(exit::FAILURE, format!("cannot handle signals: {e}")))
        };
        Ok(Signals {
            interrupt: handler(SignalKind::interrupt())?,
            terminate: handler(SignalKind::terminate())?,
            hangup: handler(SignalKind::hangup())?,
        })
    }

    /// The next signal received.
    ///
    /// # Cancel safety
    ///
    /// Cancel safe: a signal not yet returned stays pending.
    pub(crate) async fn recv(&mut self) -> Signal {
        tokio::select! {
            Some(()) = self.interrupt.recv() => Signal::SIGINT,
            Some(()) = self.terminate.recv() => Signal::SIGTERM,
            Some(()) = self.hangup.recv() => Signal::SIGHUP,
            else => std::future::pending().await,
        }
    }
}

/// The error of a wait cut short by `signal`: exit 128 + its number, as if it had killed us.
pub(crate) fn interrupted(signal: Signal, what: &str) -> CliError {
    CliError::new(
        exit::SIGNALLED.saturating_add(signal as u8),
        format!("interrupted by {} while {what}", signal.as_str()),
    )
}
