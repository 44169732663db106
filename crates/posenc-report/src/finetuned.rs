//! Experiment 8's fine-tuned arm (`posenc report --model M
//! --finetune-steps N`): Position Interpolation ×2 and YaRN ×2, each
//! fine-tuned for N steps with LoRA on PoSE windows (Zhu et al. 2024) of
//! L/4 tokens whose position ids cover 0..2L, then measured as zero-shot:
//! band losses over one window of 2L of the text's held-out part (its last
//! 10% of tokens, which the fine-tune never reads) and passkey retrieval
//! at L/4 … 2L.
//!
//! The recipe is the one `docs/finetune.md` measures on SmolLM2 with
//! `posenc finetune`: LoRA rank 8, alpha 8 (PEFT's default), on
//! `q_proj,k_proj,v_proj,o_proj`, the RMSNorm weights trained beside them
//! (LongLoRA's norms), AdamW at 3e-4 with a linear warm-up over a tenth of
//! the steps and a linear decay, clipping at 1, one window per step, seed
//! 0, activation checkpointing.

use std::path::Path;

use posenc_models::perplexity::{self, ScalingRun};
use posenc_models::{Decoder, DecoderConfig, ModelFiles, Scaling, TextTokenizer};
use posenc_tune::data::{held_out_tokens, TrainText, WindowPlan};
use posenc_tune::train::{Finetune, FinetuneConfig, RunOptions, Sources};
use posenc_tune::{LoraConfig, Target, Trainable};

use crate::corpus::fnv;
use crate::pretrained::{err, model_identity, retrieval, trial_log, Retrieval};
use crate::{ReportError, Result};

/// The scalings fine-tuned, in report order.
pub const SCALINGS: [&str; 2] = ["linear:2", "yarn:2"];

/// Largest `--finetune-steps`.
pub const MAX_STEPS: usize = 100_000;

/// The name of a fine-tuned scaling in tables and JSON.
pub fn tuned_name(scaling: &str) -> String {
    format!("{scaling} + fine-tune")
}

/// What the fine-tuned arm measured.
pub(crate) struct Finetuned {
    /// Steps of each fine-tune.
    pub(crate) steps: usize,
    /// PoSE window (tokens per step).
    pub(crate) window: usize,
    /// Held-out band losses: `none`, each scaling zero-shot, each scaling
    /// fine-tuned ([`tuned_name`]), in that order.
    pub(crate) runs: Vec<ScalingRun>,
    /// Retrieval of the fine-tuned models (methods named [`tuned_name`]).
    pub(crate) retrieval: Option<Retrieval>,
    /// Wall seconds of each fine-tune, and its last step's loss.
    pub(crate) training: Vec<(f64, f64)>,
}

/// The fine-tune of `scaling` on `text` (experiment 8's recipe, see the
/// [module docs](self)).
fn config(scaling: &str, l: usize, steps: usize) -> FinetuneConfig {
    let plan = WindowPlan::Pose {
        window: (l / 4).max(2),
        target: 2 * l,
    };
    let mut c = FinetuneConfig::new(plan, steps, 3e-4);
    c.scaling = scaling.to_string();
    c.warmup = steps / 10;
    c.lora = LoraConfig {
        rank: 8,
        alpha: 8.0,
        dropout: 0.0,
        targets: vec![Target::QProj, Target::KProj, Target::VProj, Target::OProj],
    };
    c.trainable = Trainable {
        embed: false,
        norm: true,
    };
    c.checkpoint_layers = true;
    c
}

/// Checks `--finetune-steps` and the text before any run: at most
/// [`MAX_STEPS`], a held-out part of at least 2L tokens, a training part
/// of at least one window.
pub(crate) fn check(steps: usize, all: &[u32], cfg: &DecoderConfig) -> Result<()> {
    let l = cfg.trained_length();
    if !(1..=MAX_STEPS).contains(&steps) {
        return Err(ReportError(format!(
            "--finetune-steps must be in 1..={MAX_STEPS}"
        )));
    }
    let held = held_out_tokens(all).len();
    if held < 2 * l {
        return Err(ReportError(format!(
            "--finetune-steps: the text's held-out part (its last 10%) is {held} tokens, fewer than 2L = {}; give a longer --corpus",
            2 * l
        )));
    }
    let c = config(SCALINGS[0], l, steps);
    c.validate().map_err(|e| ReportError(e.to_string()))?;
    c.lora
        .validate_for(cfg)
        .map_err(|e| ReportError(e.to_string()))?;
    Ok(())
}

/// Runs the arm (after [`check`]): the base model's held-out bands without scaling and with
/// each of [`SCALINGS`], then each fine-tune, its held-out bands and (with
/// `passkey_trials` > 0) its retrieval, logged in `cache` per model,
/// scaling, steps and code so that a stopped report resumes.
#[allow(clippy::too_many_arguments)]
pub(crate) fn run(
    model: &Path,
    base: &Decoder,
    source: &str,
    tk: &TextTokenizer,
    all: &[u32],
    steps: usize,
    passkey_trials: usize,
    cache: &Path,
) -> Result<Finetuned> {
    let l = base.config().trained_length();
    let t = 2 * l;
    let window = held_out_tokens(all)[..t].to_vec();
    let mut names = vec!["none".to_string()];
    names.extend(SCALINGS.iter().map(|s| s.to_string()));
    let scalings: Vec<Scaling> = names
        .iter()
        .map(|n| n.parse())
        .collect::<posenc_models::Result<_>>()
        .map_err(err)?;
    eprint!("\rposenc report: experiment 8: held-out window, zero-shot   ");
    let mut runs = perplexity::study(base, source, &window, &scalings, 1024, |_, _| {})
        .map_err(err)?
        .runs;
    let mut training = Vec::new();
    let mut found: Vec<Retrieval> = Vec::new();
    for scaling in SCALINGS {
        let c = config(scaling, l, steps);
        let text = TrainText::new(all.to_vec()).map_err(|e| ReportError(e.to_string()))?;
        let sources = Sources {
            model: model.display().to_string(),
            tokenizer: None,
            text: None,
        };
        let tune = |e: posenc_tune::TuneError| ReportError(e.to_string());
        let mut ft = Finetune::new(base, text, c, sources).map_err(tune)?;
        eprintln!("\rposenc report: experiment 8: fine-tuning {scaling}, {steps} steps");
        let summary = ft
            .run(&RunOptions {
                progress: true,
                ..RunOptions::default()
            })
            .map_err(tune)?;
        training.push((summary.seconds, summary.final_loss));
        let adapter = ft.adapter().map_err(tune)?;
        drop(ft);
        let mut tuned = load(model)?;
        adapter
            .merge_into(&mut tuned, Path::new("(experiment 8's fine-tune)"))
            .map_err(tune)?;
        let s: Scaling = scaling.parse().map_err(err)?;
        let mut run = perplexity::study(&tuned, source, &window, &[s], 1024, |_, _| {})
            .map_err(err)?
            .runs
            .remove(0);
        run.name = tuned_name(scaling);
        runs.push(run);
        if passkey_trials > 0 && t >= posenc_models::passkey::MIN_LENGTH {
            let mut log = tuned_log(cache, model, source, tk, scaling, steps)?;
            let mut r = retrieval(
                &tuned,
                tk,
                l,
                passkey_trials,
                &[scaling.to_string()],
                &mut log,
                crate::pretrained::ID,
            )?;
            r.methods = vec![tuned_name(scaling)];
            found.push(r);
        }
    }
    let retrieval = found.into_iter().reduce(|mut a, b| {
        a.methods.extend(b.methods);
        a.accuracy.extend(b.accuracy);
        a.logprob.extend(b.logprob);
        a.by_depth.extend(b.by_depth);
        a.seconds += b.seconds;
        a
    });
    Ok(Finetuned {
        steps,
        window: config(SCALINGS[0], l, steps).plan.window(),
        runs,
        retrieval,
        training,
    })
}

/// The model loaded afresh (the fine-tuned weights are merged into a copy).
fn load(model: &Path) -> Result<Decoder> {
    let mut files = ModelFiles::open(model).map_err(err)?;
    let cfg = files.config().map_err(err)?;
    Ok(files.load(cfg).map_err(err)?.0)
}

/// The trial log of one fine-tuned model: its own file in `cache`, named
/// by the model, the scaling, the steps and the code of the fine-tune and
/// the probe, with a header naming the fine-tune (so that it is never
/// mistaken for the base model's log).
fn tuned_log(
    cache: &Path,
    model: &Path,
    source: &str,
    tk: &TextTokenizer,
    scaling: &str,
    steps: usize,
) -> Result<posenc_models::passkey::TrialLog> {
    let key = format!(
        "{:016x}|{scaling}|{steps}|{:016x}|{:016x}|{:016x}",
        model_identity(model)?,
        fnv(include_str!("finetuned.rs").as_bytes()),
        fnv(include_str!("../../posenc-tune/src/train.rs").as_bytes()),
        fnv(include_str!("../../posenc-models/src/passkey/mod.rs").as_bytes()),
    );
    std::fs::create_dir_all(cache)?;
    let path = cache.join(format!(
        "passkey-finetuned-{:016x}.jsonl",
        fnv(key.as_bytes())
    ));
    let source = format!(
        "{source}; {} ({steps} steps, experiment 8's recipe)",
        tuned_name(scaling)
    );
    trial_log(cache, Some(&path), model, &source, tk)
}
