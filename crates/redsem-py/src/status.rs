//! `status()`: the library's `StatusReport`, the object of the CLI's `redsem status NAME --json`
//! (crates/redsem-cli/README.md, "The status JSON"), as a Python dict.

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::Value;

/// A JSON value on its way to Python (dicts, lists, ints, floats, strings, None).
pub(crate) struct Json(pub(crate) Value);

impl<'py> IntoPyObject<'py> for Json {
    type Target = PyAny;
    type Output = Bound<'py, PyAny>;
    type Error = PyErr;

    fn into_pyobject(self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        to_python(py, &self.0)
    }
}

fn to_python<'py>(py: Python<'py>, value: &Value) -> PyResult<Bound<'py, PyAny>> {
    match value {
        Value::Null => Ok(py.None().into_bound(py)),
        Value::Bool(b) => b.into_bound_py_any(py),
        Value::Number(n) => match (n.as_u64(), n.as_i64()) {
            (Some(u), _) => u.into_bound_py_any(py),
            (None, Some(i)) => i.into_bound_py_any(py),
            (None, None) => n.as_f64().unwrap_or(f64::NAN).into_bound_py_any(py),
        },
        Value::String(s) => s.into_bound_py_any(py),
        Value::Array(items) => {
            let list = PyList::empty(py);
            for item in items {
                list.append(to_python(py, item)?)?;
            }
            Ok(list.into_any())
        }
        Value::Object(fields) => {
            let dict = PyDict::new(py);
            for (key, item) in fields {
                dict.set_item(key, to_python(py, item)?)?;
            }
            Ok(dict.into_any())
        }
    }
}

/// `value` (the library's `StatusReport` or `LatchState`) as its `serde` feature writes it:
/// the objects of the CLI's JSON.
pub(crate) fn json(value: &impl serde::Serialize, script: &'static str) -> redsem::Result<Json> {
    serde_json::to_value(value)
        .map(Json)
        .map_err(|e| redsem::Error::Protocol {
            script,
            detail: format!("cannot write the status as JSON: {e}"),
        })
}

/// The library's report of the semaphore's name: its status, and the permits and latch of the
/// same name (three reads, at once).
pub(crate) async fn status_future(
    client: redsem::Redsem,
    sem: redsem::LeaseSemaphore,
) -> redsem::Result<Json> {
    json(&client.status_report(sem.name()).await?, "lease_status")
}
