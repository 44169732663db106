//! `posenc train`, `posenc finetune`, `posenc eval`, `posenc probe`,
//! `posenc shuffle`: the lab on the command line.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Args;
use posenc_lab::bpe::Tokenization;
use posenc_lab::config::{PeConfig, TrainConfig};
use posenc_lab::finetune::{self, scaling_at, FinetuneOptions};
use posenc_lab::optim::AdamW;
use posenc_lab::tasks::TaskKind;
use posenc_lab::train::{self, Lab, Summary, TrainOptions};
use posenc_lab::LabError;

use crate::cmd_finetune::FinetuneArgs;
use crate::{CliError, CliResult};

impl From<LabError> for CliError {
    fn from(e: LabError) -> Self {
        CliError(e.to_string())
    }
}

/// Arguments of `posenc train`.
#[derive(Args, Debug)]
pub struct TrainArgs {
    /// Task: copy, reverse, sort, count, addition, order, lm, mlm.
    #[arg(long)]
    pub task: String,
    /// Positional encoding: nope, sinusoidal, sinusoidal-concat, learned,
    /// floater, rope, rope-interleaved, xpos, alibi, t5, shaw, irope (RoPE
    /// with a NoPE layer every 4th, as Llama 4), fire, cope, fox
    /// (forgetting attention; decoders only).
    #[arg(long)]
    pub pe: String,
    /// Number of blocks.
    #[arg(long, default_value_t = 2)]
    pub layers: usize,
    /// Model width.
    #[arg(long = "d-model", default_value_t = 64)]
    pub d_model: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Training sequence length.
    #[arg(long = "train-len", default_value_t = 32)]
    pub train_len: usize,
    /// Largest length the model will be evaluated at (size of a learned table).
    #[arg(long = "max-len")]
    pub max_len: Option<usize>,
    /// Optimiser steps.
    #[arg(long, default_value_t = 500)]
    pub steps: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Peak learning rate.
    #[arg(long, default_value_t = 3e-3, allow_hyphen_values = true)]
    pub lr: f64,
    /// Warm-up steps.
    #[arg(long, default_value_t = 50)]
    pub warmup: usize,
    /// Seed of weights and data.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Content symbols of the synthetic tasks.
    #[arg(long, default_value_t = 16)]
    pub symbols: u32,
    /// Shaw's clipping distance k.
    #[arg(long = "shaw-k", default_value_t = 16)]
    pub shaw_k: usize,
    /// UTF-8 text file for `--task lm` or `--task mlm` (default: the
    /// built-in grammar). Training reads its first 90%; `posenc eval`,
    /// `probe` and `shuffle` read only its last 10%.
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Tokens of `--task lm` or `--task mlm`: `chars` (one per character)
    /// or `bpe:N` (byte-level BPE of N tokens, 256..=8192, trained on the
    /// training part only, cached, and saved beside the checkpoint as
    /// tokenizer.json).
    #[arg(long, default_value = "chars")]
    pub tokens: String,
    /// Checkpoint directory.
    #[arg(long)]
    pub out: PathBuf,
    #[command(flatten)]
    pub run: RunFlags,
}

/// `--resume` and `--quiet`, as `posenc train` and `posenc finetune` take
/// them.
#[derive(Args, Debug)]
pub struct RunFlags {
    /// Continue the interrupted run saved in --out.
    #[arg(long)]
    pub resume: bool,
    /// No progress output.
    #[arg(long)]
    pub quiet: bool,
}

/// Arguments of `posenc eval`.
#[derive(Args, Debug)]
pub struct EvalArgs {
    /// Checkpoint directory.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Comma-separated evaluation lengths.
    #[arg(long, default_value = "32,64,128")]
    pub lengths: String,
    /// RoPE scaling at evaluation time: none, linear, ntk, dynamic, yarn
    /// (factor = length / training length, at least 1), or one with a
    /// fixed factor (linear:F, ntk:F, dynamic:F, yarn:F; F >= 1). Default:
    /// the scaling the checkpoint was fine-tuned with, if any, else none.
    #[arg(long)]
    pub scaling: Option<String>,
    /// Batches of 32 sequences per length.
    #[arg(long, default_value_t = 4)]
    pub batches: usize,
    /// Print JSON (`{"lengths": [...], "loss": [...], "accuracy": [...]}`).
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `posenc probe` and `posenc shuffle`.
#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// Checkpoint directory.
    #[arg(long)]
    pub checkpoint: PathBuf,
    /// Sequence length (default: the training length).
    #[arg(long)]
    pub length: Option<usize>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn train(a: TrainArgs) -> CliResult {
    let task_kind = TaskKind::parse(&a.task)?;
    let tokens = Tokenization::parse(&a.tokens)?;
    let stop = ctrl_c_flag();
    let (mut lab, mut opt) = if a.run.resume {
        let (lab, opt) = Lab::load_resumable(&a.out)?;
        if lab.meta.finetune.is_some() {
            return Err(CliError(format!(
                "{} is a fine-tune: resume it with posenc finetune --resume --out {}",
                a.out.display(),
                a.out.display()
            )));
        }
        eprintln!("resuming {} at step {}", a.out.display(), lab.meta.step);
        (lab, opt)
    } else {
        refuse_existing_checkpoint(&a.out)?;
        let max_len = a.max_len.unwrap_or(a.train_len * 8).max(a.train_len);
        let train = TrainConfig {
            task: task_kind,
            n_symbols: a.symbols,
            train_len: a.train_len,
            steps: a.steps,
            batch: a.batch,
            lr: a.lr,
            warmup: a.warmup.min(a.steps),
            min_lr_frac: 0.1,
            weight_decay: 0.01,
            grad_clip: 1.0,
            seed: a.seed,
            log_every: (a.steps / 50).max(1),
            corpus: a.corpus.clone(),
        };
        let task = train::load_task_in(&train, tokens, None)?;
        let pe = PeConfig::parse(&a.pe, max_len, a.shaw_k)?;
        let model = task.model_config(task_kind.mode(), a.d_model, a.layers, a.heads, pe);
        let lab = Lab::new(model, train, task)?;
        let opt = AdamW::new(lab.params(), lab.meta.train.weight_decay).map_err(LabError::from)?;
        (lab, opt)
    };
    let summary = train_with_progress(&mut lab, &mut opt, &a.out, a.run.quiet, &stop)?;
    println!(
        "{}: {}",
        headline(&summary, &lab, "trained", "interrupted"),
        summary_line(&summary, &lab, &a.out)
    );
    exit_if_interrupted(&summary);
    Ok(())
}

/// A flag that Ctrl-C sets: training finishes the step, writes a
/// checkpoint and returns; the command then exits with 130.
pub(crate) fn ctrl_c_flag() -> Arc<AtomicBool> {
    let stop = Arc::new(AtomicBool::new(false));
    let flag = stop.clone();
    let _ = ctrlc::set_handler(move || flag.store(true, Ordering::SeqCst));
    stop
}

/// Trains `lab` to its configured step count, checkpointing into `out`,
/// with a progress bar (unless `quiet`) and Ctrl-C handling.
fn train_with_progress(
    lab: &mut Lab,
    opt: &mut AdamW,
    out: &Path,
    quiet: bool,
    stop: &AtomicBool,
) -> CliResult<Summary> {
    Ok(train::train(
        lab,
        opt,
        &TrainOptions {
            out,
            progress: true,
            quiet,
            stop: Some(stop),
            pause_at: None,
        },
    )?)
}

/// A fresh run never writes over a checkpoint.
fn refuse_existing_checkpoint(out: &Path) -> CliResult {
    if out.join("config.json").exists() {
        return Err(CliError(format!(
            "{} already holds a checkpoint: pass --resume to continue it, or choose another --out",
            out.display()
        )));
    }
    Ok(())
}

/// `done` (or `stopped`, for an interrupted run), the task and the
/// encoding: `trained copy with rope`.
fn headline(summary: &Summary, lab: &Lab, done: &str, stopped: &str) -> String {
    format!(
        "{} {} with {}",
        if summary.interrupted { stopped } else { done },
        lab.meta.train.task.name(),
        lab.meta.model.pe.label()
    )
}

/// Steps, loss, accuracy, speed and checkpoint of a finished (or
/// interrupted) run.
fn summary_line(summary: &Summary, lab: &Lab, out: &Path) -> String {
    format!(
        "step {}/{}, loss {:.4}, accuracy {:.1}%, {:.0} tokens/s, {:.1} s{}; checkpoint in {}",
        summary.steps,
        lab.meta.train.steps,
        summary.final_loss,
        summary.final_accuracy * 100.0,
        summary.tokens_per_s,
        summary.seconds,
        if summary.interrupted { " (Ctrl-C)" } else { "" },
        out.display()
    )
}

/// Exit status 130 after Ctrl-C (the checkpoint is written by then).
fn exit_if_interrupted(summary: &Summary) {
    if summary.interrupted {
        std::process::exit(130);
    }
}

pub fn finetune(a: FinetuneArgs) -> CliResult {
    let stop = ctrl_c_flag();
    if a.model.is_some() || (a.run.resume && posenc_run::finetune::is_model_finetune(&a.out)) {
        return crate::cmd_finetune::model_finetune(&a, &stop);
    }
    if a.text.is_some() || a.tokenizer.is_some() || a.merge {
        return Err(CliError(
            "--text, --tokenizer and --merge are for --model (a pretrained model)".into(),
        ));
    }
    let (lab, summary) = if a.run.resume {
        let (mut lab, mut opt) = Lab::load_resumable(&a.out)?;
        if lab.meta.finetune.is_none() {
            return Err(CliError(format!(
                "{} is not a fine-tune: resume it with posenc train --resume",
                a.out.display()
            )));
        }
        if !a.run.quiet {
            eprintln!("resuming {} at step {}", a.out.display(), lab.meta.step);
        }
        let summary = train_with_progress(&mut lab, &mut opt, &a.out, a.run.quiet, &stop)?;
        (lab, summary)
    } else {
        let need = |what: &str| CliError(format!("--{what} is required (or --resume)"));
        let base = a.checkpoint.as_deref().ok_or_else(|| need("checkpoint"))?;
        let len = a.len.ok_or_else(|| need("len"))?;
        let steps = a.steps.ok_or_else(|| need("steps"))?;
        if finetune::same_dir(base, &a.out) {
            return Err(CliError(format!(
                "--out {} is the base checkpoint: choose another directory (the base is never overwritten)",
                a.out.display()
            )));
        }
        if let Some(s) = &a.scaling {
            finetune::parse_scaling(s)?;
        }
        refuse_existing_checkpoint(&a.out)?;
        let mut lab = Lab::load(base)?;
        let mut o = FinetuneOptions::new(len, steps, a.lr.unwrap_or(1e-3));
        o.warmup = a.warmup.unwrap_or(0);
        o.scaling = scaling_at(&lab, a.scaling.as_deref(), len)?;
        o.seed = a.seed;
        o.batch = a.batch;
        o.base = Some(base);
        o.out = Some(&a.out);
        o.progress = true;
        o.quiet = a.run.quiet;
        o.stop = Some(&stop);
        let summary = finetune::finetune(&mut lab, &o)?;
        (lab, summary)
    };
    let record = lab.meta.finetune.as_ref().expect("a fine-tuned checkpoint");
    if a.json {
        let mut v = serde_json::to_value(&summary)?;
        v["out"] = serde_json::json!(a.out.display().to_string());
        v["finetune"] = serde_json::to_value(record)?;
        println!("{v}");
    } else {
        println!(
            "{} at {} (trained at {}), scaling {}: {}",
            headline(&summary, &lab, "fine-tuned", "interrupted fine-tuning"),
            record.len,
            record.base_train.train_len,
            record.scaling.as_ref().map_or("none".into(), |s| s.label()),
            summary_line(&summary, &lab, &a.out)
        );
    }
    exit_if_interrupted(&summary);
    Ok(())
}

fn parse_lengths(s: &str) -> CliResult<Vec<usize>> {
    let v: Result<Vec<usize>, _> = s.split(',').map(|x| x.trim().parse::<usize>()).collect();
    let v = v.map_err(|_| CliError(format!("invalid --lengths {s:?}: expected e.g. 32,64,128")))?;
    if v.is_empty() || v.contains(&0) {
        return Err(CliError(format!(
            "invalid --lengths {s:?}: lengths must be ≥ 1"
        )));
    }
    Ok(v)
}

pub fn eval(a: EvalArgs) -> CliResult {
    // Scored on the corpus's validation text (its last 10%), never trained on.
    let mut lab = Lab::load(&a.checkpoint)?;
    lab.task = lab.task.validation();
    let lengths = parse_lengths(&a.lengths)?;
    let train_len = lab.meta.train.train_len;
    let mut res = train::EvalResult {
        lengths: vec![],
        loss: vec![],
        accuracy: vec![],
        bits_per_char: vec![],
    };
    let mut used = Vec::new();
    for &len in &lengths {
        // A length no evaluation budget holds is refused before its scaling
        // (whose factor grows with the length) is built.
        posenc_lab::eval::micro_batch(&lab.model, len, 1)?;
        let spec = scaling_at(&lab, a.scaling.as_deref(), len)?;
        let scaling = spec
            .as_ref()
            .map(|s| s.build(&lab.meta.model))
            .transpose()?;
        let r = train::evaluate(&lab, &[len], a.batches, 32, scaling.as_ref())?;
        res.lengths.push(len);
        res.loss.push(r.loss[0]);
        res.accuracy.push(r.accuracy[0]);
        res.bits_per_char.push(r.bits_per_char[0]);
        used.push(spec.map_or("none".to_string(), |s| s.label()));
    }
    if a.json {
        let mut v = serde_json::to_value(&res)?;
        v["scaling"] = serde_json::json!(used);
        println!("{v}");
    } else {
        let how = match (&a.scaling, lab.meta.finetune.as_ref()) {
            (Some(s), _) => s.clone(),
            (None, Some(f)) if f.scaling.is_some() => "as fine-tuned".into(),
            (None, _) => "none".into(),
        };
        let trained = match &lab.meta.finetune {
            Some(f) => format!(
                "trained at {}, fine-tuned at {train_len}",
                f.base_train.train_len
            ),
            None => format!("trained at {train_len}"),
        };
        let corpus = lab.task.corpus();
        println!(
            "{} with {} ({trained}{}), scaling {how}",
            lab.meta.train.task.name(),
            lab.meta.model.pe.label(),
            corpus.map_or(String::new(), |c| format!(
                ", tokens {}, unigram {:.4} nats/token = {:.4} bits/char",
                c.tokenization().label(),
                c.unigram_entropy(),
                c.unigram_bits_per_char()
            )),
        );
        let mut header: Vec<String> = vec!["length".into(), "loss".into()];
        if corpus.is_some() {
            header.push("bits/char".into());
        }
        header.extend(["accuracy".into(), "scaling".into()]);
        let rows: Vec<Vec<String>> = (0..res.lengths.len())
            .map(|i| {
                let mut row = vec![res.lengths[i].to_string(), format!("{:.4}", res.loss[i])];
                if corpus.is_some() {
                    row.push(format!("{:.4}", res.bits_per_char[i]));
                }
                row.extend([format!("{:.1}%", res.accuracy[i] * 100.0), used[i].clone()]);
                row
            })
            .collect();
        print!("{}", crate::output::table(&header, &rows));
    }
    Ok(())
}

/// The checkpoint of `a`, scored on its corpus's validation text (its last
/// 10%, never trained on), and the length asked (default: the trained one).
fn validation_lab(a: &ProbeArgs) -> CliResult<(Lab, usize)> {
    let mut lab = Lab::load(&a.checkpoint)?;
    lab.task = lab.task.validation();
    let len = a.length.unwrap_or(lab.meta.train.train_len);
    Ok((lab, len))
}

pub fn probe(a: ProbeArgs) -> CliResult {
    let (lab, len) = validation_lab(&a)?;
    let r = train::probe(&lab, len, 4, 16)?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!(
            "linear probe of absolute position (length {len}); random baseline MAE {:.2}",
            r.baseline_mae
        );
        let rows: Vec<Vec<String>> = r
            .mae
            .iter()
            .enumerate()
            .map(|(l, m)| {
                vec![
                    if l == 0 {
                        "input".into()
                    } else {
                        format!("block {l}")
                    },
                    format!("{m:.2}"),
                    format!("{:.2}", m / r.baseline_mae),
                ]
            })
            .collect();
        print!(
            "{}",
            crate::output::table(
                &["layer".into(), "MAE".into(), "MAE / baseline".into()],
                &rows
            )
        );
    }
    Ok(())
}

pub fn shuffle(a: ProbeArgs) -> CliResult {
    let (lab, len) = validation_lab(&a)?;
    let r = train::shuffle_test(&lab, len, (len / 4).max(1), 4, 16)?;
    if a.json {
        println!("{}", serde_json::to_string(&r)?);
    } else {
        println!("loss on the last quarter of {len}-token windows:");
        println!("  prefix in order   {:.4}", r.in_order);
        println!("  prefix shuffled   {:.4}", r.shuffled);
        if let Some(u) = r.unigram {
            println!("  unigram entropy   {u:.4}");
        }
    }
    Ok(())
}
