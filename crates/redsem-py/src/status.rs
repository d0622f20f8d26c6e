//! `status()`: the object of the CLI's `redsem status NAME --json` (crates/redsem-cli/README.md,
//! "The status JSON"), as a Python dict.

use pyo3::IntoPyObjectExt;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use serde_json::{Value, json};

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

/// The latch state as the CLI's JSON writes it: `{"state": ..., "count": n}`.
pub(crate) fn latch_json(state: redsem::LatchState) -> Value {
    let (state, count) = match state {
        redsem::LatchState::NeverSet => ("never-set", 0),
        redsem::LatchState::Counting(n) => ("counting", n),
        redsem::LatchState::Done => ("open", 0),
    };
    json!({ "state": state, "count": count })
}

/// Read the semaphore's status, and the permits and latch of the same name (three reads, in
/// parallel), into the CLI's JSON object.
pub(crate) async fn status_future(
    client: redsem::Redsem,
    sem: redsem::LeaseSemaphore,
) -> redsem::Result<Json> {
    let name = sem.name().to_owned();
    let permits = client.permit_semaphore(&name)?;
    let latch_of = client.count_down_latch(&name)?;
    let (status, available, state) =
        tokio::join!(sem.status(), permits.available_permits(), latch_of.state());
    let Value::Object(lease) =
        serde_json::to_value(status?).map_err(|e| redsem::Error::Protocol {
            script: "lease_status",
            detail: format!("cannot write the status as JSON: {e}"),
        })?
    else {
        return Err(redsem::Error::Protocol {
            script: "lease_status",
            detail: "the status is not a JSON object".to_owned(),
        });
    };
    let mut object = serde_json::Map::new();
    object.insert("name".to_owned(), Value::String(name));
    object.extend(lease);
    object.insert("permits".to_owned(), json!({ "available": available? }));
    object.insert("latch".to_owned(), latch_json(state?));
    Ok(Json(Value::Object(object)))
}
