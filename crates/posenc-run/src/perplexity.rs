//! `posenc perplexity` as a call: the loss at every position of a window
//! for each RoPE scaling.

use std::path::PathBuf;

use posenc_models::perplexity::{self, Study};
use posenc_models::{input, scaling, Scaling};
use serde_json::Value;

use crate::session::Session;
use crate::{
    cancellable, memory, report_or_stop, Progress, ProgressFn, Result, RunError, Text, MAX_LENGTH,
};

/// The scalings `posenc perplexity` compares by default.
pub const DEFAULT_SCALINGS: &str = "none,linear:2,dynamic:2,ntk:2,yarn:2";

/// What to score and how (the options of `posenc perplexity`).
#[derive(Debug, Clone)]
pub struct PerplexityRequest {
    /// The text: its first `length` tokens are the window (default: the
    /// built-in *Pride and Prejudice*).
    pub text: Text,
    /// Window length in tokens (default: twice the trained length).
    pub length: Option<usize>,
    /// Scaling names, each as `posenc perplexity --scaling` takes them
    /// (`none`, `yarn:2`, `self-extend:4:1024+yarn:2`, ...), in order.
    pub scalings: Vec<String>,
    /// Positions per band of the summary (at least 1).
    pub band: usize,
    /// Score the text's held-out part (its last 10% of tokens, which
    /// fine-tuning never reads) instead of its start.
    pub held_out: bool,
    /// Include the loss at every position.
    pub per_position: bool,
    /// A LoRA adapter directory merged for this call only.
    pub adapter: Option<PathBuf>,
    /// The memory the run may use, bytes (`--max-memory`; default: the
    /// available memory and `RLIMIT_AS`, see [`crate::memory`]).
    pub max_memory: Option<u64>,
}

impl Default for PerplexityRequest {
    fn default() -> Self {
        PerplexityRequest {
            text: Text::Default,
            length: None,
            scalings: vec!["none".into()],
            band: 1024,
            held_out: false,
            per_position: false,
            adapter: None,
            max_memory: None,
        }
    }
}

impl PerplexityRequest {
    /// The scalings, parsed; every check that needs no model.
    ///
    /// # Errors
    /// The command's messages for a bad scaling name, a band of 0.
    pub fn check(&self) -> Result<Vec<Scaling>> {
        let scalings = scaling::parse_list(&self.scalings.join(","))?;
        if self.band == 0 {
            return Err(RunError::Invalid("--band must be at least 1".into()));
        }
        Ok(scalings)
    }

    /// [`check`](Self::check), and the text file (if any) a regular file.
    ///
    /// # Errors
    /// As [`check`](Self::check); the text file's.
    pub fn check_files(&self) -> Result<Vec<Scaling>> {
        let scalings = self.check()?;
        if let Some(p) = self.text.path() {
            input::check_regular(p)?;
        }
        Ok(scalings)
    }
}

/// The warning of a study whose first window (its first scaling's mean
/// loss) is at or above `ln V`, the loss of a uniform prediction over the
/// vocabulary: the model predicts uniformly (absurd weights, an adapter's
/// scale, a broken file), whatever the scaling. `None` otherwise.
pub fn uniform_warning(study: &Study, vocab_size: usize) -> Option<String> {
    let run = study.runs.first()?;
    if run.loss.is_empty() || vocab_size < 2 {
        return None;
    }
    let mean = run.loss.iter().sum::<f64>() / run.loss.len() as f64;
    let uniform = (vocab_size as f64).ln();
    (mean >= uniform).then(|| {
        format!(
            "the model predicts uniformly: the mean loss {mean:.3} of the first window ({}) is at or above ln(V) = {uniform:.3}, a uniform guess over its {vocab_size} tokens; its weights or adapter may be broken",
            run.name
        )
    })
}

impl Session {
    /// Scores the window: what `posenc perplexity --json` prints (with the
    /// loss at every position when `per_position`).
    ///
    /// # Errors
    /// As [`Session::perplexity_study`].
    pub fn perplexity(
        &mut self,
        request: &PerplexityRequest,
        progress: &mut ProgressFn<'_>,
    ) -> Result<Value> {
        let study = self.perplexity_study(request, progress)?;
        let mut json = study.to_json(request.per_position);
        if let Some(w) = uniform_warning(&study, self.config().vocab_size) {
            json["warning"] = w.into();
        }
        Ok(json)
    }

    /// [`Session::perplexity`] as the study it is built from (the
    /// command draws its table and figure from it). Every input is checked
    /// (the text a regular file, the window within bounds and memory, the
    /// adapter against the model) before the weights are read or a pass
    /// runs; `progress` is called first with the run's description, then
    /// after every layer of every scaling.
    ///
    /// # Errors
    /// The command's messages; [`RunError::Cancelled`] when `progress`
    /// answers `false`.
    pub fn perplexity_study(
        &mut self,
        request: &PerplexityRequest,
        progress: &mut ProgressFn<'_>,
    ) -> Result<Study> {
        let scalings = request.check_files()?;
        let adapter = self.read_adapter(request.adapter.as_deref())?;
        let length = self.window_length(request.length)?;
        // The tokens the text's reading holds beside the window.
        let text_tokens = match &request.text {
            Text::Default => crate::PRIDE_AND_PREJUDICE.len() as u64,
            Text::String(s) => s.len() as u64,
            Text::File(_) if request.held_out => crate::text::PIECE_BYTES as u64,
            Text::File(_) => 2 * length as u64,
        };
        let loaded = self.is_loaded();
        self.check_plan(request.max_memory, length, 2, MAX_LENGTH, |len| {
            memory::perplexity(self.config(), len, text_tokens, loaded)
        })?;
        // A text file is read and tokenized only as far as the window
        // needs; with held_out, in pieces, keeping only the window.
        let held = match (&request.text, request.held_out) {
            (Text::File(p), true) => {
                let tk = self.read_tokenizer()?;
                crate::text::held_out_window(p, tk, length, crate::text::PIECE_BYTES)?
            }
            _ => None,
        };
        let all = match held {
            Some(window) => window,
            None => {
                let all = self.text_tokens(&request.text, length, request.held_out)?;
                if request.held_out {
                    let tail = posenc_tune::data::held_out_tokens(&all);
                    if tail.len() < length {
                        return Err(RunError::Invalid(format!(
                            "--held-out: the text's last 10% is {} tokens, fewer than --length {length}",
                            tail.len()
                        )));
                    }
                    tail.to_vec()
                } else {
                    all
                }
            }
        };
        let tokens = perplexity::window(&all, length)?.to_vec();
        drop(all);
        let layers = self.config().num_layers;
        let path = self.path().to_path_buf();
        let band = request.band;
        self.with_model(adapter.as_ref(), |model, source, tk| {
            let tk_source = tk.source();
            if let Some(first) = scalings.first() {
                Session::check_first_forward(&path, model, &tokens, first)?;
            }
            let total = layers * scalings.len();
            let header = format!(
                "{source}; tokenizer: {tk_source}; window of {length} tokens, trained length {}",
                model.config().trained_length()
            );
            if !progress(Progress::new(0, total, &header)) {
                return Err(RunError::Cancelled);
            }
            cancellable(|| {
                Ok(perplexity::study(
                    model,
                    source,
                    &tokens,
                    &scalings,
                    band,
                    |s, step| {
                        let done = s * layers + step.layers_done();
                        let p = Progress::new(done, total, &scalings[s].name);
                        report_or_stop(progress, p);
                    },
                )?)
            })
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use posenc_models::perplexity::ScalingRun;

    fn study(loss: Vec<f64>) -> Study {
        Study {
            model: "m".into(),
            trained_length: 8,
            length: loss.len() + 1,
            band: 4,
            runs: vec![ScalingRun {
                name: "none".into(),
                rope_type: "default".into(),
                inv_freq_first: 1.0,
                inv_freq_last: 1e-4,
                attention_factor: 1.0,
                loss,
                bands: Vec::new(),
                mean_inside: None,
                mean_beyond: None,
                forward_seconds: 0.0,
                tokens_per_second: 0.0,
            }],
        }
    }

    #[test]
    fn a_first_window_at_ln_v_warns_that_the_model_predicts_uniformly() {
        let v = 49152usize;
        let ln_v = (v as f64).ln();
        let w = uniform_warning(&study(vec![ln_v; 4]), v).unwrap();
        assert!(
            w.starts_with("the model predicts uniformly: the mean loss 10.803"),
            "{w}"
        );
        assert!(w.contains("ln(V) = 10.803"), "{w}");
        assert!(uniform_warning(&study(vec![3.3, 2.9, 11.0]), v).is_none());
        assert!(uniform_warning(&study(Vec::new()), v).is_none());
    }
}
