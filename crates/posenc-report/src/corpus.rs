//! The text the language-model and masked-language-model experiments read:
//! by default Jane Austen's *Pride and Prejudice* (built into the binary,
//! from `assets/corpus/`), the lab's synthetic grammar on request, or any
//! UTF-8 file (`posenc report --corpus FILE`). The lab trains on the first
//! 90% of it and the report evaluates on the last 10% only
//! ([`posenc_lab::tasks::Split`]).

use std::path::{Path, PathBuf};

use posenc_lab::bpe::Tokenization;
use posenc_lab::tasks::{Corpus, Split, Task, TaskKind};
use serde::Serialize;

use crate::{ReportError, Result};

/// *Pride and Prejudice*, the default text (posenc-run's, which the
/// pretrained-model probes and fine-tuning read too).
pub use posenc_run::PRIDE_AND_PREJUDICE;

/// The preset name of the default text.
pub const DEFAULT: &str = "pride-and-prejudice";

/// The preset name of the lab's synthetic grammar.
pub const GRAMMAR: &str = "grammar";

/// The largest corpus file read (bytes), checked before reading.
pub const MAX_FILE_BYTES: u64 = 256 << 20;

/// FNV-1a, 64 bits: the cache keys (the lab's, so one hash names a text
/// in both caches).
pub use posenc_lab::bpe::fnv;

/// The text experiments' corpus, resolved: what it is, its hash (part of
/// every text run's cache key) and its sizes.
#[derive(Debug, Clone, Serialize)]
pub struct TextCorpus {
    /// `pride-and-prejudice`, `grammar`, or the file's name.
    pub name: String,
    /// Where it came from, in words.
    pub origin: String,
    /// FNV-1a of its bytes (16 hex digits; `grammar` for the generated
    /// grammar, whose text the lab's source determines).
    pub hash: String,
    /// Characters (= tokens).
    pub chars: usize,
    /// Distinct characters (the vocabulary).
    pub distinct: usize,
    /// Characters of the training part (the first 90%).
    pub train_chars: usize,
    /// Characters of the validation part (the last 10%).
    pub validation_chars: usize,
    /// Unigram entropy of the text in nats: the loss of a model that
    /// ignores the context.
    pub unigram_entropy: f64,
    /// The copy the lab reads (under the report's cache), `None` for the
    /// grammar.
    #[serde(skip)]
    pub file: Option<PathBuf>,
}

impl TextCorpus {
    /// Resolves the preset's `corpus` (`pride-and-prejudice`, `grammar` or a
    /// file path), or `file` when given (`--corpus`), writing the text the
    /// lab reads under `cache/corpus/`.
    ///
    /// # Errors
    /// A file that cannot be read, is larger than [`MAX_FILE_BYTES`], is not
    /// UTF-8, or that the lab cannot tokenise (too short; more distinct
    /// characters than its vocabulary holds).
    pub fn resolve(preset_corpus: &str, file: Option<&Path>, cache: &Path) -> Result<Self> {
        let (name, origin, text) = match (file, preset_corpus) {
            (None, GRAMMAR) => {
                let task = Task::new(TaskKind::Lm, 8)?;
                let c = task.corpus().expect("lm reads a corpus");
                return Ok(Self::describe(
                    GRAMMAR,
                    "the lab's synthetic grammar (built in)",
                    "grammar".into(),
                    c,
                    None,
                ));
            }
            (None, DEFAULT) => (
                DEFAULT.to_string(),
                "Jane Austen, Pride and Prejudice (built in: assets/corpus/pride-and-prejudice.txt)"
                    .to_string(),
                PRIDE_AND_PREJUDICE.to_string(),
            ),
            (Some(path), _) => read_file(path)?,
            (None, path) => read_file(Path::new(path))?,
        };
        let hash = format!("{:016x}", fnv(text.as_bytes()));
        let corpus =
            Corpus::from_text(&text).map_err(|e| ReportError(format!("corpus {name}: {e}")))?;
        let dir = cache.join("corpus");
        std::fs::create_dir_all(&dir)
            .map_err(|e| ReportError(format!("cannot create {}: {e}", dir.display())))?;
        let dir = dir.canonicalize()?;
        let path = dir.join(format!("{hash}.txt"));
        if std::fs::read(&path).ok().as_deref() != Some(text.as_bytes()) {
            posenc_lab::train::write_atomic(&path, text.as_bytes())?;
        }
        Ok(Self::describe(&name, &origin, hash, &corpus, Some(path)))
    }

    fn describe(name: &str, origin: &str, hash: String, c: &Corpus, file: Option<PathBuf>) -> Self {
        TextCorpus {
            name: name.into(),
            origin: origin.into(),
            hash,
            chars: c.tokens.len(),
            distinct: c.vocab.len(),
            train_chars: c.part(Split::Train).len(),
            validation_chars: c.part(Split::Validation).len(),
            unigram_entropy: c.unigram_entropy(),
            file,
        }
    }

    /// The text under `tokens`: its vocabulary, token counts and unigram
    /// baseline in that tokenization (the lab's own corpus, so the same
    /// tokenizer the runs train with: [`Corpus::with_tokens`]).
    ///
    /// # Errors
    /// The file cannot be read again, or the lab cannot tokenise it (a text
    /// too short for the BPE vocabulary asked for).
    pub fn tokenized(&self, tokens: Tokenization) -> Result<Tokenized> {
        let task = match &self.file {
            Some(f) => {
                let text = std::fs::read_to_string(f)
                    .map_err(|e| ReportError(format!("cannot read corpus {}: {e}", f.display())))?;
                Task::from_text_with_tokens(TaskKind::Lm, &text, tokens)
            }
            None => Task::new_with_tokens(TaskKind::Lm, 8, tokens),
        }
        .map_err(|e| {
            ReportError(format!(
                "corpus {} with tokens {}: {e}",
                self.name,
                tokens.label()
            ))
        })?;
        let c = task.corpus().expect("lm reads a corpus");
        Ok(Tokenized {
            tokens: tokens.label(),
            vocab: c.vocab.len(),
            train_tokens: c.part(Split::Train).len(),
            validation_tokens: c.part(Split::Validation).len(),
            chars_per_token: c.chars_per_token(),
            unigram_entropy: c.unigram_entropy(),
            unigram_bits_per_char: c.unigram_bits_per_char(),
        })
    }

    /// One sentence for the experiments' text.
    pub fn description(&self) -> String {
        format!(
            "{} — {} characters, {} distinct; the models train on the first 90% ({} characters) and are evaluated on windows of the last 10% ({} characters) only, never trained on",
            self.origin, self.chars, self.distinct, self.train_chars, self.validation_chars
        )
    }

    /// Checks that the validation part holds the longest window a preset
    /// evaluates.
    pub fn check_window(&self, longest: usize) -> Result {
        if longest > self.validation_chars {
            return Err(ReportError(format!(
                "corpus {}: its validation part (the last 10%, {} characters) is shorter than the longest window the preset evaluates ({longest} characters); use a longer text",
                self.name, self.validation_chars
            )));
        }
        Ok(())
    }
}

/// The report's text under one tokenization.
#[derive(Debug, Clone, Serialize)]
pub struct Tokenized {
    /// `chars` or `bpe:N`.
    pub tokens: String,
    /// Vocabulary size.
    pub vocab: usize,
    /// Tokens of the training part.
    pub train_tokens: usize,
    /// Tokens of the validation part.
    pub validation_tokens: usize,
    /// Characters per token over the text.
    pub chars_per_token: f64,
    /// Unigram entropy, nats per token: the loss of a model that ignores
    /// the context, in this tokenization.
    pub unigram_entropy: f64,
    /// The same baseline in bits per character (comparable across
    /// tokenizations).
    pub unigram_bits_per_char: f64,
}

/// Reads a UTF-8 file, bounded in size before it is read.
fn read_file(path: &Path) -> Result<(String, String, String)> {
    let shown = path.display();
    let meta = std::fs::metadata(path)
        .map_err(|e| ReportError(format!("cannot read corpus {shown}: {e}")))?;
    if !meta.is_file() {
        return Err(ReportError(format!("corpus {shown} is not a file")));
    }
    if meta.len() > MAX_FILE_BYTES {
        return Err(ReportError(format!(
            "corpus {shown} has {} bytes; at most {MAX_FILE_BYTES} are read",
            meta.len()
        )));
    }
    let bytes =
        std::fs::read(path).map_err(|e| ReportError(format!("cannot read corpus {shown}: {e}")))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| ReportError(format!("corpus {shown} is not UTF-8 text: {e}")))?;
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| shown.to_string());
    Ok((name, format!("the file {shown}"), text))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh directory under the system's temporary one, removed when
    /// dropped (a failed test leaves nothing behind either).
    fn scratch(name: &str) -> tempfile::TempDir {
        tempfile::Builder::new()
            .prefix(&format!("posenc-corpus-{name}-"))
            .tempdir()
            .unwrap()
    }

    #[test]
    fn the_default_text_is_pride_and_prejudice() {
        let tmp = scratch("default");
        let cache = &tmp.path().join("cache");
        let c = TextCorpus::resolve(DEFAULT, None, cache).unwrap();
        assert_eq!(c.chars, 684_768);
        assert_eq!(c.distinct, 75);
        assert_eq!(c.train_chars + c.validation_chars, c.chars);
        assert_eq!(c.validation_chars, 68_477);
        let file = c.file.clone().unwrap();
        assert_eq!(std::fs::read_to_string(&file).unwrap(), PRIDE_AND_PREJUDICE);
        assert!(file.ends_with(format!("{}.txt", c.hash)));
        // English text: between 2 and ln 75 nats per character.
        assert!(c.unigram_entropy > 2.0 && c.unigram_entropy < 75f64.ln());
        assert!(c.check_window(129).is_ok());
        assert!(c.check_window(68_478).is_err());
        let g = TextCorpus::resolve(GRAMMAR, None, cache).unwrap();
        assert_eq!(g.hash, "grammar");
        assert!(g.file.is_none());
    }

    #[test]
    fn a_file_is_hashed_and_checked() {
        let tmp = scratch("file");
        let cache = &tmp.path().join("cache");
        std::fs::create_dir_all(cache).unwrap();
        let ru = cache.join("ru.txt");
        std::fs::write(
            &ru,
            "Позиционное кодирование: каждой позиции свой вектор. ".repeat(40),
        )
        .unwrap();
        let a = TextCorpus::resolve(DEFAULT, Some(&ru), cache).unwrap();
        assert_eq!(a.name, "ru.txt");
        std::fs::write(
            &ru,
            "Позиционное кодирование: каждой позиции свой вектор! ".repeat(40),
        )
        .unwrap();
        let b = TextCorpus::resolve(DEFAULT, Some(&ru), cache).unwrap();
        // A changed file is a new cache key.
        assert_ne!(a.hash, b.hash);
        let bad = cache.join("latin1.txt");
        std::fs::write(&bad, [b'a', 0xE9, b'b']).unwrap();
        let e = TextCorpus::resolve(DEFAULT, Some(&bad), cache).unwrap_err();
        assert!(e.0.contains("not UTF-8"), "{e}");
        let e = TextCorpus::resolve(DEFAULT, Some(&cache.join("missing.txt")), cache).unwrap_err();
        assert!(e.0.contains("cannot read corpus"), "{e}");
        let short = cache.join("short.txt");
        std::fs::write(&short, "too short").unwrap();
        let e = TextCorpus::resolve(DEFAULT, Some(&short), cache).unwrap_err();
        assert!(e.0.contains("too short"), "{e}");
    }
}
