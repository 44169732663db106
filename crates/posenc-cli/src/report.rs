//! `posenc report`: the arguments; the engine is the `posenc-report` crate.

use std::path::PathBuf;

use clap::Args;

use crate::{CliError, CliResult};

/// Arguments of `posenc report`.
#[derive(Args, Debug)]
pub struct ReportArgs {
    /// Output directory.
    #[arg(long, default_value = "report")]
    pub out: PathBuf,
    /// Experiment preset: quick, full, smoke, or a path to a JSON preset.
    #[arg(long, default_value = "quick")]
    pub preset: String,
    /// Run only experiment N (1–7; 8 or 9 with --model).
    #[arg(long)]
    pub only: Option<usize>,
    /// Rerun every text experiment (language models, masked language
    /// models) on this UTF-8 file instead of the preset's text (default:
    /// Pride and Prejudice); its last 10% is the validation text.
    #[arg(long, value_name = "FILE")]
    pub corpus: Option<PathBuf>,
    /// Training runs at a time, each on one thread (default: one per core);
    /// the results are the same for any value.
    #[arg(long)]
    pub jobs: Option<usize>,
    /// A pretrained RoPE decoder (GGUF file, or a Hugging Face checkpoint
    /// directory) for experiments 8 and 9: no scaling, PI, dynamic NTK and
    /// YaRN, then the training-free attention methods (Self-Extend,
    /// ReRoPE, DCA, sinks), over a window of twice its trained length, with
    /// generation and passkey retrieval past it.
    #[arg(long, value_name = "FILE")]
    pub model: Option<PathBuf>,
    /// With --model: read and append experiments 8 and 9's passkey trials
    /// through FILE, a `posenc passkey --log` file of the same model (its
    /// trials of the report's cells, seed 0, are read instead of run;
    /// default: a log in the output's cache).
    #[arg(long, value_name = "FILE", requires = "model")]
    pub passkey_log: Option<PathBuf>,
    /// With --model: experiment 8 also fine-tunes PI ×2 and YaRN ×2 for N
    /// steps each (LoRA on PoSE windows of L/4 tokens covering 2L
    /// positions, on the text's first 90%) and measures them on its last
    /// 10%: held-out band losses and passkey retrieval before and after.
    #[arg(long = "finetune-steps", value_name = "N", requires = "model")]
    pub finetune_steps: Option<usize>,
}

impl From<posenc_report::ReportError> for CliError {
    fn from(e: posenc_report::ReportError) -> Self {
        CliError(e.0)
    }
}

/// Runs `posenc report`.
pub fn run(a: ReportArgs) -> CliResult {
    let out = a.out.clone();
    // Every output checked before any work: the directory (not a file,
    // not under /proc or /sys, writable) and the passkey log.
    posenc_run::check_out_dir(&a.out, "--out")?;
    if let Some(log) = &a.passkey_log {
        posenc_run::check_log(log, "--passkey-log")?;
    }
    // A model that cannot be opened is refused before the lab's experiments
    // run (a FIFO or a missing file, say).
    if let Some(m) = &a.model {
        posenc_run::check_model(m)?;
    }
    if a.finetune_steps == Some(0) {
        return Err(CliError(format!(
            "--finetune-steps must be in 1..={}",
            posenc_report::finetuned::MAX_STEPS
        )));
    }
    let summary = posenc_report::run(&posenc_report::Options {
        out: a.out,
        preset: a.preset,
        only: a.only,
        corpus: a.corpus,
        jobs: match a.jobs {
            Some(0) | Some(257..) => {
                return Err(CliError("--jobs must be in 1..=256".into()));
            }
            j => j,
        },
        model: a.model.clone(),
        passkey_log: a.passkey_log.clone(),
        finetune_steps: a.finetune_steps.unwrap_or(0),
    })?;
    println!("{}", summary.line(&out));
    if a.model.is_none() {
        eprintln!(
            "posenc report: {}",
            posenc_report::NO_MODEL_LINE.replace('`', "")
        );
    }
    Ok(())
}
