//! The model's own tokenizer: from a `tokenizer.json` (Hugging Face
//! checkpoints) or rebuilt from a GGUF file's vocabulary and merges the way
//! transformers rebuilds it (`integrations/gguf/gguf_tokenizer_mapping.py`):
//!
//! - `tokenizer.ggml.model = gpt2`: byte-level BPE (GPT-2's `ByteLevel`
//!   pre-tokenizer with its regex, or, for the pre-tokenizer names
//!   transformers knows — llama3, qwen2, ... — that split's regex followed
//!   by `ByteLevel` without regex), tokens outside the byte alphabet
//!   respelled byte by byte, the `ByteLevel` decoder;
//! - `tokenizer.ggml.model = llama`: SentencePiece-style BPE with byte
//!   fallback, `Metaspace` (prepend `▁` to the first word), decoder
//!   `Replace ▁ → space, ByteFallback, Fuse, Strip`;
//! - tokens typed CONTROL (3) are special, USER_DEFINED (4) are added
//!   tokens, matched whole.
//!
//! A BOS token is prepended when the file says `add_bos_token` (a
//! SentencePiece vocabulary that says nothing adds one, as llama.cpp and
//! transformers do).

use std::path::Path;

use candle_core::quantized::gguf_file::Value;
use tokenizers::decoders::byte_fallback::ByteFallback;
use tokenizers::decoders::byte_level::ByteLevel as ByteLevelDecoder;
use tokenizers::decoders::fuse::Fuse;
use tokenizers::decoders::sequence::Sequence as DecoderSequence;
use tokenizers::decoders::strip::Strip;
use tokenizers::decoders::DecoderWrapper;
use tokenizers::models::bpe::BPE;
use tokenizers::normalizers::replace::Replace;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::metaspace::{Metaspace, PrependScheme};
use tokenizers::pre_tokenizers::sequence::Sequence as PreSequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, SplitDelimiterBehavior, Tokenizer};

use crate::error::{ModelError, Result};
use crate::gguf::GgufFile;
use crate::safe::{escape as esc, quote};

/// Largest `tokenizer.json` read.
pub const MAX_TOKENIZER_BYTES: u64 = 256 << 20;

/// A model's tokenizer.
pub struct TextTokenizer {
    inner: Tokenizer,
    bos: Option<u32>,
    add_bos: bool,
    eos: Vec<u32>,
    source: String,
}

debug_summary!(TextTokenizer {
    "source": |s| &s.source,
    "bos": |s| &s.bos,
    "add_bos": |s| &s.add_bos,
});

const LLAMA3_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";
const QWEN2_SPLIT: &str = r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// The split regex transformers uses for a GGUF `tokenizer.ggml.pre` name
/// (`GGUF_PRE_TOKENIZER_SPLITS`), for the names of the architectures this
/// crate runs.
fn pre_split(name: &str) -> Option<&'static str> {
    match name {
        "llama3" | "llama-v3" | "llama-bpe" | "smaug-bpe" | "dbrx" | "falcon3" | "pixtral"
        | "lfm2" => Some(LLAMA3_SPLIT),
        "qwen2" | "deepseek-r1-qwen" | "megrez" => Some(QWEN2_SPLIT),
        _ => None,
    }
}

/// GPT-2's byte → printable character map (`bytes_to_unicode`).
fn bytes_to_unicode() -> [char; 256] {
    let mut map = ['\0'; 256];
    let mut n = 0u32;
    for b in 0..256u32 {
        let printable =
            (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || (0xae..=0xff).contains(&b);
        map[b as usize] = if printable {
            char::from_u32(b).unwrap_or('\0')
        } else {
            n += 1;
            char::from_u32(255 + n).unwrap_or('\0')
        };
    }
    map
}

fn strings(v: Option<&Value>, key: &str, path: &Path) -> Result<Option<Vec<String>>> {
    match v {
        None => Ok(None),
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| match x {
                Value::String(s) => Ok(s.clone()),
                _ => Err(ModelError::bad_file(
                    path,
                    format!("{key}: not a string array"),
                )),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some),
        Some(_) => Err(ModelError::bad_file(path, format!("{key}: not an array"))),
    }
}

fn ints(v: Option<&Value>) -> Vec<i64> {
    match v {
        Some(Value::Array(a)) => a
            .iter()
            .map(|x| match x {
                Value::I32(i) => *i as i64,
                Value::U32(i) => *i as i64,
                Value::I8(i) => *i as i64,
                Value::U8(i) => *i as i64,
                Value::I64(i) => *i,
                _ => 0,
            })
            .collect(),
        _ => Vec::new(),
    }
}

/// Refuses a GGUF tokenizer model that does not match its vocabulary's
/// spelling: byte-level BPE (`gpt2`) spells a space `Ġ` (U+0120),
/// SentencePiece (`llama`) spells it `▁` (U+2581). A vocabulary where the
/// other model's spelling is the more common one was written for it (read
/// with the wrong model it tokenizes, but every loss is wrong).
fn check_model_matches_vocabulary(model: &str, tokens: &[String], path: &Path) -> Result<()> {
    let byte_level = tokens.iter().filter(|t| t.contains('\u{120}')).count();
    let sentencepiece = tokens.iter().filter(|t| t.contains('\u{2581}')).count();
    let wrong = match model {
        "gpt2" => sentencepiece > byte_level,
        "llama" => byte_level > sentencepiece,
        _ => false,
    };
    if wrong {
        return Err(ModelError::Tokenizer(format!(
            "{}: tokenizer.ggml.model is {}, but the vocabulary is spelled for the other model ({byte_level} tokens with the byte-level space U+0120, {sentencepiece} with SentencePiece's U+2581)",
            crate::safe::path(path),
            quote(model)
        )));
    }
    Ok(())
}

fn tok_err(e: impl std::fmt::Display) -> ModelError {
    // The tokenizers crate quotes tokens from the file in its messages.
    ModelError::Tokenizer(esc(&e.to_string()))
}

impl TextTokenizer {
    /// Rebuilds the tokenizer stored in a GGUF file's metadata.
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] if the file has no vocabulary or a
    /// tokenizer model other than `gpt2` and `llama`.
    pub fn from_gguf(g: &GgufFile) -> Result<TextTokenizer> {
        let md = g.metadata();
        let path = g.path();
        let model = match md.get("tokenizer.ggml.model") {
            Some(Value::String(s)) => s.clone(),
            _ => {
                return Err(ModelError::Tokenizer(format!(
                    "{}: no tokenizer in the file (tokenizer.ggml.model); pass --tokenizer tokenizer.json",
                    crate::safe::path(path)
                )))
            }
        };
        let tokens = strings(
            md.get("tokenizer.ggml.tokens"),
            "tokenizer.ggml.tokens",
            path,
        )?
        .ok_or_else(|| {
            ModelError::Tokenizer(format!(
                "{}: no tokenizer.ggml.tokens",
                crate::safe::path(path)
            ))
        })?;
        let merges = strings(
            md.get("tokenizer.ggml.merges"),
            "tokenizer.ggml.merges",
            path,
        )?;
        let types = ints(md.get("tokenizer.ggml.token_type"));
        let pre = match md.get("tokenizer.ggml.pre") {
            Some(Value::String(s)) => Some(s.clone()),
            _ => None,
        };
        let id = |k: &str| -> Option<u32> {
            md.get(k).and_then(|v| {
                v.to_u32()
                    .ok()
                    .or_else(|| v.to_u64().ok().map(|x| x as u32))
            })
        };
        let bos = id("tokenizer.ggml.bos_token_id");
        let eos: Vec<u32> = id("tokenizer.ggml.eos_token_id").into_iter().collect();
        let explicit_bos = match md.get("tokenizer.ggml.add_bos_token") {
            Some(Value::Bool(b)) => Some(*b),
            _ => None,
        };
        let merges = |need: &str| -> Result<Vec<(String, String)>> {
            let m = merges.clone().ok_or_else(|| {
                ModelError::Tokenizer(format!(
                    "a {need} vocabulary without tokenizer.ggml.merges is not supported"
                ))
            })?;
            m.iter()
                .map(|s| {
                    s.split_once(' ')
                        .map(|(a, b)| (a.to_string(), b.to_string()))
                        .ok_or_else(|| {
                            ModelError::Tokenizer(format!(
                                "{}: tokenizer.ggml.merges: merge {} has no space (a merge is two tokens joined by a space)",
                                crate::safe::path(path),
                                quote(s)
                            ))
                        })
                })
                .collect()
        };
        check_model_matches_vocabulary(&model, &tokens, path)?;
        let (mut tk, add_bos, byte_alphabet) = match model.as_str() {
            "gpt2" => {
                let spell = bytes_to_unicode();
                let alphabet: std::collections::HashSet<char> = spell.iter().copied().collect();
                let mut vocab = tokenizers::models::bpe::Vocab::with_capacity(tokens.len());
                for (i, t) in tokens.iter().enumerate() {
                    let key = if t.chars().all(|c| alphabet.contains(&c)) {
                        t.clone()
                    } else {
                        t.bytes().map(|b| spell[b as usize]).collect()
                    };
                    vocab.insert(key, i as u32);
                }
                let bpe = BPE::builder()
                    .vocab_and_merges(vocab, merges("gpt2")?)
                    .fuse_unk(false)
                    .build()
                    .map_err(tok_err)?;
                let mut tk = Tokenizer::new(bpe);
                let pre: PreTokenizerWrapper = match pre.as_deref().and_then(pre_split) {
                    Some(re) => PreSequence::new(vec![
                        Split::new(
                            SplitPattern::Regex(re.to_string()),
                            SplitDelimiterBehavior::Isolated,
                            false,
                        )
                        .map_err(tok_err)?
                        .into(),
                        ByteLevel::new(false, true, false).into(),
                    ])
                    .into(),
                    None => ByteLevel::new(false, true, true).into(),
                };
                tk.with_pre_tokenizer(Some(pre));
                tk.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevelDecoder::default())));
                (tk, explicit_bos.unwrap_or(false), Some(alphabet))
            }
            "llama" => {
                let vocab: tokenizers::models::bpe::Vocab = tokens
                    .iter()
                    .enumerate()
                    .map(|(i, t)| (t.clone(), i as u32))
                    .collect();
                let mut b = BPE::builder()
                    .vocab_and_merges(vocab, merges("llama")?)
                    .fuse_unk(true)
                    .byte_fallback(true);
                if let Some(u) = id("tokenizer.ggml.unknown_token_id").and_then(|u| tokens.get(u as usize)) {
                    b = b.unk_token(u.clone());
                }
                let mut tk = Tokenizer::new(b.build().map_err(tok_err)?);
                tk.with_pre_tokenizer(Some(PreTokenizerWrapper::Metaspace(Metaspace::new(
                    '▁',
                    PrependScheme::First,
                    false,
                ))));
                tk.with_decoder(Some(DecoderWrapper::Sequence(DecoderSequence::new(vec![
                    DecoderWrapper::Replace(Replace::new("▁", " ").map_err(tok_err)?),
                    DecoderWrapper::ByteFallback(ByteFallback::new()),
                    DecoderWrapper::Fuse(Fuse::new()),
                    DecoderWrapper::Strip(Strip::new(' ', 1, 0)),
                ]))));
                (tk, explicit_bos.unwrap_or(true), None)
            }
            other => {
                return Err(ModelError::Tokenizer(format!(
                    "tokenizer model {} in the GGUF is not supported (gpt2, llama); pass --tokenizer tokenizer.json",
                    quote(other)
                )))
            }
        };
        let spelled = |t: &str| {
            byte_alphabet
                .as_ref()
                .is_none_or(|a| t.chars().all(|c| a.contains(&c)))
        };
        let control: Vec<AddedToken> = tokens
            .iter()
            .zip(types.iter().chain(std::iter::repeat(&0)))
            .filter(|(t, ty)| **ty == 3 && spelled(t))
            .map(|(t, _)| AddedToken::from(t.clone(), true).normalized(false))
            .collect();
        if !control.is_empty() {
            tk.add_special_tokens(control).map_err(tok_err)?;
        }
        let user: Vec<AddedToken> = tokens
            .iter()
            .zip(types.iter().chain(std::iter::repeat(&0)))
            .filter(|(_, ty)| **ty == 4)
            .map(|(t, _)| AddedToken::from(t.clone(), false).normalized(false))
            .collect();
        if !user.is_empty() {
            tk.add_tokens(user).map_err(tok_err)?;
        }
        let tk = TextTokenizer {
            inner: tk,
            bos,
            add_bos: add_bos && bos.is_some(),
            eos,
            source: format!(
                "GGUF ({model}{})",
                pre.map(|p| format!(", pre-tokenizer {}", esc(&p)))
                    .unwrap_or_default()
            ),
        };
        if let Some((dims, _)) = g.tensor_info("token_embd.weight") {
            tk.check_model_vocab(dims.first().copied().unwrap_or(0))?;
        }
        Ok(tk)
    }

    /// Checks this tokenizer against a model of `rows` embedding rows: it
    /// must not know more tokens than there are rows (its ids would fall
    /// outside the embedding), nor far fewer (the model would generate ids
    /// it cannot decode): at least `rows − max(1024, rows/16)` (checkpoints
    /// pad their embedding rows by a few hundred at most).
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] saying both sizes.
    pub fn check_model_vocab(&self, rows: usize) -> Result<()> {
        let n = self.vocab_size();
        let slack = (rows / 16).max(1024);
        if n > rows || n.saturating_add(slack) < rows {
            return Err(ModelError::Tokenizer(format!(
                "{}: {n} tokens for a model of {rows} embedding rows: the tokenizer of another model",
                self.source
            )));
        }
        Ok(())
    }

    /// Reads a `tokenizer.json`; `add_bos_token` and the special tokens come
    /// from `tokenizer_config.json` beside it when there is one, else from
    /// the tokenizer's own post-processor.
    ///
    /// # Errors
    /// [`ModelError::Io`] / [`ModelError::Tokenizer`] for a missing, too
    /// large or invalid file.
    pub fn from_file(path: &Path) -> Result<TextTokenizer> {
        let bytes = crate::fsio::read_bounded(path, MAX_TOKENIZER_BYTES)?;
        Self::from_bytes(&bytes, crate::safe::path(path))
    }

    /// A `tokenizer.json` given as its text, as [`from_file`](Self::from_file)
    /// reads one from a file (no file is written); `source` names it in
    /// errors.
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] for a text over [`MAX_TOKENIZER_BYTES`] or
    /// one the `tokenizers` crate cannot read.
    pub fn from_json(json: &str, source: &str) -> Result<TextTokenizer> {
        let source = esc(source);
        if json.len() as u64 > MAX_TOKENIZER_BYTES {
            return Err(ModelError::Tokenizer(format!(
                "{source}: {} bytes is over the {MAX_TOKENIZER_BYTES}-byte limit",
                json.len()
            )));
        }
        Self::from_bytes(json.as_bytes(), source)
    }

    fn from_bytes(bytes: &[u8], source: String) -> Result<TextTokenizer> {
        let inner = Tokenizer::from_bytes(bytes)
            .map_err(|e| ModelError::Tokenizer(format!("{source}: {}", esc(&e.to_string()))))?;
        Ok(TextTokenizer {
            inner,
            bos: None,
            add_bos: false,
            eos: Vec::new(),
            source,
        })
    }

    /// Sets the BOS and EOS ids from the model's config where the tokenizer
    /// does not know them.
    pub fn with_config_ids(mut self, bos: Option<u32>, eos: &[u32]) -> Self {
        if self.bos.is_none() {
            self.bos = bos;
        }
        if self.eos.is_empty() {
            self.eos = eos.to_vec();
        }
        self
    }

    /// The token ids of `text`, as the model's tokenizer gives them by
    /// default (a BOS first if the file asks for one).
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] from the tokenizer.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>> {
        let enc = self.inner.encode(text, true).map_err(tok_err)?;
        let mut ids = Vec::with_capacity(enc.len() + 1);
        if self.add_bos {
            ids.extend(self.bos);
        }
        ids.extend_from_slice(enc.get_ids());
        Ok(ids)
    }

    /// The text of `ids` (special tokens kept).
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] from the tokenizer.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        self.inner.decode(ids, false).map_err(tok_err)
    }

    /// The end-of-sequence ids.
    pub fn eos(&self) -> &[u32] {
        &self.eos
    }

    /// Whether a BOS token is prepended.
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// Where the tokenizer came from.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The number of tokens the tokenizer knows (added tokens included).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }

    /// The tokenizer as a Hugging Face `tokenizer.json` (the `tokenizers`
    /// crate's serialisation, pretty-printed): how posenc-tune writes a
    /// GGUF model's own tokenizer beside a merged safetensors checkpoint.
    /// Whether a BOS token is prepended is the model's config's business
    /// (`bos_token_id`), not this file's.
    ///
    /// # Errors
    /// [`ModelError::Tokenizer`] from the serialiser.
    pub fn to_json(&self) -> Result<String> {
        self.inner.to_string(true).map_err(tok_err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A word-level `tokenizer.json`: `w0`..`w9`, `[UNK]`.
    fn words_json() -> String {
        let mut vocab = serde_json::Map::new();
        for i in 0..10u32 {
            vocab.insert(format!("w{i}"), i.into());
        }
        vocab.insert("[UNK]".into(), 10.into());
        serde_json::json!({
            "version": "1.0", "truncation": null, "padding": null, "added_tokens": [],
            "normalizer": null, "pre_tokenizer": {"type": "WhitespaceSplit"},
            "post_processor": null, "decoder": null,
            "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"}
        })
        .to_string()
    }

    #[test]
    fn a_tokenizer_json_text_reads_as_its_file_does() {
        let t = TextTokenizer::from_json(&words_json(), "words").unwrap();
        assert_eq!(t.encode("w3 w1 x w9").unwrap(), vec![3, 1, 10, 9]);
        assert_eq!(t.vocab_size(), 11);
        assert_eq!(t.source(), "words");
        // The same tokenizer written back reads the same.
        let again = TextTokenizer::from_json(&t.to_json().unwrap(), "again").unwrap();
        assert_eq!(again.encode("w3 w1 x w9").unwrap(), vec![3, 1, 10, 9]);
    }

    #[test]
    fn a_bad_tokenizer_json_text_names_its_source_on_one_line() {
        for bad in ["", "{", "{\"model\": 3}", "[1, 2]"] {
            let Err(e) = TextTokenizer::from_json(bad, "the\nmodel's tokenizer") else {
                panic!("{bad:?} was read as a tokenizer");
            };
            let msg = e.to_string();
            assert!(matches!(e, ModelError::Tokenizer(_)), "{msg}");
            assert!(
                msg.starts_with("tokenizer: the\\nmodel's tokenizer: "),
                "{msg}"
            );
            assert!(!msg.contains('\n'), "{msg}");
        }
    }
}
