//! The Rust library's `Error` as Python exceptions: one class per variant, all under
//! `redsem.Error` (defined in Python, `redsem/_errors.py`, so that some can also be the
//! built-in exception a Python reader expects: `Timeout` is a `TimeoutError`, ...).

use std::time::Duration;

use pyo3::PyErr;

mod py {
    pyo3::import_exception!(redsem._errors, Error);
    pyo3::import_exception!(redsem._errors, Unavailable);
    pyo3::import_exception!(redsem._errors, RedisError);
    pyo3::import_exception!(redsem._errors, NoPermit);
    pyo3::import_exception!(redsem._errors, NotEnoughPermits);
    pyo3::import_exception!(redsem._errors, Timeout);
    pyo3::import_exception!(redsem._errors, NotHeld);
    pyo3::import_exception!(redsem._errors, LeaseLost);
    pyo3::import_exception!(redsem._errors, CapacityConflict);
    pyo3::import_exception!(redsem._errors, TenantConflict);
    pyo3::import_exception!(redsem._errors, AlreadyHeld);
    pyo3::import_exception!(redsem._errors, InvalidArgument);
    pyo3::import_exception!(redsem._errors, WrongType);
    pyo3::import_exception!(redsem._errors, StateLost);
    pyo3::import_exception!(redsem._errors, Unsuitable);
    pyo3::import_exception!(redsem._errors, EngineUnavailable);
    pyo3::import_exception!(redsem._errors, NotReplicated);
    pyo3::import_exception!(redsem._errors, ProtocolError);
    pyo3::import_exception!(redsem._errors, Incompatible);
    pyo3::import_exception!(redsem._errors, WrongProcess);
}

/// The message of `err` and of every cause under it (the Rust messages leave the cause to
/// `source()`; a Python reader sees one line).
///
/// Written for a Python reader: a cause whose text is in the message already is not repeated
/// (redis-rs's errors print their own cause), durations read `1.003 s`, and the options are
/// named as `connect` takes them (`server_checks="warn"`, not `ServerChecks::Warn`).
pub(crate) fn message(err: &redsem::Error) -> String {
    let mut text = match err {
        redsem::Error::Timeout { name, waited, .. } => {
            format!("timed out after {} waiting for {name:?}", human(*waited))
        }
        other => other.to_string(),
    };
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    for (rust, python) in [
        ("ServerChecks::Enforce", "server_checks=\"enforce\""),
        ("ServerChecks::Warn", "server_checks=\"warn\""),
        ("ServerChecks::Off", "server_checks=\"off\""),
    ] {
        text = text.replace(rust, python);
    }
    text
}

/// `err` as the Python exception of its variant, with its message.
pub(crate) fn to_py(err: redsem::Error) -> PyErr {
    use redsem::Error as E;
    let text = message(&err);
    match err {
        E::Unavailable(_) => py::Unavailable::new_err(text),
        E::Redis(_) => py::RedisError::new_err(text),
        E::NoPermit { .. } => py::NoPermit::new_err(text),
        E::NotEnoughPermits { .. } => py::NotEnoughPermits::new_err(text),
        E::Timeout { .. } => py::Timeout::new_err(text),
        E::NotHeld { .. } => py::NotHeld::new_err(text),
        E::LeaseLost { .. } => py::LeaseLost::new_err(text),
        E::CapacityConflict { .. } => py::CapacityConflict::new_err(text),
        E::TenantConflict { .. } => py::TenantConflict::new_err(text),
        E::AlreadyHeld { .. } => py::AlreadyHeld::new_err(text),
        E::InvalidArgument(_) => py::InvalidArgument::new_err(text),
        E::WrongType { .. } => py::WrongType::new_err(text),
        E::StateLost { .. } => py::StateLost::new_err(text),
        E::Unsuitable { .. } => py::Unsuitable::new_err(text),
        E::EngineUnavailable { .. } => py::EngineUnavailable::new_err(text),
        E::NotReplicated { .. } => py::NotReplicated::new_err(text),
        E::Protocol { .. } => py::ProtocolError::new_err(text),
        E::Incompatible { .. } => py::Incompatible::new_err(text),
        // A variant added to the library later: still a redsem.Error, with its message.
        _ => py::Error::new_err(text),
    }
}

/// `redsem.InvalidArgument` (also a `ValueError`) for an argument refused in the binding.
pub(crate) fn invalid(text: String) -> PyErr {
    to_py(redsem::Error::InvalidArgument(text))
}

/// `redsem.WrongProcess` for an object made in process `pid`, used in a child forked from it.
pub(crate) fn wrong_process(pid: u32) -> PyErr {
    py::WrongProcess::new_err(format!(
        "this object was made in process {pid} and cannot be used in process {} (a fork of it): \
         its connections and background tasks stay with that process; connect again in this \
         one (redsem.connect(url)) and make the objects anew",
        std::process::id()
    ))
}

/// A duration for a Python reader: `1.003 s`, `250 ms`, `0 s`.
pub(crate) fn human(d: Duration) -> String {
    if d >= Duration::from_secs(1) || d.is_zero() {
        format!("{:.3} s", d.as_secs_f64())
    } else {
        format!("{} ms", d.as_millis())
    }
}
