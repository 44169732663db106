//! The lab's model and training loop: hooks, gradients, learning, exact
//! resume, and clear errors for bad checkpoints.

use crate::common;

use std::path::PathBuf;

use candle_core::{DType, Device, Tensor};
use posenc::analysis::SplitMix64;
use posenc::rope::ScalingKind;
use posenc_lab::config::{Mode, PeConfig};
use posenc_lab::optim::AdamW;
use posenc_lab::tasks::{Task, TaskKind};
use posenc_lab::train::{self, make_batch, Lab, TrainOptions};

use common::{model, new_lab, pe, run};

fn tmp(name: &str) -> (tempfile::TempDir, PathBuf) {
    common::tmp_dir("posenc-lab", name)
}

const ALL_PES: [&str; 15] = PeConfig::NAMES;

/// The largest difference between the pooled outputs of `x`'s two rows.
fn pooled_gap(lab: &Lab, x: &Tensor) -> f32 {
    let pooled = lab.model.pooled(x).unwrap().to_vec2::<f32>().unwrap();
    pooled[0]
        .iter()
        .zip(&pooled[1])
        .map(|(a, b)| (a - b).abs())
        .fold(0.0f32, f32::max)
}

#[test]
fn nope_encoder_pooled_output_is_permutation_invariant() {
    let task = Task::new(TaskKind::Order, 8).unwrap();
    let lab = new_lab(
        Mode::Encoder,
        task,
        PeConfig::Nope,
        run(TaskKind::Order, 1, 12, 3),
    );
    let mut rng = SplitMix64::new(5);
    for _ in 0..5 {
        let ex = lab.task.sample(&mut rng, 12).unwrap();
        let mut perm: Vec<usize> = (0..12).collect();
        for i in (1..12).rev() {
            perm.swap(i, rng.below(i as u64 + 1) as usize);
        }
        let shuffled: Vec<u32> = perm.iter().map(|&i| ex.input[i]).collect();
        let x = Tensor::new(vec![ex.input.clone(), shuffled], &Device::Cpu).unwrap();
        let gap = pooled_gap(&lab, &x);
        assert!(gap <= 1e-5, "NoPE encoder sees order: gap {gap}");
    }
    // With a positional encoding the pooled output depends on order.
    let task = Task::new(TaskKind::Order, 8).unwrap();
    let lab = new_lab(
        Mode::Encoder,
        task,
        pe("sinusoidal"),
        run(TaskKind::Order, 1, 12, 3),
    );
    let x = Tensor::new(&[[16u32, 17, 18, 19], [19, 18, 17, 16]], &Device::Cpu).unwrap();
    let gap = pooled_gap(&lab, &x);
    assert!(gap > 1e-4, "sinusoidal encoder is blind to order: {gap}");
}

#[test]
fn every_encoding_runs_in_both_modes_and_its_parameters_get_gradients() {
    for name in ALL_PES {
        for (mode, kind) in [
            (Mode::Decoder, TaskKind::Copy),
            (Mode::Encoder, TaskKind::Order),
        ] {
            let task = Task::new(kind, 8).unwrap();
            let pe = PeConfig::parse(name, 64, 3).unwrap();
            if name == "fox" && mode == Mode::Encoder {
                // Forget gates are causal: an encoder is refused, typed.
                let e = Lab::new(model(mode, &task, pe), run(kind, 1, 16, 1), task);
                assert!(matches!(e, Err(posenc_lab::LabError::Invalid(_))));
                continue;
            }
            let lab = Lab::new(model(mode, &task, pe), run(kind, 1, 16, 1), task).unwrap();
            let mut rng = SplitMix64::new(2);
            let batch = make_batch(&lab.task, &mut rng, 4, 16, &Device::Cpu).unwrap();
            let (loss, _) = lab.batch_loss(&batch, None).unwrap();
            let v = loss.to_scalar::<f32>().unwrap();
            assert!(v.is_finite() && v > 0.0, "{name} {mode:?}: loss {v}");
            let grads = loss.backward().unwrap();
            for (pname, var) in lab.params() {
                if !pname.starts_with("pe.")
                    && !pname.contains("shaw")
                    && !pname.contains(".cope.")
                    && !pname.contains(".fox.")
                {
                    continue;
                }
                let g = grads
                    .get(var.as_tensor())
                    .unwrap_or_else(|| panic!("{name} {mode:?}: no gradient for {pname}"));
                let n = g
                    .sqr()
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .to_dtype(DType::F32)
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap();
                assert!(n > 0.0, "{name} {mode:?}: zero gradient for {pname}");
            }
        }
    }
}

#[test]
fn trainable_encodings_have_parameters() {
    for (name, prefix) in [
        ("learned", "pe.learned"),
        ("floater", "pe.floater"),
        ("t5", "pe.t5"),
        ("shaw", "shaw"),
    ] {
        let task = Task::new(TaskKind::Copy, 8).unwrap();
        let lab = Lab::new(
            model(Mode::Decoder, &task, PeConfig::parse(name, 64, 3).unwrap()),
            run(TaskKind::Copy, 1, 16, 1),
            task,
        )
        .unwrap();
        assert!(
            lab.params().keys().any(|k| k.contains(prefix)),
            "{name}: no parameter named like {prefix}"
        );
    }
}

#[test]
fn token_embeddings_follow_each_encodings_recipe() {
    // Sinusoidal: N(0, 1/d) tokens times √d (Vaswani §3.4 as tensor2tensor
    // and fairseq do it); every other encoding: GPT-2's N(0, 0.02²), unscaled.
    let task = Task::new(TaskKind::Copy, 8).unwrap();
    for name in ["sinusoidal", "learned", "rope", "nope", "alibi"] {
        let cfg = model(Mode::Decoder, &task, PeConfig::parse(name, 64, 3).unwrap());
        let recipe = posenc_lab::model::token_embedding_recipe(&cfg);
        let d = cfg.d_model as f64;
        let (want_std, want_scale) = if name == "sinusoidal" {
            (1.0 / d.sqrt(), d.sqrt())
        } else {
            (0.02, 1.0)
        };
        assert_eq!(recipe.init_std, want_std, "{name}");
        assert_eq!(recipe.scale, want_scale, "{name}");
        let lab = Lab::new(cfg, run(TaskKind::Copy, 1, 16, 5), task.clone()).unwrap();
        let w: Vec<f32> = lab.params()["tok.weight"]
            .as_tensor()
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let n = w.len() as f64;
        let mean = w.iter().map(|&x| x as f64).sum::<f64>() / n;
        let sd = (w.iter().map(|&x| (x as f64 - mean).powi(2)).sum::<f64>() / n).sqrt();
        // n = vocabulary × 32 ≈ 400 draws: the sample sd is within 15% of
        // the true one with overwhelming probability (its relative error is
        // about 1/√(2n) ≈ 3.5%).
        assert!(
            (sd / want_std - 1.0).abs() < 0.15,
            "{name}: token embedding sd {sd}, recipe {want_std}"
        );
    }
}

#[test]
fn decoder_learns_copy_on_short_sequences() {
    let task = Task::new(TaskKind::Copy, 8).unwrap();
    let mut cfg = run(TaskKind::Copy, 300, 9, 11);
    cfg.batch = 32;
    cfg.lr = 1e-2;
    let mut lab = new_lab(Mode::Decoder, task, pe("rope"), cfg);
    let mut opt = AdamW::new(lab.params(), 0.01).unwrap();
    let (_tmp, out) = tmp("copy");
    let summary = train::train(&mut lab, &mut opt, &TrainOptions::quiet(&out)).unwrap();
    let eval = train::evaluate(&lab, &[9], 4, 32, None).unwrap();
    assert!(
        eval.accuracy[0] >= 0.9,
        "copy accuracy {:?}, train {:?}",
        eval,
        summary
    );
    assert!(eval.loss[0] < 0.3, "{eval:?}");
}

#[test]
fn resume_continues_exactly() {
    let task = || Task::new(TaskKind::Reverse, 8).unwrap();
    let cfg = run(TaskKind::Reverse, 20, 12, 21);
    let lab = || new_lab(Mode::Decoder, task(), pe("learned"), cfg.clone());
    // Straight through.
    let (_tmp_a, a_dir) = tmp("straight");
    let mut a = lab();
    let mut opt = AdamW::new(a.params(), 0.01).unwrap();
    train::train(&mut a, &mut opt, &TrainOptions::quiet(&a_dir)).unwrap();
    // Ten steps, save, load, ten more.
    let (_tmp_b, b_dir) = tmp("resumed");
    let mut b = lab();
    let mut opt_b = AdamW::new(b.params(), 0.01).unwrap();
    let paused = train::train(
        &mut b,
        &mut opt_b,
        &TrainOptions {
            pause_at: Some(10),
            ..TrainOptions::quiet(&b_dir)
        },
    )
    .unwrap();
    assert!(paused.interrupted && paused.steps == 10);
    let mut b = Lab::load(&b_dir).unwrap();
    assert_eq!(b.meta.step, 10);
    let mut opt_b = AdamW::new(b.params(), 0.01).unwrap();
    let st =
        candle_core::safetensors::load(b_dir.join("optimizer.safetensors"), &Device::Cpu).unwrap();
    opt_b.load_state(&st).unwrap();
    train::train(&mut b, &mut opt_b, &TrainOptions::quiet(&b_dir)).unwrap();
    let (pa, pb) = (a.params(), b.params());
    let values = |v: &candle_core::Var| v.as_tensor().flatten_all().unwrap().to_vec1::<f32>();
    for (name, va) in &pa {
        let (x, y) = (values(va).unwrap(), values(&pb[name]).unwrap());
        assert_eq!(x, y, "parameter {name} differs after resume");
    }
    let ma = std::fs::read_to_string(a_dir.join("metrics.jsonl")).unwrap();
    let mb = std::fs::read_to_string(b_dir.join("metrics.jsonl")).unwrap();
    let losses = |s: &str| -> Vec<f64> {
        s.lines()
            .map(|l| {
                serde_json::from_str::<serde_json::Value>(l).unwrap()["loss"]
                    .as_f64()
                    .unwrap()
            })
            .collect()
    };
    assert_eq!(losses(&ma), losses(&mb));
}

#[test]
fn same_seed_same_losses() {
    let go = || {
        let task = Task::new(TaskKind::Sort, 8).unwrap();
        let mut lab = new_lab(
            Mode::Decoder,
            task,
            pe("alibi"),
            run(TaskKind::Sort, 6, 10, 5),
        );
        let mut opt = AdamW::new(lab.params(), 0.01).unwrap();
        let (_tmp, d) = tmp(&format!("det-{}", SplitMix64::new(0).next_u64() % 7));
        train::train(&mut lab, &mut opt, &TrainOptions::quiet(&d)).unwrap();
        let m = std::fs::read_to_string(d.join("metrics.jsonl")).unwrap();
        m.lines()
            .map(|l| {
                let v: serde_json::Value = serde_json::from_str(l).unwrap();
                (
                    v["loss"].as_f64().unwrap(),
                    v["grad_norm"].as_f64().unwrap(),
                )
            })
            .collect::<Vec<_>>()
    };
    let (a, b) = (go(), go());
    assert_eq!(a.len(), 2);
    assert_eq!(a, b);
}

#[test]
fn corrupt_or_mismatched_checkpoints_are_clear_errors() {
    let task = Task::new(TaskKind::Copy, 8).unwrap();
    let mut lab = new_lab(
        Mode::Decoder,
        task,
        PeConfig::Nope,
        run(TaskKind::Copy, 2, 8, 1),
    );
    let mut opt = AdamW::new(lab.params(), 0.01).unwrap();
    let (_tmp, d) = tmp("corrupt");
    train::train(&mut lab, &mut opt, &TrainOptions::quiet(&d)).unwrap();
    assert!(Lab::load(&d).is_ok());
    // Missing directory.
    let (_tmp_absent, absent) = tmp("absent");
    let e = Lab::load(&absent).err().unwrap().to_string();
    assert!(e.contains("config.json"), "{e}");
    // Corrupt weights.
    let w = d.join("model.safetensors");
    let good = std::fs::read(&w).unwrap();
    std::fs::write(&w, b"not a safetensors file").unwrap();
    let e = Lab::load(&d).err().unwrap().to_string();
    assert!(e.contains("corrupt"), "{e}");
    std::fs::write(&w, &good).unwrap();
    // A config that does not match the weights.
    let c = d.join("config.json");
    let text = std::fs::read_to_string(&c).unwrap();
    std::fs::write(&c, text.replace("\"d_model\": 32", "\"d_model\": 48")).unwrap();
    let e = Lab::load(&d).err().unwrap().to_string();
    assert!(e.contains("does not match"), "{e}");
    // A torn checkpoint (config from another step).
    std::fs::write(&c, text.replace("\"step\": 2", "\"step\": 1")).unwrap();
    let e = Lab::load(&d).err().unwrap().to_string();
    assert!(e.contains("torn"), "{e}");
    // Not JSON.
    std::fs::write(&c, "{").unwrap();
    let e = Lab::load(&d).err().unwrap().to_string();
    assert!(e.contains("not a posenc checkpoint"), "{e}");
}

/// A decoder with `pe` after one step of the copy task at length 8.
fn one_step_copy(pe: PeConfig) -> Lab {
    let task = Task::new(TaskKind::Copy, 8).unwrap();
    new_lab(Mode::Decoder, task, pe, run(TaskKind::Copy, 1, 8, 1))
}

#[test]
fn learned_table_refuses_lengths_past_it_and_scaling_needs_rope() {
    let lab = one_step_copy(PeConfig::Learned { max_positions: 16 });
    let e = train::evaluate(&lab, &[32], 1, 2, None)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("learned position table"), "{e}");
    let e = posenc_lab::model::EvalScaling::new(&lab.meta.model, ScalingKind::Yarn(2.0), 8)
        .err()
        .unwrap()
        .to_string();
    assert!(e.contains("RoPE"), "{e}");
}

#[test]
fn rope_scalings_evaluate_at_longer_lengths() {
    let lab = one_step_copy(pe("rope"));
    for kind in ["none", "linear:4", "ntk:4", "dynamic:4", "yarn:4"] {
        let k: ScalingKind = kind.parse().unwrap();
        let s = posenc_lab::model::EvalScaling::new(&lab.meta.model, k, 8).unwrap();
        let r = train::evaluate(&lab, &[32], 1, 2, Some(&s)).unwrap();
        assert!(r.loss[0].is_finite(), "{kind}");
    }
    // A factor posenc's validation refuses.
    assert!(
        posenc_lab::model::EvalScaling::new(&lab.meta.model, ScalingKind::Linear(f64::NAN), 8)
            .is_err()
    );
    // Dynamic NTK changes nothing within the training length and rescales
    // beyond it.
    let none = posenc_lab::model::EvalScaling::new(&lab.meta.model, ScalingKind::None, 8).unwrap();
    let dynamic =
        posenc_lab::model::EvalScaling::new(&lab.meta.model, ScalingKind::Dynamic(4.0), 8).unwrap();
    let at = |len, s| train::evaluate(&lab, &[len], 1, 2, Some(s)).unwrap().loss[0];
    assert_eq!(at(8, &none), at(8, &dynamic));
    assert_ne!(at(32, &none), at(32, &dynamic));
}
