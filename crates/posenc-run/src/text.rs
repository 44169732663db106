//! Texts tokenized in pieces, in bounded memory: `--held-out`'s window is
//! found without holding the whole text's tokens.
//!
//! A file is read in pieces of about [`PIECE_BYTES`], each cut before a
//! space that follows a non-space (a word boundary for byte-level BPE's
//! split patterns and SentencePiece's `▁`), and each piece tokenized on its
//! own; the pieces' tokens, the leading special tokens of every piece but
//! the first dropped, are the whole text's (a test holds this on the real
//! model's tokenizer and the novel). A first pass counts the tokens and
//! notes where each piece starts; the second tokenizes again only from the
//! piece that holds the held-out part's first token, until the window is
//! full. Memory: one piece and its tokens, and the window.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

use posenc_models::{input, TextTokenizer};

use crate::{Result, RunError};

/// Bytes of a piece (more when no word boundary falls in it).
pub const PIECE_BYTES: usize = 1 << 20;

fn io(path: &Path, source: std::io::Error) -> RunError {
    posenc_models::ModelError::Io {
        path: path.to_path_buf(),
        source,
    }
    .into()
}

/// The fraction of tokens held out (posenc-tune's: the last 10%, rounded
/// up, at least one token).
fn split_point(n: usize) -> usize {
    let valid = ((n as f64 * 0.1).ceil() as usize).clamp(1, n.saturating_sub(1).max(1));
    n - valid
}

/// Where a piece that more text follows can end: before a space that
/// follows a non-space (the last one), else nowhere.
fn cut(b: &[u8]) -> Option<usize> {
    (1..b.len())
        .rev()
        .find(|&i| b[i] == b' ' && !b[i - 1].is_ascii_whitespace())
}

/// The ids the tokenizer adds to any text (`encode("")`): stripped from
/// every piece but the first. `None` when they are not a prefix of a
/// word's encoding (a template that appends tokens): pieces cannot be
/// joined then.
fn added_prefix(tk: &TextTokenizer) -> Result<Option<Vec<u32>>> {
    let empty = tk.encode("")?;
    let word = tk.encode("the")?;
    Ok(word.starts_with(&empty).then_some(empty))
}

/// Calls `f(offset, ids)` for each piece of the file from byte `start`
/// (a piece boundary), in order, until `f` answers `false`; `first` when
/// `start` is the file's start (its added ids kept).
fn pieces(
    path: &Path,
    tk: &TextTokenizer,
    prefix: &[u32],
    start: u64,
    piece: usize,
    f: &mut dyn FnMut(u64, Vec<u32>) -> bool,
) -> Result<()> {
    let (mut file, len): (File, u64) = input::open_regular(path)?;
    if len > posenc_models::MAX_TEXT_BYTES {
        return Err(RunError::Invalid(format!(
            "{}: {len} bytes is over the {}-byte limit",
            path.display(),
            posenc_models::MAX_TEXT_BYTES
        )));
    }
    file.seek(SeekFrom::Start(start)).map_err(|e| io(path, e))?;
    let mut buf: Vec<u8> = Vec::new();
    let mut offset = start;
    let mut eof = false;
    loop {
        while !eof && buf.len() < piece {
            let want = piece - buf.len();
            let n = (&mut file)
                .take(want as u64)
                .read_to_end(&mut buf)
                .map_err(|e| io(path, e))?;
            eof = n < want;
        }
        if buf.is_empty() {
            return Ok(());
        }
        let end = if eof {
            buf.len()
        } else {
            match cut(&buf) {
                Some(i) => i,
                None if buf.len() as u64 >= posenc_models::MAX_TEXT_BYTES => buf.len(),
                None => {
                    // No word boundary yet: read a larger piece.
                    let more = buf.len();
                    let n = (&mut file)
                        .take(more as u64)
                        .read_to_end(&mut buf)
                        .map_err(|e| io(path, e))?;
                    eof = n < more;
                    continue;
                }
            }
        };
        let text = std::str::from_utf8(&buf[..end]).map_err(|e| {
            RunError::Invalid(format!(
                "{}: not UTF-8 text (invalid byte at offset {})",
                posenc_models::safe::path(path),
                offset + e.valid_up_to() as u64
            ))
        })?;
        let mut ids = tk.encode(text)?;
        if offset > 0 && ids.starts_with(prefix) {
            ids.drain(..prefix.len());
        }
        if !f(offset, ids) {
            return Ok(());
        }
        offset += end as u64;
        buf.drain(..end);
        if eof && buf.is_empty() {
            return Ok(());
        }
    }
}

/// The first `length` tokens of the held-out part (the last 10% of the
/// tokens) of the text file at `path`, found in bounded memory (see the
/// module's documentation); `None` when the tokenizer adds tokens that
/// pieces cannot be joined with (the caller tokenizes the text whole).
///
/// # Errors
/// The file's and the tokenizer's; `--held-out` with fewer than `length`
/// held-out tokens.
pub fn held_out_window(
    path: &Path,
    tk: &TextTokenizer,
    length: usize,
    piece: usize,
) -> Result<Option<Vec<u32>>> {
    let Some(prefix) = added_prefix(tk)? else {
        return Ok(None);
    };
    let mut starts: Vec<(u64, usize)> = Vec::new();
    let mut total = 0usize;
    pieces(path, tk, &prefix, 0, piece, &mut |off, ids| {
        starts.push((off, total));
        total += ids.len();
        true
    })?;
    let split = split_point(total);
    let tail = total - split;
    if tail < length {
        return Err(RunError::Invalid(format!(
            "--held-out: the text's last 10% is {tail} tokens, fewer than --length {length}"
        )));
    }
    let (off, before) = starts
        .iter()
        .rev()
        .find(|(_, before)| *before <= split)
        .copied()
        .unwrap_or((0, 0));
    let mut window: Vec<u32> = Vec::with_capacity(length);
    let mut at = before;
    pieces(path, tk, &prefix, off, piece, &mut |_, ids| {
        let from = split.saturating_sub(at).min(ids.len());
        let take = (length - window.len()).min(ids.len() - from);
        window.extend_from_slice(&ids[from..from + take]);
        at += ids.len();
        window.len() < length
    })?;
    Ok(Some(window))
}

/// Every token of the text file at `path`, tokenized in pieces (see the
/// module's documentation): only the ids are held whole (4 bytes a token),
/// never the tokenizer's work on the whole text (tens of bytes a token).
/// `None` as [`held_out_window`]'s (the caller tokenizes the text whole).
///
/// # Errors
/// The file's and the tokenizer's.
pub fn all_tokens(path: &Path, tk: &TextTokenizer) -> Result<Option<Vec<u32>>> {
    let Some(prefix) = added_prefix(tk)? else {
        return Ok(None);
    };
    let mut all: Vec<u32> = Vec::new();
    pieces(path, tk, &prefix, 0, PIECE_BYTES, &mut |_, ids| {
        all.extend_from_slice(&ids);
        true
    })?;
    Ok(Some(all))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_split_is_posenc_tunes() {
        for n in [2usize, 3, 9, 10, 11, 99, 1000, 123_457] {
            let v = vec![0u32; n];
            assert_eq!(
                n - split_point(n),
                posenc_tune::data::held_out_tokens(&v).len(),
                "{n}"
            );
        }
    }

    #[test]
    fn pieces_end_before_a_space_after_a_word() {
        assert_eq!(cut(b"one two  three"), Some(7));
        assert_eq!(cut(b"   "), None);
        assert_eq!(cut(b"abc"), None);
    }
}
