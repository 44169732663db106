//! `posenc finetune --model M`: LoRA fine-tuning of a pretrained decoder at
//! a new context length (posenc-tune), and `--adapter DIR` of `posenc
//! perplexity`, `passkey` and `generate` (the adapter merged into the
//! loaded weights). `posenc finetune --checkpoint` (the lab's) is in
//! `cmd_lab.rs`; both share `FinetuneArgs`.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicBool;

use posenc_models::{input, Decoder, DecoderConfig, ModelFiles};
use posenc_tune::data::{TrainText, WindowPlan};
use posenc_tune::merged::{merged_config, write_merged, TokenizerFiles};
use posenc_tune::peft::{Adapter, CONFIG_FILE};
use posenc_tune::train::{
    check_train_memory, Finetune, FinetuneConfig, RunOptions, Schedule, Sources, Summary,
    RECORD_FILE,
};
use posenc_tune::{lora, Trainable, TuneError};

use crate::cmd_lab::FinetuneArgs;
use crate::cmd_models::MAX_LENGTH;
use crate::{CliError, CliResult};

impl From<TuneError> for CliError {
    fn from(e: TuneError) -> Self {
        CliError(e.to_string())
    }
}

/// The directory of the merged checkpoint inside `--out`.
pub const MERGED_DIR: &str = "merged";

/// Whether `out` holds a pretrained-model fine-tune (its `finetune.json`).
pub fn is_model_finetune(out: &Path) -> bool {
    out.join(RECORD_FILE).is_file()
}

/// `--train embed,norm`: LongLoRA's trainable embeddings and norms
/// (`none` or empty: neither).
fn parse_trainable(s: &str) -> CliResult<Trainable> {
    let mut t = Trainable::default();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part {
            "embed" => t.embed = true,
            "norm" => t.norm = true,
            "none" => {}
            other => {
                return Err(CliError(format!(
                    "--train {other:?}: use embed, norm or both (embed,norm)"
                )))
            }
        }
    }
    Ok(t)
}

/// The run's settings from the command line, every check that needs no
/// file done.
fn config_of(a: &FinetuneArgs) -> CliResult<FinetuneConfig> {
    let length = a.length.ok_or_else(|| {
        CliError("--length N (the target context length) is required with --model".into())
    })?;
    if !(2..=MAX_LENGTH).contains(&length) {
        return Err(CliError(format!("--length must be in 2..={MAX_LENGTH}")));
    }
    let plan = match a.pose {
        Some(window) => WindowPlan::Pose {
            window,
            target: length,
        },
        None => WindowPlan::Contiguous { len: length },
    };
    plan.validate()?;
    let steps = a
        .steps
        .ok_or_else(|| CliError("--steps is required (or --resume)".into()))?;
    let mut c = FinetuneConfig::new(plan, steps, a.lr.unwrap_or(2e-5));
    c.scaling = a.scaling.clone().unwrap_or_else(|| "none".into());
    if let Some(w) = a.warmup {
        c.warmup = w;
    }
    c.batch = a.batch.unwrap_or(1);
    c.seed = a.seed.unwrap_or(0);
    c.schedule = a.schedule.parse::<Schedule>()?;
    c.weight_decay = a.weight_decay;
    c.grad_clip = a.clip;
    c.checkpoint_every = a.checkpoint_every;
    c.checkpoint_layers = a.checkpoint_layers;
    c.lora = lora::LoraConfig {
        rank: a.lora,
        alpha: a.alpha,
        dropout: a.dropout,
        targets: lora::parse_targets(&a.targets)?,
    };
    c.trainable = parse_trainable(a.train.as_deref().unwrap_or(""))?;
    c.validate()?;
    Ok(c)
}

/// The training tokens of `text` (default: the built-in *Pride and
/// Prejudice*), tokenized whole; the last 10% dropped.
fn train_text(text: Option<&Path>, tk: &posenc_models::TextTokenizer) -> CliResult<TrainText> {
    let tokens = match text {
        Some(p) => tk.encode(&posenc_models::read_text(p)?)?,
        None => tk.encode(posenc_report::corpus::PRIDE_AND_PREJUDICE)?,
    };
    Ok(TrainText::new(tokens)?)
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
    fn load(self) -> CliResult<(Decoder, String, TrainText, MergeParts)> {
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
) -> CliResult<Opened> {
    input::check_model_path(model)?;
    for p in [tokenizer, text].into_iter().flatten() {
        input::check_regular(p)?;
    }
    let mut files = ModelFiles::open(model)?;
    let cfg = files.config()?;
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

/// `posenc finetune --model M ...` and `posenc finetune --resume --out DIR`
/// on a pretrained-model fine-tune.
pub fn finetune(a: &FinetuneArgs, stop: &AtomicBool) -> CliResult {
    let (mut ft, base, opened) = if a.resume {
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
        let opened = open(&model, tokenizer.as_deref(), text.as_deref(), a.merge)?;
        record.config.lora.validate_for(&opened.cfg)?;
        check_train_memory(
            &opened.cfg,
            record.config.plan.window(),
            record.config.trainable,
            record.config.checkpoint_layers,
            None,
        )?;
        if !a.quiet {
            eprintln!("resuming {} at step {}", a.out.display(), record.step);
        }
        let (base, _, text, kept) = opened.load()?;
        let ft = Finetune::resume(&a.out, &base, text)?;
        (ft, base, kept)
    } else {
        let config = config_of(a)?;
        let model = a.model.as_deref().expect("--model (checked by the caller)");
        if a.out.join(RECORD_FILE).exists() || a.out.join(CONFIG_FILE).exists() {
            return Err(CliError(format!(
                "{} already holds a fine-tune: pass --resume to continue it, or choose another --out",
                a.out.display()
            )));
        }
        if posenc_lab::finetune::same_dir(model, &a.out) {
            return Err(CliError(format!(
                "--out {} is the model's directory: choose another (the model is never overwritten)",
                a.out.display()
            )));
        }
        let opened = open(model, a.tokenizer.as_deref(), a.text.as_deref(), a.merge)?;
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
        check_train_memory(
            &opened.cfg,
            window,
            config.trainable,
            config.checkpoint_layers,
            None,
        )?;
        let (base, source, text, kept) = opened.load()?;
        let (train, held_out) = (text.len(), text.held_out());
        let sources = Sources {
            model: model.display().to_string(),
            tokenizer: a.tokenizer.as_ref().map(|p| p.display().to_string()),
            text: a.text.as_ref().map(|p| p.display().to_string()),
        };
        let ft = Finetune::new(&base, text, config, sources)?;
        if !a.quiet {
            eprintln!(
                "{source}; {train} training tokens ({held_out} held out, never read); {} trained values",
                ft.model().trained_values()
            );
        }
        (ft, base, kept)
    };
    let summary = ft.run(&RunOptions {
        out: Some(&a.out),
        progress: !a.quiet,
        stop: Some(stop),
        pause_at: None,
    })?;
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
    report(a, &record, &summary, merged.as_deref())?;
    exit(&summary)
}

fn exit(summary: &Summary) -> CliResult {
    if summary.interrupted {
        std::process::exit(130);
    }
    Ok(())
}

/// The summary line (or JSON) of a finished or interrupted run.
fn report(
    a: &FinetuneArgs,
    record: &posenc_tune::train::RunRecord,
    s: &Summary,
    merged: Option<&Path>,
) -> CliResult {
    let c = &record.config;
    if a.json {
        let mut v = serde_json::to_value(s)?;
        v["out"] = serde_json::json!(a.out.display().to_string());
        v["merged"] = serde_json::json!(merged.map(|p| p.display().to_string()));
        v["finetune"] = serde_json::to_value(record)?;
        println!("{v}");
        return Ok(());
    }
    let windows = match c.plan {
        WindowPlan::Contiguous { len } => format!("windows of {len} tokens"),
        WindowPlan::Pose { window, target } => {
            format!("PoSE windows of {window} tokens with positions over {target}")
        }
    };
    let targets: Vec<&str> = c.lora.targets.iter().map(|t| t.name()).collect();
    println!(
        "{} {} ({windows}), scaling {}, LoRA r={} on {}: step {}/{}, loss {:.4}, {:.0} tokens/s, {:.1} s{}; adapter in {}{}",
        if s.interrupted { "interrupted fine-tuning" } else { "fine-tuned" },
        record.model,
        c.scaling,
        c.lora.rank,
        targets.join(","),
        s.steps,
        c.steps,
        s.final_loss,
        s.tokens_per_s,
        s.seconds,
        if s.interrupted { " (Ctrl-C)" } else { "" },
        a.out.display(),
        merged.map_or(String::new(), |m| format!(", merged checkpoint in {}", m.display()))
    );
    Ok(())
}

/// Reads and checks `--adapter DIR` against the model's config before any
/// weight is read (`None`: no adapter).
pub fn read_adapter(dir: Option<&Path>, cfg: &DecoderConfig) -> CliResult<Option<Adapter>> {
    match dir {
        None => Ok(None),
        Some(d) => Ok(Some(Adapter::read(d, cfg)?)),
    }
}

/// Merges an adapter read by [`read_adapter`] into the loaded model.
pub fn merge_adapter(
    adapter: Option<&Adapter>,
    dir: Option<&Path>,
    model: &mut Decoder,
) -> CliResult {
    if let (Some(a), Some(d)) = (adapter, dir) {
        a.merge_into(model, d)?;
    }
    Ok(())
}
