//! Adapters in PEFT's layout: written by a fine-tune, read back, merged
//! into a loaded model (`W + s·B·A`, saved embeddings and norms replaced),
//! which then scores tokens as the trainable model with the adapter does;
//! one trained on the GGUF of a Llama model (q and k rows permuted for
//! interleaved pairs) merges into its Hugging Face checkpoint; adapters
//! that do not fit are refused.

use std::path::Path;

use candle_core::quantized::GgmlDType;
use posenc_models::gguf::write_gguf;
use posenc_models::perplexity::{loss_per_position, rope_of};
use posenc_models::weights::Safetensors;
use posenc_models::{Decoder, ModelFiles, Scaling};
use posenc_tune::data::{TrainText, WindowPlan};
use posenc_tune::merged::{merged_config, write_merged, TokenizerFiles};
use posenc_tune::peft::{Adapter, CONFIG_FILE, WEIGHTS_FILE};
use posenc_tune::train::{Finetune, FinetuneConfig, RunOptions, Sources};
use posenc_tune::{Target, Trainable, TuneError};
use serde_json::Value;

use crate::common;

use common::{ids, load, model_dir};

/// A new empty scratch directory, removed when dropped.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix(&format!("posenc-tune-peft-{name}-"))
        .tempdir()
        .unwrap()
}

fn text(n: usize) -> TrainText {
    TrainText::new((0..n).map(|i| ((i * 89 + 13) % 97 + 100) as u32).collect()).unwrap()
}

/// 48 tokens, past the tiny models' trained length of 32.
fn tokens() -> Vec<u32> {
    (0..48u32).map(|i| (i * 37 + 5) % 256).collect()
}

/// A few steps of a fine-tune with every target, the embedding and norms,
/// through `scaling`; returns the run (dropout off for scoring).
fn trained(base: &Decoder, scaling: &str, targets: &[Target], trainable: Trainable) -> Finetune {
    let mut c = FinetuneConfig::new(WindowPlan::Contiguous { len: 48 }, 4, 2e-2);
    c.scaling = scaling.into();
    c.lora.rank = 4;
    c.lora.alpha = 8.0;
    c.lora.targets = targets.to_vec();
    c.trainable = trainable;
    c.warmup = 0;
    let mut ft = Finetune::new(base, text(2000), c, tiny_sources()).unwrap();
    ft.run(&RunOptions::default()).unwrap();
    ft
}

fn trainable_loss(ft: &Finetune, tokens: &[u32]) -> f64 {
    let positions: Vec<u32> = (0..tokens.len() as u32).collect();
    let model = ft.model();
    model
        .loss(tokens, &positions)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap() as f64
}

fn merged_loss(decoder: &Decoder, scaling: &str, tokens: &[u32]) -> f64 {
    let sc: Scaling = scaling.parse().unwrap();
    let rope = rope_of(sc.rope_config(decoder.config()).unwrap()).unwrap();
    let l = loss_per_position(decoder, tokens, &rope).unwrap();
    l.iter().sum::<f64>() / l.len() as f64
}

#[test]
fn a_merged_adapter_scores_as_the_trained_model() {
    let path = model_dir("tiny-llama31");
    let base = load(&path);
    let all = Trainable {
        embed: true,
        norm: true,
    };
    let ft = trained(&base, "linear:2", &Target::ALL, all);
    let want = trainable_loss(&ft, &tokens());
    let tmp = scratch("merge");
    let dir = tmp.path();
    let adapter = ft.adapter().unwrap();
    adapter.write(dir).unwrap();
    let read = Adapter::read(dir, base.config()).unwrap();
    assert_eq!(read, adapter);
    let mut merged = load(&path);
    let before = merged_loss(&merged, "linear:2", &tokens());
    read.merge_into(&mut merged, dir).unwrap();
    let got = merged_loss(&merged, "linear:2", &tokens());
    println!("loss: base {before:.6}, trained {want:.6}, merged {got:.6}");
    assert!((got - want).abs() <= 1e-5 * want, "{got} vs {want}");
    assert!((before - want).abs() > 1e-3, "training changed nothing");
    // PEFT's config keys and tensor names.
    let c: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join(CONFIG_FILE)).unwrap()).unwrap();
    assert_eq!(c["peft_type"], "LORA");
    assert_eq!(c["r"], 4);
    assert_eq!(c["lora_alpha"], 8);
    assert_eq!(c["task_type"], "CAUSAL_LM");
    assert_eq!(
        c["modules_to_save"],
        serde_json::json!([
            "embed_tokens",
            "norm",
            "input_layernorm",
            "post_attention_layernorm"
        ])
    );
    let bytes = std::fs::read(dir.join(WEIGHTS_FILE)).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let mut names: Vec<&str> = st.names();
    names.sort_unstable();
    assert!(names.contains(&"base_model.model.model.layers.1.mlp.down_proj.lora_B.weight"));
    assert!(names.contains(&"base_model.model.model.embed_tokens.weight"));
    assert!(names.contains(&"base_model.model.model.layers.0.input_layernorm.weight"));
    // 2 layers × 7 targets × 2 factors, the embedding, 2 × 2 + 1 norms.
    assert_eq!(names.len(), 28 + 1 + 5);
}

/// The GGUF of the tiny Llama (q and k rows permuted for interleaved
/// pairs, as llama.cpp writes it): an adapter trained on it is written in
/// Hugging Face row order, so it merges into the safetensors checkpoint
/// and gives the GGUF-trained model's loss; read back onto the GGUF it
/// gives it too.
#[test]
fn an_adapter_trained_on_a_gguf_fits_the_checkpoint() {
    let hf = model_dir("tiny-llama31");
    let mut files = ModelFiles::open(&hf).unwrap();
    let mut cfg = files.config().unwrap();
    // GGUF has no key for Llama 3's scaling: plain RoPE in the file.
    cfg.rope = "none"
        .parse::<Scaling>()
        .unwrap()
        .rope_config(&cfg)
        .unwrap();
    let tmp = scratch("gguf");
    let gguf = tmp.path().join("tiny.gguf");
    write_gguf(
        &cfg,
        &mut Safetensors::open_dir(&hf).unwrap(),
        &gguf,
        GgmlDType::F32,
    )
    .unwrap();
    let base = load(&gguf);
    assert_eq!(
        base.config().pair_layout(),
        posenc::rope::PairLayout::Interleaved
    );
    let targets = [Target::QProj, Target::KProj, Target::VProj, Target::OProj];
    let ft = trained(&base, "linear:2", &targets, Trainable::default());
    let want = trainable_loss(&ft, &tokens());
    let tmp_adapter = scratch("gguf-adapter");
    let dir = tmp_adapter.path();
    ft.adapter().unwrap().write(dir).unwrap();
    // Onto the Hugging Face checkpoint (half-split pairs).
    let mut merged = load(&hf);
    let before = merged_loss(&merged, "linear:2", &tokens());
    assert!((before - want).abs() > 1e-3, "training changed nothing");
    let adapter = Adapter::read(dir, merged.config()).unwrap();
    adapter.merge_into(&mut merged, dir).unwrap();
    let got = merged_loss(&merged, "linear:2", &tokens());
    println!("GGUF-trained {want:.6}, merged into the checkpoint {got:.6}");
    assert!((got - want).abs() <= 1e-5 * want, "{got} vs {want}");
    // Back onto the GGUF.
    let mut again = load(&gguf);
    Adapter::read(dir, again.config())
        .unwrap()
        .merge_into(&mut again, dir)
        .unwrap();
    let got = merged_loss(&again, "linear:2", &tokens());
    assert!((got - want).abs() <= 1e-5 * want, "{got} vs {want}");
    // The merged GGUF written as a Hugging Face checkpoint (config from the
    // GGUF's metadata, q and k rows put back in Hugging Face order), read
    // back as one: the same loss through its own config's RoPE.
    let sc: Scaling = "linear:2".parse().unwrap();
    let config = merged_config(again.config(), None, &sc).unwrap();
    assert_eq!(config["rope_scaling"]["rope_type"], "linear");
    let tmp_merged = scratch("gguf-merged");
    let out = tmp_merged.path();
    write_merged(out, &again, &config, &TokenizerFiles::Copy(Vec::new())).unwrap();
    let reread = load(out);
    assert_eq!(
        reread.config().pair_layout(),
        posenc::rope::PairLayout::HalfSplit
    );
    let got = merged_loss(&reread, "model", &tokens());
    println!("GGUF merged and written as safetensors: {got:.6}");
    assert!((got - want).abs() <= 1e-5 * want, "{got} vs {want}");
}

#[test]
fn adapters_that_do_not_fit_are_refused() {
    let base = load(&model_dir("tiny-llama31"));
    let ft = trained(
        &base,
        "none",
        &[Target::QProj, Target::VProj],
        Trainable::default(),
    );
    let tmp = scratch("misfit");
    let dir = tmp.path();
    ft.adapter().unwrap().write(dir).unwrap();
    let reason = |dir: &Path, cfg: &posenc_models::DecoderConfig| {
        let e = Adapter::read(dir, cfg).unwrap_err();
        assert!(matches!(e, TuneError::Adapter { .. }), "{e}");
        e.to_string()
    };
    // Another model: one layer fewer, or a wider residual stream.
    let mut one_layer = base.config().clone();
    one_layer.num_layers = 1;
    assert!(reason(dir, &one_layer).contains("layer 1"));
    let mut wider = base.config().clone();
    wider.hidden_size = 128;
    assert!(reason(dir, &wider).contains("shape"));
    // A factor missing: drop lora_B of layer 0's v_proj from the file.
    let bytes = std::fs::read(dir.join(WEIGHTS_FILE)).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let keep: Vec<(String, safetensors::tensor::TensorView)> = st
        .tensors()
        .into_iter()
        .filter(|(n, _)| n != "base_model.model.model.layers.0.self_attn.v_proj.lora_B.weight")
        .collect();
    let tmp_broken = scratch("missing");
    let broken = tmp_broken.path();
    std::fs::copy(dir.join(CONFIG_FILE), broken.join(CONFIG_FILE)).unwrap();
    safetensors::serialize_to_file(keep, None, &broken.join(WEIGHTS_FILE)).unwrap();
    assert!(reason(broken, base.config()).contains("only one of"));
    // A rank in the config that the tensors do not have.
    let cfg_text = std::fs::read_to_string(dir.join(CONFIG_FILE)).unwrap();
    std::fs::write(
        broken.join(CONFIG_FILE),
        cfg_text.replace("\"r\": 4", "\"r\": 8"),
    )
    .unwrap();
    std::fs::copy(dir.join(WEIGHTS_FILE), broken.join(WEIGHTS_FILE)).unwrap();
    assert!(reason(broken, base.config()).contains("r = 8"));
    // Not an adapter directory.
    let empty = scratch("empty");
    assert!(reason(empty.path(), base.config()).contains("adapter_config.json"));
}

fn tiny_sources() -> Sources {
    Sources {
        model: "tiny".into(),
        ..Default::default()
    }
}

/// The adapter `scripts/finetune/peft_check.py` had `posenc finetune`
/// write (tiny Llama 3.1, YaRN ×2, PoSE windows of 16 over 64, LoRA r 4 on
/// all seven projections, embedding and norms trained), and the losses
/// PyTorch gave on the text's held-out tokens with it loaded by
/// `PeftModel.from_pretrained` and with the merged checkpoint loaded by
/// transformers alone: posenc's loss with the adapter, on the trainable
/// model (both position sets) and merged into the loaded decoder
/// (contiguous positions), within 1e-5 relative.
#[test]
fn pefts_losses_with_the_adapter_posenc_wrote() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/peft-llama31");
    let r = common::read_json(&dir.join("peft-check.json"));
    println!(
        "reference from torch {}, transformers {}, peft {}",
        r["torch"], r["transformers"], r["peft"]
    );
    let tokens = ids(&r["tokens"]);
    let path = model_dir("tiny-llama31");
    let base = load(&path);
    let adapter = Adapter::read(&dir, base.config()).unwrap();
    assert_eq!(adapter.lora.targets, Target::ALL.to_vec());
    assert_eq!(
        adapter.trainable(),
        Trainable {
            embed: true,
            norm: true
        }
    );
    let model =
        posenc_tune::TrainableDecoder::new(&base, adapter.lora.clone(), adapter.trainable(), 0)
            .unwrap()
            .with_scaling(&"yarn:2".parse().unwrap())
            .unwrap();
    adapter.load_into(&model, &dir).unwrap();
    let mut merged = load(&path);
    adapter.merge_into(&mut merged, &dir).unwrap();
    for (case, c) in r["cases"].as_object().unwrap() {
        let positions = ids(&c["positions"]);
        let want = c["peft_loss"].as_f64().unwrap();
        let got = model
            .loss(&tokens, &positions)
            .unwrap()
            .to_scalar::<f32>()
            .unwrap() as f64;
        let rel = (got - want).abs() / want;
        println!("{case}: posenc with the adapter {got:.7}, PEFT {want:.7} ({rel:.1e})");
        assert!(rel <= 1e-5, "{case}: {got} vs PEFT's {want}");
        if case == "contiguous" {
            let want = c["merged_loss"].as_f64().unwrap();
            let got = merged_loss(&merged, "yarn:2", &tokens);
            let rel = (got - want).abs() / want;
            println!("{case}: posenc merged {got:.7}, transformers merged {want:.7} ({rel:.1e})");
            assert!(
                rel <= 1e-5,
                "{case}: {got} vs the merged checkpoint's {want}"
            );
        }
    }
}
