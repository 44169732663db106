//! A config.json without `rope_theta` gets the base of its transformers
//! config class (`default_theta`), as transformers reads it
//! (`tests/fixtures/class-default-theta.json`, written by
//! `scripts/rope/gen_class_default_theta.py` from transformers 5.24).

use posenc::rope::RopeConfig;

#[test]
fn configs_without_a_base_take_their_class_default() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tests/fixtures/class-default-theta.json"
    );
    let fixture: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let models = fixture["models"].as_array().unwrap();
    assert!(models.len() >= 30);
    for m in models {
        let model_type = m["model_type"].as_str().unwrap();
        let want = m["rope_theta"].as_f64().unwrap();
        let config = serde_json::json!({
            "model_type": model_type,
            "hidden_size": 256,
            "num_attention_heads": 4,
        });
        let rope = RopeConfig::from_hf_json_str(&config.to_string())
            .unwrap_or_else(|e| panic!("{model_type}: {e}"));
        assert_eq!(rope.theta(), want, "{model_type}");
    }
}
