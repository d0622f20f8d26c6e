//! What `redsem` prints: [`print`], the one way anything reaches stdout, and JSON; the
//! formats for people (short durations, aligned tables) are in [`crate::format`].

use std::io::Write as _;

pub(crate) use crate::format::{duration, millis, table};

use crate::error::{CliError, exit};

/// Write `text` and a newline to stdout. A reader that went away (`redsem status | head -1`)
/// ends the process quietly with exit 0, as it does for `rg` and `cargo`.
pub(crate) fn print(text: &str) -> Result<(), CliError> {
    write(format!("{text}\n").as_bytes())
}

/// Write `bytes` to stdout as they are; see [`print`].
pub(crate) fn write(bytes: &[u8]) -> Result<(), CliError> {
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Err(CliError::quiet(0)),
        Err(e) => Err(CliError::new(
            exit::FAILURE,
            format!("cannot write to stdout: {e}"),
        )),
    }
}

/// `value` as compact JSON on one line.
pub(crate) fn json(value: &impl serde::Serialize) -> Result<String, CliError> {
    serde_json::to_string(value)
        .map_err(|e| CliError::new(exit::FAILURE, format!("cannot write JSON: {e}")))
}
