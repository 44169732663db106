//! The introductory articles the report's walk-through follows and whose
//! claims it tests: one entry each, cited by author (where the article
//! names one), title and where it was published, with an English gloss of
//! a title in another language. The report, `analyze` and the claims cite
//! these entries, never a numbered list a reader cannot see.
//!
//! Each entry is a macro expanding to a string literal (so that a claim's
//! `&'static str` source can `concat!` it) and a constant of the same text.

/// «Позиционное кодирование», a Russian introductory article (no author
/// named): the word-order example, the 32 × 16 picture, the binary analogy.
#[macro_export]
macro_rules! src_intro_ru {
    () => {
        "«Позиционное кодирование» (\"Positional encoding\", Russian introductory article)"
    };
}

/// «Позиционная кодировка», a Russian post on NoPE and RoPE (no author
/// named) with a three-question quiz on BERT, GPT and RoPE at 2L.
#[macro_export]
macro_rules! src_nope_rope_ru {
    () => {
        "«Позиционная кодировка» (\"Positional encoding\", Russian post on NoPE and RoPE)"
    };
}

/// The quiz of [`src_nope_rope_ru!`]: «Мини-квиз для читателя».
#[macro_export]
macro_rules! src_quiz {
    () => {
        "the reader's quiz of «Позиционная кодировка» (\"Positional encoding\", Russian post on NoPE and RoPE)"
    };
}

/// "Positional Encoding in Transformer Models", a chapter of the Gen-ai
/// 简明教程 tutorial.
#[macro_export]
macro_rules! src_genai {
    () => {
        "\"Positional Encoding in Transformer Models\" (Gen-ai 简明教程, \"a concise Gen-AI tutorial\")"
    };
}

/// Noonisy, «Transformer中的位置编码» (2022-11-13).
#[macro_export]
macro_rules! src_noonisy {
    () => {
        "Noonisy, «Transformer中的位置编码» (\"Positional encoding in the Transformer\", 2022-11-13)"
    };
}

/// Annotated notes on Vaswani et al. 2017 §3.5 with PyTorch code.
#[macro_export]
macro_rules! src_vaswani_notes {
    () => {
        "annotated notes on Vaswani et al. 2017, \"Attention Is All You Need\" §3.5, with PyTorch code (Chinese study notes)"
    };
}

/// [`src_intro_ru!`] as a constant.
pub const INTRO_RU: &str = src_intro_ru!();
/// [`src_nope_rope_ru!`] as a constant.
pub const NOPE_ROPE_RU: &str = src_nope_rope_ru!();
/// [`src_quiz!`] as a constant.
pub const QUIZ: &str = src_quiz!();
/// [`src_genai!`] as a constant.
pub const GENAI: &str = src_genai!();
/// [`src_noonisy!`] as a constant.
pub const NOONISY: &str = src_noonisy!();
/// [`src_vaswani_notes!`] as a constant.
pub const VASWANI_NOTES: &str = src_vaswani_notes!();

/// Every entry, in the order the walk-through meets them: the
/// bibliography the report prints.
pub const ALL: [&str; 5] = [INTRO_RU, NOPE_ROPE_RU, GENAI, NOONISY, VASWANI_NOTES];
