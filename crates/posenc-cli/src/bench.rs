//! `posenc bench rope [--json] [--quick]`: the RoPE benchmark
//! (`posenc::kernels::bench`), printed as a table or as JSON.

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
        BenchCommand::Rope(a) => {
            let report = rope_bench(BenchOptions { quick: a.quick })?;
            if a.json {
                println!("{}", serde_json::to_string_pretty(&report)?);
            } else {
                print!("{}", report.to_text());
            }
            Ok(())
        }
    }
}
