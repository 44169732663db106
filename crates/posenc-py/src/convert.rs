//! JSON documents of the Rust crates (the dicts `posenc ... --json`
//! prints) as Python objects, and Python dicts as JSON text.

use pyo3::prelude::*;
use pyo3::types::PyDict;

/// `value` as the Python object `json.loads` makes of its text (dicts,
/// lists, floats, ints, strings, None), so a dict equals the CLI's
/// `--json` output parsed by Python.
pub fn to_python(py: Python<'_>, value: &serde_json::Value) -> PyResult<Py<PyAny>> {
    let text = serde_json::to_string(value).map_err(crate::error::err)?;
    Ok(py.import("json")?.call_method1("loads", (text,))?.unbind())
}

/// A Python dict as JSON text (`json.dumps`).
pub fn dict_to_json(d: &Bound<'_, PyDict>) -> PyResult<String> {
    d.py()
        .import("json")?
        .call_method1("dumps", (d,))?
        .extract::<String>()
}
