//! Gradient parity with PyTorch + PEFT on the two tiny random decoders of
//! posenc-models' fixtures (`scripts/finetune/grad_reference.py` wrote the
//! reference: transformers in float32, eager attention, LoRA r = 4,
//! alpha = 8 on all seven projections with fixed nonzero factors, the
//! embedding and every RMSNorm weight trainable too).
//!
//! Tolerances. Both sides compute in `f32` with different summation orders
//! (candle's GEMMs and posenc's streaming attention against PyTorch's), so
//! values agree to a few units of `f32` rounding of the largest terms:
//!
//! - loss: relative difference ≤ [`LOSS_TOL`] (1e-5);
//! - each gradient tensor: max |ours − torch| ≤ [`GRAD_TOL`] (1e-5) × max
//!   |torch| over that tensor (for the embedding: over the rows stored, and
//!   its Frobenius norm to 1e-5 relative).
//!
//! The worst differences are printed (`cargo test -p posenc-tune --test
//! grads -- --nocapture`). The PoSE case (ids 0..31 then 80..111) changes
//! the query and key factors' gradients by tens of percent against the
//! contiguous case, thousands of times the tolerance, so a pass shows the
//! ids were used.

use std::collections::HashMap;

use candle_core::{Tensor, Var};
use posenc_models::perplexity::{loss_per_position, rope_of};
use posenc_models::{Decoder, Scaling};
use posenc_tune::{LoraConfig, Target, Trainable, TrainableDecoder, TuneError};
use serde_json::Value;

use crate::common;

use common::{floats, ids};

const LOSS_TOL: f64 = 1e-5;
const GRAD_TOL: f64 = 1e-5;

fn base(name: &str) -> Decoder {
    common::load(&common::model_dir(name))
}

fn reference(short: &str) -> Value {
    common::fixture_json(&format!("grads-{short}.json"))
}

fn values(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

fn max_abs(v: &[f32]) -> f64 {
    v.iter().fold(0f64, |m, &x| m.max(x.abs() as f64))
}

fn max_abs_diff(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .fold(0f64, |m, (&x, &y)| m.max((x as f64 - y as f64).abs()))
}

/// The fixture's LoRA configuration, with the embedding and norms trained.
fn tuned(short: &str, r: &Value) -> TrainableDecoder {
    let name = r["model"].as_str().unwrap();
    let lora = LoraConfig {
        rank: r["lora"]["r"].as_u64().unwrap() as usize,
        alpha: r["lora"]["alpha"].as_f64().unwrap(),
        dropout: r["lora"]["dropout"].as_f64().unwrap(),
        targets: r["lora"]["targets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_str().unwrap().parse().unwrap())
            .collect(),
    };
    assert_eq!(
        lora.targets,
        Target::ALL,
        "{short}: the fixture targets all seven"
    );
    let trainable = Trainable {
        embed: true,
        norm: true,
    };
    let model = TrainableDecoder::new(&base(name), lora, trainable, 0).unwrap();
    for (pname, v) in r["lora_init"].as_object().unwrap() {
        model.set_parameter(pname, &floats(v)).unwrap();
    }
    model
}

/// Loss and every gradient of one case against the reference, on the fused
/// or the reference path; returns the worst relative gradient difference.
fn check_case(short: &str, model: &TrainableDecoder, r: &Value, case: &str, path: &str) -> f64 {
    let c = &r["cases"][case];
    let tokens = ids(&r["tokens"]);
    let positions = ids(&c["positions"]);
    let loss = model.loss(&tokens, &positions).unwrap();
    let got = loss.to_scalar::<f32>().unwrap() as f64;
    let want = c["loss"].as_f64().unwrap();
    let rel = (got - want).abs() / want.abs();
    println!(
        "{short} {case} {path}: loss {got:.7} vs torch {want:.7} (relative difference {rel:.2e})"
    );
    assert!(
        rel <= LOSS_TOL,
        "{short} {case} {path}: loss {got} vs {want}"
    );
    let grads: HashMap<String, Tensor> = model.gradients(&loss).unwrap().into_iter().collect();
    let want_grads = c["grads"].as_object().unwrap();
    // Every trained parameter has a reference: the fixture's, plus the embedding.
    assert_eq!(
        grads.len(),
        want_grads.len() + 1,
        "{short}: parameter sets differ"
    );
    let mut worst: Vec<(f64, f64, String)> = Vec::new();
    for (name, w) in want_grads {
        let g = grads
            .get(name)
            .unwrap_or_else(|| panic!("{short}: no gradient for {name}"));
        let w = floats(w);
        let scale = max_abs(&w);
        assert!(
            scale > 0.0,
            "{short}: the reference gradient of {name} is zero"
        );
        let diff = max_abs_diff(&values(g), &w);
        worst.push((diff / scale, diff, name.clone()));
    }
    // The embedding: its norm and the rows stored (tokens in the input and
    // not; for the tied Qwen2.5 every row also gets the head's gradient).
    let e = &grads["model.embed_tokens.weight"];
    let norm = e
        .sqr()
        .unwrap()
        .sum_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
        .sqrt() as f64;
    let want_norm = c["embed_grad"]["norm"].as_f64().unwrap();
    assert!(
        (norm - want_norm).abs() <= LOSS_TOL * want_norm,
        "{short} {case}: embedding gradient norm {norm} vs {want_norm}"
    );
    let rows = c["embed_grad"]["rows"].as_object().unwrap();
    let all: Vec<f32> = rows.values().flat_map(floats).collect();
    let scale = max_abs(&all);
    for (id, w) in rows {
        let row = values(&e.get(id.parse::<usize>().unwrap()).unwrap());
        let diff = max_abs_diff(&row, &floats(w));
        worst.push((
            diff / scale,
            diff,
            format!("model.embed_tokens.weight[{id}]"),
        ));
    }
    worst.sort_by(|a, b| b.0.total_cmp(&a.0));
    for (rel, abs, name) in worst.iter().take(4) {
        println!("  {rel:.2e} of the max ({abs:.2e} absolute): {name}");
    }
    for (rel, _, name) in &worst {
        assert!(
            *rel <= GRAD_TOL,
            "{short} {case} {path}: gradient of {name} differs by {rel:.2e} of its largest value"
        );
    }
    worst[0].0
}

fn check_model(short: &str) {
    let r = reference(short);
    println!(
        "{short}: reference from torch {}, transformers {}, peft {}",
        r["torch"], r["transformers"], r["peft"]
    );
    let mut model = tuned(short, &r);
    for reference_path in [false, true] {
        model.set_reference(reference_path);
        let path = if reference_path {
            "reference path"
        } else {
            "fused"
        };
        for case in ["contiguous", "pose"] {
            check_case(short, &model, &r, case, path);
        }
    }
    // The two cases differ far beyond the tolerance in the rotated factors.
    let (a, b) = (
        &r["cases"]["contiguous"]["grads"],
        &r["cases"]["pose"]["grads"],
    );
    let name = "base_model.model.model.layers.0.self_attn.k_proj.lora_B.weight";
    let (ga, gb) = (floats(&a[name]), floats(&b[name]));
    assert!(max_abs_diff(&ga, &gb) > 1000.0 * GRAD_TOL * max_abs(&ga));
}

#[test]
fn tiny_llama31_gradients_match_pytorch_and_peft() {
    check_model("llama31");
}

#[test]
fn tiny_qwen25_gradients_match_pytorch_and_peft() {
    check_model("qwen25");
}

/// With PEFT's initialisation (B = 0) the adapted model is the base model:
/// its logits and loss equal posenc-models' inference forward (gemm and the
/// packed fused attention, no candle graph), for the config's own RoPE and
/// another scaling; A's gradient is exactly zero and B's is not.
#[test]
fn fresh_adapters_leave_the_plain_forward_unchanged() {
    let r = reference("llama31");
    let tokens = ids(&r["tokens"]);
    let positions: Vec<u32> = (0..tokens.len() as u32).collect();
    for name in ["tiny-llama31", "tiny-qwen25"] {
        let plain = base(name);
        let lora = LoraConfig {
            rank: 4,
            targets: Target::ALL.to_vec(),
            ..Default::default()
        };
        for scaling in ["model", "linear:2"] {
            let scaling: Scaling = scaling.parse().unwrap();
            let model = TrainableDecoder::new(&plain, lora.clone(), Trainable::default(), 3)
                .unwrap()
                .with_scaling(&scaling)
                .unwrap();
            let rope = rope_of(scaling.rope_config(plain.config()).unwrap()).unwrap();
            let hidden = plain.hidden_states(&tokens, &rope, None).unwrap();
            let want = plain.logits(&hidden, tokens.len()).unwrap();
            let got = values(&model.logits(&tokens, &positions).unwrap());
            let diff = max_abs_diff(&got, &want);
            println!("{name} {}: logits differ by {diff:.2e}", scaling.name);
            assert!(
                diff <= 1e-5,
                "{name} {}: logits differ by {diff}",
                scaling.name
            );
            let per_position = loss_per_position(&plain, &tokens, &rope).unwrap();
            let want = per_position.iter().sum::<f64>() / per_position.len() as f64;
            let loss = model.loss(&tokens, &positions).unwrap();
            let got = loss.to_scalar::<f32>().unwrap() as f64;
            println!("{name} {}: loss {got:.7} vs {want:.7}", scaling.name);
            assert!(
                (got - want).abs() <= LOSS_TOL * want,
                "{name}: loss {got} vs {want}"
            );
            for (pname, g) in model.gradients(&loss).unwrap() {
                let m = max_abs(&values(&g));
                if pname.contains("lora_A") {
                    assert_eq!(m, 0.0, "{pname}: B = 0 gives A no gradient");
                } else {
                    assert!(m > 0.0, "{pname}: no gradient");
                }
            }
        }
    }
}

/// posenc-nn's AdamW with torch's betas (0.9, 0.999), ε 1e-8, no weight
/// decay, fed torch's gradients, takes torch's first step: the optimiser
/// the training loop will use is checked apart from the gradients.
#[test]
fn shared_adamw_takes_torchs_step() {
    for short in ["llama31", "qwen25"] {
        let r = reference(short);
        let adamw = &r["adamw"];
        assert_eq!(adamw["weight_decay"].as_f64(), Some(0.0));
        let lr = adamw["lr"].as_f64().unwrap();
        let updated = adamw["updated"].as_object().unwrap();
        for fused in [false, true] {
            let mut vars = HashMap::new();
            let mut grads = Vec::new();
            for name in updated.keys() {
                let init = floats(&r["lora_init"][name]);
                let g = floats(&r["cases"]["contiguous"]["grads"][name]);
                let dev = candle_core::Device::Cpu;
                let var = Var::from_vec(init, g.len(), &dev).unwrap();
                grads.push(Tensor::from_vec(g, var.shape(), &dev).unwrap());
                vars.insert(name.clone(), var);
            }
            // d/dθ Σ θ·g = g: a loss whose gradient is torch's.
            let names: Vec<String> = updated.keys().cloned().collect();
            let mut loss = Tensor::new(0f32, &candle_core::Device::Cpu).unwrap();
            for (name, g) in names.iter().zip(&grads) {
                let term = (vars[name].as_tensor() * g).unwrap().sum_all().unwrap();
                loss = (loss + term).unwrap();
            }
            let store = loss.backward().unwrap();
            let mut opt = posenc_nn::optim::AdamW::new(vars.clone(), 0.0).unwrap();
            let betas = floats(&adamw["betas"]);
            opt.beta1 = betas[0] as f64;
            opt.beta2 = betas[1] as f64;
            opt.eps = adamw["eps"].as_f64().unwrap();
            if fused {
                opt.step_clipped(&store, lr, 0.0).unwrap();
            } else {
                opt.step(&store, lr).unwrap();
            }
            for (name, want) in updated {
                let diff = max_abs_diff(&values(vars[name].as_tensor()), &floats(want));
                println!("{short} AdamW (fused {fused}) {name}: differs by {diff:.2e}");
                assert!(
                    diff <= 1e-3 * lr,
                    "{short} {name} (fused {fused}): updated factor differs by {diff:.2e}"
                );
            }
        }
    }
}

#[test]
fn bad_inputs_and_configs_are_typed_errors() {
    let plain = base("tiny-llama31");
    // q_proj is (64 → 64), k_proj (64 → 32): rank 40 fits q but not k.
    let lora = |rank, targets: &[Target]| LoraConfig {
        rank,
        targets: targets.to_vec(),
        ..Default::default()
    };
    TrainableDecoder::new(&plain, lora(40, &[Target::QProj]), Trainable::default(), 0).unwrap();
    let err = TrainableDecoder::new(
        &plain,
        lora(40, &[Target::QProj, Target::KProj]),
        Trainable::default(),
        0,
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            TuneError::Rank {
                rank: 40,
                max: 32,
                target: "k_proj"
            }
        ),
        "{err}"
    );
    let model =
        TrainableDecoder::new(&plain, LoraConfig::default(), Trainable::default(), 0).unwrap();
    assert!(matches!(model.loss(&[1], &[0]), Err(TuneError::Input(_))));
    assert!(matches!(
        model.loss(&[1, 2], &[0]),
        Err(TuneError::Input(_))
    ));
    assert!(matches!(
        model.loss(&[1, 256], &[0, 1]),
        Err(TuneError::Input(_))
    ));
    assert!(matches!(model.logits(&[], &[]), Err(TuneError::Input(_))));
    let name = "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight";
    assert!(matches!(
        model.set_parameter(name, &[0.0; 3]),
        Err(TuneError::ParameterSize {
            expected: 512,
            got: 3,
            ..
        })
    ));
    // Only the default targets (q, v) have adapters; norms are frozen.
    assert!(matches!(
        model.set_parameter("model.norm.weight", &[1.0; 64]),
        Err(TuneError::UnknownParameter(_))
    ));
    assert_eq!(model.parameters().len(), 2 * 2 * 2);
    assert_eq!(
        model.trained_values(),
        2 * (8 * 64 + 64 * 8 + 8 * 64 + 32 * 8)
    );
    let method: Scaling = "self-extend:4:16".parse().unwrap();
    assert!(matches!(
        TrainableDecoder::new(&plain, LoraConfig::default(), Trainable::default(), 0)
            .unwrap()
            .with_scaling(&method),
        Err(TuneError::Scaling(_))
    ));
}

/// Dropout changes the loss while training and not in evaluation; the same
/// seed gives the same adapters.
#[test]
fn dropout_and_seeds() {
    let plain = base("tiny-qwen25");
    let lora = LoraConfig {
        dropout: 0.5,
        ..Default::default()
    };
    let tokens: Vec<u32> = (0..16).map(|i| (i * 37 % 256) as u32).collect();
    let positions: Vec<u32> = (0..16).collect();
    let mut model = TrainableDecoder::new(&plain, lora.clone(), Trainable::default(), 5).unwrap();
    // B = 0 hides dropout: give every factor B nonzero values.
    for (name, var) in model.parameters() {
        if name.contains("lora_B") {
            model
                .set_parameter(name, &vec![0.05; var.elem_count()])
                .unwrap();
        }
    }
    let loss = |m: &TrainableDecoder| {
        m.loss(&tokens, &positions)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap()
    };
    model.set_training(false);
    let (e1, e2) = (loss(&model), loss(&model));
    assert_eq!(e1, e2);
    model.set_training(true);
    let (t1, t2) = (loss(&model), loss(&model));
    assert!(
        t1 != e1 && t2 != t1,
        "dropout had no effect: {e1} {t1} {t2}"
    );
    let again = TrainableDecoder::new(&plain, lora.clone(), Trainable::default(), 5).unwrap();
    let other = TrainableDecoder::new(&plain, lora, Trainable::default(), 6).unwrap();
    let first = |m: &TrainableDecoder| values(m.parameters()[0].1.as_tensor());
    // The first parameter is layer 0's q_proj A, untouched above.
    assert_eq!(first(&again), first(&model));
    assert_ne!(first(&again), first(&other));
}

/// Activation checkpointing per layer gives the loss and the gradients of
/// the plain backward pass (to `f32` summation order: 1e-5 of each
/// tensor's largest entry), with dropout on (the masks are drawn again
/// from the same state, and the generator ends where the plain pass leaves
/// it), the embedding and norms trained, a tied (Qwen2.5) and an untied
/// (Llama 3.1) head, PoSE-like skipped ids, and more rows than one chunk
/// of the head.
#[test]
fn checkpointed_layers_give_the_same_gradients() {
    let t = posenc_tune::model::HEAD_CHUNK + 187;
    for name in ["tiny-llama31", "tiny-qwen25"] {
        let lora = LoraConfig {
            rank: 4,
            dropout: 0.3,
            targets: Target::ALL.to_vec(),
            ..Default::default()
        };
        let trainable = Trainable {
            embed: true,
            norm: true,
        };
        let model = TrainableDecoder::new(&base(name), lora, trainable, 3).unwrap();
        for (pname, var) in model.parameters() {
            if pname.contains("lora_B") {
                let v: Vec<f32> = (0..var.elem_count())
                    .map(|i| 0.02 * ((i % 7) as f32 - 3.0))
                    .collect();
                model.set_parameter(pname, &v).unwrap();
            }
        }
        let tokens: Vec<u32> = (0..t).map(|i| (i * 37 % 251) as u32).collect();
        // Two chunks of ids with a skip between them, as PoSE draws.
        let positions: Vec<u32> = (0..t as u32)
            .map(|i| if i < 300 { i } else { i + 4000 })
            .collect();
        let run = |checkpoint: bool| {
            model.reseed_dropout(11);
            let (loss, grads) = model
                .loss_and_gradients(&tokens, &positions, checkpoint)
                .unwrap();
            // The generator's state afterwards: the next loss's masks.
            let next = model
                .loss(&tokens[..16], &positions[..16])
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            (loss, grads, next)
        };
        let (plain_loss, plain, plain_next) = run(false);
        let (ck_loss, ck, ck_next) = run(true);
        assert!(
            ((ck_loss - plain_loss) / plain_loss).abs() < 1e-6,
            "{name}: loss {ck_loss} against {plain_loss}"
        );
        assert_eq!(ck_next, plain_next, "{name}: the dropout stream moved");
        let mut worst = 0f64;
        for (((pname, _), a), b) in model.parameters().iter().zip(&plain).zip(&ck) {
            let (a, b) = (a.as_ref().unwrap(), b.as_ref().unwrap());
            let (a, b) = (values(a), values(b));
            let rel = max_abs_diff(&a, &b) / max_abs(&a).max(1e-30);
            worst = worst.max(rel);
            assert!(
                rel <= GRAD_TOL,
                "{name} {pname}: relative difference {rel:e}"
            );
        }
        println!("{name}: checkpointed gradients within {worst:.2e} of the plain pass");
    }
}
