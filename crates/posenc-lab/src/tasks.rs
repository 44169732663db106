//! Seeded task generators, built in (no download).
//!
//! Every decoder task produces a token sequence `full` of `length + 1`
//! tokens; the model reads `full[..length]` and is scored on predicting
//! `full[1..]` at the *answer* positions only (the other targets are
//! [`IGNORE`]). Every example of one length has exactly that length (short
//! answers are padded with [`PAD`], ignored), so batches need no masks.
//!
//! | task | sequence (before padding) | seed claim it serves |
//! |---|---|---|
//! | copy | `BOS x₁…xₙ SEP x₁…xₙ` | copying pieces of context (the Russian post on NoPE and RoPE) |
//! | reverse | `BOS x₁…xₙ SEP xₙ…x₁` | order |
//! | sort | `BOS x₁…xₙ SEP sort(x)` | |
//! | count | `BOS x₁…xₙ QUERY q EQ c₂c₁c₀` | counting tokens (the Russian post on NoPE and RoPE) |
//! | addition | `BOS a PLUS b EQ (a+b)`, every number least-significant digit first | arithmetic (the Russian post on NoPE and RoPE) |
//! | order | encoder: one `A`, one `B` among fillers; label = A before B | "the mother loves the daughter" (the Russian introductory article) |
//! | lm | characters of a corpus (built-in grammar or a file) | language modelling |
//! | mlm | encoder: a corpus window with 15% of its characters replaced by `[MASK]`; predict them | "can BERT work without positions?" (the Russian post on NoPE and RoPE; Haviv et al. 2022 §6) |
//!
//! ## Corpora: vocabulary and the validation split
//!
//! A corpus ([`Corpus`]) is tokenised one token per distinct character by
//! default: the vocabulary grows to fit the text (Russian, Chinese or any
//! other UTF-8 text keeps every character), up to [`MAX_VOCAB`] distinct
//! characters, past which building it is an error that says how many the
//! text has — never a silent mapping of rare characters to a replacement
//! token. [`Corpus::with_tokens`] tokenises it with a byte-level BPE instead
//! ([`crate::bpe`]), trained on the training part only; the split then
//! falls at the same character as the character corpus's.
//!
//! The last [`VALIDATION_FRACTION`] of the text (10%) is validation and is
//! never trained on: a task draws its windows from the first 90% of the
//! tokens ([`Split::Train`], the default) or from the last 10% only
//! ([`Split::Validation`], [`Task::validation`]); no window crosses the
//! boundary, so no validation window overlaps the training text.
//!
//! ## Masked language modelling
//!
//! `mlm` follows BERT (Devlin et al. 2019, §3.1) with two documented
//! simplifications:
//!
//! - **How many.** A window of `n` characters gets `k` masked positions,
//!   `k = ⌊0.15·n⌋` plus one more with probability `0.15·n − ⌊0.15·n⌋`
//!   (stochastic rounding), and at least 1: the expected rate is exactly
//!   [`MASK_RATE`] for `n ≥ 7` (BERT's data pipeline masks
//!   `max(1, round(0.15·n))` positions, which biases short windows; a
//!   per-position coin flip would leave some windows with nothing to
//!   predict). The `k` positions are distinct and uniformly random.
//! - **How.** Every chosen position becomes `[MASK]` (BERT's 80% `[MASK]` /
//!   10% random / 10% unchanged exists to soften the mismatch with
//!   fine-tuning, where no `[MASK]` occurs; the lab never fine-tunes an MLM,
//!   and with all-`[MASK]` every scored position is a genuine prediction
//!   from context instead of 10% of the targets being visible in the input,
//!   which would lower every encoding's loss by the same position-free
//!   amount and blur the comparison).
//!
//! Targets are the original characters at the masked positions and
//! [`IGNORE`] elsewhere; the model is an encoder (bidirectional attention)
//! with a per-token head ([`crate::config::Mode::TokenEncoder`]). The
//! `[MASK]` token is one extra id after the corpus's characters
//! ([`Task::mask_token`]). Without positions, every `[MASK]` of a window has
//! the same input and sees the same bag of tokens, so a NoPE encoder gives
//! every masked position of a window the same prediction.

use posenc::analysis::SplitMix64;
use serde::{Deserialize, Serialize};

use std::sync::Arc;

pub use crate::bpe::MAX_VOCAB;
use crate::bpe::{Bpe, Tokenization};
pub use crate::config::TaskKind;
use crate::config::{Mode, ModelConfig, PeConfig};
use crate::error::LabError;
pub use posenc_nn::data::{split_point, VALIDATION_FRACTION};

/// Padding; never predicted.
pub const PAD: u32 = 0;
/// Beginning of sequence.
pub const BOS: u32 = 1;
/// Separates the input from the answer.
pub const SEP: u32 = 2;
/// `=` in addition and count.
pub const EQ: u32 = 3;
/// `+` in addition.
pub const PLUS: u32 = 4;
/// Introduces the queried token in count.
pub const QUERY: u32 = 5;
/// Token of digit 0 (digits are `DIGIT0..DIGIT0 + 10`).
pub const DIGIT0: u32 = 6;
/// Token of the first content symbol.
pub const SYMBOL0: u32 = 16;
/// Target value of positions that are not scored.
pub const IGNORE: i64 = -100;
/// Expected fraction of the positions of an `mlm` window that are masked
/// (BERT's 15%).
pub const MASK_RATE: f64 = 0.15;

/// The part of a corpus a task draws its windows from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Split {
    /// The first 90% of the tokens: what training sees.
    Train,
    /// The last 10%: evaluation only.
    Validation,
}

/// One training or evaluation example.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Example {
    /// Model input, `length` tokens.
    pub input: Vec<u32>,
    /// Next-token targets (decoder tasks), `length` entries, [`IGNORE`] where
    /// not scored; empty for classification.
    pub target: Vec<i64>,
    /// Class label (classification tasks).
    pub label: Option<u32>,
}

/// A task with its vocabulary and data.
#[derive(Debug, Clone)]
pub struct Task {
    /// Which task.
    pub kind: TaskKind,
    /// Number of content symbols (copy, reverse, sort, count, order).
    pub n_symbols: u32,
    /// The part of the corpus windows are drawn from (`lm`, `mlm`); the
    /// synthetic tasks draw fresh examples either way.
    pub split: Split,
    corpus: Option<Corpus>,
}

impl Task {
    /// A `mode` lab transformer for this task's vocabulary and outputs:
    /// `n_layers` blocks of width `d_model` with `n_heads` heads, an MLP of
    /// 4 × `d_model`, and the output head tied to the token embedding.
    pub fn model_config(
        &self,
        mode: Mode,
        d_model: usize,
        n_layers: usize,
        n_heads: usize,
        pe: PeConfig,
    ) -> ModelConfig {
        ModelConfig {
            mode,
            vocab_size: self.vocab_size(),
            num_outputs: self.num_outputs(),
            d_model,
            n_layers,
            n_heads,
            d_ff: 4 * d_model,
            tied: true,
            pe,
        }
    }

    /// A synthetic task with `n_symbols` content symbols (≥ 3).
    pub fn new(kind: TaskKind, n_symbols: u32) -> Result<Self, LabError> {
        if n_symbols < 3 {
            return Err(LabError::Invalid(format!(
                "n_symbols = {n_symbols}: need at least 3"
            )));
        }
        let corpus = if kind.uses_corpus() {
            Some(Corpus::synthetic(400_000, 1234))
        } else {
            None
        };
        Ok(Task {
            kind,
            n_symbols,
            split: Split::Train,
            corpus,
        })
    }

    /// A task with `tokens` for its corpus: [`Task::new`] with the
    /// built-in grammar tokenised by `tokens` (`lm`, `mlm`; the synthetic
    /// tasks have no corpus, and any `tokens` but characters is an error
    /// for them).
    ///
    /// # Errors
    /// As [`Task::new`]; a BPE for a task without a corpus; as
    /// [`Corpus::with_tokens`].
    pub fn new_with_tokens(
        kind: TaskKind,
        n_symbols: u32,
        tokens: Tokenization,
    ) -> Result<Self, LabError> {
        if tokens.is_chars() {
            return Self::new(kind, n_symbols);
        }
        if !kind.uses_corpus() {
            return Err(LabError::Invalid(format!(
                "task {} has no corpus to tokenise: --tokens applies to lm and mlm only",
                kind.name()
            )));
        }
        Self::from_text_with_tokens(kind, &Corpus::synthetic_text(400_000, 1234), tokens)
    }

    /// A corpus task (`lm` or `mlm`) on a given text with `tokens`.
    ///
    /// # Errors
    /// As [`Task::from_text`] and [`Corpus::with_tokens`].
    pub fn from_text_with_tokens(
        kind: TaskKind,
        text: &str,
        tokens: Tokenization,
    ) -> Result<Self, LabError> {
        // The task is checked before a tokenizer is trained on the text.
        Self::reads_corpus(kind)?;
        Self::with_corpus(kind, Corpus::with_tokens(text, tokens)?)
    }

    /// A corpus task (`lm` or `mlm`) on an already built corpus.
    ///
    /// # Errors
    /// [`LabError::Invalid`] for a task that reads no corpus.
    pub fn with_corpus(kind: TaskKind, corpus: Corpus) -> Result<Self, LabError> {
        Self::reads_corpus(kind)?;
        Ok(Task {
            kind,
            n_symbols: 0,
            split: Split::Train,
            corpus: Some(corpus),
        })
    }

    /// An error for the synthetic tasks, which read no corpus.
    fn reads_corpus(kind: TaskKind) -> Result<(), LabError> {
        if kind.uses_corpus() {
            Ok(())
        } else {
            Err(LabError::Invalid(format!(
                "task {} does not read a corpus (only lm and mlm do)",
                kind.name()
            )))
        }
    }

    /// How the corpus is tokenised (characters for the synthetic tasks).
    pub fn tokenization(&self) -> Tokenization {
        self.corpus
            .as_ref()
            .map_or(Tokenization::Chars, |c| c.tokenization())
    }

    /// Character-level language modelling on a given text.
    pub fn lm_from_text(text: &str) -> Result<Self, LabError> {
        Self::from_text(TaskKind::Lm, text)
    }

    /// A corpus task (`lm` or `mlm`) on a given text; an error for the
    /// synthetic tasks, which read no corpus.
    pub fn from_text(kind: TaskKind, text: &str) -> Result<Self, LabError> {
        // The task is checked before the text is read.
        Self::reads_corpus(kind)?;
        Self::with_corpus(kind, Corpus::from_text(text)?)
    }

    /// The same task drawing from the validation part of its corpus (the
    /// last 10%, never trained on): what evaluation uses. For the synthetic
    /// tasks, the same task.
    pub fn validation(&self) -> Self {
        self.with_split(Split::Validation)
    }

    /// The same task drawing from `split`.
    pub fn with_split(&self, split: Split) -> Self {
        Task {
            split,
            ..self.clone()
        }
    }

    /// The corpus, for language modelling.
    pub fn corpus(&self) -> Option<&Corpus> {
        self.corpus.as_ref()
    }

    /// Size of the token vocabulary (for `mlm`, the corpus's characters
    /// and `[MASK]`).
    pub fn vocab_size(&self) -> usize {
        match &self.corpus {
            Some(c) => c.vocab.len() + usize::from(self.kind == TaskKind::Mlm),
            None => (SYMBOL0 + self.n_symbols) as usize,
        }
    }

    /// The `[MASK]` token of `mlm` (the id after the corpus's characters);
    /// `None` for the other tasks.
    pub fn mask_token(&self) -> Option<u32> {
        match (&self.corpus, self.kind) {
            (Some(c), TaskKind::Mlm) => Some(c.vocab.len() as u32),
            _ => None,
        }
    }

    /// Number of classes (classification) or `vocab_size` (decoder tasks).
    pub fn num_outputs(&self) -> usize {
        if self.kind.is_classification() {
            2
        } else {
            self.vocab_size()
        }
    }

    /// The smallest length this task can produce an example for.
    pub fn min_length(&self) -> usize {
        match self.kind {
            TaskKind::Copy | TaskKind::Reverse | TaskKind::Sort => 3,
            TaskKind::Count => 7,
            TaskKind::Addition => 7,
            TaskKind::Order => 2,
            TaskKind::Lm | TaskKind::Mlm => 1,
        }
    }

    /// One example of exactly `length` input tokens.
    pub fn sample(&self, rng: &mut SplitMix64, length: usize) -> Result<Example, LabError> {
        if length < self.min_length() {
            return Err(LabError::Invalid(format!(
                "length {length} is too short for task {} (minimum {})",
                self.kind.name(),
                self.min_length()
            )));
        }
        let sym = |rng: &mut SplitMix64, n: u32| SYMBOL0 + rng.below(n as u64) as u32;
        // Full sequence of length + 1 tokens, and the index where scoring starts.
        let (full, answer_from): (Vec<u32>, usize) = match self.kind {
            TaskKind::Copy | TaskKind::Reverse | TaskKind::Sort => {
                // BOS x SEP y: 2n + 2 ≤ length + 1 tokens.
                let n = (length - 1) / 2;
                let x: Vec<u32> = (0..n).map(|_| sym(rng, self.n_symbols)).collect();
                let mut y = x.clone();
                match self.kind {
                    TaskKind::Reverse => y.reverse(),
                    TaskKind::Sort => y.sort_unstable(),
                    _ => {}
                }
                let mut f = vec![BOS];
                f.extend(&x);
                f.push(SEP);
                f.extend(&y);
                (f, n + 2)
            }
            TaskKind::Count => {
                // BOS x_1..x_n QUERY q EQ c c c: n + 7 tokens = length + 1.
                let n = length - 6;
                let x: Vec<u32> = (0..n).map(|_| sym(rng, self.n_symbols)).collect();
                let q = x[rng.below(n as u64) as usize];
                let c = x.iter().filter(|&&t| t == q).count();
                let mut f = vec![BOS];
                f.extend(&x);
                f.extend([QUERY, q, EQ]);
                f.extend(digits(c as u64, 3).into_iter().rev());
                (f, n + 4)
            }
            TaskKind::Addition => {
                // BOS a PLUS b EQ s (k, k and k + 1 digits): 3k + 4 ≤ length + 1 tokens.
                let k = ((length - 3) / 3).clamp(1, 18);
                let hi = 10u64.pow(k as u32);
                let (a, b) = (rng.below(hi), rng.below(hi));
                let mut f = vec![BOS];
                // Every number least-significant digit first, so that digit i
                // of the sum lines up with digit i of each operand.
                f.extend(digits(a, k));
                f.push(PLUS);
                f.extend(digits(b, k));
                f.push(EQ);
                let start = f.len();
                f.extend(digits(a + b, k + 1));
                (f, start)
            }
            TaskKind::Order => {
                let n = length;
                let fill = self.n_symbols - 2;
                let mut x: Vec<u32> = (0..n)
                    .map(|_| SYMBOL0 + 2 + rng.below(fill as u64) as u32)
                    .collect();
                let i = rng.below(n as u64) as usize;
                let mut j = rng.below(n as u64 - 1) as usize;
                if j >= i {
                    j += 1;
                }
                x[i] = SYMBOL0; // A
                x[j] = SYMBOL0 + 1; // B
                return Ok(Example {
                    input: x,
                    target: Vec::new(),
                    label: Some(u32::from(i < j)),
                });
            }
            TaskKind::Lm => {
                // Every next character is scored. (Not through the padding
                // below: a corpus's token 0 is its most frequent character,
                // not PAD.)
                let c = self.corpus.as_ref().expect("lm task has a corpus");
                let f = c.window(rng, length + 1, self.split)?;
                return Ok(Example {
                    input: f[..length].to_vec(),
                    target: f[1..].iter().map(|&t| t as i64).collect(),
                    label: None,
                });
            }
            TaskKind::Mlm => {
                let c = self.corpus.as_ref().expect("mlm task has a corpus");
                let mask = self.mask_token().expect("mlm task has a mask token");
                let mut input = c.window(rng, length, self.split)?;
                let mut target = vec![IGNORE; length];
                for p in masked_positions(rng, length) {
                    target[p] = input[p] as i64;
                    input[p] = mask;
                }
                return Ok(Example {
                    input,
                    target,
                    label: None,
                });
            }
        };
        let mut full = full;
        full.resize(length + 1, PAD);
        let input = full[..length].to_vec();
        let target = (0..length)
            .map(|t| {
                let y = full[t + 1];
                if t + 1 >= answer_from && y != PAD {
                    y as i64
                } else {
                    IGNORE
                }
            })
            .collect();
        Ok(Example {
            input,
            target,
            label: None,
        })
    }
}

/// The distinct positions of a window of `n` tokens that `mlm` masks:
/// `⌊MASK_RATE·n⌋`, plus one with probability equal to the fractional part,
/// at least one (none when `n = 0`); chosen uniformly (a partial
/// Fisher–Yates shuffle), in increasing order.
pub fn masked_positions(rng: &mut SplitMix64, n: usize) -> Vec<usize> {
    if n == 0 {
        return Vec::new();
    }
    let expected = MASK_RATE * n as f64;
    let mut k = expected.floor() as usize;
    if rng.uniform() < expected - expected.floor() {
        k += 1;
    }
    let k = k.clamp(1, n);
    let mut idx: Vec<usize> = (0..n).collect();
    for i in 0..k {
        let j = i + rng.below((n - i) as u64) as usize;
        idx.swap(i, j);
    }
    let mut chosen = idx[..k].to_vec();
    chosen.sort_unstable();
    chosen
}

/// `width` decimal digit tokens of `v`, least-significant first.
fn digits(mut v: u64, width: usize) -> Vec<u32> {
    (0..width)
        .map(|_| {
            let d = (v % 10) as u32;
            v /= 10;
            DIGIT0 + d
        })
        .collect()
}

/// A corpus's vocabulary: its characters, or a byte-level BPE.
#[derive(Debug, Clone)]
pub enum Vocab {
    /// The characters, most frequent first (ties in character order);
    /// token `i` is `chars[i]`.
    Chars(Vec<char>),
    /// A byte-level BPE trained on the training part.
    Bpe(Arc<Bpe>),
}

impl Vocab {
    /// Number of tokens.
    pub fn len(&self) -> usize {
        match self {
            Vocab::Chars(v) => v.len(),
            Vocab::Bpe(b) => b.vocab_size(),
        }
    }

    /// Whether there is no token (never, for a built corpus).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A corpus as tokens, with its vocabulary and its validation split.
#[derive(Debug, Clone)]
pub struct Corpus {
    /// The vocabulary.
    pub vocab: Vocab,
    /// The text as tokens.
    pub tokens: Vec<u32>,
    /// The first token of the validation part: training windows lie in
    /// `tokens[..split_at]`, validation windows in `tokens[split_at..]`.
    pub split_at: usize,
    /// Characters of the text.
    pub chars: usize,
    /// Characters of the training part (the first 90%, the same for every
    /// tokenization).
    pub train_chars: usize,
}

/// Memo of encoded texts: (text hash, tokenizer id) → tokens and split.
type EncodedMemo = std::collections::HashMap<(u64, u64), Arc<(Vec<u32>, usize)>>;

impl Corpus {
    /// Builds a corpus from text: one token per distinct character, the
    /// vocabulary as large as the text needs; the last
    /// [`VALIDATION_FRACTION`] of the tokens is the validation part.
    ///
    /// # Errors
    /// [`LabError::Invalid`] for fewer than 16 characters, or for more than
    /// [`MAX_VOCAB`] distinct ones (the message says how many).
    pub fn from_text(text: &str) -> Result<Self, LabError> {
        let mut counts = std::collections::BTreeMap::new();
        for ch in text.chars() {
            *counts.entry(ch).or_insert(0usize) += 1;
        }
        let n = text.chars().count();
        if n < 16 {
            return Err(LabError::Invalid(
                "corpus is too short (need at least 16 characters)".into(),
            ));
        }
        if counts.len() > MAX_VOCAB {
            return Err(LabError::Invalid(format!(
                "the corpus has {} distinct characters; the lab's character vocabulary holds at most {MAX_VOCAB}",
                counts.len()
            )));
        }
        let mut by_freq: Vec<(char, usize)> = counts.into_iter().collect();
        by_freq.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let vocab: Vec<char> = by_freq.iter().map(|(c, _)| *c).collect();
        let index: std::collections::HashMap<char, u32> = vocab
            .iter()
            .enumerate()
            .map(|(i, c)| (*c, i as u32))
            .collect();
        let tokens = text.chars().map(|c| index[&c]).collect();
        Ok(Corpus {
            vocab: Vocab::Chars(vocab),
            tokens,
            split_at: split_point(n),
            chars: n,
            train_chars: split_point(n),
        })
    }

    /// Builds a corpus from text with `tokens`: [`Corpus::from_text`] for
    /// characters; for BPE, a tokenizer trained on the first 90% of the
    /// characters only (or the one already trained on them:
    /// [`Bpe::cached`]), which then encodes the training and the
    /// validation parts separately, so the split falls where the character
    /// corpus's does and no token spans it.
    ///
    /// # Errors
    /// As [`Corpus::from_text`] for characters; for BPE, fewer than 16
    /// characters, or [`LabError::TextTooShort`].
    pub fn with_tokens(text: &str, tokens: Tokenization) -> Result<Self, LabError> {
        match tokens {
            Tokenization::Chars => Self::from_text(text),
            Tokenization::Bpe { vocab } => {
                tokens.validate()?;
                let (train, _) = Self::split_text(text)?;
                let bpe = Bpe::cached(train, vocab)?;
                Self::with_bpe(text, bpe)
            }
        }
    }

    /// The text's training part (its first 90% of characters) and
    /// validation part.
    ///
    /// # Errors
    /// [`LabError::Invalid`] for fewer than 16 characters.
    pub fn split_text(text: &str) -> Result<(&str, &str), LabError> {
        let n = text.chars().count();
        if n < 16 {
            return Err(LabError::Invalid(
                "corpus is too short (need at least 16 characters)".into(),
            ));
        }
        let at = text
            .char_indices()
            .nth(split_point(n))
            .map_or(text.len(), |(i, _)| i);
        Ok(text.split_at(at))
    }

    /// Builds a corpus from text with a given BPE (e.g. a checkpoint's
    /// `tokenizer.json`): the training and validation parts encoded
    /// separately (memoised per text and tokenizer for the process).
    ///
    /// # Errors
    /// [`LabError::Invalid`] for fewer than 16 characters.
    pub fn with_bpe(text: &str, bpe: Arc<Bpe>) -> Result<Self, LabError> {
        static MEMO: std::sync::OnceLock<std::sync::Mutex<EncodedMemo>> =
            std::sync::OnceLock::new();
        let (train, valid) = Self::split_text(text)?;
        let key = (crate::bpe::fnv(text.as_bytes()), bpe.id());
        let memo = MEMO.get_or_init(Default::default);
        let hit = memo
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&key)
            .cloned();
        let enc = match hit {
            Some(e) => e,
            None => {
                let mut tokens = bpe.encode(train)?;
                let split_at = tokens.len();
                tokens.extend(bpe.encode(valid)?);
                let e = Arc::new((tokens, split_at));
                memo.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .insert(key, e.clone());
                e
            }
        };
        let n = text.chars().count();
        Ok(Corpus {
            vocab: Vocab::Bpe(bpe),
            tokens: enc.0.clone(),
            split_at: enc.1,
            chars: n,
            train_chars: split_point(n),
        })
    }

    /// How this corpus is tokenised.
    pub fn tokenization(&self) -> Tokenization {
        match &self.vocab {
            Vocab::Chars(_) => Tokenization::Chars,
            Vocab::Bpe(b) => Tokenization::Bpe {
                vocab: b.vocab_size(),
            },
        }
    }

    /// The BPE, for a subword corpus.
    pub fn bpe(&self) -> Option<&Arc<Bpe>> {
        match &self.vocab {
            Vocab::Bpe(b) => Some(b),
            Vocab::Chars(_) => None,
        }
    }

    /// Characters of the text that token `id` starts (1 for a character
    /// token; for a BPE piece, the UTF-8 lead bytes it holds; 0 for an id
    /// past the vocabulary, such as `mlm`'s `[MASK]`). Summed over a run of
    /// tokens, the characters of that run: the denominator of bits per
    /// character.
    pub fn chars_of(&self, id: u32) -> u32 {
        match &self.vocab {
            Vocab::Chars(v) => u32::from((id as usize) < v.len()),
            Vocab::Bpe(b) if (id as usize) < b.vocab_size() => b.chars_of(id),
            Vocab::Bpe(_) => 0,
        }
    }

    /// Characters per token over the whole text.
    pub fn chars_per_token(&self) -> f64 {
        self.chars as f64 / self.tokens.len().max(1) as f64
    }

    /// The unigram entropy in bits per character: the unigram model's
    /// total nats over the text ([`unigram_entropy`](Self::unigram_entropy)
    /// per token) over its characters, / ln 2 — the context-free baseline
    /// in the unit every tokenization shares.
    pub fn unigram_bits_per_char(&self) -> f64 {
        self.unigram_entropy() / self.chars_per_token() / std::f64::consts::LN_2
    }

    /// The text of `tokens`, back through the vocabulary.
    pub fn decode(&self, tokens: &[u32]) -> String {
        match &self.vocab {
            Vocab::Chars(v) => tokens.iter().map(|&t| v[t as usize]).collect(),
            Vocab::Bpe(b) => b.decode(tokens),
        }
    }

    /// The tokens of one part.
    pub fn part(&self, split: Split) -> &[u32] {
        match split {
            Split::Train => &self.tokens[..self.split_at],
            Split::Validation => &self.tokens[self.split_at..],
        }
    }

    /// A synthetic corpus of about `chars` characters with long-range
    /// structure: paragraphs introduce two names and refer back to them,
    /// subjects agree with their verbs across nested relative clauses, and
    /// paragraphs end by repeating their first name.
    pub fn synthetic(chars: usize, seed: u64) -> Self {
        Corpus::from_text(&Self::synthetic_text(chars, seed))
            .expect("synthetic corpus is long enough")
    }

    /// The text of [`Corpus::synthetic`].
    pub fn synthetic_text(chars: usize, seed: u64) -> String {
        let mut rng = SplitMix64::new(seed);
        let names = [
            "alice", "bob", "carol", "dave", "erin", "frank", "grace", "heidi", "ivan", "judy",
        ];
        let nouns = [
            ("cat", "cats"),
            ("dog", "dogs"),
            ("bird", "birds"),
            ("fox", "foxes"),
        ];
        let verbs = [
            ("sees", "see"),
            ("likes", "like"),
            ("chases", "chase"),
            ("helps", "help"),
        ];
        let pick = |rng: &mut SplitMix64, n: usize| rng.below(n as u64) as usize;
        let mut text = String::new();
        while text.len() < chars {
            let a = names[pick(&mut rng, names.len())];
            let mut b = names[pick(&mut rng, names.len())];
            if a == b {
                b = names[(names.iter().position(|n| *n == a).unwrap_or(0) + 1) % names.len()];
            }
            text.push_str(&format!("{a} met {b}. "));
            for _ in 0..(2 + pick(&mut rng, 3)) {
                let plural = rng.below(2) == 1;
                let (ns, np) = nouns[pick(&mut rng, nouns.len())];
                let (vs, vp) = verbs[pick(&mut rng, verbs.len())];
                let subj = if plural { np } else { ns };
                let verb = if plural { vp } else { vs };
                let who = if rng.below(2) == 0 { a } else { b };
                if rng.below(2) == 0 {
                    // Agreement across a nested relative clause.
                    let other_plural = rng.below(2) == 1;
                    let (os, op) = nouns[pick(&mut rng, nouns.len())];
                    let (ivs, ivp) = verbs[pick(&mut rng, verbs.len())];
                    let (o, iv) = if other_plural { (op, ivp) } else { (os, ivs) };
                    text.push_str(&format!("the {subj} that the {o} {iv} {verb} {who}. "));
                } else {
                    text.push_str(&format!("the {subj} {verb} {who}. "));
                }
            }
            text.push_str(&format!("then {b} thanked {a}.\n"));
        }
        text
    }

    /// Where a random window of `n` tokens of `split` starts (an index
    /// into [`tokens`](Self::tokens)): uniform over the starts that keep the
    /// whole window inside the part.
    ///
    /// # Errors
    /// [`LabError::Invalid`] if the part is shorter than `n`.
    pub fn window_start(
        &self,
        rng: &mut SplitMix64,
        n: usize,
        split: Split,
    ) -> Result<usize, LabError> {
        let (lo, len) = match split {
            Split::Train => (0, self.split_at),
            Split::Validation => (self.split_at, self.tokens.len() - self.split_at),
        };
        if n > len {
            return Err(LabError::Invalid(format!(
                "window of {n} tokens is longer than the corpus's {} part ({len} tokens)",
                match split {
                    Split::Train => "training",
                    Split::Validation => "validation",
                }
            )));
        }
        Ok(lo + rng.below((len - n + 1) as u64) as usize)
    }

    /// A random window of `n` tokens of `split`.
    pub fn window(
        &self,
        rng: &mut SplitMix64,
        n: usize,
        split: Split,
    ) -> Result<Vec<u32>, LabError> {
        let start = self.window_start(rng, n, split)?;
        Ok(self.tokens[start..start + n].to_vec())
    }

    /// Unigram entropy of the corpus in nats (the loss of a model that
    /// ignores context).
    pub fn unigram_entropy(&self) -> f64 {
        let mut counts = vec![0usize; self.vocab.len()];
        for &t in &self.tokens {
            counts[t as usize] += 1;
        }
        let n = self.tokens.len() as f64;
        counts
            .iter()
            .filter(|&&c| c > 0)
            .map(|&c| {
                let p = c as f64 / n;
                -p * p.ln()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(e: &Example) -> Vec<u32> {
        e.target
            .iter()
            .filter(|&&t| t != IGNORE)
            .map(|&t| t as u32)
            .collect()
    }

    fn content(e: &Example) -> Vec<u32> {
        let sep = e.input.iter().position(|&t| t == SEP).unwrap();
        e.input[1..sep].to_vec()
    }

    #[test]
    fn copy_reverse_sort_invariants() {
        let mut rng = SplitMix64::new(1);
        for len in [3usize, 4, 5, 16, 31, 64, 129] {
            for kind in [TaskKind::Copy, TaskKind::Reverse, TaskKind::Sort] {
                let t = Task::new(kind, 8).unwrap();
                let e = t.sample(&mut rng, len).unwrap();
                assert_eq!(e.input.len(), len);
                assert_eq!(e.target.len(), len);
                assert_eq!(e.input[0], BOS);
                let x = content(&e);
                let mut want = x.clone();
                match kind {
                    TaskKind::Reverse => want.reverse(),
                    TaskKind::Sort => want.sort(),
                    _ => {}
                }
                assert_eq!(answer(&e), want, "{kind:?} len {len}");
                assert!(x.iter().all(|&s| (SYMBOL0..SYMBOL0 + 8).contains(&s)));
                // Targets are next tokens of the input where scored.
                for t in 0..len - 1 {
                    if e.target[t] != IGNORE {
                        assert_eq!(e.target[t], e.input[t + 1] as i64);
                    }
                }
            }
        }
    }

    /// One example of `kind` over 4 symbols at each length of `lens`, drawn
    /// in turn from seed `seed`, with its length (checked).
    fn examples(kind: TaskKind, seed: u64, lens: &[usize]) -> Vec<(usize, Example)> {
        let mut rng = SplitMix64::new(seed);
        let t = Task::new(kind, 4).unwrap();
        lens.iter()
            .map(|&len| {
                let e = t.sample(&mut rng, len).unwrap();
                assert_eq!(e.input.len(), len);
                (len, e)
            })
            .collect()
    }

    #[test]
    fn count_answer_is_the_count() {
        for (_, e) in examples(TaskKind::Count, 2, &[7, 8, 20, 100, 300]) {
            let qpos = e.input.iter().position(|&t| t == QUERY).unwrap();
            let q = e.input[qpos + 1];
            let c = e.input[1..qpos].iter().filter(|&&t| t == q).count();
            let a = answer(&e);
            assert_eq!(a.len(), 3);
            let got: usize = a.iter().fold(0, |acc, d| acc * 10 + (d - DIGIT0) as usize);
            assert_eq!(got, c);
            assert!(c >= 1);
        }
    }

    #[test]
    fn addition_answer_is_the_sum() {
        for (len, e) in examples(TaskKind::Addition, 3, &[7, 10, 13, 31, 64]) {
            let full: Vec<u32> = e.input.iter().copied().chain(std::iter::once(0)).collect();
            let plus = full.iter().position(|&t| t == PLUS).unwrap();
            let eq = full.iter().position(|&t| t == EQ).unwrap();
            let num = |ds: &[u32]| {
                ds.iter()
                    .rev()
                    .fold(0u64, |acc, d| acc * 10 + (d - DIGIT0) as u64)
            };
            let a = num(&full[1..plus]);
            let b = num(&full[plus + 1..eq]);
            let s = num(&answer(&e));
            assert_eq!(s, a + b, "len {len}");
        }
    }

    #[test]
    fn order_labels_depend_only_on_order() {
        let mut rng = SplitMix64::new(4);
        let t = Task::new(TaskKind::Order, 6).unwrap();
        let mut ones = 0;
        for _ in 0..400 {
            let e = t.sample(&mut rng, 12).unwrap();
            let ia = e.input.iter().position(|&t| t == SYMBOL0).unwrap();
            let ib = e.input.iter().position(|&t| t == SYMBOL0 + 1).unwrap();
            assert_eq!(e.input.iter().filter(|&&t| t == SYMBOL0).count(), 1);
            assert_eq!(e.input.iter().filter(|&&t| t == SYMBOL0 + 1).count(), 1);
            assert_eq!(e.label, Some(u32::from(ia < ib)));
            ones += e.label.unwrap();
            // Swapping A and B keeps the bag and flips the label.
            let mut sw = e.input.clone();
            sw.swap(ia, ib);
            let mut b1 = e.input.clone();
            let mut b2 = sw.clone();
            b1.sort();
            b2.sort();
            assert_eq!(b1, b2);
        }
        assert!((150..250).contains(&ones), "labels balanced: {ones}");
    }

    #[test]
    fn lm_windows_and_corpus() {
        let t = Task::new(TaskKind::Lm, 4).unwrap();
        let c = t.corpus().unwrap();
        assert!(
            c.vocab.len() > 20 && c.vocab.len() < 40,
            "{}",
            c.vocab.len()
        );
        let h = c.unigram_entropy();
        assert!(h > 1.5 && h < (c.vocab.len() as f64).ln());
        let mut rng = SplitMix64::new(5);
        let e = t.sample(&mut rng, 64).unwrap();
        assert_eq!(e.input.len(), 64);
        assert!(e.target.iter().all(|&y| y != IGNORE));
        for i in 0..63 {
            assert_eq!(e.target[i], e.input[i + 1] as i64);
        }
        let f = Task::lm_from_text("hello world, hello posenc! hello again.").unwrap();
        assert_eq!(f.corpus().unwrap().tokens.len(), 39);
        // Token 0 is the text's most frequent character (here 'l'), scored
        // like any other: no character is mistaken for padding.
        assert!(matches!(&f.corpus().unwrap().vocab, Vocab::Chars(v) if v[0] == 'l'));
        let e = f.sample(&mut rng, 34).unwrap();
        assert!(e.input.contains(&0));
        assert!(e.target.iter().all(|&y| y != IGNORE));
        assert_eq!(
            e.target[..33],
            e.input[1..].iter().map(|&t| t as i64).collect::<Vec<_>>()[..]
        );
        assert!(Task::lm_from_text("short").is_err());
    }

    /// Text whose first 90% uses only `a`/`b` and whose last 10% uses only
    /// `x`/`y`: a window that crossed the split would mix them.
    fn two_part_text(n: usize) -> String {
        let split = split_point(n);
        (0..n)
            .map(|i| match (i < split, i % 3 == 0) {
                (true, true) => 'a',
                (true, false) => 'b',
                (false, true) => 'x',
                (false, false) => 'y',
            })
            .collect()
    }

    #[test]
    fn no_validation_window_overlaps_the_training_text() {
        let n = 2000;
        let text = two_part_text(n);
        let c = Corpus::from_text(&text).unwrap();
        assert_eq!(c.split_at, 1800);
        assert_eq!(c.part(Split::Train).len(), 1800);
        assert_eq!(c.part(Split::Validation).len(), 200);
        let mut rng = SplitMix64::new(7);
        for len in [1usize, 2, 17, 64, 200] {
            for _ in 0..300 {
                let s = c.window_start(&mut rng, len, Split::Train).unwrap();
                assert!(s + len <= c.split_at, "training window {s}..{}", s + len);
                let s = c.window_start(&mut rng, len, Split::Validation).unwrap();
                assert!(s >= c.split_at && s + len <= n, "validation window {s}");
            }
        }
        // Both ends are reachable: the whole part is used.
        let starts: Vec<usize> = (0..4000)
            .map(|_| c.window_start(&mut rng, 190, Split::Validation).unwrap())
            .collect();
        assert_eq!(starts.iter().min(), Some(&1800));
        assert_eq!(starts.iter().max(), Some(&1810));
        assert!(c.window_start(&mut rng, 201, Split::Validation).is_err());
        assert!(c.window_start(&mut rng, 1801, Split::Train).is_err());
        // Through the tasks: training examples never see x or y, validation
        // examples never see a or b (inputs and targets).
        for kind in [TaskKind::Lm, TaskKind::Mlm] {
            let train = Task::from_text(kind, &text).unwrap();
            assert_eq!(train.split, Split::Train);
            let valid = train.validation();
            assert_eq!(valid.split, Split::Validation);
            let corpus = train.corpus().unwrap();
            let chars = |e: &Example| -> String {
                let mut t: Vec<u32> = e
                    .input
                    .iter()
                    .copied()
                    .filter(|&t| Some(t) != train.mask_token())
                    .collect();
                t.extend(e.target.iter().filter(|&&y| y != IGNORE).map(|&y| y as u32));
                corpus.decode(&t)
            };
            for _ in 0..200 {
                let e = train.sample(&mut rng, 63).unwrap();
                assert!(chars(&e).chars().all(|ch| ch == 'a' || ch == 'b'));
                let e = valid.sample(&mut rng, 63).unwrap();
                assert!(chars(&e).chars().all(|ch| ch == 'x' || ch == 'y'));
            }
        }
        // Split points: the last 10% rounded up, at least one token.
        assert_eq!(split_point(16), 14);
        assert_eq!(split_point(20), 18);
        assert_eq!(split_point(21), 18);
        assert_eq!(split_point(684_768), 616_291);
    }

    #[test]
    fn the_vocabulary_grows_to_fit_russian_and_chinese_text() {
        // The Russian introductory article's language and a Chinese text with more distinct characters
        // than the old 256-entry vocabulary: every character keeps its own
        // token and the text decodes back exactly.
        let ru = "Все этапы в блоке кодировщика модели трансформера работают \
                  независимо для каждого токена. Позиционное кодирование!";
        let zh: String = (0..600u32)
            .map(|i| char::from_u32(0x4E00 + i).unwrap())
            .chain("位置编码使模型能够理解序列顺序。".chars())
            .collect();
        for text in [ru.to_string(), zh.clone(), format!("{ru}{zh}")] {
            let c = Corpus::from_text(&text).unwrap();
            let mut distinct: Vec<char> = text.chars().collect();
            distinct.sort_unstable();
            distinct.dedup();
            assert_eq!(c.vocab.len(), distinct.len());
            assert_eq!(c.decode(&c.tokens), text);
            let t = Task::from_text(TaskKind::Mlm, &text).unwrap();
            assert_eq!(t.vocab_size(), distinct.len() + 1);
        }
        assert!(Corpus::from_text(&zh).unwrap().vocab.len() > 600);
        // Past MAX_VOCAB: an error that says how many.
        let huge: String = (0..MAX_VOCAB as u32 + 5)
            .map(|i| char::from_u32(0x4E00 + i).unwrap())
            .collect();
        let e = Corpus::from_text(&huge).unwrap_err().to_string();
        assert!(
            e.contains(&format!("{} distinct characters", MAX_VOCAB + 5)),
            "{e}"
        );
        assert!(e.contains(&MAX_VOCAB.to_string()), "{e}");
    }

    #[test]
    fn generators_are_deterministic_and_reject_bad_lengths() {
        let t = Task::new(TaskKind::Copy, 8).unwrap();
        let a = t.sample(&mut SplitMix64::new(9), 20).unwrap();
        let b = t.sample(&mut SplitMix64::new(9), 20).unwrap();
        assert_eq!(a, b);
        assert!(t.sample(&mut SplitMix64::new(9), 2).is_err());
        assert!(Task::new(TaskKind::Copy, 2).is_err());
        assert!(TaskKind::parse("nope").is_err());
        assert_eq!(TaskKind::parse("sort").unwrap(), TaskKind::Sort);
    }
}
