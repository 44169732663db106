//! Fine-tuning a trained model at a new length, optionally with a RoPE
//! scaling kept in the forward pass during and after fine-tuning.
//!
//! The recipe of Chen et al. 2023, *Extending Context Window of Large
//! Language Models via Positional Interpolation* (§3): take a model trained
//! at length L, rescale its RoPE positions for the new length L′ (PI:
//! position m ↦ m·L/L′, the `linear` scaling with factor L′/L) and train a
//! few steps at L′. [`finetune`] runs that loop — AdamW, a constant
//! learning rate after an optional linear warm-up, the base run's gradient
//! clipping and weight decay, batches of the task at the new length — with
//! any of the scalings `posenc eval --scaling` knows (`linear`, `ntk`,
//! `dynamic`, `yarn`, each with a factor from the length or a fixed one as
//! in `yarn:2`, [`parse_scaling`]) or none (plain fine-tuning at the new
//! length).
//!
//! The fine-tuned checkpoint records what was done in
//! [`CheckpointMeta::finetune`](crate::train::CheckpointMeta::finetune): the
//! base checkpoint and its run, the new length, the steps, the learning
//! rate and the scaling. A model fine-tuned *with* a scaling has learned to
//! work through it, so [`scaling_at`] (what `posenc eval` uses) applies it by
//! default afterwards; dropping it takes an explicit `none`.
//!
//! The batch of fine-tuning step `s` is drawn from
//! `batch_seed(seed ^ 0xF1AE, s, 5)`, a stream distinct from the base
//! run's (stream 0 of `seed`), where `seed` is the base run's seed unless
//! [`FinetuneOptions::seed`] says otherwise.

use std::path::Path;
use std::sync::atomic::AtomicBool;

pub use crate::checkpoint::{FactorScaling, FinetuneRecord, ScalingSpec, FINETUNE_STREAM};
use crate::config::PeConfig;
use crate::error::LabError;
use crate::optim::AdamW;
use crate::train::{run_loop, Lab, LoopOptions, Summary};
use posenc::rope::ScalingKind;
/// Whether two paths name the same directory (the fine-tune's output is
/// never its base's).
pub use posenc_nn::train::same_dir;

/// Options of [`finetune`].
pub struct FinetuneOptions<'a> {
    /// The new training length (at least the task's minimum length, and
    /// within a learned table).
    pub len: usize,
    /// Optimiser steps.
    pub steps: usize,
    /// Learning rate: constant, after `warmup` steps of linear warm-up.
    pub lr: f64,
    /// Linear warm-up steps (0: constant from the first step; at most
    /// `steps`).
    pub warmup: usize,
    /// The RoPE scaling kept in the forward pass (`None`: plain
    /// fine-tuning). [`scaling_at`] gives the one `posenc finetune
    /// --scaling` means.
    pub scaling: Option<ScalingSpec>,
    /// Seed of the fine-tuning batches (default: the base run's seed; the
    /// batches come from a stream of their own either way).
    pub seed: Option<u64>,
    /// Sequences per step (default: the base run's batch).
    pub batch: Option<usize>,
    /// The base checkpoint's directory, recorded in the fine-tuned one
    /// (and refused as `out`).
    pub base: Option<&'a Path>,
    /// Checkpoint directory (`None`: fine-tune in memory and write
    /// nothing).
    pub out: Option<&'a Path>,
    /// Draw a progress bar (stderr) instead of log lines.
    pub progress: bool,
    /// Print anything at all.
    pub quiet: bool,
    /// Set by a Ctrl-C handler: checkpoint and stop.
    pub stop: Option<&'a AtomicBool>,
    /// Stop (with a checkpoint, as an interrupt would) once this many
    /// fine-tuning steps are done.
    pub pause_at: Option<usize>,
}

impl<'a> FinetuneOptions<'a> {
    /// `steps` steps at `len` with constant learning rate `lr`, no scaling,
    /// in memory and quiet; set the other fields as needed.
    pub fn new(len: usize, steps: usize, lr: f64) -> Self {
        FinetuneOptions {
            len,
            steps,
            lr,
            warmup: 0,
            scaling: None,
            seed: None,
            batch: None,
            base: None,
            out: None,
            progress: false,
            quiet: true,
            stop: None,
            pause_at: None,
        }
    }
}

/// The names `--scaling` takes in the lab.
pub const SCALING_NAMES: &str = "none, linear, ntk, dynamic, yarn";

/// Parses a lab `--scaling`: `none` (`Ok(None)`); a family (`linear` or
/// `pi`, `ntk`, `dynamic`, `yarn`: posenc's [`FactorScaling`]), whose factor
/// [`scaling_at`] derives from the length; or posenc's named form with a
/// fixed factor (`yarn:2`, [`ScalingKind`]'s syntax).
///
/// # Errors
/// [`LabError::Invalid`] for an unknown name (listing the known ones), a
/// bad factor (posenc's message), `model` or an attention method (the
/// lab's models have no scaling of their own and run plain attention).
pub fn parse_scaling(name: &str) -> Result<Option<(FactorScaling, Option<f64>)>, LabError> {
    let name = name.trim();
    if name == "none" {
        return Ok(None);
    }
    if let Some(family) = FactorScaling::from_name(name) {
        return Ok(Some((family, None)));
    }
    let with_factor = name
        .split_once(':')
        .is_some_and(|(k, _)| FactorScaling::from_name(k.trim()).is_some());
    if with_factor {
        let kind: ScalingKind = name
            .parse()
            .map_err(|e: posenc::Error| LabError::Invalid(e.to_string()))?;
        if let Some((family, factor)) = kind.factor_scaling() {
            return Ok(Some((family, Some(factor))));
        }
    }
    Err(LabError::Invalid(format!(
        "unknown scaling {name:?}; known: {SCALING_NAMES} (each but none also with a fixed factor, as in yarn:2)"
    )))
}

/// The scaling to run `lab` with at length `len`, given a command-line
/// `--scaling` (`None`: the flag was not given; the syntax of
/// [`parse_scaling`]).
///
/// - not given: the scaling the checkpoint was fine-tuned with, stretched
///   to `len` ([`ScalingSpec::stretched`]), or none;
/// - `none`: no scaling, even on a model fine-tuned with one;
/// - a kind: that kind with factor `max(1, len / L)` over the training
///   length `L` — or, on a model fine-tuned with a scaling, over that
///   scaling's original length and at least its factor;
/// - a kind with a factor (`yarn:2`): that factor, not stretched, over the
///   same original length.
///
/// # Errors
/// [`LabError::Invalid`] for an unknown name or a factor below 1.
pub fn scaling_at(
    lab: &Lab,
    requested: Option<&str>,
    len: usize,
) -> Result<Option<ScalingSpec>, LabError> {
    let recorded = lab.meta.finetune.as_ref().and_then(|f| f.scaling.as_ref());
    let Some(name) = requested else {
        return Ok(recorded.map(|s| s.stretched(len)));
    };
    let Some((kind, factor)) = parse_scaling(name)? else {
        return Ok(None);
    };
    Ok(Some(match (recorded, factor) {
        (Some(s), None) => ScalingSpec::new(kind, s.factor, s.original_len)?.stretched(len),
        (Some(s), Some(f)) => ScalingSpec::new(kind, f, s.original_len)?,
        (None, None) => ScalingSpec::for_length(kind, len, lab.meta.train.train_len)?,
        (None, Some(f)) => ScalingSpec::new(kind, f, lab.meta.train.train_len)?,
    }))
}

/// Fine-tunes `lab` at a new length (see the [module docs](self)): builds a
/// fresh AdamW, trains `steps` steps of `batch` sequences of `len` tokens
/// with `scaling` in the forward pass, and writes `metrics.jsonl` and a
/// checkpoint to `out` at the end and on interrupt, like
/// [`train`](crate::train::train).
///
/// Afterwards `lab.meta.train` describes the fine-tuning run (training
/// length `len`, `steps`, constant `lr`, the base's seed, which also seeds
/// evaluation), `lab.meta.step` counts fine-tuning steps, and
/// `lab.meta.finetune` records the base and the scaling. An interrupted
/// fine-tune resumes with [`Lab::load_resumable`] and
/// [`train`](crate::train::train).
///
/// # Errors
/// - [`LabError::Invalid`]: `steps` or `batch` 0, `lr` not finite and > 0,
///   `warmup > steps`, `len` below the task's minimum length, a scaling on
///   a model without RoPE, `out` the same directory as `base`;
/// - [`LabError::LengthBeyondTable`]: `len` past a learned position table;
/// - [`LabError::Io`] when the checkpoint cannot be written.
///
/// # Example
/// ```
/// use posenc_lab::config::{Mode, ModelConfig, PeConfig, TrainConfig};
/// use posenc_lab::tasks::{Task, TaskKind};
/// use posenc_lab::train::Lab;
/// use posenc_lab::{finetune, FactorScaling, FinetuneOptions, ScalingSpec};
///
/// let task = Task::new(TaskKind::Copy, 8)?;
/// let model = ModelConfig {
///     mode: Mode::Decoder,
///     vocab_size: task.vocab_size(),
///     num_outputs: task.num_outputs(),
///     d_model: 16,
///     n_layers: 1,
///     n_heads: 2,
///     d_ff: 32,
///     tied: true,
///     pe: PeConfig::parse("rope", 64, 4)?,
/// };
/// let run = TrainConfig {
///     task: TaskKind::Copy,
///     n_symbols: 8,
///     train_len: 8,
///     steps: 1,
///     batch: 4,
///     lr: 1e-3,
///     warmup: 0,
///     min_lr_frac: 0.1,
///     weight_decay: 0.01,
///     grad_clip: 1.0,
///     seed: 0,
///     log_every: 1,
///     corpus: None,
/// };
/// let mut lab = Lab::new(model, run, task)?;
/// // Position Interpolation: fine-tune at 16 with positions halved.
/// let mut o = FinetuneOptions::new(16, 2, 1e-3);
/// o.scaling = Some(ScalingSpec::for_length(FactorScaling::Linear, 16, 8)?);
/// let summary = finetune(&mut lab, &o)?;
/// assert_eq!(summary.steps, 2);
/// assert_eq!(lab.meta.train.train_len, 16);
/// let record = lab.meta.finetune.as_ref().unwrap();
/// assert_eq!((record.len, record.base_train.train_len), (16, 8));
/// assert_eq!(record.scaling.as_ref().unwrap().factor, 2.0);
/// # Ok::<(), posenc_lab::LabError>(())
/// ```
pub fn finetune(lab: &mut Lab, o: &FinetuneOptions) -> Result<Summary, LabError> {
    let bad = |m: String| Err(LabError::Invalid(m));
    if o.steps == 0 {
        return bad("fine-tuning needs at least 1 step".into());
    }
    if o.warmup > o.steps {
        return bad(format!(
            "warm-up ({}) must not exceed the fine-tuning steps ({})",
            o.warmup, o.steps
        ));
    }
    let min = lab.task.min_length();
    if o.len < min {
        return bad(format!(
            "length {} is too short for task {} (minimum {min})",
            o.len,
            lab.task.kind.name()
        ));
    }
    if let PeConfig::Learned { max_positions } = lab.meta.model.pe {
        if o.len > max_positions {
            return Err(LabError::LengthBeyondTable {
                action: "fine-tune",
                len: o.len,
                rows: max_positions,
            });
        }
    }
    lab.model.check_length(o.len)?;
    if let Some(s) = &o.scaling {
        ScalingSpec::new(s.kind, s.factor, s.original_len)?;
        s.build(&lab.meta.model)?;
    }
    if let (Some(base), Some(out)) = (o.base, o.out) {
        if same_dir(base, out) {
            return bad(format!(
                "the fine-tuned checkpoint would overwrite its base {}: choose another output directory",
                base.display()
            ));
        }
    }
    let base_train = lab.meta.train.clone();
    let mut run = base_train.clone();
    run.train_len = o.len;
    run.steps = o.steps;
    run.batch = o.batch.unwrap_or(base_train.batch);
    run.lr = o.lr;
    run.warmup = o.warmup;
    // Constant after the warm-up: the cosine decays from lr to lr.
    run.min_lr_frac = 1.0;
    run.log_every = (o.steps / 50).max(1);
    run.validate()?;
    let record = FinetuneRecord {
        base: o.base.map(|p| {
            p.canonicalize()
                .unwrap_or_else(|_| p.to_path_buf())
                .display()
                .to_string()
        }),
        base_step: lab.meta.step,
        base_train,
        base_finetune: lab.meta.finetune.take().map(Box::new),
        len: o.len,
        steps: o.steps,
        lr: o.lr,
        warmup: o.warmup,
        batch: run.batch,
        seed: o.seed.unwrap_or(run.seed),
        scaling: o.scaling.clone(),
    };
    lab.meta.train = run;
    lab.meta.step = 0;
    lab.meta.finetune = Some(record);
    let mut opt = AdamW::new(lab.params(), lab.meta.train.weight_decay)?;
    run_loop(
        lab,
        &mut opt,
        &LoopOptions {
            out: o.out,
            progress: o.progress,
            quiet: o.quiet,
            stop: o.stop,
            pause_at: o.pause_at,
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scaling_names_parse_and_specs_validate() {
        for n in SCALING_NAMES.split(", ") {
            let k = parse_scaling(n).unwrap();
            assert_eq!(
                k.map_or("none", |(k, f)| {
                    assert_eq!(f, None);
                    k.name()
                }),
                n
            );
        }
        assert_eq!(
            parse_scaling("pi").unwrap(),
            Some((FactorScaling::Linear, None))
        );
        assert_eq!(
            parse_scaling(" yarn:2.5 ").unwrap(),
            Some((FactorScaling::Yarn, Some(2.5)))
        );
        for bad in [
            "magic",
            "model",
            "rerope:8",
            "dca:64:16+yarn:2",
            "magic:2",
            "yarn:0",
        ] {
            let e = parse_scaling(bad).unwrap_err().to_string();
            assert!(e.contains(bad.split('+').next().unwrap()), "{e}");
        }
        let e = parse_scaling("magic").unwrap_err().to_string();
        assert!(e.contains("magic") && e.contains("yarn"), "{e}");
        assert!(parse_scaling("yarn:0")
            .unwrap_err()
            .to_string()
            .contains("factor"));
        assert!(ScalingSpec::new(FactorScaling::Linear, 0.5, 8).is_err());
        assert!(ScalingSpec::new(FactorScaling::Linear, f64::NAN, 8).is_err());
        assert!(ScalingSpec::new(FactorScaling::Linear, 2.0, 0).is_err());
        let s = ScalingSpec::for_length(FactorScaling::Linear, 64, 32).unwrap();
        assert_eq!(s.factor, 2.0);
        assert_eq!(
            ScalingSpec::for_length(FactorScaling::Ntk, 16, 32)
                .unwrap()
                .factor,
            1.0
        );
        // Stretching keeps the factor within what it covers, grows it past.
        assert_eq!(s.stretched(48).factor, 2.0);
        assert_eq!(s.stretched(128).factor, 4.0);
        let json = serde_json::to_string(&s).unwrap();
        assert!(json.contains("\"linear\""), "{json}");
        assert_eq!(serde_json::from_str::<ScalingSpec>(&json).unwrap(), s);
    }
}
