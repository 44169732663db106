//! Where the integration tests find the real model (SmolLM2-135M-Instruct
//! as GGUF); shared with posenc-cli's and posenc-run's tests by `#[path]`.
#![allow(dead_code)]

use std::path::{Path, PathBuf};

/// The SmolLM2-135M-Instruct GGUF the end-to-end tests run on.
pub const SMOLLM2_FILE: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// The real model at `$POSENC_TEST_GGUF`, else at `models/` in the
/// workspace; `None` (printed as skipped) without it, unless
/// `POSENC_REQUIRE_MODEL=1` (set by `.ci/run`), which makes a missing model
/// fail `test`.
pub fn model_path(test: &str) -> Option<PathBuf> {
    let path = std::env::var_os("POSENC_TEST_GGUF")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../models")
                .join(SMOLLM2_FILE)
        });
    if path.is_file() {
        return Some(path);
    }
    let why = format!(
        "{test}: SKIPPED: no model at {} (run scripts/get-model.sh or set POSENC_TEST_GGUF)",
        path.display()
    );
    if std::env::var("POSENC_REQUIRE_MODEL").is_ok_and(|v| v == "1") {
        panic!("{why}, and POSENC_REQUIRE_MODEL=1 asks for it");
    }
    eprintln!("{why}");
    None
}
