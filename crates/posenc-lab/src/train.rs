//! Training, evaluation and checkpoints.
//!
//! Deterministic: the batch of step `s` is drawn from a generator seeded by
//! `(seed, s)`, and the weights from `seed`, so the same seed and thread
//! count give the same losses, and a resumed run continues exactly.
//!
//! The training loop is here ([`train`], [`time_steps`]); the model with its
//! parameters and checkpoints ([`Lab`], [`make_batch`], [`load_task`]) and
//! the evaluations ([`evaluate`], [`shuffle_test`], [`probe`], from
//! [`crate::eval`]) are re-exported from the modules that hold them.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use candle_core::Device;
use posenc::analysis::SplitMix64;
use posenc_nn::train::{progress_line, show_progress, RunClock};
use serde::{Deserialize, Serialize};

pub use crate::checkpoint::{batch_seed, CheckpointMeta};
use crate::error::LabError;
pub use crate::eval::{
    evaluate, micro_batch, probe, scored_chars, shuffle_test, EvalResult, ProbeResult,
    ShuffleResult, EVAL_MEMORY_BUDGET,
};
pub use crate::fsio::write_atomic;
pub use crate::lab::{
    load_task, load_task_in, loss_and_accuracy, loss_and_accuracy_with, make_batch, Batch, Lab,
    MICRO_BATCHES, TOKENIZER_FILE,
};
use crate::optim::AdamW;

/// One line of `metrics.jsonl` (with the accuracy of the logging
/// window's batches).
pub use posenc_nn::train::Metrics;

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Steps completed.
    pub steps: usize,
    /// Final training loss (mean over the last logging window, or over the
    /// steps since the last log line when interrupted).
    pub final_loss: f64,
    /// Final training accuracy (mean of the last logged window).
    pub final_accuracy: f64,
    /// Wall-clock seconds of this invocation.
    pub seconds: f64,
    /// Mean tokens per second.
    pub tokens_per_s: f64,
    /// Whether the run was interrupted (checkpoint written).
    pub interrupted: bool,
}

/// Options of [`train`].
pub struct TrainOptions<'a> {
    /// Checkpoint directory.
    pub out: &'a Path,
    /// Draw a progress bar (stderr) instead of log lines.
    pub progress: bool,
    /// Print anything at all.
    pub quiet: bool,
    /// Set by a Ctrl-C handler: checkpoint and stop.
    pub stop: Option<&'a AtomicBool>,
    /// Stop (with a checkpoint, as an interrupt would) once this many steps
    /// are done; the schedule still runs to `steps`.
    pub pause_at: Option<usize>,
}

impl<'a> TrainOptions<'a> {
    /// Silent training to the last step, checkpointing into `out`: no
    /// progress bar, no log lines, no interrupt flag, no pause.
    pub fn quiet(out: &'a Path) -> Self {
        TrainOptions {
            out,
            progress: false,
            quiet: true,
            stop: None,
            pause_at: None,
        }
    }
}

/// Trains `lab` until `lab.meta.train.steps`, from its current step,
/// writing `metrics.jsonl` and a checkpoint at the end (and on interrupt).
///
/// A fine-tuned checkpoint ([`CheckpointMeta::finetune`] set) continues its
/// fine-tuning: the same RoPE scaling in the forward pass and the same data
/// stream as [`finetune`](crate::finetune::finetune), so resuming an
/// interrupted fine-tune is loading it with [`Lab::load_resumable`] and
/// calling this.
pub fn train(lab: &mut Lab, opt: &mut AdamW, o: &TrainOptions) -> Result<Summary, LabError> {
    run_loop(
        lab,
        opt,
        &LoopOptions {
            out: Some(o.out),
            progress: o.progress,
            quiet: o.quiet,
            stop: o.stop,
            pause_at: o.pause_at,
        },
    )
}

/// [`TrainOptions`] with an optional output directory (`None`: train in
/// memory, write nothing).
pub(crate) struct LoopOptions<'a> {
    pub out: Option<&'a Path>,
    pub progress: bool,
    pub quiet: bool,
    pub stop: Option<&'a AtomicBool>,
    pub pause_at: Option<usize>,
}

/// The training loop of [`train`] and [`finetune`](crate::finetune::finetune).
pub(crate) fn run_loop(
    lab: &mut Lab,
    opt: &mut AdamW,
    o: &LoopOptions,
) -> Result<Summary, LabError> {
    let device = Device::Cpu;
    let cfg = lab.meta.train.clone();
    // A fine-tune keeps its scaling in the forward pass and draws its batches
    // from its own stream.
    let ft = lab.meta.finetune.clone();
    let scaling = match ft.as_ref().and_then(|f| f.scaling.as_ref()) {
        Some(s) => Some(s.build(&lab.meta.model)?),
        None => None,
    };
    let step_seed = |step: usize| match &ft {
        Some(f) => f.batch_seed(step),
        None => batch_seed(cfg.seed, step as u64, 0),
    };
    let mut metrics_text = String::new();
    if let Some(out) = o.out {
        std::fs::create_dir_all(out).map_err(|e| LabError::Io {
            path: out.to_path_buf(),
            source: e,
        })?;
        // On resume, drop metric lines past the checkpoint's step so the
        // file matches the run exactly.
        let kept: Vec<String> = std::fs::read_to_string(out.join("metrics.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter(|l| {
                serde_json::from_str::<Metrics>(l)
                    .map(|m| m.step <= lab.meta.step)
                    .unwrap_or(false)
            })
            .map(str::to_owned)
            .collect();
        metrics_text = kept.join("\n");
        if !metrics_text.is_empty() {
            metrics_text.push('\n');
        }
    }
    let start_step = lab.meta.step;
    let clock = RunClock::start(start_step, cfg.steps, (cfg.batch * cfg.train_len) as f64);
    let (mut win_loss, mut win_acc, mut win_n) = (0.0, 0.0, 0usize);
    let (mut last_loss, mut last_acc) = (f64::NAN, f64::NAN);
    let mut interrupted = false;
    let tty = o.progress && std::io::stderr().is_terminal();
    while lab.meta.step < cfg.steps {
        if o.stop.is_some_and(|s| s.load(Ordering::SeqCst))
            || o.pause_at.is_some_and(|p| lab.meta.step >= p)
        {
            interrupted = true;
            break;
        }
        let step = lab.meta.step;
        let mut rng = SplitMix64::new(step_seed(step));
        let batch = make_batch(&lab.task, &mut rng, cfg.batch, cfg.train_len, &device)?;
        let (loss_v, acc, mut grads) = lab.loss_and_grads(&batch, scaling.as_ref())?;
        if !loss_v.is_finite() {
            return Err(LabError::Diverged { step, loss: loss_v });
        }
        let lr = cfg.lr_at(step);
        let gnorm = lab.optimizer_step(opt, &mut grads, lr)?;
        drop(grads);
        lab.meta.step += 1;
        win_loss += loss_v;
        win_acc += acc;
        win_n += 1;
        let done = lab.meta.step;
        if done.is_multiple_of(cfg.log_every) || done == cfg.steps {
            let elapsed = clock.elapsed();
            let tps = clock.tokens_per_s(done, elapsed);
            (last_loss, last_acc) = (win_loss / win_n as f64, win_acc / win_n as f64);
            let m = Metrics {
                step: done,
                loss: last_loss,
                accuracy: Some(last_acc),
                lr,
                grad_norm: gnorm,
                tokens_per_s: tps,
                elapsed_s: elapsed,
            };
            if o.out.is_some() {
                m.push_line(&mut metrics_text);
            }
            (win_loss, win_acc, win_n) = (0.0, 0.0, 0);
            if !o.quiet {
                let figures = format!(
                    "loss {last_loss:.4} acc {:.1}% {:.1}k tok/s",
                    last_acc * 100.0,
                    tps / 1000.0
                );
                let line = progress_line(done, cfg.steps, &figures, clock.eta(done, elapsed));
                show_progress(&line, tty);
            }
        }
    }
    if tty && !o.quiet {
        eprintln!();
    }
    if win_n > 0 {
        // Steps since the last log line (an interrupted run).
        last_loss = win_loss / win_n as f64;
        last_acc = win_acc / win_n as f64;
    }
    if let Some(out) = o.out {
        write_atomic(&out.join("metrics.jsonl"), metrics_text.as_bytes())?;
        lab.save(out, Some(opt))?;
    }
    let seconds = clock.elapsed();
    Ok(Summary {
        steps: lab.meta.step,
        final_loss: last_loss,
        final_accuracy: last_acc,
        seconds,
        tokens_per_s: clock.tokens_per_s(lab.meta.step, seconds),
        interrupted,
    })
}

/// Times `steps` full training steps (batch, forward, backward, clipping,
/// AdamW) without writing anything; returns the seconds of each step.
pub fn time_steps(lab: &mut Lab, opt: &mut AdamW, steps: usize) -> Result<Vec<f64>, LabError> {
    let cfg = lab.meta.train.clone();
    let mut out = Vec::with_capacity(steps);
    for s in 0..steps {
        let t0 = Instant::now();
        let mut rng = SplitMix64::new(batch_seed(cfg.seed, s as u64, 5));
        let batch = make_batch(&lab.task, &mut rng, cfg.batch, cfg.train_len, &Device::Cpu)?;
        let (_, _, mut grads) = lab.loss_and_grads(&batch, None)?;
        lab.optimizer_step(opt, &mut grads, cfg.lr_at(s))?;
        out.push(t0.elapsed().as_secs_f64());
    }
    Ok(out)
}
