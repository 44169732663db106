//! Small models, runs and scratch directories shared by the lab's tests.
#![allow(dead_code)] // each test binary uses its own subset

use std::path::PathBuf;

use posenc_lab::config::{Mode, ModelConfig, PeConfig, TrainConfig};
use posenc_lab::tasks::{Task, TaskKind};

/// A fresh (removed) scratch directory `PREFIX-NAME-PID` under the system's
/// temporary directory.
pub fn tmp_dir(prefix: &str, name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("{prefix}-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    d
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
