//! `posenc`: inspect a model's RoPE, print, draw and measure encodings, and
//! write the report.
//!
//! Every error on user input — clap's usage errors included — prints one
//! line, `posenc: error: ...`, and exits with status 2.

mod args;
mod bench;
mod cmd_bias;
mod cmd_explore;
mod cmd_finetune;
mod cmd_lab;
mod cmd_models;
mod cmd_passkey;
mod cmd_rope;
mod cmd_table;
mod output;
mod report;
mod viz;

use clap::{Parser, Subcommand};

/// With `--features mimalloc` the binary allocates with mimalloc, which keeps
/// freed memory for reuse: out-of-place RoPE then skips the page faults of a
/// fresh output (see docs/kernels.md), but some lab models train slower.
#[cfg(feature = "mimalloc")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The global allocator this binary was built with (printed by `posenc bench`).
pub(crate) const ALLOCATOR: &str = if cfg!(feature = "mimalloc") {
    "mimalloc"
} else if cfg!(all(target_os = "linux", target_env = "gnu")) {
    "glibc, tuned"
} else {
    "system"
};

/// Positional encodings for transformers: tables, biases, RoPE inspection,
/// pictures, measurements and the report.
#[derive(Parser, Debug)]
#[command(name = "posenc", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Print an absolute encoding table.
    #[command(subcommand)]
    Table(cmd_table::TableCommand),
    /// Print attention-bias parameters (ALiBi slopes, T5 buckets).
    #[command(subcommand)]
    Bias(cmd_bias::BiasCommand),
    /// Inspect the RoPE of a Hugging Face config.json.
    #[command(subcommand)]
    Rope(cmd_rope::RopeCommand),
    /// Draw an encoding as a heatmap (terminal, PNG or SVG).
    Show(viz::ShowArgs),
    /// Measure an encoding's properties, with verdicts and plots.
    Analyze(viz::AnalyzeArgs),
    /// Two encodings side by side.
    Compare(viz::CompareArgs),
    /// Train a lab transformer (encoder or decoder) with any encoding.
    Train(cmd_lab::TrainArgs),
    /// Fine-tune at a new length: a lab checkpoint (--checkpoint, optionally
    /// keeping a RoPE scaling: --scaling linear is Position Interpolation),
    /// or a pretrained model with LoRA (--model, --length, --pose,
    /// --scaling yarn:2, ...), written as a PEFT adapter.
    Finetune(cmd_finetune::FinetuneArgs),
    /// Evaluate a checkpoint at several lengths, optionally with a RoPE
    /// scaling chosen now.
    Eval(cmd_lab::EvalArgs),
    /// Per-layer linear probe of absolute position from the activations.
    Probe(cmd_lab::ProbeArgs),
    /// Loss with the prefix shuffled against in order (decoders).
    Shuffle(cmd_lab::ProbeArgs),
    /// Benchmarks (`posenc bench rope`).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// Loss at every position of a pretrained model (GGUF or safetensors)
    /// for each RoPE scaling, inside and beyond its trained length.
    Perplexity(cmd_models::PerplexityArgs),
    /// Generate text with a pretrained model, with any RoPE scaling.
    Generate(cmd_models::GenerateArgs),
    /// Passkey and needle retrieval over prompt length × needle depth, for
    /// every scaling and attention method, on a pretrained model.
    Passkey(cmd_passkey::PasskeyArgs),
    /// Write the report (report.md, results.json): every encoding family with
    /// its formula, values and measured properties.
    Report(report::ReportArgs),
    /// Serve the interactive explorer on 127.0.0.1 (the URL is printed).
    Explore(cmd_explore::ExploreArgs),
}

/// An error to show the user: one line, exit status 2.
#[derive(Debug)]
pub struct CliError(pub String);

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<posenc::Error> for CliError {
    fn from(e: posenc::Error) -> Self {
        CliError(e.to_string())
    }
}

impl From<std::io::Error> for CliError {
    fn from(e: std::io::Error) -> Self {
        CliError(e.to_string())
    }
}

impl From<serde_json::Error> for CliError {
    fn from(e: serde_json::Error) -> Self {
        CliError(e.to_string())
    }
}

impl From<posenc_viz::VizError> for CliError {
    fn from(e: posenc_viz::VizError) -> Self {
        CliError(e.to_string())
    }
}

impl From<String> for CliError {
    fn from(e: String) -> Self {
        CliError(e)
    }
}

/// Result of a subcommand.
pub type CliResult<T = ()> = Result<T, CliError>;

fn run(cli: Cli) -> CliResult {
    match cli.command {
        Command::Table(c) => cmd_table::run(c),
        Command::Bias(c) => cmd_bias::run(c),
        Command::Rope(c) => cmd_rope::run(c),
        Command::Show(a) => viz::show(a),
        Command::Analyze(a) => viz::analyze(a),
        Command::Compare(a) => viz::compare(a),
        Command::Train(a) => cmd_lab::train(a),
        Command::Finetune(a) => cmd_lab::finetune(a),
        Command::Eval(a) => cmd_lab::eval(a),
        Command::Probe(a) => cmd_lab::probe(a),
        Command::Shuffle(a) => cmd_lab::shuffle(a),
        Command::Bench(c) => bench::run(c),
        Command::Perplexity(a) => cmd_models::perplexity(a),
        Command::Generate(a) => cmd_models::generate_cmd(a),
        Command::Passkey(a) => cmd_passkey::passkey_cmd(a),
        Command::Report(a) => report::run(a),
        Command::Explore(a) => cmd_explore::run(a),
    }
}

/// Exits with status 2 after printing `msg` as one line.
fn fail(msg: &str) -> ! {
    let msg = msg.replace('\n', " ");
    eprintln!(
        "posenc: error: {}",
        msg.strip_prefix("error: ").unwrap_or(&msg)
    );
    std::process::exit(2);
}

/// Tunes glibc's allocator for training loops that free and re-allocate
/// the same large buffers every step: with the default dynamic mmap
/// threshold, each buffer above it is a fresh `mmap` whose pages the kernel
/// faults in and zeroes on every step, and each free returns them. Raising
/// the thresholds keeps freed memory in the heap for the next step, and two
/// arenas (one per core) keep threads from spreading memory over many
/// arenas. Measured with `posenc bench train` (docs/kernels.md).
fn tune_allocator() {
    #[cfg(all(target_os = "linux", target_env = "gnu", not(feature = "mimalloc")))]
    {
        use std::os::raw::c_int;
        extern "C" {
            fn mallopt(param: c_int, value: c_int) -> c_int;
        }
        const M_TRIM_THRESHOLD: c_int = -1;
        const M_MMAP_THRESHOLD: c_int = -3;
        const M_ARENA_MAX: c_int = -8;
        // SAFETY: mallopt only changes allocator parameters; it is called
        // before any thread starts.
        unsafe {
            mallopt(M_MMAP_THRESHOLD, 1 << 30);
            mallopt(M_TRIM_THRESHOLD, 1 << 30);
            mallopt(M_ARENA_MAX, 2);
        }
    }
}

/// candle's element-wise ops run on a pool of spinning worker threads
/// (`CANDLE_NUM_THREADS`, default: every core) that serialises concurrent
/// callers; the lab trains the halves of a batch side by side, and posenc's
/// own kernels do the threading, so the CLI gives candle's pool no workers
/// unless the user set the variable. Measured with `posenc bench train`
/// (docs/kernels.md).
/// And candle's matmul reads `/proc/cpuinfo` on every call unless
/// `RAYON_NUM_THREADS` is set ([`posenc::kernels::default_rayon_threads_env`]).
fn configure_candle_threads() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // Before any thread starts and before candle reads it.
        std::env::set_var("CANDLE_NUM_THREADS", "1");
    }
    posenc::kernels::default_rayon_threads_env();
}

fn main() {
    tune_allocator();
    configure_candle_threads();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help, --version.
            let _ = e.print();
            return;
        }
        Err(e) => {
            // clap's message without its usage block, on one line.
            let text = e.to_string();
            let msg: Vec<&str> = text
                .lines()
                .map(str::trim)
                .filter(|l| {
                    !l.is_empty()
                        && !l.starts_with("Usage:")
                        && !l.starts_with("For more information")
                })
                .collect();
            fail(&msg.join(" "));
        }
    };
    // POSENC_SIMD lowers the kernels' instruction set (docs/kernels.md): a
    // name that is not a level, or one this CPU lacks, is refused here
    // rather than silently ignored.
    if let Err(e) = posenc::kernels::SimdLevel::from_env() {
        fail(&e.to_string());
    }
    if let Err(e) = run(cli) {
        fail(&e.0);
    }
}
