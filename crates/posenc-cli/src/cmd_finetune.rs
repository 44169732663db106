//! `posenc finetune`'s arguments, and `posenc finetune --model M` (and
//! `--resume` of such a run): LoRA fine-tuning of a pretrained decoder at a
//! new context length. The run is `posenc_run::finetune`; here are its
//! flags, the Ctrl-C flag, the progress lines and the summary. `posenc
//! finetune --checkpoint` (the lab's) is in `cmd_lab.rs`.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};

use clap::Args;
use posenc_run::finetune::{finetune_run, FinetuneOptions, FinetuneOutcome};
use posenc_tune::data::WindowPlan;
use posenc_tune::TuneError;

use crate::cmd_lab::RunFlags;
use crate::{CliError, CliResult};

impl From<TuneError> for CliError {
    fn from(e: TuneError) -> Self {
        CliError(e.to_string())
    }
}

/// Arguments of `posenc finetune`: a lab checkpoint (`--checkpoint`, at a
/// new `--len`) or a pretrained model (`--model`, LoRA at a new
/// `--length`, posenc-tune). The flags after `--json` are the pretrained
/// mode's.
#[derive(Args, Debug)]
pub struct FinetuneArgs {
    /// The base checkpoint directory of a lab model (read, never written).
    #[arg(
        long,
        required_unless_present_any = ["resume", "model"],
        conflicts_with_all = ["resume", "model"]
    )]
    pub checkpoint: Option<PathBuf>,
    /// The new training length (lab checkpoints).
    #[arg(
        long,
        required_unless_present_any = ["resume", "model"],
        conflicts_with_all = ["resume", "model"],
        allow_hyphen_values = true
    )]
    pub len: Option<usize>,
    /// Fine-tuning steps.
    #[arg(
        long,
        required_unless_present = "resume",
        conflicts_with = "resume",
        allow_hyphen_values = true
    )]
    pub steps: Option<usize>,
    /// RoPE scaling kept in the forward pass during fine-tuning. Lab
    /// checkpoints: none, linear (Position Interpolation), ntk, dynamic,
    /// yarn (factor = --len / the base's training length, at least 1), or
    /// one with a fixed factor (yarn:2; F >= 1); default: the base's own
    /// fine-tune scaling, if any, else none.
    /// --model: none, model (the config's own), linear:F, dynamic:F, yarn:F
    /// (factors relative to the model's trained length; default none),
    /// written into the merged checkpoint's config.json.
    #[arg(long, conflicts_with = "resume")]
    pub scaling: Option<String>,
    /// Learning rate (default: 1e-3, constant after the warm-up, for a lab
    /// checkpoint; 2e-5, YaRN's, for --model).
    #[arg(long, allow_hyphen_values = true, conflicts_with = "resume")]
    pub lr: Option<f64>,
    /// Linear warm-up steps (default: 0 for a lab checkpoint; for --model
    /// YaRN's 20, at most a tenth of the steps).
    #[arg(long, conflicts_with = "resume")]
    pub warmup: Option<usize>,
    /// Sequences (windows) per step (default: the base run's; 1 for
    /// --model).
    #[arg(long, conflicts_with = "resume", allow_hyphen_values = true)]
    pub batch: Option<usize>,
    /// Seed of the fine-tuning batches (default: the base run's for a lab
    /// checkpoint, 0 for --model, where it also seeds the adapters).
    #[arg(long, conflicts_with = "resume")]
    pub seed: Option<u64>,
    /// Checkpoint directory of the fine-tuned model (not --checkpoint or
    /// --model). For --model: the adapter in PEFT's layout
    /// (adapter_config.json, adapter_model.safetensors), the optimizer
    /// state, metrics.jsonl and finetune.json.
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub run: RunFlags,
    /// Print the summary and the fine-tune record as JSON.
    #[arg(long)]
    pub json: bool,
    /// A pretrained model to fine-tune with LoRA: a GGUF file or a Hugging
    /// Face checkpoint directory (read, never written). With --resume: the
    /// model to use instead of the one recorded (its weights are checked).
    #[arg(long, value_name = "FILE", conflicts_with = "checkpoint")]
    pub model: Option<PathBuf>,
    /// UTF-8 text to train on (default: Pride and Prejudice, built in):
    /// windows come from the first 90% of its tokens; the last 10% is never
    /// read.
    #[arg(long, value_name = "FILE", conflicts_with = "checkpoint")]
    pub text: Option<PathBuf>,
    /// A tokenizer.json to use instead of the model's own.
    #[arg(long, value_name = "FILE", conflicts_with = "checkpoint")]
    pub tokenizer: Option<PathBuf>,
    /// The target context length N (--model): training windows of N tokens
    /// at positions 0..N, or with --pose, shorter windows whose positions
    /// cover 0..N.
    #[arg(long, conflicts_with_all = ["checkpoint", "resume"], allow_hyphen_values = true)]
    pub length: Option<usize>,
    /// PoSE (Zhu et al. 2024): windows of WINDOW tokens (below --length)
    /// with position ids spread over 0..--length as the authors' training
    /// script draws them.
    #[arg(
        long,
        value_name = "WINDOW",
        conflicts_with_all = ["checkpoint", "resume"],
        allow_hyphen_values = true
    )]
    pub pose: Option<usize>,
    /// LoRA rank r (at least 1, at most the smaller side of every targeted
    /// projection).
    #[arg(
        long,
        default_value_t = 8,
        conflicts_with_all = ["checkpoint", "resume"],
        allow_hyphen_values = true
    )]
    pub lora: usize,
    /// LoRA alpha (the update is scaled by alpha/r; PEFT's default 8).
    #[arg(long, default_value_t = 8.0, conflicts_with_all = ["checkpoint", "resume"], allow_hyphen_values = true)]
    pub alpha: f64,
    /// Dropout on the adapters' inputs while training (PEFT's default 0).
    #[arg(long, default_value_t = 0.0, conflicts_with_all = ["checkpoint", "resume"], allow_hyphen_values = true)]
    pub dropout: f64,
    /// The projections adapted in every layer (PEFT's target_modules):
    /// q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj.
    #[arg(long, default_value = "q_proj,v_proj", conflicts_with_all = ["checkpoint", "resume"])]
    pub targets: String,
    /// Base parameters trained beside the adapters, as LongLoRA: embed,
    /// norm, or embed,norm (saved as PEFT's modules_to_save).
    #[arg(long, conflicts_with_all = ["checkpoint", "resume"])]
    pub train: Option<String>,
    /// The learning rate's decay after the warm-up: linear (to 0, YaRN's
    /// default), cosine, constant.
    #[arg(long, default_value = "linear", conflicts_with_all = ["checkpoint", "resume"])]
    pub schedule: String,
    /// AdamW's weight decay, on matrices (torch's default 0.01).
    #[arg(long = "weight-decay", default_value_t = 0.01, conflicts_with_all = ["checkpoint", "resume"], allow_hyphen_values = true)]
    pub weight_decay: f64,
    /// Clip the gradients' global norm to this (0: no clipping).
    #[arg(long, default_value_t = 1.0, conflicts_with_all = ["checkpoint", "resume"], allow_hyphen_values = true)]
    pub clip: f64,
    /// Also checkpoint every K steps (0: at the end and on Ctrl-C only).
    #[arg(long = "checkpoint-every", value_name = "K", default_value_t = 0, conflicts_with_all = ["checkpoint", "resume"])]
    pub checkpoint_every: usize,
    /// With --model: activation checkpointing per layer (only each layer's
    /// input kept; every layer run again in the backward pass), so a long
    /// window trains in a fraction of the memory for about a third more
    /// time; the same gradients.
    #[arg(long = "checkpoint-layers", requires = "model", conflicts_with_all = ["checkpoint", "resume"])]
    pub checkpoint_layers: bool,
    /// At the end, also write the adapter merged into the model as a
    /// Hugging Face checkpoint in OUT/merged (config.json with the scaling
    /// in rope_scaling, model.safetensors, the tokenizer).
    #[arg(long, conflicts_with = "checkpoint")]
    pub merge: bool,
    /// With --model: the memory the run may use (900M, 2G, ...): the run
    /// is refused before the text is tokenized or a weight read when its
    /// estimate is over it. Default: the smaller of the available memory
    /// (MemAvailable) and RLIMIT_AS less what the process maps.
    #[arg(
        long = "max-memory",
        value_name = "SIZE",
        conflicts_with = "checkpoint"
    )]
    pub max_memory: Option<String>,
}

impl FinetuneArgs {
    /// The pretrained mode's options (`--model`, `--resume` of such a run).
    pub fn options(&self) -> crate::CliResult<FinetuneOptions> {
        Ok(FinetuneOptions {
            model: self.model.clone(),
            out: self.out.clone(),
            resume: self.run.resume,
            text: self.text.clone(),
            tokenizer: self.tokenizer.clone(),
            length: self.length,
            pose: self.pose,
            steps: self.steps,
            scaling: self.scaling.clone(),
            lr: self.lr,
            warmup: self.warmup,
            batch: self.batch,
            seed: self.seed,
            lora: self.lora,
            alpha: self.alpha,
            dropout: self.dropout,
            targets: self.targets.clone(),
            train: self.train.clone(),
            schedule: self.schedule.clone(),
            weight_decay: self.weight_decay,
            clip: self.clip,
            checkpoint_every: self.checkpoint_every,
            checkpoint_layers: self.checkpoint_layers,
            merge: self.merge,
            print_progress: !self.run.quiet,
            max_memory: crate::cmd_models::max_memory(self.max_memory.as_deref())?,
        })
    }
}

/// `posenc finetune --model M ...` and `posenc finetune --resume --out DIR`
/// on a pretrained-model fine-tune; `stop` is set by Ctrl-C.
pub fn model_finetune(a: &FinetuneArgs, stop: &AtomicBool) -> CliResult {
    let mut first = true;
    let outcome = finetune_run(&a.options()?, &mut |p| {
        if first {
            first = false;
            if !a.run.quiet {
                eprintln!("{}", p.what);
            }
        }
        !stop.load(Ordering::SeqCst)
    })?;
    report(a, &outcome)?;
    if outcome.summary.interrupted {
        std::process::exit(130);
    }
    Ok(())
}

/// The summary line (or JSON) of a finished or interrupted run.
fn report(a: &FinetuneArgs, o: &FinetuneOutcome) -> CliResult {
    if a.json {
        println!("{}", o.to_json());
        return Ok(());
    }
    let (record, s, merged) = (&o.record, &o.summary, o.merged.as_deref());
    let c = &record.config;
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
        merged.map_or(String::new(), |m: &Path| format!(", merged checkpoint in {}", m.display()))
    );
    Ok(())
}
