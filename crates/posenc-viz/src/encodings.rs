//! Parsing an ENCODING spec (`NAME[:KEY=VALUE,...]` plus the command-line
//! options) into an encoding and the matrices that picture it.

use std::path::PathBuf;

use posenc::absolute::{Floater, FloaterConfig, LearnedTable, Sinusoidal, SinusoidalLayout};
use posenc::relative::{Alibi, AlibiMode, Shaw, T5Bias, T5Buckets};
use posenc::rope::{
    PairLayout, Rope, RopeConfig, RopeFrequencies, RopeScaling, ScalingKind, XPos, YarnParams,
};
use posenc::{AbsoluteEncoding, AttentionBias};
use posenc_plot::{Colormap, Orientation, ValueRange};

use crate::error::{invalid, Result};

/// Every family name `show`, `analyze` and `compare` accept.
pub const FAMILIES: &[&str] = &[
    "sinusoidal",
    "rope",
    "alibi",
    "t5",
    "shaw",
    "learned",
    "floater",
    "xpos",
    "binary",
];

/// Largest number of positions drawn or measured.
pub const MAX_POSITIONS: usize = 100_000;
/// Largest dimension accepted.
pub const MAX_DIM: usize = 65_536;
/// Largest table (positions × dimension) built.
pub const MAX_CELLS: usize = 20_000_000;

/// Options that describe an encoding; each can also be given inside the
/// ENCODING spec as `NAME:KEY=VALUE,...` (the spec wins), so that `compare`
/// can give its two encodings different values.
#[derive(Debug, Clone, Default)]
pub struct EncodingOptions {
    /// Number of positions (table rows; query and key positions of a bias).
    /// Default: the `default_positions` given to [`build`] (`show` and
    /// `compare`: 32; `analyze`: enough for every position it measures).
    pub positions: Option<usize>,
    /// Model / head dimension. Default: the `default_dim` given to
    /// [`build`] (`show` and `compare`: 16; `analyze`: 128).
    pub dim: Option<usize>,
    /// Layout: `interleaved` (default) or `concatenated` (sinusoidal),
    /// `half-split` (default) or `interleaved` (rope, xpos).
    pub layout: Option<String>,
    /// Sinusoidal base (default 10000).
    pub base: Option<f64>,
    /// Sinusoidal position offset (the first row is position OFFSET).
    pub offset: Option<u64>,
    /// RoPE / xPos base θ (default 10000).
    pub theta: Option<f64>,
    /// RoPE scaling: default, linear, ntk, dynamic, yarn, llama3, longrope,
    /// or one with its factor (`yarn:4`, posenc's [`ScalingKind`] syntax).
    pub scaling: Option<String>,
    /// Scaling factor (default 4).
    pub factor: Option<f64>,
    /// Pre-training context length for dynamic/yarn/llama3/longrope
    /// (default 4096).
    pub original_max: Option<usize>,
    /// Sequence length the RoPE frequencies are computed for (dynamic NTK,
    /// LongRoPE); default: the table built at load time.
    pub seq_len: Option<usize>,
    /// A Hugging Face `config.json` to read RoPE from.
    pub config: Option<PathBuf>,
    /// Number of heads (ALiBi, T5; default 8).
    pub heads: Option<usize>,
    /// Head drawn (ALiBi, T5; default 0).
    pub head: Option<usize>,
    /// T5 number of buckets (default 32).
    pub buckets: Option<usize>,
    /// T5 max distance (default 128).
    pub max_distance: Option<usize>,
    /// Causal (decoder) bias: ALiBi's default; T5 unidirectional buckets.
    pub causal: bool,
    /// Bidirectional (encoder) bias: T5's default; ALiBi's `−m·|i − j|`.
    pub bidirectional: bool,
    /// Shaw clipping distance k (default 4).
    pub k: Option<usize>,
    /// Seed of the random initialisation (learned, floater, shaw, t5 bias;
    /// default 0).
    pub seed: Option<u64>,
    /// A lab checkpoint (`posenc train --out DIR`) whose trained table
    /// (learned) or vector field (floater) to use instead of a random one.
    pub checkpoint: Option<std::path::PathBuf>,
    /// FLOATER hidden width (default 16).
    pub hidden: Option<usize>,
    /// FLOATER time step Δt between positions (default 0.1).
    pub delta_t: Option<f64>,
    /// xPos decay length (default 512).
    pub scale_base: Option<f64>,
    /// T5 picture: `buckets` (bucket index, default) or `bias` (a seeded
    /// random bias table).
    pub values: Option<String>,
}

fn parse_num<T: std::str::FromStr>(key: &str, v: &str) -> Result<T> {
    v.trim()
        .parse::<T>()
        .map_err(|_| invalid(format!("invalid value {v:?} for {key}")))
}

fn parse_bool(key: &str, v: &str) -> Result<bool> {
    match v {
        "" | "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(invalid(format!(
            "invalid value {v:?} for {key} (true or false)"
        ))),
    }
}

impl EncodingOptions {
    /// Sets one option from a spec's `KEY=VALUE` (the key is the long option
    /// name without dashes; `_` and `-` are the same).
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let key = key.trim().replace('_', "-");
        let v = value.trim();
        match key.as_str() {
            "positions" => self.positions = Some(parse_num(&key, v)?),
            "dim" => self.dim = Some(parse_num(&key, v)?),
            "layout" => self.layout = Some(v.to_string()),
            "base" => self.base = Some(parse_num(&key, v)?),
            "offset" => self.offset = Some(parse_num(&key, v)?),
            "theta" => self.theta = Some(parse_num(&key, v)?),
            "scaling" => self.scaling = Some(v.to_string()),
            "factor" => self.factor = Some(parse_num(&key, v)?),
            "original-max" => self.original_max = Some(parse_num(&key, v)?),
            "seq-len" => self.seq_len = Some(parse_num(&key, v)?),
            "config" => self.config = Some(PathBuf::from(v)),
            "heads" => self.heads = Some(parse_num(&key, v)?),
            "head" => self.head = Some(parse_num(&key, v)?),
            "buckets" => self.buckets = Some(parse_num(&key, v)?),
            "max-distance" => self.max_distance = Some(parse_num(&key, v)?),
            "causal" => {
                self.causal = parse_bool(&key, v)?;
                self.bidirectional = !self.causal;
            }
            "bidirectional" => {
                self.bidirectional = parse_bool(&key, v)?;
                self.causal = !self.bidirectional;
            }
            "k" => self.k = Some(parse_num(&key, v)?),
            "seed" => self.seed = Some(parse_num(&key, v)?),
            "hidden" => self.hidden = Some(parse_num(&key, v)?),
            "delta-t" => self.delta_t = Some(parse_num(&key, v)?),
            "scale-base" => self.scale_base = Some(parse_num(&key, v)?),
            "values" => self.values = Some(v.to_string()),
            _ => {
                return Err(invalid(format!(
                    "unknown option {key:?} in the encoding spec"
                )))
            }
        }
        Ok(())
    }
}

/// An encoding family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// Vaswani et al. sinusoidal table.
    Sinusoidal,
    /// RoPE cos/sin tables.
    Rope,
    /// ALiBi bias matrix.
    Alibi,
    /// T5 buckets or bias.
    T5,
    /// Shaw relative index matrix.
    Shaw,
    /// Learned table (seeded init).
    Learned,
    /// FLOATER (seeded random vector field, integrated).
    Floater,
    /// xPos scales.
    XPos,
    /// The binary analogy figure.
    Binary,
}

impl Family {
    fn parse(name: &str) -> Result<Family> {
        Ok(match name.trim().to_ascii_lowercase().as_str() {
            "sinusoidal" | "sin" | "sinusoid" => Family::Sinusoidal,
            "rope" | "rotary" => Family::Rope,
            "alibi" => Family::Alibi,
            "t5" => Family::T5,
            "shaw" => Family::Shaw,
            "learned" => Family::Learned,
            "floater" => Family::Floater,
            "xpos" => Family::XPos,
            "binary" => Family::Binary,
            _ => {
                return Err(invalid(format!(
                    "unknown encoding {name:?}; known: {}",
                    FAMILIES.join(", ")
                )))
            }
        })
    }

    /// The canonical name.
    pub fn name(self) -> &'static str {
        match self {
            Family::Sinusoidal => "sinusoidal",
            Family::Rope => "rope",
            Family::Alibi => "alibi",
            Family::T5 => "t5",
            Family::Shaw => "shaw",
            Family::Learned => "learned",
            Family::Floater => "floater",
            Family::XPos => "xpos",
            Family::Binary => "binary",
        }
    }
}

/// An ENCODING spec with its options resolved.
#[derive(Debug, Clone)]
pub struct Spec {
    /// The family.
    pub family: Family,
    /// Options: command line, then the spec's own `KEY=VALUE`s.
    pub opts: EncodingOptions,
}

/// Parses `NAME[:KEY=VALUE,...]` on top of the command-line options.
pub fn parse_spec(spec: &str, base: &EncodingOptions) -> Result<Spec> {
    let (name, rest) = match spec.split_once(':') {
        Some((n, r)) => (n, Some(r)),
        None => (spec, None),
    };
    let family = Family::parse(name)?;
    let mut opts = base.clone();
    if let Some(rest) = rest {
        for item in rest.split(',').filter(|s| !s.trim().is_empty()) {
            let (k, v) = item.split_once('=').unwrap_or((item, ""));
            opts.set(k, v)?;
        }
    }
    Ok(Spec { family, opts })
}

/// A built encoding, ready to draw or measure.
#[derive(Debug, Clone)]
pub enum Built {
    /// Sinusoidal (also the right half of `binary`).
    Sinusoidal(Sinusoidal),
    /// RoPE with its frequencies.
    Rope {
        /// The configuration.
        config: RopeConfig,
        /// The frequencies at the chosen sequence length.
        freqs: RopeFrequencies,
        /// The rotary encoding at that length.
        rope: Box<Rope>,
    },
    /// ALiBi and the head drawn.
    Alibi(Alibi, usize),
    /// T5 buckets, a seeded bias table, the head drawn and whether the
    /// picture shows bias values (else bucket indices).
    T5(T5Buckets, T5Bias, usize, bool),
    /// Shaw.
    Shaw(Shaw),
    /// Learned table.
    Learned(LearnedTable),
    /// FLOATER.
    Floater(Floater),
    /// xPos.
    XPos(XPos),
    /// Binary analogy (bits next to this sinusoidal table).
    Binary(Sinusoidal),
}

/// An encoding built from a spec, with the number of positions to picture.
#[derive(Debug, Clone)]
pub struct Encoding {
    /// The family.
    pub family: Family,
    /// Positions to draw.
    pub positions: usize,
    /// The encoding.
    pub built: Built,
    /// One-line description, used in titles.
    pub label: String,
}

fn check_count(what: &str, v: usize, max: usize) -> Result<usize> {
    if v == 0 {
        return Err(invalid(format!("invalid {what} = 0: must be at least 1")));
    }
    if v > max {
        return Err(invalid(format!("invalid {what} = {v}: at most {max}")));
    }
    Ok(v)
}

fn sinusoidal_layout(s: Option<&str>) -> Result<SinusoidalLayout> {
    match s.unwrap_or("interleaved") {
        "interleaved" => Ok(SinusoidalLayout::Interleaved),
        "concatenated" | "concat" => Ok(SinusoidalLayout::Concatenated),
        other => Err(invalid(format!(
            "invalid layout {other:?} for sinusoidal (interleaved or concatenated)"
        ))),
    }
}

fn pair_layout(s: Option<&str>) -> Result<Option<PairLayout>> {
    match s {
        None => Ok(None),
        Some(s) => s.parse::<PairLayout>().map(Some).map_err(|_| {
            invalid(format!(
                "invalid layout {s:?} for rope/xpos (half-split or interleaved)"
            ))
        }),
    }
}

/// The RoPE scaling a `--scaling NAME --factor F --original-max L` asks for,
/// or a `--scaling NAME:F` in posenc's named form
/// ([`ScalingKind`]: `linear:F`, `pi:F`, `ntk:F`, `dynamic:F`, `yarn:F`)
/// with the factor in the name (`--factor` then refused).
fn scaling_from_flags(
    name: &str,
    factor: Option<f64>,
    original: usize,
    rotary_dim: usize,
) -> Result<RopeScaling> {
    if name.contains(':') {
        if factor.is_some() {
            return Err(invalid(format!(
                "--scaling {name} gives its factor: drop --factor"
            )));
        }
        let kind: ScalingKind = name
            .parse()
            .map_err(|e: posenc::Error| invalid(e.to_string()))?;
        return Ok(kind.rope_scaling(original).unwrap_or(RopeScaling::Default));
    }
    let factor = factor.unwrap_or(4.0);
    Ok(match name {
        "longrope" => {
            // A synthetic profile (a real model's lists come with --config):
            // short factors 1, long factors rising geometrically from 1 for
            // the fastest pair to `factor` for the slowest.
            let n = rotary_dim / 2;
            let long = (0..n)
                .map(|i| factor.powf(i as f64 / (n.max(2) - 1) as f64))
                .collect();
            RopeScaling::LongRope {
                short_factor: vec![1.0; n],
                long_factor: long,
                original_max_position_embeddings: original,
                factor,
                attention_factor: None,
            }
        }
        other => RopeScaling::from_factor(other, factor, original).map_err(|_| {
            invalid(format!(
                "unknown scaling {other:?}; known: {}, longrope (or --config)",
                posenc::rope::FACTOR_SCALINGS.join(", ")
            ))
        })?,
    })
}

/// Builds the RoPE configuration a spec describes.
pub fn rope_config(o: &EncodingOptions, default_dim: usize) -> Result<RopeConfig> {
    let layout = pair_layout(o.layout.as_deref())?;
    let mut cfg = if let Some(path) = &o.config {
        if o.scaling.is_some() {
            return Err(invalid("give either --config or --scaling, not both"));
        }
        RopeConfig::from_hf_file(path)?
    } else {
        let dim = check_count("dim", o.dim.unwrap_or(default_dim), MAX_DIM)?;
        let cfg = RopeConfig::new(o.theta.unwrap_or(10000.0), dim)?;
        let scaling = scaling_from_flags(
            o.scaling.as_deref().unwrap_or("default"),
            o.factor,
            check_count("original-max", o.original_max.unwrap_or(4096), usize::MAX)?,
            dim,
        )?;
        cfg.with_scaling(scaling)?
    };
    if let Some(l) = layout {
        cfg = cfg.with_layout(l);
    }
    Ok(cfg)
}

/// Builds the encoding a spec describes (`default_dim` and
/// `default_positions` fill what the spec leaves out).
pub fn build(spec: &Spec, default_dim: usize, default_positions: usize) -> Result<Encoding> {
    let o = &spec.opts;
    let positions = check_count(
        "positions",
        o.positions.unwrap_or(default_positions),
        MAX_POSITIONS,
    )?;
    let dim = || -> Result<usize> {
        let d = check_count("dim", o.dim.unwrap_or(default_dim), MAX_DIM)?;
        if d.saturating_mul(positions) > MAX_CELLS {
            return Err(invalid(format!(
                "{positions} positions × dim {d} is too large: at most {MAX_CELLS} values"
            )));
        }
        Ok(d)
    };
    let seed = o.seed.unwrap_or(0);
    let heads = || check_count("heads", o.heads.unwrap_or(8), 4096);
    let head = |n: usize| -> Result<usize> {
        let h = o.head.unwrap_or(0);
        if h >= n {
            Err(invalid(format!(
                "invalid head = {h}: there are {n} heads (0..{})",
                n - 1
            )))
        } else {
            Ok(h)
        }
    };
    let sinusoidal = |dim: usize| -> Result<Sinusoidal> {
        let mut s = Sinusoidal::new(dim)?;
        if let Some(b) = o.base {
            s = s.with_base(b)?;
        }
        Ok(s.with_layout(sinusoidal_layout(o.layout.as_deref())?)
            .with_offset(o.offset.unwrap_or(0)))
    };
    let (built, label) = match spec.family {
        Family::Sinusoidal => {
            let d = dim()?;
            let s = sinusoidal(d)?;
            let label = format!(
                "sinusoidal ({}), D = {d}, base {}",
                layout_name(s.layout()),
                s.base()
            );
            (Built::Sinusoidal(s), label)
        }
        Family::Binary => {
            let d = dim()?;
            let s = sinusoidal(d)?;
            let label = format!("binary analogy, D = {d}, base {}", s.base());
            (Built::Binary(s), label)
        }
        Family::Rope => {
            let config = rope_config(o, default_dim)?;
            let rope = Rope::at_seq_len(config.clone(), o.seq_len)?;
            let freqs = rope.frequencies().clone();
            let mut label = format!(
                "RoPE {}, θ = {}, d = {} ({})",
                freqs.rope_type,
                config.theta(),
                freqs.rotary_dim,
                freqs.layout
            );
            if let Some(f) = scaling_factor(config.scaling()) {
                label.push_str(&format!(", factor {f}"));
            }
            (
                Built::Rope {
                    config,
                    freqs,
                    rope: Box::new(rope),
                },
                label,
            )
        }
        Family::XPos => {
            let d = dim()?;
            let mut x = XPos::new(d)?;
            if let Some(t) = o.theta {
                x = x.with_theta(t)?;
            }
            if let Some(sb) = o.scale_base {
                x = x.with_scale_base(sb)?;
            }
            if let Some(l) = pair_layout(o.layout.as_deref())? {
                x = x.with_layout(l);
            }
            let label = format!("xPos, d = {d}, scale base {}", x.scale_base());
            (Built::XPos(x), label)
        }
        Family::Alibi => {
            let n = heads()?;
            let h = head(n)?;
            let mode = if o.bidirectional {
                AlibiMode::Bidirectional
            } else {
                AlibiMode::Causal
            };
            let a = Alibi::new(n, mode)?;
            let label = format!(
                "ALiBi ({}), head {h} of {n}, slope {}",
                if o.bidirectional {
                    "bidirectional"
                } else {
                    "causal; attention masks j > i"
                },
                posenc_plot::format_value(a.slopes()[h])
            );
            (Built::Alibi(a, h), label)
        }
        Family::T5 => {
            let n = heads()?;
            let h = head(n)?;
            let bidirectional = !o.causal;
            let b = T5Buckets::new(
                o.buckets.unwrap_or(32),
                o.max_distance.unwrap_or(128),
                bidirectional,
            )?;
            let bias = T5Bias::random(b, n, seed)?;
            let show_bias = match o.values.as_deref().unwrap_or("buckets") {
                "buckets" | "bucket" => false,
                "bias" => true,
                other => {
                    return Err(invalid(format!(
                        "invalid values {other:?} for t5 (buckets or bias)"
                    )))
                }
            };
            let label = format!(
                "T5 {}, {} buckets, max distance {}, {}",
                if show_bias {
                    format!("bias (seed {seed}), head {h} of {n}")
                } else {
                    "buckets".to_string()
                },
                b.num_buckets(),
                b.max_distance(),
                if bidirectional {
                    "bidirectional"
                } else {
                    "causal"
                }
            );
            (Built::T5(b, bias, h, show_bias), label)
        }
        Family::Shaw => {
            let k = o.k.unwrap_or(4);
            let s = Shaw::new(k, dim()?, seed)?;
            (Built::Shaw(s), format!("Shaw relative index, k = {k}"))
        }
        Family::Learned | Family::Floater if o.checkpoint.is_some() => {
            let dir = o.checkpoint.as_deref().expect("checked");
            let lab = posenc_lab::train::Lab::load(dir)?;
            let what = format!(
                "{} ({} trained {} steps on {})",
                spec.family.name(),
                dir.display(),
                lab.meta.step,
                lab.meta.train.task.name()
            );
            match (lab.model.trained_input()?, spec.family) {
                (Some(posenc_lab::model::TrainedInput::Learned(t)), Family::Learned) => {
                    if positions > t.max_positions() {
                        return Err(invalid(format!(
                            "--positions {positions} is past the checkpoint's learned table ({} rows)",
                            t.max_positions()
                        )));
                    }
                    (Built::Learned(t), what)
                }
                (Some(posenc_lab::model::TrainedInput::Floater(f)), Family::Floater) => {
                    (Built::Floater(f), what)
                }
                _ => {
                    return Err(invalid(format!(
                        "{} was trained with {}, not {}",
                        dir.display(),
                        lab.meta.model.pe.label(),
                        spec.family.name()
                    )))
                }
            }
        }
        Family::Learned => {
            let d = dim()?;
            let t = LearnedTable::new(positions, d, seed)?;
            (
                Built::Learned(t),
                format!("learned table (N(0, 0.02²) init, seed {seed}), D = {d}"),
            )
        }
        Family::Floater => {
            let d = dim()?;
            let hidden = o.hidden.unwrap_or(16);
            let cfg = FloaterConfig::new(d, hidden).with_delta_t(o.delta_t.unwrap_or(0.1));
            let f = Floater::random(cfg, seed)?;
            (
                Built::Floater(f),
                format!("FLOATER (random h, seed {seed}), D = {d}, hidden {hidden}"),
            )
        }
    };
    Ok(Encoding {
        family: spec.family,
        positions,
        built,
        label,
    })
}

fn layout_name(l: SinusoidalLayout) -> &'static str {
    match l {
        SinusoidalLayout::Interleaved => "interleaved",
        SinusoidalLayout::Concatenated => "concatenated",
    }
}

/// The headline factor of a scaling, if it has one.
pub fn scaling_factor(s: &RopeScaling) -> Option<f64> {
    match s {
        RopeScaling::Linear { factor }
        | RopeScaling::Dynamic { factor, .. }
        | RopeScaling::Yarn(YarnParams { factor, .. })
        | RopeScaling::LongRope { factor, .. }
        | RopeScaling::Llama3 { factor, .. }
        | RopeScaling::Proportional { factor, .. } => Some(*factor),
        RopeScaling::Ntk { alpha } => Some(*alpha),
        _ => None,
    }
}

/// One heatmap of a picture.
#[derive(Debug, Clone)]
pub struct Panel {
    /// Panel title.
    pub title: String,
    /// The matrix (rows as in `orientation`).
    pub data: Vec<Vec<f64>>,
    /// Horizontal axis label.
    pub x_label: String,
    /// Vertical axis label.
    pub y_label: String,
    /// Colour-bar label.
    pub colorbar_label: String,
    /// How rows are drawn.
    pub orientation: Orientation,
    /// Colour map.
    pub colormap: Colormap,
    /// Value range.
    pub range: ValueRange,
}

impl Panel {
    fn table(title: String, data: Vec<Vec<f64>>, y_label: &str, value: &str) -> Panel {
        Panel {
            title,
            data,
            x_label: "position".into(),
            y_label: y_label.into(),
            colorbar_label: value.into(),
            orientation: Orientation::RowsAsColumns,
            colormap: Colormap::RdBu,
            range: ValueRange::Symmetric,
        }
    }

    fn matrix(title: String, data: Vec<Vec<f64>>, value: &str, colormap: Colormap) -> Panel {
        Panel {
            title,
            data,
            x_label: "key position j".into(),
            y_label: "query position i".into(),
            colorbar_label: value.into(),
            orientation: Orientation::RowsAsRows,
            colormap,
            range: ValueRange::Auto,
        }
    }

    /// The posenc-plot heatmap of this panel.
    pub fn heatmap(&self) -> Result<posenc_plot::Heatmap> {
        Ok(posenc_plot::Heatmap::new(self.data.clone())?
            .title(self.title.clone())
            .x_label(self.x_label.clone())
            .y_label(self.y_label.clone())
            .colorbar_label(self.colorbar_label.clone())
            .orientation(self.orientation)
            .colormap(self.colormap)
            .range(self.range))
    }
}

/// What a picture of an encoding holds.
#[derive(Debug, Clone)]
pub struct Picture {
    /// Figure title.
    pub title: String,
    /// One or more heatmaps.
    pub panels: Vec<Panel>,
    /// `Some(bits)` for the binary analogy (then `panels[0]` is the
    /// sinusoidal table).
    pub bits: Option<Vec<Vec<f64>>>,
}

fn to_f64(v: Vec<f32>, rows: usize) -> Vec<Vec<f64>> {
    if rows == 0 {
        return Vec::new();
    }
    let cols = v.len() / rows;
    v.chunks(cols.max(1))
        .map(|r| r.iter().map(|&x| x as f64).collect())
        .collect()
}

fn index_matrix(m: Vec<Vec<usize>>) -> Vec<Vec<f64>> {
    m.into_iter()
        .map(|r| r.into_iter().map(|x| x as f64).collect())
        .collect()
}

impl Encoding {
    /// The positions pictured: `0..positions`.
    pub fn position_list(&self) -> Vec<u64> {
        (0..self.positions as u64).collect()
    }

    /// The absolute encoding, for the families that have one.
    pub fn absolute(&self) -> Option<&dyn AbsoluteEncoding> {
        match &self.built {
            Built::Sinusoidal(s) | Built::Binary(s) => Some(s),
            Built::Learned(t) => Some(t),
            Built::Floater(f) => Some(f),
            _ => None,
        }
    }

    /// One inverse frequency per pair, for the families that rotate.
    pub fn inv_freq(&self) -> Option<Vec<f64>> {
        match &self.built {
            Built::Sinusoidal(s) | Built::Binary(s) => Some(s.frequencies().to_vec()),
            Built::Rope { freqs, .. } => Some(freqs.inv_freq.iter().map(|&f| f as f64).collect()),
            Built::XPos(x) => Some(x.inv_freq().to_vec()),
            _ => None,
        }
    }

    /// The matrices that picture this encoding.
    pub fn picture(&self) -> Result<Picture> {
        let pos = self.position_list();
        let n = self.positions;
        let title = self.label.clone();
        let one = |p: Panel| Picture {
            title: p.title.clone(),
            panels: vec![p],
            bits: None,
        };
        Ok(match &self.built {
            Built::Sinusoidal(s) => {
                one(Panel::table(title, s.table_range(0, n)?, "dimension", "PE"))
            }
            Built::Learned(t) => one(Panel::table(title, t.table(&pos)?, "dimension", "PE")),
            Built::Floater(f) => one(Panel::table(title, f.table_f64(n), "dimension", "PE")),
            Built::Binary(s) => {
                let bits_n = (usize::BITS - (n.max(2) - 1).leading_zeros()) as usize;
                let bits = (0..n)
                    .map(|p| (0..bits_n).map(|k| ((p >> k) & 1) as f64).collect())
                    .collect();
                Picture {
                    title: "Positions as bits and as sinusoids".into(),
                    panels: vec![Panel::table(
                        "Sinusoidal encoding".into(),
                        s.table_range(0, n)?,
                        "dimension",
                        "PE",
                    )],
                    bits: Some(bits),
                }
            }
            Built::Rope { freqs, .. } => {
                let (c, s) = freqs.cos_sin_table(&pos);
                Picture {
                    title,
                    panels: vec![
                        Panel::table("cos(m·θ_i)".into(), to_f64(c, n), "pair i", "cos"),
                        Panel::table("sin(m·θ_i)".into(), to_f64(s, n), "pair i", "sin"),
                    ],
                    bits: None,
                }
            }
            Built::XPos(x) => {
                let sb = x.scale_base();
                let scale = |sign: f64| -> Vec<Vec<f64>> {
                    pos.iter()
                        .map(|&m| {
                            x.zeta()
                                .iter()
                                .map(|z| z.powf(sign * m as f64 / sb))
                                .collect()
                        })
                        .collect()
                };
                let mk = |t: &str, d| Panel {
                    colormap: Colormap::Viridis,
                    range: ValueRange::Auto,
                    ..Panel::table(t.into(), d, "pair i", "scale")
                };
                Picture {
                    title,
                    panels: vec![
                        mk("query scale ζ_i^(m/scale_base)", scale(1.0)),
                        mk("key scale ζ_i^(−n/scale_base)", scale(-1.0)),
                    ],
                    bits: None,
                }
            }
            Built::Alibi(a, h) => one(Panel::matrix(
                title,
                a.bias_matrix(*h, &pos, &pos)?,
                "bias",
                Colormap::Viridis,
            )),
            Built::T5(b, bias, h, show_bias) => {
                if *show_bias {
                    one(Panel::matrix(
                        title,
                        bias.bias_matrix(*h, &pos, &pos)?,
                        "bias",
                        Colormap::RdBu,
                    ))
                } else {
                    one(Panel::matrix(
                        title,
                        index_matrix(b.bucket_matrix(n, n, 0, 0)?),
                        "bucket",
                        Colormap::Viridis,
                    ))
                }
            }
            Built::Shaw(s) => one(Panel::matrix(
                title,
                index_matrix(s.index_matrix(n, n, 0, 0)?),
                "table row",
                Colormap::Viridis,
            )),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rope(scaling: &str, factor: Option<f64>) -> Result<RopeConfig> {
        let o = EncodingOptions {
            scaling: Some(scaling.into()),
            factor,
            original_max: Some(64),
            ..EncodingOptions::default()
        };
        rope_config(&o, 16)
    }

    #[test]
    fn scaling_takes_its_factor_in_the_name_or_from_factor() {
        for (named, family) in [
            ("linear:2", "linear"),
            ("pi:2", "linear"),
            ("ntk:2", "ntk"),
            ("dynamic:2", "dynamic"),
            ("yarn:2", "yarn"),
        ] {
            assert_eq!(
                rope(named, None).unwrap(),
                rope(family, Some(2.0)).unwrap(),
                "{named}"
            );
        }
        let e = rope("yarn:2", Some(2.0)).unwrap_err().to_string();
        assert!(e.contains("drop --factor"), "{e}");
        let e = rope("yarn:0", None).unwrap_err().to_string();
        assert!(e.contains("factor must be in"), "{e}");
        let e = rope("bogus", None).unwrap_err().to_string();
        assert!(e.contains("unknown scaling"), "{e}");
    }
}
