//! `posenc train`, `posenc eval`, `posenc probe`, `posenc shuffle`: the lab
//! on the command line.

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use clap::Args;
use posenc_lab::config::{ModelConfig, PeConfig, TrainConfig};
use posenc_lab::model::EvalScaling;
use posenc_lab::optim::AdamW;
use posenc_lab::tasks::TaskKind;
use posenc_lab::train::{self, Lab, TrainOptions};
use posenc_lab::LabError;

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
    /// floater, rope, rope-interleaved, xpos, alibi, t5, shaw.
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
    /// built-in grammar).
    #[arg(long)]
    pub corpus: Option<PathBuf>,
    /// Checkpoint directory.
    #[arg(long)]
    pub out: PathBuf,
    /// Continue the run saved in --out.
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
    /// (factor = length / training length, at least 1).
    #[arg(long, default_value = "none")]
    pub scaling: String,
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
    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        // Ctrl-C: finish the step, write a checkpoint, exit.
        let _ = ctrlc::set_handler(move || stop.store(true, Ordering::SeqCst));
    }
    let (mut lab, mut opt) = if a.resume {
        let lab = Lab::load(&a.out)?;
        let mut opt = AdamW::new(lab.params(), lab.meta.train.weight_decay)?;
        let st = candle_core::safetensors::load(
            a.out.join("optimizer.safetensors"),
            &candle_core::Device::Cpu,
        )
        .map_err(|e| {
            CliError(format!(
                "{}: corrupt or missing optimizer state: {e}",
                a.out.display()
            ))
        })?;
        let step = st
            .get("__step")
            .and_then(|t| t.to_vec1::<u32>().ok())
            .map(|v| v[0] as usize);
        if step != Some(lab.meta.step) {
            return Err(CliError(format!(
                "{}: optimizer state is from step {step:?}, the model from step {}: the checkpoint is torn",
                a.out.display(),
                lab.meta.step
            )));
        }
        opt.load_state(&st)?;
        eprintln!("resuming {} at step {}", a.out.display(), lab.meta.step);
        (lab, opt)
    } else {
        if a.out.join("config.json").exists() {
            return Err(CliError(format!(
                "{} already holds a checkpoint: pass --resume to continue it, or choose another --out",
                a.out.display()
            )));
        }
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
        let task = train::load_task(&train)?;
        let model = ModelConfig {
            mode: task_kind.mode(),
            vocab_size: task.vocab_size(),
            num_outputs: task.num_outputs(),
            d_model: a.d_model,
            n_layers: a.layers,
            n_heads: a.heads,
            d_ff: 4 * a.d_model,
            tied: true,
            pe: PeConfig::parse(&a.pe, max_len, a.shaw_k)?,
        };
        let lab = Lab::new(model, train, task)?;
        let opt = AdamW::new(lab.params(), lab.meta.train.weight_decay)?;
        (lab, opt)
    };
    let summary = train::train(
        &mut lab,
        &mut opt,
        &TrainOptions {
            out: &a.out,
            progress: true,
            quiet: a.quiet,
            stop: Some(&stop),
            pause_at: None,
        },
    )?;
    println!(
        "{} {} with {}: step {}/{}, loss {:.4}, accuracy {:.1}%, {:.0} tokens/s, {:.1} s{}; checkpoint in {}",
        if summary.interrupted { "interrupted" } else { "trained" },
        lab.meta.train.task.name(),
        lab.meta.model.pe.label(),
        summary.steps,
        lab.meta.train.steps,
        summary.final_loss,
        summary.final_accuracy * 100.0,
        summary.tokens_per_s,
        summary.seconds,
        if summary.interrupted { " (Ctrl-C)" } else { "" },
        a.out.display()
    );
    if summary.interrupted {
        std::process::exit(130);
    }
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
    let lab = Lab::load(&a.checkpoint)?;
    let lengths = parse_lengths(&a.lengths)?;
    let train_len = lab.meta.train.train_len;
    let mut res = train::EvalResult {
        lengths: vec![],
        loss: vec![],
        accuracy: vec![],
    };
    for &len in &lengths {
        let scaling = if a.scaling == "none" {
            None
        } else {
            let factor = (len as f64 / train_len as f64).max(1.0);
            Some(EvalScaling::new(
                &lab.meta.model,
                &a.scaling,
                factor,
                train_len,
            )?)
        };
        let r = train::evaluate(&lab, &[len], a.batches, 32, scaling.as_ref())?;
        res.lengths.push(len);
        res.loss.push(r.loss[0]);
        res.accuracy.push(r.accuracy[0]);
    }
    if a.json {
        println!("{}", serde_json::to_string(&res)?);
    } else {
        println!(
            "{} with {} (trained at {train_len}), scaling {}",
            lab.meta.train.task.name(),
            lab.meta.model.pe.label(),
            a.scaling
        );
        let rows: Vec<Vec<String>> = (0..res.lengths.len())
            .map(|i| {
                vec![
                    res.lengths[i].to_string(),
                    format!("{:.4}", res.loss[i]),
                    format!("{:.1}%", res.accuracy[i] * 100.0),
                ]
            })
            .collect();
        print!(
            "{}",
            crate::output::table(&["length".into(), "loss".into(), "accuracy".into()], &rows)
        );
    }
    Ok(())
}

pub fn probe(a: ProbeArgs) -> CliResult {
    let lab = Lab::load(&a.checkpoint)?;
    let len = a.length.unwrap_or(lab.meta.train.train_len);
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
    let lab = Lab::load(&a.checkpoint)?;
    let len = a.length.unwrap_or(lab.meta.train.train_len);
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
