//! `CliError`: what went wrong, in one line, and the exit code it ends the process with.

use std::fmt;
use std::io::Write as _;
use std::process::ExitCode;

use redsem::Error;

use crate::format;

/// The exit codes of `redsem` (besides 0 and the child's own code in `run`).
pub(crate) mod exit {
    /// Any other error: bad state, limit conflict, not held.
    pub(crate) const FAILURE: u8 = 1;
    /// Bad flags or values.
    pub(crate) const USAGE: u8 = 2;
    /// A tenant named with a weight or cap other than those in force while it holds or
    /// waits (sysexits `EX_DATAERR`): callers configured the tenant differently.
    pub(crate) const TENANT_CONFLICT: u8 = 65;
    /// Redis unreachable (sysexits `EX_UNAVAILABLE`).
    pub(crate) const UNAVAILABLE: u8 = 69;
    /// Redis lost the state of the primitive (restart without persistence, failover, flush,
    /// eviction) while the call relied on it (sysexits `EX_IOERR`).
    pub(crate) const STATE_LOST: u8 = 74;
    /// No permit in time, or a change not acknowledged by the replicas of `--replica-acks`
    /// in time (sysexits `EX_TEMPFAIL`).
    pub(crate) const NOT_ACQUIRED: u8 = 75;
    /// The lease was lost while `run`'s command ran.
    pub(crate) const LEASE_LOST: u8 = 76;
    /// The Redis server (or user) is set up so that redsem's guarantees would not hold: an
    /// `allkeys-*` eviction policy, missing ACL rights (sysexits `EX_CONFIG`).
    pub(crate) const UNSUITABLE: u8 = 78;
    /// `run` and `lock` failed by themselves (a usage error, a limit conflict, ...), kept apart
    /// from the command's own codes as `env` and `timeout` do.
    pub(crate) const RUN_FAILED: u8 = 125;
    /// `run`'s command was found but could not be started (as `env` and `timeout` do).
    pub(crate) const CANNOT_EXECUTE: u8 = 126;
    /// `run`'s command was not found.
    pub(crate) const NOT_FOUND: u8 = 127;
    /// Added to a signal number when a process ended by that signal.
    pub(crate) const SIGNALLED: u8 = 128;
}

/// A failure of the command line: printed once by `main` as `redsem: <message>`.
#[derive(Debug)]
pub(crate) struct CliError {
    code: u8,
    message: String,
}

impl CliError {
    pub(crate) fn new(code: u8, message: impl Into<String>) -> Self {
        CliError {
            code,
            message: message.into(),
        }
    }

    /// An end with `code` and nothing to say (stdout closed by its reader).
    pub(crate) fn quiet(code: u8) -> Self {
        CliError::new(code, "")
    }

    pub(crate) fn code(&self) -> u8 {
        self.code
    }

    /// The same error, exiting with `code` instead.
    pub(crate) fn with_code(self, code: u8) -> Self {
        CliError { code, ..self }
    }

    /// Print the one line on stderr (unless there is nothing to say) and give the exit code.
    pub(crate) fn report(&self) -> ExitCode {
        if !self.message.trim().is_empty() {
            // Nowhere left to report a closed stderr to.
            let _ = writeln!(std::io::stderr(), "redsem: {self}");
        }
        ExitCode::from(self.code())
    }
}

impl fmt::Display for CliError {
    /// The message on one line, whatever a cause (a Redis error, a clap error) contained.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut words = self.message.split_whitespace();
        if let Some(first) = words.next() {
            f.write_str(first)?;
        }
        for word in words {
            write!(f, " {word}")?;
        }
        Ok(())
    }
}

/// A cap as the flags say it: `--cap C`, or `no --cap`.
fn cap_flag(cap: Option<u32>) -> String {
    cap.map_or_else(|| "no --cap".to_owned(), |cap| format!("--cap {cap}"))
}

impl From<Error> for CliError {
    fn from(err: Error) -> Self {
        let code = if err.is_unavailable() {
            exit::UNAVAILABLE
        } else if matches!(
            err,
            Error::Unsuitable { .. } | Error::EngineUnavailable { .. }
        ) {
            exit::UNSUITABLE
        } else if matches!(err, Error::TenantConflict { .. }) {
            exit::TENANT_CONFLICT
        } else if matches!(err, Error::StateLost { .. }) {
            exit::STATE_LOST
        } else if err.is_not_acquired() || err.is_not_replicated() {
            exit::NOT_ACQUIRED
        } else if err.is_invalid_argument() {
            exit::USAGE
        } else {
            exit::FAILURE
        };
        let message = match &err {
            Error::CapacityConflict {
                name,
                requested,
                current,
            } => format!(
                "--limit {requested} differs from the limit {current} in force for {name:?} \
                 while it has holders or waiters"
            ),
            Error::TenantConflict {
                name,
                tenant,
                requested_weight,
                requested_cap,
                weight,
                cap,
            } => format!(
                "tenant {tenant:?} of {name:?} is in force with --weight {weight} and {} while it \
                 holds or waits; this request asks for --weight {requested_weight} and {}: give \
                 every request of a tenant the same --weight and --cap",
                cap_flag(*cap),
                cap_flag(*requested_cap)
            ),
            Error::Timeout { name, waited } => format!(
                "no permit of {name:?} within {} (timed out)",
                format::duration(*waited)
            ),
            Error::InvalidArgument(what) => what.clone(),
            Error::NotReplicated { acked, wanted } => format!(
                "only {acked} of the {wanted} replicas of --replica-acks acknowledged the change \
                 in time: a grant was given back (nothing is held; try again later); a release, \
                 count-down or other change stands on the primary (do not repeat it), but a \
                 failover to a replica that missed it may undo it"
            ),
            Error::Unsuitable { setting, problem } => format!(
                "Redis is not set up for redsem ({setting}): {problem} (--server-checks warn \
                 connects anyway, at that risk)"
            ),
            Error::EngineUnavailable { node, reply, .. } => format!(
                "--engine native: {node} cannot serve redsem's module engine: {reply} (load \
                 the module there, or use --engine auto)"
            ),
            Error::StateLost { name, detail } => format!(
                "Redis lost the state of {name:?} ({detail}): it restarted without \
                 persistence, failed over to a replica that had not received it, was flushed, \
                 or evicted it; nothing was granted or opened because of it"
            ),
            _ => chain(&err),
        };
        CliError::new(code, message)
    }
}

/// `err` and its causes, `outer: inner: innermost`, each said once: a cause whose message an
/// outer one already contains is skipped.
pub(crate) fn chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut cause = err.source();
    while let Some(err) = cause {
        let said = err.to_string();
        if !said.is_empty() && !text.contains(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = err.source();
    }
    text
}

/// Print one line and exit 1 on a panic (a bug): never a backtrace. The child of `run` dies
/// with the process (parent-death signal); a permit comes back when its lease ends.
pub(crate) fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        let what = info
            .payload()
            .downcast_ref::<&str>()
            .copied()
            .or_else(|| info.payload().downcast_ref::<String>().map(String::as_str))
            .unwrap_or("panic");
        let place = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        let err = CliError::new(
            exit::FAILURE,
            format!("internal error{place}: {what} (a bug; please report it)"),
        );
        let _ = writeln!(std::io::stderr(), "redsem: {err}");
        std::process::exit(exit::FAILURE.into());
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_print_on_one_line() {
        let err = CliError::new(exit::FAILURE, "first\n\n  second\tthird ");
        assert_eq!(err.to_string(), "first second third");
    }

    #[test]
    fn a_cause_is_said_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = Error::from(redsem::redis::RedisError::from(io));
        let text = CliError::from(err).to_string();
        assert!(text.starts_with("redis unavailable: "), "{text}");
        assert_eq!(text.matches("refused").count(), 1, "{text}");
    }

    #[test]
    fn library_errors_carry_their_exit_codes() {
        let conflict = CliError::from(Error::CapacityConflict {
            name: "jobs".into(),
            requested: 5,
            current: 3,
        });
        assert_eq!(conflict.code(), exit::FAILURE);
        assert!(conflict.to_string().contains("--limit 5"));
        assert!(conflict.to_string().contains("limit 3"));
        let not_held = CliError::from(Error::NotHeld {
            name: "jobs".into(),
            id: "ab".into(),
        });
        assert_eq!(not_held.code(), exit::FAILURE);
        assert!(not_held.to_string().contains("not held"));
        let timeout = CliError::from(Error::Timeout {
            name: "jobs".into(),
            waited: std::time::Duration::from_millis(500),
        });
        assert_eq!(timeout.code(), exit::NOT_ACQUIRED);
        let invalid = CliError::from(Error::InvalidArgument("bad".into()));
        assert_eq!(invalid.code(), exit::USAGE);
        let unsuitable = CliError::from(Error::Unsuitable {
            setting: "maxmemory-policy".into(),
            problem: "127.0.0.1:6379 has maxmemory-policy allkeys-lru".into(),
        });
        assert_eq!(unsuitable.code(), exit::UNSUITABLE);
        assert!(
            unsuitable.to_string().contains("allkeys-lru"),
            "{unsuitable}"
        );
        assert!(
            unsuitable.to_string().contains("--server-checks warn"),
            "{unsuitable}"
        );
        let unacked = CliError::from(Error::NotReplicated {
            acked: 0,
            wanted: 1,
        });
        assert_eq!(unacked.code(), exit::NOT_ACQUIRED);
        assert!(
            unacked.to_string().contains("0 of the 1 replicas"),
            "{unacked}"
        );
        let lost = CliError::from(Error::StateLost {
            name: "deploy".into(),
            detail: "the count is gone".into(),
        });
        assert_eq!(lost.code(), exit::STATE_LOST);
        assert!(lost.to_string().contains("\"deploy\""), "{lost}");
        assert!(lost.to_string().contains("the count is gone"), "{lost}");
    }

    #[test]
    fn a_tenant_conflict_has_its_own_exit_code_and_names_both_settings() {
        let conflict = CliError::from(Error::TenantConflict {
            name: "llm".into(),
            tenant: "acme".into(),
            requested_weight: 2,
            requested_cap: None,
            weight: 1,
            cap: Some(4),
        });
        assert_eq!(conflict.code(), exit::TENANT_CONFLICT);
        let text = conflict.to_string();
        assert!(text.contains("\"acme\""), "{text}");
        assert!(text.contains("--weight 1 and --cap 4"), "{text}");
        assert!(text.contains("--weight 2 and no --cap"), "{text}");
    }
}
