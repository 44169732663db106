//! Retrieval probes: can the model *find* a fact placed at a depth of a long
//! prompt? Two formats, as published:
//!
//! - **Passkey** (landmark attention, Mohtashami & Jaggi 2023; the format of
//!   Position Interpolation's, YaRN's and LongLoRA's evaluations, YaRN's
//!   `eval/passkey.py`): the intro line, the filler "The grass is green. The
//!   sky is blue. The sun is yellow. Here we go. There and back again."
//!   repeated (joined by spaces and cut at a character count), the line
//!   "The pass key is K. Remember it. K is the pass key." after the first
//!   `depth` of the filler's characters, the rest of the filler (cut from the
//!   filler's start, as the original), and "What is the pass key? The pass key
//!   is", lines joined by newlines; `K` uniform in 1..=50000.
//! - **Needle** (RULER, Hsieh et al. 2024, `niah_single` with an essay
//!   haystack): the words of a text, the needle "One of the special magic
//!   numbers for WORD is: NNNNNNN." inserted before sentence `⌊n·depth⌋`, in
//!   RULER's single-needle template with its answer prefix, so that a base
//!   model can be scored; the value has 7 digits.
//!
//! The filler (characters) or haystack (words) is sized by binary search to
//! the largest prompt of at most the target length in tokens (RULER's
//! search; YaRN steps the character count). Each trial is scored twice:
//! greedy generation of [`MAX_NEW_TOKENS`] tokens, read as YaRN reads it (the
//! first integer in the text; exact match), and the teacher-forced
//! log-probability of the answer's tokens after the prompt.
//!
//! Prompts of one length share their start (the text before the needle);
//! [`Prober`] keeps the KV cache of the previous prompt and recomputes only
//! from the first token that differs, which is exact (causal attention,
//! positions from 0) except where the keys' treatment depends on the whole
//! length: dynamic NTK and dual chunk attention's `mscale`. There it
//! prefills every prompt from scratch.

mod log;

pub use log::{LogHeader, LogRecord, TrialLog, LOG_VERSION, MAX_LOG_BYTES};

use posenc::extend::ContextMethod;
use posenc::tensor::rope::Rope;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

use crate::error::{ModelError, Result};
use crate::llama::{Decoder, KvCache, Step};
use crate::scaling::{Scaling, ScalingKind};
use crate::tokenizer::TextTokenizer;
use posenc_nn::loss::log_prob;

/// Tokens generated per trial (YaRN's `max_new_tokens=10`).
pub const MAX_NEW_TOKENS: usize = 10;

/// The landmark prompt's first line.
pub const INTRO: &str = "There is an important info hidden inside a lot of irrelevant text. \
Find it and memorize them. I will quiz you about the important information there.";
/// The landmark prompt's filler sentence.
pub const FILLER: &str =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
/// The landmark prompt's question.
pub const QUESTION: &str = "What is the pass key? The pass key is";

/// RULER's single-needle template (before its `{context}`).
pub const RULER_INTRO: &str = "A special magic number is hidden within the following text. \
Make sure to memorize it. I will quiz you about the number afterwards.";

/// Most trials per (length, depth) cell of a grid.
pub const MAX_TRIALS: usize = 10_000;

/// Most lengths, and most depths, of a grid.
pub const MAX_GRID_VALUES: usize = 1024;

/// Smallest prompt a probe builds, in tokens.
pub const MIN_LENGTH: usize = 64;

/// Adjectives and nouns for RULER's `adj-noun` keys (RULER draws them from
/// wonderwords' lists; these are a fixed sample of common words).
const ADJECTIVES: [&str; 16] = [
    "ancient", "bitter", "brave", "calm", "crimson", "eager", "fragile", "gentle", "hollow",
    "lively", "modest", "quiet", "rapid", "silent", "tender", "wild",
];
const NOUNS: [&str; 16] = [
    "anchor", "badger", "canyon", "candle", "falcon", "garden", "harbor", "lantern", "meadow",
    "orchard", "pebble", "quarry", "river", "saddle", "thimble", "violin",
];

/// What the needle hides in.
#[derive(Debug, Clone)]
pub enum Haystack {
    /// The landmark passkey prompt.
    Landmark,
    /// RULER's needle in the words of a text.
    Ruler {
        /// The haystack's words (whitespace-separated, in order).
        words: Vec<String>,
    },
}

impl Haystack {
    /// RULER's haystack from a text.
    ///
    /// # Errors
    /// [`ModelError::Invalid`] for a text of fewer than 64 words.
    pub fn ruler(text: &str) -> Result<Haystack> {
        let words: Vec<String> = text.split_whitespace().map(str::to_string).collect();
        if words.len() < 64 {
            return Err(ModelError::Invalid(format!(
                "the haystack has {} words: at least 64 are needed",
                words.len()
            )));
        }
        Ok(Haystack::Ruler { words })
    }

    /// The format's name in outputs.
    pub fn name(&self) -> &'static str {
        match self {
            Haystack::Landmark => "passkey (landmark)",
            Haystack::Ruler { .. } => "needle (RULER niah_single)",
        }
    }

    /// A 64-bit fingerprint of the haystack (FNV-1a over its words; 0 for
    /// the landmark filler), so that a [`TrialLog`] is read back only for
    /// the text it was written for.
    pub fn fingerprint(&self) -> u64 {
        use std::hash::Hasher;
        match self {
            Haystack::Landmark => 0,
            Haystack::Ruler { words } => {
                let mut h = fnv::FnvHasher::default();
                for w in words {
                    h.write(w.as_bytes());
                    h.write_u8(b' ');
                }
                h.finish()
            }
        }
    }

    /// Units of filler available (characters or words).
    fn capacity(&self) -> usize {
        match self {
            Haystack::Landmark => usize::MAX / 4,
            Haystack::Ruler { words } => words.len(),
        }
    }

    /// The prompt text with `n` units of filler, the needle at `depth`, and
    /// `key` (and `word` for RULER); returns (prompt, answer text).
    fn text(&self, n: usize, depth: f64, key: u64, word: &str) -> (String, String) {
        match self {
            Haystack::Landmark => {
                let prefix_n = (n as f64 * depth).floor() as usize;
                let filler = |chars: usize| -> String {
                    let unit = FILLER.len() + 1;
                    let mut s = String::with_capacity(chars + unit);
                    while s.len() < chars {
                        if !s.is_empty() {
                            s.push(' ');
                        }
                        s.push_str(FILLER);
                    }
                    s.truncate(chars);
                    s
                };
                let info = format!("The pass key is {key}. Remember it. {key} is the pass key.");
                let text = [
                    INTRO.to_string(),
                    filler(prefix_n),
                    info,
                    filler(n - prefix_n),
                    QUESTION.to_string(),
                ]
                .join("\n");
                (text, key.to_string())
            }
            Haystack::Ruler { words } => {
                let text = words[..n.min(words.len())].join(" ");
                let sents = sentences(&text);
                let at = ((sents.len() as f64) * depth).floor() as usize;
                let needle = format!("One of the special magic numbers for {word} is: {key}.");
                let mut parts: Vec<&str> = Vec::with_capacity(sents.len() + 1);
                parts.extend(&sents[..at]);
                parts.push(&needle);
                parts.extend(&sents[at..]);
                let context = parts.join(" ");
                let text = format!(
                    "{RULER_INTRO}\n{context}\nWhat is the special magic number for {word} mentioned \
                     in the provided text? The special magic number for {word} mentioned in the \
                     provided text is"
                );
                (text, key.to_string())
            }
        }
    }
}

/// Sentences of `text`: split after `.`, `!` or `?` followed by a space
/// (RULER uses NLTK's `sent_tokenize`).
fn sentences(text: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut start = 0;
    let b = text.as_bytes();
    for i in 0..b.len() {
        if matches!(b[i], b'.' | b'!' | b'?') && b.get(i + 1) == Some(&b' ') {
            out.push(&text[start..=i]);
            start = i + 2;
        }
    }
    if start < text.len() {
        out.push(&text[start..]);
    }
    out
}

/// One prompt of a trial.
#[derive(Debug, Clone)]
pub struct Prompt {
    /// Its token ids.
    pub ids: Vec<u32>,
    /// The answer's text (the key's digits).
    pub answer: String,
    /// The answer's tokens after the prompt (`" " + answer`).
    pub answer_ids: Vec<u32>,
    /// The key.
    pub key: u64,
}

/// Builds prompts of one format for one tokenizer.
pub struct PromptBuilder<'a> {
    tokenizer: &'a TextTokenizer,
    haystack: &'a Haystack,
}

impl<'a> PromptBuilder<'a> {
    /// Prompts of `haystack`'s format, tokenized by `tokenizer`.
    pub fn new(tokenizer: &'a TextTokenizer, haystack: &'a Haystack) -> Self {
        PromptBuilder {
            tokenizer,
            haystack,
        }
    }

    /// Tokens of the prompt with no filler at all (the needle with a 5-digit
    /// key and the question): no prompt of this format can be shorter.
    ///
    /// # Errors
    /// The tokenizer's.
    pub fn shortest(&self) -> Result<usize> {
        let (t, _) = self.haystack.text(0, 0.5, 12345, "brave-falcon");
        Ok(self.tokenizer.encode(&t)?.len())
    }

    /// The filler size (characters, or words) whose prompt is the longest of
    /// at most `length` tokens (needle at depth 0.5, a 5-digit key).
    ///
    /// # Errors
    /// [`ModelError::Invalid`] when `length` is below [`MIN_LENGTH`] or the
    /// haystack cannot fill it; the tokenizer's errors.
    pub fn calibrate(&self, length: usize) -> Result<usize> {
        if length < MIN_LENGTH {
            return Err(ModelError::Invalid(format!(
                "a prompt of {length} tokens cannot hold the needle and the question: \
                 use lengths of at least {MIN_LENGTH}"
            )));
        }
        let count = |n: usize| -> Result<usize> {
            let (t, _) = self.haystack.text(n, 0.5, 12345, "brave-falcon");
            Ok(self.tokenizer.encode(&t)?.len())
        };
        let cap = self.haystack.capacity();
        if count(0)? > length {
            return Err(ModelError::Invalid(format!(
                "the needle and the question alone take more than {length} tokens"
            )));
        }
        // Largest n with count(n) ≤ length (counts grow with n).
        let (mut lo, mut hi) = (0usize, 1usize);
        while hi < cap && count(hi)? <= length {
            lo = hi;
            hi = (hi * 2).min(cap);
        }
        if hi >= cap && count(cap)? <= length {
            if matches!(self.haystack, Haystack::Ruler { .. }) {
                return Err(ModelError::Invalid(format!(
                    "the haystack is too short: all its {cap} words make a prompt of {} tokens, \
                     below the {length} asked",
                    count(cap)?
                )));
            }
            return Ok(cap);
        }
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if count(mid)? <= length {
                lo = mid;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    /// The prompt with at most `n` filler units (as [`calibrate`] gave for
    /// `length`), fewer if this depth and key make it longer than `length`
    /// tokens: every prompt of a length has at most that many tokens.
    ///
    /// # Errors
    /// The tokenizer's; [`ModelError::Invalid`] if no filler size fits.
    ///
    /// [`calibrate`]: Self::calibrate
    pub fn prompt_within(
        &self,
        length: usize,
        n: usize,
        depth: f64,
        key: u64,
        word: &str,
    ) -> Result<Prompt> {
        let mut n = n;
        loop {
            let p = self.prompt(n, depth, key, word)?;
            if p.ids.len() <= length {
                return Ok(p);
            }
            if n == 0 {
                return Err(ModelError::Invalid(format!(
                    "no prompt of at most {length} tokens holds the needle"
                )));
            }
            // A filler unit is at most one token: shrink by the excess.
            n = n.saturating_sub((p.ids.len() - length).max(1));
        }
    }

    /// The prompt with `n` filler units, the needle at `depth`, for `key`.
    ///
    /// # Errors
    /// The tokenizer's.
    pub fn prompt(&self, n: usize, depth: f64, key: u64, word: &str) -> Result<Prompt> {
        let (text, answer) = self.haystack.text(n, depth, key, word);
        let ids = self.tokenizer.encode(&text)?;
        let full = self.tokenizer.encode(&format!("{text} {answer}"))?;
        let answer_ids = if full.len() > ids.len() && full[..ids.len()] == ids[..] {
            full[ids.len()..].to_vec()
        } else {
            let alone = self.tokenizer.encode(&format!(" {answer}"))?;
            let skip = usize::from(self.tokenizer.adds_bos()).min(alone.len());
            alone[skip..].to_vec()
        };
        Ok(Prompt {
            ids,
            answer,
            answer_ids,
            key,
        })
    }
}

/// The probe's grid and seed.
#[derive(Debug, Clone, PartialEq)]
pub struct ProbeGrid {
    /// Prompt lengths in tokens.
    pub lengths: Vec<usize>,
    /// Needle depths in `[0, 1]`.
    pub depths: Vec<f64>,
    /// Trials per (length, depth).
    pub trials: usize,
    /// Seed of the keys.
    pub seed: u64,
}

impl ProbeGrid {
    /// Checks the grid.
    ///
    /// # Errors
    /// [`ModelError::Invalid`] for an empty list, a length below
    /// [`MIN_LENGTH`], a depth outside `[0, 1]`, no trial.
    pub fn validate(&self) -> Result<()> {
        if self.lengths.is_empty() || self.depths.is_empty() {
            return Err(ModelError::Invalid(
                "give at least one length and one depth".into(),
            ));
        }
        if let Some(l) = self.lengths.iter().find(|&&l| l < MIN_LENGTH) {
            return Err(ModelError::Invalid(format!(
                "length {l}: too short for the needle and the question (at least {MIN_LENGTH})"
            )));
        }
        if let Some(d) = self.depths.iter().find(|d| !(0.0..=1.0).contains(*d)) {
            return Err(ModelError::Invalid(format!("depth {d} is outside [0, 1]")));
        }
        if self.trials == 0 || self.trials > MAX_TRIALS {
            return Err(ModelError::Invalid(format!(
                "--trials must be in 1..={MAX_TRIALS} (trials per length and depth)"
            )));
        }
        for (what, n) in [
            ("--lengths", self.lengths.len()),
            ("--depths", self.depths.len()),
        ] {
            if n > MAX_GRID_VALUES {
                return Err(ModelError::Invalid(format!(
                    "{what}: {n} values, more than {MAX_GRID_VALUES}"
                )));
            }
        }
        Ok(())
    }

    /// The key of trial `trial` at (`length`, `depth`): landmark keys
    /// uniform in 1..=50000, RULER values of 7 digits, and RULER's
    /// `adj-noun` word. The draw depends on the seed and on the cell's
    /// values, not on its place in the grid, so that a cell has the same
    /// keys in every grid that holds it (and logs of different grids can be
    /// shared).
    pub fn key(
        &self,
        haystack: &Haystack,
        length: usize,
        depth: f64,
        trial: usize,
    ) -> (u64, String) {
        use std::hash::Hasher;
        let mut h = fnv::FnvHasher::default();
        for v in [self.seed, length as u64, depth.to_bits(), trial as u64] {
            h.write_u64(v);
        }
        let mut rng = StdRng::seed_from_u64(h.finish());
        let key = match haystack {
            Haystack::Landmark => rng.random_range(1..=50_000u64),
            Haystack::Ruler { .. } => rng.random_range(1_000_000..=9_999_999u64),
        };
        let word = format!(
            "{}-{}",
            ADJECTIVES[rng.random_range(0..ADJECTIVES.len())],
            NOUNS[rng.random_range(0..NOUNS.len())]
        );
        (key, word)
    }
}

/// One trial's result.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TrialResult {
    /// Target length.
    pub length: usize,
    /// Needle depth.
    pub depth: f64,
    /// The key.
    pub key: u64,
    /// Tokens in the prompt.
    pub prompt_tokens: usize,
    /// The first integer of the generated text, if any.
    pub read: Option<u64>,
    /// Whether it equals the key.
    pub correct: bool,
    /// `Σ log p(answer token | prompt, earlier answer tokens)`, nats.
    pub logprob: f64,
    /// Tokens in the answer.
    pub answer_tokens: usize,
    /// The generated text.
    pub generated: String,
    /// Tokens prefilled for this trial (the rest came from the cache).
    pub prefilled: usize,
    /// Wall-clock seconds of the trial (prefill, answer, generation).
    #[serde(default)]
    pub seconds: f64,
}

/// Whether the prompts of one length can share the KV cache of the one
/// before under `scaling`: not where the keys' treatment depends on the
/// whole length (dynamic NTK, dual chunk attention's `mscale`).
pub fn reuses_cache(scaling: &Scaling) -> bool {
    !matches!(scaling.kind, ScalingKind::Dynamic(_))
        && !matches!(scaling.method, Some(ContextMethod::Dca { .. }))
}

/// Runs trials of one scaling (and method), reusing the KV cache of the
/// previous prompt where that is exact.
pub struct Prober<'a> {
    model: &'a Decoder,
    rope: Rope,
    method: Option<ContextMethod>,
    reuse: bool,
    cache: KvCache,
    cached_ids: Vec<u32>,
    eos: Vec<u32>,
}

impl<'a> Prober<'a> {
    /// A prober of `scaling` on `model`; `eos` stops generation.
    ///
    /// # Errors
    /// The scaling's RoPE errors.
    pub fn new(model: &'a Decoder, scaling: &Scaling, eos: &[u32]) -> Result<Self> {
        let cfg = scaling.rope_config(model.config())?;
        let rope = crate::perplexity::rope_of(cfg)?;
        Ok(Prober {
            model,
            rope,
            method: scaling.method,
            reuse: reuses_cache(scaling),
            cache: KvCache::new(model.config()),
            cached_ids: Vec::new(),
            eos: eos.to_vec(),
        })
    }

    /// Whether prompts share the cache of the one before.
    pub fn reuses_cache(&self) -> bool {
        self.reuse
    }

    /// Runs one trial: prefill (from the first token that differs from the
    /// cached prompt), the answer's log-probability, greedy generation.
    ///
    /// # Errors
    /// The model's errors; [`ModelError::Invalid`] for an empty prompt or
    /// answer.
    pub fn trial(
        &mut self,
        tokenizer: &TextTokenizer,
        prompt: &Prompt,
        length: usize,
        depth: f64,
    ) -> Result<TrialResult> {
        self.trial_observed(tokenizer, prompt, length, depth, &mut |_| {})
    }

    /// [`trial`](Self::trial), calling `on_layer` after each layer of the
    /// prefill (the long part of a trial: progress, or a stop from inside).
    ///
    /// # Errors
    /// As [`trial`](Self::trial).
    pub fn trial_observed(
        &mut self,
        tokenizer: &TextTokenizer,
        prompt: &Prompt,
        length: usize,
        depth: f64,
        on_layer: &mut dyn FnMut(Step),
    ) -> Result<TrialResult> {
        if prompt.ids.is_empty() || prompt.answer_ids.is_empty() {
            return Err(ModelError::Invalid("an empty prompt or answer".into()));
        }
        let t0 = std::time::Instant::now();
        let d = self.model.config().hidden_size;
        let common = if self.reuse {
            prompt
                .ids
                .iter()
                .zip(&self.cached_ids)
                .take_while(|(a, b)| a == b)
                .count()
                .min(prompt.ids.len() - 1)
        } else {
            0
        };
        self.cache.truncate(common);
        let rest = &prompt.ids[common..];
        let hidden = self.model.hidden_states_with(
            rest,
            &self.rope,
            self.method,
            Some(&mut self.cache),
            on_layer,
        )?;
        let prompt_last = hidden[(rest.len() - 1) * d..].to_vec();
        drop(hidden);
        let n = prompt.ids.len();
        // Teacher-forced answer: its first token from the prompt's last
        // state, the others from the answer's own states.
        let mut logprob = 0.0;
        let first = self.model.logits(&prompt_last, 1)?;
        logprob += log_prob(&first, prompt.answer_ids[0]);
        if prompt.answer_ids.len() > 1 {
            let a = &prompt.answer_ids[..prompt.answer_ids.len() - 1];
            let h = self.model.hidden_states_with(
                a,
                &self.rope,
                self.method,
                Some(&mut self.cache),
                &mut |_| {},
            )?;
            let logits = self.model.logits(&h, a.len())?;
            let v = self.model.config().vocab_size;
            for (r, &t) in prompt.answer_ids[1..].iter().enumerate() {
                logprob += log_prob(&logits[r * v..(r + 1) * v], t);
            }
            self.cache.truncate(n);
        }
        // Greedy generation.
        let mut out = Vec::with_capacity(MAX_NEW_TOKENS);
        let mut logits = first;
        for step in 0..MAX_NEW_TOKENS {
            let next = crate::generate::argmax(&logits);
            out.push(next);
            if self.eos.contains(&next) || step + 1 == MAX_NEW_TOKENS {
                break;
            }
            let h = self.model.hidden_states_with(
                &[next],
                &self.rope,
                self.method,
                Some(&mut self.cache),
                &mut |_| {},
            )?;
            logits = self.model.logits(&h, 1)?;
        }
        self.cache.truncate(n);
        self.cached_ids = prompt.ids.clone();
        let generated = tokenizer.decode(&out)?;
        let read = first_integer(&generated);
        Ok(TrialResult {
            length,
            depth,
            key: prompt.key,
            prompt_tokens: n,
            read,
            correct: read == Some(prompt.key),
            logprob,
            answer_tokens: prompt.answer_ids.len(),
            generated,
            prefilled: rest.len(),
            seconds: t0.elapsed().as_secs_f64(),
        })
    }

    /// Forgets the cached prompt.
    pub fn reset(&mut self) {
        self.cache.truncate(0);
        self.cached_ids.clear();
    }
}

/// Greedy continuation ids of `prompt` (for parity tests): prefill then
/// `max_new` argmax steps, stopping at `eos`.
///
/// # Errors
/// The model's errors.
pub fn greedy(
    model: &Decoder,
    scaling: &Scaling,
    prompt: &[u32],
    max_new: usize,
    eos: &[u32],
) -> Result<Vec<u32>> {
    let cfg = scaling.rope_config(model.config())?;
    let rope = crate::perplexity::rope_of(cfg)?;
    let d = model.config().hidden_size;
    let mut cache = KvCache::new(model.config());
    let h =
        model.hidden_states_with(prompt, &rope, scaling.method, Some(&mut cache), &mut |_| {})?;
    let mut logits = model.logits(&h[(prompt.len() - 1) * d..], 1)?;
    let mut out = Vec::new();
    for step in 0..max_new {
        let next = crate::generate::argmax(&logits);
        out.push(next);
        if eos.contains(&next) || step + 1 == max_new {
            break;
        }
        let h = model.hidden_states_with(
            &[next],
            &rope,
            scaling.method,
            Some(&mut cache),
            &mut |_| {},
        )?;
        logits = model.logits(&h, 1)?;
    }
    Ok(out)
}

/// The first run of ASCII digits in `text`, as YaRN's `re.search(r'\d+')`
/// reads the answer (`None` if there is none or it overflows).
pub fn first_integer(text: &str) -> Option<u64> {
    let start = text.find(|c: char| c.is_ascii_digit())?;
    let digits: String = text[start..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect();
    digits.parse().ok()
}

/// Accuracy and mean log-probability of one (length, depth) cell.
#[derive(Debug, Clone, Serialize)]
pub struct Cell {
    /// Target length.
    pub length: usize,
    /// Depth.
    pub depth: f64,
    /// Fraction of trials whose greedy answer was the key.
    pub accuracy: f64,
    /// Mean teacher-forced log-probability of the answer.
    pub logprob: f64,
    /// Trials.
    pub trials: usize,
}

/// Groups trials into cells, in the grid's order.
pub fn cells(grid: &ProbeGrid, trials: &[TrialResult]) -> Vec<Cell> {
    let mut out = Vec::new();
    for &length in &grid.lengths {
        for &depth in &grid.depths {
            let of: Vec<&TrialResult> = trials
                .iter()
                .filter(|t| t.length == length && t.depth == depth)
                .collect();
            if of.is_empty() {
                continue;
            }
            let n = of.len() as f64;
            out.push(Cell {
                length,
                depth,
                accuracy: of.iter().filter(|t| t.correct).count() as f64 / n,
                logprob: of.iter().map(|t| t.logprob).sum::<f64>() / n,
                trials: of.len(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_first_integer() {
        assert_eq!(first_integer(" 12345. Remember"), Some(12345));
        assert_eq!(first_integer(" the pass key. The"), None);
        assert_eq!(first_integer("is 7 and 8"), Some(7));
    }

    #[test]
    fn landmark_text_is_the_published_format() {
        let (t, a) = Haystack::Landmark.text(200, 0.5, 4242, "");
        assert_eq!(a, "4242");
        let lines: Vec<&str> = t.split('\n').collect();
        assert_eq!(lines.len(), 5);
        assert_eq!(lines[0], INTRO);
        assert_eq!(lines[1].len(), 100);
        assert!(FILLER.starts_with(&lines[1][..FILLER.len().min(100)]));
        assert_eq!(
            lines[2],
            "The pass key is 4242. Remember it. 4242 is the pass key."
        );
        assert_eq!(lines[3], lines[1]);
        assert_eq!(lines[4], QUESTION);
        let (t0, _) = Haystack::Landmark.text(200, 0.0, 1, "");
        assert!(t0.split('\n').nth(1).unwrap().is_empty());
    }

    #[test]
    fn ruler_needle_sits_at_its_depth() {
        let text = "One. Two. Three. Four.";
        let h = Haystack::Ruler {
            words: text.split_whitespace().map(String::from).collect(),
        };
        let (t, _) = h.text(4, 0.5, 1234567, "brave-falcon");
        assert!(t.contains(
            "One. Two. One of the special magic numbers for brave-falcon is: 1234567. Three. Four."
        ));
        assert!(t.ends_with("mentioned in the provided text is"));
    }

    #[test]
    fn grid_checks() {
        let g = ProbeGrid {
            lengths: vec![2048],
            depths: vec![0.0, 1.0],
            trials: 1,
            seed: 0,
        };
        assert!(g.validate().is_ok());
        assert!(ProbeGrid {
            depths: vec![1.5],
            ..g.clone()
        }
        .validate()
        .is_err());
        assert!(ProbeGrid {
            depths: vec![-0.1],
            ..g.clone()
        }
        .validate()
        .is_err());
        assert!(ProbeGrid {
            lengths: vec![10],
            ..g.clone()
        }
        .validate()
        .is_err());
        assert!(ProbeGrid { trials: 0, ..g }.validate().is_err());
    }
}
