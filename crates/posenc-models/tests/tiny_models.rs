//! Parity with transformers on two tiny random models built from real
//! configs (`scripts/models/gen_model_fixtures.py`): Llama 3.1 with its
//! `llama3` scaling, Qwen2.5 with YaRN and q/k/v biases. For every scaling
//! the inverse frequencies, the attention factor, the logits of the first
//! positions and of the last, and the loss at every position must match
//! the values transformers 5.23 computed in float32.
//!
//! Tolerances: both sides compute in `f32` with different summation orders
//! (gemm's blocked dot products against PyTorch's, a one-pass online
//! softmax against a two-pass one). On these models (logits O(1)) the
//! losses agreed to 2.5e-7 when this test was written, so 5e-6 absolute is
//! 20× the observed spread; the smallest difference between two scalings'
//! losses (ntk:2 against none, 3.7e-4) is 70× the tolerance, and the test
//! checks that every scaling stays 10× the tolerance away from `none`, so a
//! pass shows that the right scaling ran.

mod common;

use common::{fixture, floats, ids, max_abs_diff};
use posenc_models::generate::{generate, Decoding, Sampling};
use posenc_models::perplexity::{loss_per_position, rope_of};
use posenc_models::{Decoder, ModelFiles, Scaling};

fn load(name: &str) -> Decoder {
    let mut files = ModelFiles::open(&fixture(name)).unwrap();
    let cfg = files.config().unwrap();
    files.load(cfg).unwrap().0
}

const TOL: f64 = 5e-6;

/// The RoPE of `model`'s config under the scaling named `scaling`.
fn rope_for(model: &Decoder, scaling: &str) -> posenc::tensor::rope::Rope {
    let config = scaling
        .parse::<Scaling>()
        .unwrap()
        .rope_config(model.config())
        .unwrap();
    rope_of(config).unwrap()
}

fn check_model(name: &str) {
    let r = common::reference("reference.json");
    let m = &r["models"][name];
    let mut model = load(name);
    let tokens = ids(&m["input_ids"]);
    assert_eq!(
        model.config().trained_length() as u64,
        m["L"].as_u64().unwrap()
    );
    let v = model.config().vocab_size;
    let d = model.config().hidden_size;
    for reference_path in [false, true] {
        model.set_reference(reference_path);
        let mut losses: Vec<(String, Vec<f64>)> = Vec::new();
        for (sname, s) in m["scalings"].as_object().unwrap() {
            let scaling: Scaling = sname.parse().unwrap();
            let cfg = scaling.rope_config(model.config()).unwrap();
            let freqs = cfg.frequencies(Some(tokens.len())).unwrap();
            let inv: Vec<f64> = freqs.inv_freq.iter().map(|&x| x as f64).collect();
            let want_inv = floats(&s["inv_freq"]);
            for (a, b) in inv.iter().zip(&want_inv) {
                assert!(
                    (a - b).abs() <= 1e-6 * b.abs().max(1e-30),
                    "{name} {sname}: inv_freq {a} vs {b}"
                );
            }
            assert!(
                (freqs.attention_factor - s["attention_scaling"].as_f64().unwrap()).abs() < 1e-6,
                "{name} {sname}: attention factor"
            );
            let rope = rope_of(cfg).unwrap();
            let hidden = model.hidden_states(&tokens, &rope, None).unwrap();
            let logits = model.logits(&hidden, tokens.len()).unwrap();
            for (p, want) in s["logits_first"].as_array().unwrap().iter().enumerate() {
                let got: Vec<f64> = logits[p * v..][..v].iter().map(|&x| x as f64).collect();
                let diff = max_abs_diff(&got, &floats(want));
                assert!(
                    diff < TOL,
                    "{name} {sname} path {reference_path}: logits at {p} differ by {diff}"
                );
            }
            let last: Vec<f64> = logits[(tokens.len() - 1) * v..][..v]
                .iter()
                .map(|&x| x as f64)
                .collect();
            let diff = max_abs_diff(&last, &floats(&s["logits_last"]));
            assert!(diff < TOL, "{name} {sname}: last logits differ by {diff}");
            let loss = loss_per_position(&model, &tokens, &rope).unwrap();
            let want = floats(&s["loss"]);
            let diff = max_abs_diff(&loss, &want);
            assert!(
                diff < TOL,
                "{name} {sname} path {reference_path}: losses differ by {diff}"
            );
            assert_eq!(hidden.len(), tokens.len() * d);
            losses.push((sname.clone(), want));
        }
        // The scalings must be told apart at this tolerance, else the
        // comparison above would not show which one ran.
        let plain = &losses.iter().find(|(n, _)| n == "none").unwrap().1;
        for (n, l) in &losses {
            if n != "none" && n != "model" {
                assert!(
                    max_abs_diff(l, plain) > 10.0 * TOL,
                    "{name}: {n} is within 10× the tolerance of none"
                );
            }
        }
    }
}

#[test]
fn tiny_llama31_matches_transformers_for_every_scaling() {
    check_model("tiny-llama31");
}

#[test]
fn tiny_qwen25_matches_transformers_for_every_scaling() {
    check_model("tiny-qwen25");
}

/// Greedy decoding through the KV cache (one token at a time, keys rotated
/// at their positions inside the attention) gives transformers' tokens,
/// which it computed without a cache; the reference recorded the margins
/// between the best two logits, all far above the tolerance.
#[test]
fn greedy_generation_with_the_cache_matches_transformers() {
    let r = common::reference("reference.json");
    for name in ["tiny-llama31", "tiny-qwen25"] {
        let m = &r["models"][name];
        let model = load(name);
        let want = ids(&m["greedy"]);
        let margins = floats(&m["greedy_margins"]);
        assert!(
            margins.iter().all(|&x| x > 10.0 * TOL),
            "{name}: a margin is too thin to test"
        );
        let prompt = &ids(&m["input_ids"])[..8];
        let rope = rope_for(&model, "model");
        let mut streamed = Vec::new();
        let greedy = Decoding {
            max_new: want.len(),
            rope: &rope,
            sampling: Sampling::Greedy,
            stop: &[],
        };
        let got = generate(&model, prompt, greedy, |t| streamed.push(t)).unwrap();
        assert_eq!(got, want, "{name}");
        assert_eq!(streamed, want);
    }
}

/// The cache path (prompt in one pass, then one token at a time) gives the
/// same final hidden states as one pass over the whole sequence, for a
/// length-dependent scaling too.
#[test]
fn cached_decoding_equals_one_pass() {
    let r = common::reference("reference.json");
    let m = &r["models"]["tiny-qwen25"];
    let model = load("tiny-qwen25");
    let tokens = ids(&m["input_ids"]);
    for sname in ["none", "yarn:2", "linear:2"] {
        let rope = rope_for(&model, sname);
        let full = model.hidden_states(&tokens, &rope, None).unwrap();
        let mut cache = posenc_models::KvCache::new(model.config());
        let mut got = model
            .hidden_states(&tokens[..20], &rope, Some(&mut cache))
            .unwrap();
        for &t in &tokens[20..] {
            got.extend(model.hidden_states(&[t], &rope, Some(&mut cache)).unwrap());
        }
        assert_eq!(cache.len(), tokens.len());
        assert_eq!(got.len(), full.len());
        let diff = got
            .iter()
            .zip(&full)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            diff < 1e-4,
            "{sname}: cached and one-pass states differ by {diff}"
        );
    }
}

/// Sampling is reproducible from its seed and differs between seeds.
#[test]
fn sampling_is_seeded() {
    let model = load("tiny-llama31");
    let rope = rope_for(&model, "model");
    let s = |seed| Sampling::Sample {
        temperature: 1.5,
        top_p: 0.95,
        seed,
    };
    let run = |prompt: &[u32], max_new, sampling| {
        let decoding = Decoding {
            max_new,
            rope: &rope,
            sampling,
            stop: &[],
        };
        generate(&model, prompt, decoding, |_| {})
    };
    let a = run(&[1, 2, 3], 24, s(7)).unwrap();
    let b = run(&[1, 2, 3], 24, s(7)).unwrap();
    let c = run(&[1, 2, 3], 24, s(8)).unwrap();
    assert_eq!(a, b);
    assert_ne!(a, c);
    assert!(run(&[], 4, Sampling::Greedy).is_err());
    let bad = Sampling::Sample {
        temperature: 0.0,
        top_p: 1.0,
        seed: 0,
    };
    assert!(run(&[1], 4, bad).is_err());
}
