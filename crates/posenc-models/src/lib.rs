//! # posenc-models — pretrained decoders on posenc's RoPE and attention
//!
//! Real checkpoints run through [`posenc`]'s fused attention and RoPE, with
//! any RoPE scaling chosen at run time, at any length that fits in memory:
//!
//! - **files**: GGUF (llama.cpp's format, read by candle's reader, tensors
//!   dequantized to `f32`: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 and
//!   the K-quants) and Hugging Face checkpoints (`config.json` with
//!   safetensors) — [`gguf`], [`weights`];
//! - **architectures**: the Llama family (Llama 2, Llama 3/3.1 with its
//!   llama3 scaling, SmolLM2, TinyLlama, Mistral) and Qwen2/Qwen2.5 —
//!   [`config`], [`llama`];
//! - **tokenizers**: the GGUF's own vocabulary and merges, rebuilt as
//!   transformers rebuilds them, or a `tokenizer.json` — [`tokenizer`];
//! - **scalings**: none, Position Interpolation (Chen et al. 2023), dynamic
//!   NTK, NTK-aware, YaRN (Peng et al. 2023), or the config's own —
//!   [`scaling`];
//! - **measurements**: loss at every position of a window
//!   ([`perplexity`]), and generation with a KV cache ([`generate`]).
//!
//! Every size read from a file is bounded before anything is allocated, and
//! a window's memory is estimated before the model is loaded
//! ([`check_memory`]).
//!
//! ```no_run
//! use posenc_models::{perplexity, PretrainedModel, Scaling};
//!
//! let model = PretrainedModel::load("SmolLM2-135M-Instruct.Q4_1.gguf".as_ref(), None)?;
//! let text = std::fs::read_to_string("book.txt").unwrap();
//! let tokens = model.tokenizer.encode(&text)?;
//! let window = perplexity::window(&tokens, 16384)?;
//! for name in ["none", "yarn:2"] {
//!     let scaling: Scaling = name.parse()?;
//!     let run = perplexity::run_scaling(&model.decoder, window, &scaling, 1024, &mut |_layer| {})?;
//!     println!("{name}: inside {:?}, beyond {:?}", run.mean_inside, run.mean_beyond);
//! }
//! # Ok::<(), posenc_models::ModelError>(())
//! ```
#![warn(missing_docs)]

/// `Debug` for a type whose contents are large or opaque: its name and the
/// fields listed, each `"label": |s| expression of s` (`s` the value).
macro_rules! debug_summary {
    ($t:ident { $($label:literal: |$s:ident| $e:expr),* $(,)? }) => {
        impl std::fmt::Debug for $t {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.debug_struct(stringify!($t))
                    $(.field($label, &{
                        let $s = self;
                        $e
                    }))*
                    .finish()
            }
        }
    };
}

pub mod config;
pub mod error;
pub mod fsio;
pub mod generate;
pub mod gguf;
pub mod input;
pub mod layers;
pub mod llama;
pub mod passkey;
pub mod perplexity;
pub mod safe;
pub mod scaling;
pub mod tokenizer;
pub mod weights;

use std::path::{Path, PathBuf};

pub use config::{Arch, DecoderConfig};
pub use error::{ModelError, Result};
pub use llama::{Decoder, KvCache, Step, DEFAULT_BLOCK_ROWS};
pub use scaling::{Scaling, ScalingKind};
pub use tokenizer::TextTokenizer;

use gguf::GgufFile;
use weights::{Safetensors, WeightSource};

/// Where a model is: a GGUF file, or a Hugging Face checkpoint directory.
#[derive(Debug)]
pub enum ModelFiles {
    /// A GGUF file.
    Gguf(GgufFile),
    /// A directory with `config.json` and safetensors.
    HuggingFace {
        /// The directory.
        dir: PathBuf,
        /// Its `config.json`'s text.
        config: String,
    },
}

/// Largest `config.json` read.
pub const MAX_CONFIG_BYTES: u64 = 4 << 20;

impl ModelFiles {
    /// Opens `path`: a `.gguf` file (or any file starting with GGUF's
    /// magic), a checkpoint directory, or the `config.json` inside one. Only
    /// headers and the config are read.
    ///
    /// # Errors
    /// [`ModelError::Io`] for a path that cannot be read,
    /// [`ModelError::BadFile`] for a file that is neither GGUF nor a
    /// config.
    pub fn open(path: &Path) -> Result<ModelFiles> {
        // Special files (FIFOs, devices) are refused by type, never opened
        // for a blocking read.
        fsio::check_model_path(path)?;
        let meta = std::fs::metadata(path).map_err(|e| ModelError::io(path, e))?;
        let dir = if meta.is_dir() {
            Some(path.to_path_buf())
        } else if path.file_name().is_some_and(|n| n == "config.json") {
            path.parent().map(Path::to_path_buf)
        } else {
            None
        };
        if let Some(dir) = dir {
            let cfg = dir.join("config.json");
            let bytes = fsio::read_bounded(&cfg, MAX_CONFIG_BYTES)?;
            let config = String::from_utf8(bytes)
                .map_err(|_| ModelError::bad_file(&cfg, "not UTF-8 text"))?;
            return Ok(ModelFiles::HuggingFace { dir, config });
        }
        let mut magic = [0u8; 4];
        {
            use std::io::Read;
            let (mut f, _) = fsio::open_regular(path)?;
            let n = f.read(&mut magic).map_err(|e| ModelError::io(path, e))?;
            if n < 4 || &magic != b"GGUF" {
                return Err(ModelError::bad_file(
                    path,
                    "not a GGUF file or a Hugging Face checkpoint directory",
                ));
            }
        }
        Ok(ModelFiles::Gguf(GgufFile::open(path)?))
    }

    /// The model's configuration (no weights read).
    ///
    /// # Errors
    /// Those of [`DecoderConfig`] and [`GgufFile::config`].
    pub fn config(&mut self) -> Result<DecoderConfig> {
        match self {
            ModelFiles::Gguf(g) => g.config(),
            ModelFiles::HuggingFace { dir, config } => {
                DecoderConfig::from_hf_json_file(&dir.join("config.json"), config)
            }
        }
    }

    /// The tokenizer: `explicit` if given, else the GGUF's own or the
    /// checkpoint's `tokenizer.json`.
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] when there is none.
    pub fn tokenizer(&self, explicit: Option<&Path>) -> Result<TextTokenizer> {
        if let Some(p) = explicit {
            return TextTokenizer::from_file(p);
        }
        match self {
            ModelFiles::Gguf(g) => TextTokenizer::from_gguf(g),
            ModelFiles::HuggingFace { dir, .. } => {
                let p = dir.join("tokenizer.json");
                if !p.is_file() {
                    return Err(ModelError::Tokenizer(format!(
                        "{}: no tokenizer.json; pass --tokenizer FILE",
                        safe::path(dir)
                    )));
                }
                TextTokenizer::from_file(&p)
            }
        }
    }

    /// The tokenizer of [`ModelFiles::tokenizer`] with `cfg`'s special
    /// token ids, checked against `cfg`'s vocabulary.
    ///
    /// # Errors
    /// Those of [`ModelFiles::tokenizer`] and
    /// [`TextTokenizer::check_model_vocab`].
    pub fn tokenizer_for(
        &self,
        explicit: Option<&Path>,
        cfg: &DecoderConfig,
    ) -> Result<TextTokenizer> {
        let tk = self
            .tokenizer(explicit)?
            .with_config_ids(cfg.bos_token_id, &cfg.eos_token_ids);
        tk.check_model_vocab(cfg.vocab_size)?;
        Ok(tk)
    }

    /// Reads the weights into a [`Decoder`].
    ///
    /// # Errors
    /// Those of [`Decoder::load`].
    pub fn load(self, cfg: DecoderConfig) -> Result<(Decoder, String)> {
        match self {
            ModelFiles::Gguf(mut g) => {
                let what = g.describe();
                Ok((Decoder::load(cfg, &mut g)?, what))
            }
            ModelFiles::HuggingFace { dir, .. } => {
                let mut st = Safetensors::open_dir(&dir)?;
                let what = st.describe();
                Ok((Decoder::load(cfg, &mut st)?, what))
            }
        }
    }
}

/// A loaded model with its tokenizer.
#[derive(Debug)]
pub struct PretrainedModel {
    /// The network.
    pub decoder: Decoder,
    /// Its tokenizer.
    pub tokenizer: TextTokenizer,
    /// One line on the files (format, tensor types).
    pub source: String,
}

impl PretrainedModel {
    /// Opens and loads the model at `path` (see [`ModelFiles::open`]), with
    /// the tokenizer from `tokenizer` or from the model's files.
    ///
    /// # Errors
    /// Those of [`ModelFiles`] and [`Decoder::load`].
    pub fn load(path: &Path, tokenizer: Option<&Path>) -> Result<PretrainedModel> {
        let mut files = ModelFiles::open(path)?;
        let cfg = files.config()?;
        let tk = files.tokenizer_for(tokenizer, &cfg)?;
        let (decoder, source) = files.load(cfg)?;
        Ok(PretrainedModel {
            decoder,
            tokenizer: tk,
            source,
        })
    }
}

/// Estimated peak bytes of a forward pass over `len` tokens (weights as
/// `f32`, one layer's activations, the attention's per-thread scratch, one
/// block of logits), for `threads` threads.
pub fn estimate_bytes(cfg: &DecoderConfig, len: usize, threads: usize) -> u64 {
    let t = len as u64;
    let d = cfg.hidden_size as u64;
    let w = cfg.qkv_width() as u64;
    let hq = (cfg.num_heads * cfg.head_dim) as u64;
    let i = cfg.intermediate_size as u64;
    let dh = cfg.head_dim as u64;
    let per_token = 2 * d + (w + hq + d).max(3 * i + d);
    let scratch = threads as u64 * (2 * dh * t + 64 * 128 + 64 * dh);
    let logits = perplexity::LOGIT_ROWS as u64 * cfg.vocab_size as u64;
    let floats = t * per_token + scratch + logits + 2 * t;
    llama::weight_bytes(cfg) + floats * 4 + 8 * t
}

/// Available memory in bytes (`MemAvailable` of `/proc/meminfo`), if known.
pub fn available_memory() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = text.lines().find(|l| l.starts_with("MemAvailable:"))?;
    let kb: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb * 1024)
}

/// Refuses a window of `len` tokens whose estimated peak memory
/// ([`estimate_bytes`]) exceeds `budget` bytes (default: the available
/// memory), before anything is loaded.
///
/// # Errors
/// [`ModelError::TooLong`].
pub fn check_memory(cfg: &DecoderConfig, len: usize, budget: Option<u64>) -> Result<()> {
    let threads = rayon::current_num_threads();
    let need = estimate_bytes(cfg, len, threads);
    let (budget, why) = match budget {
        Some(b) => (b, "the budget given".to_string()),
        None => match available_memory() {
            Some(b) => (b, "MemAvailable in /proc/meminfo".to_string()),
            None => (
                16 << 30,
                "a default of 16 GB: available memory unknown".to_string(),
            ),
        },
    };
    if need > budget {
        return Err(ModelError::TooLong {
            len,
            need_mb: need >> 20,
            budget_mb: budget >> 20,
            why,
        });
    }
    Ok(())
}

/// Largest text file read (1 GiB).
pub const MAX_TEXT_BYTES: u64 = 1 << 30;

/// Reads a text file, refusing one over [`MAX_TEXT_BYTES`] before reading
/// it, and one that is not UTF-8 (with the byte offset of the first bad
/// byte).
///
/// # Errors
/// [`ModelError::Io`], [`ModelError::Invalid`].
pub fn read_text(path: &Path) -> Result<String> {
    // Refused by type (FIFOs, devices) and by size before any read.
    let bytes = fsio::read_bounded(path, MAX_TEXT_BYTES)?;
    String::from_utf8(bytes).map_err(|e| {
        ModelError::Invalid(format!(
            "{}: not UTF-8 text (invalid byte at offset {})",
            safe::path(path),
            e.utf8_error().valid_up_to()
        ))
    })
}
