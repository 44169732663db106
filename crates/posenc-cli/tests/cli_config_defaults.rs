//! Configs transformers loads, posenc reads (issue 18): a `vision_config`
//! that leaves keys out takes the defaults of transformers' vision config
//! class, and a RoPE question never fails on keys it does not need.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

fn fixture(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../posenc/tests/fixtures/models")
        .join(rel)
}

fn inspect_json(path: &std::path::Path) -> Value {
    let out = Command::new(env!("CARGO_BIN_EXE_posenc"))
        .args(["rope", "inspect", "--json", "--config"])
        .arg(path)
        .output()
        .expect("run posenc");
    assert!(
        out.status.success(),
        "posenc rope inspect {}: {}",
        path.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("stdout is JSON")
}

/// A new scratch directory for one test, removed when dropped.
fn tmp_dir(name: &str) -> tempfile::TempDir {
    crate::common::tempdir(&format!("cli-{name}"))
}

fn with_vision(config: &str, vision: Value, dir: &std::path::Path) -> PathBuf {
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(fixture(config)).unwrap())
        .expect("fixture is JSON");
    v["vision_config"] = vision;
    let path = dir.join(config);
    std::fs::write(&path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
    path
}

/// The case of the issue: Qwen2-VL-7B-Instruct's config with a
/// `vision_config` of `{"depth": 32}` (every other key at the class default,
/// which is what the real file spells out) inspects exactly like the full file.
#[test]
fn qwen2_vl_with_a_bare_vision_config_inspects_like_the_full_one() {
    let dir = tmp_dir("bare-vision");
    let full = inspect_json(&fixture("qwen2-vl-7b-instruct.config.json"));
    let bare = with_vision(
        "qwen2-vl-7b-instruct.config.json",
        serde_json::json!({"depth": 32}),
        dir.path(),
    );
    let got = inspect_json(&bare);
    assert_eq!(got, full);
    assert_eq!(got["vision"]["head_dim"], 80);
}

/// Every multimodal config the tests carry answers a RoPE question with an
/// empty `vision_config`: the encoder's RoPE then comes from the class
/// defaults (head dimension `hidden_size / heads` of transformers 5.24's
/// `Qwen2VLVisionConfig` 1280/16, `Qwen2_5_VLVisionConfig` 3584/16,
/// `Qwen3VLVisionConfig` 1152/16, `PixtralVisionConfig` 1024/16,
/// `Llama4VisionConfig` 768/16), and the language model's RoPE is unchanged.
#[test]
fn empty_vision_configs_take_the_class_defaults() {
    let dir = tmp_dir("empty-vision");
    for (config, head_dim) in [
        ("qwen2-vl-7b-instruct.config.json", 80),
        ("qwen2.5-vl-7b-instruct.config.json", 224),
        ("qwen3-vl-8b-instruct.config.json", 72),
        ("llama-4-scout-17b-16e-instruct.config.json", 48),
    ] {
        let full = inspect_json(&fixture(config));
        let got = inspect_json(&with_vision(config, serde_json::json!({}), dir.path()));
        assert_eq!(got["vision"]["head_dim"], head_dim, "{config}");
        let mut a = full.clone();
        let mut b = got.clone();
        a.as_object_mut().unwrap().remove("vision");
        b.as_object_mut().unwrap().remove("vision");
        assert_eq!(a, b, "{config}: the language model's RoPE changed");
    }
}
