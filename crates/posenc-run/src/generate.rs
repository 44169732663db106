//! `posenc generate` as a call: text from a prompt with any RoPE scaling.

use std::path::PathBuf;
use std::time::Instant;

use std::cell::RefCell;

use posenc_models::generate::{check_sampling, generate_observed, Decoding, Sampling};
use posenc_models::input::{self, Prompt};
use posenc_models::perplexity::rope_of;
use posenc_models::Scaling;
use serde_json::{json, Value};

use crate::session::Session;
use crate::{cancellable, Progress, ProgressFn, Result, RunError, MAX_LENGTH};

/// The `what` of the reports made after each layer of the prompt's pass
/// (`done` layers of `total`), before the first token.
pub const PREFILL: &str = "prefill";

/// Where the prompt comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PromptSource {
    /// The prompt itself.
    String(String),
    /// A UTF-8 file (a regular file, read bounded).
    File(PathBuf),
}

/// The options of `posenc generate`.
#[derive(Debug, Clone)]
pub struct GenerateRequest {
    /// The prompt.
    pub prompt: PromptSource,
    /// Keep only the prompt's last N tokens.
    pub prompt_tokens: Option<usize>,
    /// New tokens at most (fewer if an end-of-sequence token comes).
    pub max_new_tokens: usize,
    /// One scaling or method name (`model`: the config's own).
    pub scaling: String,
    /// Greedy decoding or seeded sampling.
    pub sampling: Sampling,
    /// A LoRA adapter directory merged for this call only.
    pub adapter: Option<PathBuf>,
    /// Decode as tokens come and give each token's new text
    /// ([`Progress::text`]).
    pub stream_text: bool,
    /// The memory the run may use, bytes (`--max-memory`; default: the
    /// available memory and `RLIMIT_AS`, see [`crate::memory`]).
    pub max_memory: Option<u64>,
}

impl Default for GenerateRequest {
    fn default() -> Self {
        GenerateRequest {
            prompt: PromptSource::String(String::new()),
            prompt_tokens: None,
            max_new_tokens: 64,
            scaling: "model".into(),
            sampling: Sampling::Greedy,
            adapter: None,
            stream_text: false,
            max_memory: None,
        }
    }
}

/// The command's sampling from its flags: greedy at temperature 0.
pub fn sampling(temperature: f64, top_p: f64, seed: u64) -> Sampling {
    if temperature == 0.0 {
        Sampling::Greedy
    } else {
        Sampling::Sample {
            temperature,
            top_p,
            seed,
        }
    }
}

impl GenerateRequest {
    /// The scaling, parsed; every check that needs no model.
    ///
    /// # Errors
    /// The command's messages for a bad scaling, sampling, token count.
    pub fn check(&self) -> Result<Scaling> {
        let sc: Scaling = self.scaling.parse()?;
        check_sampling(self.sampling)?;
        if self.max_new_tokens > MAX_LENGTH {
            return Err(RunError::Invalid(format!(
                "--max-tokens must be at most {MAX_LENGTH}"
            )));
        }
        if self.prompt_tokens == Some(0) {
            return Err(RunError::Invalid(
                "--prompt-tokens must be at least 1".into(),
            ));
        }
        Ok(sc)
    }
}

impl Session {
    /// Generates after the prompt: what `posenc generate --json` prints
    /// (`model`, `scaling`, `prompt_ids`, `new_ids`, `text`, `seconds`,
    /// `tokens_per_second`). `on_token` is called first with the run's
    /// description (`done = 0`), then after each layer of the prompt's pass
    /// and between its parts (`what` = [`PREFILL`], `done` layers of
    /// `total`: where a long prefill stops), then with every new token
    /// ([`Progress::token`]).
    ///
    /// # Errors
    /// The command's messages; [`RunError::Cancelled`] when `on_token`
    /// answers `false`.
    pub fn generate(
        &mut self,
        request: &GenerateRequest,
        on_token: &mut ProgressFn<'_>,
    ) -> Result<Value> {
        let sc = request.check()?;
        let prompt = match &request.prompt {
            PromptSource::String(s) => Prompt::Text(s),
            PromptSource::File(p) => {
                input::check_regular(p)?;
                Prompt::File(p)
            }
        };
        let adapter = self.read_adapter(request.adapter.as_deref())?;
        // At most MAX_PROMPT_TOKENS, refused before any prefill.
        let ids = input::prompt_tokens(self.read_tokenizer()?, prompt, request.prompt_tokens)?;
        if ids.is_empty() {
            return Err(RunError::Invalid("the prompt has no tokens".into()));
        }
        let max_new = request.max_new_tokens;
        let total = ids.len() + max_new;
        if total > MAX_LENGTH {
            return Err(RunError::Invalid(format!(
                "prompt and new tokens exceed {MAX_LENGTH}"
            )));
        }
        let loaded = self.is_loaded();
        let prompt_len = ids.len();
        let limit = crate::Limit::current(request.max_memory);
        crate::memory::check_generate(self.config(), prompt_len, max_new, loaded, &limit)?;
        let rope = rope_of(sc.rope_config(self.config())?)?;
        let path = self.path().to_path_buf();
        self.with_model(adapter.as_ref(), |model, source, tk| {
            model.set_method(sc.method)?;
            posenc_models::input::check_first_forward(model, &ids, &rope, &mut |k| {
                crate::session::first_layers(&path, k)
            })?;
            let header = format!("{source}; {} prompt tokens; scaling {}", ids.len(), sc.name);
            if !on_token(Progress::new(0, max_new, &header)) {
                return Err(RunError::Cancelled);
            }
            let start = Instant::now();
            let stop = tk.eos().to_vec();
            let mut new_ids: Vec<u32> = Vec::new();
            let mut shown = String::new();
            // The prefill's layers and the new tokens report through the
            // one callback, never at once (both on this thread).
            let report = RefCell::new(on_token);
            let layers = model.config().num_layers;
            let out = cancellable(|| {
                Ok(generate_observed(
                    model,
                    &ids,
                    Decoding {
                        max_new,
                        rope: &rope,
                        sampling: request.sampling,
                        stop: &stop,
                    },
                    &mut |step| {
                        let p = Progress::new(step.layers_done(), layers, PREFILL);
                        crate::report_or_stop(&mut **report.borrow_mut(), p);
                    },
                    |t| {
                        new_ids.push(t);
                        let mut piece = None;
                        if request.stream_text {
                            if let Ok(text) = tk.decode(&new_ids) {
                                if text.len() > shown.len()
                                    && text.starts_with(&shown)
                                    && !text.ends_with('\u{FFFD}')
                                {
                                    piece = Some(text[shown.len()..].to_string());
                                    shown = text;
                                }
                            }
                        }
                        let p = Progress {
                            done: new_ids.len(),
                            total: max_new,
                            what: "token",
                            token: Some(t),
                            text: Some(piece.as_deref().unwrap_or(""))
                                .filter(|_| request.stream_text),
                        };
                        crate::report_or_stop(&mut **report.borrow_mut(), p);
                    },
                )?)
            })?;
            let secs = start.elapsed().as_secs_f64();
            let text = tk.decode(&out)?;
            Ok(json!({
                "model": source,
                "scaling": sc.name,
                "prompt_ids": ids,
                "new_ids": out,
                "text": text,
                "seconds": secs,
                "tokens_per_second": out.len() as f64 / secs.max(1e-9),
            }))
        })
    }
}
