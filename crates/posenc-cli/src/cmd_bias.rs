//! `posenc bias alibi` and `posenc bias t5`.

use clap::{Args, Subcommand};
use posenc::relative::alibi::alibi_slopes;
use posenc::relative::t5::T5Buckets;
use posenc_viz::json::{alibi_json, t5_json};

use crate::args::parse_relative_range;
use crate::output::table;
use crate::{CliError, CliResult};

/// Attention-bias parameters.
#[derive(Subcommand, Debug)]
pub enum BiasCommand {
    /// ALiBi head slopes (Press et al. 2022), for any number of heads.
    Alibi(AlibiArgs),
    /// T5 relative-position buckets (Raffel et al. 2020), exactly as
    /// transformers' `_relative_position_bucket`.
    T5(T5Args),
}

/// Arguments of `posenc bias alibi`.
#[derive(Args, Debug)]
pub struct AlibiArgs {
    /// Number of attention heads.
    #[arg(long)]
    pub heads: usize,
    /// Print JSON (`{"slopes": [...]}`).
    #[arg(long)]
    pub json: bool,
}

/// Arguments of `posenc bias t5`.
#[derive(Args, Debug)]
pub struct T5Args {
    /// Number of buckets.
    #[arg(long, default_value_t = 32)]
    pub buckets: usize,
    /// Distance beyond which all positions share the last bucket.
    #[arg(long = "max-distance", default_value_t = 128)]
    pub max_distance: usize,
    /// Encoder (bidirectional) bucketing: half the buckets for each sign.
    #[arg(long, conflicts_with = "causal", required_unless_present = "causal")]
    pub bidirectional: bool,
    /// Decoder (causal) bucketing: keys after the query share bucket 0.
    #[arg(long)]
    pub causal: bool,
    /// Relative positions LO:HI (key − query), inclusive, e.g. -16:16.
    #[arg(long, allow_hyphen_values = true, default_value = "-16:16")]
    pub relative: String,
    /// Print JSON (`{"relative": [...], "bucket": [...]}`).
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: BiasCommand) -> CliResult {
    match cmd {
        BiasCommand::Alibi(a) => alibi(a),
        BiasCommand::T5(a) => t5(a),
    }
}

fn alibi(a: AlibiArgs) -> CliResult {
    if a.json {
        let v = alibi_json(a.heads)?;
        println!("{}", serde_json::to_string(&v)?);
    } else {
        let slopes = alibi_slopes(a.heads)?;
        println!(
            "ALiBi slopes for {} heads (bias of head h: -slope_h * |i - j|)",
            a.heads
        );
        let rows: Vec<Vec<String>> = slopes
            .iter()
            .enumerate()
            .map(|(h, s)| {
                vec![
                    h.to_string(),
                    format!("{s:.10}"),
                    format!("2^{:.4}", s.log2()),
                ]
            })
            .collect();
        print!(
            "{}",
            table(
                &["head".into(), "slope".into(), "as power of 2".into()],
                &rows
            )
        );
    }
    Ok(())
}

fn t5(a: T5Args) -> CliResult {
    if !a.bidirectional && !a.causal {
        return Err(CliError("choose --bidirectional or --causal".into()));
    }
    let (lo, hi) = parse_relative_range(&a.relative)?;
    let buckets = T5Buckets::new(a.buckets, a.max_distance, a.bidirectional)?;
    if a.json {
        let v = t5_json(&buckets, lo, hi);
        println!("{}", serde_json::to_string(&v)?);
    } else {
        let rel: Vec<i64> = (lo..=hi).collect();
        let bucket: Vec<usize> = rel.iter().map(|&r| buckets.bucket(r)).collect();
        println!(
            "T5 buckets ({}, {} buckets, max_distance {}), relative = key - query",
            if a.bidirectional {
                "bidirectional"
            } else {
                "causal"
            },
            a.buckets,
            a.max_distance
        );
        let rows: Vec<Vec<String>> = rel
            .iter()
            .zip(&bucket)
            .map(|(r, b)| vec![r.to_string(), b.to_string()])
            .collect();
        print!("{}", table(&["relative".into(), "bucket".into()], &rows));
    }
    Ok(())
}
