//! `posenc bench rope [--json] [--quick]`: the RoPE benchmark
//! (`posenc::kernels::bench`), and `posenc bench train`: training
//! throughput of the lab's reference model per encoding.

use clap::{Args, Subcommand};
use posenc::kernels::bench::{rope_bench, BenchOptions};

use crate::CliResult;

/// Benchmarks.
#[derive(Subcommand, Debug)]
pub enum BenchCommand {
    /// posenc's RoPE (in place and out of place) against candle-nn's `rope`,
    /// `rope_i`, `rope_thd` and a plain copy of the same bytes, on prefill,
    /// batch, decode and (B, T, H, D) shapes in f32 and bf16; plus the time
    /// to build an exact 131072 × 64 cos/sin cache.
    Rope(BenchRopeArgs),
    /// Tokens per second of a full training step (forward, backward, AdamW)
    /// of the reference lab model (4 layers, d_model 128, 4 heads, length
    /// 128, batch 32) with each positional encoding.
    Train(BenchTrainArgs),
}

/// Arguments of `posenc bench train`.
#[derive(Args, Debug)]
pub struct BenchTrainArgs {
    /// Timed steps per encoding (after one warm-up step).
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    /// Only these encodings (comma-separated names, as `posenc train --pe`).
    #[arg(long)]
    pub pe: Option<String>,
    /// Print JSON (`{"model": {...}, "cases": [{"pe", "ms_per_step", "tokens_per_s"}, ...]}`).
    #[arg(long)]
    pub json: bool,
}

/// One encoding's training throughput.
#[derive(Debug, serde::Serialize)]
struct TrainCase {
    pe: String,
    ms_per_step: f64,
    tokens_per_s: f64,
    relative_to_nope: f64,
}

fn bench_train(a: BenchTrainArgs) -> CliResult {
    use posenc_lab::config::{Mode, ModelConfig, PeConfig, TrainConfig};
    use posenc_lab::tasks::{Task, TaskKind};
    if a.steps == 0 {
        return Err(crate::CliError("--steps must be at least 1".into()));
    }
    let names: Vec<String> = match &a.pe {
        Some(list) => list.split(',').map(|s| s.trim().to_string()).collect(),
        None => PeConfig::NAMES.iter().map(|s| s.to_string()).collect(),
    };
    let (layers, d, heads, len, batch) = (4, 128, 4, 128, 32);
    let mut cases: Vec<TrainCase> = Vec::new();
    for name in &names {
        let task = Task::new(TaskKind::Copy, 16)?;
        let model = ModelConfig {
            mode: Mode::Decoder,
            vocab_size: task.vocab_size(),
            num_outputs: task.num_outputs(),
            d_model: d,
            n_layers: layers,
            n_heads: heads,
            d_ff: 4 * d,
            tied: true,
            pe: PeConfig::parse(name, len, 16)?,
        };
        let train = TrainConfig {
            task: TaskKind::Copy,
            n_symbols: 16,
            train_len: len,
            steps: a.steps + 1,
            batch,
            lr: 1e-3,
            warmup: 1,
            min_lr_frac: 0.1,
            weight_decay: 0.01,
            grad_clip: 1.0,
            seed: 0,
            log_every: 1,
            corpus: None,
        };
        let mut lab = posenc_lab::train::Lab::new(model, train, task)?;
        let mut opt = posenc_lab::optim::AdamW::new(lab.params(), 0.01)?;
        let mut times = posenc_lab::train::time_steps(&mut lab, &mut opt, a.steps + 1)?;
        times.remove(0); // warm-up
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        eprintln!("  {name:<18} {:8.1} ms/step", median * 1e3);
        cases.push(TrainCase {
            pe: name.clone(),
            ms_per_step: median * 1e3,
            tokens_per_s: (batch * len) as f64 / median,
            relative_to_nope: f64::NAN,
        });
    }
    if let Some(base) = cases
        .iter()
        .find(|c| c.pe == "nope")
        .map(|c| c.tokens_per_s)
    {
        for c in cases.iter_mut() {
            c.relative_to_nope = c.tokens_per_s / base;
        }
    }
    if a.json {
        let v = serde_json::json!({
            "model": {"layers": layers, "d_model": d, "heads": heads, "length": len, "batch": batch},
            "threads": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
            "allocator": crate::ALLOCATOR,
            "cases": cases.iter().map(|c| serde_json::json!({
                "pe": c.pe, "ms_per_step": c.ms_per_step, "tokens_per_s": c.tokens_per_s,
                "relative_to_nope": if c.relative_to_nope.is_finite() { serde_json::json!(c.relative_to_nope) } else { serde_json::Value::Null },
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "training step, {layers} layers, d_model {d}, {heads} heads, length {len}, batch {batch} (median of {} steps, {} allocator)",
            a.steps,
            crate::ALLOCATOR
        );
        let rows: Vec<Vec<String>> = cases
            .iter()
            .map(|c| {
                vec![
                    c.pe.clone(),
                    format!("{:.1}", c.ms_per_step),
                    format!("{:.0}", c.tokens_per_s),
                    if c.relative_to_nope.is_finite() {
                        format!("{:.2}", c.relative_to_nope)
                    } else {
                        "-".into()
                    },
                ]
            })
            .collect();
        print!(
            "{}",
            crate::output::table(
                &[
                    "encoding".into(),
                    "ms/step".into(),
                    "tokens/s".into(),
                    "vs NoPE".into()
                ],
                &rows
            )
        );
    }
    Ok(())
}

/// Arguments of `posenc bench rope`.
#[derive(Args, Debug)]
pub struct BenchRopeArgs {
    /// Print JSON (`{"cases": [{"shape", "layout", "dtype", "impl", "ms", "gbps"}, ...], "cache_ms": ...}`).
    #[arg(long)]
    pub json: bool,
    /// Fewer repetitions (a rough figure in a few seconds).
    #[arg(long)]
    pub quick: bool,
}

pub fn run(cmd: BenchCommand) -> CliResult {
    match cmd {
        BenchCommand::Train(a) => bench_train(a),
        BenchCommand::Rope(a) => {
            let report = rope_bench(BenchOptions { quick: a.quick })?;
            if a.json {
                let mut v = serde_json::to_value(&report)?;
                v["allocator"] = serde_json::Value::from(crate::ALLOCATOR);
                println!("{}", serde_json::to_string_pretty(&v)?);
            } else {
                print!("{}", report.to_text());
                println!(
                    "allocator: {} (out-of-place timings include faulting in fresh output pages; \
                     see README, Speed)",
                    crate::ALLOCATOR
                );
            }
            Ok(())
        }
    }
}
