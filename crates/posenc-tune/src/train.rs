//! The fine-tuning loop: LoRA (and optionally LongLoRA's embeddings and
//! norms) on a pretrained decoder, at a new context length, on the CPU.
//!
//! Each step takes [`FinetuneConfig::batch`] windows of the text's first
//! 90% ([`crate::data::Windows`], plain windows of the target length or
//! PoSE's skipped ids), runs them one after another (one window's
//! activations alive at a time), averages the window losses' gradients,
//! clips their global norm to [`FinetuneConfig::grad_clip`] (1.0) and takes
//! one AdamW step (posenc-nn's [`AdamW`]: decoupled weight decay on
//! matrices only, here with torch's default betas `(0.9, 0.999)` and
//! `ε = 1e-8`, as `torch.optim.AdamW` in YaRN's `finetune.py`).
//!
//! The learning rate follows transformers' schedulers as YaRN's
//! `finetune.py` uses them (Peng et al. 2023, *YaRN: Efficient Context
//! Window Extension of Large Language Models*; its default is `linear`):
//! step `k` (from 0) runs at `lr · λ(k)` with a linear warm-up `λ(k) =
//! k / W` for `k < W`, then
//!
//! - `linear` (`get_linear_schedule_with_warmup`): `max(0, (S − k) / (S −
//!   W))`;
//! - `cosine` (`get_cosine_schedule_with_warmup`): `max(0, ½(1 + cos(π·(k
//!   − W)/(S − W))))`;
//! - `constant` (`get_constant_schedule_with_warmup`): 1,
//!
//! over `S` steps (denominators at least 1), so a warm-up's first step has
//! rate 0, as with transformers.
//!
//! **Determinism.** Everything random is drawn from the seed: the LoRA
//! factors' initial values ([`TrainableDecoder::new`]), each step's windows
//! ([`crate::data::step_seed`]) and each step's dropout masks (reseeded per
//! step). A run is the same bit for bit for a seed and a thread count, and
//! a resumed run equals an uninterrupted one (`tests/train.rs`).
//!
//! **Checkpoints** go to the output directory every
//! [`FinetuneConfig::checkpoint_every`] steps, at the end, and when the
//! stop flag is set (Ctrl-C): the adapter in PEFT's layout
//! ([`crate::peft`], loadable by PEFT as it is), `optimizer.safetensors`
//! (AdamW's moments and step count), `metrics.jsonl`, and `finetune.json`
//! (the run and its step), written last. Each file goes through a
//! temporary file and a rename, and each records the step: a checkpoint
//! torn by a crash between two renames is refused on resume, as the lab's
//! checkpoints are.

use std::io::IsTerminal;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor};
use posenc_models::{Decoder, Scaling, ScalingKind};
use posenc_nn::optim::AdamW;
use posenc_nn::train::{progress_line, show_progress, RunClock};
use serde::{Deserialize, Serialize};

use crate::data::{step_seed, TrainText, WindowPlan, Windows};
use crate::error::{Result, TuneError};
use crate::lora::LoraConfig;
use crate::model::{Trainable, TrainableDecoder};
use crate::peft::{self, Adapter};

/// The run's record in a checkpoint directory.
pub const RECORD_FILE: &str = "finetune.json";
/// AdamW's state in a checkpoint directory.
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
/// One JSON line per logged step.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// Largest `finetune.json` read.
const MAX_RECORD_BYTES: u64 = 1 << 20;
/// Mixed into the seed of each step's dropout masks.
const DROPOUT_SALT: u64 = 0xD0_0D;

/// Most optimiser steps of one run.
pub const MAX_STEPS: usize = 10_000_000;
/// Most windows per step.
pub const MAX_BATCH: usize = 4096;

/// A learning-rate schedule after the warm-up (transformers' names).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Schedule {
    /// Linear decay to 0 at the last step (YaRN's default).
    Linear,
    /// Half a cosine to 0 at the last step.
    Cosine,
    /// Constant.
    Constant,
}

impl std::str::FromStr for Schedule {
    type Err = TuneError;

    fn from_str(s: &str) -> Result<Schedule> {
        match s.trim() {
            "linear" => Ok(Schedule::Linear),
            "cosine" => Ok(Schedule::Cosine),
            "constant" => Ok(Schedule::Constant),
            other => Err(TuneError::Config(format!(
                "unknown schedule {other:?}: use linear, cosine or constant"
            ))),
        }
    }
}

impl Schedule {
    /// `λ(step)` for `steps` steps with `warmup` warm-up steps (see the
    /// [module docs](self)).
    pub fn factor(self, step: usize, steps: usize, warmup: usize) -> f64 {
        if step < warmup {
            return step as f64 / warmup.max(1) as f64;
        }
        let rest = (steps.saturating_sub(warmup)).max(1) as f64;
        let progress = (step - warmup) as f64 / rest;
        match self {
            Schedule::Linear => ((steps as f64 - step as f64) / rest).max(0.0),
            Schedule::Cosine => (0.5 * (1.0 + (std::f64::consts::PI * progress).cos())).max(0.0),
            Schedule::Constant => 1.0,
        }
    }
}

/// A fine-tuning run's settings (saved in `finetune.json`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FinetuneConfig {
    /// The RoPE scaling trained through (posenc-models' syntax: `none`,
    /// `model`, `linear:F`, `dynamic:F`, `yarn:F`).
    pub scaling: String,
    /// The training windows.
    pub plan: WindowPlan,
    /// Optimiser steps.
    pub steps: usize,
    /// Windows per step.
    pub batch: usize,
    /// Peak learning rate.
    pub lr: f64,
    /// Linear warm-up steps.
    pub warmup: usize,
    /// The decay after the warm-up.
    pub schedule: Schedule,
    /// AdamW's decoupled weight decay (matrices only).
    pub weight_decay: f64,
    /// Global gradient-norm clipping (0: none).
    pub grad_clip: f64,
    /// Seed of the adapters' initial values, the windows and dropout.
    pub seed: u64,
    /// The adapters.
    pub lora: LoraConfig,
    /// Base parameters trained beside them.
    pub trainable: Trainable,
    /// Checkpoint every this many steps (0: only at the end and on stop).
    pub checkpoint_every: usize,
    /// Activation checkpointing per layer
    /// ([`TrainableDecoder::loss_and_gradients`]): one layer's activations
    /// live at a time, for a second forward pass of each layer. The same
    /// gradients up to the order of floating-point sums.
    #[serde(default)]
    pub checkpoint_layers: bool,
}

impl FinetuneConfig {
    /// `steps` steps of `plan` at learning rate `lr`, with YaRN's
    /// `finetune.py` defaults otherwise: linear schedule, 20 warm-up steps
    /// (fewer when the run is shorter: at most a tenth of it), weight decay
    /// 0.01 (torch's AdamW default), clipping at 1.0, one window per step,
    /// PEFT's default adapters, no scaling, seed 0, a checkpoint at the
    /// end only.
    pub fn new(plan: WindowPlan, steps: usize, lr: f64) -> FinetuneConfig {
        FinetuneConfig {
            scaling: "none".into(),
            plan,
            steps,
            batch: 1,
            lr,
            warmup: 20.min(steps / 10),
            schedule: Schedule::Linear,
            weight_decay: 0.01,
            grad_clip: 1.0,
            seed: 0,
            lora: LoraConfig::default(),
            trainable: Trainable::default(),
            checkpoint_every: 0,
            checkpoint_layers: false,
        }
    }

    /// The checks that need no model: lengths ([`WindowPlan::validate`]),
    /// steps in `1..=MAX_STEPS`, batch in `1..=MAX_BATCH`, a learning rate
    /// finite and in `(0, 1]`, warm-up at most the steps, weight decay in
    /// `[0, 1)`, clipping finite and ≥ 0, the checkpoint interval at most
    /// the steps, the adapters' own checks, and a scaling that training can
    /// run and transformers can load ([`FinetuneConfig::parsed_scaling`]).
    ///
    /// # Errors
    /// [`TuneError::Config`], [`TuneError::PoseWindow`],
    /// [`TuneError::Scaling`], the adapters' errors.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(TuneError::Config(m));
        self.plan.validate()?;
        if !(1..=MAX_STEPS).contains(&self.steps) {
            return bad(format!("--steps must be in 1..={MAX_STEPS}"));
        }
        if !(1..=MAX_BATCH).contains(&self.batch) {
            return bad(format!("--batch must be in 1..={MAX_BATCH}"));
        }
        if !(self.lr.is_finite() && self.lr > 0.0 && self.lr <= 1.0) {
            return bad(format!("--lr {} must be in (0, 1]", self.lr));
        }
        if self.warmup > self.steps {
            return bad(format!(
                "--warmup {} must not exceed --steps {}",
                self.warmup, self.steps
            ));
        }
        if !(self.weight_decay.is_finite() && (0.0..1.0).contains(&self.weight_decay)) {
            return bad(format!(
                "--weight-decay {} must be in [0, 1)",
                self.weight_decay
            ));
        }
        if !(self.grad_clip.is_finite() && self.grad_clip >= 0.0) {
            return bad(format!(
                "--clip {} must be a finite number >= 0",
                self.grad_clip
            ));
        }
        if self.checkpoint_every > self.steps {
            return bad(format!(
                "--checkpoint-every {} must not exceed --steps {}",
                self.checkpoint_every, self.steps
            ));
        }
        self.lora.validate()?;
        self.parsed_scaling()?;
        Ok(())
    }

    /// The scaling, parsed: `none`, `model`, `linear:F`, `dynamic:F` or
    /// `yarn:F` — the scalings transformers' `rope_type`s can carry in a
    /// merged checkpoint's `config.json` (`ntk:F` has none) — and no
    /// attention method (those are training-free, for inference).
    ///
    /// # Errors
    /// [`TuneError::Scaling`], posenc-models' parse errors.
    pub fn parsed_scaling(&self) -> Result<Scaling> {
        let s: Scaling = self.scaling.parse()?;
        if s.method.is_some() || matches!(s.kind, ScalingKind::Ntk(_)) {
            return Err(TuneError::Scaling(s.name));
        }
        Ok(s)
    }

    /// The learning rate of step `step` (from 0).
    pub fn lr_at(&self, step: usize) -> f64 {
        self.lr * self.schedule.factor(step, self.steps, self.warmup)
    }
}

/// What `finetune.json` holds: the run, its step, and what it was run on.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RunRecord {
    /// The settings.
    pub config: FinetuneConfig,
    /// Steps completed.
    pub step: usize,
    /// The base model as given on the command line.
    pub model: String,
    /// The tokenizer file given on the command line, if any (else the
    /// model's own).
    #[serde(default)]
    pub tokenizer: Option<String>,
    /// A hash of the base model's weights (a resume on another model is
    /// refused).
    pub model_hash: String,
    /// The text as given, if from a file (`None`: the built-in text of the
    /// command line, *Pride and Prejudice*).
    pub text: Option<String>,
    /// Tokens of its training part (its first 90%).
    pub train_tokens: usize,
    /// Tokens held out (its last 10%, never read by training).
    pub held_out_tokens: usize,
    /// A hash of the training tokens (a resume on another text or
    /// tokenizer is refused).
    pub text_hash: String,
    /// The posenc-tune version that wrote it.
    pub version: String,
}

/// One line of `metrics.jsonl` (the step's own loss; no accuracy).
pub use posenc_nn::train::Metrics;

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Summary {
    /// Steps completed.
    pub steps: usize,
    /// Loss of the last step run (NaN if none ran).
    pub final_loss: f64,
    /// Mean loss of the steps this invocation ran.
    pub mean_loss: f64,
    /// Wall-clock seconds of this invocation.
    pub seconds: f64,
    /// Training tokens per second.
    pub tokens_per_s: f64,
    /// Whether the run stopped early (stop flag or pause), with a
    /// checkpoint.
    pub interrupted: bool,
}

/// Options of [`Finetune::run`].
#[derive(Default)]
pub struct RunOptions<'a> {
    /// Checkpoint directory (`None`: train in memory, write nothing).
    pub out: Option<&'a Path>,
    /// Print progress on stderr (a line rewritten in place on a terminal).
    pub progress: bool,
    /// Set by a Ctrl-C handler: checkpoint and stop after the step.
    pub stop: Option<&'a AtomicBool>,
    /// Stop (with a checkpoint, as an interrupt) once this many steps are
    /// done.
    pub pause_at: Option<usize>,
    /// Set to the step count after every step (for a watcher on another
    /// thread: the Python package's progress).
    pub done: Option<&'a std::sync::atomic::AtomicUsize>,
}

/// A rough upper estimate of a training step's peak bytes on `cfg`'s model
/// with windows of `window` tokens: the loaded model and the trainable
/// copy of its weights (`f32`, twice [`posenc_models::llama::weight_bytes`]),
/// every activation the backward pass keeps and about as much again for
/// their gradients (per token and layer: the residual stream and norms,
/// q, k, v before and after the rotation, the attention output, the
/// SwiGLU's four `I`-wide products), the logits with their softmax and
/// gradient (four `V`-wide rows per token), and one weight-sized gradient
/// of the largest frozen matrix (candle forms it; see the crate docs), and
/// the attention backward's partial query gradients
/// ([`posenc::kernels::attention::backward_extra_floats`]).
/// Trained parameters and AdamW's moments are counted four times over
/// (values, gradient, two moments) when `trainable` includes the
/// embedding. With `checkpoint_layers`, the activations are one layer's
/// plus every layer's input `(T, D)`, and the logits [`HEAD_CHUNK`] rows'.
///
/// [`HEAD_CHUNK`]: crate::model::HEAD_CHUNK
pub fn estimate_train_bytes(
    cfg: &posenc_models::DecoderConfig,
    window: usize,
    trainable: Trainable,
    checkpoint_layers: bool,
) -> u64 {
    let t = window as u64;
    let d = cfg.hidden_size as u64;
    let q = (cfg.num_heads * cfg.head_dim) as u64;
    let kv = (cfg.num_kv_heads * cfg.head_dim) as u64;
    let i = cfg.intermediate_size as u64;
    let v = cfg.vocab_size as u64;
    let layers = cfg.num_layers as u64;
    let per_token_layer = 8 * d + 3 * q + 3 * kv + 4 * i;
    let (activations, logit_rows) = if checkpoint_layers {
        let rows = (crate::model::HEAD_CHUNK as u64).min(t);
        (2 * t * per_token_layer + t * layers * d + 2 * t * d, rows)
    } else {
        (2 * t * layers * per_token_layer, t)
    };
    let logits = 4 * logit_rows * v;
    let largest = (v * d).max(i * d).max(q * d);
    let embed = if trainable.embed { 4 * v * d } else { 0 };
    let dims = posenc::kernels::attention::Dims {
        batch: 1,
        q_heads: cfg.num_heads,
        kv_heads: cfg.num_kv_heads,
        q_len: window,
        k_len: window,
        head_dim: cfg.head_dim,
    };
    let backward = posenc::kernels::attention::backward_extra_floats(dims) as u64;
    2 * posenc_models::llama::weight_bytes(cfg)
        + 4 * (activations + logits + largest + embed + backward)
}

/// Refuses a training window whose estimated peak
/// ([`estimate_train_bytes`]) is over `budget` bytes (default: the
/// available memory), before anything is loaded.
///
/// # Errors
/// [`posenc_models::ModelError::TooLong`] (as [`TuneError::Model`]).
pub fn check_train_memory(
    cfg: &posenc_models::DecoderConfig,
    window: usize,
    trainable: Trainable,
    checkpoint_layers: bool,
    budget: Option<u64>,
) -> Result<()> {
    let need = estimate_train_bytes(cfg, window, trainable, checkpoint_layers);
    let (budget, why) = match budget {
        Some(b) => (b, "the budget given".to_string()),
        None => match posenc_models::available_memory() {
            Some(b) => (
                b,
                if checkpoint_layers {
                    "MemAvailable in /proc/meminfo".into()
                } else {
                    "MemAvailable in /proc/meminfo; training keeps every activation \
                     (--checkpoint-layers keeps one layer's)"
                        .into()
                },
            ),
            None => (
                16 << 30,
                "a default of 16 GB: available memory unknown".into(),
            ),
        },
    };
    if need > budget {
        return Err(posenc_models::ModelError::TooLong {
            len: window,
            need_mb: need >> 20,
            budget_mb: budget >> 20,
            why,
        }
        .into());
    }
    Ok(())
}

/// A 64-bit hash of a stream of words (SplitMix64's finaliser over a
/// running state), as 16 hex digits.
fn hash_words(words: impl Iterator<Item = u32>) -> String {
    let mut h: u64 = 0x9E37_79B9_7F4A_7C15;
    for w in words {
        h = (h ^ w as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        h ^= h >> 29;
    }
    format!("{h:016x}")
}

/// A checkpoint file's step in words: `step N`, or that it records none.
fn stepped(step: Option<usize>) -> String {
    match step {
        Some(s) => format!("step {s}"),
        None => "no recorded step".into(),
    }
}

/// The hash of a model's weights recorded in [`RunRecord::model_hash`].
pub fn model_hash(base: &Decoder) -> String {
    let weights = base.named_weights();
    hash_words(
        weights
            .iter()
            .flat_map(|w| w.data.iter().map(|x| x.to_bits())),
    )
}

/// The hash of a training text recorded in [`RunRecord::text_hash`].
pub fn text_hash(text: &TrainText) -> String {
    hash_words(text.tokens().iter().copied())
}

/// What a run is trained on, as named on the command line (recorded in
/// `finetune.json`, so that `--resume` finds them again).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Sources {
    /// The base model (a GGUF file or a checkpoint directory).
    pub model: String,
    /// A tokenizer file, if not the model's own.
    pub tokenizer: Option<String>,
    /// The text file (`None`: a built-in text).
    pub text: Option<String>,
}

/// A fine-tuning run in progress (see the [module docs](self)).
pub struct Finetune {
    record: RunRecord,
    model: TrainableDecoder,
    windows: Windows,
    opt: AdamW,
    metrics: Vec<Metrics>,
}

impl std::fmt::Debug for Finetune {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Finetune")
            .field("record", &self.record)
            .finish()
    }
}

impl Finetune {
    /// A new run of `config` on `base` and `text` (named as `sources`
    /// says in the record): fresh adapters from the seed, the scaling's
    /// RoPE, a fresh AdamW.
    ///
    /// # Errors
    /// [`FinetuneConfig::validate`]'s; the adapters' rank against the
    /// model; [`TuneError::TextTooShort`] when the training part is shorter
    /// than a window.
    pub fn new(
        base: &Decoder,
        text: TrainText,
        config: FinetuneConfig,
        sources: Sources,
    ) -> Result<Finetune> {
        config.validate()?;
        config.lora.validate_for(base.config())?;
        let record = RunRecord {
            step: 0,
            model: sources.model,
            tokenizer: sources.tokenizer,
            model_hash: model_hash(base),
            text: sources.text,
            train_tokens: text.len(),
            held_out_tokens: text.held_out(),
            text_hash: text_hash(&text),
            version: env!("CARGO_PKG_VERSION").into(),
            config,
        };
        Self::build(base, text, record)
    }

    fn build(base: &Decoder, text: TrainText, record: RunRecord) -> Result<Finetune> {
        let c = &record.config;
        let windows = Windows::new(text, c.plan, c.seed)?;
        let model = TrainableDecoder::new(base, c.lora.clone(), c.trainable, c.seed)?
            .with_scaling(&c.parsed_scaling()?)?;
        let params = model
            .parameters()
            .iter()
            .map(|(n, v)| (n.clone(), v.clone()))
            .collect();
        let mut opt = AdamW::new(params, c.weight_decay)?;
        // torch.optim.AdamW's defaults (YaRN's finetune.py).
        opt.beta1 = 0.9;
        opt.beta2 = 0.999;
        opt.eps = 1e-8;
        Ok(Finetune {
            record,
            model,
            windows,
            opt,
            metrics: Vec::new(),
        })
    }

    /// Reads a checkpoint's `finetune.json` (to know the model and text to
    /// load before [`resume`](Self::resume)).
    ///
    /// # Errors
    /// [`TuneError::Checkpoint`].
    pub fn read_record(dir: &Path) -> Result<RunRecord> {
        let path = dir.join(RECORD_FILE);
        let bad = |reason: String| TuneError::Checkpoint {
            path: dir.to_path_buf(),
            reason,
        };
        if !path.is_file() {
            return Err(bad(format!("no {RECORD_FILE}: not a posenc fine-tune")));
        }
        let bytes = posenc_models::input::read_bounded(&path, MAX_RECORD_BYTES)?;
        let record: RunRecord =
            serde_json::from_slice(&bytes).map_err(|e| bad(format!("{RECORD_FILE}: {e}")))?;
        record.config.validate().map_err(|e| {
            bad(format!(
                "{RECORD_FILE} holds settings the command line refuses (edited or damaged; start a new run with another --out): {e}"
            ))
        })?;
        if record.step > record.config.steps {
            return Err(bad(format!(
                "step {} is past the run's {} steps",
                record.step, record.config.steps
            )));
        }
        Ok(record)
    }

    /// Continues the run checkpointed in `dir` on `base` and `text` (the
    /// ones it was started on: their hashes are checked), with its adapter,
    /// AdamW state, step and metrics.
    ///
    /// # Errors
    /// [`TuneError::Checkpoint`] for another model or text, a torn
    /// checkpoint (files of different steps), missing or misshapen state.
    pub fn resume(dir: &Path, base: &Decoder, text: TrainText) -> Result<Finetune> {
        let bad = |reason: String| TuneError::Checkpoint {
            path: dir.to_path_buf(),
            reason,
        };
        let record = Self::read_record(dir)?;
        if model_hash(base) != record.model_hash {
            return Err(bad(format!(
                "it was trained on other weights than those given ({} when it started, in {RECORD_FILE})",
                posenc_models::safe::escape(&record.model)
            )));
        }
        if text_hash(&text) != record.text_hash || text.len() != record.train_tokens {
            return Err(bad(
                "the text (or its tokenizer) is not the one it was trained on".into(),
            ));
        }
        let step = record.step;
        let mut ft = Self::build(base, text, record)?;
        let adapter = Adapter::read(dir, base.config())?;
        if adapter.step != Some(step) {
            return Err(bad(format!(
                "its adapter is from {}, {RECORD_FILE} from step {step}: the checkpoint is torn",
                stepped(adapter.step)
            )));
        }
        adapter.load_into(&ft.model, dir)?;
        let opt_path = dir.join(OPTIMIZER_FILE);
        let (bytes, _, opt_step) = peft::read_stepped(&opt_path, base.config(), 4, |e| {
            bad(format!("{OPTIMIZER_FILE}: {e}"))
        })?;
        if opt_step != Some(step) {
            return Err(bad(format!(
                "its optimizer state is from {}, {RECORD_FILE} from step {step}: the checkpoint is torn",
                stepped(opt_step)
            )));
        }
        let mut state = candle_core::safetensors::load_buffer(&bytes, &Device::Cpu)
            .map_err(|e| bad(format!("{OPTIMIZER_FILE}: {e}")))?;
        // The step count is stored as f32 (exact: steps ≤ MAX_STEPS < 2²⁴).
        if let Some(t) = state.get("t") {
            let t = t.to_dtype(candle_core::DType::U32)?;
            state.insert("t".into(), t);
        }
        ft.opt.load_state(&state).map_err(|e| bad(e.to_string()))?;
        if ft.opt.t != step {
            return Err(bad(format!(
                "its optimizer has taken {} steps, the run {step}",
                ft.opt.t
            )));
        }
        ft.metrics = std::fs::read_to_string(dir.join(METRICS_FILE))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str::<Metrics>(l).ok())
            .filter(|m| m.step <= step)
            .collect();
        ft.record.step = step;
        Ok(ft)
    }

    /// The run's record (settings, step, model and text).
    pub fn record(&self) -> &RunRecord {
        &self.record
    }

    /// Steps completed.
    pub fn step(&self) -> usize {
        self.record.step
    }

    /// The model being trained.
    pub fn model(&self) -> &TrainableDecoder {
        &self.model
    }

    /// Logged metrics so far (one per step).
    pub fn metrics(&self) -> &[Metrics] {
        &self.metrics
    }

    /// The adapter as it is now (Hugging Face row order), recording the
    /// step.
    ///
    /// # Errors
    /// Candle's.
    pub fn adapter(&self) -> Result<Adapter> {
        let mut a = Adapter::from_model(&self.model, Some(self.record.model.clone()))?;
        a.step = Some(self.record.step);
        Ok(a)
    }

    /// One optimiser step: the step's windows, the mean of their gradients,
    /// clipping and AdamW. Returns the step's loss, the gradient norm
    /// before clipping and the learning rate.
    ///
    /// # Errors
    /// [`TuneError::Diverged`] for a loss that is not finite; candle's.
    pub fn train_step(&mut self) -> Result<(f64, f64, f64)> {
        let step = self.record.step;
        let c = &self.record.config;
        let windows = self.windows.step(step as u64, c.batch);
        self.model
            .reseed_dropout(step_seed(c.seed ^ DROPOUT_SALT, step as u64));
        let n = self.model.parameters().len();
        let mut acc: Vec<Option<Tensor>> = vec![None; n];
        let mut loss_sum = 0f64;
        for w in &windows {
            let (l, grads) =
                self.model
                    .loss_and_gradients(&w.tokens, &w.positions, c.checkpoint_layers)?;
            if !l.is_finite() {
                return Err(TuneError::Diverged { step, loss: l });
            }
            loss_sum += l;
            crate::model::add_grads(&mut acc, grads)?;
        }
        let inv = 1.0 / windows.len() as f64;
        let mut store = GradStore::default();
        for (slot, (_, var)) in acc.into_iter().zip(self.model.parameters()) {
            if let Some(g) = slot {
                store.insert(var.as_tensor(), g.affine(inv, 0.0)?);
            }
        }
        let lr = c.lr_at(step);
        let clip = c.grad_clip;
        let norm = self.opt.step_clipped(&store, lr, clip)?;
        self.record.step += 1;
        Ok((loss_sum * inv, norm, lr))
    }

    /// Trains to the configured step count from the current step,
    /// checkpointing into `o.out` every `checkpoint_every` steps, at the
    /// end and on stop; progress on stderr if asked.
    ///
    /// # Errors
    /// Those of [`train_step`](Self::train_step) and [`save`](Self::save).
    pub fn run(&mut self, o: &RunOptions) -> Result<Summary> {
        let start_step = self.record.step;
        let steps = self.record.config.steps;
        let every = self.record.config.checkpoint_every;
        let tokens_per_step = (self.record.config.batch * self.record.config.plan.window()) as f64;
        let clock = RunClock::start(start_step, steps, tokens_per_step);
        let tty = o.progress && std::io::stderr().is_terminal();
        let log_every = if tty { 1 } else { (steps / 50).max(1) };
        let (mut last, mut sum, mut ran) = (f64::NAN, 0f64, 0usize);
        let mut interrupted = false;
        while self.record.step < steps {
            if o.stop.is_some_and(|s| s.load(Ordering::SeqCst))
                || o.pause_at.is_some_and(|p| self.record.step >= p)
            {
                interrupted = true;
                break;
            }
            let (loss, grad_norm, lr) = self.train_step()?;
            (last, sum, ran) = (loss, sum + loss, ran + 1);
            let done = self.record.step;
            if let Some(d) = o.done {
                d.store(done, Ordering::SeqCst);
            }
            let elapsed = clock.elapsed();
            let tps = clock.tokens_per_s(done, elapsed);
            self.metrics.push(Metrics {
                step: done,
                loss,
                accuracy: None,
                lr,
                grad_norm,
                tokens_per_s: tps,
                elapsed_s: elapsed,
            });
            if o.progress && (done.is_multiple_of(log_every) || done == steps) {
                let figures = format!("loss {loss:.4} lr {lr:.1e} {:.2}k tok/s", tps / 1000.0);
                let line = progress_line(done, steps, &figures, clock.eta(done, elapsed));
                show_progress(&line, tty);
            }
            if let Some(out) = o.out {
                if every > 0 && done.is_multiple_of(every) && done < steps {
                    self.save(out)?;
                }
            }
        }
        if tty {
            eprintln!();
        }
        if let Some(out) = o.out {
            self.save(out)?;
        }
        let seconds = clock.elapsed();
        Ok(Summary {
            steps: self.record.step,
            final_loss: last,
            mean_loss: if ran > 0 { sum / ran as f64 } else { f64::NAN },
            seconds,
            tokens_per_s: clock.tokens_per_s(self.record.step, seconds),
            interrupted,
        })
    }

    /// Writes a checkpoint into `dir`: the adapter (PEFT layout),
    /// `optimizer.safetensors` (AdamW's `m.NAME`, `v.NAME` and its step
    /// count `t`, all `f32`), `metrics.jsonl`, then `finetune.json`, each
    /// atomically, each recording the step.
    ///
    /// # Errors
    /// [`TuneError::Io`] and the writers' errors.
    pub fn save(&self, dir: &Path) -> Result<()> {
        let step = self.record.step;
        self.adapter()?.write(dir)?;
        let state = self.opt.state()?;
        let mut names: Vec<&String> = state.keys().collect();
        names.sort();
        let values: Vec<(String, Vec<usize>, Vec<f32>)> = names
            .into_iter()
            .map(|n| {
                let t = &state[n];
                let v = t
                    .to_dtype(candle_core::DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?;
                Ok((n.clone(), t.dims().to_vec(), v))
            })
            .collect::<Result<_>>()?;
        let views: Vec<(String, Vec<usize>, &[f32])> = values
            .iter()
            .map(|(n, s, v)| (n.clone(), s.clone(), v.as_slice()))
            .collect();
        let meta = std::collections::HashMap::from([
            ("format".to_string(), "pt".to_string()),
            (peft::STEP_KEY.to_string(), step.to_string()),
        ]);
        peft::write_safetensors(&dir.join(OPTIMIZER_FILE), &views, meta)?;
        let mut lines = String::new();
        for m in &self.metrics {
            m.push_line(&mut lines);
        }
        peft::write_atomic(&dir.join(METRICS_FILE), lines.as_bytes())?;
        let json = serde_json::to_string_pretty(&self.record).expect("serialisable");
        peft::write_atomic(&dir.join(RECORD_FILE), json.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// transformers' schedulers: `get_linear_schedule_with_warmup(opt, 2,
    /// 10)` gives λ = 0, 0.5, 1, 0.875, ..., 0.125; the cosine one 0, 0.5,
    /// 1, then ½(1 + cos(π·(k−2)/8)); constant 0, 0.5, 1, 1, ...
    #[test]
    fn schedules_are_transformers() {
        let lin: Vec<f64> = (0..10).map(|k| Schedule::Linear.factor(k, 10, 2)).collect();
        assert_eq!(
            lin,
            vec![0.0, 0.5, 1.0, 0.875, 0.75, 0.625, 0.5, 0.375, 0.25, 0.125]
        );
        for k in 2..10 {
            let want = 0.5 * (1.0 + (std::f64::consts::PI * (k - 2) as f64 / 8.0).cos());
            assert!((Schedule::Cosine.factor(k, 10, 2) - want).abs() < 1e-15);
        }
        assert_eq!(Schedule::Cosine.factor(1, 10, 2), 0.5);
        assert_eq!(Schedule::Constant.factor(9, 10, 2), 1.0);
        // No warm-up: the first step at the full rate.
        assert_eq!(Schedule::Linear.factor(0, 4, 0), 1.0);
        assert_eq!("cosine".parse::<Schedule>().unwrap(), Schedule::Cosine);
        assert!("step".parse::<Schedule>().is_err());
    }

    #[test]
    fn configs_are_checked() {
        let ok = FinetuneConfig::new(WindowPlan::Contiguous { len: 64 }, 10, 1e-4);
        ok.validate().unwrap();
        assert_eq!(ok.warmup, 1);
        let bad = |f: &dyn Fn(&mut FinetuneConfig)| {
            let mut c = ok.clone();
            f(&mut c);
            c.validate().unwrap_err()
        };
        assert!(matches!(bad(&|c| c.steps = 0), TuneError::Config(_)));
        assert!(matches!(bad(&|c| c.batch = 0), TuneError::Config(_)));
        assert!(matches!(bad(&|c| c.lr = f64::NAN), TuneError::Config(_)));
        assert!(matches!(bad(&|c| c.lr = 0.0), TuneError::Config(_)));
        assert!(matches!(bad(&|c| c.warmup = 11), TuneError::Config(_)));
        assert!(matches!(
            bad(&|c| c.weight_decay = 1.0),
            TuneError::Config(_)
        ));
        assert!(matches!(bad(&|c| c.grad_clip = -1.0), TuneError::Config(_)));
        assert!(matches!(
            bad(&|c| c.checkpoint_every = 11),
            TuneError::Config(_)
        ));
        assert!(matches!(bad(&|c| c.lora.rank = 0), TuneError::Rank { .. }));
        assert!(matches!(
            bad(&|c| c.scaling = "ntk:2".into()),
            TuneError::Scaling(_)
        ));
        assert!(matches!(
            bad(&|c| c.scaling = "self-extend:4:512".into()),
            TuneError::Scaling(_)
        ));
        assert!(matches!(
            bad(&|c| c.scaling = "magic:2".into()),
            TuneError::Model(_)
        ));
        assert!(matches!(
            bad(&|c| c.plan = WindowPlan::Pose {
                window: 64,
                target: 32
            }),
            TuneError::PoseWindow { .. }
        ));
        for s in ["none", "model", "linear:2", "dynamic:2", "yarn:2"] {
            let mut c = ok.clone();
            c.scaling = s.into();
            c.validate().unwrap();
        }
    }
}
