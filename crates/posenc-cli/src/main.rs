//! `posenc`: inspect a model's RoPE, print encodings and biases, and write
//! the report.
//!
//! Every error on user input prints one line, `posenc: error: ...`, and exits
//! with status 2.

mod args;
mod cmd_bias;
mod cmd_rope;
mod cmd_table;
mod output;
mod report;

use clap::{Parser, Subcommand};

/// Positional encodings for transformers: tables, biases, RoPE inspection and
/// the report.
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
    /// Write the report (report.md, results.json): every encoding family with
    /// its formula, values and measured properties.
    Report(report::ReportArgs),
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

/// Result of a subcommand.
pub type CliResult<T = ()> = Result<T, CliError>;

fn run(cli: Cli) -> CliResult {
    match cli.command {
        Command::Table(c) => cmd_table::run(c),
        Command::Bias(c) => cmd_bias::run(c),
        Command::Rope(c) => cmd_rope::run(c),
        Command::Report(a) => report::run(a),
    }
}

fn main() {
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        // One clear line; never a panic or a backtrace for user input.
        let msg = e.to_string().replace('\n', " ");
        eprintln!("posenc: error: {msg}");
        std::process::exit(2);
    }
}
