//! Rotary position embedding (RoPE), Su et al. 2021, *RoFormer: Enhanced
//! Transformer with Rotary Position Embedding*, and its long-context scalings.
//!
//! Queries and keys are split into pairs and pair `i` of the vector at
//! position `m` is rotated by the angle `m · θ_i`, with
//! `θ_i = base^(−2i/d)` before scaling. Because rotations compose,
//! `⟨R(m)q, R(n)k⟩ = ⟨q, R(n − m)k⟩` depends only on the distance.
//!
//! - [`RopeConfig`]: a validated configuration, read from a Hugging Face
//!   `config.json` ([`RopeConfig::from_hf_file`]) or built by hand;
//!   [`RopeConfig::frequencies`] gives the [`RopeFrequencies`] transformers
//!   computes for it.
//! - [`RopeScaling`]: every transformers scaling (linear, dynamic NTK, YaRN,
//!   LongRoPE, Llama 3, proportional) plus fixed NTK, one module each in
//!   [`scaling`]; [`NamedScaling`] chooses one by name (`yarn:2`, with an
//!   attention method: `dca:6144:1024+yarn:2`) for a trained length.
//! - [`Rope`] and [`xpos::XPos`]: the encodings, on `f64` head vectors.
//! - [`axial`]: multi-axis RoPE (one position per axis), the core of
//!   [`mrope`] (Qwen2-VL's M-RoPE and Qwen3-VL's interleaved M-RoPE, with
//!   the position-id builder) and [`vision`] (Pixtral, Qwen-VL and Llama 4
//!   2-D RoPE).
//! - [`layers`]: a model's RoPE layer by layer ([`ModelRope`]): per-layer
//!   types (Gemma 3, Gemma 4), NoPE layers (Llama 4, SmolLM3), Llama 4's
//!   attention-temperature tuning.
//! - [`limits`]: the bounds on every size read from user input.

pub mod axial;
pub mod config;
pub mod frequencies;
pub mod layers;
pub mod limits;
pub mod mrope;
pub mod rotary;
pub mod scaling;
pub mod vision;
pub mod xpos;

pub use axial::{AxialFrequencies, AxisSplit};
pub use config::{
    json_key_at, json_kind, Flag, HfRopeConfig, HfRopeParameters, HfRopeParametersField,
    RopeConfig, INTERLEAVED_MODEL_TYPES,
};
pub use frequencies::{default_inv_freq, PairLayout, RopeFrequencies};
pub use layers::{irope_layers, AttnTemperature, LayerRope, ModelRope};
pub use mrope::{Mrope, MropeLayout};
pub use rotary::Rope;
pub use scaling::named::{FactorScaling, NamedScaling, ScalingKind, ScalingNameError};
pub use scaling::{RopeScaling, YarnParams, FACTOR_SCALINGS, KNOWN_ROPE_TYPES};
pub use xpos::XPos;
