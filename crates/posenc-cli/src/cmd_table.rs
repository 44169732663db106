//! `posenc table sinusoidal`.

use clap::{Args, Subcommand, ValueEnum};
use posenc::absolute::sinusoidal::SinusoidalLayout;

use posenc_viz::json::{sinusoidal_rows, sinusoidal_table_json, SinusoidalParams};

use crate::output::table;
use crate::CliResult;

/// Absolute encoding tables.
#[derive(Subcommand, Debug)]
pub enum TableCommand {
    /// The sinusoidal table of Vaswani et al. (2017): T rows (positions) of
    /// D columns.
    Sinusoidal(SinusoidalArgs),
}

/// Layout of the sinusoidal table.
#[derive(ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutArg {
    /// Even columns sin, odd columns cos (the introductory articles' code, Vaswani et al.).
    Interleaved,
    /// [sin | cos] halves (tensor2tensor, fairseq, Whisper).
    Concatenated,
}

/// Arguments of `posenc table sinusoidal`.
#[derive(Args, Debug)]
pub struct SinusoidalArgs {
    /// Number of positions (rows).
    #[arg(long, default_value_t = 32)]
    pub positions: usize,
    /// Model dimension (columns).
    #[arg(long, default_value_t = 16)]
    pub dim: usize,
    /// Column layout.
    #[arg(long, value_enum, default_value_t = LayoutArg::Interleaved)]
    pub layout: LayoutArg,
    /// Base of the geometric frequency progression.
    #[arg(long, default_value_t = 10000.0)]
    pub base: f64,
    /// First position (rows are offset, offset+1, ...).
    #[arg(long, default_value_t = 0, allow_hyphen_values = true)]
    pub offset: i64,
    /// Print JSON (`{"table": [[...], ...]}`) instead of a readable table.
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: TableCommand) -> CliResult {
    match cmd {
        TableCommand::Sinusoidal(a) => sinusoidal(a),
    }
}

/// The library's parameters of the table the arguments describe.
fn params(a: &SinusoidalArgs) -> SinusoidalParams {
    SinusoidalParams {
        positions: a.positions,
        dim: a.dim,
        layout: match a.layout {
            LayoutArg::Interleaved => SinusoidalLayout::Interleaved,
            LayoutArg::Concatenated => SinusoidalLayout::Concatenated,
        },
        base: a.base,
        offset: a.offset,
    }
}

fn sinusoidal(a: SinusoidalArgs) -> CliResult {
    let p = params(&a);
    if a.json {
        let v = sinusoidal_table_json(&p)?;
        println!("{}", serde_json::to_string(&v)?);
    } else {
        let rows = sinusoidal_rows(&p)?;
        println!(
            "sinusoidal encoding ({} layout, base {}, positions {}..{}, dim {})",
            format!("{:?}", a.layout).to_lowercase(),
            a.base,
            a.offset,
            a.offset + a.positions as i64,
            a.dim
        );
        let mut header = vec!["pos".to_string()];
        header.extend((0..a.dim).map(|d| format!("d{d}")));
        let body: Vec<Vec<String>> = rows
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut line = vec![(a.offset + i as i64).to_string()];
                line.extend(r.iter().map(|v| format!("{v:.4}")));
                line
            })
            .collect();
        print!("{}", table(&header, &body));
    }
    Ok(())
}
