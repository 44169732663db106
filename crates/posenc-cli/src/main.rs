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
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if !e.use_stderr() => {
            // --help, --version
            let _ = e.print();
            return;
        }
        Err(e) => {
            // One line: clap's message without its usage block.
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
            let msg = msg.join(" ");
            eprintln!(
                "posenc: error: {}",
                msg.strip_prefix("error: ").unwrap_or(&msg)
            );
            std::process::exit(2);
        }
    };
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
