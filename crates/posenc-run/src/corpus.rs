//! The default text of the probes and of fine-tuning.

/// Jane Austen's *Pride and Prejudice* (from `assets/corpus/`), the text
/// `posenc perplexity` scores and `posenc finetune --model` trains on
/// unless given another; also the report's default corpus.
pub const PRIDE_AND_PREJUDICE: &str =
    include_str!("../../../assets/corpus/pride-and-prejudice.txt");
