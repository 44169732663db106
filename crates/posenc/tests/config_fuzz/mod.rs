//! Hostile Hugging Face configs: random mutations of a real `config.json`
//! (numbers at the extremes, every known `rope_type`, per-layer structure,
//! nested parameters, M-RoPE sections), shared by posenc's `rope_fuzz` and
//! posenc-explore's API fuzz (`#[path]`).

use posenc::rope::KNOWN_ROPE_TYPES;
use rand::rngs::StdRng;
use rand::Rng;
use serde_json::{json, Map, Value};

/// Extreme and odd numbers a config could hold.
fn number(rng: &mut StdRng) -> Value {
    let picks: [f64; 24] = [
        0.0,
        -1.0,
        1.0,
        2.0,
        3.0,
        7.0,
        0.5,
        1e-300,
        -1e308,
        1.7e308,
        4294967296.0,
        2147483648.0,
        9007199254740992.0,
        65536.0,
        65537.0,
        131072.0,
        1e7,
        1e19,
        -0.0,
        1.0000001,
        4.0,
        8192.0,
        16.0,
        1e-7,
    ];
    match rng.random_range(0..4) {
        0 => json!(picks[rng.random_range(0..picks.len())]),
        1 => json!(rng.random_range(0u64..70000)),
        2 => json!(1u64 << rng.random_range(0..64)),
        _ => json!(rng.random_range(-1e6..1e6)),
    }
}

fn any_value(rng: &mut StdRng, depth: usize) -> Value {
    match rng.random_range(0..12) {
        0 => Value::Null,
        1 => json!(rng.random_bool(0.5)),
        2 => {
            // every known rope_type, legacy and unknown ones
            let names: Vec<&str> = KNOWN_ROPE_TYPES
                .iter()
                .copied()
                .chain(["mrope", "su", "bogus", ""])
                .collect();
            json!(names[rng.random_range(0..names.len())])
        }
        3 if depth < 3 => {
            let n = rng.random_range(0..6);
            Value::Array((0..n).map(|_| number(rng)).collect())
        }
        4 if depth < 3 => {
            let mut m = Map::new();
            for _ in 0..rng.random_range(0..4) {
                let k = KEYS[rng.random_range(0..KEYS.len())];
                m.insert(k.into(), any_value(rng, depth + 1));
            }
            Value::Object(m)
        }
        _ => number(rng),
    }
}

/// Keys posenc reads (top level and inside the parameters).
const KEYS: &[&str] = &[
    "head_dim",
    "hidden_size",
    "num_attention_heads",
    "num_hidden_layers",
    "rope_theta",
    "rotary_dim",
    "partial_rotary_factor",
    "rotary_pct",
    "max_position_embeddings",
    "original_max_position_embeddings",
    "qk_rope_head_dim",
    "qk_nope_head_dim",
    "global_head_dim",
    "rope_local_base_freq",
    "sliding_window_pattern",
    "no_rope_layer_interval",
    "attention_chunk_size",
    "floor_scale",
    "attn_scale",
    "rope_type",
    "type",
    "factor",
    "beta_fast",
    "beta_slow",
    "mscale",
    "mscale_all_dim",
    "attention_factor",
    "low_freq_factor",
    "high_freq_factor",
    "mixed_b",
    "alpha",
    "mrope_section",
    "mrope_interleaved",
    "truncate",
    "rope_interleave",
    "model_type",
];

const MODEL_TYPES: &[&str] = &[
    "llama",
    "gemma3_text",
    "gemma3",
    "gemma4_text",
    "llama4_text",
    "llama4",
    "smollm3",
    "qwen2_vl",
    "qwen2_5_vl",
    "qwen3_vl",
    "glm4v",
    "deepseek_v3",
    "phi3",
    "gpt_neox",
    "pixtral",
    "hunyuan_v1_dense",
];

/// A random object inside `v` (the root or a nested dict), as a path of keys.
fn random_object_path(rng: &mut StdRng, v: &Value) -> Vec<String> {
    let mut path = Vec::new();
    let mut cur = v;
    while let Value::Object(m) = cur {
        let children: Vec<&String> = m
            .iter()
            .filter(|(_, c)| c.is_object())
            .map(|(k, _)| k)
            .collect();
        if children.is_empty() || rng.random_bool(0.5) {
            break;
        }
        let k = children[rng.random_range(0..children.len())].clone();
        cur = &m[&k];
        path.push(k);
    }
    path
}

fn object_at<'a>(v: &'a mut Value, path: &[String]) -> &'a mut Map<String, Value> {
    let mut cur = v;
    for k in path {
        cur = cur.get_mut(k).unwrap();
    }
    cur.as_object_mut().unwrap()
}

/// Changes, deletes or adds one key (a number, a list, per-layer structure,
/// nested parameters or M-RoPE sections), at the top or in a nested object.
pub fn mutate(rng: &mut StdRng, v: &mut Value) {
    let path = random_object_path(rng, v);
    let obj = object_at(v, &path);
    let keys: Vec<String> = obj.keys().cloned().collect();
    match rng.random_range(0..9) {
        // change an existing value
        0..=2 if !keys.is_empty() => {
            let k = &keys[rng.random_range(0..keys.len())];
            let new = match obj[k].clone() {
                Value::Number(_) => number(rng),
                Value::Array(mut a) if !a.is_empty() && rng.random_bool(0.6) => {
                    match rng.random_range(0..3) {
                        0 => {
                            a.pop();
                        }
                        1 => {
                            let x = a[0].clone();
                            a.push(x);
                        }
                        _ => {
                            let i = rng.random_range(0..a.len());
                            a[i] = any_value(rng, 2);
                        }
                    }
                    Value::Array(a)
                }
                _ => any_value(rng, 1),
            };
            obj.insert(k.clone(), new);
        }
        // delete a key
        3 if !keys.is_empty() => {
            let k = &keys[rng.random_range(0..keys.len())];
            obj.remove(k);
        }
        // add or replace a key posenc reads
        4 | 5 => {
            let k = KEYS[rng.random_range(0..KEYS.len())];
            let val = if k == "model_type" {
                json!(MODEL_TYPES[rng.random_range(0..MODEL_TYPES.len())])
            } else {
                any_value(rng, 1)
            };
            obj.insert(k.into(), val);
        }
        // per-layer structure
        6 => {
            let n = [0usize, 1, 3, 4, 12, 48, 70000][rng.random_range(0..7)];
            let names = [
                "full_attention",
                "sliding_attention",
                "chunked_attention",
                "linear_attention",
                "x",
            ];
            let lt: Vec<Value> = (0..n.min(4096))
                .map(|_| json!(names[rng.random_range(0..names.len())]))
                .collect();
            match rng.random_range(0..3) {
                0 => {
                    obj.insert("layer_types".into(), Value::Array(lt));
                }
                1 => {
                    let nr: Vec<Value> = (0..n.min(4096))
                        .map(|_| json!(rng.random_range(0..3)))
                        .collect();
                    obj.insert("no_rope_layers".into(), Value::Array(nr));
                }
                _ => {
                    obj.insert("num_hidden_layers".into(), json!(n));
                }
            }
        }
        // nested rope parameters by layer type
        7 => {
            let mut m = Map::new();
            for name in ["full_attention", "sliding_attention"] {
                let e = if rng.random_bool(0.2) {
                    Value::Null
                } else {
                    any_value(rng, 1)
                };
                m.insert(
                    name.into(),
                    if e.is_object() || e.is_null() {
                        e
                    } else {
                        json!({})
                    },
                );
            }
            let key = if rng.random_bool(0.5) {
                "rope_parameters"
            } else {
                "rope_scaling"
            };
            obj.insert(key.into(), Value::Object(m));
        }
        // M-RoPE sections
        _ => {
            let n = rng.random_range(0..5);
            let s: Vec<Value> = (0..n).map(|_| json!(rng.random_range(0..80))).collect();
            let mut p = obj
                .get("rope_scaling")
                .filter(|x| x.is_object())
                .cloned()
                .unwrap_or_else(|| json!({}));
            p["mrope_section"] = Value::Array(s);
            if rng.random_bool(0.5) {
                p["mrope_interleaved"] = json!(rng.random_bool(0.5));
            }
            obj.insert("rope_scaling".into(), p);
        }
    }
}
