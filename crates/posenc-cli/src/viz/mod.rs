//! `posenc show`, `posenc analyze`, `posenc compare`: the arguments, mapped
//! onto the options of the `posenc-viz` library, which builds, measures and
//! draws; this module only prints and writes what it returns.
//!
//! An ENCODING is a family name (`sinusoidal`, `rope`, `alibi`, `t5`,
//! `shaw`, `learned`, `floater`, `xpos`, `binary`) optionally followed by
//! `:KEY=VALUE,...` with the same keys as the long options
//! (`rope:scaling=yarn,factor=8`); the spec's values win over the options.
//! `posenc show rope2d --grid HxW` draws a 2-D RoPE's patch similarity.

use std::path::PathBuf;

use clap::{Args, ValueEnum};
use posenc_plot::terminal::TerminalMode;
use posenc_viz::output::{check_writable, format_of, parse_size};
use posenc_viz::{AnalyzeOptions, EncodingOptions, ShowOptions};

/// Options that describe an encoding; each can also be given inside the
/// ENCODING spec as `NAME:KEY=VALUE,...` (the spec wins), so that `compare`
/// can give its two encodings different values.
#[derive(Args, Debug, Clone, Default)]
pub struct EncodingOpts {
    /// Number of positions (table rows; query and key positions of a bias).
    #[arg(long)]
    pub positions: Option<usize>,
    /// Model / head dimension.
    #[arg(long)]
    pub dim: Option<usize>,
    /// Layout: `interleaved` or `concatenated` (sinusoidal), `half-split` or
    /// `interleaved` (rope, xpos).
    #[arg(long)]
    pub layout: Option<String>,
    /// Sinusoidal base (default 10000).
    #[arg(long)]
    pub base: Option<f64>,
    /// Sinusoidal position offset (the first row is position OFFSET).
    #[arg(long)]
    pub offset: Option<u64>,
    /// RoPE / xPos base θ (default 10000).
    #[arg(long)]
    pub theta: Option<f64>,
    /// RoPE scaling: default, linear, ntk, dynamic, yarn, llama3, longrope,
    /// or one with its factor: linear:F, ntk:F, dynamic:F, yarn:F.
    #[arg(long)]
    pub scaling: Option<String>,
    /// Scaling factor (default 4).
    #[arg(long)]
    pub factor: Option<f64>,
    /// Pre-training context length for dynamic/yarn/llama3/longrope
    /// (default 4096).
    #[arg(long = "original-max")]
    pub original_max: Option<usize>,
    /// Sequence length the RoPE frequencies are computed for (dynamic NTK,
    /// LongRoPE); default: the table built at load time.
    #[arg(long = "seq-len")]
    pub seq_len: Option<usize>,
    /// A Hugging Face `config.json` to read RoPE from.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Number of heads (ALiBi, T5; default 8).
    #[arg(long)]
    pub heads: Option<usize>,
    /// Head drawn (ALiBi, T5; default 0).
    #[arg(long)]
    pub head: Option<usize>,
    /// T5 number of buckets (default 32).
    #[arg(long)]
    pub buckets: Option<usize>,
    /// T5 max distance (default 128).
    #[arg(long = "max-distance")]
    pub max_distance: Option<usize>,
    /// Causal (decoder) bias: ALiBi's default; T5 unidirectional buckets.
    #[arg(long, conflicts_with = "bidirectional")]
    pub causal: bool,
    /// Bidirectional (encoder) bias: T5's default; ALiBi's `−m·|i − j|`.
    #[arg(long)]
    pub bidirectional: bool,
    /// Shaw clipping distance k (default 4).
    #[arg(long)]
    pub k: Option<usize>,
    /// Seed of the random initialisation (learned, floater, shaw, t5 bias;
    /// default 0).
    #[arg(long)]
    pub seed: Option<u64>,
    /// A lab checkpoint (`posenc train --out DIR`) whose trained table
    /// (learned) or vector field (floater) to use instead of a random one.
    #[arg(long)]
    pub checkpoint: Option<std::path::PathBuf>,
    /// FLOATER hidden width (default 16).
    #[arg(long)]
    pub hidden: Option<usize>,
    /// FLOATER time step Δt between positions (default 0.1).
    #[arg(long = "delta-t")]
    pub delta_t: Option<f64>,
    /// xPos decay length (default 512).
    #[arg(long = "scale-base")]
    pub scale_base: Option<f64>,
    /// T5 picture: `buckets` (bucket index, default) or `bias` (a seeded
    /// random bias table).
    #[arg(long)]
    pub values: Option<String>,
}

impl From<EncodingOpts> for EncodingOptions {
    fn from(o: EncodingOpts) -> Self {
        EncodingOptions {
            positions: o.positions,
            dim: o.dim,
            layout: o.layout,
            base: o.base,
            offset: o.offset,
            theta: o.theta,
            scaling: o.scaling,
            factor: o.factor,
            original_max: o.original_max,
            seq_len: o.seq_len,
            config: o.config,
            heads: o.heads,
            head: o.head,
            buckets: o.buckets,
            max_distance: o.max_distance,
            causal: o.causal,
            bidirectional: o.bidirectional,
            k: o.k,
            seed: o.seed,
            checkpoint: o.checkpoint,
            hidden: o.hidden,
            delta_t: o.delta_t,
            scale_base: o.scale_base,
            values: o.values,
        }
    }
}

/// `--color`: how to draw in the terminal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, Default)]
pub enum ColorChoice {
    /// Detect from the environment (`NO_COLOR`, `TERM`, `COLORTERM`, tty).
    #[default]
    Auto,
    /// 24-bit colour.
    Truecolor,
    /// The 256-colour palette.
    #[value(name = "256")]
    Ansi256,
    /// Characters only.
    Plain,
}

impl ColorChoice {
    /// The terminal mode to draw with.
    pub fn mode(self) -> TerminalMode {
        match self {
            ColorChoice::Auto => TerminalMode::detect(),
            ColorChoice::Truecolor => TerminalMode::TrueColor,
            ColorChoice::Ansi256 => TerminalMode::Ansi256,
            ColorChoice::Plain => TerminalMode::Plain,
        }
    }
}

/// Arguments of `posenc show`.
#[derive(Args, Debug, Clone)]
pub struct ShowArgs {
    /// The encoding: sinusoidal, rope, alibi, t5, shaw, learned, floater,
    /// xpos, binary or rope2d (`rope2d:variant=axial|pixtral|llama4`),
    /// optionally with `:KEY=VALUE,...`.
    pub encoding: String,
    /// Encoding options.
    #[command(flatten)]
    pub opts: EncodingOpts,
    /// Write the picture to FILE.png or FILE.svg instead of the terminal.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Picture size WIDTHxHEIGHT in pixels (default: the natural size).
    #[arg(long)]
    pub size: Option<String>,
    /// Terminal colours.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
    /// `rope2d`: the grid of patches, HxW (default 16x16).
    #[arg(long)]
    pub grid: Option<String>,
    /// `rope2d`: the patch compared with every other, ROW,COL (default the centre).
    #[arg(long)]
    pub patch: Option<String>,
}

/// Runs `posenc show`.
pub fn show(a: ShowArgs) -> crate::CliResult {
    let size = a.size.as_deref().map(parse_size).transpose()?;
    if let Some(path) = &a.output {
        format_of(path)?;
        check_writable(path)?;
    }
    let pic = posenc_viz::picture(&ShowOptions {
        encoding: a.encoding,
        encoding_options: a.opts.into(),
        grid: a.grid,
        patch: a.patch,
    })?;
    match &a.output {
        Some(path) => {
            posenc_viz::show::write_picture(&pic, path, size)?;
            println!("wrote {} ({})", path.display(), pic.title);
        }
        None => print!("{}", posenc_viz::show::terminal(&pic, a.color.mode())?),
    }
    Ok(())
}

/// Arguments of `posenc analyze`.
#[derive(Args, Debug, Clone)]
pub struct AnalyzeArgs {
    /// The encoding: sinusoidal, rope, alibi, t5, shaw, learned, floater,
    /// xpos or binary (analysed as sinusoidal), optionally with
    /// `:KEY=VALUE,...`.
    pub encoding: String,
    /// Encoding options (`--dim` defaults to 128 here).
    #[command(flatten)]
    pub opts: EncodingOpts,
    /// Print the measurements as JSON.
    #[arg(long)]
    pub json: bool,
    /// Write one PNG and one SVG per plot, and `analysis.json`, into DIR.
    #[arg(short = 'o', long = "output", value_name = "DIR")]
    pub output: Option<PathBuf>,
    /// Distinctness: compare all positions up to N.
    #[arg(long, default_value_t = 1000)]
    pub n: u64,
    /// Similarity: offsets k = 0..=MAX_OFFSET.
    #[arg(long = "max-offset", default_value_t = 64)]
    pub max_offset: u64,
    /// Similarity: the reference position p.
    #[arg(long, default_value_t = 0)]
    pub from: u64,
    /// RoPE decay bound: distances 0..=DECAY_MAX.
    #[arg(long = "decay-max", default_value_t = 256)]
    pub decay_max: u64,
}

/// Runs `posenc analyze`.
pub fn analyze(a: AnalyzeArgs) -> crate::CliResult {
    if let Some(dir) = &a.output {
        std::fs::create_dir_all(dir)
            .map_err(|err| format!("cannot create {}: {err}", dir.display()))?;
    }
    let (analysis, plots) = posenc_viz::analyze(&AnalyzeOptions {
        encoding: a.encoding,
        encoding_options: a.opts.into(),
        n: a.n,
        max_offset: a.max_offset,
        from: a.from,
        decay_max: a.decay_max,
    })?;
    if let Some(dir) = &a.output {
        posenc_viz::analyze::write_all(dir, &analysis, &plots)?;
    }
    if a.json {
        println!("{}", serde_json::to_string_pretty(&analysis)?);
    } else {
        print!("{}", posenc_viz::analyze::summary(&analysis));
        if let Some(dir) = &a.output {
            println!(
                "wrote {} plots (PNG + SVG) and analysis.json to {}",
                plots.len(),
                dir.display()
            );
        }
    }
    Ok(())
}

/// Arguments of `posenc compare`.
#[derive(Args, Debug, Clone)]
pub struct CompareArgs {
    /// First encoding (e.g. `rope`).
    pub a: String,
    /// Second encoding (e.g. `rope:scaling=yarn,factor=8`).
    pub b: String,
    /// Options shared by both encodings (each spec's `:KEY=VALUE` wins).
    #[command(flatten)]
    pub opts: EncodingOpts,
    /// Write the figure to FILE.png or FILE.svg (else: terminal heatmaps).
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Terminal colours.
    #[arg(long, value_enum, default_value_t = ColorChoice::Auto)]
    pub color: ColorChoice,
}

/// Runs `posenc compare`.
pub fn compare(a: CompareArgs) -> crate::CliResult {
    if let Some(path) = &a.output {
        format_of(path)?;
        check_writable(path)?;
    }
    let c = posenc_viz::compare(&a.a, &a.b, &a.opts.into())?;
    match &a.output {
        Some(path) => {
            c.write(path)?;
            print!("{}", c.summary);
            println!("wrote {}", path.display());
        }
        None => print!("{}", c.terminal(a.color.mode())?),
    }
    Ok(())
}
