//! Issue 37 through adapters: PEFT adapter directories damaged one way
//! each (from the fixture `tests/fixtures/peft-llama31`, an adapter of the
//! tiny Llama 3.1) are refused before any run with one line saying what
//! is wrong, naming the tensor, key or file: a tensor relabelled I32, a
//! `layers_to_transform` past the model's layers (and the list honoured
//! when it fits), an implausible `lora_alpha`, factors whose product
//! overflows, an `adapter_config.json` that is a directory, FIFO or
//! device or not a JSON object, names carrying terminal escapes.

use std::path::{Path, PathBuf};

use posenc_tune::peft::{safetensors_head, Adapter, CONFIG_FILE, WEIGHTS_FILE};
use posenc_tune::TuneError;
use serde_json::{json, Value};
use tempfile::TempDir;

use crate::common;

use common::{load, model_dir};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/peft-llama31")
}

/// A new empty scratch directory, removed when dropped.
fn scratch(name: &str) -> TempDir {
    tempfile::Builder::new()
        .prefix(&format!("posenc-tune-hostile-{name}-"))
        .tempdir()
        .unwrap()
}

/// The fixture's safetensors as (header, data).
fn weights() -> (serde_json::Map<String, Value>, Vec<u8>) {
    let b = std::fs::read(fixture().join(WEIGHTS_FILE)).unwrap();
    let n = u64::from_le_bytes(b[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&b[8..8 + n]).unwrap();
    (header.as_object().unwrap().clone(), b[8 + n..].to_vec())
}

/// An adapter directory `name`: the fixture's config and weights, each
/// edited (`config`; `tensors` on the header and the data); removed when
/// dropped.
fn adapter(
    name: &str,
    config: impl Fn(&mut Value),
    tensors: impl Fn(&mut serde_json::Map<String, Value>, &mut Vec<u8>),
) -> TempDir {
    let dir = scratch(name);
    let d = dir.path();
    let mut c: Value =
        serde_json::from_str(&std::fs::read_to_string(fixture().join(CONFIG_FILE)).unwrap())
            .unwrap();
    config(&mut c);
    std::fs::write(d.join(CONFIG_FILE), c.to_string()).unwrap();
    let (mut header, mut data) = weights();
    tensors(&mut header, &mut data);
    let mut b = safetensors_head(header);
    b.extend_from_slice(&data);
    std::fs::write(d.join(WEIGHTS_FILE), b).unwrap();
    dir
}

fn no_edit(_: &mut serde_json::Map<String, Value>, _: &mut Vec<u8>) {}

/// An adapter directory `name`: the fixture with its config's `key` set to
/// `value`.
fn with_key(name: &str, key: &str, value: Value) -> TempDir {
    adapter(name, |c| c[key] = value.clone(), no_edit)
}

/// Sets every `f32` of tensor `name` to `v`.
fn fill(header: &serde_json::Map<String, Value>, data: &mut [u8], name: &str, v: f32) {
    let off = &header[name]["data_offsets"];
    let (a, b) = (
        off[0].as_u64().unwrap() as usize,
        off[1].as_u64().unwrap() as usize,
    );
    for c in data[a..b].chunks_mut(4) {
        c.copy_from_slice(&v.to_le_bytes());
    }
}

/// The one-line refusal of the adapter in `dir`, checked free of control
/// characters.
fn refusal(dir: impl AsRef<Path>) -> String {
    let base = load(&model_dir("tiny-llama31"));
    let e = Adapter::read(dir.as_ref(), base.config()).unwrap_err();
    assert!(matches!(e, TuneError::Adapter { .. }), "{e}");
    let msg = e.to_string();
    assert!(
        !msg.contains('\n') && !msg.chars().any(char::is_control),
        "{msg:?}"
    );
    msg
}

const Q0: &str = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";

#[test]
fn the_fixture_adapter_reads() {
    let base = load(&model_dir("tiny-llama31"));
    let a = Adapter::read(&fixture(), base.config()).unwrap();
    assert_eq!(a.layers, None);
    assert_eq!(a.factors.len(), 2 * 7);
}

#[test]
fn a_tensor_relabelled_i32_is_refused_by_name() {
    let dir = adapter(
        "i32",
        |_| {},
        |h, _| {
            h[Q0]["dtype"] = "I32".into();
        },
    );
    let msg = refusal(&dir);
    assert!(msg.contains(Q0) && msg.contains("dtype I32"), "{msg}");
    assert!(msg.contains("F32, F16 or BF16"), "{msg}");
}

#[test]
fn layers_to_transform_is_honoured_or_refused() {
    // An index past the model's 2 layers.
    for v in [json!([100]), json!(100), json!([0, 2])] {
        let dir = with_key("layers-100", "layers_to_transform", v.clone());
        let msg = refusal(&dir);
        assert!(msg.contains("layers_to_transform holds layer"), "{msg}");
        assert!(msg.contains("the model has 2 layers (0..=1)"), "{msg}");
    }
    // Not an index.
    let dir = with_key("layers-str", "layers_to_transform", json!(["x"]));
    assert!(refusal(&dir).contains("not a layer index"));
    // Factors of a layer the list leaves out.
    let dir = with_key("layers-0", "layers_to_transform", json!([0]));
    let msg = refusal(&dir);
    assert!(
        msg.contains("layers.1.") && msg.contains("layers_to_transform [0] leaves out"),
        "{msg}"
    );
    // Another layers_pattern than these decoders' `layers`.
    let dir = adapter(
        "pattern",
        |c| {
            c["layers_to_transform"] = json!([0, 1]);
            c["layers_pattern"] = json!("h");
        },
        no_edit,
    );
    assert!(refusal(&dir).contains("layers_pattern is \"h\""));
    // Layer 0 only, its factors alone in the file: read, and merged into
    // layer 0 only.
    for (name, v) in [("only-0", json!([0])), ("only-0-int", json!(0))] {
        let dir = with_key(name, "layers_to_transform", v.clone());
        // The file rewritten without layer 1's factors (safetensors packs
        // its data without holes).
        let bytes = std::fs::read(dir.path().join(WEIGHTS_FILE)).unwrap();
        let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
        let keep: Vec<(String, safetensors::tensor::TensorView)> = st
            .tensors()
            .into_iter()
            .filter(|(n, _)| !(n.contains(".layers.1.") && n.contains("lora_")))
            .collect();
        let out = dir.path().join("w.tmp");
        safetensors::serialize_to_file(keep, None, &out).unwrap();
        std::fs::rename(&out, dir.path().join(WEIGHTS_FILE)).unwrap();
        let base = load(&model_dir("tiny-llama31"));
        let a = Adapter::read(dir.path(), base.config()).unwrap();
        assert_eq!(a.layers, Some(vec![0]));
        assert!(a.factors.keys().all(|(l, _)| *l == 0));
        assert_eq!(a.config_json()["layers_to_transform"], json!([0]));
        let mut merged = load(&model_dir("tiny-llama31"));
        a.merge_into(&mut merged, dir.path()).unwrap();
        let weight = |d: &posenc_models::Decoder, n: &str| -> Vec<f32> {
            d.named_weights()
                .into_iter()
                .find(|w| w.name == n)
                .unwrap()
                .data
                .to_vec()
        };
        let q = |l: usize| format!("model.layers.{l}.self_attn.q_proj.weight");
        assert_ne!(weight(&merged, &q(0)), weight(&base, &q(0)));
        assert_eq!(weight(&merged, &q(1)), weight(&base, &q(1)));
    }
}

#[test]
fn implausible_scales_and_values_are_refused_before_the_run() {
    // lora_alpha 1e38 over r = 4: a scale of 2.5e37.
    let dir = with_key("alpha", "lora_alpha", json!(1e38));
    let msg = refusal(&dir);
    assert!(
        msg.contains("LoRA scale lora_alpha/r = 2.5e37 is outside [0.0009765625, 256]"),
        "{msg}"
    );
    // rsLoRA's alpha/√r.
    let dir = adapter(
        "rslora",
        |c| {
            c["use_rslora"] = json!(true);
            c["lora_alpha"] = json!(1024);
        },
        no_edit,
    );
    assert!(refusal(&dir).contains("lora_alpha/√r = 5.12e2"));
    // A factor value beyond any trained adapter's.
    let dir = adapter("big", |_| {}, |h, d| fill(h, d, Q0, 1e30));
    let msg = refusal(&dir);
    assert!(
        msg.contains(Q0) && msg.contains("holds 1e30 at index 0"),
        "{msg}"
    );
    // A saved norm weight beyond any model's.
    let norm = "base_model.model.model.norm.weight";
    let dir = adapter("norm", |_| {}, |h, d| fill(h, d, norm, -3e5));
    let msg = refusal(&dir);
    assert!(msg.contains("norm weight") && msg.contains("±1e4"), "{msg}");
    // Factors inside the bound whose product is not: refused when merged,
    // naming the layer and projection (not "value 0 is not finite").
    let b0 = Q0.replace("lora_A", "lora_B");
    let dir = adapter(
        "product",
        |_| {},
        |h, d| {
            fill(h, d, Q0, 9e3);
            fill(h, d, &b0, 9e3);
        },
    );
    let base = load(&model_dir("tiny-llama31"));
    let a = Adapter::read(dir.path(), base.config()).unwrap();
    let mut merged = load(&model_dir("tiny-llama31"));
    let msg = a
        .merge_into(&mut merged, dir.path())
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("merging layer 0's q_proj") && msg.contains("implausible"),
        "{msg}"
    );
    assert!(!msg.contains("not finite"), "{msg}");
}

#[test]
fn a_config_that_is_not_a_file_or_not_an_object_is_said_for_what_it_is() {
    // A directory.
    let dir = adapter("cfg-dir", |_| {}, no_edit);
    std::fs::remove_file(dir.path().join(CONFIG_FILE)).unwrap();
    std::fs::create_dir(dir.path().join(CONFIG_FILE)).unwrap();
    let msg = refusal(&dir);
    assert!(
        msg.contains("adapter_config.json is a directory, not a regular file"),
        "{msg}"
    );
    // A FIFO: refused by type, without blocking.
    let dir = adapter("cfg-fifo", |_| {}, no_edit);
    std::fs::remove_file(dir.path().join(CONFIG_FILE)).unwrap();
    let made = std::process::Command::new("mkfifo")
        .arg(dir.path().join(CONFIG_FILE))
        .status()
        .unwrap();
    assert!(made.success());
    assert!(refusal(&dir).contains("adapter_config.json is a FIFO"));
    // A device.
    let dir = adapter("cfg-dev", |_| {}, no_edit);
    std::fs::remove_file(dir.path().join(CONFIG_FILE)).unwrap();
    std::os::unix::fs::symlink("/dev/zero", dir.path().join(CONFIG_FILE)).unwrap();
    assert!(refusal(&dir).contains("adapter_config.json is a character device"));
    // Missing.
    let dir = adapter("cfg-none", |_| {}, no_edit);
    std::fs::remove_file(dir.path().join(CONFIG_FILE)).unwrap();
    assert!(refusal(&dir).contains("no adapter_config.json"));
    // The adapter path a file.
    let msg = refusal(fixture().join(CONFIG_FILE));
    assert!(msg.contains("not a directory"), "{msg}");
    // Not an object.
    let dir = adapter("cfg-array", |c| *c = json!([]), no_edit);
    assert!(refusal(&dir).contains("adapter_config.json is not a JSON object but an array"));
}

#[test]
fn names_from_the_files_are_escaped() {
    let dir = with_key(
        "escape-target",
        "target_modules",
        json!(["q_proj\u{1b}[2J"]),
    );
    assert!(refusal(&dir).contains("q_proj\\u{1b}[2J"));
    let dir = adapter(
        "escape-tensor",
        |_| {},
        |h, _| {
            let v = h.remove(Q0).unwrap();
            h.insert(format!("{Q0}\u{1b}[2J\u{0}"), v);
        },
    );
    let msg = refusal(&dir);
    assert!(msg.contains("\\u{1b}[2J\\0"), "{msg}");
    let dir = with_key("escape-bias", "bias", json!("all\u{7}"));
    assert!(refusal(&dir).contains("bias is \"all\\u{7}\""));
}
