//! The fine-tuning loop on the tiny Llama 3.1 of posenc-models' fixtures:
//! determinism, exact resume (a run paused and resumed equals an
//! uninterrupted one bit for bit: adapter, optimiser state, losses), torn or
//! foreign checkpoints refused, and the loss going down on a text it can
//! learn.

use std::path::{Path, PathBuf};

use posenc_models::Decoder;
use posenc_tune::data::{TrainText, WindowPlan};
use posenc_tune::peft::{Adapter, CONFIG_FILE, WEIGHTS_FILE};
use posenc_tune::train::{
    Finetune, FinetuneConfig, RunOptions, Schedule, Sources, METRICS_FILE, OPTIMIZER_FILE,
    RECORD_FILE,
};
use posenc_tune::{LoraConfig, Target, Trainable, TuneError};

use crate::common;

fn tiny() -> Decoder {
    common::load(&common::model_dir("tiny-llama31"))
}

/// The path `name` (not created) in a new scratch directory, and the
/// guard that removes that directory when dropped.
fn scratch(name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix(&format!("posenc-tune-train-{name}-"))
        .tempdir()
        .unwrap();
    let d = dir.path().join(name);
    (dir, d)
}

/// A text of `n` tokens over the tiny model's 256 ids: a pseudo-random
/// sequence of period 97 (learnable from context).
fn text(n: usize) -> TrainText {
    let period: Vec<u32> = (0..97u32).map(|i| (i * 89 + 13) % 256).collect();
    TrainText::new((0..n).map(|i| period[i % 97]).collect()).unwrap()
}

/// PoSE windows of 16 tokens over 64 positions, through YaRN ×2, two
/// windows a step, dropout on, embeddings and norms trained too, a
/// checkpoint every 2 steps.
fn config(steps: usize) -> FinetuneConfig {
    let mut c = FinetuneConfig::new(
        WindowPlan::Pose {
            window: 16,
            target: 64,
        },
        steps,
        5e-3,
    );
    c.scaling = "yarn:2".into();
    c.batch = 2;
    c.warmup = 2;
    c.schedule = Schedule::Cosine;
    c.seed = 11;
    c.lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.1,
        targets: vec![Target::QProj, Target::VProj, Target::DownProj],
    };
    c.trainable = Trainable {
        embed: true,
        norm: true,
    };
    c.checkpoint_every = 2;
    c
}

fn files(dir: &Path) -> Vec<(String, Vec<u8>)> {
    [CONFIG_FILE, WEIGHTS_FILE, OPTIMIZER_FILE]
        .iter()
        .map(|f| (f.to_string(), std::fs::read(dir.join(f)).unwrap()))
        .collect()
}

fn losses(ft: &Finetune) -> Vec<(usize, u64, u64, u64)> {
    ft.metrics()
        .iter()
        .map(|m| {
            (
                m.step,
                m.loss.to_bits(),
                m.lr.to_bits(),
                m.grad_norm.to_bits(),
            )
        })
        .collect()
}

#[test]
fn a_resumed_run_equals_an_uninterrupted_one_bit_for_bit() {
    let base = tiny();
    let ((_tmp_a, a), (_tmp_b, b)) = (scratch("whole"), scratch("paused"));
    let mut whole = Finetune::new(&base, text(2000), config(7), tiny_sources()).unwrap();
    let done = std::sync::atomic::AtomicUsize::new(0);
    let s = whole
        .run(&RunOptions {
            out: Some(&a),
            done: Some(&done),
            ..Default::default()
        })
        .unwrap();
    assert_eq!((s.steps, s.interrupted), (7, false));
    // The step counter a watcher thread reads.
    assert_eq!(done.into_inner(), 7);

    let mut first = Finetune::new(&base, text(2000), config(7), tiny_sources()).unwrap();
    let s = first
        .run(&RunOptions {
            out: Some(&b),
            pause_at: Some(3),
            ..Default::default()
        })
        .unwrap();
    assert_eq!((s.steps, s.interrupted), (3, true));
    drop(first);
    let mut resumed = Finetune::resume(&b, &base, text(2000)).unwrap();
    assert_eq!(resumed.step(), 3);
    resumed
        .run(&RunOptions {
            out: Some(&b),
            ..Default::default()
        })
        .unwrap();
    assert_eq!(resumed.step(), 7);
    // The adapter, its config and AdamW's moments: the same bytes.
    for ((name, x), (_, y)) in files(&a).into_iter().zip(files(&b)) {
        assert!(x == y, "{name} differs between the runs");
    }
    assert_eq!(losses(&whole), losses(&resumed));
    assert_eq!(losses(&whole).len(), 7);
    // The PEFT adapter reads back as the model's parameters.
    let adapter = Adapter::read(&a, base.config()).unwrap();
    assert_eq!(adapter.step, Some(7));
    assert_eq!(adapter, whole.adapter().unwrap());
    let lines = std::fs::read_to_string(a.join(METRICS_FILE)).unwrap();
    assert_eq!(lines.lines().count(), 7);
}

#[test]
fn runs_are_seeded() {
    let base = tiny();
    let run = |seed: u64| {
        let mut c = config(3);
        c.seed = seed;
        let mut ft = Finetune::new(&base, text(2000), c, tiny_sources()).unwrap();
        ft.run(&RunOptions::default()).unwrap();
        (ft.adapter().unwrap(), losses(&ft))
    };
    let (a, la) = run(1);
    let (b, lb) = run(1);
    let (c, lc) = run(2);
    assert_eq!(a, b);
    assert_eq!(la, lb);
    assert_ne!(a, c);
    assert_ne!(la, lc);
}

#[test]
fn the_loss_falls_on_a_learnable_text() {
    let base = tiny();
    let mut c = FinetuneConfig::new(WindowPlan::Contiguous { len: 48 }, 40, 1e-2);
    c.scaling = "linear:2".into();
    c.lora.targets = Target::ALL.to_vec();
    c.warmup = 0;
    c.schedule = Schedule::Constant;
    let mut ft = Finetune::new(&base, text(3000), c, tiny_sources()).unwrap();
    ft.run(&RunOptions::default()).unwrap();
    let l: Vec<f64> = ft.metrics().iter().map(|m| m.loss).collect();
    let first = l[..5].iter().sum::<f64>() / 5.0;
    let last = l[l.len() - 5..].iter().sum::<f64>() / 5.0;
    println!("loss: first 5 steps {first:.4}, last 5 {last:.4}");
    // ln 256 = 5.55 at the start; a period-97 sequence is learnable.
    assert!(last < first - 0.5, "{first} -> {last}");
}

#[test]
fn torn_or_foreign_checkpoints_are_refused() {
    let base = tiny();
    let (_tmp, dir) = scratch("torn");
    let mut ft = Finetune::new(&base, text(2000), config(4), tiny_sources()).unwrap();
    ft.run(&RunOptions {
        out: Some(&dir),
        pause_at: Some(2),
        ..Default::default()
    })
    .unwrap();
    // Another text (the same length, one token changed).
    let mut other: Vec<u32> = text(2000).tokens().to_vec();
    other[5] = (other[5] + 1) % 256;
    other.extend(std::iter::repeat_n(0, 200));
    let other = TrainText::new(other).unwrap();
    let e = Finetune::resume(&dir, &base, other).unwrap_err();
    assert!(matches!(e, TuneError::Checkpoint { .. }), "{e}");
    assert!(e.to_string().contains("text"), "{e}");
    // finetune.json from another step than the tensors.
    let record = std::fs::read_to_string(dir.join(RECORD_FILE)).unwrap();
    let torn = record.replace("\"step\": 2", "\"step\": 1");
    assert_ne!(torn, record);
    std::fs::write(dir.join(RECORD_FILE), &torn).unwrap();
    let e = Finetune::resume(&dir, &base, text(2000)).unwrap_err();
    assert!(e.to_string().contains("torn"), "{e}");
    std::fs::write(dir.join(RECORD_FILE), &record).unwrap();
    Finetune::resume(&dir, &base, text(2000)).unwrap();
    // No record at all.
    let (_tmp_none, none) = scratch("none");
    let e = Finetune::resume(&none, &base, text(2000)).unwrap_err();
    assert!(e.to_string().contains("not a posenc fine-tune"), "{e}");
}

#[test]
fn a_window_longer_than_the_training_part_is_refused() {
    let base = tiny();
    let c = FinetuneConfig::new(WindowPlan::Contiguous { len: 100 }, 2, 1e-3);
    // 110 tokens: 99 for training.
    let e = Finetune::new(&base, text(110), c, tiny_sources()).unwrap_err();
    assert!(
        matches!(
            e,
            TuneError::TextTooShort {
                need: 100,
                have: 99
            }
        ),
        "{e}"
    );
    let mut c = FinetuneConfig::new(WindowPlan::Contiguous { len: 48 }, 2, 1e-3);
    c.lora.rank = 65;
    let e = Finetune::new(&base, text(2000), c, tiny_sources()).unwrap_err();
    assert!(matches!(e, TuneError::Rank { rank: 65, .. }), "{e}");
}

fn tiny_sources() -> Sources {
    Sources {
        model: "tiny".into(),
        ..Default::default()
    }
}

/// An order-sensitive digest of every gradient's bits.
fn digest(grads: &[Option<candle_core::Tensor>]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325u64;
    for g in grads.iter().flatten() {
        for v in g.flatten_all().unwrap().to_vec1::<f32>().unwrap() {
            h = (h ^ u64::from(v.to_bits())).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

/// The first steps of a fine-tune and the loss and gradients of the fused
/// and the reference paths, with and without checkpointing, to the bit: the
/// values the code gave when they were recorded (a refactoring that changes
/// one of them changed the arithmetic).
#[test]
fn the_first_steps_are_the_recorded_ones() {
    let base = tiny();
    let mut ft = Finetune::new(&base, text(2000), config(3), tiny_sources()).unwrap();
    ft.run(&RunOptions::default()).unwrap();
    let steps = losses(&ft);
    let lora = LoraConfig {
        rank: 4,
        alpha: 8.0,
        dropout: 0.1,
        targets: Target::ALL.to_vec(),
    };
    let trainable = Trainable {
        embed: true,
        norm: true,
    };
    let mut model = posenc_tune::TrainableDecoder::new(&base, lora, trainable, 5).unwrap();
    let tokens: Vec<u32> = text(100).tokens()[..40].to_vec();
    let positions: Vec<u32> = (0..40).map(|i| 3 * i).collect();
    let mut paths = Vec::new();
    for reference in [false, true] {
        model.set_reference(reference);
        for checkpoint in [false, true] {
            model.reseed_dropout(9);
            let (loss, grads) = model
                .loss_and_gradients(&tokens, &positions, checkpoint)
                .unwrap();
            paths.push((loss.to_bits(), digest(&grads)));
        }
    }
    if std::env::var_os("POSENC_PRINT_PINNED").is_some() {
        println!("steps: {steps:?}\npaths: {paths:?}");
    }
    // candle's products (the `gemm` crate, beneath the reference path and
    // the frozen weights) take AVX-512 kernels where the CPU has them, and
    // sum in another order there: one pinned set per family of CPU.
    let (pinned_steps, pinned_paths) = if avx512() {
        (PINNED_STEPS_AVX512, PINNED_PATHS_AVX512)
    } else {
        (PINNED_STEPS, PINNED_PATHS)
    };
    assert_eq!(steps, pinned_steps);
    assert_eq!(paths, pinned_paths);
}

/// Whether this CPU has AVX-512 (which the `gemm` crate's kernels use).
fn avx512() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        std::arch::is_x86_feature_detected!("avx512f")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// Step, loss, learning rate and gradient norm (bits) of `config(3)`'s
/// steps, recorded from the code of 23ee5d2.
const PINNED_STEPS: [(usize, u64, u64, u64); 3] = [
    (1, 4617945644424757248, 0, 4609524158474135381),
    (
        2,
        4617921148347219968,
        4567911030049346683,
        4609254687597659006,
    ),
    (
        3,
        4617932207351136256,
        4572414629676717179,
        4610384666511005437,
    ),
];
/// [`PINNED_STEPS`] on a CPU with AVX-512, recorded from the code of
/// 0dddabd (before the operand structs of issue 38's last clean-up, which
/// gave the same values) on an AMD EPYC Zen 4.
const PINNED_STEPS_AVX512: [(usize, u64, u64, u64); 3] = [
    (1, 4617945644424757248, 0, 4609524158468154766),
    (
        2,
        4617921148347219968,
        4567911030049346683,
        4609254687594808571,
    ),
    (
        3,
        4617932207351136256,
        4572414629676717179,
        4610384666427695392,
    ),
];
/// [`PINNED_PATHS`] on a CPU with AVX-512, recorded as
/// [`PINNED_STEPS_AVX512`].
const PINNED_PATHS_AVX512: [(u64, u64); 4] = [
    (4617935073973370880, 2152664002519948660),
    (4617935073973370880, 2152664002519948660),
    (4617935074510241792, 18285247977048656546),
    (4617935074510241792, 18285247977048656546),
];
/// Loss bits and gradient digest of the fused path (without, with
/// checkpointing) and the reference path (likewise), recorded from the
/// code of 23ee5d2.
const PINNED_PATHS: [(u64, u64); 4] = [
    (4617935073973370880, 2592585422839597886),
    (4617935073973370880, 2592585422839597886),
    (4617935074510241792, 6578302933451725905),
    (4617935074510241792, 6578302933451725905),
];
