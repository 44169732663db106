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
    /// Milliseconds per full training step (batch, forward, backward,
    /// clipping, AdamW) of a lab decoder (default 4 layers, d_model 128, 4
    /// heads, length 128, batch 32, the copy task's 32-token vocabulary)
    /// with each positional encoding. `scripts/bench/torch_twin.py` times the
    /// same model in PyTorch (`scripts/bench/train_vs_torch.sh` runs both).
    Train(BenchTrainArgs),
}

/// Arguments of `posenc bench train`.
#[derive(Args, Debug)]
pub struct BenchTrainArgs {
    /// Timed steps per encoding (after one warm-up step); the median is reported.
    #[arg(long, default_value_t = 5)]
    pub steps: usize,
    /// Only these encodings (comma-separated names, as `posenc train --pe`).
    #[arg(long)]
    pub pe: Option<String>,
    /// Number of blocks.
    #[arg(long, default_value_t = 4)]
    pub layers: usize,
    /// Model width.
    #[arg(long = "d-model", default_value_t = 128)]
    pub d_model: usize,
    /// Attention heads.
    #[arg(long, default_value_t = 4)]
    pub heads: usize,
    /// Sequence length.
    #[arg(long = "len", default_value_t = 128)]
    pub len: usize,
    /// Sequences per step.
    #[arg(long, default_value_t = 32)]
    pub batch: usize,
    /// Time the composed candle reference ops instead of the fused ones.
    #[arg(long)]
    pub reference: bool,
    /// Print JSON (`{"model": {...}, "simd": "avx512", "cases": [{"pe", "params", "ms_per_step", "tokens_per_s", "relative_to_nope"}, ...]}`).
    #[arg(long)]
    pub json: bool,
}

/// One encoding's training throughput.
#[derive(Debug, serde::Serialize)]
struct TrainCase {
    pe: String,
    params: usize,
    ms_per_step: f64,
    tokens_per_s: f64,
    relative_to_nope: f64,
}

fn bench_train(a: BenchTrainArgs) -> CliResult {
    use posenc_lab::config::{Mode, PeConfig, TrainConfig};
    use posenc_lab::tasks::{Task, TaskKind};
    if a.steps == 0 {
        return Err(crate::CliError("--steps must be at least 1".into()));
    }
    for (what, v, max) in [
        ("--layers", a.layers, 64),
        ("--d-model", a.d_model, 4096),
        ("--heads", a.heads, 256),
        ("--len", a.len, 1 << 16),
        ("--batch", a.batch, 1 << 12),
        ("--steps", a.steps, 100_000),
    ] {
        if v == 0 || v > max {
            return Err(crate::CliError(format!(
                "{what} must be in 1..={max} (got {v})"
            )));
        }
    }
    if a.len.saturating_mul(a.batch).saturating_mul(a.d_model) > 1 << 30 {
        return Err(crate::CliError(
            "--len × --batch × --d-model must stay below 2^30 activations".into(),
        ));
    }
    let names: Vec<String> = match &a.pe {
        Some(list) => list.split(',').map(|s| s.trim().to_string()).collect(),
        None => PeConfig::NAMES.iter().map(|s| s.to_string()).collect(),
    };
    let (layers, d, heads, len, batch) = (a.layers, a.d_model, a.heads, a.len, a.batch);
    let mut cases: Vec<TrainCase> = Vec::new();
    for name in &names {
        let task = Task::new(TaskKind::Copy, 16)?;
        let pe = PeConfig::parse(name, len, 16)?;
        let model = task.model_config(Mode::Decoder, d, layers, heads, pe);
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
        lab.model.set_fused(!a.reference);
        let params: usize = lab.params().values().map(|v| v.elem_count()).sum();
        let mut opt = posenc_lab::optim::AdamW::new(lab.params(), 0.01)
            .map_err(posenc_lab::LabError::from)?;
        let mut times = posenc_lab::train::time_steps(&mut lab, &mut opt, a.steps + 1)?;
        times.remove(0); // warm-up
        times.sort_by(f64::total_cmp);
        let median = times[times.len() / 2];
        eprintln!("  {name:<18} {:8.2} ms/step", median * 1e3);
        cases.push(TrainCase {
            pe: name.clone(),
            params,
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
            "ops": if a.reference { "reference" } else { "fused" },
            "threads": rayon_threads(),
            "simd": posenc::kernels::SimdLevel::detect().as_str(),
            "allocator": crate::ALLOCATOR,
            "cases": cases.iter().map(|c| serde_json::json!({
                "pe": c.pe, "params": c.params, "ms_per_step": c.ms_per_step, "tokens_per_s": c.tokens_per_s,
                "relative_to_nope": if c.relative_to_nope.is_finite() { serde_json::json!(c.relative_to_nope) } else { serde_json::Value::Null },
            })).collect::<Vec<_>>(),
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "training step, {layers} layers, d_model {d}, {heads} heads, length {len}, batch {batch} ({} ops, median of {} steps, {} threads, {} kernels, {} allocator)",
            if a.reference { "composed reference" } else { "fused" },
            a.steps,
            rayon_threads(),
            posenc::kernels::SimdLevel::detect(),
            crate::ALLOCATOR
        );
        let rows: Vec<Vec<String>> = cases
            .iter()
            .map(|c| {
                vec![
                    c.pe.clone(),
                    c.params.to_string(),
                    format!("{:.2}", c.ms_per_step),
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
                    "params".into(),
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

fn rayon_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .min(
            std::env::var("RAYON_NUM_THREADS")
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(usize::MAX),
        )
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
                     see docs/kernels.md)",
                    crate::ALLOCATOR
                );
            }
            Ok(())
        }
    }
}
