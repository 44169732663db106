//! Shared loader for the Hugging Face RoPE reference fixtures.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

use serde::Deserialize;

/// One `NAME.expected.json`.
#[derive(Debug, Deserialize)]
pub struct Expected {
    pub name: String,
    pub transformers: String,
    pub cases: Vec<Case>,
}

/// One case: what transformers computes for one sequence length.
#[derive(Debug, Deserialize)]
pub struct Case {
    pub seq_len: Option<usize>,
    pub rope_type: String,
    pub rotary_dim: usize,
    pub inv_freq: Vec<f64>,
    pub attention_factor: f64,
    pub positions: Vec<u64>,
    pub cos_f64: Vec<Vec<f64>>,
    pub sin_f64: Vec<Vec<f64>>,
    pub cos_hf_f32: Vec<Vec<f64>>,
    pub sin_hf_f32: Vec<Vec<f64>>,
}

pub fn fixture_dir(sub: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests")
        .join("fixtures")
        .join(sub)
}

/// Every `(name, config path, expected)` in a fixture directory, sorted by name.
pub fn load_dir(sub: &str) -> Vec<(String, PathBuf, Expected)> {
    let dir = fixture_dir(sub);
    let mut out = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("fixture directory") {
        let path = entry.expect("dir entry").path();
        let file = path.file_name().unwrap().to_string_lossy().to_string();
        if let Some(name) = file.strip_suffix(".expected.json") {
            let text = std::fs::read_to_string(&path).expect("read expected");
            let exp: Expected = serde_json::from_str(&text).expect("parse expected");
            assert_eq!(exp.name, name);
            out.push((
                name.to_string(),
                dir.join(format!("{name}.config.json")),
                exp,
            ));
        }
    }
    out.sort_by(|a, b| a.0.cmp(&b.0));
    out
}
