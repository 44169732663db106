//! Helpers shared by the integration tests: the fixtures directory, JSON
//! arrays of the reference files, and the largest difference of two series.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde_json::Value;

pub mod model;

/// `tests/fixtures/NAME`.
pub fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A reference JSON file under `tests/fixtures/`.
pub fn reference(name: &str) -> Value {
    serde_json::from_str(&std::fs::read_to_string(fixture(name)).unwrap()).unwrap()
}

/// A JSON array of numbers.
pub fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// A JSON array of token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

/// The report's default text, Pride and Prejudice, from the workspace's
/// assets.
pub fn pride_and_prejudice() -> String {
    std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../assets/corpus/pride-and-prejudice.txt"),
    )
    .unwrap()
}

/// The largest `|a_i − b_i|` (the lengths must agree).
pub fn max_abs_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len(), "lengths differ");
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

/// The model at [`model::model_path`], loaded; `None` (skipped) as there.
pub fn smollm2(test: &str) -> Option<posenc_models::PretrainedModel> {
    model::model_path(test).map(|path| posenc_models::PretrainedModel::load(&path, None).unwrap())
}
