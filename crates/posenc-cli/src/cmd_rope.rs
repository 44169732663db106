//! `posenc rope inspect` and `posenc rope table`.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use posenc::rope::RopeConfig;

use crate::args::parse_positions;
use crate::output::{num, table};
use crate::CliResult;

/// RoPE from a Hugging Face `config.json`.
#[derive(Subcommand, Debug)]
pub enum RopeCommand {
    /// Print rope_type, rotary_dim, layout, inv_freq and attention_factor.
    Inspect(InspectArgs),
    /// Print the cos/sin table (attention factor applied) at given positions,
    /// computed in f64 from transformers' f32 frequencies.
    Table(RopeTableArgs),
}

/// Arguments of `posenc rope inspect`.
#[derive(Args, Debug)]
pub struct InspectArgs {
    /// Path to the model's config.json.
    #[arg(long)]
    pub config: PathBuf,
    /// Sequence length, for length-dependent scalings (dynamic NTK, LongRoPE).
    #[arg(long = "seq-len")]
    pub seq_len: Option<usize>,
    /// Print JSON (`rope_type`, `rotary_dim`, `inv_freq`, `attention_factor`, ...).
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `posenc rope table`.
#[derive(Args, Debug)]
pub struct RopeTableArgs {
    /// Path to the model's config.json.
    #[arg(long)]
    pub config: PathBuf,
    /// Comma-separated positions, e.g. 0,1,4095,1000000,10000000.
    #[arg(
        long,
        allow_hyphen_values = true,
        default_value = "0,1,4095,1000000,10000000"
    )]
    pub positions: String,
    /// Sequence length, for length-dependent scalings.
    #[arg(long = "seq-len")]
    pub seq_len: Option<usize>,
    /// Print JSON (`positions`, `cos`, `sin`: one array of rotary_dim/2 per position).
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: RopeCommand) -> CliResult {
    match cmd {
        RopeCommand::Inspect(a) => inspect(a),
        RopeCommand::Table(a) => rope_table(a),
    }
}

fn inspect(a: InspectArgs) -> CliResult {
    let cfg = RopeConfig::from_hf_file(&a.config)?;
    let f = cfg.frequencies(a.seq_len)?;
    if a.json {
        let v = serde_json::json!({
            "rope_type": f.rope_type,
            "rotary_dim": f.rotary_dim,
            "head_dim": cfg.head_dim(),
            "layout": f.layout.as_str(),
            "rope_theta": cfg.theta(),
            "seq_len": a.seq_len,
            "inv_freq": f.inv_freq,
            "attention_factor": f.attention_factor,
        });
        println!("{}", serde_json::to_string(&v)?);
    } else {
        println!("config            {}", a.config.display());
        println!("rope_type         {}", f.rope_type);
        println!("rope_theta        {}", cfg.theta());
        println!("head_dim          {}", cfg.head_dim());
        println!("rotary_dim        {}", f.rotary_dim);
        println!("layout            {}", f.layout);
        println!("attention_factor  {}", f.attention_factor);
        if let Some(s) = a.seq_len {
            println!("seq_len           {s}");
        }
        let rows: Vec<Vec<String>> = f
            .inv_freq
            .iter()
            .enumerate()
            .map(|(i, w)| {
                let w = *w as f64;
                vec![
                    i.to_string(),
                    format!("{:e}", w as f32),
                    num(2.0 * std::f64::consts::PI / w, 2),
                ]
            })
            .collect();
        print!(
            "{}",
            table(
                &[
                    "pair".into(),
                    "inv_freq".into(),
                    "wavelength (positions)".into()
                ],
                &rows
            )
        );
    }
    Ok(())
}

fn rope_table(a: RopeTableArgs) -> CliResult {
    let positions = parse_positions(&a.positions)?;
    let cfg = RopeConfig::from_hf_file(&a.config)?;
    let f = cfg.frequencies(a.seq_len)?;
    let n = f.num_freqs();
    let (cos, sin) = f.cos_sin_table(&positions);
    let cos_rows: Vec<&[f32]> = cos.chunks(n).collect();
    let sin_rows: Vec<&[f32]> = sin.chunks(n).collect();
    if a.json {
        let v = serde_json::json!({
            "rope_type": f.rope_type,
            "rotary_dim": f.rotary_dim,
            "attention_factor": f.attention_factor,
            "positions": positions,
            "cos": cos_rows,
            "sin": sin_rows,
        });
        println!("{}", serde_json::to_string(&v)?);
    } else {
        println!(
            "{} RoPE, rotary_dim {}, attention_factor {} (angles in f64 from f32 inv_freq)",
            f.rope_type, f.rotary_dim, f.attention_factor
        );
        let mut header = vec!["position".to_string(), "".to_string()];
        header.extend((0..n).map(|i| format!("pair{i}")));
        let mut rows = Vec::new();
        for (k, p) in positions.iter().enumerate() {
            for (name, src) in [("cos", &cos_rows), ("sin", &sin_rows)] {
                let mut r = vec![p.to_string(), name.to_string()];
                r.extend(src[k].iter().map(|v| format!("{v:.6}")));
                rows.push(r);
            }
        }
        print!("{}", table(&header, &rows));
    }
    Ok(())
}
