//! A model's RoPE read from its `config.json`, and what a scaling does to
//! each frequency pair.
//!
//! ```sh
//! cargo run -p posenc --example rope_from_config                       # Llama 3.1 8B's RoPE keys
//! cargo run -p posenc --example rope_from_config -- path/to/config.json
//! ```
//!
//! For every pair `i` it prints the inverse frequency `θ_i` (radians per
//! position) of the config as read, the wavelength `2π/θ_i` in positions,
//! and the ratio to the unscaled frequency: 1 for a pair the scaling keeps,
//! `1/factor` for one it interpolates (Chen et al. 2023), values between
//! for pairs on a ramp (YaRN, Peng et al. 2023; Llama 3's bands).

use std::f64::consts::PI;

use posenc::rope::RopeConfig;

const LLAMA_3_1_8B: &str = r#"{"model_type": "llama", "hidden_size": 4096,
  "num_attention_heads": 32, "num_key_value_heads": 8,
  "max_position_embeddings": 131072, "rope_theta": 500000.0,
  "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                   "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}}"#;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let config = match std::env::args_os().nth(1) {
        Some(path) => RopeConfig::from_hf_file(std::path::Path::new(&path))?,
        None => RopeConfig::from_hf_json_str(LLAMA_3_1_8B)?,
    };
    let scaled = config.frequencies(None)?;
    let plain = RopeConfig::new(config.theta(), config.rotary_dim())?.frequencies(None)?;
    println!(
        "rope_type {}, theta {}, head_dim {}, rotary_dim {}, attention factor {:.6}",
        scaled.rope_type,
        config.theta(),
        config.head_dim(),
        config.rotary_dim(),
        scaled.attention_factor
    );
    println!(
        "{:>4}  {:>14}  {:>16}  {:>10}",
        "pair", "inv_freq", "wavelength", "scaled/raw"
    );
    for (i, (&s, &p)) in scaled.inv_freq.iter().zip(&plain.inv_freq).enumerate() {
        let ratio = s as f64 / p as f64;
        println!(
            "{i:>4}  {s:>14.6e}  {:>16.1}  {ratio:>10.4}",
            2.0 * PI / s as f64
        );
    }
    let kept = scaled
        .inv_freq
        .iter()
        .zip(&plain.inv_freq)
        .filter(|(s, p)| s == p)
        .count();
    println!(
        "{kept} of {} pairs kept as trained, {} changed by the scaling",
        scaled.inv_freq.len(),
        scaled.inv_freq.len() - kept
    );
    Ok(())
}
