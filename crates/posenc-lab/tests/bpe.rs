//! Subword tokens: the byte-level BPE round-trips any UTF-8 text, is
//! trained on the training part only and deterministically, refuses a text
//! too short for its size, travels with the checkpoint, and bits per
//! character count every character once.

use crate::common;

use std::sync::Arc;

use posenc_lab::bpe::{Bpe, Tokenization};
use posenc_lab::checkpoint::batch_seed;
use posenc_lab::config::{Mode, PeConfig};
use posenc_lab::optim::AdamW;
use posenc_lab::tasks::{Corpus, Split, Task, TaskKind};
use posenc_lab::train::{self, Lab};
use posenc_lab::LabError;
use proptest::prelude::*;

const PRIDE: &str = include_str!("../../../assets/corpus/pride-and-prejudice.txt");

/// The first `n` characters of Pride and Prejudice (the tests' corpus: the
/// whole book trains a BPE in seconds in release, slowly in a debug test).
fn pride(n: usize) -> &'static str {
    let end = PRIDE.char_indices().nth(n).map_or(PRIDE.len(), |(i, _)| i);
    &PRIDE[..end]
}

fn tokenizer() -> Arc<Bpe> {
    let (train, _) = Corpus::split_text(pride(120_000)).unwrap();
    Bpe::cached(train, 512).unwrap()
}

#[test]
fn the_corpus_round_trips_and_the_split_matches_the_characters() {
    let text = pride(120_000);
    let c = Corpus::with_tokens(text, Tokenization::Bpe { vocab: 512 }).unwrap();
    assert_eq!(c.vocab.len(), 512);
    assert_eq!(c.tokenization(), Tokenization::Bpe { vocab: 512 });
    assert_eq!(c.decode(&c.tokens), text);
    // The training part is the first 90% of the characters, as for the
    // character corpus; the validation part is the rest.
    let chars = Corpus::from_text(text).unwrap();
    let (train, valid) = Corpus::split_text(text).unwrap();
    assert_eq!(chars.decode(chars.part(Split::Train)), train);
    assert_eq!(c.decode(c.part(Split::Train)), train);
    assert_eq!(c.decode(c.part(Split::Validation)), valid);
    assert_eq!(c.train_chars, chars.split_at);
    // Characters per token add up to the text's, in each part.
    let count = |t: &[u32]| t.iter().map(|&x| c.chars_of(x) as usize).sum::<usize>();
    assert_eq!(count(&c.tokens), text.chars().count());
    assert_eq!(count(c.part(Split::Train)), train.chars().count());
    assert_eq!(c.chars, text.chars().count());
    // Subwords: fewer tokens than characters.
    assert!(
        c.chars_per_token() > 2.0,
        "{} chars/token",
        c.chars_per_token()
    );
    // Bits per character of the unigram baseline: per tokenization, in one
    // unit (a subword unigram knows more than a character one).
    assert!(c.unigram_bits_per_char() < chars.unigram_bits_per_char());
    let h = chars.unigram_entropy() / std::f64::consts::LN_2;
    assert!((chars.unigram_bits_per_char() - h).abs() < 1e-12);
}

#[test]
fn the_tokenizer_never_sees_the_validation_text() {
    // The validation part is in a script the training part never uses:
    // no merge can join two of its bytes, so it costs one token per byte.
    let mut text = "the quick brown fox jumps over the lazy dog. ".repeat(200);
    let n = text.chars().count();
    let valid: String = "Позиционное кодирование! "
        .chars()
        .cycle()
        .take(n / 9 + 1)
        .collect();
    text.push_str(&valid);
    let c = Corpus::with_tokens(&text, Tokenization::Bpe { vocab: 280 }).unwrap();
    let (train, v) = Corpus::split_text(&text).unwrap();
    assert!(!train.contains('П'), "the split is inside the Latin part");
    let bpe = c.bpe().unwrap();
    let cyrillic = bpe
        .encode(v)
        .unwrap()
        .iter()
        .filter(|&&t| bpe.piece(t).iter().any(|&b| b >= 0x80))
        .count();
    let bytes_of_cyrillic = v.chars().filter(|ch| !ch.is_ascii()).count() * 2;
    assert_eq!(cyrillic, bytes_of_cyrillic);
    assert_eq!(c.decode(&c.tokens), text);
}

#[test]
fn any_script_trains_and_round_trips() {
    let ru = "Все этапы в блоке кодировщика модели трансформера работают \
              независимо для каждого токена. Позиционное кодирование! "
        .repeat(40);
    let zh: String = "位置编码使模型能够理解序列顺序。注意力机制本身不知道顺序。".repeat(60);
    for text in [ru, zh] {
        let c = Corpus::with_tokens(&text, Tokenization::Bpe { vocab: 300 }).unwrap();
        assert_eq!(c.decode(&c.tokens), text);
        let t = Task::from_text_with_tokens(TaskKind::Mlm, &text, c.tokenization()).unwrap();
        assert_eq!(t.vocab_size(), 301);
        assert_eq!(t.mask_token(), Some(300));
    }
}

#[test]
fn a_synthetic_task_is_refused_before_any_tokenizer_is_trained() {
    // The text is far too short for the vocabulary: if a BPE were trained
    // first, the error would be TextTooShort, not the task's.
    let text = "a short text, far too short for it.";
    for kind in [TaskKind::Copy, TaskKind::Addition, TaskKind::Order] {
        let e =
            Task::from_text_with_tokens(kind, text, Tokenization::Bpe { vocab: 4096 }).unwrap_err();
        assert!(
            matches!(&e, LabError::Invalid(m) if m.contains("does not read a corpus")),
            "{kind:?}: {e:?}"
        );
    }
}

#[test]
fn a_text_too_short_for_the_vocabulary_is_a_typed_error() {
    let text = "a short text, a short text, far too short for it.";
    let e = Corpus::with_tokens(text, Tokenization::Bpe { vocab: 4096 }).unwrap_err();
    match &e {
        LabError::TextTooShort {
            vocab,
            learned,
            chars,
        } => {
            assert_eq!(*vocab, 4096);
            assert!(*learned >= 256 && *learned < 4096, "{learned}");
            assert_eq!(*chars, Corpus::split_text(text).unwrap().0.chars().count());
        }
        other => panic!("expected TextTooShort, got {other:?}"),
    }
    assert!(e.to_string().contains("bpe:N"), "{e}");
    assert!(Tokenization::parse("bpe:100").is_err());
}

#[test]
fn training_the_tokenizer_is_deterministic_on_any_thread_count() {
    let (train, _) = Corpus::split_text(pride(60_000)).unwrap();
    let on = |threads: usize| {
        rayon::ThreadPoolBuilder::new()
            .num_threads(threads)
            .build()
            .unwrap()
            .install(|| Bpe::train(train, 700).unwrap().to_json())
    };
    let one = on(1);
    assert_eq!(one, on(1));
    assert_eq!(one, on(2));
    let back = Bpe::from_json(&one).unwrap();
    assert_eq!(back.to_json(), one);
    assert_eq!(back.vocab_size(), 700);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any UTF-8 string, in any script, decodes back to itself through a
    /// tokenizer trained on English.
    #[test]
    fn random_utf8_round_trips(text in any::<String>()) {
        let bpe = tokenizer();
        let ids = bpe.encode(&text).unwrap();
        prop_assert_eq!(bpe.decode(&ids), text.clone());
        let chars: usize = ids.iter().map(|&t| bpe.chars_of(t) as usize).sum();
        prop_assert_eq!(chars, text.chars().count());
    }
}

/// One run's losses and final weights, training `tokens` on `threads`
/// threads.
fn train_bits(tokens: Tokenization, threads: usize) -> (Vec<u32>, Vec<u32>) {
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    pool.install(|| {
        let task = Task::from_text_with_tokens(TaskKind::Lm, pride(60_000), tokens).unwrap();
        let m = common::model(
            Mode::Decoder,
            &task,
            PeConfig::parse("rope", 64, 4).unwrap(),
        );
        let lab = Lab::new(m, common::run(TaskKind::Lm, 6, 32, 5), task).unwrap();
        let mut opt = AdamW::new(lab.params(), 0.01).unwrap();
        let losses = (0..6)
            .map(|s| common::train_step(&lab, &mut opt, batch_seed(5, s, 0), 16, 32).to_bits())
            .collect();
        let w = common::sorted_params(&lab)
            .into_iter()
            .flat_map(|(_, v)| v)
            .map(f32::to_bits)
            .collect();
        (losses, w)
    })
}

#[test]
fn training_is_deterministic_per_seed_and_thread_count_with_either_tokenization() {
    for tokens in [Tokenization::Chars, Tokenization::Bpe { vocab: 512 }] {
        for threads in [1, 2] {
            let a = train_bits(tokens, threads);
            assert_eq!(a, train_bits(tokens, threads), "{tokens:?} on {threads}");
        }
    }
}

#[test]
fn a_checkpoint_keeps_its_tokenizer_and_scores_bits_per_character() {
    let (_tmp, dir) = common::tmp_dir("posenc-bpe", "ckpt");
    let corpus = dir.join("corpus.txt");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(&corpus, pride(60_000)).unwrap();
    let mut run = common::run(TaskKind::Lm, 4, 32, 1);
    run.corpus = Some(corpus.clone());
    let tokens = Tokenization::Bpe { vocab: 400 };
    let task = train::load_task_in(&run, tokens, None).unwrap();
    let m = common::model(Mode::Decoder, &task, PeConfig::Nope);
    let lab = Lab::new(m, run, task).unwrap();
    assert_eq!(lab.meta.tokens, tokens);
    let out = dir.join("ckpt");
    lab.save(&out, None).unwrap();
    let json = std::fs::read_to_string(out.join(train::TOKENIZER_FILE)).unwrap();
    assert_eq!(json, lab.task.corpus().unwrap().bpe().unwrap().to_json());
    // The checkpoint's tokenizer is the one loaded back, even when the
    // corpus's cached one would differ: replace it with another size's and
    // the load refuses it.
    let back = Lab::load(&out).unwrap();
    assert_eq!(back.meta.tokens, tokens);
    assert_eq!(
        back.task.corpus().unwrap().tokens,
        lab.task.corpus().unwrap().tokens
    );
    let valid = back.task.validation();
    let mut v = Lab::load(&out).unwrap();
    v.task = valid;
    let r = train::evaluate(&v, &[32], 2, 8, None).unwrap();
    let p = posenc_lab::loss_per_position(&v, 32, 2, 8, None).unwrap();
    // Bits per character: the same windows' nats over their characters.
    let chars: u64 = p.chars.iter().sum();
    let nats: f64 = p
        .loss
        .iter()
        .zip(&p.count)
        .map(|(l, &n)| l * n as f64)
        .sum();
    let bpc = nats / chars as f64 / std::f64::consts::LN_2;
    assert!((p.bits_per_char_over(0..32) - bpc).abs() < 1e-9);
    let scored: usize = p.count.iter().sum();
    assert_eq!(scored, 2 * 8 * 32);
    assert!(
        chars as f64 > 1.5 * scored as f64,
        "subword targets hold several characters: {chars} for {scored}"
    );
    assert!(r.bits_per_char[0].is_finite() && r.bits_per_char[0] > 0.0);
    assert!(r.bits_per_char[0] < r.loss[0], "{r:?}");
    let other = Bpe::train(Corpus::split_text(pride(60_000)).unwrap().0, 300).unwrap();
    std::fs::write(out.join(train::TOKENIZER_FILE), other.to_json()).unwrap();
    let e = match Lab::load(&out) {
        Err(e) => e.to_string(),
        Ok(_) => panic!("a tokenizer of another size was accepted"),
    };
    assert!(e.contains("bpe:400"), "{e}");
    std::fs::write(out.join(train::TOKENIZER_FILE), "{not json").unwrap();
    assert!(Lab::load(&out).is_err());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn character_bits_per_character_are_nats_over_ln_2() {
    let task = Task::from_text(TaskKind::Lm, pride(30_000)).unwrap();
    let m = common::model(Mode::Decoder, &task, PeConfig::Nope);
    let mut lab = Lab::new(m, common::run(TaskKind::Lm, 2, 16, 2), task).unwrap();
    lab.task = lab.task.validation();
    let r = train::evaluate(&lab, &[16], 2, 8, None).unwrap();
    // Every character token holds one character: bits per character is the
    // mean loss / ln 2 (up to the per-batch averaging of equal batches).
    assert!(
        (r.bits_per_char[0] - r.loss[0] / std::f64::consts::LN_2).abs() < 1e-5,
        "{r:?}"
    );
    // A task without a corpus has none.
    let copy = Task::new(TaskKind::Copy, 8).unwrap();
    let m = common::model(Mode::Decoder, &copy, PeConfig::Nope);
    let lab = Lab::new(m, common::run(TaskKind::Copy, 2, 16, 2), copy).unwrap();
    assert!(train::evaluate(&lab, &[16], 1, 4, None)
        .unwrap()
        .bits_per_char[0]
        .is_nan());
}
