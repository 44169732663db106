//! The RoPE scalings of Hugging Face transformers (and fixed NTK-aware
//! scaling), one file each.
//!
//! Every scaling turns `(theta, rotary_dim)` — and, for the length-dependent
//! ones, a sequence length — into the `f32` inverse frequencies and the
//! attention factor that transformers 5.x's `ROPE_INIT_FUNCTIONS[rope_type]`
//! returns. The arithmetic follows transformers' `float32` tensor operations
//! step by step (base rounded to `f32`, `torch.arange(0, d, 2).float() / d`,
//! reciprocals, ramps and comparisons in `f32`), so that the frequencies agree
//! with transformers to a few `f32` ulps and the piecewise rules (Llama 3's
//! wavelength bands, YaRN's ramp) take the same branch.
//!
//! | `rope_type` | variant | paper |
//! |---|---|---|
//! | `default` | [`RopeScaling::Default`] | Su et al. 2021 |
//! | `linear` | [`RopeScaling::Linear`] | Chen et al. 2023 (position interpolation) |
//! | `dynamic` | [`RopeScaling::Dynamic`] | bloc97 / emozilla 2023 (dynamic NTK) |
//! | `yarn` | [`RopeScaling::Yarn`] | Peng et al. 2023 (YaRN) |
//! | `longrope` | [`RopeScaling::LongRope`] | Ding et al. 2024 (LongRoPE) |
//! | `llama3` | [`RopeScaling::Llama3`] | Meta 2024 (Llama 3.1) |
//! | `proportional` | [`RopeScaling::Proportional`] | transformers 5.x (Gemma-style partial RoPE) |
//! | `ntk` | [`RopeScaling::Ntk`] | bloc97 2023 (fixed NTK-aware base) |
//! | `ntk` with `mixed_b` | [`RopeScaling::MixedNtk`] | Su 2023 (mixed NTK, vLLM) |
//! | `dynamic` with `alpha` | [`RopeScaling::NtkAlpha`] | Hunyuan (fixed NTK-aware base, transformers' `ntk_alpha`) |
//!
//! [`named`] chooses a scaling by name (`yarn:2`, `pi:4`, with an attention
//! method: `dca:6144:1024+yarn:2`) for a model's trained length.
//!
//! Every computed table is checked: a frequency or attention factor that is
//! not finite (a factor so small that `θ / s` overflows, an `mscale` that
//! makes YaRN's denominator zero) is an error, never a NaN table.

pub mod dynamic;
pub mod linear;
pub mod llama3;
pub mod longrope;
pub mod mixed_ntk;
pub mod named;
pub mod ntk;
pub mod ntk_alpha;
pub mod proportional;
pub mod yarn;

pub use yarn::YarnParams;

use crate::error::{check_dim, check_positive, Error, Result};

/// Every `rope_type` posenc understands (the error for an unknown type lists
/// them).
pub const KNOWN_ROPE_TYPES: &[&str] = &[
    "default",
    "linear",
    "dynamic",
    "yarn",
    "longrope",
    "llama3",
    "proportional",
    "ntk",
    "ntk_alpha",
];

/// One RoPE scaling with its parameters.
///
/// Build it directly and pass it to
/// [`RopeConfig::with_scaling`](crate::rope::RopeConfig::with_scaling), which
/// validates it against the rotary dimension, or let
/// [`RopeConfig::from_hf_json_str`](crate::rope::RopeConfig::from_hf_json_str)
/// read it from a `config.json`. Every variant carries what it needs (for
/// example the pre-training context length), so a value is self-contained.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub enum RopeScaling {
    /// No scaling: `θ_i = base^(−2i/d)` (`rope_type: "default"`).
    Default,
    /// Position interpolation (Chen et al. 2023): `θ_i / factor`. See [`linear`].
    Linear {
        /// Interpolation factor `s` (> 0).
        factor: f64,
    },
    /// Dynamic NTK (bloc97, emozilla 2023): the base grows with the sequence
    /// length past `max_position_embeddings`. See [`dynamic`].
    Dynamic {
        /// Scaling factor (> 0).
        factor: f64,
        /// The model's `max_position_embeddings`: lengths up to it use the
        /// unscaled base.
        max_position_embeddings: usize,
    },
    /// YaRN (Peng et al. 2023): NTK-by-parts interpolation plus an attention
    /// factor, with its parameters ([`YarnParams::new`] gives transformers'
    /// defaults). See [`yarn`].
    Yarn(YarnParams),
    /// LongRoPE (Ding et al. 2024): one rescale factor per frequency, a short
    /// set up to the pre-training length and a long set beyond. See [`longrope`].
    LongRope {
        /// Per-frequency factors for sequences up to `original_max_position_embeddings`.
        short_factor: Vec<f64>,
        /// Per-frequency factors for longer sequences.
        long_factor: Vec<f64>,
        /// Pre-training context length.
        original_max_position_embeddings: usize,
        /// Context extension factor (transformers: `factor`, or
        /// `max_position_embeddings / original_max_position_embeddings`).
        factor: f64,
        /// Explicit attention factor; `None` derives it from `factor`.
        attention_factor: Option<f64>,
    },
    /// Llama 3.1 (Meta 2024): high frequencies kept, low frequencies divided by
    /// `factor`, a smooth ramp in between. See [`llama3`].
    Llama3 {
        /// Factor for the low frequencies (8 for Llama 3.1).
        factor: f64,
        /// Wavelengths above `original / low_freq_factor` are fully scaled.
        low_freq_factor: f64,
        /// Wavelengths below `original / high_freq_factor` are kept.
        high_freq_factor: f64,
        /// Pre-training context length (8192 for Llama 3.1).
        original_max_position_embeddings: usize,
    },
    /// transformers 5.x `proportional`: only the first
    /// `⌊partial_rotary_factor · head_dim / 2⌋` pairs rotate, with exponents
    /// over the full head dimension; the other pairs get frequency 0. See
    /// [`proportional`].
    Proportional {
        /// Divides every frequency (default 1).
        factor: f64,
        /// Fraction of the pairs that rotate, in (0, 1].
        partial_rotary_factor: f64,
    },
    /// Fixed NTK-aware scaling (bloc97 2023): `base' = base · α^(d/(d−2))`.
    /// See [`ntk`].
    Ntk {
        /// The scale `α` (> 0); `rope_scaling.factor` in a config.
        alpha: f64,
    },
    /// Mixed NTK (Su 2023; vLLM's `ntk` with `mixed_b`): pair `i` slowed by
    /// `exp(a · i^b)`, the slowest by the whole factor. See [`mixed_ntk`].
    MixedNtk {
        /// Factor of the slowest pair (> 0).
        factor: f64,
        /// Exponent `b` of the mix (finite; 1 is vLLM's fixed NTK).
        mixed_b: f64,
    },
    /// NTK-alpha (Hunyuan's `dynamic` with `alpha`): the fixed NTK-aware base
    /// `base · α^(d/(d−2))`, independent of the length. See [`ntk_alpha`].
    NtkAlpha {
        /// The scale `α` (> 0).
        alpha: f64,
    },
}

/// Smallest attention factor accepted (explicit or computed): 0.1.
/// Trained models use 1 (most), YaRN's `0.1·ln s + 1` (1.07 to 1.69 for
/// factors 2 to 1024) or LongRoPE's `√(1 + ln s / ln L)` (about 1.2).
pub const MIN_ATTENTION_FACTOR: f64 = 0.1;
/// Largest attention factor accepted: 10 (it multiplies cos and sin, so
/// every logit by its square).
pub const MAX_ATTENTION_FACTOR: f64 = 10.0;

/// Checks that a scaling factor (or LongRoPE entry) is finite, above 0
/// and in `[MIN_FACTOR, MAX_FACTOR]` ([`named::MIN_FACTOR`],
/// [`named::MAX_FACTOR`]: the range of the CLI's `--scaling` factors).
/// Outside it the tables degenerate: `θ/s` overflows `f32` or every
/// frequency collapses towards 0.
///
/// # Errors
/// [`Error::InvalidFactor`] for a value that is not finite and > 0,
/// [`Error::InvalidValue`] naming `name` and the range otherwise.
pub fn check_factor(name: &'static str, value: f64) -> Result<f64> {
    check_positive(name, value)?;
    if !(named::MIN_FACTOR..=named::MAX_FACTOR).contains(&value) {
        return Err(Error::invalid(
            name,
            format!(
                "{value:e} is outside [{}, {}] (1/{} to {}), the scaling factors posenc accepts \
                 (transformers warns below 1 and sets no bound; trained models use 1 to 64)",
                named::MIN_FACTOR,
                named::MAX_FACTOR,
                named::MAX_FACTOR,
                named::MAX_FACTOR
            ),
        ));
    }
    Ok(value)
}

/// Checks that an attention factor is finite, above 0 and in
/// `[MIN_ATTENTION_FACTOR, MAX_ATTENTION_FACTOR]`.
///
/// # Errors
/// [`Error::InvalidFactor`] for a value that is not finite and > 0,
/// [`Error::InvalidValue`] naming `name` and the range otherwise.
pub fn check_attention_factor(name: &'static str, value: f64) -> Result<f64> {
    check_positive(name, value)?;
    if !(MIN_ATTENTION_FACTOR..=MAX_ATTENTION_FACTOR).contains(&value) {
        return Err(Error::invalid(
            name,
            format!(
                "{value} is outside [{MIN_ATTENTION_FACTOR}, {MAX_ATTENTION_FACTOR}] \
                 (trained models use 1 to about 1.7)"
            ),
        ));
    }
    Ok(value)
}

/// The names [`RopeScaling::from_factor`] understands.
pub const FACTOR_SCALINGS: &[&str] = &[
    "none", "default", "linear", "pi", "dynamic", "ntk", "yarn", "llama3",
];

impl RopeScaling {
    /// The scaling `name` extending a model pre-trained at `original` tokens
    /// by `factor`, every other parameter at the default transformers gives
    /// a config that states only `rope_type` and `factor`:
    ///
    /// | name | variant |
    /// |---|---|
    /// | `none`, `default` | [`RopeScaling::Default`] (`factor` unused) |
    /// | `linear`, `pi` | [`RopeScaling::Linear`] (position interpolation) |
    /// | `dynamic` | [`RopeScaling::Dynamic`], unscaled up to `original` |
    /// | `ntk` | [`RopeScaling::Ntk`] with `alpha = factor` |
    /// | `yarn` | [`RopeScaling::Yarn`]: β_fast 32, β_slow 1, attention factor from `factor`, rounded correction range |
    /// | `llama3` | [`RopeScaling::Llama3`]: low_freq_factor 1, high_freq_factor 4 (Llama 3.1's; transformers has no default for them) |
    ///
    /// The result is not validated yet:
    /// [`RopeConfig::with_scaling`](crate::rope::RopeConfig::with_scaling)
    /// checks it against the base and rotary dimension.
    ///
    /// # Errors
    /// [`Error::UnknownRopeType`] (listing [`FACTOR_SCALINGS`]) for any other
    /// name.
    pub fn from_factor(name: &str, factor: f64, original: usize) -> Result<RopeScaling> {
        if let Some(family) = named::FactorScaling::from_name(name) {
            return Ok(family.rope_scaling(factor, original));
        }
        Ok(match name {
            "none" | "default" => RopeScaling::Default,
            "llama3" => RopeScaling::Llama3 {
                factor,
                low_freq_factor: 1.0,
                high_freq_factor: 4.0,
                original_max_position_embeddings: original,
            },
            other => {
                return Err(Error::UnknownRopeType {
                    name: other.to_string(),
                    known: FACTOR_SCALINGS,
                })
            }
        })
    }

    /// The `rope_type` name (one of [`KNOWN_ROPE_TYPES`]).
    pub fn rope_type(&self) -> &'static str {
        match self {
            RopeScaling::Default => "default",
            RopeScaling::Linear { .. } => "linear",
            RopeScaling::Dynamic { .. } => "dynamic",
            RopeScaling::Yarn(_) => "yarn",
            RopeScaling::LongRope { .. } => "longrope",
            RopeScaling::Llama3 { .. } => "llama3",
            RopeScaling::Proportional { .. } => "proportional",
            RopeScaling::Ntk { .. } | RopeScaling::MixedNtk { .. } => "ntk",
            RopeScaling::NtkAlpha { .. } => "ntk_alpha",
        }
    }

    /// Checks the parameters against `theta` and the rotary dimension.
    ///
    /// # Errors
    /// [`Error::InvalidFactor`] for a factor (or `beta_*`, `attention_factor`,
    /// a LongRoPE entry) that is not finite and > 0; [`Error::NotFinite`] for a
    /// NaN `mscale`; [`Error::FreqFactorOrder`] when Llama 3's
    /// `low_freq_factor ≥ high_freq_factor`; [`Error::FactorListLength`] for a
    /// LongRoPE list whose length is not `rotary_dim / 2`;
    /// [`Error::PartialRotaryFactor`] for a proportional fraction outside
    /// (0, 1]; [`Error::InvalidDimension`] for an odd rotary dimension, a zero
    /// context length, or `rotary_dim = 2` with dynamic/NTK scaling (their
    /// exponent `d/(d−2)` is undefined); [`Error::InvalidTheta`] for a base that
    /// is not finite and > 0 (or equal to 1 with YaRN, whose correction range
    /// divides by `ln base`).
    pub fn validate(&self, theta: f64, rotary_dim: usize) -> Result<()> {
        if !(theta.is_finite() && theta > 0.0) {
            return Err(Error::InvalidTheta(theta));
        }
        check_dim("rotary_dim", rotary_dim, true)?;
        self.validate_fields(theta, rotary_dim)?;
        // Then the ranges, once each value is known to be a positive number.
        match self {
            RopeScaling::Default => {}
            RopeScaling::Linear { factor }
            | RopeScaling::Dynamic { factor, .. }
            | RopeScaling::Yarn(YarnParams { factor, .. })
            | RopeScaling::Llama3 { factor, .. }
            | RopeScaling::Proportional { factor, .. }
            | RopeScaling::MixedNtk { factor, .. } => {
                check_factor("factor", *factor)?;
            }
            RopeScaling::Ntk { alpha } => {
                check_factor("factor", *alpha)?;
            }
            RopeScaling::NtkAlpha { alpha } => {
                check_factor("alpha", *alpha)?;
            }
            RopeScaling::LongRope {
                short_factor,
                long_factor,
                factor,
                ..
            } => {
                for &v in short_factor {
                    check_factor("short_factor", v)?;
                }
                for &v in long_factor {
                    check_factor("long_factor", v)?;
                }
                check_factor("factor", *factor)?;
            }
        }
        let explicit = match self {
            RopeScaling::Yarn(y) => y.attention_factor,
            RopeScaling::LongRope {
                attention_factor, ..
            } => *attention_factor,
            _ => None,
        };
        if let Some(a) = explicit {
            check_attention_factor("attention_factor", a)?;
        }
        Ok(())
    }

    fn validate_fields(&self, theta: f64, rotary_dim: usize) -> Result<()> {
        match self {
            RopeScaling::Default => Ok(()),
            RopeScaling::Linear { factor } => check_positive("factor", *factor).map(|_| ()),
            RopeScaling::Dynamic {
                factor,
                max_position_embeddings,
            } => dynamic::validate(*factor, *max_position_embeddings, rotary_dim),
            RopeScaling::Yarn(_) => yarn::validate(self, theta, rotary_dim),
            RopeScaling::LongRope { .. } => longrope::validate(self, rotary_dim),
            RopeScaling::Llama3 { .. } => llama3::validate(self),
            RopeScaling::Proportional {
                factor,
                partial_rotary_factor,
            } => proportional::validate(*factor, *partial_rotary_factor),
            RopeScaling::Ntk { alpha } | RopeScaling::NtkAlpha { alpha } => {
                ntk::validate(*alpha, rotary_dim)
            }
            RopeScaling::MixedNtk { factor, mixed_b } => mixed_ntk::validate(*factor, *mixed_b),
        }
    }

    /// The `f32` inverse frequencies and the attention factor for base
    /// `theta` over `rotary_dim` dimensions at sequence length `seq_len`
    /// (`None`: the table transformers builds at load time), after
    /// [`validate`](Self::validate).
    ///
    /// # Errors
    /// As [`validate`](Self::validate).
    pub fn inv_freq(
        &self,
        theta: f64,
        rotary_dim: usize,
        seq_len: Option<usize>,
    ) -> Result<(Vec<f32>, f64)> {
        self.validate(theta, rotary_dim)?;
        let (inv, attention_factor) = match self {
            RopeScaling::Default => (default_inv_freq_f32(theta, rotary_dim), 1.0),
            RopeScaling::Linear { factor } => (linear::inv_freq(theta, rotary_dim, *factor), 1.0),
            RopeScaling::Dynamic {
                factor,
                max_position_embeddings,
            } => (
                dynamic::inv_freq(
                    theta,
                    rotary_dim,
                    *factor,
                    *max_position_embeddings,
                    seq_len,
                ),
                1.0,
            ),
            RopeScaling::Yarn(_) => yarn::inv_freq(self, theta, rotary_dim),
            RopeScaling::LongRope { .. } => longrope::inv_freq(self, theta, rotary_dim, seq_len),
            RopeScaling::Llama3 { .. } => (llama3::inv_freq(self, theta, rotary_dim), 1.0),
            RopeScaling::Proportional {
                factor,
                partial_rotary_factor,
            } => (
                proportional::inv_freq(theta, rotary_dim, *factor, *partial_rotary_factor),
                1.0,
            ),
            RopeScaling::Ntk { alpha } | RopeScaling::NtkAlpha { alpha } => {
                (ntk::inv_freq(theta, rotary_dim, *alpha), 1.0)
            }
            RopeScaling::MixedNtk { factor, mixed_b } => (
                mixed_ntk::inv_freq(theta, rotary_dim, *factor, *mixed_b),
                1.0,
            ),
        };
        check_table(&inv, attention_factor)?;
        Ok((inv, attention_factor))
    }
}

/// Every frequency finite and ≥ 0, the attention factor finite and in
/// `[MIN_ATTENTION_FACTOR, MAX_ATTENTION_FACTOR]`: what a computed table
/// must satisfy for its cos/sin to be finite and its logits plausible.
fn check_table(inv: &[f32], attention_factor: f64) -> Result<()> {
    if let Some(&bad) = inv.iter().find(|v| !(v.is_finite() && **v >= 0.0)) {
        return Err(Error::NotFinite {
            name: "inv_freq (computed from the scaling parameters)",
            value: bad as f64,
        });
    }
    check_attention_factor(
        "attention_factor (computed from the scaling parameters)",
        attention_factor,
    )?;
    Ok(())
}

// ---------------------------------------------------------------------------
// float32 building blocks, mirroring transformers' tensor expressions.
// Each `f32` operation below is IEEE-correctly rounded, like torch's CPU
// kernels for + − × ÷; `pow` is evaluated in f64 from the f32 operands and
// rounded once (torch's own f32 pow is within about one ulp of that).
// ---------------------------------------------------------------------------

/// `torch.arange(0, dim, 2).float() / dim`: the exponents `2i/d` in `f32`.
pub(crate) fn exponents_f32(dim: usize) -> Vec<f32> {
    (0..dim).step_by(2).map(|i| i as f32 / dim as f32).collect()
}

/// `base ** e` for a Python-float `base` and an `f32` tensor `e`: torch casts
/// the base to `f32`.
#[inline]
pub(crate) fn pow_f32(base: f64, e: f32) -> f32 {
    ((base as f32) as f64).powf(e as f64) as f32
}

/// `base ** (torch.arange(0, dim, 2).float() / dim)` in `f32`.
pub(crate) fn pos_freqs_f32(base: f64, dim: usize) -> Vec<f32> {
    exponents_f32(dim)
        .into_iter()
        .map(|e| pow_f32(base, e))
        .collect()
}

/// `1.0 / (base ** (torch.arange(0, dim, 2).float() / dim))`: transformers'
/// `compute_default_rope_parameters`, in `f32`.
pub fn default_inv_freq_f32(base: f64, dim: usize) -> Vec<f32> {
    pos_freqs_f32(base, dim)
        .into_iter()
        .map(|p| 1.0f32 / p)
        .collect()
}
