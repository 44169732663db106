//! `posenc`: the command-line tool.

use clap::{Parser, Subcommand};

mod viz;

/// Positional encodings for transformers: see and measure them.
#[derive(Parser, Debug)]
#[command(name = "posenc", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Draw an encoding as a heatmap (terminal, PNG or SVG).
    Show(viz::ShowArgs),
    /// Measure an encoding's properties, with verdicts and plots.
    Analyze(viz::AnalyzeArgs),
    /// Two encodings side by side.
    Compare(viz::CompareArgs),
}

fn main() {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Show(a) => viz::show(a),
        Command::Analyze(a) => viz::analyze(a),
        Command::Compare(a) => viz::compare(a),
    };
    if let Err(e) = result {
        eprintln!("posenc: error: {}", e.replace('\n', " "));
        std::process::exit(2);
    }
}
