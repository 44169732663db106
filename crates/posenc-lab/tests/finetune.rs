//! Fine-tuning at a new length: it learns there, records what it did, keeps
//! its scaling for later evaluation, resumes exactly, and refuses what it
//! cannot do with typed errors.

use crate::common;

use std::path::{Path, PathBuf};

use candle_core::Device;
use posenc::analysis::SplitMix64;
use posenc_lab::config::{Mode, PeConfig, TrainConfig};
use posenc_lab::finetune::scaling_at;
use posenc_lab::optim::{clip_grad_norm, AdamW};
use posenc_lab::tasks::{Task, TaskKind, IGNORE};
use posenc_lab::train::{self, batch_seed, make_batch, Lab, TrainOptions};
use posenc_lab::{finetune, FactorScaling, FinetuneOptions, LabError, ScalingSpec};

const BASE_LEN: usize = 8;

fn tmp(name: &str) -> (tempfile::TempDir, PathBuf) {
    common::tmp_dir("posenc-ft", name)
}

fn lab(pe: PeConfig, steps: usize) -> Lab {
    let task = Task::new(TaskKind::Copy, 8).unwrap();
    let model = common::model(Mode::Decoder, &task, pe);
    let run = TrainConfig {
        lr: 1e-2,
        warmup: 5.min(steps),
        ..common::run(TaskKind::Copy, steps, BASE_LEN, 4)
    };
    Lab::new(model, run, task).unwrap()
}

fn rope() -> PeConfig {
    PeConfig::parse("rope", 64, 4).unwrap()
}

/// A base model trained `steps` steps at [`BASE_LEN`], saved in `dir`.
fn base(dir: &Path, pe: PeConfig, steps: usize) -> Lab {
    let mut l = lab(pe, steps);
    let mut opt = AdamW::new(l.params(), 0.01).unwrap();
    train::train(&mut l, &mut opt, &TrainOptions::quiet(dir)).unwrap();
    l
}

fn loss_at(l: &Lab, len: usize, scaling: Option<&ScalingSpec>) -> f64 {
    let s = scaling.map(|s| s.build(&l.meta.model).unwrap());
    train::evaluate(l, &[len], 4, 16, s.as_ref()).unwrap().loss[0]
}

#[test]
fn finetuning_at_a_new_length_lowers_the_loss_there() {
    let (_tmp, dir) = tmp("lowers");
    let b = base(&dir, rope(), 120);
    let len = 2 * BASE_LEN;
    let pi = ScalingSpec::for_length(FactorScaling::Linear, len, BASE_LEN).unwrap();
    let before_plain = loss_at(&b, len, None);
    let before_pi = loss_at(&b, len, Some(&pi));
    let mut afters = Vec::new();
    for scaling in [None, Some(pi.clone())] {
        let mut l = Lab::load(&dir).unwrap();
        let mut o = FinetuneOptions::new(len, 40, 3e-3);
        o.scaling = scaling.clone();
        let s = finetune(&mut l, &o).unwrap();
        assert_eq!(s.steps, 40);
        assert!(!s.interrupted);
        let before = if scaling.is_some() {
            before_pi
        } else {
            before_plain
        };
        // Evaluated as `posenc eval` would by default: with the kept scaling.
        let spec = scaling_at(&l, None, len).unwrap();
        assert_eq!(spec, scaling);
        let after = loss_at(&l, len, spec.as_ref());
        assert!(
            after < 0.9 * before,
            "scaling {scaling:?}: loss at {len} {before:.4} before, {after:.4} after"
        );
        afters.push(after);
    }
    // Chen et al. 2023 §3: with positions interpolated into the trained
    // range the same steps go further than plain fine-tuning (here about
    // 0.05 against 2.1 nats).
    assert!(
        afters[1] < afters[0],
        "PI {} vs plain {}",
        afters[1],
        afters[0]
    );
}

#[test]
fn the_checkpoint_records_the_finetune_and_the_base_is_untouched() {
    let (_tmp, dir) = tmp("record-base");
    let (_tmp_out, out) = tmp("record-ft");
    base(&dir, rope(), 3);
    let base_files: Vec<Vec<u8>> = ["config.json", "model.safetensors"]
        .iter()
        .map(|f| std::fs::read(dir.join(f)).unwrap())
        .collect();
    // A checkpoint trained from scratch has no fine-tune record.
    let text = std::fs::read_to_string(dir.join("config.json")).unwrap();
    assert!(!text.contains("finetune"), "{text}");
    let mut l = Lab::load(&dir).unwrap();
    assert!(l.meta.finetune.is_none());
    let spec = ScalingSpec::for_length(FactorScaling::Yarn, 24, BASE_LEN).unwrap();
    let mut o = FinetuneOptions::new(24, 4, 1e-3);
    o.scaling = Some(spec.clone());
    o.warmup = 2;
    o.batch = Some(4);
    o.seed = Some(99);
    o.base = Some(&dir);
    o.out = Some(&out);
    finetune(&mut l, &o).unwrap();
    for (f, bytes) in ["config.json", "model.safetensors"].iter().zip(&base_files) {
        assert_eq!(
            &std::fs::read(dir.join(f)).unwrap(),
            bytes,
            "base {f} changed"
        );
    }
    let ft = Lab::load(&out).unwrap();
    assert_eq!(ft.meta.step, 4);
    assert_eq!(ft.meta.train.train_len, 24);
    assert_eq!(ft.meta.train.steps, 4);
    assert_eq!(ft.meta.train.batch, 4);
    // The evaluation seed stays the base's.
    assert_eq!(ft.meta.train.seed, 4);
    let r = ft.meta.finetune.as_ref().expect("fine-tune record");
    assert_eq!(
        r.base.as_deref(),
        Some(dir.canonicalize().unwrap().to_str().unwrap())
    );
    assert_eq!(
        (r.base_step, r.base_train.train_len, r.base_train.steps),
        (3, BASE_LEN, 3)
    );
    assert_eq!(
        (r.len, r.steps, r.warmup, r.batch, r.seed),
        (24, 4, 2, 4, 99)
    );
    assert_eq!(r.lr, 1e-3);
    assert_eq!(r.scaling.as_ref(), Some(&spec));
    assert_eq!(spec.factor, 3.0);
    // Warm-up, then constant.
    let m = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let lrs: Vec<f64> = m
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["lr"]
                .as_f64()
                .unwrap()
        })
        .collect();
    assert_eq!(lrs, vec![5e-4, 1e-3, 1e-3, 1e-3]);
    // Fine-tuning the fine-tuned model keeps the history.
    let mut again = Lab::load(&out).unwrap();
    let o = FinetuneOptions::new(24, 1, 1e-3);
    finetune(&mut again, &o).unwrap();
    let r2 = again.meta.finetune.as_ref().unwrap();
    assert_eq!(r2.base_step, 4);
    assert_eq!(r2.base_train.train_len, 24);
    assert_eq!(r2.base_finetune.as_deref(), Some(r));
}

#[test]
fn a_scaling_kept_in_finetuning_is_the_default_afterwards() {
    let (_tmp, dir) = tmp("kept-base");
    let (_tmp_out, out) = tmp("kept-ft");
    base(&dir, rope(), 3);
    let mut l = Lab::load(&dir).unwrap();
    // Without a fine-tune, no scaling unless asked; asked: over the training length.
    assert_eq!(scaling_at(&l, None, 32).unwrap(), None);
    assert_eq!(
        scaling_at(&l, Some("ntk"), 32).unwrap(),
        Some(ScalingSpec::new(FactorScaling::Ntk, 4.0, BASE_LEN).unwrap())
    );
    let spec = ScalingSpec::for_length(FactorScaling::Linear, 16, BASE_LEN).unwrap();
    let mut o = FinetuneOptions::new(16, 2, 1e-3);
    o.scaling = Some(spec.clone());
    o.out = Some(&out);
    finetune(&mut l, &o).unwrap();
    let ft = Lab::load(&out).unwrap();
    // Within the fine-tuned length: exactly the scaling it was trained with.
    assert_eq!(scaling_at(&ft, None, 16).unwrap(), Some(spec.clone()));
    assert_eq!(scaling_at(&ft, None, 8).unwrap(), Some(spec.clone()));
    // Past it: stretched further, from the same original length.
    assert_eq!(
        scaling_at(&ft, None, 64).unwrap(),
        Some(ScalingSpec::new(FactorScaling::Linear, 8.0, BASE_LEN).unwrap())
    );
    // An explicit kind keeps the original length and at least the factor;
    // `none` drops it.
    assert_eq!(
        scaling_at(&ft, Some("ntk"), 16).unwrap(),
        Some(ScalingSpec::new(FactorScaling::Ntk, 2.0, BASE_LEN).unwrap())
    );
    assert_eq!(scaling_at(&ft, Some("none"), 16).unwrap(), None);
    assert!(scaling_at(&ft, Some("magic"), 16).is_err());
    // The default evaluation is the scaled one, not the bare RoPE.
    let default = loss_at(&ft, 16, scaling_at(&ft, None, 16).unwrap().as_ref());
    let kept = loss_at(&ft, 16, Some(&spec));
    let bare = loss_at(&ft, 16, None);
    assert_eq!(default, kept);
    assert_ne!(default, bare);
}

#[test]
fn an_interrupted_finetune_resumes_exactly() {
    let (_tmp, dir) = tmp("resume-base");
    base(&dir, rope(), 3);
    let spec = ScalingSpec::for_length(FactorScaling::Linear, 16, BASE_LEN).unwrap();
    let run = |out: &Path, pause_at: Option<usize>| {
        let mut l = Lab::load(&dir).unwrap();
        let mut o = FinetuneOptions::new(16, 6, 2e-3);
        o.scaling = Some(spec.clone());
        o.warmup = 2;
        o.out = Some(out);
        o.pause_at = pause_at;
        let s = finetune(&mut l, &o).unwrap();
        (l, s)
    };
    let (_tmp_a, a_dir) = tmp("resume-a");
    let (a, _) = run(&a_dir, None);
    let (_tmp_b, b_dir) = tmp("resume-b");
    let (_, paused) = run(&b_dir, Some(3));
    assert!(paused.interrupted && paused.steps == 3);
    let (mut b, mut opt) = Lab::load_resumable(&b_dir).unwrap();
    assert_eq!(b.meta.step, 3);
    let s = train::train(&mut b, &mut opt, &TrainOptions::quiet(&b_dir)).unwrap();
    assert_eq!(s.steps, 6);
    assert_eq!(common::sorted_params(&a), common::sorted_params(&b));
}

/// The report's fine-tune before it moved into the lab: a plain AdamW loop
/// with a constant learning rate, each batch in the lab's two halves. The lab's must match it bit for bit, with
/// the composed reference ops and candle-op AdamW (that loop as it was
/// written), and with the fused ops and in-place AdamW (`Lab::optimizer_step`).
#[test]
fn in_memory_finetune_matches_a_plain_adamw_loop() {
    for fused in [false, true] {
        let (_tmp, dir) = tmp(if fused {
            "plain-base-fused"
        } else {
            "plain-base"
        });
        base(&dir, rope(), 3);
        let spec = ScalingSpec::for_length(FactorScaling::Linear, 16, BASE_LEN).unwrap();
        let (len, steps, lr) = (16, 3, 1e-3);
        let mut a = Lab::load(&dir).unwrap();
        a.model.set_fused(fused);
        let mut o = FinetuneOptions::new(len, steps, lr);
        o.scaling = Some(spec.clone());
        finetune(&mut a, &o).unwrap();

        let mut b = Lab::load(&dir).unwrap();
        b.model.set_fused(fused);
        let scaling = spec.build(&b.meta.model).unwrap();
        let p = b.params();
        let mut names: Vec<&String> = p.keys().collect();
        names.sort();
        let vars: Vec<candle_core::Var> = names.iter().map(|n| p[*n].clone()).collect();
        let mut opt = AdamW::new(p.clone(), b.meta.train.weight_decay).unwrap();
        for step in 0..steps {
            let seed = batch_seed(b.meta.train.seed ^ 0xF1AE, step as u64, 5);
            let mut rng = SplitMix64::new(seed);
            let batch =
                make_batch(&b.task, &mut rng, b.meta.train.batch, len, &Device::Cpu).unwrap();
            // The batch in MICRO_BATCHES = 2 row halves, each mean loss
            // weighted by its share of the scored targets, gradients summed.
            assert_eq!(train::MICRO_BATCHES, 2);
            let rows = batch.input.dim(0).unwrap();
            let halves = [(0, rows / 2), (rows / 2, rows - rows / 2)];
            let part = |(s, n): (usize, usize)| train::Batch {
                input: batch.input.narrow(0, s, n).unwrap(),
                target: batch.target.narrow(0, s, n).unwrap(),
            };
            let scored = |t: &candle_core::Tensor| {
                let v = t.flatten_all().unwrap().to_vec1::<i64>().unwrap();
                v.iter().filter(|&&y| y != IGNORE).count()
            };
            let counts = halves.map(|h| scored(&part(h).target));
            let total = (counts[0] + counts[1]) as f64;
            let mut stores = halves.iter().zip(counts).map(|(&h, c)| {
                let (loss, _) = b.batch_loss(&part(h), Some(&scaling)).unwrap();
                (loss * (c as f64 / total)).unwrap().backward().unwrap()
            });
            let mut grads = stores.next().unwrap();
            let second = stores.next().unwrap();
            for var in &vars {
                if let Some(g2) = second.get(var.as_tensor()) {
                    let sum = match grads.get(var.as_tensor()) {
                        Some(g1) => (g1 + g2).unwrap(),
                        None => g2.clone(),
                    };
                    grads.insert(var.as_tensor(), sum);
                }
            }
            if fused {
                b.optimizer_step(&mut opt, &mut grads, lr).unwrap();
            } else {
                clip_grad_norm(&mut grads, &vars, 1.0).unwrap();
                opt.step(&grads, lr).unwrap();
            }
        }
        assert_eq!(
            common::sorted_params(&a),
            common::sorted_params(&b),
            "fused {fused}"
        );
    }
}

#[test]
fn what_cannot_be_finetuned_is_a_typed_error() {
    // A learned table cannot run past its rows.
    let mut l = lab(PeConfig::Learned { max_positions: 12 }, 1);
    let e = finetune(&mut l, &FinetuneOptions::new(16, 2, 1e-3)).unwrap_err();
    assert!(
        matches!(
            e,
            LabError::LengthBeyondTable {
                len: 16,
                rows: 12,
                ..
            }
        ),
        "{e:?}"
    );
    assert!(e.to_string().contains("learned position table"), "{e}");
    // Within the table it fine-tunes.
    assert!(finetune(&mut l, &FinetuneOptions::new(12, 1, 1e-3)).is_ok());
    let mut l = lab(rope(), 1);
    let step0 = l.meta.clone();
    // Below the task's minimum length (copy: 3), at each edge.
    for len in [0, 1, 2] {
        let e = finetune(&mut l, &FinetuneOptions::new(len, 1, 1e-3)).unwrap_err();
        assert!(
            matches!(&e, LabError::Invalid(m) if m.contains("too short")),
            "{e:?}"
        );
    }
    // Zero steps, a bad learning rate, warm-up past the steps, a zero batch.
    assert!(finetune(&mut l, &FinetuneOptions::new(16, 0, 1e-3)).is_err());
    assert!(finetune(&mut l, &FinetuneOptions::new(16, 1, f64::NAN)).is_err());
    assert!(finetune(&mut l, &FinetuneOptions::new(16, 1, -1.0)).is_err());
    let mut o = FinetuneOptions::new(16, 2, 1e-3);
    o.warmup = 3;
    assert!(finetune(&mut l, &o).is_err());
    let mut o = FinetuneOptions::new(16, 2, 1e-3);
    o.batch = Some(0);
    assert!(finetune(&mut l, &o).is_err());
    // The output cannot be the base.
    let (_tmp, d) = common::fresh_dir("posenc-ft", "same");
    let mut o = FinetuneOptions::new(16, 1, 1e-3);
    o.base = Some(&d);
    let same = d.join(".");
    o.out = Some(&same);
    let e = finetune(&mut l, &o).unwrap_err().to_string();
    assert!(e.contains("overwrite its base"), "{e}");
    // A failed call leaves the model as it was.
    assert_eq!(l.meta, step0);
    // A scaling needs RoPE.
    let mut a = lab(PeConfig::Alibi, 1);
    let mut o = FinetuneOptions::new(16, 1, 1e-3);
    o.scaling = Some(ScalingSpec::for_length(FactorScaling::Linear, 16, BASE_LEN).unwrap());
    let e = finetune(&mut a, &o).unwrap_err().to_string();
    assert!(e.contains("RoPE"), "{e}");
}
