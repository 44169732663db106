//! Small models, runs and scratch directories shared by the lab's tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;

use posenc_lab::config::{Mode, ModelConfig, PeConfig, TrainConfig};
use posenc_lab::optim::AdamW;
use posenc_lab::tasks::{Task, TaskKind};
use posenc_lab::train::Lab;

/// The path `NAME` (not created) in a new scratch directory
/// `PREFIX-NAME-XXXXXX` under the system's temporary directory, and the
/// guard that removes that directory with all it holds when dropped (keep
/// it for as long as the path is used).
pub fn tmp_dir(prefix: &str, name: &str) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::Builder::new()
        .prefix(&format!("{prefix}-{name}-"))
        .tempdir()
        .unwrap();
    let d = dir.path().join(name);
    (dir, d)
}

/// [`tmp_dir`], created (empty).
pub fn fresh_dir(prefix: &str, name: &str) -> (tempfile::TempDir, PathBuf) {
    let (dir, d) = tmp_dir(prefix, name);
    std::fs::create_dir(&d).unwrap();
    (dir, d)
}

/// The tests' model: 2 layers, d_model 32, 4 heads, tied head.
pub fn model(mode: Mode, task: &Task, pe: PeConfig) -> ModelConfig {
    ModelConfig {
        mode,
        vocab_size: task.vocab_size(),
        num_outputs: task.num_outputs(),
        d_model: 32,
        n_layers: 2,
        n_heads: 4,
        d_ff: 64,
        tied: true,
        pe,
    }
}

/// The tests' run: batch 16, lr 3e-3 with up to 10 warm-up steps, 8 symbols.
pub fn run(task: TaskKind, steps: usize, len: usize, seed: u64) -> TrainConfig {
    TrainConfig {
        task,
        n_symbols: 8,
        train_len: len,
        steps,
        batch: 16,
        lr: 3e-3,
        warmup: 10.min(steps),
        min_lr_frac: 0.1,
        weight_decay: 0.01,
        grad_clip: 1.0,
        seed,
        log_every: 5,
        corpus: None,
    }
}

/// A lab of [`model`] in `mode` with `pe` on `task`, running `run`.
pub fn new_lab(mode: Mode, task: Task, pe: PeConfig, run: TrainConfig) -> posenc_lab::train::Lab {
    posenc_lab::train::Lab::new(model(mode, &task, pe), run, task).unwrap()
}

/// The encoding `name` at up to 64 positions with 4 heads.
pub fn pe(name: &str) -> PeConfig {
    PeConfig::parse(name, 64, 4).unwrap()
}

/// One step of `lab` at learning rate 3e-3 on a batch of `batch` windows of
/// `len` tokens drawn from `seed`: the loss before it.
pub fn train_step(lab: &Lab, opt: &mut AdamW, seed: u64, batch: usize, len: usize) -> f32 {
    let mut rng = posenc::analysis::SplitMix64::new(seed);
    let b =
        posenc_lab::train::make_batch(&lab.task, &mut rng, batch, len, &candle_core::Device::Cpu)
            .unwrap();
    let (loss, _) = lab.batch_loss(&b, None).unwrap();
    let l = loss.to_scalar::<f32>().unwrap();
    let mut g = loss.backward().unwrap();
    lab.optimizer_step(opt, &mut g, 3e-3).unwrap();
    l
}

/// The parameters of `lab` by name, in name order, as `f32` values.
pub fn sorted_params(lab: &Lab) -> Vec<(String, Vec<f32>)> {
    let mut v: Vec<(String, Vec<f32>)> = lab
        .params()
        .into_iter()
        .map(|(n, v)| {
            (
                n,
                v.as_tensor()
                    .flatten_all()
                    .unwrap()
                    .to_vec1::<f32>()
                    .unwrap(),
            )
        })
        .collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}
