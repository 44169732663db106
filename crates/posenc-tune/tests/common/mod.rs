//! Helpers shared by posenc-tune's integration tests (`mod common;` in each).

// Each test binary uses its own subset of these.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use posenc_models::{Decoder, ModelFiles};
use serde_json::Value;

/// The JSON file at `path`.
pub fn read_json(path: &Path) -> Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The JSON file `tests/fixtures/{name}` of this crate.
pub fn fixture_json(name: &str) -> Value {
    read_json(
        &Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/fixtures")
            .join(name),
    )
}

/// The model directory `name` among posenc-models' test fixtures.
pub fn model_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../posenc-models/tests/fixtures")
        .join(name)
}

/// The decoder of the model files at `path`, with the config they hold.
pub fn load(path: &Path) -> Decoder {
    let mut files = ModelFiles::open(path).unwrap();
    let cfg = files.config().unwrap();
    files.load(cfg).unwrap().0
}

/// The elements of the JSON array `v`, each through `f`.
fn array<T>(v: &Value, f: impl Fn(&Value) -> T) -> Vec<T> {
    v.as_array().unwrap().iter().map(f).collect()
}

/// A JSON array of token ids.
pub fn ids(v: &Value) -> Vec<u32> {
    array(v, |x| x.as_u64().unwrap() as u32)
}

/// A JSON array of numbers, as `f32`s.
pub fn floats(v: &Value) -> Vec<f32> {
    array(v, |x| x.as_f64().unwrap() as f32)
}
