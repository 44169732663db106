//! `posenc perplexity` and `posenc generate`: pretrained decoders (GGUF,
//! Hugging Face safetensors) through posenc's RoPE and attention, with any
//! RoPE scaling, past their trained length. The work is in the
//! `posenc-models` crate; the figure in `posenc-report`.

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use posenc_models::ModelError;
use posenc_plot::Figure;
use posenc_run::{
    GenerateRequest, OpenOptions, PerplexityRequest, PromptSource, RunError, Session, Text,
};

use crate::output::{check_writable, num, table, write_atomic, RunBar};
use crate::{CliError, CliResult};

impl From<ModelError> for CliError {
    fn from(e: ModelError) -> Self {
        CliError(e.to_string())
    }
}

impl From<RunError> for CliError {
    fn from(e: RunError) -> Self {
        CliError(e.to_string())
    }
}

/// The scalings `posenc perplexity` compares by default.
pub use posenc_run::perplexity::DEFAULT_SCALINGS;

/// The precision of the attention's products on windows of more than
/// 1,024 tokens.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProductsArg {
    /// f32 throughout.
    F32,
    /// q·k and p·v in bfloat16, summed in f32 (CPUs with AVX-512 and
    /// AVX512_BF16; the softmax stays f32).
    Bf16,
}

impl From<ProductsArg> for posenc_models::llama::Products {
    fn from(p: ProductsArg) -> Self {
        match p {
            ProductsArg::F32 => Self::F32,
            ProductsArg::Bf16 => Self::Bf16,
        }
    }
}

/// The options that every command running a pretrained model shares: its
/// tokenizer and a LoRA adapter merged into it.
#[derive(Args, Debug)]
pub struct ModelExtras {
    /// A tokenizer.json to use instead of the model's own tokenizer.
    #[arg(long, value_name = "FILE")]
    pub tokenizer: Option<PathBuf>,
    /// A LoRA adapter directory in PEFT's layout (adapter_config.json,
    /// adapter_model.safetensors; e.g. `posenc finetune --model --out`),
    /// merged into the model's weights (W + alpha/r·B·A) before the run;
    /// one whose names or shapes do not fit the model is refused.
    #[arg(long, value_name = "DIR")]
    pub adapter: Option<PathBuf>,
}

impl ModelExtras {
    /// Opens the model at `path` with these options (config, tokenizer and
    /// adapter checked; no weight read).
    pub fn open(&self, path: &Path, products: ProductsArg) -> CliResult<Session> {
        Ok(Session::open(
            path,
            &OpenOptions {
                tokenizer: self.tokenizer.clone(),
                products: products.into(),
                adapter: self.adapter.clone(),
            },
        )?)
    }
}

/// Arguments of `posenc perplexity`.
#[derive(Args, Debug)]
pub struct PerplexityArgs {
    /// The model: a GGUF file, or a Hugging Face checkpoint directory
    /// (config.json + *.safetensors).
    #[arg(long, value_name = "FILE")]
    pub model: PathBuf,
    /// UTF-8 text to score (default: Pride and Prejudice, built in); it is
    /// tokenized as one string, and the first --length tokens are the
    /// window.
    #[arg(long, value_name = "FILE")]
    pub text: Option<PathBuf>,
    /// Score the text's held-out part instead of its start: the window
    /// begins where its last 10% of tokens begins, the part `posenc
    /// finetune` never trains on.
    #[arg(long = "held-out")]
    pub held_out: bool,
    /// Window length in tokens (default: twice the model's trained length).
    #[arg(long)]
    pub length: Option<usize>,
    /// RoPE scalings to compare, comma-separated: model (the config's own),
    /// none, linear:F (Position Interpolation), dynamic:F (dynamic NTK),
    /// ntk:F (NTK-aware base), yarn:F. Factors are relative to the trained
    /// length. Training-free attention methods too: self-extend:G:W,
    /// rerope:W, leaky-rerope:W:K, dca:CHUNK:LOCAL, sinks:S:WINDOW, alone or
    /// with a scaling (METHOD+SCALING).
    #[arg(long, default_value = DEFAULT_SCALINGS)]
    pub scaling: String,
    /// Positions per band of the summary.
    #[arg(long, default_value_t = 1024)]
    pub band: usize,
    #[command(flatten)]
    pub extras: ModelExtras,
    /// Print JSON instead of a table: {"scalings": {NAME: {"bands": {"A-B":
    /// loss, ...}, "mean_inside", "mean_beyond", ...}}, "tokens_per_second", ...}.
    #[arg(long)]
    pub json: bool,
    /// Include the loss at every position in the JSON.
    #[arg(long = "per-position")]
    pub per_position: bool,
    /// Write the figure of loss against position (.png or .svg).
    #[arg(long, value_name = "FILE")]
    pub out: Option<PathBuf>,
    /// No progress bar.
    #[arg(long)]
    pub quiet: bool,
    /// The precision of the attention's products past 1,024 tokens.
    #[arg(long, value_enum, default_value_t = ProductsArg::F32)]
    pub products: ProductsArg,
    /// The memory the run may use (900M, 2G, ...): the run is refused
    /// before anything large is allocated when its estimate is over it.
    /// Default: the smaller of the available memory (MemAvailable) and
    /// RLIMIT_AS less what the process maps.
    #[arg(long = "max-memory", value_name = "SIZE")]
    pub max_memory: Option<String>,
}

/// Arguments of `posenc generate`.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    /// The model: a GGUF file, or a Hugging Face checkpoint directory.
    #[arg(long, value_name = "FILE")]
    pub model: PathBuf,
    /// The prompt.
    #[arg(long, conflicts_with = "prompt_file")]
    pub prompt: Option<String>,
    /// Read the prompt from a UTF-8 file.
    #[arg(long = "prompt-file", value_name = "FILE")]
    pub prompt_file: Option<PathBuf>,
    /// Keep only the last N tokens of the prompt (a prompt may have at most
    /// 131,072 tokens, posenc_models::input::MAX_PROMPT_TOKENS).
    #[arg(long = "prompt-tokens")]
    pub prompt_tokens: Option<usize>,
    /// New tokens to generate at most (fewer if an end-of-sequence token
    /// comes).
    #[arg(long = "max-tokens", default_value_t = 64)]
    pub max_tokens: usize,
    /// One RoPE scaling (see `posenc perplexity --help`).
    #[arg(long, default_value = "model")]
    pub scaling: String,
    /// Sampling temperature; 0 (the default) is greedy decoding.
    #[arg(long, default_value_t = 0.0, allow_hyphen_values = true)]
    pub temperature: f64,
    /// Nucleus sampling mass (with --temperature > 0).
    #[arg(long = "top-p", default_value_t = 1.0, allow_hyphen_values = true)]
    pub top_p: f64,
    /// Seed of the sampler.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    #[command(flatten)]
    pub extras: ModelExtras,
    /// Print JSON (prompt and new token ids, text, speed) instead of
    /// streaming the text.
    #[arg(long)]
    pub json: bool,
    /// The precision of the attention's products past 1,024 tokens.
    #[arg(long, value_enum, default_value_t = ProductsArg::F32)]
    pub products: ProductsArg,
    /// The memory the run may use (900M, 2G, ...): the run is refused
    /// before anything large is allocated when its estimate is over it.
    /// Default: the smaller of the available memory (MemAvailable) and
    /// RLIMIT_AS less what the process maps.
    #[arg(long = "max-memory", value_name = "SIZE")]
    pub max_memory: Option<String>,
}

/// Runs `posenc perplexity`.
pub fn perplexity(a: PerplexityArgs) -> CliResult {
    let request = PerplexityRequest {
        text: a.text.clone().map_or(Text::Default, Text::File),
        length: a.length,
        scalings: vec![a.scaling.clone()],
        band: a.band,
        held_out: a.held_out,
        per_position: a.per_position,
        adapter: None,
        max_memory: max_memory(a.max_memory.as_deref())?,
    };
    request.check()?;
    posenc_models::llama::check_products(a.products.into())?;
    if let Some(out) = &a.out {
        figure_kind(out)?;
        check_writable(out, "--out")?;
    }
    posenc_models::input::check_model_path(&a.model)?;
    if let Some(t) = &a.extras.tokenizer {
        posenc_models::input::check_regular(t)?;
    }
    request.check_files()?;
    let mut session = a.extras.open(&a.model, a.products)?;
    let mut bar = RunBar::new(
        "{msg:>14} [{bar:32}] {pos}/{len} layers, {elapsed} (eta {eta})",
        a.quiet || a.json && !stderr_is_tty(),
        !a.json,
    );
    let study = session.perplexity_study(&request, &mut |p| bar.report(p))?;
    bar.finish();
    let length = study.length;
    let warning = posenc_run::perplexity::uniform_warning(&study, session.config().vocab_size);
    if let Some(w) = &warning {
        eprintln!("posenc: warning: {w}");
    }
    if let Some(out) = &a.out {
        let plot = posenc_report::pretrained::loss_plot(&study);
        let err = |e: posenc_plot::PlotError| CliError(format!("{}: {e}", out.display()));
        let bytes = match figure_kind(out)? {
            FigureKind::Svg => plot.to_svg_string(900, 520).map_err(err)?.into_bytes(),
            FigureKind::Png => plot.to_png_bytes(900, 520).map_err(err)?,
        };
        write_atomic(out, &bytes)?;
    }
    if a.json {
        let mut json = study.to_json(a.per_position);
        if let Some(w) = warning {
            json["warning"] = w.into();
        }
        println!("{}", serde_json::to_string_pretty(&json)?);
        return Ok(());
    }
    let names: Vec<String> = study.runs.iter().map(|r| r.name.clone()).collect();
    let mut header = vec!["positions".to_string()];
    header.extend(names.iter().cloned());
    let nb = study.runs.first().map_or(0, |r| r.bands.len());
    let mut rows: Vec<Vec<String>> = (0..nb)
        .map(|i| {
            let b = &study.runs[0].bands[i];
            let mut row = vec![format!("{}-{}", b.start, b.end.min(length - 1))];
            row.extend(study.runs.iter().map(|r| num(r.bands[i].loss, 3)));
            row
        })
        .collect();
    let opt = |x: Option<f64>| x.map_or("-".into(), |v| num(v, 3));
    let l = study.trained_length;
    let mut inside = vec![format!("mean < {l}")];
    inside.extend(study.runs.iter().map(|r| opt(r.mean_inside)));
    let mut beyond = vec![format!("mean ≥ {l}")];
    beyond.extend(study.runs.iter().map(|r| opt(r.mean_beyond)));
    let mut speed = vec!["tokens/s".to_string()];
    speed.extend(study.runs.iter().map(|r| num(r.tokens_per_second, 0)));
    rows.extend([inside, beyond, speed]);
    print!("{}", table(&header, &rows));
    println!(
        "loss of token i+1 given tokens 0..i, in nats; band A-B: mean over positions i in [A, B)"
    );
    if let Some(out) = &a.out {
        println!("wrote {}", out.display());
    }
    Ok(())
}

/// `--max-memory SIZE` in bytes.
pub(crate) fn max_memory(s: Option<&str>) -> CliResult<Option<u64>> {
    Ok(s.map(posenc_run::memory::parse_size).transpose()?)
}

pub(crate) fn stderr_is_tty() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal()
}

pub(crate) enum FigureKind {
    Png,
    Svg,
}

pub(crate) fn figure_kind(out: &std::path::Path) -> CliResult<FigureKind> {
    match out
        .extension()
        .and_then(|e| e.to_str())
        .map(str::to_ascii_lowercase)
        .as_deref()
    {
        Some("png") => Ok(FigureKind::Png),
        Some("svg") => Ok(FigureKind::Svg),
        _ => Err(CliError(format!(
            "--out {}: the figure must be .png or .svg",
            out.display()
        ))),
    }
}

/// Runs `posenc generate`.
pub fn generate_cmd(a: GenerateArgs) -> CliResult {
    let prompt = match (&a.prompt, &a.prompt_file) {
        (Some(p), None) => PromptSource::String(p.clone()),
        (None, Some(f)) => PromptSource::File(f.clone()),
        _ => PromptSource::String(String::new()),
    };
    let request = GenerateRequest {
        prompt,
        prompt_tokens: a.prompt_tokens,
        max_new_tokens: a.max_tokens,
        scaling: a.scaling.clone(),
        sampling: posenc_run::generate::sampling(a.temperature, a.top_p, a.seed),
        adapter: None,
        stream_text: !a.json,
        max_memory: max_memory(a.max_memory.as_deref())?,
    };
    // The checks that need no model, in the command's order.
    request.scaling.parse::<posenc_models::Scaling>()?;
    posenc_models::llama::check_products(a.products.into())?;
    request.check()?;
    if a.prompt.is_some() == a.prompt_file.is_some() {
        return Err(CliError("give --prompt TEXT or --prompt-file FILE".into()));
    }
    if let Some(f) = &a.prompt_file {
        posenc_models::input::check_regular(f)?;
    }
    let mut session = a.extras.open(&a.model, a.products)?;
    let mut shown = String::new();
    let mut stdout = std::io::stdout();
    let v = session.generate(&request, &mut |p| {
        if a.json {
            return true;
        }
        match (p.token, p.text) {
            (None, _) if p.what == posenc_run::generate::PREFILL => {}
            (None, _) => eprintln!("{}", p.what),
            // Print what the new token added once it decodes to whole
            // characters.
            (Some(_), Some(piece)) if !piece.is_empty() => {
                let _ = write!(stdout, "{piece}");
                let _ = stdout.flush();
                shown.push_str(piece);
            }
            _ => {}
        }
        true
    })?;
    let text = v["text"].as_str().unwrap_or_default().to_string();
    let n = v["new_ids"].as_array().map_or(0, Vec::len);
    let secs = v["seconds"].as_f64().unwrap_or(0.0);
    if a.json {
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        if text.len() > shown.len() && text.starts_with(&shown) {
            print!("{}", &text[shown.len()..]);
        }
        println!();
        eprintln!(
            "{} new tokens in {:.2} s ({:.1} tokens/s, prompt included)",
            n,
            secs,
            n as f64 / secs.max(1e-9)
        );
    }
    Ok(())
}
