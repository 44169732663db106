//! `posenc finetune --model M --out DIR` as a call: LoRA fine-tuning of a
//! pretrained decoder at a new context length (posenc-tune), resumable,
//! its checkpoints written atomically.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use posenc_models::{input, Decoder, DecoderConfig, ModelFiles, TextTokenizer};
use posenc_nn::train::same_dir;
use posenc_tune::data::{TrainText, WindowPlan};
use posenc_tune::merged::{merged_config, write_merged, TokenizerFiles};
use posenc_tune::peft::CONFIG_FILE;
use posenc_tune::train::{
    Finetune, FinetuneConfig, RunOptions, RunRecord, Schedule, Sources, Summary, RECORD_FILE,
};
use posenc_tune::{lora, Trainable, TuneError};
use serde_json::Value;

use crate::files::check_out_dir;
use crate::{Progress, ProgressFn, Result, RunError, MAX_LENGTH};

/// The directory of the merged checkpoint inside the output directory.
pub const MERGED_DIR: &str = "merged";

/// How often a running fine-tune reports progress (and reads the answer).
const TICK: Duration = Duration::from_millis(200);

/// The options of `posenc finetune --model` (the command's flags, its
/// defaults in [`Default`]).
#[derive(Debug, Clone, PartialEq)]
pub struct FinetuneOptions {
    /// The model: a GGUF file or a checkpoint directory (never written).
    /// With `resume`: instead of the one recorded (its weights checked).
    pub model: Option<PathBuf>,
    /// The output directory: the adapter (PEFT's layout), the optimizer
    /// state, `metrics.jsonl`, `finetune.json`.
    pub out: PathBuf,
    /// Continue the interrupted fine-tune saved in `out`.
    pub resume: bool,
    /// UTF-8 text to train on (default: the built-in *Pride and
    /// Prejudice*): windows from its first 90% of tokens.
    pub text: Option<PathBuf>,
    /// A `tokenizer.json` instead of the model's own.
    pub tokenizer: Option<PathBuf>,
    /// The target context length (required unless `resume`).
    pub length: Option<usize>,
    /// PoSE: windows of this many tokens with positions over `length`.
    pub pose: Option<usize>,
    /// Optimiser steps (required unless `resume`).
    pub steps: Option<usize>,
    /// RoPE scaling kept during training (default `none`).
    pub scaling: Option<String>,
    /// Peak learning rate (default 2e-5).
    pub lr: Option<f64>,
    /// Warm-up steps (default: YaRN's 20, at most a tenth of the steps).
    pub warmup: Option<usize>,
    /// Windows per step (default 1).
    pub batch: Option<usize>,
    /// Seed of the windows and adapters (default 0).
    pub seed: Option<u64>,
    /// LoRA rank r.
    pub lora: usize,
    /// LoRA alpha.
    pub alpha: f64,
    /// Dropout on the adapters' inputs.
    pub dropout: f64,
    /// Adapted projections, comma-separated (`q_proj,v_proj`).
    pub targets: String,
    /// Base parameters trained beside the adapters: `embed`, `norm`,
    /// `embed,norm` (`None` or `none`: neither).
    pub train: Option<String>,
    /// Learning-rate decay after the warm-up: linear, cosine, constant.
    pub schedule: String,
    /// AdamW's weight decay.
    pub weight_decay: f64,
    /// Gradient clipping norm (0: none).
    pub clip: f64,
    /// Also checkpoint every K steps (0: at the end and on stop only).
    pub checkpoint_every: usize,
    /// Activation checkpointing per layer.
    pub checkpoint_layers: bool,
    /// Also write the merged Hugging Face checkpoint in `out/merged`.
    pub merge: bool,
    /// Print posenc-tune's progress line on stderr.
    pub print_progress: bool,
    /// The memory the run may use, bytes (`--max-memory`; default: the
    /// available memory and `RLIMIT_AS`, see [`crate::memory`]).
    pub max_memory: Option<u64>,
}

impl Default for FinetuneOptions {
    fn default() -> Self {
        FinetuneOptions {
            model: None,
            out: PathBuf::new(),
            resume: false,
            text: None,
            tokenizer: None,
            length: None,
            pose: None,
            steps: None,
            scaling: None,
            lr: None,
            warmup: None,
            batch: None,
            seed: None,
            lora: 8,
            alpha: 8.0,
            dropout: 0.0,
            targets: "q_proj,v_proj".into(),
            train: None,
            schedule: "linear".into(),
            weight_decay: 0.01,
            clip: 1.0,
            checkpoint_every: 0,
            checkpoint_layers: false,
            merge: false,
            print_progress: false,
            max_memory: None,
        }
    }
}

/// A finished (or stopped) fine-tune.
#[derive(Debug, Clone)]
pub struct FinetuneOutcome {
    /// How the run ended.
    pub summary: Summary,
    /// The run's record (`finetune.json`).
    pub record: RunRecord,
    /// The merged checkpoint's directory, if written.
    pub merged: Option<PathBuf>,
    /// The output directory.
    pub out: PathBuf,
}

impl FinetuneOutcome {
    /// What `posenc finetune --model ... --json` prints: the summary with
    /// `out`, `merged` and the record as `finetune`.
    pub fn to_json(&self) -> Value {
        let mut v = serde_json::to_value(&self.summary).unwrap_or(Value::Null);
        v["out"] = serde_json::json!(self.out.display().to_string());
        v["merged"] = serde_json::json!(self.merged.as_ref().map(|p| p.display().to_string()));
        v["finetune"] = serde_json::to_value(&self.record).unwrap_or(Value::Null);
        v
    }
}

/// Whether `out` holds a pretrained-model fine-tune (its `finetune.json`).
pub fn is_model_finetune(out: &Path) -> bool {
    out.join(RECORD_FILE).is_file()
}

/// `embed,norm`: LongLoRA's trainable embeddings and norms (`none` or
/// empty: neither).
fn parse_trainable(s: &str) -> Result<Trainable> {
    let mut t = Trainable::default();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part {
            "embed" => t.embed = true,
            "norm" => t.norm = true,
            "none" => {}
            other => {
                return Err(RunError::Invalid(format!(
                    "--train {other:?}: use embed, norm or both (embed,norm)"
                )))
            }
        }
    }
    Ok(t)
}

impl FinetuneOptions {
    /// The run's settings, every check that needs no file done.
    ///
    /// # Errors
    /// The command's messages for each option.
    pub fn config(&self) -> Result<FinetuneConfig> {
        let length = self.length.ok_or_else(|| {
            RunError::Invalid(
                "--length N (the target context length) is required with --model".into(),
            )
        })?;
        if !(2..=MAX_LENGTH).contains(&length) {
            return Err(RunError::Invalid(format!(
                "--length must be in 2..={MAX_LENGTH}"
            )));
        }
        let plan = match self.pose {
            Some(window) => WindowPlan::Pose {
                window,
                target: length,
            },
            None => WindowPlan::Contiguous { len: length },
        };
        plan.validate()?;
        let steps = self
            .steps
            .ok_or_else(|| RunError::Invalid("--steps is required (or --resume)".into()))?;
        let mut c = FinetuneConfig::new(plan, steps, self.lr.unwrap_or(2e-5));
        c.scaling = self.scaling.clone().unwrap_or_else(|| "none".into());
        if let Some(w) = self.warmup {
            c.warmup = w;
        }
        c.batch = self.batch.unwrap_or(1);
        c.seed = self.seed.unwrap_or(0);
        c.schedule = self.schedule.parse::<Schedule>()?;
        c.weight_decay = self.weight_decay;
        c.grad_clip = self.clip;
        c.checkpoint_every = self.checkpoint_every;
        c.checkpoint_layers = self.checkpoint_layers;
        c.lora = lora::LoraConfig {
            rank: self.lora,
            alpha: self.alpha,
            dropout: self.dropout,
            targets: lora::parse_targets(&self.targets)?,
        };
        c.trainable = parse_trainable(self.train.as_deref().unwrap_or(""))?;
        c.validate()?;
        Ok(c)
    }
}

/// The training tokens of `text` (default: the built-in *Pride and
/// Prejudice*), a file tokenized in pieces (only its ids held whole); the
/// last 10% dropped.
fn train_text(text: Option<&Path>, tk: &TextTokenizer) -> Result<TrainText> {
    let tokens = match text {
        Some(p) => match crate::text::all_tokens(p, tk)? {
            Some(ids) => ids,
            None => tk.encode(&posenc_models::read_text(p)?)?,
        },
        None => tk.encode(crate::PRIDE_AND_PREJUDICE)?,
    };
    Ok(TrainText::new(tokens)?)
}

/// The training text's bytes: the file's size, or the built-in novel's.
fn text_bytes(text: Option<&Path>) -> Result<u64> {
    Ok(match text {
        Some(p) => input::check_regular(p)?,
        None => crate::PRIDE_AND_PREJUDICE.len() as u64,
    })
}

/// Refuses a fine-tune whose memory plan ([`crate::memory::finetune`])
/// is over the limit, before the text is tokenized or a weight read,
/// naming the largest window (`--length`, or `--pose`'s) that fits.
fn check_plan(
    cfg: &DecoderConfig,
    config: &FinetuneConfig,
    text_bytes: u64,
    max_memory: Option<u64>,
) -> Result<()> {
    let window = config.plan.window();
    let (t, c) = (config.trainable, config.checkpoint_layers);
    let plan = |w: usize| {
        let mut p = crate::memory::finetune(cfg, w, t, c, text_bytes);
        if matches!(config.plan, WindowPlan::Pose { .. }) {
            p.flag = "--pose";
        }
        p
    };
    let limit = crate::Limit::current(max_memory);
    let p = plan(window);
    if p.total() <= limit.bytes {
        return Ok(());
    }
    let largest = crate::memory::largest_fitting(2, window, limit.bytes, |w| plan(w).total());
    p.check(&limit, largest)
}

/// What a run needs once its files are open: the model's config, the
/// tokenizer, the training text, and the merged checkpoint's sources.
struct Opened {
    files: ModelFiles,
    cfg: DecoderConfig,
    text: TrainText,
    base_config: Option<String>,
    tokenizer_files: TokenizerFiles,
}

/// What a merged checkpoint needs of an [`Opened`] run: the model's
/// config, the checkpoint's config.json and the tokenizer's files.
type MergeParts = (DecoderConfig, Option<String>, TokenizerFiles);

impl Opened {
    /// Reads the weights: the model, its description, the training text
    /// and what a merged checkpoint needs.
    fn load(self) -> Result<(Decoder, String, TrainText, MergeParts)> {
        let (base, source) = self.files.load(self.cfg.clone())?;
        let kept = (self.cfg, self.base_config, self.tokenizer_files);
        Ok((base, source, self.text, kept))
    }
}

/// Opens the model (config only), its tokenizer and the text, checking
/// each before any weight is read.
fn open(
    model: &Path,
    tokenizer: Option<&Path>,
    text: Option<&Path>,
    merge: bool,
    check: &dyn Fn(&DecoderConfig) -> Result<()>,
) -> Result<Opened> {
    input::check_model_path(model)?;
    for p in [tokenizer, text].into_iter().flatten() {
        input::check_regular(p)?;
    }
    let mut files = ModelFiles::open(model)?;
    let cfg = files.config()?;
    // The memory plan, before the text is tokenized or a weight read.
    check(&cfg)?;
    let tk = files.tokenizer_for(tokenizer, &cfg)?;
    let text = train_text(text, &tk)?;
    let (base_config, tokenizer_files) = match &files {
        ModelFiles::HuggingFace { dir, config } => (
            Some(config.clone()),
            TokenizerFiles::from_dir(dir, tokenizer),
        ),
        ModelFiles::Gguf(_) => (
            None,
            match tokenizer {
                Some(p) => TokenizerFiles::Copy(vec![(p.to_path_buf(), "tokenizer.json".into())]),
                // Serialised only when a merged checkpoint is asked for.
                None if merge => TokenizerFiles::Json(tk.to_json()?),
                None => TokenizerFiles::Copy(Vec::new()),
            },
        ),
    };
    Ok(Opened {
        files,
        cfg,
        text,
        base_config,
        tokenizer_files,
    })
}

/// Fine-tunes as `posenc finetune --model ... --out DIR --json` and
/// returns what it prints; a run stopped by `progress` returns
/// [`RunError::Cancelled`] (its checkpoint written, resumable with
/// `resume`).
///
/// # Errors
/// As [`finetune_run`]; [`RunError::Cancelled`].
pub fn finetune(options: &FinetuneOptions, progress: &mut ProgressFn<'_>) -> Result<Value> {
    let outcome = finetune_run(options, progress)?;
    if outcome.summary.interrupted {
        return Err(RunError::Cancelled);
    }
    Ok(outcome.to_json())
}

/// Fine-tunes (or resumes) into `options.out`: `out` is checked first (a
/// writable directory or one that can be made, not a file, not under
/// `/proc` or `/sys`), then every option and file before any weight is
/// read. `progress` is called first with the run's description (`done` =
/// the step it starts at), then about every 200 ms with the steps done;
/// when it answers `false` the run stops after the step in progress,
/// writes its checkpoint (each file atomically) and returns with
/// `summary.interrupted`, skipping the merge.
///
/// # Errors
/// The command's messages.
pub fn finetune_run(
    options: &FinetuneOptions,
    progress: &mut ProgressFn<'_>,
) -> Result<FinetuneOutcome> {
    let a = options;
    check_out_dir(&a.out, "--out")?;
    if a.merge {
        check_out_dir(&a.out.join(MERGED_DIR), "--merge")?;
    }
    let (mut ft, base, opened, header) = if a.resume {
        let record = Finetune::read_record(&a.out)?;
        let model = a
            .model
            .clone()
            .unwrap_or_else(|| PathBuf::from(&record.model));
        let tokenizer = a
            .tokenizer
            .clone()
            .or_else(|| record.tokenizer.as_ref().map(PathBuf::from));
        let text = a
            .text
            .clone()
            .or_else(|| record.text.as_ref().map(PathBuf::from));
        let bytes = text_bytes(text.as_deref())?;
        let opened = open(
            &model,
            tokenizer.as_deref(),
            text.as_deref(),
            a.merge,
            &|cfg| check_plan(cfg, &record.config, bytes, a.max_memory),
        )?;
        record.config.lora.validate_for(&opened.cfg)?;
        let header = format!("resuming {} at step {}", a.out.display(), record.step);
        let (base, _, text, kept) = opened.load()?;
        if posenc_tune::train::model_hash(&base) != record.model_hash {
            return Err(TuneError::Checkpoint {
                path: a.out.clone(),
                reason: format!(
                    "the model {} has other weights than the run was trained on ({} when it started, in {RECORD_FILE}): resume with that model (--model), or choose another --out for a new run",
                    posenc_models::safe::path(&model),
                    posenc_models::safe::escape(&record.model)
                ),
            }
            .into());
        }
        let ft = Finetune::resume(&a.out, &base, text)?;
        (ft, base, kept, header)
    } else {
        let config = a.config()?;
        let model = a
            .model
            .as_deref()
            .ok_or_else(|| RunError::Invalid("--model is required (or --resume)".into()))?;
        if a.out.join(RECORD_FILE).exists() || a.out.join(CONFIG_FILE).exists() {
            return Err(RunError::Invalid(format!(
                "{} already holds a fine-tune: pass --resume to continue it, or choose another --out",
                a.out.display()
            )));
        }
        if same_dir(model, &a.out) {
            return Err(RunError::Invalid(format!(
                "--out {} is the model's directory: choose another (the model is never overwritten)",
                a.out.display()
            )));
        }
        let bytes = text_bytes(a.text.as_deref())?;
        let opened = open(
            model,
            a.tokenizer.as_deref(),
            a.text.as_deref(),
            a.merge,
            &|cfg| check_plan(cfg, &config, bytes, a.max_memory),
        )?;
        config.lora.validate_for(&opened.cfg)?;
        config.parsed_scaling()?.rope_config(&opened.cfg)?;
        let window = config.plan.window();
        if opened.text.len() < window {
            return Err(TuneError::TextTooShort {
                need: window,
                have: opened.text.len(),
            }
            .into());
        }
        let (base, source, text, kept) = opened.load()?;
        let (train, held_out) = (text.len(), text.held_out());
        let sources = Sources {
            model: model.display().to_string(),
            tokenizer: a.tokenizer.as_ref().map(|p| p.display().to_string()),
            text: a.text.as_ref().map(|p| p.display().to_string()),
        };
        let ft = Finetune::new(&base, text, config, sources)?;
        let header = format!(
            "{source}; {train} training tokens ({held_out} held out, never read); {} trained values",
            ft.model().trained_values()
        );
        (ft, base, kept, header)
    };
    let summary = run_watched(&mut ft, a, &header, progress)?;
    let record = ft.record().clone();
    let merged = if a.merge && !summary.interrupted {
        let (cfg, base_config, tokenizer_files) = &opened;
        let adapter = ft.adapter()?;
        // The trainable copy of the weights goes before the merge.
        drop(ft);
        let mut base = base;
        adapter.merge_into(&mut base, &a.out)?;
        let config = merged_config(
            cfg,
            base_config.as_deref(),
            &record.config.parsed_scaling()?,
        )?;
        let dir = a.out.join(MERGED_DIR);
        write_merged(&dir, &base, &config, tokenizer_files)?;
        Some(dir)
    } else {
        None
    };
    Ok(FinetuneOutcome {
        summary,
        record,
        merged,
        out: a.out.clone(),
    })
}

/// Runs `ft` to its step count on a worker thread while this thread
/// reports the steps done to `progress` every [`TICK`] (posenc-tune's loop
/// counts them in `RunOptions::done` and checks its stop flag between
/// steps, so a stop asked for ends the run after the step in progress,
/// with a checkpoint).
fn run_watched(
    ft: &mut Finetune,
    a: &FinetuneOptions,
    header: &str,
    progress: &mut ProgressFn<'_>,
) -> Result<Summary> {
    let steps = ft.record().config.steps;
    let start = ft.step();
    let stop = AtomicBool::new(!progress(Progress::new(start, steps, header)));
    let done = std::sync::atomic::AtomicUsize::new(start);
    let options = RunOptions {
        out: Some(&a.out),
        progress: a.print_progress,
        stop: Some(&stop),
        pause_at: None,
        done: Some(&done),
    };
    let summary = std::thread::scope(|s| {
        let worker = s.spawn(|| ft.run(&options));
        while !worker.is_finished() {
            std::thread::park_timeout(TICK);
            let now = done.load(Ordering::SeqCst);
            if !stop.load(Ordering::SeqCst) && !progress(Progress::new(now, steps, "step")) {
                stop.store(true, Ordering::SeqCst);
            }
        }
        worker.join()
    });
    let summary = match summary {
        Ok(r) => r?,
        Err(payload) => std::panic::resume_unwind(payload),
    };
    progress(Progress::new(summary.steps, steps, "step"));
    Ok(summary)
}
