//! `posenc rope inspect` and `posenc rope table`.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use posenc::rope::layers::{LayerRope, ModelRope};
use posenc::rope::limits::MAX_TABLE_VALUES;
use posenc::rope::{HfRopeConfig, MropeLayout, RopeFrequencies};
use posenc_viz::json::{insert_mrope, inspect_json, vision_json};
use posenc_viz::model::layer_ranges as ranges;
use serde_json::{json, Map, Value};

use crate::args::parse_positions;
use crate::output::{num, table};
use crate::{CliError, CliResult};

/// RoPE from a Hugging Face `config.json`.
#[derive(Subcommand, Debug)]
pub enum RopeCommand {
    /// Print rope_type, rotary_dim, layout, inv_freq and attention_factor —
    /// of every layer type, with the layers that use each and the NoPE
    /// layers, for models whose layers differ (Gemma 3/4, Llama 4, SmolLM3).
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
    /// Print JSON (`rope_type`, `rotary_dim`, `inv_freq`, `attention_factor`,
    /// `layout`, ...; `layer_types` and `layers` when the layers differ;
    /// `mrope_section` and `mrope_interleaved` for M-RoPE).
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
        default_value = "0,1,4095,1000000,10000000",
        conflicts_with = "positions_thw"
    )]
    pub positions: String,
    /// M-RoPE positions (t, h, w), `t,h,w;t,h,w;...` (multimodal models).
    #[arg(long = "positions-thw", allow_hyphen_values = true)]
    pub positions_thw: Option<String>,
    /// The layer type, for models with several (`posenc rope inspect` lists them).
    #[arg(long = "layer-type")]
    pub layer_type: Option<String>,
    /// Sequence length, for length-dependent scalings.
    #[arg(long = "seq-len")]
    pub seq_len: Option<usize>,
    /// Print JSON (`positions` or `positions_thw`, `cos`, `sin`: one array of
    /// rotary_dim/2 per position).
    #[arg(long)]
    pub json: bool,
}

pub fn run(cmd: RopeCommand) -> CliResult {
    match cmd {
        RopeCommand::Inspect(a) => inspect(a),
        RopeCommand::Table(a) => rope_table(a),
    }
}

fn freq_table(f: &RopeFrequencies) -> String {
    let rows: Vec<Vec<String>> = f
        .inv_freq
        .iter()
        .enumerate()
        .map(|(i, w)| {
            let w = *w as f64;
            vec![
                i.to_string(),
                format!("{:e}", w as f32),
                if w > 0.0 {
                    num(2.0 * std::f64::consts::PI / w, 2)
                } else {
                    "inf (not rotated)".into()
                },
            ]
        })
        .collect();
    table(
        &[
            "pair".into(),
            "inv_freq".into(),
            "wavelength (positions)".into(),
        ],
        &rows,
    )
}

fn inspect(a: InspectArgs) -> CliResult {
    let hf = HfRopeConfig::from_file(&a.config)?;
    let model = ModelRope::from_hf(&hf)?;
    let mut types = Vec::new();
    for t in model.layer_types() {
        types.push((t.name.clone(), &t.config, t.config.frequencies(a.seq_len)?));
    }
    if a.json {
        let v = inspect_json(&hf, a.seq_len)?;
        println!("{}", serde_json::to_string(&v)?);
        return Ok(());
    }
    let vision = vision_json(&hf)?;
    let per_layer = model.is_per_layer();

    println!("config            {}", a.config.display());
    if let Some(mt) = model.model_type() {
        println!("model_type        {mt}");
    }
    if let Some(s) = a.seq_len {
        println!("seq_len           {s}");
    }
    if !model.layers().is_empty() && per_layer {
        println!("layers            {}", model.layers().len());
    }
    if let Some((section, layout)) = model.mrope_section() {
        println!(
            "mrope_section     {section:?} (t, h, w; {})",
            match layout {
                MropeLayout::Chunked => "chunked",
                MropeLayout::Interleaved => "interleaved",
            }
        );
    }
    if let Some(c) = model.attention_chunk_size() {
        println!("attention_chunk   {c} tokens (RoPE layers)");
    }
    if let Some(f) = model.softmax_scale_factor() {
        match model.softmax_scale() {
            Some(s) => println!("softmax_scale     {s} (× {f} = mscale², DeepSeek)"),
            None => println!("softmax_scale     × {f} (mscale², DeepSeek)"),
        }
    }
    if model.has_nope_layers() {
        let nope = ranges(model.layers(), |l| *l == LayerRope::NoPe);
        println!("NoPE layers       {nope}");
        if let Some(t) = model.attn_temperature() {
            println!(
                "                  queries × (log1p(floor((p + 1) / {})) × {} + 1)",
                t.floor_scale, t.attn_scale
            );
        }
    }
    for (name, cfg, f) in &types {
        println!();
        if per_layer {
            let used = ranges(
                model.layers(),
                |l| matches!(l, LayerRope::Rope(n) if n == name),
            );
            println!("layer type        {name} (layers {used})");
        }
        println!("rope_type         {}", f.rope_type);
        println!("rope_theta        {}", cfg.theta());
        println!("head_dim          {}", cfg.head_dim());
        println!("rotary_dim        {}", f.rotary_dim);
        println!("layout            {}", f.layout);
        println!("attention_factor  {}", f.attention_factor);
        print!("{}", freq_table(f));
    }
    if let Some(vis) = vision {
        println!();
        println!(
            "vision encoder    {} 2-D RoPE, head_dim {}, rope_theta {}, {} pairs",
            vis["kind"].as_str().unwrap_or(""),
            vis["head_dim"],
            vis["rope_theta"],
            vis["layout"].as_str().unwrap_or("")
        );
    }
    Ok(())
}

/// Parses `t,h,w;t,h,w;...`.
fn parse_thw(s: &str) -> CliResult<Vec<u64>> {
    let mut out = Vec::new();
    for part in s.split(';').map(str::trim).filter(|p| !p.is_empty()) {
        let v = parse_positions(part)?;
        if v.len() != 3 {
            return Err(CliError(format!(
                "invalid M-RoPE position {part:?}: expected three values t,h,w"
            )));
        }
        out.extend(v);
    }
    if out.is_empty() {
        return Err(CliError("no positions given".into()));
    }
    Ok(out)
}

fn check_size(rows: usize, width: usize) -> CliResult {
    if rows.saturating_mul(width) > MAX_TABLE_VALUES {
        return Err(posenc::Error::TooLarge {
            what: "table size (positions × rotary_dim / 2)",
            value: rows.saturating_mul(width) as u64,
            max: MAX_TABLE_VALUES as u64,
        }
        .into());
    }
    Ok(())
}

fn rope_table(a: RopeTableArgs) -> CliResult {
    let model = ModelRope::from_hf_file(&a.config)?;
    if a.positions_thw.is_some() && model.mrope_section().is_none() {
        return Err(CliError(
            "--positions-thw needs an M-RoPE config (Qwen2-VL, Qwen2.5-VL, Qwen3-VL, GLM-4V: mrope_section)".into(),
        ));
    }
    let names: Vec<&str> = model
        .layer_types()
        .iter()
        .map(|t| t.name.as_str())
        .collect();
    let name = match (&a.layer_type, model.single()) {
        (Some(n), _) => {
            if !names.contains(&n.as_str()) {
                return Err(CliError(format!(
                    "layer type {n:?} has no RoPE in this model (layer types with RoPE: {})",
                    names.join(", ")
                )));
            }
            n.clone()
        }
        (None, Some(_)) => names
            .first()
            .map(|n| n.to_string())
            .ok_or_else(|| CliError("no layer of this model uses RoPE".into()))?,
        (None, None) => {
            return Err(CliError(format!(
                "this model has several layer types with different RoPE ({}): choose one with --layer-type",
                names.join(", ")
            )))
        }
    };
    let f = model.axial_frequencies(&name, a.seq_len)?;
    let n = f.num_freqs();
    let (positions, thw) = match &a.positions_thw {
        Some(s) => (parse_thw(s)?, true),
        None => {
            let p = parse_positions(&a.positions)?;
            let na = f.num_axes();
            (
                p.iter().flat_map(|&x| std::iter::repeat_n(x, na)).collect(),
                false,
            )
        }
    };
    let na = f.num_axes();
    check_size(positions.len() / na, n)?;
    let (cos, sin) = f.cos_sin_table(&positions)?;
    let cos_rows: Vec<&[f32]> = cos.chunks(n).collect();
    let sin_rows: Vec<&[f32]> = sin.chunks(n).collect();
    let labels: Vec<String> = positions
        .chunks(na)
        .map(|p| {
            if thw {
                format!("({},{},{})", p[0], p[1], p[2])
            } else {
                p[0].to_string()
            }
        })
        .collect();
    if a.json {
        let mut v = Map::new();
        v.insert("rope_type".into(), json!(f.rope_type()));
        v.insert("rotary_dim".into(), json!(f.rotary_dim()));
        v.insert("attention_factor".into(), json!(f.attention_factor()));
        if model.is_per_layer() {
            v.insert("layer_type".into(), json!(name));
        }
        if thw {
            let rows: Vec<&[u64]> = positions.chunks(3).collect();
            v.insert("positions_thw".into(), json!(rows));
            insert_mrope(&mut v, &model);
        } else {
            let p: Vec<u64> = positions.chunks(na).map(|p| p[0]).collect();
            v.insert("positions".into(), json!(p));
        }
        v.insert("cos".into(), json!(cos_rows));
        v.insert("sin".into(), json!(sin_rows));
        println!("{}", serde_json::to_string(&Value::Object(v))?);
    } else {
        println!(
            "{} RoPE{}, rotary_dim {}, attention_factor {} (angles in f64 from f32 inv_freq)",
            f.rope_type(),
            if model.is_per_layer() {
                format!(" of {name} layers")
            } else {
                String::new()
            },
            f.rotary_dim(),
            f.attention_factor()
        );
        let mut header = vec![
            if thw { "(t,h,w)" } else { "position" }.to_string(),
            "".to_string(),
        ];
        header.extend((0..n).map(|i| format!("pair{i}")));
        let mut rows = Vec::new();
        for (k, label) in labels.iter().enumerate() {
            for (what, src) in [("cos", &cos_rows), ("sin", &sin_rows)] {
                let mut r = vec![label.clone(), what.to_string()];
                r.extend(src[k].iter().map(|v| format!("{v:.6}")));
                rows.push(r);
            }
        }
        print!("{}", table(&header, &rows));
    }
    Ok(())
}
