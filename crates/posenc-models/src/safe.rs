//! One rule for showing, in an error message, any string taken from a file
//! (GGUF metadata keys and values, tensor names, tokenizer pieces, JSON
//! keys, safetensors names, paths): control characters (C0, DEL, C1) and
//! the invisible format characters that reorder or hide text (bidi
//! overrides and isolates, zero-width characters, the BOM) are written as
//! Rust escapes (`\u{1b}`, `\0`, `\n`, `\t`, `\r`), a backslash as `\\`,
//! and a string longer than [`MAX_SHOWN_CHARS`] characters is cut with its
//! length said. A message built from such strings is one line that a
//! terminal shows as written: a file's `ESC[2J` cannot clear the screen,
//! nor a NUL cut the line.
//!
//! Every error message of `posenc-models` and `posenc-tune` that quotes a
//! file's string goes through [`escape`] (bare) or [`quote`] (in double
//! quotes, as Rust's `{:?}` writes a string), paths through [`path`].

use std::fmt::Write;

/// Longest string shown whole, in characters; a longer one is cut there
/// and followed by `… (N bytes)`.
pub const MAX_SHOWN_CHARS: usize = 200;

/// Whether `c` must be written as an escape: control characters, and
/// format characters that change how the surrounding text is displayed.
pub fn needs_escape(c: char) -> bool {
    c.is_control()
        || matches!(c,
            '\u{00ad}'                       // soft hyphen (invisible)
            | '\u{061c}'                     // Arabic letter mark
            | '\u{180e}'                     // Mongolian vowel separator
            | '\u{200b}'..='\u{200f}'        // zero-width, LRM, RLM
            | '\u{2028}'..='\u{202e}'        // line/paragraph separators, bidi embeddings/overrides
            | '\u{2060}'..='\u{206f}'        // word joiner, bidi isolates, invisible operators
            | '\u{feff}'                     // BOM / zero-width no-break space
            | '\u{fff9}'..='\u{fffb}'        // interlinear annotations
        )
}

fn push_escaped(out: &mut String, c: char) {
    match c {
        '\\' => out.push_str("\\\\"),
        '\0' => out.push_str("\\0"),
        '\n' => out.push_str("\\n"),
        '\r' => out.push_str("\\r"),
        '\t' => out.push_str("\\t"),
        c if needs_escape(c) => {
            let _ = write!(out, "\\u{{{:x}}}", c as u32);
        }
        c => out.push(c),
    }
}

/// `s` safe to print: escapes as the module says, cut after
/// [`MAX_SHOWN_CHARS`] characters.
///
/// ```
/// use posenc_models::safe::escape;
/// assert_eq!(escape("blk.0.attn_q.weight"), "blk.0.attn_q.weight");
/// assert_eq!(escape("a\u{1b}[2Jb\0"), "a\\u{1b}[2Jb\\0");
/// assert!(escape(&"x".repeat(1000)).ends_with("… (1000 bytes)"));
/// ```
pub fn escape(s: &str) -> String {
    escape_up_to(s, MAX_SHOWN_CHARS)
}

fn escape_up_to(s: &str, max: usize) -> String {
    let mut out = String::with_capacity(s.len().min(max.saturating_mul(4)));
    for (n, c) in s.chars().enumerate() {
        if n == max {
            let _ = write!(out, "… ({} bytes)", s.len());
            break;
        }
        push_escaped(&mut out, c);
    }
    out
}

/// `s` escaped and in double quotes (a `"` inside written `\"`), as a
/// value is quoted in a message.
///
/// ```
/// assert_eq!(posenc_models::safe::quote("llama\u{7}"), "\"llama\\u{7}\"");
/// ```
pub fn quote(s: &str) -> String {
    format!("\"{}\"", escape(s).replace('"', "\\\""))
}

/// Bytes that may not be UTF-8 (a key as a file stores it): invalid
/// sequences as `\xNN`, the rest as [`escape`].
///
/// ```
/// assert_eq!(posenc_models::safe::bytes(b"k\xff\x1b"), "k\\xff\\u{1b}");
/// ```
pub fn bytes(b: &[u8]) -> String {
    let mut out = String::new();
    let mut n = 0usize;
    for chunk in b.utf8_chunks() {
        let items = chunk
            .valid()
            .chars()
            .map(Ok)
            .chain(chunk.invalid().iter().map(|&x| Err(x)));
        for item in items {
            if n == MAX_SHOWN_CHARS {
                let _ = write!(out, "… ({} bytes)", b.len());
                return out;
            }
            match item {
                Ok(c) => push_escaped(&mut out, c),
                Err(x) => {
                    let _ = write!(out, "\\x{x:02x}");
                }
            }
            n += 1;
        }
    }
    out
}

/// A path safe to print: its lossy UTF-8 form, escaped, never cut (a
/// path is at most `PATH_MAX` bytes).
pub fn path(p: &std::path::Path) -> String {
    escape_up_to(&p.to_string_lossy(), usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_control_and_format_character_is_escaped() {
        for c in (0u32..0x20).chain(0x7f..0xa0).filter_map(char::from_u32) {
            let e = escape(&c.to_string());
            assert!(e.starts_with('\\'), "{c:?} -> {e}");
            assert!(!e.chars().any(|x| x.is_control()), "{c:?} -> {e}");
        }
        for c in ['\u{202e}', '\u{2066}', '\u{200b}', '\u{feff}', '\u{2028}'] {
            assert!(escape(&c.to_string()).starts_with("\\u{"), "{c:?}");
        }
        // Printable text, including non-ASCII, is kept.
        assert_eq!(escape("Ġthe ▁é 中"), "Ġthe ▁é 中");
        assert_eq!(escape("a\\b"), "a\\\\b");
        assert_eq!(quote("say \"hi\"\n"), "\"say \\\"hi\\\"\\n\"");
    }

    #[test]
    fn long_strings_are_cut_with_their_length() {
        let s = "é".repeat(MAX_SHOWN_CHARS + 1);
        let e = escape(&s);
        assert_eq!(e.chars().filter(|&c| c == 'é').count(), MAX_SHOWN_CHARS);
        assert!(e.ends_with(&format!("… ({} bytes)", s.len())), "{e}");
        assert_eq!(escape(&"x".repeat(MAX_SHOWN_CHARS)).len(), MAX_SHOWN_CHARS);
    }

    #[test]
    fn invalid_bytes_are_hex() {
        assert_eq!(bytes(b"ok"), "ok");
        assert_eq!(bytes(b"\x00GGUF\xc3"), "\\0GGUF\\xc3");
    }
}
