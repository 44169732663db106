//! Subword tokens: byte-level BPE (Sennrich et al. 2016, "Neural Machine
//! Translation of Rare Words with Subword Units"; on bytes, as GPT-2:
//! Radford et al. 2019 §2.2), trained with the `tokenizers` crate on the
//! training part of a corpus only.
//!
//! The papers that measured NoPE on language models tokenised words or BPE
//! pieces (Haviv et al. 2022: word-level WikiText-103 and the Pile with
//! GPT-2's BPE); a character model has to recover the order of the last few
//! characters by counting, while a subword token carries it inside itself.
//! [`Tokenization`] picks one or the other for the lab's `lm` and `mlm`.
//!
//! - **Any script.** The base alphabet is the 256 bytes (GPT-2's
//!   byte-to-character map), so every UTF-8 text is encodable, including
//!   validation text with characters the training text never had, and
//!   [`Bpe::decode`] gives the text back exactly.
//! - **Training text only.** [`Bpe::train`] sees the first 90% of the
//!   characters ([`crate::tasks::split_point`]); the validation text is
//!   encoded with the result, never trained on.
//! - **Deterministic.** The trainer picks the most frequent pair, ties by
//!   the smaller pair of ids, over a byte alphabet in byte order: the same
//!   text and size give the same merges, whatever the thread count (a test
//!   trains twice and compares the JSON).
//! - **Too short a text** for the vocabulary asked (fewer than
//!   `size − 256` pairs occurring at least twice) is
//!   [`LabError::TextTooShort`], never a silently smaller vocabulary.
//! - **Cached.** Trained once per (training text, size): in memory for the
//!   process and on disk under [`cache_dir`] as JSON; a checkpoint keeps its
//!   own copy (`tokenizer.json`), which `eval`, `probe`, `shuffle` and
//!   `finetune` read.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use serde::{Deserialize, Serialize};
use tokenizers::models::bpe::{BpeTrainerBuilder, BPE};
use tokenizers::models::TrainerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::{DecoderWrapper, ModelWrapper, PreTokenizerWrapper, Tokenizer};

use crate::error::LabError;

/// The most distinct characters a corpus may have (its vocabulary). A
/// character vocabulary of Chinese text needs a few thousand; the logits of
/// a step grow with it (batch × length × vocabulary floats).
pub const MAX_VOCAB: usize = 8192;
/// The smallest BPE vocabulary: the 256 bytes, no merge.
pub const MIN_BPE_VOCAB: usize = 256;
/// The largest BPE vocabulary (the logits of a step grow with it, as a
/// character vocabulary's do: [`MAX_VOCAB`]).
pub const MAX_BPE_VOCAB: usize = MAX_VOCAB;
/// A pair must occur this many times in the training text to be merged: a
/// merge seen once only memorises it.
pub const MIN_PAIR_FREQUENCY: u64 = 2;

/// How a corpus becomes tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Tokenization {
    /// One token per distinct character (the vocabulary grows to fit).
    #[default]
    Chars,
    /// Byte-level BPE with `vocab` tokens (256 bytes and `vocab − 256`
    /// merges).
    Bpe {
        /// Vocabulary size.
        vocab: usize,
    },
}

impl Tokenization {
    /// Parses `chars` or `bpe:N` (`N` in [`MIN_BPE_VOCAB`]..=[`MAX_BPE_VOCAB`]).
    ///
    /// # Errors
    /// [`LabError::Invalid`] for anything else.
    pub fn parse(s: &str) -> Result<Self, LabError> {
        if s == "chars" {
            return Ok(Tokenization::Chars);
        }
        let bad = || {
            LabError::Invalid(format!(
                "invalid tokens {s:?}: expected chars or bpe:N with N in {MIN_BPE_VOCAB}..={MAX_BPE_VOCAB}"
            ))
        };
        let n: usize = s
            .strip_prefix("bpe:")
            .ok_or_else(bad)?
            .parse()
            .map_err(|_| bad())?;
        let t = Tokenization::Bpe { vocab: n };
        t.validate().map_err(|_| bad())?;
        Ok(t)
    }

    /// Checks a BPE size.
    ///
    /// # Errors
    /// [`LabError::Invalid`] for a size outside
    /// [`MIN_BPE_VOCAB`]..=[`MAX_BPE_VOCAB`].
    pub fn validate(&self) -> Result<(), LabError> {
        match *self {
            Tokenization::Chars => Ok(()),
            Tokenization::Bpe { vocab } if (MIN_BPE_VOCAB..=MAX_BPE_VOCAB).contains(&vocab) => {
                Ok(())
            }
            Tokenization::Bpe { vocab } => Err(LabError::Invalid(format!(
                "BPE vocabulary {vocab} is outside {MIN_BPE_VOCAB}..={MAX_BPE_VOCAB}"
            ))),
        }
    }

    /// `chars` or `bpe:N`, as parsed.
    pub fn label(&self) -> String {
        match self {
            Tokenization::Chars => "chars".into(),
            Tokenization::Bpe { vocab } => format!("bpe:{vocab}"),
        }
    }

    /// Whether this is the character tokenization (the default).
    pub fn is_chars(&self) -> bool {
        *self == Tokenization::Chars
    }
}

/// GPT-2's map from bytes to printable characters (Radford et al. 2019;
/// `bytes_to_unicode` of its `encoder.py`): the printable Latin-1 bytes
/// stand for themselves, the other 68 for `U+0100…`. The byte-level
/// pre-tokenizer writes every piece in these characters.
fn byte_chars() -> [char; 256] {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    let mut out = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..=255u8 {
        out[b as usize] = if printable(b) {
            char::from(b)
        } else {
            n += 1;
            char::from_u32(255 + n).expect("U+0100..U+0144 are characters")
        };
    }
    out
}

/// A trained byte-level BPE: the `tokenizers` tokenizer, the bytes of each
/// token, and how many characters each token starts.
#[derive(Debug, Clone)]
pub struct Bpe {
    tokenizer: Tokenizer,
    /// The bytes of token `i`.
    pieces: Vec<Vec<u8>>,
    /// Characters whose first byte token `i` holds (the UTF-8 bytes that are
    /// not continuation bytes): the characters of a run of tokens are the
    /// sum of theirs, even where a character's bytes span two tokens.
    chars: Vec<u32>,
    /// FNV-1a of the tokenizer's JSON: tells two tokenizers apart.
    id: u64,
}

impl Bpe {
    /// Trains a BPE of `vocab` tokens on `text` (the training part of a
    /// corpus; nothing else).
    ///
    /// # Errors
    /// [`LabError::Invalid`] for a size outside the bounds;
    /// [`LabError::TextTooShort`] if the text has fewer than `vocab − 256`
    /// pairs occurring [`MIN_PAIR_FREQUENCY`] times.
    pub fn train(text: &str, vocab: usize) -> Result<Self, LabError> {
        Tokenization::Bpe { vocab }.validate()?;
        let alphabet = ByteLevel::alphabet().into_iter().collect();
        let mut trainer = TrainerWrapper::BpeTrainer(
            BpeTrainerBuilder::new()
                .vocab_size(vocab)
                .min_frequency(MIN_PAIR_FREQUENCY)
                .show_progress(false)
                .initial_alphabet(alphabet)
                .build(),
        );
        let mut tokenizer = Self::empty();
        tokenizer
            .train(&mut trainer, std::iter::once(text))
            .map_err(|e| LabError::Invalid(format!("BPE training failed: {e}")))?;
        let bpe = Self::from_tokenizer(tokenizer)?;
        if bpe.vocab_size() < vocab {
            return Err(LabError::TextTooShort {
                vocab,
                learned: bpe.vocab_size(),
                chars: text.chars().count(),
            });
        }
        Ok(bpe)
    }

    /// A tokenizer with an empty BPE model and GPT-2's byte-level
    /// pre-tokenizer and decoder (no prefix space: decoding gives the text
    /// back exactly).
    fn empty() -> Tokenizer {
        let mut t = Tokenizer::new(ModelWrapper::BPE(BPE::default()));
        let bl = ByteLevel::default()
            .add_prefix_space(false)
            .trim_offsets(false)
            .use_regex(true);
        t.with_pre_tokenizer(Some(PreTokenizerWrapper::ByteLevel(bl)));
        t.with_decoder(Some(DecoderWrapper::ByteLevel(bl)));
        t
    }

    /// Wraps a tokenizer: reads each token's bytes back through GPT-2's byte
    /// map, checking that it is a byte-level BPE with ids `0..n`.
    fn from_tokenizer(tokenizer: Tokenizer) -> Result<Self, LabError> {
        if !matches!(tokenizer.get_model(), ModelWrapper::BPE(_))
            || !matches!(
                tokenizer.get_pre_tokenizer(),
                Some(PreTokenizerWrapper::ByteLevel(_))
            )
        {
            return Err(LabError::Invalid(
                "the tokenizer is not a byte-level BPE".into(),
            ));
        }
        let to_byte: HashMap<char, u8> = byte_chars()
            .iter()
            .enumerate()
            .map(|(b, &c)| (c, b as u8))
            .collect();
        let n = tokenizer.get_vocab_size(true);
        if !(MIN_BPE_VOCAB..=MAX_BPE_VOCAB).contains(&n) {
            return Err(LabError::Invalid(format!(
                "the tokenizer has {n} tokens, outside {MIN_BPE_VOCAB}..={MAX_BPE_VOCAB}"
            )));
        }
        let mut pieces = Vec::with_capacity(n);
        for id in 0..n as u32 {
            let s = tokenizer.id_to_token(id).ok_or_else(|| {
                LabError::Invalid(format!("the tokenizer has no token {id} (of {n})"))
            })?;
            let bytes: Option<Vec<u8>> = s.chars().map(|c| to_byte.get(&c).copied()).collect();
            pieces.push(bytes.ok_or_else(|| {
                LabError::Invalid(format!(
                    "token {id} ({s:?}) is not written in byte-level characters"
                ))
            })?);
        }
        for b in 0..=255u8 {
            if !pieces.iter().any(|p| p.as_slice() == [b]) {
                return Err(LabError::Invalid(format!(
                    "the tokenizer cannot encode byte {b:#04x} (not a byte-level BPE)"
                )));
            }
        }
        let chars = pieces
            .iter()
            .map(|p| p.iter().filter(|&&b| (b & 0xC0) != 0x80).count() as u32)
            .collect();
        let json = tokenizer
            .to_string(false)
            .map_err(|e| LabError::Invalid(format!("the tokenizer does not serialise: {e}")))?;
        Ok(Bpe {
            tokenizer,
            pieces,
            chars,
            id: fnv(json.as_bytes()),
        })
    }

    /// Reads a `tokenizer.json` written by [`Bpe::to_json`].
    ///
    /// # Errors
    /// [`LabError::Invalid`] if it is not a byte-level BPE's JSON.
    pub fn from_json(json: &str) -> Result<Self, LabError> {
        let t: Tokenizer = json
            .parse()
            .map_err(|e| LabError::Invalid(format!("not a tokenizer.json: {e}")))?;
        Self::from_tokenizer(t)
    }

    /// The tokenizer as `tokenizer.json` (readable by Hugging Face's
    /// `tokenizers` as well).
    pub fn to_json(&self) -> String {
        self.tokenizer
            .to_string(false)
            .expect("a BPE tokenizer serialises")
    }

    /// FNV-1a of the tokenizer's JSON (equal JSON, equal id).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Vocabulary size.
    pub fn vocab_size(&self) -> usize {
        self.pieces.len()
    }

    /// The tokens of `text`.
    ///
    /// # Errors
    /// [`LabError::Invalid`] if the tokenizer fails (it does not on UTF-8
    /// text: every byte is a token).
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, LabError> {
        if text.is_empty() {
            return Ok(Vec::new());
        }
        let e = self
            .tokenizer
            .encode_fast(text, false)
            .map_err(|e| LabError::Invalid(format!("BPE encoding failed: {e}")))?;
        Ok(e.get_ids().to_vec())
    }

    /// The bytes of `tokens`.
    pub fn decode_bytes(&self, tokens: &[u32]) -> Vec<u8> {
        tokens
            .iter()
            .flat_map(|&t| self.pieces[t as usize].iter().copied())
            .collect()
    }

    /// The text of `tokens` (a character cut between two tokens at either
    /// end comes out as U+FFFD).
    pub fn decode(&self, tokens: &[u32]) -> String {
        String::from_utf8_lossy(&self.decode_bytes(tokens)).into_owned()
    }

    /// The bytes of token `id`.
    pub fn piece(&self, id: u32) -> &[u8] {
        &self.pieces[id as usize]
    }

    /// Characters whose first byte token `id` holds.
    pub fn chars_of(&self, id: u32) -> u32 {
        self.chars[id as usize]
    }

    /// Trains a BPE of `vocab` tokens on `text`, or returns the one already
    /// trained on the same text and size: from this process's memory, else
    /// from [`cache_dir`] (written there after training when it can be).
    ///
    /// # Errors
    /// As [`Bpe::train`].
    pub fn cached(text: &str, vocab: usize) -> Result<Arc<Self>, LabError> {
        static MEMO: OnceLock<Mutex<TrainedMemo>> = OnceLock::new();
        let key = (fnv(text.as_bytes()), vocab);
        // Held while training: parallel runs of one report train it once.
        let mut memo = MEMO
            .get_or_init(Default::default)
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(b) = memo.get(&key) {
            return Ok(b.clone());
        }
        let file = cache_dir().map(|d| d.join(format!("{:016x}-{vocab}.json", key.0)));
        let from_disk = file
            .as_ref()
            .and_then(|f| std::fs::read_to_string(f).ok())
            .and_then(|j| Bpe::from_json(&j).ok())
            .filter(|b| b.vocab_size() == vocab);
        let bpe = match from_disk {
            Some(b) => b,
            None => {
                let b = Bpe::train(text, vocab)?;
                if let Some(f) = &file {
                    // A cache that cannot be written is only slower.
                    if let Some(d) = f.parent() {
                        let _ = std::fs::create_dir_all(d);
                    }
                    let _ = crate::fsio::write_atomic(f, b.to_json().as_bytes());
                }
                b
            }
        };
        let bpe = Arc::new(bpe);
        memo.insert(key, bpe.clone());
        Ok(bpe)
    }
}

/// Memo of trained tokenizers: (training-text hash, size) → tokenizer.
type TrainedMemo = HashMap<(u64, usize), Arc<Bpe>>;

/// Where trained tokenizers are cached: `$POSENC_CACHE/bpe`, else
/// `$XDG_CACHE_HOME/posenc/bpe`, else `$HOME/.cache/posenc/bpe`; `None`
/// when none is set.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = var("POSENC_CACHE") {
        return Some(d.join("bpe"));
    }
    if let Some(d) = var("XDG_CACHE_HOME") {
        return Some(d.join("posenc").join("bpe"));
    }
    var("HOME").map(|h| Path::new(&h).join(".cache").join("posenc").join("bpe"))
}

/// FNV-1a, 64 bits (the `fnv` crate's hasher): the cache keys of the lab
/// and the report.
pub fn fnv(bytes: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h = fnv::FnvHasher::default();
    h.write(bytes);
    h.finish()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published FNV-1a 64-bit values (the hand-written fold this
    /// replaced gave the same, so existing cache keys stay valid).
    #[test]
    fn fnv_is_fnv_1a_64() {
        assert_eq!(fnv(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv(b"foobar"), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn the_byte_map_is_gpt2s() {
        let ours: std::collections::HashSet<char> = byte_chars().into_iter().collect();
        let theirs: std::collections::HashSet<char> = ByteLevel::alphabet().into_iter().collect();
        assert_eq!(ours.len(), 256);
        assert_eq!(ours, theirs);
        assert_eq!(byte_chars()[b'a' as usize], 'a');
        assert_eq!(byte_chars()[b' ' as usize], 'Ġ');
        assert_eq!(byte_chars()[b'\n' as usize], 'Ċ');
    }

    #[test]
    fn tokenizations_parse_and_bound() {
        assert_eq!(Tokenization::parse("chars").unwrap(), Tokenization::Chars);
        assert_eq!(
            Tokenization::parse("bpe:512").unwrap(),
            Tokenization::Bpe { vocab: 512 }
        );
        for bad in ["bpe:255", "bpe:", "bpe:x", "bpe:99999", "bytes", "bpe:-1"] {
            assert!(Tokenization::parse(bad).is_err(), "{bad}");
        }
        let t = Tokenization::Bpe { vocab: 300 };
        assert_eq!(Tokenization::parse(&t.label()).unwrap(), t);
        let j = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<Tokenization>(&j).unwrap(), t);
    }
}
