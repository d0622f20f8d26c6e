//! What every example shares: where Redis is, and how a run's outcome becomes the exit code.
//! (A directory without `main.rs`, so cargo does not take it for an example of its own.)

use std::process::ExitCode;

/// `REDIS_URL`, or a local server on the default port.
pub(crate) fn redis_url() -> String {
    std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

/// 0 on success; 69 (`EX_UNAVAILABLE`) with a hint when no server answers at `url`; 1 on any
/// other error, printed.
pub(crate) fn exit_code(url: &str, outcome: redsem::Result<()>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.is_unavailable() => {
            eprintln!("no Redis at {url}: start one with `redis-server --daemonize yes`");
            ExitCode::from(69)
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::FAILURE
        }
    }
}
