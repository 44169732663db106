//! Bounded, special-file-safe input: every file a run is given (model,
//! config, tokenizer, text, prompt) is checked by its type before it is
//! opened, opened without blocking, and read only as far as the run needs.
//!
//! - **Special files** — FIFOs, character and block devices, sockets, and
//!   directories where a file is expected — are refused by their type
//!   (from `stat`, before any `open`); files are then opened with
//!   `O_NONBLOCK` and checked again on the open descriptor, so a path
//!   swapped for a FIFO in between cannot block either
//!   ([`open_regular`]; the reading of one file is the leaf module
//!   [`crate::fsio`], re-exported here).
//! - **Texts** are read and tokenized incrementally ([`text_tokens`]): a
//!   prefix is read, cut at a word boundary and tokenized, growing until it
//!   holds the window and two successive prefixes agree on the window's
//!   tokens, so a window of 64 tokens reads a few kilobytes of a novel of
//!   any size, and the tokens are those of the whole text's tokenization.
//! - **Prompts** have a stated cap, [`MAX_PROMPT_TOKENS`] tokens from a
//!   file of at most [`MAX_PROMPT_BYTES`] bytes, checked before any
//!   prefill ([`prompt_tokens`]).
//! - **The first forward pass** is checked for non-finite logits, naming
//!   the first layer whose output is not finite
//!   ([`check_first_forward`]).

use std::fs::File;
use std::io::Read;
use std::path::Path;

use posenc::tensor::rope::Rope;

use crate::error::{ModelError, Result};
pub use crate::fsio::{check_model_path, check_regular, open_regular, read_bounded};
use crate::llama::Decoder;
use crate::tokenizer::TextTokenizer;

/// Most prompt tokens `generate` runs (2^17): a prompt with more is refused
/// before the prefill, naming this cap (keep its end with
/// `--prompt-tokens N`).
pub const MAX_PROMPT_TOKENS: usize = 1 << 17;

/// Largest prompt file read (8 MiB).
pub const MAX_PROMPT_BYTES: u64 = 8 << 20;

/// A text prefix that needs more than this many bytes per token of the
/// window is refused instead of being read further (natural text needs 3
/// to 6).
pub const MAX_BYTES_PER_TOKEN: u64 = 256;

/// Tokens of the first forward pass checked by [`check_first_forward`].
pub const FIRST_FORWARD_TOKENS: usize = 16;

/// First prefix read by [`text_tokens`], bytes.
const FIRST_PREFIX: usize = 4096;

/// Tokens beyond the window a prefix must hold before its first tokens
/// are trusted (those near the cut may change once more text follows).
const MARGIN: usize = 64;

/// Reads more of `file` into `buf` until it holds `target` bytes; `true`
/// at the end of the file.
fn fill(file: &mut File, buf: &mut Vec<u8>, target: usize, path: &Path) -> Result<bool> {
    let want = target.saturating_sub(buf.len());
    if want == 0 {
        return Ok(false);
    }
    let n = file
        .take(want as u64)
        .read_to_end(buf)
        .map_err(|e| ModelError::io(path, e))?;
    Ok(n < want)
}

/// Where a prefix of `text` (which more text follows) can be cut without
/// changing the tokens before the cut: before a space that follows a
/// non-space (a word boundary for byte-level BPE's split regexes, for
/// SentencePiece's `▁` and for whitespace splitting), else after a newline
/// between two non-spaces, else at the end (the agreement of two prefixes
/// in [`text_tokens`] is then the only guard).
fn cut_point(text: &str) -> usize {
    let b = text.as_bytes();
    let ws = |c: u8| c.is_ascii_whitespace();
    if let Some(i) = (1..b.len()).rev().find(|&i| b[i] == b' ' && !ws(b[i - 1])) {
        return i;
    }
    if let Some(i) = (1..b.len().saturating_sub(1))
        .rev()
        .find(|&i| b[i] == b'\n' && !ws(b[i - 1]) && !ws(b[i + 1]))
    {
        return i + 1;
    }
    text.len()
}

/// The valid UTF-8 text at the start of `buf`: at the end of the file it
/// must all be valid; before it, a character cut by the read is left for
/// the next one.
fn utf8_prefix<'a>(buf: &'a [u8], eof: bool, path: &Path) -> Result<&'a str> {
    match std::str::from_utf8(buf) {
        Ok(s) => Ok(s),
        Err(e) if e.error_len().is_none() && !eof => {
            // A character cut by the end of the read: valid up to it.
            Ok(std::str::from_utf8(&buf[..e.valid_up_to()]).unwrap_or_default())
        }
        Err(e) => Err(ModelError::Invalid(format!(
            "{}: not UTF-8 text (invalid byte at offset {})",
            path.display(),
            e.valid_up_to()
        ))),
    }
}

/// The first tokens of the text file at `path`: exactly the first `need`
/// tokens of the whole text's tokenization when it has that many, else all
/// of its tokens. Only as much of the file is read and tokenized as the
/// window needs (see the module's documentation); the file is refused if
/// it is not a regular file, is over [`crate::MAX_TEXT_BYTES`], is not
/// UTF-8 where read, or needs more than [`MAX_BYTES_PER_TOKEN`] bytes per
/// token of the window.
///
/// # Errors
/// [`ModelError::Io`], [`ModelError::NotAFile`], [`ModelError::Invalid`],
/// [`ModelError::Tokenizer`].
pub fn text_tokens(path: &Path, tk: &TextTokenizer, need: usize) -> Result<Vec<u32>> {
    prefix_tokens(path, tk, need, crate::MAX_TEXT_BYTES)
}

fn prefix_tokens(path: &Path, tk: &TextTokenizer, need: usize, max: u64) -> Result<Vec<u32>> {
    let (mut file, len) = open_regular(path)?;
    if len > max {
        return Err(ModelError::Invalid(format!(
            "{}: {len} bytes is over the {max}-byte limit",
            path.display()
        )));
    }
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    let byte_budget = (need as u64)
        .saturating_mul(MAX_BYTES_PER_TOKEN)
        .saturating_add(1 << 20);
    let mut buf: Vec<u8> = Vec::new();
    let mut target = FIRST_PREFIX.max(need.saturating_mul(8)).min(max);
    let mut previous: Option<Vec<u32>> = None;
    loop {
        let eof = fill(&mut file, &mut buf, target.min(max.saturating_add(1)), path)?;
        if buf.len() > max {
            return Err(ModelError::Invalid(format!(
                "{}: over the {max}-byte limit",
                path.display()
            )));
        }
        let text = utf8_prefix(&buf, eof, path)?;
        if eof {
            return tk.encode(text);
        }
        let mut ids = tk.encode(&text[..cut_point(text)])?;
        if ids.len() >= need.saturating_add(MARGIN) {
            if previous.as_ref().is_some_and(|p| p[..need] == ids[..need]) {
                ids.truncate(need);
                return Ok(ids);
            }
            previous = Some(ids);
        } else if buf.len() as u64 >= byte_budget {
            return Err(ModelError::Invalid(format!(
                "{}: its first {} bytes give only {} tokens, fewer than one per {MAX_BYTES_PER_TOKEN} bytes of the window of {need}; refused rather than read further",
                path.display(),
                buf.len(),
                ids.len()
            )));
        }
        target = target.saturating_mul(2);
    }
}

/// Where a prompt comes from.
#[derive(Debug, Clone, Copy)]
pub enum Prompt<'a> {
    /// Given as text.
    Text(&'a str),
    /// A UTF-8 file.
    File(&'a Path),
}

/// The token ids of a prompt, its last `keep_last` only if given, refused
/// over [`MAX_PROMPT_TOKENS`] (naming the cap) before anything runs. A
/// prompt file must be a regular file of at most [`MAX_PROMPT_BYTES`];
/// without `keep_last` it is tokenized only until it passes the cap.
///
/// # Errors
/// [`ModelError::Invalid`] for a prompt over the cap, `keep_last` of 0 or
/// over the cap, or a file that is not UTF-8; the errors of
/// [`open_regular`] and of the tokenizer.
pub fn prompt_tokens(
    tk: &TextTokenizer,
    prompt: Prompt<'_>,
    keep_last: Option<usize>,
) -> Result<Vec<u32>> {
    if let Some(n) = keep_last {
        if n == 0 || n > MAX_PROMPT_TOKENS {
            return Err(ModelError::Invalid(format!(
                "--prompt-tokens must be in 1..={MAX_PROMPT_TOKENS} (the cap on prompt tokens)"
            )));
        }
    }
    let mut ids = match (prompt, keep_last) {
        (Prompt::Text(s), _) => tk.encode(s)?,
        (Prompt::File(p), Some(_)) => {
            let bytes = read_bounded(p, MAX_PROMPT_BYTES)?;
            tk.encode(utf8_prefix(&bytes, true, p)?)?
        }
        (Prompt::File(p), None) => prefix_tokens(p, tk, MAX_PROMPT_TOKENS + 1, MAX_PROMPT_BYTES)?,
    };
    if let Some(n) = keep_last {
        let skip = ids.len().saturating_sub(n);
        ids.drain(..skip);
    }
    if ids.len() > MAX_PROMPT_TOKENS {
        return Err(ModelError::Invalid(format!(
            "the prompt has more than {MAX_PROMPT_TOKENS} tokens, the cap on prompt tokens (MAX_PROMPT_TOKENS); keep its end with --prompt-tokens N"
        )));
    }
    Ok(ids)
}

fn all_finite(x: &[f32]) -> bool {
    x.iter().all(|v| v.is_finite())
}

/// Runs the first [`FIRST_FORWARD_TOKENS`] of `tokens` through `model` and
/// checks that every hidden state and logit is finite. If one is not, the
/// first layer whose output is not finite is found by running the first
/// `k` layers alone (`reload(k)` loads the model with `k` layers; a
/// bisection over `k`) and named in the error.
///
/// # Errors
/// [`ModelError::NonFinite`] naming the layer (or the output projection);
/// the errors of the forward pass and of `reload`.
pub fn check_first_forward(
    model: &Decoder,
    tokens: &[u32],
    rope: &Rope,
    reload: &mut dyn FnMut(usize) -> Result<Decoder>,
) -> Result<()> {
    let n = tokens.len().min(FIRST_FORWARD_TOKENS);
    if n == 0 {
        return Ok(());
    }
    let finite_output = |m: &Decoder| -> Result<bool> {
        let h = m.hidden_states(&tokens[..n], rope, None)?;
        Ok(all_finite(&h))
    };
    let h = model.hidden_states(&tokens[..n], rope, None)?;
    if all_finite(&h) {
        if all_finite(&model.logits(&h, n)?) {
            return Ok(());
        }
        return Err(ModelError::NonFinite(
            "non-finite logits in the first forward pass: every layer's output is finite, the output projection (lm_head or the tied embedding) overflows".into(),
        ));
    }
    let layers = model.config().num_layers;
    // The smallest k whose first k layers give a non-finite output.
    let (mut lo, mut hi) = (1usize, layers);
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        if finite_output(&reload(mid)?)? {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    let l = lo - 1;
    Err(ModelError::NonFinite(format!(
        "non-finite logits in the first forward pass: layer {l} (GGUF blk.{l}, Hugging Face model.layers.{l}) is the first whose output is not finite"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cuts_before_a_space_that_ends_a_word() {
        assert_eq!(cut_point("one two  three"), 7);
        assert_eq!(cut_point("a\nb"), 2);
        assert_eq!(cut_point("abc"), 3);
    }
}
