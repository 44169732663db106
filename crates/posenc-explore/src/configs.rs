//! Real `config.json` files the test suite carries (`crates/posenc/tests/
//! fixtures`), embedded so the explorer offers them offline.

/// One bundled config: `(name, label, text)`.
pub type Bundled = (&'static str, &'static str, &'static str);

/// Every bundled config, the default first.
pub const CONFIGS: &[Bundled] = &[
    (
        "llama-3.1-8b",
        "Llama 3.1 8B (llama3)",
        include_str!("../../posenc/tests/fixtures/checkpoints/llama-3.1-8b.config.json"),
    ),
    (
        "llama-3.2-1b",
        "Llama 3.2 1B (llama3)",
        include_str!("../../posenc/tests/fixtures/checkpoints/llama-3.2-1b.config.json"),
    ),
    (
        "llama-2-7b",
        "Llama 2 7B (default)",
        include_str!("../../posenc/tests/fixtures/checkpoints/llama-2-7b.config.json"),
    ),
    (
        "mistral-7b-v0.1",
        "Mistral 7B v0.1",
        include_str!("../../posenc/tests/fixtures/checkpoints/mistral-7b-v0.1.config.json"),
    ),
    (
        "qwen2.5-7b-instruct-yarn",
        "Qwen2.5 7B Instruct, YaRN 4×",
        include_str!(
            "../../posenc/tests/fixtures/checkpoints/qwen2.5-7b-instruct-yarn.config.json"
        ),
    ),
    (
        "deepseek-v3",
        "DeepSeek-V3 (YaRN, mscale)",
        include_str!("../../posenc/tests/fixtures/checkpoints/deepseek-v3.config.json"),
    ),
    (
        "gpt-oss-20b",
        "gpt-oss 20B (YaRN, no truncation)",
        include_str!("../../posenc/tests/fixtures/checkpoints/gpt-oss-20b.config.json"),
    ),
    (
        "phi-3-mini-128k-instruct",
        "Phi-3 mini 128k (LongRoPE)",
        include_str!(
            "../../posenc/tests/fixtures/checkpoints/phi-3-mini-128k-instruct.config.json"
        ),
    ),
    (
        "phi-2",
        "Phi-2 (partial rotary)",
        include_str!("../../posenc/tests/fixtures/checkpoints/phi-2.config.json"),
    ),
    (
        "pythia-410m",
        "Pythia 410M (GPT-NeoX, partial rotary)",
        include_str!("../../posenc/tests/fixtures/checkpoints/pythia-410m.config.json"),
    ),
    (
        "gemma-2-2b",
        "Gemma 2 2B",
        include_str!("../../posenc/tests/fixtures/checkpoints/gemma-2-2b.config.json"),
    ),
    (
        "gemma-3-1b-it",
        "Gemma 3 1B (local and global layers)",
        include_str!("../../posenc/tests/fixtures/models/gemma-3-1b-it.config.json"),
    ),
    (
        "gemma-3-4b-it",
        "Gemma 3 4B (local and global, linear 8×)",
        include_str!("../../posenc/tests/fixtures/models/gemma-3-4b-it.config.json"),
    ),
    (
        "gemma-4-e2b-it",
        "Gemma 4 E2B (proportional)",
        include_str!("../../posenc/tests/fixtures/models/gemma-4-e2b-it.config.json"),
    ),
    (
        "llama-4-scout-17b-16e-instruct",
        "Llama 4 Scout (NoPE layers)",
        include_str!(
            "../../posenc/tests/fixtures/models/llama-4-scout-17b-16e-instruct.config.json"
        ),
    ),
    (
        "smollm3-3b",
        "SmolLM3 3B (NoPE layers)",
        include_str!("../../posenc/tests/fixtures/models/smollm3-3b.config.json"),
    ),
    (
        "qwen2-vl-7b-instruct",
        "Qwen2-VL 7B (M-RoPE)",
        include_str!("../../posenc/tests/fixtures/models/qwen2-vl-7b-instruct.config.json"),
    ),
    (
        "qwen2.5-vl-7b-instruct",
        "Qwen2.5-VL 7B (M-RoPE)",
        include_str!("../../posenc/tests/fixtures/models/qwen2.5-vl-7b-instruct.config.json"),
    ),
    (
        "qwen3-vl-8b-instruct",
        "Qwen3-VL 8B (interleaved M-RoPE)",
        include_str!("../../posenc/tests/fixtures/models/qwen3-vl-8b-instruct.config.json"),
    ),
    (
        "pixtral-12b",
        "Pixtral 12B (2-D vision RoPE)",
        include_str!("../../posenc/tests/fixtures/models/pixtral-12b.config.json"),
    ),
    (
        "hunyuan-dense-ntk-alpha",
        "Hunyuan dense (NTK-alpha)",
        include_str!("../../posenc/tests/fixtures/models/hunyuan-dense-ntk-alpha.config.json"),
    ),
];

/// The text of the bundled config `name`.
pub fn config(name: &str) -> Option<&'static str> {
    CONFIGS.iter().find(|c| c.0 == name).map(|c| c.2)
}
