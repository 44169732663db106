//! `posenc perplexity` and `posenc generate`: pretrained decoders (GGUF,
//! Hugging Face safetensors) through posenc's RoPE and attention, with any
//! RoPE scaling, past their trained length. The work is in the
//! `posenc-models` crate; the figure in `posenc-report`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use posenc_models::generate::{generate, Sampling};
use posenc_models::input::{self, Prompt};
use posenc_models::perplexity::{self, rope_of};
use posenc_models::{
    scaling, Decoder, DecoderConfig, ModelError, ModelFiles, Scaling, TextTokenizer,
};
use posenc_plot::Figure;
use posenc_tune::peft::Adapter;

use crate::output::{check_writable, num, table, write_atomic};
use crate::{CliError, CliResult};

impl From<ModelError> for CliError {
    fn from(e: ModelError) -> Self {
        CliError(e.to_string())
    }
}

/// The scalings `posenc perplexity` compares by default.
pub const DEFAULT_SCALINGS: &str = "none,linear:2,dynamic:2,ntk:2,yarn:2";

/// Largest window accepted before any estimate (the memory check comes
/// next and is usually the tighter bound).
pub const MAX_LENGTH: usize = 1 << 22;

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
    /// Reads the adapter (if any) against the model's config, before the
    /// weights.
    pub fn read_adapter(&self, cfg: &DecoderConfig) -> CliResult<Option<Adapter>> {
        crate::cmd_tune::read_adapter(self.adapter.as_deref(), cfg)
    }

    /// The tokenizer (--tokenizer, or the model's own) with the config's
    /// special ids, checked against the model's vocabulary.
    pub fn tokenizer(&self, files: &ModelFiles, cfg: &DecoderConfig) -> CliResult<TextTokenizer> {
        Ok(files.tokenizer_for(self.tokenizer.as_deref(), cfg)?)
    }

    /// Loads the weights, merges `adapter` (from [`Self::read_adapter`])
    /// and sets the products' precision: the model and its description.
    pub fn load(
        &self,
        files: ModelFiles,
        cfg: DecoderConfig,
        adapter: Option<Adapter>,
        products: ProductsArg,
    ) -> CliResult<(Decoder, String)> {
        let (mut model, source) = files.load(cfg)?;
        crate::cmd_tune::merge_adapter(adapter.as_ref(), self.adapter.as_deref(), &mut model)?;
        let source = with_adapter(source, self.adapter.as_deref());
        model.set_products(products.into())?;
        Ok((model, source))
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
}

fn bar(total: u64, quiet: bool) -> ProgressBar {
    if quiet {
        return ProgressBar::hidden();
    }
    progress_bar(
        total,
        "{msg:>14} [{bar:32}] {pos}/{len} layers, {elapsed} (eta {eta})",
    )
}

/// A progress bar of `total` steps drawn by the indicatif `template`.
pub fn progress_bar(total: u64, template: &str) -> ProgressBar {
    let b = ProgressBar::new(total);
    b.set_style(
        ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    b
}

/// Runs `posenc perplexity`.
pub fn perplexity(a: PerplexityArgs) -> CliResult {
    let scalings = scaling::parse_list(&a.scaling)?;
    posenc_models::llama::check_products(a.products.into())?;
    if a.band == 0 {
        return Err(CliError("--band must be at least 1".into()));
    }
    if let Some(out) = &a.out {
        figure_kind(out)?;
        check_writable(out, "--out")?;
    }
    check_inputs(&a.model, a.extras.tokenizer.as_deref(), a.text.as_deref())?;
    // Headers and config only: nothing large is read before the checks.
    let mut files = ModelFiles::open(&a.model)?;
    let cfg = files.config()?;
    let adapter = a.extras.read_adapter(&cfg)?;
    let length = a.length.unwrap_or(2 * cfg.trained_length());
    if !(2..=MAX_LENGTH).contains(&length) {
        return Err(CliError(format!("--length must be in 2..={MAX_LENGTH}")));
    }
    posenc_models::check_memory(&cfg, length, None)?;
    let tk = a.extras.tokenizer(&files, &cfg)?;
    // A text file is read and tokenized only as far as the window needs.
    // (With --held-out the whole text: its tail is the window.)
    let all = match &a.text {
        Some(p) if a.held_out => tk.encode(&posenc_models::read_text(p)?)?,
        Some(p) => input::text_tokens(p, &tk, length)?,
        None => tk.encode(posenc_report::corpus::PRIDE_AND_PREJUDICE)?,
    };
    let all = if a.held_out {
        let tail = posenc_tune::data::held_out_tokens(&all);
        if tail.len() < length {
            return Err(CliError(format!(
                "--held-out: the text's last 10% is {} tokens, fewer than --length {length}",
                tail.len()
            )));
        }
        tail.to_vec()
    } else {
        all
    };
    let tokens = perplexity::window(&all, length)?.to_vec();
    drop(all);
    let layers = cfg.num_layers;
    let (model, source) = a.extras.load(files, cfg, adapter, a.products)?;
    if let Some(first) = scalings.first() {
        let rope = rope_of(first.rope_config(model.config())?)?;
        input::check_first_forward(&model, &tokens, &rope, &mut |k| first_layers(&a.model, k))?;
    }
    if !a.json {
        eprintln!(
            "{source}; tokenizer: {}; window of {length} tokens, trained length {}",
            tk.source(),
            model.config().trained_length()
        );
    }
    let pb = bar(
        (layers * scalings.len()) as u64,
        a.quiet || a.json && !stderr_is_tty(),
    );
    let study = perplexity::study(&model, &source, &tokens, &scalings, a.band, |s, _| {
        pb.set_message(scalings[s].name.clone());
        pb.inc(1);
    })?;
    pb.finish_and_clear();
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
        println!(
            "{}",
            serde_json::to_string_pretty(&study.to_json(a.per_position))?
        );
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

/// The model's description with the adapter merged into it, if any.
pub(crate) fn with_adapter(source: String, adapter: Option<&Path>) -> String {
    match adapter {
        Some(d) => format!("{source}; LoRA adapter {} merged", d.display()),
        None => source,
    }
}

/// Refuses, before anything is opened, a model path, tokenizer or text
/// that is missing or not a regular file (a FIFO would block, a device
/// never ends).
fn check_inputs(model: &Path, tokenizer: Option<&Path>, text: Option<&Path>) -> CliResult {
    input::check_model_path(model)?;
    for p in [tokenizer, text].into_iter().flatten() {
        input::check_regular(p)?;
    }
    Ok(())
}

/// The model at `path` with its first `layers` layers only (to find the
/// first layer whose output is not finite).
fn first_layers(path: &Path, layers: usize) -> posenc_models::Result<Decoder> {
    let mut files = ModelFiles::open(path)?;
    let mut cfg = files.config()?;
    cfg.num_layers = layers;
    Ok(files.load(cfg)?.0)
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
    let sc: Scaling = a.scaling.parse()?;
    posenc_models::llama::check_products(a.products.into())?;
    let sampling = if a.temperature == 0.0 {
        Sampling::Greedy
    } else {
        Sampling::Sample {
            temperature: a.temperature,
            top_p: a.top_p,
            seed: a.seed,
        }
    };
    posenc_models::generate::check_sampling(sampling)?;
    if a.max_tokens > MAX_LENGTH {
        return Err(CliError(format!(
            "--max-tokens must be at most {MAX_LENGTH}"
        )));
    }
    let prompt = match (&a.prompt, &a.prompt_file) {
        (Some(p), None) => Prompt::Text(p),
        (None, Some(f)) => Prompt::File(f),
        _ => return Err(CliError("give --prompt TEXT or --prompt-file FILE".into())),
    };
    if a.prompt_tokens == Some(0) {
        return Err(CliError("--prompt-tokens must be at least 1".into()));
    }
    check_inputs(
        &a.model,
        a.extras.tokenizer.as_deref(),
        a.prompt_file.as_deref(),
    )?;
    let mut files = ModelFiles::open(&a.model)?;
    let cfg = files.config()?;
    let adapter = a.extras.read_adapter(&cfg)?;
    let tk = a.extras.tokenizer(&files, &cfg)?;
    // At most MAX_PROMPT_TOKENS, refused before any prefill.
    let ids = input::prompt_tokens(&tk, prompt, a.prompt_tokens)?;
    if ids.is_empty() {
        return Err(CliError("the prompt has no tokens".into()));
    }
    let total = ids.len() + a.max_tokens;
    if total > MAX_LENGTH {
        return Err(CliError(format!(
            "prompt and new tokens exceed {MAX_LENGTH}"
        )));
    }
    posenc_models::check_memory(&cfg, total, None)?;
    let rope = rope_of(sc.rope_config(&cfg)?)?;
    let (mut model, source) = a.extras.load(files, cfg, adapter, a.products)?;
    model.set_method(sc.method)?;
    input::check_first_forward(&model, &ids, &rope, &mut |k| first_layers(&a.model, k))?;
    if !a.json {
        eprintln!("{source}; {} prompt tokens; scaling {}", ids.len(), sc.name);
    }
    let start = Instant::now();
    let mut shown = String::new();
    let mut new_ids: Vec<u32> = Vec::new();
    let stop = tk.eos().to_vec();
    let mut stdout = std::io::stdout();
    let out = generate(&model, &ids, a.max_tokens, &rope, sampling, &stop, |t| {
        if a.json {
            return;
        }
        new_ids.push(t);
        if let Ok(text) = tk.decode(&new_ids) {
            // Print what the new token added once it decodes to whole
            // characters (a byte-level token can end inside one).
            if text.len() > shown.len() && text.starts_with(&shown) && !text.ends_with('\u{FFFD}') {
                let _ = write!(stdout, "{}", &text[shown.len()..]);
                let _ = stdout.flush();
                shown = text;
            }
        }
    })?;
    let secs = start.elapsed().as_secs_f64();
    let text = tk.decode(&out)?;
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&serde_json::json!({
                "model": source,
                "scaling": sc.name,
                "prompt_ids": ids,
                "new_ids": out,
                "text": text,
                "seconds": secs,
                "tokens_per_second": out.len() as f64 / secs.max(1e-9),
            }))?
        );
    } else {
        if text.len() > shown.len() && text.starts_with(&shown) {
            print!("{}", &text[shown.len()..]);
        }
        println!();
        eprintln!(
            "{} new tokens in {:.2} s ({:.1} tokens/s, prompt included)",
            out.len(),
            secs,
            out.len() as f64 / secs.max(1e-9)
        );
    }
    Ok(())
}
