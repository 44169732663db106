//! A prepared model: opened and checked once, its weights loaded once,
//! reused by every probe.

use std::panic::{catch_unwind, resume_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

use posenc_models::llama::{check_products, Products};
use posenc_models::perplexity::rope_of;
use posenc_models::{input, Decoder, DecoderConfig, ModelFiles, Scaling, TextTokenizer};
use posenc_tune::peft::Adapter;

use crate::memory::{self, Limit, Plan};
use crate::{Result, RunError, Text, MAX_LENGTH};

/// How to open a model.
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// A `tokenizer.json` to use instead of the model's own tokenizer.
    pub tokenizer: Option<PathBuf>,
    /// The precision of the attention's products past 1,024 tokens.
    pub products: Products,
    /// A LoRA adapter directory (PEFT's layout) merged into the weights
    /// for the whole session, as the command's `--adapter` (a probe's own
    /// adapter is merged for that call only).
    pub adapter: Option<PathBuf>,
}

/// The weights, once read.
struct Loaded {
    model: Decoder,
    /// One line on the files (and the session's adapter).
    source: String,
}

/// A model opened and checked (config, tokenizer, adapter), its weights
/// read on [`load`](Self::load) or by the first probe and kept for the
/// next ones.
pub struct Session {
    path: PathBuf,
    cfg: DecoderConfig,
    tokenizer_path: Option<PathBuf>,
    tokenizer: Option<TextTokenizer>,
    products: Products,
    files: Option<ModelFiles>,
    adapter: Option<(PathBuf, Adapter)>,
    loaded: Option<Loaded>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("path", &self.path)
            .field("products", &self.products)
            .field("loaded", &self.loaded.is_some())
            .finish_non_exhaustive()
    }
}

/// The model's description with the adapter `dir` merged into it, if any.
pub fn with_adapter(source: String, adapter: Option<&Path>) -> String {
    match adapter {
        Some(d) => format!("{source}; LoRA adapter {} merged", d.display()),
        None => source,
    }
}

/// Opens the model at `path` (its files regular and readable, its headers
/// read; no weight, no config check) and closes it again: `posenc report
/// --model` refuses a model that cannot be opened before the lab's
/// experiments run.
///
/// # Errors
/// The model files' messages.
pub fn check_model(path: &Path) -> Result<()> {
    ModelFiles::open(path)?;
    Ok(())
}

/// The model at `path` with its first `layers` layers only (to find the
/// first layer whose output is not finite).
pub(crate) fn first_layers(path: &Path, layers: usize) -> posenc_models::Result<Decoder> {
    let mut files = ModelFiles::open(path)?;
    let mut cfg = files.config()?;
    cfg.num_layers = layers;
    Ok(files.load(cfg)?.0)
}

impl Session {
    /// Opens the model at `path` (a GGUF file, a checkpoint directory or
    /// its `config.json`) as the command does: the products' precision is
    /// checked against the CPU, the path and the tokenizer must be regular
    /// files (a FIFO would block, a device never end), the config and the
    /// adapter is read and checked against the config. No weight is read;
    /// the tokenizer is read by [`load`](Self::load) or by the first probe,
    /// after the probe's memory check (as the command does).
    ///
    /// # Errors
    /// The command's messages for each of those checks.
    pub fn open(path: &Path, options: &OpenOptions) -> Result<Session> {
        check_products(options.products)?;
        input::check_model_path(path)?;
        if let Some(t) = &options.tokenizer {
            input::check_regular(t)?;
        }
        // Headers and config only: nothing large is read before the checks.
        let mut files = ModelFiles::open(path)?;
        let cfg = files.config()?;
        let adapter = match &options.adapter {
            Some(d) => Some((d.clone(), Adapter::read(d, &cfg)?)),
            None => None,
        };
        Ok(Session {
            path: path.to_path_buf(),
            cfg,
            tokenizer_path: options.tokenizer.clone(),
            tokenizer: None,
            products: options.products,
            files: Some(files),
            adapter,
            loaded: None,
        })
    }

    /// The model's path as given.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The model's config.
    pub fn config(&self) -> &DecoderConfig {
        &self.cfg
    }

    /// The tokenizer in use, once read (by [`load`](Self::load) or a
    /// probe).
    pub fn tokenizer(&self) -> Option<&TextTokenizer> {
        self.tokenizer.as_ref()
    }

    /// Reads the tokenizer (once): the `tokenizer` option's, or the
    /// model's own, with the config's special ids, checked against the
    /// model's vocabulary.
    ///
    /// # Errors
    /// The tokenizer's.
    pub fn read_tokenizer(&mut self) -> Result<&TextTokenizer> {
        if self.tokenizer.is_none() {
            let files = self.files.as_ref().ok_or_else(|| {
                RunError::Invalid("the model's weights failed to load earlier".into())
            })?;
            self.tokenizer = Some(files.tokenizer_for(self.tokenizer_path.as_deref(), &self.cfg)?);
        }
        Ok(self.tokenizer.as_ref().expect("read above"))
    }

    /// The attention's products.
    pub fn products(&self) -> Products {
        self.products
    }

    /// The trained length `L` (the config's).
    pub fn trained_length(&self) -> usize {
        self.cfg.trained_length()
    }

    /// One line on the model's files (format, tensor types) and the
    /// session's adapter; `None` until the weights are loaded.
    pub fn source(&self) -> Option<&str> {
        self.loaded.as_ref().map(|l| l.source.as_str())
    }

    /// Whether the weights are loaded.
    pub fn is_loaded(&self) -> bool {
        self.loaded.is_some()
    }

    /// The window of a probe: `length`, or twice the trained length,
    /// within `2..=MAX_LENGTH`.
    ///
    /// # Errors
    /// `--length must be in 2..=4194304`.
    pub fn window_length(&self, length: Option<usize>) -> Result<usize> {
        let length = length.unwrap_or(2 * self.cfg.trained_length());
        if !(2..=MAX_LENGTH).contains(&length) {
            return Err(RunError::Invalid(format!(
                "--length must be in 2..={MAX_LENGTH}"
            )));
        }
        Ok(length)
    }

    /// Reads the tokenizer and the weights (once: later calls do
    /// nothing), after checking that the smallest forward pass fits in
    /// memory, and merges the session's adapter.
    ///
    /// # Errors
    /// The memory check's, the loader's and the adapter's.
    pub fn load(&mut self) -> Result<()> {
        self.check_plan(None, 2, 2, 2, |len| {
            memory::perplexity(&self.cfg, len, 0, false)
        })?;
        self.ensure_loaded()
    }

    /// [`load`](Self::load) without the memory check (the probes check
    /// their own window first).
    pub(crate) fn ensure_loaded(&mut self) -> Result<()> {
        if self.loaded.is_some() {
            return Ok(());
        }
        self.read_tokenizer()?;
        let files = self.files.take().ok_or_else(|| {
            RunError::Invalid("the model's weights failed to load earlier".into())
        })?;
        let (mut model, source) = files.load(self.cfg.clone())?;
        if let Some((dir, a)) = &self.adapter {
            a.merge_into(&mut model, dir)?;
        }
        let source = with_adapter(source, self.adapter.as_ref().map(|(d, _)| d.as_path()));
        model.set_products(self.products)?;
        self.loaded = Some(Loaded { model, source });
        Ok(())
    }

    /// Reads a probe's adapter directory against the model's config
    /// (before any weight is read).
    pub(crate) fn read_adapter(&self, dir: Option<&Path>) -> Result<Option<(PathBuf, Adapter)>> {
        match dir {
            None => Ok(None),
            Some(d) => Ok(Some((d.to_path_buf(), Adapter::read(d, &self.cfg)?))),
        }
    }

    /// Runs `f` on the loaded model, its description and the tokenizer,
    /// with `adapter`
    /// (from [`read_adapter`](Self::read_adapter)) merged into it for this
    /// call only: the weights it changes are copied first and written back
    /// after `f` (also when `f` fails or unwinds), so the next call sees
    /// the base weights bit for bit. `f` may change the model's attention
    /// method; it is restored too.
    pub(crate) fn with_model<T>(
        &mut self,
        adapter: Option<&(PathBuf, Adapter)>,
        f: impl FnOnce(&mut Decoder, &str, &TextTokenizer) -> Result<T>,
    ) -> Result<T> {
        self.ensure_loaded()?;
        let tokenizer = self.tokenizer.as_ref().expect("read by ensure_loaded");
        let loaded = self.loaded.as_mut().expect("loaded above");
        let model = &mut loaded.model;
        let method = model.method();
        let saved = match adapter {
            Some((_, a)) => touched_weights(model, a),
            None => Vec::new(),
        };
        let source = with_adapter(loaded.source.clone(), adapter.map(|(d, _)| d.as_path()));
        let r = catch_unwind(AssertUnwindSafe(|| {
            if let Some((dir, a)) = adapter {
                a.merge_into(model, dir)?;
            }
            f(model, &source, tokenizer)
        }));
        for (name, values) in &saved {
            model.set_weight(name, values)?;
        }
        model.set_method(method)?;
        match r {
            Ok(r) => r,
            Err(payload) => resume_unwind(payload),
        }
    }

    /// Tokens of `text` for a window of `length`: a file is read and
    /// tokenized only as far as the window needs, unless `whole` (then all
    /// of it, bounded); the built-in text and a string are tokenized whole.
    pub(crate) fn text_tokens(
        &mut self,
        text: &Text,
        length: usize,
        whole: bool,
    ) -> Result<Vec<u32>> {
        let tk = self.read_tokenizer()?;
        Ok(match text {
            Text::File(p) if whole => tk.encode(&posenc_models::read_text(p)?)?,
            Text::File(p) => input::text_tokens(p, tk, length)?,
            Text::String(s) => {
                if s.len() as u64 > posenc_models::MAX_TEXT_BYTES {
                    return Err(RunError::Invalid(format!(
                        "the text is {} bytes, over the {}-byte limit",
                        s.len(),
                        posenc_models::MAX_TEXT_BYTES
                    )));
                }
                tk.encode(s)?
            }
            Text::Default => tk.encode(crate::PRIDE_AND_PREJUDICE)?,
        })
    }

    /// Refuses a run whose memory plan `plan(value)` is over the limit
    /// ([`Limit::current`] of `max_memory`), naming the largest value in
    /// `lo..=hi` whose plan fits.
    ///
    /// # Errors
    /// [`Plan::check`]'s.
    pub(crate) fn check_plan(
        &self,
        max_memory: Option<u64>,
        value: usize,
        lo: usize,
        hi: usize,
        plan: impl Fn(usize) -> Plan,
    ) -> Result<()> {
        let limit = Limit::current(max_memory);
        let p = plan(value);
        if p.total() <= limit.bytes {
            return Ok(());
        }
        let largest = memory::largest_fitting(lo, hi, limit.bytes, |v| plan(v).total());
        p.check(&limit, largest)
    }

    /// The check the command makes before its first pass: `tokens`' first
    /// forward with `scaling` gives finite outputs, or the error names the
    /// first layer that does not.
    pub(crate) fn check_first_forward(
        path: &Path,
        model: &Decoder,
        tokens: &[u32],
        scaling: &Scaling,
    ) -> Result<()> {
        let rope = rope_of(scaling.rope_config(model.config())?)?;
        input::check_first_forward(model, tokens, &rope, &mut |k| first_layers(path, k))?;
        Ok(())
    }
}

/// Copies of the weights `adapter` may change when merged: the adapted
/// projections of every layer, the embedding and head, the norms (those
/// of the parameters it trains beside the factors).
fn touched_weights(model: &Decoder, adapter: &Adapter) -> Vec<(String, Vec<f32>)> {
    let trainable = adapter.trainable();
    let ends: Vec<String> = adapter
        .lora
        .targets
        .iter()
        .map(|t| format!(".{}.{}.weight", t.block(), t.name()))
        .collect();
    model
        .named_weights()
        .into_iter()
        .filter(|w| {
            ends.iter().any(|e| w.name.ends_with(e.as_str()))
                || (trainable.embed
                    && (w.name == "model.embed_tokens.weight" || w.name == "lm_head.weight"))
                || (trainable.norm && w.name.contains("norm"))
        })
        .map(|w| (w.name, w.data.to_vec()))
        .collect()
}
